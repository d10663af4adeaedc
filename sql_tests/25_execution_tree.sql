-- The execution tree (docs/ARCHITECTURE.md, "Composite blocks: the execution tree"): the
-- node transition table and its guard, the path grammar's helpers, effect ids of nested
-- paths, and the interpreter at work: parallel (one node per branch), for_each (one node
-- per item, concurrency), router and loop (decide), sub_sequence (run_child, child_ended),
-- each iteration's step with its own receipt. Time stands still at 2030-01-01 00:00 (five
-- seconds pass in section 8); each instance is run to its end before the next starts, so
-- every claim takes only its nodes.
BEGIN;
SELECT plan(115);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:00+00', true);

-- Fixtures: tap.* (sql_tests/fixtures/tree.sql), in tenant tree
SELECT set_config('tap.tenant', 'tree', true);

-- the effect id as its COMMENT documents it, byte by byte (independent of
-- uuid_from_digest): the first 16 bytes of the SHA-256, version 8, RFC 4122 variant
CREATE FUNCTION pg_temp.documented_effect_id(
    p_continuity uuid, p_epoch bigint, p_instance uuid, p_block text, p_attempt integer
)
RETURNS uuid
LANGUAGE sql
AS $$
    SELECT encode(
        set_byte(set_byte(x.d, 6, (get_byte(x.d, 6) & 15) | 128),
                 8, (get_byte(x.d, 8) & 63) | 128),
        'hex')::uuid
    FROM (
        SELECT substr(sha256(
            convert_to('orch8-effect-v1', 'UTF8') || '\x00'::bytea
            || uuid_send(p_continuity) || int8send(p_epoch) || uuid_send(p_instance)
            || convert_to(p_block, 'UTF8') || int4send(p_attempt)), 1, 16) AS d
    ) AS x
$$;

-- whether a receipt's id is the one its position gives: every scope here is new, so of
-- effect id version 2, the documented id led by the instance id's first six bytes
CREATE FUNCTION pg_temp.id_fits(p_receipt orch8.effect_receipts)
RETURNS boolean
LANGUAGE sql
AS $$
    SELECT p_receipt.id = encode(overlay(
        uuid_send(pg_temp.documented_effect_id(
            p_receipt.continuity_id, p_receipt.epoch, p_receipt.instance_id,
            p_receipt.block_id, p_receipt.attempt))
        PLACING substring(uuid_send(p_receipt.instance_id) FROM 1 FOR 6) FROM 1 FOR 6),
        'hex')::uuid
$$;

-- The sequences ------------------------------------------------------------------------

SELECT tap.seq('par', $${"blocks": [
    {"type": "parallel", "id": "fan", "branches": [
        [{"type": "step", "id": "ship", "handler": "x.ship"}],
        [{"type": "step", "id": "bill", "handler": "x.bill"}]]},
    {"type": "step", "id": "done", "handler": "transform", "params": {"value": 1}}]}$$);
SELECT tap.seq('each', $${"blocks": [
    {"type": "for_each", "id": "lines", "collection": "data.lines", "concurrency": 2,
     "body": [{"type": "step", "id": "charge", "handler": "x.pay"}]}]}$$);
SELECT tap.seq('few', $${"blocks": [
    {"type": "for_each", "id": "lines", "collection": "data.lines", "max_iterations": 2,
     "body": [{"type": "step", "id": "charge", "handler": "x.pay"}]}]}$$);
SELECT tap.seq('route', $${"blocks": [
    {"type": "router", "id": "tier",
     "routes": [
        {"condition": "data.amount > 1000",
         "blocks": [{"type": "step", "id": "review", "handler": "transform",
                     "params": {"value": "review"}}]},
        {"condition": "data.amount > 100",
         "blocks": [{"type": "step", "id": "fast", "handler": "transform",
                     "params": {"value": "fast"}}]}],
     "default": [{"type": "step", "id": "auto", "handler": "transform",
                  "params": {"value": "auto"}}]}]}$$);
SELECT tap.seq('poll', $${"blocks": [
    {"type": "loop", "id": "poll", "condition": "iteration < 2",
     "body": [{"type": "step", "id": "check", "handler": "x.check"}]}]}$$);
SELECT tap.seq('halve', $${"blocks": [
    {"type": "step", "id": "div", "handler": "transform",
     "params": {"expression": "data.n / 2"}}]}$$);
SELECT tap.seq('sub', $${"blocks": [
    {"type": "sub_sequence", "id": "half", "sequence_name": "halve",
     "input": {"n": "{{ data.n }}"}}]}$$);

-- 1. Node states and moves ------------------------------------------------------------------

SELECT is(
    enum_range(NULL::orch8.node_state),
    ARRAY[
        'ready', 'running', 'waiting', 'blocked', 'completed', 'failed', 'skipped', 'cancelled'
    ]::orch8.node_state[],
    'node_state has exactly the eight documented states, in order'
);

-- one row per from-state; columns ready, running, waiting, blocked, completed, failed,
-- skipped, cancelled (node_can_transition's COMMENT)
SELECT results_eq(
    $$SELECT f.s::text,
             orch8.node_can_transition(f.s, 'ready'),
             orch8.node_can_transition(f.s, 'running'),
             orch8.node_can_transition(f.s, 'waiting'),
             orch8.node_can_transition(f.s, 'blocked'),
             orch8.node_can_transition(f.s, 'completed'),
             orch8.node_can_transition(f.s, 'failed'),
             orch8.node_can_transition(f.s, 'skipped'),
             orch8.node_can_transition(f.s, 'cancelled')
      FROM unnest(enum_range(NULL::orch8.node_state)) WITH ORDINALITY AS f (s, i)
      ORDER BY f.i$$,
    $$VALUES ('ready', false, true, false, false, false, false, false, true),
             ('running', true, false, true, true, true, true, true, true),
             ('waiting', true, true, false, true, true, true, false, true),
             ('blocked', true, false, true, false, true, true, false, true),
             ('completed', false, false, false, false, false, false, false, false),
             ('failed', true, true, false, false, true, false, false, false),
             ('skipped', false, false, false, false, false, false, false, false),
             ('cancelled', true, true, true, true, false, false, false, false)$$,
    'node_can_transition: the full 8x8 matrix matches the transition table'
);
SELECT results_eq(
    $$SELECT count(*)::integer,
             count(*) FILTER (WHERE t.from_state IN ('completed', 'skipped'))::integer,
             count(*) FILTER (WHERE t.from_state = t.to_state)::integer
      FROM orch8.node_transition_table AS t$$,
    $$VALUES (27, 0, 0)$$,
    'node_transition_table: 27 moves, none out of completed or skipped, none in place'
);
SELECT is(
    orch8.node_can_transition(NULL, 'ready'), NULL,
    'node_can_transition is strict: a NULL state answers NULL'
);
SELECT is(
    orch8.node_kinds(),
    ARRAY[
        'sequence', 'step', 'compensation', 'parallel', 'race', 'loop', 'for_each',
        'router', 'try_catch', 'saga', 'undo', 'sub_sequence', 'sleep', 'wait_for_signal',
        'wait_for_input'
    ],
    'node_kinds: a list, a step, a compensation, each composite type, a sub_sequence, the waits'
);

-- 2. The path grammar ---------------------------------------------------------------------

SELECT results_eq(
    $$SELECT p.path, orch8.node_block_id(p.path)
      FROM (VALUES (1, ''), (2, 'charge'), (3, 'fan#1'), (4, 'fan#1/ship'),
                   (5, 'items[3]'), (6, 'items[3]/charge'), (7, 'pay.try'),
                   (8, 'pay.catch/notify'), (9, 'tier.route0/gold'), (10, 'tier.default'),
                   (11, 'trip.undo/book_hotel'), (12, '.on_failure[0]'),
                   (13, '.on_failure[0]/page'), (14, '.on_cancel'),
                   (15, 'poll[0]/lines[12]/charge')) AS p (n, path)
      ORDER BY p.n$$,
    $$VALUES ('', NULL), ('charge', 'charge'), ('fan#1', 'fan'), ('fan#1/ship', 'ship'),
             ('items[3]', 'items'), ('items[3]/charge', 'charge'), ('pay.try', 'pay'),
             ('pay.catch/notify', 'notify'), ('tier.route0/gold', 'gold'),
             ('tier.default', 'tier'), ('trip.undo/book_hotel', 'book_hotel'),
             ('.on_failure[0]', NULL), ('.on_failure[0]/page', 'page'),
             ('.on_cancel', NULL), ('poll[0]/lines[12]/charge', 'charge')$$,
    'node_block_id: the last segment up to its first marker; NULL for the root, '
    'on_failure and on_cancel'
);
SELECT is(orch8.node_block_id(NULL), NULL, 'node_block_id is strict');
SELECT results_eq(
    $$SELECT orch8.child_path('', 'charge'), orch8.child_path('fan#1', 'ship'),
             orch8.child_path('items[3]', 'x'), orch8.child_path('.on_failure[0]', 'page')$$,
    $$VALUES ('charge', 'fan#1/ship', 'items[3]/x', '.on_failure[0]/page')$$,
    'child_path: the id alone at the top level, else parent/id'
);
SELECT results_eq(
    $$SELECT orch8.compensated_path('trip.undo/book_hotel'),
             orch8.compensated_path('pay.try/trip.undo/book'),
             orch8.compensated_path('trip/book_hotel'),
             orch8.compensated_path('trip.undo'),
             orch8.compensated_path('a.undo/b/c')$$,
    $$VALUES ('trip/book_hotel', 'pay.try/trip/book', NULL, NULL, NULL)$$,
    'compensated_path: saga.undo/step names saga/step (nested too); any other path NULL'
);
SELECT results_eq(
    $$SELECT p.path, p.root, orch8.in_subtree(p.path, p.root)
      FROM (VALUES (1, 'x', ''), (2, 'fan', 'fan'), (3, 'fan#1/ship', 'fan'),
                   (4, 'fan#1/ship', 'fan#1'), (5, 'fanout', 'fan'), (6, 'fan', 'fan#1'),
                   (7, 'items[3]/x', 'items'), (8, 'items[30]/x', 'items[3]'),
                   (9, 'fan#10', 'fan#1'), (10, 'pay.try/charge', 'pay'),
                   (11, 'pay/charge', 'pay.try')) AS p (n, path, root)
      ORDER BY p.n$$,
    $$VALUES ('x', '', true), ('fan', 'fan', true), ('fan#1/ship', 'fan', true),
             ('fan#1/ship', 'fan#1', true), ('fanout', 'fan', false),
             ('fan', 'fan#1', false), ('items[3]/x', 'items', true),
             ('items[30]/x', 'items[3]', false), ('fan#10', 'fan#1', false),
             ('pay.try/charge', 'pay', true), ('pay/charge', 'pay.try', false)$$,
    'in_subtree: the root and what is below it at a marker, never a longer id or index'
);
SELECT results_eq(
    $$SELECT b.block_id, b.type, b.parent_id, b.depth, b.json_path, b.scope_vars
      FROM orch8.definition_blocks('{"blocks": [
          {"id": "lines", "type": "for_each", "item_var": "line",
           "body": [{"id": "try", "type": "try_catch",
                     "try_block": [{"id": "pay", "type": "step"}],
                     "catch_block": [{"id": "note", "type": "step"}]}]},
          {"id": "fan", "type": "parallel",
           "branches": [[{"id": "a", "type": "step"}], [{"id": "b", "type": "step"}]]}],
        "on_failure": [{"id": "page", "type": "step"}]}') AS b$$,
    $$VALUES ('lines', 'for_each', NULL, 1, '$.blocks[0]', ARRAY[]::text[]),
             ('try', 'try_catch', 'lines', 2, '$.blocks[0].body[0]', ARRAY['line', 'index']),
             ('pay', 'step', 'try', 3, '$.blocks[0].body[0].try_block[0]',
              ARRAY['line', 'index']),
             ('note', 'step', 'try', 3, '$.blocks[0].body[0].catch_block[0]',
              ARRAY['line', 'index', 'error']),
             ('fan', 'parallel', NULL, 1, '$.blocks[1]', ARRAY[]::text[]),
             ('a', 'step', 'fan', 2, '$.blocks[1].branches[0][0]', ARRAY[]::text[]),
             ('b', 'step', 'fan', 2, '$.blocks[1].branches[1][0]', ARRAY[]::text[]),
             ('page', 'step', NULL, 1, '$.on_failure[0]', ARRAY['error'])$$,
    'definition_blocks: every block at any depth in document order, with its parent, '
    'depth, JSON path and the variables bound around it'
);
SELECT results_eq(
    $$SELECT b.block_id, b.type, b.parent_id, b.depth FROM orch8.sequence_blocks AS b
      WHERE b.sequence_id = tap.id('par') ORDER BY b.block_id$$,
    $$VALUES ('bill', 'step', 'fan', 2), ('done', 'step', NULL, 1),
             ('fan', 'parallel', NULL, 1), ('ship', 'step', 'fan', 2)$$,
    'sequence_blocks: a stored sequence''s blocks are indexed by id, with parent and depth'
);

-- 3. Effect ids of nested paths ---------------------------------------------------------------
-- The path is the ledger's block_id. Two literal vectors, computed with Python's hashlib
-- as in 11_effect_ids.sql, pin the formula; the rest are computed here the documented way.

SELECT is(
    orch8.deterministic_effect_id(
        '00000000-0000-0000-0000-0000000000c1', 0,
        '00000000-0000-0000-0000-0000000000a1', 'fan#1/ship', 0
    ),
    'aa75a670-ce80-86f6-9f01-8260c1dff553'::uuid,
    'effect id vector: branch path fan#1/ship, attempt 0'
);
SELECT is(
    orch8.deterministic_effect_id(
        '00000000-0000-0000-0000-0000000000c1', 0,
        '00000000-0000-0000-0000-0000000000a1', 'items[3]/x', 2
    ),
    '538ec9a3-8218-8d9b-bcbc-dd7a04c574dc'::uuid,
    'effect id vector: iteration path items[3]/x, attempt 2'
);
SELECT is(
    orch8.deterministic_effect_id(
        '00000000-0000-0000-0000-0000000000c1', 0,
        '00000000-0000-0000-0000-0000000000a1', 'trip.undo/book_hotel', 0
    ),
    '9cbba20f-64c4-81ba-9a0c-403cc8151257'::uuid,
    'effect id vector: compensation path trip.undo/book_hotel'
);
SELECT is(
    orch8.deterministic_effect_id(
        '00000000-0000-0000-0000-0000000000c1', 0,
        '00000000-0000-0000-0000-0000000000a1', '.on_failure[0]/page', 0
    ),
    'b5430e87-36a6-8db2-83c3-512a33dc3d51'::uuid,
    'effect id vector: on_failure path .on_failure[0]/page'
);
SELECT is(
    pg_temp.documented_effect_id(
        '00000000-0000-0000-0000-0000000000c1', 0,
        '00000000-0000-0000-0000-0000000000a1', 'charge', 0
    ),
    '826498ec-87fb-8e62-95cb-77ad101c9496'::uuid,
    'the documented computation gives 11_effect_ids.sql''s flat vector for charge'
);
-- nested paths of each kind, with epochs and attempts around them
CREATE TEMP TABLE nested_paths (n integer, path text, epoch bigint, attempt integer);
INSERT INTO nested_paths VALUES
(1, 'fan#0/ship', 0, 0), (2, 'fan#1/ship', 0, 0),
(3, 'items[3]/x', 7, 1), (4, 'items[10]/x', 7, 1),
(5, 'pay.try/charge', 4294967301, 0), (6, 'pay.catch/charge', 1, 3),
(7, 'tier.route0/gold', 2, 0), (8, 'poll[0]/lines[12]/charge', 3, 2),
(9, 'fan#1/ship-é', 0, 0);
SELECT results_eq(
    $$SELECT p.path, orch8.deterministic_effect_id(
                 '6f1c2b3a-4d5e-4f60-8172-83a4b5c6d7e8', p.epoch,
                 '00000000-0000-0000-0000-0000000000a2', p.path, p.attempt)
      FROM nested_paths AS p ORDER BY p.n$$,
    $$SELECT p.path, pg_temp.documented_effect_id(
                 '6f1c2b3a-4d5e-4f60-8172-83a4b5c6d7e8', p.epoch,
                 '00000000-0000-0000-0000-0000000000a2', p.path, p.attempt)
      FROM nested_paths AS p ORDER BY p.n$$,
    'deterministic_effect_id of nested paths: the documented SHA-256 over the path as UTF-8'
);
SELECT is(
    (
        SELECT
            count(DISTINCT orch8.deterministic_effect_id(
                '00000000-0000-0000-0000-0000000000c1', 0,
                '00000000-0000-0000-0000-0000000000a1', p.path, 0
            ))::integer
        FROM unnest(ARRAY['ship', 'fan#0/ship', 'fan#1/ship', 'fan#1', 'fan/ship']) AS p (path)
    ),
    5,
    'effect ids: the same step in another branch, or at the top level, gets another id'
);

-- 4. parallel: one node per branch ---------------------------------------------------------

SELECT tap.new('p1', 'par');
SELECT results_eq(
    $$SELECT * FROM tap.tree('p1')$$,
    $$VALUES ('', NULL, 'sequence', 'running'), ('fan', '', 'parallel', 'running'),
             ('fan#0', 'fan', 'sequence', 'running'), ('fan#0/ship', 'fan#0', 'step', 'ready'),
             ('fan#1', 'fan', 'sequence', 'running'), ('fan#1/bill', 'fan#1', 'step', 'ready')$$,
    'parallel: the block, a list per branch (fan#i) and each branch''s first step, ready'
);
SELECT results_eq(
    $$SELECT n.selector, n.block_id FROM orch8.execution_nodes AS n
      WHERE n.instance_id = tap.id('p1') AND n.path IN ('fan#0', 'fan#1') ORDER BY n.path$$,
    $$VALUES (ARRAY['branches', '0'], 'fan'), (ARRAY['branches', '1'], 'fan')$$,
    'parallel: each branch list selects its branch of the block'
);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$,
    $$VALUES ('p1:fan#0/ship'), ('p1:fan#1/bill')$$,
    'claim: one batch takes both branches of one instance'
);
SELECT results_eq(
    $$SELECT tap.tok('p1', 'fan#0/ship') <> tap.tok('p1', 'fan#1/bill'),
             (SELECT count(*)::integer FROM orch8.instance_transitions AS a
              WHERE a.instance_id = tap.id('p1') AND a.to_state = 'running'),
             tap.state('p1')$$,
    $$VALUES (true, 1, 'running')$$,
    'claim: each branch has its own lease; the instance became running once'
);
SELECT is(tap.begin('p1', 'fan#0/ship', 'x.ship'), 'dispatched', 'parallel: ship dispatches');
SELECT results_eq(
    $$SELECT r.block_id::text, r.attempt::integer, pg_temp.id_fits(r),
             r.id <> orch8.effect_receipt_id(
                 2, r.continuity_id, r.epoch, r.instance_id, 'ship', 0)
      FROM tap.receipt('p1', 'fan#0/ship') AS r$$,
    $$VALUES ('fan#0/ship', 0, true, true)$$,
    'parallel: the receipt names the branch path, and its id is that path''s'
);
SELECT results_eq(
    $$SELECT * FROM tap.finish('p1', 'fan#0/ship', 'ok', '{"s": 1}')$$,
    $$VALUES ('running', NULL::text, NULL::jsonb)$$,
    'parallel: a branch ends while the other runs: nothing to hand over'
);
SELECT results_eq(
    $$SELECT path, state FROM tap.tree('p1') WHERE path IN ('fan', 'fan#0', 'fan#0/ship')$$,
    $$VALUES ('fan', 'running'), ('fan#0', 'completed'), ('fan#0/ship', 'completed')$$,
    'parallel: the finished branch completes, the block waits for the other'
);
SELECT is(tap.begin('p1', 'fan#1/bill', 'x.bill'), 'dispatched', 'parallel: bill dispatches');
SELECT results_eq(
    $$SELECT * FROM tap.finish('p1', 'fan#1/bill', 'ok', '{"b": 2}')$$,
    $$VALUES ('running', 'done', '{}'::jsonb)$$,
    'parallel: the last branch ends the block; the next block is handed over'
);
SELECT results_eq(
    $$SELECT (tap.node('p1', 'fan')).state::text,
             orch8.node_output('tree', tap.id('p1'), 'fan'),
             tap.tok('p1', 'done') IS NOT NULL$$,
    $$VALUES ('completed', '[{"s": 1}, {"b": 2}]'::jsonb, true)$$,
    'parallel: completed with every branch''s output, in branch order'
);
SELECT results_eq(
    $$SELECT * FROM tap.finish('p1', 'done', 'ok', '1')$$,
    $$VALUES ('completed', NULL::text, NULL::jsonb)$$,
    'parallel: the step after it completes the instance'
);
SELECT throws_ok(
    $$UPDATE orch8.execution_nodes SET state = 'running'
      WHERE instance_id = tap.id('p1') AND path = 'fan'$$,
    'O8004', NULL, 'the guard: a completed node cannot move (O8004)'
);
SELECT throws_ok(
    $$UPDATE orch8.execution_nodes SET path = 'fan2'
      WHERE instance_id = tap.id('p1') AND path = 'fan'$$,
    'O8004', NULL, 'the guard: a node''s identity cannot change (O8004)'
);
SELECT throws_ok(
    $$DELETE FROM orch8.execution_nodes WHERE instance_id = tap.id('p1')$$,
    'O8004', NULL, 'the guard: nodes are never deleted (O8004)'
);

-- a failed branch fails the block (on_branch_failure fail) and stops the other
SELECT tap.new('p2', 'par');
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$,
    $$VALUES ('p2:fan#0/ship'), ('p2:fan#1/bill')$$,
    'p2: both branches are claimed'
);
SELECT tap.begin('p2', 'fan#0/ship', 'x.ship');
SELECT results_eq(
    $$SELECT state, next_block
      FROM tap.finish('p2', 'fan#0/ship', 'not_applied', '{}', 'no stock')$$,
    $$VALUES ('failed', NULL::text)$$,
    'parallel: a failed branch fails the instance'
);
SELECT results_eq(
    $$SELECT n.path, n.state::text, n.error, n.failed_child, n.cancel_requested
      FROM orch8.execution_nodes AS n WHERE n.instance_id = tap.id('p2')
        AND n.path IN ('', 'fan', 'fan#1/bill') ORDER BY n.path$$,
    $$VALUES ('', 'failed', 'no stock', 'fan', false),
             ('fan', 'failed', 'no stock', 'fan#0', false),
             ('fan#1/bill', 'running', NULL, NULL, true)$$,
    'parallel: the block and the root fail, naming where; the leased sibling is asked to stop'
);
SELECT is(
    (
        SELECT (orch8.begin_step(
            'tree', tap.id('p2'), tap.tok('p2', 'fan#1/bill'),
            'fan#1/bill', 'x.bill', '{}', 0
        )).outcome
    ),
    'stopped',
    'parallel: the stopped sibling''s begin_step answers stopped'
);
SELECT results_eq(
    $$SELECT (tap.node('p2', 'fan#1/bill')).state::text,
             (tap.node('p2', 'fan#1/bill')).lease_token,
             (SELECT count(*)::integer FROM orch8.effect_receipts AS r
              WHERE r.instance_id = tap.id('p2') AND r.block_id = 'fan#1/bill'),
             tap.state('p2')$$,
    $$VALUES ('cancelled', NULL::uuid, 0, 'failed')$$,
    'parallel: the sibling ends cancelled without a receipt; the instance stays failed'
);

-- 5. for_each: one node per item ---------------------------------------------------------

SELECT tap.new('f1', 'each', '{"lines": [1, 2, 3]}');
SELECT results_eq(
    $$SELECT n.kind::text, n.state::text, n.items FROM orch8.execution_nodes AS n
      WHERE n.instance_id = tap.id('f1') AND n.path = 'lines'$$,
    $$VALUES ('for_each', 'ready', '{"asking": "collection"}'::jsonb)$$,
    'for_each: a ready node that asks for its collection'
);
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('f1:lines')$$, 'f1: claimed');
SELECT throws_ok(
    $$SELECT * FROM tap.decide('f1', 'lines', '{"a": 1}')$$,
    'O8008', NULL, 'decide: a collection that is not an array is O8008'
);
SELECT results_eq(
    $$SELECT * FROM tap.decide('f1', 'lines', '[{"sku": "a"}, {"sku": "b"}, {"sku": "c"}]')$$,
    $$VALUES ('running', 'lines[0]/charge', 'step', NULL::text, 0,
              '{"item": {"sku": "a"}, "index": 0}'::jsonb)$$,
    'decide: the collection starts the items; the first item''s step is handed over with '
    'item and index bound'
);
SELECT results_eq(
    $$SELECT * FROM tap.tree('f1')$$,
    $$VALUES ('', NULL, 'sequence', 'running'), ('lines', '', 'for_each', 'running'),
             ('lines[0]', 'lines', 'sequence', 'running'),
             ('lines[0]/charge', 'lines[0]', 'step', 'running'),
             ('lines[1]', 'lines', 'sequence', 'running'),
             ('lines[1]/charge', 'lines[1]', 'step', 'ready')$$,
    'for_each: concurrency 2 starts two items (lines[k]), each with its own step node'
);
SELECT results_eq(
    $$SELECT n.position, n.items, n.lease_token,
             (tap.node('f1', 'lines[1]')).vars::jsonb
      FROM tap.node('f1', 'lines') AS n$$,
    $$VALUES (2, '{"collection": [{"sku": "a"}, {"sku": "b"}, {"sku": "c"}]}'::jsonb,
              NULL::uuid, '{"item": {"sku": "b"}, "index": 1}'::jsonb)$$,
    'for_each: the block keeps the collection and its next item, without a lease; an item '
    'binds item and index'
);
SELECT results_eq(
    $$SELECT o.attempt::integer, o.sentinel::text, o.output FROM orch8.block_outputs AS o
      WHERE o.instance_id = tap.id('f1') AND o.block_id = 'lines'$$,
    $$VALUES (0, '__decision__'::text,
              '{"asking": "collection", "value": [{"sku": "a"}, {"sku": "b"}, {"sku": "c"}]}'
              ::jsonb)$$,
    'decide: the value is recorded as a __decision__ row'
);
SELECT throws_ok(
    $$SELECT orch8.decide('tree', tap.id('f1'), tap.tok('f1', 'lines[0]/charge'),
                          'lines', '[]')$$,
    'O8001', NULL, 'decide: a node the token no longer holds is O8001'
);
SELECT throws_ok(
    $$SELECT orch8.decide('tree', tap.id('f1'), tap.tok('f1', 'lines[0]/charge'),
                          'lines[0]/charge', '[]')$$,
    'O8008', NULL, 'decide: a step node is O8008 (decide answers loop, for_each, router)'
);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('f1:lines[1]/charge')$$,
    'f1: the second item''s step is claimed'
);
SELECT results_eq(
    $$SELECT tap.begin('f1', 'lines[0]/charge', 'x.pay')
      UNION ALL SELECT tap.begin('f1', 'lines[1]/charge', 'x.pay')$$,
    $$VALUES ('dispatched'), ('dispatched')$$,
    'for_each: both items dispatch their step'
);
SELECT results_eq(
    $$SELECT * FROM tap.finish('f1', 'lines[0]/charge', 'ok', '"a"')$$,
    $$VALUES ('running', 'lines[2]/charge', '{"item": {"sku": "c"}, "index": 2}'::jsonb)$$,
    'for_each: an item done starts the next one, handed over under the same lease'
);
SELECT is(
    tap.begin('f1', 'lines[2]/charge', 'x.pay'), 'dispatched',
    'for_each: the third item dispatches'
);
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('f1', 'lines[2]/charge', 'ok', '"c"')$$,
    $$VALUES ('running', NULL::text)$$,
    'for_each: the block waits for its last item'
);
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('f1', 'lines[1]/charge', 'ok', '"b"')$$,
    $$VALUES ('completed', NULL::text)$$,
    'for_each: the last item ends the block and the instance'
);
SELECT results_eq(
    $$SELECT (tap.node('f1', 'lines')).state::text,
             orch8.node_output('tree', tap.id('f1'), 'lines'),
             (tap.node('f1', '')).output$$,
    $$VALUES ('completed', '["a", "b", "c"]'::jsonb, '["a", "b", "c"]'::jsonb)$$,
    'for_each: completed with the items'' outputs in item order'
);
SELECT results_eq(
    $$SELECT r.block_id::text, r.attempt::integer, r.state::text, pg_temp.id_fits(r)
      FROM orch8.effect_receipts AS r WHERE r.instance_id = tap.id('f1')
      ORDER BY r.block_id$$,
    $$VALUES ('lines[0]/charge', 0, 'committed', true), ('lines[1]/charge', 0, 'committed', true),
             ('lines[2]/charge', 0, 'committed', true)$$,
    'for_each: each item''s step has its own receipt at attempt 0, its id its path''s'
);
SELECT is(
    (
        SELECT count(DISTINCT r.id)::integer FROM orch8.effect_receipts AS r
        WHERE r.instance_id = tap.id('f1')
    ),
    3,
    'for_each: three items, three distinct effect ids'
);

SELECT tap.new('f2', 'each', '{"lines": []}');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('f2:lines')$$, 'f2: claimed');
SELECT results_eq(
    $$SELECT state, next_block FROM tap.decide('f2', 'lines', '[]')$$,
    $$VALUES ('completed', NULL::text)$$,
    'for_each: an empty collection completes at once'
);
SELECT results_eq(
    $$SELECT orch8.node_output('tree', tap.id('f2'), 'lines'),
             (SELECT count(*)::integer FROM orch8.execution_nodes AS n
              WHERE n.instance_id = tap.id('f2'))$$,
    $$VALUES ('[]'::jsonb, 2)$$,
    'for_each: an empty collection outputs [] and starts no item'
);

SELECT tap.new('f3', 'few');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('f3:lines')$$, 'f3: claimed');
SELECT results_eq(
    $$SELECT state, next_block FROM tap.decide('f3', 'lines', '[1, 2, 3]')$$,
    $$VALUES ('failed', NULL::text)$$,
    'for_each: a collection over max_iterations fails the instance'
);
SELECT is(
    (tap.node('f3', 'lines')).error,
    'for_each lines: the collection has 3 items, over max_iterations (2)',
    'for_each: the error names the size and the limit'
);

-- 6. router: decide takes a route -----------------------------------------------------------

SELECT tap.new('r1', 'route', '{"amount": 500}');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('r1:tier')$$, 'r1: claimed');
SELECT results_eq(
    $$SELECT n.kind::text, n.items ->> 'asking' FROM tap.node('r1', 'tier') AS n$$,
    $$VALUES ('router', 'route')$$,
    'router: its node asks for the route'
);
SELECT throws_ok(
    $$SELECT * FROM tap.decide('r1', 'tier', '"fast"')$$,
    'O8008', NULL, 'decide: a route that is not an index or null is O8008'
);
SELECT throws_ok(
    $$SELECT * FROM tap.decide('r1', 'tier', '-1')$$,
    'O8008', NULL, 'decide: a negative route is O8008 (one name per route)'
);
SELECT throws_ok(
    $$SELECT * FROM tap.decide('r1', 'tier', '1.5')$$,
    'O8008', NULL, 'decide: a fractional route is O8008'
);
SELECT throws_ok(
    $$SELECT * FROM tap.decide('r1', 'tier', '2')$$,
    'O8008', 'router tier has routes 0 to 1, got 2', 'decide: a route past the last is O8008'
);
SELECT throws_ok(
    $$SELECT * FROM tap.decide('r1', 'tier', '3000000000')$$,
    'O8008', NULL, 'decide: a route past integer range is O8008, not a cast error'
);
SELECT results_eq(
    $$SELECT state, next_block, next_kind FROM tap.decide('r1', 'tier', '1')$$,
    $$VALUES ('running', 'tier.route1/fast', 'step')$$,
    'decide: route 1 starts tier.route1 and hands its first step over'
);
SELECT results_eq(
    $$SELECT n.path, n.parent_path, n.selector FROM orch8.execution_nodes AS n
      WHERE n.instance_id = tap.id('r1') AND n.path LIKE 'tier.%' ORDER BY n.path$$,
    $$VALUES ('tier.route1', 'tier', ARRAY['routes', '1', 'blocks']),
             ('tier.route1/fast', 'tier.route1', NULL)$$,
    'router: only the route taken has nodes'
);
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('r1', 'tier.route1/fast', 'ok', '"fast"')$$,
    $$VALUES ('completed', NULL::text)$$,
    'router: the route''s end ends the router and the instance'
);
SELECT results_eq(
    $$SELECT (tap.node('r1', 'tier')).state::text,
             orch8.node_output('tree', tap.id('r1'), 'tier'),
             (SELECT o.output FROM orch8.block_outputs AS o
              WHERE o.instance_id = tap.id('r1') AND o.block_id = 'tier'
                AND o.sentinel = '__decision__')$$,
    $$VALUES ('completed', '"fast"'::jsonb, '{"asking": "route", "value": 1}'::jsonb)$$,
    'router: completed with its route''s output; the decision is recorded'
);

SELECT tap.new('r2', 'route', '{"amount": 5}');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('r2:tier')$$, 'r2: claimed');
SELECT results_eq(
    $$SELECT state, next_block FROM tap.decide('r2', 'tier', 'null')$$,
    $$VALUES ('running', 'tier.default/auto')$$,
    'decide: no route (null) starts the default'
);
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('r2', 'tier.default/auto', 'ok', '"auto"')$$,
    $$VALUES ('completed', NULL::text)$$,
    'router: the default''s end completes the instance'
);

SELECT tap.new('r3', 'route', '{"amount": 5}');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('r3:tier')$$, 'r3: claimed');
SELECT results_eq(
    $$SELECT state, next_block FROM tap.decide('r3', 'tier', NULL, 'amount is undefined')$$,
    $$VALUES ('failed', NULL::text)$$,
    'decide with an error (the condition failed): the router and the instance fail'
);
SELECT results_eq(
    $$SELECT n.state::text, n.error, (SELECT t.error FROM orch8.task_instances AS t
                                       WHERE t.id = n.instance_id)
      FROM tap.node('r3', 'tier') AS n$$,
    $$VALUES ('failed', 'router tier: amount is undefined', 'router tier: amount is undefined')$$,
    'decide with an error: the error names the block'
);

-- 7. loop: each iteration its own nodes and receipt ---------------------------------------

SELECT tap.new('l1', 'poll');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('l1:poll')$$, 'l1: claimed');
SELECT throws_ok(
    $$SELECT * FROM tap.decide('l1', 'poll', '1')$$,
    'O8008', NULL, 'decide: a condition that is not a boolean is O8008'
);
SELECT results_eq(
    $$SELECT * FROM tap.decide('l1', 'poll', 'true')$$,
    $$VALUES ('running', 'poll[0]/check', 'step', NULL::text, 0, '{"iteration": 0}'::jsonb)$$,
    'decide: a true condition starts iteration 0, iteration bound'
);
SELECT tap.begin('l1', 'poll[0]/check', 'x.check');
SELECT results_eq(
    $$SELECT f.state::text, f.next_block, f.next_kind, f.next_phase, f.next_position
      FROM orch8.finish_step('tree', tap.id('l1'), tap.tok('l1', 'poll[0]/check'),
                             'poll[0]/check', 0, (tap.receipt('l1', 'poll[0]/check')).id,
                             'ok', '{"n": 0}') AS f$$,
    $$VALUES ('running', 'poll', 'loop', 'condition', 1)$$,
    'loop: an iteration done hands the loop over, asking its condition for iteration 1'
);
SELECT results_eq(
    $$SELECT next_block, next_vars FROM tap.decide('l1', 'poll', 'true')$$,
    $$VALUES ('poll[1]/check', '{"iteration": 1}'::jsonb)$$,
    'decide: a true condition starts iteration 1'
);
SELECT tap.begin('l1', 'poll[1]/check', 'x.check');
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('l1', 'poll[1]/check', 'ok', '{"n": 1}')$$,
    $$VALUES ('running', 'poll')$$,
    'loop: the second iteration done asks again'
);
SELECT results_eq(
    $$SELECT state, next_block FROM tap.decide('l1', 'poll', 'false')$$,
    $$VALUES ('completed', NULL::text)$$,
    'decide: a false condition completes the loop and the instance'
);
SELECT results_eq(
    $$SELECT (tap.node('l1', 'poll')).output, (tap.node('l1', '')).output$$,
    $$VALUES ('{"n": 1}'::jsonb, '{"n": 1}'::jsonb)$$,
    'loop: its output is its last iteration''s'
);
SELECT results_eq(
    $$SELECT o.attempt::integer, o.output FROM orch8.block_outputs AS o
      WHERE o.instance_id = tap.id('l1') AND o.block_id = 'poll'
        AND o.sentinel = '__decision__' ORDER BY o.seq$$,
    $$VALUES (0, '{"asking": "condition", "value": true, "iteration": 0}'::jsonb),
             (1, '{"asking": "condition", "value": true, "iteration": 1}'::jsonb),
             (2, '{"asking": "condition", "value": false, "iteration": 2}'::jsonb)$$,
    'loop: every decision is recorded with its iteration'
);
SELECT results_eq(
    $$SELECT r.block_id::text, r.attempt::integer, pg_temp.id_fits(r)
      FROM orch8.effect_receipts AS r
      WHERE r.instance_id = tap.id('l1') ORDER BY r.block_id$$,
    $$VALUES ('poll[0]/check', 0, true), ('poll[1]/check', 0, true)$$,
    'loop: each iteration''s step has its own receipt at attempt 0, its id its path''s'
);
SELECT isnt(
    (tap.receipt('l1', 'poll[0]/check')).id, (tap.receipt('l1', 'poll[1]/check')).id,
    'loop: the two iterations'' effect ids differ'
);

-- 8. sub_sequence: run_child and child_ended -----------------------------------------------

SELECT tap.new('s1', 'sub', '{"n": 4}', '{"region": "eu"}', 7);
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('s1:half')$$, 's1: claimed');
SELECT throws_ok(
    $$SELECT orch8.run_child('tree', tap.id('s1'), tap.tok('s1', 'half'), 'half',
                             tap.id('sub'), '{"n": 4}')$$,
    'O8008', NULL, 'run_child: a sequence other than the one the block names is O8008'
);
CREATE TEMP TABLE saved AS SELECT tap.tok('s1', 'half') AS token;
SELECT results_eq(
    $$SELECT r.state::text, r.next_block
      FROM orch8.run_child('tree', tap.id('s1'), tap.tok('s1', 'half'), 'half',
                           tap.id('halve'), '{"n": 4}') AS r$$,
    $$VALUES ('waiting', NULL::text)$$,
    'run_child: the child is started and the parent waits'
);
INSERT INTO tap.names (name, id)
SELECT
    'c1' AS name,
    (tap.node('s1', 'half')).child_instance_id AS id;
SELECT results_eq(
    $$SELECT n.state::text, n.lease_token, n.child_instance_id IS NOT NULL
      FROM tap.node('s1', 'half') AS n$$,
    $$VALUES ('waiting', NULL::uuid, true)$$,
    'run_child: the node waits for its child, without a lease'
);
SELECT results_eq(
    $$SELECT t.state::text, t.parent_instance_id, t.parent_path, t.depth::integer,
             t.context::jsonb, t.priority, t.idempotency_key::text
      FROM orch8.task_instances AS t WHERE t.id = tap.id('c1')$$,
    $$SELECT 'scheduled', tap.id('s1'), 'half'::text, 1,
             '{"data": {"n": 4}, "config": {"region": "eu"}, "runtime": {}}'::jsonb, 7,
             format('orch8:child:%s:half:0', tap.id('s1'))$$,
    'run_child: the child has the input as data, the parent''s config and priority, '
    'depth 1 and a key from the parent, path and attempt'
);
SELECT throws_ok(
    $$SELECT orch8.run_child('tree', tap.id('s1'), (SELECT s.token FROM saved AS s),
                             'half', tap.id('halve'), '{"n": 4}')$$,
    'O8001', NULL, 'run_child: the lease given up by waiting is O8001'
);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('c1:div')$$,
    'the child''s step is claimed (the waiting parent has nothing due)'
);
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('c1', 'div', 'ok', '{"half": 2}')$$,
    $$VALUES ('completed', NULL::text)$$,
    'the child completes'
);
SELECT results_eq(
    $$SELECT n.state::text, n.next_fire_at, tap.state('s1')
      FROM tap.node('s1', 'half') AS n$$,
    $$VALUES ('ready', '2030-01-01 00:00:00+00'::timestamptz, 'waiting')$$,
    'child_ended: the parent''s node is ready again; the parent waits until it is claimed'
);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:05+00', true);
SELECT orch8.child_ended((
    SELECT t FROM orch8.task_instances AS t
    WHERE t.id = tap.id('c1')
));
SELECT results_eq(
    $$SELECT n.state::text, n.next_fire_at, n.updated_at FROM tap.node('s1', 'half') AS n$$,
    $$VALUES ('ready', '2030-01-01 00:00:00+00'::timestamptz,
              '2030-01-01 00:00:00+00'::timestamptz)$$,
    'child_ended again (5 seconds later): a node that no longer waits is left alone'
);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('s1:half')$$,
    'the parent''s node is claimed again'
);
SELECT results_eq(
    $$SELECT r.state::text, r.next_block
      FROM orch8.run_child('tree', tap.id('s1'), tap.tok('s1', 'half'), 'half',
                           tap.id('halve'), '{"n": 4}') AS r$$,
    $$VALUES ('completed', NULL::text)$$,
    'run_child: the child completed: the node and the parent complete'
);
SELECT results_eq(
    $$SELECT orch8.node_output('tree', tap.id('s1'), 'half'),
             (SELECT count(*)::integer FROM orch8.task_instances AS t
              WHERE t.parent_instance_id = tap.id('s1'))$$,
    $$VALUES ('{"half": 2}'::jsonb, 1)$$,
    'run_child: the node''s output is the child''s; the repeated call made no second child'
);
SELECT results_eq(
    $$SELECT a.from_state::text, a.to_state::text, a.actor
      FROM orch8.instance_transitions AS a WHERE a.instance_id = tap.id('s1')
      ORDER BY a.seq$$,
    $$VALUES (NULL, 'scheduled', 'create'), ('scheduled', 'running', 'tree-runner'),
             ('running', 'waiting', 'runner'), ('waiting', 'running', 'tree-runner'),
             ('running', 'completed', 'runner')$$,
    'sub_sequence: the parent ran, waited for its child, was claimed from waiting, completed'
);

-- a child that fails fails its node
SELECT tap.new('s2', 'sub', '{"n": 4}');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('s2:half')$$, 's2: claimed');
SELECT FROM orch8.run_child(
    'tree', tap.id('s2'), tap.tok('s2', 'half'), 'half',
    tap.id('halve'), '{"n": 4}'
);
INSERT INTO tap.names (name, id)
SELECT
    'c2' AS name,
    (tap.node('s2', 'half')).child_instance_id AS id;
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('c2:div')$$, 'c2: claimed');
SELECT results_eq(
    $$SELECT state FROM tap.finish('c2', 'div', 'error', '{}', 'division failed')$$,
    $$VALUES ('failed')$$,
    'the child fails'
);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('s2:half')$$,
    'the parent''s node is ready again and claimed'
);
SELECT results_eq(
    $$SELECT r.state::text
      FROM orch8.run_child('tree', tap.id('s2'), tap.tok('s2', 'half'), 'half',
                           tap.id('halve'), '{"n": 4}') AS r$$,
    $$VALUES ('failed')$$,
    'run_child: the child failed: the node and the parent fail'
);
SELECT results_eq(
    $$SELECT n.state::text, n.error FROM tap.node('s2', 'half') AS n$$,
    $$SELECT 'failed', format('child %s failed: division failed', tap.id('c2'))$$,
    'run_child: the node''s error names the child and its error'
);

-- an input that did not render fails the node without a child
SELECT tap.new('s3', 'sub', '{}');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('s3:half')$$, 's3: claimed');
SELECT results_eq(
    $$SELECT r.state::text
      FROM orch8.run_child('tree', tap.id('s3'), tap.tok('s3', 'half'), 'half',
                           tap.id('halve'), NULL, 'data.n is undefined') AS r$$,
    $$VALUES ('failed')$$,
    'run_child with an error: the node fails'
);
SELECT results_eq(
    $$SELECT n.error, n.child_instance_id,
             (SELECT o.sentinel::text FROM orch8.block_outputs AS o
              WHERE o.instance_id = n.instance_id AND o.block_id = 'half')
      FROM tap.node('s3', 'half') AS n$$,
    $$VALUES ('data.n is undefined', NULL::uuid, '__error__'::text)$$,
    'run_child with an error: no child, an __error__ row, the error kept'
);
SELECT is(
    (SELECT count(*)::integer FROM tap.claim()), 0,
    'every instance ran to its end: nothing is left to claim'
);

SELECT * FROM finish();
ROLLBACK;
