-- External workers (docs/ARCHITECTURE.md, "External workers"): handlers registered per
-- tenant are served by worker processes over the REST API. A worker step's receipt is
-- dispatched and its task queued in begin_step's one transaction; workers long-poll,
-- heartbeat and report, each call fenced by the worker id and the claim epoch. The moves
-- are in sql/functions/workers.sql.

-- Named sets and the task transition table ------------------------------------------------

CREATE FUNCTION orch8.worker_task_states()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT ARRAY['queued', 'running', 'completed', 'failed', 'timed_out', 'blocked', 'cancelled']
$$;

COMMENT ON FUNCTION orch8.worker_task_states() IS
'The states of a worker task: queued (its receipt is dispatched; no worker holds it), '
'running (a worker claimed it and holds its lease), completed (the worker reported '
'success: receipt committed), failed (the worker reported a failure: receipt unknown, or '
'abandoned when it applied nothing), timed_out (not closed by its close_by: receipt '
'abandoned when no worker ever had it, else unknown), blocked (its lease ran out after '
'the worker confirmed pickup: receipt unknown, for a verifier or an operator), cancelled '
'(withdrawn while queued: receipt abandoned).';

CREATE FUNCTION orch8.worker_task_can_transition(p_from text, p_to text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
    SELECT CASE p_from
        WHEN 'queued' THEN p_to IN ('running', 'timed_out', 'cancelled')
        WHEN 'running' THEN p_to IN ('queued', 'completed', 'failed', 'timed_out', 'blocked')
        ELSE false
    END
$$;

COMMENT ON FUNCTION orch8.worker_task_can_transition(text, text) IS
'The worker task transition table: queued->running (claimed)|timed_out (close_by passed, '
'never claimed)|cancelled (its instance or branch was cancelled); running->queued (its '
'lease ran out before any heartbeat, and its handler is registered redeliver_unstarted)|'
'completed|failed|timed_out|blocked (its lease ran out after a heartbeat). The other '
'states are final.';

CREATE VIEW orch8.worker_task_transitions AS
SELECT
    f.state AS from_state,
    t.state AS to_state
FROM unnest(orch8.worker_task_states()) AS f (state)
CROSS JOIN unnest(orch8.worker_task_states()) AS t (state)
WHERE orch8.worker_task_can_transition(f.state, t.state);

COMMENT ON VIEW orch8.worker_task_transitions IS
'Every allowed worker task move, one row each (generated from worker_task_can_transition).';

CREATE FUNCTION orch8.worker_task_event_kinds()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT ARRAY['queued', 'claimed', 'started', 'redelivered', 'cancel_requested',
                 'completed', 'failed', 'timed_out', 'blocked', 'cancelled']
$$;

COMMENT ON FUNCTION orch8.worker_task_event_kinds() IS
'What orch8.worker_task_events records: queued (the task was created), claimed (a worker '
'took it: a new epoch), started (its first heartbeat: pickup confirmed), redelivered '
'(queued again: its lease ran out before any heartbeat), cancel_requested (its instance '
'or branch was cancelled while it ran), and each final state.';

-- Registrations -------------------------------------------------------------------------

CREATE TABLE orch8.worker_handlers (
    tenant_id text NOT NULL CHECK (tenant_id <> ''),
    handler orch8.identifier NOT NULL,
    queue orch8.identifier NOT NULL DEFAULT 'default',
    timeout_ms bigint NOT NULL DEFAULT 300000 CHECK (timeout_ms BETWEEN 1000 AND 31622400000),
    redeliver_unstarted boolean NOT NULL DEFAULT false,
    created_by text NOT NULL,
    updated_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    updated_at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, handler)
);

COMMENT ON TABLE orch8.worker_handlers IS
'The handlers a tenant''s external workers serve: a step naming one is dispatched as a '
'worker task by begin_step instead of running in a runner. Written only by '
'register_worker_handler and unregister_worker_handler.';
COMMENT ON COLUMN orch8.worker_handlers.tenant_id IS 'The tenant whose steps it serves.';
COMMENT ON COLUMN orch8.worker_handlers.handler IS 'The handler name steps use.';
COMMENT ON COLUMN orch8.worker_handlers.queue IS
'The queue its tasks go to; a poll may ask for one queue.';
COMMENT ON COLUMN orch8.worker_handlers.timeout_ms IS
'How long a task may take from queued to closed (schedule-to-close) when its step '
'declares no timeout.';
COMMENT ON COLUMN orch8.worker_handlers.redeliver_unstarted IS
'Whether a task whose lease ran out before its worker''s first heartbeat is queued again '
'for another worker (the handler promises it sends nothing before it heartbeats); '
'otherwise such a task blocks like any other (its receipt unknown).';
COMMENT ON COLUMN orch8.worker_handlers.created_by IS 'Who registered it.';
COMMENT ON COLUMN orch8.worker_handlers.updated_by IS 'Who last changed it.';
COMMENT ON COLUMN orch8.worker_handlers.created_at IS 'When it was registered.';
COMMENT ON COLUMN orch8.worker_handlers.updated_at IS 'When it last changed.';

-- Tasks ---------------------------------------------------------------------------------

CREATE TABLE orch8.worker_tasks (
    tenant_id text NOT NULL,
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    instance_id uuid NOT NULL,
    path text NOT NULL,
    attempt integer NOT NULL CHECK (attempt >= 0),
    effect_id uuid NOT NULL,
    handler orch8.identifier NOT NULL,
    queue orch8.identifier NOT NULL,
    params jsonb NOT NULL,
    idempotency_key text NOT NULL,
    priority integer NOT NULL DEFAULT 0,
    state text NOT NULL DEFAULT 'queued' CHECK (state = any(orch8.worker_task_states())),
    claim_epoch bigint NOT NULL DEFAULT 0 CHECK (claim_epoch >= 0),
    worker_id text,
    lease_ms integer CHECK (lease_ms > 0),
    lease_expires_at timestamptz,
    claimed_at timestamptz,
    started_at timestamptz,
    heartbeat_at timestamptz,
    checkpoint jsonb,
    timeout_ms bigint NOT NULL CHECK (timeout_ms > 0),
    close_by timestamptz NOT NULL,
    redeliver_unstarted boolean NOT NULL,
    cancel_requested boolean NOT NULL DEFAULT false,
    result text CHECK (result IN ('ok', 'invalid_output', 'error', 'not_applied')),
    error text,
    error_code text,
    retryable boolean,
    evidence jsonb,
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    updated_at timestamptz NOT NULL DEFAULT orch8.now(),
    ended_at timestamptz,
    PRIMARY KEY (tenant_id, id),
    FOREIGN KEY (tenant_id, instance_id) REFERENCES orch8.task_instances (tenant_id, id),
    FOREIGN KEY (tenant_id, effect_id) REFERENCES orch8.effect_receipts (tenant_id, id),
    -- a lease exists only on a running task, and a running task has a worker and a lease
    CHECK ((state = 'running') = (lease_expires_at IS NOT NULL)),
    CHECK (state <> 'running' OR (worker_id IS NOT NULL AND lease_ms IS NOT NULL)),
    CHECK ((state IN ('queued', 'running')) = (ended_at IS NULL))
) WITH (fillfactor = 80);

COMMENT ON TABLE orch8.worker_tasks IS
'One row per dispatch of a worker step (per receipt): created queued by begin_step in the '
'transaction that moved its receipt to dispatched, claimed by a worker''s poll, closed by '
'its report or a sweep. Moves only along worker_task_can_transition (trigger), each '
'recorded in worker_task_events; never deleted.';
COMMENT ON COLUMN orch8.worker_tasks.tenant_id IS 'The tenant; workers see only their own.';
COMMENT ON COLUMN orch8.worker_tasks.id IS 'The task id workers call back with.';
COMMENT ON COLUMN orch8.worker_tasks.instance_id IS 'The instance whose step it is.';
COMMENT ON COLUMN orch8.worker_tasks.path IS 'The step''s node path (the ledger''s block_id).';
COMMENT ON COLUMN orch8.worker_tasks.attempt IS 'The step''s attempt: one task per attempt.';
COMMENT ON COLUMN orch8.worker_tasks.effect_id IS
'The receipt, dispatched while the task is queued or running; one task per receipt.';
COMMENT ON COLUMN orch8.worker_tasks.handler IS 'The registered handler that serves it.';
COMMENT ON COLUMN orch8.worker_tasks.queue IS 'The handler''s queue when it was dispatched.';
COMMENT ON COLUMN orch8.worker_tasks.params IS
'The step''s params as rendered by the runner: what the worker receives (stored, so a '
'secret rendered into them is stored too).';
COMMENT ON COLUMN orch8.worker_tasks.idempotency_key IS
'The receipt''s idempotency key, for the worker to hand to the provider.';
COMMENT ON COLUMN orch8.worker_tasks.priority IS 'The step node''s priority (claimed first).';
COMMENT ON COLUMN orch8.worker_tasks.state IS 'One of orch8.worker_task_states().';
COMMENT ON COLUMN orch8.worker_tasks.claim_epoch IS
'How many times it was claimed: every callback names it, and only the latest claim''s '
'callbacks are accepted.';
COMMENT ON COLUMN orch8.worker_tasks.worker_id IS 'The worker of the latest claim.';
COMMENT ON COLUMN orch8.worker_tasks.lease_ms IS 'The lease the latest claim asked for.';
COMMENT ON COLUMN orch8.worker_tasks.lease_expires_at IS
'While running: when the lease runs out unless a heartbeat extends it.';
COMMENT ON COLUMN orch8.worker_tasks.claimed_at IS 'When the latest claim was made.';
COMMENT ON COLUMN orch8.worker_tasks.started_at IS
'The latest claim''s first heartbeat (pickup confirmed); NULL until then.';
COMMENT ON COLUMN orch8.worker_tasks.heartbeat_at IS 'The latest heartbeat.';
COMMENT ON COLUMN orch8.worker_tasks.checkpoint IS
'What the worker last saved with a heartbeat (at most worker_checkpoint_bytes); handed '
'to the next attempt of the same step.';
COMMENT ON COLUMN orch8.worker_tasks.timeout_ms IS
'Schedule-to-close: the step''s timeout, else its handler''s timeout_ms.';
COMMENT ON COLUMN orch8.worker_tasks.close_by IS
'created_at + timeout_ms: a task still open then times out.';
COMMENT ON COLUMN orch8.worker_tasks.redeliver_unstarted IS
'Its handler''s redeliver_unstarted when it was dispatched.';
COMMENT ON COLUMN orch8.worker_tasks.cancel_requested IS
'Its instance or branch was cancelled while it ran: the next heartbeat says so.';
COMMENT ON COLUMN orch8.worker_tasks.result IS
'What its report (or a sweep) came to, as finish_step''s result: ok, invalid_output, '
'error or not_applied.';
COMMENT ON COLUMN orch8.worker_tasks.error IS 'The reported (or swept) error.';
COMMENT ON COLUMN orch8.worker_tasks.error_code IS
'The reported error code (matched against retry.non_retryable_codes), or timeout.';
COMMENT ON COLUMN orch8.worker_tasks.retryable IS 'Whether the failure may be retried.';
COMMENT ON COLUMN orch8.worker_tasks.evidence IS
'not_applied: the evidence that nothing was sent (kept on the receipt too).';
COMMENT ON COLUMN orch8.worker_tasks.created_at IS 'When it was queued.';
COMMENT ON COLUMN orch8.worker_tasks.updated_at IS 'Its latest change.';
COMMENT ON COLUMN orch8.worker_tasks.ended_at IS 'When it reached a final state.';

CREATE UNIQUE INDEX worker_tasks_effect_idx ON orch8.worker_tasks (tenant_id, effect_id);
-- the poll: a tenant's queued tasks of some handlers, priority then age
CREATE INDEX worker_tasks_queued_idx ON orch8.worker_tasks (
    tenant_id, handler, priority DESC, created_at
) WHERE state = 'queued';
-- the sweeps: leases run out, close_by passed
CREATE INDEX worker_tasks_lease_idx ON orch8.worker_tasks (lease_expires_at)
WHERE state = 'running';
CREATE INDEX worker_tasks_close_idx ON orch8.worker_tasks (close_by)
WHERE state IN ('queued', 'running');
-- a step's tasks (an earlier attempt's checkpoint), an instance's tasks
CREATE INDEX worker_tasks_instance_idx ON orch8.worker_tasks (tenant_id, instance_id, path);
-- the operator's list, newest first
CREATE INDEX worker_tasks_created_idx ON orch8.worker_tasks (tenant_id, created_at DESC, id);

CREATE TABLE orch8.worker_task_events (
    tenant_id text NOT NULL,
    task_id uuid NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    event text NOT NULL CHECK (event = any(orch8.worker_task_event_kinds())),
    from_state text,
    to_state text NOT NULL,
    claim_epoch bigint NOT NULL,
    worker_id text,
    detail jsonb,
    actor text NOT NULL,
    db_user text NOT NULL DEFAULT session_user,
    api_key_id uuid,
    recorded_at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, task_id, seq),
    FOREIGN KEY (tenant_id, task_id) REFERENCES orch8.worker_tasks (tenant_id, id)
);

COMMENT ON TABLE orch8.worker_task_events IS
'Append-only: every move of a worker task (and its first heartbeat, and a cancel asked '
'while it ran), written by a trigger on worker_tasks whoever moves it. Never updated or '
'deleted.';
COMMENT ON COLUMN orch8.worker_task_events.tenant_id IS 'The task''s tenant.';
COMMENT ON COLUMN orch8.worker_task_events.task_id IS 'The task.';
COMMENT ON COLUMN orch8.worker_task_events.seq IS 'Order of the events.';
COMMENT ON COLUMN orch8.worker_task_events.event IS
'One of orch8.worker_task_event_kinds().';
COMMENT ON COLUMN orch8.worker_task_events.from_state IS 'The state before (NULL: created).';
COMMENT ON COLUMN orch8.worker_task_events.to_state IS 'The state after.';
COMMENT ON COLUMN orch8.worker_task_events.claim_epoch IS 'The task''s epoch after the move.';
COMMENT ON COLUMN orch8.worker_task_events.worker_id IS
'The worker holding the task after the move (for a close: the one that held it).';
COMMENT ON COLUMN orch8.worker_task_events.detail IS
'The result, error, code and evidence of a close; the lease of a claim.';
COMMENT ON COLUMN orch8.worker_task_events.actor IS
'Who moved it (attributed_actor: the sealed API key for a worker''s call, the runner''s '
'id for a sweep).';
COMMENT ON COLUMN orch8.worker_task_events.db_user IS
'The PostgreSQL login that recorded it (session_user); no caller can set it.';
COMMENT ON COLUMN orch8.worker_task_events.api_key_id IS
'The API key sealed into the transaction (a worker''s or an operator''s), if any.';
COMMENT ON COLUMN orch8.worker_task_events.recorded_at IS 'When (orch8.now()).';

CREATE TRIGGER worker_task_events_append_only
BEFORE UPDATE OR DELETE ON orch8.worker_task_events
FOR EACH ROW EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TRIGGER worker_task_events_no_truncate
BEFORE TRUNCATE ON orch8.worker_task_events
FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE FUNCTION orch8.worker_tasks_guard()
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

CREATE TRIGGER worker_tasks_guard
BEFORE UPDATE OR DELETE ON orch8.worker_tasks
FOR EACH ROW EXECUTE FUNCTION orch8.worker_tasks_guard();

CREATE TRIGGER worker_tasks_no_truncate
BEFORE TRUNCATE ON orch8.worker_tasks
FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE FUNCTION orch8.worker_tasks_record_event()
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

CREATE TRIGGER worker_tasks_record_event
AFTER INSERT OR UPDATE ON orch8.worker_tasks
FOR EACH ROW EXECUTE FUNCTION orch8.worker_tasks_record_event();

-- The node a worker task serves -------------------------------------------------------------

ALTER TABLE orch8.execution_nodes
ADD COLUMN worker_task_id uuid;

COMMENT ON COLUMN orch8.execution_nodes.worker_task_id IS
'The worker task of a step node dispatched to external workers: set while the task is '
'queued or running (the node waits) and while the runner decides what its failure or '
'timeout means (the node is ready, then leased); cleared when the node moves on or ends.';

-- A node that ends lets go of its task (one place, whoever ends it).
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

CREATE OR REPLACE FUNCTION orch8.wait_reasons()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['time', 'signal', 'input', 'child', 'verification', 'worker'] $$;

COMMENT ON FUNCTION orch8.wait_reasons() IS
'What a waiting node waits for (orch8.waiting_nodes.waiting_for): time (a sleep), signal '
'(a wait_for_signal), input (a person, wait_for_input), child (a sub_sequence''s '
'instance), verification (a verifier settling the step''s receipt), worker (an external '
'worker running the step''s task).';

-- A paused instance whose work ends while it is paused (a sleep or a wait that was its
-- last block, a worker's report of its last step) completes: before, the move was refused,
-- which aborted the claim that fired the timer, and with it every runner's claim.
CREATE OR REPLACE FUNCTION orch8.instance_can_transition(
    p_from orch8.instance_state, p_to orch8.instance_state
)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
    SELECT CASE p_from
        WHEN 'scheduled' THEN p_to IN (
            'running', 'waiting', 'paused', 'completed', 'failed', 'cancelled')
        WHEN 'running' THEN p_to IN (
            'scheduled', 'waiting', 'paused', 'completed', 'failed', 'cancelled'
        )
        WHEN 'waiting' THEN p_to IN (
            'scheduled', 'running', 'paused', 'completed', 'failed', 'cancelled')
        WHEN 'paused' THEN p_to IN ('scheduled', 'waiting', 'completed', 'failed', 'cancelled')
        WHEN 'failed' THEN p_to IN ('scheduled', 'waiting', 'completed')
        ELSE false
    END
$$;

COMMENT ON FUNCTION orch8.instance_can_transition(orch8.instance_state, orch8.instance_state) IS
'The instance transition table (an instance''s state sums up its execution tree, '
'sync_instance): scheduled->running|waiting|paused|completed|failed|cancelled; '
'running->scheduled|waiting|paused|completed|failed|cancelled; waiting->scheduled|running '
'(a node whose child ended is claimed)|paused|completed|failed|cancelled; '
'paused->scheduled|waiting|completed (its last block ended while it was paused: a timer, '
'a signal, an external worker''s report)|failed|cancelled; failed->scheduled|waiting|'
'completed (an operator''s retry; completed when the last step is settled from evidence). '
'completed and cancelled are final.';

-- the running tasks of a handler, counted for orch8.worker_handler_status
CREATE INDEX worker_tasks_running_idx ON orch8.worker_tasks (tenant_id, handler)
WHERE state = 'running';

-- A step waiting on a worker task holds its concurrency slot: its effect is in flight.
DROP INDEX orch8.execution_nodes_concurrency_idx;
CREATE INDEX execution_nodes_concurrency_idx ON orch8.execution_nodes (
    tenant_id, concurrency_key
)
WHERE (lease_token IS NOT NULL OR worker_task_id IS NOT NULL) AND concurrency_key IS NOT NULL;

-- begin_step learns whether its caller can run the handler; claim_work answers a worker's
-- result: both change signature, and sql/functions re-creates them.
DROP FUNCTION IF EXISTS orch8.begin_step(text, uuid, uuid, text, text, jsonb, integer);
DROP FUNCTION IF EXISTS orch8.claim_work(text, integer, interval);

-- Tenants and privileges (as migration 0010 does for every tenant table) -------------------

SELECT orch8.enable_tenant_isolation('orch8.worker_handlers');
SELECT orch8.enable_tenant_isolation('orch8.worker_tasks');
SELECT orch8.enable_tenant_isolation('orch8.worker_task_events');

REVOKE ALL ON orch8.worker_handlers, orch8.worker_tasks, orch8.worker_task_events FROM public;
GRANT SELECT ON orch8.worker_handlers, orch8.worker_tasks, orch8.worker_task_events
TO orch8_web, orch8_runner, orch8_auditor;
GRANT SELECT ON orch8.worker_task_transitions TO orch8_web, orch8_runner, orch8_auditor;
GRANT SELECT, INSERT, UPDATE, DELETE ON orch8.worker_handlers TO orch8_ledger;
GRANT SELECT, INSERT, UPDATE ON orch8.worker_tasks TO orch8_ledger;
GRANT SELECT, INSERT ON orch8.worker_task_events TO orch8_ledger;

INSERT INTO orch8.function_access (name, access) VALUES
('register_worker_handler', 'web'),
('unregister_worker_handler', 'web'),
('claim_worker_tasks', 'web'),
('heartbeat_worker_task', 'web'),
('complete_worker_task', 'web'),
('fail_worker_task', 'web'),
('claim_worker_verifications', 'web'),
('record_worker_verdict', 'web'),
('record_step_result', 'private'),
('dispatch_worker_task', 'private'),
('close_worker_task', 'private'),
('sweep_worker_tasks', 'private'),
('withdraw_worker_tasks', 'private'),
('lock_worker_task', 'private'),
('refuse_worker_call', 'private'),
('worker_tasks_guard', 'private'),
('worker_tasks_record_event', 'private')
ON CONFLICT (name) DO UPDATE SET access = excluded.access;
