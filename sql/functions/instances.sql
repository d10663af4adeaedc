-- Repeatable: instances, lease-fenced claiming, block outputs and attempts.
-- Every instance state change is a CAS against orch8.instance_can_transition and writes
-- an instance_transitions row (the trigger task_instances_record_transition, from what
-- attribute_transition set); every runner write carries (instance, lease token).

CREATE OR REPLACE FUNCTION orch8.attribute_transition(p_actor text, p_reason text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM orch8.require_size('actor', 'actor_chars', char_length(p_actor));
    PERFORM set_config('orch8.transition_actor', coalesce(p_actor, ''), true),
            set_config('orch8.transition_reason', coalesce(p_reason, ''), true);
END
$$;

COMMENT ON FUNCTION orch8.attribute_transition(text, text) IS
'Who moves the instance next, and why, for the row the trigger writes to '
'instance_transitions (the actor as attributed_actor sees it). An actor over actor_chars: '
'O8008.';

CREATE OR REPLACE FUNCTION orch8.create_instance(
    p_tenant_id text,
    p_sequence_id uuid,
    p_data jsonb DEFAULT '{}',
    p_config jsonb DEFAULT '{}',
    p_priority integer DEFAULT 0,
    p_idempotency_key text DEFAULT NULL,
    p_next_fire_at timestamptz DEFAULT NULL,
    p_parent_instance_id uuid DEFAULT NULL
)
RETURNS TABLE (id uuid, state orch8.instance_state, deduplicated boolean)
LANGUAGE plpgsql
AS $$
DECLARE
    v_seq orch8.sequences;
    v_context jsonb;
    v_limit integer := coalesce(
        nullif(current_setting('orch8.max_context_bytes', true), '')::integer,
        orch8.limit_of('context_bytes'));
    v_row orch8.task_instances;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);  -- the web role acts in its sealed tenant
    IF octet_length(p_idempotency_key) NOT BETWEEN 1 AND orch8.limit_of('idempotency_key_bytes')
    THEN
        RAISE EXCEPTION 'idempotency key must be 1 to % bytes',
            orch8.limit_of('idempotency_key_bytes')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object(
                      'field', 'idempotency_key',
                      'limit', orch8.limit_of('idempotency_key_bytes'))::text;
    END IF;
    IF jsonb_typeof(coalesce(p_data, '{}')) <> 'object'
       OR jsonb_typeof(coalesce(p_config, '{}')) <> 'object' THEN
        RAISE EXCEPTION 'instance data and config must be JSON objects' USING ERRCODE = 'O8008';
    END IF;
    SELECT * INTO v_seq FROM orch8.sequences AS s
     WHERE s.tenant_id = p_tenant_id AND s.id = p_sequence_id;
    IF NOT found THEN
        RAISE EXCEPTION 'sequence % not found', p_sequence_id
            USING ERRCODE = 'O8007', DETAIL = json_build_object('sequence_id', p_sequence_id)::text;
    END IF;
    IF p_parent_instance_id IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM orch8.task_instances AS t
         WHERE t.tenant_id = p_tenant_id AND t.id = p_parent_instance_id) THEN
        RAISE EXCEPTION 'parent instance % not found', p_parent_instance_id
            USING ERRCODE = 'O8007',
                  DETAIL = json_build_object('parent_instance_id', p_parent_instance_id)::text;
    END IF;
    v_context := jsonb_build_object(
        'data', coalesce(p_data, '{}'), 'config', coalesce(p_config, '{}'), 'runtime', '{}'::jsonb);
    IF octet_length(v_context::text) > v_limit THEN
        RAISE EXCEPTION 'instance context is % bytes, over the limit of % bytes',
            octet_length(v_context::text), v_limit
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'context', 'limit', v_limit,
                                             'size', octet_length(v_context::text))::text,
                  HINT = 'store large payloads elsewhere and pass a reference '
                         '(the limit is the setting orch8.max_context_bytes)';
    END IF;

    PERFORM orch8.attribute_transition('create', NULL);
    INSERT INTO orch8.task_instances AS t (
        tenant_id, sequence_id, sequence_version, context, next_fire_at, priority,
        parent_instance_id, idempotency_key
    ) VALUES (
        p_tenant_id, v_seq.id, v_seq.version, v_context,
        coalesce(p_next_fire_at, orch8.now()), coalesce(p_priority, 0),
        p_parent_instance_id, p_idempotency_key
    )
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING t.* INTO v_row;

    IF v_row.id IS NULL THEN  -- the key was used before: hand back that instance
        SELECT * INTO STRICT v_row FROM orch8.task_instances AS t
         WHERE t.tenant_id = p_tenant_id AND t.idempotency_key = p_idempotency_key;
        RETURN QUERY SELECT v_row.id, v_row.state, true;
        RETURN;
    END IF;
    PERFORM pg_notify('orch8_work', '');
    RETURN QUERY SELECT v_row.id, v_row.state, false;
END
$$;

COMMENT ON FUNCTION orch8.create_instance(
    text, uuid, jsonb, jsonb, integer, text, timestamptz, uuid
) IS
'Start an instance of a sequence version: context {data, config, runtime}, scheduled at '
'next_fire_at (default now). A repeated idempotency_key returns the existing instance '
'with deduplicated = true. Context over orch8.max_context_bytes (default: the limit '
'context_bytes, 262144): O8008. '
'Notifies channel orch8_work so idle runners wake.';

CREATE OR REPLACE FUNCTION orch8.reclaim_expired_leases(p_limit integer DEFAULT 100)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_row record;
    v_count integer := 0;
BEGIN
    -- Rare and bounded, so one instance at a time through transition_instance: the audit
    -- row, a woken parent and the work notification come from the one place that does
    -- them. The row lock held from the SELECT keeps token and expiry as they were read.
    FOR v_row IN
        SELECT t.tenant_id, t.id, t.requested_state
        FROM orch8.task_instances AS t
        WHERE t.state = 'running' AND t.lease_expires_at < orch8.now()
        ORDER BY t.lease_expires_at
        LIMIT greatest(p_limit, 0)
        FOR UPDATE SKIP LOCKED
    LOOP
        IF v_row.requested_state IS NOT NULL THEN
            -- Paused or cancelled, the step will not begin again soon, and beginning it
            -- again is what would notice a receipt the lost runner left dispatched. Say
            -- now that its outcome is unknown, so it reaches the operator queue and can be
            -- resolved (a dispatched receipt cannot be).
            PERFORM orch8.cas_effect_receipt(r.tenant_id, r.id, 'dispatched', 'unknown',
                jsonb_build_object(
                    'actor', 'lease-sweep',
                    'note', 'the runner lost its lease before it recorded the step',
                    'error', format('outcome unknown: the lease expired and the instance '
                                    'was %s as requested', v_row.requested_state)))
            FROM orch8.effect_receipts AS r
            WHERE r.tenant_id = v_row.tenant_id AND r.instance_id = v_row.id
              AND r.state = 'dispatched';
            PERFORM orch8.schedule_verification(r.tenant_id, r.id, 'lease-sweep')
            FROM orch8.effect_receipts AS r
            WHERE r.tenant_id = v_row.tenant_id AND r.instance_id = v_row.id
              AND r.state = 'unknown';
        END IF;
        PERFORM orch8.transition_instance(v_row.tenant_id, v_row.id, 'running',
            coalesce(v_row.requested_state, 'scheduled'), 'lease-sweep', 'lease expired');
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END
$$;

COMMENT ON FUNCTION orch8.reclaim_expired_leases(integer) IS
'Bounded sweep: up to p_limit running instances whose lease expired go back to scheduled, '
'or to the paused or cancelled state requested meanwhile (then a receipt the lost runner '
'left dispatched becomes unknown, for the operator queue, and its step''s verifier is '
'scheduled). Through transition_instance: '
'audit row, parent woken. Returns how many. claim_due_instances runs it.';

CREATE OR REPLACE FUNCTION orch8.claim_due_instances(
    p_worker_id text, p_batch integer, p_lease interval DEFAULT '30 seconds'
)
RETURNS SETOF orch8.task_instances
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_worker_id IS NULL OR p_worker_id = '' OR p_batch IS NULL OR p_batch < 1
       OR p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION 'claim_due_instances needs a worker id, a batch >= 1 and a positive lease'
            USING ERRCODE = 'O8008';
    END IF;
    PERFORM orch8.reclaim_expired_leases(p_batch);
    PERFORM orch8.attribute_transition(p_worker_id, NULL);
    RETURN QUERY
    WITH due AS (
        SELECT t.tenant_id, t.id
        FROM orch8.task_instances AS t
        WHERE t.state = 'scheduled' AND t.next_fire_at <= orch8.now()
        ORDER BY t.priority DESC, t.next_fire_at
        LIMIT p_batch
        FOR UPDATE SKIP LOCKED
    ),
    claimed AS (
        UPDATE orch8.task_instances AS t
        SET state = 'running', lease_owner = p_worker_id, lease_token = gen_random_uuid(),
            lease_expires_at = orch8.now() + p_lease, updated_at = orch8.now()
        FROM due AS d
        WHERE t.tenant_id = d.tenant_id AND t.id = d.id AND t.state = 'scheduled'
        RETURNING t.*
    )
    SELECT * FROM claimed;
END
$$;

COMMENT ON FUNCTION orch8.claim_due_instances(text, integer, interval) IS
'One round trip for a batch: reclaim up to p_batch expired leases, then claim up to '
'p_batch due scheduled instances (priority, then next_fire_at; FOR UPDATE SKIP LOCKED), '
'each with a fresh lease token and expiry now + p_lease. Every later write for an '
'instance carries its token.';

CREATE OR REPLACE FUNCTION orch8.lock_leased_instance(
    p_tenant_id text, p_instance_id uuid, p_lease_token uuid
)
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
    IF v_row.state <> 'running' OR v_row.lease_token IS DISTINCT FROM p_lease_token
       OR v_row.lease_expires_at < orch8.now() THEN
        RAISE EXCEPTION 'lease on instance % is no longer held by this caller', p_instance_id
            USING ERRCODE = 'O8001',
                  DETAIL = json_build_object('instance_id', p_instance_id,
                                             'current_state', v_row.state,
                                             'lease_owner', v_row.lease_owner)::text;
    END IF;
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION orch8.lock_leased_instance(text, uuid, uuid) IS
'Lock a running instance for a write by its lease holder; a token that is not the '
'current one, or an expired lease, raises O8001 stale_lease (the caller stops quietly).';

CREATE OR REPLACE FUNCTION orch8.heartbeat_leases(p_lease_tokens uuid[], p_lease interval)
RETURNS SETOF uuid
LANGUAGE plpgsql
AS $$
BEGIN
    -- A negative lease would report the lease held while setting it in the past.
    IF p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION 'heartbeat_leases needs a positive lease, got %',
            coalesce(p_lease::text, 'NULL') USING ERRCODE = 'O8008';
    END IF;
    RETURN QUERY
    UPDATE orch8.task_instances AS t
    SET lease_expires_at = orch8.now() + p_lease
    WHERE t.state = 'running'
      AND t.lease_token = ANY(p_lease_tokens)
      AND t.lease_expires_at >= orch8.now()
    RETURNING t.lease_token;
END
$$;

COMMENT ON FUNCTION orch8.heartbeat_leases(uuid[], interval) IS
'Extend every still-held lease among p_lease_tokens to now + p_lease in one statement; '
'returns the tokens still held (a missing one was lost: stop work on that instance). '
'A lease that is NULL or not positive: O8008.';

CREATE OR REPLACE FUNCTION orch8.transition_instance(
    p_tenant_id text,
    p_instance_id uuid,
    p_expected orch8.instance_state,
    p_next orch8.instance_state,
    p_actor text,
    p_reason text DEFAULT NULL,
    p_next_fire_at timestamptz DEFAULT NULL
)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    IF NOT orch8.instance_can_transition(p_expected, p_next) THEN
        RAISE EXCEPTION 'instance % cannot move from % to %', p_instance_id, p_expected, p_next
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('instance_id', p_instance_id,
                                             'from_state', p_expected, 'to_state', p_next)::text;
    END IF;
    IF p_next = 'running' THEN
        -- running carries a lease, which only a claim issues
        RAISE EXCEPTION 'instance % moves to running only by a claim', p_instance_id
            USING ERRCODE = 'O8004', HINT = 'orch8.claim_due_instances';
    END IF;
    PERFORM orch8.attribute_transition(p_actor, p_reason);
    UPDATE orch8.task_instances AS t
    SET state = p_next,
        updated_at = orch8.now(),
        next_fire_at = coalesce(p_next_fire_at,
                                CASE WHEN p_next = 'scheduled' THEN orch8.now()
                                     ELSE t.next_fire_at END),
        error = CASE WHEN p_next = 'failed' THEN p_reason
                     WHEN p_next = 'scheduled' THEN NULL ELSE t.error END,
        requested_state = CASE WHEN p_next = 'running' THEN t.requested_state END,
        lease_owner = CASE WHEN p_next = 'running' THEN t.lease_owner END,
        lease_token = CASE WHEN p_next = 'running' THEN t.lease_token END,
        lease_expires_at = CASE WHEN p_next = 'running' THEN t.lease_expires_at END
    WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id AND t.state = p_expected;
    IF NOT found THEN
        RETURN false;
    END IF;
    IF p_next IN ('completed', 'failed', 'cancelled') THEN
        -- a child that ends wakes its parent if the parent waits for it
        PERFORM orch8.transition_instance(
            p_tenant_id, t.parent_instance_id, 'waiting', 'scheduled', 'child',
            format('child %s %s', p_instance_id, p_next))
        FROM orch8.task_instances AS t
        WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id
          AND t.parent_instance_id IS NOT NULL;
    END IF;
    IF p_next = 'scheduled' THEN
        PERFORM pg_notify('orch8_work', '');
    END IF;
    RETURN true;
END
$$;

COMMENT ON FUNCTION orch8.transition_instance(
    text, uuid, orch8.instance_state, orch8.instance_state, text, text, timestamptz
) IS
'CAS an instance from p_expected to p_next (the table in instance_can_transition; an '
'illegal pair raises O8004) and write the audit row. Leaving running drops the lease. '
'An instance that ends (completed, failed, cancelled) wakes its parent when the parent is '
'waiting. Returns false when the instance was not in p_expected (never retried).';

CREATE OR REPLACE FUNCTION orch8.release_lease(
    p_tenant_id text,
    p_instance_id uuid,
    p_lease_token uuid,
    p_next_fire_at timestamptz DEFAULT NULL,
    p_reason text DEFAULT 'released'
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_inst orch8.task_instances;
BEGIN
    v_inst := orch8.lock_leased_instance(p_tenant_id, p_instance_id, p_lease_token);
    IF v_inst.requested_state IS NOT NULL THEN  -- a pause or cancel asked meanwhile wins
        PERFORM orch8.transition_instance(p_tenant_id, p_instance_id, 'running',
            v_inst.requested_state, 'operator', 'requested while running');
        RETURN;
    END IF;
    PERFORM orch8.transition_instance(p_tenant_id, p_instance_id, 'running', 'scheduled',
                                      'runner', p_reason, p_next_fire_at);
END
$$;

COMMENT ON FUNCTION orch8.release_lease(text, uuid, uuid, timestamptz, text) IS
'The lease holder hands a running instance back to scheduled (at p_next_fire_at, default '
'now), or to the paused or cancelled state requested meanwhile: on graceful shutdown, or '
'to wait for a retry backoff. Stale token: O8001.';

CREATE OR REPLACE FUNCTION orch8.compute_attempt(
    p_tenant_id text, p_instance_id uuid, p_block_id text
)
RETURNS integer
LANGUAGE sql
STABLE
AS $$
    SELECT coalesce(
        (SELECT CASE WHEN o.sentinel IN ('__in_progress__', '__unsettled__') THEN o.attempt
                     ELSE o.attempt + 1 END
           FROM orch8.block_outputs AS o
          WHERE o.tenant_id = p_tenant_id AND o.instance_id = p_instance_id
            AND o.block_id = p_block_id
          ORDER BY o.seq DESC
          LIMIT 1),
        0)
$$;

COMMENT ON FUNCTION orch8.compute_attempt(text, uuid, text) IS
'The attempt number of a block''s next run, from the latest block_outputs row: none -> 0; '
'__in_progress__ (a crash resumes it) and __unsettled__ (its outcome is not settled yet) '
'-> the same attempt, whose receipt then blocks a second send; anything else -> previous '
'+ 1.';

CREATE OR REPLACE FUNCTION orch8.record_block_output(
    p_tenant_id text,
    p_instance_id uuid,
    p_block_id text,
    p_attempt integer,
    p_sentinel text,
    p_output jsonb,
    p_retryable boolean,
    p_effect_id uuid,
    p_lease_token uuid
)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_effect_id IS NOT NULL THEN
        PERFORM orch8.require_own_receipt(p_tenant_id, p_effect_id, p_instance_id, p_block_id,
                                          NULL);
    END IF;
    INSERT INTO orch8.block_outputs (
        tenant_id, instance_id, block_id, attempt, sentinel, output, retryable, effect_id,
        lease_token
    ) VALUES (
        p_tenant_id, p_instance_id, p_block_id, p_attempt, p_sentinel, p_output, p_retryable,
        p_effect_id, p_lease_token
    );
END
$$;

COMMENT ON FUNCTION orch8.record_block_output(
    text, uuid, text, integer, text, jsonb, boolean, uuid, uuid
) IS
'The one INSERT into block_outputs (internal helper: callers check the lease first). '
'lease_token is the claim that wrote the row, NULL for an operator''s retry. An effect id '
'must name a receipt of this instance and block (require_own_receipt, O8009).';

CREATE OR REPLACE FUNCTION orch8.refuse_foreign_receipt(
    p_effect_id uuid, p_instance_id uuid, p_block_id text, p_attempt integer
)
RETURNS void
LANGUAGE plpgsql
STABLE  -- not IMMUTABLE: never folded into a plan with constant arguments
AS $$
BEGIN
    RAISE EXCEPTION '%', format('receipt %s is not a receipt of instance %s, block %s%s',
        p_effect_id, p_instance_id, p_block_id, ', attempt ' || p_attempt)
        USING ERRCODE = 'O8009',
              DETAIL = json_build_object('effect_id', p_effect_id, 'instance_id', p_instance_id,
                                         'block_id', p_block_id, 'attempt', p_attempt)::text;
END
$$;

COMMENT ON FUNCTION orch8.refuse_foreign_receipt(uuid, uuid, text, integer) IS
'Raises O8009: the receipt named is not this instance''s, block''s (and attempt''s). The '
'one wording of that refusal, for require_own_receipt and recover_lost_receipt.';

CREATE OR REPLACE FUNCTION orch8.require_own_receipt(
    p_tenant_id text, p_effect_id uuid, p_instance_id uuid, p_block_id text, p_attempt integer
)
RETURNS void
LANGUAGE plpgsql
STABLE
AS $$
DECLARE
    v_row orch8.effect_receipts;
BEGIN
    SELECT * INTO v_row FROM orch8.effect_receipts AS r
     WHERE r.tenant_id = p_tenant_id AND r.id = p_effect_id;
    -- A receipt that does not exist is no one's (finish_step recovers one lost with a
    -- failed primary, recover_lost_receipt; a lost write must not be a reason to resend).
    IF v_row.id IS NOT NULL AND (
        v_row.instance_id <> p_instance_id OR v_row.block_id <> p_block_id
        OR v_row.attempt <> coalesce(p_attempt, v_row.attempt))
    THEN
        PERFORM orch8.refuse_foreign_receipt(p_effect_id, p_instance_id, p_block_id, p_attempt);
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.require_own_receipt(text, uuid, uuid, text, integer) IS
'O8009 when the receipt belongs to another instance, block or (when given) attempt: a '
'caller holding one instance''s lease cannot settle or cite another''s receipt. A receipt '
'that does not exist (lost with a failed primary) passes: finish_step records it again '
'(recover_lost_receipt).';

CREATE OR REPLACE FUNCTION orch8.append_block_output(
    p_tenant_id text,
    p_instance_id uuid,
    p_lease_token uuid,
    p_block_id text,
    p_attempt integer,
    p_sentinel text,
    p_output jsonb,
    p_retryable boolean DEFAULT NULL,
    p_effect_id uuid DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM orch8.lock_leased_instance(p_tenant_id, p_instance_id, p_lease_token);
    PERFORM orch8.record_block_output(p_tenant_id, p_instance_id, p_block_id, p_attempt,
                                      p_sentinel, p_output, p_retryable, p_effect_id,
                                      p_lease_token);
END
$$;

COMMENT ON FUNCTION orch8.append_block_output(
    text, uuid, uuid, text, integer, text, jsonb, boolean, uuid
) IS
'Append a block result (or a sentinel: __in_progress__, __retry__, __error__) for the '
'lease holder; a stale token raises O8001 and nothing is written.';

CREATE OR REPLACE FUNCTION orch8.instance_progress(p_tenant_id text, p_instance_id uuid)
RETURNS jsonb
LANGUAGE sql
STABLE
AS $$
    SELECT coalesce(jsonb_object_agg(b.block_id, jsonb_build_object(
        'attempt', b.attempt,
        'sentinel', b.sentinel,
        'output', (
            SELECT o.output FROM orch8.block_outputs AS o
            WHERE o.tenant_id = p_tenant_id AND o.instance_id = p_instance_id
              AND o.block_id = b.block_id AND o.sentinel IS NULL
            ORDER BY o.seq DESC LIMIT 1
        )
    )), '{}'::jsonb)
    FROM (
        SELECT DISTINCT ON (o.block_id) o.block_id, o.attempt, o.sentinel
        FROM orch8.block_outputs AS o
        WHERE o.tenant_id = p_tenant_id AND o.instance_id = p_instance_id
        ORDER BY o.block_id, o.seq DESC
    ) AS b
$$;

COMMENT ON FUNCTION orch8.instance_progress(text, uuid) IS
'Per block of an instance: the latest row''s attempt and sentinel (what compute_attempt '
'reads) and the latest real output, as {block_id: {attempt, sentinel, output}}.';

CREATE OR REPLACE FUNCTION orch8.next_block_id(
    p_tenant_id text, p_sequence_id uuid, p_block_id text
)
RETURNS text
LANGUAGE sql
STABLE
AS $$
    SELECT b.next_id
    FROM orch8.sequences AS s,
        LATERAL (
            SELECT e.value ->> 'id' AS id,
                   lead(e.value ->> 'id') OVER (ORDER BY e.ordinality) AS next_id
            FROM jsonb_array_elements(s.definition -> 'blocks') WITH ORDINALITY AS e
        ) AS b
    WHERE s.tenant_id = p_tenant_id AND s.id = p_sequence_id AND b.id = p_block_id
$$;

COMMENT ON FUNCTION orch8.next_block_id(text, uuid, text) IS
'The id of the top-level block after p_block_id in a sequence, or NULL at the end.';

CREATE OR REPLACE FUNCTION orch8.first_block_id(p_tenant_id text, p_sequence_id uuid)
RETURNS text
LANGUAGE sql
STABLE
AS $$
    SELECT s.definition -> 'blocks' -> 0 ->> 'id'
    FROM orch8.sequences AS s
    WHERE s.tenant_id = p_tenant_id AND s.id = p_sequence_id
$$;

COMMENT ON FUNCTION orch8.first_block_id(text, uuid) IS
'The id of the first top-level block of a sequence, where a new instance starts.';

CREATE OR REPLACE FUNCTION orch8.claim_work(
    p_worker_id text, p_batch integer, p_lease interval DEFAULT '30 seconds'
)
RETURNS TABLE (
    tenant_id text,
    id uuid,
    sequence_id uuid,
    sequence_version integer,
    context jsonb,
    current_block text,
    current_attempt integer,
    parent_instance_id uuid,
    lease_token uuid,
    progress jsonb
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_claimed orch8.task_instances [];
BEGIN
    -- Two statements on purpose. The claim takes fresh snapshots inside, so it may claim
    -- an instance scheduled by a transaction that committed after this call began; the
    -- STABLE reads below would still see the snapshot of the statement that called them.
    -- Read in a statement that starts after the claim, they see what it saw (the output
    -- a verifier recorded with the move to scheduled, the __retry__ row of a retry).
    v_claimed := ARRAY(SELECT c FROM orch8.claim_due_instances(p_worker_id, p_batch, p_lease) AS c);
    RETURN QUERY
    SELECT
        c.tenant_id, c.id, c.sequence_id, c.sequence_version, c.context, b.block_id,
        orch8.compute_attempt(c.tenant_id, c.id, b.block_id),
        c.parent_instance_id, c.lease_token, orch8.instance_progress(c.tenant_id, c.id)
    FROM unnest(v_claimed) AS c
    CROSS JOIN LATERAL (
        SELECT coalesce(c.current_block, orch8.first_block_id(c.tenant_id, c.sequence_id))
            AS block_id
    ) AS b;
END
$$;

COMMENT ON FUNCTION orch8.claim_work(text, integer, interval) IS
'The runner''s claim: claim_due_instances plus, per instance, the block to run (its '
'current block, or the first one) with its attempt (compute_attempt) and the progress of '
'every block, so a batch costs one round trip and the steps that follow need no further '
'reads. The attempt and progress are read after the claim, in a statement of their own, so '
'they include what the transaction that scheduled the instance wrote.';
