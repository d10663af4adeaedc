-- Who asked an instance to pause, cancel or resume, and why (docs/ARCHITECTURE.md, "An
-- operator's request is on record"). A pause or cancel asked while a step runs takes
-- effect at the step's boundary, and the transition then said actor "operator", reason
-- "requested while running": the name and the reason the operator gave were lost. Every
-- request is now a row of orch8.instance_requests (also the ones that changed nothing or
-- were refused nothing: unchanged, requested, withdrawn), and a request left pending on
-- a running instance keeps its actor and reason beside requested_state, so that the
-- transition that finally applies it carries them. resume_instance takes a reason too:
-- its three-argument form goes (the four-argument one, reason last with a default, is
-- created with the functions, after the migrations).

ALTER TABLE orch8.task_instances
ADD COLUMN requested_by text,
ADD COLUMN requested_reason text;

COMMENT ON COLUMN orch8.task_instances.requested_by IS
'Who asked for requested_state (as orch8.attributed_actor recorded them), while the '
'request waits for the step in flight; the transition that applies it names them. NULL '
'when nothing is requested.';
COMMENT ON COLUMN orch8.task_instances.requested_reason IS
'The reason given with requested_state, carried to the transition that applies it; NULL '
'when none was given or nothing is requested.';

CREATE TABLE orch8.instance_requests (
    tenant_id text NOT NULL,
    instance_id uuid NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    action text NOT NULL CHECK (action IN ('pause', 'cancel', 'resume')),
    actor text NOT NULL,
    reason text,
    outcome text NOT NULL,
    at timestamptz NOT NULL DEFAULT orch8.now(),
    db_user text NOT NULL DEFAULT session_user,
    api_key_id uuid,
    PRIMARY KEY (tenant_id, instance_id, seq)
);

COMMENT ON TABLE orch8.instance_requests IS
'Audit trail of operators'' requests: one row per pause, cancel or resume asked of an '
'instance (pause_instance, cancel_instance, resume_instance, whoever calls them: the API, '
'the CLI, bulk actions, signals, schedules, a parent''s cancel), with who, why and what '
'the call answered. Append-only.';
COMMENT ON COLUMN orch8.instance_requests.tenant_id IS 'The instance''s tenant.';
COMMENT ON COLUMN orch8.instance_requests.instance_id IS 'The instance asked.';
COMMENT ON COLUMN orch8.instance_requests.seq IS 'Order of the requests (identity).';
COMMENT ON COLUMN orch8.instance_requests.action IS 'pause, cancel or resume.';
COMMENT ON COLUMN orch8.instance_requests.actor IS
'Who asked: what a trusted caller names (an operator, a runner), else the sealed API key '
'(key:<name>), else the login (orch8.attributed_actor).';
COMMENT ON COLUMN orch8.instance_requests.reason IS 'The reason given, if any.';
COMMENT ON COLUMN orch8.instance_requests.outcome IS
'What the call answered: the new state (paused, cancelled, scheduled, waiting, failed, '
'running), requested (a step in flight: applied at its boundary), unchanged (already so, '
'or already asked) or withdrawn (a resume that withdrew a pending pause).';
COMMENT ON COLUMN orch8.instance_requests.at IS 'When it was asked (orch8.now()).';
COMMENT ON COLUMN orch8.instance_requests.db_user IS
'The PostgreSQL login that asked (session_user); no caller can set it.';
COMMENT ON COLUMN orch8.instance_requests.api_key_id IS
'The API key sealed into the transaction (orch8.enter_tenant), if any.';

SELECT orch8.enable_tenant_isolation('orch8.instance_requests');
REVOKE ALL ON orch8.instance_requests FROM public;
GRANT SELECT ON orch8.instance_requests TO orch8_web, orch8_runner, orch8_auditor;
GRANT SELECT, INSERT ON orch8.instance_requests TO orch8_ledger;

CREATE TRIGGER instance_requests_append_only
BEFORE UPDATE OR DELETE ON orch8.instance_requests
FOR EACH ROW EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TRIGGER instance_requests_no_truncate
BEFORE TRUNCATE ON orch8.instance_requests
FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite();

DROP FUNCTION IF EXISTS orch8.resume_instance(text, uuid, text);

INSERT INTO orch8.function_access (name, access) VALUES
('record_instance_request', 'private')
ON CONFLICT (name) DO UPDATE SET access = excluded.access;
