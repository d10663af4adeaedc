-- Every pause, cancel and resume an operator asks for is on record (instance_requests),
-- with who, why and what it answered; the transition that applies it names them
-- (migration 0025).
BEGIN;
SELECT plan(9);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:00+00', true);
SELECT set_config('tap.tenant', 'ops', true);

SELECT
    tap.seq(
        'two', $${"blocks": [
        {"type": "step", "id": "a", "handler": "x.pay"},
        {"type": "step", "id": "b", "handler": "x.pay"}]}$$
    );
SELECT tap.new('i1', 'two');
SELECT tap.new('i2', 'two');

-- i1 is not running: the pause applies at once
SELECT is(
    orch8.pause_instance('ops', tap.id('i1'), 'alice', 'customer asked'), 'paused',
    'a pause of an instance no step holds: paused at once'
);
SELECT is(
    orch8.pause_instance('ops', tap.id('i1'), 'bob', 'again'), 'unchanged',
    'asked again: unchanged'
);
SELECT is(
    orch8.resume_instance('ops', tap.id('i1'), 'carol', 'customer confirmed'), 'scheduled',
    'resume with a reason: scheduled'
);
SELECT results_eq(
    $$SELECT from_state::text, to_state::text, actor, reason FROM orch8.instance_transitions
      WHERE instance_id = tap.id('i1') AND from_state IS NOT NULL ORDER BY seq$$,
    $$VALUES ('scheduled', 'paused', 'alice', 'customer asked'),
             ('paused', 'scheduled', 'carol', 'customer confirmed')$$,
    'the transitions name who asked and why'
);

-- i2 runs: a pause waits for the step, a resume withdraws it
SELECT tap.claim();
SELECT is(
    orch8.pause_instance('ops', tap.id('i2'), 'dave', 'suspected fraud'), 'requested',
    'a pause of a running instance: requested'
);
SELECT is(
    orch8.resume_instance('ops', tap.id('i2'), 'erin', 'false alarm'), 'running',
    'a resume withdraws the pending pause'
);
SELECT results_eq(
    $$SELECT t.state::text, t.requested_state::text, t.requested_by, t.requested_reason
      FROM orch8.task_instances AS t WHERE t.id = tap.id('i2')$$,
    $$VALUES ('running', NULL::text, NULL::text, NULL::text)$$,
    'withdrawn: nothing pending, nobody named'
);

SELECT results_eq(
    $$SELECT n.name, r.action, r.actor, r.reason, r.outcome
      FROM orch8.instance_requests AS r JOIN tap.names AS n ON r.instance_id = n.id
      ORDER BY r.seq$$,
    $$VALUES ('i1', 'pause', 'alice', 'customer asked', 'paused'),
             ('i1', 'pause', 'bob', 'again', 'unchanged'),
             ('i1', 'resume', 'carol', 'customer confirmed', 'scheduled'),
             ('i2', 'pause', 'dave', 'suspected fraud', 'requested'),
             ('i2', 'resume', 'erin', 'false alarm', 'withdrawn')$$,
    'every request is on record with what it answered, in order'
);

SELECT throws_ok(
    $$DELETE FROM orch8.instance_requests$$,
    'O8004', NULL,
    'the requests are append-only'
);

SELECT * FROM finish();
ROLLBACK;
