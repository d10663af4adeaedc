-- Receipts lost with a failed primary (docs/HA.md): finish_step records a missing receipt
-- again as unknown with the handler's answer; keep_lost_receipt does the same for a runner
-- whose lease was lost as well, so the next claim of the step blocks instead of resending.
-- The lost writes are reproduced by deleting with triggers skipped, as a superuser.
BEGIN;
SELECT plan(16);

SELECT s.id AS seq
FROM orch8.create_sequence('lr', 'tap', 'pay', '{"blocks": [
    {"id": "charge", "type": "step", "handler": "x.pay"}]}') AS s \gset
SELECT (orch8.create_instance('lr', :'seq')).id AS held \gset
SELECT (orch8.create_instance('lr', :'seq')).id AS lost \gset
SELECT c.lease_token AS held_token
FROM orch8.claim_work('tap-runner', 10, '1 hour') AS c
WHERE c.id = :'held' \gset
SELECT c.lease_token AS lost_token
FROM orch8.execution_nodes AS c
WHERE c.instance_id = :'lost' AND c.lease_token IS NOT NULL \gset
SELECT (orch8.begin_step('lr', :'held', :'held_token', 'charge', 'x.pay', '{}', 0)).effect_id
    AS held_effect
\gset
SELECT (orch8.begin_step('lr', :'lost', :'lost_token', 'charge', 'x.pay', '{}', 0)).effect_id
    AS lost_effect
\gset

-- What the new primary lacks: both receipts; for 'lost' also its claim.
SET session_replication_role = replica;
DELETE FROM orch8.effect_receipt_events
WHERE receipt_id IN (:'held_effect', :'lost_effect');
DELETE FROM orch8.block_outputs
WHERE instance_id IN (:'held', :'lost');
DELETE FROM orch8.effect_receipts
WHERE id IN (:'held_effect', :'lost_effect');
UPDATE orch8.task_instances
SET
    state = 'scheduled',
    next_fire_at = orch8.now() + interval '1 hour'
WHERE id = :'lost';
UPDATE orch8.execution_nodes
SET
    state = 'ready',
    lease_token = NULL,
    lease_owner = NULL,
    lease_expires_at = NULL,
    next_fire_at = orch8.now() + interval '1 hour'
WHERE instance_id = :'lost' AND path = 'charge';
RESET session_replication_role;

-- Under a held lease, finish_step itself records the receipt and waits for settlement.
SELECT is(
    (orch8.finish_step(
        'lr', :'held', :'held_token', 'charge', 0, :'held_effect', 'ok',
        '{"receipt_id": "ch_1"}'
    )).state::text,
    'failed', 'finish_step with a missing receipt fails the step for settlement'
);
SELECT results_eq(
    format($$SELECT state::text, evidence -> 'handler_output'
             FROM orch8.effect_receipts WHERE id = %L$$, :'held_effect'),
    $$VALUES ('unknown', '{"receipt_id": "ch_1"}'::jsonb)$$,
    'the recovered receipt is unknown and carries the handler''s answer'
);

-- With the lease gone too, finish_step refuses, and keep_lost_receipt records it.
SELECT throws_ok(
    format(
        $$SELECT orch8.finish_step('lr', %L, %L, 'charge', 0, %L, 'ok', '{}')$$,
        :'lost', :'lost_token', :'lost_effect'
    ),
    'O8001', NULL, 'finish_step refuses a lease the new primary never saw'
);
SELECT throws_ok(
    format(
        $$SELECT orch8.keep_lost_receipt('lr', %L, 'charge', 0, %L, 'ok', '{}', NULL)$$,
        :'lost', gen_random_uuid()
    ),
    'O8009', NULL, 'keep_lost_receipt records only the id begin_step derives'
);
SELECT throws_ok(
    format(
        $$SELECT orch8.keep_lost_receipt('lr', %L, 'charge', 0, %L, 'maybe', '{}', NULL)$$,
        :'lost', :'lost_effect'
    ),
    'O8008', NULL, 'keep_lost_receipt refuses a result that is not ok, error or not_applied'
);
SELECT throws_ok(
    format(
        $$SELECT orch8.keep_lost_receipt('lr', %L, 'charge', 0, %L, 'ok', '{}', NULL)$$,
        gen_random_uuid(), :'lost_effect'
    ),
    'O8007', NULL, 'keep_lost_receipt refuses an unknown instance'
);
SELECT ok(
    orch8.keep_lost_receipt(
        'lr', :'lost', 'charge', 0, :'lost_effect', 'ok',
        '{"receipt_id": "ch_2"}', NULL
    ),
    'keep_lost_receipt records the missing receipt'
);
SELECT results_eq(
    format($$SELECT state::text, (evidence ->> 'recovered_after_lost_write')::boolean,
                    evidence -> 'handler_output'
             FROM orch8.effect_receipts WHERE id = %L$$, :'lost_effect'),
    $$VALUES ('unknown', true, '{"receipt_id": "ch_2"}'::jsonb)$$,
    'kept as unknown, marked recovered, with the answer'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.unresolved_effects
        WHERE effect_id = :'lost_effect'
    ),
    1, 'the kept receipt is in the unresolved queue'
);
SELECT ok(
    NOT orch8.keep_lost_receipt('lr', :'lost', 'charge', 0, :'lost_effect', 'ok', '{}', NULL),
    'a second call finds the receipt and writes nothing'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.effect_receipt_events
        WHERE receipt_id = :'lost_effect'
    ),
    4, 'recorded once: planned, prepared, dispatched, unknown'
);
SELECT is(
    (
        SELECT state::text FROM orch8.task_instances
        WHERE id = :'lost'
    ),
    'scheduled', 'keep_lost_receipt does not move the instance'
);

-- The runner's batch: a receipt that exists answers nothing, a refused one answers why.
SELECT results_eq(
    format(
        $$SELECT effect_id, left(outcome, 5) FROM orch8.keep_lost_receipts(jsonb_build_array(
            jsonb_build_object('tenant_id', 'lr', 'instance_id', %L, 'block_id', 'charge',
                               'attempt', 0, 'effect_id', %L, 'result', 'ok', 'output', '{}'),
            jsonb_build_object('tenant_id', 'lr', 'instance_id', %L, 'block_id', 'charge',
                               'attempt', 0, 'effect_id', %L, 'result', 'ok', 'output', '{}')))$$,
        :'lost', :'lost_effect', :'lost', :'held'
    ),
    format($$VALUES (%L::uuid, 'O8009')$$, :'held'),
    'keep_lost_receipts skips an existing receipt and reports a refused one'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.keep_lost_receipts('{}')$$,
    'O8008', NULL, 'keep_lost_receipts takes an array'
);

-- The next claim of the step meets the kept receipt: blocked, nothing dispatched.
UPDATE orch8.execution_nodes SET next_fire_at = orch8.now()
WHERE instance_id = :'lost' AND state = 'ready';
SELECT c.lease_token AS again
FROM orch8.claim_work('tap-runner-2', 10, '1 hour') AS c
WHERE c.id = :'lost' \gset
SELECT isnt(
    (orch8.begin_step('lr', :'lost', :'again', 'charge', 'x.pay', '{}', 0)).outcome,
    'dispatched', 'begin_step after a kept receipt does not dispatch again'
);
SELECT is(
    (
        SELECT state::text FROM orch8.effect_receipts
        WHERE id = :'lost_effect'
    ),
    'unknown', 'the kept receipt stays unknown for the operator'
);

SELECT * FROM finish();
ROLLBACK;
