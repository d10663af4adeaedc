-- The execution tree's handlers that 25_execution_tree.sql does not reach, through the
-- public calls that run them: the rules of the language's shape (block_containers,
-- block_defaults, claimable_kinds, for_each_vars), try_catch (try_catch_part_ended,
-- node_error, node_vars), saga (start_undo, compensate_receipts), race (cancel_subtree,
-- stop_node), cancel_instance and the definition's on_cancel and on_failure
-- (instance_end), sync_instance and a pause (hand_over), reopen_failure through
-- retry_instance, and the guard trigger. Time starts at 2030-01-01 00:00 and only moves
-- forward (one second in section 3, thirty more in section 6); each instance is run to its end
-- before the next starts, so every claim takes only its nodes.
BEGIN;
SELECT plan(122);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:00+00', true);

-- Fixtures: tap.* (sql_tests/fixtures/tree.sql), in tenant hand
SELECT set_config('tap.tenant', 'hand', true);

-- The sequences ------------------------------------------------------------------------

SELECT tap.seq('tc', $${"blocks": [
    {"type": "try_catch", "id": "pay",
     "try_block": [{"type": "step", "id": "charge", "handler": "x.pay"}],
     "catch_block": [{"type": "step", "id": "explain", "handler": "transform",
                      "params": {"expression": "error.message"}}],
     "finally_block": [{"type": "step", "id": "audit", "handler": "transform",
                        "params": {"value": "audited"}}]},
    {"type": "step", "id": "after", "handler": "transform", "params": {"value": 1}}]}$$);
SELECT tap.seq('tf', $${"blocks": [
    {"type": "try_catch", "id": "pay",
     "try_block": [{"type": "step", "id": "charge", "handler": "x.pay"}],
     "finally_block": [{"type": "step", "id": "audit", "handler": "transform",
                        "params": {"value": "audited"}}]}]}$$);
-- hotel completes a second before flight: the reverse of completion is not path order
SELECT tap.seq('saga', $${"blocks": [
    {"type": "saga", "id": "trip", "blocks": [
        {"type": "step", "id": "hotel", "handler": "x.book",
         "compensation": {"handler": "x.cancel", "params": {"what": "hotel"}}},
        {"type": "step", "id": "note", "handler": "transform", "params": {"value": 1}},
        {"type": "step", "id": "flight", "handler": "x.book",
         "compensation": {"handler": "x.cancel", "params": {"what": "flight"}}},
        {"type": "step", "id": "car", "handler": "x.book"}]}]}$$);
SELECT tap.seq('bare', $${"blocks": [
    {"type": "saga", "id": "trip", "blocks": [
        {"type": "step", "id": "hotel", "handler": "x.book"},
        {"type": "step", "id": "car", "handler": "x.book"}]}]}$$);
SELECT tap.seq('resolve', $${"blocks": [
    {"type": "race", "id": "quote", "branches": [
        [{"type": "step", "id": "slow", "handler": "transform", "params": {"value": 0}}],
        [{"type": "step", "id": "fast", "handler": "x.quote"}],
        [{"type": "step", "id": "late", "handler": "x.quote"}]]}]}$$);
SELECT tap.seq('succeed', $${"blocks": [
    {"type": "race", "id": "quote", "semantics": "first_to_succeed", "branches": [
        [{"type": "step", "id": "primary", "handler": "x.quote"}],
        [{"type": "step", "id": "backup", "handler": "x.quote"}]]}]}$$);
SELECT tap.seq('kid', $${"blocks": [
    {"type": "step", "id": "work", "handler": "x.work"}]}$$);
SELECT tap.seq('mom', $${"blocks": [
    {"type": "sub_sequence", "id": "sub", "sequence_name": "kid"}],
    "on_cancel": [{"type": "step", "id": "tidy", "handler": "transform",
                   "params": {"value": "tidied"}}]}$$);
SELECT tap.seq('pager', $${"blocks": [
    {"type": "step", "id": "charge", "handler": "x.pay"}],
    "on_failure": [{"type": "step", "id": "page", "handler": "transform",
                    "params": {"expression": "'paging: ' + error.message"}}]}$$);
SELECT tap.seq('par', $${"blocks": [
    {"type": "parallel", "id": "fan", "branches": [
        [{"type": "step", "id": "ship", "handler": "x.ship"}],
        [{"type": "step", "id": "bill", "handler": "transform", "params": {"value": "billed"}},
         {"type": "step", "id": "mail", "handler": "transform",
          "params": {"value": "mailed"}}]]}]}$$);
SELECT tap.seq('par2', $${"blocks": [
    {"type": "parallel", "id": "fan", "branches": [
        [{"type": "step", "id": "ship", "handler": "x.ship"}],
        [{"type": "step", "id": "bill", "handler": "x.bill"},
         {"type": "step", "id": "mail", "handler": "transform",
          "params": {"value": "mailed"}}]]}]}$$);
SELECT tap.seq('nested', $${"blocks": [
    {"type": "step", "id": "charge", "handler": "x.pay"}],
    "on_failure": [{"type": "try_catch", "id": "notify",
                    "try_block": [{"type": "step", "id": "page", "handler": "transform",
                                   "params": {"value": "paged"}}],
                    "finally_block": [{"type": "step", "id": "log", "handler": "transform",
                                       "params": {"expression": "error.message"}}]}]}$$);
SELECT tap.seq('two', $${"blocks": [
    {"type": "step", "id": "a", "handler": "transform", "params": {"value": 1}},
    {"type": "step", "id": "b", "handler": "transform", "params": {"value": 2}}]}$$);

-- 1. The rules of the tree's shape ----------------------------------------------------------

SELECT results_eq(
    $$SELECT count(*)::integer, count(DISTINCT c.type)::integer,
             count(*) FILTER (WHERE c.binds IS NOT NULL)::integer
      FROM orch8.block_containers() AS c$$,
    $$VALUES (15, 10, 5)$$,
    'block_containers: 15 fields of 10 holders (the definition and 9 types), 5 of them bind'
);
SELECT results_eq(
    $$SELECT c.type, c.field, c.shape, c.binds FROM orch8.block_containers() AS c
      WHERE c.type IN ('parallel', 'race', 'for_each', 'loop', 'router')
      ORDER BY c.type, c.field$$,
    $$VALUES ('for_each', 'body', 'list', 'item'), ('loop', 'body', 'list', 'iteration'),
             ('parallel', 'branches', 'lists', NULL), ('race', 'branches', 'lists', NULL),
             ('router', 'default', 'list', NULL), ('router', 'routes', 'routes', NULL)$$,
    'block_containers: branches are lists, a for_each body binds item, a loop''s iteration, '
    'a router holds routes and a default list'
);
SELECT results_eq(
    $$SELECT c.type, c.field, c.shape, c.binds FROM orch8.block_containers() AS c
      WHERE c.type IN ('try_catch', 'saga', 'definition')
      ORDER BY c.type, c.field$$,
    $$VALUES ('definition', 'blocks', 'list', NULL), ('definition', 'on_cancel', 'list', NULL),
             ('definition', 'on_failure', 'list', 'error'),
             ('saga', 'blocks', 'list', NULL),
             ('try_catch', 'catch_block', 'list', 'error'),
             ('try_catch', 'finally_block', 'list', 'error'),
             ('try_catch', 'try_block', 'list', NULL)$$,
    'block_containers: catch, finally and on_failure bind the error; try, saga and the '
    'definition''s blocks bind nothing'
);
SELECT results_eq(
    $$SELECT d.field, d.value FROM orch8.block_defaults() AS d ORDER BY d.field$$,
    $$VALUES ('concurrency', '1'::jsonb), ('index_var', '"index"'), ('item_var', '"item"'),
             ('max_iterations', '1000'), ('on_branch_failure', '"fail"'),
             ('semantics', '"first_to_resolve"')$$,
    'block_defaults: the six optional fields and their values'
);
SELECT results_eq(
    $$SELECT orch8.block_default('max_iterations'), orch8.block_default('semantics'),
             orch8.block_default('on_branch_failure'), orch8.block_default('timeout')$$,
    $$VALUES ('1000'::jsonb, '"first_to_resolve"'::jsonb, '"fail"'::jsonb, NULL::jsonb)$$,
    'block_default: one value of block_defaults; a field without a default is NULL'
);
SELECT is(
    orch8.claimable_kinds(),
    ARRAY[
        'step', 'compensation', 'loop', 'for_each', 'router', 'sub_sequence',
        'wait_for_input'
    ],
    'claimable_kinds: steps, compensations, the composites that ask a value, sub_sequence, '
    || 'wait_for_input'
);
SELECT is(
    (
        SELECT array_agg(k.kind ORDER BY k.n)
        FROM unnest(orch8.node_kinds()) WITH ORDINALITY AS k (kind, n)
        WHERE NOT k.kind = any(orch8.claimable_kinds())
    ),
    ARRAY[
        'sequence', 'parallel', 'race', 'try_catch', 'saga', 'undo', 'sleep',
        'wait_for_signal'
    ],
    'node_kinds: the kinds no runner claims (moved by SQL alone) are the lists, the waits and the '
    'composites that ask nothing'
);
SELECT results_eq(
    $$SELECT orch8.for_each_vars('{"type": "for_each"}'),
             orch8.for_each_vars('{"item_var": "line"}'),
             orch8.for_each_vars('{"item_var": "line", "index_var": "n"}')$$,
    $$VALUES (ARRAY['item', 'index'], ARRAY['line', 'index'], ARRAY['line', 'n'])$$,
    'for_each_vars: item and index by default; item_var and index_var name them'
);

-- 2. try_catch -----------------------------------------------------------------------------

SELECT tap.new('t1', 'tc');
SELECT results_eq(
    $$SELECT * FROM tap.tree('t1')$$,
    $$VALUES ('', NULL, 'sequence', 'running'), ('pay', '', 'try_catch', 'running'),
             ('pay.try', 'pay', 'sequence', 'running'),
             ('pay.try/charge', 'pay.try', 'step', 'ready')$$,
    'try_catch: the block starts its .try list and the try''s first step'
);
SELECT FROM tap.claim();
SELECT tap.begin('t1', 'pay.try/charge', 'x.pay');
SELECT results_eq(
    $$SELECT * FROM tap.finish('t1', 'pay.try/charge', 'not_applied', '{}', 'declined',
                                   NULL, 'card_declined')$$,
    $$VALUES ('running', 'pay.catch/explain',
              '{"error": {"message": "declined", "code": "card_declined",
                          "path": "pay.try/charge"}}'::jsonb)$$,
    'try_catch: a failed try starts the catch, its step handed over with the error bound'
);
SELECT results_eq(
    $$SELECT path, state FROM tap.tree('t1') WHERE path <> '' ORDER BY path$$,
    $$VALUES ('pay', 'running'), ('pay.catch', 'running'), ('pay.catch/explain', 'running'),
             ('pay.try', 'failed'), ('pay.try/charge', 'failed')$$,
    'try_catch: the try and its step failed, the block did not: it runs its catch'
);
SELECT is(
    orch8.node_error('hand', tap.id('t1'), 'pay.try'),
    '{"message": "declined", "code": "card_declined", "path": "pay.try/charge"}'::jsonb,
    'node_error of the failed try: its message, and the code and path of the step it came from'
);
SELECT results_eq(
    $$SELECT orch8.node_vars('hand', tap.id('t1'), 'pay.catch/explain'),
             (tap.node('t1', 'pay.catch')).vars::jsonb,
             (tap.node('t1', 'pay.catch/explain')).vars::jsonb$$,
    $$VALUES ('{"error": {"message": "declined", "code": "card_declined",
                          "path": "pay.try/charge"}}'::jsonb,
              '{"error": {"message": "declined", "code": "card_declined",
                          "path": "pay.try/charge"}}'::jsonb,
              '{}'::jsonb)$$,
    'node_vars: the catch list binds the error; its step sees it from there'
);
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('t1', 'pay.catch/explain', 'ok',
                                                   '"declined"')$$,
    $$VALUES ('running', 'pay.finally/audit')$$,
    'try_catch: the catch done, the finally runs'
);
SELECT is(
    (tap.node('t1', 'pay.finally')).vars::jsonb,
    '{"error": {"message": "declined", "code": "card_declined",
                "path": "pay.try/charge"}}'::jsonb,
    'try_catch: after a catch handled it, the finally still sees the try''s error'
);
SELECT results_eq(
    $$SELECT (tap.node('t1', 'pay')).state::text,
             (tap.node('t1', 'pay')).items ->> 'state',
             (tap.node('t1', 'pay')).items -> 'output'$$,
    $$VALUES ('running', 'completed', '"declined"'::jsonb)$$,
    'try_catch: while the finally runs, the block keeps the catch''s outcome'
);
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('t1', 'pay.finally/audit', 'ok',
                                                   '"audited"')$$,
    $$VALUES ('running', 'after')$$,
    'try_catch: the finally done, the block ends and the next block is handed over'
);
SELECT results_eq(
    $$SELECT (tap.node('t1', 'pay')).state::text, (tap.node('t1', 'pay')).error,
             orch8.node_output('hand', tap.id('t1'), 'pay')$$,
    $$VALUES ('completed', NULL::text, '"declined"'::jsonb)$$,
    'try_catch: the block ends as its catch did, with the catch''s output (not the finally''s)'
);
SELECT results_eq(
    $$SELECT state FROM tap.finish('t1', 'after', 'ok', '1')$$,
    $$VALUES ('completed')$$,
    'try_catch: a handled failure lets the instance complete'
);

SELECT tap.new('t2', 'tf');
SELECT FROM tap.claim();
SELECT tap.begin('t2', 'pay.try/charge', 'x.pay');
SELECT results_eq(
    $$SELECT * FROM tap.finish('t2', 'pay.try/charge', 'not_applied', '{}', 'declined',
                                   NULL, 'card_declined')$$,
    $$VALUES ('running', 'pay.finally/audit',
              '{"error": {"message": "declined", "code": "card_declined",
                          "path": "pay.try/charge"}}'::jsonb)$$,
    'try_catch without a catch: the failed try runs the finally, the error bound'
);
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('t2', 'pay.finally/audit', 'ok',
                                                   '"audited"')$$,
    $$VALUES ('failed', NULL::text)$$,
    'try_catch without a catch: after the finally the block fails, and the instance'
);
SELECT results_eq(
    $$SELECT n.path, n.state::text, n.error, n.failed_child FROM orch8.execution_nodes AS n
      WHERE n.instance_id = tap.id('t2') AND n.path IN ('', 'pay', 'pay.finally')
      ORDER BY n.path$$,
    $$VALUES ('', 'failed', 'declined', 'pay'), ('pay', 'failed', 'declined', 'pay.try'),
             ('pay.finally', 'completed', NULL, NULL)$$,
    'try_catch without a catch: the block fails with the try''s error, naming the try'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.retry_instance('hand', tap.id('t2'), 'tap')$$,
    'O8004', NULL, 'retry_instance: a failure a try_catch handled is O8004'
);
SELECT throws_like(
    $$SELECT * FROM orch8.retry_instance('hand', tap.id('t2'), 'tap')$$,
    '%the failure of pay.try was handled by try_catch pay (declined)%',
    'retry_instance: the refusal names the failure and the try_catch that handled it'
);
SELECT results_eq(
    $$SELECT tap.state('t2'), (tap.node('t2', 'pay.try/charge')).state::text$$,
    $$VALUES ('failed', 'failed')$$,
    'retry_instance refused: nothing moved'
);

-- 3. saga ----------------------------------------------------------------------------------

SELECT tap.new('g1', 'saga');
SELECT FROM tap.claim();
SELECT tap.begin('g1', 'trip/hotel', 'x.book');
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('g1', 'trip/hotel', 'ok', '{"h": 1}')$$,
    $$VALUES ('running', 'trip/note')$$,
    'saga: its blocks run in order'
);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:01+00', true);
SELECT tap.finish('g1', 'trip/note', 'ok', '1');
SELECT tap.begin('g1', 'trip/flight', 'x.book');
SELECT tap.finish('g1', 'trip/flight', 'ok', '{"f": 1}');
SELECT tap.begin('g1', 'trip/car', 'x.book');
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('g1', 'trip/car', 'not_applied', '{}',
                                                   'sold out')$$,
    $$VALUES ('running', 'trip.undo/flight')$$,
    'saga: a failed block starts the compensations, the last completed first (flight)'
);
SELECT results_eq(
    $$SELECT path, parent_path, kind, state FROM tap.tree('g1')
      WHERE path LIKE 'trip.%'$$,
    $$VALUES ('trip.undo', 'trip', 'undo', 'running'),
             ('trip.undo/flight', 'trip.undo', 'compensation', 'running')$$,
    'start_undo: an undo list under the saga, one compensation node at a time'
);
SELECT results_eq(
    $$SELECT (tap.node('g1', 'trip')).state::text, (tap.node('g1', 'trip')).items,
             (tap.node('g1', 'trip.undo')).items$$,
    $$VALUES ('running', '{"failed": "trip/car", "error": "sold out"}'::jsonb,
              '[{"block_id": "flight", "path": "trip/flight"},
                {"block_id": "hotel", "path": "trip/hotel"}]'::jsonb)$$,
    'start_undo: the saga keeps what failed; the steps to undo are those that declare a '
    'compensation, in reverse order of completion'
);
SELECT is(
    orch8.instance_step('hand', tap.id('g1'), 'trip.undo/flight'),
    '{"id": "flight", "type": "step", "handler": "x.cancel", "params": {"what": "flight"}}'
    ::jsonb,
    'instance_step: a compensation node runs the step''s compensation'
);
SELECT is(
    tap.begin('g1', 'trip.undo/flight', 'x.cancel'), 'dispatched',
    'saga: the compensation dispatches with its own receipt'
);
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('g1', 'trip.undo/flight', 'ok',
                                                   '{"c": "f"}')$$,
    $$VALUES ('running', 'trip.undo/hotel')$$,
    'saga: a compensation done starts the next one'
);
SELECT results_eq(
    $$SELECT r.block_id::text, r.state::text, r.evidence::jsonb FROM orch8.effect_receipts AS r
      WHERE r.instance_id = tap.id('g1') AND r.block_id IN ('trip/flight', 'trip/hotel')
      ORDER BY r.block_id$$,
    $$SELECT * FROM (VALUES
        ('trip/flight', 'compensated', jsonb_build_object(
            'compensated_by', 'trip.undo/flight',
            'compensating_effect_id', (tap.receipt('g1', 'trip.undo/flight')).id)),
        ('trip/hotel', 'committed', '{}'::jsonb)) AS v (b, s, e)$$,
    'compensate_receipts: the compensated step''s receipt is compensated, the evidence names '
    'the compensating node and its effect id; the other is untouched yet'
);
SELECT results_eq(
    $$SELECT e.from_state::text, e.actor, e.note FROM orch8.effect_receipt_events AS e
      WHERE e.receipt_id = (tap.receipt('g1', 'trip/flight')).id
        AND e.to_state = 'compensated'$$,
    $$VALUES ('committed', 'saga', 'compensated by trip.undo/flight')$$,
    'compensate_receipts: the move from committed is recorded, by the saga, naming the node'
);
SELECT tap.begin('g1', 'trip.undo/hotel', 'x.cancel');
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('g1', 'trip.undo/hotel', 'ok',
                                                   '{"c": "h"}')$$,
    $$VALUES ('failed', NULL::text)$$,
    'saga: the last compensation done, the saga and the instance fail'
);
SELECT results_eq(
    $$SELECT r.block_id::text, r.state::text, r.evidence ->> 'compensated_by'
      FROM orch8.effect_receipts AS r
      WHERE r.instance_id = tap.id('g1') ORDER BY r.block_id$$,
    $$VALUES ('trip.undo/flight', 'committed', NULL::text),
             ('trip.undo/hotel', 'committed', NULL),
             ('trip/car', 'abandoned', NULL),
             ('trip/flight', 'compensated', 'trip.undo/flight'),
             ('trip/hotel', 'compensated', 'trip.undo/hotel')$$,
    'saga: both booked steps compensated, each by its own node; the failed step''s receipt '
    'and the compensations'' own stay as they were'
);
SELECT results_eq(
    $$SELECT n.path, n.state::text, n.error, n.failed_child FROM orch8.execution_nodes AS n
      WHERE n.instance_id = tap.id('g1') AND n.path IN ('trip', 'trip.undo')
      ORDER BY n.path$$,
    $$VALUES ('trip', 'failed', 'saga trip compensated 2 step(s) after trip/car failed: sold out',
              'trip.undo'),
             ('trip.undo', 'completed', NULL, NULL)$$,
    'saga: the undo list completed; the saga failed, saying what it compensated after what'
);
SELECT ok(
    (
        SELECT t.error FROM orch8.task_instances AS t
        WHERE t.id = tap.id('g1')
    ) LIKE 'saga trip compensated %',
    'saga: the instance''s error starts with saga trip compensated'
);
SELECT throws_like(
    $$SELECT * FROM orch8.retry_instance('hand', tap.id('g1'), 'tap')$$,
    '%was handled by saga trip%',
    'retry_instance: a failure a saga compensated is refused'
);

SELECT tap.new('g2', 'bare');
SELECT FROM tap.claim();
SELECT tap.begin('g2', 'trip/hotel', 'x.book');
SELECT tap.finish('g2', 'trip/hotel', 'ok', '{"h": 1}');
SELECT tap.begin('g2', 'trip/car', 'x.book');
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('g2', 'trip/car', 'not_applied', '{}',
                                                   'sold out')$$,
    $$VALUES ('failed', NULL::text)$$,
    'saga without compensations: a failed block fails it at once'
);
SELECT results_eq(
    $$SELECT (tap.node('g2', 'trip')).error, (tap.node('g2', 'trip')).failed_child,
             (tap.node('g2', 'trip.undo')).path,
             (tap.receipt('g2', 'trip/hotel')).state::text$$,
    $$VALUES ('sold out (saga trip had nothing to compensate)', 'trip/car', NULL::text,
              'committed')$$,
    'saga without compensations: no undo list, the error says so, the receipt stays committed'
);

-- 4. race ----------------------------------------------------------------------------------

SELECT tap.new('q1', 'resolve');
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$,
    $$VALUES ('q1:quote#0/slow'), ('q1:quote#1/fast'), ('q1:quote#2/late')$$,
    'q1: the three branches are claimed'
);
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('q1', 'quote#0/slow', 'error', '{}',
                                                   'busy', '1 minute')$$,
    $$VALUES ('running', NULL::text)$$,
    'race: a branch retrying later leaves its node ready, without a lease'
);
SELECT tap.begin('q1', 'quote#1/fast', 'x.quote');
SELECT results_eq(
    $$SELECT state FROM tap.finish('q1', 'quote#1/fast', 'not_applied', '{}', 'no quote')$$,
    $$VALUES ('failed')$$,
    'race first_to_resolve (the default): the first branch to fail decides, the race fails'
);
SELECT results_eq(
    $$SELECT n.state::text, n.items, n.error, n.failed_child
      FROM tap.node('q1', 'quote') AS n$$,
    $$VALUES ('failed', '{"winner": "quote#1"}'::jsonb, 'no quote', 'quote#1')$$,
    'race: the block records its deciding branch and fails with its error'
);
SELECT results_eq(
    $$SELECT n.path, n.state::text, n.state_before_cancel::text, n.cancel_requested,
             n.cancel_reason, n.lease_token IS NOT NULL
      FROM orch8.execution_nodes AS n
      WHERE n.instance_id = tap.id('q1') AND n.path IN ('quote#0', 'quote#0/slow',
                                                            'quote#2', 'quote#2/late')
      ORDER BY n.path$$,
    $$VALUES ('quote#0', 'cancelled', 'running', false, 'lost the race to quote#1', false),
             ('quote#0/slow', 'cancelled', 'ready', false, 'lost the race to quote#1', false),
             ('quote#2', 'cancelled', 'running', false, 'lost the race to quote#1', false),
             ('quote#2/late', 'running', NULL, true, 'lost the race to quote#1', true)$$,
    'cancel_subtree: the losers'' unleased nodes end cancelled, keeping the state they had; '
    'the leased one is asked to stop'
);
SELECT is(
    (
        SELECT b.outcome FROM orch8.begin_step(
            'hand', tap.id('q1'), tap.tok('q1', 'quote#2/late'), 'quote#2/late',
            'x.quote', '{}', 0
        ) AS b
    ),
    'stopped',
    'stop_node: the loser asked to stop answers begin_step with stopped'
);
SELECT results_eq(
    $$SELECT n.state::text, n.lease_token, tap.receipt('q1', 'quote#2/late') IS NULL,
             tap.state('q1')
      FROM tap.node('q1', 'quote#2/late') AS n$$,
    $$VALUES ('cancelled', NULL::uuid, true, 'failed')$$,
    'stop_node: the loser ends cancelled without a lease or a receipt; the instance stays failed'
);

SELECT tap.new('q2', 'succeed');
SELECT FROM tap.claim();
SELECT tap.begin('q2', 'quote#0/primary', 'x.quote');
SELECT results_eq(
    $$SELECT state FROM tap.finish('q2', 'quote#0/primary', 'not_applied', '{}', 'down')$$,
    $$VALUES ('running')$$,
    'race first_to_succeed: a failed branch does not decide'
);
SELECT results_eq(
    $$SELECT path, state FROM tap.tree('q2') WHERE path LIKE 'quote%'$$,
    $$VALUES ('quote', 'running'), ('quote#0', 'failed'), ('quote#0/primary', 'failed'),
             ('quote#1', 'running'), ('quote#1/backup', 'running')$$,
    'race first_to_succeed: the race and the other branch go on, not cancelled'
);
SELECT tap.begin('q2', 'quote#1/backup', 'x.quote');
SELECT results_eq(
    $$SELECT state FROM tap.finish('q2', 'quote#1/backup', 'ok', '{"p": 9}')$$,
    $$VALUES ('completed')$$,
    'race first_to_succeed: the first branch to complete wins; the instance completes'
);
SELECT results_eq(
    $$SELECT (tap.node('q2', 'quote')).state::text, (tap.node('q2', 'quote')).items,
             orch8.node_output('hand', tap.id('q2'), 'quote')$$,
    $$VALUES ('completed', '{"winner": "quote#1"}'::jsonb, '{"p": 9}'::jsonb)$$,
    'race: completed with the winner''s output'
);

SELECT tap.new('q3', 'succeed');
SELECT FROM tap.claim();
SELECT tap.begin('q3', 'quote#0/primary', 'x.quote');
SELECT tap.finish('q3', 'quote#0/primary', 'not_applied', '{}', 'down');
SELECT tap.begin('q3', 'quote#1/backup', 'x.quote');
SELECT results_eq(
    $$SELECT state FROM tap.finish('q3', 'quote#1/backup', 'not_applied', '{}',
                                       'also down')$$,
    $$VALUES ('failed')$$,
    'race first_to_succeed: every branch failed fails the race'
);
SELECT is(
    (tap.node('q3', 'quote')).error,
    'every branch failed: quote#0: down; quote#1: also down',
    'race first_to_succeed: the error lists every branch''s'
);

-- 5. Cancel, on_cancel, on_failure ---------------------------------------------------------

SELECT tap.new('m1', 'mom');
SELECT FROM tap.claim();
SELECT results_eq(
    $$SELECT r.state::text
      FROM orch8.run_child('hand', tap.id('m1'), tap.tok('m1', 'sub'), 'sub',
                           tap.id('kid'), '{}') AS r$$,
    $$VALUES ('waiting')$$,
    'm1: the sub_sequence started its child and waits'
);
INSERT INTO tap.names (name, id)
SELECT
    'k1' AS name,
    (tap.node('m1', 'sub')).child_instance_id AS id;
SELECT is(
    orch8.cancel_instance('hand', tap.id('m1'), 'tap', 'no longer needed'), 'requested',
    'cancel_instance: requested, since the on_cancel blocks have to run first'
);
SELECT results_eq(
    $$SELECT tap.state('k1'), (tap.node('k1', 'work')).state::text,
             (SELECT a.actor || ': ' || a.reason FROM orch8.instance_transitions AS a
              WHERE a.instance_id = tap.id('k1') AND a.to_state = 'cancelled')$$,
    $$SELECT 'cancelled', 'cancelled',
             format('parent: parent %s: no longer needed', tap.id('m1'))$$,
    'cancel_subtree: the waiting sub_sequence''s child is cancelled, naming its parent'
);
SELECT results_eq(
    $$SELECT n.path, n.state::text, n.cancel_reason FROM orch8.execution_nodes AS n
      WHERE n.instance_id = tap.id('m1') ORDER BY n.path$$,
    $$VALUES ('', 'cancelled', 'no longer needed'), ('.on_cancel', 'running', NULL),
             ('.on_cancel/tidy', 'ready', NULL), ('sub', 'cancelled', 'no longer needed')$$,
    'instance_end: the cancelled root starts the on_cancel blocks'
);
SELECT results_eq(
    $$SELECT t.state::text, t.requested_state::text FROM orch8.task_instances AS t
      WHERE t.id = tap.id('m1')$$,
    $$VALUES ('scheduled', 'cancelled')$$,
    'sync_instance: while on_cancel has to run, the instance is not cancelled yet'
);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('m1:.on_cancel/tidy')$$,
    'the on_cancel step is claimed'
);
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('m1', '.on_cancel/tidy', 'ok', '"tidied"')$$,
    $$VALUES ('cancelled', NULL::text)$$,
    'sync_instance: on_cancel done, the instance is cancelled'
);

SELECT tap.new('f1', 'pager');
SELECT FROM tap.claim();
SELECT tap.begin('f1', 'charge', 'x.pay');
SELECT results_eq(
    $$SELECT * FROM tap.finish('f1', 'charge', 'not_applied', '{}', 'card declined', NULL,
                                   'card_declined')$$,
    $$VALUES ('running', '.on_failure[0]/page',
              '{"error": {"message": "card declined", "code": "card_declined",
                          "path": "charge"}}'::jsonb)$$,
    'instance_end: a failed root starts on_failure (.on_failure[0]) before the instance fails'
);
SELECT results_eq(
    $$SELECT orch8.node_vars('hand', tap.id('f1'), '.on_failure[0]/page'),
             (tap.node('f1', '')).state::text, tap.state('f1')$$,
    $$VALUES ('{"error": {"message": "card declined", "code": "card_declined",
                          "path": "charge"}}'::jsonb, 'failed', 'running')$$,
    'node_vars: on_failure''s step sees {{ error }}; the root failed, the instance runs on'
);
SELECT results_eq(
    $$SELECT state FROM tap.finish('f1', '.on_failure[0]/page', 'ok',
                                       '"paging: card declined"')$$,
    $$VALUES ('failed')$$,
    'sync_instance: on_failure done, the instance fails'
);
SELECT results_eq(
    $$SELECT t.error, (tap.node('f1', '.on_failure[0]')).state::text,
             (tap.node('f1', '.on_failure[0]')).output
      FROM orch8.task_instances AS t WHERE t.id = tap.id('f1')$$,
    $$VALUES ('card declined', 'completed', '"paging: card declined"'::jsonb)$$,
    'on_failure: completed with its output; the instance''s error is the failure''s'
);

-- 6. sync_instance and a pause -------------------------------------------------------------

SELECT tap.new('y1', 'par');
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$,
    $$VALUES ('y1:fan#0/ship'), ('y1:fan#1/bill')$$,
    'y1: both branches are claimed'
);
SELECT results_eq(
    $$SELECT state FROM tap.finish('y1', 'fan#1/bill', 'error', '{}', 'busy', '10 seconds')$$,
    $$VALUES ('running')$$,
    'sync_instance: a leased node keeps the instance running'
);
SELECT results_eq(
    $$SELECT state FROM tap.finish('y1', 'fan#0/ship', 'error', '{}', 'busy', '30 seconds')$$,
    $$VALUES ('scheduled')$$,
    'sync_instance: only ready nodes left: scheduled'
);
SELECT results_eq(
    $$SELECT t.next_fire_at, orch8.sync_instance('hand', t.id, 'tap')::text
      FROM orch8.task_instances AS t WHERE t.id = tap.id('y1')$$,
    $$VALUES ('2030-01-01 00:00:11+00'::timestamptz, 'scheduled')$$,
    'sync_instance: next_fire_at is the earliest ready node''s; called again it answers the same'
);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:11+00', true);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('y1:fan#1/bill')$$,
    'y1: at 00:00:11 only bill is due'
);
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('y1', 'fan#1/bill', 'ok', '"billed"')$$,
    $$VALUES ('running', 'fan#1/mail')$$,
    'y1: bill done, mail is handed over'
);
SELECT results_eq(
    $$SELECT state FROM tap.finish('y1', 'fan#1/mail', 'ok', '"mailed"')$$,
    $$VALUES ('scheduled')$$,
    'y1: the branch done, only ship is left, ready: scheduled'
);
SELECT is(
    (
        SELECT t.next_fire_at FROM orch8.task_instances AS t
        WHERE t.id = tap.id('y1')
    ),
    '2030-01-01 00:00:31+00'::timestamptz,
    'sync_instance: next_fire_at follows, that of the one ready node left'
);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:31+00', true);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('y1:fan#0/ship')$$, 'y1: ship is due'
);
SELECT tap.begin('y1', 'fan#0/ship', 'x.ship');
SELECT results_eq(
    $$SELECT state FROM tap.finish('y1', 'fan#0/ship', 'error', '{}', 'provider timeout')$$,
    $$VALUES ('failed')$$,
    'sync_instance: an ambiguous outcome blocks the node; a blocked node alone fails the '
    'instance'
);
SELECT results_eq(
    $$SELECT (tap.node('y1', 'fan#0/ship')).state::text,
             (tap.node('y1', 'fan')).state::text,
             t.error, orch8.sync_instance('hand', t.id, 'tap')::text
      FROM orch8.task_instances AS t WHERE t.id = tap.id('y1')$$,
    $$VALUES ('blocked', 'running', 'provider timeout', 'failed')$$,
    'sync_instance: failed with the blocked node''s error, while its parallel still runs'
);

SELECT tap.new('z1', 'two');
SELECT FROM tap.claim();
SELECT is(
    orch8.pause_instance('hand', tap.id('z1'), 'alice', 'fraud check'), 'requested',
    'pause_instance while a node is leased: requested'
);
SELECT results_eq(
    $$SELECT t.state::text, t.requested_state::text FROM orch8.task_instances AS t
      WHERE t.id = tap.id('z1')$$,
    $$VALUES ('running', 'paused')$$,
    'pause_instance: the instance runs on, the pause asked for'
);
SELECT results_eq(
    $$SELECT t.requested_by, t.requested_reason FROM orch8.task_instances AS t
      WHERE t.id = tap.id('z1')$$,
    $$VALUES ('alice', 'fraud check')$$,
    'the pending pause keeps who asked and why'
);
SELECT results_eq(
    $$SELECT * FROM tap.finish('z1', 'a', 'ok', '1')$$,
    $$VALUES ('paused', NULL::text, NULL::jsonb)$$,
    'hand_over: a pause asked for hands no next node over; the step done, the instance pauses'
);
SELECT results_eq(
    $$SELECT (tap.node('z1', 'b')).state::text, (tap.node('z1', 'b')).lease_token,
             (SELECT a.actor || ': ' || a.reason FROM orch8.instance_transitions AS a
              WHERE a.instance_id = tap.id('z1') AND a.to_state = 'paused')$$,
    $$VALUES ('ready', NULL::uuid, 'alice: fraud check')$$,
    'pause: the next step waits ready and unleased; the pause is the move of the operator '
    || 'who asked, with their reason'
);
SELECT results_eq(
    $$SELECT action, actor, reason, outcome FROM orch8.instance_requests
      WHERE instance_id = tap.id('z1') ORDER BY seq$$,
    $$VALUES ('pause', 'alice', 'fraud check', 'requested')$$,
    'the request itself is on record, with what it answered'
);
SELECT results_eq(
    $$SELECT t.requested_state::text, t.requested_by, t.requested_reason
      FROM orch8.task_instances AS t WHERE t.id = tap.id('z1')$$,
    $$VALUES (NULL::text, NULL::text, NULL::text)$$,
    'applied: the request and its actor and reason are cleared'
);
SELECT is(
    (SELECT count(*)::integer FROM tap.claim()), 0,
    'pause: a paused instance''s ready node is not claimed'
);
SELECT is(
    orch8.resume_instance('hand', tap.id('z1'), 'tap'), 'scheduled',
    'resume_instance: scheduled, as its tree says'
);
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('z1:b')$$, 'z1: b is claimed');
SELECT results_eq(
    $$SELECT state FROM tap.finish('z1', 'b', 'ok', '2')$$, $$VALUES ('completed')$$,
    'z1: completes'
);

-- 7. reopen_failure through retry_instance ---------------------------------------------------

SELECT tap.new('o1', 'par');
SELECT FROM tap.claim();
SELECT tap.finish('o1', 'fan#1/bill', 'error', '{}', 'busy', '10 seconds');
SELECT tap.begin('o1', 'fan#0/ship', 'x.ship');
SELECT results_eq(
    $$SELECT state FROM tap.finish('o1', 'fan#0/ship', 'not_applied', '{}', 'no stock')$$,
    $$VALUES ('failed')$$,
    'o1: ship is not applied: the branch, the parallel and the instance fail'
);
SELECT results_eq(
    $$SELECT n.path, n.state::text, n.state_before_cancel::text, n.cancel_reason
      FROM orch8.execution_nodes AS n
      WHERE n.instance_id = tap.id('o1') AND n.path LIKE 'fan#1%' ORDER BY n.path$$,
    $$VALUES ('fan#1', 'cancelled', 'running', 'branch fan#0 failed'),
             ('fan#1/bill', 'cancelled', 'ready', 'branch fan#0 failed')$$,
    'o1: the sibling branch was cancelled, keeping the state it had'
);
SELECT results_eq(
    $$SELECT r.outcome, r.block_id, r.effect_id = (tap.receipt('o1', 'fan#0/ship')).id
      FROM orch8.retry_instance('hand', tap.id('o1'), 'tap') AS r$$,
    $$VALUES ('rerun', 'fan#0/ship', true)$$,
    'retry_instance: the step whose receipt was abandoned runs again'
);
SELECT results_eq(
    $$SELECT n.path, n.state::text, n.error, n.failed_child, n.cancel_reason,
             n.state_before_cancel::text
      FROM orch8.execution_nodes AS n WHERE n.instance_id = tap.id('o1') ORDER BY n.path$$,
    $$VALUES ('', 'running', NULL::text, NULL::text, NULL::text, NULL::text),
             ('fan', 'running', NULL, NULL, NULL, NULL),
             ('fan#0', 'running', NULL, NULL, NULL, NULL),
             ('fan#0/ship', 'ready', NULL, NULL, NULL, NULL),
             ('fan#1', 'running', NULL, NULL, NULL, NULL),
             ('fan#1/bill', 'ready', NULL, NULL, NULL, NULL)$$,
    'reopen_failure: the failed step and the ancestors it failed run again; the cancelled '
    'branch is back in the state it had'
);
SELECT results_eq(
    $$SELECT orch8.compute_attempt('hand', tap.id('o1'), 'fan#0/ship'), tap.state('o1')$$,
    $$VALUES (1, 'scheduled')$$,
    'reopen_failure: the step runs as attempt 1; the instance is scheduled'
);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$,
    $$VALUES ('o1:fan#0/ship'), ('o1:fan#1/bill')$$,
    'o1: the retried step and the sibling are claimed again'
);
SELECT is(tap.begin('o1', 'fan#0/ship', 'x.ship'), 'dispatched', 'o1: ship dispatches again');
SELECT results_eq(
    $$SELECT r.attempt::integer, r.state::text FROM orch8.effect_receipts AS r
      WHERE r.instance_id = tap.id('o1') ORDER BY r.attempt$$,
    $$VALUES (0, 'abandoned'), (1, 'dispatched')$$,
    'reopen_failure: a new receipt for attempt 1; attempt 0''s stays abandoned'
);
SELECT tap.finish('o1', 'fan#0/ship', 'ok', '"shipped"');
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('o1', 'fan#1/bill', 'ok', '"billed"')$$,
    $$VALUES ('running', 'fan#1/mail')$$,
    'reopen_failure: the sibling branch goes on from where it stopped'
);
SELECT results_eq(
    $$SELECT state FROM tap.finish('o1', 'fan#1/mail', 'ok', '"mailed"')$$,
    $$VALUES ('completed')$$,
    'o1: the retried instance completes'
);
SELECT is(
    orch8.node_output('hand', tap.id('o1'), 'fan'), '["shipped", "mailed"]'::jsonb,
    'o1: the parallel''s output has both branches'', the retried step''s new one'
);

-- 7b. Retries after a sibling stopped or finished late, and a finally inside on_failure ---

-- o2: the sibling's step is stopped by begin_step (it never began its work)
SELECT tap.new('o2', 'par2');
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('o2:fan#0/ship'), ('o2:fan#1/bill')$$,
    'o2: both branches'' steps are claimed'
);
SELECT tap.begin('o2', 'fan#0/ship', 'x.ship');
SELECT tap.finish('o2', 'fan#0/ship', 'not_applied', '{}', 'no stock');
SELECT is(
    tap.begin('o2', 'fan#1/bill', 'x.bill'), 'stopped',
    'o2: the leased sibling, asked to stop, does not begin'
);
SELECT results_eq(
    $$SELECT tap.state('o2'), (tap.node('o2', 'fan#1/bill')).state::text$$,
    $$VALUES ('failed', 'cancelled')$$,
    'o2: the instance fails once the sibling stopped'
);
SELECT results_eq(
    $$SELECT r.outcome, r.block_id
      FROM orch8.retry_instance('hand', tap.id('o2'), 'tap') AS r$$,
    $$VALUES ('rerun', 'fan#0/ship')$$,
    'o2: retry reruns the failed step'
);
SELECT results_eq(
    $$SELECT (tap.node('o2', 'fan#1')).state::text,
             (tap.node('o2', 'fan#1/bill')).state::text$$,
    $$VALUES ('running', 'ready')$$,
    'reopen_failure: a step stopped before its work began is ready again'
);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('o2:fan#0/ship'), ('o2:fan#1/bill')$$,
    'o2: both are claimed again'
);
SELECT tap.begin('o2', 'fan#0/ship', 'x.ship');
SELECT tap.finish('o2', 'fan#0/ship', 'ok', '"shipped"');
SELECT is(tap.begin('o2', 'fan#1/bill', 'x.bill'), 'dispatched', 'o2: bill dispatches');
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('o2', 'fan#1/bill', 'ok', '"billed"')$$,
    $$VALUES ('running', 'fan#1/mail')$$,
    'o2: the sibling branch goes on'
);
SELECT results_eq(
    $$SELECT state FROM tap.finish('o2', 'fan#1/mail', 'ok', '"mailed"')$$,
    $$VALUES ('completed')$$,
    'o2: the retried instance completes'
);

-- o3: the sibling's step was dispatched and finished after its branch was cancelled
SELECT tap.new('o3', 'par2');
SELECT FROM tap.claim();
SELECT tap.begin('o3', 'fan#0/ship', 'x.ship');
SELECT tap.begin('o3', 'fan#1/bill', 'x.bill');
SELECT tap.finish('o3', 'fan#0/ship', 'not_applied', '{}', 'no stock');
SELECT results_eq(
    $$SELECT state FROM tap.finish('o3', 'fan#1/bill', 'ok', '"billed"')$$,
    $$VALUES ('failed')$$,
    'o3: the late result of the sibling is recorded; the instance fails'
);
SELECT results_eq(
    $$SELECT (tap.node('o3', 'fan#1')).state::text,
             (tap.node('o3', 'fan#1/bill')).state::text,
             (tap.receipt('o3', 'fan#1/bill')).state::text$$,
    $$VALUES ('cancelled', 'completed', 'committed')$$,
    'o3: bill completed (its receipt committed) inside a cancelled branch'
);
SELECT results_eq(
    $$SELECT r.outcome, r.block_id
      FROM orch8.retry_instance('hand', tap.id('o3'), 'tap') AS r$$,
    $$VALUES ('rerun', 'fan#0/ship')$$,
    'o3: retry reruns the failed step'
);
SELECT results_eq(
    $$SELECT n.path, n.state::text FROM orch8.execution_nodes AS n
      WHERE n.instance_id = tap.id('o3') AND n.path LIKE 'fan#1%' ORDER BY n.path$$,
    $$VALUES ('fan#1', 'running'), ('fan#1/bill', 'completed'), ('fan#1/mail', 'ready')$$,
    'reopen_failure: the branch takes the late end of its step and moves on to mail'
);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('o3:fan#0/ship'), ('o3:fan#1/mail')$$,
    'o3: the retried step and the next step of the branch are claimed; bill is not'
);
SELECT tap.begin('o3', 'fan#0/ship', 'x.ship');
SELECT tap.finish('o3', 'fan#0/ship', 'ok', '"shipped"');
SELECT results_eq(
    $$SELECT state FROM tap.finish('o3', 'fan#1/mail', 'ok', '"mailed"')$$,
    $$VALUES ('completed')$$,
    'o3: the instance completes'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.effect_receipts AS r
        WHERE r.instance_id = tap.id('o3') AND r.block_id = 'fan#1/bill'
    ),
    1, 'o3: bill was never begun again'
);

-- n1: a finally inside on_failure, after its try succeeded, sees the on_failure's error
SELECT tap.new('n1', 'nested');
SELECT FROM tap.claim();
SELECT tap.begin('n1', 'charge', 'x.pay');
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('n1', 'charge', 'not_applied', '{}',
                                                   'declined')$$,
    $$VALUES ('running', '.on_failure[0]/notify.try/page')$$,
    'n1: the failure starts on_failure, its try_catch''s first step handed over'
);
SELECT results_eq(
    $$SELECT state, next_block FROM tap.finish('n1', '.on_failure[0]/notify.try/page',
                                                   'ok', '"paged"')$$,
    $$VALUES ('running', '.on_failure[0]/notify.finally/log')$$,
    'n1: the try succeeded; the finally runs'
);
SELECT is(
    orch8.node_vars('hand', tap.id('n1'), '.on_failure[0]/notify.finally/log') -> 'error'
    ->> 'message',
    'declined',
    'try_catch: a finally after a try that succeeded sees the error bound around the block'
);

-- 8. The guard trigger ---------------------------------------------------------------------

SELECT throws_ok(
    $$UPDATE orch8.execution_nodes SET state = 'ready'
      WHERE instance_id = tap.id('o1') AND path = 'fan#0/ship'$$,
    'O8004', NULL, 'execution_nodes_guard: completed -> ready is O8004'
);
SELECT throws_like(
    $$UPDATE orch8.execution_nodes SET state = 'ready'
      WHERE instance_id = tap.id('o1') AND path = 'fan#0/ship'$$,
    '%cannot move from completed to ready',
    'execution_nodes_guard: the error names the move'
);
SELECT throws_ok(
    $$DELETE FROM orch8.execution_nodes
      WHERE instance_id = tap.id('g1') AND path = 'trip.undo/flight'$$,
    'O8004', NULL, 'execution_nodes_guard: a node is never deleted (O8004)'
);
SELECT throws_ok(
    $$INSERT INTO orch8.execution_nodes (tenant_id, instance_id, path, parent_path, kind, state)
      VALUES ('hand', tap.id('o1'), 'x', '', 'delay', 'ready')$$,
    '23514', NULL, 'execution_nodes: a kind outside node_kinds() is refused'
);
SELECT is(
    (SELECT count(*)::integer FROM tap.claim()), 0,
    'every instance ran to its end: nothing is left to claim'
);

SELECT * FROM finish();
ROLLBACK;
