-- One place for each rule. Named sets, size limits, identifier patterns and which
-- receipt moves an operator may make are defined here once; table CHECKs and the
-- functions read them, and orch8_py/rules.py is generated from them (make rules).
-- Also: the views the front ends share, the builtin handlers this engine implements,
-- and the drop of function signatures that sql/functions/ now defines differently.

-- Named sets -------------------------------------------------------------------------

CREATE FUNCTION orch8.effect_kinds()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['http', 'model', 'message', 'storage', 'custom', 'worker'] $$;

COMMENT ON FUNCTION orch8.effect_kinds() IS
'The effect kinds, in their documented order: http, model, message, storage, custom '
'(builtins) and worker (every handler that is not a builtin).';

CREATE FUNCTION orch8.webhook_events()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['instance.completed', 'instance.failed'] $$;

COMMENT ON FUNCTION orch8.webhook_events() IS
'The events a webhook subscription may receive.';

CREATE FUNCTION orch8.outbox_states()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['pending', 'delivering', 'delivered', 'parked', 'discarded'] $$;

COMMENT ON FUNCTION orch8.outbox_states() IS
'The states of a webhook outbox row (moves: sql/functions/webhooks.sql).';

CREATE FUNCTION orch8.api_key_roles()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['operator', 'worker', 'auditor', 'admin'] $$;

COMMENT ON FUNCTION orch8.api_key_roles() IS
'The roles an API key may have: operator (everything in its tenant), worker (the worker '
'endpoints), auditor (read-only), admin (any tenant).';

ALTER TABLE orch8.builtin_handlers DROP CONSTRAINT builtin_handlers_kind_check;
ALTER TABLE orch8.builtin_handlers ADD CONSTRAINT builtin_handlers_kind_check
CHECK (kind = any(orch8.effect_kinds()) AND kind <> 'worker');

ALTER TABLE orch8.effect_receipts DROP CONSTRAINT effect_receipts_kind_check;
ALTER TABLE orch8.effect_receipts ADD CONSTRAINT effect_receipts_kind_check
CHECK (kind = any(orch8.effect_kinds())) NOT VALID;
ALTER TABLE orch8.effect_receipts VALIDATE CONSTRAINT effect_receipts_kind_check;

ALTER TABLE orch8.webhook_subscriptions DROP CONSTRAINT webhook_subscriptions_events_check;
ALTER TABLE orch8.webhook_subscriptions ADD CONSTRAINT webhook_subscriptions_events_check
CHECK (cardinality(events) >= 1 AND events <@ orch8.webhook_events());

ALTER TABLE orch8.webhook_outbox DROP CONSTRAINT webhook_outbox_event_check;
ALTER TABLE orch8.webhook_outbox ADD CONSTRAINT webhook_outbox_event_check
CHECK (event = any(orch8.webhook_events())) NOT VALID;
ALTER TABLE orch8.webhook_outbox VALIDATE CONSTRAINT webhook_outbox_event_check;

ALTER TABLE orch8.webhook_outbox DROP CONSTRAINT webhook_outbox_state_check;
ALTER TABLE orch8.webhook_outbox ADD CONSTRAINT webhook_outbox_state_check
CHECK (state = any(orch8.outbox_states())) NOT VALID;
ALTER TABLE orch8.webhook_outbox VALIDATE CONSTRAINT webhook_outbox_state_check;

ALTER TABLE orch8.api_keys DROP CONSTRAINT api_keys_role_check;
ALTER TABLE orch8.api_keys ADD CONSTRAINT api_keys_role_check
CHECK (role = any(orch8.api_key_roles()));

-- Size limits --------------------------------------------------------------------------

CREATE FUNCTION orch8.limits()
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
    ('retry_max_attempts', 100, 'attempts', 'a step''s retry.max_attempts')
$$;

COMMENT ON FUNCTION orch8.limits() IS
'Every size limit the engine enforces, by name, with its unit and what it bounds. Read '
'one with orch8.limit_of(name); table CHECKs and functions do.';

CREATE FUNCTION orch8.limit_of(p_name text)
RETURNS bigint
LANGUAGE plpgsql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
DECLARE
    v_value bigint;
BEGIN
    SELECT l.value INTO v_value FROM orch8.limits() AS l WHERE l.name = p_name;
    IF v_value IS NULL THEN
        -- a typo must not make a CHECK vacuous
        RAISE EXCEPTION 'no limit named %', p_name USING ERRCODE = 'O8005';
    END IF;
    RETURN v_value;
END
$$;

COMMENT ON FUNCTION orch8.limit_of(text) IS
'The value of one limit of orch8.limits(); an unknown name raises O8005.';

ALTER TABLE orch8.task_instances DROP CONSTRAINT task_instances_idempotency_key_check;
ALTER TABLE orch8.task_instances ADD CONSTRAINT task_instances_idempotency_key_check
CHECK (octet_length(idempotency_key) BETWEEN 1 AND orch8.limit_of('idempotency_key_bytes'))
NOT VALID;
ALTER TABLE orch8.task_instances VALIDATE CONSTRAINT task_instances_idempotency_key_check;

ALTER TABLE orch8.effect_receipts DROP CONSTRAINT effect_receipts_idempotency_key_check;
ALTER TABLE orch8.effect_receipts ADD CONSTRAINT effect_receipts_idempotency_key_check
CHECK (octet_length(idempotency_key) <= orch8.limit_of('idempotency_key_bytes')) NOT VALID;
ALTER TABLE orch8.effect_receipts VALIDATE CONSTRAINT effect_receipts_idempotency_key_check;

ALTER TABLE orch8.effect_receipts DROP CONSTRAINT effect_receipts_provider_receipt_id_check;
ALTER TABLE orch8.effect_receipts ADD CONSTRAINT effect_receipts_provider_receipt_id_check
CHECK (octet_length(provider_receipt_id) <= orch8.limit_of('provider_receipt_id_bytes'))
NOT VALID;
ALTER TABLE orch8.effect_receipts VALIDATE CONSTRAINT effect_receipts_provider_receipt_id_check;

ALTER TABLE orch8.instance_kv_state DROP CONSTRAINT instance_kv_state_key_check;
ALTER TABLE orch8.instance_kv_state ADD CONSTRAINT instance_kv_state_key_check
CHECK (octet_length(key) BETWEEN 1 AND orch8.limit_of('state_key_bytes')) NOT VALID;
ALTER TABLE orch8.instance_kv_state VALIDATE CONSTRAINT instance_kv_state_key_check;

-- Identifier patterns --------------------------------------------------------------------
-- Each domain's comment is the rule in words; error messages and docs quote it.

CREATE DOMAIN orch8.identifier AS text
CONSTRAINT identifier_pattern CHECK (value ~ '^[A-Za-z0-9_.-]{1,100}$');

COMMENT ON DOMAIN orch8.identifier IS
'1 to 100 characters among A-Z a-z 0-9 _ . -';

CREATE DOMAIN orch8.sequence_name AS text
CONSTRAINT sequence_name_pattern CHECK (value ~ '^[A-Za-z0-9_.-]{1,200}$');

COMMENT ON DOMAIN orch8.sequence_name IS
'1 to 200 characters among A-Z a-z 0-9 _ . -';

CREATE DOMAIN orch8.signal_type AS text
CONSTRAINT signal_type_pattern CHECK (value ~ '^[A-Za-z0-9_.:-]{1,100}$');

COMMENT ON DOMAIN orch8.signal_type IS
'1 to 100 characters among A-Z a-z 0-9 _ . : -';

ALTER TABLE orch8.sequences DROP CONSTRAINT sequences_namespace_check;
ALTER TABLE orch8.sequences DROP CONSTRAINT sequences_name_check;
ALTER TABLE orch8.sequences
ALTER COLUMN namespace TYPE orch8.identifier,
ALTER COLUMN name TYPE orch8.sequence_name;

ALTER TABLE orch8.instance_signals DROP CONSTRAINT instance_signals_signal_type_check;
ALTER TABLE orch8.instance_signals ALTER COLUMN signal_type TYPE orch8.signal_type;

-- Whitespace is spelled out, not \s or [:space:]: those differ between PostgreSQL, Python,
-- Rust (pydantic) and ECMA-262 (the OpenAPI document), and this pattern is read by all four.
CREATE DOMAIN orch8.webhook_url AS text
-- (one literal: orch8_py/rules.py reads the pattern back from the constraint)
CONSTRAINT webhook_url_pattern CHECK (
    value ~ '^[Hh][Tt][Tt][Pp][Ss]?://[^/?#\x00\t\n\x0B\f\r \x85\xA0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000\uFEFF]+[^\x00\t\n\x0B\f\r \x85\xA0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000\uFEFF]*$'  -- noqa: LT05
);

COMMENT ON DOMAIN orch8.webhook_url IS
'an http:// or https:// URL with a host (no spaces)';

ALTER TABLE orch8.webhook_subscriptions DROP CONSTRAINT webhook_subscriptions_url_check;
ALTER TABLE orch8.webhook_subscriptions ALTER COLUMN url TYPE orch8.webhook_url;

CREATE FUNCTION orch8.fits_domain(p_value text, p_domain regtype)
RETURNS boolean
LANGUAGE plpgsql
STABLE
AS $$
BEGIN
    IF p_value IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('SELECT %L::%s', p_value, p_domain);
    RETURN true;
EXCEPTION WHEN check_violation THEN
    RETURN false;
END
$$;

COMMENT ON FUNCTION orch8.fits_domain(text, regtype) IS
'Whether p_value is a value of the domain (its CHECK holds); NULL never fits.';

CREATE FUNCTION orch8.require_domain(p_value text, p_domain regtype, p_what text)
RETURNS text
LANGUAGE plpgsql
STABLE
AS $$
BEGIN
    IF orch8.fits_domain(p_value, p_domain) THEN
        RETURN p_value;
    END IF;
    RAISE EXCEPTION 'invalid %: %', p_what, coalesce(quote_literal(p_value), 'NULL')
        USING ERRCODE = 'O8008',
              DETAIL = json_build_object('field', p_what,
                                         'rule', obj_description(p_domain, 'pg_type'))::text,
              HINT = format('a %s is %s', p_what, obj_description(p_domain, 'pg_type'));
END
$$;

COMMENT ON FUNCTION orch8.require_domain(text, regtype, text) IS
'p_value when it fits the domain (orch8.identifier, orch8.sequence_name, '
'orch8.signal_type), else O8008 "invalid <what>" with DETAIL {field, rule} (the rule is '
'the domain''s comment). NULL never fits.';

-- Resolving a receipt ----------------------------------------------------------------------

CREATE FUNCTION orch8.can_resolve_to(p_from orch8.effect_state, p_to orch8.effect_state)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
    SELECT p_from IN ('unknown', 'committed', 'verified')
           AND orch8.can_transition_to(p_from, p_to)
$$;

COMMENT ON FUNCTION orch8.can_resolve_to(orch8.effect_state, orch8.effect_state) IS
'The moves an operator may make with resolve_effect: unknown -> verified|committed|'
'compensated|abandoned and committed|verified -> compensated (the transitions that leave '
'a receipt nobody else will move).';

CREATE FUNCTION orch8.resolution_needs_evidence(p_to orch8.effect_state)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$ SELECT p_to IN ('abandoned', 'compensated') $$;

COMMENT ON FUNCTION orch8.resolution_needs_evidence(orch8.effect_state) IS
'Whether resolving to this state needs non-empty evidence: abandoned and compensated '
'(what was looked at to say it did not happen, or was undone).';

CREATE VIEW orch8.effect_resolutions AS
SELECT
    t.from_state,
    t.to_state,
    orch8.resolution_needs_evidence(t.to_state) AS needs_evidence
FROM orch8.effect_transitions AS t
WHERE orch8.can_resolve_to(t.from_state, t.to_state);

COMMENT ON VIEW orch8.effect_resolutions IS
'Every move resolve_effect accepts, one row each, and whether it needs evidence '
'(generated from can_resolve_to and resolution_needs_evidence).';

CREATE VIEW orch8.instance_transition_table AS
SELECT
    f.state AS from_state,
    t.state AS to_state
FROM unnest(enum_range(NULL::orch8.instance_state)) AS f (state)
CROSS JOIN unnest(enum_range(NULL::orch8.instance_state)) AS t (state)
WHERE orch8.instance_can_transition(f.state, t.state);

COMMENT ON VIEW orch8.instance_transition_table IS
'Every allowed instance move, one row each (generated from instance_can_transition).';

-- The builtin handlers this engine runs -------------------------------------------------
-- The other names are reserved (a custom handler may not take them) and a step naming
-- one is refused by validate_sequence as not supported yet.

ALTER TABLE orch8.builtin_handlers ADD COLUMN implemented boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN orch8.builtin_handlers.implemented IS
'Whether orch8-py runs this builtin. A step naming an unimplemented one is refused by '
'validate_sequence ("not supported yet").';

UPDATE orch8.builtin_handlers SET implemented = true
WHERE name IN (
    'http_request', 'llm_call', 'tool_call', 'noop', 'log', 'sleep', 'fail', 'assert',
    'transform', 'set_state', 'get_state', 'delete_state', 'merge_state'
);

-- Views the front ends share --------------------------------------------------------------

CREATE VIEW orch8.instance_overview WITH (security_invoker = true) AS
SELECT
    t.tenant_id,
    t.id,
    t.sequence_id,
    s.namespace::text AS sequence_namespace,
    s.name::text AS sequence_name,
    t.sequence_version,
    t.state,
    t.requested_state,
    t.current_block,
    t.priority,
    t.idempotency_key,
    t.parent_instance_id,
    t.error,
    t.next_fire_at,
    t.created_at,
    t.updated_at,
    t.context,
    t.lease_owner,
    t.lease_expires_at
FROM orch8.task_instances AS t
LEFT JOIN orch8.sequences AS s ON t.tenant_id = s.tenant_id AND t.sequence_id = s.id;

COMMENT ON VIEW orch8.instance_overview IS
'Instances with the namespace and name of their sequence: what the API, the CLI and '
'the console list and show.';

CREATE VIEW orch8.effect_receipt_overview WITH (security_invoker = true) AS
SELECT
    r.tenant_id,
    r.id,
    r.continuity_id,
    r.epoch,
    r.instance_id,
    r.block_id,
    r.attempt,
    r.kind,
    r.state,
    r.handler,
    r.destination_fingerprint,
    r.request_sha256,
    r.idempotency_key,
    r.provider_receipt_id,
    r.error,
    r.evidence,
    r.created_at,
    r.updated_at,
    orch8.now() - r.created_at AS age,
    t.state AS instance_state
FROM orch8.effect_receipts AS r
LEFT JOIN orch8.task_instances AS t ON r.tenant_id = t.tenant_id AND r.instance_id = t.id;

COMMENT ON VIEW orch8.effect_receipt_overview IS
'Receipts with their age and the state of their instance: what the API, the CLI and the '
'console show of one receipt or list for an instance.';

CREATE VIEW orch8.sequence_overview WITH (security_invoker = true) AS
SELECT DISTINCT ON (s.tenant_id, s.namespace, s.name)
    s.tenant_id,
    s.namespace::text AS namespace,
    s.name::text AS name,
    s.id AS latest_id,
    s.version AS latest_version,
    count(*) OVER (PARTITION BY s.tenant_id, s.namespace, s.name) AS versions,
    jsonb_array_length(coalesce(s.definition -> 'blocks', '[]')) AS blocks,
    s.created_at AS latest_created_at
FROM orch8.sequences AS s
ORDER BY s.tenant_id ASC, s.namespace ASC, s.name ASC, s.version DESC;

COMMENT ON VIEW orch8.sequence_overview IS
'One row per sequence name: its latest version (id, number, block count, when it was '
'created) and how many versions it has.';

-- Signatures sql/functions/ now defines differently ------------------------------------

-- finish_step no longer takes p_next_block (it finds the next block itself) and returns
-- the next block and its attempt besides the state.
DROP FUNCTION IF EXISTS orch8.finish_step(
    text, uuid, uuid, text, integer, uuid, text, jsonb, text, interval, text
);
-- claim_work also returns each instance's current attempt.
DROP FUNCTION IF EXISTS orch8.claim_work(text, integer, interval);

-- Engine errors carry their facts in DETAIL as a JSON object (docs/SQL_API.md).
CREATE OR REPLACE FUNCTION orch8.effect_receipts_guard()
RETURNS trigger
LANGUAGE plpgsql
AS $$
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
                  DETAIL = json_build_object('effect_id', old.id)::text,
                  HINT = 'resolve it instead: orch8.resolve_effect()';
    END IF;
    IF (new.tenant_id, new.id, new.continuity_id, new.epoch, new.instance_id, new.block_id,
        new.attempt, new.kind, new.handler, new.destination_fingerprint, new.request_sha256,
        new.created_at)
       IS DISTINCT FROM
       (old.tenant_id, old.id, old.continuity_id, old.epoch, old.instance_id, old.block_id,
        old.attempt, old.kind, old.handler, old.destination_fingerprint, old.request_sha256,
        old.created_at) THEN
        RAISE EXCEPTION 'the identity of receipt % cannot change', old.id
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('effect_id', old.id)::text;
    END IF;
    IF new.state IS DISTINCT FROM old.state
       AND NOT orch8.can_transition_to(old.state, new.state) THEN
        RAISE EXCEPTION 'receipt % cannot move from % to %', old.id, old.state, new.state
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('effect_id', old.id,
                                             'current_state', old.state)::text;
    END IF;
    RETURN new;
END
$$;
