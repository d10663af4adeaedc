-- Repeatable: time, signals and people (docs/ARCHITECTURE.md, "Time, signals and people").
-- A sleep or a wait is a waiting node with a timer (wake_at) that fire_timers fires; a
-- custom signal is consumed by exactly one wait_for_signal node, under the instance's row
-- lock; a person's answer completes a wait_for_input node. Everything here runs under
-- the instance's row lock, like the rest of the tree (tree.sql).

-- Durations ----------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.duration_ms(p_value jsonb)
RETURNS bigint
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
DECLARE
    v_total numeric := 0;
    v_part text [];
BEGIN
    IF jsonb_typeof(p_value) = 'number' THEN
        IF p_value::text !~ '^[0-9]+$' THEN
            RETURN NULL;
        END IF;
        v_total := p_value::text::numeric;
    ELSIF jsonb_typeof(p_value) = 'string'
          AND p_value #>> '{}' ~ '^([0-9]{1,12}(ms|s|m|h|d))+$' THEN
        FOR v_part IN
            SELECT m FROM regexp_matches(p_value #>> '{}', '([0-9]+)(ms|s|m|h|d)', 'g') AS m
        LOOP
            v_total := v_total + v_part[1]::numeric * CASE v_part[2]
                WHEN 'ms' THEN 1 WHEN 's' THEN 1000 WHEN 'm' THEN 60000
                WHEN 'h' THEN 3600000 ELSE 86400000 END;
        END LOOP;
    ELSE
        RETURN NULL;
    END IF;
    IF v_total > orch8.limit_of('wait_ms') THEN
        RETURN NULL;
    END IF;
    RETURN v_total::bigint;
END
$$;

COMMENT ON FUNCTION orch8.duration_ms(jsonb) IS
'A duration of the language in milliseconds: a non-negative integer (milliseconds) or a '
'string of units, 250ms, 30s, 15m, 2h, 3d, 1h30m. NULL when it is anything else or over '
'the limit wait_ms. The validator and the interpreter both read it.';

CREATE OR REPLACE FUNCTION orch8.duration_problem(p_value jsonb, p_field text)
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT format('%s must be a duration: milliseconds (an integer >= 0) or a string such '
                  'as 30s, 15m, 2h, 3d, 1h30m; at most %s days',
                  p_field, orch8.limit_of('wait_ms') / 86400000)
    WHERE orch8.duration_ms(p_value) IS NULL
$$;

COMMENT ON FUNCTION orch8.duration_problem(jsonb, text) IS
'The validator''s message for a field that is not a duration (duration_ms), or NULL.';

CREATE OR REPLACE FUNCTION orch8.after_ms(p_ms bigint)
RETURNS timestamptz
LANGUAGE sql
STABLE
AS $$
    SELECT orch8.now() + p_ms * interval '1 millisecond'
$$;

COMMENT ON FUNCTION orch8.after_ms(bigint) IS
'orch8.now() plus p_ms milliseconds (NULL for NULL): when a sleep, a delay or a timeout '
'that starts now ends.';

-- A step's send window -----------------------------------------------------------------------
-- {"timezone": "Europe/Berlin", "days": ["mon", ...], "start": "09:00", "end": "17:00"}: the
-- step becomes due only between start (included) and end (excluded), local wall time in
-- the zone, on the days listed (all when omitted). Outside, it waits for the next opening.

CREATE OR REPLACE FUNCTION orch8.window_days()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT ARRAY['mon', 'tue', 'wed', 'thu', 'fri', 'sat', 'sun']
$$;

COMMENT ON FUNCTION orch8.window_days() IS
'The day names of a send window, in ISO order (Monday is 1, as extract(isodow)).';

CREATE OR REPLACE FUNCTION orch8.send_window_problems(p_window jsonb, p_path text)
RETURNS TABLE (path text, message text)
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
AS $$
DECLARE
    v_time text := '^([01][0-9]|2[0-3]):[0-5][0-9]$';
    v_start_ok boolean;
    v_end_ok boolean;
BEGIN
    IF jsonb_typeof(p_window) IS DISTINCT FROM 'object' THEN
        RETURN QUERY SELECT p_path,
            'send_window must be an object {timezone, days, start, end}';
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM orch8.sequence_field_problems('send_window', p_window, p_path);
    IF NOT p_window ? 'timezone' THEN
        RETURN QUERY SELECT p_path || '.timezone',
            'timezone is required (a time zone name such as Europe/Berlin)';
    ELSIF jsonb_typeof(p_window -> 'timezone') <> 'string'
          OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_timezone_names AS z
                         WHERE z.name = p_window ->> 'timezone') THEN
        RETURN QUERY SELECT p_path || '.timezone',
            'timezone must be a time zone name (pg_timezone_names), such as Europe/Berlin';
    END IF;
    IF p_window ? 'days' AND (
        jsonb_typeof(p_window -> 'days') <> 'array'
        OR jsonb_array_length(p_window -> 'days') = 0
        OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_window -> 'days') AS d
                   WHERE jsonb_typeof(d.value) <> 'string'
                      OR NOT d.value #>> '{}' = ANY (orch8.window_days()))
        OR (SELECT count(DISTINCT d.value) FROM jsonb_array_elements(p_window -> 'days') AS d)
           <> jsonb_array_length(p_window -> 'days')
    ) THEN
        RETURN QUERY SELECT p_path || '.days',
            'days must be a non-empty array of distinct days: mon, tue, wed, thu, fri, sat, sun';
    END IF;
    v_start_ok := jsonb_typeof(p_window -> 'start') = 'string'
                  AND p_window ->> 'start' ~ v_time;
    v_end_ok := jsonb_typeof(p_window -> 'end') = 'string'
                AND (p_window ->> 'end' ~ v_time OR p_window ->> 'end' = '24:00');
    IF NOT coalesce(v_start_ok, false) THEN
        RETURN QUERY SELECT p_path || '.start', 'start must be a time HH:MM, 00:00 to 23:59';
    END IF;
    IF NOT coalesce(v_end_ok, false) THEN
        RETURN QUERY SELECT p_path || '.end', 'end must be a time HH:MM, 00:01 to 24:00';
    ELSIF coalesce(v_start_ok, false)
          AND (p_window ->> 'start')::time >= (p_window ->> 'end')::time THEN
        RETURN QUERY SELECT p_path || '.end',
            'end must be after start (a window across midnight is not supported)';
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.send_window_problems(jsonb, text) IS
'The validator''s problems of a step''s send_window at p_path, one per field: an object of '
'the language scope send_window; timezone required, a name of pg_timezone_names; days '
'(optional) a non-empty array of distinct window_days(); start HH:MM 00:00-23:59 and end '
'HH:MM up to 24:00, both required, start before end (across midnight is not supported).';

CREATE OR REPLACE FUNCTION orch8.window_open_at(p_window jsonb, p_at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
AS $$
DECLARE
    v_zone text := p_window ->> 'timezone';
    v_days jsonb := p_window -> 'days';
    v_local timestamp;
    v_day date;
    v_open timestamptz;
    v_close timestamptz;
BEGIN
    -- no window, or one the validator would refuse (stored before it was checked): p_at
    IF p_at IS NULL OR jsonb_typeof(p_window) IS DISTINCT FROM 'object' OR v_zone IS NULL
       OR coalesce(p_window ->> 'start', '') !~ '^([01][0-9]|2[0-3]):[0-5][0-9]$'
       OR coalesce(p_window ->> 'end', '') !~ '^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$'
       OR (p_window ->> 'start')::time >= (p_window ->> 'end')::time THEN
        RETURN p_at;
    END IF;
    BEGIN
        v_local := p_at AT TIME ZONE v_zone;
    EXCEPTION WHEN invalid_parameter_value THEN  -- an unknown zone
        RETURN p_at;
    END;
    -- today's window if p_at is before its end, else the next day of the window's
    FOR v_i IN 0 .. 7 LOOP
        v_day := v_local::date + v_i;
        CONTINUE WHEN jsonb_typeof(v_days) = 'array'
            AND NOT v_days ? (orch8.window_days())[extract(isodow FROM v_day)::integer];
        v_open := orch8.wall_instant(v_day + (p_window ->> 'start')::time, v_zone);
        v_close := orch8.wall_instant(v_day + (p_window ->> 'end')::time, v_zone);
        -- (a window inside a spring-forward gap is empty that day)
        IF p_at < v_close AND v_open < v_close THEN
            RETURN greatest(p_at, v_open);
        END IF;
    END LOOP;
    RETURN p_at;
END
$$;

COMMENT ON FUNCTION orch8.window_open_at(jsonb, timestamptz) IS
'When a step with the send_window p_window that is due at p_at may start: p_at when it is '
'inside the window (start included, end excluded, wall time in the window''s zone, on its '
'days), else the next opening (wall_instant, as the schedules: DST-correct; a start in '
'a spring-forward gap opens at the end of the gap, one that occurs twice at its first). '
'p_at itself for no window, or one the validator would refuse. STABLE: it reads the '
'time zone data. start_block (after the delay) and finish_step (a retry) apply it.';

-- A step's deadline ---------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.deadline_passed(p_node orch8.execution_nodes)
RETURNS boolean
LANGUAGE sql
STABLE
AS $$
    SELECT coalesce(p_node.deadline_at <= orch8.now(), false)
$$;

COMMENT ON FUNCTION orch8.deadline_passed(orch8.execution_nodes) IS
'Whether the node''s deadline (deadline_at) has passed by orch8.now(); false without one.';

CREATE OR REPLACE FUNCTION orch8.fail_deadline(
    p_inst orch8.task_instances, p_node orch8.execution_nodes, p_attempt integer,
    p_effect_id uuid, p_lease_token uuid
)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_error text := format('step %s missed its deadline of %s', p_node.block_id,
        orch8.instance_step(p_inst.tenant_id, p_inst.id, p_node.path) ->> 'deadline');
BEGIN
    PERFORM orch8.record_block_output(p_inst.tenant_id, p_inst.id, p_node.path, p_attempt,
        '__error__', jsonb_build_object('error', v_error, 'code', 'deadline'), false,
        p_effect_id, p_lease_token);
    PERFORM orch8.end_node(p_inst, p_node.path, 'failed', NULL, v_error, NULL);
    RETURN v_error;
END
$$;

COMMENT ON FUNCTION orch8.fail_deadline(
    orch8.task_instances, orch8.execution_nodes, integer, uuid, uuid
) IS
'Fail a step node whose deadline passed: an __error__ row with code deadline (so a catch '
'sees error.code), and the node fails, unwinding to the nearest handler (end_node). '
'Returns the error. Internal helper of fire_deadlines, begin_step and finish_step.';

CREATE OR REPLACE FUNCTION orch8.fire_deadlines(p_limit integer DEFAULT 100)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_row record;
    v_inst orch8.task_instances;
    v_node orch8.execution_nodes;
    v_count integer := 0;
BEGIN
    -- Ready nodes only, with no lease: a leased one fails when its runner reports
    -- (begin_step, finish_step); one waiting for its receipt to settle is decided by the
    -- settlement, and fails here if that makes it ready again.
    FOR v_row IN
        SELECT n.tenant_id, n.instance_id, n.path
        FROM orch8.execution_nodes AS n
        JOIN orch8.task_instances AS t ON t.tenant_id = n.tenant_id AND t.id = n.instance_id
        WHERE n.state = 'ready' AND n.deadline_at <= orch8.now() AND n.lease_token IS NULL
        ORDER BY n.deadline_at
        LIMIT greatest(p_limit, 0)
        FOR UPDATE OF t, n SKIP LOCKED
    LOOP
        SELECT * INTO v_inst FROM orch8.task_instances AS t
        WHERE t.tenant_id = v_row.tenant_id AND t.id = v_row.instance_id;
        SELECT * INTO v_node FROM orch8.execution_nodes AS n
        WHERE n.tenant_id = v_row.tenant_id AND n.instance_id = v_row.instance_id
          AND n.path = v_row.path;
        -- a node fails from running (node_can_transition): it is taken for this moment
        UPDATE orch8.execution_nodes AS n SET state = 'running', updated_at = orch8.now()
        WHERE n.tenant_id = v_row.tenant_id AND n.instance_id = v_row.instance_id
          AND n.path = v_row.path;
        PERFORM orch8.fail_deadline(v_inst, v_node,
            orch8.compute_attempt(v_row.tenant_id, v_row.instance_id, v_row.path), NULL, NULL);
        PERFORM orch8.sync_instance(v_row.tenant_id, v_row.instance_id, 'timer',
            format('step %s: deadline passed', v_node.path));
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END
$$;

COMMENT ON FUNCTION orch8.fire_deadlines(integer) IS
'Bounded sweep: up to p_limit ready step nodes without a lease whose deadline_at has '
'passed fail with code deadline (fail_deadline; FOR UPDATE SKIP LOCKED, with their '
'instances), audited as the timer''s. Returns how many. claim_due_nodes runs it before '
'it claims.';

-- An instance's sla ----------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.breach_sla(p_inst orch8.task_instances)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_definition jsonb;
    v_root orch8.execution_nodes;
    v_error text;
BEGIN
    SELECT s.definition INTO v_definition FROM orch8.sequences AS s
    WHERE s.tenant_id = p_inst.tenant_id AND s.id = p_inst.sequence_id;
    v_error := format('the instance missed its sla of %s', v_definition ->> 'sla');
    UPDATE orch8.task_instances AS t SET sla_breached_at = orch8.now()
    WHERE t.tenant_id = p_inst.tenant_id AND t.id = p_inst.id;
    INSERT INTO orch8.webhook_outbox (tenant_id, subscription_id, event, instance_id, payload)
    SELECT s.tenant_id, s.id, 'instance.sla_breached', p_inst.id,
           jsonb_build_object(
               'event', 'instance.sla_breached',
               'tenant_id', p_inst.tenant_id,
               'instance_id', p_inst.id,
               'state', p_inst.state::text,
               'reason', v_error,
               'sla', v_definition -> 'sla',
               'sla_at', to_char(p_inst.sla_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'at', to_char(orch8.now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'sequence_id', p_inst.sequence_id,
               'sequence_version', p_inst.sequence_version)
    FROM orch8.webhook_subscriptions AS s
    WHERE s.tenant_id = p_inst.tenant_id AND s.enabled
      AND 'instance.sla_breached' = ANY (s.events)
    ORDER BY s.created_at, s.id;
    IF found THEN
        PERFORM pg_notify('orch8_webhooks', '');
    END IF;
    v_root := orch8.lock_node(p_inst.tenant_id, p_inst.id, '');
    IF coalesce(v_definition ->> 'on_sla_breach', 'fail') <> 'fail'
       OR v_root.state IN ('completed', 'failed', 'skipped', 'cancelled') THEN
        RETURN;  -- notify only, or the root ended already (its on_failure or on_cancel runs)
    END IF;
    -- as a parallel does for a failed branch: what has not been dispatched is withdrawn,
    -- a step in flight finishes and records its outcome; the root fails with code sla
    PERFORM orch8.record_block_output(p_inst.tenant_id, p_inst.id, '', 0, '__error__',
        jsonb_build_object('error', v_error, 'code', 'sla'), false, NULL, NULL);
    PERFORM orch8.cancel_subtree(p_inst, c.path, v_error)
    FROM orch8.execution_nodes AS c
    WHERE c.tenant_id = p_inst.tenant_id AND c.instance_id = p_inst.id AND c.parent_path = ''
      AND c.state NOT IN ('completed', 'failed', 'skipped', 'cancelled');
    PERFORM orch8.end_node(p_inst, '', 'failed', NULL, v_error, NULL);
END
$$;

COMMENT ON FUNCTION orch8.breach_sla(orch8.task_instances) IS
'An instance (locked by the caller) missed its sla: sla_breached_at is set, one '
'instance.sla_breached outbox row per enabled subscription that wants it; with '
'on_sla_breach fail (the default) and its root still open, its open blocks are cancelled '
'(a step in flight finishes first) and the root fails with code sla (an __error__ row), '
'which starts on_failure. Internal helper of fire_slas.';

CREATE OR REPLACE FUNCTION orch8.fire_slas(p_limit integer DEFAULT 100)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_inst orch8.task_instances;
    v_count integer := 0;
BEGIN
    -- sla_watch_at is sla_at while the instance is open, not paused and not yet past it
    -- (task_instances_watch_sla); a paused one is watched again once it resumes.
    FOR v_inst IN
        SELECT t.* FROM orch8.task_instances AS t
        WHERE t.sla_watch_at <= orch8.now() AND t.sla_watch_at IS NOT NULL
          AND t.requested_state IS NULL
        ORDER BY t.sla_watch_at
        LIMIT greatest(p_limit, 0)
        FOR UPDATE OF t SKIP LOCKED
    LOOP
        PERFORM orch8.breach_sla(v_inst);
        PERFORM orch8.sync_instance(v_inst.tenant_id, v_inst.id, 'timer', 'sla missed');
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END
$$;

COMMENT ON FUNCTION orch8.fire_slas(integer) IS
'Bounded sweep: up to p_limit instances past their sla_at that have not ended, are not '
'paused and have no pause or cancel asked (FOR UPDATE SKIP LOCKED, the earliest first) '
'go through breach_sla, the instance following (sync_instance, actor timer, reason '
'"sla missed"). Returns how many. claim_due_nodes runs it before it claims.';

-- Starting a wait ------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.start_wait(
    p_inst orch8.task_instances, p_parent text, p_block jsonb
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_type text := p_block ->> 'type';
    v_path text := orch8.child_path(p_parent, p_block ->> 'id');
    v_signal orch8.instance_signals;
BEGIN
    INSERT INTO orch8.execution_nodes (
        tenant_id, instance_id, path, parent_path, block_id, kind, state, priority, items,
        wake_at
    ) VALUES (
        p_inst.tenant_id, p_inst.id, v_path, p_parent, p_block ->> 'id', v_type,
        'waiting', p_inst.priority,
        CASE WHEN v_type = 'wait_for_signal'
             THEN jsonb_build_object('signal', p_block ->> 'signal') END,
        orch8.after_ms(orch8.duration_ms(
            p_block -> CASE WHEN v_type = 'sleep' THEN 'duration' ELSE 'timeout' END))
    );
    UPDATE orch8.task_instances AS t SET current_block = v_path
    WHERE t.tenant_id = p_inst.tenant_id AND t.id = p_inst.id;
    IF v_type = 'wait_for_signal' THEN
        -- a signal that came before the wait was kept for it: the oldest one is consumed
        SELECT * INTO v_signal FROM orch8.instance_signals AS s
        WHERE s.tenant_id = p_inst.tenant_id AND s.instance_id = p_inst.id
          AND s.signal_type = p_block ->> 'signal' AND s.outcome = 'pending'
        ORDER BY s.id
        LIMIT 1
        FOR UPDATE;
        IF v_signal.id IS NOT NULL THEN
            PERFORM orch8.consume_signal(p_inst, v_path, v_signal);
        END IF;
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.start_wait(orch8.task_instances, text, jsonb) IS
'Start a sleep or a wait_for_signal in the list at p_parent: the node is waiting, its '
'timer (wake_at) the sleep''s end or the wait''s timeout (none without one). A '
'wait_for_signal consumes at once the oldest pending signal of its name (one sent before '
'the wait began).';

CREATE OR REPLACE FUNCTION orch8.consume_signal(
    p_inst orch8.task_instances, p_path text, p_signal orch8.instance_signals
)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE orch8.instance_signals AS s
    SET outcome = 'consumed', consumed_by = p_path, consumed_at = orch8.now()
    WHERE s.tenant_id = p_signal.tenant_id AND s.instance_id = p_signal.instance_id
      AND s.id = p_signal.id AND s.outcome = 'pending';
    IF NOT found THEN
        RAISE EXCEPTION 'signal % of instance % was consumed already', p_signal.id,
            p_signal.instance_id
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('signal_id', p_signal.id)::text;
    END IF;
    PERFORM orch8.end_node(p_inst, p_path, 'completed', jsonb_build_object(
        'signal', p_signal.signal_type, 'payload', p_signal.payload, 'signal_id', p_signal.id,
        'sent_by', p_signal.actor, 'sent_at', p_signal.created_at), NULL, NULL);
END
$$;

COMMENT ON FUNCTION orch8.consume_signal(
    orch8.task_instances, text, orch8.instance_signals
) IS
'A wait_for_signal node at p_path consumes a pending signal (CAS pending -> consumed, '
'consumed_by the path) and completes with {signal, payload, signal_id, sent_by, sent_at} '
'in the same transaction. A signal consumed already: O8004 (never happens under the '
'instance''s row lock).';

-- Timers -----------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.timer_fired(
    p_inst orch8.task_instances, p_node orch8.execution_nodes
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_block jsonb := orch8.sequence_block(p_inst.tenant_id, p_inst.sequence_id, p_node.block_id);
    v_error text;
BEGIN
    IF p_node.kind = 'sleep' THEN
        PERFORM orch8.end_node(p_inst, p_node.path, 'completed', jsonb_build_object(
            'slept_ms', orch8.duration_ms(v_block -> 'duration')), NULL, NULL);
        RETURN;
    END IF;
    IF jsonb_typeof(v_block -> 'on_timeout') = 'array' THEN
        UPDATE orch8.execution_nodes AS n SET state = 'running', updated_at = orch8.now()
        WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id
          AND n.path = p_node.path AND n.state = 'waiting';
        PERFORM orch8.start_list(p_inst, p_node.path || '.timeout', p_node.path, p_node.block_id,
                                 ARRAY['on_timeout'], '{}');
        RETURN;
    END IF;
    v_error := format('%s %s timed out after %s waiting for %s', p_node.kind, p_node.block_id,
        v_block ->> 'timeout',
        CASE WHEN p_node.kind = 'wait_for_signal'
             THEN format('signal %s', v_block ->> 'signal') ELSE 'an answer' END);
    PERFORM orch8.record_block_output(p_inst.tenant_id, p_inst.id, p_node.path, 0, '__error__',
        jsonb_build_object('error', v_error, 'code', 'timeout'), false, NULL, NULL);
    PERFORM orch8.end_node(p_inst, p_node.path, 'failed', NULL, v_error, NULL);
END
$$;

COMMENT ON FUNCTION orch8.timer_fired(orch8.task_instances, orch8.execution_nodes) IS
'A waiting node''s timer fired: a sleep completes with {slept_ms}; a wait_for_signal or '
'wait_for_input that timed out runs its on_timeout blocks (path <wait>.timeout, the node '
'running meanwhile, then ending as they did), or without them fails with code timeout '
'(an __error__ row, so a catch sees error.code).';

CREATE OR REPLACE FUNCTION orch8.fire_timers(p_limit integer DEFAULT 100)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_row record;
    v_inst orch8.task_instances;
    v_node orch8.execution_nodes;
    v_count integer := 0;
BEGIN
    -- the instance's row is locked with the node's, both skipped when busy (one lock order)
    FOR v_row IN
        SELECT n.tenant_id, n.instance_id, n.path
        FROM orch8.execution_nodes AS n
        JOIN orch8.task_instances AS t ON t.tenant_id = n.tenant_id AND t.id = n.instance_id
        WHERE n.state = 'waiting' AND n.wake_at <= orch8.now()
        ORDER BY n.wake_at
        LIMIT greatest(p_limit, 0)
        FOR UPDATE OF t, n SKIP LOCKED
    LOOP
        SELECT * INTO v_inst FROM orch8.task_instances AS t
        WHERE t.tenant_id = v_row.tenant_id AND t.id = v_row.instance_id;
        SELECT * INTO v_node FROM orch8.execution_nodes AS n
        WHERE n.tenant_id = v_row.tenant_id AND n.instance_id = v_row.instance_id
          AND n.path = v_row.path;
        CONTINUE WHEN v_node.state <> 'waiting';  -- a timer fired before it moved it on
        PERFORM orch8.timer_fired(v_inst, v_node);
        PERFORM orch8.sync_instance(v_row.tenant_id, v_row.instance_id, 'timer',
            format('%s %s: %s', v_node.kind, v_node.path,
                   CASE WHEN v_node.kind = 'sleep' THEN 'slept' ELSE 'timed out' END));
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END
$$;

COMMENT ON FUNCTION orch8.fire_timers(integer) IS
'Bounded sweep: fire up to p_limit due timers (waiting nodes whose wake_at has passed, '
'the earliest first; FOR UPDATE SKIP LOCKED with their instances) through timer_fired, '
'the instance following (sync_instance, actor timer). Returns how many. claim_due_nodes '
'runs it before it claims, so what a timer readies is claimed in the same call.';

-- Signals -----------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.update_instance_context(
    p_inst orch8.task_instances, p_payload jsonb
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_context jsonb := jsonb_set(p_inst.context, '{data}',
                                 coalesce(p_inst.context -> 'data', '{}') || p_payload);
    v_limit integer := coalesce(
        nullif(current_setting('orch8.max_context_bytes', true), '')::integer,
        orch8.limit_of('context_bytes'));
BEGIN
    IF octet_length(v_context::text) > v_limit THEN
        RAISE EXCEPTION 'instance context would be % bytes, over the limit of % bytes',
            octet_length(v_context::text), v_limit
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'payload', 'limit', v_limit,
                                             'size', octet_length(v_context::text))::text;
    END IF;
    UPDATE orch8.task_instances AS t
    SET context = v_context, context_version = t.context_version + 1, updated_at = orch8.now()
    WHERE t.tenant_id = p_inst.tenant_id AND t.id = p_inst.id;
END
$$;

COMMENT ON FUNCTION orch8.update_instance_context(orch8.task_instances, jsonb) IS
'The update_context signal: merge p_payload into the instance''s data (top-level keys '
'replaced, ||) and bump context_version, so runners holding the old context read the new '
'one before their next block. Over the context limit: O8008.';

CREATE OR REPLACE FUNCTION orch8.send_signal(
    p_tenant_id text,
    p_instance_id uuid,
    p_signal_type text,
    p_payload jsonb,
    p_actor text,
    p_idempotency_key text DEFAULT NULL
)
RETURNS TABLE (signal_id bigint, outcome text, deduplicated boolean)
LANGUAGE plpgsql
AS $$
DECLARE
    v_inst orch8.task_instances;
    v_outcome text;
    v_signal orch8.instance_signals;
    v_waiter orch8.execution_nodes;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);  -- the web role acts in its sealed tenant
    PERFORM orch8.require_domain(p_signal_type, 'orch8.signal_type', 'signal type');
    IF jsonb_typeof(p_payload) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'a signal''s payload must be a JSON object, got %',
            coalesce(jsonb_typeof(p_payload), 'NULL')
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'payload')::text;
    END IF;
    PERFORM orch8.require_size('payload', 'signal_payload_bytes', octet_length(p_payload::text)),
            orch8.require_size('actor', 'actor_chars', char_length(p_actor));
    IF octet_length(p_idempotency_key) NOT BETWEEN 1 AND orch8.limit_of('idempotency_key_bytes')
    THEN
        RAISE EXCEPTION 'idempotency key must be 1 to % bytes',
            orch8.limit_of('idempotency_key_bytes')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'idempotency_key',
                                             'limit', orch8.limit_of('idempotency_key_bytes'))::text;
    END IF;
    IF p_signal_type = 'input' THEN
        RAISE EXCEPTION 'input signals record answers to wait_for_input; answer with '
                        'orch8.answer_input'
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'signal_type')::text;
    END IF;
    -- the instance's row lock orders this signal with every move of its tree and with
    -- every other signal to it
    v_inst := orch8.load_instance(p_tenant_id, p_instance_id);
    IF p_idempotency_key IS NOT NULL THEN
        SELECT * INTO v_signal FROM orch8.instance_signals AS s
        WHERE s.tenant_id = p_tenant_id AND s.instance_id = p_instance_id
          AND s.idempotency_key = p_idempotency_key;
        IF v_signal.id IS NOT NULL THEN
            RETURN QUERY SELECT v_signal.id, v_signal.outcome, true;
            RETURN;
        END IF;
    END IF;
    IF p_signal_type <> ALL (orch8.builtin_signals())
       AND v_inst.state IN ('completed', 'cancelled', 'failed') THEN
        RAISE EXCEPTION 'instance % is %: no wait will ever read signal %', p_instance_id,
            v_inst.state, p_signal_type
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('instance_id', p_instance_id,
                                             'current_state', v_inst.state)::text;
    END IF;
    v_outcome := CASE p_signal_type
        WHEN 'cancel' THEN orch8.cancel_instance(p_tenant_id, p_instance_id, p_actor, 'signal')
        WHEN 'pause' THEN orch8.pause_instance(p_tenant_id, p_instance_id, p_actor, 'signal')
        WHEN 'resume' THEN orch8.resume_instance(p_tenant_id, p_instance_id, p_actor, 'signal')
        ELSE 'pending'
    END;
    IF p_signal_type = 'update_context' THEN
        IF v_inst.state IN ('completed', 'cancelled') THEN
            RAISE EXCEPTION 'instance % is %: its context no longer changes', p_instance_id,
                v_inst.state
                USING ERRCODE = 'O8004',
                      DETAIL = json_build_object('instance_id', p_instance_id,
                                                 'current_state', v_inst.state)::text;
        END IF;
        PERFORM orch8.update_instance_context(v_inst, p_payload);
        v_outcome := 'context_updated';
    END IF;
    INSERT INTO orch8.instance_signals AS s (
        tenant_id, instance_id, signal_type, payload, actor, outcome, idempotency_key
    ) VALUES (
        p_tenant_id, p_instance_id, p_signal_type, p_payload, orch8.attributed_actor(p_actor),
        v_outcome, p_idempotency_key
    )
    RETURNING s.* INTO v_signal;
    IF v_outcome = 'pending' THEN
        SELECT * INTO v_waiter FROM orch8.execution_nodes AS n
        WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id
          AND n.kind = 'wait_for_signal' AND n.state = 'waiting'
          AND n.items ->> 'signal' = p_signal_type
        ORDER BY n.created_at, n.path
        LIMIT 1
        FOR UPDATE;
        IF v_waiter.path IS NOT NULL THEN
            PERFORM orch8.consume_signal(v_inst, v_waiter.path, v_signal);
            PERFORM orch8.sync_instance(p_tenant_id, p_instance_id, v_signal.actor,
                                        format('signal %s', p_signal_type));
            v_outcome := 'consumed';
        END IF;
    END IF;
    RETURN QUERY SELECT v_signal.id, v_outcome, false;
END
$$;

COMMENT ON FUNCTION orch8.send_signal(text, uuid, text, jsonb, text, text) IS
'Send a signal to an instance, exactly once, under the instance''s row lock. A repeated '
'p_idempotency_key answers the first signal (deduplicated) and acts on nothing. cancel, '
'pause and resume act (see their functions); update_context merges the payload into the '
'instance''s data (update_instance_context). Any other name is a custom signal: the '
'oldest waiting wait_for_signal node of that name consumes it now (outcome consumed), '
'else it stays pending for the next one to start. A custom signal to an ended instance: '
'O8004. input (answer_input records those), a type that is not an orch8.signal_type, a '
'payload that is not a JSON object or over signal_payload_bytes, an actor over '
'actor_chars, a key over idempotency_key_bytes: O8008. The actor recorded is '
'attributed_actor''s.';

-- People --------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.await_input(
    p_tenant_id text,
    p_instance_id uuid,
    p_lease_token uuid,
    p_path text,
    p_prompt text,
    p_error text DEFAULT NULL
)
RETURNS SETOF orch8.tree_answer
LANGUAGE plpgsql
AS $$
DECLARE
    v_inst orch8.task_instances;
    v_node orch8.execution_nodes;
    v_block jsonb;
    v_next orch8.execution_nodes;
BEGIN
    v_inst := orch8.lock_leased_instance(p_tenant_id, p_instance_id, p_lease_token);
    v_node := orch8.leased_node(p_tenant_id, p_instance_id, p_lease_token);
    PERFORM orch8.require_node(v_node, p_path, ARRAY['wait_for_input'], 'await_input');
    IF orch8.stop_node(v_inst, v_node) IS NOT NULL THEN
        RETURN QUERY SELECT * FROM orch8.node_answer(p_tenant_id, p_instance_id, NULL, NULL,
                                                     'runner', 'requested while running');
        RETURN;
    END IF;
    v_block := orch8.sequence_block(p_tenant_id, v_inst.sequence_id, v_node.block_id);
    IF p_error IS NULL AND octet_length(p_prompt) > orch8.limit_of('signal_payload_bytes') THEN
        p_error := format('the prompt is %s bytes, over the limit signal_payload_bytes (%s)',
                          octet_length(p_prompt), orch8.limit_of('signal_payload_bytes'));
    END IF;
    IF p_error IS NOT NULL THEN
        PERFORM orch8.record_block_output(p_tenant_id, p_instance_id, p_path, 0, '__error__',
            jsonb_build_object('error', p_error), false, NULL, p_lease_token);
        PERFORM orch8.end_node(v_inst, p_path, 'failed', NULL, p_error, NULL);
    ELSE
        UPDATE orch8.execution_nodes AS n
        SET state = 'waiting', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
            items = jsonb_build_object('prompt', p_prompt, 'choices', v_block -> 'choices'),
            wake_at = orch8.after_ms(orch8.duration_ms(v_block -> 'timeout')),
            updated_at = orch8.now()
        WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id AND n.path = p_path;
    END IF;
    v_inst := orch8.load_instance(p_tenant_id, p_instance_id);
    v_next := orch8.hand_over(v_inst, p_lease_token, v_node.lease_owner, v_node.lease_expires_at,
                              v_node.parent_path);
    RETURN QUERY SELECT * FROM orch8.node_answer(p_tenant_id, p_instance_id, v_next,
                                                 v_node.parent_path, 'runner');
END
$$;

COMMENT ON FUNCTION orch8.await_input(text, uuid, uuid, text, text, text) IS
'The runner''s call for a wait_for_input node, fenced by its lease (O8001): the node waits '
'for a person, holding no lease, with the prompt the runner rendered (at most '
'signal_payload_bytes) and the block''s choices, its timer the block''s timeout. '
'p_error (the prompt did not render) fails the node. Answers like finish_step, the next '
'node leased to the caller.';

CREATE OR REPLACE FUNCTION orch8.answer_input(
    p_tenant_id text,
    p_instance_id uuid,
    p_path text,
    p_choice text,
    p_comment text,
    p_actor text
)
RETURNS TABLE (state orch8.instance_state, path text, output jsonb)
LANGUAGE plpgsql
AS $$
DECLARE
    v_inst orch8.task_instances;
    v_node orch8.execution_nodes;
    v_actor text;
    v_output jsonb;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);  -- the web role acts in its sealed tenant
    PERFORM orch8.require_size('actor', 'actor_chars', char_length(p_actor));
    IF octet_length(p_comment) > orch8.limit_of('note_bytes') THEN
        RAISE EXCEPTION 'comment is % bytes, over the limit of % bytes',
            octet_length(p_comment), orch8.limit_of('note_bytes')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'comment',
                                             'limit', orch8.limit_of('note_bytes'))::text;
    END IF;
    v_inst := orch8.load_instance(p_tenant_id, p_instance_id);
    v_node := orch8.lock_node(p_tenant_id, p_instance_id, p_path);
    IF v_node.path IS NULL OR v_node.kind <> 'wait_for_input' THEN
        RAISE EXCEPTION 'instance % has no wait_for_input at %', p_instance_id, p_path
            USING ERRCODE = 'O8007',
                  DETAIL = json_build_object('instance_id', p_instance_id, 'path', p_path)::text;
    END IF;
    IF v_node.state <> 'waiting' THEN
        RAISE EXCEPTION 'input % of instance % is %, not waiting for an answer', p_path,
            p_instance_id, v_node.state
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('instance_id', p_instance_id, 'path', p_path,
                                             'current_state', v_node.state)::text;
    END IF;
    IF jsonb_typeof(v_node.items -> 'choices') = 'array'
       AND NOT coalesce((v_node.items -> 'choices') ? p_choice, false) THEN
        RAISE EXCEPTION 'choice % is not one of %', to_json(p_choice)::text,
            v_node.items -> 'choices'
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'choice',
                                             'choices', v_node.items -> 'choices')::text;
    END IF;
    IF p_choice IS NULL OR p_choice = '' THEN
        RAISE EXCEPTION 'an answer needs a choice'
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'choice')::text;
    END IF;
    v_actor := orch8.attributed_actor(p_actor);
    v_output := jsonb_build_object('choice', p_choice, 'comment', p_comment,
                                   'answered_by', v_actor, 'answered_at', orch8.now());
    -- the answer is a signal too, so the instance's signals show who answered and when
    INSERT INTO orch8.instance_signals (
        tenant_id, instance_id, signal_type, payload, actor, outcome, consumed_by, consumed_at
    ) VALUES (
        p_tenant_id, p_instance_id, 'input',
        jsonb_strip_nulls(jsonb_build_object('path', p_path, 'choice', p_choice,
                                             'comment', p_comment)),
        v_actor, 'consumed', p_path, orch8.now()
    );
    PERFORM orch8.end_node(v_inst, p_path, 'completed', v_output, NULL, NULL);
    RETURN QUERY SELECT
        orch8.sync_instance(p_tenant_id, p_instance_id, p_actor,
                            format('answered %s: %s', p_path, p_choice)),
        p_path, v_output;
END
$$;

COMMENT ON FUNCTION orch8.answer_input(text, uuid, text, text, text, text) IS
'A person answers the wait_for_input node at p_path: it must be waiting (else O8004; no '
'such node: O8007) and the choice one of its choices (else O8008). The node completes '
'with {choice, comment, answered_by, answered_at}, the answer is kept as a signal of '
'type input (who, when, what), and the instance moves on, audited with the actor and '
'"answered <path>: <choice>". The actor recorded is attributed_actor''s (a sealed key''s '
'name). Returns the instance''s state, the path and the output.';

-- What instances wait for ---------------------------------------------------------------

CREATE OR REPLACE VIEW orch8.waiting_nodes WITH (security_invoker = true) AS
SELECT
    n.tenant_id,
    n.instance_id,
    n.path,
    n.kind,
    CASE
        WHEN n.worker_task_id IS NOT NULL THEN 'worker'
        WHEN n.kind = 'sleep' THEN 'time'
        WHEN n.kind = 'wait_for_signal' THEN 'signal'
        WHEN n.kind = 'wait_for_input' THEN 'input'
        WHEN n.kind = 'sub_sequence' THEN 'child'
        ELSE 'verification'
    END AS waiting_for,
    n.items ->> 'signal' AS signal,
    n.items ->> 'prompt' AS prompt,
    n.items -> 'choices' AS choices,
    n.child_instance_id,
    coalesce(n.wake_at, w.close_by) AS until,
    n.updated_at AS since,
    t.state AS instance_state,
    s.name AS sequence_name,
    s.namespace,
    n.worker_task_id
FROM orch8.execution_nodes AS n
INNER JOIN orch8.task_instances AS t ON n.tenant_id = t.tenant_id AND n.instance_id = t.id
INNER JOIN orch8.sequences AS s ON t.tenant_id = s.tenant_id AND t.sequence_id = s.id
LEFT JOIN orch8.worker_tasks AS w ON n.tenant_id = w.tenant_id AND n.worker_task_id = w.id
WHERE n.state = 'waiting';

COMMENT ON VIEW orch8.waiting_nodes IS
'Every waiting node with what it waits for: time (a sleep), signal (its name), input (a '
'person: the rendered prompt and the choices), child (a sub_sequence''s instance), '
'worker (an external worker runs the step''s task, worker_task_id) or verification (a '
'verifier settling the step''s receipt), and until when (its timer: a sleep''s end, a '
'wait''s timeout, a worker task''s close_by; NULL when none). What the console, the API '
'and the CLI list as waiting.';

COMMENT ON COLUMN orch8.waiting_nodes.tenant_id IS 'The instance''s tenant.';

COMMENT ON COLUMN orch8.waiting_nodes.instance_id IS 'The instance that waits.';

COMMENT ON COLUMN orch8.waiting_nodes.path IS 'The waiting node''s path.';

COMMENT ON COLUMN orch8.waiting_nodes.kind IS
'The node''s kind (sleep, wait_for_signal, wait_for_input, sub_sequence, step...).';

COMMENT ON COLUMN orch8.waiting_nodes.waiting_for IS
'What it waits for, one of orch8.wait_reasons(): time, signal, input, child, verification '
'or worker.';

COMMENT ON COLUMN orch8.waiting_nodes.signal IS
'For a wait_for_signal: the signal name it waits for; NULL otherwise.';

COMMENT ON COLUMN orch8.waiting_nodes.prompt IS
'For a wait_for_input: the rendered prompt shown to people; NULL otherwise.';

COMMENT ON COLUMN orch8.waiting_nodes.choices IS
'For a wait_for_input: the JSON array of allowed answers; NULL otherwise.';

COMMENT ON COLUMN orch8.waiting_nodes.child_instance_id IS
'For a sub_sequence: the child instance it waits for; NULL otherwise.';

COMMENT ON COLUMN orch8.waiting_nodes.until IS
'When the wait ends if nothing else happens: a sleep''s end or a wait''s timeout, or an '
'external worker task''s close_by. NULL when not timed.';

COMMENT ON COLUMN orch8.waiting_nodes.since IS
'When the node row last changed, normally when it began waiting.';

COMMENT ON COLUMN orch8.waiting_nodes.instance_state IS 'The state of the instance.';

COMMENT ON COLUMN orch8.waiting_nodes.sequence_name IS 'The name of the instance''s sequence.';

COMMENT ON COLUMN orch8.waiting_nodes.namespace IS 'The namespace of the instance''s sequence.';

COMMENT ON COLUMN orch8.waiting_nodes.worker_task_id IS
'For a step served by an external worker: its task (worker_tasks.id); NULL otherwise.';
