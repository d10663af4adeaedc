-- The audit trail of instance moves is written once per statement (migration 0027): a
-- claim of many instances records each move, a hand-made UPDATE too, an UPDATE that moves
-- no state records nothing, and no foreign key check remains on the way.
BEGIN;
SELECT plan(7);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:00+00', true);
SELECT set_config('tap.tenant', 'audit', true);

SELECT tap.seq('one', $${"blocks": [{"type": "step", "id": "a", "handler": "x.pay"}]}$$);
SELECT tap.new('i1', 'one');
SELECT tap.new('i2', 'one');
SELECT tap.new('i3', 'one');

SELECT results_eq(
    $$SELECT count(*)::int FROM orch8.instance_transitions
      WHERE tenant_id = 'audit' AND from_state IS NULL AND to_state = 'scheduled'$$,
    ARRAY[3],
    'each creation is recorded: NULL -> scheduled'
);

SELECT is((SELECT count(*)::int FROM tap.claim(10)), 3, 'one claim takes the three');
SELECT results_eq(
    $$SELECT t.instance_id, t.actor FROM orch8.instance_transitions AS t
      WHERE t.tenant_id = 'audit' AND t.from_state = 'scheduled' AND t.to_state = 'running'
      ORDER BY 1$$,
    $$SELECT id, 'audit-runner' FROM tap.names WHERE name LIKE 'i_' ORDER BY 1$$,
    'the claim''s one UPDATE records a move per instance, with the claiming worker'
);

UPDATE orch8.task_instances SET updated_at = orch8.now()
WHERE tenant_id = 'audit';
SELECT is(
    (
        SELECT count(*)::int FROM orch8.instance_transitions
        WHERE tenant_id = 'audit'
    ), 6,
    'an UPDATE that moves no state records nothing'
);

SELECT orch8.attribute_transition('dba', 'by hand');
UPDATE orch8.task_instances SET state = 'paused'
WHERE tenant_id = 'audit' AND id IN (tap.id('i1'), tap.id('i2'));
SELECT results_eq(
    $$SELECT t.instance_id, t.actor, t.reason FROM orch8.instance_transitions AS t
      WHERE t.tenant_id = 'audit' AND t.to_state = 'paused' ORDER BY 1$$,
    $$SELECT id, 'dba', 'by hand' FROM tap.names WHERE name IN ('i1', 'i2') ORDER BY 1$$,
    'a hand-made UPDATE of two rows records both, with the actor and reason set'
);

SELECT is(
    (
        SELECT string_agg(t.tgname || ':' || ((t.tgtype & 1) = 0)::text, ' ' ORDER BY t.tgname)
        FROM pg_trigger AS t
        WHERE t.tgrelid = 'orch8.task_instances'::regclass AND t.tgname LIKE '%record%'
    ),
    'task_instances_record_creations:true task_instances_record_moves:true',
    'the two writers are statement triggers'
);
SELECT is_empty(
    $$SELECT 1 FROM pg_constraint
      WHERE conrelid = 'orch8.instance_transitions'::regclass AND contype = 'f'$$,
    'instance_transitions checks no foreign key: its one writer is the instance''s trigger'
);

SELECT * FROM finish();
ROLLBACK;
