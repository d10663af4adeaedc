-- A step's deadline (docs/ARCHITECTURE.md, "Time, signals and people"): when a step's node
-- must have completed, counted from when it started. fire_deadlines (run by
-- claim_due_nodes) fails a ready node past it; finish_step and begin_step fail a leased
-- one when its runner reports.

ALTER TABLE orch8.execution_nodes ADD COLUMN deadline_at timestamptz;

COMMENT ON COLUMN orch8.execution_nodes.deadline_at IS
'A step node''s deadline: start_block sets it to the start plus the step''s deadline; past '
'it the node fails with code deadline (fire_deadlines, finish_step, begin_step). NULL when '
'the step has none.';

CREATE INDEX execution_nodes_deadline_idx ON orch8.execution_nodes (deadline_at)
WHERE state = 'ready' AND deadline_at IS NOT NULL;

INSERT INTO orch8.function_access (name, access) VALUES
('fire_deadlines', 'private'),
('fail_deadline', 'private')
ON CONFLICT (name) DO UPDATE SET access = excluded.access;
