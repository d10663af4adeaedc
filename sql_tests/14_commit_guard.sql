-- The commit guard: effect_at_most_once invariants with commit_guard make dispatch a
-- serialised, content-checked decision (orch8.dispatch_effect_receipt_at_most_once).
-- Receipt ids for instance a1 were computed in Python (see 11_effect_ids.sql); a new
-- scope is of effect id version 2, whose ids begin with the instance id's first six
-- bytes, all zero here:
--   (charge, 0)       00000000-0000-8c4b-b8b1-cee7091cecd9
--   (charge-again, 0) 00000000-0000-854f-a1e9-547ccd95ab0b
--   (charge, 1)       00000000-0000-8882-ad8b-637cfe7533d1
BEGIN;
SELECT plan(39);
-- the instances the vectors name (a receipt needs a real instance)
SELECT
    tap.instances(
        't1',
        ARRAY[
            '00000000-0000-0000-0000-0000000000a1',
            '00000000-0000-0000-0000-0000000000a2',
            '00000000-0000-0000-0000-0000000000a3',
            '00000000-0000-0000-0000-0000000000b1',
            '00000000-0000-0000-0000-0000000000b9',
            '00000000-0000-0000-0000-0000000000c1',
            '00000000-0000-0000-0000-0000000000c2',
            '00000000-0000-0000-0000-0000000000d1',
            '00000000-0000-0000-0000-0000000000d2',
            '00000000-0000-0000-0000-0000000000e1',
            '00000000-0000-0000-0000-0000000000e2',
            '00000000-0000-0000-0000-0000000000f1',
            '00000000-0000-0000-0000-0000000000f2'
        ]::uuid[]
    );
SELECT tap.instances('t2', ARRAY['00000000-0000-0000-0000-0000000000b1']::uuid[]);

CREATE TEMP TABLE inv AS
SELECT * FROM orch8.declare_invariant(
    't1', 'one charge', '{"type": "effect_at_most_once", "kind": "http"}', true,
    p_instance_id := '00000000-0000-0000-0000-0000000000a1'
);

SELECT results_eq(
    $$SELECT name, commit_guard, enabled, instance_id, sequence_id FROM inv$$,
    $$VALUES ('one charge', true, true, '00000000-0000-0000-0000-0000000000a1'::uuid,
              NULL::uuid)$$,
    'declare_invariant stores an instance-scoped commit guard'
);

-- 1. Through begin_effect ----------------------------------------------------------------

CREATE TEMP TABLE o1 AS
SELECT * FROM orch8.begin_effect(
    't1', '00000000-0000-0000-0000-0000000000a1', 'charge', 'http_request',
    '{"url": "https://pay.example/charges", "body": {"amount": 1200}}', 0
);

SELECT results_eq(
    'SELECT outcome, effect_id, state, invariant_id, competing_effect_id FROM o1',
    $$VALUES ('dispatched', '00000000-0000-8c4b-b8b1-cee7091cecd9'::uuid,
              'dispatched'::orch8.effect_state, NULL::uuid, NULL::uuid)$$,
    'the first guarded begin dispatches'
);

SELECT results_eq(
    $$SELECT status, invariant_id, effect_id, competing_effect_id, block_id
      FROM orch8.invariant_results WHERE tenant_id = 't1' ORDER BY id$$,
    $$SELECT 'pass', id, '00000000-0000-8c4b-b8b1-cee7091cecd9'::uuid, NULL::uuid, 'charge'
      FROM inv$$,
    'a pass result is recorded for the first dispatch'
);

SELECT results_eq(
    $$SELECT from_state, to_state, note FROM orch8.effect_receipt_events
      WHERE tenant_id = 't1' AND receipt_id = '00000000-0000-8c4b-b8b1-cee7091cecd9'
        AND to_state = 'dispatched'$$,
    $$VALUES ('prepared'::orch8.effect_state, 'dispatched'::orch8.effect_state,
              'guarded dispatch')$$,
    'the dispatch went through the guard (event note "guarded dispatch")'
);

CREATE TEMP TABLE o2 AS
SELECT * FROM orch8.begin_effect(
    't1', '00000000-0000-0000-0000-0000000000a1', 'charge-again', 'http_request',
    '{"body": {"amount": 1200}, "url": "https://pay.example/charges"}', 0
);

SELECT results_eq(
    'SELECT outcome, effect_id, state, invariant_id, competing_effect_id FROM o2',
    $$SELECT 'duplicate', '00000000-0000-854f-a1e9-547ccd95ab0b'::uuid,
             'prepared'::orch8.effect_state, id, '00000000-0000-8c4b-b8b1-cee7091cecd9'::uuid
      FROM inv$$,
    'identical content on another block: duplicate, naming the invariant and the holder'
);

SELECT is(
    (
        SELECT state FROM orch8.effect_receipts
        WHERE tenant_id = 't1' AND id = '00000000-0000-854f-a1e9-547ccd95ab0b'
    ),
    'prepared'::orch8.effect_state,
    'the refused candidate receipt stays prepared'
);

SELECT results_eq(
    $$SELECT status, effect_id, competing_effect_id, block_id
      FROM orch8.invariant_results WHERE tenant_id = 't1' AND status = 'fail'$$,
    $$VALUES ('fail', '00000000-0000-854f-a1e9-547ccd95ab0b'::uuid,
              '00000000-0000-8c4b-b8b1-cee7091cecd9'::uuid, 'charge-again')$$,
    'one fail result names the candidate and the competing receipt'
);

CREATE TEMP TABLE o3 AS
SELECT * FROM orch8.begin_effect(
    't1', '00000000-0000-0000-0000-0000000000a1', 'charge', 'http_request',
    '{"url": "https://pay.example/charges", "body": {"amount": 1200}}', 1
);

-- every receipt here has the transaction's created_at, so (created_at, id) order is id
-- order: charge-again's prepared receipt comes before this one and is the competitor named
SELECT results_eq(
    'SELECT outcome, effect_id, state, competing_effect_id FROM o3',
    $$VALUES ('duplicate', '00000000-0000-8882-ad8b-637cfe7533d1'::uuid,
              'prepared'::orch8.effect_state, '00000000-0000-854f-a1e9-547ccd95ab0b'::uuid)$$,
    'a third identical attempt (charge, attempt 1) is a duplicate too'
);

SELECT results_eq(
    $$SELECT status, count(*)::integer FROM orch8.invariant_results WHERE tenant_id = 't1'
      GROUP BY status ORDER BY status$$,
    $$VALUES ('fail', 1), ('pass', 1)$$,
    'the repeated duplicate is deduplicated: still one fail row'
);

SELECT results_eq(
    $$SELECT outcome, effect_id, state FROM orch8.begin_effect(
          't1', '00000000-0000-0000-0000-0000000000a1', 'charge-again', 'http_request',
          '{"url": "https://pay.example/charges", "body": {"amount": 1200}}', 0)$$,
    $$VALUES ('duplicate', '00000000-0000-854f-a1e9-547ccd95ab0b'::uuid,
              'prepared'::orch8.effect_state)$$,
    're-beginning the prepared candidate goes through the guard again: duplicate'
);

SELECT results_eq(
    $$SELECT outcome, state FROM orch8.begin_effect(
          't1', '00000000-0000-0000-0000-0000000000a1', 'refund', 'http_request',
          '{"url": "https://pay.example/charges", "body": {"amount": -1200}}', 0)$$,
    $$VALUES ('dispatched', 'dispatched'::orch8.effect_state)$$,
    'different content under the same guard dispatches'
);

SELECT results_eq(
    $$SELECT status, count(*)::integer FROM orch8.invariant_results WHERE tenant_id = 't1'
      GROUP BY status ORDER BY status$$,
    $$VALUES ('fail', 1), ('pass', 2)$$,
    'the new content got its own pass row'
);

CREATE TEMP TABLE o_model AS
SELECT * FROM orch8.begin_effect(
    't1', '00000000-0000-0000-0000-0000000000a1', 'ask', 'llm_call',
    '{"model": "m", "prompt": "hi"}', 0
);
SELECT orch8.begin_effect(
    't1', '00000000-0000-0000-0000-0000000000a1', 'ask-again', 'llm_call',
    '{"model": "m", "prompt": "hi"}', 0
);

SELECT results_eq(
    $$SELECT block_id::text, state FROM orch8.effect_receipts
      WHERE tenant_id = 't1' AND kind = 'model' ORDER BY block_id$$,
    $$VALUES ('ask', 'dispatched'::orch8.effect_state),
             ('ask-again', 'dispatched'::orch8.effect_state)$$,
    'an effect kind without a guard (model) is not content-checked'
);

SELECT is(
    (
        SELECT count(*)::integer FROM orch8.invariant_results AS r
        INNER JOIN orch8.effect_receipts AS e ON r.tenant_id = e.tenant_id AND r.effect_id = e.id
        WHERE e.kind = 'model'
    ),
    0,
    'no invariant result for an unguarded kind'
);

SELECT results_eq(
    $$SELECT outcome, state FROM orch8.begin_effect(
          't1', '00000000-0000-0000-0000-0000000000a2', 'charge', 'http_request',
          '{"url": "https://pay.example/charges", "body": {"amount": 1200}}', 0)$$,
    $$VALUES ('dispatched', 'dispatched'::orch8.effect_state)$$,
    'the guard is scoped to instance a1: the same content in instance a2 dispatches'
);

-- 2. The guarded dispatch directly: older wins -------------------------------------------
-- Instance a3, guarded too. Receipts are written by hand with controlled created_at.

CREATE TEMP TABLE inv3 AS
SELECT * FROM orch8.declare_invariant(
    't1', 'one charge (a3)', '{"type": "effect_at_most_once", "kind": "http"}', true,
    p_instance_id := '00000000-0000-0000-0000-0000000000a3'
);

CREATE TEMP TABLE scope3 AS
SELECT * FROM orch8.ensure_effect_scope('t1', '00000000-0000-0000-0000-0000000000a3');

-- A temp helper: a prepared (or planned) receipt of instance a3 created at a given time.
CREATE FUNCTION pg_temp.receipt_at(
    p_id uuid, p_block text, p_request text, p_at text, p_prepare boolean DEFAULT true
)
RETURNS uuid
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM set_config('orch8.fake_now', p_at, true);
    PERFORM orch8.ensure_effect_receipt(
        't1', p_id, s.continuity_id, 0, s.current_instance_id, p_block, 0, 'http',
        'http_request', repeat('d', 64), p_request
    ) FROM scope3 AS s;
    IF p_prepare THEN
        PERFORM orch8.cas_effect_receipt('t1', p_id, 'planned', 'prepared');
    END IF;
    PERFORM set_config('orch8.fake_now', '', true);
    RETURN p_id;
END
$$;

-- The younger receipt gets the SMALLER id, so only created_at can make the older one win.
SELECT pg_temp.receipt_at(
    '00000000-0000-0000-0000-0000000000b9', 'older', repeat('e', 64), '2030-01-01 00:00:00+00'
);
SELECT pg_temp.receipt_at(
    '00000000-0000-0000-0000-0000000000b1', 'younger', repeat('e', 64), '2030-01-01 00:00:10+00'
);

SELECT ok(
    (
        SELECT created_at FROM orch8.effect_receipts
        WHERE id = '00000000-0000-0000-0000-0000000000b9'
    )
    < (
        SELECT created_at FROM orch8.effect_receipts
        WHERE id = '00000000-0000-0000-0000-0000000000b1'
    ),
    'setup: receipt b9 was created before b1'
);

SELECT results_eq(
    $$SELECT outcome, effect_id, state, invariant_id, competing_effect_id
      FROM orch8.dispatch_effect_receipt_at_most_once(
          't1', '00000000-0000-0000-0000-0000000000b1')$$,
    $$SELECT 'duplicate', '00000000-0000-0000-0000-0000000000b1'::uuid,
             'prepared'::orch8.effect_state, id, '00000000-0000-0000-0000-0000000000b9'::uuid
      FROM inv3$$,
    'two prepared receipts with the same content: the younger is a duplicate of the older'
);

SELECT results_eq(
    $$SELECT outcome, effect_id, state, competing_effect_id
      FROM orch8.dispatch_effect_receipt_at_most_once(
          't1', '00000000-0000-0000-0000-0000000000b9')$$,
    $$VALUES ('dispatched', '00000000-0000-0000-0000-0000000000b9'::uuid,
              'dispatched'::orch8.effect_state, NULL::uuid)$$,
    'the older one dispatches'
);

SELECT results_eq(
    $$SELECT outcome, state, competing_effect_id
      FROM orch8.dispatch_effect_receipt_at_most_once(
          't1', '00000000-0000-0000-0000-0000000000b1')$$,
    $$VALUES ('duplicate', 'prepared'::orch8.effect_state,
              '00000000-0000-0000-0000-0000000000b9'::uuid)$$,
    'the younger is still a duplicate once the older is dispatched'
);

-- Same created_at: the smaller id is the older. b2 is written first.
SELECT pg_temp.receipt_at(
    '00000000-0000-0000-0000-0000000000c2', 'tie-2', repeat('f', 64), '2030-01-02 00:00:00+00'
);
SELECT pg_temp.receipt_at(
    '00000000-0000-0000-0000-0000000000c1', 'tie-1', repeat('f', 64), '2030-01-02 00:00:00+00'
);

SELECT results_eq(
    $$SELECT outcome, competing_effect_id
      FROM orch8.dispatch_effect_receipt_at_most_once(
          't1', '00000000-0000-0000-0000-0000000000c2')$$,
    $$VALUES ('duplicate', '00000000-0000-0000-0000-0000000000c1'::uuid)$$,
    'a created_at tie is broken by id: c2 is a duplicate of c1'
);

SELECT results_eq(
    $$SELECT outcome, state
      FROM orch8.dispatch_effect_receipt_at_most_once(
          't1', '00000000-0000-0000-0000-0000000000c1')$$,
    $$VALUES ('dispatched', 'dispatched'::orch8.effect_state)$$,
    'and c1 dispatches'
);

-- A younger receipt already dispatched (e.g. without the guard) blocks an older prepared one.
SELECT pg_temp.receipt_at(
    '00000000-0000-0000-0000-0000000000d1', 'old-prepared', repeat('1', 64),
    '2030-01-03 00:00:00+00'
);
SELECT pg_temp.receipt_at(
    '00000000-0000-0000-0000-0000000000d2', 'young-dispatched', repeat('1', 64),
    '2030-01-03 00:00:10+00'
);
SELECT orch8.cas_effect_receipt(
    't1', '00000000-0000-0000-0000-0000000000d2', 'prepared', 'dispatched'
);

SELECT results_eq(
    $$SELECT outcome, state, competing_effect_id
      FROM orch8.dispatch_effect_receipt_at_most_once(
          't1', '00000000-0000-0000-0000-0000000000d1')$$,
    $$VALUES ('duplicate', 'prepared'::orch8.effect_state,
              '00000000-0000-0000-0000-0000000000d2'::uuid)$$,
    'a dispatched receipt with the same content blocks even an older prepared one'
);

-- Abandoned and compensated receipts do not block.
SELECT pg_temp.receipt_at(
    '00000000-0000-0000-0000-0000000000e1', 'old-abandoned', repeat('2', 64),
    '2030-01-04 00:00:00+00', false
);
SELECT orch8.cas_effect_receipt(
    't1', '00000000-0000-0000-0000-0000000000e1', 'planned', 'abandoned'
);
SELECT pg_temp.receipt_at(
    '00000000-0000-0000-0000-0000000000e2', 'young', repeat('2', 64), '2030-01-04 00:00:10+00'
);

SELECT results_eq(
    $$SELECT outcome, state, competing_effect_id
      FROM orch8.dispatch_effect_receipt_at_most_once(
          't1', '00000000-0000-0000-0000-0000000000e2')$$,
    $$VALUES ('dispatched', 'dispatched'::orch8.effect_state, NULL::uuid)$$,
    'an older abandoned receipt with the same content does not block'
);

SELECT pg_temp.receipt_at(
    '00000000-0000-0000-0000-0000000000f1', 'old-compensated', repeat('3', 64),
    '2030-01-05 00:00:00+00'
);
SELECT orch8.cas_effect_receipt(
    't1', '00000000-0000-0000-0000-0000000000f1', 'prepared', 'dispatched'
);
SELECT orch8.cas_effect_receipt(
    't1', '00000000-0000-0000-0000-0000000000f1', 'dispatched', 'committed'
);
SELECT orch8.cas_effect_receipt(
    't1', '00000000-0000-0000-0000-0000000000f1', 'committed', 'compensated'
);
SELECT pg_temp.receipt_at(
    '00000000-0000-0000-0000-0000000000f2', 'young', repeat('3', 64), '2030-01-05 00:00:10+00'
);

SELECT results_eq(
    $$SELECT outcome, state
      FROM orch8.dispatch_effect_receipt_at_most_once(
          't1', '00000000-0000-0000-0000-0000000000f2')$$,
    $$VALUES ('dispatched', 'dispatched'::orch8.effect_state)$$,
    'an older compensated receipt with the same content does not block'
);

-- Stale calls.

SELECT results_eq(
    $$SELECT outcome, effect_id, state
      FROM orch8.dispatch_effect_receipt_at_most_once(
          't1', '00000000-0000-0000-0000-0000000000b9')$$,
    $$VALUES ('stale', '00000000-0000-0000-0000-0000000000b9'::uuid,
              'dispatched'::orch8.effect_state)$$,
    'guarded dispatch of a receipt that is already dispatched: stale with its state'
);

SELECT results_eq(
    $$SELECT outcome, effect_id, state
      FROM orch8.dispatch_effect_receipt_at_most_once(
          't1', '00000000-0000-0000-0000-00000000dead')$$,
    $$VALUES ('stale', '00000000-0000-0000-0000-00000000dead'::uuid, NULL::orch8.effect_state)$$,
    'guarded dispatch of an unknown id: stale'
);

SELECT results_eq(
    $$SELECT outcome, state
      FROM orch8.dispatch_effect_receipt_at_most_once(
          't2', '00000000-0000-0000-0000-0000000000b1')$$,
    $$VALUES ('stale', NULL::orch8.effect_state)$$,
    'guarded dispatch under another tenant does not see the receipt: stale'
);

SELECT is(
    (
        SELECT state FROM orch8.effect_receipts
        WHERE tenant_id = 't1' AND id = '00000000-0000-0000-0000-0000000000b1'
    ),
    'prepared'::orch8.effect_state,
    'the stale calls changed nothing'
);

-- 3. declare_invariant refuses malformed declarations ------------------------------------

SELECT throws_ok(
    $$SELECT orch8.declare_invariant('t1', 'x', '{"type": "exactly_twice"}', false,
          p_instance_id := '00000000-0000-0000-0000-0000000000a1')$$,
    'O8005', NULL,
    'an unknown invariant type: O8005'
);

SELECT throws_ok(
    $$SELECT orch8.declare_invariant('t1', 'x', '{"kind": "http"}', false,
          p_instance_id := '00000000-0000-0000-0000-0000000000a1')$$,
    'O8005', NULL,
    'a rule without a type: O8005'
);

SELECT throws_ok(
    $$SELECT orch8.declare_invariant('t1', 'x', '["effect_at_most_once"]', false,
          p_instance_id := '00000000-0000-0000-0000-0000000000a1')$$,
    'O8005', NULL,
    'a rule that is not an object: O8005'
);

SELECT throws_ok(
    $$SELECT orch8.declare_invariant('t1', 'x', '{"type": "effect_at_most_once"}', true,
          p_instance_id := '00000000-0000-0000-0000-0000000000a1')$$,
    'O8005', NULL,
    'effect_at_most_once without a kind: O8005'
);

SELECT throws_ok(
    $$SELECT orch8.declare_invariant('t1', 'x',
          '{"type": "effect_at_most_once", "kind": "fax"}', true,
          p_instance_id := '00000000-0000-0000-0000-0000000000a1')$$,
    'O8005', NULL,
    'effect_at_most_once with an unknown kind: O8005'
);

SELECT throws_ok(
    $$SELECT orch8.declare_invariant('t1', 'x', '{"type": "no_unknown_effects"}', true,
          p_instance_id := '00000000-0000-0000-0000-0000000000a1')$$,
    'O8005', 'invariant type no_unknown_effects is not supported yet',
    'a rule type of the language that the engine does not evaluate: O8005, not supported yet'
);

SELECT throws_ok(
    $$SELECT orch8.declare_invariant('t1', 'x', '{"type": "effect_at_most_once", "kind": "http"}',
          false, p_instance_id := '00000000-0000-0000-0000-0000000000a1')$$,
    'O8005', NULL,
    'effect_at_most_once that is not a commit guard (nothing would check it): O8005'
);

SELECT throws_ok(
    $$SELECT orch8.declare_invariant('t1', 'x', '{"type": "effect_at_most_once", "kind": "http"}',
          true)$$,
    'O8005', NULL,
    'neither an instance nor a sequence: O8005'
);

SELECT throws_ok(
    $$SELECT orch8.declare_invariant('t1', 'x', '{"type": "effect_at_most_once", "kind": "http"}',
          true, p_instance_id := '00000000-0000-0000-0000-0000000000a1',
          p_sequence_id := '00000000-0000-0000-0000-0000000000ee')$$,
    'O8005', NULL,
    'both an instance and a sequence: O8005'
);

SELECT throws_ok(
    $$SELECT orch8.declare_invariant('t1', 'charge once',
          '{"type": "effect_at_most_once", "kind": "http"}', true,
          p_sequence_id := '00000000-0000-0000-0000-0000000000ee', p_sequence_version := 2)$$,
    'O8007', NULL,
    'a declaration for a sequence that does not exist: O8007'
);

SELECT lives_ok(
    $$SELECT orch8.declare_invariant('t1', 'charge once',
          '{"type": "effect_at_most_once", "kind": "http"}', true,
          p_sequence_id := (SELECT s.id FROM orch8.sequences AS s
                            WHERE s.tenant_id = 't1' AND s.name = 'fixture'),
          p_sequence_version := 2)$$,
    'a well-formed sequence-scoped declaration is accepted'
);

SELECT * FROM finish();
ROLLBACK;
