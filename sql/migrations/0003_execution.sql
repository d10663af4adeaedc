-- Durable execution: sequences (versioned definitions), instances with lease-fenced
-- claiming, the append-only block outputs ledger, and the instance audit trail.
-- Functions live in sql/functions/sequences.sql and sql/functions/instances.sql.

CREATE TABLE orch8.sequences (
    tenant_id text NOT NULL,
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    namespace text NOT NULL DEFAULT 'default' CHECK (namespace ~ '^[A-Za-z0-9_.-]{1,100}$'),
    name text NOT NULL CHECK (name ~ '^[A-Za-z0-9_.-]{1,200}$'),
    version integer NOT NULL CHECK (version >= 1),
    definition jsonb NOT NULL CHECK (jsonb_typeof(definition) = 'object'),
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, namespace, name, version)
);

COMMENT ON TABLE orch8.sequences IS
'Workflow definitions: immutable, versioned per (tenant, namespace, name). '
'Created only through orch8.create_sequence, which validates them.';

CREATE TRIGGER sequences_immutable
BEFORE UPDATE OR DELETE ON orch8.sequences
FOR EACH ROW EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TYPE orch8.instance_state AS ENUM (
    'scheduled', 'running', 'waiting', 'paused', 'completed', 'failed', 'cancelled'
);

COMMENT ON TYPE orch8.instance_state IS
'States of a workflow instance; moves are limited to orch8.instance_can_transition().';

CREATE FUNCTION orch8.instance_can_transition(
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
        WHEN 'waiting' THEN p_to IN ('scheduled', 'paused', 'failed', 'cancelled')
        WHEN 'paused' THEN p_to IN ('scheduled', 'cancelled')
        WHEN 'failed' THEN p_to IN ('scheduled', 'completed')
        ELSE false
    END
$$;

COMMENT ON FUNCTION orch8.instance_can_transition(orch8.instance_state, orch8.instance_state) IS
'The instance transition table: scheduled->running|paused|cancelled; running->scheduled|'
'waiting|paused|completed|failed|cancelled; waiting->scheduled|paused|failed|cancelled; '
'paused->scheduled|cancelled; failed->scheduled|completed (operator retry, completed when '
'the last step is settled from evidence). completed and cancelled are final.';

CREATE TABLE orch8.task_instances (
    tenant_id text NOT NULL,
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    sequence_id uuid NOT NULL,
    sequence_version integer NOT NULL,
    state orch8.instance_state NOT NULL DEFAULT 'scheduled',
    context jsonb NOT NULL DEFAULT '{"data": {}, "config": {}, "runtime": {}}'
    CHECK (jsonb_typeof(context) = 'object'),
    current_block text,
    next_fire_at timestamptz NOT NULL DEFAULT orch8.now(),
    priority integer NOT NULL DEFAULT 0,
    parent_instance_id uuid,
    idempotency_key text CHECK (octet_length(idempotency_key) BETWEEN 1 AND 256),
    lease_owner text,
    lease_token uuid,
    lease_expires_at timestamptz,
    error text,
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    updated_at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, idempotency_key),
    FOREIGN KEY (tenant_id, sequence_id) REFERENCES orch8.sequences (tenant_id, id),
    -- a lease exists exactly while the instance runs
    CHECK ((state = 'running') = (lease_token IS NOT NULL)),
    CHECK ((lease_token IS NULL) = (lease_expires_at IS NULL)),
    CHECK ((lease_token IS NULL) = (lease_owner IS NULL))
) WITH (fillfactor = 80);

COMMENT ON TABLE orch8.task_instances IS
'Workflow runs. State moves are CAS calls in SQL that write orch8.instance_transitions; '
'a running instance carries a lease (owner, token, expiry) that fences every write.';

-- The claim: due scheduled instances by priority then time, across tenants.
CREATE INDEX task_instances_due_idx ON orch8.task_instances (priority DESC, next_fire_at)
WHERE state = 'scheduled';
-- The lease sweep: running instances by expiry.
CREATE INDEX task_instances_lease_idx ON orch8.task_instances (lease_expires_at)
WHERE state = 'running';
CREATE INDEX task_instances_listing_idx ON orch8.task_instances (tenant_id, created_at, id);
CREATE INDEX task_instances_parent_idx ON orch8.task_instances (tenant_id, parent_instance_id)
WHERE parent_instance_id IS NOT NULL;

CREATE TABLE orch8.instance_transitions (
    tenant_id text NOT NULL,
    instance_id uuid NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    from_state orch8.instance_state,
    to_state orch8.instance_state NOT NULL,
    actor text NOT NULL,
    reason text,
    at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, instance_id, seq),
    FOREIGN KEY (tenant_id, instance_id) REFERENCES orch8.task_instances (tenant_id, id)
);

COMMENT ON TABLE orch8.instance_transitions IS
'Audit trail: one row per instance creation and state change (append-only).';

CREATE TRIGGER instance_transitions_append_only
BEFORE UPDATE OR DELETE ON orch8.instance_transitions
FOR EACH ROW EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TRIGGER instance_transitions_no_truncate
BEFORE TRUNCATE ON orch8.instance_transitions
FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TABLE orch8.block_outputs (
    tenant_id text NOT NULL,
    instance_id uuid NOT NULL,
    block_id text NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    attempt integer NOT NULL CHECK (attempt >= 0),
    -- NULL for a real output; else __in_progress__, __retry__ or __error__
    sentinel text CHECK (sentinel IN ('__in_progress__', '__retry__', '__error__')),
    output jsonb,
    retryable boolean,
    effect_id uuid,
    -- the lease under which the row was written: lets a runner that lost the answer to
    -- begin_step or finish_step repeat the call safely under the same lease
    lease_token uuid,
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, instance_id, block_id, seq),
    FOREIGN KEY (tenant_id, instance_id) REFERENCES orch8.task_instances (tenant_id, id),
    CHECK (sentinel IS DISTINCT FROM '__error__' OR retryable IS NOT NULL)
);

COMMENT ON TABLE orch8.block_outputs IS
'Append-only ledger of step results. Sentinels: __in_progress__ (written with '
'begin_effect, before a side-effecting handler runs), __retry__ (retryable error), '
'__error__ (permanent). compute_attempt derives the attempt from the latest row.';

CREATE TRIGGER block_outputs_append_only
BEFORE UPDATE OR DELETE ON orch8.block_outputs
FOR EACH ROW EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TRIGGER block_outputs_no_truncate
BEFORE TRUNCATE ON orch8.block_outputs
FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite();
