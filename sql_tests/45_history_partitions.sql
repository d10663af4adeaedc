-- The history tables in monthly partitions, and the archive (migration 0033,
-- sql/functions/history.sql): rows land in their month, a month made late takes its rows
-- from the default partition, nothing in flight is archived, an archived receipt is still
-- found, and only the owner's functions touch the catalog.
BEGIN;
SELECT plan(31);

SELECT set_eq(
    $$SELECT table_name || ':' || key_column FROM orch8.history_tables$$,
    ARRAY[
        'effect_receipts:id', 'effect_receipt_events:receipt_id', 'block_outputs:instance_id',
        'instance_transitions:instance_id'
    ],
    'four history tables, each keyed by the id its primary key holds'
);
SELECT is_empty(
    $$SELECT h.table_name FROM orch8.history_tables AS h
      WHERE (SELECT c.relkind FROM pg_class AS c
             WHERE c.oid = ('orch8.' || h.table_name)::regclass) <> 'p'
         OR (SELECT c.relkind FROM pg_class AS c
             WHERE c.oid = ('orch8_archive.' || h.table_name)::regclass) <> 'p'
         OR to_regclass('orch8.' || h.table_name || '_default') IS NULL$$,
    'each is partitioned, live and in the archive, with a default partition'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.history_partitions() AS p
        WHERE
            NOT p.archived AND p.month BETWEEN date_trunc('month', orch8.now())::date
            AND (
                date_trunc('month', orch8.now())
                + interval '2 months'
            )::date
    ),
    12,
    'the migrator made this month and the next two for every table'
);
SELECT is_empty(
    $$SELECT * FROM orch8.ensure_history_partitions()$$,
    'ensure_history_partitions makes nothing when the months exist'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.ensure_history_partitions(25)$$,
    'O8008', NULL, 'more than 24 months ahead is refused'
);

-- A time-ordered instance: its rows land in this month --------------------------------------

SELECT tap.instances('t1', ARRAY['00000000-0000-0000-0000-0000000000a1']::uuid[]);
CREATE TEMP TABLE now_instance AS
SELECT orch8.time_ordered_uuid() AS id;
SELECT tap.instances('t1', array(SELECT ni.id FROM now_instance AS ni));
CREATE TEMP TABLE now_receipt AS
SELECT (orch8.begin_effect(
    't1', (SELECT ni.id FROM now_instance AS ni), 'pay', 'http_request',
    '{"url": "https://x.example/now"}', 0
)).effect_id AS id;

SELECT is(
    (
        SELECT r.tableoid::regclass::text FROM orch8.effect_receipts AS r
        WHERE r.id = (SELECT n.id FROM now_receipt AS n)
    ),
    'orch8.' || orch8.history_partition_name(
        'effect_receipts',
        date_trunc('month', orch8.now())::date
    ),
    'a receipt of an instance made now is in this month''s partition'
);
SELECT is(
    (
        SELECT array_agg(DISTINCT e.tableoid::regclass::text) FROM orch8.effect_receipt_events AS e
        WHERE e.receipt_id = (SELECT n.id FROM now_receipt AS n)
    ),
    ARRAY['orch8.' || orch8.history_partition_name(
        'effect_receipt_events',
        date_trunc('month', orch8.now())::date
    )],
    'so are its events'
);
SELECT is(
    (
        SELECT array_agg(DISTINCT t.tableoid::regclass::text) FROM orch8.instance_transitions AS t
        WHERE t.instance_id = (SELECT ni.id FROM now_instance AS ni)
    ),
    ARRAY['orch8.' || orch8.history_partition_name(
        'instance_transitions',
        date_trunc('month', orch8.now())::date
    )],
    'and the instance''s transitions'
);

-- An id that carries no month lands in the default; a month made late takes its rows ----

CREATE TEMP TABLE old_receipt AS
SELECT (orch8.begin_effect(
    't1', '00000000-0000-0000-0000-0000000000a1', 'pay', 'http_request',
    '{"url": "https://x.example/old", "idempotency_key": "order-1970"}', 0
)).effect_id AS id;
SELECT is(
    (
        SELECT r.tableoid::regclass::text FROM orch8.effect_receipts AS r
        WHERE r.id = (SELECT o.id FROM old_receipt AS o)
    ),
    'orch8.effect_receipts_default',
    'a receipt whose id names no month with a partition is in the default partition'
);

SELECT set_config('orch8.fake_now', '1970-01-20 00:00:00+00', true);
SELECT set_eq(
    $$SELECT partition_name || ':' || (rows_moved > 0) FROM orch8.ensure_history_partitions(0)$$,
    ARRAY[
        'effect_receipts_p197001:true', 'effect_receipt_events_p197001:true',
        'block_outputs_p197001:false', 'instance_transitions_p197001:true'
    ],
    'making a month the default already has rows of moves them into it'
);
SELECT set_config('orch8.fake_now', '', true);
SELECT is(
    (
        SELECT r.tableoid::regclass::text FROM orch8.effect_receipts AS r
        WHERE r.id = (SELECT o.id FROM old_receipt AS o)
    ),
    'orch8.effect_receipts_p197001',
    'the receipt is now in its month, the same row'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.effect_receipt_events_default AS e
        WHERE e.receipt_id = (SELECT o.id FROM old_receipt AS o)
    ),
    0,
    'none of its events stayed behind'
);
SELECT cmp_ok(
    (
        SELECT count(*)::integer FROM orch8.effect_receipt_events_p197001 AS e
        WHERE e.receipt_id = (SELECT o.id FROM old_receipt AS o)
    ),
    '>', 0,
    'they moved with it'
);
SELECT tap.instances('t1', ARRAY['ffffffff-0000-0000-0000-0000000000f1']::uuid[]);
SELECT throws_ok(
    $$DELETE FROM orch8.instance_transitions_default
      WHERE instance_id = 'ffffffff-0000-0000-0000-0000000000f1'$$,
    'O8004', NULL,
    'the default partition refuses deletes again after the move'
);
SELECT throws_ok(
    $$UPDATE orch8.effect_receipt_events SET actor = 'x'
      WHERE receipt_id = (SELECT o.id FROM old_receipt AS o)$$,
    'O8004', NULL,
    'and a moved month refuses rewrites as every month does'
);
SELECT is(
    (
        SELECT count(*)::integer FROM pg_trigger AS t
        WHERE t.tgrelid = 'orch8.effect_receipts_default'::regclass AND t.tgenabled = 'D'
    ),
    0,
    'no trigger is left disabled'
);

-- References to receipts are checked without a foreign key ------------------------------

SELECT throws_ok(
    $$INSERT INTO orch8.effect_verifications (tenant_id, effect_id, method, handler,
                                              schedule, next_at, requested_by)
      VALUES ('t1', '00000000-0000-0000-0000-00000000dead', (orch8.verification_methods())[1],
              'h', '{1}', now(), 'x')$$,
    '23503', NULL,
    'a verification of a receipt that does not exist is refused'
);
SELECT lives_ok(
    $$INSERT INTO orch8.effect_verifications (tenant_id, effect_id, method, handler,
                                              schedule, next_at, requested_by)
      VALUES ('t1', (SELECT o.id FROM old_receipt AS o), (orch8.verification_methods())[1], 'h',
              '{1}', now(), 'x')$$,
    'one of a receipt that moved months is accepted'
);
SELECT is_empty(
    $$SELECT e.receipt_id FROM orch8.effect_receipt_events AS e
      WHERE NOT EXISTS (SELECT 1 FROM orch8.effect_receipts AS r
                        WHERE r.tenant_id = e.tenant_id AND r.id = e.receipt_id)$$,
    'every event has its receipt'
);

-- Archiving a month ----------------------------------------------------------------------

SELECT throws_ok(
    $$SELECT * FROM orch8.archive_history_month('1970-01-01')$$,
    'O8010', NULL,
    'a month with an instance not ended and a receipt not settled stays live'
);
SELECT orch8.commit_effect('t1', (SELECT o.id FROM old_receipt AS o), '{"receipt_id": "ch_1970"}');
UPDATE orch8.task_instances SET state = 'cancelled'
WHERE id = '00000000-0000-0000-0000-0000000000a1';
CREATE TEMP TABLE events_before AS
SELECT count(*)::integer AS n FROM orch8.effect_receipt_events AS e
WHERE e.receipt_id = (SELECT o.id FROM old_receipt AS o);
SELECT set_eq(
    $$SELECT partition_name FROM orch8.archive_history_month('1970-01-15')$$,
    ARRAY[
        'effect_receipts_p197001', 'effect_receipt_events_p197001', 'block_outputs_p197001',
        'instance_transitions_p197001'
    ],
    'an ended month leaves the live tables, every table at once'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.effect_receipts
        WHERE id = (SELECT o.id FROM old_receipt AS o)
    ),
    0,
    'the live table no longer holds the receipt'
);
SELECT is(
    (
        SELECT r.tableoid::regclass::text FROM orch8_archive.effect_receipts AS r
        WHERE r.id = (SELECT o.id FROM old_receipt AS o)
    ),
    'orch8_archive.effect_receipts_p197001',
    'the archive does'
);
SELECT set_eq(
    $$SELECT id FROM orch8.find_receipts('t1', (SELECT o.id::text FROM old_receipt AS o))
      UNION ALL SELECT id FROM orch8.find_receipts('t1', 'order-1970')
      UNION ALL SELECT id FROM orch8.find_receipts('t1', 'ch_1970')$$,
    $$SELECT id FROM old_receipt$$,
    'find_receipts still finds it by its id, its idempotency key and the provider''s id'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8_archive.effect_receipt_events AS e
        WHERE e.receipt_id = (SELECT o.id FROM old_receipt AS o)
    ),
    (SELECT n FROM events_before),
    'its events went with it'
);
SELECT throws_ok(
    $$UPDATE orch8_archive.effect_receipts SET error = 'x'$$,
    'O8004', NULL,
    'the archive refuses rewrites'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.archive_history_month('1970-01-01')$$,
    'O8007', NULL,
    'a month archived already has no live partitions to archive'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.archive_history_month(current_date)$$,
    'O8008', NULL,
    'the current month cannot be archived'
);

-- Who may call what, and read where ------------------------------------------------------

SELECT ok(
    has_function_privilege(
        'orch8_runner', 'orch8.ensure_history_partitions(integer)',
        'EXECUTE'
    )
    AND NOT has_function_privilege(
        'orch8_web', 'orch8.ensure_history_partitions(integer)',
        'EXECUTE'
    )
    AND (
        SELECT p.prosecdef FROM pg_proc AS p
        WHERE p.oid = 'orch8.ensure_history_partitions(integer)'::regprocedure
    ),
    'the runner may make months (as the owner); the web may not'
);
SELECT ok(
    NOT has_function_privilege('orch8_runner', 'orch8.archive_history_month(date)', 'EXECUTE')
    AND NOT has_function_privilege('orch8_web', 'orch8.archive_history_month(date)', 'EXECUTE'),
    'archiving is the owner''s alone'
);
SELECT is_empty(
    $$SELECT c.oid::regclass::text FROM pg_inherits AS i
      INNER JOIN pg_class AS c ON c.oid = i.inhrelid
      WHERE i.inhparent IN (SELECT ('orch8.' || table_name)::regclass FROM orch8.history_tables)
        AND (has_table_privilege('orch8_web', c.oid, 'SELECT')
             OR has_table_privilege('orch8_runner', c.oid, 'SELECT')
             OR has_table_privilege('orch8_ledger', c.oid, 'INSERT')
             OR NOT c.relrowsecurity)$$,
    'a partition is read and written only through its parent (its grants and policies)'
);

SELECT * FROM finish();
ROLLBACK;
