-- Unknown outcomes that finish the job: the idempotency key on every outcome, the
-- __unsettled__ sentinel (an ambiguous outcome waiting to be settled), waiting ->
-- completed (a verifier settled the last step), the named sets and limits of verifiers,
-- and the verifications a runner works through.

ALTER TYPE orch8.effect_outcome ADD ATTRIBUTE idempotency_key text;

COMMENT ON TYPE orch8.effect_outcome IS
'Result of begin_effect, the guarded dispatch and the settle functions. outcome is '
'dispatched, blocked, duplicate or stale (begin), or committed, unknown, abandoned or '
'stale (settle); idempotency_key is the key the receipt records (what the handler sends).';

ALTER TABLE orch8.block_outputs DROP CONSTRAINT block_outputs_sentinel_check;
ALTER TABLE orch8.block_outputs ADD CONSTRAINT block_outputs_sentinel_check
CHECK (sentinel IN ('__in_progress__', '__retry__', '__error__', '__unsettled__'));

CREATE OR REPLACE FUNCTION orch8.instance_can_transition(
    p_from orch8.instance_state, p_to orch8.instance_state
)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
    SELECT CASE p_from
        WHEN 'scheduled' THEN p_to IN ('running', 'paused', 'cancelled')
        WHEN 'running' THEN p_to IN (
            'scheduled', 'waiting', 'paused', 'completed', 'failed', 'cancelled'
        )
        WHEN 'waiting' THEN p_to IN ('scheduled', 'paused', 'completed', 'failed', 'cancelled')
        WHEN 'paused' THEN p_to IN ('scheduled', 'cancelled')
        WHEN 'failed' THEN p_to IN ('scheduled', 'completed')
        ELSE false
    END
$$;

COMMENT ON FUNCTION orch8.instance_can_transition(orch8.instance_state, orch8.instance_state) IS
'The instance transition table: scheduled->running|paused|cancelled; running->scheduled|'
'waiting|paused|completed|failed|cancelled; waiting->scheduled|paused|completed|failed|'
'cancelled (completed when a verifier settled the last step); paused->scheduled|'
'cancelled; failed->scheduled|completed (operator retry, completed when the last step is '
'settled from evidence). completed and cancelled are final.';

-- Named sets -------------------------------------------------------------------------

CREATE FUNCTION orch8.ambiguity_modes()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['same_key', 'new_attempt', 'settle'] $$;

COMMENT ON FUNCTION orch8.ambiguity_modes() IS
'What a step does after an ambiguous outcome (retry.on_ambiguous): same_key (retry, '
'resending under the same idempotency key), new_attempt (retry under a new key), settle '
'(never resend: the step''s verifier or an operator settles the receipt first).';

CREATE FUNCTION orch8.verification_methods()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['http', 'replay', 'handler'] $$;

COMMENT ON FUNCTION orch8.verification_methods() IS
'How a verifier settles an unknown receipt: http (a lookup request and two expressions), '
'replay (the identical request under the same key), handler (the Python verifier '
'registered beside the step''s handler).';

CREATE FUNCTION orch8.verification_states()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['pending', 'escalated', 'settled'] $$;

COMMENT ON FUNCTION orch8.verification_states() IS
'The states of a verification: pending (tries left), escalated (every try was '
'inconclusive: left to people), settled (the receipt left unknown, by the verifier or '
'anyone else).';

CREATE FUNCTION orch8.verify_http_methods()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['GET', 'POST'] $$;

COMMENT ON FUNCTION orch8.verify_http_methods() IS
'The methods of a verifier''s lookup request (verify.http.method; GET by default).';

CREATE FUNCTION orch8.default_verify_schedule()
RETURNS integer[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY[1000, 5000, 30000, 120000, 600000] $$;

COMMENT ON FUNCTION orch8.default_verify_schedule() IS
'verify.schedule when a step gives none: milliseconds before each try (1 s, 5 s, 30 s, '
'2 min, 10 min); after the last inconclusive try the receipt is escalated.';

-- Size limits: the earlier ones, and the verifier's ---------------------------------------

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
     'the output a resolution carries for the step (JSON text)')
$$;

COMMENT ON FUNCTION orch8.limits() IS
'Every size limit the engine enforces, by name, with its unit and what it bounds. Read '
'one with orch8.limit_of(name); table CHECKs and functions do.';

-- Verifications ------------------------------------------------------------------------

CREATE TABLE orch8.effect_verifications (
    tenant_id text NOT NULL,
    effect_id uuid NOT NULL,
    method text NOT NULL CHECK (method = any(orch8.verification_methods())),
    handler text NOT NULL,
    state text NOT NULL DEFAULT 'pending' CHECK (state = any(orch8.verification_states())),
    schedule integer[] NOT NULL CHECK (cardinality(schedule) >= 1),
    tries integer NOT NULL DEFAULT 0 CHECK (tries >= 0),
    next_at timestamptz NOT NULL,
    lease_owner text,
    lease_token uuid,
    lease_expires_at timestamptz,
    last_result jsonb,
    requested_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    updated_at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, effect_id),
    FOREIGN KEY (tenant_id, effect_id) REFERENCES orch8.effect_receipts (tenant_id, id)
);

COMMENT ON TABLE orch8.effect_verifications IS
'One row per unknown receipt a verifier should settle: how (method, from the step''s '
'verify), when (schedule: ms before each try; tries counted at claim), and who holds it '
'(a lease, like an instance''s). Moves only through the functions of '
'sql/functions/verifications.sql.';

-- the verifier's claim: due pending rows
CREATE INDEX effect_verifications_due_idx ON orch8.effect_verifications (next_at)
WHERE state = 'pending';

SELECT orch8.enable_tenant_isolation('orch8.effect_verifications');

-- Signatures that sql/functions/ now defines differently: resolve_effect takes the
-- expected state (required) before the target and an output; retry_instance an output.
DROP FUNCTION IF EXISTS orch8.resolve_effect(
    text, uuid, orch8.effect_state, text, jsonb, text, text, orch8.effect_state
);
DROP FUNCTION IF EXISTS orch8.retry_instance(text, uuid, text);

CREATE FUNCTION orch8.retry_defaults()
RETURNS TABLE (field text, value numeric)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    VALUES ('max_attempts', 3), ('initial_backoff', 1000), ('max_backoff', 60000),
           ('backoff_multiplier', 2)
$$;

COMMENT ON FUNCTION orch8.retry_defaults() IS
'The retry policy of a step that gives no retry field: attempts in all 3, first backoff '
'1000 ms, longest 60000 ms, multiplier 2. The runner (rules.py) and the verifier read it.';

CREATE FUNCTION orch8.retry_default(p_field text)
RETURNS numeric
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$ SELECT d.value FROM orch8.retry_defaults() AS d WHERE d.field = p_field $$;

COMMENT ON FUNCTION orch8.retry_default(text) IS 'One value of orch8.retry_defaults().';

-- The template functions take the roots now (a verifier's lookup has its own).
DROP FUNCTION IF EXISTS orch8.template_expression_pattern();
DROP FUNCTION IF EXISTS orch8.sequence_template_problems(text);
DROP FUNCTION IF EXISTS orch8.sequence_params_problems(jsonb, text);
