-- An instance's updates are heap-only (migration 0030): no index of task_instances names
-- a column that its moves change, the claim's update of an instance without an sla is
-- HOT, and sla_watch_at, which the sla sweep reads in place of state, follows the
-- instance: open, paused, resumed, past its sla, ended, and whatever a writer sets.
BEGIN;
SELECT plan(11);
SELECT set_config('orch8.fake_now', '2032-05-01 08:00:00+00', true);
SELECT set_config('tap.tenant', 'hot', true);

-- 1. No index names what a move changes -------------------------------------------------

SELECT is(
    tap.indexes_naming(
        'orch8.task_instances',
        ARRAY[
            'state', 'requested_state', 'updated_at', 'current_block', 'next_fire_at',
            'error', 'context'
        ]
    ),
    '{}'::text[],
    'no index of task_instances names a column an instance''s moves change'
);

-- 2. The claim's move is a HOT update ---------------------------------------------------

SELECT tap.seq('plain', $${"blocks": [{"type": "step", "id": "a", "handler": "noop"}]}$$);
SELECT tap.new('p1', 'plain');
CREATE TEMP TABLE hot_before AS
SELECT
    s.n_tup_upd,
    s.n_tup_hot_upd
FROM pg_stat_xact_user_tables AS s
WHERE s.relid = 'orch8.task_instances'::regclass;
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('p1:a')$$, 'p1 is claimed');
SELECT is(
    (
        SELECT (s.n_tup_upd - b.n_tup_upd, s.n_tup_hot_upd - b.n_tup_hot_upd)
        FROM pg_stat_xact_user_tables AS s CROSS JOIN hot_before AS b
        WHERE s.relid = 'orch8.task_instances'::regclass
    ),
    (1::bigint, 1::bigint),
    'its instance''s move to running is one update, heap-only'
);
SELECT is(
    (
        SELECT t.sla_watch_at FROM orch8.task_instances AS t
        WHERE t.id = tap.id('p1')
    ),
    NULL, 'an instance without an sla is not watched'
);

-- 3. sla_watch_at follows the instance --------------------------------------------------

SELECT tap.seq('timed', $${"sla": "1h", "blocks": [
    {"type": "step", "id": "later", "handler": "noop", "delay": "2h"}]}$$);
SELECT tap.new('t1', 'timed');
CREATE FUNCTION pg_temp.watch(p_name text) RETURNS timestamptz LANGUAGE sql AS $$
    SELECT t.sla_watch_at FROM orch8.task_instances AS t WHERE t.id = tap.id(p_name)
$$;
SELECT is(
    pg_temp.watch('t1'), '2032-05-01 09:00:00+00'::timestamptz,
    'created with an sla, it is watched from sla_at'
);
SELECT orch8.pause_instance('hot', tap.id('t1'), 'tap');
SELECT is(pg_temp.watch('t1'), NULL, 'paused, it is not');
SELECT orch8.resume_instance('hot', tap.id('t1'), 'tap');
SELECT is(pg_temp.watch('t1'), '2032-05-01 09:00:00+00'::timestamptz, 'resumed, it is again');
UPDATE orch8.task_instances SET sla_watch_at = '2032-05-01 08:01:00+00'
WHERE id = tap.id('t1');
SELECT is(
    pg_temp.watch('t1'), '2032-05-01 09:00:00+00'::timestamptz,
    'a writer cannot move it: the trigger sets it from sla_at'
);
UPDATE orch8.task_instances SET sla_watch_at = '2032-05-01 08:01:00+00'
WHERE id = tap.id('p1');
SELECT is(pg_temp.watch('p1'), NULL, 'nor watch an instance that has no sla');
SELECT set_config('orch8.fake_now', '2032-05-01 09:00:00+00', true);
SELECT is_empty($$SELECT * FROM tap.claim()$$, 'at sla_at the sweep fails it');
SELECT is(
    (
        SELECT (t.state::text, t.sla_breached_at, t.sla_watch_at)
        FROM orch8.task_instances AS t
        WHERE t.id = tap.id('t1')
    ),
    ('failed'::text, '2032-05-01 09:00:00+00'::timestamptz, NULL::timestamptz),
    'failed past its sla, it is watched no more'
);

SELECT * FROM finish();
ROLLBACK;
