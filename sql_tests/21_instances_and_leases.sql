-- Instances, leases and steps under the execution tree: the transition table,
-- create_instance (the root list and its first node), the lease-fenced claim of nodes
-- (claim_due_nodes, heartbeat_leases, lock_leased_instance, release_lease,
-- reclaim_expired_leases), transition_instance, compute_attempt, begin_step and
-- finish_step (the next node handed over under the same token). Leases live on
-- orch8.execution_nodes; an instance's state sums up its tree. Time moves with
-- orch8.fake_now; every claim is made in this file, so which nodes are due is known at
-- each point.
BEGIN;
SELECT plan(146);

SELECT set_config('orch8.fake_now', '2030-01-01 00:00:00+00', true);

-- Fixtures ---------------------------------------------------------------------------
-- ids: every instance by a name (and what create_instance answered for it);
-- leases: every claim, in order. pg_temp.token(name) is the latest token of an
-- instance, pg_temp.first_token(name) its first.
CREATE TEMP TABLE ids (
    name text PRIMARY KEY,
    id uuid NOT NULL,
    created_state orch8.instance_state,
    deduplicated boolean
);

CREATE TEMP TABLE leases (
    n integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL,
    path text,
    token uuid,
    owner text,
    expires_at timestamptz
);

CREATE TEMP TABLE outcomes (name text PRIMARY KEY, o orch8.effect_outcome);

-- blocks prep then call: finishing prep hands call over under the same lease. call
-- resends after an ambiguous outcome (new_attempt), so finish_step's retry_in is
-- honoured for it (the default, settle, is tested in 22_settlement.sql).
INSERT INTO orch8.sequences (tenant_id, name, version, definition)
VALUES ('tap', 'flow', 1, '{"blocks": [{"id": "prep", "type": "step", "handler": "transform"},
                                       {"id": "call", "type": "step", "handler": "x.y",
                                        "retry": {"on_ambiguous": "new_attempt"}}]}');
INSERT INTO ids (name, id)
SELECT
    'seq' AS name,
    s.id
FROM orch8.sequences AS s
WHERE s.tenant_id = 'tap';

CREATE FUNCTION pg_temp.id(p_name text)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT i.id FROM ids AS i WHERE i.name = p_name $$;

CREATE FUNCTION pg_temp.token(p_name text)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT l.token FROM leases AS l WHERE l.name = p_name ORDER BY l.n DESC LIMIT 1 $$;

CREATE FUNCTION pg_temp.first_token(p_name text)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT l.token FROM leases AS l WHERE l.name = p_name ORDER BY l.n LIMIT 1 $$;

CREATE FUNCTION pg_temp.inst(p_name text)
RETURNS orch8.task_instances
LANGUAGE sql
AS $$
    SELECT t.* FROM orch8.task_instances AS t
    WHERE t.tenant_id = 'tap' AND t.id = pg_temp.id(p_name)
$$;

CREATE FUNCTION pg_temp.node(p_name text, p_path text)
RETURNS orch8.execution_nodes
LANGUAGE sql
AS $$
    SELECT n.* FROM orch8.execution_nodes AS n
    WHERE n.tenant_id = 'tap' AND n.instance_id = pg_temp.id(p_name) AND n.path = p_path
$$;

CREATE FUNCTION pg_temp.create(
    p_name text,
    p_data jsonb DEFAULT '{}',
    p_config jsonb DEFAULT '{}',
    p_priority integer DEFAULT 0,
    p_key text DEFAULT NULL,
    p_fire_at timestamptz DEFAULT NULL,
    p_parent text DEFAULT NULL
)
RETURNS TABLE (created_state orch8.instance_state, deduplicated boolean)
LANGUAGE sql
AS $$
    INSERT INTO ids AS i (name, id, created_state, deduplicated)
    SELECT p_name, c.id, c.state, c.deduplicated
    FROM orch8.create_instance(
        'tap', pg_temp.id('seq'), p_data, p_config, p_priority, p_key, p_fire_at,
        pg_temp.id(p_parent)
    ) AS c
    RETURNING i.created_state, i.deduplicated
$$;

-- claim a batch of nodes and record each lease; returns the names claimed
CREATE FUNCTION pg_temp.claim(p_worker text, p_batch integer, p_lease interval)
RETURNS SETOF text
LANGUAGE sql
AS $$
    INSERT INTO leases AS l (name, path, token, owner, expires_at)
    SELECT
        coalesce((SELECT min(i.name) FROM ids AS i WHERE i.id = c.instance_id),
                 c.instance_id::text),
        c.path, c.lease_token, c.lease_owner, c.lease_expires_at
    FROM orch8.claim_due_nodes(p_worker, p_batch, p_lease) AS c
    RETURNING l.name
$$;

-- create an instance whose first node wins the next claim (top priority, due a day ago)
-- and claim it
CREATE FUNCTION pg_temp.start(
    p_name text, p_lease interval DEFAULT '1 hour', p_parent text DEFAULT NULL
)
RETURNS text
LANGUAGE sql
AS $$
    SELECT FROM pg_temp.create(
        p_name, p_priority => 1000, p_fire_at => orch8.now() - interval '1 day',
        p_parent => p_parent
    );
    SELECT n FROM pg_temp.claim('tap-runner', 1, p_lease) AS n;
$$;

CREATE FUNCTION pg_temp.audit(p_name text)
RETURNS TABLE (
    from_state orch8.instance_state, to_state orch8.instance_state, actor text, reason text
)
LANGUAGE sql
AS $$
    SELECT a.from_state, a.to_state, a.actor, a.reason
    FROM orch8.instance_transitions AS a
    WHERE a.tenant_id = 'tap' AND a.instance_id = pg_temp.id(p_name)
    ORDER BY a.seq
$$;

CREATE FUNCTION pg_temp.last_audit(p_name text)
RETURNS TABLE (
    from_state orch8.instance_state, to_state orch8.instance_state, actor text, reason text
)
LANGUAGE sql
AS $$
    SELECT a.from_state, a.to_state, a.actor, a.reason
    FROM orch8.instance_transitions AS a
    WHERE a.tenant_id = 'tap' AND a.instance_id = pg_temp.id(p_name)
    ORDER BY a.seq DESC
    LIMIT 1
$$;

CREATE FUNCTION pg_temp.last_output(p_name text, p_block text)
RETURNS orch8.block_outputs
LANGUAGE sql
AS $$
    SELECT o.* FROM orch8.block_outputs AS o
    WHERE o.tenant_id = 'tap' AND o.instance_id = pg_temp.id(p_name) AND o.block_id = p_block
    ORDER BY o.seq DESC
    LIMIT 1
$$;

CREATE FUNCTION pg_temp.receipt(p_name text)
RETURNS orch8.effect_receipts
LANGUAGE sql
AS $$
    SELECT r.* FROM orch8.effect_receipts AS r
    WHERE r.tenant_id = 'tap' AND r.id = (SELECT (o.o).effect_id FROM outcomes AS o
                                          WHERE o.name = p_name)
$$;

-- what an instance has written so far: block outputs, audit rows, receipt events
CREATE FUNCTION pg_temp.footprint(p_name text)
RETURNS integer[]
LANGUAGE sql
AS $$
    SELECT ARRAY[
        (SELECT count(*)::integer FROM orch8.block_outputs AS o
         WHERE o.tenant_id = 'tap' AND o.instance_id = pg_temp.id(p_name)),
        (SELECT count(*)::integer FROM orch8.instance_transitions AS a
         WHERE a.tenant_id = 'tap' AND a.instance_id = pg_temp.id(p_name)),
        (SELECT count(*)::integer FROM orch8.effect_receipt_events AS e
         JOIN orch8.effect_receipts AS r ON r.tenant_id = e.tenant_id AND r.id = e.receipt_id
         WHERE r.tenant_id = 'tap' AND r.instance_id = pg_temp.id(p_name))
    ]
$$;

-- begin a step under the latest lease of an instance and keep the outcome
CREATE FUNCTION pg_temp.begin(
    p_name text, p_key text, p_block text, p_handler text, p_attempt integer DEFAULT 0
)
RETURNS orch8.effect_outcome
LANGUAGE sql
AS $$
    INSERT INTO outcomes AS o (name, o)
    SELECT p_key, orch8.begin_step(
        'tap', pg_temp.id(p_name), pg_temp.token(p_name), p_block, p_handler,
        '{"url": "https://x.example"}', p_attempt
    )
    RETURNING o.o
$$;

-- finish the pure step prep under the latest lease: ok, and call is handed over
CREATE FUNCTION pg_temp.finish_prep(p_name text)
RETURNS text
LANGUAGE sql
AS $$
    SELECT f.next_block FROM orch8.finish_step(
        'tap', pg_temp.id(p_name), pg_temp.token(p_name), 'prep', 0, NULL, 'ok', '{"v": 1}'
    ) AS f
$$;

-- a chain of p_n instances, each the child of the one before; the last one's depth
CREATE FUNCTION pg_temp.chain(p_prefix text, p_n integer)
RETURNS integer
LANGUAGE plpgsql
AS $$
BEGIN
    FOR v_k IN 0 .. p_n - 1 LOOP
        PERFORM pg_temp.create(p_prefix || v_k, p_fire_at => '2031-01-01 00:00:00+00',
                               p_parent => CASE WHEN v_k > 0 THEN p_prefix || (v_k - 1) END);
    END LOOP;
    RETURN (pg_temp.inst(p_prefix || (p_n - 1))).depth;
END
$$;

-- 1. The transition table ---------------------------------------------------------------

SELECT is(
    enum_range(NULL::orch8.instance_state),
    ARRAY[
        'scheduled', 'running', 'waiting', 'paused', 'completed', 'failed', 'cancelled'
    ]::orch8.instance_state[],
    'instance_state has exactly the seven documented states, in order'
);

-- One row per from-state, one column per to-state (scheduled, running, waiting, paused,
-- completed, failed, cancelled), as the function's COMMENT (0012_execution_tree.sql)
-- states it: an instance's state sums up its tree, so scheduled may go straight to
-- waiting, completed or failed, and a waiting one back to running when a node is claimed.
SELECT results_eq(
    $$SELECT f.s::text,
             orch8.instance_can_transition(f.s, 'scheduled'),
             orch8.instance_can_transition(f.s, 'running'),
             orch8.instance_can_transition(f.s, 'waiting'),
             orch8.instance_can_transition(f.s, 'paused'),
             orch8.instance_can_transition(f.s, 'completed'),
             orch8.instance_can_transition(f.s, 'failed'),
             orch8.instance_can_transition(f.s, 'cancelled')
      FROM unnest(enum_range(NULL::orch8.instance_state)) WITH ORDINALITY AS f (s, i)
      ORDER BY f.i$$,
    $$VALUES ('scheduled', false, true, true, true, true, true, true),
             ('running', true, false, true, true, true, true, true),
             ('waiting', true, true, false, true, true, true, true),
             ('paused', true, false, true, false, true, true, true),
             ('completed', false, false, false, false, false, false, false),
             ('failed', true, false, true, false, true, false, false),
             ('cancelled', false, false, false, false, false, false, false)$$,
    'instance_can_transition: the full 7x7 matrix matches the transition table'
);

-- 2. create_instance ----------------------------------------------------------------------

SELECT results_eq(
    $$SELECT * FROM pg_temp.create('a', '{"order_id": 7}', '{"currency": "EUR"}')$$,
    $$VALUES ('scheduled'::orch8.instance_state, false)$$,
    'create_instance: a new instance is scheduled, not deduplicated'
);
SELECT is(
    (pg_temp.inst('a')).context::jsonb,
    '{"data": {"order_id": 7}, "config": {"currency": "EUR"}, "runtime": {}}'::jsonb,
    'create_instance: context is {data, config, runtime} with an empty runtime'
);
SELECT results_eq(
    $$SELECT t.state, t.priority, t.next_fire_at, t.sequence_version, t.parent_instance_id,
             t.current_block, t.error, t.depth::integer, t.parent_path
      FROM orch8.task_instances AS t WHERE t.id = pg_temp.id('a')$$,
    $$VALUES ('scheduled'::orch8.instance_state, 0, '2030-01-01 00:00:00+00'::timestamptz, 1,
              NULL::uuid, 'prep'::text, NULL::text, 0, NULL::text)$$,
    'create_instance: priority 0, due now, the sequence version, no parent, depth 0, '
    'current_block the first block'
);
SELECT results_eq(
    $$SELECT n.path, n.parent_path, n.block_id, n.kind::text, n.state::text, n.selector,
             n.position, n.priority, n.next_fire_at, n.lease_owner, n.lease_token,
             n.lease_expires_at
      FROM orch8.execution_nodes AS n WHERE n.instance_id = pg_temp.id('a')
      ORDER BY n.path$$,
    $$VALUES ('', NULL, NULL, 'sequence', 'running', ARRAY['blocks'], 1, 0,
              '2030-01-01 00:00:00+00'::timestamptz, NULL::text, NULL::uuid,
              NULL::timestamptz),
             ('prep', '', 'prep', 'step', 'ready', NULL, 0, 0, '2030-01-01 00:00:00+00',
              NULL, NULL, NULL)$$,
    'create_instance: the root list (past its first block) and a ready node for prep, '
    'due now, without a lease'
);
SELECT results_eq(
    $$SELECT a.from_state, a.to_state, a.actor, a.reason, a.at
      FROM orch8.instance_transitions AS a WHERE a.instance_id = pg_temp.id('a')$$,
    $$VALUES (NULL::orch8.instance_state, 'scheduled'::orch8.instance_state, 'create'::text,
              NULL::text, '2030-01-01 00:00:00+00'::timestamptz)$$,
    'create_instance: one audit row NULL -> scheduled by actor create, at now'
);

SELECT results_eq(
    $$SELECT * FROM pg_temp.create('k1', '{"n": 1}', p_key => 'order-7')$$,
    $$VALUES ('scheduled'::orch8.instance_state, false)$$,
    'create_instance: the first use of idempotency key order-7 creates'
);
SELECT results_eq(
    $$SELECT * FROM pg_temp.create('k2', '{"n": 2}', p_priority => 3, p_key => 'order-7')$$,
    $$VALUES ('scheduled'::orch8.instance_state, true)$$,
    'create_instance: the same key again answers deduplicated = true'
);
SELECT is(pg_temp.id('k2'), pg_temp.id('k1'), 'create_instance: the same key returns the same id');
SELECT results_eq(
    $$SELECT t.context -> 'data', t.priority FROM orch8.task_instances AS t
      WHERE t.tenant_id = 'tap' AND t.idempotency_key = 'order-7'$$,
    $$VALUES ('{"n": 1}'::jsonb, 0)$$,
    'create_instance: one row for the key, the first call''s data and priority kept'
);
SELECT results_eq(
    $$SELECT (SELECT count(*)::integer FROM pg_temp.audit('k1')),
             (SELECT count(*)::integer FROM orch8.execution_nodes AS n
              WHERE n.instance_id = pg_temp.id('k1'))$$,
    $$VALUES (1, 2)$$,
    'create_instance: a deduplicated call writes no second audit row and no second tree'
);

SELECT set_config(
    'orch8.max_context_bytes',
    octet_length('{"data": {}, "config": {}, "runtime": {}}'::jsonb::text)::text, true
);
SELECT results_eq(
    $$SELECT * FROM pg_temp.create('edge', p_fire_at => '2031-01-01 00:00:00+00')$$,
    $$VALUES ('scheduled'::orch8.instance_state, false)$$,
    'create_instance: a context exactly at orch8.max_context_bytes is accepted'
);
SELECT results_eq(
    $$SELECT (pg_temp.inst('edge')).next_fire_at, (pg_temp.node('edge', 'prep')).next_fire_at$$,
    $$VALUES ('2031-01-01 00:00:00+00'::timestamptz, '2031-01-01 00:00:00+00'::timestamptz)$$,
    'create_instance: the first node is ready at the given next_fire_at'
);
SELECT throws_ok(
    $$SELECT * FROM pg_temp.create('big', '{"x": 1}')$$,
    'O8008', NULL,
    'create_instance: a context one object over orch8.max_context_bytes is O8008'
);
SELECT set_config('orch8.max_context_bytes', '', true);
SELECT throws_ok(
    $$SELECT * FROM pg_temp.create('huge', jsonb_build_object('blob', repeat('x', 262144)))$$,
    'O8008', NULL,
    'create_instance: a context over the default 262144 bytes is O8008'
);
SELECT results_eq(
    $$SELECT (SELECT count(*)::integer FROM orch8.task_instances WHERE tenant_id = 'tap'),
             (SELECT count(*)::integer FROM orch8.instance_transitions
              WHERE tenant_id = 'tap'),
             (SELECT count(*)::integer FROM orch8.execution_nodes WHERE tenant_id = 'tap')$$,
    $$VALUES (3, 3, 6)$$,
    'create_instance: the refused contexts wrote no instance, no audit row and no node'
);
SELECT throws_ok(
    $$SELECT orch8.create_instance('tap', gen_random_uuid())$$,
    'O8007', NULL, 'create_instance: an unknown sequence is O8007'
);
SELECT throws_ok(
    $$SELECT orch8.create_instance('tap', pg_temp.id('seq'),
                                   p_parent_instance_id => gen_random_uuid())$$,
    'O8007', NULL, 'create_instance: an unknown parent instance is O8007'
);
SELECT throws_ok(
    $$SELECT orch8.create_instance('tap', pg_temp.id('seq'), '[1]')$$,
    'O8008', NULL, 'create_instance: data that is not an object is O8008'
);
SELECT throws_ok(
    $$SELECT orch8.create_instance('tap', pg_temp.id('seq'), p_idempotency_key => '')$$,
    'O8008', NULL, 'create_instance: an empty idempotency key is O8008'
);

-- children: one level deeper than their parent, at most sub_sequence_depth (8)
SELECT is(
    pg_temp.chain('d', 9), 8,
    'create_instance: a chain of children reaches depth 8 (sub_sequence_depth)'
);
SELECT results_eq(
    $$SELECT t.parent_instance_id, t.depth::integer FROM orch8.task_instances AS t
      WHERE t.id = pg_temp.id('d1')$$,
    $$SELECT pg_temp.id('d0'), 1$$,
    'create_instance: a child names its parent and is one level deeper'
);
SELECT throws_ok(
    $$SELECT * FROM pg_temp.create('d9', p_parent => 'd8')$$,
    'O8008', NULL, 'create_instance: a child at depth 9 is over sub_sequence_depth (O8008)'
);

-- retire a and k1 so they are never claimed (also the scheduled -> cancelled move)
SELECT ok(
    orch8.transition_instance(
        'tap', pg_temp.id('a'), 'scheduled', 'cancelled', 'alice', 'not needed'
    ),
    'transition_instance: scheduled -> cancelled answers true'
);
SELECT orch8.transition_instance('tap', pg_temp.id('k1'), 'scheduled', 'cancelled', 'alice');
SELECT results_eq(
    $$SELECT * FROM pg_temp.create('k3', p_key => 'order-7')$$,
    $$VALUES ('cancelled'::orch8.instance_state, true)$$,
    'create_instance: a deduplicated call answers the existing instance''s current state'
);

-- 3. claim_due_nodes (at 00:00:00) ------------------------------------------------------
-- SKIP LOCKED itself needs a second session (tests/test_instances.py,
-- test_concurrent_claimers_never_share_an_instance). Here, in one session: a leased node
-- is never claimed twice, nor a ready node of a cancelled or paused instance; several
-- nodes of one instance in one batch are in 25_execution_tree.sql.

SELECT FROM pg_temp.create('c_low', p_priority => 0, p_fire_at => '2029-12-31 23:50:00+00');
SELECT FROM pg_temp.create('c_mid', p_priority => 1, p_fire_at => '2029-12-31 23:57:00+00');
SELECT FROM pg_temp.create(
    'c_high_late', p_priority => 5, p_fire_at => '2029-12-31 23:59:00+00'
);
SELECT FROM pg_temp.create(
    'c_high_early', p_priority => 5, p_fire_at => '2029-12-31 23:58:00+00'
);
SELECT FROM pg_temp.create(
    'c_future', p_priority => 9, p_fire_at => '2030-01-01 00:01:00+00'
);

SELECT results_eq(
    $$SELECT n FROM pg_temp.claim('w1', 1, '45 seconds') AS n$$,
    $$VALUES ('c_high_early')$$,
    'claim batch 1: the highest priority first, the older next_fire_at among equals'
);
SELECT results_eq(
    $$SELECT n FROM pg_temp.claim('w1', 1, '1 hour') AS n$$,
    $$VALUES ('c_high_late')$$,
    'claim batch 1 again: the other priority-5 node (a leased node is not claimed twice)'
);
SELECT results_eq(
    $$SELECT n FROM pg_temp.claim('w2', 1, '1 hour') AS n$$,
    $$VALUES ('c_mid')$$,
    'claim batch 1: priority 1 before an older priority-0 node'
);
SELECT results_eq(
    $$SELECT n FROM pg_temp.claim('w2', 5, '1 hour') AS n$$,
    $$VALUES ('c_low')$$,
    'claim batch 5: only the one due node left (c_future is not yet due, the ready nodes '
    'of cancelled instances are not claimed)'
);
SELECT is(
    (SELECT count(*)::integer FROM pg_temp.claim('w2', 5, '1 hour')), 0,
    'claim: nothing due, nothing claimed'
);
SELECT results_eq(
    $$SELECT (pg_temp.inst('c_future')).state::text, (pg_temp.node('c_future', 'prep')).state::text,
             (pg_temp.node('a', 'prep')).state::text$$,
    $$VALUES ('scheduled', 'ready', 'ready')$$,
    'claim: a node due in the future, and one of a cancelled instance, stay ready'
);
SELECT results_eq(
    $$SELECT n.path, n.state::text, n.lease_owner, n.lease_token, n.lease_expires_at,
             t.state::text
      FROM orch8.execution_nodes AS n
      JOIN orch8.task_instances AS t ON t.tenant_id = n.tenant_id AND t.id = n.instance_id
      WHERE n.instance_id = pg_temp.id('c_high_early') AND n.lease_token IS NOT NULL$$,
    $$VALUES ('prep'::text, 'running'::text, 'w1'::text, pg_temp.token('c_high_early'),
              '2030-01-01 00:00:45+00'::timestamptz, 'running'::text)$$,
    'claim: the node runs, owned by the worker, with the returned token, expiring at '
    'now + lease; its instance is running'
);
SELECT results_eq(
    $$SELECT count(*)::integer, count(DISTINCT l.token)::integer, count(l.token)::integer,
             count(*) FILTER (WHERE l.path = 'prep')::integer
      FROM leases AS l$$,
    $$VALUES (4, 4, 4, 4)$$,
    'claim: each of the four claims got its own non-NULL lease token, on the node prep'
);
SELECT results_eq(
    $$SELECT i.name, a.from_state, a.to_state, a.actor
      FROM orch8.instance_transitions AS a JOIN ids AS i ON i.id = a.instance_id
      WHERE a.to_state = 'running' ORDER BY a.seq$$,
    $$VALUES ('c_high_early', 'scheduled'::orch8.instance_state,
              'running'::orch8.instance_state, 'w1'),
             ('c_high_late', 'scheduled', 'running', 'w1'),
             ('c_mid', 'scheduled', 'running', 'w2'),
             ('c_low', 'scheduled', 'running', 'w2')$$,
    'claim: one audit row scheduled -> running per claim, by the worker id'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.claim_due_nodes('', 1, '30 seconds')$$,
    'O8008', NULL, 'claim: an empty worker id is O8008'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.claim_due_nodes(NULL, 1, '30 seconds')$$,
    'O8008', NULL, 'claim: a NULL worker id is O8008'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.claim_due_nodes('w1', 0, '30 seconds')$$,
    'O8008', NULL, 'claim: a batch of 0 is O8008'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.claim_due_nodes('w1', 1, '0 seconds')$$,
    'O8008', NULL, 'claim: a zero lease is O8008'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.claim_due_nodes('w1', 1, '-5 seconds')$$,
    'O8008', NULL, 'claim: a negative lease is O8008'
);

-- 4. lock_leased_instance and release_lease (at 00:00:00) --------------------------------

SELECT is(
    (orch8.lock_leased_instance('tap', pg_temp.id('c_mid'), pg_temp.token('c_mid'))).id,
    pg_temp.id('c_mid'),
    'lock_leased_instance: the token of one of its nodes locks and returns the instance'
);
SELECT throws_ok(
    $$SELECT orch8.lock_leased_instance('tap', pg_temp.id('c_mid'), gen_random_uuid())$$,
    'O8001', NULL, 'lock_leased_instance: a token no node holds is O8001'
);
SELECT throws_ok(
    $$SELECT orch8.lock_leased_instance('tap', pg_temp.id('c_mid'), pg_temp.token('c_low'))$$,
    'O8001', NULL, 'lock_leased_instance: the token of another instance''s node is O8001'
);
SELECT throws_ok(
    $$SELECT orch8.lock_leased_instance('tap', pg_temp.id('a'), NULL)$$,
    'O8001', NULL, 'lock_leased_instance: an instance without a lease is O8001'
);
SELECT throws_ok(
    $$SELECT orch8.lock_leased_instance('tap', gen_random_uuid(), gen_random_uuid())$$,
    'O8007', NULL, 'lock_leased_instance: an unknown instance is O8007'
);
SELECT throws_ok(
    $$SELECT orch8.release_lease('tap', pg_temp.id('c_mid'), gen_random_uuid())$$,
    'O8001', NULL, 'release_lease: a wrong token is O8001'
);
SELECT results_eq(
    $$SELECT (pg_temp.inst('c_mid')).state, (pg_temp.node('c_mid', 'prep')).lease_token$$,
    $$SELECT 'running'::orch8.instance_state, pg_temp.token('c_mid')$$,
    'release_lease: the refused release left the node running under its lease'
);

SELECT orch8.release_lease('tap', pg_temp.id('c_mid'), pg_temp.token('c_mid'));
SELECT results_eq(
    $$SELECT n.state::text, n.next_fire_at, n.lease_owner, n.lease_token, n.lease_expires_at,
             t.state::text, t.next_fire_at
      FROM pg_temp.node('c_mid', 'prep') AS n, pg_temp.inst('c_mid') AS t$$,
    $$VALUES ('ready', '2030-01-01 00:00:00+00'::timestamptz, NULL::text, NULL::uuid,
              NULL::timestamptz, 'scheduled', '2030-01-01 00:00:00+00'::timestamptz)$$,
    'release_lease: the node back to ready, due now, the lease dropped; the instance '
    'scheduled'
);
SELECT results_eq(
    $$SELECT * FROM pg_temp.last_audit('c_mid')$$,
    $$VALUES ('running'::orch8.instance_state, 'scheduled'::orch8.instance_state,
              'runner'::text, 'released'::text)$$,
    'release_lease: audit row running -> scheduled by runner, reason released'
);
SELECT throws_ok(
    $$SELECT orch8.release_lease('tap', pg_temp.id('c_mid'), pg_temp.token('c_mid'))$$,
    'O8001', NULL, 'release_lease: releasing twice with the same token is O8001'
);

SELECT orch8.release_lease(
    'tap', pg_temp.id('c_low'), pg_temp.token('c_low'), '2030-01-01 00:10:00+00', 'backoff'
);
SELECT results_eq(
    $$SELECT (pg_temp.inst('c_low')).state, (pg_temp.inst('c_low')).next_fire_at,
             (pg_temp.node('c_low', 'prep')).next_fire_at,
             (SELECT a.reason FROM pg_temp.last_audit('c_low') AS a)$$,
    $$VALUES ('scheduled'::orch8.instance_state, '2030-01-01 00:10:00+00'::timestamptz,
              '2030-01-01 00:10:00+00'::timestamptz, 'backoff'::text)$$,
    'release_lease: the node ready at the given next_fire_at, the instance too, with the '
    'given reason'
);

SELECT is(
    orch8.pause_instance('tap', pg_temp.id('c_high_late'), 'bob'), 'requested',
    'pause_instance on a running instance is only requested'
);
SELECT orch8.release_lease('tap', pg_temp.id('c_high_late'), pg_temp.token('c_high_late'));
SELECT results_eq(
    $$SELECT t.state, t.requested_state, n.state::text, n.lease_token, a.from_state,
             a.to_state, a.actor, a.reason
      FROM pg_temp.inst('c_high_late') AS t, pg_temp.node('c_high_late', 'prep') AS n,
           pg_temp.last_audit('c_high_late') AS a$$,
    $$VALUES ('paused'::orch8.instance_state, NULL::orch8.instance_state, 'ready'::text,
              NULL::uuid, 'running'::orch8.instance_state, 'paused'::orch8.instance_state,
              'operator'::text, 'released'::text)$$,
    'release_lease: a pause requested meanwhile wins over scheduled (by operator) and is '
    'cleared; the node waits ready'
);

SELECT results_eq(
    $$SELECT n FROM pg_temp.claim('w4', 5, '1 hour') AS n$$,
    $$VALUES ('c_mid')$$,
    'claim: a released node is claimed again; the ready node of a paused instance is not'
);
SELECT isnt(
    pg_temp.token('c_mid'), pg_temp.first_token('c_mid'),
    'claim: the second claim of a node gets a new lease token'
);

-- hb: one more running node, with a 30 second lease
SELECT pg_temp.start('hb', '30 seconds');

-- 5. heartbeat_leases (at 00:00:20) ------------------------------------------------------

SELECT set_config('orch8.fake_now', '2030-01-01 00:00:20+00', true);
SELECT set_eq(
    $$SELECT h FROM orch8.heartbeat_leases(
        ARRAY[pg_temp.token('c_high_early'), pg_temp.token('hb'),
              pg_temp.first_token('c_mid'), pg_temp.token('c_low'), gen_random_uuid()],
        '1 minute') AS h$$,
    $$VALUES (pg_temp.token('c_high_early')), (pg_temp.token('hb'))$$,
    'heartbeat: returns the held tokens, not a superseded, released or unknown one'
);
SELECT results_eq(
    $$SELECT i.name, n.lease_expires_at FROM orch8.execution_nodes AS n
      JOIN ids AS i ON i.id = n.instance_id
      WHERE i.name IN ('c_high_early', 'hb', 'c_mid') AND n.path = 'prep' ORDER BY i.name$$,
    $$VALUES ('c_high_early', '2030-01-01 00:01:20+00'::timestamptz),
             ('c_mid', '2030-01-01 01:00:00+00'),
             ('hb', '2030-01-01 00:01:20+00')$$,
    'heartbeat: held leases now expire at now + 1 minute; the old c_mid token moved nothing'
);

-- c_future is due at exactly 00:01:00
SELECT set_config('orch8.fake_now', '2030-01-01 00:01:00+00', true);
SELECT results_eq(
    $$SELECT n FROM pg_temp.claim('w3', 1, '1 hour') AS n$$,
    $$VALUES ('c_future')$$,
    'claim: a node is due at exactly its next_fire_at'
);

-- 6. reclaim_expired_leases ----------------------------------------------------------------

SELECT set_config('orch8.fake_now', '2030-01-01 00:01:20+00', true);
SELECT is(
    orch8.reclaim_expired_leases(), 0, 'reclaim: at exactly the expiry nothing is reclaimed'
);
SELECT is(
    (orch8.lock_leased_instance(
        'tap', pg_temp.id('c_high_early'), pg_temp.token('c_high_early')
    )).state,
    'running',
    'lock_leased_instance: at exactly the expiry the lease still holds'
);

SELECT set_config('orch8.fake_now', '2030-01-01 00:01:21+00', true);
SELECT is(
    (
        SELECT count(*)::integer
        FROM orch8.heartbeat_leases(ARRAY[pg_temp.token('c_high_early')], '1 minute')
    ),
    0,
    'heartbeat: an expired lease, not yet swept, is lost (not returned)'
);
SELECT throws_ok(
    $$SELECT orch8.lock_leased_instance(
        'tap', pg_temp.id('c_high_early'), pg_temp.token('c_high_early'))$$,
    'O8001', NULL, 'lock_leased_instance: an expired lease is O8001'
);
SELECT is(
    orch8.reclaim_expired_leases(), 2, 'reclaim: one second after the expiry, both are swept'
);
SELECT results_eq(
    $$SELECT i.name, n.state::text, n.next_fire_at, n.lease_owner, n.lease_token,
             n.lease_expires_at, t.state::text, t.next_fire_at
      FROM orch8.execution_nodes AS n JOIN ids AS i ON i.id = n.instance_id
      JOIN orch8.task_instances AS t ON t.id = n.instance_id
      WHERE i.name IN ('c_high_early', 'hb') AND n.path = 'prep' ORDER BY i.name$$,
    $$VALUES ('c_high_early', 'ready', '2030-01-01 00:01:21+00'::timestamptz, NULL::text,
              NULL::uuid, NULL::timestamptz, 'scheduled',
              '2030-01-01 00:01:21+00'::timestamptz),
             ('hb', 'ready', '2030-01-01 00:01:21+00', NULL, NULL, NULL, 'scheduled',
              '2030-01-01 00:01:21+00')$$,
    'reclaim: the nodes back to ready, due now, without a lease; the instances scheduled'
);
SELECT results_eq(
    $$SELECT * FROM pg_temp.last_audit('c_high_early')
      UNION ALL SELECT * FROM pg_temp.last_audit('hb')$$,
    $$VALUES ('running'::orch8.instance_state, 'scheduled'::orch8.instance_state,
              'lease-sweep'::text, 'lease expired'::text),
             ('running', 'scheduled', 'lease-sweep', 'lease expired')$$,
    'reclaim: audit rows running -> scheduled by lease-sweep, reason lease expired'
);
SELECT throws_ok(
    $$SELECT orch8.release_lease(
        'tap', pg_temp.id('c_high_early'), pg_temp.token('c_high_early'))$$,
    'O8001', NULL, 'release_lease: the swept runner''s token is O8001'
);
SELECT results_eq(
    $$SELECT (pg_temp.inst('c_mid')).state::text,
             (pg_temp.node('c_mid', 'prep')).lease_token$$,
    $$SELECT 'running', pg_temp.token('c_mid')$$,
    'reclaim: a lease that has not expired is left alone'
);

-- 7. The sweep applies a requested cancel or pause (00:01:21 -> 00:01:52) ------------------

SELECT results_eq(
    $$SELECT pg_temp.start('r1', '30 seconds') UNION ALL SELECT pg_temp.start('r2', '10 seconds')$$,
    $$VALUES ('r1'), ('r2')$$,
    'r1 and r2 are claimed (their leases expire at 00:01:51 and 00:01:31)'
);
SELECT is(pg_temp.finish_prep('r1'), 'call', 'r1 finishes prep and holds call');
SELECT is(
    (pg_temp.begin('r1', 'r1', 'call', 'x.y')).outcome, 'dispatched',
    'begin_step under r1''s lease dispatches a side-effecting step'
);
SELECT results_eq(
    $$SELECT orch8.cancel_instance('tap', pg_temp.id('r1'), 'alice', 'stop')
      UNION ALL SELECT orch8.pause_instance('tap', pg_temp.id('r2'), 'bob')$$,
    $$VALUES ('requested'), ('requested')$$,
    'a cancel of r1 and a pause of r2 are requested while they run'
);
SELECT results_eq(
    $$SELECT n.path, n.state::text, n.cancel_requested, n.cancel_reason
      FROM orch8.execution_nodes AS n WHERE n.instance_id = pg_temp.id('r1')
      ORDER BY n.path$$,
    $$VALUES ('', 'cancelled', false, 'stop'), ('call', 'running', true, 'stop'),
             ('prep', 'completed', false, NULL)$$,
    'cancel requested: the root is cancelled at once, the leased call marked cancel_requested'
);

SELECT set_config('orch8.fake_now', '2030-01-01 00:01:52+00', true);
SELECT is(orch8.reclaim_expired_leases(1), 1, 'reclaim(1): at most one node');
SELECT results_eq(
    $$SELECT (pg_temp.inst('r1')).state, (pg_temp.inst('r2')).state,
             (pg_temp.inst('r2')).requested_state, (pg_temp.node('r2', 'prep')).state::text$$,
    $$VALUES ('running'::orch8.instance_state, 'paused'::orch8.instance_state,
              NULL::orch8.instance_state, 'ready')$$,
    'reclaim(1): the earliest expiry (r2) goes first, to the requested paused, its node ready'
);
SELECT is(orch8.reclaim_expired_leases(), 1, 'reclaim: then the other one');
SELECT results_eq(
    $$SELECT t.state, t.requested_state, n.state::text, n.lease_token
      FROM pg_temp.inst('r1') AS t, pg_temp.node('r1', 'call') AS n$$,
    $$VALUES ('cancelled'::orch8.instance_state, NULL::orch8.instance_state, 'cancelled',
              NULL::uuid)$$,
    'reclaim: a node whose cancel was requested ends cancelled, and the instance with it'
);
SELECT results_eq(
    $$SELECT * FROM pg_temp.last_audit('r1') UNION ALL SELECT * FROM pg_temp.last_audit('r2')$$,
    $$VALUES ('running'::orch8.instance_state, 'cancelled'::orch8.instance_state,
              'lease-sweep'::text, 'lease expired'::text),
             ('running', 'paused', 'lease-sweep', 'lease expired')$$,
    'reclaim: the audit rows say running -> cancelled / paused by lease-sweep'
);
SELECT results_eq(
    $$SELECT (pg_temp.receipt('r1')).state, (pg_temp.receipt('r1')).error$$,
    $$VALUES ('unknown'::orch8.effect_state,
              'outcome unknown: the lease expired and the node was cancelled'::text)$$,
    'reclaim: the receipt r1 left dispatched is now unknown, with the reason'
);
SELECT results_eq(
    $$SELECT e.from_state, e.to_state, e.actor, e.note FROM orch8.effect_receipt_events AS e
      WHERE e.receipt_id = (pg_temp.receipt('r1')).id ORDER BY e.event_id DESC LIMIT 1$$,
    $$VALUES ('dispatched'::orch8.effect_state, 'unknown'::orch8.effect_state,
              'lease-sweep'::text, 'the runner lost its lease before it recorded the step'::text)$$,
    'reclaim: the receipt event dispatched -> unknown is by actor lease-sweep'
);
SELECT throws_ok(
    $$SELECT orch8.release_lease('tap', pg_temp.id('r1'), pg_temp.token('r1'))$$,
    'O8001', NULL, 'release_lease: the dead runner''s token is O8001 after the sweep'
);
SELECT throws_ok(
    $$SELECT orch8.finish_step('tap', pg_temp.id('r1'), pg_temp.token('r1'), 'call', 0,
                               (pg_temp.receipt('r1')).id, 'ok', '{}')$$,
    'O8001', NULL, 'finish_step: the dead runner cannot record its step (O8001)'
);
SELECT is(
    (pg_temp.receipt('r1')).state, 'unknown',
    'finish_step: the refused finish did not commit the receipt'
);

-- 8. transition_instance (at 00:01:52) ------------------------------------------------------

SELECT throws_ok(
    $$SELECT orch8.transition_instance('tap', pg_temp.id('a'), 'completed', 'running', 'x')$$,
    'O8004', NULL, 'transition_instance: completed -> running is O8004'
);
SELECT throws_ok(
    $$SELECT orch8.transition_instance('tap', pg_temp.id('a'), 'paused', 'running', 'x')$$,
    'O8004', NULL, 'transition_instance: paused -> running is O8004'
);
SELECT throws_ok(
    $$SELECT orch8.transition_instance('tap', pg_temp.id('a'), 'cancelled', 'scheduled', 'x')$$,
    'O8004', NULL, 'transition_instance: cancelled -> scheduled is O8004'
);
SELECT is(
    orch8.transition_instance('tap', pg_temp.id('a'), 'scheduled', 'paused', 'x'), false,
    'transition_instance: a lost CAS (a is cancelled, not scheduled) answers false'
);
SELECT results_eq(
    $$SELECT (pg_temp.inst('a')).state, (SELECT count(*)::integer FROM pg_temp.audit('a'))$$,
    $$VALUES ('cancelled'::orch8.instance_state, 2)$$,
    'transition_instance: the lost CAS changed nothing and wrote no audit row'
);
SELECT throws_ok(
    $$SELECT orch8.transition_instance('tap', pg_temp.id('edge'), 'scheduled', 'running', 'x')$$,
    'O8004', NULL, 'transition_instance: running is reached only by a claim (O8004)'
);
SELECT results_eq(
    $$SELECT (pg_temp.inst('edge')).state::text,
             (SELECT count(*)::integer FROM pg_temp.audit('edge'))$$,
    $$VALUES ('scheduled', 1)$$,
    'transition_instance: the refused move to running changed nothing'
);

SELECT is(pg_temp.start('p'), 'p', 'the parent p is claimed');
SELECT is(pg_temp.start('ch', p_parent => 'p'), 'ch', 'the child ch of p is claimed');
SELECT results_eq(
    $$SELECT t.parent_instance_id, t.depth::integer FROM pg_temp.inst('ch') AS t$$,
    $$SELECT pg_temp.id('p'), 1$$,
    'create_instance: the parent argument is stored, one level deeper'
);
SELECT ok(
    orch8.transition_instance('tap', pg_temp.id('ch'), 'running', 'completed', 'runner'),
    'transition_instance: running -> completed answers true'
);
SELECT results_eq(
    $$SELECT (pg_temp.inst('p')).state::text, (pg_temp.node('p', 'prep')).state::text,
             (SELECT count(*)::integer FROM pg_temp.audit('p'))$$,
    $$VALUES ('running', 'running', 2)$$,
    'transition_instance: a child that ends touches no node of a parent that does not '
    'wait for it (child_ended wakes only its sub_sequence node: 25_execution_tree.sql)'
);
SELECT FROM pg_temp.create('ch2', p_fire_at => '2031-01-01 00:00:00+00');
SELECT ok(
    orch8.transition_instance('tap', pg_temp.id('ch2'), 'scheduled', 'failed', 'runner', 'boom'),
    'transition_instance: scheduled -> failed answers true'
);
SELECT results_eq(
    $$SELECT t.state, t.error, a.actor, a.reason
      FROM pg_temp.inst('ch2') AS t, pg_temp.last_audit('ch2') AS a$$,
    $$VALUES ('failed'::orch8.instance_state, 'boom'::text, 'runner'::text, 'boom'::text)$$,
    'transition_instance: failed keeps the reason as error, and the audit row says it'
);
SELECT orch8.transition_instance(
    'tap', pg_temp.id('ch2'), 'failed', 'scheduled', 'alice', 'retry', '2031-01-01 02:00:00+00'
);
SELECT results_eq(
    $$SELECT t.state, t.error, t.next_fire_at FROM orch8.task_instances AS t
      WHERE t.id = pg_temp.id('ch2')$$,
    $$VALUES ('scheduled'::orch8.instance_state, NULL::text,
              '2031-01-01 02:00:00+00'::timestamptz)$$,
    'transition_instance: to scheduled clears the error and uses the given next_fire_at'
);

-- 9. compute_attempt, begin_step and finish_step (at 00:01:52) -----------------------------

SELECT is(pg_temp.start('s1'), 's1', 's1 is claimed');
SELECT is(
    orch8.compute_attempt('tap', pg_temp.id('s1'), 'call'), 0, 'compute_attempt: no row: 0'
);
SELECT is(
    (pg_temp.begin('s1', 's1_prep', 'prep', 'transform')).outcome, NULL,
    'begin_step: a pure handler gives a NULL outcome'
);
SELECT is(
    pg_temp.footprint('s1'), ARRAY[0, 2, 0],
    'begin_step: a pure handler writes no block output and no receipt'
);
SELECT throws_ok(
    $$SELECT orch8.finish_step('tap', pg_temp.id('s1'), pg_temp.token('s1'), 'call', 0, NULL,
                               'ok', '{}')$$,
    'O8001', NULL, 'finish_step: a block the token does not hold is O8001'
);
SELECT throws_ok(
    $$SELECT orch8.finish_step('tap', pg_temp.id('s1'), pg_temp.token('s1'), 'prep', 0, NULL,
                               'error', '{}', 'x', '-1 second')$$,
    'O8008', NULL, 'finish_step: a negative retry_in is O8008'
);
SELECT throws_ok(
    $$SELECT orch8.finish_step('tap', pg_temp.id('s1'), pg_temp.token('s1'), 'prep', 0,
                               gen_random_uuid(), 'skipped', '{}')$$,
    'O8008', NULL, 'finish_step: a skipped step with an effect id is O8008'
);
SELECT results_eq(
    $$SELECT f.state, f.next_block, f.next_attempt, f.next_block_id, f.next_kind,
             f.next_vars
      FROM orch8.finish_step(
        'tap', pg_temp.id('s1'), pg_temp.token('s1'), 'prep', 0, NULL, 'ok', '{"v": 1}'
    ) AS f$$,
    $$VALUES ('running'::orch8.instance_state, 'call'::text, 0, 'call'::text, 'step'::text,
              '{}'::jsonb)$$,
    'finish_step ok before the last block: running, and the next node with its attempt'
);
SELECT results_eq(
    $$SELECT (pg_temp.inst('s1')).current_block, o.attempt::integer, o.sentinel::text,
             o.output, o.effect_id, o.lease_token
      FROM pg_temp.last_output('s1', 'prep') AS o$$,
    $$SELECT 'call'::text, 0, NULL::text, '{"v": 1}'::jsonb, NULL::uuid, pg_temp.token('s1')$$,
    'finish_step ok: the output row is written under the lease and current_block advances'
);
SELECT results_eq(
    $$SELECT p.state::text, p.lease_token, c.state::text, c.lease_owner, c.lease_token,
             c.lease_expires_at
      FROM pg_temp.node('s1', 'prep') AS p, pg_temp.node('s1', 'call') AS c$$,
    $$SELECT 'completed', NULL::uuid, 'running', 'tap-runner'::text, pg_temp.token('s1'),
             '2030-01-01 01:01:52+00'::timestamptz$$,
    'finish_step ok: prep completed; call is handed over under the same token and expiry'
);
SELECT is(
    orch8.compute_attempt('tap', pg_temp.id('s1'), 'prep'), 1,
    'compute_attempt: latest row an output: previous + 1'
);
SELECT throws_ok(
    $$SELECT orch8.begin_step('tap', pg_temp.id('s1'), pg_temp.token('s1'), 'prep',
                              'transform', '{}', 1)$$,
    'O8001', NULL, 'begin_step: a block the token no longer holds is O8001'
);

SELECT results_eq(
    $$SELECT (o).outcome, (o).state, (o).kind, (o).block_id, (o).attempt
      FROM pg_temp.begin('s1', 's1_call', 'call', 'x.y') AS o$$,
    $$VALUES ('dispatched'::text, 'dispatched'::orch8.effect_state, 'worker'::text,
              'call'::text, 0)$$,
    'begin_step: a side-effecting handler (x.y) is dispatched'
);
SELECT results_eq(
    $$SELECT o.attempt::integer, o.sentinel::text, o.effect_id, o.lease_token
      FROM orch8.block_outputs AS o
      WHERE o.instance_id = pg_temp.id('s1') AND o.block_id = 'call'$$,
    $$SELECT 0, '__in_progress__'::text, (pg_temp.receipt('s1_call')).id,
             pg_temp.token('s1')$$,
    'begin_step: one __in_progress__ row with the effect id and the lease token'
);
SELECT results_eq(
    $$SELECT r.state, r.instance_id, r.block_id::text, r.attempt::integer, r.handler::text
      FROM pg_temp.receipt('s1_call') AS r$$,
    $$SELECT 'dispatched'::orch8.effect_state, pg_temp.id('s1'), 'call'::text, 0, 'x.y'::text$$,
    'begin_step: the receipt is dispatched in the same call'
);
SELECT is(
    orch8.compute_attempt('tap', pg_temp.id('s1'), 'call'), 0,
    'compute_attempt: latest row __in_progress__: the same attempt'
);
SELECT results_eq(
    $$SELECT (o).outcome, (o).effect_id,
             (SELECT count(*)::integer FROM orch8.block_outputs AS b
              WHERE b.instance_id = pg_temp.id('s1') AND b.block_id = 'call')
      FROM pg_temp.begin('s1', 's1_again', 'call', 'x.y') AS o$$,
    $$SELECT 'dispatched'::text, (pg_temp.receipt('s1_call')).id, 1$$,
    'begin_step: repeated under the same lease, the same dispatched effect and no new row'
);
SELECT throws_ok(
    $$SELECT orch8.begin_step('tap', pg_temp.id('s1'), gen_random_uuid(), 'call', 'x.y',
                              '{"url": "https://x.example"}', 0)$$,
    'O8001', NULL, 'begin_step: a wrong token is O8001'
);
SELECT throws_ok(
    $$SELECT orch8.finish_step('tap', pg_temp.id('s1'), pg_temp.token('s1'), 'call', 0,
                               (pg_temp.receipt('s1_call')).id, 'maybe', '{}')$$,
    'O8008', NULL, 'finish_step: a result other than ok, error, not_applied, skipped or '
    'invalid_output is O8008'
);
SELECT throws_ok(
    $$SELECT orch8.finish_step('tap', pg_temp.id('s1'), gen_random_uuid(), 'call', 0,
                               (pg_temp.receipt('s1_call')).id, 'ok', '{}')$$,
    'O8001', NULL, 'finish_step: a wrong token is O8001'
);
SELECT is(
    pg_temp.footprint('s1'), ARRAY[2, 2, 3],
    'begin_step / finish_step: the refused calls wrote nothing'
);

SELECT results_eq(
    $$SELECT f.state::text, f.next_block FROM orch8.finish_step(
        'tap', pg_temp.id('s1'), pg_temp.token('s1'), 'call', 0,
        (pg_temp.receipt('s1_call')).id, 'error', '{}', 'HTTP 503', '5 minutes', 'E503'
    ) AS f$$,
    $$VALUES ('scheduled', NULL::text)$$,
    'finish_step error with retry_in: scheduled, and no node handed over (not the one to '
    'be retried)'
);
SELECT results_eq(
    $$SELECT o.attempt::integer, o.sentinel::text, o.retryable, o.output, o.effect_id
      FROM pg_temp.last_output('s1', 'call') AS o$$,
    $$SELECT 0, '__retry__'::text, true, '{"error": "HTTP 503", "code": "E503"}'::jsonb,
             (pg_temp.receipt('s1_call')).id$$,
    'finish_step error with retry_in: a __retry__ row (retryable) with the error and its code'
);
SELECT results_eq(
    $$SELECT n.state::text, n.next_fire_at, n.lease_token, t.state::text, t.next_fire_at,
             r.state, r.error
      FROM pg_temp.node('s1', 'call') AS n, pg_temp.inst('s1') AS t,
           pg_temp.receipt('s1_call') AS r$$,
    $$VALUES ('ready', '2030-01-01 00:06:52+00'::timestamptz, NULL::uuid, 'scheduled',
              '2030-01-01 00:06:52+00'::timestamptz, 'unknown'::orch8.effect_state,
              'HTTP 503'::text)$$,
    'finish_step error with retry_in: the node ready in 5 minutes without a lease, the '
    'instance scheduled then, the receipt unknown'
);
SELECT results_eq(
    $$SELECT * FROM pg_temp.last_audit('s1')$$,
    $$VALUES ('running'::orch8.instance_state, 'scheduled'::orch8.instance_state,
              'runner'::text, 'HTTP 503'::text)$$,
    'finish_step error with retry_in: audit row running -> scheduled with the error'
);
SELECT is(
    orch8.compute_attempt('tap', pg_temp.id('s1'), 'call'), 1,
    'compute_attempt: latest row __retry__: previous + 1'
);
SELECT is(
    (SELECT f.state::text FROM orch8.finish_step(
        'tap', pg_temp.id('s1'), pg_temp.token('s1'), 'call', 0,
        (pg_temp.receipt('s1_call')).id, 'error', '{}', 'HTTP 503', '5 minutes'
    ) AS f),
    'scheduled',
    'finish_step repeated under the same (now released) lease: answers the state'
);
SELECT is(
    pg_temp.footprint('s1'), ARRAY[3, 3, 4],
    'finish_step repeated: no new block output, audit row or receipt event'
);

SELECT is(pg_temp.start('s2'), 's2', 's2 is claimed');
SELECT is(pg_temp.finish_prep('s2'), 'call', 's2 finishes prep and holds call');
SELECT is(
    (pg_temp.begin('s2', 's2_call', 'call', 'x.y')).outcome, 'dispatched',
    'begin_step: s2 dispatches its step'
);
SELECT results_eq(
    $$SELECT f.state::text, f.next_block, f.next_attempt FROM orch8.finish_step(
        'tap', pg_temp.id('s2'), pg_temp.token('s2'), 'call', 0,
        (pg_temp.receipt('s2_call')).id, 'ok', '{"receipt_id": "r-1"}'
    ) AS f$$,
    $$VALUES ('completed', NULL::text, NULL::integer)$$,
    'finish_step ok without a next block: completed, nothing handed over'
);
SELECT results_eq(
    $$SELECT r.state, r.provider_receipt_id::text, o.sentinel::text, o.output, t.state
      FROM pg_temp.receipt('s2_call') AS r, pg_temp.last_output('s2', 'call') AS o,
           pg_temp.inst('s2') AS t$$,
    $$VALUES ('committed'::orch8.effect_state, 'r-1'::text, NULL::text,
              '{"receipt_id": "r-1"}'::jsonb, 'completed'::orch8.instance_state)$$,
    'finish_step ok: receipt committed with the provider id, output row, instance completed'
);
SELECT results_eq(
    $$SELECT n.path, n.state::text, n.lease_token, n.output
      FROM orch8.execution_nodes AS n WHERE n.instance_id = pg_temp.id('s2') ORDER BY n.path$$,
    $$VALUES ('', 'completed', NULL::uuid, '{"receipt_id": "r-1"}'::jsonb),
             ('call', 'completed', NULL, NULL), ('prep', 'completed', NULL, NULL)$$,
    'finish_step ok: every node completed without a lease; the root keeps the last output'
);
SELECT results_eq(
    $$SELECT * FROM pg_temp.last_audit('s2')$$,
    $$VALUES ('running'::orch8.instance_state, 'completed'::orch8.instance_state,
              'runner'::text, NULL::text)$$,
    'finish_step ok: audit row running -> completed by runner'
);
SELECT is(
    (SELECT f.state::text FROM orch8.finish_step(
        'tap', pg_temp.id('s2'), pg_temp.token('s2'), 'call', 0,
        (pg_temp.receipt('s2_call')).id, 'ok', '{"receipt_id": "r-1"}'
    ) AS f),
    'completed',
    'finish_step ok repeated under the same lease: answers completed'
);
SELECT is(
    pg_temp.footprint('s2'), ARRAY[3, 3, 4],
    'finish_step ok repeated: nothing new written'
);

SELECT is(pg_temp.start('s3'), 's3', 's3 is claimed');
SELECT is(pg_temp.finish_prep('s3'), 'call', 's3 finishes prep and holds call');
SELECT is(
    (pg_temp.begin('s3', 's3_call', 'call', 'x.y')).outcome, 'dispatched',
    'begin_step: s3 dispatches its step'
);
SELECT is(
    (SELECT f.state::text FROM orch8.finish_step(
        'tap', pg_temp.id('s3'), pg_temp.token('s3'), 'call', 0,
        (pg_temp.receipt('s3_call')).id, 'not_applied', '{"error": "connection refused"}',
        'connection refused', NULL, 'ECONNREFUSED'
    ) AS f),
    'failed',
    'finish_step not_applied without retry_in: failed'
);
SELECT results_eq(
    $$SELECT r.state, r.evidence -> 'not_applied', o.sentinel::text, o.retryable, o.output,
             t.state, t.error
      FROM pg_temp.receipt('s3_call') AS r, pg_temp.last_output('s3', 'call') AS o,
           pg_temp.inst('s3') AS t$$,
    $$VALUES ('abandoned'::orch8.effect_state, '{"error": "connection refused"}'::jsonb,
              '__error__'::text, false,
              '{"error": "connection refused", "code": "ECONNREFUSED"}'::jsonb,
              'failed'::orch8.instance_state, 'connection refused'::text)$$,
    'finish_step not_applied: receipt abandoned with the evidence, __error__ with the code, '
    'failed'
);
SELECT results_eq(
    $$SELECT n.path, n.state::text, n.error, n.failed_child
      FROM orch8.execution_nodes AS n WHERE n.instance_id = pg_temp.id('s3')
        AND n.path IN ('', 'call') ORDER BY n.path$$,
    $$VALUES ('', 'failed', 'connection refused', 'call'),
             ('call', 'failed', 'connection refused', NULL)$$,
    'finish_step not_applied: the node fails and the root with it, naming the failed child'
);

-- the retry of s1 five minutes later: a new attempt, a new receipt
SELECT set_config('orch8.fake_now', '2030-01-01 00:06:52+00', true);
SELECT ok(
    's1' IN (SELECT n FROM pg_temp.claim('w9', 10, '1 hour') AS n),
    'claim: s1 is due again after its retry backoff'
);
SELECT is(
    (
        SELECT l.path
        FROM leases AS l
        WHERE l.name = 's1'
        ORDER BY l.n DESC
        LIMIT 1
    ),
    'call',
    'claim: the node claimed again is the one to retry'
);
SELECT results_eq(
    $$SELECT (o).outcome, (o).attempt, (o).effect_id <> (pg_temp.receipt('s1_call')).id
      FROM pg_temp.begin('s1', 's1_retry', 'call', 'x.y', 1) AS o$$,
    $$VALUES ('dispatched'::text, 1, true)$$,
    'begin_step attempt 1: dispatched with a new receipt'
);

SELECT throws_ok(
    $$SELECT orch8.heartbeat_leases(ARRAY[gen_random_uuid()], NULL)$$,
    'O8008', NULL, 'heartbeat_leases: a NULL lease is O8008'
);
SELECT throws_ok(
    $$SELECT orch8.heartbeat_leases(ARRAY[gen_random_uuid()], '-1 hour')$$,
    'O8008', NULL, 'heartbeat_leases: a negative lease is O8008 (it would look held yet lapse)'
);

-- claim_work: the runner's claim names the node to run and its attempt
SELECT FROM pg_temp.create('cw', p_priority => 5000, p_fire_at => orch8.now() - interval '1 day');
SELECT results_eq(
    $$SELECT c.id, c.current_block, c.current_attempt, c.block_id, c.kind, c.vars, c.progress
      FROM orch8.claim_work('w-cw', 1, '1 hour') AS c$$,
    $$VALUES (pg_temp.id('cw'), 'prep'::text, 0, 'prep'::text, 'step'::text, '{}'::jsonb,
              '{}'::jsonb)$$,
    'claim_work: a new instance starts at the first block of its sequence, attempt 0'
);

SELECT * FROM finish();
ROLLBACK;
