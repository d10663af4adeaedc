-- Repeatable: the effect ledger's functions. Every receipt write goes through
-- cas_effect_receipt (one conditional UPDATE); a lost CAS is reported, never retried.

CREATE OR REPLACE FUNCTION orch8.handler_has_side_effects(p_handler text)
RETURNS boolean
LANGUAGE plpgsql
STABLE
STRICT
PARALLEL SAFE
AS $$
BEGIN
    RETURN (
        SELECT coalesce(
            (SELECT h.has_side_effects FROM orch8.builtin_handlers AS h WHERE h.name = p_handler),
            true
        )
    );
END
$$;

COMMENT ON FUNCTION orch8.handler_has_side_effects(text) IS
'True for side-effecting builtins and for every name that is not a builtin (somebody''s '
'own code cannot be proven harmless); false for pure builtins such as transform and log.';

CREATE OR REPLACE FUNCTION orch8.effect_kind(p_handler text)
RETURNS text
LANGUAGE plpgsql
STABLE
STRICT
PARALLEL SAFE
AS $$
BEGIN
    RETURN (
        SELECT CASE
            WHEN h.name IS NULL THEN 'worker'
            ELSE h.kind
        END
        FROM (SELECT 1) AS one
        LEFT JOIN orch8.builtin_handlers AS h ON h.name = p_handler
    );
END
$$;

COMMENT ON FUNCTION orch8.effect_kind(text) IS
'The effect kind of a handler: http_request http; llm_call, agent, embed model; '
'emit_event, send_signal message; memory_store, memory_delete, blob_put storage; '
'tool_call, mcp_call, self_modify custom; any non-builtin worker; NULL for pure builtins.';

CREATE OR REPLACE FUNCTION orch8.clear_event_attribution()
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    -- PL/pgSQL: called twice a step, where a SQL function would be planned each time
    PERFORM set_config('orch8.event_actor', '', true),
            set_config('orch8.event_note', '', true),
            set_config('orch8.event_evidence', '', true);
END
$$;

COMMENT ON FUNCTION orch8.clear_event_attribution() IS
'Clears the transaction settings that attribute the next receipt event (actor, note, '
'evidence), so a later direct write in the same transaction is credited to its caller '
'(attributed_actor).';

CREATE OR REPLACE FUNCTION orch8.ensure_effect_scope(p_tenant_id text, p_instance_id uuid)
RETURNS orch8.continuity_executions
LANGUAGE plpgsql
AS $$
DECLARE
    v_scope orch8.continuity_executions;
BEGIN
    IF p_tenant_id IS NULL OR p_tenant_id = '' OR p_instance_id IS NULL THEN
        RAISE EXCEPTION 'ensure_effect_scope needs a tenant and an instance id'
            USING ERRCODE = 'O8008';
    END IF;
    SELECT * INTO v_scope FROM orch8.continuity_executions AS c
     WHERE c.tenant_id = p_tenant_id AND c.current_instance_id = p_instance_id;
    IF found THEN
        RETURN v_scope;
    END IF;
    PERFORM orch8.instance_state_of(p_tenant_id, p_instance_id);  -- O8007 when missing
    -- Both ids derive from the instance id, so concurrent callers insert the same row;
    -- the loser's insert waits for the winner and then does nothing.
    INSERT INTO orch8.continuity_executions AS c (
        tenant_id, continuity_id, epoch, owner_runtime_id, current_instance_id,
        effect_id_version
    ) VALUES (
        p_tenant_id,
        orch8.effect_scope_id('orch8-effect-scope-v1', p_instance_id),
        0,
        orch8.effect_scope_id('orch8-effect-runtime-v1', p_instance_id),
        p_instance_id,
        2
    )
    ON CONFLICT DO NOTHING
    RETURNING * INTO v_scope;
    IF found THEN
        RETURN v_scope;
    END IF;
    SELECT * INTO STRICT v_scope FROM orch8.continuity_executions AS c
     WHERE c.tenant_id = p_tenant_id AND c.current_instance_id = p_instance_id;
    RETURN v_scope;
END
$$;

COMMENT ON FUNCTION orch8.ensure_effect_scope(text, uuid) IS
'The ledger scope (continuity execution) of an instance, created on first use with ids '
'derived from the instance id (epoch 0) and effect_id_version 2 (receipt ids that begin '
'with the instance''s time); concurrent callers converge on one row. An instance that '
'does not exist: O8007.';

CREATE OR REPLACE FUNCTION orch8.find_unresolved_effect_receipt(
    p_tenant_id text,
    p_continuity_id uuid,
    p_instance_id uuid,
    p_block_id text,
    p_attempt integer,
    p_id_version integer,
    p_epoch bigint
)
RETURNS orch8.effect_receipts
LANGUAGE plpgsql
STABLE
AS $$
DECLARE
    v_id uuid;
BEGIN
    -- A receipt of this position has the id effect_receipt_id derives for one epoch of
    -- the scope, and one that is dispatched or unknown has its row in open_receipts. So
    -- the search is a key lookup in that small table per epoch (one: epochs start at 0),
    -- not a search by position through every month of the partitioned receipts.
    FOR v_epoch IN REVERSE p_epoch .. 0 LOOP
        v_id := orch8.effect_receipt_id(p_id_version, p_continuity_id, v_epoch, p_instance_id,
                                        p_block_id, p_attempt);
        IF EXISTS (SELECT 1 FROM orch8.open_receipts AS o
                   WHERE o.tenant_id = p_tenant_id AND o.receipt_id = v_id) THEN
            RETURN orch8.load_effect_receipt(p_tenant_id, v_id);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.find_unresolved_effect_receipt(
    text, uuid, uuid, text, integer, integer, bigint
) IS
'The receipt of (continuity, instance, block, attempt) in dispatched or unknown, the '
'latest epoch''s first, or NULL: the trace of a run that may have sent and never '
'settled. p_id_version and p_epoch are the scope''s: the candidates are the ids '
'effect_receipt_id derives for each epoch up to p_epoch, looked up in open_receipts.';

CREATE OR REPLACE FUNCTION orch8.ensure_effect_receipt(
    p_tenant_id text,
    p_id uuid,
    p_continuity_id uuid,
    p_epoch bigint,
    p_instance_id uuid,
    p_block_id text,
    p_attempt integer,
    p_kind text,
    p_handler text,
    p_destination_fingerprint text,
    p_request_sha256 text,
    p_idempotency_key text DEFAULT NULL,
    p_evidence jsonb DEFAULT '{}'
)
RETURNS orch8.effect_receipts
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.effect_receipts;
BEGIN
    PERFORM set_config('orch8.event_actor', 'engine', true),
            set_config('orch8.event_note', 'receipt planned', true),
            set_config('orch8.event_evidence', '', true);
    -- The no-op DO UPDATE makes RETURNING yield the stored row, ours or a concurrent one.
    INSERT INTO orch8.effect_receipts AS r (
        tenant_id, id, continuity_id, epoch, instance_id, block_id, attempt, kind, state,
        handler, destination_fingerprint, request_sha256, idempotency_key, evidence
    ) VALUES (
        p_tenant_id, p_id, p_continuity_id, p_epoch, p_instance_id, p_block_id, p_attempt,
        p_kind, 'planned', p_handler, p_destination_fingerprint, p_request_sha256,
        p_idempotency_key, coalesce(p_evidence, '{}')
    )
    ON CONFLICT (tenant_id, id) DO UPDATE SET id = excluded.id
    RETURNING r.* INTO v_row;
    PERFORM orch8.clear_event_attribution();

    IF (v_row.tenant_id, v_row.id, v_row.continuity_id, v_row.epoch, v_row.instance_id,
        v_row.block_id, v_row.attempt, v_row.request_sha256)
       IS DISTINCT FROM
       (p_tenant_id, p_id, p_continuity_id, p_epoch, p_instance_id,
        p_block_id, p_attempt, p_request_sha256) THEN
        RAISE EXCEPTION 'deterministic effect id % collided with different effect evidence', p_id
            USING ERRCODE = 'O8005',
                  DETAIL = json_build_object(
                      'effect_id', p_id,
                      'stored', json_build_object('block_id', v_row.block_id,
                          'attempt', v_row.attempt, 'request_sha256', v_row.request_sha256),
                      'candidate', json_build_object('block_id', p_block_id,
                          'attempt', p_attempt, 'request_sha256', p_request_sha256))::text,
                  HINT = 'the resolved params of one attempt changed between runs '
                         '(a template using the time or a random value?)';
    END IF;
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION orch8.ensure_effect_receipt(
    text, uuid, uuid, bigint, uuid, text, integer, text, text, text, text, text, jsonb
) IS
'Upsert a planned receipt and return the stored row (ours or the one that won). If the '
'stored identity (id, tenant, continuity, epoch, instance, block, attempt, request hash) '
'differs from the candidate, raise O8005 invalid_config and never reuse the row.';

CREATE OR REPLACE FUNCTION orch8.insert_dispatched_receipt(
    p_tenant_id text,
    p_id uuid,
    p_continuity_id uuid,
    p_epoch bigint,
    p_instance_id uuid,
    p_block_id text,
    p_attempt integer,
    p_kind text,
    p_handler text,
    p_destination_fingerprint text,
    p_request_sha256 text,
    p_idempotency_key text
)
RETURNS orch8.effect_receipts
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.effect_receipts;
BEGIN
    PERFORM set_config('orch8.event_actor', 'engine', true),
            set_config('orch8.event_note', '', true),
            set_config('orch8.event_evidence', '', true);
    -- A receipt of this id already there (a concurrent run, an earlier one) is not ours to
    -- move: the caller takes the step by step path, which reads and checks it.
    INSERT INTO orch8.effect_receipts AS r (
        tenant_id, id, continuity_id, epoch, instance_id, block_id, attempt, kind, state,
        handler, destination_fingerprint, request_sha256, idempotency_key, evidence
    ) VALUES (
        p_tenant_id, p_id, p_continuity_id, p_epoch, p_instance_id, p_block_id, p_attempt,
        p_kind, 'dispatched', p_handler, p_destination_fingerprint, p_request_sha256,
        p_idempotency_key, '{}'
    )
    ON CONFLICT (tenant_id, id) DO NOTHING
    RETURNING r.* INTO v_row;
    PERFORM orch8.clear_event_attribution();
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION orch8.insert_dispatched_receipt(
    text, uuid, uuid, bigint, uuid, text, integer, text, text, text, text, text
) IS
'begin_effect''s one-write path: insert a new receipt already dispatched (its events '
'planned, prepared, dispatched are written by the trigger) and return it; a row of NULLs '
'when a receipt of that id exists (nothing written). Only for a receipt no commit guard '
'covers: the guarded dispatch must see it prepared.';

CREATE OR REPLACE FUNCTION orch8.swap_effect_receipt(
    p_tenant_id text,
    p_id uuid,
    p_expected orch8.effect_state,
    p_next orch8.effect_state,
    p_patch jsonb DEFAULT '{}'
)
RETURNS orch8.effect_receipts
LANGUAGE plpgsql
-- planned at each call: a plan cached while the table was nearly empty may pick any
-- index that starts with tenant_id and walk all of the tenant's receipts
-- (docs/ARCHITECTURE.md, "Lookups planned for the table they meet")
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    v_patch jsonb := coalesce(p_patch, '{}');
    v_unknown_keys text[];
    v_row orch8.effect_receipts;
BEGIN
    IF NOT orch8.can_transition_to(p_expected, p_next) THEN
        RAISE EXCEPTION 'receipt % cannot move from % to %', p_id, p_expected, p_next
            USING ERRCODE = 'O8004';
    END IF;
    IF jsonb_typeof(v_patch) <> 'object' THEN
        RAISE EXCEPTION 'patch must be a JSON object' USING ERRCODE = 'O8008';
    END IF;
    SELECT array_agg(k) INTO v_unknown_keys FROM jsonb_object_keys(v_patch) AS k
     WHERE k NOT IN ('provider_receipt_id', 'error', 'evidence', 'actor', 'note');
    IF v_unknown_keys IS NOT NULL THEN
        RAISE EXCEPTION 'unknown patch field(s): %', array_to_string(v_unknown_keys, ', ')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('fields', v_unknown_keys)::text,
                  HINT = 'allowed: provider_receipt_id, error, evidence, actor, note';
    END IF;
    IF v_patch ? 'evidence' AND jsonb_typeof(v_patch -> 'evidence') <> 'object' THEN
        RAISE EXCEPTION 'patch evidence must be a JSON object' USING ERRCODE = 'O8008';
    END IF;

    PERFORM set_config('orch8.event_actor', coalesce(v_patch ->> 'actor', 'engine'), true),
            set_config('orch8.event_note', coalesce(v_patch ->> 'note', ''), true),
            set_config('orch8.event_evidence', coalesce(v_patch ->> 'evidence', ''), true);

    UPDATE orch8.effect_receipts AS r
       SET state = p_next,
           updated_at = orch8.now(),
           provider_receipt_id = CASE WHEN v_patch ? 'provider_receipt_id'
                                      THEN v_patch ->> 'provider_receipt_id'
                                      ELSE r.provider_receipt_id END,
           error = CASE WHEN v_patch ? 'error' THEN v_patch ->> 'error' ELSE r.error END,
           evidence = r.evidence || coalesce(v_patch -> 'evidence', '{}')
     WHERE r.tenant_id = p_tenant_id
       AND r.id = p_id
       AND r.state = p_expected
    RETURNING r.* INTO v_row;
    PERFORM orch8.clear_event_attribution();
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION orch8.swap_effect_receipt(
    text, uuid, orch8.effect_state, orch8.effect_state, jsonb
) IS
'cas_effect_receipt that answers the receipt as the won CAS left it, or NULL (all fields) '
'when the CAS was lost: settle_effect reports the new state without reading it again.';

CREATE OR REPLACE FUNCTION orch8.cas_effect_receipt(
    p_tenant_id text,
    p_id uuid,
    p_expected orch8.effect_state,
    p_next orch8.effect_state,
    p_patch jsonb DEFAULT '{}'
)
RETURNS boolean
LANGUAGE sql
AS $$
    SELECT (orch8.swap_effect_receipt(p_tenant_id, p_id, p_expected, p_next, p_patch)).id
           IS NOT NULL
$$;

COMMENT ON FUNCTION orch8.cas_effect_receipt(
    text, uuid, orch8.effect_state, orch8.effect_state, jsonb
) IS
'Compare-and-swap a receipt: one UPDATE ... WHERE tenant_id, id AND state = expected. '
'Returns whether it won; a lost CAS means someone else moved the receipt and is never '
'retried. patch may set provider_receipt_id and error, merge evidence (an object), and '
'name the actor and note recorded in effect_receipt_events (the work is '
'swap_effect_receipt''s).';

CREATE OR REPLACE FUNCTION orch8.effect_outcome_of(
    p_outcome text,
    p_receipt orch8.effect_receipts,
    p_detail text DEFAULT NULL,
    p_invariant_id uuid DEFAULT NULL,
    p_competing_effect_id uuid DEFAULT NULL
)
RETURNS orch8.effect_outcome
LANGUAGE plpgsql
IMMUTABLE
AS $$
BEGIN
    -- PL/pgSQL: a SQL function returning a row type is not inlined, and would be planned
    -- again on every call
    RETURN ROW(
        p_outcome, (p_receipt).id, (p_receipt).state, (p_receipt).kind, (p_receipt).block_id,
        (p_receipt).attempt, p_invariant_id, p_competing_effect_id, p_detail,
        (p_receipt).idempotency_key
    )::orch8.effect_outcome;
END
$$;

COMMENT ON FUNCTION orch8.effect_outcome_of(
    text, orch8.effect_receipts, text, uuid, uuid
) IS 'Builds an effect_outcome from a receipt (internal helper).';

CREATE OR REPLACE FUNCTION orch8.load_effect_receipt(p_tenant_id text, p_id uuid)
RETURNS orch8.effect_receipts
LANGUAGE plpgsql
STABLE
-- planned at each call, as cas_effect_receipt
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    v_row orch8.effect_receipts;
BEGIN
    SELECT r.* INTO v_row FROM orch8.effect_receipts AS r WHERE r.tenant_id = p_tenant_id AND r.id = p_id;
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION orch8.load_effect_receipt(text, uuid) IS
'One receipt by tenant and id, or NULL.';

CREATE OR REPLACE FUNCTION orch8.find_receipts(p_tenant_id text, p_key text)
RETURNS SETOF orch8.effect_receipts
LANGUAGE plpgsql
STABLE
AS $$
DECLARE
    -- a key shaped like a UUID may be the receipt id itself (the default idempotency key)
    v_id uuid := CASE WHEN p_key ~* '^[0-9a-f]{8}-?([0-9a-f]{4}-?){3}[0-9a-f]{12}$'
                      THEN p_key::uuid END;
BEGIN
    -- the live receipts and the archived months (orch8.archive_history_month) alike
    RETURN QUERY
    WITH keyed AS (
        SELECT k.id FROM orch8.effect_receipts AS k
        WHERE k.tenant_id = p_tenant_id AND k.id = v_id
        UNION
        -- the partial index effect_receipts_idempotency_key_idx: keys other than the id
        SELECT k.id FROM orch8.effect_receipts AS k
        WHERE k.tenant_id = p_tenant_id AND k.idempotency_key = p_key
          AND k.idempotency_key <> k.id::text
        UNION
        SELECT a.id FROM orch8_archive.effect_receipts AS a
        WHERE a.tenant_id = p_tenant_id AND a.id = v_id
        UNION
        SELECT a.id FROM orch8_archive.effect_receipts AS a
        WHERE a.tenant_id = p_tenant_id AND a.idempotency_key = p_key
          AND a.idempotency_key <> a.id::text
        UNION
        SELECT p.receipt_id FROM orch8.receipt_provider_ids AS p
        WHERE p.tenant_id = p_tenant_id AND p.provider_receipt_id = p_key
    )
    SELECT r.* FROM orch8.effect_receipts AS r
    WHERE r.tenant_id = p_tenant_id AND r.id IN (SELECT keyed.id FROM keyed)
    UNION ALL
    SELECT a.* FROM orch8_archive.effect_receipts AS a
    WHERE a.tenant_id = p_tenant_id AND a.id IN (SELECT keyed.id FROM keyed)
    ORDER BY created_at, id;
END
$$;

COMMENT ON FUNCTION orch8.find_receipts(text, text) IS
'The tenant''s receipts a key a person holds points at, oldest first: the receipt whose '
'id it is, those sent with it as idempotency key, and those the provider answered with '
'it as receipt id; each path an index lookup (effect_receipts_pkey, '
'effect_receipts_idempotency_key_idx, receipt_provider_ids), however many receipts the '
'tenant has. Archived months (orch8_archive.effect_receipts) are searched the same way. '
'Empty when nothing matches.';

CREATE OR REPLACE FUNCTION orch8.effect_commit_guards(
    p_tenant_id text, p_instance_id uuid, p_kind text
)
RETURNS SETOF orch8.workflow_invariants
LANGUAGE sql
STABLE
AS $$
    SELECT i.*
    FROM orch8.workflow_invariants AS i
    WHERE i.tenant_id = p_tenant_id
      AND i.enabled
      AND i.commit_guard
      AND i.rule ->> 'type' = 'effect_at_most_once'
      AND i.rule ->> 'kind' = p_kind
      AND (
          i.instance_id = p_instance_id
          OR EXISTS (
              SELECT 1 FROM orch8.task_instances AS t
              WHERE t.tenant_id = p_tenant_id
                AND t.id = p_instance_id
                AND t.sequence_id = i.sequence_id
                AND (i.sequence_version IS NULL OR i.sequence_version = t.sequence_version)
          )
      )
    ORDER BY i.created_at, i.id
$$;

COMMENT ON FUNCTION orch8.effect_commit_guards(text, uuid, text) IS
'The enabled effect_at_most_once invariants with commit_guard for this effect kind that '
'cover the instance: declared for the instance itself, or for its sequence (all versions, '
'or the instance''s version).';

CREATE OR REPLACE FUNCTION orch8.declare_invariant(
    p_tenant_id text,
    p_name text,
    p_rule jsonb,
    p_commit_guard boolean DEFAULT false,
    p_instance_id uuid DEFAULT NULL,
    p_sequence_id uuid DEFAULT NULL,
    p_sequence_version integer DEFAULT NULL
)
RETURNS orch8.workflow_invariants
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.workflow_invariants;
    v_type text := p_rule ->> 'type';
    v_note text;
BEGIN
    IF p_rule IS NULL OR jsonb_typeof(p_rule) <> 'object' THEN
        RAISE EXCEPTION 'invariant rule must be a JSON object with a "type"'
            USING ERRCODE = 'O8005';
    END IF;
    SELECT CASE WHEN l.supported THEN NULL ELSE l.note END INTO v_note
    FROM orch8.sequence_language() AS l
    WHERE l.scope = 'invariant_type' AND l.field = v_type;
    IF NOT found THEN
        RAISE EXCEPTION 'unknown invariant type %', coalesce(v_type, '(missing)')
            USING ERRCODE = 'O8005', HINT = 'effect_at_most_once';
    END IF;
    IF v_note IS NOT NULL THEN
        RAISE EXCEPTION 'invariant type % is %', v_type, v_note
            USING ERRCODE = 'O8005', HINT = 'effect_at_most_once';
    END IF;
    IF coalesce(p_rule ->> 'kind', '') <> ALL (orch8.effect_kinds()) THEN
        RAISE EXCEPTION 'effect_at_most_once needs a kind (%), got %',
            array_to_string(orch8.effect_kinds(), ', '), coalesce(p_rule ->> 'kind', '(missing)')
            USING ERRCODE = 'O8005';
    END IF;
    IF NOT coalesce(p_commit_guard, false) THEN
        RAISE EXCEPTION 'effect_at_most_once is enforced as a commit guard: declare it with '
                        'commit_guard true (a check after the fact is not supported yet)'
            USING ERRCODE = 'O8005';
    END IF;
    IF (p_instance_id IS NULL) = (p_sequence_id IS NULL) THEN
        RAISE EXCEPTION 'declare an invariant for exactly one of an instance or a sequence'
            USING ERRCODE = 'O8005';
    END IF;
    IF p_instance_id IS NOT NULL THEN
        PERFORM orch8.instance_state_of(p_tenant_id, p_instance_id);  -- O8007 when missing
    END IF;
    IF p_sequence_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM orch8.sequences AS s
         WHERE s.tenant_id = p_tenant_id AND s.id = p_sequence_id) THEN
        RAISE EXCEPTION 'sequence % not found', p_sequence_id
            USING ERRCODE = 'O8007', DETAIL = json_build_object('sequence_id', p_sequence_id)::text;
    END IF;
    INSERT INTO orch8.workflow_invariants AS w (
        tenant_id, name, rule, commit_guard, instance_id, sequence_id, sequence_version
    ) VALUES (
        p_tenant_id, p_name, p_rule, true, p_instance_id, p_sequence_id, p_sequence_version
    )
    RETURNING w.* INTO v_row;
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION orch8.declare_invariant(text, text, jsonb, boolean, uuid, uuid, integer) IS
'Declare an invariant for one instance or for a sequence (one version or all). The one '
'rule this engine enforces is {"type":"effect_at_most_once","kind":K} as a commit guard '
'(p_commit_guard true); the other types of orch8.sequence_language() are not supported '
'yet. Anything else, or commit_guard false: O8005; an instance or sequence that does not '
'exist: O8007. The declaration is recorded in invariant_events.';

CREATE OR REPLACE FUNCTION orch8.append_invariant_result(
    p_invariant orch8.workflow_invariants,
    p_receipt orch8.effect_receipts,
    p_status text,
    p_competing_effect_id uuid
)
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO orch8.invariant_results (
        tenant_id, invariant_id, continuity_id, epoch, instance_id, block_id, status,
        effect_id, competing_effect_id, evidence, dedupe_key
    )
    SELECT
        (p_receipt).tenant_id, (p_invariant).id, (p_receipt).continuity_id,
        (p_receipt).epoch, (p_receipt).instance_id, (p_receipt).block_id, p_status,
        (p_receipt).id, p_competing_effect_id, ev.evidence,
        orch8.sha256_hex(concat_ws(':', (p_invariant).id, (p_receipt).continuity_id,
                                   (p_receipt).epoch, orch8.canonical_json(ev.evidence)))
    FROM (SELECT jsonb_build_object(
        'status', p_status,
        'kind', (p_receipt).kind,
        'destination_fingerprint', (p_receipt).destination_fingerprint,
        'request_sha256', (p_receipt).request_sha256
    ) AS evidence) AS ev
    ON CONFLICT (tenant_id, dedupe_key) DO NOTHING
$$;

COMMENT ON FUNCTION orch8.append_invariant_result(
    orch8.workflow_invariants, orch8.effect_receipts, text, uuid
) IS
'Record a guard decision, deduplicated by SHA-256 of invariant:continuity:epoch:evidence '
'where evidence is the canonical {status, kind, destination_fingerprint, request_sha256}.';

CREATE OR REPLACE FUNCTION orch8.dispatch_effect_receipt_at_most_once(
    p_tenant_id text, p_id uuid
)
RETURNS orch8.effect_outcome
LANGUAGE plpgsql
AS $$
DECLARE
    v_self orch8.effect_receipts;
    v_mine orch8.effect_receipts;
    v_other orch8.effect_receipts;
    v_competing orch8.effect_receipts;
    v_guard orch8.workflow_invariants;
    v_first_guard uuid;
    v_continuity uuid;
    v_kind text;
    v_destination text;
    v_request text;
BEGIN
    v_self := orch8.load_effect_receipt(p_tenant_id, p_id);
    IF v_self.id IS NULL THEN
        RETURN ROW('stale', p_id, NULL, NULL, NULL, NULL, NULL, NULL,
                   'receipt not found', NULL)::orch8.effect_outcome;
    END IF;
    -- Identity columns never change (trigger), so they can be read before the lock.
    v_mine := v_self;  -- the same-key exemption below reads its instance, block and key
    v_continuity := v_self.continuity_id;
    v_kind := v_self.kind;
    v_destination := v_self.destination_fingerprint;
    v_request := v_self.request_sha256;
    -- Serialise every caller dispatching this content in this continuity.
    PERFORM pg_advisory_xact_lock(hashtextextended(format('effect|%s|%s|%s|%s|%s',
        p_tenant_id, v_continuity, v_kind, v_destination, v_request), 0));

    v_self := NULL;
    FOR v_other IN
        SELECT r.* FROM orch8.effect_receipts AS r
         WHERE r.tenant_id = p_tenant_id
           AND r.continuity_id = v_continuity
           AND (r.id = p_id OR (r.kind = v_kind
                                AND r.destination_fingerprint = v_destination
                                AND r.request_sha256 = v_request))
         ORDER BY r.created_at, r.id
         FOR UPDATE
    LOOP
        IF v_other.id = p_id THEN
            v_self := v_other;
        ELSIF v_other.state = 'unknown' AND v_other.instance_id = v_mine.instance_id
              AND v_other.block_id = v_mine.block_id
              AND v_other.idempotency_key = v_mine.idempotency_key THEN
            -- A same_key retry: the provider deduplicates the resend by the key, so the
            -- unknown attempt before it is not a competitor.
            NULL;
        ELSIF v_competing.id IS NULL AND (
            v_other.state IN ('dispatched', 'committed', 'unknown', 'verified')
            -- rows before ours in (created_at, id) order are older: the oldest wins
            OR (v_self.id IS NULL AND v_other.state NOT IN ('abandoned', 'compensated'))
        ) THEN
            v_competing := v_other;
        END IF;
    END LOOP;

    IF v_self.id IS NULL THEN
        RETURN ROW('stale', p_id, NULL, NULL, NULL, NULL, NULL, NULL,
                   'receipt not found', NULL)::orch8.effect_outcome;
    END IF;
    IF v_self.state <> 'prepared' THEN
        RETURN orch8.effect_outcome_of('stale', v_self,
            format('receipt is %s, not prepared', v_self.state));
    END IF;

    IF v_competing.id IS NOT NULL THEN
        FOR v_guard IN SELECT * FROM orch8.effect_commit_guards(p_tenant_id, v_self.instance_id, v_self.kind)
        LOOP
            v_first_guard := coalesce(v_first_guard, v_guard.id);
            PERFORM orch8.append_invariant_result(v_guard, v_self, 'fail', v_competing.id);
        END LOOP;
        RETURN orch8.effect_outcome_of('duplicate', v_self,
            format('receipt %s (block %s, attempt %s, %s) already holds this content',
                   v_competing.id, v_competing.block_id, v_competing.attempt, v_competing.state),
            v_first_guard, v_competing.id);
    END IF;

    IF NOT orch8.cas_effect_receipt(p_tenant_id, p_id, 'prepared', 'dispatched',
                                    '{"note": "guarded dispatch"}') THEN
        RETURN orch8.effect_outcome_of('stale', orch8.load_effect_receipt(p_tenant_id, p_id),
                                       'receipt moved during guarded dispatch');
    END IF;
    FOR v_guard IN SELECT * FROM orch8.effect_commit_guards(p_tenant_id, v_self.instance_id, v_self.kind)
    LOOP
        PERFORM orch8.append_invariant_result(v_guard, v_self, 'pass', NULL);
    END LOOP;
    RETURN orch8.effect_outcome_of('dispatched', orch8.load_effect_receipt(p_tenant_id, p_id));
END
$$;

COMMENT ON FUNCTION orch8.dispatch_effect_receipt_at_most_once(text, uuid) IS
'Guarded prepared->dispatched: under pg_advisory_xact_lock on '
'effect|tenant|continuity|kind|destination|request, lock our receipt and every receipt with '
'the same content (FOR UPDATE, by created_at, id). Ours missing or not prepared: stale. '
'Another one dispatched, committed, unknown or verified, or older and not abandoned or '
'compensated: duplicate (an invariant result is appended; ours stays prepared). An '
'unknown receipt of the same instance and block with the same idempotency key is not a '
'competitor (a same_key retry: the provider deduplicates it). Otherwise dispatched. '
'Returns the outcome instead of raising so the trace survives.';

CREATE OR REPLACE FUNCTION orch8.begin_effect(
    p_tenant_id text,
    p_instance_id uuid,
    p_block_id text,
    p_handler text,
    p_params jsonb,
    p_attempt integer
)
RETURNS orch8.effect_outcome
LANGUAGE plpgsql
AS $$
DECLARE
    v_scope orch8.continuity_executions;
    v_found orch8.effect_receipts;
    v_row orch8.effect_receipts;
    v_kind text;
    v_id uuid;
    v_key text;
    v_state orch8.instance_state;
    v_destination text;
    v_request text;
    v_guarded boolean;
BEGIN
    IF p_handler IS NULL OR p_handler = '' THEN
        RAISE EXCEPTION 'begin_effect needs a handler name' USING ERRCODE = 'O8008';
    END IF;
    IF NOT orch8.handler_has_side_effects(p_handler) THEN
        RETURN NULL;  -- pure: no scope, no receipt
    END IF;
    IF p_block_id IS NULL OR p_block_id = '' OR p_attempt IS NULL OR p_attempt < 0 THEN
        RAISE EXCEPTION 'begin_effect needs a block id and an attempt >= 0'
            USING ERRCODE = 'O8008';
    END IF;
    PERFORM orch8.require_size('params', 'params_bytes', octet_length(p_params::text));
    v_state := orch8.instance_state_of(p_tenant_id, p_instance_id);
    IF v_state IN ('completed', 'cancelled', 'failed') THEN
        RAISE EXCEPTION 'instance % is %: it begins no effect', p_instance_id, v_state
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('instance_id', p_instance_id,
                                             'current_state', v_state)::text;
    END IF;

    IF orch8.step_idempotency_key_problem(p_params) IS NOT NULL THEN
        RAISE EXCEPTION '%', orch8.step_idempotency_key_problem(p_params)
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object(
                      'field', 'idempotency_key',
                      'limit', orch8.limit_of('idempotency_key_bytes'))::text;
    END IF;
    v_scope := orch8.ensure_effect_scope(p_tenant_id, p_instance_id);

    v_found := orch8.find_unresolved_effect_receipt(
        p_tenant_id, v_scope.continuity_id, p_instance_id, p_block_id, p_attempt,
        v_scope.effect_id_version, v_scope.epoch);
    IF v_found.id IS NOT NULL THEN
        IF v_found.state = 'dispatched' THEN
            -- A previous run of this very attempt may have sent it: say so, send nothing.
            PERFORM orch8.cas_effect_receipt(p_tenant_id, v_found.id, 'dispatched', 'unknown',
                jsonb_build_object(
                    'note', 'found dispatched when the same attempt began again',
                    'error', 'outcome unknown: the previous run of this attempt did not settle'));
            v_found := orch8.load_effect_receipt(p_tenant_id, v_found.id);
        END IF;
        RETURN orch8.effect_outcome_of('blocked', v_found,
            format('receipt %s is %s: resolve it before this step can run again',
                   v_found.id, v_found.state));
    END IF;

    v_kind := orch8.effect_kind(p_handler);
    v_id := orch8.effect_receipt_id(v_scope.effect_id_version, v_scope.continuity_id,
                                    v_scope.epoch, p_instance_id, p_block_id, p_attempt);
    v_key := coalesce(
        orch8.step_idempotency_key_param(p_params),
        -- same_key: one key for every attempt, the id attempt 0 has (so attempt 0, the
        -- common case, needs no look at the definition)
        CASE WHEN p_attempt > 0 AND orch8.step_ambiguity_mode(
                      orch8.instance_step(p_tenant_id, p_instance_id, p_block_id)) = 'same_key'
             THEN orch8.effect_receipt_id(v_scope.effect_id_version, v_scope.continuity_id,
                                          v_scope.epoch, p_instance_id, p_block_id, 0)::text
        END,
        v_id::text);
    v_destination := orch8.destination_fingerprint(p_handler, p_params);
    v_request := orch8.request_sha256(p_handler, p_params);
    v_guarded := EXISTS (SELECT 1 FROM orch8.effect_commit_guards(p_tenant_id, p_instance_id,
                                                                  v_kind));
    IF NOT v_guarded THEN
        -- the common case: a new receipt, nothing to wait for: one write, dispatched
        v_row := orch8.insert_dispatched_receipt(
            p_tenant_id, v_id, v_scope.continuity_id, v_scope.epoch, p_instance_id,
            p_block_id, p_attempt, v_kind, p_handler, v_destination, v_request, v_key);
        IF v_row.id IS NOT NULL THEN
            RETURN orch8.effect_outcome_of('dispatched', v_row);
        END IF;
    END IF;
    v_row := orch8.ensure_effect_receipt(
        p_tenant_id, v_id,
        v_scope.continuity_id, v_scope.epoch, p_instance_id, p_block_id, p_attempt,
        v_kind, p_handler, v_destination, v_request, v_key);

    IF v_row.state = 'planned' THEN
        IF NOT orch8.cas_effect_receipt(p_tenant_id, v_row.id, 'planned', 'prepared') THEN
            v_row := orch8.load_effect_receipt(p_tenant_id, v_row.id);
            RETURN orch8.effect_outcome_of('blocked', v_row, 'receipt moved concurrently');
        END IF;
    ELSIF v_row.state <> 'prepared' THEN
        RETURN orch8.effect_outcome_of('blocked', v_row,
            format('receipt %s is already %s', v_row.id, v_row.state));
    END IF;

    IF v_guarded THEN
        RETURN orch8.dispatch_effect_receipt_at_most_once(p_tenant_id, v_row.id);
    END IF;
    IF NOT orch8.cas_effect_receipt(p_tenant_id, v_row.id, 'prepared', 'dispatched') THEN
        v_row := orch8.load_effect_receipt(p_tenant_id, v_row.id);
        RETURN orch8.effect_outcome_of('blocked', v_row, 'receipt moved concurrently');
    END IF;
    RETURN orch8.effect_outcome_of('dispatched', orch8.load_effect_receipt(p_tenant_id, v_row.id));
END
$$;

COMMENT ON FUNCTION orch8.begin_effect(text, uuid, text, text, jsonb, integer) IS
'Everything before a side effect, in one call: NULL for a pure handler (nothing written); '
'else ensure the scope; a dispatched receipt of this (block, attempt) becomes unknown and '
'the outcome is blocked (unknown: blocked too); else upsert the planned receipt (kind, '
'destination fingerprint, request hash, idempotency key: the idempotency_key param, else '
'with step_ambiguity_mode same_key the id of attempt 0, else the receipt''s own id), move '
'it to prepared, then to '
'dispatched (plain CAS, or the guarded dispatch when a commit guard covers its kind). '
'Without a commit guard a new receipt is inserted dispatched in one write '
'(insert_dispatched_receipt; its three events are written all the same). A '
'receipt already past prepared gives blocked. Returns the outcome; never raises for them. '
'An idempotency_key param over idempotency_key_bytes, or params over params_bytes, raise '
'O8008 before anything is written; an unknown instance O8007, a completed, cancelled or '
'failed one O8004.';

CREATE OR REPLACE FUNCTION orch8.settle_effect(
    p_tenant_id text,
    p_id uuid,
    p_expected orch8.effect_state,
    p_next orch8.effect_state,
    p_patch jsonb
)
RETURNS orch8.effect_outcome
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.effect_receipts;
BEGIN
    v_row := orch8.swap_effect_receipt(p_tenant_id, p_id, p_expected, p_next, p_patch);
    IF v_row.id IS NOT NULL THEN
        RETURN orch8.effect_outcome_of(p_next::text, v_row);
    END IF;
    v_row := orch8.load_effect_receipt(p_tenant_id, p_id);
    IF v_row.id IS NULL THEN
        RETURN ROW('stale', p_id, NULL, NULL, NULL, NULL, NULL, NULL,
                   'receipt not found', NULL)::orch8.effect_outcome;
    END IF;
    RETURN orch8.effect_outcome_of('stale', v_row,
        format('receipt is %s, not %s', v_row.state, p_expected));
END
$$;

COMMENT ON FUNCTION orch8.settle_effect(
    text, uuid, orch8.effect_state, orch8.effect_state, jsonb
) IS 'CAS and report: the new state as outcome, or stale with the current state (internal helper).';

CREATE OR REPLACE FUNCTION orch8.commit_effect(p_tenant_id text, p_id uuid, p_output jsonb)
RETURNS orch8.effect_outcome
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN (
        SELECT orch8.settle_effect(p_tenant_id, p_id, 'dispatched', 'committed',
            jsonb_strip_nulls(jsonb_build_object(
                'provider_receipt_id', orch8.provider_receipt_id(p_output),
                'note', 'handler succeeded')))
    );
END
$$;

COMMENT ON FUNCTION orch8.commit_effect(text, uuid, jsonb) IS
'dispatched->committed after the handler succeeded; provider_receipt_id is the first '
'string among output.provider_receipt_id, receipt_id, request_id (ignored over 256 bytes). '
'Outcome committed, or stale with the current state.';

CREATE OR REPLACE FUNCTION orch8.mark_effect_unknown(p_tenant_id text, p_id uuid, p_error text)
RETURNS orch8.effect_outcome
LANGUAGE sql
AS $$
    SELECT orch8.settle_effect(p_tenant_id, p_id, 'dispatched', 'unknown',
        jsonb_build_object('error', left(coalesce(p_error, 'unknown error'),
                                         orch8.limit_of('error_chars')::integer),
                           'note', 'handler failed or timed out after dispatch'))
$$;

COMMENT ON FUNCTION orch8.mark_effect_unknown(text, uuid, text) IS
'dispatched->unknown after a handler error or timeout: the provider may or may not have '
'acted. Outcome unknown, or stale with the current state.';

CREATE OR REPLACE FUNCTION orch8.abandon_effect_not_applied(
    p_tenant_id text, p_id uuid, p_evidence jsonb
)
RETURNS orch8.effect_outcome
LANGUAGE plpgsql
AS $$
DECLARE
    v_out orch8.effect_outcome;
BEGIN
    IF p_evidence IS NULL OR jsonb_typeof(p_evidence) <> 'object' OR p_evidence = '{}' THEN
        RAISE EXCEPTION 'abandoning a dispatched receipt needs evidence that nothing was sent'
            USING ERRCODE = 'O8008';
    END IF;
    v_out := orch8.settle_effect(p_tenant_id, p_id, 'dispatched', 'unknown',
        jsonb_build_object('error', p_evidence ->> 'error',
                           'note', 'handler proved nothing was sent'));
    IF v_out.outcome = 'stale' THEN
        RETURN v_out;
    END IF;
    RETURN orch8.settle_effect(p_tenant_id, p_id, 'unknown', 'abandoned',
        jsonb_build_object('evidence', jsonb_build_object('not_applied', p_evidence),
                           'note', 'not applied: nothing left the process'));
END
$$;

COMMENT ON FUNCTION orch8.abandon_effect_not_applied(text, uuid, jsonb) IS
'dispatched->unknown->abandoned in one call, for a handler that can prove nothing left the '
'process (connection refused before a byte was sent). Evidence (a non-empty object) is '
'kept on the receipt under not_applied.';

CREATE OR REPLACE FUNCTION orch8.append_receipt_event(
    p_tenant_id text, p_id uuid, p_actor text, p_note text, p_evidence jsonb
)
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO orch8.effect_receipt_events (
        tenant_id, receipt_id, from_state, to_state, actor, note, evidence
    )
    SELECT r.tenant_id, r.id, r.state, r.state, p_actor, p_note, p_evidence
    FROM orch8.effect_receipts AS r
    WHERE r.tenant_id = p_tenant_id AND r.id = p_id
$$;

COMMENT ON FUNCTION orch8.append_receipt_event(text, uuid, text, text, jsonb) IS
'An event on a receipt that does not move it (from_state = to_state): a verifier''s '
'inconclusive try, a verification requested or escalated. Moves are recorded by trigger.';

CREATE OR REPLACE FUNCTION orch8.settle_same_key_receipts(
    p_tenant_id text, p_id uuid, p_actor text
)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.effect_receipts := orch8.load_effect_receipt(p_tenant_id, p_id);
    v_other orch8.effect_receipts;
    v_count integer := 0;
BEGIN
    IF v_row.state NOT IN ('committed', 'verified') OR v_row.idempotency_key IS NULL THEN
        RETURN 0;
    END IF;
    FOR v_other IN
        SELECT r.* FROM orch8.effect_receipts AS r
        WHERE r.tenant_id = p_tenant_id AND r.continuity_id = v_row.continuity_id
          AND r.instance_id = v_row.instance_id AND r.block_id = v_row.block_id
          AND r.idempotency_key = v_row.idempotency_key
          AND r.state = 'unknown' AND r.id <> v_row.id
        ORDER BY r.attempt
        FOR UPDATE
    LOOP
        IF orch8.record_resolution(p_tenant_id, v_other, 'verified',
               v_row.provider_receipt_id,
               jsonb_build_object('same_key_as', v_row.id, 'idempotency_key',
                                  v_row.idempotency_key, 'which_is', v_row.state),
               p_actor,
               format('the provider deduplicates key %s: receipt %s (attempt %s) is %s',
                      v_row.idempotency_key, v_row.id, v_row.attempt, v_row.state),
               NULL) THEN
            v_count := v_count + 1;
        END IF;
    END LOOP;
    RETURN v_count;
END
$$;

COMMENT ON FUNCTION orch8.settle_same_key_receipts(text, uuid, text) IS
'When receipt p_id is committed or verified, its step''s unknown receipts holding the same '
'idempotency key become verified with its provider receipt id: the provider keeps one '
'object per key, so they were the same effect. Returns how many.';

CREATE OR REPLACE FUNCTION orch8.require_output_size(p_output jsonb)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $$
BEGIN
    IF octet_length(p_output::text) > orch8.limit_of('resolution_output_bytes') THEN
        RAISE EXCEPTION 'output is % bytes, over the limit of % bytes',
            octet_length(p_output::text), orch8.limit_of('resolution_output_bytes')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object(
                      'field', 'output',
                      'limit', orch8.limit_of('resolution_output_bytes'))::text;
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.require_output_size(jsonb) IS
'O8008 (DETAIL {field: output, limit}) when a step output given by a person (a resolution, '
'a retry) is over resolution_output_bytes as JSON text; nothing for NULL.';

CREATE OR REPLACE FUNCTION orch8.record_resolution(
    p_tenant_id text,
    p_row orch8.effect_receipts,
    p_state orch8.effect_state,
    p_provider_receipt_id text,
    p_evidence jsonb,
    p_actor text,
    p_note text,
    p_output jsonb
)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_resolution jsonb := jsonb_strip_nulls(jsonb_build_object(
        'state', p_state, 'from_state', (p_row).state, 'actor', p_actor, 'note', p_note,
        'evidence', coalesce(p_evidence, '{}'), 'provider_receipt_id', p_provider_receipt_id,
        'at', orch8.now()))
        -- a JSON null output is an output (the step returned null); SQL NULL is none
        || CASE WHEN p_output IS NULL THEN '{}'::jsonb
                ELSE jsonb_build_object('output', p_output) END;
BEGIN
    IF NOT orch8.cas_effect_receipt(p_tenant_id, (p_row).id, (p_row).state, p_state,
        jsonb_build_object(
            'error', NULL,  -- a settled receipt keeps no stale "outcome unknown"
            'actor', p_actor,
            'note', coalesce(p_note, 'resolved'),
            'evidence', jsonb_build_object(
                'resolution', v_resolution,
                'resolutions', coalesce((p_row).evidence -> 'resolutions', '[]')
                               || jsonb_build_array(v_resolution)))
        || CASE WHEN p_provider_receipt_id IS NULL THEN '{}'::jsonb
                ELSE jsonb_build_object('provider_receipt_id', p_provider_receipt_id) END)
    THEN
        RETURN false;
    END IF;
    UPDATE orch8.effect_verifications AS v
    SET state = 'settled', lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL,
        updated_at = orch8.now()
    WHERE v.tenant_id = p_tenant_id AND v.effect_id = (p_row).id AND v.state <> 'settled';
    IF p_state IN ('committed', 'verified') THEN
        PERFORM orch8.settle_same_key_receipts(p_tenant_id, (p_row).id, p_actor);
    END IF;
    RETURN true;
END
$$;

COMMENT ON FUNCTION orch8.record_resolution(
    text, orch8.effect_receipts, orch8.effect_state, text, jsonb, text, text, jsonb
) IS
'The one write of a resolution (operator or verifier; callers check who may make it): CAS '
'the receipt from the state in p_row to p_state, clear its error, set the provider '
'receipt id when given, store {state, from_state, actor, note, evidence, '
'provider_receipt_id, output, at} as evidence.resolution and append it to '
'evidence.resolutions (earlier resolutions are kept), close the receipt''s verification, '
'and settle the same-key receipts of a committed or verified one. false: lost the CAS.';

CREATE OR REPLACE FUNCTION orch8.resolve_effect(
    p_tenant_id text,
    p_id uuid,
    p_expected_state orch8.effect_state,
    p_state orch8.effect_state,
    p_provider_receipt_id text,
    p_evidence jsonb,
    p_actor text,
    p_note text DEFAULT NULL,
    p_output jsonb DEFAULT NULL
)
RETURNS orch8.effect_receipts
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.effect_receipts;
    v_evidence jsonb := coalesce(p_evidence, '{}');
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);  -- the web role acts in its sealed tenant
    IF p_actor IS NULL OR p_actor = '' THEN
        RAISE EXCEPTION 'resolve_effect needs an actor (who is resolving)'
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'actor')::text;
    END IF;
    IF p_expected_state IS NULL THEN
        RAISE EXCEPTION 'resolve_effect needs the state you saw (expected_state): two people '
                        'resolving at once must not both win'
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'expected_state')::text;
    END IF;
    IF jsonb_typeof(v_evidence) <> 'object' THEN
        RAISE EXCEPTION 'evidence must be a JSON object'
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'evidence')::text;
    END IF;
    PERFORM orch8.require_size('evidence', 'evidence_bytes', octet_length(v_evidence::text)),
            orch8.require_size('actor', 'actor_chars', char_length(p_actor));
    IF octet_length(p_provider_receipt_id) > orch8.limit_of('provider_receipt_id_bytes') THEN
        RAISE EXCEPTION 'provider_receipt_id is longer than % bytes',
            orch8.limit_of('provider_receipt_id_bytes')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object(
                      'field', 'provider_receipt_id',
                      'limit', orch8.limit_of('provider_receipt_id_bytes'))::text;
    END IF;
    IF octet_length(p_note) > orch8.limit_of('note_bytes') THEN
        RAISE EXCEPTION 'note is % bytes, over the limit of % bytes',
            octet_length(p_note), orch8.limit_of('note_bytes')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'note',
                                             'limit', orch8.limit_of('note_bytes'))::text;
    END IF;
    IF p_output IS NOT NULL AND p_state NOT IN ('committed', 'verified') THEN
        RAISE EXCEPTION 'an output belongs to a committed or verified resolution (the step '
                        'then completes with it), not to %', p_state
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'output')::text;
    END IF;
    PERFORM orch8.require_output_size(p_output);
    v_row := orch8.load_effect_receipt(p_tenant_id, p_id);
    IF v_row.id IS NULL THEN
        RAISE EXCEPTION 'effect receipt % not found', p_id
            USING ERRCODE = 'O8007', DETAIL = json_build_object('effect_id', p_id)::text;
    END IF;
    IF v_row.state <> p_expected_state THEN
        RAISE EXCEPTION 'receipt % is %, not % any more: reload before resolving',
            p_id, v_row.state, p_expected_state
            USING ERRCODE = 'O8002',
                  DETAIL = json_build_object('effect_id', p_id,
                                             'current_state', v_row.state)::text;
    END IF;
    IF p_state IS NULL OR NOT orch8.can_resolve_to(v_row.state, p_state) THEN
        RAISE EXCEPTION 'receipt % cannot be resolved from % to %',
            p_id, v_row.state, coalesce(p_state::text, 'NULL')
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object(
                      'effect_id', p_id, 'current_state', v_row.state,
                      'allowed_states', (SELECT coalesce(json_agg(r.to_state ORDER BY r.to_state),
                                                         '[]')
                                         FROM orch8.effect_resolutions AS r
                                         WHERE r.from_state = v_row.state))::text,
                  HINT = (SELECT string_agg(format('%s -> %s', r.from_state, r.to_state), '; '
                                            ORDER BY r.from_state, r.to_state)
                          FROM orch8.effect_resolutions AS r);
    END IF;
    IF orch8.resolution_needs_evidence(p_state) AND v_evidence = '{}' THEN
        RAISE EXCEPTION 'resolving to % needs evidence (what you looked at)', p_state
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'evidence')::text;
    END IF;
    IF NOT orch8.record_resolution(p_tenant_id, v_row, p_state, p_provider_receipt_id,
                                   v_evidence, p_actor, coalesce(p_note, 'resolved by operator'),
                                   p_output) THEN
        RAISE EXCEPTION 'receipt % changed while resolving: reload before resolving', p_id
            USING ERRCODE = 'O8002',
                  DETAIL = json_build_object(
                      'effect_id', p_id,
                      'current_state', (orch8.load_effect_receipt(p_tenant_id, p_id)).state
                  )::text;
    END IF;
    RETURN orch8.load_effect_receipt(p_tenant_id, p_id);
END
$$;

COMMENT ON FUNCTION orch8.resolve_effect(
    text, uuid, orch8.effect_state, orch8.effect_state, text, jsonb, text, text, jsonb
) IS
'The operator path: the moves of orch8.effect_resolutions (can_resolve_to): unknown -> '
'verified|committed|compensated|abandoned, and committed|verified -> compensated; those '
'that need evidence (abandoned, compensated) refuse an empty one. p_expected_state (the '
'state the operator saw) is required: a receipt in another state gives O8002 "reload '
'before resolving" with DETAIL {effect_id, current_state}, so two people resolving at '
'once cannot both win. p_output, for committed or verified, is the output the step would '
'have produced: retry_instance completes the step with it. Written by record_resolution '
'(history kept in evidence.resolutions, error cleared). Illegal move: O8004 with DETAIL '
'{effect_id, current_state, allowed_states}; not found: O8007; missing expected state, '
'empty evidence where needed, an output for another state, or a note, receipt id, '
'evidence, actor or output over its limit: O8008 with DETAIL {field}.';

-- security_invoker: the caller's row-level security applies through the view
CREATE OR REPLACE VIEW orch8.unresolved_effects WITH (security_invoker = true) AS
SELECT
    r.tenant_id,
    r.id AS effect_id,
    r.kind,
    r.state,
    orch8.now() - r.created_at AS age,
    r.updated_at AS state_since,
    r.instance_id,
    r.block_id,
    r.attempt,
    r.epoch,
    r.continuity_id,
    r.handler,
    r.destination_fingerprint,
    r.request_sha256,
    r.idempotency_key,
    r.provider_receipt_id,
    r.error,
    r.evidence,
    r.created_at,
    -- false when nothing waits on it: the instance ended, a later attempt of the step
    -- completed, or its branch was given up (history to settle in bulk, not an order on
    -- hold)
    (
        coalesce(t.state NOT IN ('completed', 'cancelled'), false)
        AND NOT EXISTS (
            SELECT 1 FROM orch8.block_outputs AS o
            WHERE
                o.tenant_id = r.tenant_id AND o.instance_id = r.instance_id
                AND o.block_id = r.block_id AND o.sentinel IS NULL AND o.attempt > r.attempt
        )
        AND NOT EXISTS (
            SELECT 1 FROM orch8.execution_nodes AS n
            WHERE
                n.tenant_id = r.tenant_id AND n.instance_id = r.instance_id
                AND n.path = coalesce(r.compensation_path, r.block_id)
                AND n.state = 'cancelled'
        )
    ) AS blocking,
    v.state AS verification,
    v.tries AS verification_tries,
    cardinality(v.schedule) AS verification_max_tries,
    CASE WHEN v.state = 'pending' THEN v.next_at END AS verification_next_at,
    r.compensation_path AS awaiting_compensation
FROM (
    SELECT
        q.*,
        NULL::text AS compensation_path
    -- the open set is small (receipts dispatched or unknown): read the receipts through it
    FROM orch8.open_receipts AS o
    INNER JOIN orch8.effect_receipts AS q ON o.tenant_id = q.tenant_id AND o.receipt_id = q.id
    WHERE
        q.state = 'unknown'
        OR (
            q.state = 'dispatched'
            AND q.updated_at < orch8.now() - coalesce(
                nullif(current_setting('orch8.dispatched_alert_after', true), ''), '5 minutes'
            )::interval
        )
    UNION ALL
    -- a step whose compensation's outcome is unknown: did the undo happen? Both receipts
    -- are on the queue
    SELECT
        q.*,
        c.block_id
    FROM orch8.effect_receipts AS c
    INNER JOIN orch8.open_receipts AS oc ON c.tenant_id = oc.tenant_id AND c.id = oc.receipt_id
    INNER JOIN orch8.effect_receipts AS q
        ON
            c.tenant_id = q.tenant_id AND c.instance_id = q.instance_id
            AND q.block_id = orch8.compensated_path(c.block_id)
            AND q.state IN ('committed', 'verified')
    WHERE c.state = 'unknown' AND c.block_id LIKE '%.undo/%'
) AS r
LEFT JOIN orch8.task_instances AS t ON r.tenant_id = t.tenant_id AND r.instance_id = t.id
LEFT JOIN orch8.effect_verifications AS v
    ON r.tenant_id = v.tenant_id AND r.id = v.effect_id;

COMMENT ON VIEW orch8.unresolved_effects IS
'The operator queue and alert source: receipts in unknown, receipts dispatched for '
'longer than the setting orch8.dispatched_alert_after (default 5 minutes), and the '
'committed or verified receipts of steps whose compensation''s outcome is unknown '
'(awaiting_compensation names that compensation). blocking: its instance has not ended, '
'no later attempt of the step completed and its branch was not given up. verification: the '
'state of its verifier (pending, escalated, settled; NULL when none was scheduled), with '
'tries used, tries in all and the next try. Oldest first: ORDER BY created_at.';

COMMENT ON COLUMN orch8.unresolved_effects.tenant_id IS 'The receipt''s tenant.';

COMMENT ON COLUMN orch8.unresolved_effects.effect_id IS 'The receipt (effect_receipts.id).';

COMMENT ON COLUMN orch8.unresolved_effects.kind IS
'The effect kind: http, model, message, storage, custom or worker.';

COMMENT ON COLUMN orch8.unresolved_effects.state IS
'unknown, dispatched (for longer than orch8.dispatched_alert_after, default 5 minutes), '
'or committed or verified for a step whose compensation''s outcome is unknown.';

COMMENT ON COLUMN orch8.unresolved_effects.age IS
'How long ago the receipt was written: orch8.now() minus created_at.';

COMMENT ON COLUMN orch8.unresolved_effects.state_since IS
'When the receipt entered its current state (effect_receipts.updated_at).';

COMMENT ON COLUMN orch8.unresolved_effects.instance_id IS
'The instance whose step made the effect.';

COMMENT ON COLUMN orch8.unresolved_effects.block_id IS 'The path of the step''s node.';

COMMENT ON COLUMN orch8.unresolved_effects.attempt IS 'The step''s attempt, 0-based.';

COMMENT ON COLUMN orch8.unresolved_effects.epoch IS 'The ledger scope''s ownership epoch.';

COMMENT ON COLUMN orch8.unresolved_effects.continuity_id IS
'The ledger scope the receipt belongs to.';

COMMENT ON COLUMN orch8.unresolved_effects.handler IS 'The handler the step ran.';

COMMENT ON COLUMN orch8.unresolved_effects.destination_fingerprint IS
'Hex SHA-256 of where the effect went.';

COMMENT ON COLUMN orch8.unresolved_effects.request_sha256 IS
'Hex SHA-256 of the request''s content.';

COMMENT ON COLUMN orch8.unresolved_effects.idempotency_key IS
'The key sent to the provider: what to look the effect up by there.';

COMMENT ON COLUMN orch8.unresolved_effects.provider_receipt_id IS
'The provider''s own id for the effect; NULL when unknown.';

COMMENT ON COLUMN orch8.unresolved_effects.error IS 'Why the outcome became unknown.';

COMMENT ON COLUMN orch8.unresolved_effects.evidence IS 'The receipt''s evidence object.';

COMMENT ON COLUMN orch8.unresolved_effects.created_at IS
'When the receipt was written; the queue is read oldest first by it.';

COMMENT ON COLUMN orch8.unresolved_effects.blocking IS
'true when something waits on the receipt: its instance has not ended, no later attempt '
'of the step completed and its branch was not given up. false rows are history to settle '
'in bulk.';

COMMENT ON COLUMN orch8.unresolved_effects.verification IS
'The state of its verifier: pending, escalated or settled; NULL when none was scheduled.';

COMMENT ON COLUMN orch8.unresolved_effects.verification_tries IS
'Tries the verifier has used; NULL without a verifier.';

COMMENT ON COLUMN orch8.unresolved_effects.verification_max_tries IS
'Tries the verifier has in all (the length of its schedule); NULL without a verifier.';

COMMENT ON COLUMN orch8.unresolved_effects.verification_next_at IS
'When the verifier''s next try is due, while pending; NULL otherwise.';

COMMENT ON COLUMN orch8.unresolved_effects.awaiting_compensation IS
'For a committed or verified receipt listed because its compensation''s outcome is '
'unknown: the path of that compensation node. NULL for the other rows.';
