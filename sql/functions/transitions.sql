-- Repeatable: the state machines, one function each: which moves a receipt, an instance,
-- an execution node and a worker's task may make. The guards (triggers.sql) and the
-- functions that move rows ask them on every write, so they are written to be inlined
-- into the calling expression: SQL, one CASE, not STRICT (the planner does not inline a
-- STRICT function whose body is a CASE), NULL in giving NULL out all the same. Called
-- as functions instead they cost a planning each, about 0.3 ms of every guarded step.
-- Migrations 0002, 0003, 0009, 0012, 0013 and 0019 hold their earlier versions.

CREATE OR REPLACE FUNCTION orch8.can_transition_to(
    p_from orch8.effect_state, p_to orch8.effect_state
)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
CALLED ON NULL INPUT
PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_from IS NULL OR p_to IS NULL THEN NULL ELSE CASE p_from
        WHEN 'planned' THEN p_to IN ('prepared', 'abandoned')
        WHEN 'prepared' THEN p_to IN ('dispatched', 'abandoned')
        WHEN 'dispatched' THEN p_to IN ('committed', 'unknown')
        WHEN 'unknown' THEN p_to IN ('verified', 'committed', 'compensated', 'abandoned')
        WHEN 'committed' THEN p_to = 'compensated'
        WHEN 'verified' THEN p_to = 'compensated'
        ELSE false
    END END
$$;

COMMENT ON FUNCTION orch8.can_transition_to(orch8.effect_state, orch8.effect_state) IS
'The receipt transition table: planned->prepared|abandoned; '
'prepared->dispatched|abandoned; dispatched->committed|unknown; '
'unknown->verified|committed|compensated|abandoned; committed|verified->compensated. '
'Nothing else; unknown never returns to dispatched. Enforced on every write by the '
'trigger on orch8.effect_receipts.';

CREATE OR REPLACE FUNCTION orch8.instance_can_transition(
    p_from orch8.instance_state, p_to orch8.instance_state
)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
CALLED ON NULL INPUT
PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_from IS NULL OR p_to IS NULL THEN NULL ELSE CASE p_from
        WHEN 'scheduled' THEN p_to IN (
            'running', 'waiting', 'paused', 'completed', 'failed', 'cancelled')
        WHEN 'running' THEN p_to IN (
            'scheduled', 'waiting', 'paused', 'completed', 'failed', 'cancelled')
        WHEN 'waiting' THEN p_to IN (
            'scheduled', 'running', 'paused', 'completed', 'failed', 'cancelled')
        WHEN 'paused' THEN p_to IN ('scheduled', 'waiting', 'completed', 'failed', 'cancelled')
        WHEN 'failed' THEN p_to IN ('scheduled', 'waiting', 'completed')
        ELSE false
    END END
$$;

COMMENT ON FUNCTION orch8.instance_can_transition(orch8.instance_state, orch8.instance_state) IS
'The instance transition table (an instance''s state sums up its execution tree, '
'sync_instance): scheduled->running|waiting|paused|completed|failed|cancelled; '
'running->scheduled|waiting|paused|completed|failed|cancelled; waiting->scheduled|running'
' (a node whose child ended is claimed)|paused|completed|failed|cancelled; '
'paused->scheduled|waiting|completed (its last block ended while it was paused: a timer, '
'a signal, an external worker''s report)|failed|cancelled; '
'failed->scheduled|waiting|completed (an operator''s retry; completed when the last step '
'is settled from evidence). completed and cancelled are final.';

CREATE OR REPLACE FUNCTION orch8.node_can_transition(
    p_from orch8.node_state, p_to orch8.node_state
)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
CALLED ON NULL INPUT
PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_from IS NULL OR p_to IS NULL THEN NULL ELSE CASE p_from
        WHEN 'ready' THEN p_to IN ('running', 'cancelled')
        WHEN 'running' THEN p_to IN (
            'ready', 'waiting', 'blocked', 'completed', 'failed', 'skipped', 'cancelled')
        WHEN 'waiting' THEN p_to IN (
            'ready', 'running', 'blocked', 'completed', 'failed', 'cancelled')
        WHEN 'blocked' THEN p_to IN ('ready', 'waiting', 'completed', 'failed', 'cancelled')
        WHEN 'failed' THEN p_to IN ('ready', 'running', 'completed')
        WHEN 'cancelled' THEN p_to IN ('ready', 'running', 'waiting', 'blocked')
        ELSE false
    END END
$$;

COMMENT ON FUNCTION orch8.node_can_transition(orch8.node_state, orch8.node_state) IS
'The node transition table: ready->running|cancelled; running->ready (a retry''s backoff,'
' a lease handed back or expired)|waiting|blocked|completed|failed|skipped|cancelled; '
'waiting->ready|running (a wait that timed out runs its '
'on_timeout)|blocked|completed|failed|cancelled; '
'blocked->ready|waiting|completed|failed|cancelled (settled by a verifier or an '
'operator); failed->ready|running|completed (an operator''s retry); '
'cancelled->ready|running|waiting|blocked (a retry restores what the failure it undoes '
'had cancelled). completed and skipped are final.';

CREATE OR REPLACE FUNCTION orch8.worker_task_can_transition(
    p_from text, p_to text
)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
CALLED ON NULL INPUT
PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_from IS NULL OR p_to IS NULL THEN NULL ELSE CASE p_from
        WHEN 'queued' THEN p_to IN ('running', 'timed_out', 'cancelled')
        WHEN 'running' THEN p_to IN ('queued', 'completed', 'failed', 'timed_out', 'blocked')
        ELSE false
    END END
$$;

COMMENT ON FUNCTION orch8.worker_task_can_transition(text, text) IS
'The worker task transition table: queued->running (claimed)|timed_out (close_by passed, '
'never claimed)|cancelled (its instance or branch was cancelled); running->queued (its '
'lease ran out before any heartbeat, and its handler is registered '
'redeliver_unstarted)|completed|failed|timed_out|blocked (its lease ran out after a '
'heartbeat). The other states are final.';
