-- begin_effect: everything before a side effect, without a commit guard (see
-- 14_commit_guard.sql for the guarded dispatch).
-- Expected receipt ids were computed in Python (see 11_effect_ids.sql) for continuity
-- 00000000-0000-8ff6-aee8-afd472664eaf (the scope of instance a1), epoch 0, and led by
-- the instance id's first six bytes (all zero here), as a new scope's effect id version 2
-- says.
BEGIN;
SELECT plan(34);
-- the instances the vectors name (a receipt needs a real instance)
SELECT
    tap.instances(
        't1',
        ARRAY[
            '00000000-0000-0000-0000-0000000000a0',
            '00000000-0000-0000-0000-0000000000a1',
            '00000000-0000-0000-0000-0000000000f1',
            '0193a4b5-c6d7-7e8f-9a0b-1c2d3e4f5a6b'
        ]::uuid[]
    );

SELECT has_function(
    'orch8', 'begin_effect',
    ARRAY['text', 'uuid', 'text', 'text', 'jsonb', 'integer'],
    'begin_effect(tenant, instance, block, handler, params, attempt) exists'
);

-- 1. A pure handler writes nothing -------------------------------------------------------

SELECT ok(
    orch8.begin_effect(
        't1', '00000000-0000-0000-0000-0000000000a0', 'calc', 'transform', '{"x": 1}', 0
    ) IS NULL,
    'a pure handler (transform) gives a NULL outcome'
);

SELECT is(
    (
        SELECT count(*)::integer FROM orch8.continuity_executions
        WHERE current_instance_id = '00000000-0000-0000-0000-0000000000a0'
    )
    + (
        SELECT count(*)::integer FROM orch8.effect_receipts
        WHERE instance_id = '00000000-0000-0000-0000-0000000000a0'
    ),
    0,
    'a pure handler creates neither a scope nor a receipt'
);

-- 2. The happy path ----------------------------------------------------------------------

CREATE TEMP TABLE o_first AS
SELECT * FROM orch8.begin_effect(
    't1', '00000000-0000-0000-0000-0000000000a1', 'pay', 'http_request',
    '{"url": "https://pay.example/charges", "method": "POST",
      "body": {"amount": 1200, "currency": "EUR", "note": "café"},
      "idempotency_key": "k-1"}',
    0
);

SELECT results_eq(
    $$SELECT outcome, effect_id, state, kind, block_id, attempt, invariant_id,
             competing_effect_id
      FROM o_first$$,
    $$VALUES ('dispatched', '00000000-0000-89ff-b65b-12e788efdb1a'::uuid,
              'dispatched'::orch8.effect_state, 'http', 'pay', 0, NULL::uuid, NULL::uuid)$$,
    'begin_effect of an http_request: outcome dispatched with the deterministic id'
);

SELECT is(
    (SELECT effect_id FROM o_first),
    orch8.effect_receipt_id(
        2,
        orch8.effect_scope_id('orch8-effect-scope-v1', '00000000-0000-0000-0000-0000000000a1'),
        0, '00000000-0000-0000-0000-0000000000a1', 'pay', 0
    ),
    'effect_id = effect_receipt_id(2, scope continuity, 0, instance, block, attempt)'
);

SELECT results_eq(
    $$SELECT state, continuity_id, epoch::bigint, kind::text, handler::text,
             destination_fingerprint::text, request_sha256::text, idempotency_key::text,
             provider_receipt_id::text, error
      FROM orch8.effect_receipts
      WHERE tenant_id = 't1' AND id = '00000000-0000-89ff-b65b-12e788efdb1a'$$,
    $$VALUES ('dispatched'::orch8.effect_state,
              '00000000-0000-8ff6-aee8-afd472664eaf'::uuid, 0::bigint, 'http', 'http_request',
              '8823cce3fc774a3bf746e10a74d58ca3a4a0348e2b273facbbe4ba6d72e942e5',
              '20d3cc25d803b785c7e34c9a7e0d635ac722f0548e489f1ab55927dbcb7183f6',
              'k-1', NULL::text, NULL::text)$$,
    'the receipt stores kind, handler, destination, request hash and idempotency key'
);

SELECT results_eq(
    $$SELECT from_state, to_state, actor FROM orch8.effect_receipt_events
      WHERE tenant_id = 't1' AND receipt_id = '00000000-0000-89ff-b65b-12e788efdb1a'
      ORDER BY event_id$$,
    $$VALUES
        (NULL::orch8.effect_state, 'planned'::orch8.effect_state, 'engine'),
        ('planned', 'prepared', 'engine'),
        ('prepared', 'dispatched', 'engine')$$,
    'events planned, prepared, dispatched are recorded'
);

SELECT is(
    (
        SELECT count(*)::integer FROM orch8.continuity_executions
        WHERE tenant_id = 't1' AND current_instance_id = '00000000-0000-0000-0000-0000000000a1'
    ),
    1,
    'begin_effect created the scope of the instance'
);

-- 3. The idempotency key -----------------------------------------------------------------

SELECT orch8.begin_effect(
    't1', '00000000-0000-0000-0000-0000000000a1', 'key-256', 'http_request',
    jsonb_build_object('url', 'https://x.example', 'idempotency_key', repeat('é', 128)), 0
);
SELECT throws_ok(
    $$SELECT orch8.begin_effect(
        't1', '00000000-0000-0000-0000-0000000000a1', 'key-257', 'http_request',
        jsonb_build_object('url', 'https://x.example', 'idempotency_key', repeat('k', 257)), 0
    )$$,
    'O8008',
    'the idempotency_key param is 257 bytes, over the limit of 256',
    'an idempotency_key param over 256 bytes is refused before anything is written'
);
SELECT orch8.begin_effect(
    't1', '00000000-0000-0000-0000-0000000000a1', 'key-number', 'http_request',
    '{"url": "https://x.example", "idempotency_key": 42}', 0
);
SELECT orch8.begin_effect(
    't1', '00000000-0000-0000-0000-0000000000a1', 'key-nested', 'http_request',
    '{"url": "https://x.example", "body": {"idempotency_key": "k"}}', 0
);

SELECT results_eq(
    $$SELECT block_id::text, idempotency_key = id::text, idempotency_key::text, state
      FROM orch8.effect_receipts
      WHERE tenant_id = 't1' AND block_id LIKE 'key-%'
      ORDER BY block_id$$,
    $$VALUES
        ('key-256', false, repeat('é', 128), 'dispatched'::orch8.effect_state),
        ('key-nested', true, (SELECT id::text FROM orch8.effect_receipts
                              WHERE block_id = 'key-nested'), 'dispatched'),
        ('key-number', false, '42', 'dispatched')$$,
    'idempotency_key: the param (a string, or a number as text) of <= 256 bytes; without '
    'one (a nested key does not count), the receipt''s own id'
);

-- 4. Beginning the same attempt again ----------------------------------------------------

CREATE TEMP TABLE o_again AS
SELECT * FROM orch8.begin_effect(
    't1', '00000000-0000-0000-0000-0000000000a1', 'pay', 'http_request',
    '{"url": "https://pay.example/charges", "method": "POST",
      "body": {"amount": 1200, "currency": "EUR", "note": "café"},
      "idempotency_key": "k-1"}',
    0
);

SELECT results_eq(
    'SELECT outcome, effect_id, state FROM o_again',
    $$VALUES ('blocked', '00000000-0000-89ff-b65b-12e788efdb1a'::uuid,
              'unknown'::orch8.effect_state)$$,
    're-begin of a dispatched (block, attempt): blocked, the receipt is now unknown'
);

SELECT results_eq(
    $$SELECT id, state, error IS NOT NULL FROM orch8.effect_receipts
      WHERE tenant_id = 't1' AND block_id = 'pay' AND attempt = 0$$,
    $$VALUES ('00000000-0000-89ff-b65b-12e788efdb1a'::uuid,
              'unknown'::orch8.effect_state, true)$$,
    'still one receipt for (pay, 0), now unknown with an error explaining why'
);

SELECT results_eq(
    $$SELECT from_state, to_state FROM orch8.effect_receipt_events
      WHERE tenant_id = 't1' AND receipt_id = '00000000-0000-89ff-b65b-12e788efdb1a'
      ORDER BY event_id DESC LIMIT 1$$,
    $$VALUES ('dispatched'::orch8.effect_state, 'unknown'::orch8.effect_state)$$,
    'the move dispatched -> unknown is recorded'
);

CREATE TEMP TABLE o_third AS
SELECT * FROM orch8.begin_effect(
    't1', '00000000-0000-0000-0000-0000000000a1', 'pay', 'http_request',
    '{"url": "https://pay.example/charges", "method": "POST",
      "body": {"amount": 1200, "currency": "EUR", "note": "café"},
      "idempotency_key": "k-1"}',
    0
);

SELECT results_eq(
    'SELECT outcome, effect_id, state FROM o_third',
    $$VALUES ('blocked', '00000000-0000-89ff-b65b-12e788efdb1a'::uuid,
              'unknown'::orch8.effect_state)$$,
    'beginning again while unknown: blocked, state stays unknown'
);

SELECT is(
    (
        SELECT count(*)::integer FROM orch8.effect_receipt_events
        WHERE tenant_id = 't1' AND receipt_id = '00000000-0000-89ff-b65b-12e788efdb1a'
    ),
    4,
    'blocked while unknown writes no event (planned, prepared, dispatched, unknown)'
);

-- 5. The next attempt gets a new receipt -------------------------------------------------

CREATE TEMP TABLE o_next AS
SELECT * FROM orch8.begin_effect(
    't1', '00000000-0000-0000-0000-0000000000a1', 'pay', 'http_request',
    '{"url": "https://pay.example/charges", "method": "POST",
      "body": {"amount": 1200, "currency": "EUR", "note": "café"},
      "idempotency_key": "k-1"}',
    1
);

SELECT results_eq(
    'SELECT outcome, effect_id, state, attempt FROM o_next',
    $$VALUES ('dispatched', '00000000-0000-84ec-9d92-5a6785a27efd'::uuid,
              'dispatched'::orch8.effect_state, 1)$$,
    'attempt + 1: a new receipt with its own deterministic id, dispatched'
);

SELECT results_eq(
    $$SELECT attempt::integer, state FROM orch8.effect_receipts
      WHERE tenant_id = 't1' AND block_id = 'pay' ORDER BY attempt$$,
    $$VALUES (0, 'unknown'::orch8.effect_state), (1, 'dispatched'::orch8.effect_state)$$,
    'two receipts for block pay: attempt 0 unknown, attempt 1 dispatched'
);

-- 6. A receipt already committed --------------------------------------------------------

SELECT orch8.begin_effect(
    't1', '00000000-0000-0000-0000-0000000000a1', 'ship', 'emit_event',
    '{"topic": "orders", "payload": {"id": 7}}', 0
);
SELECT orch8.commit_effect('t1', '00000000-0000-86c3-98fc-c0fb01ff8add', '{}');

CREATE TEMP TABLE o_committed AS
SELECT * FROM orch8.begin_effect(
    't1', '00000000-0000-0000-0000-0000000000a1', 'ship', 'emit_event',
    '{"topic": "orders", "payload": {"id": 7}}', 0
);

SELECT results_eq(
    'SELECT outcome, effect_id, state, kind FROM o_committed',
    $$VALUES ('blocked', '00000000-0000-86c3-98fc-c0fb01ff8add'::uuid,
              'committed'::orch8.effect_state, 'message')$$,
    'begin of a (block, attempt) already committed: blocked with state committed'
);

SELECT results_eq(
    $$SELECT count(*)::integer, min(state::text), (
          SELECT count(*)::integer FROM orch8.effect_receipt_events AS e
          WHERE e.tenant_id = 't1' AND e.receipt_id = '00000000-0000-86c3-98fc-c0fb01ff8add'
      )
      FROM orch8.effect_receipts
      WHERE tenant_id = 't1' AND block_id = 'ship'$$,
    $$VALUES (1, 'committed', 4)$$,
    'no new receipt and no new event: still one committed receipt with 4 events'
);

SELECT throws_ok(
    $$SELECT orch8.begin_effect(
          't1', '00000000-0000-0000-0000-0000000000a1', 'ship', 'emit_event',
          '{"topic": "orders", "payload": {"id": 8}}', 0)$$,
    'O8005', NULL,
    'the same (block, attempt) with different params collides with the stored receipt (O8005)'
);

-- 7. A custom handler --------------------------------------------------------------------

SELECT results_eq(
    $$SELECT outcome, state, kind FROM orch8.begin_effect(
          't1', '00000000-0000-0000-0000-0000000000a1', 'custom', 'payments.charge',
          '{"amount": 5}', 0)$$,
    $$VALUES ('dispatched', 'dispatched'::orch8.effect_state, 'worker')$$,
    'a custom handler is side-effecting with kind worker'
);

-- 8. ensure_effect_receipt and identity mismatches ---------------------------------------

SELECT results_eq(
    $$SELECT id, state, block_id::text FROM orch8.ensure_effect_receipt(
          't1', '00000000-0000-0000-0000-0000000000f1',
          '00000000-0000-8ff6-aee8-afd472664eaf', 0,
          '00000000-0000-0000-0000-0000000000a1', 'manual', 0, 'http', 'http_request',
          repeat('a', 64), repeat('b', 64))$$,
    $$VALUES ('00000000-0000-0000-0000-0000000000f1'::uuid,
              'planned'::orch8.effect_state, 'manual')$$,
    'ensure_effect_receipt creates a planned receipt'
);

SELECT orch8.cas_effect_receipt(
    't1', '00000000-0000-0000-0000-0000000000f1', 'planned', 'prepared'
);

SELECT results_eq(
    $$SELECT id, state FROM orch8.ensure_effect_receipt(
          't1', '00000000-0000-0000-0000-0000000000f1',
          '00000000-0000-8ff6-aee8-afd472664eaf', 0,
          '00000000-0000-0000-0000-0000000000a1', 'manual', 0, 'http', 'http_request',
          repeat('a', 64), repeat('b', 64))$$,
    $$VALUES ('00000000-0000-0000-0000-0000000000f1'::uuid, 'prepared'::orch8.effect_state)$$,
    'ensure_effect_receipt with the same identity returns the stored row as it is'
);

SELECT is(
    (
        SELECT count(*)::integer FROM orch8.effect_receipt_events
        WHERE tenant_id = 't1' AND receipt_id = '00000000-0000-0000-0000-0000000000f1'
    ),
    2,
    'the repeated ensure_effect_receipt recorded no event'
);

SELECT throws_ok(
    $$SELECT orch8.ensure_effect_receipt(
          't1', '00000000-0000-0000-0000-0000000000f1',
          '00000000-0000-8ff6-aee8-afd472664eaf', 0,
          '00000000-0000-0000-0000-0000000000a1', 'manual', 0, 'http', 'http_request',
          repeat('a', 64), repeat('c', 64))$$,
    'O8005', NULL,
    'same id, different request_sha256: O8005'
);

SELECT throws_ok(
    $$SELECT orch8.ensure_effect_receipt(
          't1', '00000000-0000-0000-0000-0000000000f1',
          '00000000-0000-8ff6-aee8-afd472664eaf', 0,
          '00000000-0000-0000-0000-0000000000a1', 'other-block', 0, 'http', 'http_request',
          repeat('a', 64), repeat('b', 64))$$,
    'O8005', NULL,
    'same id, different block: O8005'
);

SELECT throws_ok(
    $$SELECT orch8.ensure_effect_receipt(
          't1', '00000000-0000-0000-0000-0000000000f1',
          '00000000-0000-8ff6-aee8-afd472664eaf', 0,
          '00000000-0000-0000-0000-0000000000a1', 'manual', 3, 'http', 'http_request',
          repeat('a', 64), repeat('b', 64))$$,
    'O8005', NULL,
    'same id, different attempt: O8005'
);

SELECT results_eq(
    $$SELECT block_id::text, attempt::integer, request_sha256::text, state
      FROM orch8.effect_receipts
      WHERE tenant_id = 't1' AND id = '00000000-0000-0000-0000-0000000000f1'$$,
    $$VALUES ('manual', 0, repeat('b', 64), 'prepared'::orch8.effect_state)$$,
    'the stored receipt is untouched by the collisions'
);

-- 9. Input validation --------------------------------------------------------------------

SELECT throws_ok(
    $$SELECT orch8.begin_effect(
          't1', '00000000-0000-0000-0000-0000000000a1', 'b', NULL, '{}', 0)$$,
    'O8008', NULL,
    'begin_effect without a handler: O8008'
);

SELECT throws_ok(
    $$SELECT orch8.begin_effect(
          't1', '00000000-0000-0000-0000-0000000000a1', '', 'http_request', '{}', 0)$$,
    'O8008', NULL,
    'begin_effect of a side-effecting handler with an empty block id: O8008'
);

SELECT throws_ok(
    $$SELECT orch8.begin_effect(
          't1', '00000000-0000-0000-0000-0000000000a1', 'b', 'http_request', '{}', -1)$$,
    'O8008', NULL,
    'begin_effect with a negative attempt: O8008'
);

-- 7. A scope keeps the derivation it was made with ----------------------------------------
-- A scope stored before migration 0032 is of version 1: its receipts keep
-- deterministic_effect_id's ids, so an attempt begun again is sent under the same key.

INSERT INTO orch8.continuity_executions (
    tenant_id, continuity_id, epoch, owner_runtime_id, current_instance_id
) VALUES (
    't1', '0193a4b5-c6d7-8e8f-9a0b-aaaaaaaaaaaa', 0, '0193a4b5-c6d7-8e8f-9a0b-bbbbbbbbbbbb',
    '0193a4b5-c6d7-7e8f-9a0b-1c2d3e4f5a6b'
);

SELECT is(
    (
        SELECT effect_id_version::integer FROM orch8.continuity_executions
        WHERE tenant_id = 't1' AND current_instance_id = '0193a4b5-c6d7-7e8f-9a0b-1c2d3e4f5a6b'
    ),
    1,
    'a scope written without a version is of version 1'
);

SELECT is(
    (SELECT effect_id FROM orch8.begin_effect(
        't1', '0193a4b5-c6d7-7e8f-9a0b-1c2d3e4f5a6b', 'charge', 'emit_event',
        '{"topic": "orders", "payload": {"id": 8}}', 0
    )),
    '74375b44-bd31-822e-a2bc-c379d8f60540'::uuid,
    'in a version-1 scope the receipt id is deterministic_effect_id''s (11_effect_ids.sql)'
);

SELECT is(
    (
        SELECT array_agg(DISTINCT effect_id_version::integer)
        FROM orch8.continuity_executions
        WHERE tenant_id = 't1' AND current_instance_id <> '0193a4b5-c6d7-7e8f-9a0b-1c2d3e4f5a6b'
    ),
    ARRAY[2],
    'every scope begin_effect made is of version 2'
);

SELECT * FROM finish();
ROLLBACK;
