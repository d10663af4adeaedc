-- Repeatable: every trigger function. The triggers themselves (CREATE TRIGGER) are made by
-- the migrations that made their tables; the bodies live here, so a change to one is an
-- edit of this file rather than a new migration that copies the whole body again.

-- The effect ledger (docs/SQL_API.md, "Effect ledger")

CREATE OR REPLACE FUNCTION orch8.effect_receipts_guard()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_evidence text := nullif(current_setting('orch8.event_evidence', true), '');
BEGIN
    IF tg_op = 'INSERT' THEN
        IF new.state NOT IN ('planned', 'dispatched') THEN
            RAISE EXCEPTION 'a receipt is created in state planned (or dispatched, through '
                            'prepared, in one write), not %', new.state
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
'Trigger: receipts are created planned (or dispatched: planned -> prepared -> dispatched '
'in one write, each move recorded by effect_receipts_record_event), move only along '
'can_transition_to, keep their identity columns (idempotency key included), change '
'provider receipt id, evidence or error only with a state move, leave unknown only with '
'evidence (the transaction''s orch8.event_evidence, a non-empty object), and are never '
'deleted (O8004; O8008 for the missing evidence).';

CREATE OR REPLACE FUNCTION orch8.effect_receipts_record_event()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF tg_op = 'UPDATE' AND new.state = old.state THEN
        RETURN NULL;  -- not a transition (e.g. the no-op upsert in ensure_effect_receipt)
    END IF;
    -- a provider's receipt id that neither the receipt id nor its idempotency key
    -- already finds (receipt_provider_ids, written once: no index of the receipts names
    -- the column a settle writes)
    IF new.provider_receipt_id IS NOT NULL
       AND new.provider_receipt_id IS DISTINCT FROM
           (CASE WHEN tg_op = 'UPDATE' THEN old.provider_receipt_id END)
       AND new.provider_receipt_id NOT IN (new.id::text, coalesce(new.idempotency_key, '')) THEN
        INSERT INTO orch8.receipt_provider_ids (tenant_id, provider_receipt_id, receipt_id)
        VALUES (new.tenant_id, new.provider_receipt_id, new.id)
        ON CONFLICT DO NOTHING;
    END IF;
    -- the open set (dispatched or unknown) follows the state
    IF new.state IN ('dispatched', 'unknown')
       AND (tg_op = 'INSERT' OR old.state NOT IN ('dispatched', 'unknown')) THEN
        INSERT INTO orch8.open_receipts (tenant_id, receipt_id) VALUES (new.tenant_id, new.id)
        ON CONFLICT DO NOTHING;
    ELSIF tg_op = 'UPDATE' AND old.state IN ('dispatched', 'unknown')
          AND new.state NOT IN ('dispatched', 'unknown') THEN
        DELETE FROM orch8.open_receipts AS o
        WHERE o.tenant_id = new.tenant_id AND o.receipt_id = new.id;
    END IF;
    IF tg_op = 'INSERT' AND new.state = 'dispatched' THEN
        -- created dispatched: it took the path planned -> prepared -> dispatched
        INSERT INTO orch8.effect_receipt_events (
            tenant_id, receipt_id, from_state, to_state, actor, note, evidence, api_key_id
        )
        SELECT
            new.tenant_id, new.id, m.from_state, m.to_state,
            orch8.attributed_actor(current_setting('orch8.event_actor', true)),
            m.note,
            CASE WHEN m.n = 3
                 THEN nullif(current_setting('orch8.event_evidence', true), '')::jsonb END,
            orch8.current_key_id()
        FROM (VALUES
            (1, NULL::orch8.effect_state, 'planned'::orch8.effect_state, 'receipt planned'),
            (2, 'planned', 'prepared', NULL),
            (3, 'prepared', 'dispatched', nullif(current_setting('orch8.event_note', true), ''))
        ) AS m (n, from_state, to_state, note)
        ORDER BY m.n;
        RETURN NULL;
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
'Trigger: keeps orch8.open_receipts (the receipts dispatched or unknown) and '
'orch8.receipt_provider_ids (provider receipt ids to look receipts up by), and appends '
'one effect_receipt_events row per receipt creation and state move (a receipt created '
'dispatched gets three: planned, prepared, dispatched, in that order). Note and evidence '
'come from the transaction settings orch8.event_note and orch8.event_evidence (set by the'
' ledger functions; the note of a receipt created dispatched goes on its dispatched '
'event); the actor is attributed_actor(orch8.event_actor), db_user the login and '
'api_key_id the sealed key.';

CREATE OR REPLACE FUNCTION orch8.workflow_invariants_record_change()
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
'Trigger: every declaration of and change to an invariant is appended to invariant_events'
' (before and after); deleting one is refused (O8004).';

CREATE OR REPLACE FUNCTION orch8.refuse_history_rewrite()
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

-- Instances

CREATE OR REPLACE FUNCTION orch8.task_instances_guard()
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

COMMENT ON FUNCTION orch8.task_instances_watch_sla() IS
'Trigger before INSERT or UPDATE on task_instances, for rows with an sla (its WHEN): '
'sla_watch_at is sla_at while the instance is scheduled, running or waiting and has not '
'missed it, else NULL, whatever the writer set. fire_slas reads it through its own '
'index, which names no other column, so an update of an instance is heap-only (HOT) '
'unless it ends, pauses or breaches a watched sla.';

CREATE OR REPLACE FUNCTION orch8.task_instances_record_creations()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    -- actor, reason and key are the statement's, so each is a sub-SELECT: evaluated once
    -- (an InitPlan), not once per row of a bulk start or a claim
    INSERT INTO orch8.instance_transitions (
        tenant_id, instance_id, from_state, to_state, actor, reason, api_key_id
    )
    SELECT n.tenant_id, n.id, NULL, n.state,
           (SELECT orch8.attributed_actor(current_setting('orch8.transition_actor', true))),
           (SELECT nullif(current_setting('orch8.transition_reason', true), '')),
           (SELECT orch8.current_key_id())
    FROM new_rows AS n;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.task_instances_record_creations() IS
'Statement trigger after INSERT on task_instances, one of the two writers of '
'instance_transitions (with task_instances_record_moves): one row per instance created, '
'from NULL to its state, all in one INSERT. The actor comes from orch8.transition_actor '
'(attributed_actor), the reason from orch8.transition_reason, with the login and the '
'sealed key.';

-- Rows are paired by (tenant_id, id), which task_instances_guard keeps from changing.
-- The hash join is set on: a claim runs with hash joins off (claim_due_nodes), and a
-- nested loop over a batch of 256 paired 65,536 rows.
CREATE OR REPLACE FUNCTION orch8.task_instances_record_moves()
RETURNS trigger
LANGUAGE plpgsql
SET enable_hashjoin = on
AS $$
BEGIN
    -- actor, reason and key once per statement, as in task_instances_record_creations
    INSERT INTO orch8.instance_transitions (
        tenant_id, instance_id, from_state, to_state, actor, reason, api_key_id
    )
    SELECT n.tenant_id, n.id, o.state, n.state,
           (SELECT orch8.attributed_actor(current_setting('orch8.transition_actor', true))),
           (SELECT nullif(current_setting('orch8.transition_reason', true), '')),
           (SELECT orch8.current_key_id())
    FROM new_rows AS n
    JOIN old_rows AS o ON o.tenant_id = n.tenant_id AND o.id = n.id
    WHERE n.state <> o.state;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.task_instances_record_moves() IS
'Statement trigger after UPDATE on task_instances, one of the two writers of '
'instance_transitions (with task_instances_record_creations): one row per instance whose '
'state the statement changed, from its old state to its new one, all in one INSERT (a '
'claim of 256 instances writes its 256 rows at once). A move made by hand is recorded '
'like any other; actor, reason, login and sealed key as for a creation.';

-- The execution tree

CREATE OR REPLACE FUNCTION orch8.execution_nodes_guard()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF tg_op = 'DELETE' THEN
        RAISE EXCEPTION 'execution nodes are never deleted (node % of instance %)',
            old.path, old.instance_id
            USING ERRCODE = 'O8004';
    END IF;
    IF (new.tenant_id, new.instance_id, new.path, new.parent_path, new.block_id, new.kind,
        new.created_at)
       IS DISTINCT FROM
       (old.tenant_id, old.instance_id, old.path, old.parent_path, old.block_id, old.kind,
        old.created_at) THEN
        RAISE EXCEPTION 'the identity of node % of instance % cannot change',
            old.path, old.instance_id
            USING ERRCODE = 'O8004';
    END IF;
    IF new.state IS DISTINCT FROM old.state
       AND NOT orch8.node_can_transition(old.state, new.state) THEN
        RAISE EXCEPTION 'node % of instance % cannot move from % to %', old.path,
            old.instance_id, old.state, new.state
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('instance_id', old.instance_id, 'path', old.path,
                                             'from_state', old.state,
                                             'to_state', new.state)::text;
    END IF;
    IF new.worker_task_id IS NOT NULL
       AND new.state NOT IN ('ready', 'running', 'waiting') THEN
        new.worker_task_id := NULL;  -- ended (or blocked): it holds no task, no slot
    END IF;
    RETURN new;
END
$$;

COMMENT ON FUNCTION orch8.execution_nodes_guard() IS
'Trigger: a node keeps its identity, moves only along node_can_transition, and is never '
'deleted (O8004), whoever writes the row; a node that ends or blocks lets go of its '
'worker task (worker_task_id cleared).';

-- Sequences

CREATE OR REPLACE FUNCTION orch8.sequences_index_blocks()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO orch8.sequence_blocks (
        tenant_id, sequence_id, block_id, type, parent_id, depth, definition
    )
    SELECT DISTINCT ON (b.block_id)
        new.tenant_id, new.id, b.block_id, b.type, b.parent_id, b.depth, b.definition
    FROM orch8.definition_blocks(new.definition) AS b
    WHERE b.block_id IS NOT NULL AND b.block_id <> ''
    ORDER BY b.block_id, b.sort_key
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.sequences_index_blocks() IS
'Trigger: index a stored sequence''s blocks in sequence_blocks (definition_blocks).';

-- Webhooks

CREATE OR REPLACE FUNCTION orch8.enqueue_instance_webhooks()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_event text;
    v_rows integer;
BEGIN
    IF new.to_state NOT IN ('completed', 'failed') THEN
        RETURN NULL;
    END IF;
    v_event := 'instance.' || new.to_state::text;
    INSERT INTO orch8.webhook_outbox (
        tenant_id, subscription_id, event, instance_id, payload
    )
    SELECT s.tenant_id, s.id, v_event, new.instance_id,
           jsonb_build_object(
               'event', v_event,
               'tenant_id', new.tenant_id,
               'instance_id', new.instance_id,
               'state', new.to_state::text,
               'reason', new.reason,
               'at', to_char(new.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
               'sequence_id', t.sequence_id,
               'sequence_version', t.sequence_version)
    FROM orch8.webhook_subscriptions AS s
    INNER JOIN orch8.task_instances AS t
        ON t.tenant_id = new.tenant_id AND t.id = new.instance_id
    WHERE s.tenant_id = new.tenant_id
      AND s.enabled
      AND v_event = ANY (s.events)
    ORDER BY s.created_at, s.id;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    IF v_rows > 0 THEN
        PERFORM pg_notify('orch8_webhooks', '');  -- sent at commit, never on rollback
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.enqueue_instance_webhooks() IS
'Trigger on orch8.instance_transitions: a move to completed or failed inserts one '
'webhook_outbox row per enabled subscription of the tenant that wants instance.<state>, '
'payload {event, tenant_id, instance_id, state, reason, at (UTC ISO 8601), sequence_id, '
'sequence_version}, in the same transaction; then NOTIFY orch8_webhooks.';

-- External workers

CREATE OR REPLACE FUNCTION orch8.worker_tasks_guard()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF tg_op = 'DELETE' THEN
        RAISE EXCEPTION 'worker tasks are never deleted (task %)', old.id
            USING ERRCODE = 'O8004';
    END IF;
    IF (new.tenant_id, new.id, new.instance_id, new.path, new.attempt, new.effect_id,
        new.handler, new.params, new.idempotency_key, new.created_at)
       IS DISTINCT FROM
       (old.tenant_id, old.id, old.instance_id, old.path, old.attempt, old.effect_id,
        old.handler, old.params, old.idempotency_key, old.created_at) THEN
        RAISE EXCEPTION 'the identity of worker task % cannot change', old.id
            USING ERRCODE = 'O8004';
    END IF;
    IF new.state IS DISTINCT FROM old.state
       AND NOT orch8.worker_task_can_transition(old.state, new.state) THEN
        RAISE EXCEPTION 'worker task % cannot move from % to %', old.id, old.state, new.state
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('task_id', old.id, 'from_state', old.state,
                                             'to_state', new.state)::text;
    END IF;
    IF new.claim_epoch < old.claim_epoch THEN
        RAISE EXCEPTION 'the claim epoch of worker task % cannot go back', old.id
            USING ERRCODE = 'O8004';
    END IF;
    RETURN new;
END
$$;

COMMENT ON FUNCTION orch8.worker_tasks_guard() IS
'Trigger: a worker task keeps its identity (instance, step, attempt, receipt, handler, '
'params), moves only along worker_task_can_transition, never lowers its claim epoch, and '
'is never deleted (O8004), whoever writes the row.';

CREATE OR REPLACE FUNCTION orch8.worker_tasks_record_event()
RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    v_event text;
BEGIN
    v_event := CASE
        WHEN tg_op = 'INSERT' THEN 'queued'
        WHEN new.state = 'running' AND new.claim_epoch > old.claim_epoch THEN 'claimed'
        WHEN new.state = 'queued' AND old.state = 'running' THEN 'redelivered'
        WHEN new.state IS DISTINCT FROM old.state THEN new.state
        WHEN new.started_at IS NOT NULL AND old.started_at IS NULL THEN 'started'
        WHEN new.cancel_requested AND NOT old.cancel_requested THEN 'cancel_requested'
    END;
    IF v_event IS NULL THEN
        RETURN NULL;  -- a heartbeat, a checkpoint: not history
    END IF;
    INSERT INTO orch8.worker_task_events (
        tenant_id, task_id, event, from_state, to_state, claim_epoch, worker_id, detail,
        actor, api_key_id
    ) VALUES (
        new.tenant_id, new.id, v_event, CASE WHEN tg_op = 'UPDATE' THEN old.state END,
        new.state, new.claim_epoch, new.worker_id,
        nullif(jsonb_strip_nulls(CASE
            WHEN v_event = 'claimed' THEN jsonb_build_object(
                'lease_ms', new.lease_ms, 'lease_expires_at', new.lease_expires_at)
            WHEN new.ended_at IS NOT NULL THEN jsonb_build_object(
                'result', new.result, 'error', new.error, 'code', new.error_code,
                'retryable', new.retryable, 'evidence', new.evidence)
            END), '{}'),
        orch8.attributed_actor(current_setting('orch8.task_actor', true)),
        orch8.current_key_id()
    );
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.worker_tasks_record_event() IS
'Trigger: one worker_task_events row for every move of a task (queued, claimed, '
'redelivered, each final state), its first heartbeat (started) and a cancel asked while '
'it ran (cancel_requested); heartbeats are not recorded. The actor is '
'attributed_actor(orch8.task_actor), set by the moving function.';
