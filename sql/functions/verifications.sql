-- Repeatable: verifiers. An unknown receipt whose step declares `verify` gets a row in
-- orch8.effect_verifications; a runner's verifier loop claims due rows (SKIP LOCKED plus a
-- lease, a try counted at claim), calls the provider, and records the verdict here. The
-- verdict settles the receipt through record_resolution and the instance through
-- continue_settled_step, as the step says.

CREATE OR REPLACE FUNCTION orch8.step_verification_method(p_step jsonb)
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT m.method
    FROM unnest(orch8.verification_methods()) WITH ORDINALITY AS m (method, n)
    WHERE jsonb_typeof(p_step -> 'verify') = 'object' AND (p_step -> 'verify') ? m.method
    ORDER BY m.n
    LIMIT 1
$$;

COMMENT ON FUNCTION orch8.step_verification_method(jsonb) IS
'How a step''s verify settles an unknown receipt: the one of verification_methods() it '
'names (http, replay, handler), or NULL when the step declares no verifier.';

CREATE OR REPLACE FUNCTION orch8.verification_try_seconds(p_step jsonb)
RETURNS numeric
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT least(coalesce(orch8.sequence_json_number(p_step -> 'timeout') / 1000.0, 30), 300)
$$;

COMMENT ON FUNCTION orch8.verification_try_seconds(jsonb) IS
'How long one verifier try may take: the step''s timeout (ms), else 30 s, at most 300 s. '
'A try''s lease lasts this long plus the claimer''s margin, so it never outlives its lease.';

CREATE OR REPLACE FUNCTION orch8.schedule_verification(
    p_tenant_id text, p_effect_id uuid, p_actor text
)
RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_receipt orch8.effect_receipts := orch8.load_effect_receipt(p_tenant_id, p_effect_id);
    v_step jsonb;
    v_method text;
    v_schedule integer [];
    v_existing orch8.effect_verifications;
BEGIN
    IF v_receipt.id IS NULL THEN
        RETURN 'not_found';
    END IF;
    IF v_receipt.state <> 'unknown' THEN
        RETURN 'not_unknown';
    END IF;
    v_step := orch8.instance_step(p_tenant_id, v_receipt.instance_id, v_receipt.block_id);
    v_method := orch8.step_verification_method(v_step);
    IF v_method IS NULL THEN
        RETURN 'no_verifier';
    END IF;
    SELECT coalesce(array_agg(d.value::numeric::integer ORDER BY d.n),
                    orch8.default_verify_schedule())
    INTO v_schedule
    FROM jsonb_array_elements_text(
        CASE WHEN jsonb_typeof(v_step -> 'verify' -> 'schedule') = 'array'
             THEN v_step -> 'verify' -> 'schedule' END) WITH ORDINALITY AS d (value, n);
    IF cardinality(v_schedule) = 0 THEN
        v_schedule := orch8.default_verify_schedule();
    END IF;

    SELECT * INTO v_existing FROM orch8.effect_verifications AS v
    WHERE v.tenant_id = p_tenant_id AND v.effect_id = p_effect_id
    FOR UPDATE;
    IF v_existing.state = 'pending' THEN
        RETURN 'already_scheduled';
    END IF;
    IF v_existing.effect_id IS NOT NULL THEN
        -- escalated (or settled and back to unknown: never, but harmless): try again afresh
        UPDATE orch8.effect_verifications AS v
        SET state = 'pending', tries = 0, schedule = v_schedule,
            next_at = orch8.now() + make_interval(secs => v_schedule[1] / 1000.0),
            lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
            requested_by = p_actor, updated_at = orch8.now()
        WHERE v.tenant_id = p_tenant_id AND v.effect_id = p_effect_id;
        PERFORM orch8.append_receipt_event(p_tenant_id, p_effect_id, p_actor,
            'verification scheduled again', jsonb_build_object('method', v_method,
                                                               'schedule_ms', v_schedule));
        RETURN 'rescheduled';
    END IF;
    INSERT INTO orch8.effect_verifications (
        tenant_id, effect_id, method, handler, schedule, next_at, requested_by
    ) VALUES (
        p_tenant_id, p_effect_id, v_method, v_receipt.handler, v_schedule,
        orch8.now() + make_interval(secs => v_schedule[1] / 1000.0), p_actor
    );
    PERFORM orch8.append_receipt_event(p_tenant_id, p_effect_id, p_actor,
        'verification scheduled', jsonb_build_object('method', v_method,
                                                     'schedule_ms', v_schedule));
    RETURN 'scheduled';
END
$$;

COMMENT ON FUNCTION orch8.schedule_verification(text, uuid, text) IS
'Ask the step''s verifier to settle an unknown receipt: scheduled (first try after '
'schedule[1] ms), rescheduled (an escalated one starts over with its tries reset), '
'already_scheduled, no_verifier (the step declares no verify), not_unknown or not_found. '
'An event on the receipt records who asked.';

CREATE OR REPLACE FUNCTION orch8.request_verifications(
    p_tenant_id text, p_effect_ids uuid[], p_superseded boolean, p_actor text
)
RETURNS TABLE (effect_id uuid, outcome text)
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);  -- the web role acts in its sealed tenant
    IF (p_effect_ids IS NULL) = (NOT coalesce(p_superseded, false)) THEN
        RAISE EXCEPTION 'name the receipts to verify, or ask for every superseded one'
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'effect_ids')::text;
    END IF;
    IF cardinality(p_effect_ids) > orch8.limit_of('verify_request_receipts') THEN
        RAISE EXCEPTION 'at most % receipts per request, got %',
            orch8.limit_of('verify_request_receipts'), cardinality(p_effect_ids)
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object(
                      'field', 'effect_ids',
                      'limit', orch8.limit_of('verify_request_receipts'))::text;
    END IF;
    RETURN QUERY
    SELECT i.id, orch8.schedule_verification(p_tenant_id, i.id, p_actor)
    FROM (
        SELECT DISTINCT e.id FROM unnest(p_effect_ids) AS e (id)
        UNION
        SELECT u.effect_id FROM orch8.unresolved_effects AS u
        WHERE p_superseded AND u.tenant_id = p_tenant_id AND u.state = 'unknown'
          AND NOT u.blocking
    ) AS i (id)
    ORDER BY i.id;
END
$$;

COMMENT ON FUNCTION orch8.request_verifications(text, uuid[], boolean, text) IS
'Schedule verifiers in bulk: the receipts named (at most verify_request_receipts), or with '
'p_superseded every '
'unknown receipt of the tenant that blocks nothing (unresolved_effects.blocking false). '
'One row per receipt with schedule_verification''s outcome. Neither or both: O8008.';

CREATE OR REPLACE FUNCTION orch8.claim_verifications(
    p_worker_id text,
    p_batch integer,
    p_lease interval,
    p_handlers text[],
    p_verifiers text[]
)
RETURNS TABLE (
    tenant_id text,
    effect_id uuid,
    lease_token uuid,
    method text,
    try integer,
    tries integer,
    timeout_seconds numeric,
    receipt jsonb,
    step jsonb,
    context jsonb,
    progress jsonb,
    vars jsonb
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_spent record;
BEGIN
    IF p_worker_id IS NULL OR p_worker_id = '' OR p_batch IS NULL OR p_batch < 1
       OR p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION 'claim_verifications needs a worker id, a batch >= 1 and a positive lease'
            USING ERRCODE = 'O8008';
    END IF;
    -- A verifier that died holding its last try: that try is spent, so escalate.
    FOR v_spent IN
        SELECT v.tenant_id, v.effect_id FROM orch8.effect_verifications AS v
        WHERE v.state = 'pending' AND v.next_at <= orch8.now()
          AND v.tries >= cardinality(v.schedule)
        LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    LOOP
        PERFORM orch8.escalate_verification(v_spent.tenant_id, v_spent.effect_id, NULL,
            jsonb_build_object('reason', 'the verifier holding the last try stopped answering'));
    END LOOP;
    RETURN QUERY
    WITH due AS (
        SELECT v.tenant_id, v.effect_id
        FROM orch8.effect_verifications AS v
        WHERE v.state = 'pending' AND v.next_at <= orch8.now()
          AND v.tries < cardinality(v.schedule)
          AND (v.method = 'http'
               OR (v.method = 'replay' AND v.handler = ANY (p_handlers))
               OR (v.method = 'handler' AND v.handler = ANY (p_verifiers)))
          -- a receipt dispatched to external workers: its replay or verifier is theirs
          -- (claim_worker_verifications), whatever this runner has of the same name
          AND (v.method = 'http' OR NOT EXISTS (
              SELECT 1 FROM orch8.worker_tasks AS w
              WHERE w.tenant_id = v.tenant_id AND w.effect_id = v.effect_id))
        ORDER BY v.next_at
        LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    ),
    claimed AS (
        -- the try counts now: a verifier that crashes mid-call has used it. The lease
        -- outlasts the longest the try may take.
        UPDATE orch8.effect_verifications AS v
        SET tries = v.tries + 1, lease_owner = p_worker_id, lease_token = gen_random_uuid(),
            lease_expires_at = orch8.now() + p_lease + make_interval(
                secs => orch8.verification_try_seconds(s.step)),
            next_at = orch8.now() + p_lease + make_interval(
                secs => orch8.verification_try_seconds(s.step)),
            updated_at = orch8.now()
        FROM due AS d
        JOIN orch8.effect_receipts AS r ON r.tenant_id = d.tenant_id AND r.id = d.effect_id
        CROSS JOIN LATERAL (
            SELECT orch8.instance_step(r.tenant_id, r.instance_id, r.block_id) AS step
        ) AS s
        WHERE v.tenant_id = d.tenant_id AND v.effect_id = d.effect_id
        RETURNING v.*, s.step
    )
    SELECT c.tenant_id, c.effect_id, c.lease_token, c.method, c.tries,
           cardinality(c.schedule), orch8.verification_try_seconds(c.step), to_jsonb(r),
           c.step, t.context::jsonb, orch8.instance_progress(t.tenant_id, t.id),
           orch8.node_vars(t.tenant_id, t.id, r.block_id)
    FROM claimed AS c
    JOIN orch8.effect_receipts AS r ON r.tenant_id = c.tenant_id AND r.id = c.effect_id
    JOIN orch8.task_instances AS t ON t.tenant_id = r.tenant_id AND t.id = r.instance_id;
END
$$;

COMMENT ON FUNCTION orch8.claim_verifications(text, integer, interval, text[], text[]) IS
'The verifier loop''s claim, one round trip: up to p_batch due pending verifications '
'(FOR UPDATE SKIP LOCKED, oldest next_at first) that this runner can run (http always; '
'replay when it has the step''s handler, p_handlers; handler when it has the handler''s '
'verifier, p_verifiers; replay and handler never for a receipt dispatched to external '
'workers: claim_worker_verifications), each with a fresh lease token lasting p_lease plus '
'the try''s '
'timeout (verification_try_seconds, returned as timeout_seconds), the try counted (a '
'crash uses it up), and what rendering needs: the receipt, the step definition, the '
'instance context and progress, and the variables in scope at the step''s node (vars). '
'Rows whose last try''s holder vanished are escalated first.';

CREATE OR REPLACE FUNCTION orch8.verification_request_matches(
    p_tenant_id text, p_effect_id uuid, p_params jsonb
)
RETURNS boolean
LANGUAGE sql
STABLE
AS $$
    SELECT r.request_sha256 = orch8.request_sha256(r.handler, p_params)
    FROM orch8.effect_receipts AS r
    WHERE r.tenant_id = p_tenant_id AND r.id = p_effect_id
$$;

COMMENT ON FUNCTION orch8.verification_request_matches(text, uuid, jsonb) IS
'Whether params re-rendered for a verifier hash to the receipt''s request_sha256: the '
'request a replay would send, or a lookup would describe, is the one that was sent.';

CREATE OR REPLACE FUNCTION orch8.escalate_verification(
    p_tenant_id text, p_effect_id uuid, p_actor text, p_evidence jsonb
)
RETURNS orch8.instance_state
LANGUAGE plpgsql
AS $$
DECLARE
    v_receipt orch8.effect_receipts := orch8.load_effect_receipt(p_tenant_id, p_effect_id);
    v_inst orch8.task_instances;
    v_last orch8.block_outputs;
BEGIN
    UPDATE orch8.effect_verifications AS v
    SET state = 'escalated', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        last_result = p_evidence, updated_at = orch8.now()
    WHERE v.tenant_id = p_tenant_id AND v.effect_id = p_effect_id;
    PERFORM orch8.append_receipt_event(p_tenant_id, p_effect_id,
        coalesce(p_actor, 'verifier'), 'escalated: every try was inconclusive; settle it by hand',
        p_evidence);
    SELECT * INTO v_inst FROM orch8.task_instances AS t
    WHERE t.tenant_id = p_tenant_id AND t.id = v_receipt.instance_id
    FOR UPDATE;
    v_last := orch8.latest_block_row(p_tenant_id, v_inst.id, v_receipt.block_id);
    IF v_last.sentinel = '__unsettled__' AND v_last.effect_id = p_effect_id THEN
        -- the node waiting on it blocks its branch, for a person
        UPDATE orch8.execution_nodes AS n
        SET state = 'blocked', updated_at = orch8.now(),
            error = format('receipt %s is still unknown after its verifier''s last try: '
                           'settle it by hand (orch8 effects resolve), then retry', p_effect_id)
        WHERE n.tenant_id = p_tenant_id AND n.instance_id = v_inst.id
          AND n.path = v_receipt.block_id AND n.state = 'waiting';
        RETURN orch8.sync_instance(p_tenant_id, v_inst.id, coalesce(p_actor, 'verifier'),
            format('receipt %s is still unknown after its verifier''s last try: settle it '
                   'by hand (orch8 effects resolve), then retry', p_effect_id));
    END IF;
    RETURN v_inst.state;
END
$$;

COMMENT ON FUNCTION orch8.escalate_verification(text, uuid, text, jsonb) IS
'Give a receipt up to people (internal helper): its verification becomes escalated, an '
'event says so, and the node waiting on it blocks, naming the receipt (the receipt stays '
'unknown; the instance fails when nothing else can run). Returns the instance''s state.';

CREATE OR REPLACE FUNCTION orch8.latest_block_row(
    p_tenant_id text, p_instance_id uuid, p_block_id text
)
RETURNS orch8.block_outputs
LANGUAGE sql
STABLE
AS $$
    SELECT o.* FROM orch8.block_outputs AS o
    WHERE o.tenant_id = p_tenant_id AND o.instance_id = p_instance_id
      AND o.block_id = p_block_id
    ORDER BY o.seq DESC
    LIMIT 1
$$;

COMMENT ON FUNCTION orch8.latest_block_row(text, uuid, text) IS
'The latest block_outputs row of one block of an instance (what compute_attempt reads).';

CREATE OR REPLACE FUNCTION orch8.record_verification(
    p_tenant_id text,
    p_effect_id uuid,
    p_lease_token uuid,
    p_verdict text,
    p_evidence jsonb,
    p_provider_receipt_id text DEFAULT NULL,
    p_output jsonb DEFAULT NULL
)
RETURNS TABLE (outcome text, instance_state orch8.instance_state, detail text)
LANGUAGE plpgsql
AS $$
DECLARE
    v_ver orch8.effect_verifications;
    v_receipt orch8.effect_receipts;
    v_inst orch8.task_instances;
    v_last orch8.block_outputs;
    v_step jsonb;
    v_actor text;
    v_evidence jsonb := coalesce(p_evidence, '{}');
    v_next record;
    v_reason text;
    v_node_state orch8.node_state;
BEGIN
    IF p_verdict IS NULL OR p_verdict NOT IN ('applied', 'not_applied', 'inconclusive') THEN
        RAISE EXCEPTION 'a verdict is applied, not_applied or inconclusive, got %',
            coalesce(p_verdict, 'NULL')
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'verdict')::text;
    END IF;
    IF jsonb_typeof(v_evidence) <> 'object' THEN
        RAISE EXCEPTION 'verification evidence must be a JSON object'
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'evidence')::text;
    END IF;
    SELECT * INTO v_ver FROM orch8.effect_verifications AS v
    WHERE v.tenant_id = p_tenant_id AND v.effect_id = p_effect_id
    FOR UPDATE;
    IF v_ver.state IS DISTINCT FROM 'pending'
       OR v_ver.lease_token IS DISTINCT FROM p_lease_token THEN
        -- another runner took the try over, or someone settled it: ours is history
        RETURN QUERY SELECT 'stale'::text, NULL::orch8.instance_state,
            format('verification of %s is %s and no longer held by this try', p_effect_id,
                   coalesce(v_ver.state, 'gone'));
        RETURN;
    END IF;
    v_actor := 'verifier:' || v_ver.method;
    v_evidence := v_evidence || jsonb_build_object('try', v_ver.tries, 'tries',
                                                   cardinality(v_ver.schedule),
                                                   'worker', v_ver.lease_owner);
    v_receipt := orch8.load_effect_receipt(p_tenant_id, p_effect_id);
    IF v_receipt.state <> 'unknown' THEN
        UPDATE orch8.effect_verifications AS v
        SET state = 'settled', lease_owner = NULL, lease_token = NULL,
            lease_expires_at = NULL, updated_at = orch8.now()
        WHERE v.tenant_id = p_tenant_id AND v.effect_id = p_effect_id;
        RETURN QUERY SELECT 'stale'::text, NULL::orch8.instance_state,
            format('receipt %s is already %s', p_effect_id, v_receipt.state);
        RETURN;
    END IF;

    IF p_verdict = 'inconclusive' THEN
        UPDATE orch8.effect_verifications AS v
        SET last_result = v_evidence, lease_owner = NULL, lease_token = NULL,
            lease_expires_at = NULL, updated_at = orch8.now(),
            next_at = orch8.now() + make_interval(
                secs => coalesce(v.schedule[v.tries + 1], 0) / 1000.0)
        WHERE v.tenant_id = p_tenant_id AND v.effect_id = p_effect_id;
        PERFORM orch8.append_receipt_event(p_tenant_id, p_effect_id, v_actor,
            format('inconclusive (try %s of %s)', v_ver.tries, cardinality(v_ver.schedule)),
            v_evidence);
        IF v_ver.tries >= cardinality(v_ver.schedule) THEN
            RETURN QUERY SELECT 'escalated'::text,
                orch8.escalate_verification(p_tenant_id, p_effect_id, v_actor, v_evidence),
                format('receipt %s stays unknown after %s inconclusive tries', p_effect_id,
                       v_ver.tries);
            RETURN;
        END IF;
        RETURN QUERY SELECT 'inconclusive'::text, NULL::orch8.instance_state,
            format('try %s of %s inconclusive; the next in %s ms', v_ver.tries,
                   cardinality(v_ver.schedule), v_ver.schedule[v_ver.tries + 1]);
        RETURN;
    END IF;

    p_provider_receipt_id := coalesce(p_provider_receipt_id,
                                      orch8.provider_receipt_id(p_output));
    IF octet_length(p_provider_receipt_id) > orch8.limit_of('provider_receipt_id_bytes') THEN
        v_evidence := v_evidence || jsonb_build_object('provider_receipt_id_dropped',
            'longer than ' || orch8.limit_of('provider_receipt_id_bytes') || ' bytes');
        p_provider_receipt_id := NULL;
    END IF;
    IF NOT orch8.record_resolution(p_tenant_id, v_receipt,
        CASE p_verdict WHEN 'applied' THEN 'verified' ELSE 'abandoned' END::orch8.effect_state,
        p_provider_receipt_id, v_evidence, v_actor,
        CASE p_verdict WHEN 'applied' THEN 'the verifier found it applied'
                       ELSE 'the verifier found it not applied' END,
        CASE WHEN p_verdict = 'applied' THEN p_output END)
    THEN
        RETURN QUERY SELECT 'stale'::text, NULL::orch8.instance_state,
            format('receipt %s moved while its verifier answered', p_effect_id);
        RETURN;
    END IF;
    v_receipt := orch8.load_effect_receipt(p_tenant_id, p_effect_id);

    -- Does a node wait on this receipt? Then it goes on as the step says.
    SELECT * INTO v_inst FROM orch8.task_instances AS t
    WHERE t.tenant_id = p_tenant_id AND t.id = v_receipt.instance_id
    FOR UPDATE;
    v_last := orch8.latest_block_row(p_tenant_id, v_inst.id, v_receipt.block_id);
    SELECT n.state INTO v_node_state FROM orch8.execution_nodes AS n
    WHERE n.tenant_id = p_tenant_id AND n.instance_id = v_inst.id
      AND n.path = v_receipt.block_id;
    IF v_inst.state IN ('completed', 'cancelled')
       OR v_node_state IS NULL OR v_node_state NOT IN ('waiting', 'blocked')
       OR v_last.sentinel IS DISTINCT FROM '__unsettled__'
       OR v_last.effect_id IS DISTINCT FROM p_effect_id THEN
        RETURN QUERY SELECT v_receipt.state::text, v_inst.state,
            format('receipt %s is %s; its instance does not wait on it', p_effect_id,
                   v_receipt.state);
        RETURN;
    END IF;
    v_step := orch8.instance_step(p_tenant_id, v_inst.id, v_receipt.block_id);
    IF p_verdict = 'applied' AND coalesce(v_step -> 'verify' ->> 'on_verified', 'continue') = 'stop'
    THEN
        v_reason := 'on_verified is stop';
    ELSIF p_verdict = 'not_applied'
          AND coalesce(v_step -> 'verify' ->> 'on_not_applied', 'retry') = 'stop' THEN
        v_reason := 'on_not_applied is stop';
    ELSIF p_verdict = 'not_applied' AND v_last.attempt + 1 >= coalesce(
        orch8.sequence_json_integer(v_step -> 'retry' -> 'max_attempts'),
        orch8.retry_default('max_attempts'))
    THEN
        v_reason := format('no attempt left (retry.max_attempts %s)', coalesce(
            orch8.sequence_json_integer(v_step -> 'retry' -> 'max_attempts'),
            orch8.retry_default('max_attempts')));
    ELSE
        SELECT * INTO v_next
        FROM orch8.continue_settled_step(v_inst, v_last, v_receipt, NULL, v_actor, 'verifier');
        IF v_next.outcome <> 'needs_output' THEN
            RETURN QUERY SELECT v_receipt.state::text,
                (SELECT t.state FROM orch8.task_instances AS t
                 WHERE t.tenant_id = p_tenant_id AND t.id = v_inst.id),
                v_next.detail;
            RETURN;
        END IF;
        v_reason := v_next.detail;
    END IF;
    -- the step stops here: its node blocks, for a person
    UPDATE orch8.execution_nodes AS n
    SET state = 'blocked', updated_at = orch8.now(),
        error = format('receipt %s is %s by its verifier, and the step stops: %s; retry it '
                       'by hand', p_effect_id, v_receipt.state, v_reason)
    WHERE n.tenant_id = p_tenant_id AND n.instance_id = v_inst.id
      AND n.path = v_receipt.block_id AND n.state = 'waiting';
    RETURN QUERY SELECT v_receipt.state::text,
        orch8.sync_instance(p_tenant_id, v_inst.id, v_actor,
            format('receipt %s is %s by its verifier, and the step stops: %s; retry it by hand',
                   p_effect_id, v_receipt.state, v_reason)),
        v_reason;
END
$$;

COMMENT ON FUNCTION orch8.record_verification(
    text, uuid, uuid, text, jsonb, text, jsonb
) IS
'A verifier''s verdict on one try, fenced by the try''s lease token (another holder, or a '
'verification no longer pending: outcome stale, nothing written). inconclusive: an event '
'on the receipt (actor verifier:<method>), the next try after the schedule''s next delay, '
'or after the last one escalated (escalate_verification). applied -> the receipt is '
'verified, not_applied -> abandoned, through record_resolution with the evidence, the '
'provider receipt id and (applied) the output. When a node waits on the receipt (waiting '
'or blocked, its latest row __unsettled__ for it) it goes on as the step '
'says: verify.on_verified continue (default; continue_settled_step) or stop, '
'verify.on_not_applied retry (default, while retry.max_attempts allows) or stop; stopping '
'blocks the step''s node with the reason (the instance fails when nothing else runs). '
'Returns the receipt''s new state (or inconclusive, escalated, '
'stale), the instance''s state and a detail.';
