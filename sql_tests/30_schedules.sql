-- Schedules: cron validation and fire times (DST in America/New_York and Europe/Berlin),
-- create/pause/resume/end, and fire_due_schedules (idempotency key, catch-up rule, each
-- overlap policy, starts_at/ends_at, the CAS). Time moves with orch8.fake_now.
BEGIN;
SELECT plan(133);

SET LOCAL timezone = 'UTC';

SELECT has_table('orch8', 'schedules', 'schedules exist');
SELECT has_table('orch8', 'schedule_fires', 'the fire history exists');
SELECT has_view('orch8', 'schedule_overview', 'the overview exists');
SELECT has_function(
    'orch8', 'cron_next', ARRAY['text', 'text', 'timestamp with time zone'],
    'cron_next(text, text, timestamptz) exists'
);
SELECT has_function('orch8', 'cron_problems', ARRAY['text'], 'cron_problems(text) exists');
SELECT has_function(
    'orch8', 'fire_due_schedules', ARRAY['integer', 'text'], 'fire_due_schedules exists'
);

-- 1. Validation: one problem per mistake -------------------------------------------------

SELECT is(orch8.cron_problems('*/5 * * * *'), '{}'::text[], 'a valid expression has none');
SELECT is(orch8.cron_problems('0 0 29 2 *'), '{}'::text[], 'Feb 29 is possible');
SELECT is(
    orch8.cron_problems('0 0 30 2 *'),
    ARRAY['no date matches: day-of-month 30 never falls in month 2'],
    '0 0 30 2 * can never fire'
);
SELECT is(
    cardinality(orch8.cron_problems('0 0 31 4,6,9,11 *')), 1,
    'the 31st of a 30-day month can never fire'
);
SELECT is(
    cardinality(orch8.cron_problems('0 0 30 2 1')), 0,
    'Feb 30 or a Monday: the Monday makes it possible (Vixie OR)'
);
SELECT is(
    orch8.cron_problems('* * * *'),
    ARRAY['a cron expression has 5 fields (minute hour day-of-month month day-of-week), not 4'],
    'four fields are refused'
);
SELECT is(cardinality(orch8.cron_problems('')), 1, 'an empty expression is refused');
SELECT is(cardinality(orch8.cron_problems(NULL)), 1, 'NULL is refused');
SELECT is(
    orch8.cron_problems('61 * * * *'), ARRAY['minute: ''61'' is out of range 0-59'],
    'a minute out of range'
);
SELECT is(
    cardinality(orch8.cron_problems('60 24 32 13 8')), 5, 'one problem per field out of range'
);
SELECT is(
    cardinality(orch8.cron_problems('*/0 * * * *')), 1, 'a step of 0 is refused'
);
SELECT is(cardinality(orch8.cron_problems('5-1 * * * *')), 1, 'a range from high to low');
SELECT is(cardinality(orch8.cron_problems('MON * * * *')), 1, 'no names for minutes');
SELECT is(cardinality(orch8.cron_problems('* * * JANUARY *')), 1, 'JANUARY is no month name');
SELECT is(cardinality(orch8.cron_problems('1,,2 * * * *')), 1, 'an empty list item');
SELECT is(
    cardinality(orch8.cron_problems('0 9 * jan-Mar mon-FRI')), 0,
    'names in any case, in ranges'
);
SELECT throws_ok(
    $$SELECT orch8.cron_next('0 0 30 2 *', 'UTC', now())$$, 'O8008', NULL,
    'cron_next refuses an expression with problems'
);
SELECT throws_ok(
    $$SELECT orch8.cron_next('0 0 * * *', 'Mars/Olympus', now())$$, 'O8008', NULL,
    'cron_next refuses an unknown time zone'
);

-- 2. Fire times ---------------------------------------------------------------------------

SELECT is(
    orch8.cron_next('*/5 * * * *', 'UTC', '2030-01-01 00:00:00Z'), '2030-01-01 00:05:00Z',
    'strictly after: */5 from 00:00 is 00:05'
);
SELECT is(
    orch8.cron_next('*/5 * * * *', 'UTC', '2030-01-01 00:04:59.9Z'), '2030-01-01 00:05:00Z',
    'a fraction of a second before counts'
);
SELECT is(
    orch8.cron_next('5-20/5 * * * *', 'UTC', '2025-01-01 00:20Z'), '2025-01-01 01:05Z',
    'a-b/n'
);
SELECT is(
    orch8.cron_next('50/5 * * * *', 'UTC', '2025-01-01 00:56Z'), '2025-01-01 01:50Z',
    'a/n runs to the end of the field'
);
SELECT is(
    orch8.cron_next('0 9 * * mon-fri', 'UTC', '2025-01-03 10:00Z'), '2025-01-06 09:00Z',
    'Friday after nine: next Monday'
);
SELECT is(
    ARRAY[
        orch8.cron_next('0 0 * * 0', 'UTC', '2025-01-01Z'),
        orch8.cron_next('0 0 * * 7', 'UTC', '2025-01-01Z'),
        orch8.cron_next('0 0 * * sun', 'UTC', '2025-01-01Z')
    ],
    ARRAY['2025-01-05Z', '2025-01-05Z', '2025-01-05Z']::timestamptz[],
    '0, 7 and SUN are all Sunday'
);
SELECT is(
    orch8.cron_next('0 0 13 * 5', 'UTC', '2025-01-01Z'), '2025-01-03Z',
    'both day fields restricted: either matches (Friday the 3rd)'
);
SELECT is(
    orch8.cron_next('0 0 */2 * 1', 'UTC', '2025-01-01Z'), '2025-01-13Z',
    'a day field starting with *: both must match (an odd day that is a Monday)'
);
SELECT is(
    orch8.cron_next('0 0 1 mar *', 'UTC', '2025-01-01Z'), '2025-03-01Z', 'a month name'
);
SELECT is(
    orch8.cron_next('0 0 29 2 *', 'UTC', '2025-01-01Z'), '2028-02-29Z', 'Feb 29: the next leap year'
);
SELECT is(
    orch8.cron_next('0 0 29 2 *', 'UTC', '2024-02-29Z'), '2028-02-29Z',
    'Feb 29 from Feb 29: four years on'
);
SELECT is(
    orch8.cron_next('0 0 31 * *', 'UTC', '2025-01-31Z'), '2025-03-31Z',
    'the 31st skips the months without one'
);
SELECT is(
    orch8.cron_next('59 23 31 12 *', 'UTC', '2025-12-31 23:59Z'), '2026-12-31 23:59Z',
    'the last minute of the year, a year on'
);
SELECT is(
    orch8.cron_next('* * * * *', 'UTC', '2025-12-31 23:59:30Z'), '2026-01-01 00:00Z',
    'every minute rolls over into the new year'
);
SELECT is(
    orch8.cron_next('0 9 * * *', 'Europe/Berlin', '2025-07-01Z'), '2025-07-01 07:00Z',
    'nine in Berlin in summer is 07:00 UTC'
);
SELECT is(
    orch8.cron_next('0 9 * * *', 'America/New_York', '2025-01-01Z'), '2025-01-01 14:00Z',
    'nine in New York in winter is 14:00 UTC'
);

-- 3. DST ----------------------------------------------------------------------------------
-- What PostgreSQL does, which cron_next corrects: a wall time in the gap is read with the
-- offset before the transition, a repeated one as its later occurrence.
SELECT is(
    '2024-03-10 02:30'::timestamp AT TIME ZONE 'America/New_York', '2024-03-10 07:30Z',
    'PostgreSQL: 02:30 in the New York gap is 07:30Z (03:30 EDT)'
);
SELECT is(
    '2024-11-03 01:30'::timestamp AT TIME ZONE 'America/New_York', '2024-11-03 06:30Z',
    'PostgreSQL: the repeated 01:30 in New York is its later occurrence (EST)'
);
SELECT is(
    orch8.cron_next('30 2 * * *', 'America/New_York', '2024-03-10Z'), '2024-03-10 07:00Z',
    'New York spring-forward: 02:30 fires at the first instant after the gap (03:00 EDT)'
);
SELECT is(
    orch8.cron_next('30 2 * * *', 'America/New_York', '2024-03-10 07:00Z'), '2024-03-11 06:30Z',
    '... once: next 02:30 EDT the day after'
);
SELECT is(
    orch8.cron_next('0 * * * *', 'America/New_York', '2024-03-10 06:00Z'), '2024-03-10 07:00Z',
    'hourly: 02:00 (in the gap) and 03:00 are the same instant ...'
);
SELECT is(
    orch8.cron_next('0 * * * *', 'America/New_York', '2024-03-10 07:00Z'), '2024-03-10 08:00Z',
    '... which fires once'
);
SELECT is(
    orch8.cron_next('30 1 * * *', 'America/New_York', '2024-11-03Z'), '2024-11-03 05:30Z',
    'New York fall-back: the repeated 01:30 fires at its first occurrence (EDT)'
);
SELECT is(
    orch8.cron_next('30 1 * * *', 'America/New_York', '2024-11-03 05:30Z'), '2024-11-04 06:30Z',
    '... once: not again at 01:30 EST'
);
SELECT is(
    orch8.cron_next('0 * * * *', 'America/New_York', '2024-11-03 05:00Z'), '2024-11-03 07:00Z',
    'hourly at fall-back: after 01:00 EDT comes 02:00 EST (the second 01:00 is skipped)'
);
SELECT is(
    orch8.cron_next('*/15 2 * * *', 'Europe/Berlin', '2024-03-31Z'), '2024-03-31 01:00Z',
    'Berlin spring-forward: 02:00-02:45 all fire at 03:00 CEST ...'
);
SELECT is(
    orch8.cron_next('*/15 2 * * *', 'Europe/Berlin', '2024-03-31 01:00Z'), '2024-04-01 00:00Z',
    '... once'
);
SELECT is(
    orch8.cron_next('30 2 * * *', 'Europe/Berlin', '2024-10-27Z'), '2024-10-27 00:30Z',
    'Berlin fall-back: 02:30 fires at its first occurrence (CEST)'
);
SELECT is(
    orch8.cron_next('30 2 * * *', 'Europe/Berlin', '2024-10-27 00:30Z'), '2024-10-28 01:30Z',
    '... once: next 02:30 CET the day after'
);

-- 4. Creating a schedule -------------------------------------------------------------------

SELECT set_config('orch8.fake_now', '2030-01-01 00:00:00+00', true);
SELECT isnt(
    orch8.create_sequence(
        'ts', 'default', 'job', '{"blocks": [{"id": "a", "type": "step", "handler": "noop"}]}'
    ),
    NULL, 'a sequence to schedule'
);

CREATE FUNCTION pg_temp.refused_field(p_sql text)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_detail text;
BEGIN
    EXECUTE p_sql;
    RETURN 'accepted';
EXCEPTION WHEN SQLSTATE 'O8008' THEN
    GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
    RETURN v_detail::jsonb ->> 'field';
END
$$;

SELECT is(pg_temp.refused_field(
    $$SELECT orch8.create_schedule('ts', 'has space', 'job', '* * * * *')$$
), 'name', 'a name that is not an identifier: O8008 {field: name}');
SELECT is(pg_temp.refused_field(
    $$SELECT orch8.create_schedule('ts', 'x', 'job', '0 0 30 2 *')$$
), 'cron', 'an impossible expression: O8008 {field: cron}');
SELECT is(pg_temp.refused_field(
    $$SELECT orch8.create_schedule('ts', 'x', 'job', '* * * * *', 'Mars/Olympus')$$
), 'timezone', 'an unknown time zone: O8008 {field: timezone}');
SELECT is(pg_temp.refused_field(
    $$SELECT orch8.create_schedule('ts', 'x', 'job', '* * * * *',
        p_overlap_policy => 'sometimes')$$
), 'overlap_policy', 'an unknown overlap policy: O8008 {field: overlap_policy}');
SELECT is(pg_temp.refused_field(
    $$SELECT orch8.create_schedule('ts', 'x', 'job', '* * * * *', p_data => '[]')$$
), 'data', 'data that is not an object: O8008 {field: data}');
SELECT is(pg_temp.refused_field(
    $$SELECT orch8.create_schedule('ts', 'x', 'job', '* * * * *',
        p_starts_at => '2030-02-01Z', p_ends_at => '2030-01-15Z')$$
), 'ends_at', 'ends_at before starts_at: O8008 {field: ends_at}');
SELECT is(pg_temp.refused_field(
    $$SELECT orch8.create_schedule('ts', 'x', 'job', '0 0 1 1 *', p_ends_at => '2030-06-01Z')$$
), 'ends_at', 'no fire time before ends_at: O8008 {field: ends_at}');
SELECT is(pg_temp.refused_field(
    $$SELECT orch8.create_schedule('ts', 'x', 'nosuchjob', '* * * * *')$$
), 'sequence_name', 'an unknown sequence: O8008 {field: sequence_name}');

CREATE TEMP TABLE sched (name text PRIMARY KEY, id uuid NOT NULL);
INSERT INTO sched VALUES
('s5', orch8.create_schedule('ts', 's5', 'job', '*/5 * * * *', p_data => '{"k": 1}')),
('sa', orch8.create_schedule('ts', 'sa', 'job', '0 * * * *', p_overlap_policy => 'allow')),
('sb', orch8.create_schedule('ts', 'sb', 'job', '0 * * * *', p_overlap_policy => 'buffer_one')),
('sc', orch8.create_schedule(
    'ts', 'sc', 'job', '0 * * * *', p_overlap_policy => 'cancel_previous'
)),
('se', orch8.create_schedule(
    'ts', 'se', 'job', '0 * * * *', p_ends_at => '2030-01-01 02:30Z'
)),
('sf', orch8.create_schedule(
    'ts', 'sf', 'job', '0 * * * *', p_starts_at => '2030-01-01 05:00Z'
));

SELECT is(pg_temp.refused_field(
    $$SELECT orch8.create_schedule('ts', 's5', 'job', '* * * * *')$$
), 'name', 'a name in use: O8008 {field: name}');

CREATE FUNCTION pg_temp.sid(p_name text)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT s.id FROM sched AS s WHERE s.name = p_name $$;

SELECT is(
    (
        SELECT next_fire_at FROM orch8.schedules
        WHERE id = pg_temp.sid('s5')
    ),
    '2030-01-01 00:05Z', 'created active with its next fire time'
);
SELECT is(
    (
        SELECT next_fire_at FROM orch8.schedules
        WHERE id = pg_temp.sid('sf')
    ),
    '2030-01-01 05:00Z', 'starts_at is the first fire time when it is one'
);

-- 5. Firing ---------------------------------------------------------------------------------

CREATE TEMP TABLE fired AS SELECT * FROM orch8.schedule_fires WITH NO DATA;

CREATE FUNCTION pg_temp.fire(p_at text)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_count integer;
BEGIN
    PERFORM set_config('orch8.fake_now', p_at, true);
    INSERT INTO fired SELECT * FROM orch8.fire_due_schedules(100, 'tap');
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

CREATE FUNCTION pg_temp.outcomes(p_name text, p_from text)
RETURNS text
LANGUAGE sql
AS $$
    SELECT coalesce(string_agg(
        f.outcome || '@' || to_char(f.fire_at AT TIME ZONE 'UTC', 'HH24:MI')
        || coalesce('x' || f.missed_count::text, ''), ' ' ORDER BY f.seq), '')
    FROM fired AS f
    WHERE f.schedule_id = pg_temp.sid(p_name) AND f.recorded_at >= p_from::timestamptz
$$;

CREATE FUNCTION pg_temp.end_last(p_name text)
RETURNS text
LANGUAGE sql
AS $$
    SELECT orch8.cancel_instance('ts', s.last_instance_id, 'tap')
    FROM orch8.schedules AS s WHERE s.id = pg_temp.sid(p_name)
$$;

SELECT is(pg_temp.fire('2030-01-01 00:04:59+00'), 0, 'nothing is due before the first fire');
SELECT is(pg_temp.fire('2030-01-01 00:05:00+00'), 1, 'at the fire time one fire ...');
SELECT is(pg_temp.outcomes('s5', '2030-01-01 00:05Z'), 'started@00:05', '... started');
SELECT is(
    (
        SELECT t.idempotency_key::text FROM orch8.task_instances AS t
        INNER JOIN fired AS f ON t.id = f.instance_id
        WHERE f.schedule_id = pg_temp.sid('s5')
    ),
    'orch8:schedule:' || pg_temp.sid('s5') || ':2030-01-01T00:05:00Z',
    'the instance''s idempotency key is the schedule id and the fire time'
);
SELECT is(
    (
        SELECT t.context -> 'data' FROM orch8.task_instances AS t
        INNER JOIN fired AS f ON t.id = f.instance_id
        WHERE f.schedule_id = pg_temp.sid('s5')
    ),
    '{"k": 1}'::jsonb, 'with the schedule''s data'
);
SELECT is(
    (
        SELECT row(next_fire_at, last_fire_at)::text FROM orch8.schedules
        WHERE id = pg_temp.sid('s5')
    ),
    row('2030-01-01 00:10Z'::timestamptz, '2030-01-01 00:05Z'::timestamptz)::text,
    'next_fire_at advanced, last_fire_at recorded'
);
SELECT is(pg_temp.fire('2030-01-01 00:05:00+00'), 0, 'a second pass at that time fires nothing');
SELECT is(pg_temp.fire('2030-01-01 00:10:00+00'), 1, 'skip: the previous instance runs ...');
SELECT is(
    pg_temp.outcomes('s5', '2030-01-01 00:10Z'), 'skipped_overlap@00:10',
    '... so the fire is skipped_overlap'
);
SELECT is(pg_temp.end_last('s5'), 'cancelled', 'the previous instance ends');
SELECT is(pg_temp.fire('2030-01-01 00:15:00+00'), 1, 'then the next fire ...');
SELECT is(pg_temp.outcomes('s5', '2030-01-01 00:15Z'), 'started@00:15', '... starts');

-- catch-up: everything was down from 00:16 to 01:00:30
SELECT is(pg_temp.end_last('s5'), 'cancelled', 'its instance ends');
SELECT is(pg_temp.fire('2030-01-01 01:00:30+00'), 6, 'after an outage: six fires recorded');
SELECT is(
    pg_temp.outcomes('s5', '2030-01-01 01:00Z'), 'missed@00:55x8 started@01:00',
    'catch-up: the latest due fire time starts, the 8 before it are one missed row'
);
SELECT is(
    (
        SELECT missed_from FROM fired
        WHERE schedule_id = pg_temp.sid('s5') AND outcome = 'missed'
    ),
    '2030-01-01 00:20Z', 'the missed row names the first fire time missed'
);
SELECT is(
    pg_temp.outcomes('sa', '2030-01-01 01:00Z')
    || ' ' || pg_temp.outcomes('sb', '2030-01-01 01:00Z')
    || ' ' || pg_temp.outcomes('sc', '2030-01-01 01:00Z')
    || ' ' || pg_temp.outcomes('se', '2030-01-01 01:00Z'),
    'started@01:00 started@01:00 started@01:00 started@01:00',
    'the hourly schedules start their first instance'
);
SELECT is(orch8.pause_schedule('ts', pg_temp.sid('s5'), 'tap'), 'paused', 'pause s5');
SELECT is(orch8.pause_schedule('ts', pg_temp.sid('s5'), 'tap'), 'unchanged', 'twice: unchanged');
SELECT is(
    (
        SELECT row(state, next_fire_at)::text FROM orch8.schedules
        WHERE id = pg_temp.sid('s5')
    ),
    '(paused,)', 'a paused schedule has no next fire time'
);

SELECT is(pg_temp.fire('2030-01-01 02:00:00+00'), 4, 'at 02:00 the previous instances run');
SELECT is(
    (
        SELECT count(*)::integer
        FROM fired
        WHERE
            schedule_id = pg_temp.sid('s5')
            AND recorded_at >= '2030-01-01 02:00Z'
    ),
    0, 'a paused schedule does not fire'
);
SELECT is(pg_temp.outcomes('sa', '2030-01-01 02:00Z'), 'started@02:00', 'allow: starts anyway');
SELECT is(pg_temp.outcomes('sb', '2030-01-01 02:00Z'), 'buffered@02:00', 'buffer_one: buffered');
SELECT is(
    (
        SELECT buffered_fire_at FROM orch8.schedules
        WHERE id = pg_temp.sid('sb')
    ),
    '2030-01-01 02:00Z', 'the buffered fire time is kept'
);
SELECT is(
    pg_temp.outcomes('sc', '2030-01-01 02:00Z'), 'cancelled_previous@02:00',
    'cancel_previous: the new one starts ...'
);
SELECT is(
    (
        SELECT t.state::text FROM orch8.task_instances AS t
        INNER JOIN fired AS f ON t.id = f.previous_instance_id
        WHERE f.schedule_id = pg_temp.sid('sc')
    ),
    'cancelled', '... and the previous one is cancelled'
);
SELECT is(
    (
        SELECT row(state, next_fire_at)::text FROM orch8.schedules
        WHERE id = pg_temp.sid('se')
    ),
    '(ended,)', 'ends_at: the last fire time before it was 02:00, the schedule ended'
);

SELECT is(pg_temp.fire('2030-01-01 03:00:00+00'), 3, 'at 03:00 ...');
SELECT is(
    pg_temp.outcomes('sb', '2030-01-01 03:00Z'), 'skipped_overlap@03:00',
    'buffer_one keeps one buffered fire: the next is skipped'
);
SELECT is(pg_temp.end_last('sb'), 'cancelled', 'buffer_one: the previous instance ends');
SELECT is(pg_temp.fire('2030-01-01 03:00:10+00'), 1, 'the next pass ...');
SELECT is(
    pg_temp.outcomes('sb', '2030-01-01 03:00:10Z'), 'started@02:00',
    '... starts the buffered fire, with its own fire time'
);
SELECT is(
    (
        SELECT row(buffered_fire_at, last_fire_at)::text FROM orch8.schedules
        WHERE id = pg_temp.sid('sb')
    ),
    row(NULL::timestamptz, '2030-01-01 02:00Z'::timestamptz)::text,
    'the buffer is empty again'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.task_instances
        WHERE idempotency_key = 'orch8:schedule:' || pg_temp.sid('sb') || ':2030-01-01T02:00:00Z'
    ),
    1, 'its key names the buffered fire time'
);

-- resume: from now, no catch-up of the paused period
SELECT is(pg_temp.end_last('s5'), 'cancelled', 's5: its instance ends');
SELECT set_config('orch8.fake_now', '2030-01-01 03:01:00+00', true);
SELECT is(orch8.resume_schedule('ts', pg_temp.sid('s5'), 'tap'), 'active', 'resume s5');
SELECT is(
    (
        SELECT next_fire_at FROM orch8.schedules
        WHERE id = pg_temp.sid('s5')
    ),
    '2030-01-01 03:05Z', 'its next fire is computed from now'
);
SELECT is(pg_temp.fire('2030-01-01 03:05:00+00'), 1, 'one fire at 03:05 ...');
SELECT is(
    pg_temp.outcomes('s5', '2030-01-01 03:05Z'), 'started@03:05',
    '... and no missed row for the paused period'
);
SELECT is(orch8.resume_schedule('ts', pg_temp.sid('s5'), 'tap'), 'unchanged', 'resume twice');
SELECT throws_ok(
    format('SELECT orch8.pause_schedule(%L, %L)', 'ts', pg_temp.sid('se')), 'O8004', NULL,
    'an ended schedule cannot be paused'
);
SELECT throws_ok(
    format('SELECT orch8.resume_schedule(%L, %L)', 'ts', pg_temp.sid('se')), 'O8004', NULL,
    'nor resumed'
);
SELECT throws_ok(
    format('SELECT orch8.pause_schedule(%L, %L)', 'ts', gen_random_uuid()), 'O8007', NULL,
    'an unknown schedule: O8007'
);

SELECT is(pg_temp.fire('2030-01-01 05:00:00+00'), 9, 'at 05:00 ...');
SELECT is(
    pg_temp.outcomes('sf', '2030-01-01 05:00Z'), 'started@05:00', 'starts_at: sf fires first'
);

-- the CAS: a schedule row that is not the current one fires nothing
CREATE FUNCTION pg_temp.fire_stale(p_name text, p_expected timestamptz, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.schedules;
    v_count integer;
BEGIN
    SELECT * INTO STRICT v_row FROM orch8.schedules AS s WHERE s.id = pg_temp.sid(p_name);
    v_row.next_fire_at := p_expected;
    SELECT count(*) INTO v_count FROM orch8.schedule_fire(v_row, p_now, 'tap');
    RETURN v_count;
END
$$;

SELECT is(
    pg_temp.fire_stale('sa', '2030-01-01 04:00Z', '2030-01-01 05:00:01Z'), 0,
    'a lost CAS (an expected next_fire_at that is not the current one) fires nothing'
);

-- a long outage: counted up to 1000
INSERT INTO sched VALUES ('sm', orch8.create_schedule('ts', 'sm', 'job', '* * * * *'));
SELECT is(pg_temp.fire('2030-01-02 06:00:30+00') >= 2, true, 'a day later ...');
SELECT is(
    pg_temp.outcomes('sm', '2030-01-02 06:00Z'), 'missed@05:59x1000 started@06:00',
    'the count stops at 1000 ...'
);
SELECT is(
    (
        SELECT row(count_capped, missed_from)::text FROM fired
        WHERE schedule_id = pg_temp.sid('sm') AND outcome = 'missed'
    ),
    row(true, '2030-01-01 05:01Z'::timestamptz)::text,
    '... count_capped says so; missed_from is the first one missed'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.task_instances
        WHERE idempotency_key LIKE 'orch8:schedule:' || pg_temp.sid('sm') || ':%'
    ),
    1, 'one instance for the outage, not one per fire time'
);

-- a fire the engine refuses is recorded as failed; the schedule and the others go on
SELECT set_config('orch8.fake_now', '2030-01-02 06:00:30+00', true);
INSERT INTO sched VALUES ('sx', orch8.create_schedule(
    'ts', 'sx', 'job', '* * * * *', p_data => jsonb_build_object('big', repeat('x', 200))
));
INSERT INTO sched VALUES ('sy', orch8.create_schedule('ts', 'sy', 'job', '* * * * *'));
SELECT set_config('orch8.max_context_bytes', '100', true);
SELECT cmp_ok(pg_temp.fire('2030-01-02 06:01:00+00'), '>=', 2, 'a pass with a refused fire');
SELECT is(
    (
        SELECT row(outcome, fire_at, error LIKE 'O8008: instance context is % bytes%')::text
        FROM fired
        WHERE schedule_id = pg_temp.sid('sx')
    ),
    row('failed', '2030-01-02 06:01Z'::timestamptz, true)::text,
    'the refused fire is failed, with the error'
);
SELECT is(
    pg_temp.outcomes('sy', '2030-01-02 06:01Z'), 'started@06:01',
    'the other schedule in the same pass started'
);
SELECT is(
    (
        SELECT next_fire_at FROM orch8.schedules
        WHERE id = pg_temp.sid('sx')
    ),
    '2030-01-02 06:02Z', 'the failed schedule moved on to its next fire time'
);
SELECT set_config('orch8.max_context_bytes', '', true);

-- a crash after the instance was created but before the schedule advanced (say, a fire
-- made by hand in another transaction): the key hands back that instance, no second one
SELECT set_config('orch8.fake_now', '2030-01-02 06:01:30+00', true);
INSERT INTO sched VALUES ('sk', orch8.create_schedule('ts', 'sk', 'job', '* * * * *'));
CREATE TEMP TABLE early AS
SELECT c.id FROM orch8.create_instance(
    'ts', (
        SELECT q.id FROM orch8.sequences AS q
        WHERE q.tenant_id = 'ts' AND q.name = 'job'
    ),
    p_idempotency_key => orch8.schedule_fire_key(pg_temp.sid('sk'), '2030-01-02 06:02Z')
) AS c;
SELECT cmp_ok(pg_temp.fire('2030-01-02 06:02:05+00'), '>=', 1, 'the fire at 06:02 ...');
SELECT is(
    (
        SELECT f.instance_id FROM fired AS f
        WHERE f.schedule_id = pg_temp.sid('sk')
    ),
    (SELECT e.id FROM early AS e), '... is the instance its key already named'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.task_instances
        WHERE idempotency_key LIKE 'orch8:schedule:' || pg_temp.sid('sk') || ':%'
    ),
    1, 'one instance for that fire time'
);

-- buffer_one on the last fire before ends_at: nothing is buffered for an ended schedule
SELECT set_config('orch8.fake_now', '2030-01-02 06:02:10+00', true);
INSERT INTO sched VALUES ('sl', orch8.create_schedule(
    'ts', 'sl', 'job', '*/5 * * * *', p_overlap_policy => 'buffer_one',
    p_ends_at => '2030-01-02 06:12Z'
));
SELECT cmp_ok(pg_temp.fire('2030-01-02 06:05:00+00'), '>=', 1, 'sl starts at 06:05');
SELECT cmp_ok(pg_temp.fire('2030-01-02 06:10:00+00'), '>=', 1, 'at 06:10, its last fire ...');
SELECT is(
    (
        SELECT row(s.state, s.buffered_fire_at, f.outcome)::text
        FROM orch8.schedules AS s
        INNER JOIN fired AS f ON s.id = f.schedule_id AND f.fire_at = '2030-01-02 06:10Z'
        WHERE s.id = pg_temp.sid('sl')
    ),
    row('ended', NULL::timestamptz, 'skipped_overlap')::text,
    '... is skipped, not buffered: the schedule ended'
);

-- 6. History stays -------------------------------------------------------------------------

SELECT is(orch8.end_schedule('ts', pg_temp.sid('s5'), 'tap'), 'ended', 'end s5');
SELECT is(orch8.end_schedule('ts', pg_temp.sid('s5'), 'tap'), 'unchanged', 'end twice');
SELECT ok(
    (SELECT orch8.create_schedule('ts', 's5', 'job', '*/5 * * * *') IS NOT NULL),
    'an ended schedule''s name is free again'
);
SELECT throws_ok(
    'UPDATE orch8.schedule_fires SET outcome = ''missed''', 'O8004', NULL,
    'fires are never rewritten'
);
SELECT throws_ok('DELETE FROM orch8.schedule_fires', 'O8004', NULL, 'nor deleted');
SELECT throws_ok('DELETE FROM orch8.schedules', 'O8004', NULL, 'schedules are never deleted');
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.schedule_fires AS f
        WHERE f.outcome IN ('started', 'cancelled_previous')
    ),
    (
        SELECT count(*)::integer FROM orch8.task_instances AS t
        WHERE t.idempotency_key LIKE 'orch8:schedule:%'
    ),
    'one instance per started fire'
);

SELECT * FROM finish();
ROLLBACK;
