-- The database defends itself (issue "The ledger defends itself", docs/SECURITY.md): each
-- attack the issue lists, reproduced, and refused or recorded. pg_prove connects as a
-- superuser; pg_temp.as_role runs one statement as an application role.
BEGIN;
SELECT plan(69);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:00+00', true);

-- Run p_sql as p_role (SET LOCAL ROLE, reverted on error with the subtransaction); answer
-- 'ok' or the SQLSTATE it raised.
CREATE FUNCTION pg_temp.as_role(p_role text, p_sql text)
RETURNS text
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM set_config('role', p_role, true);
    EXECUTE p_sql;
    PERFORM set_config('role', 'none', true);
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END
$$;

-- Two tenants, each with an operator key (hash of the secret 'ld-key' / 'beta-key').
SELECT orch8.create_api_key('ld', 'ld-ops', 'operator', 'o8_ld', encode(sha256('ld-key'), 'hex'));
SELECT orch8.create_api_key(
    'beta', 'beta-ops', 'operator', 'o8_be', encode(sha256('beta-key'), 'hex')
);
SELECT orch8.create_api_key(
    'ld', 'old', 'operator', 'o8_ol', encode(sha256('old-key'), 'hex'),
    orch8.now() + interval '1 second'
);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:05+00', true);  -- 'old' has expired

CREATE TEMP TABLE names (name text PRIMARY KEY, id uuid, token uuid);
INSERT INTO names (name, id)
SELECT
    'seq' AS name,
    s.id
FROM orch8.create_sequence('ld', 'tap', 'pay', '{"blocks": [
    {"id": "charge", "type": "step", "handler": "x.pay", "params": {"amount": 5}}]}') AS s;
INSERT INTO names (name, id)
SELECT
    n AS name,
    (orch8.create_instance('ld', (
        SELECT id FROM names
        WHERE name = 'seq'
    ))).id AS id
FROM unnest(ARRAY['d', 's', 'done']) AS n;
INSERT INTO names (name, id)
SELECT
    'beta1' AS name,
    (orch8.create_instance('beta', s.id)).id AS id
FROM orch8.create_sequence('beta', 'tap', 'pay', '{"blocks": [
    {"id": "charge", "type": "step", "handler": "x.pay"}]}') AS s;
UPDATE names AS n SET token = c.lease_token
FROM orch8.claim_work('tap-runner', 10, '1 hour') AS c
WHERE c.id = n.id;

CREATE FUNCTION pg_temp.id(p_name text)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT n.id FROM names AS n WHERE n.name = p_name $$;

CREATE FUNCTION pg_temp.token(p_name text)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT n.token FROM names AS n WHERE n.name = p_name $$;

-- 1. A lease holder cannot settle another instance's receipt --------------------------------

INSERT INTO names (name, id)
SELECT
    'r_s' AS name,
    (orch8.begin_step(
        'ld', pg_temp.id('s'), pg_temp.token('s'), 'charge',
        'x.pay', '{"amount": 5}', 0
    )).effect_id AS id;
INSERT INTO names (name, id)
SELECT
    'r_d' AS name,
    (orch8.begin_step(
        'ld', pg_temp.id('d'), pg_temp.token('d'), 'charge',
        'x.pay', '{"amount": 5}', 0
    )).effect_id AS id;

SELECT throws_ok(
    format(
        $$SELECT orch8.finish_step('ld', %L, %L, 'charge', 0, %L, 'ok',
                                      '{"receipt_id": "ch_wrong"}')$$,
        pg_temp.id('d'), pg_temp.token('d'), pg_temp.id('r_s')
    ),
    'O8009', NULL, 'finish_step refuses a receipt of another instance'
);
SELECT throws_ok(
    format(
        $$SELECT orch8.finish_step('ld', %L, %L, 'charge', 1, %L, 'ok', '{}')$$,
        pg_temp.id('d'), pg_temp.token('d'), pg_temp.id('r_d')
    ),
    'O8009', NULL, 'finish_step refuses its own block''s receipt under another attempt'
);
SELECT throws_ok(
    format(
        $$SELECT orch8.append_block_output('ld', %L, %L, 'charge', 0, '__done__', '{}',
                                              NULL, %L)$$,
        pg_temp.id('d'), pg_temp.token('d'), pg_temp.id('r_s')
    ),
    'O8009', NULL, 'a block output cannot cite another instance''s receipt'
);
SELECT is(
    (
        SELECT state::text FROM orch8.effect_receipts
        WHERE id = pg_temp.id('r_s')
    ),
    'dispatched', 'the other instance''s receipt is untouched'
);
SELECT is(
    (SELECT state::text FROM orch8.finish_step(
        'ld', pg_temp.id('d'), pg_temp.token('d'), 'charge', 0, pg_temp.id('r_d'), 'ok',
        '{"receipt_id": "ch_d"}'
    )),
    'completed', 'its own receipt settles as before'
);

-- 2. No application role writes a ledger table, a history table or a global table ----------

SELECT is(pg_temp.as_role('orch8_web', format(
    $$UPDATE orch8.effect_receipts SET state = 'committed' WHERE id = %L$$, pg_temp.id('r_s')
)),
'42501', 'the web role cannot UPDATE a receipt');
SELECT is(pg_temp.as_role('orch8_runner', format(
    $$UPDATE orch8.effect_receipts SET state = 'committed' WHERE id = %L$$, pg_temp.id('r_s')
)),
'42501', 'nor can the runner role');
SELECT is(pg_temp.as_role(
    'orch8_web',
    $$INSERT INTO orch8.effect_receipt_events (tenant_id, receipt_id, to_state, actor)
      VALUES ('ld', gen_random_uuid(), 'planned', 'x')$$
),
'42501', 'the web role cannot write receipt events');
SELECT is(pg_temp.as_role(
    'orch8_web',
    $$UPDATE orch8.workflow_invariants SET commit_guard = false$$
),
'42501', 'the web role cannot switch a commit guard off');
SELECT is(pg_temp.as_role(
    'orch8_web',
    $$UPDATE orch8.task_instances SET state = 'scheduled'$$
),
'42501', 'the web role cannot move an instance by UPDATE');
SELECT is(
    pg_temp.as_role('orch8_web', $$DELETE FROM orch8.instance_transitions$$),
    '42501', 'the web role cannot delete transitions'
);
SELECT is(pg_temp.as_role(
    'orch8_web',
    $$UPDATE orch8.builtin_handlers SET has_side_effects = false, kind = NULL
      WHERE name = 'http_request'$$
),
'42501', 'the web role cannot switch receipts off for every tenant (builtin_handlers)');
SELECT is(pg_temp.as_role(
    'orch8_runner',
    $$UPDATE orch8.builtin_handlers SET has_side_effects = false$$
),
'42501', 'nor can the runner role');
SELECT is(
    pg_temp.as_role('orch8_web', $$DELETE FROM orch8.schema_migrations$$),
    '42501', 'the web role cannot rewrite schema_migrations'
);
SELECT is(pg_temp.as_role(
    'orch8_auditor',
    $$UPDATE orch8.effect_receipts SET error = 'x'$$
),
'42501', 'the auditor only reads');
SELECT is(
    pg_temp.as_role('orch8_web', $$SELECT 1 FROM orch8.api_keys$$),
    '42501', 'the web role cannot read the key table'
);
SELECT is(
    pg_temp.as_role('orch8_web', $$SELECT 1 FROM orch8.tenant_seal$$),
    '42501', 'the web role cannot read the seal secret'
);
SELECT is(pg_temp.as_role(
    'orch8_web',
    $$SELECT orch8.seal_of('ld', gen_random_uuid()::text, 'admin')$$
),
'42501', 'the web role cannot compute a seal');
SELECT is(
    pg_temp.as_role('orch8_web', $$SELECT * FROM orch8.claim_work('w', 1, '1 hour')$$),
    '42501', 'the web role cannot call the runner''s functions'
);
SELECT is(pg_temp.as_role('orch8_web', format(
    $$SELECT orch8.cas_effect_receipt('ld', %L, 'dispatched', 'committed')$$,
    pg_temp.id('r_s')
)),
'42501', 'nor the ledger''s internal CAS');

SELECT is_empty(
    $$SELECT p.oid::regprocedure::text FROM pg_proc AS p
      LEFT JOIN orch8.function_access AS a ON a.name = p.proname
      WHERE p.pronamespace = 'orch8'::regnamespace AND p.prokind = 'f'
        AND p.provolatile = 'v' AND coalesce(a.access, '') NOT IN ('migration', 'private')
        AND NOT (p.prosecdef
                 AND 'search_path=pg_catalog, orch8, pg_temp' = ANY (p.proconfig))$$,
    'every writing function an application role may call is SECURITY DEFINER with a fixed '
    || 'search_path'
);
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text FROM pg_proc AS p
      JOIN orch8.function_access AS a ON a.name = p.proname
      WHERE p.pronamespace = 'orch8'::regnamespace AND a.access IN ('private', 'migration')
        AND (has_function_privilege('orch8_web', p.oid, 'EXECUTE')
             OR has_function_privilege('orch8_runner', p.oid, 'EXECUTE')
             OR has_function_privilege('orch8_auditor', p.oid, 'EXECUTE'))$$,
    'no application role may call a private helper or a migration function'
);
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text FROM pg_proc AS p
      LEFT JOIN orch8.function_access AS a ON a.name = p.proname
      WHERE p.pronamespace = 'orch8'::regnamespace AND p.prokind = 'f'
        AND coalesce(a.access, '') NOT IN ('migration', 'maintenance')
        AND pg_get_userbyid(p.proowner) NOT IN ('orch8_ledger', 'orch8_runner')$$,
    'every function is owned by orch8_ledger (or orch8_runner for all-tenant reads)'
);
SELECT is_empty(
    $$SELECT c.relname FROM pg_class AS c
      WHERE c.relnamespace = 'orch8'::regnamespace AND c.relkind IN ('r', 'p')
        AND (has_table_privilege('orch8_web', c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE')
             OR has_table_privilege('orch8_runner', c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE')
             OR has_table_privilege('orch8_auditor', c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE'))$$,
    'no application role holds DML on any table of the schema'
);

-- 3. History names the real caller; identity, receipt id and evidence cannot be rewritten ----

SELECT orch8.mark_effect_unknown('ld', pg_temp.id('r_s'), 'timeout');

-- the web role with ld's key: the event names the key, whatever the actor argument says
SELECT is(pg_temp.as_role('orch8_web', format(
    $$SELECT orch8.enter_tenant('api_key', %L, 'ld'),
             set_config('orch8.event_actor', 'alice@ops', true),
             orch8.resolve_effect('ld', %L, 'unknown', 'committed', 'ch_s',
                                  '{"checked": "dashboard"}', 'alice@ops')$$,
    encode(sha256('ld-key'), 'hex'), pg_temp.id('r_s')
)),
'ok', 'the web role resolves through the function');
SELECT results_eq(
    format($$SELECT actor, db_user = session_user, api_key_id IS NOT NULL
             FROM orch8.effect_receipt_events
             WHERE receipt_id = %L AND to_state = 'committed'$$, pg_temp.id('r_s')),
    $$VALUES ('key:ld-ops', true, true)$$,
    'the event names the sealed key and the login, not the actor it was told'
);

-- a superuser's direct UPDATE with a forged actor: the login is recorded beside it
SELECT
    set_config('orch8.event_actor', 'alice@ops', true) AS actor,
    set_config('orch8.event_evidence', '{"ticket": "OPS-1"}', true) AS evidence;
UPDATE orch8.effect_receipts SET state = 'compensated'
WHERE id = pg_temp.id('r_s');
SELECT orch8.clear_event_attribution();
SELECT results_eq(
    format($$SELECT actor, db_user = session_user FROM orch8.effect_receipt_events
             WHERE receipt_id = %L AND to_state = 'compensated'$$, pg_temp.id('r_s')),
    $$VALUES ('alice@ops', true)$$,
    'a direct UPDATE records the real login next to any claimed actor'
);

SELECT throws_ok(
    format($$UPDATE orch8.effect_receipts
             SET provider_receipt_id = 'forged', evidence = '{"forged": true}'
             WHERE id = %L$$, pg_temp.id('r_d')),
    'O8004', NULL, 'provider receipt id and evidence do not change without a recorded move'
);
SELECT throws_ok(
    format(
        $$UPDATE orch8.effect_receipts SET idempotency_key = 'other' WHERE id = %L$$,
        pg_temp.id('r_d')
    ),
    'O8004', NULL, 'the idempotency key is identity'
);
SELECT throws_ok(
    format($$DELETE FROM orch8.effect_receipts WHERE id = %L$$, pg_temp.id('r_d')),
    'O8004', NULL, 'a receipt is never deleted'
);

-- unknown -> abandoned by UPDATE needs evidence, as through resolve_effect
INSERT INTO names (name, id)
SELECT
    'u' AS name,
    (orch8.begin_effect('beta', pg_temp.id('beta1'), 'charge', 'x.pay', '{}', 0)).effect_id AS id;
SELECT orch8.mark_effect_unknown('beta', pg_temp.id('u'), 'timeout');
SELECT throws_ok(
    format(
        $$UPDATE orch8.effect_receipts SET state = 'abandoned' WHERE id = %L$$,
        pg_temp.id('u')
    ),
    'O8008', NULL, 'unknown -> abandoned without evidence is refused by the table'
);
SELECT set_config('orch8.event_evidence', '{}', true);
SELECT throws_ok(
    format(
        $$UPDATE orch8.effect_receipts SET state = 'abandoned' WHERE id = %L$$,
        pg_temp.id('u')
    ),
    'O8008', NULL, 'empty evidence is no evidence'
);
SELECT set_config('orch8.event_evidence', '{"provider": "no such charge"}', true);
UPDATE orch8.effect_receipts SET state = 'abandoned'
WHERE id = pg_temp.id('u');
SELECT orch8.clear_event_attribution();
SELECT is(
    (
        SELECT evidence FROM orch8.effect_receipt_events
        WHERE receipt_id = pg_temp.id('u') AND to_state = 'abandoned'
    ),
    '{"provider": "no such charge"}'::jsonb, 'with evidence it moves, and the event keeps it'
);

-- invariants: a change is recorded, a delete refused
INSERT INTO names (name, id)
SELECT
    'inv' AS name,
    (orch8.declare_invariant('ld', 'once', '{"type": "effect_at_most_once",
    "kind": "worker"}', true, p_sequence_id => pg_temp.id('seq'))).id AS id;
UPDATE orch8.workflow_invariants SET commit_guard = false
WHERE id = pg_temp.id('inv');
SELECT results_eq(
    format(
        $$SELECT change, (before ->> 'commit_guard')::boolean,
                    (after ->> 'commit_guard')::boolean, db_user = session_user
             FROM orch8.invariant_events WHERE invariant_id = %L ORDER BY seq$$,
        pg_temp.id('inv')
    ),
    $$VALUES ('declared', NULL::boolean, true, true), ('changed', true, false, true)$$,
    'declaring and switching off a commit guard are both recorded'
);
SELECT throws_ok(
    format($$DELETE FROM orch8.workflow_invariants WHERE id = %L$$, pg_temp.id('inv')),
    'O8004', NULL, 'an invariant is never deleted'
);
SELECT throws_ok(
    format(
        $$UPDATE orch8.invariant_events SET actor = 'x' WHERE invariant_id = %L$$,
        pg_temp.id('inv')
    ),
    'O8004', NULL, 'invariant events are append-only'
);

-- instances: an illegal move is refused, a legal one by hand is recorded
SELECT throws_ok(
    format(
        $$UPDATE orch8.task_instances SET state = 'scheduled' WHERE id = %L$$,
        pg_temp.id('d')
    ),
    'O8004', NULL, 'a completed instance is not moved back to scheduled'
);
SELECT throws_ok(
    format($$DELETE FROM orch8.task_instances WHERE id = %L$$, pg_temp.id('d')),
    'O8004', NULL, 'an instance is never deleted'
);
SELECT throws_ok(
    format(
        $$UPDATE orch8.task_instances SET sequence_version = 9 WHERE id = %L$$,
        pg_temp.id('d')
    ),
    'O8004', NULL, 'an instance keeps its identity'
);
UPDATE orch8.task_instances SET state = 'paused'
WHERE id = pg_temp.id('done');
SELECT results_eq(
    format(
        $$SELECT from_state::text, to_state::text, db_user = session_user
             FROM orch8.instance_transitions WHERE instance_id = %L ORDER BY seq$$,
        pg_temp.id('done')
    ),
    $$VALUES (NULL, 'scheduled', true), ('scheduled', 'running', true),
             ('running', 'paused', true)$$,
    'every move is in instance_transitions, a move by hand included'
);

-- 4. The tenant is sealed by a credential, not by a setting --------------------------------

-- forget the seal of the resolution above (the web service's seal lasts one transaction)
SELECT set_config('orch8.tenant_seal', '', true);

SELECT is(
    pg_temp.as_role('orch8_web', $q$
    SELECT set_config('orch8.tenant_id', 'ld', true);
    DO $d$ BEGIN IF (SELECT count(*) FROM orch8.task_instances) <> 0
                 OR orch8.current_tenant() IS NOT NULL THEN RAISE 'visible'; END IF; END $d$$q$),
    'ok', 'a tenant set by hand shows the web role nothing'
);
SELECT is(
    pg_temp.as_role('orch8_web', format($q$
    SELECT orch8.enter_tenant('api_key', %L, 'beta');
    DO $d$ BEGIN IF (SELECT count(*) FROM orch8.task_instances WHERE tenant_id = 'beta') <> 1
                 OR (SELECT count(*) FROM orch8.task_instances WHERE tenant_id = 'ld') <> 0
                 THEN RAISE 'wrong rows'; END IF; END $d$$q$, encode(sha256('beta-key'), 'hex'))),
    'ok', 'enter_tenant with beta''s key shows beta''s rows only'
);
SELECT is(
    pg_temp.as_role('orch8_web', format($q$
    SELECT orch8.enter_tenant('api_key', %L, 'beta');
    SELECT set_config('orch8.tenant_id', 'ld', true);
    DO $d$ BEGIN IF orch8.current_tenant() IS NOT NULL
                 OR (SELECT count(*) FROM orch8.task_instances) <> 0
                 THEN RAISE 'switched'; END IF; END $d$$q$, encode(sha256('beta-key'), 'hex'))),
    'ok', 'changing the tenant after the seal gives no tenant at all'
);
SELECT is(pg_temp.as_role('orch8_web', format(
    $$SELECT orch8.enter_tenant('api_key', %L, 'ld')$$, encode(sha256('beta-key'), 'hex')
)),
'O8009', 'a key of beta cannot enter ld');
SELECT is(pg_temp.as_role('orch8_web', format(
    $$SELECT orch8.enter_tenant('api_key', %L, 'ld')$$, encode(sha256('nope'), 'hex')
)),
'O8009', 'an unknown key enters nothing');
SELECT is(pg_temp.as_role('orch8_web', format(
    $$SELECT orch8.enter_tenant('api_key', %L, 'ld')$$, encode(sha256('old-key'), 'hex')
)),
'O8009', 'an expired key enters nothing');
SELECT is_empty(
    format($$SELECT * FROM orch8.authenticate_api_key(%L)$$, encode(sha256('old-key'), 'hex')),
    'an expired key does not authenticate'
);
SELECT is(pg_temp.as_role('orch8_web', format(
    $$SELECT orch8.enter_tenant('api_key', %L, 'beta');
      SELECT orch8.cancel_instance('ld', %L, 'mallory')$$,
    encode(sha256('beta-key'), 'hex'), pg_temp.id('s')
)),
'O8009', 'beta''s key cannot cancel an instance of ld');
SELECT is(pg_temp.as_role('orch8_web', format(
    $$SELECT orch8.enter_tenant('api_key', %L, 'beta');
      SELECT orch8.resolve_effect('ld', %L, 'dispatched', 'abandoned', NULL, '{"x": 1}', 'm')$$,
    encode(sha256('beta-key'), 'hex'), pg_temp.id('r_d')
)),
'O8009', 'nor resolve a receipt of ld');
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text FROM pg_proc AS p
      JOIN orch8.function_access AS a ON a.name = p.proname
      WHERE p.pronamespace = 'orch8'::regnamespace AND a.access = 'web'
        AND p.proargnames[1] = 'p_tenant_id'
        AND p.prosrc NOT LIKE '%orch8.require_tenant(p_tenant_id)%'$$,
    'every function the web role may call checks its tenant argument'
);
SELECT is(
    pg_temp.as_role('orch8_web', $$SELECT * FROM orch8.known_tenants(10)$$),
    'O8009', 'only an admin key lists the tenants'
);
SELECT is(pg_temp.as_role(
    'orch8_auditor',
    $q$DO $d$ BEGIN IF (SELECT count(DISTINCT tenant_id) FROM orch8.task_instances) <> 2
                 THEN RAISE 'auditor'; END IF; END $d$$q$
),
'ok', 'the auditor reads every tenant');

-- 5. No rows for things that do not exist --------------------------------------------------

SELECT throws_ok(
    $$SELECT orch8.begin_effect('ld', gen_random_uuid(), 'charge', 'x.pay', '{}', 0)$$,
    'O8007', NULL, 'begin_effect for an instance that does not exist'
);
SELECT throws_ok(
    format($$SELECT orch8.begin_effect('ld', %L, 'again', 'x.pay', '{}', 0)$$, pg_temp.id('d')),
    'O8004', NULL, 'begin_effect on a completed instance'
);
SELECT throws_ok(
    $$SELECT orch8.ensure_effect_scope('ld', gen_random_uuid())$$,
    'O8007', NULL, 'ensure_effect_scope for an instance that does not exist'
);
SELECT throws_ok(
    $$SELECT orch8.declare_invariant('ld', 'x', '{"type": "effect_at_most_once",
        "kind": "http"}', true, gen_random_uuid())$$,
    'O8007', NULL, 'declare_invariant for an instance that does not exist'
);
SELECT throws_ok(
    format(
        $$SELECT orch8.create_instance('ld', %L, p_parent_instance_id => gen_random_uuid())$$,
        pg_temp.id('seq')
    ),
    'O8007', NULL, 'create_instance with a parent that does not exist'
);
INSERT INTO names (name, id)
SELECT
    'r_b' AS name,
    (orch8.begin_step(
        'beta', pg_temp.id('beta1'), pg_temp.token('beta1'), 'charge',
        'x.pay', '{}', 1
    )).effect_id AS id;
SELECT throws_ok(
    format(
        $$SELECT orch8.finish_step('beta', %L, %L, 'charge', 1, %L, 'error', '{}', 'boom',
                                      interval '-5 seconds')$$,
        pg_temp.id('beta1'), pg_temp.token('beta1'), pg_temp.id('r_b')
    ),
    'O8008', NULL, 'finish_step with a negative retry_in'
);

-- 6. Sizes are capped in SQL ---------------------------------------------------------------

SELECT throws_ok(
    format(
        $$SELECT orch8.begin_effect('beta', %L, 'big', 'x.pay',
                                       jsonb_build_object('blob', repeat('x', 1100000)), 0)$$,
        pg_temp.id('beta1')
    ),
    'O8008', NULL, 'params over params_bytes'
);
SELECT orch8.mark_effect_unknown('beta', pg_temp.id('r_b'), 'timeout');
SELECT throws_ok(
    format(
        $$SELECT orch8.resolve_effect('beta', %L, 'unknown', 'abandoned', NULL,
                                         jsonb_build_object('blob', repeat('x', 70000)), 'ops')$$,
        pg_temp.id('r_b')
    ),
    'O8008', NULL, 'evidence over evidence_bytes'
);
SELECT throws_ok(
    format(
        $$SELECT orch8.resolve_effect('beta', %L, 'unknown', 'abandoned', NULL,
                                         '{"checked": 1}', repeat('a', 300))$$,
        pg_temp.id('r_b')
    ),
    'O8008', NULL, 'an actor over actor_chars'
);
SELECT throws_ok(
    format(
        $$SELECT orch8.resolve_effect('beta', %L, 'unknown', 'abandoned', NULL,
                                         '{"checked": 1}', 'ops', repeat('n', 3000))$$,
        pg_temp.id('r_b')
    ),
    'O8008', NULL, 'a note over note_bytes'
);
SELECT throws_ok(
    $$SELECT orch8.create_sequence('ld', 'tap', 'huge', jsonb_build_object('blocks',
        jsonb_build_array(jsonb_build_object('id', 'a', 'type', 'step', 'handler', 'log',
                                             'params', jsonb_build_object('m', repeat('x', 1100000))))))$$,
    'O8008', NULL, 'a definition over definition_bytes'
);
SELECT throws_ok(
    format(
        $$SELECT orch8.send_signal('beta', %L, 'note',
                                      jsonb_build_object('blob', repeat('x', 70000)), 'ops')$$,
        pg_temp.id('beta1')
    ),
    'O8008', NULL, 'a signal payload over signal_payload_bytes'
);
SELECT throws_ok(
    format($$SELECT orch8.send_signal('beta', %L, 'note', NULL, 'ops')$$, pg_temp.id('beta1')),
    'O8008', NULL, 'a NULL signal payload'
);
SELECT throws_ok(
    format(
        $$SELECT orch8.send_signal('beta', %L, 'note', '[1, 2]', 'ops')$$,
        pg_temp.id('beta1')
    ),
    'O8008', NULL, 'an array signal payload'
);
SELECT throws_ok(
    $$SELECT orch8.canonical_json((repeat('[', 1000) || repeat(']', 1000))::jsonb)$$,
    'O8008', NULL, 'canonical_json refuses 1,000 nesting levels with an engine code'
);
SELECT is(
    orch8.canonical_json((repeat('[', 64) || repeat(']', 64))::jsonb),
    repeat('[', 64) || repeat(']', 64), 'the nesting limit itself is fine'
);
SELECT throws_ok(
    $$SELECT orch8.uuid_from_digest('\x010203'::bytea)$$,
    'O8008', NULL, 'uuid_from_digest refuses 3 bytes with an engine code'
);

SELECT * FROM finish();
ROLLBACK;
