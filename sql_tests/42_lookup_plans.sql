-- The receipt lookups of every guarded step are planned at each call: a plan cached
-- while the receipts table was nearly empty (a new database's first minute, before
-- autovacuum's first ANALYZE) walked the tenant's whole receipts index on every later
-- call (docs/ARCHITECTURE.md, "Lookups planned for the table they meet"). Planning at
-- each call costs, so a guarded step makes that lookup once (docs/ARCHITECTURE.md, "A
-- step reads its receipt once").
BEGIN;
SELECT plan(8);

SELECT is(
    (
        SELECT p.proconfig FROM pg_proc AS p
        WHERE p.oid = 'orch8.require_own_receipt(text, uuid, uuid, text, integer)'::regprocedure
    ),
    ARRAY['plan_cache_mode=force_custom_plan'],
    'require_own_receipt plans for the table it meets'
);

SELECT is(
    (
        SELECT p.proconfig FROM pg_proc AS p
        WHERE
            p.oid = 'orch8.swap_effect_receipt(text, uuid, orch8.effect_state, orch8.effect_state, '
            'jsonb)'::regprocedure
    ),
    ARRAY['plan_cache_mode=force_custom_plan'],
    'swap_effect_receipt (the work of cas_effect_receipt) plans for the table it meets'
);

SELECT is(
    (
        SELECT p.proconfig FROM pg_proc AS p
        WHERE p.oid = 'orch8.load_effect_receipt(text, uuid)'::regprocedure
    ),
    ARRAY['plan_cache_mode=force_custom_plan'],
    'load_effect_receipt plans for the table it meets'
);

-- A guarded step from begin to a successful finish, counting the calls of this transaction
-- (pg_stat_get_xact_function_calls counts while track_functions is on).
SET LOCAL track_functions = 'all';
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:00+00', true);
CREATE TEMP TABLE step (instance_id uuid, token uuid, effect_id uuid);
INSERT INTO step (instance_id)
SELECT (orch8.create_instance('lp', s.id)).id
FROM orch8.create_sequence('lp', 'tap', 'pay', '{"blocks": [
    {"id": "charge", "type": "step", "handler": "x.pay", "params": {"amount": 5}}]}') AS s;
UPDATE step SET token = c.lease_token
FROM orch8.claim_work('tap-runner', 10, '1 hour') AS c
WHERE c.id = step.instance_id;
UPDATE step SET effect_id = (orch8.begin_step(
    'lp', step.instance_id, step.token, 'charge', 'x.pay', '{"amount": 5}', 0
)).effect_id;

SELECT is(
    pg_stat_get_xact_function_calls(
        'orch8.require_own_receipt(text, uuid, uuid, text, integer)'::regprocedure
    ),
    NULL,
    'begin_step does not read back the receipt it has just written'
);


SELECT
    orch8.finish_step(
        'lp', step.instance_id, step.token, 'charge', 0, step.effect_id, 'ok',
        '{"receipt_id": "ch_1"}'
    )
FROM step;

SELECT is(
    pg_stat_get_xact_function_calls(
        'orch8.require_own_receipt(text, uuid, uuid, text, integer)'::regprocedure
    ),
    1::bigint,
    'finish_step checks whose the receipt is with one read'
);

SELECT is(
    pg_stat_get_xact_function_calls('orch8.load_effect_receipt(text, uuid)'::regprocedure),
    NULL,
    'and settles it without reading it again (the CAS answers the row it wrote)'
);

SELECT is(
    (SELECT r.state::text FROM orch8.effect_receipts AS r INNER JOIN step ON r.id = step.effect_id),
    'committed',
    'and the receipt is committed'
);

-- find_unresolved_effect_receipt no longer searches the receipts by position (every month
-- of them): it derives the position's ids (any epoch up to the scope's) and looks them up
-- in open_receipts; 13_begin_effect finds a dispatched one that way
SELECT is(
    (
        SELECT
            (orch8.find_unresolved_effect_receipt(
                'lp', c.continuity_id, step.instance_id, 'charge', 0, c.effect_id_version, 2
            )).id
        FROM step
        INNER JOIN orch8.continuity_executions AS c
            ON c.tenant_id = 'lp' AND step.instance_id = c.current_instance_id
    ),
    NULL,
    'a settled receipt is not found: only dispatched and unknown ones are in open_receipts'
);

SELECT * FROM finish();
ROLLBACK;
