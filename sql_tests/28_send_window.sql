-- A step's send_window (sql/functions/waits.sql): window_open_at's vectors (inside,
-- before start, after end, the weekend, DST weeks in Europe/Berlin and America/New_York,
-- a start in a spring-forward gap), the validator's problems, and the
-- window applied where a step becomes due: start_block (after its delay) and
-- finish_step's retry. 2031-03-01 is a Saturday.
BEGIN;
SELECT plan(29);
SELECT set_config('orch8.fake_now', '2031-03-01 12:00:00+00', true);
SELECT set_config('tap.tenant', 'window', true);

-- 1. window_open_at --------------------------------------------------------------------------

CREATE TEMPORARY TABLE office ON COMMIT DROP AS
SELECT '{"timezone": "Europe/Berlin", "days": ["mon", "tue", "wed", "thu", "fri"],
         "start": "09:00", "end": "17:00"}'::jsonb AS w;

SELECT is(
    orch8.window_open_at(w, '2031-03-03 10:00+00'), '2031-03-03 10:00+00'::timestamptz,
    'inside the window: at once'
) FROM office;
SELECT is(
    orch8.window_open_at(w, '2031-03-03 07:00+00'), '2031-03-03 08:00+00'::timestamptz,
    'before the start: the start (09:00 CET)'
) FROM office;
SELECT is(
    orch8.window_open_at(w, '2031-03-03 08:00+00'), '2031-03-03 08:00+00'::timestamptz,
    'the start is inside'
) FROM office;
SELECT is(
    orch8.window_open_at(w, '2031-03-03 16:00+00'), '2031-03-04 08:00+00'::timestamptz,
    'the end is outside: the next day''s start'
) FROM office;
SELECT is(
    orch8.window_open_at(w, '2031-03-03 16:30+00'), '2031-03-04 08:00+00'::timestamptz,
    'after the end: the next day''s start'
) FROM office;
SELECT is(
    orch8.window_open_at(w, '2031-03-01 12:00+00'), '2031-03-03 08:00+00'::timestamptz,
    'on Saturday: Monday''s start'
) FROM office;
SELECT is(
    orch8.window_open_at(w, '2031-03-07 17:00+00'), '2031-03-10 08:00+00'::timestamptz,
    'Friday after the end: Monday''s start'
) FROM office;
SELECT is(
    orch8.window_open_at(w, '2031-03-02 23:30+00'), '2031-03-03 08:00+00'::timestamptz,
    'the local date counts: 00:30 Monday in Berlin is Sunday in UTC'
) FROM office;
SELECT is(
    orch8.window_open_at(w, '2031-03-28 17:00+00'), '2031-03-31 07:00+00'::timestamptz,
    'across the spring-forward weekend: Monday 09:00 CEST'
) FROM office;
SELECT is(
    orch8.window_open_at(w, '2031-10-24 17:00+00'), '2031-10-27 08:00+00'::timestamptz,
    'across the fall-back weekend: Monday 09:00 CET'
) FROM office;

SELECT is(
    orch8.window_open_at(
        '{"timezone": "America/New_York", "days": ["mon", "tue", "wed", "thu", "fri"],
          "start": "09:00", "end": "17:00"}', '2031-03-07 13:00+00'
    ),
    '2031-03-07 14:00+00'::timestamptz, 'New York before its DST: 09:00 EST'
);
SELECT is(
    orch8.window_open_at(
        '{"timezone": "America/New_York", "days": ["mon", "tue", "wed", "thu", "fri"],
          "start": "09:00", "end": "17:00"}', '2031-03-08 12:00+00'
    ),
    '2031-03-10 13:00+00'::timestamptz, 'New York across its DST weekend: Monday 09:00 EDT'
);
SELECT is(
    orch8.window_open_at(
        '{"timezone": "Europe/Berlin", "start": "02:30", "end": "04:00"}',
        '2031-03-29 23:00+00'
    ),
    '2031-03-30 01:00+00'::timestamptz,
    'a start in the spring-forward gap opens at the end of the gap (03:00 CEST)'
);
SELECT is(
    orch8.window_open_at(
        '{"timezone": "America/New_York", "start": "02:00", "end": "02:30"}',
        '2031-03-09 05:00+00'
    ),
    '2031-03-10 06:00+00'::timestamptz,
    'a window inside the gap is empty that day: the next day''s start'
);
SELECT is(
    orch8.window_open_at(
        '{"timezone": "Europe/Berlin", "start": "02:30", "end": "04:00"}',
        '2031-10-25 23:00+00'
    ),
    '2031-10-26 00:30+00'::timestamptz,
    'a start that occurs twice (fall back) opens at its first occurrence (02:30 CEST)'
);
SELECT is(
    orch8.window_open_at(
        '{"timezone": "UTC", "start": "00:00", "end": "24:00"}',
        '2031-03-01 23:59:59+00'
    ),
    '2031-03-01 23:59:59+00'::timestamptz, 'every day 00:00 to 24:00: always open'
);
SELECT is(
    orch8.window_open_at('{"timezone": "Asia/Tokyo", "days": ["sun"], "start": "10:00",
                           "end": "11:00"}', '2031-03-01 12:00+00'),
    '2031-03-02 01:00+00'::timestamptz, 'days: only Sunday, in Tokyo'
);
SELECT is(
    orch8.window_open_at(NULL, '2031-03-01 12:00+00'), '2031-03-01 12:00+00'::timestamptz,
    'no window: at once'
);
SELECT is(
    orch8.window_open_at(
        '{"timezone": "Mars/Olympus", "start": "09:00", "end": "17:00"}',
        '2031-03-01 12:00+00'
    ),
    '2031-03-01 12:00+00'::timestamptz,
    'a window the validator refuses (stored unchecked) is not applied'
);

-- 2. The validator ---------------------------------------------------------------------------

SELECT set_eq(
    $$SELECT path, message FROM orch8.validate_sequence('{"blocks": [
        {"type": "step", "id": "a", "handler": "noop", "send_window": "9-5"},
        {"type": "step", "id": "b", "handler": "noop", "send_window": {
            "timezone": "Mars/Olympus", "days": ["mon", "funday"], "start": "9:00",
            "end": "25:00", "zone": "x"}},
        {"type": "step", "id": "c", "handler": "noop", "send_window": {
            "days": [], "start": "17:00", "end": "09:00"}},
        {"type": "step", "id": "d", "handler": "noop", "send_window": {
            "timezone": "UTC", "days": ["mon", "mon"]}},
        {"type": "step", "id": "e", "handler": "noop", "send_window": {
            "timezone": "Europe/Berlin", "days": ["sat", "sun"], "start": "00:00",
            "end": "24:00"}}]}')$$,
    $$VALUES
        ('$.blocks[0].send_window', 'send_window must be an object {timezone, days, start, end}'),
        ('$.blocks[1].send_window.zone', 'unknown field'),
        ('$.blocks[1].send_window.timezone',
         'timezone must be a time zone name (pg_timezone_names), such as Europe/Berlin'),
        ('$.blocks[1].send_window.days',
         'days must be a non-empty array of distinct days: mon, tue, wed, thu, fri, sat, sun'),
        ('$.blocks[1].send_window.start', 'start must be a time HH:MM, 00:00 to 23:59'),
        ('$.blocks[1].send_window.end', 'end must be a time HH:MM, 00:01 to 24:00'),
        ('$.blocks[2].send_window.timezone',
         'timezone is required (a time zone name such as Europe/Berlin)'),
        ('$.blocks[2].send_window.days',
         'days must be a non-empty array of distinct days: mon, tue, wed, thu, fri, sat, sun'),
        ('$.blocks[2].send_window.end',
         'end must be after start (a window across midnight is not supported)'),
        ('$.blocks[3].send_window.days',
         'days must be a non-empty array of distinct days: mon, tue, wed, thu, fri, sat, sun'),
        ('$.blocks[3].send_window.start', 'start must be a time HH:MM, 00:00 to 23:59'),
        ('$.blocks[3].send_window.end', 'end must be a time HH:MM, 00:01 to 24:00')$$,
    'the validator refuses each malformed field of a send_window, with its path'
);

-- 3. Where a step becomes due ------------------------------------------------------------------

SELECT tap.seq('office', $${"blocks": [
    {"type": "step", "id": "mail", "handler": "noop", "delay": "1h",
     "send_window": {"timezone": "Europe/Berlin", "days": ["mon", "tue", "wed", "thu", "fri"],
                     "start": "09:00", "end": "17:00"}}]}$$);
SELECT tap.new('o1', 'office');
SELECT is(
    (tap.node('o1', 'mail')).next_fire_at, '2031-03-03 08:00+00'::timestamptz,
    'started on Saturday, the step is due at Monday''s opening'
);
SELECT is(tap.state('o1'), 'scheduled', 'the instance is scheduled');
SELECT is(
    (
        SELECT t.next_fire_at FROM orch8.task_instances AS t
        WHERE t.id = tap.id('o1')
    ),
    '2031-03-03 08:00+00'::timestamptz, 'the instance is due then'
);
SELECT is((SELECT count(*)::integer FROM tap.claim()), 0, 'nothing to claim on Saturday');

SELECT set_config('orch8.fake_now', '2031-03-03 08:59:00+00', true);  -- 09:59 CET
SELECT tap.new('o2', 'office');
SELECT is(
    (tap.node('o2', 'mail')).next_fire_at, '2031-03-03 09:59+00'::timestamptz,
    'inside the window, the delay alone counts'
);

SELECT set_config('orch8.fake_now', '2031-03-03 08:00:00+00', true);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('o1:mail')$$,
    'at the opening the step is claimed'
);
SELECT is(
    (SELECT f.state FROM tap.finish('o1', 'mail', 'error', NULL, 'busy', '8 hours') AS f),
    'scheduled', 'a retry in 8 hours: at 17:00 CET, the end'
);
SELECT is(
    (tap.node('o1', 'mail')).next_fire_at, '2031-03-04 08:00+00'::timestamptz,
    'a retry that would fall after the end waits for the next opening'
);
SELECT set_config('orch8.fake_now', '2031-03-03 14:00:00+00', true);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('o2:mail')$$,
    'the other instance, inside its window, is claimed'
);

SELECT * FROM finish();
ROLLBACK;
