-- Repeatable: the runner's two calls around a step. A guarded step costs exactly these
-- two round trips (begin_step before the handler, finish_step after it) besides the
-- amortised claim. Both are fenced by the lease token of the step's node.

CREATE OR REPLACE FUNCTION orch8.fail_step(
    p_tenant_id text,
    p_instance_id uuid,
    p_lease_token uuid,
    p_block_id text,
    p_attempt integer,
    p_effect_id uuid,
    p_output jsonb,
    p_reason text
)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM orch8.record_block_output(p_tenant_id, p_instance_id, p_block_id, p_attempt,
                                      '__error__', p_output, false, p_effect_id, p_lease_token);
    PERFORM orch8.end_node(
        (SELECT t FROM orch8.task_instances AS t
         WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id),
        p_block_id, 'failed', NULL, p_reason, NULL);
END
$$;

COMMENT ON FUNCTION orch8.fail_step(text, uuid, uuid, text, integer, uuid, jsonb, text) IS
'A step failed for good (internal helper of begin_step and finish_step): append its '
'__error__ row (retryable false) and fail its node with p_reason, which unwinds to the '
'nearest block that handles it (end_node).';

CREATE OR REPLACE FUNCTION orch8.step_idempotency_key_param(p_params jsonb)
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT CASE WHEN jsonb_typeof(p_params -> 'idempotency_key') IN ('string', 'number')
                     AND p_params ->> 'idempotency_key' <> ''
                THEN p_params ->> 'idempotency_key' END
$$;

COMMENT ON FUNCTION orch8.step_idempotency_key_param(jsonb) IS
'The idempotency_key param of a step''s rendered params (a non-empty string, or a number '
'as text), or NULL.';

CREATE OR REPLACE FUNCTION orch8.step_idempotency_key_problem(p_params jsonb)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
BEGIN
    RETURN (
        SELECT format('the idempotency_key param is %s bytes, over the limit of %s',
                      octet_length(k.key), orch8.limit_of('idempotency_key_bytes'))
        FROM (SELECT orch8.step_idempotency_key_param(p_params) AS key) AS k
        WHERE octet_length(k.key) > orch8.limit_of('idempotency_key_bytes')
    );
END
$$;

COMMENT ON FUNCTION orch8.step_idempotency_key_problem(jsonb) IS
'Why a step''s idempotency_key param cannot be a receipt''s key (over '
'idempotency_key_bytes), or NULL.';

CREATE OR REPLACE FUNCTION orch8.step_ambiguity_mode(p_step jsonb)
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT coalesce(
        p_step -> 'retry' ->> 'on_ambiguous',
        CASE WHEN p_step -> 'provider_idempotency' = 'true'
                  OR (p_step -> 'params') ? 'idempotency_key'
             THEN 'same_key' ELSE 'settle' END)
$$;

COMMENT ON FUNCTION orch8.step_ambiguity_mode(jsonb) IS
'What a step does after an ambiguous outcome (orch8.ambiguity_modes()): its '
'retry.on_ambiguous, else same_key when the provider deduplicates (provider_idempotency '
'true, or an idempotency_key param), else settle (never resend: a verifier or an '
'operator settles the receipt first).';

CREATE OR REPLACE FUNCTION orch8.await_settlement(
    p_tenant_id text,
    p_instance_id uuid,
    p_lease_token uuid,
    p_block_id text,
    p_attempt integer,
    p_effect_id uuid,
    p_error text
)
RETURNS orch8.node_state
LANGUAGE plpgsql
AS $$
DECLARE
    v_node orch8.execution_nodes := orch8.lock_node(p_tenant_id, p_instance_id, p_block_id);
    v_parent_state orch8.node_state;
    v_state orch8.node_state;
BEGIN
    PERFORM orch8.record_block_output(p_tenant_id, p_instance_id, p_block_id, p_attempt,
        '__unsettled__', jsonb_build_object('error', p_error, 'effect_id', p_effect_id),
        NULL, p_effect_id, p_lease_token);
    -- scheduled only when the step declares a verifier and the receipt is unknown
    PERFORM orch8.schedule_verification(p_tenant_id, p_effect_id, 'engine');
    SELECT n.state INTO v_parent_state FROM orch8.execution_nodes AS n
    WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id
      AND n.path = v_node.parent_path;
    IF v_node.cancel_requested
       OR v_parent_state IN ('completed', 'failed', 'skipped', 'cancelled') THEN
        -- its branch was given up (a race lost, a sibling failed): the receipt stays in the
        -- unresolved queue, and nothing waits on it
        v_state := 'cancelled';
    ELSIF EXISTS (SELECT 1 FROM orch8.effect_verifications AS v
                  WHERE v.tenant_id = p_tenant_id AND v.effect_id = p_effect_id
                    AND v.state = 'pending') THEN
        v_state := 'waiting';
    ELSE
        v_state := 'blocked';
    END IF;
    UPDATE orch8.execution_nodes AS n
    SET state = v_state, error = left(p_error, orch8.limit_of('error_chars')::integer),
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        ended_at = CASE WHEN v_state = 'cancelled' THEN orch8.now() END,
        cancel_reason = CASE WHEN v_state = 'cancelled'
                             THEN coalesce(n.cancel_reason, 'its branch ended meanwhile')
                             ELSE n.cancel_reason END,
        updated_at = orch8.now()
    WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id AND n.path = p_block_id;
    UPDATE orch8.task_instances AS t SET current_block = p_block_id
    WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id
      AND t.current_block IS DISTINCT FROM p_block_id;
    RETURN v_state;
END
$$;

COMMENT ON FUNCTION orch8.await_settlement(text, uuid, uuid, text, integer, uuid, text) IS
'A step whose outcome is ambiguous and is not resent (internal helper of begin_step and '
'finish_step): append __unsettled__ (compute_attempt keeps the attempt, so running the '
'node again lands on the same receipt and cannot send), schedule the step''s verifier, '
'and park the node: waiting (a verifier is pending) or blocked (for an operator), which '
'stops its branch only; in a branch given up meanwhile it ends cancelled, its receipt '
'left in the unresolved queue. Returns the node''s state.';

CREATE OR REPLACE FUNCTION orch8.begin_step(
    p_tenant_id text,
    p_instance_id uuid,
    p_lease_token uuid,
    p_block_id text,
    p_handler text,
    p_params jsonb,
    p_attempt integer,
    p_not_runnable text DEFAULT NULL
)
RETURNS orch8.effect_outcome
LANGUAGE plpgsql
AS $$
DECLARE
    v_out orch8.effect_outcome;
    v_last orch8.block_outputs;
    v_inst orch8.task_instances;
    v_node orch8.execution_nodes;
    v_worker orch8.worker_handlers;
BEGIN
    v_inst := orch8.lock_leased_instance(p_tenant_id, p_instance_id, p_lease_token);
    -- The same claim asking again (its first answer was lost with the connection): the
    -- handler has not run, since the runner only calls it after this answer.
    SELECT * INTO v_last FROM orch8.block_outputs AS o
     WHERE o.tenant_id = p_tenant_id AND o.instance_id = p_instance_id
       AND o.block_id = p_block_id
     ORDER BY o.seq DESC LIMIT 1;
    IF v_last.sentinel = '__in_progress__' AND v_last.attempt = p_attempt
       AND v_last.lease_token = p_lease_token THEN
        RETURN orch8.effect_outcome_of(
            'dispatched', orch8.load_effect_receipt(p_tenant_id, v_last.effect_id),
            'repeated begin under the same lease');
    END IF;
    v_node := orch8.leased_node(p_tenant_id, p_instance_id, p_lease_token);
    PERFORM orch8.require_node(v_node, p_block_id, ARRAY['step', 'compensation'], 'begin_step');
    IF orch8.stop_node(v_inst, v_node) IS NOT NULL THEN
        -- its branch was cancelled, or an operator asked for a pause or a cancel
        RETURN ROW('stopped', NULL, NULL, NULL, p_block_id, p_attempt, NULL, NULL,
                   orch8.sync_instance(p_tenant_id, p_instance_id, 'runner',
                                       'requested while running')::text,
                   NULL)::orch8.effect_outcome;
    END IF;
    IF orch8.deadline_passed(v_node) THEN
        -- claimed in time but begun too late: it fails before any receipt
        PERFORM orch8.fail_deadline(v_inst, v_node, p_attempt, NULL, p_lease_token);
        RETURN ROW('stopped', NULL, NULL, NULL, p_block_id, p_attempt, NULL, NULL,
                   orch8.sync_instance(p_tenant_id, p_instance_id, 'runner',
                                       'deadline passed')::text,
                   NULL)::orch8.effect_outcome;
    END IF;
    IF orch8.step_idempotency_key_problem(p_params) IS NOT NULL THEN
        -- refused before any receipt (begin_effect would raise, and lose this record)
        PERFORM orch8.fail_step(p_tenant_id, p_instance_id, p_lease_token, p_block_id,
            p_attempt, NULL, jsonb_build_object('error', 'idempotency_key too long'),
            'InvalidInput: ' || orch8.step_idempotency_key_problem(p_params));
        RETURN ROW('stopped', NULL, NULL, NULL, p_block_id, p_attempt, NULL, NULL,
                   orch8.sync_instance(p_tenant_id, p_instance_id, 'runner')::text,
                   NULL)::orch8.effect_outcome;
    END IF;
    -- A handler registered for external workers is theirs, whatever the caller has loaded
    SELECT * INTO v_worker FROM orch8.worker_handlers AS w
    WHERE w.tenant_id = p_tenant_id AND w.handler = p_handler;
    IF v_worker.handler IS NULL AND p_not_runnable IS NOT NULL THEN
        -- nobody can run it: the step fails before any receipt
        PERFORM orch8.fail_step(p_tenant_id, p_instance_id, p_lease_token, p_block_id,
            p_attempt, NULL, jsonb_build_object('error', p_not_runnable), p_not_runnable);
        RETURN ROW('stopped', NULL, NULL, NULL, p_block_id, p_attempt, NULL, NULL,
                   orch8.sync_instance(p_tenant_id, p_instance_id, 'runner')::text,
                   NULL)::orch8.effect_outcome;
    END IF;
    v_out := orch8.begin_effect(p_tenant_id, p_instance_id, p_block_id, p_handler, p_params,
                                p_attempt);
    IF v_out.outcome IS NULL THEN
        RETURN v_out;  -- pure handler: nothing to record before it runs
    END IF;
    IF v_out.outcome = 'dispatched' THEN
        -- begin_effect has just moved this receipt to dispatched: it is this step's own
        PERFORM orch8.insert_block_output(p_tenant_id, p_instance_id, p_block_id, p_attempt,
            '__in_progress__', NULL, NULL, v_out.effect_id, p_lease_token);
        IF v_worker.handler IS NOT NULL THEN
            v_out.detail := format('worker task %s queued for handler %s',
                orch8.dispatch_worker_task(v_inst, v_node, v_worker, v_out, p_params),
                p_handler);
            v_out.outcome := 'queued';
        END IF;
        RETURN v_out;
    END IF;
    IF v_out.outcome = 'blocked' AND v_out.state = 'unknown' THEN
        -- an earlier run of this attempt may have sent it: settle that receipt first
        PERFORM orch8.await_settlement(p_tenant_id, p_instance_id, p_lease_token, p_block_id,
            p_attempt, v_out.effect_id, 'EffectBlocked: ' || v_out.detail);
        PERFORM orch8.sync_instance(p_tenant_id, p_instance_id, 'runner',
            format('EffectBlocked: %s; its verifier settles receipt %s', v_out.detail,
                   v_out.effect_id));
        RETURN v_out;
    END IF;
    -- blocked, stale or duplicate: never retried. The trace begin_effect wrote stays.
    PERFORM orch8.fail_step(
        p_tenant_id, p_instance_id, p_lease_token, p_block_id, p_attempt, v_out.effect_id,
        jsonb_build_object('outcome', v_out.outcome, 'effect_state', v_out.state,
                           'detail', v_out.detail, 'invariant_id', v_out.invariant_id,
                           'competing_effect_id', v_out.competing_effect_id),
        format('%s: %s',
               CASE v_out.outcome WHEN 'duplicate' THEN 'InvariantViolation'
                                  ELSE 'EffectBlocked' END,
               v_out.detail));
    PERFORM orch8.sync_instance(p_tenant_id, p_instance_id, 'runner');
    RETURN v_out;
END
$$;

COMMENT ON FUNCTION orch8.begin_step(text, uuid, uuid, text, text, jsonb, integer, text) IS
'Before a handler runs, in one call: check the lease (O8001), begin_effect, and on '
'dispatched append the __in_progress__ sentinel with the effect id. A handler registered '
'for external workers (worker_handlers) is dispatched to them in the same transaction '
'(dispatch_worker_task: a queued task, the node waiting without a lease): outcome '
'queued, detail naming the task. p_not_runnable (why the caller cannot run the handler '
'itself): when no worker serves it either, the step fails with that reason before any '
'receipt (outcome stopped). Blocked on an unknown '
'receipt (an earlier run of this attempt may have sent): await_settlement (__unsettled__, '
'the verifier or an operator). Otherwise blocked, stale or duplicate: append __error__ '
'(retryable false) and fail the instance in the same transaction; the outcome is '
'returned (never raised) so those writes persist. An idempotency_key param over '
'idempotency_key_bytes fails the step before any receipt (outcome stopped, detail '
'failed). A pure '
'handler returns a NULL outcome and writes nothing. A node whose branch was cancelled, '
'or whose instance an operator asked to pause or cancel, does not begin (outcome '
'stopped, detail the instance''s state). Repeating the call '
'under the same lease after a lost answer returns the same dispatched outcome.';

CREATE OR REPLACE FUNCTION orch8.require_step_result(p_result text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $$
BEGIN
    IF p_result IS NULL
       OR p_result NOT IN ('ok', 'error', 'not_applied', 'skipped', 'invalid_output') THEN
        RAISE EXCEPTION 'a step result must be ok, error, not_applied, skipped or '
                        'invalid_output, got %',
            coalesce(p_result, 'NULL')
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'result')::text;
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.require_step_result(text) IS
'The results a step can come to (ok, error, not_applied; skipped when its when is false; '
'invalid_output when its output breaks output_schema); anything else is O8008. Read by '
'finish_step and keep_lost_receipt.';

CREATE OR REPLACE FUNCTION orch8.recover_lost_receipt(
    p_tenant_id text,
    p_instance_id uuid,
    p_block_id text,
    p_attempt integer,
    p_effect_id uuid,
    p_result text,
    p_output jsonb,
    p_error text
)
RETURNS orch8.effect_receipts
LANGUAGE plpgsql
AS $$
DECLARE
    v_scope orch8.continuity_executions := orch8.ensure_effect_scope(p_tenant_id, p_instance_id);
    v_handler text := orch8.instance_step(p_tenant_id, p_instance_id, p_block_id) ->> 'handler';
    v_stand_in text := encode(sha256(convert_to('orch8:lost-write:' || p_effect_id, 'UTF8')),
                              'hex');
    v_note text := 'begin_step''s write was lost (a failover?) after the handler was called';
BEGIN
    -- Only the id begin_step derives for this very step: no one records a receipt they
    -- name at will.
    IF p_effect_id IS DISTINCT FROM orch8.effect_receipt_id(
           v_scope.effect_id_version, v_scope.continuity_id, v_scope.epoch, p_instance_id,
           p_block_id, p_attempt) THEN
        PERFORM orch8.refuse_foreign_receipt(p_effect_id, p_instance_id, p_block_id, p_attempt);
    END IF;
    -- The request's content is gone with the write: stand-in hashes, unique to the receipt,
    -- and the effect id as key (what a step without an idempotency_key param sends).
    PERFORM orch8.ensure_effect_receipt(
        p_tenant_id, p_effect_id, v_scope.continuity_id, v_scope.epoch, p_instance_id,
        p_block_id, p_attempt, coalesce(orch8.effect_kind(v_handler), 'custom'),
        coalesce(v_handler, 'unknown'), v_stand_in, v_stand_in, p_effect_id::text,
        jsonb_build_object('recovered_after_lost_write', true, 'handler_result', p_result,
                           'handler_output', p_output, 'handler_error', p_error));
    PERFORM orch8.cas_effect_receipt(p_tenant_id, p_effect_id, 'planned', 'prepared',
                                     jsonb_build_object('note', v_note));
    PERFORM orch8.cas_effect_receipt(p_tenant_id, p_effect_id, 'prepared', 'dispatched',
                                     jsonb_build_object('note', v_note));
    PERFORM orch8.cas_effect_receipt(p_tenant_id, p_effect_id, 'dispatched', 'unknown',
        jsonb_build_object('note', v_note, 'error', left(coalesce(p_error,
            'the handler answered ' || p_result || ' but the receipt was lost'), 2000)));
    RETURN (SELECT r FROM orch8.effect_receipts AS r
            WHERE r.tenant_id = p_tenant_id AND r.id = p_effect_id);
END
$$;

COMMENT ON FUNCTION orch8.recover_lost_receipt(
    text, uuid, text, integer, uuid, text, jsonb, text
) IS
'finish_step''s helper for a receipt that is gone (begin_step''s transaction lost with a '
'failed primary under asynchronous replication) while the handler ran: records it again, '
'moved through prepared and dispatched to unknown, with the handler''s result, output and '
'error as evidence (recovered_after_lost_write), so it reaches the unresolved queue. '
'Only for the id begin_step derives for this instance, block and attempt (else O8009).';

CREATE OR REPLACE FUNCTION orch8.keep_lost_receipt(
    p_tenant_id text,
    p_instance_id uuid,
    p_block_id text,
    p_attempt integer,
    p_effect_id uuid,
    p_result text,
    p_output jsonb,
    p_error text
)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM orch8.require_step_result(p_result);
    -- The instance's row lock orders this call with begin_step: either begin_step already
    -- wrote this receipt (nothing to do here), or it will find the one written here.
    PERFORM 1 FROM orch8.task_instances AS t
     WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id
       FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'instance % not found', p_instance_id
            USING ERRCODE = 'O8007', DETAIL = json_build_object('instance_id', p_instance_id)::text;
    END IF;
    IF EXISTS (SELECT 1 FROM orch8.effect_receipts AS r
                WHERE r.tenant_id = p_tenant_id AND r.id = p_effect_id) THEN
        RETURN false;
    END IF;
    PERFORM orch8.recover_lost_receipt(p_tenant_id, p_instance_id, p_block_id, p_attempt,
                                       p_effect_id, p_result, p_output, p_error);
    RETURN true;
END
$$;

COMMENT ON FUNCTION orch8.keep_lost_receipt(
    text, uuid, text, integer, uuid, text, jsonb, text
) IS
'keep_lost_receipts'' helper for one dispatched effect: when its receipt is missing (lost '
'with a failed primary), records it as unknown with the handler''s answer '
'(recover_lost_receipt), whatever the lease and without moving the instance, so that '
'begin_step of whoever claims the step next finds it and blocks instead of sending again. '
'Returns true when it recorded one, false when the receipt exists. Only the id '
'begin_step derives for this step (else O8009).';

CREATE OR REPLACE FUNCTION orch8.keep_lost_receipts(p_items jsonb)
RETURNS TABLE (effect_id uuid, outcome text)
LANGUAGE plpgsql
AS $$
DECLARE
    v_item jsonb;
BEGIN
    IF jsonb_typeof(p_items) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'keep_lost_receipts takes a JSON array of receipts, got %',
            coalesce(jsonb_typeof(p_items), 'NULL')
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'items')::text;
    END IF;
    FOR v_item IN SELECT i.value FROM jsonb_array_elements(p_items) AS i (value) LOOP
        effect_id := (v_item ->> 'effect_id')::uuid;
        BEGIN
            -- one receipt refused must not cost the others their record
            IF orch8.keep_lost_receipt(
                v_item ->> 'tenant_id', (v_item ->> 'instance_id')::uuid,
                v_item ->> 'block_id', (v_item ->> 'attempt')::integer, effect_id,
                v_item ->> 'result', v_item -> 'output', v_item ->> 'error') THEN
                outcome := 'recorded';
                RETURN NEXT;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            outcome := format('%s: %s', SQLSTATE, SQLERRM);
            RETURN NEXT;
        END;
    END LOOP;
END
$$;

COMMENT ON FUNCTION orch8.keep_lost_receipts(jsonb) IS
'The runner''s record of receipts a failover may have lost: for each item {tenant_id, '
'instance_id, block_id, attempt, effect_id, result, output, error}, keep_lost_receipt. '
'Called after finish_step refused a lease following a dispatch, and after an outage for '
'the side effects the runner finished shortly before it (their begin_step and finish_step '
'may both be gone while the claim survived). Answers one row per receipt it recorded '
'(outcome recorded) and per item it could not handle (outcome: the SQLSTATE and message), '
'none for receipts that exist; each item runs in its own subtransaction.';

CREATE OR REPLACE FUNCTION orch8.record_step_result(
    p_inst orch8.task_instances,
    p_node orch8.execution_nodes,
    p_attempt integer,
    p_effect_id uuid,
    p_result text,
    p_output jsonb,
    p_error text,
    p_retry_in interval,
    p_error_code text,
    p_lease_token uuid,
    p_settled orch8.effect_outcome DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_tenant text := p_inst.tenant_id;
    v_instance uuid := p_inst.id;
    v_path text := p_node.path;
    v_settled orch8.effect_outcome := p_settled;
    v_receipt orch8.effect_receipts;
    v_retry_in interval;
    v_reason text;
BEGIN
    IF p_effect_id IS NOT NULL THEN
        -- the one read of the receipt: whose it is, and whether it is there at all
        v_receipt := orch8.require_own_receipt(v_tenant, p_effect_id, v_instance, v_path,
                                               p_attempt);
    END IF;
    IF p_effect_id IS NOT NULL AND v_receipt.id IS NULL THEN
        -- The receipt written before dispatch is gone, yet the handler ran: record it
        -- unknown with what the handler answered, and wait for it to be settled.
        PERFORM orch8.recover_lost_receipt(v_tenant, v_instance, v_path, p_attempt,
                                           p_effect_id, p_result, p_output, p_error);
        v_reason := format('EffectBlocked: receipt %s was lost with the primary; recovered '
                           'as unknown', p_effect_id);
        PERFORM orch8.await_settlement(v_tenant, v_instance, p_lease_token,
            v_path, p_attempt, p_effect_id, v_reason);
        RETURN v_reason;
    END IF;
    IF p_effect_id IS NOT NULL AND v_settled.outcome IS NULL THEN
        v_settled := CASE
            WHEN p_result IN ('ok', 'invalid_output')
            THEN orch8.commit_effect(v_tenant, p_effect_id, p_output)
            WHEN p_result = 'error'
            THEN orch8.mark_effect_unknown(v_tenant, p_effect_id, p_error)
            ELSE orch8.abandon_effect_not_applied(
                v_tenant, p_effect_id,
                coalesce(nullif(p_output, '{}'::jsonb),
                         jsonb_build_object('error', coalesce(p_error, 'not applied'))))
        END;
    END IF;
    IF v_settled.outcome = 'stale' THEN
        -- someone moved our receipt (an operator, a runner that took over): stop.
        v_reason := format('EffectBlocked: %s', v_settled.detail);
        PERFORM orch8.fail_step(
            v_tenant, v_instance, p_lease_token, v_path, p_attempt, p_effect_id,
            jsonb_build_object('outcome', 'stale', 'effect_state', v_settled.state,
                               'detail', v_settled.detail), v_reason);
    ELSIF p_result = 'ok' THEN
        PERFORM orch8.insert_block_output(v_tenant, v_instance, v_path,  -- checked above
            p_attempt, NULL, coalesce(p_output, 'null'), NULL, p_effect_id, p_lease_token);
        IF p_effect_id IS NOT NULL AND p_attempt > 0 THEN  -- attempt 0 has no earlier one
            PERFORM orch8.settle_same_key_receipts(v_tenant, p_effect_id, 'engine');
        END IF;
        IF orch8.deadline_passed(p_node) THEN
            -- too late: the outcome is recorded (and its receipt committed), the node fails
            v_reason := orch8.fail_deadline(p_inst, p_node, p_attempt, p_effect_id,
                                            p_lease_token);
        ELSE
            PERFORM orch8.end_node(p_inst, v_path, 'completed', NULL, NULL, NULL);
        END IF;
    ELSIF p_result = 'skipped' THEN
        PERFORM orch8.record_block_output(v_tenant, v_instance, v_path,
            p_attempt, '__skipped__', p_output, NULL, NULL, p_lease_token);
        PERFORM orch8.end_node(p_inst, v_path, 'skipped', NULL, NULL, NULL);
    ELSIF p_result = 'invalid_output' THEN
        -- it happened (the receipt is committed), but the output breaks the step's
        -- output_schema: a failure no retry repairs
        v_reason := coalesce(p_error, 'the output does not match output_schema');
        PERFORM orch8.fail_step(v_tenant, v_instance, p_lease_token, v_path,
            p_attempt, p_effect_id,
            jsonb_build_object('error', v_reason,
                               'code', coalesce(p_error_code, 'output_schema'),
                               'output', p_output),
            v_reason);
    ELSE
        v_retry_in := p_retry_in;
        v_reason := p_error;
        IF p_result = 'error' AND p_effect_id IS NOT NULL
           -- Ambiguous: it may have been sent. Resend only as the step says; by default
           -- the receipt is settled first, whatever the runner proposed.
           AND orch8.step_ambiguity_mode(orch8.instance_step(v_tenant, v_instance, v_path))
               = 'settle'
        THEN
            v_retry_in := NULL;
        END IF;
        IF p_result = 'error' AND p_effect_id IS NOT NULL AND v_retry_in IS NULL THEN
            IF orch8.await_settlement(v_tenant, v_instance, p_lease_token,
                   v_path, p_attempt, p_effect_id, p_error) = 'waiting' THEN
                v_reason := format('%s; its verifier settles receipt %s', p_error, p_effect_id);
            END IF;
        ELSIF v_retry_in IS NULL THEN
            PERFORM orch8.fail_step(v_tenant, v_instance, p_lease_token, v_path,
                p_attempt, p_effect_id,
                jsonb_strip_nulls(jsonb_build_object('error', p_error, 'code', p_error_code)),
                p_error);
        ELSE
            PERFORM orch8.record_block_output(v_tenant, v_instance, v_path,
                p_attempt, '__retry__',
                jsonb_strip_nulls(jsonb_build_object('error', p_error, 'code', p_error_code)),
                true, p_effect_id, p_lease_token);
            IF p_node.cancel_requested THEN
                PERFORM orch8.end_node(p_inst, v_path, 'cancelled', NULL, NULL, NULL);
            ELSIF orch8.deadline_passed(p_node) THEN
                v_reason := orch8.fail_deadline(p_inst, p_node, p_attempt, p_effect_id,
                                                p_lease_token);
            ELSE
                UPDATE orch8.execution_nodes AS n
                SET state = 'ready',
                    -- a retry waits for its backoff, then for the step's send_window
                    next_fire_at = orch8.window_open_at(
                        orch8.instance_step(v_tenant, v_instance, v_path) -> 'send_window',
                        orch8.now() + v_retry_in),
                    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                    worker_task_id = NULL, updated_at = orch8.now()
                WHERE n.tenant_id = v_tenant AND n.instance_id = v_instance AND n.path = v_path;
            END IF;
        END IF;
    END IF;
    RETURN v_reason;
END
$$;

COMMENT ON FUNCTION orch8.record_step_result(
    orch8.task_instances, orch8.execution_nodes, integer, uuid, text, jsonb, text, interval,
    text, uuid, orch8.effect_outcome
) IS
'What a step''s result means, once (internal helper of finish_step and '
'complete_worker_task; the caller holds the instance''s lock and has checked who may '
'report): settle the receipt (ok and invalid_output: commit_effect; error: '
'mark_effect_unknown; not_applied: abandon_effect_not_applied), unless p_settled says it '
'was settled already (a worker''s report), then record the step as finish_step''s '
'comment says. Returns the reason the instance''s audit row gives, or NULL.';

CREATE OR REPLACE FUNCTION orch8.finish_step(
    p_tenant_id text,
    p_instance_id uuid,
    p_lease_token uuid,
    p_block_id text,
    p_attempt integer,
    p_effect_id uuid,
    p_result text,
    p_output jsonb,
    p_error text DEFAULT NULL,
    p_retry_in interval DEFAULT NULL,
    p_error_code text DEFAULT NULL
)
RETURNS SETOF orch8.tree_answer
LANGUAGE plpgsql
AS $$
DECLARE
    v_inst orch8.task_instances;
    v_node orch8.execution_nodes;
    v_settled orch8.effect_outcome;
    v_task orch8.worker_tasks;
    v_receipt orch8.effect_receipts;
    v_reason text;
    v_next orch8.execution_nodes;
BEGIN
    PERFORM orch8.require_step_result(p_result);
    IF p_retry_in < interval '0' THEN
        RAISE EXCEPTION 'finish_step retry_in must not be negative, got %', p_retry_in
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'retry_in')::text;
    END IF;
    IF p_result = 'skipped' AND p_effect_id IS NOT NULL THEN
        RAISE EXCEPTION 'a skipped step began no effect (effect %)', p_effect_id
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'effect_id')::text;
    END IF;
    -- Already finished by this very claim (the answer was lost with the connection)? Then
    -- answer again: the node the token holds now, if any.
    IF EXISTS (
        SELECT 1 FROM orch8.block_outputs AS o
         WHERE o.tenant_id = p_tenant_id AND o.instance_id = p_instance_id
           AND o.block_id = p_block_id AND o.attempt = p_attempt
           AND o.lease_token = p_lease_token
           AND o.sentinel IS DISTINCT FROM '__in_progress__'
    ) THEN
        PERFORM 1 FROM orch8.task_instances AS t
        WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id FOR UPDATE;
        RETURN QUERY SELECT * FROM orch8.node_answer(p_tenant_id, p_instance_id,
            orch8.leased_node(p_tenant_id, p_instance_id, p_lease_token),
            (SELECT n.parent_path FROM orch8.execution_nodes AS n
             WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id
               AND n.path = p_block_id), 'runner');
        RETURN;
    END IF;
    v_inst := orch8.lock_leased_instance(p_tenant_id, p_instance_id, p_lease_token);
    v_node := orch8.leased_node(p_tenant_id, p_instance_id, p_lease_token);
    PERFORM orch8.require_node(v_node, p_block_id, ARRAY['step', 'compensation'],
                               'finish_step');
    IF v_node.worker_task_id IS NOT NULL THEN
        -- A worker's failure or timeout, decided now by the runner's retry policy: its
        -- receipt was settled when it was reported (fail_worker_task, the sweep).
        SELECT * INTO v_task FROM orch8.worker_tasks AS w
        WHERE w.tenant_id = p_tenant_id AND w.id = v_node.worker_task_id;
        IF p_effect_id IS DISTINCT FROM v_task.effect_id
           OR p_result IS DISTINCT FROM v_task.result THEN
            RAISE EXCEPTION 'step % waits for the decision on worker task %: finish it with '
                            'effect % and result %', p_block_id, v_task.id, v_task.effect_id,
                            v_task.result
                USING ERRCODE = 'O8008',
                      DETAIL = json_build_object('field', 'result', 'task_id', v_task.id)::text;
        END IF;
        v_receipt := orch8.load_effect_receipt(p_tenant_id, p_effect_id);
        v_settled := CASE
            WHEN v_receipt.state = CASE p_result WHEN 'error' THEN 'unknown'
                                                 ELSE 'abandoned' END::orch8.effect_state
            THEN orch8.effect_outcome_of(v_receipt.state::text, v_receipt)
            ELSE orch8.effect_outcome_of('stale', v_receipt,
                     format('receipt is %s, not what worker task %s left it', v_receipt.state,
                            v_task.id))
        END;
        UPDATE orch8.execution_nodes AS n SET worker_task_id = NULL
        WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id
          AND n.path = p_block_id;
    END IF;
    v_reason := orch8.record_step_result(v_inst, v_node, p_attempt, p_effect_id, p_result,
        p_output, p_error, p_retry_in, p_error_code, p_lease_token, v_settled);
    v_inst := orch8.load_instance(p_tenant_id, p_instance_id);
    -- a step to be retried goes back to the claim, as it always did
    v_next := orch8.hand_over(v_inst, p_lease_token, v_node.lease_owner, v_node.lease_expires_at,
                              v_node.parent_path, p_block_id);
    RETURN QUERY SELECT * FROM orch8.node_answer(p_tenant_id, p_instance_id, v_next,
                                                 v_node.parent_path, 'runner', v_reason);
END
$$;

COMMENT ON FUNCTION orch8.finish_step(
    text, uuid, uuid, text, integer, uuid, text, jsonb, text, interval, text
) IS
'After a handler returns, in one transaction, fenced by the lease of the step''s node '
'(O8001): settle the receipt (ok: commit_effect; error: mark_effect_unknown; '
'not_applied: abandon_effect_not_applied; invalid_output: commit_effect, then the step '
'fails for its output_schema) and record the step (record_step_result): ok -> output row '
'(and the step''s unknown receipts under the same key settled: settle_same_key_receipts) '
'and the node completes, which moves the tree on (end_node); skipped (its when was '
'false; no effect) -> __skipped__ with p_output and the node is skipped; error with '
'p_retry_in -> __retry__ and the node ready again p_retry_in from now (or at the next '
'opening of its send_window: window_open_at); error without -> __error__ (with '
'p_error_code) and the node fails, unwinding to the nearest handler. An ambiguous '
'outcome (error with an effect) is retried only when step_ambiguity_mode is not settle '
'(p_retry_in is ignored otherwise); not retried, it goes to await_settlement (the node '
'waits or blocks). A receipt moved by someone else fails the step (EffectBlocked); a '
'receipt lost with a failed primary is recorded again as unknown. For a node deciding '
'on a worker task''s failure or timeout (worker_task_id; claim_work''s worker_result) '
'the receipt was settled by the report: p_effect_id and p_result must be the task''s '
'(else O8008), and the same rule decides. Then the next due ready node of the instance, '
'if any, is leased to the caller under the same token, and the answer is '
'node_answer''s: the instance state and that node. Repeating the call under the same '
'lease after a lost answer changes nothing and answers the same.';

-- Group commit: many runner calls in one transaction -----------------------------------------

CREATE OR REPLACE FUNCTION orch8.require_step_batch(p_calls jsonb, p_function text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $$
BEGIN
    IF jsonb_typeof(p_calls) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION '% takes a JSON array of calls, got %', p_function,
            coalesce(jsonb_typeof(p_calls), 'NULL')
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'calls')::text;
    END IF;
    IF jsonb_array_length(p_calls) > orch8.limit_of('step_batch') THEN
        RAISE EXCEPTION '% calls in one %, over the limit step_batch (%)',
            jsonb_array_length(p_calls), p_function, orch8.limit_of('step_batch')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'calls',
                                             'limit', orch8.limit_of('step_batch'))::text;
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.require_step_batch(jsonb, text) IS
'A batch of runner calls is a JSON array of at most the limit step_batch (else O8008): '
'each call is a subtransaction, and more than 64 of them per transaction would overflow '
'PostgreSQL''s per-backend cache of subtransaction ids.';

CREATE OR REPLACE FUNCTION orch8.begin_steps(p_calls jsonb)
RETURNS TABLE (
    ord integer,
    -- orch8.effect_outcome's fields, then the error a call raised instead
    outcome text, effect_id uuid, state orch8.effect_state, kind text, block_id text,
    attempt integer, invariant_id uuid, competing_effect_id uuid, detail text,
    idempotency_key text,
    error_state text, error_message text, error_detail text, error_hint text
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_call jsonb;
    v_n bigint;
    v_answer orch8.effect_outcome;
    v_state text;
    v_message text;
    v_detail text;
    v_hint text;
BEGIN
    PERFORM orch8.require_step_batch(p_calls, 'begin_steps');
    -- in (tenant, instance) order, as heartbeat_leases locks: no lock cycle between them
    FOR v_call, v_n IN
        SELECT c.value, c.n FROM jsonb_array_elements(p_calls) WITH ORDINALITY AS c (value, n)
        ORDER BY c.value ->> 'tenant_id', c.value ->> 'instance_id'
    LOOP
        v_state := NULL; v_message := NULL; v_detail := NULL; v_hint := NULL;
        BEGIN
            -- each call in a subtransaction: one refused (a lost lease) leaves the others
            v_answer := orch8.begin_step(
                v_call ->> 'tenant_id', (v_call ->> 'instance_id')::uuid,
                (v_call ->> 'lease_token')::uuid, v_call ->> 'block_id', v_call ->> 'handler',
                v_call -> 'params', (v_call ->> 'attempt')::integer,
                v_call ->> 'not_runnable');
        EXCEPTION WHEN OTHERS THEN
            v_answer := NULL;
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                                    v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
        END;
        RETURN QUERY SELECT (v_n - 1)::integer, (v_answer).*, v_state, v_message, v_detail,
                            v_hint;
    END LOOP;
END
$$;

COMMENT ON FUNCTION orch8.begin_steps(jsonb) IS
'Group commit of begin_step: each call of the JSON array p_calls ({tenant_id, '
'instance_id, lease_token, block_id, handler, params, attempt, not_runnable}) runs '
'begin_step in a subtransaction of its own, all in the caller''s one transaction, so the '
'batch costs one round trip and one commit. One row per call, in order (ord from 0): '
'begin_step''s outcome, or the error it raised (SQLSTATE, message, detail, hint; its '
'writes undone, the other calls'' kept). At most step_batch calls (require_step_batch). '
'The runner dispatches no handler before this commits, so every receipt is durable '
'before its dispatch.';

CREATE OR REPLACE FUNCTION orch8.finish_steps(p_calls jsonb)
RETURNS TABLE (
    ord integer,
    -- orch8.tree_answer's fields, then the error a call raised instead
    state orch8.instance_state, next_block text, next_attempt integer, next_block_id text,
    next_kind text, next_position integer, next_phase text, next_child_instance_id uuid,
    next_vars jsonb, progress jsonb, context_version integer,
    error_state text, error_message text, error_detail text, error_hint text
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_call jsonb;
    v_n bigint;
    v_answer orch8.tree_answer;
    v_state text;
    v_message text;
    v_detail text;
    v_hint text;
BEGIN
    PERFORM orch8.require_step_batch(p_calls, 'finish_steps');
    -- in (tenant, instance) order, as heartbeat_leases locks: no lock cycle between them
    FOR v_call, v_n IN
        SELECT c.value, c.n FROM jsonb_array_elements(p_calls) WITH ORDINALITY AS c (value, n)
        ORDER BY c.value ->> 'tenant_id', c.value ->> 'instance_id'
    LOOP
        v_state := NULL; v_message := NULL; v_detail := NULL; v_hint := NULL;
        BEGIN
            SELECT f.* INTO v_answer FROM orch8.finish_step(
                v_call ->> 'tenant_id', (v_call ->> 'instance_id')::uuid,
                (v_call ->> 'lease_token')::uuid, v_call ->> 'block_id',
                (v_call ->> 'attempt')::integer, (v_call ->> 'effect_id')::uuid,
                v_call ->> 'result', v_call -> 'output', v_call ->> 'error',
                ((v_call ->> 'retry_in_ms')::bigint) * interval '1 millisecond',
                v_call ->> 'error_code') AS f;
        EXCEPTION WHEN OTHERS THEN
            v_answer := NULL;
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                                    v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
        END;
        RETURN QUERY SELECT (v_n - 1)::integer, (v_answer).*, v_state, v_message, v_detail,
                            v_hint;
    END LOOP;
END
$$;

COMMENT ON FUNCTION orch8.finish_steps(jsonb) IS
'Group commit of finish_step: each call of the JSON array p_calls ({tenant_id, '
'instance_id, lease_token, block_id, attempt, effect_id, result, output, error, '
'retry_in_ms, error_code}) runs finish_step in a subtransaction of its own, all in one '
'transaction and one commit. One row per call, in order (ord from 0): finish_step''s '
'answer, or the error it raised (SQLSTATE, message, detail, hint; its writes undone, the '
'other calls'' kept). At most step_batch calls.';
