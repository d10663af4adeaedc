-- Cron schedules (docs/ARCHITECTURE.md, "Schedules (issue 12)"): a schedule starts an
-- instance of the latest version of a sequence at the fire times of a 5-field cron
-- expression in a time zone. The cron arithmetic, the moves and the firing are in
-- sql/functions/schedules.sql; every fire time considered is a row of schedule_fires.

-- Named sets -------------------------------------------------------------------------

CREATE FUNCTION orch8.schedule_states()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['active', 'paused', 'ended'] $$;

COMMENT ON FUNCTION orch8.schedule_states() IS
'The states of a schedule: active (fires), paused (does not; resume recomputes the next '
'fire from now), ended (past ends_at, or ended by hand; final).';

CREATE FUNCTION orch8.schedule_overlap_policies()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['allow', 'skip', 'buffer_one', 'cancel_previous'] $$;

COMMENT ON FUNCTION orch8.schedule_overlap_policies() IS
'What a fire does while the schedule''s previous instance has not ended: allow (start '
'anyway), skip (record skipped_overlap), buffer_one (keep one fire, started when the '
'previous ends), cancel_previous (cancel the previous, start the new one).';

CREATE FUNCTION orch8.schedule_fire_outcomes()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT ARRAY[
        'started', 'skipped_overlap', 'buffered', 'missed', 'cancelled_previous', 'failed'
    ]
$$;

COMMENT ON FUNCTION orch8.schedule_fire_outcomes() IS
'The outcomes of a fire time in orch8.schedule_fires: started, skipped_overlap, buffered, '
'missed (fire times passed while nothing ran, one row per catch-up), cancelled_previous '
'(started after asking to cancel the previous instance), failed (the engine refused to '
'start it, e.g. data over the context limit: the error is kept, the schedule goes on).';

-- A parsed cron expression (orch8.cron_parse): the values each field allows, sorted, and
-- whether each day field starts with * (Vixie: then both day fields must match).
CREATE TYPE orch8.cron_spec AS (
    minutes integer [],
    hours integer [],
    days integer [],
    months integer [],
    weekdays integer [],
    days_star boolean,
    weekdays_star boolean,
    problems text []
);

COMMENT ON TYPE orch8.cron_spec IS
'A parsed 5-field cron expression (orch8.cron_parse): the sorted values of minute, hour, '
'day of month, month and day of week (0 = Sunday), and whether each day field starts with '
'*, which decides between Vixie''s "either day field" and "both day fields"; problems: '
'every problem of the expression (the values are NULL unless it is empty).';

-- Tables -----------------------------------------------------------------------------

CREATE TABLE orch8.schedules (
    tenant_id text NOT NULL CHECK (tenant_id <> ''),
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    name orch8.identifier NOT NULL,
    sequence_namespace orch8.identifier NOT NULL,
    sequence_name orch8.sequence_name NOT NULL,
    cron text NOT NULL CHECK (char_length(cron) BETWEEN 1 AND 200),
    timezone text NOT NULL CHECK (char_length(timezone) BETWEEN 1 AND 100),
    data jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(data) = 'object'),
    priority integer NOT NULL DEFAULT 0,
    overlap_policy text NOT NULL DEFAULT 'skip'
    CHECK (overlap_policy = any(orch8.schedule_overlap_policies())),
    starts_at timestamptz,
    ends_at timestamptz,
    state text NOT NULL DEFAULT 'active' CHECK (state = any(orch8.schedule_states())),
    next_fire_at timestamptz,
    last_fire_at timestamptz,
    last_instance_id uuid,
    buffered_fire_at timestamptz,
    created_by text NOT NULL,
    updated_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    updated_at timestamptz NOT NULL DEFAULT orch8.now(),
    ended_at timestamptz,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, last_instance_id) REFERENCES orch8.task_instances (tenant_id, id),
    CHECK (starts_at IS NULL OR ends_at IS NULL OR starts_at < ends_at),
    -- an active schedule always knows its next fire; a paused or ended one has none
    CHECK ((state = 'active') = (next_fire_at IS NOT NULL)),
    CHECK ((state = 'ended') = (ended_at IS NOT NULL))
);

COMMENT ON TABLE orch8.schedules IS
'Cron schedules: each starts an instance of the latest version of a sequence at the fire '
'times of a 5-field cron expression in a time zone (orch8.cron_next), between starts_at '
'and ends_at. Created with orch8.create_schedule, moved by pause_schedule, '
'resume_schedule, end_schedule, fired by fire_due_schedules (the runner). Never deleted.';
COMMENT ON COLUMN orch8.schedules.name IS
'The schedule''s name (an orch8.identifier), unique in the tenant among schedules that '
'have not ended.';
COMMENT ON COLUMN orch8.schedules.sequence_namespace IS
'The namespace of the sequence each fire starts.';
COMMENT ON COLUMN orch8.schedules.sequence_name IS
'The name of the sequence each fire starts: its latest version at fire time.';
COMMENT ON COLUMN orch8.schedules.cron IS
'minute hour day-of-month month day-of-week (orch8.cron_problems validates it).';
COMMENT ON COLUMN orch8.schedules.timezone IS
'The IANA time zone (a name of pg_timezone_names) the cron expression''s wall times are in.';
COMMENT ON COLUMN orch8.schedules.data IS 'The data of every instance the schedule starts.';
COMMENT ON COLUMN orch8.schedules.priority IS 'The priority of the instances it starts.';
COMMENT ON COLUMN orch8.schedules.overlap_policy IS
'One of orch8.schedule_overlap_policies(): what a fire does while the last instance runs.';
COMMENT ON COLUMN orch8.schedules.starts_at IS 'No fire time before this (NULL: from creation).';
COMMENT ON COLUMN orch8.schedules.ends_at IS
'Fire times are before this; the schedule ends when the next one would not be (NULL: never).';
COMMENT ON COLUMN orch8.schedules.state IS 'One of orch8.schedule_states().';
COMMENT ON COLUMN orch8.schedules.next_fire_at IS
'The next fire time (NULL unless active); fire_due_schedules advances it by CAS.';
COMMENT ON COLUMN orch8.schedules.last_fire_at IS 'The fire time of the last started instance.';
COMMENT ON COLUMN orch8.schedules.last_instance_id IS
'The last instance started: the overlap policy is judged against it.';
COMMENT ON COLUMN orch8.schedules.buffered_fire_at IS
'buffer_one: the fire time waiting for the last instance to end (at most one).';
COMMENT ON COLUMN orch8.schedules.created_by IS 'Who created it (orch8.attributed_actor).';
COMMENT ON COLUMN orch8.schedules.updated_by IS
'Who made the last move (created, paused, resumed, ended it; the runner for fires).';
COMMENT ON COLUMN orch8.schedules.created_at IS 'When it was created (orch8.now()).';
COMMENT ON COLUMN orch8.schedules.updated_at IS 'When it last changed (orch8.now()).';
COMMENT ON COLUMN orch8.schedules.ended_at IS 'When it ended (NULL unless ended).';

CREATE UNIQUE INDEX schedules_name_idx ON orch8.schedules (tenant_id, name)
WHERE state <> 'ended';
-- fire_due_schedules: the due ones, soonest first, across tenants
CREATE INDEX schedules_due_idx ON orch8.schedules (next_fire_at) WHERE state = 'active';
CREATE INDEX schedules_buffered_idx ON orch8.schedules (tenant_id, id)
WHERE state = 'active' AND buffered_fire_at IS NOT NULL;

CREATE TABLE orch8.schedule_fires (
    tenant_id text NOT NULL,
    schedule_id uuid NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    fire_at timestamptz NOT NULL,
    outcome text NOT NULL CHECK (outcome = any(orch8.schedule_fire_outcomes())),
    instance_id uuid,
    previous_instance_id uuid,
    missed_count integer CHECK (missed_count >= 1),
    missed_from timestamptz,
    count_capped boolean NOT NULL DEFAULT false,
    error text,
    actor text NOT NULL,
    db_user text NOT NULL DEFAULT session_user,
    recorded_at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, schedule_id, seq),
    FOREIGN KEY (tenant_id, schedule_id) REFERENCES orch8.schedules (tenant_id, id),
    FOREIGN KEY (tenant_id, instance_id) REFERENCES orch8.task_instances (tenant_id, id),
    CHECK ((outcome IN ('started', 'cancelled_previous')) = (instance_id IS NOT NULL)),
    CHECK ((outcome = 'missed') = (missed_count IS NOT NULL AND missed_from IS NOT NULL)),
    CHECK ((outcome = 'cancelled_previous') = (previous_instance_id IS NOT NULL)),
    CHECK ((outcome = 'failed') = (error IS NOT NULL))
);

COMMENT ON TABLE orch8.schedule_fires IS
'Append-only: every fire time a schedule considered and what came of it (one of '
'orch8.schedule_fire_outcomes()). Fire times missed while nothing ran are one missed row '
'per catch-up (first and last time, count). Never updated or deleted.';
COMMENT ON COLUMN orch8.schedule_fires.fire_at IS
'The fire time (for missed: the last one missed).';
COMMENT ON COLUMN orch8.schedule_fires.outcome IS 'One of orch8.schedule_fire_outcomes().';
COMMENT ON COLUMN orch8.schedule_fires.instance_id IS
'The instance started (started, cancelled_previous).';
COMMENT ON COLUMN orch8.schedule_fires.previous_instance_id IS
'cancelled_previous: the instance asked to cancel.';
COMMENT ON COLUMN orch8.schedule_fires.missed_count IS
'missed: how many fire times were missed (at most 1000 counted, see count_capped).';
COMMENT ON COLUMN orch8.schedule_fires.missed_from IS 'missed: the first fire time missed.';
COMMENT ON COLUMN orch8.schedule_fires.count_capped IS
'missed: true when more than missed_count were missed (counting stopped there).';
COMMENT ON COLUMN orch8.schedule_fires.error IS
'failed: the engine''s refusal (SQLSTATE and message), cut to error_chars.';
COMMENT ON COLUMN orch8.schedule_fires.actor IS 'Who fired it: the runner''s worker id.';
COMMENT ON COLUMN orch8.schedule_fires.db_user IS
'The PostgreSQL login that recorded it (session_user); no caller can set it.';
COMMENT ON COLUMN orch8.schedule_fires.recorded_at IS 'When it was recorded (orch8.now()).';

-- one instance per schedule and fire time, whatever happens
CREATE UNIQUE INDEX schedule_fires_started_idx ON orch8.schedule_fires (
    tenant_id, schedule_id, fire_at
) WHERE outcome IN ('started', 'cancelled_previous');

CREATE TRIGGER schedule_fires_append_only
BEFORE UPDATE OR DELETE ON orch8.schedule_fires
FOR EACH ROW EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TRIGGER schedule_fires_no_truncate
BEFORE TRUNCATE ON orch8.schedule_fires
FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TRIGGER schedules_no_delete
BEFORE DELETE ON orch8.schedules
FOR EACH ROW EXECUTE FUNCTION orch8.refuse_history_rewrite();

-- Tenants and privileges (as migration 0010 does for every tenant table) ---------------

SELECT orch8.enable_tenant_isolation('orch8.schedules');
SELECT orch8.enable_tenant_isolation('orch8.schedule_fires');

REVOKE ALL ON orch8.schedules, orch8.schedule_fires FROM public;
GRANT SELECT ON orch8.schedules, orch8.schedule_fires TO orch8_web, orch8_runner, orch8_auditor;
GRANT SELECT, INSERT, UPDATE ON orch8.schedules, orch8.schedule_fires TO orch8_ledger;

INSERT INTO orch8.function_access (name, access) VALUES
('create_schedule', 'web'),
('pause_schedule', 'web'),
('resume_schedule', 'web'),
('end_schedule', 'web'),
('lock_schedule', 'private'),
('schedule_fire', 'private'),
('schedule_start', 'private'),
('schedule_fire_failed', 'private')
ON CONFLICT (name) DO UPDATE SET access = excluded.access;

-- What the front ends list and show --------------------------------------------------

CREATE VIEW orch8.schedule_overview WITH (security_invoker = true) AS
SELECT
    s.tenant_id,
    s.id,
    s.name::text AS name,
    s.sequence_namespace::text AS sequence_namespace,
    s.sequence_name::text AS sequence_name,
    s.cron,
    s.timezone,
    s.data,
    s.priority,
    s.overlap_policy,
    s.starts_at,
    s.ends_at,
    s.state,
    s.next_fire_at,
    s.last_fire_at,
    s.last_instance_id,
    t.state::text AS last_instance_state,
    s.buffered_fire_at,
    s.created_by,
    s.updated_by,
    s.created_at,
    s.updated_at,
    s.ended_at
FROM orch8.schedules AS s
LEFT JOIN orch8.task_instances AS t
    ON s.tenant_id = t.tenant_id AND s.last_instance_id = t.id;

COMMENT ON VIEW orch8.schedule_overview IS
'Schedules with the state of their last instance: what the API, the CLI and the console '
'list and show.';
