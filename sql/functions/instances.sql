-- Repeatable: instances, lease-fenced claiming, block outputs and attempts.
-- Every instance state change is a CAS against orch8.instance_can_transition and writes
-- an instance_transitions row (the triggers task_instances_record_creations and
-- task_instances_record_moves, from what attribute_transition set); every runner write
-- carries (instance, lease token).

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

CREATE OR REPLACE FUNCTION orch8.create_instances(
    p_tenant_id text,
    p_sequence_id uuid,
    p_items jsonb,
    p_next_fire_at timestamptz DEFAULT NULL,
    p_parent_instance_id uuid DEFAULT NULL,
    p_parent_path text DEFAULT NULL
)
RETURNS TABLE (ord integer, id uuid, state orch8.instance_state, deduplicated boolean)
LANGUAGE plpgsql
AS $$
DECLARE
    v_seq orch8.sequences;
    v_limit integer := coalesce(
        nullif(current_setting('orch8.max_context_bytes', true), '')::integer,
        orch8.limit_of('context_bytes'));
    v_key_limit integer := orch8.limit_of('idempotency_key_bytes');
    v_depth integer := 0;
    v_count integer;
    v_bad record;
    v_ids uuid[];
    v_new orch8.task_instances[];
    v_inst orch8.task_instances;
    v_first jsonb;
    v_claimable boolean;
BEGIN
    PERFORM orch8.require_tenant(p_tenant_id);  -- the web role acts in its sealed tenant
    IF jsonb_typeof(p_items) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'items must be a JSON array of instances' USING ERRCODE = 'O8008',
            DETAIL = json_build_object('field', 'items')::text;
    END IF;
    v_count := jsonb_array_length(p_items);
    IF v_count > orch8.limit_of('create_batch') THEN
        RAISE EXCEPTION '% instances in one call, over the limit create_batch (%)',
            v_count, orch8.limit_of('create_batch')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'items',
                                             'limit', orch8.limit_of('create_batch'))::text,
                  HINT = 'start them in several calls';
    END IF;
    -- The first item that cannot start refuses the whole call: nothing is half-written.
    SELECT i.n - 1 AS idx, p.problem, p.field, p.lim, p.size INTO v_bad
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS i (item, n)
    CROSS JOIN LATERAL (SELECT
        CASE WHEN jsonb_typeof(i.item) = 'object' THEN i.item END AS o) AS x
    CROSS JOIN LATERAL (SELECT
        octet_length(jsonb_build_object(
            'data', coalesce(nullif(x.o -> 'data', 'null'), '{}'),
            'config', coalesce(nullif(x.o -> 'config', 'null'), '{}'),
            'runtime', '{}'::jsonb)::text) AS ctx,
        x.o ->> 'idempotency_key' AS key) AS c
    CROSS JOIN LATERAL (SELECT * FROM (VALUES
        (1, x.o IS NULL, 'an instance must be a JSON object', 'items', NULL::integer, NULL::integer),
        (2, EXISTS (SELECT 1 FROM jsonb_object_keys(x.o) AS k
                    WHERE k NOT IN ('data', 'config', 'priority', 'idempotency_key')),
         'unknown field(s): ' || (SELECT string_agg(k, ', ' ORDER BY k) FROM jsonb_object_keys(x.o) AS k
                                  WHERE k NOT IN ('data', 'config', 'priority', 'idempotency_key')),
         'items', NULL, NULL),
        (3, coalesce(jsonb_typeof(x.o -> 'data'), 'object') NOT IN ('object', 'null')
            OR coalesce(jsonb_typeof(x.o -> 'config'), 'object') NOT IN ('object', 'null'),
         'instance data and config must be JSON objects', 'data', NULL, NULL),
        (4, coalesce(jsonb_typeof(x.o -> 'priority'), 'null') NOT IN ('number', 'null')
            OR (jsonb_typeof(x.o -> 'priority') = 'number'
                AND ((x.o ->> 'priority')::numeric <> trunc((x.o ->> 'priority')::numeric)
                     OR (x.o ->> 'priority')::numeric NOT BETWEEN -2147483648 AND 2147483647)),
         'priority must be a 32-bit integer', 'priority', NULL, NULL),
        (5, coalesce(jsonb_typeof(x.o -> 'idempotency_key'), 'null') NOT IN ('string', 'null')
            OR octet_length(c.key) NOT BETWEEN 1 AND v_key_limit,
         format('idempotency key must be 1 to %s bytes', v_key_limit), 'idempotency_key',
         v_key_limit, NULL),
        (6, c.ctx > v_limit,
         format('instance context is %s bytes, over the limit of %s bytes', c.ctx, v_limit),
         'context', v_limit, c.ctx)
    ) AS v (rank, bad, problem, field, lim, size)
    WHERE v.bad ORDER BY v.rank LIMIT 1) AS p
    ORDER BY i.n LIMIT 1;
    IF found THEN
        RAISE EXCEPTION '%', CASE WHEN v_count > 1 THEN format('instance %s: %s', v_bad.idx, v_bad.problem)
                                  ELSE v_bad.problem END
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object(
                      'field', v_bad.field, 'limit', v_bad.lim, 'size', v_bad.size,
                      'index', v_bad.idx)::text,
                  HINT = CASE WHEN v_bad.field = 'context'
                      THEN 'store large payloads elsewhere and pass a reference '
                           '(the limit is the setting orch8.max_context_bytes)' ELSE '' END;
    END IF;
    SELECT * INTO v_seq FROM orch8.sequences AS s
     WHERE s.tenant_id = p_tenant_id AND s.id = p_sequence_id;
    IF NOT found THEN
        RAISE EXCEPTION 'sequence % not found', p_sequence_id
            USING ERRCODE = 'O8007', DETAIL = json_build_object('sequence_id', p_sequence_id)::text;
    END IF;
    IF p_parent_instance_id IS NOT NULL THEN
        SELECT t.depth + 1 INTO v_depth FROM orch8.task_instances AS t
         WHERE t.tenant_id = p_tenant_id AND t.id = p_parent_instance_id;
        IF NOT found THEN
            RAISE EXCEPTION 'parent instance % not found', p_parent_instance_id
                USING ERRCODE = 'O8007',
                      DETAIL = json_build_object('parent_instance_id', p_parent_instance_id)::text;
        END IF;
        IF v_depth > orch8.limit_of('sub_sequence_depth') THEN
            RAISE EXCEPTION 'a child at depth % is over the limit sub_sequence_depth (%)',
                v_depth, orch8.limit_of('sub_sequence_depth')
                USING ERRCODE = 'O8008',
                      DETAIL = json_build_object('field', 'parent_instance_id',
                                                 'limit', orch8.limit_of('sub_sequence_depth'))::text;
        END IF;
    END IF;
    IF v_count = 0 THEN
        RETURN;
    END IF;

    v_first := v_seq.definition -> 'blocks' -> 0;
    v_claimable := v_first IS NOT NULL AND orch8.claimable_block(v_first);
    -- ids chosen first, so that each item finds its own row afterwards (a repeated key
    -- inserts nothing and answers the instance that holds it)
    SELECT array_agg(orch8.time_ordered_uuid()) INTO v_ids FROM generate_series(1, v_count);
    PERFORM orch8.attribute_transition('create', NULL);
    WITH items AS (
        SELECT i.n::integer AS n,
               jsonb_build_object(
                   'data', coalesce(nullif(i.item -> 'data', 'null'), '{}'),
                   'config', coalesce(nullif(i.item -> 'config', 'null'), '{}'),
                   'runtime', '{}'::jsonb) AS context,
               coalesce((i.item ->> 'priority')::integer, 0) AS priority,
               i.item ->> 'idempotency_key' AS key
        FROM jsonb_array_elements(p_items) WITH ORDINALITY AS i (item, n)
    ), made AS (
        INSERT INTO orch8.task_instances AS t (
            id, tenant_id, sequence_id, sequence_version, context, next_fire_at, priority,
            parent_instance_id, parent_path, depth, idempotency_key, concurrency_key,
            max_concurrency, sla_at, current_block
        )
        SELECT v_ids[it.n], p_tenant_id, v_seq.id, v_seq.version, it.context,
               coalesce(p_next_fire_at, orch8.now()), it.priority,
               p_parent_instance_id, p_parent_path, v_depth, it.key,
               -- rendered before the id exists: {{ instance_id }} in it is refused by the
               -- validator
               orch8.render_key(v_seq.definition ->> 'concurrency_key', it.context, NULL),
               (v_seq.definition ->> 'max_concurrency')::integer,
               -- the sla counts from when it is due to start
               coalesce(p_next_fire_at, orch8.now())
               + orch8.duration_ms(v_seq.definition -> 'sla') * interval '1 millisecond',
               -- what start_block sets for a claimable first block, written once here
               CASE WHEN v_claimable THEN orch8.child_path('', v_first ->> 'id') END
        FROM items AS it
        ORDER BY it.n
        ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
        RETURNING t AS row
    )
    SELECT array_agg(made.row) INTO v_new FROM made;

    -- the tree: each root list and its first block, ready at next_fire_at
    IF v_claimable THEN
        -- the whole batch in two statements: start_list's root (already moved past its
        -- first block) and start_block's ready node
        INSERT INTO orch8.execution_nodes (
            tenant_id, instance_id, path, parent_path, block_id, kind, state, selector, vars,
            priority, position
        )
        SELECT i.tenant_id, i.id, '', NULL, NULL, 'sequence', 'running', ARRAY['blocks'],
               '{}', i.priority, 1
        FROM unnest(v_new) AS i;
        PERFORM orch8.insert_ready_nodes(v_new, '', v_first);
    ELSE
        FOREACH v_inst IN ARRAY coalesce(v_new, '{}') LOOP
            PERFORM orch8.start_list(v_inst, '', NULL, NULL, ARRAY['blocks'], '{}');
        END LOOP;
    END IF;
    IF p_next_fire_at IS NOT NULL THEN  -- due at another time: a first step's delay after it
        UPDATE orch8.execution_nodes AS n
        SET next_fire_at = n.next_fire_at + (p_next_fire_at - orch8.now())
        -- IS TRUE: probed by the primary key, never by the ready queue's index (below)
        WHERE n.tenant_id = p_tenant_id AND (n.state = 'ready') IS TRUE
          AND n.instance_id = ANY (SELECT i.id FROM unnest(v_new) AS i);
    END IF;
    -- a first step's delay: the instance is due when its node is (probed per instance, so
    -- the plan stays an index lookup however stale the table's statistics are). Written
    -- "(state = 'ready') IS TRUE" so that the planner cannot use the ready queue's partial
    -- index: statistics taken beside a large history say almost no node is ready, and it
    -- then walked the whole queue once per instance (docs/ARCHITECTURE.md, "Flat as
    -- history grows").
    UPDATE orch8.task_instances AS t SET next_fire_at = d.at
    FROM unnest(v_new) AS i
    CROSS JOIN LATERAL (
        SELECT min(n.next_fire_at) AS at FROM orch8.execution_nodes AS n
        WHERE n.tenant_id = p_tenant_id AND n.instance_id = i.id
          AND (n.state = 'ready') IS TRUE) AS d
    WHERE t.tenant_id = p_tenant_id AND t.id = i.id AND d.at > t.next_fire_at;
    IF NOT v_claimable THEN
        -- a tree that ended at once (no blocks, stored before blocks were required; empty
        -- branches) settles its instance now
        PERFORM orch8.sync_instance(p_tenant_id, i.id, 'create')
        FROM unnest(v_new) AS i
        WHERE NOT EXISTS (SELECT 1 FROM orch8.execution_nodes AS n
                          WHERE n.tenant_id = p_tenant_id AND n.instance_id = i.id
                            AND (n.state = 'ready') IS TRUE);
    END IF;
    IF v_new IS NOT NULL THEN
        PERFORM pg_notify('orch8_work', '');
    END IF;
    RETURN QUERY
    SELECT (i.n - 1)::integer, t.id, t.state, t.id IS DISTINCT FROM v_ids[i.n]
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS i (item, n)
    CROSS JOIN LATERAL (
        SELECT s.id, s.state FROM orch8.task_instances AS s
        WHERE s.tenant_id = p_tenant_id
          AND (s.id = v_ids[i.n] OR s.idempotency_key = i.item ->> 'idempotency_key')
        ORDER BY s.id = v_ids[i.n] DESC LIMIT 1) AS t
    ORDER BY i.n;
END
$$;

COMMENT ON FUNCTION orch8.create_instances(text, uuid, jsonb, timestamptz, uuid, text) IS
'Start a batch of instances of one sequence version in one transaction, set-based: '
'p_items is a JSON array of {data, config, priority, idempotency_key} (each optional; '
'at most the limit create_batch). Each instance''s context is {data, config, runtime}, its '
'tree started (the root list, its first block ready at next_fire_at, default now). The '
'first item that cannot start (not an object, an unknown field, data or config not an '
'object, priority not a 32-bit integer, an idempotency key outside 1 to '
'idempotency_key_bytes, a context over orch8.max_context_bytes) refuses the whole call '
'with O8008 naming its index: nothing is written. One row per item, in order: ord (its '
'0-based index), the instance, its state, and deduplicated = true when its '
'idempotency_key was used before (in the tenant, or earlier in the same batch). A child '
'batch (p_parent_instance_id, p_parent_path) is one level deeper than its parent, at most '
'sub_sequence_depth (else O8008). The sequence''s input_schema is checked by the front '
'ends (docs/WORKFLOWS.md), not here. Notifies channel orch8_work once.';

CREATE OR REPLACE FUNCTION orch8.create_instance(
    p_tenant_id text,
    p_sequence_id uuid,
    p_data jsonb DEFAULT '{}',
    p_config jsonb DEFAULT '{}',
    p_priority integer DEFAULT 0,
    p_idempotency_key text DEFAULT NULL,
    p_next_fire_at timestamptz DEFAULT NULL,
    p_parent_instance_id uuid DEFAULT NULL,
    p_parent_path text DEFAULT NULL
)
RETURNS TABLE (id uuid, state orch8.instance_state, deduplicated boolean)
LANGUAGE sql
AS $$
    -- one instance is a batch of one: the rules live in create_instances only
    SELECT c.id, c.state, c.deduplicated
    FROM orch8.create_instances(
        orch8.require_tenant(p_tenant_id), p_sequence_id,
        jsonb_build_array(jsonb_build_object(
            'data', p_data, 'config', p_config, 'priority', p_priority,
            'idempotency_key', p_idempotency_key)),
        p_next_fire_at, p_parent_instance_id, p_parent_path) AS c
$$;

COMMENT ON FUNCTION orch8.create_instance(
    text, uuid, jsonb, jsonb, integer, text, timestamptz, uuid, text
) IS
'Start an instance of a sequence version: context {data, config, runtime}, its tree '
'started (the root list, its first block ready at next_fire_at, default now), scheduled. '
'A repeated idempotency_key returns the existing instance with deduplicated = true. '
'Context over orch8.max_context_bytes (default: the limit context_bytes, 262144): O8008. '
'A child (p_parent_instance_id, and p_parent_path for a sub_sequence node) is one level '
'deeper than its parent, at most sub_sequence_depth (else O8008). The sequence''s '
'input_schema is checked by the front ends (docs/WORKFLOWS.md), not here. Notifies '
'channel orch8_work so idle runners wake.';

CREATE OR REPLACE FUNCTION orch8.reclaim_expired_leases(p_limit integer DEFAULT 100)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_row record;
    v_inst orch8.task_instances;
    v_node orch8.execution_nodes;
    v_count integer := 0;
BEGIN
    -- Rare and bounded, so one node at a time through the functions that move nodes. The
    -- instance's row is locked with the node's, both skipped when busy (the one lock order
    -- of a tree is instance, then node).
    FOR v_row IN
        SELECT n.tenant_id, n.instance_id, n.path
        FROM orch8.execution_nodes AS n
        JOIN orch8.task_instances AS t ON t.tenant_id = n.tenant_id AND t.id = n.instance_id
        WHERE n.lease_token IS NOT NULL AND n.lease_expires_at < orch8.now()
        ORDER BY n.lease_expires_at
        LIMIT greatest(p_limit, 0)
        FOR UPDATE OF t, n SKIP LOCKED
    LOOP
        SELECT * INTO v_inst FROM orch8.task_instances AS t
        WHERE t.tenant_id = v_row.tenant_id AND t.id = v_row.instance_id;
        SELECT * INTO v_node FROM orch8.execution_nodes AS n
        WHERE n.tenant_id = v_row.tenant_id AND n.instance_id = v_row.instance_id
          AND n.path = v_row.path;
        IF v_node.cancel_requested OR v_inst.requested_state IS NOT NULL THEN
            -- Cancelled or paused, the step will not begin again soon, and beginning it
            -- again is what would notice a receipt the lost runner left dispatched. Say
            -- now that its outcome is unknown, so it reaches the operator queue and can be
            -- resolved (a dispatched receipt cannot be).
            PERFORM orch8.cas_effect_receipt(r.tenant_id, r.id, 'dispatched', 'unknown',
                jsonb_build_object(
                    'actor', 'lease-sweep',
                    'note', 'the runner lost its lease before it recorded the step',
                    'error', format('outcome unknown: the lease expired and the %s was %s',
                                    CASE WHEN v_node.cancel_requested THEN 'node'
                                         ELSE 'instance' END,
                                    CASE WHEN v_node.cancel_requested THEN 'cancelled'
                                         ELSE v_inst.requested_state::text || ' as requested' END)))
            FROM orch8.effect_receipts AS r
            WHERE r.tenant_id = v_row.tenant_id AND r.instance_id = v_row.instance_id
              AND r.block_id = v_row.path AND r.state = 'dispatched';
            PERFORM orch8.schedule_verification(r.tenant_id, r.id, 'lease-sweep')
            FROM orch8.effect_receipts AS r
            WHERE r.tenant_id = v_row.tenant_id AND r.instance_id = v_row.instance_id
              AND r.block_id = v_row.path AND r.state = 'unknown';
        END IF;
        IF v_node.cancel_requested THEN
            PERFORM orch8.end_node(v_inst, v_row.path, 'cancelled', NULL, NULL, NULL);
        ELSE
            UPDATE orch8.execution_nodes AS n
            SET state = 'ready', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                next_fire_at = orch8.now(), updated_at = orch8.now()
            WHERE n.tenant_id = v_row.tenant_id AND n.instance_id = v_row.instance_id
              AND n.path = v_row.path;
        END IF;
        PERFORM orch8.sync_instance(v_row.tenant_id, v_row.instance_id, 'lease-sweep',
                                    'lease expired');
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END
$$;

COMMENT ON FUNCTION orch8.reclaim_expired_leases(integer) IS
'Bounded sweep: up to p_limit nodes whose lease expired go back to ready (the next '
'begin_step of that node finds a receipt the lost runner left dispatched and makes it '
'unknown), or, in a cancelled subtree, end cancelled; when the node or its instance was '
'cancelled or paused meanwhile, a receipt the lost runner left dispatched becomes unknown '
'at once (for the operator queue) and its step''s verifier is scheduled. The instance '
'follows (sync_instance). Returns how many. claim_due_nodes runs it.';

CREATE OR REPLACE FUNCTION orch8.claim_due_nodes(
    p_worker_id text, p_batch integer, p_lease interval DEFAULT '30 seconds'
)
RETURNS SETOF orch8.execution_nodes
LANGUAGE plpgsql
-- Every statement here touches a batch, never the backlog. Right after a bulk start the
-- statistics still say the tables are nearly empty, and the planner then sorted every due
-- node (an external sort of 100,000 rows) and hashed them all to update 256: ten times
-- slower. Without sorts and hash joins it walks the ready index in order and probes by key;
-- without sequential scans the batch's rows are reached by ctid (a TID scan) even when the
-- statistics say the table is a page or two.
-- JIT off: the sorts admit_nodes cannot avoid then cost 1e10, far over the JIT thresholds,
-- and every claim of a keyed node compiled them (555 ms a claim instead of 4 ms).
SET enable_sort = off
SET enable_hashjoin = off
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_due orch8.execution_nodes [];
    v_node_rows tid [];
    v_inst_rows tid [];
BEGIN
    IF p_worker_id IS NULL OR p_worker_id = '' OR p_batch IS NULL OR p_batch < 1
       OR p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION 'claim_due_nodes needs a worker id, a batch >= 1 and a positive lease'
            USING ERRCODE = 'O8008';
    END IF;
    PERFORM orch8.reclaim_expired_leases(p_batch);
    PERFORM orch8.sweep_worker_tasks(p_batch);  -- workers' leases and timeouts
    -- timers first, so what they ready is claimed in this very call
    PERFORM orch8.fire_timers(4 * p_batch);
    PERFORM orch8.fire_deadlines(4 * p_batch);  -- before the claim: a step past it fails
    PERFORM orch8.fire_slas(p_batch);
    -- The instance's row is locked with the node's, and both are skipped when busy: every
    -- other move of a tree locks the instance first (one lock order), and a busy instance
    -- is some other runner's moment. A node whose concurrency key looks full is passed
    -- over here, so that a crowd of them does not fill the batch; admit_nodes decides
    -- under the key's lock.
    WITH due AS (
        SELECT n AS node, n.priority, n.next_fire_at, n.ctid AS node_row, t.ctid AS inst_row
        FROM orch8.execution_nodes AS n
        JOIN orch8.task_instances AS t ON t.tenant_id = n.tenant_id AND t.id = n.instance_id
        WHERE n.state = 'ready' AND n.next_fire_at <= orch8.now()
          AND t.state IN ('scheduled', 'running', 'waiting')
          AND t.requested_state IS DISTINCT FROM 'paused'
          AND (n.concurrency_key IS NULL OR n.worker_task_id IS NOT NULL
               OR n.max_concurrency > (
                   SELECT count(*) FROM orch8.execution_nodes AS h
                   WHERE h.tenant_id = n.tenant_id AND h.concurrency_key = n.concurrency_key
                     AND (h.lease_token IS NOT NULL OR h.worker_task_id IS NOT NULL)))
        ORDER BY n.priority DESC, n.next_fire_at
        LIMIT p_batch
        FOR UPDATE OF n, t SKIP LOCKED
    )
    -- The rows are locked by this transaction until it ends, so their versions stay where
    -- the claim found them: the two UPDATEs below reach them by ctid (a TID scan) instead
    -- of probing both primary keys again for each node.
    SELECT coalesce(array_agg(d.node ORDER BY d.priority DESC, d.next_fire_at),
                    ARRAY[]::orch8.execution_nodes []),
           coalesce(array_agg(d.node_row ORDER BY d.priority DESC, d.next_fire_at),
                    ARRAY[]::tid []),
           coalesce(array_agg(d.inst_row ORDER BY d.priority DESC, d.next_fire_at),
                    ARRAY[]::tid [])
    INTO v_due, v_node_rows, v_inst_rows FROM due AS d;
    IF EXISTS (SELECT 1 FROM unnest(v_due) AS c
               WHERE c.concurrency_key IS NOT NULL OR c.rate_limit_key IS NOT NULL) THEN
        v_due := orch8.admit_nodes(v_due);
        -- the rows of the admitted ones (admit_nodes writes only those it defers)
        SELECT coalesce(array_agg(n.ctid), ARRAY[]::tid []),
               coalesce(array_agg(t.ctid), ARRAY[]::tid [])
        INTO v_node_rows, v_inst_rows
        FROM unnest(v_due) AS d
        JOIN orch8.execution_nodes AS n
            ON n.tenant_id = d.tenant_id AND n.instance_id = d.instance_id AND n.path = d.path
        JOIN orch8.task_instances AS t ON t.tenant_id = d.tenant_id AND t.id = d.instance_id;
    END IF;
    -- their instances run now: one statement (the trigger writes each one's transition)
    PERFORM orch8.attribute_transition(p_worker_id, NULL);
    UPDATE orch8.task_instances AS t SET state = 'running', updated_at = orch8.now()
    WHERE t.ctid = ANY(v_inst_rows) AND t.state <> 'running';
    -- and the nodes, answered in the claim's order (the claim changes neither priority nor
    -- next_fire_at), ties by creation
    RETURN QUERY
    WITH claimed AS (
        UPDATE orch8.execution_nodes AS n
        SET state = 'running', lease_owner = p_worker_id, lease_token = gen_random_uuid(),
            lease_expires_at = orch8.now() + p_lease, deferred_by = NULL,
            updated_at = orch8.now()
        WHERE n.ctid = ANY(v_node_rows)
        RETURNING n.*
    )
    SELECT * FROM claimed AS c
    ORDER BY c.priority DESC, c.next_fire_at, c.instance_id, c.path;
END
$$;

COMMENT ON FUNCTION orch8.claim_due_nodes(text, integer, interval) IS
'One round trip for a batch: reclaim up to p_batch expired node leases, fire up to '
'4 * p_batch due timers (fire_timers: sleeps end, waits time out) and as many passed '
'step deadlines (fire_deadlines), up to p_batch missed instance slas (fire_slas), then '
'claim up to '
'p_batch due ready nodes of instances that are not paused (priority, then next_fire_at; '
'FOR UPDATE SKIP LOCKED, the node''s instance locked with it) that admit_nodes admits '
'(concurrency keys, rate limits), each with a fresh lease '
'token and expiry now + p_lease; their instances become running. Every later write for '
'a node carries its token.';

CREATE OR REPLACE FUNCTION orch8.lock_leased_instance(
    p_tenant_id text, p_instance_id uuid, p_lease_token uuid
)
RETURNS orch8.task_instances
LANGUAGE plpgsql
AS $$
DECLARE
    v_row orch8.task_instances;
    v_node orch8.execution_nodes;
BEGIN
    SELECT * INTO v_row FROM orch8.task_instances AS t
     WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id
     FOR UPDATE;
    IF v_row.id IS NULL THEN
        RAISE EXCEPTION 'instance % not found', p_instance_id
            USING ERRCODE = 'O8007', DETAIL = json_build_object('instance_id', p_instance_id)::text;
    END IF;
    SELECT * INTO v_node FROM orch8.execution_nodes AS n
     WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id
       AND n.lease_token = p_lease_token;
    IF v_node.path IS NULL OR v_node.lease_expires_at < orch8.now() THEN
        RAISE EXCEPTION 'lease on instance % is no longer held by this caller', p_instance_id
            USING ERRCODE = 'O8001',
                  DETAIL = json_build_object('instance_id', p_instance_id,
                                             'current_state', v_row.state,
                                             'lease_owner', v_node.lease_owner)::text;
    END IF;
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION orch8.lock_leased_instance(text, uuid, uuid) IS
'Lock an instance for a write by the holder of one of its nodes'' leases; a token that '
'no node of the instance holds, or an expired lease, raises O8001 stale_lease (the caller '
'stops quietly).';

CREATE OR REPLACE FUNCTION orch8.heartbeat_leases(p_lease_tokens uuid[], p_lease interval)
RETURNS SETOF uuid
LANGUAGE plpgsql
AS $$
DECLARE
    v_extended uuid[];
BEGIN
    -- A negative lease would report the lease held while setting it in the past.
    IF p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION 'heartbeat_leases needs a positive lease, got %',
            coalesce(p_lease::text, 'NULL') USING ERRCODE = 'O8008';
    END IF;
    -- Locked in the order group-committed batches lock their instances (tenant, instance):
    -- a heartbeat and a batch then never wait on each other in a cycle.
    WITH held AS (
        SELECT n.tenant_id, n.instance_id, n.path FROM orch8.execution_nodes AS n
        WHERE n.lease_token = ANY(p_lease_tokens) AND n.lease_expires_at >= orch8.now()
        ORDER BY n.tenant_id, n.instance_id, n.path
        FOR UPDATE
    ), extended AS (
        UPDATE orch8.execution_nodes AS n
        SET lease_expires_at = orch8.now() + p_lease
        FROM held AS h
        WHERE n.tenant_id = h.tenant_id AND n.instance_id = h.instance_id AND n.path = h.path
          AND n.lease_expires_at >= orch8.now()
        RETURNING n.lease_token
    )
    SELECT coalesce(array_agg(e.lease_token), '{}') INTO v_extended FROM extended AS e;
    -- A lease handed over to the instance's next node while this waited for the lock
    -- is on a row the statement above did not see; this one, with a new snapshot, does.
    RETURN QUERY SELECT t.token FROM unnest(v_extended) AS t (token);
    -- It must not wait: holding the rows of the first statement, a wait here can close a
    -- cycle with a batch that holds the row it wants and wants one of those (four to
    -- eight deadlocks a run in test_runner_edges). A row a batch holds now is skipped, and
    -- its token answered as held without being extended: the row names it with a lease
    -- not expired, and the lock is a begin or finish of the same runner, milliseconds
    -- long; the next heartbeat extends it.
    RETURN QUERY
    WITH again AS (
        SELECT n.tenant_id, n.instance_id, n.path, n.lease_token FROM orch8.execution_nodes AS n
        WHERE n.lease_token = ANY(p_lease_tokens) AND NOT n.lease_token = ANY(v_extended)
          AND n.lease_expires_at >= orch8.now()
    ), locked AS (
        SELECT n.tenant_id, n.instance_id, n.path FROM orch8.execution_nodes AS n
        JOIN again AS a
            ON n.tenant_id = a.tenant_id AND n.instance_id = a.instance_id AND n.path = a.path
        ORDER BY n.tenant_id, n.instance_id, n.path
        FOR UPDATE OF n SKIP LOCKED
    ), extended AS (
        UPDATE orch8.execution_nodes AS n
        SET lease_expires_at = orch8.now() + p_lease
        FROM locked AS l
        WHERE n.tenant_id = l.tenant_id AND n.instance_id = l.instance_id AND n.path = l.path
          AND n.lease_token = ANY(p_lease_tokens) AND n.lease_expires_at >= orch8.now()
        RETURNING n.lease_token
    )
    SELECT e.lease_token FROM extended AS e
    UNION ALL
    SELECT a.lease_token FROM again AS a
    WHERE NOT EXISTS (
        SELECT 1 FROM locked AS l
        WHERE l.tenant_id = a.tenant_id AND l.instance_id = a.instance_id AND l.path = a.path);
END
$$;

COMMENT ON FUNCTION orch8.heartbeat_leases(uuid[], interval) IS
'Extend every still-held node lease among p_lease_tokens to now + p_lease in one '
'statement, locking the nodes in (tenant, instance, path) order, the order in which '
'begin_steps and finish_steps take their calls, then in a second statement, without '
'waiting (SKIP LOCKED), the leases handed over to another node while it waited (one '
'whose node a batch holds at that moment is answered held, not extended: the next '
'heartbeat extends it); so a heartbeat and a batch never deadlock. Returns the tokens '
'still held (a missing one was lost: stop work on that node). A lease that is NULL or '
'not positive: O8008.';

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
DECLARE
    v_row orch8.task_instances;
BEGIN
    IF NOT orch8.instance_can_transition(p_expected, p_next) THEN
        RAISE EXCEPTION 'instance % cannot move from % to %', p_instance_id, p_expected, p_next
            USING ERRCODE = 'O8004',
                  DETAIL = json_build_object('instance_id', p_instance_id,
                                             'from_state', p_expected, 'to_state', p_next)::text;
    END IF;
    IF p_next = 'running' THEN
        -- running means a node holds a lease, which only a claim issues
        RAISE EXCEPTION 'instance % moves to running only by a claim', p_instance_id
            USING ERRCODE = 'O8004', HINT = 'orch8.claim_due_nodes';
    END IF;
    PERFORM orch8.attribute_transition(p_actor, p_reason);
    UPDATE orch8.task_instances AS t
    SET state = p_next,
        updated_at = orch8.now(),
        next_fire_at = coalesce(p_next_fire_at,
                                CASE WHEN p_next = 'scheduled' THEN orch8.now()
                                     ELSE t.next_fire_at END),
        error = CASE WHEN p_next = 'failed' THEN p_reason
                     WHEN p_next IN ('scheduled', 'waiting', 'completed') THEN NULL
                     ELSE t.error END,
        -- a request holds until it is met, or the instance ends
        requested_state = CASE WHEN p_next = t.requested_state
                                    OR p_next IN ('completed', 'failed', 'cancelled')
                               THEN NULL ELSE t.requested_state END,
        requested_by = CASE WHEN p_next = t.requested_state
                                 OR p_next IN ('completed', 'failed', 'cancelled')
                            THEN NULL ELSE t.requested_by END,
        requested_reason = CASE WHEN p_next = t.requested_state
                                     OR p_next IN ('completed', 'failed', 'cancelled')
                                THEN NULL ELSE t.requested_reason END
    WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id AND t.state = p_expected
    RETURNING t.* INTO v_row;
    IF v_row.id IS NULL THEN
        RETURN false;
    END IF;
    IF p_next IN ('completed', 'failed', 'cancelled') AND v_row.parent_instance_id IS NOT NULL
    THEN
        PERFORM orch8.child_ended(v_row);
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
'illegal pair raises O8004) and write the audit row. A requested pause or cancel holds '
'until the instance reaches it or ends. A child that ends (completed, failed, cancelled) '
'makes its parent''s sub_sequence node ready (child_ended). Returns false when the '
'instance was not in p_expected (never retried).';

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
BEGIN
    PERFORM orch8.lock_leased_instance(p_tenant_id, p_instance_id, p_lease_token);
    UPDATE orch8.execution_nodes AS n
    SET state = 'ready', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        next_fire_at = coalesce(p_next_fire_at, orch8.now()), updated_at = orch8.now()
    WHERE n.tenant_id = p_tenant_id AND n.instance_id = p_instance_id
      AND n.lease_token = p_lease_token;
    PERFORM orch8.sync_instance(p_tenant_id, p_instance_id,
        CASE WHEN (SELECT t.requested_state FROM orch8.task_instances AS t
                   WHERE t.tenant_id = p_tenant_id AND t.id = p_instance_id) IS NOT NULL
             THEN 'operator' ELSE 'runner' END,
        p_reason);
END
$$;

COMMENT ON FUNCTION orch8.release_lease(text, uuid, uuid, timestamptz, text) IS
'The lease holder hands its node back to ready (at p_next_fire_at, default now): on '
'graceful shutdown. The instance follows (scheduled, or the pause requested meanwhile). '
'Stale token: O8001.';

CREATE OR REPLACE FUNCTION orch8.compute_attempt(
    p_tenant_id text, p_instance_id uuid, p_block_id text
)
RETURNS integer
LANGUAGE plpgsql
STABLE
AS $$
BEGIN
    -- PL/pgSQL so that the plan is made once per session (node_vars says why)
    RETURN coalesce(
        (SELECT CASE WHEN o.sentinel IN ('__in_progress__', '__unsettled__') THEN o.attempt
                     ELSE o.attempt + 1 END
           FROM orch8.block_outputs AS o
          WHERE o.tenant_id = p_tenant_id AND o.instance_id = p_instance_id
            AND o.block_id = p_block_id
          ORDER BY o.seq DESC
          LIMIT 1),
        0);
END
$$;

COMMENT ON FUNCTION orch8.compute_attempt(text, uuid, text) IS
'The attempt number of a block''s next run, from the latest block_outputs row: none -> 0; '
'__in_progress__ (a crash resumes it) and __unsettled__ (its outcome is not settled yet) '
'-> the same attempt, whose receipt then blocks a second send; anything else -> previous '
'+ 1.';

CREATE OR REPLACE FUNCTION orch8.insert_block_output(
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
LANGUAGE plpgsql  -- not sql: PostgreSQL 15 plans a SQL function's body again at each call
AS $$
BEGIN
    INSERT INTO orch8.block_outputs (
        tenant_id, instance_id, block_id, attempt, sentinel, output, retryable, effect_id,
        lease_token
    ) VALUES (
        p_tenant_id, p_instance_id, p_block_id, p_attempt, p_sentinel, p_output, p_retryable,
        p_effect_id, p_lease_token
    );
END
$$;

COMMENT ON FUNCTION orch8.insert_block_output(
    text, uuid, text, integer, text, jsonb, boolean, uuid, uuid
) IS
'The one INSERT into block_outputs (internal helper). It does not look at the receipt an '
'effect id names: call it only with a receipt just written or already checked '
'(require_own_receipt), else call record_block_output.';

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
    PERFORM orch8.insert_block_output(p_tenant_id, p_instance_id, p_block_id, p_attempt,
        p_sentinel, p_output, p_retryable, p_effect_id, p_lease_token);
END
$$;

COMMENT ON FUNCTION orch8.record_block_output(
    text, uuid, text, integer, text, jsonb, boolean, uuid, uuid
) IS
'A block_outputs row (internal helper: callers check the lease first). lease_token is the '
'claim that wrote the row, NULL for an operator''s retry. An effect id must name a receipt '
'of this instance and block (require_own_receipt, O8009); insert_block_output skips that '
'read for a receipt the caller holds.';

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
RETURNS orch8.effect_receipts
LANGUAGE plpgsql
STABLE
-- planned at each call, never from a plan cached while the table was nearly empty: that
-- plan walks the tenant's whole receipts index (docs/ARCHITECTURE.md, "Lookups planned
-- for the table they meet")
SET plan_cache_mode = force_custom_plan
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
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION orch8.require_own_receipt(text, uuid, uuid, text, integer) IS
'The receipt, after checking it is this instance''s and block''s (and, when given, '
'attempt''s): O8009 otherwise, so a caller holding one instance''s lease cannot settle or '
'cite another''s receipt. A receipt that does not exist (lost with a failed primary) '
'passes as NULL: finish_step records it again (recover_lost_receipt).';

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
    block_id text,
    kind text,
    node_position integer,
    phase text,
    child_instance_id uuid,
    vars jsonb,
    parent_instance_id uuid,
    lease_token uuid,
    progress jsonb,
    context_version integer,
    worker_result jsonb
)
LANGUAGE plpgsql
AS $$
DECLARE
    v_claimed orch8.execution_nodes [];
BEGIN
    -- Two statements on purpose. The claim takes fresh snapshots inside, so it may claim
    -- a node readied by a transaction that committed after this call began; the STABLE
    -- reads below would still see the snapshot of the statement that called them. Read in
    -- a statement that starts after the claim, they see what it saw (the output a verifier
    -- recorded with the move to ready, the __retry__ row of a retry).
    v_claimed := ARRAY(SELECT c FROM orch8.claim_due_nodes(p_worker_id, p_batch, p_lease) AS c);
    RETURN QUERY
    SELECT
        -- ::jsonb, ::text: RETURN QUERY wants the declared types, not their domains
        c.tenant_id, c.instance_id, t.sequence_id, t.sequence_version, t.context::jsonb,
        c.path, orch8.compute_attempt(c.tenant_id, c.instance_id, c.path), c.block_id,
        c.kind::text,
        c.position, c.items ->> 'asking', c.child_instance_id,
        orch8.node_vars(c.tenant_id, c.instance_id, c.path),
        t.parent_instance_id, c.lease_token, orch8.instance_progress(c.tenant_id, c.instance_id),
        t.context_version,
        CASE WHEN c.worker_task_id IS NOT NULL THEN (
            SELECT jsonb_build_object('task_id', w.id, 'effect_id', w.effect_id,
                                      'result', w.result, 'error', w.error,
                                      'code', w.error_code, 'retryable', w.retryable,
                                      'evidence', w.evidence, 'state', w.state)
            FROM orch8.worker_tasks AS w
            WHERE w.tenant_id = c.tenant_id AND w.id = c.worker_task_id) END
    FROM unnest(v_claimed) AS c
    JOIN orch8.task_instances AS t ON t.tenant_id = c.tenant_id AND t.id = c.instance_id;
END
$$;

COMMENT ON FUNCTION orch8.claim_work(text, integer, interval) IS
'The runner''s claim: claim_due_nodes plus, per node, what running it needs: its '
'instance''s context (and its context_version), its path, attempt (compute_attempt), '
'block id, kind, position and '
'what it asks for (a loop''s condition or break_on, a collection, a route), its child '
'instance, its variables (node_vars) and the outputs of the whole instance, so a batch '
'costs one round trip and the steps that follow need no further reads. The attempt and '
'outputs are read after the claim, in a statement of their own, so they include what '
'the transaction that readied the node wrote. worker_result, for a step whose worker '
'task failed or timed out (its node ready for the runner''s decision): the task''s id, '
'effect id, result, error, code, retryable, evidence and state, for finish_step.';
