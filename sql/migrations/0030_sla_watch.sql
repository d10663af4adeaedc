-- Instance updates can be heap-only (docs/ARCHITECTURE.md, "An instance's sla is watched
-- from a column of its own"). task_instances_sla_idx named state in its predicate, and
-- PostgreSQL counts the columns of a predicate as indexed: every change of an instance's
-- state (the claim's scheduled -> running, a step's moves, its end) was written as a new
-- row version with an entry in each index of task_instances (primary key, listing,
-- idempotency key), although only instances with an sla are in that index.
--
-- fire_slas reads sla_watch_at instead: sla_at while the instance is watched (not ended,
-- not paused, not yet found past it), else NULL. A row trigger keeps it so. Its WHEN is
-- checked without calling PL/pgSQL, so instances without an sla pay nothing and their
-- updates touch no index. The body lives in sql/functions/triggers.sql; it is created here
-- too because the trigger needs it, and with it no instance is written unwatched between
-- this migration and the function files of the same run.

ALTER TABLE orch8.task_instances ADD COLUMN sla_watch_at timestamptz;

COMMENT ON COLUMN orch8.task_instances.sla_watch_at IS
'sla_at while fire_slas watches the instance (not ended, not paused, sla not yet missed), '
'else NULL. Written only by the trigger task_instances_watch_sla; it is what '
'task_instances_sla_watch_idx holds, so that no index names state.';

CREATE OR REPLACE FUNCTION orch8.task_instances_watch_sla()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    new.sla_watch_at := CASE
        WHEN new.sla_breached_at IS NULL AND new.state IN ('scheduled', 'running', 'waiting')
            THEN new.sla_at
    END;
    RETURN new;
END
$$;

INSERT INTO orch8.function_access (name, access) VALUES
('task_instances_watch_sla', 'private')
ON CONFLICT (name) DO UPDATE SET access = excluded.access;

CREATE TRIGGER task_instances_watch_sla
BEFORE INSERT OR UPDATE ON orch8.task_instances
FOR EACH ROW WHEN (new.sla_at IS NOT NULL OR new.sla_watch_at IS NOT NULL)
EXECUTE FUNCTION orch8.task_instances_watch_sla();

-- the instances the old index held (it serves this UPDATE), through the trigger
UPDATE orch8.task_instances AS t SET sla_watch_at = t.sla_at
WHERE
    t.sla_at IS NOT NULL AND t.sla_breached_at IS NULL
    AND t.state IN ('scheduled', 'running', 'waiting');

DROP INDEX orch8.task_instances_sla_idx;

-- what fire_slas looks at: only instances it watches, and no column an update of any other
-- instance changes
CREATE INDEX task_instances_sla_watch_idx ON orch8.task_instances (sla_watch_at)
WHERE sla_watch_at IS NOT NULL;
