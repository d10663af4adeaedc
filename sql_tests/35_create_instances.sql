-- Starting instances in bulk (create_instances in sql/functions/instances.sql): one row
-- per item in order; keys repeated in the batch or from before answer the first
-- instance; the trees are built set-based exactly as create_instance builds one; a bad
-- item or an oversized batch refuses the whole call and writes nothing.
BEGIN;
SELECT plan(15);

SELECT orch8.create_sequence(
    'bulk', 'default', 'flow',
    '{"blocks": [{"id": "a", "type": "step", "handler": "noop", "delay": "10s"},
                 {"id": "b", "type": "step", "handler": "noop"}]}'
);
SELECT set_config('tap.seq', (
    SELECT s.id::text FROM orch8.sequences AS s
    WHERE s.tenant_id = 'bulk' AND s.name = 'flow'
), true);

CREATE TEMP TABLE made AS
SELECT * FROM orch8.create_instances(
    'bulk', current_setting('tap.seq')::uuid,
    '[{"data": {"n": 1}, "idempotency_key": "k"}, {"idempotency_key": "k"},
      {"data": {"n": 3}, "priority": 4}]'
);

SELECT results_eq(
    'SELECT ord, state::text, deduplicated FROM made ORDER BY ord',
    $$VALUES (0, 'scheduled', false), (1, 'scheduled', true), (2, 'scheduled', false)$$,
    'one row per item, in order; the repeated key is deduplicated'
);
SELECT is(
    (
        SELECT id FROM made
        WHERE ord = 1), (
        SELECT id FROM made
        WHERE ord = 0
    ),
    'a key repeated in the batch answers the instance its first use started'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.task_instances
        WHERE tenant_id = 'bulk'
    ), 2,
    'two instances started'
);
SELECT results_eq(
    $$SELECT n.path, n.kind::text, n.state::text, n.position, n.priority
      FROM orch8.execution_nodes AS n JOIN made AS m ON m.id = n.instance_id AND m.ord = 2
      ORDER BY n.path$$,
    $$VALUES ('', 'sequence', 'running', 1, 4), ('a', 'step', 'ready', 0, 4)$$,
    'each tree: the root list past its first block and the first step ready'
);
SELECT ok((
    SELECT t.next_fire_at = n.next_fire_at AND n.next_fire_at > t.created_at
    FROM orch8.task_instances AS t
    INNER JOIN orch8.execution_nodes AS n ON t.id = n.instance_id AND n.path = 'a'
    INNER JOIN made AS m ON t.id = m.id AND m.ord = 0
),
'a first step''s delay makes the instance due when its node is');
SELECT is((
    SELECT t.current_block FROM orch8.task_instances AS t
    INNER JOIN made AS m ON t.id = m.id AND m.ord = 2
), 'a', 'current_block is the first step');
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.instance_transitions
        WHERE tenant_id = 'bulk'
    ),
    2, 'one create transition per instance started'
);
SELECT is((
    SELECT (t.context -> 'data')::text FROM orch8.task_instances AS t INNER JOIN made AS m
        ON t.id = m.id AND m.ord = 2
), '{"n": 3}', 'each item keeps its own data');

SELECT throws_ok(
    $$SELECT * FROM orch8.create_instances('bulk', current_setting('tap.seq')::uuid,
        '[{"data": {"n": 4}}, {"data": {"n": 5}, "colour": "red"}]')$$,
    'O8008', 'instance 1: unknown field(s): colour', 'an unknown field refuses the batch'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.create_instances('bulk', current_setting('tap.seq')::uuid,
        '[{}, {"priority": "high"}]')$$,
    'O8008', 'instance 1: priority must be a 32-bit integer', 'so does a bad priority'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.task_instances
        WHERE tenant_id = 'bulk'
    ), 2,
    'a refused batch writes nothing'
);
SELECT throws_ok(
    format(
        $$SELECT * FROM orch8.create_instances('bulk', %L::uuid,
        (SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, %s)))$$,
        current_setting('tap.seq'), orch8.limit_of('create_batch') + 1
    ),
    'O8008', NULL, 'a batch over the limit create_batch is refused in SQL'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.create_instances('bulk', current_setting('tap.seq')::uuid, '{}')$$,
    'O8008', 'items must be a JSON array of instances', 'items must be an array'
);
SELECT results_eq(
    $$SELECT c.id, c.deduplicated FROM orch8.create_instance('bulk',
        current_setting('tap.seq')::uuid, p_idempotency_key => 'k') AS c$$,
    $$SELECT id, true FROM made WHERE ord = 0$$,
    'create_instance is a batch of one: the key answers the same instance'
);

-- a bulk start leaves statistics that say the tables are nearly empty; the claim must not
-- plan for that (a sort of every due node, a hash of them all, a scan of the whole table)
SELECT is(
    (
        SELECT p.proconfig FROM pg_proc AS p
        WHERE p.oid = 'orch8.claim_due_nodes(text, integer, interval)'::regprocedure
    ),
    ARRAY['enable_sort=off', 'enable_hashjoin=off', 'enable_seqscan=off', 'jit=off'],
    'claim_due_nodes plans for a batch whatever the statistics say'
);

SELECT * FROM finish();
ROLLBACK;
