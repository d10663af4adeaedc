-- Repeatable: the runner's two calls around a step. A guarded step costs exactly these
-- two round trips (begin_step before the handler, finish_step after it) besides the
-- amortised claim. Both are fenced by the instance's lease token.

CREATE OR REPLACE FUNCTION orch8.apply_requested_state(
    p_tenant_id text, p_instance_id uuid, p_current orch8.instance_state
)
RETURNS orch8.instance_state
LANGUAGE plpgsql
AS $$
DECLARE
    v_requested orch8.instance_state;
BEGIN
    SELECT t.requested_state INTO v_requested FROM orch8.task_instances AS t
    WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id;
    IF v_requested IS NULL THEN
        RETURN p_current;
    END IF;
    PERFORM orch8.transition_instance(p_tenant_id, p_instance_id, p_current, v_requested,
                                      'operator', 'requested while running');
    RETURN v_requested;
END
$$;

COMMENT ON FUNCTION orch8.apply_requested_state(text, uuid, orch8.instance_state) IS
'At a step boundary: move a running instance to the paused or cancelled state an operator '
'requested meanwhile; returns the resulting state (p_current when nothing was requested).';

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
    UPDATE orch8.task_instances AS t SET current_block = p_block_id
    WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id;
    PERFORM orch8.transition_instance(p_tenant_id, p_instance_id, 'running', 'failed',
                                      'runner', p_reason);
END
$$;

COMMENT ON FUNCTION orch8.fail_step(text, uuid, uuid, text, integer, uuid, jsonb, text) IS
'A step failed for good (internal helper of begin_step and finish_step): append its '
'__error__ row (retryable false), keep the instance on that block, and fail the instance '
'with p_reason.';

-- What a step's definition says about its effect: read by begin_effect, finish_step and
-- the verifier, so no runner decides it.

CREATE OR REPLACE FUNCTION orch8.instance_step(
    p_tenant_id text, p_instance_id uuid, p_block_id text
)
RETURNS jsonb
LANGUAGE sql
STABLE
AS $$
    SELECT b.value
    FROM orch8.task_instances AS t
    JOIN orch8.sequences AS s ON s.tenant_id = t.tenant_id AND s.id = t.sequence_id
    CROSS JOIN LATERAL jsonb_array_elements(s.definition -> 'blocks') AS b (value)
    WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id AND b.value ->> 'id' = p_block_id
    LIMIT 1
$$;

COMMENT ON FUNCTION orch8.instance_step(text, uuid, text) IS
'The definition of block p_block_id in the sequence an instance runs, or NULL.';

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
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT format('the idempotency_key param is %s bytes, over the limit of %s',
                  octet_length(k.key), orch8.limit_of('idempotency_key_bytes'))
    FROM (SELECT orch8.step_idempotency_key_param(p_params) AS key) AS k
    WHERE octet_length(k.key) > orch8.limit_of('idempotency_key_bytes')
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
RETURNS orch8.instance_state
LANGUAGE plpgsql
AS $$
DECLARE
    v_state orch8.instance_state;
BEGIN
    PERFORM orch8.record_block_output(p_tenant_id, p_instance_id, p_block_id, p_attempt,
        '__unsettled__', jsonb_build_object('error', p_error, 'effect_id', p_effect_id),
        NULL, p_effect_id, p_lease_token);
    UPDATE orch8.task_instances AS t SET current_block = p_block_id
    WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id;
    -- scheduled only when the step declares a verifier and the receipt is unknown
    PERFORM orch8.schedule_verification(p_tenant_id, p_effect_id, 'engine');
    v_state := orch8.apply_requested_state(p_tenant_id, p_instance_id, 'running');
    IF v_state <> 'running' THEN
        RETURN v_state;  -- paused or cancelled meanwhile; a verifier still settles the receipt
    END IF;
    v_state := CASE WHEN EXISTS (
                        SELECT 1 FROM orch8.effect_verifications AS v
                        WHERE v.tenant_id = p_tenant_id AND v.effect_id = p_effect_id
                          AND v.state = 'pending')
                    THEN 'waiting'::orch8.instance_state
                    ELSE 'failed'::orch8.instance_state END;
    PERFORM orch8.transition_instance(p_tenant_id, p_instance_id, 'running', v_state,
        'runner', CASE WHEN v_state = 'waiting'
                       THEN format('%s; its verifier settles receipt %s', p_error, p_effect_id)
                       ELSE p_error END);
    RETURN v_state;
END
$$;

COMMENT ON FUNCTION orch8.await_settlement(text, uuid, uuid, text, integer, uuid, text) IS
'A step whose outcome is ambiguous and is not resent (internal helper of begin_step and '
'finish_step): append __unsettled__ (compute_attempt keeps the attempt, so running the '
'block again lands on the same receipt and cannot send), keep the instance on the block, '
'schedule the step''s verifier, and move the instance to waiting (a verifier is pending) '
'or failed (for an operator), or to the pause or cancel requested meanwhile.';

CREATE OR REPLACE FUNCTION orch8.begin_step(
    p_tenant_id text,
    p_instance_id uuid,
    p_lease_token uuid,
    p_block_id text,
    p_handler text,
    p_params jsonb,
    p_attempt integer
)
RETURNS orch8.effect_outcome
LANGUAGE plpgsql
AS $$
DECLARE
    v_out orch8.effect_outcome;
    v_last orch8.block_outputs;
    v_inst orch8.task_instances;
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
    IF v_inst.requested_state IS NOT NULL THEN  -- paused or cancelled by an operator
        PERFORM orch8.transition_instance(p_tenant_id, p_instance_id, 'running',
            v_inst.requested_state, 'operator', 'requested while running');
        RETURN ROW('stopped', NULL, NULL, NULL, p_block_id, p_attempt, NULL, NULL,
                   v_inst.requested_state::text, NULL)::orch8.effect_outcome;
    END IF;
    IF orch8.step_idempotency_key_problem(p_params) IS NOT NULL THEN
        -- refused before any receipt (begin_effect would raise, and lose this record)
        PERFORM orch8.fail_step(p_tenant_id, p_instance_id, p_lease_token, p_block_id,
            p_attempt, NULL, jsonb_build_object('error', 'idempotency_key too long'),
            'InvalidInput: ' || orch8.step_idempotency_key_problem(p_params));
        RETURN ROW('stopped', NULL, NULL, NULL, p_block_id, p_attempt, NULL, NULL,
                   'failed', NULL)::orch8.effect_outcome;
    END IF;
    v_out := orch8.begin_effect(p_tenant_id, p_instance_id, p_block_id, p_handler, p_params,
                                p_attempt);
    IF v_out.outcome IS NULL THEN
        RETURN v_out;  -- pure handler: nothing to record before it runs
    END IF;
    IF v_out.outcome = 'dispatched' THEN
        PERFORM orch8.record_block_output(p_tenant_id, p_instance_id, p_block_id, p_attempt,
            '__in_progress__', NULL, NULL, v_out.effect_id, p_lease_token);
        RETURN v_out;
    END IF;
    IF v_out.outcome = 'blocked' AND v_out.state = 'unknown' THEN
        -- an earlier run of this attempt may have sent it: settle that receipt first
        PERFORM orch8.await_settlement(p_tenant_id, p_instance_id, p_lease_token, p_block_id,
            p_attempt, v_out.effect_id, 'EffectBlocked: ' || v_out.detail);
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
    RETURN v_out;
END
$$;

COMMENT ON FUNCTION orch8.begin_step(text, uuid, uuid, text, text, jsonb, integer) IS
'Before a handler runs, in one call: check the lease (O8001), begin_effect, and on '
'dispatched append the __in_progress__ sentinel with the effect id. Blocked on an unknown '
'receipt (an earlier run of this attempt may have sent): await_settlement (__unsettled__, '
'the verifier or an operator). Otherwise blocked, stale or duplicate: append __error__ '
'(retryable false) and fail the instance in the same transaction; the outcome is '
'returned (never raised) so those writes persist. An idempotency_key param over '
'idempotency_key_bytes fails the step before any receipt (outcome stopped, detail '
'failed). A pure '
'handler returns a NULL outcome and writes nothing. An operator''s pending pause or '
'cancel is applied first (outcome stopped, detail the new state). Repeating the call '
'under the same lease after a lost answer returns the same dispatched outcome.';

CREATE OR REPLACE FUNCTION orch8.require_step_result(p_result text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $$
BEGIN
    IF p_result IS NULL OR p_result NOT IN ('ok', 'error', 'not_applied') THEN
        RAISE EXCEPTION 'a step result must be ok, error or not_applied, got %',
            coalesce(p_result, 'NULL')
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'result')::text;
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.require_step_result(text) IS
'The results a handler call can come to (ok, error, not_applied); anything else is O8008. '
'Read by finish_step and keep_lost_receipt.';

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
    IF p_effect_id IS DISTINCT FROM orch8.deterministic_effect_id(
           v_scope.continuity_id, v_scope.epoch, p_instance_id, p_block_id, p_attempt) THEN
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
    p_retry_in interval DEFAULT NULL
)
RETURNS TABLE (state orch8.instance_state, next_block text, next_attempt integer)
LANGUAGE plpgsql
AS $$
DECLARE
    v_inst orch8.task_instances;
    v_settled orch8.effect_outcome;
    v_next text;
    v_state orch8.instance_state;
    v_retry_in interval;
BEGIN
    PERFORM orch8.require_step_result(p_result);
    IF p_retry_in < interval '0' THEN
        RAISE EXCEPTION 'finish_step retry_in must not be negative, got %', p_retry_in
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'retry_in')::text;
    END IF;
    -- Already finished by this very claim (the answer was lost with the connection)?
    IF EXISTS (
        SELECT 1 FROM orch8.block_outputs AS o
         WHERE o.tenant_id = p_tenant_id AND o.instance_id = p_instance_id
           AND o.block_id = p_block_id AND o.attempt = p_attempt
           AND o.lease_token = p_lease_token
           AND o.sentinel IS DISTINCT FROM '__in_progress__'
    ) THEN
        SELECT t.state, t.current_block INTO v_state, v_next FROM orch8.task_instances AS t
         WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id;
        RETURN QUERY SELECT v_state,
            CASE WHEN v_state = 'running' THEN v_next END,
            CASE WHEN v_state = 'running'
                 THEN orch8.compute_attempt(p_tenant_id, p_instance_id, v_next) END;
        RETURN;
    END IF;
    v_inst := orch8.lock_leased_instance(p_tenant_id, p_instance_id, p_lease_token);

    IF p_effect_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM orch8.effect_receipts AS r
         WHERE r.tenant_id = p_tenant_id AND r.id = p_effect_id) THEN
        -- The receipt written before dispatch is gone, yet the handler ran: record it
        -- unknown with what the handler answered, and wait for it to be settled.
        PERFORM orch8.recover_lost_receipt(p_tenant_id, p_instance_id, p_block_id, p_attempt,
                                           p_effect_id, p_result, p_output, p_error);
        v_state := orch8.await_settlement(p_tenant_id, p_instance_id, p_lease_token,
            p_block_id, p_attempt, p_effect_id,
            format('EffectBlocked: receipt %s was lost with the primary; recovered as unknown',
                   p_effect_id));
        RETURN QUERY SELECT v_state, NULL::text, NULL::integer;
        RETURN;
    END IF;
    IF p_effect_id IS NOT NULL THEN
        PERFORM orch8.require_own_receipt(p_tenant_id, p_effect_id, p_instance_id, p_block_id,
                                          p_attempt);
        v_settled := CASE p_result
            WHEN 'ok' THEN orch8.commit_effect(p_tenant_id, p_effect_id, p_output)
            WHEN 'error' THEN orch8.mark_effect_unknown(p_tenant_id, p_effect_id, p_error)
            ELSE orch8.abandon_effect_not_applied(
                p_tenant_id, p_effect_id,
                coalesce(nullif(p_output, '{}'::jsonb),
                         jsonb_build_object('error', coalesce(p_error, 'not applied'))))
        END;
        IF v_settled.outcome = 'stale' THEN
            -- someone moved our receipt (an operator, a runner that took over): stop.
            PERFORM orch8.fail_step(
                p_tenant_id, p_instance_id, p_lease_token, p_block_id, p_attempt, p_effect_id,
                jsonb_build_object('outcome', 'stale', 'effect_state', v_settled.state,
                                   'detail', v_settled.detail),
                format('EffectBlocked: %s', v_settled.detail));
            RETURN QUERY SELECT 'failed'::orch8.instance_state, NULL::text, NULL::integer;
            RETURN;
        END IF;
    END IF;

    IF p_result = 'ok' THEN
        PERFORM orch8.record_block_output(p_tenant_id, p_instance_id, p_block_id, p_attempt,
            NULL, coalesce(p_output, 'null'), NULL, p_effect_id, p_lease_token);
        IF p_effect_id IS NOT NULL AND p_attempt > 0 THEN  -- attempt 0 has no earlier one
            PERFORM orch8.settle_same_key_receipts(p_tenant_id, p_effect_id, 'engine');
        END IF;
        v_next := orch8.next_block_id(p_tenant_id, v_inst.sequence_id, p_block_id);
        IF v_next IS NULL THEN
            PERFORM orch8.transition_instance(p_tenant_id, p_instance_id, 'running',
                                              'completed', 'runner');
            RETURN QUERY SELECT 'completed'::orch8.instance_state, NULL::text, NULL::integer;
            RETURN;
        END IF;
        UPDATE orch8.task_instances AS t
        SET current_block = v_next, updated_at = orch8.now()
        WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id;
        v_state := orch8.apply_requested_state(p_tenant_id, p_instance_id, 'running');
        RETURN QUERY SELECT v_state,
            CASE WHEN v_state = 'running' THEN v_next END,
            CASE WHEN v_state = 'running'
                 THEN orch8.compute_attempt(p_tenant_id, p_instance_id, v_next) END;
        RETURN;
    END IF;

    v_retry_in := p_retry_in;
    IF p_result = 'error' AND p_effect_id IS NOT NULL THEN
        -- Ambiguous: it may have been sent. Resend only as the step says; by default the
        -- receipt is settled first, whatever the runner proposed.
        IF orch8.step_ambiguity_mode(
               orch8.instance_step(p_tenant_id, p_instance_id, p_block_id)) = 'settle' THEN
            v_retry_in := NULL;
        END IF;
        IF v_retry_in IS NULL THEN
            v_state := orch8.await_settlement(p_tenant_id, p_instance_id, p_lease_token,
                p_block_id, p_attempt, p_effect_id, p_error);
            RETURN QUERY SELECT v_state, NULL::text, NULL::integer;
            RETURN;
        END IF;
    END IF;
    IF v_retry_in IS NULL THEN
        PERFORM orch8.fail_step(p_tenant_id, p_instance_id, p_lease_token, p_block_id,
            p_attempt, p_effect_id, jsonb_build_object('error', p_error), p_error);
        RETURN QUERY SELECT 'failed'::orch8.instance_state, NULL::text, NULL::integer;
        RETURN;
    END IF;
    PERFORM orch8.record_block_output(p_tenant_id, p_instance_id, p_block_id, p_attempt,
        '__retry__', jsonb_build_object('error', p_error), true, p_effect_id, p_lease_token);
    v_state := orch8.apply_requested_state(p_tenant_id, p_instance_id, 'running');
    IF v_state = 'running' THEN
        PERFORM orch8.transition_instance(p_tenant_id, p_instance_id, 'running', 'scheduled',
                                          'runner', p_error, orch8.now() + v_retry_in);
        v_state := 'scheduled';
    END IF;
    RETURN QUERY SELECT v_state, NULL::text, NULL::integer;
END
$$;

COMMENT ON FUNCTION orch8.finish_step(
    text, uuid, uuid, text, integer, uuid, text, jsonb, text, interval
) IS
'After a handler returns, in one transaction, fenced by the lease (O8001): settle the '
'receipt (ok: commit_effect; error: mark_effect_unknown; not_applied: '
'abandon_effect_not_applied) and record the step: ok -> output row (and the step''s '
'unknown receipts under the same key settled: settle_same_key_receipts), then the next '
'block of the sequence (next_block_id; the instance stays running, or takes a pause or '
'cancel requested meanwhile) or completed; error with p_retry_in -> __retry__ and '
'scheduled p_retry_in from now; error without -> __error__ and failed. An ambiguous '
'outcome (error with an effect) is retried only when step_ambiguity_mode is not settle '
'(p_retry_in is ignored otherwise); not retried, it goes to await_settlement. A receipt '
'moved by someone '
'else fails the instance (EffectBlocked). Returns the instance state and, while it is '
'running, the block to run next with its attempt (compute_attempt). Repeating the call '
'under the same lease after a lost answer changes nothing and returns the same.';
