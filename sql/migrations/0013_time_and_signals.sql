-- Time, signals and people (docs/ARCHITECTURE.md, "Time, signals and people"): a wait is
-- a waiting node with a timer (wake_at) that the database fires; signals are consumed
-- once, under the instance's row lock, by the wait that reads them; a person's answer
-- completes a wait_for_input node. The interpreter is sql/functions/tree.sql and
-- waits.sql.

-- Nodes that wait, and their timers ------------------------------------------------------

ALTER TABLE orch8.execution_nodes ADD COLUMN wake_at timestamptz;

COMMENT ON COLUMN orch8.execution_nodes.wake_at IS
'A waiting node''s timer: when a sleep ends or a wait times out (fire_timers). NULL when '
'the node waits for nothing timed.';

-- The timer sweep (fire_timers, run by every claim).
CREATE INDEX execution_nodes_timer_idx ON orch8.execution_nodes (wake_at)
WHERE state = 'waiting' AND wake_at IS NOT NULL;

CREATE OR REPLACE FUNCTION orch8.node_kinds()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT ARRAY['sequence', 'step', 'compensation', 'parallel', 'race', 'loop', 'for_each',
                 'router', 'try_catch', 'saga', 'undo', 'sub_sequence', 'sleep',
                 'wait_for_signal', 'wait_for_input']
$$;

COMMENT ON FUNCTION orch8.node_kinds() IS
'What a node executes: sequence (a list of blocks: the root, a branch, an iteration, a '
'part of try_catch, a route, on_failure, on_cancel, a wait''s on_timeout), a block type '
'(step, parallel, race, loop, for_each, router, try_catch, saga, sub_sequence, sleep, '
'wait_for_signal, wait_for_input), undo (a saga''s compensations) or compensation (one '
'of them).';

CREATE OR REPLACE FUNCTION orch8.claimable_kinds()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT ARRAY['step', 'compensation', 'loop', 'for_each', 'router', 'sub_sequence',
                 'wait_for_input']
$$;

COMMENT ON FUNCTION orch8.claimable_kinds() IS
'The node kinds a runner claims and answers: a step or compensation (begin_step, '
'finish_step), a loop, for_each or router (decide), a sub_sequence (run_child), a '
'wait_for_input (await_input: the runner renders its prompt). A sleep and a '
'wait_for_signal start waiting in SQL and are never claimed.';

-- A waiting composite may go on running its on_timeout blocks (waiting -> running).
CREATE OR REPLACE FUNCTION orch8.node_can_transition(p_from orch8.node_state, p_to orch8.node_state)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
    SELECT CASE p_from
        WHEN 'ready' THEN p_to IN ('running', 'cancelled')
        WHEN 'running' THEN p_to IN (
            'ready', 'waiting', 'blocked', 'completed', 'failed', 'skipped', 'cancelled')
        WHEN 'waiting' THEN p_to IN (
            'ready', 'running', 'blocked', 'completed', 'failed', 'cancelled')
        WHEN 'blocked' THEN p_to IN ('ready', 'waiting', 'completed', 'failed', 'cancelled')
        WHEN 'failed' THEN p_to IN ('ready', 'running', 'completed')
        WHEN 'cancelled' THEN p_to IN ('ready', 'running', 'waiting', 'blocked')
        ELSE false
    END
$$;

COMMENT ON FUNCTION orch8.node_can_transition(orch8.node_state, orch8.node_state) IS
'The node transition table: ready->running|cancelled; running->ready (a retry''s backoff, '
'a lease handed back or expired)|waiting|blocked|completed|failed|skipped|cancelled; '
'waiting->ready|running (a wait that timed out runs its on_timeout)|blocked|completed|'
'failed|cancelled; blocked->ready|waiting|completed|failed|cancelled (settled by a '
'verifier or an operator); failed->ready|running|completed (an operator''s retry); '
'cancelled->ready|running|waiting|blocked (a retry restores what the failure it undoes '
'had cancelled). completed and skipped are final.';

CREATE OR REPLACE FUNCTION orch8.block_containers()
RETURNS TABLE (type text, field text, shape text, binds text)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
ROWS 15
AS $$
    VALUES
    ('definition', 'blocks', 'list', NULL),
    ('definition', 'on_failure', 'list', 'error'),
    ('definition', 'on_cancel', 'list', NULL),
    ('parallel', 'branches', 'lists', NULL),
    ('race', 'branches', 'lists', NULL),
    ('loop', 'body', 'list', 'iteration'),
    ('for_each', 'body', 'list', 'item'),
    ('router', 'routes', 'routes', NULL),
    ('router', 'default', 'list', NULL),
    ('try_catch', 'try_block', 'list', NULL),
    ('try_catch', 'catch_block', 'list', 'error'),
    ('try_catch', 'finally_block', 'list', 'error'),
    ('saga', 'blocks', 'list', NULL),
    ('wait_for_signal', 'on_timeout', 'list', NULL),
    ('wait_for_input', 'on_timeout', 'list', NULL)
$$;

COMMENT ON FUNCTION orch8.block_containers() IS
'Where blocks hold blocks: per type (definition for the top level) the field and its '
'shape (list: an array of blocks; lists: an array of arrays, the branches; routes: an '
'array of {condition, blocks}), and the variables the field binds for the blocks inside '
'(item: a for_each''s item_var and index_var; iteration: a loop''s count; error: the '
'failure being handled). The one description of the tree''s shape: the validator, the '
'walker and the runner (rules.py) read it.';

-- The limit wait_ms is in sql/functions/limits.sql.


CREATE FUNCTION orch8.wait_reasons()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['time', 'signal', 'input', 'child', 'verification'] $$;

COMMENT ON FUNCTION orch8.wait_reasons() IS
'What a waiting node waits for (orch8.waiting_nodes.waiting_for): time (a sleep), signal '
'(a wait_for_signal), input (a person, wait_for_input), child (a sub_sequence''s '
'instance), verification (a verifier settling the step''s receipt).';

-- Signals, consumed once -----------------------------------------------------------------

CREATE FUNCTION orch8.builtin_signals()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['cancel', 'pause', 'resume', 'update_context', 'input'] $$;

COMMENT ON FUNCTION orch8.builtin_signals() IS
'The signal names the engine acts on itself: cancel, pause, resume, update_context (merge '
'the payload into the instance''s data) and input (an answer to a wait_for_input, '
'recorded by answer_input and never sent). Any other orch8.signal_type is a custom '
'signal for a wait_for_signal block.';

ALTER TABLE orch8.instance_signals
ADD COLUMN idempotency_key text
CHECK (octet_length(idempotency_key) BETWEEN 1 AND 256),
ADD COLUMN consumed_by text,
ADD COLUMN consumed_at timestamptz,
ADD CONSTRAINT instance_signals_consumed_check
CHECK ((consumed_by IS NULL) = (consumed_at IS NULL));

COMMENT ON TABLE orch8.instance_signals IS
'Signals sent to instances, never deleted: cancel, pause, resume and update_context act '
'at once (a running instance''s pause or cancel at its next step boundary); any other '
'name is a custom signal, consumed by exactly one wait_for_signal node of that name '
'(consumed_by, consumed_at, outcome consumed) or kept pending until one starts.';
COMMENT ON COLUMN orch8.instance_signals.idempotency_key IS
'The sender''s key: a second signal with the same key to the same instance acts on '
'nothing and answers the first one.';
COMMENT ON COLUMN orch8.instance_signals.consumed_by IS
'The path of the wait_for_signal node that consumed the signal.';
COMMENT ON COLUMN orch8.instance_signals.consumed_at IS
'When the signal was consumed (orch8.now() of that transaction).';
COMMENT ON COLUMN orch8.instance_signals.outcome IS
'What the signal did: the state a built-in left (cancelled, paused, scheduled...), '
'context_updated, consumed, or pending (a custom signal no wait has read yet).';

CREATE UNIQUE INDEX instance_signals_idempotency_idx
ON orch8.instance_signals (tenant_id, instance_id, idempotency_key)
WHERE idempotency_key IS NOT NULL;

-- The wait that starts finds its signal.
CREATE INDEX instance_signals_pending_idx
ON orch8.instance_signals (tenant_id, instance_id, signal_type, id)
WHERE outcome = 'pending';

-- update_context: runners learn that the context changed from the version -----------------

ALTER TABLE orch8.task_instances ADD COLUMN context_version integer NOT NULL DEFAULT 0;

COMMENT ON COLUMN orch8.task_instances.context_version IS
'Bumped by every update_context signal; every tree_answer carries it, so a runner '
'holding an older context reads the new one before its next block.';

ALTER TYPE orch8.tree_answer ADD ATTRIBUTE context_version integer;

-- Signatures that change ---------------------------------------------------------------------

DROP FUNCTION IF EXISTS orch8.send_signal(text, uuid, text, jsonb, text);
DROP FUNCTION IF EXISTS orch8.claim_work(text, integer, interval);

INSERT INTO orch8.function_access (name, access) VALUES
('answer_input', 'web'),
('fire_timers', 'private'),
('timer_fired', 'private'),
('start_wait', 'private'),
('consume_signal', 'private'),
('update_instance_context', 'private')
ON CONFLICT (name) DO UPDATE SET access = excluded.access;
