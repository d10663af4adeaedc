-- Moving a receipt after dispatch: commit_effect, mark_effect_unknown,
-- abandon_effect_not_applied (the engine), cas_effect_receipt (the primitive) and
-- resolve_effect (the operator).
BEGIN;
SELECT plan(66);
-- the instances the vectors name (a receipt needs a real instance)
SELECT tap.instances('t1', ARRAY['00000000-0000-0000-0000-0000000000a1']::uuid[]);

-- One dispatched http receipt per block of instance a1.
CREATE TEMP TABLE r AS
SELECT
    b.block,
    (orch8.begin_effect(
        't1', '00000000-0000-0000-0000-0000000000a1', b.block, 'http_request',
        jsonb_build_object('url', 'https://x.example/' || b.block), 0
    )).effect_id AS id
FROM unnest(ARRAY[
    'commit', 'commit-long', 'unknown', 'unknown-null', 'abandon', 'cas',
    'res-commit', 'res-abandon', 'res-comp', 'res-verify', 'res-exp', 'res-dispatched', 'res-out'
]) AS b (block);

CREATE FUNCTION pg_temp.rid(p_block text)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT r.id FROM r WHERE r.block = p_block $$;

CREATE FUNCTION pg_temp.state_of(p_block text)
RETURNS orch8.effect_state
LANGUAGE sql
AS $$
    SELECT e.state FROM orch8.effect_receipts AS e
    WHERE e.tenant_id = 't1' AND e.id = pg_temp.rid(p_block)
$$;

CREATE FUNCTION pg_temp.events_of(p_block text)
RETURNS integer
LANGUAGE sql
AS $$
    SELECT count(*)::integer FROM orch8.effect_receipt_events AS e
    WHERE e.tenant_id = 't1' AND e.receipt_id = pg_temp.rid(p_block)
$$;

SELECT is(
    (
        SELECT count(*)::integer FROM r
        WHERE pg_temp.state_of(block) = 'dispatched'
    ),
    13,
    'setup: thirteen dispatched receipts'
);

-- 1. commit_effect ------------------------------------------------------------------------

SELECT results_eq(
    $$SELECT outcome, effect_id, state FROM orch8.commit_effect(
          't1', pg_temp.rid('commit'),
          '{"provider_receipt_id": 7, "receipt_id": "r-9", "request_id": "q-1"}')$$,
    $$SELECT 'committed', pg_temp.rid('commit'), 'committed'::orch8.effect_state$$,
    'commit_effect: dispatched -> committed'
);

SELECT is(
    (
        SELECT provider_receipt_id FROM orch8.effect_receipts
        WHERE id = pg_temp.rid('commit')
    ),
    'r-9',
    'the provider receipt id is taken by the rule (non-string provider_receipt_id skipped)'
);

SELECT results_eq(
    $$SELECT from_state, to_state, actor, note FROM orch8.effect_receipt_events
      WHERE receipt_id = pg_temp.rid('commit') ORDER BY event_id DESC LIMIT 1$$,
    $$VALUES ('dispatched'::orch8.effect_state, 'committed'::orch8.effect_state, 'engine',
              'handler succeeded')$$,
    'the commit is recorded as an event'
);

SELECT results_eq(
    $$SELECT outcome, effect_id, state FROM orch8.commit_effect(
          't1', pg_temp.rid('commit'), '{"receipt_id": "other"}')$$,
    $$SELECT 'stale', pg_temp.rid('commit'), 'committed'::orch8.effect_state$$,
    'committing a receipt that is not dispatched: stale with its current state'
);

SELECT results_eq(
    $$SELECT provider_receipt_id::text, pg_temp.events_of('commit')
      FROM orch8.effect_receipts WHERE id = pg_temp.rid('commit')$$,
    $$VALUES ('r-9', 4)$$,
    'the stale commit changed nothing (provider id kept, no new event)'
);

SELECT results_eq(
    $$SELECT outcome, state FROM orch8.commit_effect(
          't1', pg_temp.rid('commit-long'),
          jsonb_build_object('provider_receipt_id', repeat('p', 257), 'receipt_id', 'r-1'))$$,
    $$VALUES ('committed', 'committed'::orch8.effect_state)$$,
    'commit_effect with an over-long provider_receipt_id still commits'
);

SELECT is(
    (
        SELECT provider_receipt_id FROM orch8.effect_receipts
        WHERE id = pg_temp.rid('commit-long')
    ),
    NULL,
    '... without a provider receipt id (no fall-through to receipt_id)'
);

SELECT results_eq(
    $$SELECT outcome, effect_id, state FROM orch8.commit_effect(
          't1', '00000000-0000-0000-0000-00000000dead', '{}')$$,
    $$VALUES ('stale', '00000000-0000-0000-0000-00000000dead'::uuid,
              NULL::orch8.effect_state)$$,
    'committing an unknown id: stale without a state'
);

-- 2. mark_effect_unknown -----------------------------------------------------------------

SELECT results_eq(
    $$SELECT outcome, effect_id, state FROM orch8.mark_effect_unknown(
          't1', pg_temp.rid('unknown'), 'timeout after 30s')$$,
    $$SELECT 'unknown', pg_temp.rid('unknown'), 'unknown'::orch8.effect_state$$,
    'mark_effect_unknown: dispatched -> unknown'
);

SELECT is(
    (
        SELECT error FROM orch8.effect_receipts
        WHERE id = pg_temp.rid('unknown')
    ),
    'timeout after 30s',
    'the error is stored on the receipt'
);

SELECT results_eq(
    $$SELECT from_state, to_state, note FROM orch8.effect_receipt_events
      WHERE receipt_id = pg_temp.rid('unknown') ORDER BY event_id DESC LIMIT 1$$,
    $$VALUES ('dispatched'::orch8.effect_state, 'unknown'::orch8.effect_state,
              'handler failed or timed out after dispatch')$$,
    'the move to unknown is recorded as an event'
);

SELECT results_eq(
    $$SELECT outcome, state FROM orch8.mark_effect_unknown(
          't1', pg_temp.rid('unknown'), 'again')$$,
    $$VALUES ('stale', 'unknown'::orch8.effect_state)$$,
    'marking a receipt that is no longer dispatched: stale'
);

SELECT results_eq(
    $$SELECT outcome, state FROM orch8.commit_effect(
          't1', pg_temp.rid('unknown'), '{"receipt_id": "late"}')$$,
    $$VALUES ('stale', 'unknown'::orch8.effect_state)$$,
    'a late commit of an unknown receipt: stale (only an operator moves it on)'
);

SELECT results_eq(
    $$SELECT error, provider_receipt_id::text FROM orch8.effect_receipts
      WHERE id = pg_temp.rid('unknown')$$,
    $$VALUES ('timeout after 30s', NULL::text)$$,
    'the stale calls left the error and provider id alone'
);

SELECT orch8.mark_effect_unknown('t1', pg_temp.rid('unknown-null'), NULL);

SELECT is(
    (
        SELECT error FROM orch8.effect_receipts
        WHERE id = pg_temp.rid('unknown-null')
    ),
    'unknown error',
    'a NULL error is stored as "unknown error"'
);

-- 3. abandon_effect_not_applied ----------------------------------------------------------

SELECT throws_ok(
    $$SELECT orch8.abandon_effect_not_applied('t1', pg_temp.rid('abandon'), '{}')$$,
    'O8008', NULL,
    'abandoning with empty evidence: O8008'
);

SELECT throws_ok(
    $$SELECT orch8.abandon_effect_not_applied('t1', pg_temp.rid('abandon'), NULL)$$,
    'O8008', NULL,
    'abandoning without evidence: O8008'
);

SELECT throws_ok(
    $$SELECT orch8.abandon_effect_not_applied('t1', pg_temp.rid('abandon'), '["refused"]')$$,
    'O8008', NULL,
    'abandoning with evidence that is not an object: O8008'
);

SELECT is(pg_temp.state_of('abandon'), 'dispatched', 'the refused abandons changed nothing');

SELECT results_eq(
    $$SELECT outcome, effect_id, state FROM orch8.abandon_effect_not_applied(
          't1', pg_temp.rid('abandon'),
          '{"error": "connection refused", "bytes_sent": 0}')$$,
    $$SELECT 'abandoned', pg_temp.rid('abandon'), 'abandoned'::orch8.effect_state$$,
    'abandon_effect_not_applied: dispatched -> abandoned'
);

SELECT results_eq(
    $$SELECT from_state, to_state FROM orch8.effect_receipt_events
      WHERE receipt_id = pg_temp.rid('abandon') AND from_state >= 'dispatched'
      ORDER BY event_id$$,
    $$VALUES ('dispatched'::orch8.effect_state, 'unknown'::orch8.effect_state),
             ('unknown'::orch8.effect_state, 'abandoned'::orch8.effect_state)$$,
    'two events: dispatched -> unknown, unknown -> abandoned'
);

SELECT results_eq(
    $$SELECT error, evidence -> 'not_applied' FROM orch8.effect_receipts
      WHERE id = pg_temp.rid('abandon')$$,
    $$VALUES ('connection refused', '{"error": "connection refused", "bytes_sent": 0}'::jsonb)$$,
    'the evidence is kept under not_applied, its error on the receipt'
);

SELECT results_eq(
    $$SELECT outcome, state FROM orch8.abandon_effect_not_applied(
          't1', pg_temp.rid('commit'), '{"error": "connection refused"}')$$,
    $$VALUES ('stale', 'committed'::orch8.effect_state)$$,
    'abandoning a committed receipt: stale, nothing changed'
);

-- 4. cas_effect_receipt ------------------------------------------------------------------

SELECT is(
    orch8.cas_effect_receipt('t1', pg_temp.rid('cas'), 'prepared', 'abandoned'),
    false,
    'cas with the wrong expected state returns false'
);

SELECT results_eq(
    $$SELECT pg_temp.state_of('cas'), pg_temp.events_of('cas')$$,
    $$VALUES ('dispatched'::orch8.effect_state, 3)$$,
    'the lost cas changed nothing'
);

SELECT throws_ok(
    $$SELECT orch8.cas_effect_receipt('t1', pg_temp.rid('cas'), 'dispatched', 'prepared')$$,
    'O8004', NULL,
    'cas along an illegal pair (dispatched -> prepared): O8004'
);

SELECT throws_ok(
    $$SELECT orch8.cas_effect_receipt('t1', pg_temp.rid('cas'), 'unknown', 'dispatched')$$,
    'O8004', NULL,
    'cas along an illegal pair (unknown -> dispatched): O8004'
);

SELECT throws_ok(
    $$SELECT orch8.cas_effect_receipt('t1', pg_temp.rid('cas'), 'dispatched', 'unknown',
          '{"state": "committed"}')$$,
    'O8008', NULL,
    'cas with an unknown patch key: O8008'
);

SELECT throws_ok(
    $$SELECT orch8.cas_effect_receipt('t1', pg_temp.rid('cas'), 'dispatched', 'unknown',
          '["error"]')$$,
    'O8008', NULL,
    'cas with a patch that is not an object: O8008'
);

SELECT throws_ok(
    $$SELECT orch8.cas_effect_receipt('t1', pg_temp.rid('cas'), 'dispatched', 'unknown',
          '{"evidence": "a string"}')$$,
    'O8008', NULL,
    'cas with patch evidence that is not an object: O8008'
);

SELECT is(pg_temp.state_of('cas'), 'dispatched', 'the refused cas calls changed nothing');

SELECT is(
    orch8.cas_effect_receipt(
        't1', pg_temp.rid('cas'), 'dispatched', 'unknown',
        '{"actor": "bob", "note": "n1", "error": "e1", "evidence": {"k": 1}}'
    ),
    true,
    'cas with the right expected state returns true'
);

SELECT results_eq(
    $$SELECT state, error, evidence::jsonb FROM orch8.effect_receipts
      WHERE id = pg_temp.rid('cas')$$,
    $$VALUES ('unknown'::orch8.effect_state, 'e1', '{"k": 1}'::jsonb)$$,
    'the patch set the error and merged the evidence'
);

SELECT results_eq(
    $$SELECT from_state, to_state, actor, note, evidence FROM orch8.effect_receipt_events
      WHERE receipt_id = pg_temp.rid('cas') ORDER BY event_id DESC LIMIT 1$$,
    $$VALUES ('dispatched'::orch8.effect_state, 'unknown'::orch8.effect_state, 'bob', 'n1',
              '{"k": 1}'::jsonb)$$,
    'the event records the actor, note and evidence of the patch'
);

SELECT is(
    orch8.cas_effect_receipt('t2', pg_temp.rid('cas'), 'unknown', 'verified'),
    false,
    'cas under another tenant does not find the receipt: false'
);

-- 5. resolve_effect ----------------------------------------------------------------------

SELECT orch8.mark_effect_unknown('t1', pg_temp.rid(b), 'timeout')
FROM unnest(ARRAY['res-commit', 'res-abandon', 'res-comp', 'res-verify', 'res-exp']) AS b;

SELECT results_eq(
    $$SELECT state, provider_receipt_id::text, evidence #>> '{resolution,actor}',
             evidence #> '{resolution,evidence}'
      FROM orch8.resolve_effect('t1', pg_temp.rid('res-commit'), 'unknown', 'committed', 'pr-1',
          '{"checked": "provider dashboard"}', 'alice', 'found it')$$,
    $$VALUES ('committed'::orch8.effect_state, 'pr-1', 'alice',
              '{"checked": "provider dashboard"}'::jsonb)$$,
    'resolve unknown -> committed with a provider id records the resolution on the receipt'
);

SELECT results_eq(
    $$SELECT from_state, to_state, actor, note, evidence #>> '{resolution,state}'
      FROM orch8.effect_receipt_events
      WHERE receipt_id = pg_temp.rid('res-commit') ORDER BY event_id DESC LIMIT 1$$,
    $$VALUES ('unknown'::orch8.effect_state, 'committed'::orch8.effect_state, 'alice',
              'found it', 'committed')$$,
    'the resolution is an event by that actor'
);

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-commit'), 'committed', 'compensated',
          NULL, '{}',
          'carol')$$,
    'O8008', NULL,
    'committed -> compensated without evidence: O8008'
);

SELECT results_eq(
    $$SELECT state, provider_receipt_id::text
      FROM orch8.resolve_effect('t1', pg_temp.rid('res-commit'), 'committed', 'compensated', NULL,
          '{"refund": "rf-1"}', 'carol')$$,
    $$VALUES ('compensated'::orch8.effect_state, 'pr-1')$$,
    'committed -> compensated with evidence (the provider id is kept)'
);

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-abandon'), 'unknown', 'abandoned',
          NULL, '{}',
          'alice')$$,
    'O8008', NULL,
    'unknown -> abandoned with empty evidence: O8008'
);

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-abandon'), 'unknown', 'abandoned',
          NULL, NULL,
          'alice')$$,
    'O8008', NULL,
    'unknown -> abandoned without evidence: O8008'
);

SELECT is(
    (
        orch8.resolve_effect(
            't1', pg_temp.rid('res-abandon'), 'unknown', 'abandoned', NULL,
            '{"provider_search": "no such charge"}', 'alice'
        )
    ).state,
    'abandoned'::orch8.effect_state,
    'unknown -> abandoned with evidence'
);

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-comp'), 'unknown', 'compensated',
          NULL, '{}',
          'alice')$$,
    'O8008', NULL,
    'unknown -> compensated with empty evidence: O8008'
);

SELECT is(
    (
        orch8.resolve_effect(
            't1', pg_temp.rid('res-comp'), 'unknown', 'compensated', NULL,
            '{"refund": "rf-2"}', 'alice'
        )
    ).state,
    'compensated'::orch8.effect_state,
    'unknown -> compensated with evidence'
);

SELECT is(
    (
        orch8.resolve_effect(
            't1', pg_temp.rid('res-verify'), 'unknown', 'verified', 'pr-3', '{}', 'alice'
        )
    ).state,
    'verified'::orch8.effect_state,
    'unknown -> verified needs no evidence'
);

SELECT is(
    (
        orch8.resolve_effect(
            't1', pg_temp.rid('res-verify'), 'verified', 'compensated', NULL,
            '{"refund": "rf-3"}', 'alice'
        )
    ).state,
    'compensated'::orch8.effect_state,
    'verified -> compensated with evidence'
);

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-exp'), 'unknown', 'dispatched', NULL,
          '{"x": 1}', 'alice')$$,
    'O8004', NULL,
    'unknown -> dispatched: O8004'
);

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-dispatched'), 'dispatched', 'committed',
          'pr-4',
          '{"x": 1}', 'alice')$$,
    'O8004', NULL,
    'resolving a dispatched receipt (dispatched -> committed): O8004'
);

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-abandon'), 'abandoned', 'committed',
          'pr-5',
          '{"x": 1}', 'alice')$$,
    'O8004', NULL,
    'abandoned -> committed: O8004'
);

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-exp'), 'unknown', NULL, NULL, '{"x": 1}',
          'alice')$$,
    'O8004', NULL,
    'resolving to no state: O8004'
);

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', '00000000-0000-0000-0000-00000000dead', 'unknown',
          'committed', NULL, '{}', 'alice')$$,
    'O8007', NULL,
    'resolving an unknown id: O8007'
);

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t2', pg_temp.rid('res-exp'), 'unknown', 'committed', NULL, '{}',
          'alice')$$,
    'O8007', NULL,
    'resolving another tenant''s receipt: O8007'
);

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-exp'), 'dispatched', 'committed', NULL,
          '{}', 'alice')$$,
    'O8002', NULL,
    'p_expected_state differs from the current state: O8002'
);

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-exp'), 'unknown', 'committed', NULL, '{}',
          NULL)$$,
    'O8008', NULL,
    'resolving without an actor: O8008'
);

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-exp'), 'unknown', 'committed',
          NULL, '{}', '')$$,
    'O8008', NULL,
    'resolving with an empty actor: O8008'
);

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-exp'), 'unknown', 'committed',
          repeat('p', 257), '{}', 'alice')$$,
    'O8008', NULL,
    'a provider receipt id over 256 bytes: O8008'
);

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-exp'), 'unknown', 'committed', NULL,
          '"evidence"', 'alice')$$,
    'O8008', NULL,
    'evidence that is not an object: O8008'
);

SELECT results_eq(
    $$SELECT pg_temp.state_of('res-exp'), pg_temp.state_of('res-dispatched'),
             pg_temp.state_of('res-abandon')$$,
    $$VALUES ('unknown'::orch8.effect_state, 'dispatched'::orch8.effect_state,
              'abandoned'::orch8.effect_state)$$,
    'the refused resolutions changed nothing'
);

SELECT results_eq(
    $$SELECT state, provider_receipt_id::text FROM orch8.resolve_effect(
          't1', pg_temp.rid('res-exp'), 'unknown', 'committed', NULL, NULL, 'dave')$$,
    $$VALUES ('committed'::orch8.effect_state, NULL::text)$$,
    'a matching p_expected_state resolves'
);

SELECT results_eq(
    $$SELECT actor, note FROM orch8.effect_receipt_events
      WHERE receipt_id = pg_temp.rid('res-exp') ORDER BY event_id DESC LIMIT 1$$,
    $$VALUES ('dave', 'resolved by operator')$$,
    'without a note the event says "resolved by operator"'
);

-- 6. What a resolution leaves on the receipt --------------------------------------------

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-out'), NULL, 'committed', NULL, '{}',
          'alice')$$,
    'O8008', NULL,
    'resolving without the state one saw (expected_state NULL): O8008'
);

SELECT orch8.mark_effect_unknown('t1', pg_temp.rid('res-out'), 'timed out after 5s');

SELECT throws_ok(
    $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-out'), 'unknown', 'abandoned', NULL,
          '{"x": 1}', 'alice', NULL, '{"id": "ch_1"}')$$,
    'O8008', NULL,
    'an output with an abandoned resolution: O8008 (only committed or verified carry one)'
);

SELECT throws_ok(
    format(
        $$SELECT orch8.resolve_effect('t1', pg_temp.rid('res-out'), 'unknown', 'committed',
          NULL, '{}', 'alice', NULL, jsonb_build_object('big', repeat('x', %s)))$$,
        orch8.limit_of('resolution_output_bytes')
    ),
    'O8008', NULL,
    'an output over resolution_output_bytes: O8008'
);

SELECT results_eq(
    $$SELECT state, error, evidence #> '{resolution,output}', provider_receipt_id::text
      FROM orch8.resolve_effect('t1', pg_temp.rid('res-out'), 'unknown', 'committed', 'ch_1',
          '{"looked": "dashboard"}', 'alice', NULL, '{"id": "ch_1", "paid": true}')$$,
    $$VALUES ('committed'::orch8.effect_state, NULL::text,
              '{"id": "ch_1", "paid": true}'::jsonb, 'ch_1')$$,
    'a committed resolution keeps its output and clears the stale error'
);

SELECT results_eq(
    $$SELECT state, jsonb_array_length(evidence -> 'resolutions'),
             evidence #>> '{resolutions,0,state}', evidence #>> '{resolutions,0,actor}',
             evidence #>> '{resolutions,1,state}', evidence #>> '{resolutions,1,from_state}',
             evidence #>> '{resolution,state}'
      FROM orch8.resolve_effect('t1', pg_temp.rid('res-out'), 'committed', 'compensated',
          NULL, '{"refund": "rf-9"}', 'bob')$$,
    $$VALUES ('compensated'::orch8.effect_state, 2, 'committed', 'alice', 'compensated',
              'committed', 'compensated')$$,
    'a later resolution keeps the earlier one in evidence.resolutions'
);

SELECT * FROM finish();
ROLLBACK;
