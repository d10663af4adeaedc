-- Repeatable: cron arithmetic, schedules and their firing (docs/ARCHITECTURE.md,
-- "Schedules (issue 12)").
--   active -> paused        (pause_schedule)
--   paused -> active        (resume_schedule: next fire recomputed from now, no catch-up)
--   active | paused -> ended  (end_schedule, or fire_due_schedules past ends_at)
-- Every fire time considered is a row of orch8.schedule_fires (fire_due_schedules).

-- Cron -----------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.cron_field(
    p_field text,
    p_what text,
    p_lo integer,
    p_hi integer,
    p_names text[] DEFAULT '{}',
    p_name_base integer DEFAULT 0,
    OUT field_values integer[],
    OUT problems text[]
)
LANGUAGE plpgsql
IMMUTABLE
AS $$
DECLARE
    v_item text;
    v_range text;
    v_parts text[];
    v_step integer;
    v_from integer;
    v_to integer;
    v_bad text;
    v_vals integer[] := '{}'::integer[];
BEGIN
    problems := '{}';
    IF p_field IS NULL OR p_field = '' THEN
        problems := ARRAY[format('%s: empty', p_what)];
        RETURN;
    END IF;
    FOREACH v_item IN ARRAY string_to_array(p_field, ',') LOOP
        v_step := 1;
        v_range := v_item;
        IF position('/' IN v_item) > 0 THEN
            v_parts := string_to_array(v_item, '/');
            IF cardinality(v_parts) <> 2 OR v_parts[2] !~ '^[0-9]{1,3}$'
               OR v_parts[2]::integer = 0 THEN
                problems := problems || format('%s: %s: a step is /n with n from 1 to 999',
                                               p_what, quote_literal(v_item));
                CONTINUE;
            END IF;
            v_step := v_parts[2]::integer;
            v_range := v_parts[1];
        END IF;
        v_parts := CASE WHEN v_range = '*' THEN ARRAY[p_lo::text, p_hi::text]
                        ELSE string_to_array(v_range, '-') END;
        IF cardinality(v_parts) NOT IN (1, 2) OR '' = ANY (v_parts) THEN
            problems := problems || format('%s: %s is not a number, a name, a range or *',
                                           p_what, quote_literal(v_item));
            CONTINUE;
        END IF;
        v_bad := NULL;
        FOR i IN 1 .. cardinality(v_parts) LOOP
            IF v_parts[i] ~ '^[0-9]{1,3}$' THEN
                v_parts[i] := v_parts[i]::integer::text;
            ELSIF upper(v_parts[i]) = ANY (p_names) THEN
                v_parts[i] := (array_position(p_names, upper(v_parts[i])) - 1 + p_name_base)::text;
            ELSE
                v_bad := v_parts[i];
            END IF;
        END LOOP;
        IF v_bad IS NOT NULL THEN
            problems := problems || format('%s: %s is not a number%s', p_what,
                                           quote_literal(v_bad),
                                           CASE WHEN cardinality(p_names) > 0
                                                THEN ' or a name (' || p_names[1] || '...'
                                                     || p_names[cardinality(p_names)] || ')'
                                                ELSE '' END);
            CONTINUE;
        END IF;
        v_from := v_parts[1]::integer;
        -- a/n runs from a to the end of the field, as in Vixie cron
        v_to := CASE WHEN cardinality(v_parts) = 2 THEN v_parts[2]::integer
                     WHEN v_step > 1 OR position('/' IN v_item) > 0 THEN p_hi
                     ELSE v_from END;
        IF v_from NOT BETWEEN p_lo AND p_hi OR v_to NOT BETWEEN p_lo AND p_hi THEN
            problems := problems || format('%s: %s is out of range %s-%s', p_what,
                                           quote_literal(v_item), p_lo, p_hi);
            CONTINUE;
        END IF;
        IF v_from > v_to THEN
            problems := problems || format('%s: %s is a range from high to low', p_what,
                                           quote_literal(v_item));
            CONTINUE;
        END IF;
        v_vals := v_vals || ARRAY(SELECT generate_series(v_from, v_to, v_step));
    END LOOP;
    IF cardinality(problems) = 0 THEN
        field_values := ARRAY(SELECT DISTINCT v FROM unnest(v_vals) AS u (v) ORDER BY v);
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.cron_field(text, text, integer, integer, text[], integer) IS
'One field of a cron expression: its values (sorted, distinct) when valid, else NULL and '
'one problem per bad list item. *, n, a-b, */n, a-b/n, a/n (a to the end), lists; names '
'(p_names, case-insensitive) stand for p_name_base, p_name_base + 1, ...';

CREATE OR REPLACE FUNCTION orch8.cron_parse(p_expr text)
RETURNS orch8.cron_spec
LANGUAGE plpgsql
IMMUTABLE
AS $$
DECLARE
    v_fields text[];
    v_f record;
    v_days_in_month CONSTANT integer[] := ARRAY[31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    spec orch8.cron_spec;
    problems text[] := '{}'::text[];
BEGIN
    IF p_expr IS NULL OR btrim(p_expr) = '' THEN
        spec.problems := ARRAY['a cron expression is needed: minute hour day-of-month month '
                               'day-of-week'];
        RETURN spec;
    END IF;
    IF char_length(p_expr) > 200 THEN
        spec.problems := ARRAY[format('a cron expression is at most 200 characters, not %s',
                                      char_length(p_expr))];
        RETURN spec;
    END IF;
    v_fields := regexp_split_to_array(btrim(p_expr), '\s+');
    IF cardinality(v_fields) <> 5 THEN
        spec.problems := ARRAY[format('a cron expression has 5 fields (minute hour '
                                      'day-of-month month day-of-week), not %s',
                                      cardinality(v_fields))];
        RETURN spec;
    END IF;
    spec.days_star := left(v_fields[3], 1) = '*';
    spec.weekdays_star := left(v_fields[5], 1) = '*';
    v_f := orch8.cron_field(v_fields[1], 'minute', 0, 59);
    spec.minutes := v_f.field_values;
    problems := problems || v_f.problems;
    v_f := orch8.cron_field(v_fields[2], 'hour', 0, 23);
    spec.hours := v_f.field_values;
    problems := problems || v_f.problems;
    v_f := orch8.cron_field(v_fields[3], 'day-of-month', 1, 31);
    spec.days := v_f.field_values;
    problems := problems || v_f.problems;
    v_f := orch8.cron_field(v_fields[4], 'month', 1, 12,
        ARRAY['JAN', 'FEB', 'MAR', 'APR', 'MAY', 'JUN', 'JUL', 'AUG', 'SEP', 'OCT', 'NOV', 'DEC'],
        1);
    spec.months := v_f.field_values;
    problems := problems || v_f.problems;
    v_f := orch8.cron_field(v_fields[5], 'day-of-week', 0, 7,
        ARRAY['SUN', 'MON', 'TUE', 'WED', 'THU', 'FRI', 'SAT'], 0);
    -- 7 is Sunday too
    spec.weekdays := ARRAY(SELECT DISTINCT v % 7 FROM unnest(v_f.field_values) AS u (v) ORDER BY 1);
    problems := problems || v_f.problems;
    IF cardinality(problems) > 0 THEN
        RETURN ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, problems)::orch8.cron_spec;
    END IF;
    -- Only the day of month decides (the day of week is *): some month must have that day.
    IF NOT spec.days_star AND spec.weekdays_star AND NOT EXISTS (
        SELECT 1 FROM unnest(spec.months) AS m (month), unnest(spec.days) AS d (day)
        WHERE d.day <= v_days_in_month[m.month]
    ) THEN
        RETURN ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                   ARRAY[format('no date matches: day-of-month %s never falls in month %s',
                                v_fields[3], v_fields[4])])::orch8.cron_spec;
    END IF;
    spec.problems := problems;
    RETURN spec;
END
$$;

COMMENT ON FUNCTION orch8.cron_parse(text) IS
'A cron expression parsed (orch8.cron_spec), or only its problems (every one). 5 fields: minute '
'0-59, hour 0-23, day of month 1-31, month 1-12 or JAN-DEC, day of week 0-7 or SUN-SAT '
'(0 and 7 are Sunday); names in any case. An expression no date can match (0 0 30 2 *) '
'is a problem; Feb 29 is not.';

CREATE OR REPLACE FUNCTION orch8.cron_problems(p_expr text)
RETURNS text[]
LANGUAGE sql
IMMUTABLE
AS $$ SELECT (orch8.cron_parse(p_expr)).problems $$;

COMMENT ON FUNCTION orch8.cron_problems(text) IS
'Every problem of a cron expression, one message each; empty when it is valid '
'(orch8.cron_parse says what is valid).';

CREATE OR REPLACE FUNCTION orch8.tz_offset(p_at timestamptz, p_tz text)
RETURNS interval
LANGUAGE sql
STABLE
AS $$ SELECT (p_at AT TIME ZONE p_tz) - (p_at AT TIME ZONE 'UTC') $$;

COMMENT ON FUNCTION orch8.tz_offset(timestamptz, text) IS
'The UTC offset of the time zone at that instant (wall time minus UTC).';

CREATE OR REPLACE FUNCTION orch8.wall_instant(p_wall timestamp, p_tz text)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
AS $$
DECLARE
    -- PostgreSQL reads a wall time in a gap with the offset before the transition, and a
    -- repeated one as its later (standard time) occurrence
    v_at timestamptz := p_wall AT TIME ZONE p_tz;
    v_before interval;
    v_earlier timestamptz;
    v_lo timestamptz;
    v_hi timestamptz;
    v_mid timestamptz;
BEGIN
    IF (v_at AT TIME ZONE p_tz) = p_wall THEN
        -- the wall time exists; when it occurs twice (fall-back), the first occurrence
        v_before := orch8.tz_offset(v_at - interval '3 hours', p_tz);
        IF v_before <> orch8.tz_offset(v_at, p_tz) THEN
            v_earlier := (p_wall - v_before) AT TIME ZONE 'UTC';
            IF v_earlier < v_at AND (v_earlier AT TIME ZONE p_tz) = p_wall THEN
                RETURN v_earlier;
            END IF;
        END IF;
        RETURN v_at;
    END IF;
    -- in a gap (spring-forward): the first instant whose wall time is at or after it.
    -- v_lo (read with the offset after the transition) is before the gap, v_at after it.
    v_lo := (p_wall - orch8.tz_offset(v_at, p_tz)) AT TIME ZONE 'UTC';
    v_hi := v_at;
    WHILE v_hi - v_lo > interval '1 second' LOOP
        v_mid := v_lo + date_trunc('second', (v_hi - v_lo) / 2);
        IF (v_mid AT TIME ZONE p_tz) >= p_wall THEN
            v_hi := v_mid;
        ELSE
            v_lo := v_mid;
        END IF;
    END LOOP;
    RETURN v_hi;
END
$$;

COMMENT ON FUNCTION orch8.wall_instant(timestamp, text) IS
'The instant a wall time of the zone fires at: itself; when it occurs twice (fall-back), '
'its first occurrence; when it does not exist (the spring-forward gap), the first instant '
'after the gap. PostgreSQL''s timestamp AT TIME ZONE answers the later occurrence and, '
'for a gap, the offset before the transition (02:30 -> 03:30); this corrects both.';

CREATE OR REPLACE FUNCTION orch8.cron_next(p_spec orch8.cron_spec, p_tz text, p_after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
AS $$
DECLARE
    v_local timestamp := p_after AT TIME ZONE p_tz;
    v_floor timestamp;
    v_day date;
    v_last date;
    v_wall timestamp;
    v_at timestamptz;
    v_hour integer;
    v_minute integer;
    v_day_ok boolean;
BEGIN
    IF p_spec.minutes IS NULL OR p_tz IS NULL OR p_after IS NULL THEN
        RETURN NULL;
    END IF;
    -- A wall time before the local time of p_after can still fire after it only when the
    -- clocks went back in the last hours (its first occurrence is taken): look back then.
    v_floor := CASE WHEN orch8.tz_offset(p_after - interval '3 hours', p_tz)
                         = orch8.tz_offset(p_after, p_tz)
                    THEN date_trunc('minute', v_local)
                    ELSE date_trunc('minute', v_local) - interval '3 hours' END;
    v_day := v_floor::date;
    v_last := (v_local + interval '41 years')::date;
    WHILE v_day <= v_last LOOP
        IF NOT extract(MONTH FROM v_day)::integer = ANY (p_spec.months) THEN
            v_day := (date_trunc('month', v_day::timestamp) + interval '1 month')::date;
            CONTINUE;
        END IF;
        v_day_ok := CASE
            WHEN p_spec.days_star OR p_spec.weekdays_star THEN
                extract(DAY FROM v_day)::integer = ANY (p_spec.days)
                AND extract(DOW FROM v_day)::integer = ANY (p_spec.weekdays)
            ELSE
                extract(DAY FROM v_day)::integer = ANY (p_spec.days)
                OR extract(DOW FROM v_day)::integer = ANY (p_spec.weekdays)
        END;
        IF v_day_ok THEN
            FOREACH v_hour IN ARRAY p_spec.hours LOOP
                CONTINUE WHEN v_day + make_interval(hours => v_hour, mins => 59) < v_floor;
                FOREACH v_minute IN ARRAY p_spec.minutes LOOP
                    v_wall := v_day + make_interval(hours => v_hour, mins => v_minute);
                    CONTINUE WHEN v_wall < v_floor;
                    v_at := orch8.wall_instant(v_wall, p_tz);
                    IF v_at > p_after THEN
                        RETURN v_at;
                    END IF;
                END LOOP;
            END LOOP;
        END IF;
        v_day := v_day + 1;
    END LOOP;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.cron_next(orch8.cron_spec, text, timestamptz) IS
'The first fire time of a parsed cron expression strictly after p_after, in the wall time '
'of the zone p_tz (orch8.wall_instant: a time in the spring-forward gap fires at the '
'first instant after it, a repeated time at its first occurrence). Walks local days '
'(skipping months that do not match), then hours and minutes. NULL when none in 41 years.';

CREATE OR REPLACE FUNCTION orch8.cron_next(p_expr text, p_tz text, p_after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
AS $$
DECLARE
    v_parsed orch8.cron_spec := orch8.cron_parse(p_expr);
BEGIN
    IF cardinality(v_parsed.problems) > 0 THEN
        RAISE EXCEPTION 'invalid cron expression %: %', quote_literal(p_expr),
            array_to_string(v_parsed.problems, '; ')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'cron', 'problems', (
                      SELECT json_agg(json_build_object('path', 'cron', 'message', u.p))
                      FROM unnest(v_parsed.problems) AS u (p)))::text;
    END IF;
    BEGIN
        -- cheap (pg_timezone_names reads every zone file): any zone PostgreSQL knows
        PERFORM p_after AT TIME ZONE p_tz;
    EXCEPTION WHEN invalid_parameter_value THEN
        RAISE EXCEPTION 'unknown time zone %', coalesce(quote_literal(p_tz), 'NULL')
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'timezone')::text,
                  HINT = 'an IANA name such as UTC or Europe/Berlin (pg_timezone_names)';
    END;
    RETURN orch8.cron_next(v_parsed, p_tz, p_after);
END
$$;

COMMENT ON FUNCTION orch8.cron_next(text, text, timestamptz) IS
'The first fire time of a cron expression strictly after p_after in the time zone p_tz '
'(see cron_next(cron_spec, ...)). An invalid expression (DETAIL {field: cron, problems: '
'[{path, message}]}) '
'or a zone PostgreSQL does not know (DETAIL {field: timezone}): O8008. create_schedule '
'is stricter: a name of pg_timezone_names.';

CREATE OR REPLACE FUNCTION orch8.cron_latest(
    p_spec orch8.cron_spec, p_tz text, p_from timestamptz, p_upto timestamptz
)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
AS $$
DECLARE
    v_window interval;
    v_start timestamptz;
    v_at timestamptz;
    v_next timestamptz;
BEGIN
    -- look back in growing windows, so that a long outage costs a few steps, not one per
    -- fire time missed
    FOREACH v_window IN ARRAY ARRAY['1 hour', '4 hours', '1 day', '7 days', '32 days',
                                    '1 year', '41 years']::interval[] LOOP
        v_start := greatest(p_from, p_upto - v_window);
        v_at := orch8.cron_next(p_spec, p_tz, v_start - interval '1 microsecond');
        IF v_at <= p_upto THEN
            LOOP
                v_next := orch8.cron_next(p_spec, p_tz, v_at);
                EXIT WHEN v_next IS NULL OR v_next > p_upto;
                v_at := v_next;
            END LOOP;
            RETURN v_at;
        END IF;
        EXIT WHEN v_start = p_from;
    END LOOP;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.cron_latest(orch8.cron_spec, text, timestamptz, timestamptz) IS
'The last fire time from p_from to p_upto (both included), or NULL: the fire time a '
'catch-up starts.';

-- Schedules ------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.schedule_first_fire(
    p_spec orch8.cron_spec, p_tz text, p_now timestamptz, p_starts_at timestamptz,
    p_ends_at timestamptz
)
RETURNS timestamptz
LANGUAGE sql
STABLE
AS $$
    SELECT CASE WHEN n.at < p_ends_at OR p_ends_at IS NULL THEN n.at END
    FROM (
        SELECT orch8.cron_next(
            p_spec, p_tz,
            CASE WHEN p_starts_at > p_now THEN p_starts_at - interval '1 microsecond'
                 ELSE p_now END) AS at
    ) AS n
$$;

COMMENT ON FUNCTION orch8.schedule_first_fire(
    orch8.cron_spec, text, timestamptz, timestamptz, timestamptz
) IS
'The next fire time of a schedule counted from now: after now and at or after starts_at, '
'NULL when none is before ends_at.';

CREATE OR REPLACE FUNCTION orch8.create_schedule(
    p_tenant_id text,
    p_name text,
    p_sequence_name text,
    p_cron text,
    p_timezone text DEFAULT 'UTC',
    p_namespace text DEFAULT 'default',
    p_data jsonb DEFAULT '{}',
    p_priority integer DEFAULT 0,
    p_overlap_policy text DEFAULT 'skip',
    p_starts_at timestamptz DEFAULT NULL,
    p_ends_at timestamptz DEFAULT NULL,
    p_actor text DEFAULT NULL
)
RETURNS uuid
LANGUAGE plpgsql
AS $$
DECLARE
    v_parsed orch8.cron_spec;
    v_next timestamptz;
    v_actor text;
    v_id uuid;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);  -- the web role acts in its sealed tenant
    PERFORM orch8.require_domain(p_name, 'orch8.identifier', 'name');
    PERFORM orch8.require_domain(p_namespace, 'orch8.identifier', 'namespace');
    PERFORM orch8.require_domain(p_sequence_name, 'orch8.sequence_name', 'sequence_name');
    PERFORM orch8.require_size('actor', 'actor_chars', char_length(p_actor));
    v_parsed := orch8.cron_parse(p_cron);
    IF cardinality(v_parsed.problems) > 0 THEN
        RAISE EXCEPTION 'invalid cron expression %: %', coalesce(quote_literal(p_cron), 'NULL'),
            array_to_string(v_parsed.problems, '; ')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'cron', 'problems', (
                      SELECT json_agg(json_build_object('path', 'cron', 'message', u.p))
                      FROM unnest(v_parsed.problems) AS u (p)))::text;
    END IF;
    IF p_timezone IS NULL
       OR NOT EXISTS (SELECT 1 FROM pg_timezone_names AS z WHERE z.name = p_timezone) THEN
        RAISE EXCEPTION 'unknown time zone %', coalesce(quote_literal(p_timezone), 'NULL')
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'timezone')::text,
                  HINT = 'an IANA name such as UTC or Europe/Berlin (pg_timezone_names)';
    END IF;
    IF p_overlap_policy IS NULL OR NOT p_overlap_policy = ANY (orch8.schedule_overlap_policies())
    THEN
        RAISE EXCEPTION 'unknown overlap policy %', coalesce(quote_literal(p_overlap_policy), 'NULL')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'overlap_policy',
                                             'allowed', orch8.schedule_overlap_policies())::text;
    END IF;
    IF jsonb_typeof(coalesce(p_data, '{}')) <> 'object' THEN
        RAISE EXCEPTION 'schedule data must be a JSON object'
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'data')::text;
    END IF;
    PERFORM orch8.require_size('data', 'context_bytes', octet_length(coalesce(p_data, '{}')::text));
    IF p_priority IS NULL THEN
        RAISE EXCEPTION 'priority must be an integer'
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'priority')::text;
    END IF;
    IF p_starts_at >= p_ends_at THEN
        RAISE EXCEPTION 'ends_at (%) must be after starts_at (%)', p_ends_at, p_starts_at
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'ends_at')::text;
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM orch8.sequences AS q
        WHERE q.tenant_id = p_tenant_id AND q.namespace = p_namespace AND q.name = p_sequence_name
    ) THEN
        RAISE EXCEPTION 'sequence %/% not found', p_namespace, p_sequence_name
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'sequence_name',
                                             'namespace', p_namespace,
                                             'sequence_name', p_sequence_name)::text,
                  HINT = 'create the sequence first; each fire starts its latest version';
    END IF;
    IF EXISTS (
        SELECT 1 FROM orch8.schedules AS s
        WHERE s.tenant_id = p_tenant_id AND s.name = p_name AND s.state <> 'ended'
    ) THEN
        RAISE EXCEPTION 'a schedule named % exists already', quote_literal(p_name)
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'name')::text,
                  HINT = 'end it first (orch8.end_schedule), or pick another name';
    END IF;
    v_next := orch8.schedule_first_fire(v_parsed, p_timezone, orch8.now(), p_starts_at,
                                        p_ends_at);
    IF v_next IS NULL THEN
        RAISE EXCEPTION 'the schedule would never fire: no fire time before ends_at (%)',
            p_ends_at
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'ends_at')::text;
    END IF;
    v_actor := orch8.attributed_actor(p_actor);
    INSERT INTO orch8.schedules (
        tenant_id, name, sequence_namespace, sequence_name, cron, timezone, data, priority,
        overlap_policy, starts_at, ends_at, next_fire_at, created_by, updated_by
    ) VALUES (
        p_tenant_id, p_name, p_namespace, p_sequence_name, btrim(p_cron), p_timezone,
        coalesce(p_data, '{}'), p_priority, p_overlap_policy, p_starts_at, p_ends_at, v_next,
        v_actor, v_actor
    )
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;

COMMENT ON FUNCTION orch8.create_schedule(
    text, text, text, text, text, text, jsonb, integer, text, timestamptz, timestamptz, text
) IS
'Create an active schedule: each fire time of the cron expression in the time zone starts '
'an instance of the latest version of namespace/sequence_name with data and priority. '
'Returns its id. Bad input (name, cron with every problem, time zone, overlap policy, '
'data, ends_at not after starts_at or before any fire time, an unknown sequence, a name '
'already used by a schedule that has not ended): O8008 with DETAIL {field, ...}.';

CREATE OR REPLACE FUNCTION orch8.lock_schedule(p_tenant_id text, p_id uuid)
RETURNS orch8.schedules
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.schedules;
BEGIN
    SELECT * INTO v_row FROM orch8.schedules AS s
    WHERE s.tenant_id = p_tenant_id AND s.id = p_id
    FOR UPDATE;
    IF NOT found THEN
        RAISE EXCEPTION 'schedule % not found', p_id
            USING ERRCODE = 'O8007', DETAIL = json_build_object('schedule_id', p_id)::text;
    END IF;
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION orch8.lock_schedule(text, uuid) IS
'The schedule, locked FOR UPDATE; O8007 when the tenant has none with that id.';

CREATE OR REPLACE FUNCTION orch8.pause_schedule(
    p_tenant_id text, p_id uuid, p_actor text DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.schedules;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);
    PERFORM orch8.require_size('actor', 'actor_chars', char_length(p_actor));
    v_row := orch8.lock_schedule(p_tenant_id, p_id);
    IF v_row.state = 'paused' THEN
        RETURN 'unchanged';
    END IF;
    IF v_row.state <> 'active' THEN
        RAISE EXCEPTION 'schedule % is %, it cannot be paused', p_id, v_row.state
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('schedule_id', p_id,
                                             'current_state', v_row.state)::text;
    END IF;
    UPDATE orch8.schedules AS s
    SET state = 'paused', next_fire_at = NULL, updated_at = orch8.now(),
        updated_by = orch8.attributed_actor(p_actor)
    WHERE s.tenant_id = p_tenant_id AND s.id = p_id AND s.state = 'active';
    RETURN 'paused';
END
$$;

COMMENT ON FUNCTION orch8.pause_schedule(text, uuid, text) IS
'Pause an active schedule: no fire until it is resumed (a buffered fire is kept). '
'Answers paused, or unchanged when it was paused. Ended: O8004 {schedule_id, '
'current_state}; unknown id: O8007.';

CREATE OR REPLACE FUNCTION orch8.resume_schedule(
    p_tenant_id text, p_id uuid, p_actor text DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.schedules;
    v_next timestamptz;
    v_now timestamptz := orch8.now();
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);
    PERFORM orch8.require_size('actor', 'actor_chars', char_length(p_actor));
    v_row := orch8.lock_schedule(p_tenant_id, p_id);
    IF v_row.state = 'active' THEN
        RETURN 'unchanged';
    END IF;
    IF v_row.state <> 'paused' THEN
        RAISE EXCEPTION 'schedule % is %, not paused', p_id, v_row.state
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('schedule_id', p_id,
                                             'current_state', v_row.state)::text;
    END IF;
    -- from now: the fire times of the paused period are not caught up
    v_next := orch8.schedule_first_fire(orch8.cron_parse(v_row.cron), v_row.timezone,
                                        v_now, v_row.starts_at, v_row.ends_at);
    UPDATE orch8.schedules AS s
    SET state = CASE WHEN v_next IS NULL THEN 'ended' ELSE 'active' END,
        next_fire_at = v_next,
        ended_at = CASE WHEN v_next IS NULL THEN v_now END,
        updated_at = v_now,
        updated_by = orch8.attributed_actor(p_actor)
    WHERE s.tenant_id = p_tenant_id AND s.id = p_id AND s.state = 'paused';
    RETURN CASE WHEN v_next IS NULL THEN 'ended' ELSE 'active' END;
END
$$;

COMMENT ON FUNCTION orch8.resume_schedule(text, uuid, text) IS
'Resume a paused schedule: its next fire time is computed from now (the paused period is '
'not caught up). Answers active, ended (no fire time is left before ends_at) or unchanged '
'when it was active. Ended: O8004 {schedule_id, current_state}; unknown id: O8007.';

CREATE OR REPLACE FUNCTION orch8.end_schedule(
    p_tenant_id text, p_id uuid, p_actor text DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.schedules;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);
    PERFORM orch8.require_size('actor', 'actor_chars', char_length(p_actor));
    v_row := orch8.lock_schedule(p_tenant_id, p_id);
    IF v_row.state = 'ended' THEN
        RETURN 'unchanged';
    END IF;
    UPDATE orch8.schedules AS s
    SET state = 'ended', next_fire_at = NULL, buffered_fire_at = NULL,
        ended_at = orch8.now(), updated_at = orch8.now(),
        updated_by = orch8.attributed_actor(p_actor)
    WHERE s.tenant_id = p_tenant_id AND s.id = p_id AND s.state = v_row.state;
    RETURN 'ended';
END
$$;

COMMENT ON FUNCTION orch8.end_schedule(text, uuid, text) IS
'End a schedule for good (what DELETE means): no more fires, a buffered fire is dropped, '
'its name is free again; the row and its fires stay. Answers ended, or unchanged when '
'it had ended. Unknown id: O8007.';

-- Firing ---------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.schedule_fire_key(p_schedule_id uuid, p_fire_at timestamptz)
RETURNS text
LANGUAGE sql
IMMUTABLE
AS $$
    SELECT 'orch8:schedule:' || p_schedule_id::text || ':'
           || to_char(p_fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
$$;

COMMENT ON FUNCTION orch8.schedule_fire_key(uuid, timestamptz) IS
'The idempotency key of the instance a schedule starts for a fire time: '
'orch8:schedule:<schedule id>:<fire time in UTC, YYYY-MM-DDTHH:MI:SSZ>.';

CREATE OR REPLACE FUNCTION orch8.schedule_start(p_row orch8.schedules, p_fire_at timestamptz)
RETURNS uuid
LANGUAGE plpgsql
AS $$
DECLARE
    v_seq uuid;
BEGIN
    SELECT q.id INTO v_seq FROM orch8.sequences AS q
    WHERE q.tenant_id = p_row.tenant_id AND q.namespace = p_row.sequence_namespace
      AND q.name = p_row.sequence_name
    ORDER BY q.version DESC LIMIT 1;
    RETURN (
        SELECT c.id FROM orch8.create_instance(
            p_tenant_id => p_row.tenant_id,
            p_sequence_id => v_seq,
            p_data => p_row.data,
            p_priority => p_row.priority,
            p_idempotency_key => orch8.schedule_fire_key(p_row.id, p_fire_at)
        ) AS c
    );
END
$$;

COMMENT ON FUNCTION orch8.schedule_start(orch8.schedules, timestamptz) IS
'Private: the instance a schedule starts for a fire time (the latest version of its '
'sequence, its data and priority, the idempotency key schedule_fire_key: a repeat '
'returns the same instance).';

CREATE OR REPLACE FUNCTION orch8.schedule_fire(
    p_row orch8.schedules, p_now timestamptz, p_actor text
)
RETURNS SETOF orch8.schedule_fires
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.schedules := p_row;
    v_spec orch8.cron_spec := orch8.cron_parse(p_row.cron);
    v_ended boolean;
    v_instance uuid;
    v_fire timestamptz;
    v_next timestamptz;
    v_at timestamptz;
    v_count integer := 0;
    v_outcome text;
    v_last boolean;
BEGIN
    v_ended := v_row.last_instance_id IS NULL OR coalesce((
        SELECT t.state IN ('completed', 'failed', 'cancelled') FROM orch8.task_instances AS t
        WHERE t.tenant_id = v_row.tenant_id AND t.id = v_row.last_instance_id), true);
    -- 1. a buffered fire whose previous instance has ended starts now
    IF v_row.buffered_fire_at IS NOT NULL AND v_ended THEN
        UPDATE orch8.schedules AS s SET buffered_fire_at = NULL
        WHERE s.tenant_id = v_row.tenant_id AND s.id = v_row.id
          AND s.buffered_fire_at = v_row.buffered_fire_at;
        IF found THEN
            v_instance := orch8.schedule_start(v_row, v_row.buffered_fire_at);
            UPDATE orch8.schedules AS s
            SET last_instance_id = v_instance, last_fire_at = v_row.buffered_fire_at,
                updated_at = p_now, updated_by = p_actor
            WHERE s.tenant_id = v_row.tenant_id AND s.id = v_row.id;
            RETURN QUERY
            INSERT INTO orch8.schedule_fires AS f (
                tenant_id, schedule_id, fire_at, outcome, instance_id, actor
            ) VALUES (
                v_row.tenant_id, v_row.id, v_row.buffered_fire_at, 'started', v_instance, p_actor
            )
            ON CONFLICT DO NOTHING
            RETURNING f.*;
            v_row.last_instance_id := v_instance;
            v_row.buffered_fire_at := NULL;
            v_ended := false;
        END IF;
    END IF;
    IF v_row.next_fire_at IS NULL OR v_row.next_fire_at > p_now THEN
        RETURN;
    END IF;
    -- 2. the latest due fire time fires; earlier due ones were missed (catch-up rule)
    v_fire := orch8.cron_latest(
        v_spec, v_row.timezone, v_row.next_fire_at,
        CASE WHEN v_row.ends_at <= p_now THEN v_row.ends_at - interval '1 microsecond'
             ELSE p_now END);
    v_fire := coalesce(v_fire, v_row.next_fire_at);
    v_next := orch8.cron_next(v_spec, v_row.timezone, v_fire);
    IF v_next >= v_row.ends_at THEN
        v_next := NULL;
    END IF;
    -- the CAS on the expected next fire: a lost one fires nothing and is not retried
    UPDATE orch8.schedules AS s
    SET next_fire_at = v_next,
        state = CASE WHEN v_next IS NULL THEN 'ended' ELSE 'active' END,
        ended_at = CASE WHEN v_next IS NULL THEN p_now END,
        buffered_fire_at = CASE WHEN v_next IS NULL THEN NULL ELSE s.buffered_fire_at END,
        updated_at = p_now,
        updated_by = p_actor
    WHERE s.tenant_id = v_row.tenant_id AND s.id = v_row.id AND s.state = 'active'
      AND s.next_fire_at = v_row.next_fire_at;
    IF NOT found THEN
        RETURN;
    END IF;
    v_last := v_next IS NULL;  -- this fire ended the schedule
    IF v_fire > v_row.next_fire_at THEN
        v_at := v_row.next_fire_at;
        WHILE v_at < v_fire AND v_count < 1000 LOOP
            v_count := v_count + 1;
            v_next := v_at;
            v_at := orch8.cron_next(v_spec, v_row.timezone, v_at);
        END LOOP;
        IF v_at < v_fire THEN  -- more than we count: the last one missed, found directly
            v_next := orch8.cron_latest(v_spec, v_row.timezone, v_row.next_fire_at,
                                        v_fire - interval '1 microsecond');
        END IF;
        RETURN QUERY
        INSERT INTO orch8.schedule_fires AS f (
            tenant_id, schedule_id, fire_at, outcome, missed_count, missed_from,
            count_capped, actor
        ) VALUES (
            v_row.tenant_id, v_row.id, v_next, 'missed', v_count, v_row.next_fire_at,
            v_at < v_fire, p_actor
        )
        RETURNING f.*;
    END IF;
    -- 3. the overlap policy, against the last instance started
    v_outcome := CASE
        WHEN v_ended OR v_row.overlap_policy = 'allow' THEN 'started'
        WHEN v_row.overlap_policy = 'cancel_previous' THEN 'cancelled_previous'
        -- nothing is buffered for a schedule that this fire ended: it would never start
        WHEN v_row.overlap_policy = 'buffer_one' AND v_row.buffered_fire_at IS NULL
             AND NOT v_last THEN 'buffered'
        ELSE 'skipped_overlap'
    END;
    IF v_outcome = 'buffered' THEN
        UPDATE orch8.schedules AS s SET buffered_fire_at = v_fire
        WHERE s.tenant_id = v_row.tenant_id AND s.id = v_row.id AND s.state = 'active';
    END IF;
    IF v_outcome = 'cancelled_previous' THEN
        PERFORM orch8.cancel_instance(
            v_row.tenant_id, v_row.last_instance_id, p_actor,
            format('schedule %s fired at %s (overlap_policy cancel_previous)', v_row.name, v_fire));
    END IF;
    v_instance := NULL;
    IF v_outcome IN ('started', 'cancelled_previous') THEN
        v_instance := orch8.schedule_start(v_row, v_fire);
        UPDATE orch8.schedules AS s
        SET last_instance_id = v_instance, last_fire_at = v_fire
        WHERE s.tenant_id = v_row.tenant_id AND s.id = v_row.id;
    END IF;
    RETURN QUERY
    INSERT INTO orch8.schedule_fires AS f (
        tenant_id, schedule_id, fire_at, outcome, instance_id, previous_instance_id, actor
    ) VALUES (
        v_row.tenant_id, v_row.id, v_fire, v_outcome, v_instance,
        CASE WHEN v_outcome = 'cancelled_previous' THEN v_row.last_instance_id END, p_actor
    )
    ON CONFLICT DO NOTHING
    RETURNING f.*;
END
$$;

COMMENT ON FUNCTION orch8.schedule_fire(orch8.schedules, timestamptz, text) IS
'Private (fire_due_schedules, under the schedule''s row lock): start a buffered fire whose '
'previous instance ended; then, when due, advance next_fire_at by CAS, record the missed '
'fire times (one row) and apply the overlap policy to the latest due one. Returns the '
'fires recorded.';

CREATE OR REPLACE FUNCTION orch8.schedule_fire_failed(
    p_row orch8.schedules, p_now timestamptz, p_actor text, p_error text
)
RETURNS SETOF orch8.schedule_fires
LANGUAGE plpgsql
AS $$
DECLARE
    v_spec orch8.cron_spec := orch8.cron_parse(p_row.cron);
    v_fire timestamptz;
    v_next timestamptz;
BEGIN
    IF p_row.next_fire_at IS NULL OR p_row.next_fire_at > p_now THEN
        -- a buffered fire failed: it is dropped, the schedule goes on
        UPDATE orch8.schedules AS s SET buffered_fire_at = NULL
        WHERE s.tenant_id = p_row.tenant_id AND s.id = p_row.id
          AND s.buffered_fire_at = p_row.buffered_fire_at;
        v_fire := p_row.buffered_fire_at;
    ELSE
        v_fire := coalesce(orch8.cron_latest(
            v_spec, p_row.timezone, p_row.next_fire_at,
            CASE WHEN p_row.ends_at <= p_now THEN p_row.ends_at - interval '1 microsecond'
                 ELSE p_now END), p_row.next_fire_at);
        v_next := orch8.cron_next(v_spec, p_row.timezone, v_fire);
        IF v_next >= p_row.ends_at THEN
            v_next := NULL;
        END IF;
        UPDATE orch8.schedules AS s
        SET next_fire_at = v_next,
            state = CASE WHEN v_next IS NULL THEN 'ended' ELSE 'active' END,
            ended_at = CASE WHEN v_next IS NULL THEN p_now END,
            updated_at = p_now,
            updated_by = p_actor
        WHERE s.tenant_id = p_row.tenant_id AND s.id = p_row.id AND s.state = 'active'
          AND s.next_fire_at = p_row.next_fire_at;
        IF NOT found THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
    INSERT INTO orch8.schedule_fires AS f (
        tenant_id, schedule_id, fire_at, outcome, error, actor
    ) VALUES (
        p_row.tenant_id, p_row.id, v_fire, 'failed',
        left(p_error, orch8.limit_of('error_chars')::integer), p_actor
    )
    RETURNING f.*;
END
$$;

COMMENT ON FUNCTION orch8.schedule_fire_failed(orch8.schedules, timestamptz, text, text) IS
'Private (fire_due_schedules, after schedule_fire raised and was rolled back): record the '
'fire as failed with the error and move past it (the next fire time, or the buffered fire '
'dropped), so one refusal never stops the schedule or blocks the others.';

CREATE OR REPLACE FUNCTION orch8.fire_due_schedules(
    p_limit integer DEFAULT 100, p_actor text DEFAULT 'scheduler'
)
RETURNS SETOF orch8.schedule_fires
LANGUAGE plpgsql
AS $$
DECLARE
    v_now timestamptz := orch8.now();
    v_actor text := coalesce(p_actor, 'scheduler');
    v_row orch8.schedules;
    v_taken integer := 0;
    v_error text;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'fire_due_schedules needs a limit >= 1'
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'limit')::text;
    END IF;
    PERFORM orch8.require_size('actor', 'actor_chars', char_length(p_actor));
    -- the due ones, soonest first (schedules_due_idx), then buffered fires whose previous
    -- instance has ended (schedules_buffered_idx); a schedule locked by another runner is
    -- that runner's
    FOR v_row IN
        SELECT s.* FROM orch8.schedules AS s
        WHERE s.state = 'active' AND s.next_fire_at <= v_now
        ORDER BY s.next_fire_at
        LIMIT p_limit
        FOR UPDATE OF s SKIP LOCKED
    LOOP
        v_taken := v_taken + 1;
        BEGIN
            RETURN QUERY SELECT * FROM orch8.schedule_fire(v_row, v_now, v_actor);
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_error = MESSAGE_TEXT;
            RETURN QUERY SELECT * FROM orch8.schedule_fire_failed(
                v_row, v_now, v_actor, format('%s: %s', sqlstate, v_error));
        END;
    END LOOP;
    IF v_taken >= p_limit THEN
        RETURN;
    END IF;
    FOR v_row IN
        SELECT s.* FROM orch8.schedules AS s
        WHERE s.state = 'active' AND s.buffered_fire_at IS NOT NULL
          AND NOT EXISTS (
              SELECT 1 FROM orch8.task_instances AS t
              WHERE t.tenant_id = s.tenant_id AND t.id = s.last_instance_id
                AND t.state NOT IN ('completed', 'failed', 'cancelled'))
        LIMIT p_limit - v_taken
        FOR UPDATE OF s SKIP LOCKED
    LOOP
        BEGIN
            RETURN QUERY SELECT * FROM orch8.schedule_fire(v_row, v_now, v_actor);
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_error = MESSAGE_TEXT;
            RETURN QUERY SELECT * FROM orch8.schedule_fire_failed(
                v_row, v_now, v_actor, format('%s: %s', sqlstate, v_error));
        END;
    END LOOP;
END
$$;

COMMENT ON FUNCTION orch8.fire_due_schedules(integer, text) IS
'The runner''s tick: up to p_limit active schedules that are due (next_fire_at <= now, '
'then buffered fires whose previous instance ended), across tenants, taken FOR UPDATE SKIP '
'LOCKED (runners never fire one schedule twice), each fired in this transaction '
'(schedule_fire). Several due fire times: the latest starts, the earlier ones are one '
'missed row. A fire the engine refuses is rolled back alone and recorded as failed '
'(schedule_fire_failed). Returns the fires recorded. A limit below 1: O8008.';
