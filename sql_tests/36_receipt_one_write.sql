-- A guarded step's receipt in one write (insert_dispatched_receipt, migration 0021):
-- without a commit guard begin_effect inserts a new receipt dispatched, and its history
-- still reads planned, prepared, dispatched; a receipt created in any other state than
-- planned or dispatched is refused; an existing receipt takes the step by step path; the
-- open set (orch8.open_receipts) follows the state, and no index of the receipts names a
-- column a settle changes.
BEGIN;
SELECT plan(12);
SELECT tap.instances('fast', ARRAY['00000000-0000-0000-0000-0000000000b1']::uuid[]);

SELECT is(
    (orch8.begin_effect(
        'fast', '00000000-0000-0000-0000-0000000000b1', 'pay', 'x.pay',
        '{"amount": 5}', 0
    )).outcome,
    'dispatched', 'begin_effect dispatches a new receipt'
);
SELECT set_config('tap.receipt', (
    SELECT r.id::text FROM orch8.effect_receipts AS r
    WHERE r.tenant_id = 'fast'
), true);
SELECT results_eq(
    $$SELECT e.from_state::text, e.to_state::text, e.note, e.actor
      FROM orch8.effect_receipt_events AS e
      WHERE e.tenant_id = 'fast' AND e.receipt_id = current_setting('tap.receipt')::uuid
      ORDER BY e.event_id$$,
    $$VALUES (NULL, 'planned', 'receipt planned', 'engine'),
             ('planned', 'prepared', NULL, 'engine'),
             ('prepared', 'dispatched', NULL, 'engine')$$,
    'its history reads planned, prepared, dispatched, in order'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.effect_receipt_events AS e
        INNER JOIN orch8.effect_receipts AS r ON e.tenant_id = r.tenant_id AND e.receipt_id = r.id
        WHERE r.tenant_id = 'fast' AND e.at = r.created_at
    ), 3,
    'all three at its creation'
);
SELECT ok(
    (
        SELECT r.state = 'dispatched' AND r.updated_at = r.created_at
        FROM orch8.effect_receipts AS r
        WHERE r.tenant_id = 'fast'
    ),
    'one row version: dispatched as created'
);

SELECT throws_ok(
    $$INSERT INTO orch8.effect_receipts (tenant_id, id, continuity_id, epoch, instance_id,
          block_id, attempt, kind, state, handler, destination_fingerprint, request_sha256)
      SELECT tenant_id, gen_random_uuid(), continuity_id, epoch, instance_id, 'other', 0, kind,
             'prepared', handler, destination_fingerprint, request_sha256
      FROM orch8.effect_receipts WHERE tenant_id = 'fast'$$,
    'O8004', NULL, 'a receipt is never created prepared'
);
SELECT throws_ok(
    $$INSERT INTO orch8.effect_receipts (tenant_id, id, continuity_id, epoch, instance_id,
          block_id, attempt, kind, state, handler, destination_fingerprint, request_sha256)
      SELECT tenant_id, gen_random_uuid(), continuity_id, epoch, instance_id, 'other', 0, kind,
             'committed', handler, destination_fingerprint, request_sha256
      FROM orch8.effect_receipts WHERE tenant_id = 'fast'$$,
    'O8004', NULL, 'nor committed'
);

-- the same attempt begun again finds its receipt: the one-write path writes nothing
SELECT is(
    (orch8.begin_effect(
        'fast', '00000000-0000-0000-0000-0000000000b1', 'pay', 'x.pay',
        '{"amount": 5}', 0
    )).outcome,
    'blocked', 'a second begin of the same attempt is blocked (the first may have sent)'
);
SELECT is(
    (
        SELECT array_agg(r.state::text) FROM orch8.effect_receipts AS r
        WHERE r.tenant_id = 'fast'
    ),
    ARRAY['unknown'], 'one receipt, now unknown'
);

-- the open set follows the state: dispatched and unknown in it, settled out of it
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.open_receipts AS o
        WHERE o.tenant_id = 'fast'
    ), 1,
    'an unknown receipt is open'
);
SELECT orch8.resolve_effect(
    'fast', current_setting('tap.receipt')::uuid, 'unknown',
    'abandoned', NULL, '{"checked": "the provider has no such charge"}', 'tap'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.open_receipts AS o
        WHERE o.tenant_id = 'fast'
    ), 0,
    'a settled one is not'
);
SELECT hasnt_index(
    'orch8', 'effect_receipts', 'effect_receipts_unresolved_idx',
    'no receipts index names the columns a settle changes'
);
SELECT is(
    tap.indexes_naming(
        'orch8.effect_receipts',
        ARRAY['state', 'updated_at', 'provider_receipt_id', 'error', 'evidence']
    ),
    '{}'::text[],
    'nor uses them in a predicate: settling can be a HOT update'
);

SELECT * FROM finish();
ROLLBACK;
