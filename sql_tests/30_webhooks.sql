-- Webhooks: the outbox trigger, subscription validation, and the delivery state machine
-- (claim, record, redeliver, discard). Time moves with orch8.fake_now.
BEGIN;
SELECT plan(54);

SELECT has_table('orch8', 'webhook_subscriptions', 'webhook subscriptions exist');
SELECT has_table('orch8', 'webhook_outbox', 'the webhook outbox exists');
SELECT has_trigger(
    'orch8', 'instance_transitions', 'instance_transitions_webhooks',
    'instance transitions feed the outbox'
);
SELECT has_function(
    'orch8', 'create_webhook_subscription', ARRAY['text', 'text', 'text', 'text[]'],
    'create_webhook_subscription(text, text, text, text[]) exists'
);
SELECT has_function(
    'orch8', 'claim_webhook_deliveries', ARRAY['text', 'integer', 'interval'],
    'claim_webhook_deliveries(text, integer, interval) exists'
);
SELECT has_function(
    'orch8', 'record_webhook_delivery',
    ARRAY['text', 'bigint', 'text', 'boolean', 'integer', 'text', 'integer', 'interval'],
    'record_webhook_delivery(...) exists'
);
SELECT has_function(
    'orch8', 'redeliver_webhook', ARRAY['text', 'bigint'], 'redeliver_webhook exists'
);
SELECT has_function(
    'orch8', 'discard_webhook', ARRAY['text', 'bigint'], 'discard_webhook exists'
);

-- 1. Subscription validation (O8008) ---------------------------------------------------

SELECT throws_ok(
    $$SELECT orch8.create_webhook_subscription('tap', 'ftp://x.example/h', 's')$$,
    'O8008', NULL, 'a URL that is not http(s) is refused'
);
SELECT throws_ok(
    $$SELECT orch8.create_webhook_subscription('tap', 'https://', 's')$$,
    'O8008', NULL, 'a URL without a host is refused'
);
SELECT throws_ok(
    $$SELECT orch8.create_webhook_subscription(
        'tap', 'https://x.example/h', 's', ARRAY['instance.started'])$$,
    'O8008', 'unknown webhook event(s): instance.started', 'an unknown event is refused'
);
SELECT throws_ok(
    $$SELECT orch8.create_webhook_subscription('tap', 'https://x.example/h', 's', '{}')$$,
    'O8008', NULL, 'no events is refused'
);
SELECT throws_ok(
    $$SELECT orch8.create_webhook_subscription('tap', 'https://x.example/h', '')$$,
    'O8008', NULL, 'an empty secret is refused'
);

-- Fixtures: a sequence; subscriptions in two tenants (one disabled, one failed-only).
-- pg_temp.id(name) reads the ids saved in the temp table ids.
CREATE TEMP TABLE ids (name text PRIMARY KEY, id text NOT NULL);

CREATE FUNCTION pg_temp.id(p_name text)
RETURNS text
LANGUAGE sql
AS $$ SELECT i.id FROM ids AS i WHERE i.name = p_name $$;

CREATE FUNCTION pg_temp.delivery(p_name text)
RETURNS bigint
LANGUAGE sql
AS $$ SELECT pg_temp.id(p_name)::bigint $$;

CREATE FUNCTION pg_temp.start_instance(p_name text)
RETURNS integer
LANGUAGE sql
AS $$
    INSERT INTO ids (name, id)
    SELECT p_name, c.id::text
    FROM orch8.create_instance('tap', pg_temp.id('seq')::uuid) AS c;
    SELECT count(*)::integer FROM orch8.claim_due_nodes('tap-runner', 1, '30 seconds');
$$;

CREATE FUNCTION pg_temp.outbox_count(p_state text DEFAULT NULL)
RETURNS integer
LANGUAGE sql
AS $$
    SELECT count(*)::integer FROM orch8.webhook_outbox AS o
    WHERE o.state = coalesce(p_state, o.state)
$$;

CREATE FUNCTION pg_temp.first_claimed_by(p_worker text)
RETURNS bigint
LANGUAGE sql
AS $$
    SELECT min(o.id) FROM orch8.webhook_outbox AS o
    WHERE o.claimed_by = p_worker
$$;

INSERT INTO orch8.sequences (tenant_id, name, version, definition)
VALUES ('tap', 'flow', 1, '{"blocks": [{"id": "a", "type": "step", "handler": "noop"}]}');
INSERT INTO ids (name, id)
SELECT
    'seq' AS name,
    s.id::text AS id
FROM orch8.sequences AS s
WHERE s.tenant_id = 'tap';
INSERT INTO ids (name, id) VALUES
(
    'sub_all',
    orch8.create_webhook_subscription('tap', 'https://hooks.example/all', 'sec1')::text
),
(
    'sub_failed',
    orch8.create_webhook_subscription(
        'tap', 'https://hooks.example/failed', 'sec2', ARRAY['instance.failed']
    )::text
),
(
    'sub_off',
    orch8.create_webhook_subscription('tap', 'https://hooks.example/off', 'sec3')::text
),
(
    'sub_other',
    orch8.create_webhook_subscription('tap2', 'https://hooks.example/t2', 'sec4')::text
);
UPDATE orch8.webhook_subscriptions SET enabled = false
WHERE id = pg_temp.id('sub_off')::uuid;

-- 2. The trigger ------------------------------------------------------------------------

SELECT is(pg_temp.start_instance('i1'), 1, 'an instance is created and claimed');
SELECT is(pg_temp.outbox_count(), 0, 'creating and claiming an instance writes no webhook');
SELECT ok(
    orch8.transition_instance('tap', pg_temp.id('i1')::uuid, 'running', 'completed', 'runner'),
    'the instance completes'
);
SELECT is(
    pg_temp.outbox_count(), 1,
    'completion writes exactly one outbox row (not for the failed-only or disabled '
    || 'subscription, nor for the other tenant)'
);
SELECT results_eq(
    $$SELECT tenant_id, subscription_id::text, event, state, attempts
      FROM orch8.webhook_outbox$$,
    $$SELECT 'tap'::text, pg_temp.id('sub_all'), 'instance.completed'::text,
             'pending'::text, 0$$,
    'the row is pending, for the subscription that wants instance.completed'
);
SELECT is(
    (SELECT o.payload - 'at' FROM orch8.webhook_outbox AS o),
    jsonb_build_object(
        'event', 'instance.completed', 'tenant_id', 'tap',
        'instance_id', pg_temp.id('i1'), 'state', 'completed', 'reason', NULL,
        'sequence_id', pg_temp.id('seq'), 'sequence_version', 1
    ),
    'the payload names the event, tenant, instance, state, reason and sequence'
);
SELECT is(
    (SELECT (o.payload ->> 'at')::timestamptz FROM orch8.webhook_outbox AS o),
    (
        SELECT t.at FROM orch8.instance_transitions AS t
        WHERE t.tenant_id = 'tap' AND t.to_state = 'completed'
    ),
    'payload.at is the transition time'
);
INSERT INTO ids (name, id)
SELECT
    'w1' AS name,
    o.id::text AS id
FROM orch8.webhook_outbox AS o;

SELECT is(pg_temp.start_instance('i2'), 1, 'a second instance is created and claimed');
SELECT ok(
    orch8.transition_instance(
        'tap', pg_temp.id('i2')::uuid, 'running', 'failed', 'runner', 'card declined'
    ),
    'the second instance fails'
);
SELECT set_eq(
    $$SELECT subscription_id::text, payload ->> 'reason'
      FROM orch8.webhook_outbox WHERE event = 'instance.failed'$$,
    $$VALUES (pg_temp.id('sub_all'), 'card declined'::text),
             (pg_temp.id('sub_failed'), 'card declined'::text)$$,
    'failure writes one row per subscription wanting instance.failed, with the reason'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.webhook_outbox
        WHERE tenant_id = 'tap2'
    ),
    0,
    'the other tenant''s subscription got nothing'
);

-- 3. Claim ------------------------------------------------------------------------------

SELECT set_config('orch8.fake_now', '2030-01-01 00:00:00+00', true);
SELECT is(
    (SELECT count(*)::integer FROM orch8.claim_webhook_deliveries('d1', 10, '1 minute')), 3,
    'the claim takes the three due rows'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.webhook_outbox
        WHERE
            state = 'delivering' AND claimed_by = 'd1'
            AND claim_expires_at = '2030-01-01 00:01:00+00'
    ),
    3,
    'claimed rows are delivering, owned by the claimer, until now + lease'
);
SELECT is(
    (SELECT count(*)::integer FROM orch8.claim_webhook_deliveries('d2', 10, '1 minute')), 0,
    'a second claimer gets nothing while the claim holds'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.claim_webhook_deliveries('', 10, '1 minute')$$,
    'O8008', NULL, 'a claim needs a worker id'
);

-- 4. Record: a CAS on the claimer; failures back off exponentially, then park ----------

SELECT is(
    orch8.record_webhook_delivery(
        'tap', pg_temp.delivery('w1'), 'd2', true, 200, NULL, 3, '10 seconds'
    ),
    'stale',
    'a result from a worker that does not hold the claim is stale'
);
SELECT is(
    orch8.record_webhook_delivery(
        'tap', pg_temp.delivery('w1'), 'd1', false, 500, 'http 500', 3, '10 seconds'
    ),
    'pending',
    'a first failure goes back to pending'
);
SELECT results_eq(
    $$SELECT attempts, next_attempt_at, last_status, last_error, claimed_by
      FROM orch8.webhook_outbox WHERE id = pg_temp.delivery('w1')$$,
    $$VALUES (1, '2030-01-01 00:00:10+00'::timestamptz, 500, 'http 500'::text, NULL::text)$$,
    'attempt 1 waits backoff * 2^0, keeps status and error, drops the claim'
);
SELECT is(
    (SELECT count(*)::integer FROM orch8.claim_webhook_deliveries('d1', 10, '1 minute')), 0,
    'it is not due before the backoff'
);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:10+00', true);
SELECT is(
    (SELECT count(*)::integer FROM orch8.claim_webhook_deliveries('d1', 10, '1 minute')), 1,
    'it is due after the backoff'
);
SELECT is(
    orch8.record_webhook_delivery(
        'tap', pg_temp.delivery('w1'), 'd1', false, NULL, 'connect: refused', 3, '10 seconds'
    ),
    'pending',
    'a second failure goes back to pending'
);
SELECT is(
    (
        SELECT o.next_attempt_at FROM orch8.webhook_outbox AS o
        WHERE o.id = pg_temp.delivery('w1')
    ),
    '2030-01-01 00:00:30+00'::timestamptz,
    'attempt 2 waits backoff * 2^1'
);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:30+00', true);
SELECT is(
    (SELECT count(*)::integer FROM orch8.claim_webhook_deliveries('d1', 10, '1 minute')), 1,
    'claimed again'
);
SELECT is(
    orch8.record_webhook_delivery(
        'tap', pg_temp.delivery('w1'), 'd1', false, 503, 'http 503', 3, '10 seconds'
    ),
    'parked',
    'the failure that reaches max_attempts parks the delivery'
);
SELECT is(
    (SELECT count(*)::integer FROM orch8.claim_webhook_deliveries('d1', 10, '1 minute')), 0,
    'a parked delivery is never claimed'
);

-- 5. Operators: redeliver and discard --------------------------------------------------

SELECT throws_ok(
    $$SELECT orch8.discard_webhook(
        'tap', (SELECT min(o.id) FROM orch8.webhook_outbox AS o WHERE o.state = 'delivering'))$$,
    'O8004', NULL, 'an in-flight delivery cannot be discarded'
);
SELECT is(
    orch8.redeliver_webhook('tap', pg_temp.delivery('w1')), 'pending',
    'a parked delivery is redelivered'
);
SELECT results_eq(
    $$SELECT state, attempts, next_attempt_at FROM orch8.webhook_outbox
      WHERE id = pg_temp.delivery('w1')$$,
    $$VALUES ('pending'::text, 0, '2030-01-01 00:00:30+00'::timestamptz)$$,
    'redelivery resets the attempts and makes it due now'
);
SELECT throws_ok(
    $$SELECT orch8.redeliver_webhook('tap', pg_temp.delivery('w1'))$$,
    'O8004', NULL, 'a pending delivery cannot be redelivered'
);
SELECT is(
    (SELECT count(*)::integer FROM orch8.claim_webhook_deliveries('d1', 10, '1 minute')), 1,
    'the redelivered row is claimed'
);
SELECT is(
    orch8.record_webhook_delivery(
        'tap', pg_temp.delivery('w1'), 'd1', true, 204, NULL, 3, '10 seconds'
    ),
    'delivered',
    'a success delivers it'
);
SELECT results_eq(
    $$SELECT state, attempts, last_status, last_error, delivered_at
      FROM orch8.webhook_outbox WHERE id = pg_temp.delivery('w1')$$,
    $$VALUES ('delivered'::text, 1, 204, NULL::text, '2030-01-01 00:00:30+00'::timestamptz)$$,
    'delivered: attempt counted, status kept, error cleared, delivered_at set'
);
SELECT throws_ok(
    $$SELECT orch8.discard_webhook('tap', pg_temp.delivery('w1'))$$,
    'O8004', NULL, 'a delivered delivery cannot be discarded'
);
SELECT is(
    orch8.redeliver_webhook('tap', pg_temp.delivery('w1')), 'pending',
    'a delivered delivery can be sent again on request'
);
SELECT is(
    orch8.discard_webhook('tap', pg_temp.delivery('w1')), 'discarded',
    'a pending delivery is discarded'
);
SELECT throws_ok(
    $$SELECT orch8.discard_webhook('tap', 0)$$, 'O8007', NULL, 'discard: unknown id'
);
SELECT throws_ok(
    $$SELECT orch8.redeliver_webhook('tap2', pg_temp.delivery('w1'))$$,
    'O8007', NULL, 'redeliver: another tenant''s row is not found'
);

-- 6. An expired claim is taken over; the backoff is capped at one hour ------------------

SELECT set_config('orch8.fake_now', '2030-01-01 00:05:00+00', true);
SELECT is(
    (SELECT array_agg(c.claimed_by) FROM orch8.claim_webhook_deliveries('d3', 10, '1 minute') AS c),
    ARRAY['d3', 'd3'],
    'deliveries whose claim expired are re-claimed by another worker'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.webhook_outbox
        WHERE claimed_by = 'd3' AND last_error = 'claim by d1 expired without a result'
    ),
    2,
    'the take-over is noted in last_error'
);
UPDATE orch8.webhook_outbox SET attempts = 5
WHERE id = pg_temp.first_claimed_by('d3');
SELECT is(
    orch8.record_webhook_delivery(
        'tap', pg_temp.first_claimed_by('d3'), 'd3', false, 500, 'http 500', 30, '10 minutes'
    ),
    'pending',
    'a sixth failure with a 10 minute backoff (10 min * 2^5 = 320 min)'
);
SELECT is(
    (
        SELECT max(o.next_attempt_at) FROM orch8.webhook_outbox AS o
        WHERE o.state = 'pending'
    ),
    '2030-01-01 01:05:00+00'::timestamptz,
    'the wait is capped at one hour'
);

SELECT * FROM finish();
ROLLBACK;
