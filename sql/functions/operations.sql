-- Repeatable: what operators do to instances and keys: cancel, pause, resume, signal,
-- retry after a receipt was resolved.

CREATE OR REPLACE FUNCTION orch8.load_instance(p_tenant_id text, p_instance_id uuid)
RETURNS orch8.task_instances
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.task_instances;
BEGIN
    SELECT * INTO v_row FROM orch8.task_instances AS t
    WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id
    FOR UPDATE;
    IF v_row.id IS NULL THEN
        RAISE EXCEPTION 'instance % not found', p_instance_id
            USING ERRCODE = 'O8007', DETAIL = json_build_object('instance_id', p_instance_id)::text;
    END IF;
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION orch8.load_instance(text, uuid) IS
'Lock and return an instance of the tenant; O8007 when there is none.';

CREATE OR REPLACE FUNCTION orch8.instance_state_of(p_tenant_id text, p_instance_id uuid)
RETURNS orch8.instance_state
LANGUAGE plpgsql
STABLE
AS $$
DECLARE
    v_state orch8.instance_state;
BEGIN
    SELECT t.state INTO v_state FROM orch8.task_instances AS t
    WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id;
    IF v_state IS NULL THEN
        RAISE EXCEPTION 'instance % not found', p_instance_id
            USING ERRCODE = 'O8007', DETAIL = json_build_object('instance_id', p_instance_id)::text;
    END IF;
    RETURN v_state;
END
$$;

COMMENT ON FUNCTION orch8.instance_state_of(text, uuid) IS
'The state of an instance of the tenant (no lock); O8007 when there is none. Ledger rows '
'are written only for instances that exist.';

CREATE OR REPLACE FUNCTION orch8.record_instance_request(
    p_tenant_id text,
    p_instance_id uuid,
    p_action text,
    p_actor text,
    p_reason text,
    p_outcome text
)
RETURNS text
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO orch8.instance_requests (
        tenant_id, instance_id, action, actor, reason, outcome, api_key_id
    ) VALUES (
        p_tenant_id, p_instance_id, p_action, orch8.attributed_actor(p_actor), p_reason,
        p_outcome, orch8.current_key_id()
    );
    RETURN p_outcome;
END
$$;

COMMENT ON FUNCTION orch8.record_instance_request(text, uuid, text, text, text, text) IS
'Append an operator''s pause, cancel or resume to orch8.instance_requests (actor as '
'attributed_actor records it, the sealed API key, the login) and return p_outcome.';

CREATE OR REPLACE FUNCTION orch8.request_instance_state(
    p_tenant_id text,
    p_instance_id uuid,
    p_target orch8.instance_state,
    p_actor text,
    p_reason text DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.task_instances := orch8.load_instance(p_tenant_id, p_instance_id);
    v_state orch8.instance_state;
    v_action text := CASE p_target WHEN 'paused' THEN 'pause' WHEN 'cancelled' THEN 'cancel' END;
BEGIN
    IF p_target NOT IN ('paused', 'cancelled') THEN
        RAISE EXCEPTION 'only paused or cancelled can be requested' USING ERRCODE = 'O8008';
    END IF;
    IF octet_length(p_reason) > orch8.limit_of('note_bytes') THEN
        RAISE EXCEPTION 'reason is % bytes, over the limit of % bytes',
            octet_length(p_reason), orch8.limit_of('note_bytes')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'reason',
                                             'limit', orch8.limit_of('note_bytes'))::text;
    END IF;
    IF v_row.state = p_target OR v_row.requested_state = p_target THEN
        RETURN orch8.record_instance_request(p_tenant_id, p_instance_id, v_action, p_actor,
                                             p_reason, 'unchanged');
    END IF;
    IF v_row.state <> 'running' AND NOT orch8.instance_can_transition(v_row.state, p_target) THEN
        RAISE EXCEPTION 'instance % is %, it cannot be %', p_instance_id, v_row.state, p_target
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('instance_id', p_instance_id,
                                             'current_state', v_row.state)::text;
    END IF;
    -- who asked and why ride with the request, for the transition that applies it
    UPDATE orch8.task_instances AS t
    SET requested_state = p_target, requested_by = orch8.attributed_actor(p_actor),
        requested_reason = p_reason, updated_at = orch8.now()
    WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id
    RETURNING t.* INTO v_row;
    IF p_target = 'cancelled' THEN
        -- everything not yet dispatched is withdrawn now; a step in flight finishes first
        PERFORM orch8.cancel_subtree(v_row, '', coalesce(p_reason, 'instance cancelled'));
        PERFORM orch8.instance_end(v_row, orch8.lock_node(p_tenant_id, p_instance_id, ''));
    END IF;
    v_state := orch8.sync_instance(p_tenant_id, p_instance_id, p_actor, p_reason);
    RETURN orch8.record_instance_request(
        p_tenant_id, p_instance_id, v_action, p_actor, p_reason,
        CASE WHEN v_state = p_target THEN p_target::text ELSE 'requested' END);
END
$$;

COMMENT ON FUNCTION orch8.request_instance_state(
    text, uuid, orch8.instance_state, text, text
) IS
'Pause or cancel an instance: at once when no node of it holds a lease; else once the '
'steps in flight have finished (returns requested); unchanged when it already is or it '
'was asked already. A cancel withdraws at once every node not leased (cancel_subtree of '
'the root: child instances too) and starts the definition''s on_cancel blocks; the '
'instance is cancelled when they and the steps in flight are done. '
'From a final state: O8004 with DETAIL {instance_id, current_state}. A reason over '
'note_bytes: O8008. Every call that does not raise is recorded in instance_requests; a '
'pending request keeps its actor and reason (requested_by, requested_reason) for the '
'transition that applies it.';

CREATE OR REPLACE FUNCTION orch8.cancel_instance(
    p_tenant_id text, p_instance_id uuid, p_actor text, p_reason text DEFAULT NULL
)
RETURNS text
LANGUAGE sql
AS $$
    SELECT orch8.request_instance_state(
        orch8.require_tenant(p_tenant_id), p_instance_id, 'cancelled', p_actor, p_reason)
$$;

COMMENT ON FUNCTION orch8.cancel_instance(text, uuid, text, text) IS
'Cancel an instance (see request_instance_state): cancelled, requested or unchanged.';

CREATE OR REPLACE FUNCTION orch8.pause_instance(
    p_tenant_id text, p_instance_id uuid, p_actor text, p_reason text DEFAULT NULL
)
RETURNS text
LANGUAGE sql
AS $$
    SELECT orch8.request_instance_state(
        orch8.require_tenant(p_tenant_id), p_instance_id, 'paused', p_actor, p_reason)
$$;

COMMENT ON FUNCTION orch8.pause_instance(text, uuid, text, text) IS
'Pause an instance (see request_instance_state): paused, requested or unchanged.';

CREATE OR REPLACE FUNCTION orch8.resume_instance(
    p_tenant_id text, p_instance_id uuid, p_actor text, p_reason text DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    -- the web role acts in its sealed tenant (checked before the row is read)
    v_row orch8.task_instances := orch8.load_instance(
        orch8.require_tenant(p_tenant_id), p_instance_id);
BEGIN
    IF octet_length(p_reason) > orch8.limit_of('note_bytes') THEN
        RAISE EXCEPTION 'reason is % bytes, over the limit of % bytes',
            octet_length(p_reason), orch8.limit_of('note_bytes')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'reason',
                                             'limit', orch8.limit_of('note_bytes'))::text;
    END IF;
    IF v_row.state = 'running' AND v_row.requested_state = 'paused' THEN
        UPDATE orch8.task_instances AS t
        SET requested_state = NULL, requested_by = NULL, requested_reason = NULL,
            updated_at = orch8.now()
        WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id;
        PERFORM orch8.record_instance_request(p_tenant_id, p_instance_id, 'resume', p_actor,
                                              p_reason, 'withdrawn');
        RETURN 'running';
    END IF;
    IF v_row.state <> 'paused' THEN
        RAISE EXCEPTION 'instance % is %, not paused', p_instance_id, v_row.state
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('instance_id', p_instance_id,
                                             'current_state', v_row.state)::text;
    END IF;
    PERFORM orch8.transition_instance(p_tenant_id, p_instance_id, 'paused', 'scheduled',
                                      p_actor, coalesce(p_reason, 'resumed'));
    RETURN orch8.record_instance_request(
        p_tenant_id, p_instance_id, 'resume', p_actor, p_reason,
        orch8.sync_instance(p_tenant_id, p_instance_id, p_actor,
                            coalesce(p_reason, 'resumed'))::text);
END
$$;

COMMENT ON FUNCTION orch8.resume_instance(text, uuid, text, text) IS
'Resume a paused instance (scheduled now, or waiting, or failed, as its tree says: the '
'state is returned; the transition''s reason is p_reason, else resumed), or withdraw a '
'pause still pending on a running one (running). Recorded in instance_requests (outcome: '
'the state, or withdrawn). Any other state: O8004; a reason over note_bytes: O8008.';

CREATE OR REPLACE FUNCTION orch8.blocks_reading_output(p_definition jsonb, p_block_id text)
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT coalesce(array_agg(b.block_id ORDER BY b.json_path), ARRAY[]::text [])
    FROM orch8.definition_blocks(p_definition) AS b
    CROSS JOIN LATERAL (
        -- the block's own fields: what it holds of other blocks is theirs (a router's
        -- conditions are its own)
        SELECT (b.definition - ARRAY(SELECT c.field FROM orch8.block_containers() AS c
                                     WHERE c.type = b.type))::text
               || coalesce((SELECT string_agg(r.value ->> 'condition', ' ')
                            FROM jsonb_array_elements(CASE WHEN b.type = 'router'
                                 AND jsonb_typeof(b.definition -> 'routes') = 'array'
                                 THEN b.definition -> 'routes' END) AS r (value)), '')
            AS own
    ) AS o
    WHERE b.block_id IS DISTINCT FROM orch8.node_block_id(p_block_id)
      AND (
        -- outputs.<block> in a template or an expression, or outputs[...] (any block)
        o.own ~ ('outputs\.' || regexp_replace(orch8.node_block_id(p_block_id),
                                                '([^A-Za-z0-9_])', '\\\1', 'g')
                 || '($|[^A-Za-z0-9_-])')
        OR o.own ~ 'outputs\s*\['
    )
$$;

COMMENT ON FUNCTION orch8.blocks_reading_output(jsonb, text) IS
'The other blocks of a definition, at any depth, that may read the output of the block a '
'path names: outputs.<block> in their own fields (templates, expressions, verifiers), or '
'outputs[...] (an index could name any block). Conservative on purpose: a step completed '
'without its output must not feed them.';

CREATE OR REPLACE FUNCTION orch8.continue_settled_step(
    p_instance orch8.task_instances,
    p_row orch8.block_outputs,
    p_receipt orch8.effect_receipts,
    p_output jsonb,
    p_actor text,
    p_why text
)
RETURNS TABLE (outcome text, detail text)
LANGUAGE plpgsql
AS $$
DECLARE
    v_tenant text := (p_instance).tenant_id;
    v_instance uuid := (p_instance).id;
    v_path text := (p_row).block_id;
    v_node orch8.execution_nodes := orch8.lock_node(v_tenant, v_instance, v_path);
    v_output jsonb;
    v_readers text [];
BEGIN
    IF (p_receipt).state IN ('committed', 'verified') THEN
        -- it happened: complete the step with its output, never send again
        v_output := coalesce(p_output, (p_receipt).evidence -> 'resolution' -> 'output');
        IF v_output IS NULL THEN
            v_readers := orch8.blocks_reading_output(
                (SELECT s.definition FROM orch8.sequences AS s
                 WHERE s.tenant_id = v_tenant AND s.id = (p_instance).sequence_id),
                v_path);
            IF cardinality(v_readers) > 0 THEN
                RETURN QUERY SELECT 'needs_output'::text, format(
                    'receipt %s is %s but carries no output for block %s, and other blocks '
                    'read it (%s)', (p_receipt).id, (p_receipt).state, v_path,
                    array_to_string(v_readers, ', '));
                RETURN;
            END IF;
            v_output := jsonb_strip_nulls(jsonb_build_object(
                'settled', true,
                'settled_by', (p_receipt).evidence -> 'resolution' ->> 'actor',
                'effect_id', (p_receipt).id, 'effect_state', (p_receipt).state,
                'provider_receipt_id', (p_receipt).provider_receipt_id));
        END IF;
        PERFORM orch8.record_block_output(v_tenant, v_instance, v_path, (p_row).attempt, NULL,
            v_output, NULL, (p_receipt).id, NULL);
        IF v_node.state = 'failed' THEN
            PERFORM orch8.reopen_failure(p_instance, v_path);
        END IF;
        PERFORM orch8.end_node(p_instance, v_path, 'completed', NULL, NULL, NULL);
        PERFORM orch8.sync_instance(v_tenant, v_instance, p_actor,
            p_why || ': step settled from evidence');
        RETURN QUERY SELECT 'completed_from_evidence'::text,
            format('receipt %s is %s (provider receipt %s): the step is not sent again',
                   (p_receipt).id, (p_receipt).state,
                   coalesce((p_receipt).provider_receipt_id, '-'));
        RETURN;
    END IF;
    -- abandoned, compensated, or no receipt: the step runs again as a new attempt. After
    -- __unsettled__ compute_attempt stays on the attempt, so a __retry__ row moves it on.
    IF (p_row).sentinel = '__unsettled__' THEN
        PERFORM orch8.record_block_output(v_tenant, v_instance, v_path, (p_row).attempt,
            '__retry__', jsonb_build_object('error', format('receipt %s is %s: run again',
                                                            (p_receipt).id, (p_receipt).state)),
            true, (p_receipt).id, NULL);
    END IF;
    IF v_node.state = 'failed' THEN
        PERFORM orch8.reopen_failure(p_instance, v_path);
    END IF;
    UPDATE orch8.execution_nodes AS n
    SET state = 'ready', next_fire_at = orch8.now(), error = NULL, ended_at = NULL,
        child_instance_id = NULL, lease_owner = NULL, lease_token = NULL,
        -- run again by decision (a retry, a settlement): the step's deadline was the
        -- first run's
        deadline_at = NULL,
        lease_expires_at = NULL, updated_at = orch8.now()
    WHERE n.tenant_id = v_tenant AND n.instance_id = v_instance AND n.path = v_path;
    UPDATE orch8.task_instances AS t SET current_block = v_path
    WHERE t.tenant_id = v_tenant AND t.id = v_instance;
    PERFORM orch8.sync_instance(v_tenant, v_instance, p_actor, p_why || ': step runs again');
    RETURN QUERY SELECT 'rerun'::text,
        CASE WHEN (p_receipt).id IS NULL THEN 'the failed step runs again as a new attempt'
             ELSE format('receipt %s is %s: the step runs again as a new attempt',
                         (p_receipt).id, (p_receipt).state) END;
END
$$;

COMMENT ON FUNCTION orch8.continue_settled_step(
    orch8.task_instances, orch8.block_outputs, orch8.effect_receipts, jsonb, text, text
) IS
'The one place a settled receipt becomes a node''s next move (retry_instance and the '
'verifier; callers lock the instance and check it may move). committed or verified: the '
'step''s node completes with p_output, else the output its resolution carries, else '
'(when no other block reads it: blocks_reading_output) a marker {settled, settled_by, '
'effect_id, effect_state, provider_receipt_id}, and the tree moves on. Without an output '
'that other blocks read: outcome needs_output, nothing written. abandoned, compensated '
'or no receipt: the node is ready again for a new attempt (outcome rerun), without the '
'step''s deadline (it was the first run''s). A failed '
'node''s failure is undone up the tree first (reopen_failure). The audit row''s reason '
'starts with p_why (retry, verifier).';

CREATE OR REPLACE FUNCTION orch8.reopen_failure(p_inst orch8.task_instances, p_path text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_node orch8.execution_nodes := orch8.lock_node(p_inst.tenant_id, p_inst.id, p_path);
    v_parent orch8.execution_nodes;
    v_lists text [];
    v_path text;
    v_list orch8.execution_nodes;
    v_child orch8.execution_nodes;
BEGIN
    -- the node itself runs again (its caller says how); each failed ancestor it failed
    -- reopens, with the branches its failure cancelled
    UPDATE orch8.execution_nodes AS n
    SET state = 'running', error = NULL, failed_child = NULL, ended_at = NULL,
        updated_at = orch8.now()
    WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id AND n.path = p_path
      AND n.state = 'failed';
    WHILE v_node.parent_path IS NOT NULL LOOP
        v_parent := orch8.lock_node(p_inst.tenant_id, p_inst.id, v_node.parent_path);
        EXIT WHEN v_parent.state <> 'failed' OR v_parent.failed_child IS DISTINCT FROM v_node.path;
        UPDATE orch8.execution_nodes AS n
        SET state = 'running', error = NULL, failed_child = NULL, ended_at = NULL,
            updated_at = orch8.now()
        WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id
          AND n.path = v_parent.path;
        -- what this failure cancelled goes on from where it stopped (a sub_sequence whose
        -- child was cancelled starts a new one)
        -- (a node stopped under its lease ended cancelled from running, with no state
        -- kept: it never started its work, so it is ready again)
        WITH restored AS (
        UPDATE orch8.execution_nodes AS n
        SET state = CASE WHEN n.state_before_cancel = 'waiting' AND n.kind = 'sub_sequence'
                         THEN 'ready' ELSE coalesce(n.state_before_cancel, 'ready') END,
            child_instance_id = CASE WHEN n.kind = 'sub_sequence' THEN NULL
                                     ELSE n.child_instance_id END,
            next_fire_at = orch8.now(), cancel_reason = NULL, state_before_cancel = NULL,
            cancel_requested = false,
            ended_at = NULL, updated_at = orch8.now()
        WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id
          AND orch8.in_subtree(n.path, v_parent.path) AND n.state = 'cancelled'
          AND n.cancel_reason IN (format('branch %s failed', v_node.path),
                                  format('item %s failed', v_node.path))
        RETURNING n.path, n.kind
        )
        SELECT coalesce(array_agg(r.path ORDER BY length(r.path) DESC, r.path), '{}')
        INTO v_lists FROM restored AS r WHERE r.kind IN ('sequence', 'saga');
        UPDATE orch8.execution_nodes AS n
        SET cancel_requested = false, cancel_reason = NULL, updated_at = orch8.now()
        WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id
          AND orch8.in_subtree(n.path, v_parent.path) AND n.cancel_requested
          AND n.cancel_reason IN (format('branch %s failed', v_node.path),
                                  format('item %s failed', v_node.path));
        -- a list whose block ended while it was cancelled (a step that finished late, its
        -- result recorded) takes that end now, as it would have then (node_ended: the next
        -- block, or the list's failure); the innermost first, each re-read
        FOREACH v_path IN ARRAY v_lists LOOP
            v_list := orch8.lock_node(p_inst.tenant_id, p_inst.id, v_path);
            CONTINUE WHEN v_list.state <> 'running' OR EXISTS (
                SELECT 1 FROM orch8.execution_nodes AS c
                WHERE c.tenant_id = p_inst.tenant_id AND c.instance_id = p_inst.id
                  AND c.parent_path = v_path
                  AND c.state IN ('ready', 'running', 'waiting', 'blocked'));
            SELECT c.* INTO v_child FROM orch8.execution_nodes AS c
            WHERE c.tenant_id = p_inst.tenant_id AND c.instance_id = p_inst.id
              AND c.parent_path = v_path
            ORDER BY c.ended_at DESC NULLS LAST, c.created_at DESC
            LIMIT 1;
            IF v_child.path IS NOT NULL THEN
                PERFORM orch8.node_ended(p_inst, v_child);
            END IF;
        END LOOP;
        v_node := v_parent;
    END LOOP;
END
$$;

COMMENT ON FUNCTION orch8.reopen_failure(orch8.task_instances, text) IS
'Undo a failure for an operator''s retry: the failed node at p_path and every ancestor '
'its failure failed (failed_child) run again, and what that failure cancelled (the other '
'branches of a parallel, the other items of a for_each) goes on from where it stopped: '
'each node back to the state it had (ready for one stopped before its work began), a '
'leased one no longer asked to stop, and a list whose block ended meanwhile moves on.';

CREATE OR REPLACE FUNCTION orch8.retry_instance(
    p_tenant_id text, p_instance_id uuid, p_actor text, p_output jsonb DEFAULT NULL
)
RETURNS TABLE (outcome text, block_id text, effect_id uuid, detail text)
LANGUAGE plpgsql
AS $$
DECLARE
    -- the web role acts in its sealed tenant (checked before the row is read)
    v_inst orch8.task_instances := orch8.load_instance(
        orch8.require_tenant(p_tenant_id), p_instance_id);
    v_paths text [];
    v_path text;
    v_origin orch8.execution_nodes;
    v_err orch8.block_outputs;
    v_receipt orch8.effect_receipts;
    v_candidate orch8.effect_receipts;
    v_next record;
BEGIN
    PERFORM orch8.require_output_size(p_output);
    -- Nodes that wait on a person: blocked, or waiting on a verifier (for a receipt an
    -- operator settled meanwhile; one still unknown is refused below). Nothing around them
    -- moved, so they alone go on.
    SELECT coalesce(array_agg(n.path ORDER BY n.path), ARRAY[]::text []) INTO v_paths
    FROM orch8.execution_nodes AS n
    CROSS JOIN LATERAL orch8.latest_block_row(n.tenant_id, n.instance_id, n.path) AS o
    WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id
      AND (n.state = 'blocked'
           OR (n.state = 'waiting' AND o.sentinel = '__unsettled__')
           -- failed by hand while a step ran (its runner lost): that step is stale
           OR (v_inst.state = 'failed' AND n.state = 'running'
               AND n.kind IN ('step', 'compensation')));
    IF cardinality(v_paths) = 0 THEN
        IF v_inst.state <> 'failed' THEN
            RAISE EXCEPTION 'instance % is %: only a failed instance can be retried',
                p_instance_id, v_inst.state
                USING ERRCODE = 'O8004',
                      DETAIL = json_build_object('instance_id', p_instance_id,
                                                 'current_state', v_inst.state)::text;
        END IF;
        -- the node the instance's failure came from, down from the root
        v_origin := orch8.lock_node(p_tenant_id, p_instance_id, '');
        WHILE v_origin.state = 'failed' AND v_origin.failed_child IS NOT NULL LOOP
            IF v_origin.kind IN ('try_catch', 'saga', 'undo') THEN
                RAISE EXCEPTION 'instance %: the failure of % was handled by % % (%), which '
                                'cannot be run again', p_instance_id, v_origin.failed_child,
                                v_origin.kind, v_origin.block_id, v_origin.error
                    USING ERRCODE = 'O8004',
                          DETAIL = json_build_object('instance_id', p_instance_id,
                                                     'block_id', v_origin.path)::text,
                          HINT = 'start a new instance';
            END IF;
            v_origin := orch8.lock_node(p_tenant_id, p_instance_id, v_origin.failed_child);
        END LOOP;
        IF v_origin.state IS DISTINCT FROM 'failed' OR v_origin.path = ''
           OR v_origin.kind NOT IN ('step', 'compensation', 'loop', 'for_each', 'router',
                                    'sub_sequence') THEN
            RAISE EXCEPTION 'instance %: no failed step to run again', p_instance_id
                USING ERRCODE = 'O8004',
                      DETAIL = json_build_object('instance_id', p_instance_id,
                                                 'current_state', v_inst.state)::text;
        END IF;
        v_paths := ARRAY[v_origin.path];
    END IF;
    IF p_output IS NOT NULL AND cardinality(v_paths) > 1 THEN
        RAISE EXCEPTION 'instance % waits on %s steps (%): an output belongs to one; resolve '
                        'each receipt with its output instead', p_instance_id,
                        cardinality(v_paths), array_to_string(v_paths, ', ')
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'output')::text;
    END IF;

    -- Check every node before moving any: the receipt that decides (for a duplicate, the
    -- one holding the content; else the step's own) must be settled.
    FOREACH v_path IN ARRAY v_paths LOOP
        v_err := orch8.latest_block_row(p_tenant_id, p_instance_id, v_path);
        v_receipt := orch8.load_effect_receipt(
            p_tenant_id,
            coalesce((v_err.output ->> 'competing_effect_id')::uuid, v_err.effect_id));
        IF v_receipt.id IS NOT NULL AND v_receipt.state IN ('dispatched', 'unknown') THEN
            RAISE EXCEPTION 'receipt % (block %, attempt %) is %: resolve it before retrying',
                v_receipt.id, v_receipt.block_id, v_receipt.attempt, v_receipt.state
                USING ERRCODE = 'O8006',
                      DETAIL = json_build_object('effect_id', v_receipt.id,
                                                 'effect_state', v_receipt.state,
                                                 'block_id', v_receipt.block_id,
                                                 'attempt', v_receipt.attempt)::text,
                      HINT = 'orch8.resolve_effect(...) with what the provider says';
        END IF;
        IF p_output IS NOT NULL AND v_receipt.state IS DISTINCT FROM 'committed'
           AND v_receipt.state IS DISTINCT FROM 'verified' THEN
            RAISE EXCEPTION 'an output is used only when the step completes from a committed '
                            'or verified receipt; here the step runs again'
                USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'output')::text;
        END IF;
    END LOOP;

    FOREACH v_path IN ARRAY v_paths LOOP
        v_err := orch8.latest_block_row(p_tenant_id, p_instance_id, v_path);
        v_receipt := orch8.load_effect_receipt(
            p_tenant_id,
            coalesce((v_err.output ->> 'competing_effect_id')::uuid, v_err.effect_id));
        -- a duplicate's own candidate never dispatched: it is superseded, not left to compete
        IF v_err.output ? 'competing_effect_id' THEN
            v_candidate := orch8.load_effect_receipt(p_tenant_id, v_err.effect_id);
            IF v_candidate.state IN ('planned', 'prepared') THEN
                PERFORM orch8.cas_effect_receipt(p_tenant_id, v_candidate.id, v_candidate.state,
                    'abandoned', jsonb_build_object(
                        'actor', p_actor, 'note', 'superseded by an operator retry',
                        'evidence', jsonb_build_object('superseded_by_retry', true)));
            END IF;
        END IF;
        IF v_err.seq IS NULL THEN  -- failed before it wrote anything
            v_err.block_id := v_path;
            v_err.attempt := 0;
        END IF;
        v_inst := orch8.load_instance(p_tenant_id, p_instance_id);
        SELECT * INTO v_next
        FROM orch8.continue_settled_step(v_inst, v_err, v_receipt, p_output, p_actor, 'retry');
        IF v_next.outcome = 'needs_output' THEN
            RAISE EXCEPTION '%: give the output the step would have returned', v_next.detail
                USING ERRCODE = 'O8008',
                      DETAIL = json_build_object(
                          'field', 'output', 'effect_id', v_receipt.id, 'block_id', v_path,
                          'read_by', orch8.blocks_reading_output(
                              (SELECT s.definition FROM orch8.sequences AS s
                               WHERE s.tenant_id = p_tenant_id AND s.id = v_inst.sequence_id),
                              v_path))::text,
                      HINT = 'retry with an output (orch8 instances retry ID --output JSON), or '
                             'resolve the receipt with one';
        END IF;
        RETURN QUERY SELECT v_next.outcome, v_path, v_receipt.id, v_next.detail;
    END LOOP;
END
$$;

COMMENT ON FUNCTION orch8.retry_instance(text, uuid, text, jsonb) IS
'An operator''s retry. First the nodes that wait on a person: blocked ones, and ones '
'waiting on a verifier for a receipt settled meanwhile; they alone go on, in any instance '
'that has them (a blocked branch is retried while the others run). Else, for a failed '
'instance, the node its failure came from (followed down from the root), whose failed '
'ancestors and the branches its failure cancelled reopen (reopen_failure); a failure a '
'try_catch or a saga handled is refused (O8004: they reacted to it already). Each node '
'goes on by the receipt that stopped it (for a duplicate, the receipt holding the '
'content), through continue_settled_step: committed or verified -> the step completes '
'with p_output, else the output its resolution carries, and the workflow continues '
'without sending again; abandoned, compensated, or no receipt -> the step runs again as '
'a new attempt; dispatched or unknown -> O8006 with DETAIL {effect_id, effect_state, '
'block_id, attempt}, the receipt to resolve first, and nothing moves. No output while '
'other blocks read the step''s: O8008 with DETAIL {field, effect_id, block_id, read_by}; '
'an output for a step that runs again, for several steps at once, or over '
'resolution_output_bytes: O8008. Nothing to retry: O8004 with DETAIL {instance_id, '
'current_state}. One row per node that moved.';
