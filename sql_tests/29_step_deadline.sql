-- A step's deadline (sql/functions/waits.sql, fire_deadlines; begin_step and finish_step
-- in steps.sql): the validator's rules; a leased step that finishes after its deadline
-- records its outcome (its receipt committed) and fails with code deadline; a ready one
-- (here waiting for its retry) fails at the deadline, in the claim; one begun after it
-- fails before any receipt. Time starts at 2031-03-01 12:00 and only moves forward.
BEGIN;
SELECT plan(16);
SELECT set_config('orch8.fake_now', '2031-03-01 12:00:00+00', true);
SELECT set_config('tap.tenant', 'deadline', true);

-- 1. The validator ------------------------------------------------------------------------

SELECT set_eq(
    $$SELECT path, message FROM orch8.validate_sequence('{"blocks": [
        {"type": "step", "id": "a", "handler": "noop", "deadline": "soon"},
        {"type": "step", "id": "b", "handler": "noop", "deadline": "1h",
         "on_deadline_breach": "retry"},
        {"type": "step", "id": "c", "handler": "noop", "on_deadline_breach": "fail"},
        {"type": "step", "id": "d", "handler": "noop", "deadline": 60000,
         "on_deadline_breach": "fail"}]}')$$,
    $$VALUES
        ('$.blocks[0].deadline', 'deadline must be a duration: milliseconds (an integer >= 0) or a string such as 30s, 15m, 2h, 3d, 1h30m; at most 366 days'),
        ('$.blocks[1].on_deadline_breach',
         'on_deadline_breach must be fail (the only one this engine runs)'),
        ('$.blocks[2].on_deadline_breach', 'on_deadline_breach needs a deadline')$$,
    'the validator refuses a deadline that is no duration and any breach but fail'
);

SELECT tap.seq('pay', $${"blocks": [
    {"type": "step", "id": "pay", "handler": "x.pay", "deadline": "30m",
     "on_deadline_breach": "fail"}]}$$);

-- 2. Finished after the deadline: recorded, and the node fails -------------------------------

SELECT tap.new('d1', 'pay');
SELECT is(
    (tap.node('d1', 'pay')).deadline_at, '2031-03-01 12:30:00+00'::timestamptz,
    'the deadline counts from when the node starts'
);
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('d1:pay')$$, 'claimed in time');
SELECT is(tap.begin('d1', 'pay', 'x.pay'), 'dispatched', 'and dispatched in time');
SELECT set_config('orch8.fake_now', '2031-03-01 12:31:00+00', true);
SELECT is(
    (SELECT f.state FROM tap.finish('d1', 'pay', 'ok', '{"paid": true}') AS f), 'failed',
    'a step that finishes after its deadline fails its instance'
);
SELECT is((tap.node('d1', 'pay')).state::text, 'failed', 'its node failed');
SELECT is(
    (tap.receipt('d1', 'pay')).state::text, 'committed',
    'the late outcome keeps its receipt, committed'
);
SELECT results_eq(
    $$SELECT o.sentinel::text, o.output FROM orch8.block_outputs AS o
      WHERE o.instance_id = tap.id('d1') AND o.block_id = 'pay'
        AND o.sentinel IS DISTINCT FROM '__in_progress__' ORDER BY o.seq$$,
    $$VALUES (NULL::text, '{"paid": true}'::jsonb),
             ('__error__', '{"code": "deadline", "error": "step pay missed its deadline of 30m"}')$$,
    'its output is recorded, then the failure with code deadline'
);

-- 3. Waiting for a retry at the deadline: failed by the claim ---------------------------------

SELECT tap.new('d2', 'pay');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('d2:pay')$$, 'd2 claimed');
SELECT is(
    (SELECT f.state FROM tap.finish('d2', 'pay', 'not_applied', '{}', 'busy', '1 hour') AS f),
    'scheduled', 'its retry is an hour away'
);
SELECT set_config('orch8.fake_now', '2031-03-01 13:01:00+00', true);
SELECT is((SELECT count(*)::integer FROM tap.claim()), 0, 'at the deadline nothing is claimed');
SELECT is(tap.state('d2'), 'failed', 'the step failed at its deadline, before its retry');
SELECT is(
    (
        SELECT o.output ->> 'code' FROM orch8.block_outputs AS o
        WHERE o.instance_id = tap.id('d2') AND o.sentinel = '__error__'
    ),
    'deadline', 'with code deadline'
);

-- 4. Begun after the deadline: no receipt ---------------------------------------------------

SELECT tap.new('d3', 'pay');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('d3:pay')$$, 'd3 claimed');
SELECT set_config('orch8.fake_now', '2031-03-01 13:32:00+00', true);
SELECT is(tap.begin('d3', 'pay', 'x.pay'), 'stopped', 'begun after its deadline: stopped');
SELECT ok(
    tap.state('d3') = 'failed' AND (tap.receipt('d3', 'pay')).id IS NULL,
    'the step failed before any receipt'
);

SELECT * FROM finish();
ROLLBACK;
