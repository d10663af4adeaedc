-- Repeatable: external workers (docs/ARCHITECTURE.md, "External workers"). A handler
-- registered here is served by worker processes over the REST API: begin_step dispatches
-- its receipt and queues a task in one transaction (dispatch_worker_task); workers claim
-- tasks (claim_worker_tasks), heartbeat and report (complete_worker_task,
-- fail_worker_task), every call fenced by the worker id and the claim epoch (O8001 when it
-- no longer holds the task). What a failure means is decided by a runner (finish_step);
-- leases and timeouts are swept by claim_due_nodes (sweep_worker_tasks).

-- Registrations -------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.register_worker_handler(
    p_tenant_id text,
    p_handler text,
    p_queue text DEFAULT NULL,
    p_timeout text DEFAULT NULL,
    p_redeliver_unstarted boolean DEFAULT NULL,
    p_actor text DEFAULT NULL
)
RETURNS orch8.worker_handlers
LANGUAGE plpgsql
AS $$
DECLARE
    v_timeout_ms bigint := orch8.duration_ms(
        CASE WHEN p_timeout ~ '^[0-9]+$' THEN to_jsonb(p_timeout::numeric)
             ELSE to_jsonb(p_timeout) END);
    v_actor text;
    v_row orch8.worker_handlers;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);  -- the web role acts in its sealed tenant
    PERFORM orch8.require_domain(p_handler, 'orch8.identifier', 'handler');
    IF p_queue IS NOT NULL THEN
        PERFORM orch8.require_domain(p_queue, 'orch8.identifier', 'queue');
    END IF;
    PERFORM orch8.require_size('actor', 'actor_chars', char_length(p_actor));
    IF EXISTS (SELECT 1 FROM orch8.builtin_handlers AS h WHERE h.name = p_handler) THEN
        RAISE EXCEPTION 'handler % is a builtin: runners run it, no worker can', p_handler
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'handler')::text;
    END IF;
    IF p_timeout IS NOT NULL AND (v_timeout_ms IS NULL OR v_timeout_ms < 1000) THEN
        RAISE EXCEPTION 'timeout must be a duration such as 30s, 5m, 1h or milliseconds, '
                        'at least 1s and at most % days', orch8.limit_of('wait_ms') / 86400000
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'timeout')::text;
    END IF;
    v_actor := orch8.attributed_actor(p_actor);
    INSERT INTO orch8.worker_handlers AS w (
        tenant_id, handler, queue, timeout_ms, redeliver_unstarted, created_by, updated_by
    ) VALUES (
        p_tenant_id, p_handler, coalesce(p_queue, 'default'), coalesce(v_timeout_ms, 300000),
        coalesce(p_redeliver_unstarted, false), v_actor, v_actor
    )
    ON CONFLICT (tenant_id, handler) DO UPDATE
    SET queue = coalesce(p_queue, w.queue),
        timeout_ms = coalesce(v_timeout_ms, w.timeout_ms),
        redeliver_unstarted = coalesce(p_redeliver_unstarted, w.redeliver_unstarted),
        updated_by = excluded.updated_by, updated_at = orch8.now()
    RETURNING w.* INTO v_row;
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION orch8.register_worker_handler(text, text, text, text, boolean, text) IS
'Register (or change) a handler the tenant''s external workers serve: from now on a step '
'naming it is dispatched as a worker task (begin_step), whatever a runner has loaded. '
'p_queue (default: default), p_timeout (schedule-to-close for steps without a timeout: '
'30s, 5m, 1h or milliseconds, at least 1s; default 5m), p_redeliver_unstarted (a task '
'whose lease runs out before its first heartbeat is queued again instead of blocking; '
'default false); NULL keeps what a registration had. Tasks already queued keep their '
'queue and close_by. A builtin, or a name or queue that is not an orch8.identifier: '
'O8008. The actor recorded is attributed_actor''s.';

CREATE OR REPLACE FUNCTION orch8.unregister_worker_handler(p_tenant_id text, p_handler text)
RETURNS boolean
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);
    DELETE FROM orch8.worker_handlers AS w
    WHERE w.tenant_id = p_tenant_id AND w.handler = p_handler;
    RETURN found;
END
$$;

COMMENT ON FUNCTION orch8.unregister_worker_handler(text, text) IS
'Stop dispatching a handler to external workers (its steps run in runners again, or fail '
'where no runner has it). Tasks already queued or running stay, and are served as '
'before. Returns whether it was registered.';

CREATE OR REPLACE VIEW orch8.worker_handler_status WITH (security_invoker = true) AS
SELECT
    w.tenant_id,
    w.handler,
    w.queue,
    w.timeout_ms,
    w.redeliver_unstarted,
    (
        SELECT count(*) FROM orch8.worker_tasks AS t
        WHERE t.tenant_id = w.tenant_id AND t.handler = w.handler AND t.state = 'queued'
    ) AS queued,
    (
        SELECT min(t.created_at) FROM orch8.worker_tasks AS t
        WHERE t.tenant_id = w.tenant_id AND t.handler = w.handler AND t.state = 'queued'
    ) AS oldest_queued_at,
    (
        SELECT count(*) FROM orch8.worker_tasks AS t
        WHERE t.tenant_id = w.tenant_id AND t.handler = w.handler AND t.state = 'running'
    ) AS running,
    w.created_by,
    w.updated_by,
    w.created_at,
    w.updated_at
FROM orch8.worker_handlers AS w;

COMMENT ON VIEW orch8.worker_handler_status IS
'Every registered worker handler with its tasks queued now (and since when the oldest '
'waits) and running now: what the API, the CLI and /metrics show.';

COMMENT ON COLUMN orch8.worker_handler_status.tenant_id IS
'The tenant whose steps the handler serves.';

COMMENT ON COLUMN orch8.worker_handler_status.handler IS 'The registered handler''s name.';

COMMENT ON COLUMN orch8.worker_handler_status.queue IS 'The queue its tasks go to.';

COMMENT ON COLUMN orch8.worker_handler_status.timeout_ms IS
'Its schedule-to-close timeout in milliseconds, for steps that declare none.';

COMMENT ON COLUMN orch8.worker_handler_status.redeliver_unstarted IS
'Whether a task never heartbeated is queued again when its lease runs out.';

COMMENT ON COLUMN orch8.worker_handler_status.queued IS 'Its tasks queued now, held by no worker.';

COMMENT ON COLUMN orch8.worker_handler_status.oldest_queued_at IS
'When the oldest of those was queued; NULL when none is.';

COMMENT ON COLUMN orch8.worker_handler_status.running IS 'Its tasks a worker holds now.';

COMMENT ON COLUMN orch8.worker_handler_status.created_by IS 'Who registered it.';

COMMENT ON COLUMN orch8.worker_handler_status.updated_by IS 'Who last changed it.';

COMMENT ON COLUMN orch8.worker_handler_status.created_at IS 'When it was registered.';

COMMENT ON COLUMN orch8.worker_handler_status.updated_at IS 'When it last changed.';

-- Dispatch ------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.dispatch_worker_task(
    p_inst orch8.task_instances,
    p_node orch8.execution_nodes,
    p_worker orch8.worker_handlers,
    p_out orch8.effect_outcome,
    p_params jsonb
)
RETURNS uuid
LANGUAGE plpgsql
AS $$
DECLARE
    v_timeout_ms bigint := coalesce(
        nullif(orch8.sequence_json_integer(
            orch8.instance_step(p_inst.tenant_id, p_inst.id, p_node.path) -> 'timeout'), 0),
        p_worker.timeout_ms);
    v_id uuid;
BEGIN
    PERFORM set_config('orch8.task_actor', coalesce(p_node.lease_owner, 'runner'), true);
    INSERT INTO orch8.worker_tasks (
        tenant_id, instance_id, path, attempt, effect_id, handler, queue, params,
        idempotency_key, priority, timeout_ms, close_by, redeliver_unstarted, checkpoint
    ) VALUES (
        p_inst.tenant_id, p_inst.id, p_node.path, p_out.attempt, p_out.effect_id,
        p_worker.handler, p_worker.queue, p_params, p_out.idempotency_key, p_node.priority,
        v_timeout_ms, orch8.now() + v_timeout_ms * interval '1 millisecond',
        p_worker.redeliver_unstarted,
        -- what an earlier attempt of this step saved, for the worker to resume from
        (SELECT w.checkpoint FROM orch8.worker_tasks AS w
         WHERE w.tenant_id = p_inst.tenant_id AND w.instance_id = p_inst.id
           AND w.path = p_node.path AND w.checkpoint IS NOT NULL
         ORDER BY w.created_at DESC LIMIT 1)
    )
    RETURNING id INTO v_id;
    UPDATE orch8.execution_nodes AS n
    SET state = 'waiting', worker_task_id = v_id, lease_owner = NULL, lease_token = NULL,
        lease_expires_at = NULL, updated_at = orch8.now()
    WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id AND n.path = p_node.path;
    UPDATE orch8.task_instances AS t SET current_block = p_node.path
    WHERE t.tenant_id = p_inst.tenant_id AND t.id = p_inst.id
      AND t.current_block IS DISTINCT FROM p_node.path;
    PERFORM orch8.sync_instance(p_inst.tenant_id, p_inst.id, 'runner',
        format('step %s: worker task %s queued for %s', p_node.path, v_id, p_worker.handler));
    -- wakes the long-polls waiting for this tenant's handler (web/api/long_poll.py)
    PERFORM pg_notify('orch8_tasks', json_build_object(
        'tenant', p_inst.tenant_id, 'handler', p_worker.handler)::text);
    RETURN v_id;
END
$$;

COMMENT ON FUNCTION orch8.dispatch_worker_task(
    orch8.task_instances, orch8.execution_nodes, orch8.worker_handlers, orch8.effect_outcome,
    jsonb
) IS
'begin_step''s helper for a step whose handler workers serve, once its receipt is '
'dispatched: a queued worker_tasks row (the rendered params, the effect id and '
'idempotency key, the attempt, the handler''s queue, close_by = now + the step''s timeout '
'else the handler''s timeout_ms, the checkpoint an earlier attempt saved), the node '
'waiting on it without a lease, the instance synced, and NOTIFY orch8_tasks with the '
'tenant and handler. Returns the task id.';

-- Claim, heartbeat ----------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.require_worker_call(
    p_worker_id text, p_handlers text[], p_max integer, p_lease_ms integer
)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
AS $$
BEGIN
    IF p_worker_id IS NULL OR p_worker_id = ''
       OR char_length(p_worker_id) > orch8.limit_of('actor_chars') THEN
        RAISE EXCEPTION 'a worker id is 1 to % characters', orch8.limit_of('actor_chars')
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'worker_id')::text;
    END IF;
    IF p_handlers IS NOT NULL
       AND cardinality(p_handlers) > orch8.limit_of('worker_poll_handlers') THEN
        RAISE EXCEPTION 'a poll names at most % handlers, got %',
            orch8.limit_of('worker_poll_handlers'), cardinality(p_handlers)
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'handlers',
                                             'limit', orch8.limit_of('worker_poll_handlers'))::text;
    END IF;
    IF p_max IS NULL OR p_max NOT BETWEEN 1 AND orch8.limit_of('worker_poll_tasks') THEN
        RAISE EXCEPTION 'max_tasks must be from 1 to %', orch8.limit_of('worker_poll_tasks')
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'max_tasks')::text;
    END IF;
    IF p_lease_ms IS NULL OR p_lease_ms NOT BETWEEN 1000 AND orch8.limit_of('worker_lease_ms') THEN
        RAISE EXCEPTION 'lease_ms must be from 1000 to %', orch8.limit_of('worker_lease_ms')
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'lease_ms')::text;
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.require_worker_call(text, text[], integer, integer) IS
'O8008 (DETAIL field) unless a worker''s claim is well formed: a worker id of 1 to '
'actor_chars characters, at most worker_poll_handlers handlers, max from 1 to '
'worker_poll_tasks, a lease from 1000 to worker_lease_ms ms.';

CREATE OR REPLACE FUNCTION orch8.claim_worker_tasks(
    p_tenant_id text,
    p_worker_id text,
    p_handlers text[],
    p_queue text DEFAULT NULL,
    p_max integer DEFAULT 1,
    p_lease_ms integer DEFAULT 30000
)
RETURNS TABLE (
    task_id uuid,
    handler text,
    queue text,
    params jsonb,
    effect_id uuid,
    idempotency_key text,
    attempt integer,
    claim_epoch bigint,
    lease_ms integer,
    lease_expires_at timestamptz,
    close_by timestamptz,
    instance_id uuid,
    block_id text,
    checkpoint jsonb
)
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);
    PERFORM orch8.require_worker_call(p_worker_id, p_handlers, p_max, p_lease_ms);
    PERFORM set_config('orch8.task_actor', 'worker:' || p_worker_id, true);
    RETURN QUERY
    WITH due AS (
        SELECT w.tenant_id, w.id
        FROM orch8.worker_tasks AS w
        WHERE w.tenant_id = p_tenant_id AND w.state = 'queued'
          AND w.handler = ANY (p_handlers)
          AND (p_queue IS NULL OR w.queue = p_queue)
        ORDER BY w.priority DESC, w.created_at
        LIMIT p_max
        FOR UPDATE SKIP LOCKED
    ),
    claimed AS (
        UPDATE orch8.worker_tasks AS w
        SET state = 'running', claim_epoch = w.claim_epoch + 1, worker_id = p_worker_id,
            lease_ms = p_lease_ms,
            lease_expires_at = orch8.now() + p_lease_ms * interval '1 millisecond',
            claimed_at = orch8.now(), started_at = NULL, heartbeat_at = NULL,
            updated_at = orch8.now()
        FROM due AS d
        WHERE w.tenant_id = d.tenant_id AND w.id = d.id
        RETURNING w.*
    )
    SELECT c.id, c.handler::text, c.queue::text, c.params, c.effect_id, c.idempotency_key,
           c.attempt, c.claim_epoch, c.lease_ms, c.lease_expires_at, c.close_by,
           c.instance_id, c.path, c.checkpoint
    FROM claimed AS c
    ORDER BY c.priority DESC, c.created_at;
END
$$;

COMMENT ON FUNCTION orch8.claim_worker_tasks(text, text, text[], text, integer, integer) IS
'A worker''s claim, one statement: up to p_max queued tasks of the tenant for p_handlers '
'(and p_queue when given), priority then age, FOR UPDATE SKIP LOCKED (two workers never '
'get one task), each moved to running with claim_epoch + 1, the worker id and a lease '
'of p_lease_ms. Answers what the worker needs: params, the effect id and idempotency key '
'to hand to the provider, the attempt, the epoch its callbacks must name, the lease '
'expiry, close_by, and an earlier attempt''s checkpoint. Bad arguments: O8008 '
'(require_worker_call).';

CREATE OR REPLACE FUNCTION orch8.refuse_worker_call(
    p_task orch8.worker_tasks, p_task_id uuid, p_worker_id text, p_claim_epoch bigint
)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_task.id IS NULL THEN
        RAISE EXCEPTION 'worker task % not found', p_task_id
            USING ERRCODE = 'O8007', DETAIL = json_build_object('task_id', p_task_id)::text;
    END IF;
    RAISE EXCEPTION 'worker % no longer holds task % (claim %): %', p_worker_id, p_task.id,
        p_claim_epoch,
        CASE WHEN p_task.state <> 'running' THEN format('the task is %s', p_task.state)
             WHEN p_task.claim_epoch <> p_claim_epoch OR p_task.worker_id <> p_worker_id
             THEN format('it was claimed again (claim %s)', p_task.claim_epoch)
             ELSE 'its lease ran out' END
        USING ERRCODE = 'O8001',
              DETAIL = json_build_object('task_id', p_task.id, 'current_state', p_task.state,
                                         'claim_epoch', p_task.claim_epoch)::text,
              HINT = 'stop working on it: another worker or a sweep owns it now';
END
$$;

COMMENT ON FUNCTION orch8.refuse_worker_call(orch8.worker_tasks, uuid, text, bigint) IS
'Raise why a worker''s call about a task is refused: O8007 when the tenant has no such '
'task; else O8001 (409) naming the task''s state, a newer claim or a lease run out, with '
'DETAIL {task_id, current_state, claim_epoch}.';

CREATE OR REPLACE FUNCTION orch8.holds_worker_task(
    p_task orch8.worker_tasks, p_worker_id text, p_claim_epoch bigint
)
RETURNS boolean
LANGUAGE sql
STABLE
AS $$
    SELECT coalesce(p_task.state = 'running' AND p_task.worker_id = p_worker_id
                    AND p_task.claim_epoch = p_claim_epoch
                    AND p_task.lease_expires_at >= orch8.now(), false)
$$;

COMMENT ON FUNCTION orch8.holds_worker_task(orch8.worker_tasks, text, bigint) IS
'The fence of every worker callback: the task is running, claimed by this worker with '
'this epoch, and its lease has not run out.';

CREATE OR REPLACE FUNCTION orch8.heartbeat_worker_task(
    p_tenant_id text,
    p_task_id uuid,
    p_worker_id text,
    p_claim_epoch bigint,
    p_checkpoint jsonb DEFAULT NULL
)
RETURNS TABLE (lease_expires_at timestamptz, cancel_requested boolean, close_by timestamptz)
LANGUAGE plpgsql
AS $$
DECLARE
    v_task orch8.worker_tasks;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);
    PERFORM orch8.require_size('checkpoint', 'worker_checkpoint_bytes',
                               octet_length(p_checkpoint::text));
    PERFORM set_config('orch8.task_actor', 'worker:' || p_worker_id, true);
    UPDATE orch8.worker_tasks AS w
    SET lease_expires_at = orch8.now() + w.lease_ms * interval '1 millisecond',
        heartbeat_at = orch8.now(), started_at = coalesce(w.started_at, orch8.now()),
        checkpoint = coalesce(p_checkpoint, w.checkpoint), updated_at = orch8.now()
    WHERE w.tenant_id = p_tenant_id AND w.id = p_task_id AND w.state = 'running'
      AND w.worker_id = p_worker_id AND w.claim_epoch = p_claim_epoch
      AND w.lease_expires_at >= orch8.now()
    RETURNING w.* INTO v_task;
    IF v_task.id IS NULL THEN
        PERFORM orch8.refuse_worker_call(
            (SELECT w FROM orch8.worker_tasks AS w
             WHERE w.tenant_id = p_tenant_id AND w.id = p_task_id),
            p_task_id, p_worker_id, p_claim_epoch);
    END IF;
    RETURN QUERY SELECT v_task.lease_expires_at, v_task.cancel_requested, v_task.close_by;
END
$$;

COMMENT ON FUNCTION orch8.heartbeat_worker_task(text, uuid, text, bigint, jsonb) IS
'A worker still works on a task: fenced (holds_worker_task; else refuse_worker_call: 409), '
'the lease extended by the claim''s lease_ms, the first heartbeat confirming pickup '
'(started_at: from then a lost lease blocks the task instead of redelivering it), and a '
'checkpoint kept when given (at most worker_checkpoint_bytes). Answers the new lease '
'expiry, whether the task''s instance or branch was cancelled meanwhile, and close_by.';

-- Reports -------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.lock_worker_task(p_tenant_id text, p_task_id uuid)
RETURNS orch8.worker_tasks
LANGUAGE plpgsql
AS $$
DECLARE
    v_task orch8.worker_tasks;
BEGIN
    SELECT * INTO v_task FROM orch8.worker_tasks AS w
    WHERE w.tenant_id = p_tenant_id AND w.id = p_task_id;
    IF v_task.id IS NULL THEN
        PERFORM orch8.refuse_worker_call(v_task, p_task_id, NULL, NULL);
    END IF;
    -- the one lock order of a tree: the instance, then what hangs from it
    PERFORM orch8.load_instance(p_tenant_id, v_task.instance_id);
    SELECT * INTO v_task FROM orch8.worker_tasks AS w
    WHERE w.tenant_id = p_tenant_id AND w.id = p_task_id
    FOR UPDATE;
    RETURN v_task;
END
$$;

COMMENT ON FUNCTION orch8.lock_worker_task(text, uuid) IS
'Lock a task''s instance, then the task (the lock order of every move of a tree), and '
'return the task; O8007 when the tenant has no such task.';

CREATE OR REPLACE FUNCTION orch8.complete_worker_task(
    p_tenant_id text,
    p_task_id uuid,
    p_worker_id text,
    p_claim_epoch bigint,
    p_output jsonb,
    p_invalid text DEFAULT NULL
)
RETURNS TABLE (task_state text, instance_state orch8.instance_state, repeated boolean)
LANGUAGE plpgsql
AS $$
DECLARE
    v_inst orch8.task_instances;
    v_task orch8.worker_tasks;
    v_node orch8.execution_nodes;
    v_reason text;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);
    PERFORM orch8.require_size('output', 'params_bytes', octet_length(p_output::text));
    v_task := orch8.lock_worker_task(p_tenant_id, p_task_id);
    v_inst := orch8.load_instance(p_tenant_id, v_task.instance_id);
    IF v_task.state = 'completed' AND v_task.worker_id = p_worker_id
       AND v_task.claim_epoch = p_claim_epoch THEN
        -- this worker's own report again (its answer was lost): the same answer
        RETURN QUERY SELECT v_task.state, v_inst.state, true;
        RETURN;
    END IF;
    IF NOT orch8.holds_worker_task(v_task, p_worker_id, p_claim_epoch) THEN
        PERFORM orch8.refuse_worker_call(v_task, p_task_id, p_worker_id, p_claim_epoch);
    END IF;
    PERFORM set_config('orch8.task_actor', 'worker:' || p_worker_id, true);
    UPDATE orch8.worker_tasks AS w
    SET state = 'completed', result = CASE WHEN p_invalid IS NULL THEN 'ok' ELSE 'invalid_output' END,
        error = left(p_invalid, orch8.limit_of('error_chars')::integer),
        error_code = CASE WHEN p_invalid IS NOT NULL THEN 'output_schema' END,
        lease_expires_at = NULL, ended_at = orch8.now(), updated_at = orch8.now()
    WHERE w.tenant_id = p_tenant_id AND w.id = p_task_id;
    v_node := orch8.lock_node(p_tenant_id, v_task.instance_id, v_task.path);
    -- the receipt committed, the output recorded, the node completed and the tree moved
    -- on, exactly as a runner's finish_step does it
    v_reason := orch8.record_step_result(v_inst, v_node, v_task.attempt, v_task.effect_id,
        CASE WHEN p_invalid IS NULL THEN 'ok' ELSE 'invalid_output' END, p_output, p_invalid,
        NULL, CASE WHEN p_invalid IS NOT NULL THEN 'output_schema' END, NULL);
    RETURN QUERY SELECT 'completed'::text,
        orch8.sync_instance(p_tenant_id, v_task.instance_id, 'worker:' || p_worker_id,
            coalesce(v_reason, format('step %s completed by worker %s', v_task.path,
                                      p_worker_id))),
        false;
END
$$;

COMMENT ON FUNCTION orch8.complete_worker_task(text, uuid, text, bigint, jsonb, text) IS
'A worker''s success, in one transaction: fenced (holds_worker_task; else O8001, 409, '
'nothing changed), the task completed, and the step recorded as finish_step records a '
'runner''s (record_step_result): receipt committed (provider receipt id from the '
'output), output row, node completed (or failed when past its deadline), the tree moved '
'on, the instance synced (its audit row names the worker). p_invalid: the output breaks '
'the step''s output_schema (checked by the caller): committed, then the step fails. The '
'same worker repeating it with the same epoch gets the same answer (repeated true). '
'Output over params_bytes: O8008.';

CREATE OR REPLACE FUNCTION orch8.close_worker_task(
    p_inst orch8.task_instances,
    p_task orch8.worker_tasks,
    p_settled orch8.effect_outcome,
    p_actor text
)
RETURNS orch8.instance_state
LANGUAGE plpgsql
AS $$
DECLARE
    v_node orch8.execution_nodes := orch8.lock_node(p_inst.tenant_id, p_inst.id, p_task.path);
    v_reason text := coalesce(p_task.error, 'the worker failed');
BEGIN
    IF p_settled.outcome = 'stale' THEN
        -- someone moved the receipt while the task ran: the step stops, as in finish_step
        v_reason := format('EffectBlocked: %s', p_settled.detail);
        PERFORM orch8.fail_step(p_inst.tenant_id, p_inst.id, NULL, p_task.path, p_task.attempt,
            p_task.effect_id, jsonb_build_object('outcome', 'stale', 'effect_state',
                                                 p_settled.state, 'detail', p_settled.detail),
            v_reason);
    ELSIF v_node.cancel_requested THEN
        -- cancelled while it ran: nothing to decide
        IF p_settled.state = 'unknown' THEN
            PERFORM orch8.await_settlement(p_inst.tenant_id, p_inst.id, NULL, p_task.path,
                p_task.attempt, p_task.effect_id, v_reason);
        ELSE
            PERFORM orch8.end_node(p_inst, p_task.path, 'cancelled', NULL, NULL, NULL);
        END IF;
    ELSE
        -- a runner applies the step's retry rule (claim_work answers worker_result)
        UPDATE orch8.execution_nodes AS n
        SET state = 'ready', next_fire_at = orch8.now(), updated_at = orch8.now()
        WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id
          AND n.path = p_task.path;
        v_reason := format('step %s: %s; a runner decides what comes next', p_task.path,
                           v_reason);
    END IF;
    RETURN orch8.sync_instance(p_inst.tenant_id, p_inst.id, p_actor, v_reason);
END
$$;

COMMENT ON FUNCTION orch8.close_worker_task(
    orch8.task_instances, orch8.worker_tasks, orch8.effect_outcome, text
) IS
'The node of a task that failed or timed out, its receipt settled (internal helper of '
'fail_worker_task and sweep_worker_tasks): ready again, keeping worker_task_id, for a '
'runner to decide with the step''s retry rule (finish_step); when its branch or instance '
'was cancelled meanwhile, it ends there (an unknown receipt through await_settlement, '
'left in the unresolved queue); a receipt moved by someone else fails the step. Returns '
'the instance''s state.';

CREATE OR REPLACE FUNCTION orch8.fail_worker_task(
    p_tenant_id text,
    p_task_id uuid,
    p_worker_id text,
    p_claim_epoch bigint,
    p_error text,
    p_code text DEFAULT NULL,
    p_retryable boolean DEFAULT true,
    p_not_applied boolean DEFAULT false,
    p_evidence jsonb DEFAULT NULL
)
RETURNS TABLE (
    task_state text, receipt_state orch8.effect_state, instance_state orch8.instance_state,
    repeated boolean
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_inst orch8.task_instances;
    v_task orch8.worker_tasks;
    v_error text := left(coalesce(nullif(p_error, ''), 'the worker failed'),
                         orch8.limit_of('error_chars')::integer);
    v_settled orch8.effect_outcome;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);
    IF char_length(p_code) > 100 THEN
        RAISE EXCEPTION 'an error code is at most 100 characters'
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'code')::text;
    END IF;
    IF coalesce(p_not_applied, false)
       AND (jsonb_typeof(p_evidence) IS DISTINCT FROM 'object' OR p_evidence = '{}') THEN
        RAISE EXCEPTION 'not_applied needs evidence (a non-empty JSON object) that nothing '
                        'was sent'
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'evidence')::text;
    END IF;
    PERFORM orch8.require_size('evidence', 'evidence_bytes', octet_length(p_evidence::text));
    v_task := orch8.lock_worker_task(p_tenant_id, p_task_id);
    v_inst := orch8.load_instance(p_tenant_id, v_task.instance_id);
    IF v_task.state = 'failed' AND v_task.worker_id = p_worker_id
       AND v_task.claim_epoch = p_claim_epoch THEN
        RETURN QUERY SELECT v_task.state,
            (SELECT r.state FROM orch8.effect_receipts AS r
             WHERE r.tenant_id = p_tenant_id AND r.id = v_task.effect_id),
            v_inst.state, true;
        RETURN;
    END IF;
    IF NOT orch8.holds_worker_task(v_task, p_worker_id, p_claim_epoch) THEN
        PERFORM orch8.refuse_worker_call(v_task, p_task_id, p_worker_id, p_claim_epoch);
    END IF;
    -- the receipt first: unknown (it may have been sent), or abandoned on evidence
    v_settled := CASE
        WHEN coalesce(p_not_applied, false)
        THEN orch8.abandon_effect_not_applied(p_tenant_id, v_task.effect_id,
                 p_evidence || jsonb_build_object('error', v_error))
        ELSE orch8.mark_effect_unknown(p_tenant_id, v_task.effect_id, v_error)
    END;
    PERFORM set_config('orch8.task_actor', 'worker:' || p_worker_id, true);
    UPDATE orch8.worker_tasks AS w
    SET state = 'failed',
        result = CASE WHEN coalesce(p_not_applied, false) THEN 'not_applied' ELSE 'error' END,
        error = v_error, error_code = p_code, retryable = coalesce(p_retryable, true),
        evidence = CASE WHEN coalesce(p_not_applied, false) THEN p_evidence END,
        lease_expires_at = NULL, ended_at = orch8.now(), updated_at = orch8.now()
    WHERE w.tenant_id = p_tenant_id AND w.id = p_task_id
    RETURNING w.* INTO v_task;
    RETURN QUERY SELECT v_task.state, v_settled.state,
        orch8.close_worker_task(v_inst, v_task, v_settled, 'worker:' || p_worker_id), false;
END
$$;

COMMENT ON FUNCTION orch8.fail_worker_task(
    text, uuid, text, bigint, text, text, boolean, boolean, jsonb
) IS
'A worker''s failure: fenced (holds_worker_task; else O8001, 409, nothing changed); the '
'receipt first, unknown (it may have been sent) or, with p_not_applied and evidence (a '
'non-empty object, else O8008), abandoned; the task failed with the result, error, code '
'and retryable; then close_worker_task: a runner decides with the step''s retry rule '
'(backoff, retry_if, max_attempts, the ambiguity mode of an unknown receipt). The same '
'worker repeating it with the same epoch gets the same answer (repeated true).';

-- Sweeps ---------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.sweep_worker_tasks(p_limit integer DEFAULT 100)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_row record;
    v_inst orch8.task_instances;
    v_task orch8.worker_tasks;
    v_settled orch8.effect_outcome;
    v_error text;
    v_count integer := 0;
BEGIN
    PERFORM set_config('orch8.task_actor', 'worker-sweep', true);
    -- Leases that ran out. Rare and bounded: one task at a time, its instance locked with
    -- it, both skipped when busy.
    FOR v_row IN
        SELECT w.tenant_id, w.id, w.instance_id
        FROM orch8.worker_tasks AS w
        JOIN orch8.task_instances AS t ON t.tenant_id = w.tenant_id AND t.id = w.instance_id
        WHERE w.state = 'running' AND w.lease_expires_at < orch8.now()
        ORDER BY w.lease_expires_at
        LIMIT greatest(p_limit, 0)
        FOR UPDATE OF t, w SKIP LOCKED
    LOOP
        SELECT * INTO v_inst FROM orch8.task_instances AS t
        WHERE t.tenant_id = v_row.tenant_id AND t.id = v_row.instance_id;
        SELECT * INTO v_task FROM orch8.worker_tasks AS w
        WHERE w.tenant_id = v_row.tenant_id AND w.id = v_row.id;
        IF v_task.started_at IS NULL AND v_task.redeliver_unstarted THEN
            -- never confirmed, and its handler promises nothing is sent before it
            -- heartbeats: another worker may have it (the next claim fences this one)
            UPDATE orch8.worker_tasks AS w
            SET state = 'queued', worker_id = NULL, lease_ms = NULL, lease_expires_at = NULL,
                updated_at = orch8.now()
            WHERE w.tenant_id = v_row.tenant_id AND w.id = v_row.id;
            PERFORM pg_notify('orch8_tasks', json_build_object(
                'tenant', v_task.tenant_id, 'handler', v_task.handler)::text);
        ELSE
            -- the worker may have sent it: unknown, as for a runner that died mid-step
            v_error := format('outcome unknown: worker %s stopped heartbeating task %s (lease '
                              'ran out at %s)', v_task.worker_id, v_task.id,
                              v_task.lease_expires_at);
            PERFORM orch8.cas_effect_receipt(v_task.tenant_id, v_task.effect_id, 'dispatched',
                'unknown', jsonb_build_object(
                    'actor', 'worker-sweep', 'error', v_error,
                    'note', CASE WHEN v_task.started_at IS NULL
                                 THEN 'the worker''s lease ran out before it confirmed pickup'
                                 ELSE 'the worker''s lease ran out after it confirmed pickup'
                            END));
            UPDATE orch8.worker_tasks AS w
            SET state = 'blocked', result = 'error', error = v_error, retryable = false,
                lease_expires_at = NULL, ended_at = orch8.now(), updated_at = orch8.now()
            WHERE w.tenant_id = v_row.tenant_id AND w.id = v_row.id;
            UPDATE orch8.execution_nodes AS n SET worker_task_id = NULL
            WHERE n.tenant_id = v_task.tenant_id AND n.instance_id = v_task.instance_id
              AND n.path = v_task.path AND n.worker_task_id = v_task.id;
            IF found THEN  -- the node waited on it: the verifier, or an operator, settles it
                PERFORM orch8.await_settlement(v_task.tenant_id, v_task.instance_id, NULL,
                    v_task.path, v_task.attempt, v_task.effect_id, v_error);
            END IF;
            PERFORM orch8.sync_instance(v_task.tenant_id, v_task.instance_id, 'worker-sweep',
                                        v_error);
        END IF;
        v_count := v_count + 1;
    END LOOP;
    -- Past close_by (schedule-to-close): a timeout, decided by a runner like any failure
    FOR v_row IN
        SELECT w.tenant_id, w.id, w.instance_id
        FROM orch8.worker_tasks AS w
        JOIN orch8.task_instances AS t ON t.tenant_id = w.tenant_id AND t.id = w.instance_id
        WHERE w.state IN ('queued', 'running') AND w.close_by < orch8.now()
        ORDER BY w.close_by
        LIMIT greatest(p_limit, 0)
        FOR UPDATE OF t, w SKIP LOCKED
    LOOP
        SELECT * INTO v_inst FROM orch8.task_instances AS t
        WHERE t.tenant_id = v_row.tenant_id AND t.id = v_row.instance_id;
        SELECT * INTO v_task FROM orch8.worker_tasks AS w
        WHERE w.tenant_id = v_row.tenant_id AND w.id = v_row.id;
        IF v_task.state = 'queued' THEN
            v_error := format('no worker claimed it within %s s (its timeout)',
                              v_task.timeout_ms / 1000.0);
            v_settled := orch8.abandon_effect_not_applied(v_task.tenant_id, v_task.effect_id,
                jsonb_build_object('never_claimed', true, 'error', v_error,
                                   'task_id', v_task.id));
        ELSE
            v_error := format('timed out after %s s while worker %s held it',
                              v_task.timeout_ms / 1000.0, v_task.worker_id);
            v_settled := orch8.mark_effect_unknown(v_task.tenant_id, v_task.effect_id, v_error);
        END IF;
        UPDATE orch8.worker_tasks AS w
        SET state = 'timed_out',
            result = CASE WHEN v_task.state = 'queued' THEN 'not_applied' ELSE 'error' END,
            error = v_error, error_code = 'timeout', retryable = true,
            evidence = CASE WHEN v_task.state = 'queued'
                            THEN jsonb_build_object('never_claimed', true) END,
            lease_expires_at = NULL, ended_at = orch8.now(), updated_at = orch8.now()
        WHERE w.tenant_id = v_row.tenant_id AND w.id = v_row.id
        RETURNING w.* INTO v_task;
        PERFORM orch8.close_worker_task(v_inst, v_task, v_settled, 'worker-sweep');
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END
$$;

COMMENT ON FUNCTION orch8.sweep_worker_tasks(integer) IS
'Bounded sweep of worker tasks (claim_due_nodes runs it), each with its instance locked '
'(FOR UPDATE SKIP LOCKED): a running task whose lease ran out is queued again only when '
'its worker never heartbeated and its handler is registered redeliver_unstarted; '
'otherwise its receipt becomes unknown, the task blocked and the node goes to '
'await_settlement (its verifier, or blocked for an operator), as a crashed in-process '
'step. A task past close_by times out: never claimed -> receipt abandoned (evidence '
'never_claimed), result not_applied; running -> receipt unknown, result error; code '
'timeout either way, and a runner decides (close_worker_task). Returns how many tasks it '
'moved.';

CREATE OR REPLACE FUNCTION orch8.withdraw_worker_tasks(
    p_inst orch8.task_instances, p_path text, p_reason text
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_task orch8.worker_tasks;
BEGIN
    PERFORM set_config('orch8.task_actor', 'engine', true);
    FOR v_task IN
        SELECT w.* FROM orch8.execution_nodes AS n
        JOIN orch8.worker_tasks AS w ON w.tenant_id = n.tenant_id AND w.id = n.worker_task_id
        WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id
          AND n.worker_task_id IS NOT NULL AND n.state = 'waiting'
          AND orch8.in_subtree(n.path, p_path)
        ORDER BY w.id
        FOR UPDATE OF w
    LOOP
        IF v_task.state = 'queued' THEN
            -- no worker ever had it: nothing was sent
            UPDATE orch8.worker_tasks AS w
            SET state = 'cancelled', error = left(p_reason, orch8.limit_of('error_chars')::integer),
                ended_at = orch8.now(), updated_at = orch8.now()
            WHERE w.tenant_id = v_task.tenant_id AND w.id = v_task.id;
            PERFORM orch8.abandon_effect_not_applied(v_task.tenant_id, v_task.effect_id,
                jsonb_build_object('withdrawn', true, 'task_id', v_task.id, 'error',
                    'cancelled before any worker claimed it: ' || coalesce(p_reason, '')));
            UPDATE orch8.execution_nodes AS n SET worker_task_id = NULL
            WHERE n.tenant_id = v_task.tenant_id AND n.instance_id = v_task.instance_id
              AND n.path = v_task.path;
        ELSIF v_task.state = 'running' AND NOT v_task.cancel_requested THEN
            -- its worker hears it at its next heartbeat; its report is still recorded
            UPDATE orch8.worker_tasks AS w SET cancel_requested = true, updated_at = orch8.now()
            WHERE w.tenant_id = v_task.tenant_id AND w.id = v_task.id;
        END IF;
    END LOOP;
END
$$;

COMMENT ON FUNCTION orch8.withdraw_worker_tasks(orch8.task_instances, text, text) IS
'cancel_subtree''s helper: the worker tasks of the nodes at and below p_path. A queued '
'one is cancelled and its receipt abandoned (no worker ever had it: evidence withdrawn); '
'a running one is marked cancel_requested (the next heartbeat says so) and its node keeps '
'waiting for the report.';

-- Verifiers served by workers ------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.claim_worker_verifications(
    p_tenant_id text,
    p_worker_id text,
    p_verifiers text[],
    p_max integer DEFAULT 1,
    p_lease_ms integer DEFAULT 30000,
    p_handlers text[] DEFAULT NULL
)
RETURNS TABLE (
    effect_id uuid,
    method text,
    claim_token uuid,
    try_number integer,
    tries integer,
    lease_expires_at timestamptz,
    handler text,
    params jsonb,
    idempotency_key text,
    attempt integer,
    instance_id uuid,
    block_id text,
    receipt jsonb
)
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);
    PERFORM orch8.require_worker_call(p_worker_id, p_verifiers, p_max, p_lease_ms);
    RETURN QUERY
    WITH due AS (
        SELECT v.tenant_id, v.effect_id
        FROM orch8.effect_verifications AS v
        WHERE v.tenant_id = p_tenant_id AND v.state = 'pending' AND v.next_at <= orch8.now()
          AND v.tries < cardinality(v.schedule)
          AND ((v.method = 'handler' AND v.handler = ANY (p_verifiers))
               OR (v.method = 'replay' AND v.handler = ANY (p_handlers)))
          -- dispatched to a worker: the task kept the params as sent
          AND EXISTS (SELECT 1 FROM orch8.worker_tasks AS w
                      WHERE w.tenant_id = v.tenant_id AND w.effect_id = v.effect_id)
        ORDER BY v.next_at
        LIMIT p_max
        FOR UPDATE SKIP LOCKED
    ),
    claimed AS (
        -- the try counts now, as in claim_verifications: a worker that dies mid-try used it
        UPDATE orch8.effect_verifications AS v
        SET tries = v.tries + 1, lease_owner = p_worker_id, lease_token = gen_random_uuid(),
            lease_expires_at = orch8.now() + p_lease_ms * interval '1 millisecond',
            next_at = orch8.now() + p_lease_ms * interval '1 millisecond',
            updated_at = orch8.now()
        FROM due AS d
        WHERE v.tenant_id = d.tenant_id AND v.effect_id = d.effect_id
        RETURNING v.*
    )
    SELECT c.effect_id, c.method, c.lease_token, c.tries, cardinality(c.schedule),
           c.lease_expires_at,
           w.handler::text, w.params, r.idempotency_key::text, r.attempt::integer,
           r.instance_id, r.block_id::text,
           jsonb_build_object('id', r.id, 'state', r.state, 'kind', r.kind,
                              'provider_receipt_id', r.provider_receipt_id, 'error', r.error,
                              'evidence', r.evidence, 'created_at', r.created_at,
                              'updated_at', r.updated_at)
    FROM claimed AS c
    JOIN orch8.effect_receipts AS r ON r.tenant_id = c.tenant_id AND r.id = c.effect_id
    JOIN orch8.worker_tasks AS w ON w.tenant_id = c.tenant_id AND w.effect_id = c.effect_id
    ORDER BY c.next_at;
END
$$;

COMMENT ON FUNCTION orch8.claim_worker_verifications(
    text, text, text[], integer, integer, text[]
) IS
'A worker''s claim of verifier tries it can run: up to p_max due pending verifications of '
'the tenant, for receipts dispatched to workers: method handler (verify.handler) whose '
'handler is among p_verifiers, method replay (verify.replay: the handler called again '
'with the same idempotency key) whose handler is among p_handlers (FOR UPDATE SKIP '
'LOCKED; the try counted, a lease of p_lease_ms with a fresh claim token). Answers the '
'method, the receipt, the params as dispatched (from the task), the idempotency key, the '
'try and the tries. The verdict: record_worker_verdict.';

CREATE OR REPLACE FUNCTION orch8.record_worker_verdict(
    p_tenant_id text,
    p_effect_id uuid,
    p_worker_id text,
    p_claim_token uuid,
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
    v_answer record;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);
    PERFORM orch8.require_size('evidence', 'evidence_bytes', octet_length(p_evidence::text));
    PERFORM orch8.require_output_size(p_output);
    SELECT * INTO v_ver FROM orch8.effect_verifications AS v
    WHERE v.tenant_id = p_tenant_id AND v.effect_id = p_effect_id;
    IF v_ver.effect_id IS NULL THEN
        RAISE EXCEPTION 'no verification of receipt %', p_effect_id
            USING ERRCODE = 'O8007', DETAIL = json_build_object('effect_id', p_effect_id)::text;
    END IF;
    IF v_ver.state <> 'pending' OR v_ver.lease_owner IS DISTINCT FROM p_worker_id
       OR v_ver.lease_token IS DISTINCT FROM p_claim_token
       OR v_ver.lease_expires_at < orch8.now() THEN
        RAISE EXCEPTION 'worker % no longer holds the verification of receipt %', p_worker_id,
            p_effect_id
            USING ERRCODE = 'O8001',
                  DETAIL = json_build_object('effect_id', p_effect_id,
                                             'current_state', v_ver.state)::text,
                  HINT = 'another verifier or an operator owns it now';
    END IF;
    SELECT * INTO v_answer FROM orch8.record_verification(p_tenant_id, p_effect_id,
        p_claim_token, p_verdict, p_evidence, p_provider_receipt_id, p_output) AS a;
    IF v_answer.outcome = 'stale' THEN
        RAISE EXCEPTION 'the verdict on receipt % came too late: %', p_effect_id,
            v_answer.detail
            USING ERRCODE = 'O8001',
                  DETAIL = json_build_object('effect_id', p_effect_id)::text;
    END IF;
    RETURN QUERY SELECT v_answer.outcome, v_answer.instance_state, v_answer.detail;
END
$$;

COMMENT ON FUNCTION orch8.record_worker_verdict(
    text, uuid, text, uuid, text, jsonb, text, jsonb
) IS
'A worker''s verdict on a verifier try it claimed (claim_worker_verifications): fenced by '
'the worker id, the claim token and the try''s lease (else O8001, 409; no verification: '
'O8007), then record_verification (applied -> verified, not_applied -> abandoned, '
'inconclusive -> the next try or escalated; the instance goes on as the step says).';
