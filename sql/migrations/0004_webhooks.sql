-- Outbound webhooks: per-tenant subscriptions and a transactional outbox.
-- A trigger on orch8.instance_transitions writes instance.completed and instance.failed
-- to the outbox in the same transaction as the state change; a delivery loop
-- (orch8_py/webhooks.py) claims, POSTs and records them through the functions in
-- sql/functions/webhooks.sql.

CREATE TABLE orch8.webhook_subscriptions (
    tenant_id text NOT NULL CHECK (tenant_id <> ''),
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    url text NOT NULL CHECK (url ~* '^https?://[^/?#[:space:]]+[^[:space:]]*$'),
    secret text NOT NULL CHECK (secret <> ''),
    events text[] NOT NULL CHECK (
        cardinality(events) >= 1
        AND events <@ ARRAY['instance.completed', 'instance.failed']::text[]
    ),
    enabled boolean NOT NULL DEFAULT true,
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, id)
);

COMMENT ON TABLE orch8.webhook_subscriptions IS
'Per-tenant webhook endpoints: an http(s) URL, the HMAC-SHA256 signing secret and the '
'events it receives (instance.completed, instance.failed). Created with '
'orch8.create_webhook_subscription; a disabled subscription gets no new events and its '
'queued deliveries wait until it is enabled again.';

CREATE TABLE orch8.webhook_outbox (
    tenant_id text NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    subscription_id uuid NOT NULL,
    event text NOT NULL CHECK (event IN ('instance.completed', 'instance.failed')),
    instance_id uuid NOT NULL,
    payload jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    state text NOT NULL DEFAULT 'pending'
    CHECK (state IN ('pending', 'delivering', 'delivered', 'parked', 'discarded')),
    attempts integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT orch8.now(),
    last_error text,
    last_status integer,
    claimed_by text,
    claim_expires_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    delivered_at timestamptz,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, subscription_id)
    REFERENCES orch8.webhook_subscriptions (tenant_id, id),
    -- a claim exists exactly while a delivery is in flight
    CHECK ((state = 'delivering') = (claimed_by IS NOT NULL)),
    CHECK ((claimed_by IS NULL) = (claim_expires_at IS NULL)),
    CHECK ((state = 'delivered') = (delivered_at IS NOT NULL))
);

COMMENT ON TABLE orch8.webhook_outbox IS
'Transactional outbox: one row per (event, subscription), written by trigger in the '
'transaction that moved the instance. pending -> delivering (claimed with a lease) -> '
'delivered, or back to pending with exponential backoff, or parked after the last '
'attempt; operators redeliver or discard. Delivery is at-least-once: receivers dedupe '
'on the delivery id (X-Orch8-Delivery).';

-- The claim: due pending rows, oldest first, across tenants (the delivery loop's job).
CREATE INDEX webhook_outbox_due_idx ON orch8.webhook_outbox (next_attempt_at, id)
WHERE state = 'pending';
-- Re-claiming deliveries whose claim expired (a crashed deliverer).
CREATE INDEX webhook_outbox_claim_idx ON orch8.webhook_outbox (claim_expires_at)
WHERE state = 'delivering';
-- Operators: an instance's deliveries; the parked queue.
CREATE INDEX webhook_outbox_instance_idx ON orch8.webhook_outbox (tenant_id, instance_id);
CREATE INDEX webhook_outbox_subscription_idx ON orch8.webhook_outbox (
    tenant_id, subscription_id
);
CREATE INDEX webhook_outbox_parked_idx ON orch8.webhook_outbox (tenant_id, created_at)
WHERE state = 'parked';

CREATE FUNCTION orch8.enqueue_instance_webhooks()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_event text;
    v_rows integer;
BEGIN
    IF new.to_state NOT IN ('completed', 'failed') THEN
        RETURN NULL;
    END IF;
    v_event := 'instance.' || new.to_state::text;
    INSERT INTO orch8.webhook_outbox (
        tenant_id, subscription_id, event, instance_id, payload
    )
    SELECT s.tenant_id, s.id, v_event, new.instance_id,
           jsonb_build_object(
               'event', v_event,
               'tenant_id', new.tenant_id,
               'instance_id', new.instance_id,
               'state', new.to_state::text,
               'reason', new.reason,
               'at', to_char(new.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'sequence_id', t.sequence_id,
               'sequence_version', t.sequence_version)
    FROM orch8.webhook_subscriptions AS s
    INNER JOIN orch8.task_instances AS t
        ON t.tenant_id = new.tenant_id AND t.id = new.instance_id
    WHERE s.tenant_id = new.tenant_id
      AND s.enabled
      AND v_event = ANY (s.events)
    ORDER BY s.created_at, s.id;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    IF v_rows > 0 THEN
        PERFORM pg_notify('orch8_webhooks', '');  -- sent at commit, never on rollback
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.enqueue_instance_webhooks() IS
'Trigger on orch8.instance_transitions: a move to completed or failed inserts one '
'webhook_outbox row per enabled subscription of the tenant that wants instance.<state>, '
'payload {event, tenant_id, instance_id, state, reason, at (UTC ISO 8601), sequence_id, '
'sequence_version}, in the same transaction; then NOTIFY orch8_webhooks.';

CREATE TRIGGER instance_transitions_webhooks
AFTER INSERT ON orch8.instance_transitions
FOR EACH ROW
WHEN (new.to_state IN ('completed', 'failed'))
EXECUTE FUNCTION orch8.enqueue_instance_webhooks();
