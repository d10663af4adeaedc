-- The database defends itself (docs/ARCHITECTURE.md, "The database defends itself"):
-- least-privilege roles, functions that run as orch8_ledger, tenants sealed by a
-- credential, history rows that name the real caller, and triggers no application role
-- can skip.

-- Roles ------------------------------------------------------------------------------------
-- Cluster-wide: another database of the same server may have made them already. Their
-- attributes are what the design needs; a login without CREATEROLE (a managed service)
-- gets one clear error naming what a DBA must create.
DO $$
DECLARE
    v_want CONSTANT jsonb := '{
        "orch8_ledger":  {"login": false, "bypassrls": true,  "inherit": true},
        "orch8_runner":  {"login": true,  "bypassrls": true,  "inherit": true},
        "orch8_web":     {"login": true,  "bypassrls": false, "inherit": false},
        "orch8_auditor": {"login": true,  "bypassrls": false, "inherit": false}}';
    v_role text;
    v_spec jsonb;
    v_have pg_roles;
BEGIN
    FOR v_role, v_spec IN SELECT * FROM jsonb_each(v_want) LOOP
        SELECT * INTO v_have FROM pg_roles AS r WHERE r.rolname = v_role;
        BEGIN
            IF v_have.rolname IS NULL THEN
                EXECUTE format('CREATE ROLE %I', v_role);
            END IF;
            IF v_have.rolname IS NULL
               OR v_have.rolcanlogin IS DISTINCT FROM (v_spec ->> 'login')::boolean
               OR v_have.rolbypassrls IS DISTINCT FROM (v_spec ->> 'bypassrls')::boolean
               OR v_have.rolinherit IS DISTINCT FROM (v_spec ->> 'inherit')::boolean THEN
                EXECUTE format('ALTER ROLE %I %s %s %s', v_role,
                    CASE WHEN (v_spec ->> 'login')::boolean THEN 'LOGIN' ELSE 'NOLOGIN' END,
                    CASE WHEN (v_spec ->> 'bypassrls')::boolean THEN 'BYPASSRLS'
                         ELSE 'NOBYPASSRLS' END,
                    CASE WHEN (v_spec ->> 'inherit')::boolean THEN 'INHERIT'
                         ELSE 'NOINHERIT' END);
            END IF;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN NULL;  -- a concurrent migration
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'cannot create or alter role % as %', v_role, current_user
                    USING ERRCODE = 'O8005',
                          HINT = 'a DBA creates the roles once (docs/SECURITY.md, '
                                 '"Deploying with separate roles"), or migrate as a role '
                                 'with CREATEROLE (and superuser for BYPASSRLS)';
        END;
    END LOOP;
END
$$;

-- The migrating login hands functions to orch8_ledger and, with one URL, switches to the
-- runner's and the web's role. The application roles are members of nothing.
DO $$
BEGIN
    EXECUTE format('GRANT orch8_ledger, orch8_runner, orch8_web TO %I', current_user);
EXCEPTION WHEN insufficient_privilege OR invalid_grant_operation THEN
    RAISE NOTICE 'could not grant orch8_ledger, orch8_runner, orch8_web to %', current_user;
END
$$;

GRANT USAGE ON SCHEMA orch8 TO orch8_ledger, orch8_runner, orch8_web, orch8_auditor;

-- Secrets: the seal's key, console sessions --------------------------------------------

CREATE TABLE orch8.tenant_seal (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    secret text NOT NULL CHECK (secret ~ '^[0-9a-f]{64}$')
);

COMMENT ON TABLE orch8.tenant_seal IS
'The secret that seals a transaction''s tenant (orch8.enter_tenant). Readable only by '
'orch8_ledger: whoever reads it can forge a tenant for the web role.';

COMMENT ON COLUMN orch8.tenant_seal.secret IS
'256 bits from gen_random_uuid() (122 random bits each, two of them, hex).';

-- two version-4 UUIDs: 244 random bits from the server's strong random source
INSERT INTO orch8.tenant_seal (secret)
VALUES (replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));

ALTER TABLE orch8.api_keys ADD COLUMN expires_at timestamptz;

COMMENT ON COLUMN orch8.api_keys.expires_at IS
'When the key stops working (NULL: never). Checked by authenticate_api_key and '
'enter_tenant.';

CREATE TABLE orch8.console_sessions (
    tenant_id text NOT NULL,
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    key_id uuid NOT NULL,
    token_hash text NOT NULL UNIQUE CHECK (token_hash ~ '^[0-9a-f]{64}$'),
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    expires_at timestamptz NOT NULL,
    ended_at timestamptz,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, key_id) REFERENCES orch8.api_keys (tenant_id, id)
);

COMMENT ON TABLE orch8.console_sessions IS
'Console logins, server-side: the cookie carries a random token, this row its SHA-256. '
'Logging out (end_console_session), the key''s revocation or expiry, or expires_at ends '
'the session for every copy of the cookie.';

-- History that names the real caller ------------------------------------------------------

ALTER TABLE orch8.effect_receipt_events
ADD COLUMN db_user text NOT NULL DEFAULT session_user,
ADD COLUMN api_key_id uuid;

ALTER TABLE orch8.instance_transitions
ADD COLUMN db_user text NOT NULL DEFAULT session_user,
ADD COLUMN api_key_id uuid;

COMMENT ON COLUMN orch8.effect_receipt_events.db_user IS
'The PostgreSQL login that made the change (session_user); no caller can set it.';
COMMENT ON COLUMN orch8.effect_receipt_events.api_key_id IS
'The API key sealed into the transaction (orch8.enter_tenant), if any.';
COMMENT ON COLUMN orch8.instance_transitions.db_user IS
'The PostgreSQL login that made the change (session_user); no caller can set it.';
COMMENT ON COLUMN orch8.instance_transitions.api_key_id IS
'The API key sealed into the transaction (orch8.enter_tenant), if any.';

CREATE TABLE orch8.invariant_events (
    tenant_id text NOT NULL,
    invariant_id uuid NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    change text NOT NULL CHECK (change IN ('declared', 'changed')),
    before jsonb,
    after jsonb NOT NULL,
    actor text NOT NULL,
    db_user text NOT NULL DEFAULT session_user,
    api_key_id uuid,
    at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, invariant_id, seq),
    FOREIGN KEY (tenant_id, invariant_id) REFERENCES orch8.workflow_invariants (tenant_id, id)
);

COMMENT ON TABLE orch8.invariant_events IS
'Append-only: every declaration of an invariant and every change to one (a commit guard '
'switched off, a rule edited), with the row before and after, written by trigger.';

-- Rows only for instances that exist (new rows; old orphans are left as they are) ----------

ALTER TABLE orch8.continuity_executions
ADD CONSTRAINT continuity_executions_instance_fk
FOREIGN KEY (tenant_id, current_instance_id) REFERENCES orch8.task_instances (tenant_id, id)
NOT VALID;

ALTER TABLE orch8.effect_receipts
ADD CONSTRAINT effect_receipts_instance_fk
FOREIGN KEY (tenant_id, instance_id) REFERENCES orch8.task_instances (tenant_id, id)
NOT VALID;

ALTER TABLE orch8.task_instances
ADD CONSTRAINT task_instances_parent_fk
FOREIGN KEY (tenant_id, parent_instance_id) REFERENCES orch8.task_instances (tenant_id, id)
NOT VALID;

-- Who calls: the caller's role, the sealed tenant -------------------------------------------

CREATE FUNCTION orch8.caller_role()
RETURNS text
LANGUAGE sql
STABLE
AS $$ SELECT coalesce(nullif(current_setting('role'), 'none'), session_user::text) $$;

COMMENT ON FUNCTION orch8.caller_role() IS
'The role that called, also inside a SECURITY DEFINER function (which changes '
'current_user but neither the role setting nor session_user).';

CREATE FUNCTION orch8.caller_trusted()
RETURNS boolean
LANGUAGE sql
STABLE
AS $$ SELECT pg_has_role(orch8.caller_role(), 'orch8_runner', 'MEMBER') $$;

COMMENT ON FUNCTION orch8.caller_trusted() IS
'Whether the caller acts across tenants: a member of orch8_runner (the runner, the '
'migrating login, a superuser). Anyone else is confined to the sealed tenant.';

CREATE FUNCTION orch8.seal_of(p_tenant text, p_key_id text, p_key_role text)
RETURNS text
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, orch8, pg_temp
AS $$
    SELECT encode(sha256(convert_to(
        concat_ws('|', s.secret, p_tenant, p_key_id, p_key_role, pg_backend_pid(),
                  extract(epoch FROM transaction_timestamp()), s.secret),
        'UTF8')), 'hex')
    FROM orch8.tenant_seal AS s
    WHERE p_tenant IS NOT NULL AND p_key_id IS NOT NULL AND p_key_role IS NOT NULL
$$;

COMMENT ON FUNCTION orch8.seal_of(text, text, text) IS
'The seal of (tenant, key, role) for this backend and this transaction: SHA-256 over the '
'secret of orch8.tenant_seal. Private: only orch8_ledger may call it.';

CREATE FUNCTION orch8.sealed(p_setting text)
RETURNS text
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, orch8, pg_temp
AS $$
    SELECT CASE WHEN current_setting('orch8.tenant_seal', true) = orch8.seal_of(
                         current_setting('orch8.tenant_id', true),
                         current_setting('orch8.key_id', true),
                         current_setting('orch8.key_role', true))
                THEN current_setting(p_setting, true) END
$$;

COMMENT ON FUNCTION orch8.sealed(text) IS
'A setting written by enter_tenant (orch8.tenant_id, orch8.key_id, orch8.key_role), or '
'NULL when the seal does not match (set by hand, or carried from another transaction).';

-- The cheap test first: without a seal (the runner, the CLI, psql) no definer is entered.
CREATE FUNCTION orch8.current_tenant()
RETURNS text
LANGUAGE sql
STABLE
AS $$
    SELECT CASE WHEN coalesce(current_setting('orch8.tenant_seal', true), '') <> ''
                THEN orch8.sealed('orch8.tenant_id') END
$$;

COMMENT ON FUNCTION orch8.current_tenant() IS
'The tenant sealed into this transaction by enter_tenant, or NULL.';

CREATE FUNCTION orch8.current_key_id()
RETURNS uuid
LANGUAGE sql
STABLE
AS $$
    SELECT CASE WHEN coalesce(current_setting('orch8.tenant_seal', true), '') <> ''
                THEN orch8.sealed('orch8.key_id')::uuid END
$$;

COMMENT ON FUNCTION orch8.current_key_id() IS
'The API key sealed into this transaction by enter_tenant, or NULL.';

CREATE FUNCTION orch8.sealed_key_actor()
RETURNS text
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, orch8, pg_temp
AS $$
    SELECT 'key:' || k.name FROM orch8.api_keys AS k WHERE k.id = orch8.current_key_id()
$$;

COMMENT ON FUNCTION orch8.sealed_key_actor() IS
'key:<name> of the API key sealed into this transaction, or NULL (reads api_keys, which '
'application roles cannot).';

-- Called by every history trigger: a trusted caller (the runner) enters no definer.
CREATE FUNCTION orch8.attributed_actor(p_claimed text)
RETURNS text
LANGUAGE sql
STABLE
AS $$
    SELECT CASE
        WHEN orch8.caller_trusted() THEN coalesce(nullif(p_claimed, ''), session_user::text)
        ELSE coalesce(orch8.sealed_key_actor(), session_user::text)
    END
$$;

COMMENT ON FUNCTION orch8.attributed_actor(text) IS
'The actor a history row records: what a trusted caller says (its worker id, an '
'operator''s name), else the sealed key (key:<name>), else the login. A setting alone '
'never names someone else.';

-- Row-level security: the web role sees its sealed tenant; the auditor reads everything.
-- The ledger role (inside every function) bypasses it: each function the web may call
-- checks its tenant argument once (orch8.require_tenant), which costs a guarded step far
-- less than a policy on every statement inside it. ------------------------------------------

CREATE OR REPLACE FUNCTION orch8.enable_tenant_isolation(p_table regclass)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', p_table);
    EXECUTE format('DROP POLICY IF EXISTS tenant_isolation ON %s', p_table);
    EXECUTE format(
        'CREATE POLICY web_tenant ON %s TO orch8_web '
        'USING (tenant_id = (SELECT orch8.current_tenant()))', p_table);
    EXECUTE format(
        'CREATE POLICY auditor_reads ON %s FOR SELECT TO orch8_auditor USING (true)', p_table);
END
$$;

COMMENT ON FUNCTION orch8.enable_tenant_isolation(regclass) IS
'Migrations only: row-level security for a tenant table. orch8_web sees the tenant sealed '
'by enter_tenant (the check is evaluated once per statement); orch8_auditor reads all; '
'orch8_ledger, which runs the functions, bypasses it (they check with require_tenant).';

-- Credentials are looked up before any tenant is sealed (that is what they are for), so
-- their tables have no policies: no application role may read them at all, and only the
-- functions of sql/functions/access.sql do.
SELECT orch8.enable_tenant_isolation(c.oid::regclass)
FROM pg_class AS c
WHERE
    c.relnamespace = 'orch8'::regnamespace AND c.relkind = 'r'
    AND c.relname NOT IN ('api_keys', 'console_sessions')
    AND EXISTS (
        SELECT 1 FROM pg_attribute AS a
        WHERE a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped
    );
DROP POLICY tenant_isolation ON orch8.api_keys;
ALTER TABLE orch8.api_keys DISABLE ROW LEVEL SECURITY;

-- Table privileges: application roles read; only orch8_ledger writes. -----------------------

REVOKE ALL ON ALL TABLES IN SCHEMA orch8 FROM public, orch8_web, orch8_runner, orch8_auditor;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA orch8 FROM public, orch8_web, orch8_runner, orch8_auditor;
GRANT SELECT ON ALL TABLES IN SCHEMA orch8 TO orch8_web, orch8_runner, orch8_auditor;
REVOKE SELECT ON orch8.api_keys, orch8.console_sessions, orch8.tenant_seal
FROM orch8_web, orch8_runner, orch8_auditor;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA orch8 TO orch8_ledger;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA orch8 TO orch8_ledger;

ALTER DEFAULT PRIVILEGES IN SCHEMA orch8
REVOKE ALL ON TABLES FROM orch8_web, orch8_runner;
ALTER DEFAULT PRIVILEGES IN SCHEMA orch8
REVOKE ALL ON SEQUENCES FROM orch8_web, orch8_runner;
ALTER DEFAULT PRIVILEGES IN SCHEMA orch8
REVOKE ALL ON FUNCTIONS FROM orch8_web, orch8_runner;
ALTER DEFAULT PRIVILEGES IN SCHEMA orch8
GRANT SELECT ON TABLES TO orch8_web, orch8_runner, orch8_auditor;
ALTER DEFAULT PRIVILEGES IN SCHEMA orch8
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO orch8_ledger;
ALTER DEFAULT PRIVILEGES IN SCHEMA orch8
GRANT USAGE, SELECT ON SEQUENCES TO orch8_ledger;
ALTER DEFAULT PRIVILEGES IN SCHEMA orch8 REVOKE EXECUTE ON FUNCTIONS FROM public;

-- Function privileges, one list -------------------------------------------------------------

CREATE TABLE orch8.function_access (
    name text PRIMARY KEY,
    access text NOT NULL CHECK (access IN ('web', 'all_tenants', 'private', 'migration'))
);

COMMENT ON TABLE orch8.function_access IS
'Exceptions to the default function privileges applied by secure_functions(): web '
'(orch8_web may call this function that writes), all_tenants (a read across tenants that '
'checks its caller itself: runs as orch8_runner, which row-level security does not '
'confine; the web may call it), private (a helper only orch8_ledger and its members call, '
'SECURITY INVOKER: it runs inside a definer), migration (left to the '
'migrating login, SECURITY INVOKER). Every other function: the runner may call it; the '
'web and the auditor only when it is STABLE or IMMUTABLE.';

INSERT INTO orch8.function_access (name, access) VALUES
('secure_functions', 'migration'),
('enable_tenant_isolation', 'migration'),
('seal_of', 'private'),
-- Helpers and trigger functions: called only from inside the functions below (which run
-- as orch8_ledger with a fixed search_path), so they need neither; a DBA's login, a
-- member of orch8_ledger, may still call them.
('append_invariant_result', 'private'),
('append_receipt_event', 'private'),
('apply_requested_state', 'private'),
('attribute_transition', 'private'),
('await_settlement', 'private'),
('cas_effect_receipt', 'private'),
('clear_event_attribution', 'private'),
('continue_settled_step', 'private'),
('dispatch_effect_receipt_at_most_once', 'private'),
('ensure_effect_receipt', 'private'),
('ensure_effect_scope', 'private'),
('escalate_verification', 'private'),
('fail_step', 'private'),
('load_instance', 'private'),
('lock_leased_instance', 'private'),
('record_block_output', 'private'),
('record_resolution', 'private'),
('recover_lost_receipt', 'private'),
('request_instance_state', 'private'),
('schedule_verification', 'private'),
('settle_effect', 'private'),
('settle_same_key_receipts', 'private'),
('transition_instance', 'private'),
('reclaim_expired_leases', 'private'),
('claim_due_instances', 'private'),
('require_own_receipt', 'private'),
('effect_receipts_guard', 'private'),
('effect_receipts_record_event', 'private'),
('enqueue_instance_webhooks', 'private'),
('refuse_history_rewrite', 'private'),
('task_instances_guard', 'private'),
('task_instances_record_transition', 'private'),
('workflow_invariants_record_change', 'private'),
('enter_tenant', 'web'),
('authenticate_api_key', 'web'),
('open_console_session', 'web'),
('console_session', 'web'),
('end_console_session', 'web'),
('known_tenants', 'all_tenants'),
('metrics_snapshot', 'all_tenants'),
('create_instance', 'web'),
('resume_instance', 'web'),
('pause_instance', 'web'),
('cancel_instance', 'web'),
('retry_instance', 'web'),
('send_signal', 'web'),
('resolve_effect', 'web'),
('request_verifications', 'web'),
('create_sequence', 'web'),
('validate_sequence', 'web'),
('create_webhook_subscription', 'web'),
('discard_webhook', 'web'),
('redeliver_webhook', 'web'),
('set_webhook_subscription_enabled', 'web');

CREATE FUNCTION orch8.secure_functions()
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_fn record;
    v_owner text;
    v_count integer := 0;
BEGIN
    -- A new owner needs CREATE on the schema; neither keeps it (a role that can create
    -- functions here could shadow ours on the definers' search_path).
    GRANT CREATE ON SCHEMA orch8 TO orch8_ledger, orch8_runner;
    FOR v_fn IN
        SELECT p.oid::regprocedure AS sig, p.provolatile, p.prosecdef,
               pg_get_userbyid(p.proowner) AS owner,
               coalesce(a.access, 'default') AS access,
               coalesce(p.proconfig, '{}') AS config
        FROM pg_proc AS p
        LEFT JOIN orch8.function_access AS a ON a.name = p.proname
        WHERE p.pronamespace = 'orch8'::regnamespace AND p.prokind = 'f'
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC, orch8_web, orch8_runner, '
                       'orch8_auditor', v_fn.sig);
        CONTINUE WHEN v_fn.access = 'migration';
        v_owner := CASE v_fn.access WHEN 'all_tenants' THEN 'orch8_runner' ELSE 'orch8_ledger' END;
        IF v_fn.owner <> v_owner THEN
            EXECUTE format('ALTER FUNCTION %s OWNER TO %I', v_fn.sig, v_owner);
        END IF;
        -- Writers run as the ledger; so do the few readers declared DEFINER (the seal).
        -- Plain readers stay INVOKER: inlinable, and confined by the caller's own policies.
        -- Private helpers stay INVOKER too: only a definer (already the ledger, with the
        -- fixed search_path) or the ledger's members can call them, and entering a definer
        -- in every nested call costs a guarded step about a tenth of its time.
        IF (v_fn.provolatile = 'v' AND v_fn.access <> 'private' OR v_fn.prosecdef)
           AND NOT (v_fn.prosecdef
                    AND 'search_path=pg_catalog, orch8, pg_temp' = ANY (v_fn.config)) THEN
            EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER '
                           'SET search_path = pg_catalog, orch8, pg_temp', v_fn.sig);
        END IF;
        CONTINUE WHEN v_fn.access = 'private';
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO orch8_runner', v_fn.sig);
        IF v_fn.provolatile <> 'v' OR v_fn.access IN ('web', 'all_tenants') THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO orch8_web', v_fn.sig);
        END IF;
        IF v_fn.provolatile <> 'v' THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO orch8_auditor', v_fn.sig);
        END IF;
        v_count := v_count + 1;
    END LOOP;
    REVOKE CREATE ON SCHEMA orch8 FROM orch8_ledger, orch8_runner;
    RETURN v_count;
END
$$;

COMMENT ON FUNCTION orch8.secure_functions() IS
'Migrations only (the migrator runs it after applying function files, since CREATE OR '
'REPLACE resets these): every function of the schema is owned by orch8_ledger (the '
'all_tenants ones by orch8_runner), writers that application roles may call are SECURITY '
'DEFINER with search_path pg_catalog, orch8, pg_temp (private helpers run inside them), '
'and EXECUTE follows orch8.function_access. Returns how many functions application roles '
'may call.';

-- Guards no application role can skip ------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.effect_receipts_guard()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_evidence text := nullif(current_setting('orch8.event_evidence', true), '');
BEGIN
    IF tg_op = 'INSERT' THEN
        IF new.state <> 'planned' THEN
            RAISE EXCEPTION 'a receipt is created in state planned, not %', new.state
                USING ERRCODE = 'O8004';
        END IF;
        RETURN new;
    END IF;
    IF tg_op = 'DELETE' THEN
        RAISE EXCEPTION 'effect receipts are never deleted (receipt %)', old.id
            USING ERRCODE = 'O8004',
                  HINT = 'resolve it instead: orch8.resolve_effect()';
    END IF;
    IF (new.tenant_id, new.id, new.continuity_id, new.epoch, new.instance_id, new.block_id,
        new.attempt, new.kind, new.handler, new.destination_fingerprint, new.request_sha256,
        new.idempotency_key, new.created_at)
       IS DISTINCT FROM
       (old.tenant_id, old.id, old.continuity_id, old.epoch, old.instance_id, old.block_id,
        old.attempt, old.kind, old.handler, old.destination_fingerprint, old.request_sha256,
        old.idempotency_key, old.created_at) THEN
        RAISE EXCEPTION 'the identity of receipt % cannot change', old.id
            USING ERRCODE = 'O8004';
    END IF;
    IF new.state IS NOT DISTINCT FROM old.state THEN
        IF (new.provider_receipt_id, new.evidence, new.error)
           IS DISTINCT FROM (old.provider_receipt_id, old.evidence, old.error) THEN
            RAISE EXCEPTION 'receipt %: provider receipt id, evidence and error change only '
                            'with a state move, which records them', old.id
                USING ERRCODE = 'O8004',
                      HINT = 'orch8.resolve_effect() records who changed what and why';
        END IF;
        RETURN new;
    END IF;
    IF NOT orch8.can_transition_to(old.state, new.state) THEN
        RAISE EXCEPTION 'receipt % cannot move from % to %', old.id, old.state, new.state
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('effect_id', old.id, 'current_state', old.state,
                                             'to_state', new.state)::text;
    END IF;
    -- Leaving unknown settles an ambiguity: only with evidence, recorded on the event.
    IF old.state = 'unknown'
       AND (v_evidence IS NULL OR v_evidence::jsonb = '{}'::jsonb
            OR jsonb_typeof(v_evidence::jsonb) <> 'object') THEN
        RAISE EXCEPTION 'receipt % leaves unknown only with evidence', old.id
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('effect_id', old.id, 'field', 'evidence')::text,
                  HINT = 'orch8.resolve_effect(..., p_evidence => ''{"checked": "..."}'')';
    END IF;
    RETURN new;
END
$$;

COMMENT ON FUNCTION orch8.effect_receipts_guard() IS
'Trigger: receipts are created planned, move only along can_transition_to, keep their '
'identity columns (idempotency key included), change provider receipt id, evidence or '
'error only with a state move, leave unknown only with evidence (the transaction''s '
'orch8.event_evidence, a non-empty object), and are never deleted (O8004; O8008 for the '
'missing evidence).';

CREATE OR REPLACE FUNCTION orch8.effect_receipts_record_event()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF tg_op = 'UPDATE' AND new.state = old.state THEN
        RETURN NULL;  -- not a transition (e.g. the no-op upsert in ensure_effect_receipt)
    END IF;
    INSERT INTO orch8.effect_receipt_events (
        tenant_id, receipt_id, from_state, to_state, actor, note, evidence, api_key_id
    ) VALUES (
        new.tenant_id,
        new.id,
        CASE WHEN tg_op = 'UPDATE' THEN old.state END,
        new.state,
        orch8.attributed_actor(current_setting('orch8.event_actor', true)),
        nullif(current_setting('orch8.event_note', true), ''),
        nullif(current_setting('orch8.event_evidence', true), '')::jsonb,
        orch8.current_key_id()
    );
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.effect_receipts_record_event() IS
'Trigger: appends one effect_receipt_events row per receipt creation and state move. '
'Note and evidence come from the transaction settings orch8.event_note and '
'orch8.event_evidence (set by the ledger functions); the actor is attributed_actor('
'orch8.event_actor), db_user the login and api_key_id the sealed key.';

CREATE FUNCTION orch8.task_instances_guard()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF tg_op = 'DELETE' THEN
        RAISE EXCEPTION 'instances are never deleted (instance %)', old.id
            USING ERRCODE = 'O8004', HINT = 'cancel it instead: orch8.cancel_instance()';
    END IF;
    IF (new.tenant_id, new.id, new.sequence_id, new.sequence_version, new.parent_instance_id,
        new.idempotency_key, new.created_at)
       IS DISTINCT FROM
       (old.tenant_id, old.id, old.sequence_id, old.sequence_version, old.parent_instance_id,
        old.idempotency_key, old.created_at) THEN
        RAISE EXCEPTION 'the identity of instance % cannot change', old.id
            USING ERRCODE = 'O8004';
    END IF;
    IF new.state IS DISTINCT FROM old.state
       AND NOT orch8.instance_can_transition(old.state, new.state) THEN
        RAISE EXCEPTION 'instance % cannot move from % to %', old.id, old.state, new.state
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('instance_id', old.id, 'from_state', old.state,
                                             'to_state', new.state)::text;
    END IF;
    RETURN new;
END
$$;

COMMENT ON FUNCTION orch8.task_instances_guard() IS
'Trigger: an instance keeps its identity, moves only along instance_can_transition, and '
'is never deleted (O8004), whoever writes the row.';

CREATE FUNCTION orch8.task_instances_record_transition()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF tg_op = 'UPDATE' AND new.state = old.state THEN
        RETURN NULL;
    END IF;
    INSERT INTO orch8.instance_transitions (
        tenant_id, instance_id, from_state, to_state, actor, reason, api_key_id
    ) VALUES (
        new.tenant_id, new.id,
        CASE WHEN tg_op = 'UPDATE' THEN old.state END,
        new.state,
        orch8.attributed_actor(current_setting('orch8.transition_actor', true)),
        nullif(current_setting('orch8.transition_reason', true), ''),
        orch8.current_key_id()
    );
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.task_instances_record_transition() IS
'Trigger, the one writer of instance_transitions: a row per instance creation and state '
'move, the actor from orch8.transition_actor (attributed_actor), the reason from '
'orch8.transition_reason, the login and the sealed key. A move made by hand is recorded '
'like any other.';

CREATE FUNCTION orch8.workflow_invariants_record_change()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF tg_op = 'DELETE' THEN
        RAISE EXCEPTION 'invariants are never deleted (invariant %)', old.id
            USING ERRCODE = 'O8004', HINT = 'a change is recorded in orch8.invariant_events';
    END IF;
    IF tg_op = 'UPDATE' AND (new.tenant_id, new.id) IS DISTINCT FROM (old.tenant_id, old.id)
    THEN
        RAISE EXCEPTION 'the identity of invariant % cannot change', old.id
            USING ERRCODE = 'O8004';
    END IF;
    IF tg_op = 'UPDATE' AND to_jsonb(new) = to_jsonb(old) THEN
        RETURN NULL;
    END IF;
    INSERT INTO orch8.invariant_events (
        tenant_id, invariant_id, change, before, after, actor, api_key_id
    ) VALUES (
        new.tenant_id, new.id,
        CASE tg_op WHEN 'INSERT' THEN 'declared' ELSE 'changed' END,
        CASE WHEN tg_op = 'UPDATE' THEN to_jsonb(old) END,
        to_jsonb(new),
        orch8.attributed_actor(current_setting('orch8.event_actor', true)),
        orch8.current_key_id()
    );
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.workflow_invariants_record_change() IS
'Trigger: every declaration of and change to an invariant is appended to '
'invariant_events (before and after); deleting one is refused (O8004).';

CREATE TRIGGER task_instances_guard
BEFORE UPDATE OR DELETE ON orch8.task_instances
FOR EACH ROW EXECUTE FUNCTION orch8.task_instances_guard();

CREATE TRIGGER task_instances_no_truncate
BEFORE TRUNCATE ON orch8.task_instances
FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TRIGGER task_instances_record_transition
AFTER INSERT OR UPDATE OF state ON orch8.task_instances
FOR EACH ROW EXECUTE FUNCTION orch8.task_instances_record_transition();

CREATE TRIGGER workflow_invariants_record_change
AFTER INSERT OR UPDATE ON orch8.workflow_invariants
FOR EACH ROW EXECUTE FUNCTION orch8.workflow_invariants_record_change();

CREATE TRIGGER workflow_invariants_no_delete
BEFORE DELETE ON orch8.workflow_invariants
FOR EACH ROW EXECUTE FUNCTION orch8.workflow_invariants_record_change();

CREATE TRIGGER workflow_invariants_no_truncate
BEFORE TRUNCATE ON orch8.workflow_invariants
FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TRIGGER invariant_events_append_only
BEFORE UPDATE OR DELETE ON orch8.invariant_events
FOR EACH ROW EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TRIGGER invariant_events_no_truncate
BEFORE TRUNCATE ON orch8.invariant_events
FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite();

-- Existing invariants get their first event, so every guard has a recorded origin.
INSERT INTO orch8.invariant_events (tenant_id, invariant_id, change, after, actor)
SELECT
    w.tenant_id,
    w.id,
    'declared' AS change,
    to_jsonb(w) AS after,
    'migration 0010' AS actor
FROM orch8.workflow_invariants AS w;

-- Limits the database enforces (one definition each) ---------------------------------------

CREATE OR REPLACE FUNCTION orch8.limits()
RETURNS TABLE (name text, value bigint, unit text, description text)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    VALUES
    ('idempotency_key_bytes', 256, 'bytes',
     'an instance''s or a receipt''s idempotency key (UTF-8)'),
    ('provider_receipt_id_bytes', 256, 'bytes', 'a provider''s receipt id (UTF-8)'),
    ('state_key_bytes', 256, 'bytes', 'a key of an instance''s key-value state'),
    ('state_value_bytes', 262144, 'bytes',
     'one value of an instance''s key-value state (default; the setting '
     'orch8.max_state_value_bytes overrides it)'),
    ('context_bytes', 262144, 'bytes',
     'an instance''s context {data, config, runtime} (default; the setting '
     'orch8.max_context_bytes overrides it)'),
    ('note_bytes', 2000, 'bytes',
     'an operator''s note or reason (resolving a receipt, pausing, cancelling)'),
    ('error_chars', 2000, 'characters',
     'an error kept on a receipt or a webhook delivery'),
    ('block_id_chars', 200, 'characters', 'a block id'),
    ('sequence_blocks', 5000, 'blocks', 'the blocks of one sequence definition'),
    ('retry_max_attempts', 100, 'attempts', 'a step''s retry.max_attempts'),
    ('verify_tries', 50, 'tries', 'the entries of a step''s verify.schedule'),
    ('verify_delay_ms', 86400000, 'milliseconds', 'one delay of a step''s verify.schedule'),
    ('verify_request_receipts', 1000, 'receipts',
     'the receipts one request_verifications call names'),
    ('resolution_output_bytes', 262144, 'bytes',
     'the output a resolution carries for the step (JSON text)'),
    ('definition_bytes', 1048576, 'bytes', 'a sequence definition (JSON text)'),
    ('params_bytes', 1048576, 'bytes', 'the params of one step''s effect (JSON text)'),
    ('evidence_bytes', 65536, 'bytes',
     'the evidence of a resolution or a verification (JSON text)'),
    ('actor_chars', 200, 'characters', 'who a history row names (an actor, a worker id)'),
    ('signal_payload_bytes', 65536, 'bytes', 'a signal''s payload (JSON text)'),
    ('json_depth', 64, 'levels', 'the nesting of any JSON value the ledger hashes')
$$;

COMMENT ON FUNCTION orch8.limits() IS
'Every size limit the engine enforces, by name, with its unit and what it bounds. Read '
'one with orch8.limit_of(name); table CHECKs and functions do.';

CREATE FUNCTION orch8.require_size(p_field text, p_limit_name text, p_size bigint)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $$
DECLARE
    v_limit bigint := orch8.limit_of(p_limit_name);
BEGIN
    IF p_size > v_limit THEN
        RAISE EXCEPTION '% is % %, over the limit of %', p_field, p_size,
            (SELECT l.unit FROM orch8.limits() AS l WHERE l.name = p_limit_name), v_limit
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', p_field, 'limit', v_limit,
                                             'size', p_size)::text;
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.require_size(text, text, bigint) IS
'O8008 with DETAIL {field, limit, size} when a size is over the named limit of '
'orch8.limits(); nothing otherwise.';

-- Signatures that sql/functions/ now defines differently or no longer has: keys expire,
-- and the console checks its server-side session instead of a key id.
DROP FUNCTION IF EXISTS orch8.create_api_key(text, text, text, text, text);
DROP FUNCTION IF EXISTS orch8.api_key_active(uuid);
