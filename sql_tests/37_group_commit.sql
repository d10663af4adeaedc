-- Group commit (begin_steps, finish_steps in sql/functions/steps.sql): a batch of runner
-- calls in one transaction, each in a subtransaction of its own: a refused call answers
-- its error and undoes only its own writes; the batch is bounded by step_batch.
BEGIN;
SELECT plan(9);

SELECT orch8.create_sequence(
    'gc', 'default', 'flow',
    '{"blocks": [{"id": "a", "type": "step", "handler": "x.pay"}]}'
);
SELECT count(
    *) FROM orch8.create_instances(
    'gc',
    (
        SELECT s.id FROM orch8.sequences AS s
        WHERE s.tenant_id = 'gc'
    ), '[{}, {}]'
);
CREATE TEMP TABLE leased AS
SELECT
    c.instance_id,
    c.lease_token,
    row_number() OVER (ORDER BY c.instance_id) AS n
FROM orch8.claim_due_nodes('tap', 10, '1 minute') AS c;

CREATE TEMP TABLE began AS
SELECT * FROM orch8.begin_steps((
    SELECT
        jsonb_agg(jsonb_build_object(
            'tenant_id', 'gc', 'instance_id', l.instance_id,
            -- the second call holds no lease
            'lease_token', CASE WHEN l.n = 1 THEN l.lease_token ELSE gen_random_uuid() END,
            'block_id', 'a', 'handler', 'x.pay', 'params', '{"amount": 1}'::jsonb, 'attempt', 0
        )
        ORDER BY l.n)
    FROM leased AS l
));

SELECT results_eq(
    'SELECT ord, outcome, error_state FROM began ORDER BY ord',
    $$VALUES (0, 'dispatched', NULL), (1, NULL, 'O8001')$$,
    'one row per call in order: the outcome, or the error the call raised'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.effect_receipts
        WHERE tenant_id = 'gc'
    ), 1,
    'the refused call wrote nothing; the other call''s receipt stays'
);
SELECT is(
    (
        SELECT error_message FROM began
        WHERE ord = 1
    ) LIKE 'lease on instance % is no '
    'longer held by this caller', true, 'the error''s message is the single call''s'
);

CREATE TEMP TABLE finished AS
SELECT * FROM orch8.finish_steps((
    SELECT
        jsonb_build_array(
            jsonb_build_object(
                'tenant_id', 'gc', 'instance_id', l.instance_id, 'lease_token', l.lease_token,
                'block_id', 'a', 'attempt', 0, 'effect_id', b.effect_id, 'result', 'ok',
                'output', '{"receipt_id": "p-9"}'::jsonb
            ),
            jsonb_build_object(
                'tenant_id', 'gc', 'instance_id', l.instance_id, 'lease_token', l.lease_token,
                'block_id', 'a', 'attempt', 0, 'result', 'maybe', 'output', '{}'::jsonb
            )
        )
    FROM leased AS l INNER JOIN began AS b ON b.ord = 0
    WHERE l.n = 1
));

SELECT results_eq(
    'SELECT ord, state::text, error_state FROM finished ORDER BY ord',
    $$VALUES (0, 'completed', NULL), (1, NULL, 'O8008')$$,
    'finish_steps: the answer, or the error'
);
SELECT is((
    SELECT state::text || ' ' || provider_receipt_id FROM orch8.effect_receipts
    WHERE tenant_id = 'gc'
), 'committed p-9', 'the finished call''s receipt committed');

SELECT throws_ok(
    format(
        $$SELECT * FROM orch8.begin_steps(%L)$$,
        (SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, orch8.limit_of('step_batch') + 1))
    ),
    'O8008', NULL, 'at most step_batch calls'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.finish_steps('{}')$$, 'O8008',
    'finish_steps takes a JSON array of calls, got object', 'an array of calls'
);
SELECT is((SELECT count(*)::integer FROM orch8.begin_steps('[]')), 0, 'an empty batch is no call');
SELECT is(
    orch8.limit_of('step_batch'), 64::bigint,
    'step_batch stays within the 64 subtransaction ids a backend caches'
);

SELECT * FROM finish();
ROLLBACK;
