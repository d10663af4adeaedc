-- The operator surface: API keys, signals, requested pauses and cancels, and tenant
-- isolation enforced by row-level security for the web service's role.

CREATE TABLE orch8.api_keys (
    tenant_id text NOT NULL,
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    name text NOT NULL CHECK (name <> ''),
    role text NOT NULL CHECK (role IN ('operator', 'worker', 'auditor', 'admin')),
    key_prefix text NOT NULL,
    key_hash text NOT NULL UNIQUE CHECK (key_hash ~ '^[0-9a-f]{64}$'),
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    last_used_at timestamptz,
    revoked_at timestamptz,
    PRIMARY KEY (tenant_id, id)
);

COMMENT ON TABLE orch8.api_keys IS
'API keys, stored as SHA-256 of the secret (never the secret), bound to a tenant and a '
'role: operator, worker, auditor, or admin (may act for any tenant).';

CREATE TABLE orch8.instance_signals (
    tenant_id text NOT NULL,
    instance_id uuid NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    signal_type text NOT NULL CHECK (signal_type ~ '^[A-Za-z0-9_.:-]{1,100}$'),
    payload jsonb NOT NULL DEFAULT '{}',
    actor text NOT NULL,
    outcome text,
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, instance_id, id),
    FOREIGN KEY (tenant_id, instance_id) REFERENCES orch8.task_instances (tenant_id, id)
);

COMMENT ON TABLE orch8.instance_signals IS
'Signals sent to instances: cancel, pause and resume act at once (or at the next step '
'boundary of a running instance); other types are recorded for the workflow.';

-- A pause or cancel asked of a running instance takes effect at its next step boundary
-- (finish_step, begin_step, or the lease sweep), never in the middle of a step.
ALTER TABLE orch8.task_instances
ADD COLUMN requested_state orch8.instance_state
CHECK (requested_state IN ('paused', 'cancelled'));

-- Roles. orch8_web: what the web service runs as (SET ROLE), subject to row-level
-- security keyed by the transaction setting orch8.tenant_id. orch8_runner: for a runner
-- deployed with least privilege; it claims across tenants, so it bypasses RLS.
DO $$
BEGIN
    BEGIN
        CREATE ROLE orch8_web NOLOGIN;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;  -- another database made it
    END;
    BEGIN
        CREATE ROLE orch8_runner NOLOGIN BYPASSRLS;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
    END;
END
$$;

-- the user that migrates (and, by default, serves) may switch to the web role
DO $$
BEGIN
    EXECUTE format('GRANT orch8_web TO %I', current_user);
EXCEPTION WHEN insufficient_privilege OR invalid_grant_operation THEN
    RAISE NOTICE 'could not grant orch8_web to %: grant it to the web service''s login',
        current_user;
END
$$;

GRANT USAGE ON SCHEMA orch8 TO orch8_web, orch8_runner;
GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA orch8 TO orch8_web, orch8_runner;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA orch8 TO orch8_web, orch8_runner;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA orch8 TO orch8_web, orch8_runner;
ALTER DEFAULT PRIVILEGES IN SCHEMA orch8
GRANT SELECT, INSERT, UPDATE ON TABLES TO orch8_web, orch8_runner;
ALTER DEFAULT PRIVILEGES IN SCHEMA orch8
GRANT USAGE, SELECT ON SEQUENCES TO orch8_web, orch8_runner;
ALTER DEFAULT PRIVILEGES IN SCHEMA orch8
GRANT EXECUTE ON FUNCTIONS TO orch8_web, orch8_runner;
-- The web role reads keys only through orch8.authenticate_api_key.
REVOKE ALL ON orch8.api_keys FROM orch8_web;

CREATE FUNCTION orch8.enable_tenant_isolation(p_table regclass)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', p_table);
    EXECUTE format(
        'CREATE POLICY tenant_isolation ON %s TO orch8_web '
        'USING (tenant_id = current_setting(''orch8.tenant_id'', true)) '
        'WITH CHECK (tenant_id = current_setting(''orch8.tenant_id'', true))',
        p_table);
END
$$;

COMMENT ON FUNCTION orch8.enable_tenant_isolation(regclass) IS
'Turns on row-level security for a tenant table: the web role sees and writes only rows '
'whose tenant_id equals the transaction setting orch8.tenant_id (none when it is unset).';

SELECT orch8.enable_tenant_isolation(t::regclass)
FROM unnest(ARRAY[
    'orch8.continuity_executions', 'orch8.effect_receipts', 'orch8.effect_receipt_events',
    'orch8.workflow_invariants', 'orch8.invariant_results', 'orch8.sequences',
    'orch8.task_instances', 'orch8.instance_transitions', 'orch8.block_outputs',
    'orch8.webhook_subscriptions', 'orch8.webhook_outbox', 'orch8.instance_kv_state',
    'orch8.api_keys', 'orch8.instance_signals'
]) AS t;
