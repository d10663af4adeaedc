-- Time, signals and people (sql/functions/waits.sql): durations, the validator's rules,
-- sleep and a step's delay (start_block, fire_timers in claim_due_nodes), signals
-- consumed exactly once (send_signal, start_wait, consume_signal), update_context,
-- wait_for_input (await_input, answer_input), timeouts with and without on_timeout,
-- the waiting_nodes view, and cancel during a wait. Time starts at 2030-01-01 00:00 and
-- only moves forward.
BEGIN;
SELECT plan(60);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:00+00', true);
SELECT set_config('tap.tenant', 'waits', true);

-- 1. Durations and the validator -------------------------------------------------------

SELECT is(orch8.duration_ms('"1h30m"'), 5400000::bigint, 'a duration of units');
SELECT is(orch8.duration_ms('250'), 250::bigint, 'milliseconds');
SELECT is(orch8.duration_ms('"2d"'), 172800000::bigint, 'days');
SELECT ok(orch8.duration_ms('"3x"') IS NULL, 'an unknown unit is no duration');
SELECT ok(orch8.duration_ms('-1') IS NULL, 'a negative number is no duration');
SELECT ok(orch8.duration_ms('1.5') IS NULL, 'a fraction of a millisecond is no duration');
SELECT ok(orch8.duration_ms('"367d"') IS NULL, 'over the limit wait_ms is no duration');

SELECT set_eq(
    $$SELECT path, message FROM orch8.validate_sequence('{"blocks": [
        {"type": "sleep", "id": "a"},
        {"type": "sleep", "id": "b", "duration": "soon"},
        {"type": "wait_for_signal", "id": "c", "signal": "pause"},
        {"type": "wait_for_signal", "id": "d", "signal": "go", "on_timeout": [
            {"type": "step", "id": "e", "handler": "noop"}]},
        {"type": "wait_for_input", "id": "f", "prompt": "", "choices": ["y", "y"]},
        {"type": "step", "id": "g", "handler": "noop", "delay": "1w"},
        {"type": "step", "id": "h", "handler": "sleep"},
        {"type": "wait_for_input", "id": "i", "prompt": "{{ nope.x }}", "choices": ["y"]}
    ]}')$$,
    $$VALUES
        ('$.blocks[0].duration', 'duration is required (ms, or a string such as 30s, 15m, 2h, 3d)'),
        ('$.blocks[1].duration', 'duration must be a duration: milliseconds (an integer >= 0) or a string such as 30s, 15m, 2h, 3d, 1h30m; at most 366 days'),
        ('$.blocks[2].signal', 'signal is required: a custom signal''s name (1 to 100 characters among A-Z a-z 0-9 _ . : -; not cancel, pause, resume, update_context, input)'),
        ('$.blocks[3].on_timeout', 'on_timeout needs a timeout'),
        ('$.blocks[4].prompt', 'prompt is required (a non-empty string)'),
        ('$.blocks[4].choices', 'choices is required: 1 to 20 distinct non-empty strings of at most 100 characters'),
        ('$.blocks[5].delay', 'delay must be a duration: milliseconds (an integer >= 0) or a string such as 30s, 15m, 2h, 3d, 1h30m; at most 366 days'),
        ('$.blocks[6].handler', 'the sleep handler held a runner thread for the whole sleep; use a sleep block: {"type": "sleep", "id": "...", "duration": "1h"} (it holds nothing)'),
        ('$.blocks[7].prompt', 'template "{{ nope.x }}" has an unknown root "nope" (roots: data, config, outputs, instance_id, runtime)')
    $$,
    'the validator refuses each malformed wait, sleep and delay, with its path'
);

-- 2. Sleep and delay: waiting from the start, fired by the claim ---------------------------

SELECT tap.seq('nap', $${"blocks": [
    {"type": "sleep", "id": "nap", "duration": "1h"},
    {"type": "step", "id": "later", "handler": "noop", "delay": "10m"}]}$$);
SELECT tap.new('n1', 'nap');
SELECT is(tap.state('n1'), 'waiting', 'an instance whose first block sleeps is waiting at once');
SELECT is(
    (tap.node('n1', 'nap')).wake_at, '2030-01-01 01:00:00+00'::timestamptz,
    'the sleep''s timer is its end'
);
SELECT is(
    (
        SELECT t.next_fire_at FROM orch8.task_instances AS t
        WHERE t.id = tap.id('n1')
    ),
    '2030-01-01 01:00:00+00'::timestamptz, 'the instance is due at its earliest timer'
);
SELECT is((SELECT count(*)::integer FROM tap.claim()), 0, 'nothing to claim while it sleeps');
SELECT is(
    (
        SELECT w.waiting_for FROM orch8.waiting_nodes AS w
        WHERE w.instance_id = tap.id('n1')
    ),
    'time', 'waiting_nodes: a sleep waits for time'
);
SELECT is(
    (
        SELECT w.until FROM orch8.waiting_nodes AS w
        WHERE w.instance_id = tap.id('n1')
    ),
    '2030-01-01 01:00:00+00'::timestamptz, 'waiting_nodes: until the sleep''s end'
);

SELECT set_config('orch8.fake_now', '2030-01-01 01:00:00+00', true);
SELECT is(
    (SELECT count(*)::integer FROM tap.claim()), 0,
    'the claim fires the timer; the next step waits for its delay'
);
SELECT is((tap.node('n1', 'nap')).state::text, 'completed', 'the sleep completed');
SELECT is((
    SELECT o.output FROM orch8.block_outputs AS o
    WHERE o.instance_id = tap.id('n1') AND o.block_id = 'nap'
),
'{"slept_ms": 3600000}'::jsonb, 'with its duration as output');
SELECT is(
    (tap.node('n1', 'later')).next_fire_at, '2030-01-01 01:10:00+00'::timestamptz,
    'a delay makes its step due later'
);
SELECT is(tap.state('n1'), 'scheduled', 'the instance is scheduled for it');
SELECT results_eq(
    $$SELECT actor, reason FROM orch8.instance_transitions
      WHERE instance_id = tap.id('n1') AND from_state = 'waiting'$$,
    $$VALUES ('timer'::text, 'sleep nap: slept'::text)$$,
    'the wake is audited as the timer''s'
);
SELECT set_config('orch8.fake_now', '2030-01-01 01:10:00+00', true);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('n1:later')$$,
    'once the delay has passed the step is claimed'
);

-- 3. Signals: exactly once, before or during the wait ----------------------------------------

SELECT tap.seq('sig', $${"blocks": [
    {"type": "sleep", "id": "nap", "duration": "1m"},
    {"type": "wait_for_signal", "id": "w1", "signal": "go"},
    {"type": "wait_for_signal", "id": "w2", "signal": "go", "timeout": "1h"},
    {"type": "step", "id": "use", "handler": "transform",
     "params": {"value": "{{ outputs.w2.payload.n }}"}}]}$$);
SELECT tap.new('s1', 'sig');
SELECT results_eq(
    $$SELECT outcome, deduplicated FROM orch8.send_signal('waits', tap.id('s1'), 'go',
                                                            '{"n": 1}', 'ann', 'k1')$$,
    $$VALUES ('pending'::text, false)$$, 'a signal before its wait is kept (pending)'
);
SELECT results_eq(
    $$SELECT outcome, deduplicated FROM orch8.send_signal('waits', tap.id('s1'), 'go',
                                                            '{"n": 9}', 'bob', 'k1')$$,
    $$VALUES ('pending'::text, true)$$, 'the same key again acts on nothing'
);
SELECT is((
    SELECT count(*)::integer FROM orch8.instance_signals
    WHERE instance_id = tap.id('s1')
), 1, 'and makes no second row');
SELECT results_eq(
    $$SELECT outcome FROM orch8.send_signal('waits', tap.id('s1'), 'go', '{"n": 2}', 'cy')$$,
    $$VALUES ('pending'::text)$$, 'a second signal is kept too'
);
SELECT set_config('orch8.fake_now', '2030-01-01 01:11:00+00', true);
SELECT is(
    (SELECT count(*)::integer FROM tap.claim()), 1,
    'the sleep ends; both waits consume a kept signal as they start; the step is claimed'
);
SELECT results_eq(
    $$SELECT payload ->> 'n', outcome, consumed_by FROM orch8.instance_signals
      WHERE instance_id = tap.id('s1') ORDER BY id$$,
    $$VALUES ('1', 'consumed', 'w1'), ('2', 'consumed', 'w2')$$,
    'each signal consumed by one wait, the oldest by the first'
);
SELECT is((
    SELECT o.output -> 'payload' FROM orch8.block_outputs AS o
    WHERE o.instance_id = tap.id('s1') AND o.block_id = 'w2'
),
'{"n": 2}'::jsonb, 'the payload is the wait''s output');
SELECT is((
    SELECT o.output ->> 'sent_by' FROM orch8.block_outputs AS o
    WHERE o.instance_id = tap.id('s1') AND o.block_id = 'w1'
),
'ann', 'with who sent it');

SELECT tap.seq('live', $${"blocks": [
    {"type": "wait_for_signal", "id": "w", "signal": "go"},
    {"type": "step", "id": "after", "handler": "noop"}]}$$);
SELECT tap.new('l1', 'live');
SELECT is(tap.state('l1'), 'waiting', 'an instance waiting for a signal is waiting');
SELECT results_eq(
    $$SELECT outcome FROM orch8.send_signal('waits', tap.id('l1'), 'go', '{}', 'ann')$$,
    $$VALUES ('consumed'::text)$$, 'a signal to a waiting wait is consumed at once'
);
SELECT is(tap.state('l1'), 'scheduled', 'and the instance goes on');
SELECT results_eq(
    $$SELECT actor, reason FROM orch8.instance_transitions
      WHERE instance_id = tap.id('l1') AND from_state = 'waiting'$$,
    $$VALUES ('ann'::text, 'signal go'::text)$$, 'audited with the sender'
);
SELECT throws_ok(
    $$SELECT orch8.send_signal('waits', tap.id('l1'), 'input', '{}', 'ann')$$,
    'O8008', NULL, 'input signals are answer_input''s only'
);
SELECT throws_ok(
    $$SELECT orch8.send_signal('waits', tap.id('l1'), 'go', '{}', 'ann', '')$$,
    'O8008', NULL, 'an empty idempotency key is refused'
);

-- update_context merges into data and bumps the version
SELECT results_eq(
    $$SELECT outcome FROM orch8.send_signal('waits', tap.id('l1'), 'update_context',
                                            '{"x": 42}', 'ann')$$,
    $$VALUES ('context_updated'::text)$$, 'update_context acts'
);
SELECT results_eq(
    $$SELECT context -> 'data', context_version FROM orch8.task_instances
      WHERE id = tap.id('l1')$$,
    $$VALUES ('{"x": 42}'::jsonb, 1)$$, 'the payload is merged into data, the version bumped'
);

-- 4. Timeouts -----------------------------------------------------------------------------

SELECT tap.seq('tmo', $${"blocks": [
    {"type": "wait_for_signal", "id": "ack", "signal": "ack", "timeout": "1h",
     "on_timeout": [{"type": "step", "id": "nudge", "handler": "noop"}]}]}$$);
SELECT tap.seq('tmf', $${"blocks": [
    {"type": "wait_for_signal", "id": "ack", "signal": "ack", "timeout": 1000}]}$$);
SELECT tap.new('t1', 'tmo');
SELECT tap.new('t2', 'tmf');
SELECT set_config('orch8.fake_now', '2030-01-01 02:11:00+00', true);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$,
    $$VALUES ('l1:after'), ('n1:later'), ('t1:ack.timeout/nudge')$$,
    'a timed-out wait runs its on_timeout (l1 went on after its signal; n1''s lease expired)'
);
SELECT is((tap.node('t1', 'ack')).state::text, 'running', 'the wait runs meanwhile');
SELECT is(tap.state('t2'), 'failed', 'without on_timeout the wait fails');
SELECT is((
    SELECT o.output ->> 'code' FROM orch8.block_outputs AS o
    WHERE o.instance_id = tap.id('t2') AND o.block_id = 'ack'
), 'timeout',
'with code timeout');
SELECT is(
    (
        SELECT t.error FROM orch8.task_instances AS t
        WHERE t.id = tap.id('t2')
    ),
    'wait_for_signal ack timed out after 1000 waiting for signal ack',
    'and an error that says what it waited for'
);
SELECT is(
    (SELECT f.state FROM tap.finish('t1', 'ack.timeout/nudge', 'ok', '{"n": 1}') AS f),
    'completed', 'the on_timeout ends'
);
SELECT is((tap.node('t1', 'ack')).state::text, 'completed', 'and the wait ends as it did');

-- 5. People --------------------------------------------------------------------------------

SELECT tap.seq('ask', $${"blocks": [
    {"type": "wait_for_input", "id": "ok", "prompt": "Refund {{ data.n }}?",
     "choices": ["yes", "no"], "timeout": "1d"},
    {"type": "step", "id": "after", "handler": "noop"}]}$$);
SELECT tap.new('a1', 'ask', '{"n": 3}');
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('a1:ok')$$,
    'a wait_for_input is claimed, for its prompt to be rendered'
);
SELECT is((
    SELECT a.state::text FROM
        orch8.await_input(
            'waits', tap.id('a1'), tap.tok('a1', 'ok'),
            'ok', 'Refund 3?'
        ) AS a
),
'waiting', 'await_input parks it for a person');
SELECT results_eq(
    $$SELECT waiting_for, prompt, choices, until FROM orch8.waiting_nodes
      WHERE instance_id = tap.id('a1')$$,
    $$VALUES ('input'::text, 'Refund 3?'::text, '["yes", "no"]'::jsonb,
              '2030-01-02 02:11:00+00'::timestamptz)$$,
    'waiting_nodes shows the prompt, the choices and the timeout'
);
SELECT is((tap.node('a1', 'ok')).lease_token, NULL, 'holding no lease');
SELECT throws_ok(
    $$SELECT orch8.answer_input('waits', tap.id('a1'), 'ok', 'maybe', NULL, 'ann')$$,
    'O8008', NULL, 'an answer that is not a choice is refused'
);
SELECT throws_ok(
    $$SELECT orch8.answer_input('waits', tap.id('a1'), 'after', 'yes', NULL, 'ann')$$,
    'O8007', NULL, 'a node that is no wait_for_input is not found'
);
SELECT results_eq(
    $$SELECT state::text, output ->> 'choice', output ->> 'answered_by'
      FROM orch8.answer_input('waits', tap.id('a1'), 'ok', 'yes', 'fine', 'ann')$$,
    $$VALUES ('scheduled', 'yes', 'ann')$$, 'an operator''s answer completes it'
);
SELECT throws_ok(
    $$SELECT orch8.answer_input('waits', tap.id('a1'), 'ok', 'no', NULL, 'bob')$$,
    'O8004', NULL, 'a second answer is refused'
);
SELECT results_eq(
    $$SELECT actor, reason FROM orch8.instance_transitions
      WHERE instance_id = tap.id('a1') AND from_state = 'waiting'$$,
    $$VALUES ('ann'::text, 'answered ok: yes'::text)$$, 'who answered is in the audit trail'
);

-- 6. Cancel during a wait ------------------------------------------------------------------

SELECT tap.new('c1', 'live');
SELECT lives_ok(
    $$SELECT orch8.cancel_instance('waits', tap.id('c1'), 'ops', 'not needed')$$,
    'cancel a waiting instance'
);
SELECT is(tap.state('c1'), 'cancelled', 'it is cancelled at once');
SELECT is((tap.node('c1', 'w')).state::text, 'cancelled', 'its wait withdrawn');
SELECT throws_ok(
    $$SELECT orch8.send_signal('waits', tap.id('c1'), 'go', '{}', 'ann')$$,
    'O8004', NULL, 'a custom signal to an ended instance is refused'
);

-- 7. A paused instance whose last sleep ends completes (the claim that fires it goes on) ---

SELECT tap.seq('last_nap', $${"blocks": [{"type": "sleep", "id": "nap", "duration": "1s"}]}$$);
SELECT tap.new('p1', 'last_nap');
SELECT is(orch8.pause_instance('waits', tap.id('p1'), 'ops'), 'paused', 'paused while it sleeps');
SELECT set_config('orch8.fake_now', '2030-01-01 03:00:00+00', true);
SELECT lives_ok($$SELECT * FROM tap.claim()$$, 'the claim fires its timer without failing');
SELECT is(tap.state('p1'), 'completed', 'its work ended while paused: it completed');

SELECT * FROM finish();
ROLLBACK;
