-- Repeatable: webhook subscriptions and the outbox state machine.
-- Subscriptions: create_webhook_subscription; set_webhook_subscription_enabled turns one
-- off (no new events, queued deliveries wait) and on again (operators).
--   pending    -> delivering               (claim_webhook_deliveries)
--   delivering -> delivered | pending | parked   (record_webhook_delivery, CAS on worker)
--   delivering -> delivering               (re-claim once the claim expired)
--   parked | discarded | delivered -> pending     (redeliver_webhook, operators)
--   pending | parked -> discarded          (discard_webhook, operators)

CREATE OR REPLACE FUNCTION orch8.create_webhook_subscription(
    p_tenant_id text,
    p_url text,
    p_secret text,
    p_events text[] DEFAULT orch8.webhook_events()
)
RETURNS uuid
LANGUAGE plpgsql
AS $$
DECLARE
    v_events text[];
    v_unknown text[];
    v_id uuid;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);  -- the web role acts in its sealed tenant
    IF p_tenant_id IS NULL OR p_tenant_id = '' THEN
        RAISE EXCEPTION 'a webhook subscription needs a tenant' USING ERRCODE = 'O8008';
    END IF;
    IF NOT orch8.fits_domain(p_url, 'orch8.webhook_url') THEN
        RAISE EXCEPTION 'webhook url must be %, not %',
            obj_description('orch8.webhook_url'::regtype, 'pg_type'),
            coalesce(quote_literal(p_url), 'NULL')
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'url')::text;
    END IF;
    IF p_secret IS NULL OR p_secret = '' THEN
        RAISE EXCEPTION 'a webhook subscription needs a non-empty signing secret'
            USING ERRCODE = 'O8008';
    END IF;
    SELECT array_agg(DISTINCT e ORDER BY e) INTO v_events
      FROM unnest(p_events) AS u (e);
    IF v_events IS NULL THEN
        RAISE EXCEPTION 'a webhook subscription needs at least one event'
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'events',
                                             'allowed', orch8.webhook_events())::text;
    END IF;
    SELECT array_agg(e ORDER BY e) INTO v_unknown
      FROM unnest(v_events) AS u (e)
     WHERE e IS NULL OR NOT e = ANY (orch8.webhook_events());
    IF v_unknown IS NOT NULL THEN
        RAISE EXCEPTION 'unknown webhook event(s): %', array_to_string(v_unknown, ', ', 'NULL')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'events',
                                             'allowed', orch8.webhook_events())::text;
    END IF;
    INSERT INTO orch8.webhook_subscriptions (tenant_id, url, secret, events)
    VALUES (p_tenant_id, p_url, p_secret, v_events)
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;

COMMENT ON FUNCTION orch8.create_webhook_subscription(text, text, text, text[]) IS
'Subscribe an http(s) URL to events of one tenant (instance.completed, instance.failed; '
'both by default), signed with secret. Returns the subscription id. A URL that is not an '
'orch8.webhook_url (http(s) with a host, no spaces), an unknown or missing event, or an '
'empty secret: O8008.';

CREATE OR REPLACE FUNCTION orch8.claim_webhook_deliveries(
    p_worker text, p_batch integer, p_lease interval DEFAULT '30 seconds'
)
RETURNS SETOF orch8.webhook_outbox
LANGUAGE plpgsql
AS $$
DECLARE
    v_taken integer;
BEGIN
    IF p_worker IS NULL OR p_worker = '' OR p_batch IS NULL OR p_batch < 1
       OR p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION
            'claim_webhook_deliveries needs a worker id, a batch >= 1 and a positive lease'
            USING ERRCODE = 'O8008';
    END IF;
    -- First the deliveries whose claim expired (a deliverer died mid-batch): few, and
    -- found through webhook_outbox_claim_idx.
    RETURN QUERY
    WITH expired AS (
        SELECT o.tenant_id, o.id
        FROM orch8.webhook_outbox AS o
        WHERE o.state = 'delivering' AND o.claim_expires_at < orch8.now()
          AND EXISTS (
              SELECT 1 FROM orch8.webhook_subscriptions AS s
              WHERE s.tenant_id = o.tenant_id AND s.id = o.subscription_id AND s.enabled
          )
        ORDER BY o.claim_expires_at
        LIMIT p_batch
        FOR UPDATE OF o SKIP LOCKED
    )
    UPDATE orch8.webhook_outbox AS o
    SET state = 'delivering',
        claimed_by = p_worker,
        claim_expires_at = orch8.now() + p_lease,
        last_error = format('claim by %s expired without a result', o.claimed_by)
    FROM expired AS e
    WHERE o.tenant_id = e.tenant_id AND o.id = e.id
      -- re-check under the row lock
      AND o.state = 'delivering' AND o.claim_expires_at < orch8.now()
    RETURNING o.*;
    GET DIAGNOSTICS v_taken = ROW_COUNT;
    IF v_taken >= p_batch THEN
        RETURN;
    END IF;
    -- Then due pending deliveries, oldest first: an ordered walk of webhook_outbox_due_idx
    -- that stops at the batch size, however long the backlog.
    RETURN QUERY
    WITH due AS (
        SELECT o.tenant_id, o.id
        FROM orch8.webhook_outbox AS o
        WHERE o.state = 'pending' AND o.next_attempt_at <= orch8.now()
          AND EXISTS (
              SELECT 1 FROM orch8.webhook_subscriptions AS s
              WHERE s.tenant_id = o.tenant_id AND s.id = o.subscription_id AND s.enabled
          )
        ORDER BY o.next_attempt_at, o.id
        LIMIT p_batch - v_taken
        FOR UPDATE OF o SKIP LOCKED
    )
    UPDATE orch8.webhook_outbox AS o
    SET state = 'delivering',
        claimed_by = p_worker,
        claim_expires_at = orch8.now() + p_lease
    FROM due AS d
    WHERE o.tenant_id = d.tenant_id AND o.id = d.id
      AND o.state = 'pending' AND o.next_attempt_at <= orch8.now()
    RETURNING o.*;
END
$$;

COMMENT ON FUNCTION orch8.claim_webhook_deliveries(text, integer, interval) IS
'One round trip for the delivery loop: up to p_batch due pending deliveries (and '
'deliveries whose claim expired: a crashed deliverer) of enabled subscriptions, oldest '
'first, FOR UPDATE SKIP LOCKED, moved to delivering with claimed_by = p_worker and '
'claim_expires_at = now + p_lease. Returns the claimed rows. Bad arguments: O8008.';

CREATE OR REPLACE FUNCTION orch8.record_webhook_delivery(
    p_tenant_id text,
    p_id bigint,
    p_worker text,
    p_ok boolean,
    p_status integer DEFAULT NULL,
    p_error text DEFAULT NULL,
    p_max_attempts integer DEFAULT 8,
    p_backoff interval DEFAULT '5 seconds'
)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.webhook_outbox;
    v_attempts integer;
    v_state text;
BEGIN
    IF p_ok IS NULL OR p_max_attempts IS NULL OR p_max_attempts < 1
       OR p_backoff IS NULL OR p_backoff < interval '0' THEN
        RAISE EXCEPTION
            'record_webhook_delivery needs ok, max_attempts >= 1 and a backoff >= 0'
            USING ERRCODE = 'O8008';
    END IF;
    SELECT * INTO v_row FROM orch8.webhook_outbox AS o
     WHERE o.tenant_id = p_tenant_id AND o.id = p_id
     FOR UPDATE;
    IF v_row.id IS NULL THEN
        RAISE EXCEPTION 'webhook delivery % not found', p_id USING ERRCODE = 'O8007';
    END IF;
    IF v_row.state <> 'delivering' OR v_row.claimed_by IS DISTINCT FROM p_worker THEN
        RETURN 'stale';  -- the claim expired and somebody else holds (or finished) it
    END IF;
    v_attempts := v_row.attempts + 1;
    IF p_ok THEN
        v_state := 'delivered';
    ELSIF v_attempts >= p_max_attempts THEN
        v_state := 'parked';
    ELSE
        v_state := 'pending';
    END IF;
    UPDATE orch8.webhook_outbox AS o
    SET state = v_state,
        attempts = v_attempts,
        last_status = p_status,
        last_error = CASE WHEN p_ok THEN NULL ELSE left(p_error, orch8.limit_of('error_chars')::integer) END,
        claimed_by = NULL,
        claim_expires_at = NULL,
        delivered_at = CASE WHEN p_ok THEN orch8.now() END,
        next_attempt_at = CASE
            WHEN v_state = 'pending' THEN orch8.now() + least(
                p_backoff * power(2, least(v_attempts - 1, 20)), interval '1 hour'
            )
            ELSE o.next_attempt_at
        END
    WHERE o.tenant_id = p_tenant_id AND o.id = p_id;
    RETURN v_state;
END
$$;

COMMENT ON FUNCTION orch8.record_webhook_delivery(
    text, bigint, text, boolean, integer, text, integer, interval
) IS
'The deliverer reports one attempt: a CAS on (state delivering, claimed_by = p_worker). '
'Every attempt counts. ok: delivered. Otherwise pending again at now + backoff * '
'2^(attempts - 1), capped at 1 hour, or parked once attempts >= max_attempts. Returns '
'the new state, or stale when the caller no longer holds the claim (nothing written). '
'Unknown id: O8007.';

CREATE OR REPLACE FUNCTION orch8.redeliver_webhook(p_tenant_id text, p_id bigint)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_state text;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);  -- the web role acts in its sealed tenant
    SELECT o.state INTO v_state FROM orch8.webhook_outbox AS o
     WHERE o.tenant_id = p_tenant_id AND o.id = p_id
     FOR UPDATE;
    IF v_state IS NULL THEN
        RAISE EXCEPTION 'webhook delivery % not found', p_id USING ERRCODE = 'O8007';
    END IF;
    IF v_state NOT IN ('parked', 'discarded', 'delivered') THEN
        RAISE EXCEPTION 'webhook delivery % cannot be redelivered from %', p_id, v_state
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('current_state', v_state)::text,
                  HINT = 'only parked, discarded and delivered deliveries are redelivered';
    END IF;
    UPDATE orch8.webhook_outbox AS o
    SET state = 'pending', attempts = 0, next_attempt_at = orch8.now(), delivered_at = NULL
    WHERE o.tenant_id = p_tenant_id AND o.id = p_id;
    PERFORM pg_notify('orch8_webhooks', '');
    RETURN 'pending';
END
$$;

COMMENT ON FUNCTION orch8.redeliver_webhook(text, bigint) IS
'Operators: send a parked, discarded or delivered delivery again (pending now, attempts '
'0; last_error and last_status are kept until the next attempt). Returns pending. '
'Unknown id: O8007; pending or delivering: O8004.';

CREATE OR REPLACE FUNCTION orch8.discard_webhook(p_tenant_id text, p_id bigint)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_state text;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);  -- the web role acts in its sealed tenant
    SELECT o.state INTO v_state FROM orch8.webhook_outbox AS o
     WHERE o.tenant_id = p_tenant_id AND o.id = p_id
     FOR UPDATE;
    IF v_state IS NULL THEN
        RAISE EXCEPTION 'webhook delivery % not found', p_id USING ERRCODE = 'O8007';
    END IF;
    IF v_state NOT IN ('pending', 'parked') THEN
        RAISE EXCEPTION 'webhook delivery % cannot be discarded from %', p_id, v_state
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('current_state', v_state)::text,
                  HINT = 'only pending and parked deliveries are discarded';
    END IF;
    UPDATE orch8.webhook_outbox AS o
    SET state = 'discarded'
    WHERE o.tenant_id = p_tenant_id AND o.id = p_id;
    RETURN 'discarded';
END
$$;

COMMENT ON FUNCTION orch8.discard_webhook(text, bigint) IS
'Operators: give up on a pending or parked delivery (it stays in the outbox as '
'discarded; redeliver_webhook can revive it). Returns discarded. Unknown id: O8007; '
'delivering or delivered: O8004.';

CREATE OR REPLACE FUNCTION orch8.set_webhook_subscription_enabled(
    p_tenant_id text, p_id uuid, p_enabled boolean
)
RETURNS TABLE (
    id uuid,
    url text,
    events text[],
    enabled boolean,
    created_at timestamptz,
    changed boolean
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_was boolean;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);  -- the web role acts in its sealed tenant
    IF p_enabled IS NULL THEN
        RAISE EXCEPTION 'set_webhook_subscription_enabled needs enabled true or false'
            USING ERRCODE = 'O8008';
    END IF;
    SELECT s.enabled INTO v_was FROM orch8.webhook_subscriptions AS s
     WHERE s.tenant_id = p_tenant_id AND s.id = p_id
     FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'webhook subscription % not found', coalesce(p_id::text, 'NULL')
            USING ERRCODE = 'O8007';
    END IF;
    IF v_was IS DISTINCT FROM p_enabled THEN
        UPDATE orch8.webhook_subscriptions AS s
        SET enabled = p_enabled
        WHERE s.tenant_id = p_tenant_id AND s.id = p_id;
        IF p_enabled THEN
            -- its queued deliveries are due again: wake the delivery loops (at commit)
            PERFORM pg_notify('orch8_webhooks', '');
        END IF;
    END IF;
    RETURN QUERY
    SELECT s.id, s.url::text, s.events, s.enabled, s.created_at, v_was IS DISTINCT FROM p_enabled
    FROM orch8.webhook_subscriptions AS s
    WHERE s.tenant_id = p_tenant_id AND s.id = p_id;
END
$$;

COMMENT ON FUNCTION orch8.set_webhook_subscription_enabled(text, uuid, boolean) IS
'Operators: turn a subscription off (no new events; its queued deliveries stay pending and '
'are not sent) or on again (queued deliveries go out; NOTIFY orch8_webhooks). Idempotent. '
'Returns the subscription without its secret, and changed (false when it already was in '
'that state). Unknown id in the tenant: O8007; enabled NULL: O8008.';
