-- Repeatable: the interpreter of the execution tree (docs/ARCHITECTURE.md, "Composite
-- blocks: the execution tree"). A node is started (start_block, start_list), ends
-- (end_node), and its end applies its parent's rule (node_ended) up the tree; the
-- instance's state follows (sync_instance). Every function here runs under the instance's
-- row lock, taken by the public function that called it (begin_step, finish_step, decide,
-- run_child, the operator's moves), so one instance's tree moves one transaction at a time.

-- What a node runs -----------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.sequence_block(
    p_tenant_id text, p_sequence_id uuid, p_block_id text
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
AS $$
BEGIN
    RETURN (
        SELECT b.definition FROM orch8.sequence_blocks AS b
        WHERE b.tenant_id = p_tenant_id AND b.sequence_id = p_sequence_id AND b.block_id = p_block_id
    );
END
$$;

COMMENT ON FUNCTION orch8.sequence_block(text, uuid, text) IS
'The JSON of block p_block_id of a stored sequence (sequence_blocks), or NULL.';

CREATE OR REPLACE FUNCTION orch8.instance_step(
    p_tenant_id text, p_instance_id uuid, p_block_id text
)
RETURNS jsonb
LANGUAGE sql
STABLE
AS $$
    SELECT CASE
        WHEN orch8.compensated_path(p_block_id) IS NOT NULL
        THEN (b.definition -> 'compensation')
             || jsonb_build_object('id', b.definition ->> 'id', 'type', 'step')
        ELSE b.definition END
    FROM orch8.task_instances AS t
    JOIN orch8.sequence_blocks AS b
        ON b.tenant_id = t.tenant_id AND b.sequence_id = t.sequence_id
       AND b.block_id = orch8.node_block_id(p_block_id)
    WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id
$$;

COMMENT ON FUNCTION orch8.instance_step(text, uuid, text) IS
'The block a node of an instance runs, by the node''s path (a top-level block''s path is '
'its id): the block''s JSON, or for a compensation (saga.undo/step) the step''s '
'compensation with the step''s id and type step. NULL when there is none.';

CREATE OR REPLACE FUNCTION orch8.node_vars(
    p_tenant_id text, p_instance_id uuid, p_path text
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
AS $$
DECLARE
    v_vars jsonb := '{}'::jsonb;
    v_path text := p_path;
    v_node_vars jsonb;
BEGIN
    -- PL/pgSQL, not a recursive CTE in SQL: it runs once per step, and a SQL function's
    -- query is planned again in every transaction (0.3 ms a step), a PL/pgSQL one once
    -- per session. Walk up; a nearer binding wins, so an ancestor's only fills gaps.
    WHILE v_path IS NOT NULL LOOP
        SELECT n.vars, n.parent_path INTO v_node_vars, v_path
        FROM orch8.execution_nodes AS n
        WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id AND n.path = v_path;
        EXIT WHEN NOT found;
        IF v_node_vars IS NOT NULL AND v_node_vars <> '{}'::jsonb THEN
            v_vars := v_node_vars || v_vars;
        END IF;
    END LOOP;
    RETURN v_vars;
END
$$;

COMMENT ON FUNCTION orch8.node_vars(text, uuid, text) IS
'The variables in scope at a node: what it and its ancestors bind (item, index, '
'iteration, error), the nearest binding winning.';

CREATE OR REPLACE FUNCTION orch8.node_output(
    p_tenant_id text, p_instance_id uuid, p_path text
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
AS $$
BEGIN
    RETURN (
        SELECT CASE WHEN n.kind IN ('sequence', 'undo') THEN n.output ELSE (
            SELECT o.output FROM orch8.block_outputs AS o
            WHERE o.tenant_id = p_tenant_id AND o.instance_id = p_instance_id
              AND o.block_id = p_path AND o.sentinel IS NULL
            ORDER BY o.seq DESC LIMIT 1) END
        FROM orch8.execution_nodes AS n
        WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id AND n.path = p_path
    );
END
$$;

COMMENT ON FUNCTION orch8.node_output(text, uuid, text) IS
'What a node produced: a list''s output (its last completed block''s), else the latest '
'output row of the node''s path (a step''s result, a composite''s recorded output).';

CREATE OR REPLACE FUNCTION orch8.node_error(
    p_tenant_id text, p_instance_id uuid, p_path text
)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
AS $$
DECLARE
    v_node orch8.execution_nodes;
    v_origin text := p_path;
    v_code text;
BEGIN
    -- follow the failure down to the node it came from
    LOOP
        SELECT * INTO v_node FROM orch8.execution_nodes AS n
        WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id AND n.path = v_origin;
        EXIT WHEN v_node.failed_child IS NULL OR v_node.failed_child = v_origin;
        v_origin := v_node.failed_child;
    END LOOP;
    SELECT o.output ->> 'code' INTO v_code FROM orch8.block_outputs AS o
    WHERE o.tenant_id = p_tenant_id AND o.instance_id = p_instance_id AND o.block_id = v_origin
      AND o.sentinel = '__error__'
    ORDER BY o.seq DESC LIMIT 1;
    RETURN jsonb_build_object(
        'message', (SELECT n.error FROM orch8.execution_nodes AS n
                    WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id
                      AND n.path = p_path),
        'code', v_code, 'path', v_origin);
END
$$;

COMMENT ON FUNCTION orch8.node_error(text, uuid, text) IS
'The error a failed node hands to a handler ({{ error }} in a catch, a finally, '
'on_failure): {message, code, path}, path and code those of the node the failure came '
'from (failed_child followed down).';

CREATE OR REPLACE FUNCTION orch8.lock_node(p_tenant_id text, p_instance_id uuid, p_path text)
RETURNS orch8.execution_nodes
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.execution_nodes;
BEGIN
    SELECT n.* INTO v_row FROM orch8.execution_nodes AS n
    WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id AND n.path = p_path
    FOR UPDATE;
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION orch8.lock_node(text, uuid, text) IS
'Lock and return one node (a row of NULLs when there is none).';

-- Starting ---------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.claimable_block(p_block jsonb)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $$
    SELECT coalesce(p_block ->> 'type', 'step')
           NOT IN ('parallel', 'race', 'try_catch', 'saga', 'sleep', 'wait_for_signal')
$$;

COMMENT ON FUNCTION orch8.claimable_block(jsonb) IS
'Whether starting a block makes one ready node for a runner to claim (a step, loop, '
'for_each, router, sub_sequence, wait_for_input, or a type this engine does not run, '
'which the runner fails): everything but parallel, race, try_catch, saga, sleep and '
'wait_for_signal.';

CREATE OR REPLACE FUNCTION orch8.insert_ready_nodes(
    p_insts orch8.task_instances[], p_parent text, p_block jsonb
)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    -- claimable: a step, a composite that first needs a value (loop, for_each, router),
    -- a sub_sequence; a type this engine does not run is a step the runner fails, naming
    -- the type
    WITH b (id, type) AS (SELECT p_block ->> 'id', coalesce(p_block ->> 'type', 'step'))
    INSERT INTO orch8.execution_nodes (
        tenant_id, instance_id, path, parent_path, block_id, kind, state, priority, items,
        next_fire_at, deadline_at, concurrency_key, max_concurrency, rate_limit_key
    )
    SELECT
        i.tenant_id, i.id, orch8.child_path(p_parent, b.id), p_parent, b.id,
        CASE WHEN b.type IN ('loop', 'for_each', 'router', 'sub_sequence', 'wait_for_input')
             THEN b.type ELSE 'step' END,
        'ready', i.priority,
        CASE b.type WHEN 'loop' THEN '{"asking": "condition"}'::jsonb
                    WHEN 'for_each' THEN '{"asking": "collection"}'::jsonb
                    WHEN 'router' THEN '{"asking": "route"}'::jsonb END,
        -- a step's delay: claimable once it has passed, and its send_window open
        orch8.window_open_at(
            CASE WHEN b.type = 'step' THEN p_block -> 'send_window' END,
            coalesce(orch8.after_ms(orch8.duration_ms(
                CASE WHEN b.type = 'step' THEN p_block -> 'delay' END)), orch8.now())),
        -- a step's deadline counts from now, delay and window included
        orch8.after_ms(orch8.duration_ms(
            CASE WHEN b.type = 'step' THEN p_block -> 'deadline' END)),
        -- a step's flow control: its own concurrency key, else its definition's
        CASE WHEN b.type = 'step' THEN coalesce(
            orch8.render_key(p_block ->> 'concurrency_key', i.context, i.id),
            i.concurrency_key) END,
        CASE WHEN b.type = 'step' THEN CASE WHEN p_block ? 'concurrency_key'
            THEN (p_block ->> 'max_concurrency')::integer
            ELSE i.max_concurrency END END,
        CASE WHEN b.type = 'step' THEN p_block ->> 'rate_limit_key' END
    FROM unnest(p_insts) AS i
    CROSS JOIN b;
END
$$;

COMMENT ON FUNCTION orch8.insert_ready_nodes(orch8.task_instances[], text, jsonb) IS
'Start a claimable block (claimable_block) in the list at p_parent of each of p_insts, '
'in one statement: a ready node (claimable once a step''s delay has passed and its '
'send_window is open: window_open_at; deadline_at from its deadline; its concurrency key '
'rendered against the instance''s context, else the instance''s, and its '
'rate_limit_key). The caller sets the instances'' current_block. start_block starts one; '
'create_instances starts a whole batch.';

CREATE OR REPLACE FUNCTION orch8.start_block(
    p_inst orch8.task_instances, p_parent text, p_block jsonb
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_id text := p_block ->> 'id';
    v_path text := orch8.child_path(p_parent, p_block ->> 'id');
    v_type text := coalesce(p_block ->> 'type', 'step');
BEGIN
    IF v_type IN ('parallel', 'race') THEN
        INSERT INTO orch8.execution_nodes (
            tenant_id, instance_id, path, parent_path, block_id, kind, state, priority
        ) VALUES (
            p_inst.tenant_id, p_inst.id, v_path, p_parent, v_id, v_type, 'running',
            p_inst.priority
        );
        -- every branch exists before any starts: an empty one ends at once and must find
        -- its siblings to count
        INSERT INTO orch8.execution_nodes (
            tenant_id, instance_id, path, parent_path, block_id, kind, state, selector,
            priority
        )
        SELECT p_inst.tenant_id, p_inst.id, v_path || '#' || (b.n - 1), v_path, v_id,
               'sequence', 'running', ARRAY['branches', (b.n - 1)::text], p_inst.priority
        FROM jsonb_array_elements(p_block -> 'branches') WITH ORDINALITY AS b (value, n);
        FOR v_i IN 0 .. jsonb_array_length(p_block -> 'branches') - 1 LOOP
            PERFORM orch8.list_next(p_inst, v_path || '#' || v_i);
        END LOOP;
    ELSIF v_type = 'try_catch' THEN
        INSERT INTO orch8.execution_nodes (
            tenant_id, instance_id, path, parent_path, block_id, kind, state, priority
        ) VALUES (
            p_inst.tenant_id, p_inst.id, v_path, p_parent, v_id, v_type, 'running',
            p_inst.priority
        );
        PERFORM orch8.start_list(p_inst, v_path || '.try', v_path, v_id, ARRAY['try_block'],
                                 '{}');
    ELSIF v_type = 'saga' THEN
        INSERT INTO orch8.execution_nodes (
            tenant_id, instance_id, path, parent_path, block_id, kind, state, selector,
            priority
        ) VALUES (
            p_inst.tenant_id, p_inst.id, v_path, p_parent, v_id, v_type, 'running',
            ARRAY['blocks'], p_inst.priority
        );
        PERFORM orch8.list_next(p_inst, v_path);
    ELSIF v_type IN ('sleep', 'wait_for_signal') THEN
        PERFORM orch8.start_wait(p_inst, p_parent, p_block);
    ELSE  -- orch8.claimable_block
        PERFORM orch8.insert_ready_nodes(ARRAY[p_inst], p_parent, p_block);
        UPDATE orch8.task_instances AS t SET current_block = v_path
        WHERE t.tenant_id = p_inst.tenant_id AND t.id = p_inst.id;
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.start_block(orch8.task_instances, text, jsonb) IS
'Start a block in the list at p_parent: parallel and race create every branch (p#i) and '
'start them; try_catch starts its .try; saga starts its first block; a sleep or a '
'wait_for_signal starts waiting (start_wait); a step (claimable once its delay has '
'passed and its send_window is open: window_open_at; deadline_at from its deadline; its '
'concurrency key rendered, else its instance''s, and its rate_limit_key), '
'loop, for_each, router, sub_sequence or wait_for_input becomes a ready node for a '
'runner to claim (and the instance''s current_block).';

CREATE OR REPLACE FUNCTION orch8.start_list(
    p_inst orch8.task_instances,
    p_path text,
    p_parent text,
    p_block_id text,
    p_selector text[],
    p_vars jsonb
)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO orch8.execution_nodes (
        tenant_id, instance_id, path, parent_path, block_id, kind, state, selector, vars,
        priority
    ) VALUES (
        p_inst.tenant_id, p_inst.id, p_path, p_parent, p_block_id, 'sequence', 'running',
        p_selector, coalesce(p_vars, '{}'), p_inst.priority
    );
    PERFORM orch8.list_next(p_inst, p_path);
END
$$;

COMMENT ON FUNCTION orch8.start_list(
    orch8.task_instances, text, text, text, text[], jsonb
) IS
'Start a list of blocks at p_path (a part, a route, an iteration, on_failure...): the '
'blocks at p_selector inside block p_block_id (inside the definition when NULL), binding '
'p_vars for them; its first block starts.';

CREATE OR REPLACE FUNCTION orch8.list_next(p_inst orch8.task_instances, p_path text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_list orch8.execution_nodes := orch8.lock_node(p_inst.tenant_id, p_inst.id, p_path);
    v_blocks jsonb;
    v_item jsonb;
    v_output jsonb;
BEGIN
    IF v_list.kind = 'undo' THEN
        v_item := v_list.items -> v_list.position;
        IF v_item IS NOT NULL THEN
            UPDATE orch8.execution_nodes AS n SET position = n.position + 1,
                updated_at = orch8.now()
            WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id
              AND n.path = p_path;
            INSERT INTO orch8.execution_nodes (
                tenant_id, instance_id, path, parent_path, block_id, kind, state, priority
            ) VALUES (
                p_inst.tenant_id, p_inst.id, p_path || '/' || (v_item ->> 'block_id'), p_path,
                v_item ->> 'block_id', 'compensation', 'ready', p_inst.priority
            );
            RETURN;
        END IF;
        PERFORM orch8.end_node(p_inst, p_path, 'completed', NULL, NULL, NULL);
        RETURN;
    END IF;
    v_blocks := CASE WHEN v_list.block_id IS NULL
        THEN (SELECT s.definition FROM orch8.sequences AS s
              WHERE s.tenant_id = p_inst.tenant_id AND s.id = p_inst.sequence_id)
        ELSE orch8.sequence_block(p_inst.tenant_id, p_inst.sequence_id, v_list.block_id)
    END #> v_list.selector;
    IF v_list.position < coalesce(jsonb_array_length(
           CASE WHEN jsonb_typeof(v_blocks) = 'array' THEN v_blocks END), 0) THEN
        UPDATE orch8.execution_nodes AS n SET position = n.position + 1,
            updated_at = orch8.now()
        WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id AND n.path = p_path;
        PERFORM orch8.start_block(p_inst, p_path, v_blocks -> v_list.position);
        RETURN;
    END IF;
    -- every block ran: the list's output is its last completed block's
    FOR v_k IN REVERSE v_list.position - 1 .. 0 LOOP
        SELECT orch8.node_output(p_inst.tenant_id, p_inst.id,
                                 orch8.child_path(p_path, v_blocks -> v_k ->> 'id'))
        INTO v_output
        FROM orch8.execution_nodes AS c
        WHERE c.tenant_id = p_inst.tenant_id AND c.instance_id = p_inst.id
          AND c.path = orch8.child_path(p_path, v_blocks -> v_k ->> 'id')
          AND c.state = 'completed';
        EXIT WHEN FOUND;
    END LOOP;
    PERFORM orch8.end_node(p_inst, p_path, 'completed', v_output, NULL, NULL);
END
$$;

COMMENT ON FUNCTION orch8.list_next(orch8.task_instances, text) IS
'Move a list on: start its next block, or end it completed with the output of its last '
'completed block. An undo list (a saga''s compensations) starts its next compensation.';

-- Ending -------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.end_node(
    p_inst orch8.task_instances,
    p_path text,
    p_state orch8.node_state,
    p_output jsonb,
    p_error text,
    p_failed_child text
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_node orch8.execution_nodes;
BEGIN
    UPDATE orch8.execution_nodes AS n
    SET state = p_state,
        output = CASE WHEN n.kind IN ('sequence', 'undo', 'loop') THEN p_output ELSE n.output END,
        error = CASE WHEN p_state = 'failed' THEN left(p_error, orch8.limit_of('error_chars')::integer)
                     ELSE n.error END,
        failed_child = CASE WHEN p_state = 'failed' THEN p_failed_child END,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        ended_at = orch8.now(), updated_at = orch8.now()
    WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id AND n.path = p_path
      AND n.state NOT IN ('completed', 'failed', 'skipped', 'cancelled')
    RETURNING n.* INTO v_node;
    IF v_node.path IS NULL THEN
        RETURN;  -- it had ended already (a late answer): nothing moves
    END IF;
    IF p_state = 'completed' AND v_node.kind NOT IN ('sequence', 'undo', 'step', 'compensation')
    THEN
        -- a composite's output, where templates find it (outputs.<id>)
        PERFORM orch8.record_block_output(p_inst.tenant_id, p_inst.id, p_path, 0, NULL,
                                          coalesce(p_output, 'null'), NULL, NULL, NULL);
    END IF;
    PERFORM orch8.node_ended(p_inst, v_node);
END
$$;

COMMENT ON FUNCTION orch8.end_node(
    orch8.task_instances, text, orch8.node_state, jsonb, text, text
) IS
'End a node in p_state (completed, failed, skipped, cancelled) with its output (a list''s '
'and a loop''s are kept on the node; a composite''s completed output is also an output '
'row for templates), error and the child its failure came from, drop its lease, and '
'apply its parent''s rule (node_ended). A node that ended already is left alone.';

CREATE OR REPLACE FUNCTION orch8.node_ended(
    p_inst orch8.task_instances, p_node orch8.execution_nodes
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_parent orch8.execution_nodes;
    v_block jsonb;
    v_open integer;
    v_output jsonb;
    v_len integer;
BEGIN
    IF p_node.path = '' OR (p_node.parent_path = '' AND p_node.path LIKE '.%') THEN
        PERFORM orch8.instance_end(p_inst, p_node);
        RETURN;
    END IF;
    v_parent := orch8.lock_node(p_inst.tenant_id, p_inst.id, p_node.parent_path);
    IF v_parent.state IN ('completed', 'failed', 'skipped', 'cancelled') THEN
        RETURN;  -- decided already (a race lost, a sibling failed): recorded, not used
    END IF;
    v_block := orch8.sequence_block(p_inst.tenant_id, p_inst.sequence_id, v_parent.block_id);

    IF v_parent.kind IN ('sequence', 'saga', 'undo') AND p_node.kind <> 'undo' THEN
        IF p_node.state IN ('completed', 'skipped') THEN
            IF v_parent.kind = 'undo' AND p_node.state = 'completed' THEN
                PERFORM orch8.compensate_receipts(p_inst, p_node.path);
            END IF;
            PERFORM orch8.list_next(p_inst, v_parent.path);
        ELSIF p_node.state = 'failed' AND v_parent.kind = 'saga' THEN
            PERFORM orch8.start_undo(p_inst, v_parent, p_node);
        ELSIF p_node.state = 'failed' THEN
            PERFORM orch8.end_node(p_inst, v_parent.path, 'failed', NULL, p_node.error,
                                   p_node.path);
        ELSE
            PERFORM orch8.end_node(p_inst, v_parent.path, 'cancelled', NULL, NULL, NULL);
        END IF;
        RETURN;
    END IF;

    IF v_parent.kind = 'saga' THEN  -- its compensations ended
        PERFORM orch8.end_node(p_inst, v_parent.path, 'failed', NULL,
            CASE WHEN p_node.state = 'completed'
                 THEN format('saga %s compensated %s step(s) after %s failed: %s',
                             v_parent.block_id, jsonb_array_length(p_node.items),
                             v_parent.items ->> 'failed', v_parent.items ->> 'error')
                 ELSE format('saga %s: a compensation failed: %s (after %s failed: %s)',
                             v_parent.block_id, coalesce(p_node.error, p_node.state::text),
                             v_parent.items ->> 'failed', v_parent.items ->> 'error') END,
            p_node.path);
        RETURN;
    END IF;

    IF v_parent.kind = 'parallel' THEN
        IF p_node.state = 'failed'
           AND coalesce(v_block ->> 'on_branch_failure',
                        orch8.block_default('on_branch_failure') #>> '{}') = 'fail' THEN
            PERFORM orch8.cancel_subtree(p_inst, s.path,
                                         format('branch %s failed', p_node.path))
            FROM orch8.execution_nodes AS s
            WHERE s.tenant_id = p_inst.tenant_id AND s.instance_id = p_inst.id
              AND s.parent_path = v_parent.path AND s.path <> p_node.path
              AND s.state NOT IN ('completed', 'failed', 'skipped', 'cancelled');
            PERFORM orch8.end_node(p_inst, v_parent.path, 'failed', NULL, p_node.error,
                                   p_node.path);
            RETURN;
        END IF;
        SELECT count(*) INTO v_open FROM orch8.execution_nodes AS s
        WHERE s.tenant_id = p_inst.tenant_id AND s.instance_id = p_inst.id
          AND s.parent_path = v_parent.path
          AND s.state NOT IN ('completed', 'failed', 'skipped', 'cancelled');
        IF v_open > 0 THEN
            RETURN;
        END IF;
        SELECT jsonb_agg(CASE WHEN s.state = 'completed'
                              THEN coalesce(orch8.node_output(s.tenant_id, s.instance_id, s.path),
                                            'null')
                              ELSE jsonb_build_object('error', s.error, 'state', s.state,
                                                      'path', s.failed_child) END
                         ORDER BY length(s.path), s.path)
        INTO v_output
        FROM orch8.execution_nodes AS s
        WHERE s.tenant_id = p_inst.tenant_id AND s.instance_id = p_inst.id
          AND s.parent_path = v_parent.path;
        PERFORM orch8.end_node(p_inst, v_parent.path, 'completed', v_output, NULL, NULL);
        RETURN;
    END IF;

    IF v_parent.kind = 'race' THEN
        IF p_node.state = 'completed'
           OR (p_node.state = 'failed'
               AND coalesce(v_block ->> 'semantics',
                            orch8.block_default('semantics') #>> '{}') = 'first_to_resolve') THEN
            UPDATE orch8.execution_nodes AS n
            SET items = jsonb_build_object('winner', p_node.path), updated_at = orch8.now()
            WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id
              AND n.path = v_parent.path;
            PERFORM orch8.cancel_subtree(p_inst, s.path,
                                         format('lost the race to %s', p_node.path))
            FROM orch8.execution_nodes AS s
            WHERE s.tenant_id = p_inst.tenant_id AND s.instance_id = p_inst.id
              AND s.parent_path = v_parent.path AND s.path <> p_node.path
              AND s.state NOT IN ('completed', 'failed', 'skipped', 'cancelled');
            PERFORM orch8.end_node(p_inst, v_parent.path, p_node.state,
                CASE WHEN p_node.state = 'completed'
                     THEN orch8.node_output(p_inst.tenant_id, p_inst.id, p_node.path) END,
                p_node.error, CASE WHEN p_node.state = 'failed' THEN p_node.path END);
            RETURN;
        END IF;
        SELECT count(*) INTO v_open FROM orch8.execution_nodes AS s
        WHERE s.tenant_id = p_inst.tenant_id AND s.instance_id = p_inst.id
          AND s.parent_path = v_parent.path
          AND s.state NOT IN ('completed', 'failed', 'skipped', 'cancelled');
        IF v_open = 0 THEN  -- first_to_succeed, and every branch failed
            PERFORM orch8.end_node(p_inst, v_parent.path, 'failed', NULL,
                (SELECT 'every branch failed: ' || string_agg(
                     format('%s: %s', s.path, coalesce(s.error, s.state::text)), '; '
                     ORDER BY length(s.path), s.path)
                 FROM orch8.execution_nodes AS s
                 WHERE s.tenant_id = p_inst.tenant_id AND s.instance_id = p_inst.id
                   AND s.parent_path = v_parent.path),
                p_node.path);
        END IF;
        RETURN;
    END IF;

    IF v_parent.kind = 'loop' THEN
        IF p_node.state <> 'completed' THEN
            PERFORM orch8.end_node(p_inst, v_parent.path,
                CASE WHEN p_node.state = 'failed' THEN 'failed' ELSE 'cancelled' END::orch8.node_state,
                NULL, p_node.error, p_node.path);
            RETURN;
        END IF;
        -- the next value to ask for: break_on after this iteration, else the condition of
        -- the next one
        UPDATE orch8.execution_nodes AS n
        SET output = orch8.node_output(p_inst.tenant_id, p_inst.id, p_node.path),
            state = 'ready', next_fire_at = orch8.now(),
            position = CASE WHEN v_block ? 'break_on' THEN n.position ELSE n.position + 1 END,
            items = jsonb_build_object('asking', CASE WHEN v_block ? 'break_on'
                                                      THEN 'break_on' ELSE 'condition' END),
            updated_at = orch8.now()
        WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id
          AND n.path = v_parent.path;
        RETURN;
    END IF;

    IF v_parent.kind = 'for_each' THEN
        IF p_node.state = 'failed' THEN
            PERFORM orch8.cancel_subtree(p_inst, s.path,
                                         format('item %s failed', p_node.path))
            FROM orch8.execution_nodes AS s
            WHERE s.tenant_id = p_inst.tenant_id AND s.instance_id = p_inst.id
              AND s.parent_path = v_parent.path AND s.path <> p_node.path
              AND s.state NOT IN ('completed', 'failed', 'skipped', 'cancelled');
            PERFORM orch8.end_node(p_inst, v_parent.path, 'failed', NULL, p_node.error,
                                   p_node.path);
            RETURN;
        END IF;
        v_len := jsonb_array_length(v_parent.items -> 'collection');
        IF p_node.state = 'completed' AND v_parent.position < v_len THEN
            PERFORM orch8.start_iteration(p_inst, v_parent.path, v_block);
            RETURN;
        END IF;
        SELECT count(*) INTO v_open FROM orch8.execution_nodes AS s
        WHERE s.tenant_id = p_inst.tenant_id AND s.instance_id = p_inst.id
          AND s.parent_path = v_parent.path
          AND s.state NOT IN ('completed', 'failed', 'skipped', 'cancelled');
        IF v_open = 0 THEN
            SELECT jsonb_agg(coalesce(orch8.node_output(s.tenant_id, s.instance_id, s.path),
                                      'null') ORDER BY length(s.path), s.path)
            INTO v_output
            FROM orch8.execution_nodes AS s
            WHERE s.tenant_id = p_inst.tenant_id AND s.instance_id = p_inst.id
              AND s.parent_path = v_parent.path;
            PERFORM orch8.end_node(p_inst, v_parent.path, 'completed', v_output, NULL, NULL);
        END IF;
        RETURN;
    END IF;

    IF v_parent.kind = 'router' THEN
        PERFORM orch8.end_node(p_inst, v_parent.path, p_node.state,
            CASE WHEN p_node.state = 'completed'
                 THEN orch8.node_output(p_inst.tenant_id, p_inst.id, p_node.path) END,
            p_node.error, p_node.path);
        RETURN;
    END IF;

    IF v_parent.kind = 'try_catch' THEN
        PERFORM orch8.try_catch_part_ended(p_inst, v_parent, v_block, p_node);
        RETURN;
    END IF;

    IF v_parent.kind IN ('wait_for_signal', 'wait_for_input') THEN  -- its on_timeout ended
        PERFORM orch8.end_node(p_inst, v_parent.path, p_node.state,
            CASE WHEN p_node.state = 'completed'
                 THEN orch8.node_output(p_inst.tenant_id, p_inst.id, p_node.path) END,
            p_node.error, CASE WHEN p_node.state = 'failed' THEN p_node.path END);
        RETURN;
    END IF;
    RAISE EXCEPTION 'node % of instance % has a parent of kind %, which holds no children',
        p_node.path, p_inst.id, v_parent.kind USING ERRCODE = 'O8004';
END
$$;

COMMENT ON FUNCTION orch8.node_ended(orch8.task_instances, orch8.execution_nodes) IS
'A node ended: apply its parent''s rule. A list (sequence, saga, undo) starts its next '
'block, or fails with a failed one (a saga compensates first: start_undo); parallel '
'fails at the first failed branch and cancels the others (on_branch_failure fail), or '
'completes with every branch''s output (or error) once all ended; race ends with its '
'first completed branch, or (first_to_resolve) its first failed one, cancelling the '
'others; a loop asks for break_on or its next condition; for_each starts its next item, '
'fails with a failed one, or completes with every item''s output; a router ends as its '
'route did; try_catch moves to catch or finally; a wait ends as its on_timeout blocks '
'did. A parent that ended already ignores it. '
'The root and on_failure/on_cancel go to instance_end.';

CREATE OR REPLACE FUNCTION orch8.start_iteration(
    p_inst orch8.task_instances, p_path text, p_block jsonb
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_vars text [] := orch8.for_each_vars(p_block);
    v_each orch8.execution_nodes;
BEGIN
    UPDATE orch8.execution_nodes AS n SET position = n.position + 1, updated_at = orch8.now()
    WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id AND n.path = p_path
    RETURNING n.* INTO v_each;
    PERFORM orch8.start_list(p_inst, p_path || '[' || (v_each.position - 1) || ']', p_path,
        v_each.block_id, ARRAY['body'],
        jsonb_build_object(v_vars[1], v_each.items -> 'collection' -> (v_each.position - 1),
                           v_vars[2], v_each.position - 1));
END
$$;

COMMENT ON FUNCTION orch8.start_iteration(orch8.task_instances, text, jsonb) IS
'Start the next item of a for_each (its position): the body at each[k] with the item and '
'its index bound (item_var, index_var).';

CREATE OR REPLACE FUNCTION orch8.try_catch_part_ended(
    p_inst orch8.task_instances,
    p_try orch8.execution_nodes,
    p_block jsonb,
    p_part orch8.execution_nodes
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_has_catch boolean := jsonb_typeof(p_block -> 'catch_block') = 'array';
    v_has_finally boolean := jsonb_typeof(p_block -> 'finally_block') = 'array';
    v_error jsonb;
    v_outcome jsonb;
BEGIN
    IF p_part.state = 'cancelled' THEN
        PERFORM orch8.end_node(p_inst, p_try.path, 'cancelled', NULL, NULL, NULL);
        RETURN;
    END IF;
    IF p_part.path = p_try.path || '.finally' THEN
        IF p_part.state = 'failed' THEN
            PERFORM orch8.end_node(p_inst, p_try.path, 'failed', NULL, p_part.error, p_part.path);
        ELSE
            PERFORM orch8.end_node(p_inst, p_try.path,
                (p_try.items ->> 'state')::orch8.node_state, p_try.items -> 'output',
                p_try.items ->> 'error', p_try.items ->> 'failed_child');
        END IF;
        RETURN;
    END IF;
    IF p_part.state = 'failed' THEN
        v_error := orch8.node_error(p_inst.tenant_id, p_inst.id, p_part.path);
    END IF;
    IF p_part.path = p_try.path || '.try' AND p_part.state = 'failed' AND v_has_catch THEN
        PERFORM orch8.start_list(p_inst, p_try.path || '.catch', p_try.path, p_try.block_id,
                                 ARRAY['catch_block'], jsonb_build_object('error', v_error));
        RETURN;
    END IF;
    v_outcome := jsonb_build_object(
        'state', p_part.state,
        'output', CASE WHEN p_part.state = 'completed'
                       THEN orch8.node_output(p_inst.tenant_id, p_inst.id, p_part.path) END,
        'error', p_part.error,
        'failed_child', CASE WHEN p_part.state = 'failed' THEN p_part.path END);
    IF v_has_finally THEN
        UPDATE orch8.execution_nodes AS n SET items = v_outcome, updated_at = orch8.now()
        WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id AND n.path = p_try.path;
        -- error: the try's failure (also after a catch handled it), else what is bound
        -- around the block (an on_failure's), else null
        v_error := coalesce(
            v_error,
            CASE WHEN p_part.path = p_try.path || '.catch' THEN p_part.vars -> 'error' END,
            orch8.node_vars(p_inst.tenant_id, p_inst.id, p_try.path) -> 'error',
            'null');
        PERFORM orch8.start_list(p_inst, p_try.path || '.finally', p_try.path, p_try.block_id,
            ARRAY['finally_block'], jsonb_build_object('error', v_error));
        RETURN;
    END IF;
    PERFORM orch8.end_node(p_inst, p_try.path, p_part.state, v_outcome -> 'output',
                           p_part.error, v_outcome ->> 'failed_child');
END
$$;

COMMENT ON FUNCTION orch8.try_catch_part_ended(
    orch8.task_instances, orch8.execution_nodes, jsonb, orch8.execution_nodes
) IS
'try_catch''s rule: a failed .try starts .catch with {{ error }} bound (node_error); '
'after .try or .catch, .finally runs with {{ error }} the try''s failure (also when a '
'catch handled it), else the error bound around the block, else null; the block '
'then ends as that part did; without a finally it ends at once. A failed finally fails '
'the block with its own error.';

CREATE OR REPLACE FUNCTION orch8.start_undo(
    p_inst orch8.task_instances, p_saga orch8.execution_nodes, p_failed orch8.execution_nodes
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_items jsonb;
BEGIN
    SELECT jsonb_agg(jsonb_build_object('block_id', c.block_id, 'path', c.path)
                     ORDER BY c.ended_at DESC, c.path DESC)
    INTO v_items
    FROM orch8.execution_nodes AS c
    WHERE c.tenant_id = p_inst.tenant_id AND c.instance_id = p_inst.id
      AND c.parent_path = p_saga.path AND c.kind = 'step' AND c.state = 'completed'
      AND orch8.sequence_block(p_inst.tenant_id, p_inst.sequence_id, c.block_id)
          ? 'compensation';
    UPDATE orch8.execution_nodes AS n
    SET items = jsonb_build_object('failed', p_failed.path, 'error', p_failed.error),
        updated_at = orch8.now()
    WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id AND n.path = p_saga.path;
    IF v_items IS NULL THEN
        PERFORM orch8.end_node(p_inst, p_saga.path, 'failed', NULL,
            format('%s (saga %s had nothing to compensate)', p_failed.error, p_saga.block_id),
            p_failed.path);
        RETURN;
    END IF;
    INSERT INTO orch8.execution_nodes (
        tenant_id, instance_id, path, parent_path, block_id, kind, state, items, priority
    ) VALUES (
        p_inst.tenant_id, p_inst.id, p_saga.path || '.undo', p_saga.path, p_saga.block_id,
        'undo', 'running', v_items, p_inst.priority
    );
    PERFORM orch8.list_next(p_inst, p_saga.path || '.undo');
END
$$;

COMMENT ON FUNCTION orch8.start_undo(
    orch8.task_instances, orch8.execution_nodes, orch8.execution_nodes
) IS
'A block of a saga failed: compensate its completed steps that declare a compensation, '
'the last completed first (saga.undo, one compensation node each); with none, the saga '
'fails at once.';

CREATE OR REPLACE FUNCTION orch8.compensate_receipts(p_inst orch8.task_instances, p_path text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_original text := orch8.compensated_path(p_path);
    v_by uuid;
BEGIN
    SELECT o.effect_id INTO v_by FROM orch8.block_outputs AS o
    WHERE o.tenant_id = p_inst.tenant_id AND o.instance_id = p_inst.id AND o.block_id = p_path
      AND o.sentinel IS NULL
    ORDER BY o.seq DESC LIMIT 1;
    PERFORM orch8.cas_effect_receipt(p_inst.tenant_id, r.id, r.state, 'compensated',
        jsonb_build_object(
            'actor', 'saga',
            'note', format('compensated by %s', p_path),
            'evidence', jsonb_strip_nulls(jsonb_build_object(
                'compensated_by', p_path, 'compensating_effect_id', v_by))))
    FROM orch8.effect_receipts AS r
    WHERE r.tenant_id = p_inst.tenant_id AND r.instance_id = p_inst.id
      AND r.block_id = v_original AND r.state IN ('committed', 'verified');
END
$$;

COMMENT ON FUNCTION orch8.compensate_receipts(orch8.task_instances, text) IS
'A compensation (saga.undo/step) completed: the compensated step''s committed and '
'verified receipts move to compensated, with the compensating node and its effect id as '
'evidence.';

CREATE OR REPLACE FUNCTION orch8.cancel_subtree(
    p_inst orch8.task_instances, p_path text, p_reason text
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_child record;
BEGIN
    -- Worker tasks: queued ones withdrawn, running ones told (their nodes wait for the report)
    PERFORM orch8.withdraw_worker_tasks(p_inst, p_path, p_reason);
    -- Children first: a child's end touches its parent's node, so taking the child's row
    -- before that node keeps one lock order (child, then parent).
    FOR v_child IN
        SELECT n.child_instance_id FROM orch8.execution_nodes AS n
        WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id
          AND n.kind = 'sub_sequence' AND n.state = 'waiting'
          AND n.child_instance_id IS NOT NULL AND orch8.in_subtree(n.path, p_path)
    LOOP
        PERFORM orch8.request_instance_state(p_inst.tenant_id, v_child.child_instance_id,
            'cancelled', 'parent', format('parent %s: %s', p_inst.id, p_reason));
    END LOOP;
    UPDATE orch8.execution_nodes AS n
    SET state_before_cancel = n.state, state = 'cancelled', cancel_reason = p_reason,
        ended_at = orch8.now(), updated_at = orch8.now()
    WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id
      AND orch8.in_subtree(n.path, p_path) AND n.lease_token IS NULL
      AND n.state IN ('ready', 'running', 'waiting', 'blocked')
      AND NOT (n.state = 'waiting' AND n.worker_task_id IS NOT NULL);
    -- leased ones finish what they dispatched; begin_step stops one not yet dispatched;
    -- one a worker runs is recorded when the worker reports
    UPDATE orch8.execution_nodes AS n
    SET cancel_requested = true, cancel_reason = p_reason, updated_at = orch8.now()
    WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id
      AND orch8.in_subtree(n.path, p_path)
      AND (n.lease_token IS NOT NULL OR (n.state = 'waiting' AND n.worker_task_id IS NOT NULL));
END
$$;

COMMENT ON FUNCTION orch8.cancel_subtree(orch8.task_instances, text, text) IS
'Cancel the node at p_path and everything below it, withdrawing work not yet dispatched: '
'child instances of waiting sub_sequences are cancelled first; nodes without a lease '
'become cancelled (with the reason and the state they had); a leased node is marked '
'cancel_requested, so its begin_step answers stopped, and a step already dispatched '
'keeps its receipt and records its late result. Worker tasks first '
'(withdraw_worker_tasks): a queued one is withdrawn, its node cancelled; a running one is '
'told, and its node, marked cancel_requested, waits for the worker''s report.';

-- The instance ----------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.instance_end(
    p_inst orch8.task_instances, p_node orch8.execution_nodes
)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_definition jsonb;
    v_runs integer;
BEGIN
    IF p_node.path <> '' THEN
        RETURN;  -- on_failure or on_cancel ended: sync_instance ends the instance
    END IF;
    SELECT s.definition INTO v_definition FROM orch8.sequences AS s
    WHERE s.tenant_id = p_inst.tenant_id AND s.id = p_inst.sequence_id;
    IF p_node.state = 'failed' AND jsonb_typeof(v_definition -> 'on_failure') = 'array' THEN
        SELECT count(*) INTO v_runs FROM orch8.execution_nodes AS n
        WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id
          AND n.path LIKE '.on\_failure[%';
        PERFORM orch8.start_list(p_inst, '.on_failure[' || v_runs || ']', '', NULL,
            ARRAY['on_failure'],
            jsonb_build_object('error', orch8.node_error(p_inst.tenant_id, p_inst.id, '')));
    ELSIF p_node.state = 'cancelled' AND jsonb_typeof(v_definition -> 'on_cancel') = 'array'
          AND NOT EXISTS (SELECT 1 FROM orch8.execution_nodes AS n
                          WHERE n.tenant_id = p_inst.tenant_id AND n.instance_id = p_inst.id
                            AND n.path = '.on_cancel') THEN
        PERFORM orch8.start_list(p_inst, '.on_cancel', '', NULL, ARRAY['on_cancel'], '{}');
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.instance_end(orch8.task_instances, orch8.execution_nodes) IS
'The root ended: a failed one starts the definition''s on_failure blocks (.on_failure[n], '
'{{ error }} bound to the failure), a cancelled one its on_cancel blocks (.on_cancel, '
'once). sync_instance then ends the instance when they have run.';

CREATE OR REPLACE FUNCTION orch8.sync_instance(
    p_tenant_id text, p_instance_id uuid, p_actor text, p_reason text DEFAULT NULL
)
RETURNS orch8.instance_state
LANGUAGE plpgsql
AS $$
DECLARE
    v_inst orch8.task_instances;
    v_root orch8.execution_nodes;
    v_special orch8.execution_nodes;
    v_counts record;
    v_target orch8.instance_state;
    v_reason text := p_reason;
    v_at timestamptz;
BEGIN
    SELECT * INTO v_inst FROM orch8.task_instances AS t
    WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id;
    IF v_inst.state IN ('completed', 'cancelled') THEN
        RETURN v_inst.state;
    END IF;
    SELECT * INTO v_root FROM orch8.execution_nodes AS n
    WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id AND n.path = '';
    SELECT * INTO v_special FROM orch8.execution_nodes AS n
    WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id
      AND n.path LIKE '.%' AND n.parent_path = ''
    ORDER BY n.created_at DESC, n.path DESC LIMIT 1;
    SELECT
        count(*) FILTER (WHERE n.lease_token IS NOT NULL) AS leased,
        -- in flight: leased, or waiting for an external worker's report
        count(*) FILTER (WHERE n.lease_token IS NOT NULL
                            OR (n.state = 'waiting' AND n.worker_task_id IS NOT NULL)) AS busy,
        count(*) FILTER (WHERE n.state = 'ready') AS ready,
        count(*) FILTER (WHERE n.state = 'ready' AND n.next_fire_at <= orch8.now()) AS due,
        min(n.next_fire_at) FILTER (WHERE n.state = 'ready') AS next_at,
        count(*) FILTER (WHERE n.state = 'waiting') AS waiting,
        min(n.wake_at) FILTER (WHERE n.state = 'waiting') AS wake_at,
        count(*) FILTER (WHERE n.state = 'blocked') AS blocked
    INTO v_counts
    FROM orch8.execution_nodes AS n
    WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id
      AND n.state IN ('ready', 'running', 'waiting', 'blocked');

    IF v_root.state = 'completed' THEN
        v_target := 'completed';
    ELSIF v_root.state = 'failed'
          AND (v_special.path IS NULL OR v_special.path NOT LIKE '.on\_failure[%'
               OR v_special.state IN ('completed', 'failed', 'cancelled', 'skipped')) THEN
        v_target := 'failed';
        v_reason := v_root.error || CASE WHEN v_special.state = 'failed'
                                         THEN '; on_failure failed: ' || v_special.error
                                         ELSE '' END;
    ELSIF v_root.state = 'cancelled' AND v_counts.busy = 0
          AND (v_special.path IS DISTINCT FROM '.on_cancel'
               OR v_special.state IN ('completed', 'failed', 'cancelled', 'skipped')) THEN
        v_target := 'cancelled';
    ELSIF v_inst.state = 'paused' THEN
        v_target := CASE WHEN v_root.state = 'completed' THEN 'completed'
                         ELSE 'paused' END::orch8.instance_state;
    ELSIF v_counts.leased > 0 THEN
        v_target := 'running';
    ELSIF v_inst.requested_state = 'paused' THEN
        v_target := 'paused';
    ELSIF v_counts.ready > 0 THEN
        v_target := 'scheduled';
        v_at := v_counts.next_at;
    ELSIF v_counts.waiting > 0 THEN
        v_target := 'waiting';
        v_at := v_counts.wake_at;  -- the earliest timer, NULL when nothing is timed
    ELSIF v_counts.blocked > 0 THEN
        v_target := 'failed';
        SELECT n.error INTO v_reason FROM orch8.execution_nodes AS n
        WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id
          AND n.state = 'blocked'
        ORDER BY n.updated_at, n.path LIMIT 1;
    ELSE
        v_target := 'failed';
        v_reason := 'internal: no node of the instance can run (report this)';
    END IF;

    IF v_target = v_inst.requested_state AND p_actor = 'runner' THEN
        -- a pause or cancel asked for while the runner held the work: the move of the
        -- operator who asked, with their reason (kept beside the request)
        p_actor := coalesce(v_inst.requested_by, 'operator');
        v_reason := coalesce(v_inst.requested_reason, 'requested while running');
    END IF;
    IF v_counts.due > 0 THEN
        PERFORM pg_notify('orch8_work', '');  -- ready nodes: wake idle runners
    END IF;
    IF v_target = v_inst.state THEN
        IF v_target IN ('scheduled', 'waiting') AND v_at IS NOT NULL
           AND v_inst.next_fire_at IS DISTINCT FROM v_at THEN
            UPDATE orch8.task_instances AS t SET next_fire_at = v_at, updated_at = orch8.now()
            WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id;
        ELSIF v_target = 'failed' AND v_inst.error IS DISTINCT FROM v_reason THEN
            -- failed still, for another reason (a retried step settled, then the saga
            -- around it failed): the error says the latest
            UPDATE orch8.task_instances AS t SET error = v_reason, updated_at = orch8.now()
            WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id;
        END IF;
        RETURN v_target;
    END IF;
    IF v_target = 'running' THEN
        -- only a claim makes an instance running: here a node is leased already, so this is
        -- the claim's own move (a handover or a claim of a node in a waiting instance)
        PERFORM orch8.attribute_transition(p_actor, p_reason);
        UPDATE orch8.task_instances AS t SET state = 'running', updated_at = orch8.now()
        WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id;
        RETURN v_target;
    END IF;
    PERFORM orch8.transition_instance(p_tenant_id, p_instance_id, v_inst.state, v_target,
                                      p_actor, v_reason, v_at);
    RETURN v_target;
END
$$;

COMMENT ON FUNCTION orch8.sync_instance(text, uuid, text, text) IS
'Set an instance''s state from its tree, after every move: the root completed -> '
'completed; failed -> failed (once on_failure ran, its failure added); cancelled -> '
'cancelled (once on_cancel ran and no node holds a lease). Otherwise: a paused one stays '
'paused; a leased node -> running; a pause requested -> paused; a ready node -> '
'scheduled (next_fire_at the earliest); a waiting one -> waiting (next_fire_at its '
'earliest timer, when it has one); a blocked one -> '
'failed with its error. Moves through transition_instance (audit row, actor and reason '
'given); returns the state.';

-- Handing work over ---------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.hand_over(
    p_inst orch8.task_instances,
    p_lease_token uuid,
    p_lease_owner text,
    p_lease_expires_at timestamptz,
    p_prefer_parent text,
    p_exclude text DEFAULT NULL
)
RETURNS orch8.execution_nodes
LANGUAGE plpgsql
AS $$
DECLARE
    v_node orch8.execution_nodes;
BEGIN
    IF p_inst.requested_state = 'paused' OR p_inst.state IN ('paused', 'completed', 'cancelled')
       OR p_lease_expires_at < orch8.now() THEN
        RETURN NULL;
    END IF;
    -- "(state = 'ready') IS TRUE": the instance's nodes by the primary key, never a walk
    -- of the ready queue's partial index, which statistics taken beside a large history
    -- make look empty (docs/ARCHITECTURE.md, "Flat as history grows")
    SELECT c.* INTO v_node FROM orch8.execution_nodes AS c
    WHERE c.tenant_id = p_inst.tenant_id AND c.instance_id = p_inst.id
      AND (c.state = 'ready') IS TRUE AND c.next_fire_at <= orch8.now()
      AND c.path IS DISTINCT FROM p_exclude
      -- a worker's result to decide on is claimed with it (claim_work's worker_result)
      AND c.worker_task_id IS NULL
    ORDER BY (c.parent_path IS NOT DISTINCT FROM p_prefer_parent) DESC, c.priority DESC,
             c.next_fire_at, c.path
    LIMIT 1
    FOR UPDATE SKIP LOCKED;
    IF v_node.path IS NULL THEN
        RETURN NULL;
    END IF;
    -- a concurrency key or a rate limit admits it, or the claim loop takes it later
    IF (v_node.concurrency_key IS NOT NULL OR v_node.rate_limit_key IS NOT NULL)
       AND cardinality(orch8.admit_nodes(ARRAY[v_node])) = 0 THEN
        RETURN NULL;
    END IF;
    UPDATE orch8.execution_nodes AS n
    SET state = 'running', lease_owner = p_lease_owner, lease_token = p_lease_token,
        lease_expires_at = p_lease_expires_at, deferred_by = NULL, updated_at = orch8.now()
    WHERE n.tenant_id = v_node.tenant_id AND n.instance_id = v_node.instance_id
      AND n.path = v_node.path AND (n.state = 'ready') IS TRUE
    RETURNING n.* INTO v_node;
    RETURN v_node;
END
$$;

COMMENT ON FUNCTION orch8.hand_over(
    orch8.task_instances, uuid, text, timestamptz, text, text
) IS
'After a node ended under a lease: lease the instance''s next due ready node (a sibling '
'of the finished one first; never p_exclude, a step that is to be retried) to the same '
'holder with the same token and expiry, so a runner walks a chain without claiming; '
'NULL when there is none, a pause is asked, or admit_nodes does not admit it (its '
'concurrency key is full, or its rate limit defers it).';

CREATE OR REPLACE FUNCTION orch8.node_answer(
    p_tenant_id text,
    p_instance_id uuid,
    p_next orch8.execution_nodes,
    p_from_parent text,
    p_actor text,
    p_reason text DEFAULT NULL
)
RETURNS SETOF orch8.tree_answer
LANGUAGE plpgsql
AS $$
DECLARE
    v_state orch8.instance_state := orch8.sync_instance(p_tenant_id, p_instance_id, p_actor,
                                                        p_reason);
BEGIN
    RETURN QUERY SELECT
        v_state,
        p_next.path,
        CASE WHEN p_next.path IS NOT NULL
             THEN orch8.compute_attempt(p_tenant_id, p_instance_id, p_next.path) END,
        p_next.block_id,
        p_next.kind::text,
        p_next.position,
        p_next.items ->> 'asking',
        p_next.child_instance_id,
        CASE WHEN p_next.path IS NOT NULL
             THEN orch8.node_vars(p_tenant_id, p_instance_id, p_next.path) END,
        -- outputs this caller has not seen (a branch began or joined, a composite ended,
        -- p_from_parent NULL): send them all
        CASE WHEN p_next.path IS NOT NULL
                  AND p_next.parent_path IS DISTINCT FROM p_from_parent
             THEN orch8.instance_progress(p_tenant_id, p_instance_id) END,
        (SELECT t.context_version FROM orch8.task_instances AS t
         WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id);
END
$$;

COMMENT ON FUNCTION orch8.node_answer(
    text, uuid, orch8.execution_nodes, text, text, text
) IS
'What finish_step, decide and run_child answer: the instance''s state (sync_instance, '
'with the actor and reason of the move) and, when a node was handed over, that node: '
'path, attempt, block id, kind, position, what it asks for (a loop''s condition or '
'break_on, a collection, a route), its child instance, its variables, and the '
'instance''s outputs when it is not a sibling of the node that ended; always the '
'instance''s context_version (a runner holding an older context reads it again).';

-- The runner's answers for composites -----------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.leased_node(
    p_tenant_id text, p_instance_id uuid, p_lease_token uuid
)
RETURNS orch8.execution_nodes
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.execution_nodes;
BEGIN
    SELECT n.* INTO v_row FROM orch8.execution_nodes AS n
    WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id
      AND n.lease_token = p_lease_token
    FOR UPDATE;
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION orch8.leased_node(text, uuid, uuid) IS
'The node of an instance that a lease token holds, locked (a row of NULLs when none).';

CREATE OR REPLACE FUNCTION orch8.require_node(
    p_node orch8.execution_nodes, p_path text, p_kinds text[], p_call text
)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_node.path IS DISTINCT FROM p_path THEN
        RAISE EXCEPTION 'lease on node % of instance % is no longer held by this caller',
            p_path, p_node.instance_id
            USING ERRCODE = 'O8001',
                  DETAIL = json_build_object('path', p_path, 'held', p_node.path)::text;
    END IF;
    IF NOT p_node.kind = ANY (p_kinds) THEN
        RAISE EXCEPTION '% answers % nodes; node % is a %', p_call,
            array_to_string(p_kinds, ', '), p_path, p_node.kind
            USING ERRCODE = 'O8008', DETAIL = json_build_object('path', p_path,
                                                                'kind', p_node.kind)::text;
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.require_node(orch8.execution_nodes, text, text[], text) IS
'The node a lease holds must be the one the call names (else O8001, as for a lost lease) '
'and of a kind the call answers (else O8008).';

CREATE OR REPLACE FUNCTION orch8.stop_node(
    p_inst orch8.task_instances, p_node orch8.execution_nodes
)
RETURNS orch8.node_state
LANGUAGE plpgsql
AS $$
BEGIN
    IF p_node.cancel_requested THEN
        PERFORM orch8.end_node(p_inst, p_node.path, 'cancelled', NULL, NULL, NULL);
        RETURN 'cancelled'::orch8.node_state;
    END IF;
    IF p_inst.requested_state = 'paused' THEN
        UPDATE orch8.execution_nodes AS n
        SET state = 'ready', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
            updated_at = orch8.now()
        WHERE n.tenant_id = p_node.tenant_id AND n.instance_id = p_node.instance_id
          AND n.path = p_node.path;
        RETURN 'ready'::orch8.node_state;
    END IF;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.stop_node(orch8.task_instances, orch8.execution_nodes) IS
'Before a leased node starts its work: a node whose subtree was cancelled ends cancelled; '
'one whose instance is asked to pause goes back to ready, its lease dropped. Returns the '
'node''s new state, or NULL when it may go on.';

CREATE OR REPLACE FUNCTION orch8.decide(
    p_tenant_id text,
    p_instance_id uuid,
    p_lease_token uuid,
    p_path text,
    p_value jsonb,
    p_error text DEFAULT NULL
)
RETURNS SETOF orch8.tree_answer
LANGUAGE plpgsql
AS $$
DECLARE
    v_inst orch8.task_instances;
    v_node orch8.execution_nodes;
    v_block jsonb;
    v_asking text;
    v_max integer;
    v_n integer;
    v_next orch8.execution_nodes;
BEGIN
    v_inst := orch8.lock_leased_instance(p_tenant_id, p_instance_id, p_lease_token);
    v_node := orch8.leased_node(p_tenant_id, p_instance_id, p_lease_token);
    PERFORM orch8.require_node(v_node, p_path, ARRAY['loop', 'for_each', 'router'], 'decide');
    IF orch8.stop_node(v_inst, v_node) IS NOT NULL THEN
        RETURN QUERY SELECT * FROM orch8.node_answer(p_tenant_id, p_instance_id, NULL, NULL,
                                                     'runner', 'requested while running');
        RETURN;
    END IF;
    v_block := orch8.sequence_block(p_tenant_id, v_inst.sequence_id, v_node.block_id);
    v_asking := v_node.items ->> 'asking';
    IF p_error IS NULL AND (
        (v_asking IN ('condition', 'break_on') AND jsonb_typeof(p_value) IS DISTINCT FROM 'boolean')
        OR (v_asking = 'collection' AND jsonb_typeof(p_value) IS DISTINCT FROM 'array')
        OR (v_asking = 'route' AND jsonb_typeof(p_value) NOT IN ('number', 'null'))) THEN
        RAISE EXCEPTION 'node % asks for its %: a %, got %', p_path, v_asking,
            CASE v_asking WHEN 'collection' THEN 'JSON array'
                          WHEN 'route' THEN 'route index or null' ELSE 'boolean' END,
            coalesce(jsonb_typeof(p_value), 'NULL')
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'value')::text;
    END IF;
    -- a route is named by one index only (tier.route1), so refuse any other number
    IF p_error IS NULL AND v_asking = 'route' AND jsonb_typeof(p_value) = 'number'
       AND (p_value::text !~ '^[0-9]+$'
            OR p_value::text::numeric >= jsonb_array_length(v_block -> 'routes')) THEN
        RAISE EXCEPTION 'router % has routes 0 to %, got %', p_path,
            jsonb_array_length(v_block -> 'routes') - 1, p_value::text
            USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'value')::text;
    END IF;
    PERFORM orch8.record_block_output(p_tenant_id, p_instance_id, p_path, v_node.position,
        '__decision__', jsonb_strip_nulls(jsonb_build_object(
            'asking', v_asking, 'value', p_value, 'error', p_error,
            'iteration', CASE WHEN v_node.kind = 'loop' THEN v_node.position END)),
        NULL, NULL, p_lease_token);
    -- the node keeps running without a lease while its children run
    UPDATE orch8.execution_nodes AS n
    SET lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        items = CASE WHEN v_asking = 'collection' THEN jsonb_build_object('collection', p_value)
                     ELSE n.items END,
        updated_at = orch8.now()
    WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id AND n.path = p_path;
    v_max := coalesce(orch8.sequence_json_integer(v_block -> 'max_iterations'),
                      (orch8.block_default('max_iterations') #>> '{}')::integer);

    IF p_error IS NOT NULL THEN
        PERFORM orch8.end_node(v_inst, p_path, 'failed', NULL,
                               format('%s %s: %s', v_node.kind, v_node.block_id, p_error), NULL);
    ELSIF v_asking = 'condition' AND p_value = 'true' THEN
        IF v_node.position >= v_max THEN
            PERFORM orch8.end_node(v_inst, p_path, 'failed', NULL, format(
                'loop %s: its condition still held after max_iterations (%s) iterations',
                v_node.block_id, v_max), NULL);
        ELSE
            PERFORM orch8.start_list(v_inst, p_path || '[' || v_node.position || ']', p_path,
                v_node.block_id, ARRAY['body'],
                jsonb_build_object('iteration', v_node.position));
        END IF;
    ELSIF v_asking = 'condition' OR (v_asking = 'break_on' AND p_value = 'true') THEN
        PERFORM orch8.end_node(v_inst, p_path, 'completed', v_node.output, NULL, NULL);
    ELSIF v_asking = 'break_on' THEN
        UPDATE orch8.execution_nodes AS n
        SET state = 'ready', position = n.position + 1, next_fire_at = orch8.now(),
            items = '{"asking": "condition"}', updated_at = orch8.now()
        WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id AND n.path = p_path;
    ELSIF v_asking = 'collection' THEN
        v_n := jsonb_array_length(p_value);
        IF v_n > v_max THEN
            PERFORM orch8.end_node(v_inst, p_path, 'failed', NULL, format(
                'for_each %s: the collection has %s items, over max_iterations (%s)',
                v_node.block_id, v_n, v_max), NULL);
        ELSIF v_n = 0 THEN
            PERFORM orch8.end_node(v_inst, p_path, 'completed', '[]', NULL, NULL);
        ELSE
            FOR v_k IN 1 .. least(v_n, coalesce(
                    orch8.sequence_json_integer(v_block -> 'concurrency'),
                    (orch8.block_default('concurrency') #>> '{}')::integer)) LOOP
                PERFORM orch8.start_iteration(v_inst, p_path, v_block);
            END LOOP;
        END IF;
    ELSIF jsonb_typeof(p_value) = 'number' THEN
        PERFORM orch8.start_list(v_inst, p_path || '.route' || p_value::text, p_path,
            v_node.block_id, ARRAY['routes', p_value::text, 'blocks'], '{}');
    ELSIF jsonb_typeof(v_block -> 'default') = 'array' THEN
        PERFORM orch8.start_list(v_inst, p_path || '.default', p_path, v_node.block_id,
                                 ARRAY['default'], '{}');
    ELSE
        PERFORM orch8.end_node(v_inst, p_path, 'completed', 'null', NULL, NULL);
    END IF;
    v_inst := orch8.load_instance(p_tenant_id, p_instance_id);
    v_next := orch8.hand_over(v_inst, p_lease_token, v_node.lease_owner, v_node.lease_expires_at,
                              p_path);
    -- the tree wrote outputs the runner has not seen (a composite's): send them all
    RETURN QUERY SELECT * FROM orch8.node_answer(p_tenant_id, p_instance_id, v_next, NULL,
                                                 'runner');
END
$$;

COMMENT ON FUNCTION orch8.decide(text, uuid, uuid, text, jsonb, text) IS
'The runner''s answer for a composite that asked for a value, fenced by the node''s lease '
'(O8001): a loop''s condition or break_on (a boolean), a for_each''s collection (an '
'array), a router''s route (the index of the first true route, or null). The value is '
'recorded (__decision__, with the iteration) and the tree moves: a true condition starts '
'the next iteration (loop[n], {{ iteration }} bound; past max_iterations the loop fails), '
'a false one or a true break_on completes the loop with its last iteration''s output; '
'the collection starts up to concurrency items (over max_iterations: failed; empty: '
'completed with []); a route starts loop.routeN, null the default (or completes with '
'null). p_error (the expression failed) fails the node. Answers like finish_step, the '
'next node leased to the caller.';

CREATE OR REPLACE FUNCTION orch8.run_child(
    p_tenant_id text,
    p_instance_id uuid,
    p_lease_token uuid,
    p_path text,
    p_sequence_id uuid,
    p_input jsonb,
    p_error text DEFAULT NULL
)
RETURNS SETOF orch8.tree_answer
LANGUAGE plpgsql
AS $$
DECLARE
    v_inst orch8.task_instances;
    v_node orch8.execution_nodes;
    v_block jsonb;
    v_seq orch8.sequences;
    v_parent_seq orch8.sequences;
    v_child orch8.task_instances;
    v_attempt integer;
    v_error text := p_error;
    v_next orch8.execution_nodes;
BEGIN
    v_inst := orch8.lock_leased_instance(p_tenant_id, p_instance_id, p_lease_token);
    v_node := orch8.leased_node(p_tenant_id, p_instance_id, p_lease_token);
    PERFORM orch8.require_node(v_node, p_path, ARRAY['sub_sequence'], 'run_child');
    IF orch8.stop_node(v_inst, v_node) IS NOT NULL THEN
        RETURN QUERY SELECT * FROM orch8.node_answer(p_tenant_id, p_instance_id, NULL, NULL,
                                                     'runner', 'requested while running');
        RETURN;
    END IF;
    v_attempt := orch8.compute_attempt(p_tenant_id, p_instance_id, p_path);
    IF v_node.child_instance_id IS NULL AND v_error IS NULL THEN
        v_block := orch8.sequence_block(p_tenant_id, v_inst.sequence_id, v_node.block_id);
        SELECT * INTO v_parent_seq FROM orch8.sequences AS s
        WHERE s.tenant_id = p_tenant_id AND s.id = v_inst.sequence_id;
        SELECT * INTO v_seq FROM orch8.sequences AS s
        WHERE s.tenant_id = p_tenant_id AND s.id = p_sequence_id;
        IF v_seq.id IS NULL OR v_seq.name <> v_block ->> 'sequence_name'
           OR v_seq.namespace <> coalesce(v_block ->> 'namespace', v_parent_seq.namespace)
           OR v_seq.version <> coalesce(orch8.sequence_json_integer(v_block -> 'version'),
                                        v_seq.version) THEN
            RAISE EXCEPTION 'sequence % is not the one block % names (%/% version %)',
                p_sequence_id, p_path,
                coalesce(v_block ->> 'namespace', v_parent_seq.namespace),
                v_block ->> 'sequence_name', coalesce(v_block ->> 'version', 'latest')
                USING ERRCODE = 'O8008', DETAIL = json_build_object('field', 'sequence_id')::text;
        END IF;
        IF v_inst.depth + 1 > orch8.limit_of('sub_sequence_depth') THEN
            v_error := format('sub_sequence %s: a child at depth %s is over the limit '
                              'sub_sequence_depth (%s)', v_node.block_id, v_inst.depth + 1,
                              orch8.limit_of('sub_sequence_depth'));
        ELSE
            -- its own statement: a scan started before the insert would not see the child
            SELECT c.id INTO v_child.id FROM orch8.create_instance(
                p_tenant_id, v_seq.id, coalesce(p_input, '{}'), v_inst.context -> 'config',
                v_inst.priority,
                format('orch8:child:%s:%s:%s', p_instance_id, p_path, v_attempt),
                NULL, p_instance_id, p_path) AS c;
            UPDATE orch8.execution_nodes AS n
            SET state = 'waiting', child_instance_id = v_child.id, lease_owner = NULL,
                lease_token = NULL, lease_expires_at = NULL, updated_at = orch8.now()
            WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id AND n.path = p_path;
            v_node.child_instance_id := v_child.id;
        END IF;
    END IF;
    IF v_error IS NOT NULL THEN
        PERFORM orch8.record_block_output(p_tenant_id, p_instance_id, p_path, v_attempt,
            '__error__', jsonb_build_object('error', v_error), false, NULL, p_lease_token);
        PERFORM orch8.end_node(v_inst, p_path, 'failed', NULL, v_error, NULL);
    ELSE
        SELECT * INTO v_child FROM orch8.task_instances AS t
        WHERE t.tenant_id = p_tenant_id AND t.id = v_node.child_instance_id;
        IF v_child.state = 'completed' THEN
            PERFORM orch8.end_node(v_inst, p_path, 'completed',
                orch8.node_output(p_tenant_id, v_child.id, ''), NULL, NULL);
        ELSIF v_child.state IN ('failed', 'cancelled') THEN
            v_error := format('child %s %s%s', v_child.id,
                              CASE v_child.state WHEN 'failed' THEN 'failed'
                                   ELSE 'was cancelled' END,
                              ': ' || v_child.error);
            PERFORM orch8.record_block_output(p_tenant_id, p_instance_id, p_path, v_attempt,
                '__error__', jsonb_build_object('error', v_error, 'child_instance_id', v_child.id),
                false, NULL, p_lease_token);
            PERFORM orch8.end_node(v_inst, p_path, 'failed', NULL, v_error, NULL);
        ELSE
            UPDATE orch8.execution_nodes AS n
            SET state = 'waiting', lease_owner = NULL, lease_token = NULL,
                lease_expires_at = NULL, updated_at = orch8.now()
            WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id AND n.path = p_path
              AND n.state = 'running';
        END IF;
    END IF;
    v_inst := orch8.load_instance(p_tenant_id, p_instance_id);
    v_next := orch8.hand_over(v_inst, p_lease_token, v_node.lease_owner, v_node.lease_expires_at,
                              v_node.parent_path);
    -- the child's output is new to the runner: send the outputs
    RETURN QUERY SELECT * FROM orch8.node_answer(p_tenant_id, p_instance_id, v_next, NULL,
                                                 'runner');
END
$$;

COMMENT ON FUNCTION orch8.run_child(text, uuid, uuid, text, uuid, jsonb, text) IS
'The runner''s call for a sub_sequence node, fenced by its lease (O8001). Not started yet: '
'create the child instance of p_sequence_id (the sequence the block names: its '
'sequence_name, namespace, default the parent''s, and version, default the latest the '
'runner found; else O8008) with data p_input, the parent''s config and priority, and an '
'idempotency key from the parent, path and attempt (a repeated call makes no second '
'child); the node waits without a lease, and the child''s end makes it ready again. Over '
'the limit sub_sequence_depth, or with p_error (the input did not render or match the '
'child''s input_schema), the node fails. Its child ended: completed -> the node '
'completes with the child''s output; failed or cancelled -> the node fails. Answers like '
'finish_step.';

CREATE OR REPLACE FUNCTION orch8.child_ended(p_child orch8.task_instances)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    -- Only the parent's node row: never the parent instance's, which a parent cancelling
    -- its child holds while it waits for this one (child before parent, one lock order).
    UPDATE orch8.execution_nodes AS n
    SET state = 'ready', next_fire_at = orch8.now(), updated_at = orch8.now()
    WHERE n.tenant_id = p_child.tenant_id AND n.instance_id = p_child.parent_instance_id
      AND n.path = p_child.parent_path AND n.state = 'waiting'
      AND n.child_instance_id = p_child.id;
    IF found THEN
        PERFORM pg_notify('orch8_work', '');
    END IF;
END
$$;

COMMENT ON FUNCTION orch8.child_ended(orch8.task_instances) IS
'A child instance ended: the parent''s sub_sequence node that waits for it becomes ready, '
'for a runner to collect the result (run_child). Touches only that node''s row.';

-- What the front ends draw ---------------------------------------------------------------

CREATE OR REPLACE VIEW orch8.execution_tree WITH (security_invoker = true) AS
SELECT
    n.tenant_id,
    n.instance_id,
    n.path,
    n.parent_path,
    n.block_id,
    n.kind,
    n.state,
    o.attempt,
    r.id AS effect_id,
    r.state AS receipt_state,
    coalesce(v.output, CASE WHEN n.kind IN ('sequence', 'undo') THEN n.output END) AS output,
    n.error,
    n.cancel_reason,
    n.child_instance_id,
    n.lease_owner,
    n.lease_expires_at,
    n.next_fire_at,
    n.created_at,
    n.ended_at,
    n.wake_at,
    n.concurrency_key,
    n.rate_limit_key,
    n.deferred_by,
    n.deferrals
FROM orch8.execution_nodes AS n
LEFT JOIN LATERAL (
    SELECT b.attempt FROM orch8.block_outputs AS b
    WHERE
        b.tenant_id = n.tenant_id AND b.instance_id = n.instance_id AND b.block_id = n.path
        AND n.kind IN ('step', 'compensation', 'sub_sequence')
    ORDER BY b.seq DESC LIMIT 1
) AS o ON true
LEFT JOIN LATERAL (
    SELECT
        e.id,
        e.state
    FROM orch8.effect_receipts AS e
    WHERE e.tenant_id = n.tenant_id AND e.instance_id = n.instance_id AND e.block_id = n.path
    ORDER BY e.attempt DESC, e.created_at DESC LIMIT 1
) AS r ON true
LEFT JOIN LATERAL (
    SELECT b.output FROM orch8.block_outputs AS b
    WHERE
        b.tenant_id = n.tenant_id AND b.instance_id = n.instance_id AND b.block_id = n.path
        AND b.sentinel IS NULL
    ORDER BY b.seq DESC LIMIT 1
) AS v ON true;

COMMENT ON VIEW orch8.execution_tree IS
'Each node of each instance''s execution tree with what an operator reads beside it: the '
'latest attempt of a step (or sub_sequence), its latest receipt and that receipt''s '
'state, its output (the latest), why it was cancelled, its child instance, its lease '
'and a waiting node''s timer (wake_at), its flow control (concurrency_key, '
'rate_limit_key) and why and how often admission deferred it (deferred_by, deferrals). '
'What the API, the CLI '
'and the console draw as a tree (parent_path links a node to its parent; '
'ORDER BY created_at, path gives the order things started).';

COMMENT ON COLUMN orch8.execution_tree.tenant_id IS 'The instance''s tenant.';

COMMENT ON COLUMN orch8.execution_tree.instance_id IS
'The instance whose tree this node is part of.';

COMMENT ON COLUMN orch8.execution_tree.path IS
'The node''s path in the tree (execution_nodes.path).';

COMMENT ON COLUMN orch8.execution_tree.parent_path IS
'The parent node''s path, NULL for the root: the tree is drawn by it.';

COMMENT ON COLUMN orch8.execution_tree.block_id IS
'The block the node runs or belongs to; NULL for the root, on_failure and on_cancel '
'lists.';

COMMENT ON COLUMN orch8.execution_tree.kind IS 'What the node executes (execution_nodes.kind).';

COMMENT ON COLUMN orch8.execution_tree.state IS
'The node''s state: ready, running, waiting, blocked, completed, failed, skipped or '
'cancelled.';

COMMENT ON COLUMN orch8.execution_tree.attempt IS
'For a step, compensation or sub_sequence: the attempt of its latest block_outputs row; '
'NULL for other kinds or before any row.';

COMMENT ON COLUMN orch8.execution_tree.effect_id IS
'The node''s latest receipt (highest attempt); NULL when it has none.';

COMMENT ON COLUMN orch8.execution_tree.receipt_state IS
'The state of that receipt; NULL when there is none.';

COMMENT ON COLUMN orch8.execution_tree.output IS
'The node''s latest output: its latest real block_outputs row, or for a list the output '
'kept on the node. NULL when none.';

COMMENT ON COLUMN orch8.execution_tree.error IS
'Why the node failed, or the error of a step waiting on an unknown receipt.';

COMMENT ON COLUMN orch8.execution_tree.cancel_reason IS
'Why the node was cancelled or asked to stop.';

COMMENT ON COLUMN orch8.execution_tree.child_instance_id IS
'The child instance of a sub_sequence node.';

COMMENT ON COLUMN orch8.execution_tree.lease_owner IS
'The runner holding the node''s lease; NULL when not leased.';

COMMENT ON COLUMN orch8.execution_tree.lease_expires_at IS
'When that lease runs out; NULL when not leased.';

COMMENT ON COLUMN orch8.execution_tree.next_fire_at IS 'When a ready node may be claimed.';

COMMENT ON COLUMN orch8.execution_tree.created_at IS 'When the node started.';

COMMENT ON COLUMN orch8.execution_tree.ended_at IS 'When the node ended; NULL while it is open.';

COMMENT ON COLUMN orch8.execution_tree.wake_at IS
'A waiting node''s timer: when a sleep ends or a wait times out.';

COMMENT ON COLUMN orch8.execution_tree.concurrency_key IS
'The step''s rendered concurrency key; NULL when not limited.';

COMMENT ON COLUMN orch8.execution_tree.rate_limit_key IS
'The rate_limit_key the step takes tokens from; NULL when none.';

COMMENT ON COLUMN orch8.execution_tree.deferred_by IS
'Why admission holds the ready node back: rate_limit or rate_limit_undefined; NULL when '
'it does not.';

COMMENT ON COLUMN orch8.execution_tree.deferrals IS 'How many times admission deferred the node.';
