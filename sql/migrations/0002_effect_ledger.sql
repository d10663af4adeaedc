-- The effect ledger: receipts written before dispatch, their state machine, the
-- append-only event history, invariants and their results.
-- The functions that move receipts live in sql/functions/effects.sql.

CREATE TYPE orch8.effect_state AS ENUM (
    'planned',      -- decided to do it
    'prepared',     -- receipt durably written, nothing sent yet
    'dispatched',   -- sent (or about to be); outcome not known
    'committed',    -- the provider confirmed
    'unknown',      -- sent, no answer: only outside evidence moves it on
    'verified',     -- reconciled against the provider afterwards
    'compensated',  -- undone by a compensating action
    'abandoned'     -- written off (or proven never sent), with evidence
);

COMMENT ON TYPE orch8.effect_state IS
'States of an effect receipt. Moves are limited to orch8.can_transition_to().';

CREATE FUNCTION orch8.can_transition_to(
    p_from orch8.effect_state, p_to orch8.effect_state
)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
    SELECT CASE p_from
        WHEN 'planned' THEN p_to IN ('prepared', 'abandoned')
        WHEN 'prepared' THEN p_to IN ('dispatched', 'abandoned')
        WHEN 'dispatched' THEN p_to IN ('committed', 'unknown')
        WHEN 'unknown' THEN p_to IN ('verified', 'committed', 'compensated', 'abandoned')
        WHEN 'committed' THEN p_to = 'compensated'
        WHEN 'verified' THEN p_to = 'compensated'
        ELSE false
    END
$$;

COMMENT ON FUNCTION orch8.can_transition_to(orch8.effect_state, orch8.effect_state) IS
'The receipt transition table: planned->prepared|abandoned; prepared->dispatched|abandoned; '
'dispatched->committed|unknown; unknown->verified|committed|compensated|abandoned; '
'committed|verified->compensated. Nothing else; unknown never returns to dispatched. '
'Enforced on every write by the trigger on orch8.effect_receipts.';

CREATE VIEW orch8.effect_transitions AS
SELECT
    f.state AS from_state,
    t.state AS to_state
FROM unnest(enum_range(NULL::orch8.effect_state)) AS f (state)
CROSS JOIN unnest(enum_range(NULL::orch8.effect_state)) AS t (state)
WHERE orch8.can_transition_to(f.state, t.state);

COMMENT ON VIEW orch8.effect_transitions IS
'Every allowed receipt move, one row each (generated from orch8.can_transition_to).';

-- Builtin handlers: which have side effects, and the effect kind of those that do.
-- Any handler not listed here is somebody's own code: side-effecting, kind worker.
CREATE TABLE orch8.builtin_handlers (
    name text PRIMARY KEY,
    has_side_effects boolean NOT NULL,
    kind text CHECK (kind IN ('http', 'model', 'message', 'storage', 'custom')),
    CHECK (has_side_effects = (kind IS NOT NULL))
);

COMMENT ON TABLE orch8.builtin_handlers IS
'The builtin handler names, whether each reaches outside the engine, and its effect kind. '
'Names not listed are side-effecting with kind worker (classify pessimistically).';

INSERT INTO orch8.builtin_handlers (name, has_side_effects, kind) VALUES
('http_request', true, 'http'),
('llm_call', true, 'model'),
('agent', true, 'model'),
('embed', true, 'model'),
('emit_event', true, 'message'),
('send_signal', true, 'message'),
('memory_store', true, 'storage'),
('memory_delete', true, 'storage'),
('blob_put', true, 'storage'),
('tool_call', true, 'custom'),
('mcp_call', true, 'custom'),
('self_modify', true, 'custom'),
('noop', false, NULL),
('log', false, NULL),
('sleep', false, NULL),
('fail', false, NULL),
('assert', false, NULL),
('transform', false, NULL),
('set_state', false, NULL),
('get_state', false, NULL),
('delete_state', false, NULL),
('merge_state', false, NULL),
('human_review', false, NULL),
('query_instance', false, NULL),
('memory_search', false, NULL),
('blob_get', false, NULL),
('wait_for_event', false, NULL);

-- One ledger scope per instance lineage. For an ordinary instance the ids are derived
-- from the instance id (orch8.ensure_effect_scope), so concurrent callers converge.
CREATE TABLE orch8.continuity_executions (
    tenant_id text NOT NULL,
    continuity_id uuid NOT NULL,
    epoch bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    owner_runtime_id uuid NOT NULL,
    current_instance_id uuid NOT NULL,
    state text NOT NULL DEFAULT 'owned'
    CHECK (state IN ('owned', 'transferring', 'completed')),
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    updated_at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, continuity_id),
    UNIQUE (tenant_id, current_instance_id)
);

COMMENT ON TABLE orch8.continuity_executions IS
'Ledger scopes: which continuity (and ownership epoch) an instance''s receipts belong to.';

CREATE TABLE orch8.effect_receipts (
    tenant_id text NOT NULL,
    id uuid NOT NULL,
    continuity_id uuid NOT NULL,
    epoch bigint NOT NULL CHECK (epoch >= 0),
    instance_id uuid NOT NULL,
    block_id text NOT NULL CHECK (block_id <> ''),
    attempt integer NOT NULL CHECK (attempt >= 0),
    kind text NOT NULL
    CHECK (kind IN ('http', 'model', 'message', 'storage', 'custom', 'worker')),
    state orch8.effect_state NOT NULL DEFAULT 'planned',
    handler text NOT NULL CHECK (handler <> ''),
    destination_fingerprint text NOT NULL CHECK (destination_fingerprint ~ '^[0-9a-f]{64}$'),
    request_sha256 text NOT NULL CHECK (request_sha256 ~ '^[0-9a-f]{64}$'),
    idempotency_key text CHECK (octet_length(idempotency_key) <= 256),
    provider_receipt_id text CHECK (octet_length(provider_receipt_id) <= 256),
    error text,
    evidence jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(evidence) = 'object'),
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    updated_at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, continuity_id)
    REFERENCES orch8.continuity_executions (tenant_id, continuity_id)
);

COMMENT ON TABLE orch8.effect_receipts IS
'One receipt per side effect, written before dispatch. Never deleted; state moves only '
'along orch8.can_transition_to (enforced by trigger), each recorded in effect_receipt_events.';

-- begin: the receipts of one (instance, block, attempt)
CREATE INDEX effect_receipts_position_idx ON orch8.effect_receipts (
    tenant_id, continuity_id, instance_id, block_id, attempt, created_at DESC
);
-- the commit guard: receipts with the same content in one continuity
CREATE INDEX effect_receipts_content_idx ON orch8.effect_receipts (
    tenant_id, continuity_id, kind, destination_fingerprint, request_sha256
);
-- listing a continuity's or an instance's receipts in order
CREATE INDEX effect_receipts_continuity_idx ON orch8.effect_receipts (
    tenant_id, continuity_id, created_at, id
);
CREATE INDEX effect_receipts_instance_idx ON orch8.effect_receipts (
    tenant_id, instance_id, created_at, id
);
-- the operator queue: small, because resolved receipts drop out
CREATE INDEX effect_receipts_unresolved_idx ON orch8.effect_receipts (tenant_id, updated_at)
WHERE state IN ('dispatched', 'unknown');

CREATE TABLE orch8.effect_receipt_events (
    tenant_id text NOT NULL,
    receipt_id uuid NOT NULL,
    event_id bigint GENERATED ALWAYS AS IDENTITY,
    from_state orch8.effect_state,
    to_state orch8.effect_state NOT NULL,
    actor text NOT NULL,
    note text,
    evidence jsonb,
    at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, receipt_id, event_id),
    FOREIGN KEY (tenant_id, receipt_id) REFERENCES orch8.effect_receipts (tenant_id, id)
);

COMMENT ON TABLE orch8.effect_receipt_events IS
'Append-only history of every receipt write: creation (from_state NULL) and each move, '
'with who did it, a note and the evidence given. Written by trigger.';

-- Declared invariants. Until sequences exist they can be declared for one instance;
-- a sequence-scoped declaration names the sequence (and optionally one version).
CREATE TABLE orch8.workflow_invariants (
    tenant_id text NOT NULL,
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    name text NOT NULL CHECK (name <> ''),
    rule jsonb NOT NULL CHECK (jsonb_typeof(rule) = 'object'),
    commit_guard boolean NOT NULL DEFAULT false,
    enabled boolean NOT NULL DEFAULT true,
    sequence_id uuid,
    sequence_version integer CHECK (sequence_version >= 1),
    instance_id uuid,
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, id),
    CHECK ((sequence_id IS NULL) <> (instance_id IS NULL)),
    CHECK (sequence_version IS NULL OR sequence_id IS NOT NULL),
    CHECK (NOT commit_guard OR rule ->> 'type' = 'effect_at_most_once')
);

COMMENT ON TABLE orch8.workflow_invariants IS
'Invariants declared for a sequence (all versions or one) or, for tests and one-off '
'protection, for a single instance. effect_at_most_once with commit_guard makes '
'dispatch of that effect kind a serialised, content-checked decision.';

CREATE INDEX workflow_invariants_instance_idx ON orch8.workflow_invariants (
    tenant_id, instance_id
) WHERE instance_id IS NOT NULL;
CREATE INDEX workflow_invariants_sequence_idx ON orch8.workflow_invariants (
    tenant_id, sequence_id, sequence_version
) WHERE sequence_id IS NOT NULL;

CREATE TABLE orch8.invariant_results (
    tenant_id text NOT NULL,
    id bigint GENERATED ALWAYS AS IDENTITY,
    invariant_id uuid NOT NULL,
    continuity_id uuid NOT NULL,
    epoch bigint NOT NULL,
    instance_id uuid NOT NULL,
    block_id text NOT NULL,
    status text NOT NULL CHECK (status IN ('pass', 'fail')),
    effect_id uuid NOT NULL,
    competing_effect_id uuid,
    evidence jsonb NOT NULL,
    dedupe_key text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, dedupe_key),
    FOREIGN KEY (tenant_id, invariant_id) REFERENCES orch8.workflow_invariants (tenant_id, id)
);

COMMENT ON TABLE orch8.invariant_results IS
'Guard decisions, appended and deduplicated by a hash of (invariant, continuity, epoch, '
'evidence): one pass row for a first dispatch, one fail row however many duplicates follow.';

-- Enforcement in the database: whatever the write path (our functions, a DBA's UPDATE),
-- receipts are born planned, move only along the table, keep their identity, and are
-- never deleted; their history is never rewritten.

CREATE FUNCTION orch8.effect_receipts_guard()
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
            USING ERRCODE = 'O8004';
    END IF;
    IF new.state IS DISTINCT FROM old.state
       AND NOT orch8.can_transition_to(old.state, new.state) THEN
        RAISE EXCEPTION 'receipt % cannot move from % to %', old.id, old.state, new.state
            USING ERRCODE = 'O8004',
                  DETAIL = format('current state: %s', old.state);
    END IF;
    RETURN new;
END
$$;

COMMENT ON FUNCTION orch8.effect_receipts_guard() IS
'Trigger: receipts are created planned, move only along can_transition_to, keep their '
'identity columns, and are never deleted (SQLSTATE O8004).';

CREATE FUNCTION orch8.effect_receipts_record_event()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF tg_op = 'UPDATE' AND new.state = old.state THEN
        RETURN NULL;  -- not a transition (e.g. the no-op upsert in ensure_effect_receipt)
    END IF;
    INSERT INTO orch8.effect_receipt_events (
        tenant_id, receipt_id, from_state, to_state, actor, note, evidence
    ) VALUES (
        new.tenant_id,
        new.id,
        CASE WHEN tg_op = 'UPDATE' THEN old.state END,
        new.state,
        coalesce(nullif(current_setting('orch8.event_actor', true), ''), current_user),
        nullif(current_setting('orch8.event_note', true), ''),
        nullif(current_setting('orch8.event_evidence', true), '')::jsonb
    );
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.effect_receipts_record_event() IS
'Trigger: appends one effect_receipt_events row per receipt creation and state move. '
'Actor, note and evidence come from the transaction settings orch8.event_actor, '
'orch8.event_note and orch8.event_evidence (set by the ledger functions; a direct '
'UPDATE is attributed to current_user).';

CREATE FUNCTION orch8.refuse_history_rewrite()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION '% on %.% is not allowed: this history is append-only',
        tg_op, tg_table_schema, tg_table_name
        USING ERRCODE = 'O8004';
END
$$;

COMMENT ON FUNCTION orch8.refuse_history_rewrite() IS
'Trigger: refuses UPDATE, DELETE and TRUNCATE on append-only tables (SQLSTATE O8004).';

CREATE TRIGGER effect_receipts_guard
BEFORE INSERT OR UPDATE OR DELETE ON orch8.effect_receipts
FOR EACH ROW EXECUTE FUNCTION orch8.effect_receipts_guard();

CREATE TRIGGER effect_receipts_no_truncate
BEFORE TRUNCATE ON orch8.effect_receipts
FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TRIGGER effect_receipts_record_event
AFTER INSERT OR UPDATE OF state ON orch8.effect_receipts
FOR EACH ROW EXECUTE FUNCTION orch8.effect_receipts_record_event();

CREATE TRIGGER effect_receipt_events_append_only
BEFORE UPDATE OR DELETE ON orch8.effect_receipt_events
FOR EACH ROW EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TRIGGER effect_receipt_events_no_truncate
BEFORE TRUNCATE ON orch8.effect_receipt_events
FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TRIGGER invariant_results_append_only
BEFORE UPDATE OR DELETE ON orch8.invariant_results
FOR EACH ROW EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TRIGGER invariant_results_no_truncate
BEFORE TRUNCATE ON orch8.invariant_results
FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite();

-- What begin_effect and the settle functions return: an outcome, not an exception, so
-- that what they wrote (a receipt moved to unknown, an invariant result) survives.
CREATE TYPE orch8.effect_outcome AS (
    -- begin: dispatched|blocked|duplicate|stale; settle: committed|unknown|abandoned|stale
    outcome text,
    effect_id uuid,
    state orch8.effect_state,     -- the receipt's state after the call
    kind text,
    block_id text,
    attempt integer,
    invariant_id uuid,            -- duplicate: the invariant that refused
    competing_effect_id uuid,     -- duplicate: the receipt that holds the content
    detail text
);

COMMENT ON TYPE orch8.effect_outcome IS
'Result of begin_effect, the guarded dispatch and the settle functions. outcome is '
'dispatched, blocked, duplicate or stale (begin), or committed, unknown, abandoned or '
'stale (settle).';
