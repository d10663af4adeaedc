-- Instances, leases and steps: the transition table, create_instance, the lease-fenced
-- claim (claim_due_instances, heartbeat_leases, lock_leased_instance, release_lease,
-- reclaim_expired_leases), transition_instance, compute_attempt, begin_step and
-- finish_step. Time moves with orch8.fake_now; every claim is made in this file, so
-- which instances are due is known at each point.
BEGIN;
SELECT plan(124);

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
    token uuid,
    owner text,
    expires_at timestamptz
);

CREATE TEMP TABLE outcomes (name text PRIMARY KEY, o orch8.effect_outcome);

-- blocks prep then call: finish_step finds the next block in the definition. call resends
-- after an ambiguous outcome (new_attempt), so finish_step's retry_in is honoured for it
-- (the default, settle, is tested in 22_settlement.sql).
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

-- claim a batch and record each lease; returns the names claimed
CREATE FUNCTION pg_temp.claim(p_worker text, p_batch integer, p_lease interval)
RETURNS SETOF text
LANGUAGE sql
AS $$
    INSERT INTO leases AS l (name, token, owner, expires_at)
    SELECT
        coalesce((SELECT min(i.name) FROM ids AS i WHERE i.id = c.id), c.id::text),
        c.lease_token, c.lease_owner, c.lease_expires_at
    FROM orch8.claim_due_instances(p_worker, p_batch, p_lease) AS c
    RETURNING l.name
$$;

-- create an instance that wins the next claim (top priority, due a day ago) and claim it
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

-- 1. The transition table ---------------------------------------------------------------

SELECT is(
    enum_range(NULL::orch8.instance_state),
    ARRAY[
        'scheduled', 'running', 'waiting', 'paused', 'completed', 'failed', 'cancelled'
    ]::orch8.instance_state[],
    'instance_state has exactly the seven documented states, in order'
);

-- One row per from-state, one column per to-state (scheduled, running, waiting, paused,
-- completed, failed, cancelled). failed -> completed follows the function's COMMENT and
-- docs/SQL_API.md "Operating instances" (the States table there lists failed -> scheduled
-- only).
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
    $$VALUES ('scheduled', false, true, false, true, false, false, true),
             ('running', true, false, true, true, true, true, true),
             ('waiting', true, false, false, true, true, true, true),
             ('paused', true, false, false, false, false, false, true),
             ('completed', false, false, false, false, false, false, false),
             ('failed', true, false, false, false, true, false, false),
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
    (pg_temp.inst('a')).context,
    '{"data": {"order_id": 7}, "config": {"currency": "EUR"}, "runtime": {}}'::jsonb,
    'create_instance: context is {data, config, runtime} with an empty runtime'
);
SELECT results_eq(
    $$SELECT t.state, t.priority, t.next_fire_at, t.sequence_version, t.parent_instance_id,
             t.lease_owner, t.lease_token, t.lease_expires_at, t.current_block, t.error
      FROM orch8.task_instances AS t WHERE t.id = pg_temp.id('a')$$,
    $$VALUES ('scheduled'::orch8.instance_state, 0, '2030-01-01 00:00:00+00'::timestamptz, 1,
              NULL::uuid, NULL::text, NULL::uuid, NULL::timestamptz, NULL::text, NULL::text)$$,
    'create_instance: priority 0, due now, the sequence version, no parent and no lease'
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
SELECT is(
    (SELECT count(*)::integer FROM pg_temp.audit('k1')), 1,
    'create_instance: a deduplicated call writes no second audit row'
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
              WHERE tenant_id = 'tap')$$,
    $$VALUES (3, 3)$$,
    'create_instance: the refused contexts wrote no instance and no audit row'
);
SELECT throws_ok(
    $$SELECT orch8.create_instance('tap', gen_random_uuid())$$,
    'O8007', NULL, 'create_instance: an unknown sequence is O8007'
);
SELECT throws_ok(
    $$SELECT orch8.create_instance('tap', pg_temp.id('seq'), '[1]')$$,
    'O8008', NULL, 'create_instance: data that is not an object is O8008'
);
SELECT throws_ok(
    $$SELECT orch8.create_instance('tap', pg_temp.id('seq'), p_idempotency_key => '')$$,
    'O8008', NULL, 'create_instance: an empty idempotency key is O8008'
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

-- 3. claim_due_instances (at 00:00:00) ------------------------------------------------

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
    'claim batch 1 again: the other priority-5 instance'
);
SELECT results_eq(
    $$SELECT n FROM pg_temp.claim('w2', 1, '1 hour') AS n$$,
    $$VALUES ('c_mid')$$,
    'claim batch 1: priority 1 before an older priority-0 instance'
);
SELECT results_eq(
    $$SELECT n FROM pg_temp.claim('w2', 5, '1 hour') AS n$$,
    $$VALUES ('c_low')$$,
    'claim batch 5: only the one due instance left (c_future is not yet due)'
);
SELECT is(
    (SELECT count(*)::integer FROM pg_temp.claim('w2', 5, '1 hour')), 0,
    'claim: nothing due, nothing claimed'
);
SELECT is(
    (pg_temp.inst('c_future')).state, 'scheduled',
    'claim: an instance due in the future stays scheduled'
);
SELECT results_eq(
    $$SELECT t.state, t.lease_owner, t.lease_token, t.lease_expires_at
      FROM orch8.task_instances AS t WHERE t.id = pg_temp.id('c_high_early')$$,
    $$VALUES ('running'::orch8.instance_state, 'w1'::text, pg_temp.token('c_high_early'),
              '2030-01-01 00:00:45+00'::timestamptz)$$,
    'claim: running, owned by the worker, with the returned token, expiring at now + lease'
);
SELECT results_eq(
    $$SELECT count(*)::integer, count(DISTINCT l.token)::integer, count(l.token)::integer
      FROM leases AS l$$,
    $$VALUES (4, 4, 4)$$,
    'claim: each of the four claims got its own non-NULL lease token'
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
    $$SELECT * FROM orch8.claim_due_instances('', 1, '30 seconds')$$,
    'O8008', NULL, 'claim: an empty worker id is O8008'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.claim_due_instances('w1', 0, '30 seconds')$$,
    'O8008', NULL, 'claim: a batch of 0 is O8008'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.claim_due_instances('w1', 1, '0 seconds')$$,
    'O8008', NULL, 'claim: a zero lease is O8008'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.claim_due_instances('w1', 1, '-5 seconds')$$,
    'O8008', NULL, 'claim: a negative lease is O8008'
);

-- 4. lock_leased_instance and release_lease (at 00:00:00) --------------------------------

SELECT is(
    (orch8.lock_leased_instance('tap', pg_temp.id('c_mid'), pg_temp.token('c_mid'))).lease_owner,
    'w2',
    'lock_leased_instance: the holder''s token locks and returns the instance'
);
SELECT throws_ok(
    $$SELECT orch8.lock_leased_instance('tap', pg_temp.id('c_mid'), gen_random_uuid())$$,
    'O8001', NULL, 'lock_leased_instance: a token that is not the current one is O8001'
);
SELECT throws_ok(
    $$SELECT orch8.lock_leased_instance('tap', pg_temp.id('a'), NULL)$$,
    'O8001', NULL, 'lock_leased_instance: an instance that is not running is O8001'
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
    $$SELECT t.state, t.lease_token FROM orch8.task_instances AS t
      WHERE t.id = pg_temp.id('c_mid')$$,
    $$SELECT 'running'::orch8.instance_state, pg_temp.token('c_mid')$$,
    'release_lease: the refused release left the instance running under its lease'
);

SELECT orch8.release_lease('tap', pg_temp.id('c_mid'), pg_temp.token('c_mid'));
SELECT results_eq(
    $$SELECT t.state, t.next_fire_at, t.lease_owner, t.lease_token, t.lease_expires_at
      FROM orch8.task_instances AS t WHERE t.id = pg_temp.id('c_mid')$$,
    $$VALUES ('scheduled'::orch8.instance_state, '2030-01-01 00:00:00+00'::timestamptz,
              NULL::text, NULL::uuid, NULL::timestamptz)$$,
    'release_lease: back to scheduled, due now, the lease dropped'
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
             (SELECT a.reason FROM pg_temp.last_audit('c_low') AS a)$$,
    $$VALUES ('scheduled'::orch8.instance_state, '2030-01-01 00:10:00+00'::timestamptz,
              'backoff'::text)$$,
    'release_lease: at the given next_fire_at, with the given reason'
);

SELECT is(
    orch8.pause_instance('tap', pg_temp.id('c_high_late'), 'bob'), 'requested',
    'pause_instance on a running instance is only requested'
);
SELECT orch8.release_lease('tap', pg_temp.id('c_high_late'), pg_temp.token('c_high_late'));
SELECT results_eq(
    $$SELECT t.state, t.requested_state, t.lease_token, a.from_state, a.to_state, a.actor,
             a.reason
      FROM orch8.task_instances AS t, pg_temp.last_audit('c_high_late') AS a
      WHERE t.id = pg_temp.id('c_high_late')$$,
    $$VALUES ('paused'::orch8.instance_state, NULL::orch8.instance_state, NULL::uuid,
              'running'::orch8.instance_state, 'paused'::orch8.instance_state,
              'operator'::text, 'requested while running'::text)$$,
    'release_lease: a pause requested meanwhile wins over scheduled and is cleared'
);

SELECT results_eq(
    $$SELECT n FROM pg_temp.claim('w4', 1, '1 hour') AS n$$,
    $$VALUES ('c_mid')$$,
    'claim: a released instance is claimed again'
);
SELECT isnt(
    pg_temp.token('c_mid'), pg_temp.first_token('c_mid'),
    'claim: the second claim of an instance gets a new lease token'
);

-- hb: one more running instance, with a 30 second lease
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
    $$SELECT i.name, t.lease_expires_at FROM orch8.task_instances AS t
      JOIN ids AS i ON i.id = t.id
      WHERE i.name IN ('c_high_early', 'hb', 'c_mid') ORDER BY i.name$$,
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
    'claim: an instance is due at exactly its next_fire_at'
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
    $$SELECT i.name, t.state, t.next_fire_at, t.lease_owner, t.lease_token,
             t.lease_expires_at
      FROM orch8.task_instances AS t JOIN ids AS i ON i.id = t.id
      WHERE i.name IN ('c_high_early', 'hb') ORDER BY i.name$$,
    $$VALUES ('c_high_early', 'scheduled'::orch8.instance_state,
              '2030-01-01 00:01:21+00'::timestamptz, NULL::text, NULL::uuid,
              NULL::timestamptz),
             ('hb', 'scheduled', '2030-01-01 00:01:21+00', NULL, NULL, NULL)$$,
    'reclaim: back to scheduled, due now, without a lease'
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
SELECT is(
    (pg_temp.inst('c_mid')).state, 'running',
    'reclaim: a lease that has not expired is left alone'
);

-- 7. The sweep applies a requested cancel or pause (00:01:21 -> 00:01:52) ------------------

SELECT results_eq(
    $$SELECT pg_temp.start('r1', '30 seconds') UNION ALL SELECT pg_temp.start('r2', '10 seconds')$$,
    $$VALUES ('r1'), ('r2')$$,
    'r1 and r2 are claimed (their leases expire at 00:01:51 and 00:01:31)'
);
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

SELECT set_config('orch8.fake_now', '2030-01-01 00:01:52+00', true);
SELECT is(orch8.reclaim_expired_leases(1), 1, 'reclaim(1): at most one instance');
SELECT results_eq(
    $$SELECT (pg_temp.inst('r1')).state, (pg_temp.inst('r2')).state,
             (pg_temp.inst('r2')).requested_state$$,
    $$VALUES ('running'::orch8.instance_state, 'paused'::orch8.instance_state,
              NULL::orch8.instance_state)$$,
    'reclaim(1): the earliest expiry (r2) goes first, to the requested paused'
);
SELECT is(orch8.reclaim_expired_leases(), 1, 'reclaim: then the other one');
SELECT results_eq(
    $$SELECT t.state, t.requested_state, t.lease_token FROM orch8.task_instances AS t
      WHERE t.id = pg_temp.id('r1')$$,
    $$VALUES ('cancelled'::orch8.instance_state, NULL::orch8.instance_state, NULL::uuid)$$,
    'reclaim: the requested cancel is applied instead of scheduled'
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
              'outcome unknown: the lease expired and the instance was cancelled as requested'
              ::text)$$,
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
    $$SELECT orch8.transition_instance('tap', pg_temp.id('a'), 'scheduled', 'completed', 'x')$$,
    'O8004', NULL, 'transition_instance: scheduled -> completed is O8004'
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

SELECT is(pg_temp.start('p'), 'p', 'the parent p is claimed');
SELECT ok(
    orch8.transition_instance('tap', pg_temp.id('p'), 'running', 'waiting', 'runner', 'child'),
    'transition_instance: running -> waiting answers true'
);
SELECT results_eq(
    $$SELECT t.state, t.lease_owner, t.lease_token, t.lease_expires_at
      FROM orch8.task_instances AS t WHERE t.id = pg_temp.id('p')$$,
    $$VALUES ('waiting'::orch8.instance_state, NULL::text, NULL::uuid, NULL::timestamptz)$$,
    'transition_instance: leaving running drops the lease'
);
SELECT is(pg_temp.start('ch', p_parent => 'p'), 'ch', 'the child ch of p is claimed');
SELECT is(
    (pg_temp.inst('ch')).parent_instance_id, pg_temp.id('p'),
    'create_instance: the parent argument is stored'
);
SELECT orch8.transition_instance('tap', pg_temp.id('ch'), 'running', 'completed', 'runner');
SELECT results_eq(
    $$SELECT t.state, t.next_fire_at, a.from_state, a.to_state, a.actor, a.reason
      FROM orch8.task_instances AS t, pg_temp.last_audit('p') AS a
      WHERE t.id = pg_temp.id('p')$$,
    $$SELECT 'scheduled'::orch8.instance_state, '2030-01-01 00:01:52+00'::timestamptz,
             'waiting'::orch8.instance_state, 'scheduled'::orch8.instance_state,
             'child'::text, format('child %s completed', pg_temp.id('ch'))$$,
    'transition_instance: a child that ends wakes its waiting parent (scheduled, by child)'
);
-- a second child, ch2, fails while p is scheduled
SELECT pg_temp.start('ch2', p_parent => 'p');
SELECT orch8.transition_instance('tap', pg_temp.id('ch2'), 'running', 'failed', 'runner', 'boom');
SELECT results_eq(
    $$SELECT (pg_temp.inst('ch2')).state, (pg_temp.inst('ch2')).error,
             (pg_temp.inst('p')).state, (SELECT count(*)::integer FROM pg_temp.audit('p'))$$,
    $$VALUES ('failed'::orch8.instance_state, 'boom'::text, 'scheduled'::orch8.instance_state,
              4)$$,
    'transition_instance: failed keeps the reason as error; a parent not waiting is untouched'
);
SELECT orch8.transition_instance(
    'tap', pg_temp.id('ch2'), 'failed', 'scheduled', 'alice', 'retry', '2030-01-01 02:00:00+00'
);
SELECT results_eq(
    $$SELECT t.state, t.error, t.next_fire_at FROM orch8.task_instances AS t
      WHERE t.id = pg_temp.id('ch2')$$,
    $$VALUES ('scheduled'::orch8.instance_state, NULL::text,
              '2030-01-01 02:00:00+00'::timestamptz)$$,
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
SELECT results_eq(
    $$SELECT f.state, f.next_block, f.next_attempt FROM orch8.finish_step(
        'tap', pg_temp.id('s1'), pg_temp.token('s1'), 'prep', 0, NULL, 'ok', '{"v": 1}'
    ) AS f$$,
    $$VALUES ('running'::orch8.instance_state, 'call'::text, 0)$$,
    'finish_step ok before the last block: running, and the next block with its attempt'
);
SELECT results_eq(
    $$SELECT (pg_temp.inst('s1')).current_block, o.attempt, o.sentinel, o.output, o.effect_id
      FROM pg_temp.last_output('s1', 'prep') AS o$$,
    $$VALUES ('call'::text, 0, NULL::text, '{"v": 1}'::jsonb, NULL::uuid)$$,
    'finish_step ok: the output row is written and current_block advances'
);
SELECT is(
    orch8.compute_attempt('tap', pg_temp.id('s1'), 'prep'), 1,
    'compute_attempt: latest row an output: previous + 1'
);

SELECT results_eq(
    $$SELECT (o).outcome, (o).state, (o).kind, (o).block_id, (o).attempt
      FROM pg_temp.begin('s1', 's1_call', 'call', 'x.y') AS o$$,
    $$VALUES ('dispatched'::text, 'dispatched'::orch8.effect_state, 'worker'::text,
              'call'::text, 0)$$,
    'begin_step: a side-effecting handler (x.y) is dispatched'
);
SELECT results_eq(
    $$SELECT o.attempt, o.sentinel, o.effect_id, o.lease_token
      FROM orch8.block_outputs AS o
      WHERE o.instance_id = pg_temp.id('s1') AND o.block_id = 'call'$$,
    $$SELECT 0, '__in_progress__'::text, (pg_temp.receipt('s1_call')).id,
             pg_temp.token('s1')$$,
    'begin_step: one __in_progress__ row with the effect id and the lease token'
);
SELECT results_eq(
    $$SELECT r.state, r.instance_id, r.block_id, r.attempt, r.handler
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
    'O8008', NULL, 'finish_step: a result other than ok, error or not_applied is O8008'
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

SELECT is(
    (SELECT f.state::text FROM orch8.finish_step(
        'tap', pg_temp.id('s1'), pg_temp.token('s1'), 'call', 0,
        (pg_temp.receipt('s1_call')).id, 'error', '{}', 'HTTP 503', '5 minutes'
    ) AS f),
    'scheduled',
    'finish_step error with retry_in: scheduled'
);
SELECT results_eq(
    $$SELECT o.attempt, o.sentinel, o.retryable, o.output, o.effect_id
      FROM pg_temp.last_output('s1', 'call') AS o$$,
    $$SELECT 0, '__retry__'::text, true, '{"error": "HTTP 503"}'::jsonb,
             (pg_temp.receipt('s1_call')).id$$,
    'finish_step error with retry_in: a __retry__ row (retryable) with the error'
);
SELECT results_eq(
    $$SELECT t.state, t.next_fire_at, t.lease_token, r.state, r.error
      FROM orch8.task_instances AS t, pg_temp.receipt('s1_call') AS r
      WHERE t.id = pg_temp.id('s1')$$,
    $$VALUES ('scheduled'::orch8.instance_state, '2030-01-01 00:06:52+00'::timestamptz,
              NULL::uuid, 'unknown'::orch8.effect_state, 'HTTP 503'::text)$$,
    'finish_step error with retry_in: due in 5 minutes, no lease, receipt unknown'
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
SELECT is(
    (pg_temp.begin('s2', 's2_charge', 'charge', 'x.y')).outcome, 'dispatched',
    'begin_step: s2 dispatches its step'
);
SELECT is(
    (SELECT f.state::text FROM orch8.finish_step(
        'tap', pg_temp.id('s2'), pg_temp.token('s2'), 'charge', 0,
        (pg_temp.receipt('s2_charge')).id, 'ok', '{"receipt_id": "r-1"}'
    ) AS f),
    'completed',
    'finish_step ok without a next block: completed'
);
SELECT results_eq(
    $$SELECT r.state, r.provider_receipt_id, o.sentinel, o.output, t.state, t.lease_token
      FROM pg_temp.receipt('s2_charge') AS r, pg_temp.last_output('s2', 'charge') AS o,
           pg_temp.inst('s2') AS t$$,
    $$VALUES ('committed'::orch8.effect_state, 'r-1'::text, NULL::text,
              '{"receipt_id": "r-1"}'::jsonb, 'completed'::orch8.instance_state, NULL::uuid)$$,
    'finish_step ok: receipt committed with the provider id, output row, instance completed'
);
SELECT results_eq(
    $$SELECT * FROM pg_temp.last_audit('s2')$$,
    $$VALUES ('running'::orch8.instance_state, 'completed'::orch8.instance_state,
              'runner'::text, NULL::text)$$,
    'finish_step ok: audit row running -> completed by runner'
);
SELECT is(
    (SELECT f.state::text FROM orch8.finish_step(
        'tap', pg_temp.id('s2'), pg_temp.token('s2'), 'charge', 0,
        (pg_temp.receipt('s2_charge')).id, 'ok', '{"receipt_id": "r-1"}'
    ) AS f),
    'completed',
    'finish_step ok repeated under the same lease: answers completed'
);
SELECT is(
    pg_temp.footprint('s2'), ARRAY[2, 3, 4],
    'finish_step ok repeated: nothing new written'
);

SELECT is(pg_temp.start('s3'), 's3', 's3 is claimed');
SELECT is(
    (pg_temp.begin('s3', 's3_send', 'send', 'x.y')).outcome, 'dispatched',
    'begin_step: s3 dispatches its step'
);
SELECT is(
    (SELECT f.state::text FROM orch8.finish_step(
        'tap', pg_temp.id('s3'), pg_temp.token('s3'), 'send', 0,
        (pg_temp.receipt('s3_send')).id, 'not_applied', '{"error": "connection refused"}',
        'connection refused'
    ) AS f),
    'failed',
    'finish_step not_applied without retry_in: failed'
);
SELECT results_eq(
    $$SELECT r.state, r.evidence -> 'not_applied', o.sentinel, o.retryable, t.state, t.error
      FROM pg_temp.receipt('s3_send') AS r, pg_temp.last_output('s3', 'send') AS o,
           pg_temp.inst('s3') AS t$$,
    $$VALUES ('abandoned'::orch8.effect_state, '{"error": "connection refused"}'::jsonb,
              '__error__'::text, false, 'failed'::orch8.instance_state,
              'connection refused'::text)$$,
    'finish_step not_applied: receipt abandoned with the evidence, __error__, failed'
);

-- the retry of s1 five minutes later: a new attempt, a new receipt
SELECT set_config('orch8.fake_now', '2030-01-01 00:06:52+00', true);
SELECT ok(
    's1' IN (SELECT n FROM pg_temp.claim('w9', 10, '1 hour') AS n),
    'claim: s1 is due again after its retry backoff'
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
SELECT throws_ok(
    $$SELECT orch8.transition_instance('tap', gen_random_uuid(), 'scheduled', 'running', 'x')$$,
    'O8004', NULL, 'transition_instance: running is reached only by a claim (O8004)'
);

-- claim_work: the runner's claim names the block to run and its attempt
SELECT FROM pg_temp.create('cw', p_priority => 5000, p_fire_at => orch8.now() - interval '1 day');
SELECT results_eq(
    $$SELECT c.id, c.current_block, c.current_attempt, c.progress
      FROM orch8.claim_work('w-cw', 1, '1 hour') AS c$$,
    $$VALUES (pg_temp.id('cw'), 'prep'::text, 0, '{}'::jsonb)$$,
    'claim_work: a new instance starts at the first block of its sequence, attempt 0'
);

SELECT * FROM finish();
ROLLBACK;
