-- Effect receipt states: the whole transition matrix, and its enforcement by the
-- database itself (triggers), whatever the write path.
BEGIN;
SELECT plan(31);
-- the instances the vectors name (a receipt needs a real instance)
SELECT
    tap.instances(
        't1',
        ARRAY[
            '00000000-0000-0000-0000-0000000000a1',
            '00000000-0000-0000-0000-0000000000c7',
            '00000000-0000-0000-0000-0000000000e1',
            '00000000-0000-0000-0000-0000000000e2',
            '00000000-0000-0000-0000-0000000000e3'
        ]::uuid[]
    );

-- 1. The state machine --------------------------------------------------------------------

SELECT enum_has_labels(
    'orch8', 'effect_state',
    ARRAY[
        'planned', 'prepared', 'dispatched', 'committed',
        'unknown', 'verified', 'compensated', 'abandoned'
    ],
    'effect_state has the eight states in order'
);

SELECT results_eq(
    $$SELECT e.from_state::text, e.to_state::text FROM orch8.effect_transitions AS e
      ORDER BY e.from_state, e.to_state$$,
    $$VALUES
        ('planned', 'prepared'),
        ('planned', 'abandoned'),
        ('prepared', 'dispatched'),
        ('prepared', 'abandoned'),
        ('dispatched', 'committed'),
        ('dispatched', 'unknown'),
        ('committed', 'compensated'),
        ('unknown', 'committed'),
        ('unknown', 'verified'),
        ('unknown', 'compensated'),
        ('unknown', 'abandoned'),
        ('verified', 'compensated')$$,
    'effect_transitions lists exactly the allowed moves'
);

-- All 64 pairs. Columns in enum order:
-- planned, prepared, dispatched, committed, unknown, verified, compensated, abandoned.
SELECT results_eq(
    $$SELECT f.state::text,
             array_agg(orch8.can_transition_to(f.state, t.state) ORDER BY t.state)
      FROM unnest(enum_range(NULL::orch8.effect_state)) AS f (state)
      CROSS JOIN unnest(enum_range(NULL::orch8.effect_state)) AS t (state)
      GROUP BY f.state
      ORDER BY f.state$$,
    $$VALUES
        ('planned', ARRAY[false, true, false, false, false, false, false, true]),
        ('prepared', ARRAY[false, false, true, false, false, false, false, true]),
        ('dispatched', ARRAY[false, false, false, true, true, false, false, false]),
        ('committed', ARRAY[false, false, false, false, false, false, true, false]),
        ('unknown', ARRAY[false, false, false, true, false, true, true, true]),
        ('verified', ARRAY[false, false, false, false, false, false, true, false]),
        ('compensated', ARRAY[false, false, false, false, false, false, false, false]),
        ('abandoned', ARRAY[false, false, false, false, false, false, false, false])$$,
    'can_transition_to gives the expected boolean for every one of the 64 pairs'
);

SELECT is(
    (
        SELECT count(*)::integer
        FROM unnest(enum_range(NULL::orch8.effect_state)) AS f (state)
        CROSS JOIN unnest(enum_range(NULL::orch8.effect_state)) AS t (state)
        WHERE orch8.can_transition_to(f.state, t.state) IS NOT NULL
    ),
    64,
    'can_transition_to answers true or false (never NULL) for all 64 pairs'
);

SELECT is(
    orch8.can_transition_to(NULL, 'planned'), NULL,
    'can_transition_to is strict: NULL in, NULL out'
);

-- 2. Enforcement in the database ----------------------------------------------------------
-- Nothing in this file calls a ledger function that sets orch8.event_actor before the direct
-- writes below, so the trigger must attribute them to current_user.

SELECT orch8.ensure_effect_scope('t1', '00000000-0000-0000-0000-0000000000a1');

SELECT lives_ok(
    $$INSERT INTO orch8.effect_receipts (
          tenant_id, id, continuity_id, epoch, instance_id, block_id, attempt, kind, handler,
          destination_fingerprint, request_sha256
      ) VALUES (
          't1', '00000000-0000-0000-0000-0000000000e1',
          orch8.effect_scope_id('orch8-effect-scope-v1', '00000000-0000-0000-0000-0000000000a1'),
          0, '00000000-0000-0000-0000-0000000000a1', 'pay', 0, 'http', 'http_request',
          repeat('a', 64), repeat('b', 64)
      )$$,
    'a direct INSERT of a planned receipt is allowed'
);

SELECT throws_ok(
    $$INSERT INTO orch8.effect_receipts (
          tenant_id, id, continuity_id, epoch, instance_id, block_id, attempt, kind, state,
          handler, destination_fingerprint, request_sha256
      ) VALUES (
          't1', '00000000-0000-0000-0000-0000000000e2',
          orch8.effect_scope_id('orch8-effect-scope-v1', '00000000-0000-0000-0000-0000000000a1'),
          0, '00000000-0000-0000-0000-0000000000a1', 'pay', 1, 'http', 'prepared',
          'http_request', repeat('a', 64), repeat('b', 64)
      )$$,
    'O8004', NULL,
    'a direct INSERT in state prepared is refused (O8004)'
);

SELECT throws_ok(
    $$INSERT INTO orch8.effect_receipts (
          tenant_id, id, continuity_id, epoch, instance_id, block_id, attempt, kind, state,
          handler, destination_fingerprint, request_sha256
      ) VALUES (
          't1', '00000000-0000-0000-0000-0000000000e3',
          orch8.effect_scope_id('orch8-effect-scope-v1', '00000000-0000-0000-0000-0000000000a1'),
          0, '00000000-0000-0000-0000-0000000000a1', 'pay', 2, 'http', 'committed',
          'http_request', repeat('a', 64), repeat('b', 64)
      )$$,
    'O8004', NULL,
    'a direct INSERT in state committed is refused (O8004)'
);

SELECT throws_ok(
    $$UPDATE orch8.effect_receipts SET state = 'dispatched'
      WHERE tenant_id = 't1' AND id = '00000000-0000-0000-0000-0000000000e1'$$,
    'O8004', NULL,
    'a direct UPDATE planned -> dispatched (skipping prepared) is refused (O8004)'
);

SELECT throws_ok(
    $$UPDATE orch8.effect_receipts SET state = 'committed'
      WHERE tenant_id = 't1' AND id = '00000000-0000-0000-0000-0000000000e1'$$,
    'O8004', NULL,
    'a direct UPDATE planned -> committed is refused (O8004)'
);

SELECT lives_ok(
    $$UPDATE orch8.effect_receipts SET state = 'prepared'
      WHERE tenant_id = 't1' AND id = '00000000-0000-0000-0000-0000000000e1'$$,
    'a direct UPDATE planned -> prepared is allowed'
);

SELECT results_eq(
    $$SELECT from_state, to_state, actor FROM orch8.effect_receipt_events
      WHERE tenant_id = 't1' AND receipt_id = '00000000-0000-0000-0000-0000000000e1'
      ORDER BY event_id$$,
    $$VALUES
        (NULL::orch8.effect_state, 'planned'::orch8.effect_state, current_user::text COLLATE "default"),
        ('planned'::orch8.effect_state, 'prepared'::orch8.effect_state, current_user::text COLLATE "default")$$,
    'the direct INSERT and the allowed direct UPDATE are recorded as events by current_user'
);

SELECT throws_ok(
    $$UPDATE orch8.effect_receipts SET error = 'a note from a DBA'
      WHERE tenant_id = 't1' AND id = '00000000-0000-0000-0000-0000000000e1'$$,
    'O8004', NULL,
    'error, evidence or provider receipt id change only with a state move (which records it)'
);

SELECT lives_ok(
    $$UPDATE orch8.effect_receipts SET updated_at = updated_at
      WHERE tenant_id = 't1' AND id = '00000000-0000-0000-0000-0000000000e1'$$,
    'an UPDATE that changes nothing of the record is allowed'
);

SELECT is(
    (
        SELECT count(*)::integer FROM orch8.effect_receipt_events
        WHERE tenant_id = 't1' AND receipt_id = '00000000-0000-0000-0000-0000000000e1'
    ),
    2,
    'an UPDATE that does not change the state records no event'
);

SELECT throws_ok(
    $$UPDATE orch8.effect_receipts SET block_id = 'other'
      WHERE tenant_id = 't1' AND id = '00000000-0000-0000-0000-0000000000e1'$$,
    'O8004', NULL,
    'changing block_id of a receipt is refused (O8004)'
);

SELECT throws_ok(
    $$UPDATE orch8.effect_receipts SET request_sha256 = repeat('c', 64)
      WHERE tenant_id = 't1' AND id = '00000000-0000-0000-0000-0000000000e1'$$,
    'O8004', NULL,
    'changing request_sha256 of a receipt is refused (O8004)'
);

SELECT throws_ok(
    $$UPDATE orch8.effect_receipts SET attempt = 5, created_at = created_at - interval '1 day'
      WHERE tenant_id = 't1' AND id = '00000000-0000-0000-0000-0000000000e1'$$,
    'O8004', NULL,
    'changing attempt and created_at of a receipt is refused (O8004)'
);

SELECT throws_ok(
    $$DELETE FROM orch8.effect_receipts
      WHERE tenant_id = 't1' AND id = '00000000-0000-0000-0000-0000000000e1'$$,
    'O8004', NULL,
    'deleting a receipt is refused (O8004)'
);

SELECT throws_ok(
    'TRUNCATE orch8.effect_receipts, orch8.effect_receipt_events, orch8.effect_verifications, '
    'orch8.worker_tasks, orch8.worker_task_events',
    'O8004', NULL,
    'TRUNCATE of effect_receipts (with what refers to it) is refused (O8004)'
);

SELECT is(
    (
        SELECT state FROM orch8.effect_receipts
        WHERE tenant_id = 't1' AND id = '00000000-0000-0000-0000-0000000000e1'
    ),
    'prepared'::orch8.effect_state,
    'after the refused writes the receipt is still prepared'
);

-- unknown never returns to dispatched, even by hand
UPDATE orch8.effect_receipts SET state = 'dispatched'
WHERE tenant_id = 't1' AND id = '00000000-0000-0000-0000-0000000000e1';
UPDATE orch8.effect_receipts SET state = 'unknown'
WHERE tenant_id = 't1' AND id = '00000000-0000-0000-0000-0000000000e1';

SELECT throws_ok(
    $$UPDATE orch8.effect_receipts SET state = 'dispatched'
      WHERE tenant_id = 't1' AND id = '00000000-0000-0000-0000-0000000000e1'$$,
    'O8004', NULL,
    'a direct UPDATE unknown -> dispatched is refused (O8004)'
);

-- The history tables are append-only.

SELECT throws_ok(
    $$UPDATE orch8.effect_receipt_events SET actor = 'someone else'
      WHERE tenant_id = 't1' AND receipt_id = '00000000-0000-0000-0000-0000000000e1'$$,
    'O8004', NULL,
    'UPDATE on effect_receipt_events is refused (O8004)'
);

SELECT throws_ok(
    $$DELETE FROM orch8.effect_receipt_events
      WHERE tenant_id = 't1' AND receipt_id = '00000000-0000-0000-0000-0000000000e1'$$,
    'O8004', NULL,
    'DELETE on effect_receipt_events is refused (O8004)'
);

SELECT throws_ok(
    'TRUNCATE orch8.effect_receipt_events',
    'O8004', NULL,
    'TRUNCATE on effect_receipt_events is refused (O8004)'
);

SELECT orch8.declare_invariant(
    't1', 'one charge', '{"type": "effect_at_most_once", "kind": "http"}', true,
    p_instance_id := '00000000-0000-0000-0000-0000000000a1'
);

SELECT lives_ok(
    $$INSERT INTO orch8.invariant_results (
          tenant_id, invariant_id, continuity_id, epoch, instance_id, block_id, status,
          effect_id, evidence, dedupe_key
      )
      SELECT 't1', i.id, c.continuity_id, 0, c.current_instance_id, 'pay', 'pass',
             '00000000-0000-0000-0000-0000000000e1', '{}', 'k1'
      FROM orch8.workflow_invariants AS i
      CROSS JOIN orch8.continuity_executions AS c
      WHERE i.tenant_id = 't1' AND c.tenant_id = 't1'$$,
    'appending to invariant_results is allowed'
);

SELECT throws_ok(
    $$UPDATE orch8.invariant_results SET status = 'fail' WHERE tenant_id = 't1'$$,
    'O8004', NULL,
    'UPDATE on invariant_results is refused (O8004)'
);

SELECT throws_ok(
    $$DELETE FROM orch8.invariant_results WHERE tenant_id = 't1'$$,
    'O8004', NULL,
    'DELETE on invariant_results is refused (O8004)'
);

SELECT throws_ok(
    $$TRUNCATE orch8.invariant_results$$,
    'O8004', NULL,
    'TRUNCATE on invariant_results is refused (O8004)'
);

-- A direct write after a ledger call in the same transaction is credited to
-- current_user, not to the actor the ledger call named.
SELECT ok(
    (
        SELECT b.outcome = 'dispatched'
        FROM orch8.begin_effect(
            't1', '00000000-0000-0000-0000-0000000000c7', 'pay', 'http_request',
            '{"url": "https://x.example"}', 0
        ) AS b
    ),
    'a receipt to resolve'
);

SELECT orch8.mark_effect_unknown('t1', r.id, 'timeout')
FROM orch8.effect_receipts AS r
WHERE r.instance_id = '00000000-0000-0000-0000-0000000000c7';

SELECT
    orch8.resolve_effect(
        't1', r.id, 'unknown', 'verified', NULL, '{"looked": "dashboard"}',
        'alice'
    )
FROM orch8.effect_receipts AS r
WHERE r.instance_id = '00000000-0000-0000-0000-0000000000c7';

UPDATE orch8.effect_receipts SET state = 'compensated'
WHERE instance_id = '00000000-0000-0000-0000-0000000000c7';

SELECT ok(
    (
        SELECT e.actor = current_user AND e.note IS NULL AND e.evidence IS NULL
        FROM orch8.effect_receipt_events AS e
        INNER JOIN orch8.effect_receipts AS r
            ON e.tenant_id = r.tenant_id AND e.receipt_id = r.id
        WHERE
            r.instance_id = '00000000-0000-0000-0000-0000000000c7'
            AND e.to_state = 'compensated'
    ),
    'a direct UPDATE after resolve_effect is attributed to current_user, without her evidence'
);

SELECT * FROM finish();
ROLLBACK;
