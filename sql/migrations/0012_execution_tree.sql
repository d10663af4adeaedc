-- The execution tree (docs/ARCHITECTURE.md, "Composite blocks: the execution tree"):
-- execution_nodes with their own leases replace the instance's cursor and lease, and
-- sequence_blocks indexes every block of a stored definition by id. The structure of the
-- language (which fields of which block hold blocks, and what they bind) is defined here
-- once, in block_containers(); definition_blocks() walks a definition with it. Instances
-- in flight get their tree at the end of this file. The interpreter is
-- sql/functions/tree.sql.

-- The structure of the language ------------------------------------------------------------

CREATE FUNCTION orch8.block_containers()
RETURNS TABLE (type text, field text, shape text, binds text)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
ROWS 13
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
    ('saga', 'blocks', 'list', NULL)
$$;

COMMENT ON FUNCTION orch8.block_containers() IS
'Where blocks hold blocks: per type (definition for the top level) the field and its '
'shape (list: an array of blocks; lists: an array of arrays, the branches; routes: an '
'array of {condition, blocks}), and the variables the field binds for the blocks inside '
'(item: a for_each''s item_var and index_var; iteration: a loop''s count; error: the '
'failure being handled). The one description of the tree''s shape: the validator, the '
'walker and the runner (rules.py) read it.';

CREATE FUNCTION orch8.for_each_vars(p_block jsonb)
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT ARRAY[coalesce(p_block ->> 'item_var', 'item'), coalesce(p_block ->> 'index_var', 'index')]
$$;

COMMENT ON FUNCTION orch8.for_each_vars(jsonb) IS
'The two names a for_each binds in its body: item_var (default item) and index_var '
'(default index).';

CREATE FUNCTION orch8.definition_blocks_under(
    p_holder jsonb,
    p_type text,
    p_parent_id text,
    p_depth integer,
    p_at text,
    p_vars text[],
    p_sort_key integer[]
)
RETURNS TABLE (
    block_id text,
    type text,
    parent_id text,
    parent_type text,
    depth integer,
    json_path text,
    scope_vars text[],
    sort_key integer[],
    definition jsonb
)
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
AS $$
DECLARE
    v_c record;
    v_list record;
    v_block record;
    v_vars text [];
BEGIN
    -- a walk in PL/pgSQL, not a recursive CTE: the CTE's row estimates grow with every
    -- jsonb_array_elements and set off JIT compilation (most of a second) for a few blocks
    IF p_depth > 200 THEN
        RETURN;
    END IF;
    FOR v_c IN
        SELECT c.field, c.shape, c.binds, c.k
        FROM orch8.block_containers() WITH ORDINALITY AS c (type, field, shape, binds, k)
        WHERE c.type = p_type
        ORDER BY c.k
    LOOP
        v_vars := p_vars || CASE v_c.binds
            WHEN 'item' THEN orch8.for_each_vars(p_holder)
            WHEN 'iteration' THEN ARRAY['iteration']
            WHEN 'error' THEN ARRAY['error']
            ELSE ARRAY[]::text [] END;
        FOR v_list IN
            SELECT l.blocks, l.n, l.at
            FROM (
                SELECT p_holder -> v_c.field AS blocks, 0::bigint AS n,
                       format('.%s', v_c.field) AS at
                WHERE v_c.shape = 'list'
                UNION ALL
                SELECT b.value, b.n, format('.%s[%s]', v_c.field, b.n - 1)
                FROM jsonb_array_elements(CASE WHEN v_c.shape = 'lists'
                         AND jsonb_typeof(p_holder -> v_c.field) = 'array'
                         THEN p_holder -> v_c.field END) WITH ORDINALITY AS b (value, n)
                UNION ALL
                SELECT r.value -> 'blocks', r.n, format('.%s[%s].blocks', v_c.field, r.n - 1)
                FROM jsonb_array_elements(CASE WHEN v_c.shape = 'routes'
                         AND jsonb_typeof(p_holder -> v_c.field) = 'array'
                         THEN p_holder -> v_c.field END) WITH ORDINALITY AS r (value, n)
            ) AS l
            WHERE jsonb_typeof(l.blocks) = 'array'
            ORDER BY l.n
        LOOP
            FOR v_block IN
                SELECT e.value, e.n FROM jsonb_array_elements(v_list.blocks) WITH ORDINALITY AS e (value, n)
            LOOP
                block_id := v_block.value ->> 'id';
                type := v_block.value ->> 'type';
                parent_id := p_parent_id;
                parent_type := p_type;
                depth := p_depth;
                json_path := format('%s%s[%s]', p_at, v_list.at, v_block.n - 1);
                scope_vars := v_vars;
                sort_key := p_sort_key || ARRAY[v_c.k::integer, v_list.n::integer, v_block.n::integer];
                definition := v_block.value;
                RETURN NEXT;
                IF jsonb_typeof(v_block.value) = 'object' THEN
                    RETURN QUERY SELECT * FROM orch8.definition_blocks_under(
                        v_block.value, v_block.value ->> 'type', v_block.value ->> 'id',
                        p_depth + 1, json_path, v_vars, sort_key);
                END IF;
            END LOOP;
        END LOOP;
    END LOOP;
END
$$;

COMMENT ON FUNCTION orch8.definition_blocks_under(
    jsonb, text, text, integer, text, text[], integer[]
) IS
'definition_blocks'' walk below one holder (the definition, or a block of type p_type), '
'in document order.';

CREATE FUNCTION orch8.definition_blocks(p_definition jsonb)
RETURNS TABLE (
    block_id text,
    type text,
    parent_id text,
    parent_type text,
    depth integer,
    json_path text,
    scope_vars text[],
    sort_key integer[],
    definition jsonb
)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
ROWS 20
AS $$
    SELECT * FROM orch8.definition_blocks_under(
        p_definition, 'definition', NULL, 1, '$', ARRAY[]::text [], ARRAY[]::integer [])
    WHERE jsonb_typeof(p_definition) = 'object'
$$;

COMMENT ON FUNCTION orch8.definition_blocks(jsonb) IS
'Every block of a definition, at any depth (walked along block_containers()): its id, '
'type, parent block (NULL at the top level; parent_type definition), depth (1 at the top '
'level), JSON path ($.blocks[0].branches[1][0]), the variables bound around it '
'(scope_vars), a key that sorts the blocks in document order (sort_key; rows come in '
'that order) and its JSON. Blocks that are not objects are listed too (id NULL).';

-- The path grammar (docs/ARCHITECTURE.md, "Node paths") ---------------------------------

CREATE FUNCTION orch8.node_block_id(p_path text)
RETURNS text
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
    SELECT nullif(regexp_replace(regexp_replace(p_path, '^.*/', ''), '[#\[.].*$', ''), '')
$$;

COMMENT ON FUNCTION orch8.node_block_id(text) IS
'The block id a node path names: its last segment up to the first marker (# [ .); NULL '
'for a list that belongs to no block (the root, on_failure, on_cancel).';

CREATE FUNCTION orch8.child_path(p_parent text, p_id text)
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_parent = '' THEN p_id ELSE p_parent || '/' || p_id END
$$;

COMMENT ON FUNCTION orch8.child_path(text, text) IS
'The path of block p_id in the list at p_parent: the id alone at the top level, else '
'parent/id.';

CREATE FUNCTION orch8.compensated_path(p_path text)
RETURNS text
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_path ~ '\.undo/[^/]+$'
                THEN regexp_replace(p_path, '\.undo/([^/]+)$', '/\1') END
$$;

COMMENT ON FUNCTION orch8.compensated_path(text) IS
'For the path of a compensation (saga.undo/step), the path of the step it compensates '
'(saga/step); NULL for any other path.';

CREATE FUNCTION orch8.in_subtree(p_path text, p_root text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
    SELECT p_root = '' OR p_path = p_root
           OR (left(p_path, length(p_root)) = p_root
               AND substr(p_path, length(p_root) + 1, 1) IN ('/', '#', '[', '.'))
$$;

COMMENT ON FUNCTION orch8.in_subtree(text, text) IS
'Whether the node at p_path is p_root or below it (every node is below the root '''').';

-- Blocks by id ------------------------------------------------------------------------------

CREATE TABLE orch8.sequence_blocks (
    tenant_id text NOT NULL,
    sequence_id uuid NOT NULL,
    block_id text NOT NULL,
    type text,
    parent_id text,
    depth integer NOT NULL,
    definition jsonb NOT NULL,
    PRIMARY KEY (tenant_id, sequence_id, block_id),
    FOREIGN KEY (tenant_id, sequence_id) REFERENCES orch8.sequences (tenant_id, id)
);

COMMENT ON TABLE orch8.sequence_blocks IS
'Every block of every stored definition, by id: what the interpreter looks up instead of '
'walking the definition. Written by the trigger sequences_index_blocks when a sequence is '
'stored; never changed (block ids are unique in a definition; in one stored before that '
'was checked, the first in document order wins).';

CREATE TRIGGER sequence_blocks_immutable
BEFORE UPDATE OR DELETE ON orch8.sequence_blocks
FOR EACH ROW EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE FUNCTION orch8.sequences_index_blocks()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO orch8.sequence_blocks (
        tenant_id, sequence_id, block_id, type, parent_id, depth, definition
    )
    SELECT DISTINCT ON (b.block_id)
        new.tenant_id, new.id, b.block_id, b.type, b.parent_id, b.depth, b.definition
    FROM orch8.definition_blocks(new.definition) AS b
    WHERE b.block_id IS NOT NULL AND b.block_id <> ''
    ORDER BY b.block_id, b.sort_key
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.sequences_index_blocks() IS
'Trigger: index a stored sequence''s blocks in sequence_blocks (definition_blocks).';

CREATE TRIGGER sequences_index_blocks
AFTER INSERT ON orch8.sequences
FOR EACH ROW EXECUTE FUNCTION orch8.sequences_index_blocks();

INSERT INTO orch8.sequence_blocks (
    tenant_id, sequence_id, block_id, type, parent_id, depth, definition
)
SELECT DISTINCT ON (s.tenant_id, s.id, b.block_id)
    s.tenant_id,
    s.id,
    b.block_id,
    b.type,
    b.parent_id,
    b.depth,
    b.definition
FROM orch8.sequences AS s
CROSS JOIN LATERAL orch8.definition_blocks(s.definition) AS b
WHERE b.block_id IS NOT NULL AND b.block_id <> ''
ORDER BY s.tenant_id, s.id, b.block_id, b.sort_key
ON CONFLICT DO NOTHING;

-- Nodes ---------------------------------------------------------------------------------------

CREATE TYPE orch8.node_state AS ENUM (
    'ready', 'running', 'waiting', 'blocked', 'completed', 'failed', 'skipped', 'cancelled'
);

COMMENT ON TYPE orch8.node_state IS
'States of an execution node; moves are limited to orch8.node_can_transition().';

-- What finish_step, decide and run_child answer, declared once.
CREATE TYPE orch8.tree_answer AS (
    state orch8.instance_state,
    next_block text,
    next_attempt integer,
    next_block_id text,
    next_kind text,
    next_position integer,
    next_phase text,
    next_child_instance_id uuid,
    next_vars jsonb,
    progress jsonb
);

COMMENT ON TYPE orch8.tree_answer IS
'A runner call''s answer (finish_step, decide, run_child, built by node_answer): the '
'instance''s state and, when a node was handed over under the same lease, that node: '
'path, attempt, block id, kind, position, what it asks for, its child instance, its '
'variables, and the instance''s outputs (NULL when the caller has seen them).';

CREATE FUNCTION orch8.node_can_transition(p_from orch8.node_state, p_to orch8.node_state)
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
        WHEN 'waiting' THEN p_to IN ('ready', 'blocked', 'completed', 'failed', 'cancelled')
        WHEN 'blocked' THEN p_to IN ('ready', 'waiting', 'completed', 'failed', 'cancelled')
        WHEN 'failed' THEN p_to IN ('ready', 'running', 'completed')
        WHEN 'cancelled' THEN p_to IN ('ready', 'running', 'waiting', 'blocked')
        ELSE false
    END
$$;

COMMENT ON FUNCTION orch8.node_can_transition(orch8.node_state, orch8.node_state) IS
'The node transition table: ready->running|cancelled; running->ready (a retry''s backoff, '
'a lease handed back or expired)|waiting|blocked|completed|failed|skipped|cancelled; '
'waiting->ready|blocked|completed|failed|cancelled; blocked->ready|waiting|completed|'
'failed|cancelled (settled by a verifier or an operator); failed->ready|running|completed '
'(an operator''s retry); cancelled->ready|running|waiting|blocked (a retry restores what '
'the failure it undoes had cancelled). completed and skipped are final.';

CREATE VIEW orch8.node_transition_table AS
SELECT
    f.state AS from_state,
    t.state AS to_state
FROM unnest(enum_range(NULL::orch8.node_state)) AS f (state)
CROSS JOIN unnest(enum_range(NULL::orch8.node_state)) AS t (state)
WHERE orch8.node_can_transition(f.state, t.state);

COMMENT ON VIEW orch8.node_transition_table IS
'Every allowed node move, one row each (generated from node_can_transition).';

CREATE FUNCTION orch8.node_kinds()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT ARRAY['sequence', 'step', 'compensation', 'parallel', 'race', 'loop', 'for_each',
                 'router', 'try_catch', 'saga', 'undo', 'sub_sequence']
$$;

COMMENT ON FUNCTION orch8.node_kinds() IS
'What a node executes: sequence (a list of blocks: the root, a branch, an iteration, a '
'part of try_catch, a route, on_failure, on_cancel), a block type (step, parallel, race, '
'loop, for_each, router, try_catch, saga, sub_sequence), undo (a saga''s compensations) '
'or compensation (one of them).';

CREATE FUNCTION orch8.claimable_kinds()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT ARRAY['step', 'compensation', 'loop', 'for_each', 'router', 'sub_sequence'] $$;

COMMENT ON FUNCTION orch8.claimable_kinds() IS
'The node kinds a runner claims: steps and compensations (run a handler), loop, for_each '
'and router (evaluate a condition, a collection, the routes: orch8.decide) and '
'sub_sequence (start a child, then collect it: orch8.run_child). The others are moved by '
'SQL alone.';

CREATE TABLE orch8.execution_nodes (
    tenant_id text NOT NULL,
    instance_id uuid NOT NULL,
    path text NOT NULL,
    parent_path text,
    block_id text,
    kind text NOT NULL CHECK (kind = any(orch8.node_kinds())),
    state orch8.node_state NOT NULL,
    selector text[],
    position integer NOT NULL DEFAULT 0,
    items jsonb,
    vars jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(vars) = 'object'),
    priority integer NOT NULL DEFAULT 0,
    next_fire_at timestamptz NOT NULL DEFAULT orch8.now(),
    lease_owner text,
    lease_token uuid,
    lease_expires_at timestamptz,
    cancel_requested boolean NOT NULL DEFAULT false,
    cancel_reason text,
    state_before_cancel orch8.node_state,
    failed_child text,
    output jsonb,
    error text,
    child_instance_id uuid,
    created_at timestamptz NOT NULL DEFAULT orch8.now(),
    updated_at timestamptz NOT NULL DEFAULT orch8.now(),
    ended_at timestamptz,
    PRIMARY KEY (tenant_id, instance_id, path),
    FOREIGN KEY (tenant_id, instance_id) REFERENCES orch8.task_instances (tenant_id, id),
    -- a lease exists only on a running node
    CHECK (lease_token IS NULL OR state = 'running'),
    CHECK ((lease_token IS NULL) = (lease_expires_at IS NULL)),
    CHECK ((lease_token IS NULL) = (lease_owner IS NULL)),
    CHECK ((path = '') = (parent_path IS NULL))
) WITH (fillfactor = 80);

COMMENT ON TABLE orch8.execution_nodes IS
'The execution tree of each instance: one row per execution of a block (every '
'iteration, item, branch and compensation) and per list of blocks being walked, keyed by '
'its path (docs/ARCHITECTURE.md). Moved only by the functions of '
'sql/functions/tree.sql and steps.sql, along node_can_transition; never deleted. A '
'claimed node carries a lease (owner, token, expiry) that fences every write for it.';

-- The claim: due ready nodes by priority then time, across tenants.
CREATE INDEX execution_nodes_ready_idx ON orch8.execution_nodes (priority DESC, next_fire_at)
WHERE state = 'ready';
-- The lease sweep, and a lease by its token (heartbeats, fenced writes).
CREATE INDEX execution_nodes_lease_idx ON orch8.execution_nodes (lease_expires_at)
WHERE lease_token IS NOT NULL;
CREATE UNIQUE INDEX execution_nodes_token_idx ON orch8.execution_nodes (lease_token)
WHERE lease_token IS NOT NULL;

CREATE FUNCTION orch8.execution_nodes_guard()
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
    RETURN new;
END
$$;

COMMENT ON FUNCTION orch8.execution_nodes_guard() IS
'Trigger: a node keeps its identity, moves only along node_can_transition, and is never '
'deleted (O8004), whoever writes the row.';

CREATE TRIGGER execution_nodes_guard
BEFORE UPDATE OR DELETE ON orch8.execution_nodes
FOR EACH ROW EXECUTE FUNCTION orch8.execution_nodes_guard();

CREATE TRIGGER execution_nodes_no_truncate
BEFORE TRUNCATE ON orch8.execution_nodes
FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite();

SELECT orch8.enable_tenant_isolation('orch8.execution_nodes');
SELECT orch8.enable_tenant_isolation('orch8.sequence_blocks');

-- Instances: the tree holds the leases now ---------------------------------------------------

ALTER TABLE orch8.task_instances ADD COLUMN depth integer NOT NULL DEFAULT 0
CHECK (depth >= 0);
ALTER TABLE orch8.task_instances ADD COLUMN parent_path text;

COMMENT ON COLUMN orch8.task_instances.depth IS
'0 for an instance started on its own; a child''s is its parent''s plus one (at most the '
'limit sub_sequence_depth).';
COMMENT ON COLUMN orch8.task_instances.parent_path IS
'For a child started by a sub_sequence block: the path of that node in the parent''s '
'tree, which the child''s end makes ready again.';

-- Claims and leases are per node: the instance's lease goes (with its checks and index),
-- and the views that showed it show its nodes' instead.
DROP VIEW orch8.instance_overview;
DROP INDEX orch8.task_instances_lease_idx;
DROP INDEX orch8.task_instances_due_idx;

-- In flight, the running ones keep their lease on their node (below), so copy it first.
CREATE TEMPORARY TABLE upgrade_leases ON COMMIT DROP AS
SELECT
    t.tenant_id,
    t.id,
    t.lease_owner,
    t.lease_token,
    t.lease_expires_at
FROM orch8.task_instances AS t
WHERE t.state = 'running';

ALTER TABLE orch8.task_instances DROP COLUMN lease_owner;
ALTER TABLE orch8.task_instances DROP COLUMN lease_token;
ALTER TABLE orch8.task_instances DROP COLUMN lease_expires_at;

CREATE VIEW orch8.instance_overview WITH (security_invoker = true) AS
SELECT
    t.tenant_id,
    t.id,
    t.sequence_id,
    s.namespace::text AS sequence_namespace,
    s.name::text AS sequence_name,
    t.sequence_version,
    t.state,
    t.requested_state,
    t.current_block,
    t.priority,
    t.idempotency_key,
    t.parent_instance_id,
    t.error,
    t.next_fire_at,
    t.created_at,
    t.updated_at,
    t.context,
    l.lease_owner,
    l.lease_expires_at,
    t.depth,
    t.parent_path
FROM orch8.task_instances AS t
LEFT JOIN orch8.sequences AS s ON t.tenant_id = s.tenant_id AND t.sequence_id = s.id
LEFT JOIN LATERAL (
    SELECT
        string_agg(DISTINCT n.lease_owner, ', ') AS lease_owner,
        min(n.lease_expires_at) AS lease_expires_at
    FROM orch8.execution_nodes AS n
    WHERE n.tenant_id = t.tenant_id AND n.instance_id = t.id AND n.lease_token IS NOT NULL
) AS l ON true;

COMMENT ON VIEW orch8.instance_overview IS
'Instances with the namespace and name of their sequence and the leases their nodes hold '
'(the runners, the earliest expiry): what the API, the CLI and the console list and show.';

-- More moves, now that an instance's state sums up its tree: a claim of a node whose
-- child ended wakes a waiting instance; a resume finds it waiting or failed; a retry of a
-- blocked branch settles it while the others wait.
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
        WHEN 'paused' THEN p_to IN ('scheduled', 'waiting', 'failed', 'cancelled')
        WHEN 'failed' THEN p_to IN ('scheduled', 'waiting', 'completed')
        ELSE false
    END
$$;

COMMENT ON FUNCTION orch8.instance_can_transition(orch8.instance_state, orch8.instance_state) IS
'The instance transition table (an instance''s state sums up its execution tree, '
'sync_instance): scheduled->running|waiting|paused|completed|failed|cancelled; '
'running->scheduled|waiting|paused|completed|failed|cancelled; waiting->scheduled|running '
'(a node whose child ended is claimed)|paused|completed|failed|cancelled; '
'paused->scheduled|waiting|failed|cancelled; failed->scheduled|waiting|completed (an '
'operator''s retry; completed when the last step is settled from evidence). completed '
'and cancelled are final.';

-- Rows the tree writes besides a step's results
ALTER TABLE orch8.block_outputs DROP CONSTRAINT block_outputs_sentinel_check;
ALTER TABLE orch8.block_outputs ADD CONSTRAINT block_outputs_sentinel_check
CHECK (sentinel IN (
    '__in_progress__', '__retry__', '__error__', '__unsettled__',
    '__skipped__', '__decision__'
));

COMMENT ON COLUMN orch8.block_outputs.block_id IS
'The path of the node that wrote the row (a top-level block''s is its id): every '
'iteration, item and branch has its own rows.';

-- Limits the tree adds ------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION orch8.limits()
RETURNS TABLE (name text, value bigint, unit text, description text)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    VALUES
    ('idempotency_key_bytes', 256, 'bytes',
     'an instance''s or a receipt''s idempotency key (UTF-8)'),
    ('provider_receipt_id_bytes', 256, 'bytes', 'a provider''s receipt id (UTF-8)'),
    ('state_key_bytes', 256, 'bytes', 'a key of an instance''s key-value state'),
    ('state_value_bytes', 262144, 'bytes',
     'one value of an instance''s key-value state (default; the setting '
     'orch8.max_state_value_bytes overrides it)'),
    ('context_bytes', 262144, 'bytes',
     'an instance''s context {data, config, runtime} (default; the setting '
     'orch8.max_context_bytes overrides it)'),
    ('note_bytes', 2000, 'bytes',
     'an operator''s note or reason (resolving a receipt, pausing, cancelling)'),
    ('error_chars', 2000, 'characters',
     'an error kept on a receipt or a webhook delivery'),
    ('block_id_chars', 200, 'characters', 'a block id'),
    ('sequence_blocks', 5000, 'blocks', 'the blocks of one sequence definition, at any depth'),
    ('retry_max_attempts', 100, 'attempts', 'a step''s retry.max_attempts'),
    ('verify_tries', 50, 'tries', 'the entries of a step''s verify.schedule'),
    ('verify_delay_ms', 86400000, 'milliseconds', 'one delay of a step''s verify.schedule'),
    ('verify_request_receipts', 1000, 'receipts',
     'the receipts one request_verifications call names'),
    ('resolution_output_bytes', 262144, 'bytes',
     'the output a resolution carries for the step (JSON text)'),
    ('definition_bytes', 1048576, 'bytes', 'a sequence definition (JSON text)'),
    ('params_bytes', 1048576, 'bytes', 'the params of one step''s effect (JSON text)'),
    ('evidence_bytes', 65536, 'bytes',
     'the evidence of a resolution or a verification (JSON text)'),
    ('actor_chars', 200, 'characters', 'who a history row names (an actor, a worker id)'),
    ('signal_payload_bytes', 65536, 'bytes', 'a signal''s payload (JSON text)'),
    ('json_depth', 64, 'levels', 'the nesting of any JSON value the ledger hashes'),
    ('nesting_depth', 32, 'levels', 'blocks inside blocks in one definition'),
    ('branches', 256, 'branches', 'the branches of one parallel or race, the routes of a router'),
    ('max_iterations', 100000, 'iterations', 'a loop''s or a for_each''s max_iterations'),
    ('for_each_concurrency', 64, 'iterations', 'a for_each''s concurrency'),
    ('sub_sequence_depth', 8, 'levels', 'child instances inside child instances')
$$;

COMMENT ON FUNCTION orch8.limits() IS
'Every size limit the engine enforces, by name, with its unit and what it bounds. Read '
'one with orch8.limit_of(name); table CHECKs and functions do.';

CREATE FUNCTION orch8.block_defaults()
RETURNS TABLE (field text, value jsonb)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    VALUES
    ('max_iterations', '1000'::jsonb),
    ('concurrency', '1'::jsonb),
    ('item_var', '"item"'::jsonb),
    ('index_var', '"index"'::jsonb),
    ('on_branch_failure', '"fail"'::jsonb),
    ('semantics', '"first_to_resolve"'::jsonb)
$$;

COMMENT ON FUNCTION orch8.block_defaults() IS
'What a composite block''s optional fields are when left out: max_iterations 1000 (loop, '
'for_each), concurrency 1 (for_each), item_var item and index_var index (for_each), '
'on_branch_failure fail (parallel), semantics first_to_resolve (race).';

CREATE FUNCTION orch8.block_default(p_field text)
RETURNS jsonb
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$ SELECT d.value FROM orch8.block_defaults() AS d WHERE d.field = p_field $$;

COMMENT ON FUNCTION orch8.block_default(text) IS 'One value of orch8.block_defaults().';

-- Signatures sql/functions/ now defines differently ------------------------------------------

DROP FUNCTION IF EXISTS orch8.finish_step(
    text, uuid, uuid, text, integer, uuid, text, jsonb, text, interval
);
DROP FUNCTION IF EXISTS orch8.claim_work(text, integer, interval);
DROP FUNCTION IF EXISTS orch8.claim_due_instances(text, integer, interval);
DROP FUNCTION IF EXISTS orch8.create_instance(
    text, uuid, jsonb, jsonb, integer, text, timestamptz, uuid
);
DROP FUNCTION IF EXISTS orch8.apply_requested_state(text, uuid, orch8.instance_state);
DROP FUNCTION IF EXISTS orch8.next_block_id(text, uuid, text);
DROP FUNCTION IF EXISTS orch8.first_block_id(text, uuid);
DROP FUNCTION IF EXISTS orch8.fail_step(text, uuid, uuid, text, integer, uuid, jsonb, text);
DROP FUNCTION IF EXISTS orch8.await_settlement(text, uuid, uuid, text, integer, uuid, text);
DROP FUNCTION IF EXISTS orch8.continue_settled_step(
    orch8.task_instances, orch8.block_outputs, orch8.effect_receipts, jsonb, text, text
);
DROP FUNCTION IF EXISTS orch8.blocks_reading_output(jsonb, text);
DROP FUNCTION IF EXISTS orch8.claim_verifications(text, integer, interval, text[], text[]);
DROP FUNCTION IF EXISTS orch8.sequence_step_problems(jsonb, text);
DROP FUNCTION IF EXISTS orch8.sequence_block_problems(jsonb, text);
DROP FUNCTION IF EXISTS orch8.sequence_block_id_problems(jsonb);

INSERT INTO orch8.function_access (name, access) VALUES
('execution_nodes_guard', 'private'),
('sequences_index_blocks', 'private'),
('claim_due_nodes', 'private'),
('lock_node', 'private'),
('leased_node', 'private'),
('start_block', 'private'),
('start_list', 'private'),
('list_next', 'private'),
('end_node', 'private'),
('node_ended', 'private'),
('child_ended', 'private'),
('cancel_subtree', 'private'),
('reopen_failure', 'private'),
('instance_end', 'private'),
('sync_instance', 'private'),
('hand_over', 'private'),
('node_answer', 'private'),
('step_failed', 'private'),
('compensate_receipts', 'private'),
('fail_step', 'private'),
('await_settlement', 'private'),
('continue_settled_step', 'private'),
('require_node', 'private'),
('stop_node', 'private'),
('start_iteration', 'private'),
('try_catch_part_ended', 'private'),
('start_undo', 'private')
ON CONFLICT (name) DO UPDATE SET access = excluded.access;

-- Instances in flight get their tree ------------------------------------------------------
-- One root list at the instance's current block (or the first), and one node for that block,
-- in the state the instance says. A running instance's lease moves to the node, so a
-- runner holding it goes on (its token now names the node).

INSERT INTO orch8.execution_nodes (
    tenant_id, instance_id, path, parent_path, block_id, kind, state, selector, position,
    priority, next_fire_at, created_at, updated_at
)
SELECT
    t.tenant_id,
    t.id AS instance_id,
    '' AS path,
    NULL AS parent_path,
    NULL AS block_id,
    'sequence' AS kind,
    'running' AS state,
    ARRAY['blocks'] AS selector,
    coalesce((
        SELECT e.n - 1
        FROM jsonb_array_elements(s.definition -> 'blocks') WITH ORDINALITY AS e (value, n)
        WHERE e.value ->> 'id' = t.current_block
        ORDER BY e.n LIMIT 1
    ), 0) AS position,
    t.priority,
    t.next_fire_at,
    t.created_at,
    orch8.now() AS updated_at
FROM orch8.task_instances AS t
INNER JOIN orch8.sequences AS s ON t.tenant_id = s.tenant_id AND t.sequence_id = s.id
WHERE t.state NOT IN ('completed', 'cancelled');

INSERT INTO orch8.execution_nodes (
    tenant_id, instance_id, path, parent_path, block_id, kind, state, priority, next_fire_at,
    lease_owner, lease_token, lease_expires_at, error, created_at, updated_at
)
SELECT
    t.tenant_id,
    t.id AS instance_id,
    b.id AS path,
    '' AS parent_path,
    b.id AS block_id,
    'step' AS kind,
    CASE
        WHEN t.state = 'running' THEN 'running'
        WHEN t.state IN ('scheduled', 'paused') THEN 'ready'
        WHEN last.sentinel = '__unsettled__' AND t.state = 'waiting' THEN 'waiting'
        WHEN last.sentinel = '__unsettled__' THEN 'blocked'
        WHEN t.state = 'waiting' THEN 'waiting'
        ELSE 'failed'
    END::orch8.node_state AS state,
    t.priority,
    t.next_fire_at,
    l.lease_owner,
    l.lease_token,
    l.lease_expires_at,
    CASE WHEN t.state = 'failed' THEN t.error END AS error,
    t.created_at,
    orch8.now() AS updated_at
FROM orch8.task_instances AS t
INNER JOIN orch8.sequences AS s ON t.tenant_id = s.tenant_id AND t.sequence_id = s.id
CROSS JOIN
    LATERAL (
        SELECT coalesce(t.current_block, s.definition -> 'blocks' -> 0 ->> 'id') AS id
    ) AS b
LEFT JOIN upgrade_leases AS l ON t.tenant_id = l.tenant_id AND t.id = l.id
LEFT JOIN LATERAL (
    SELECT o.sentinel FROM orch8.block_outputs AS o
    WHERE o.tenant_id = t.tenant_id AND o.instance_id = t.id AND o.block_id = b.id
    ORDER BY o.seq DESC LIMIT 1
) AS last ON true
WHERE t.state NOT IN ('completed', 'cancelled') AND b.id IS NOT NULL;

-- A failed instance's failure came from its block (retry reruns it); a blocked one's
-- root still runs.
UPDATE orch8.execution_nodes AS r
SET state = 'failed', failed_child = c.path, error = c.error
FROM orch8.execution_nodes AS c
WHERE
    r.path = '' AND c.tenant_id = r.tenant_id AND c.instance_id = r.instance_id
    AND c.parent_path = '' AND c.state = 'failed';
