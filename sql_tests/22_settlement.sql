-- After an ambiguous outcome: the key a receipt records, what finish_step does by default
-- (settle: never resend), same_key retries, the verifier's claim and verdicts, resolutions
-- that carry the step's output, and retry_instance continuing from them.
BEGIN;
SELECT plan(58);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:00+00', true);

CREATE TEMP TABLE names (name text PRIMARY KEY, id uuid, token uuid);

-- The sequences ---------------------------------------------------------------------------

CREATE FUNCTION pg_temp.seq(p_name text, p_blocks jsonb)
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO names (name, id)
    SELECT p_name, s.id
    FROM orch8.create_sequence('st', 'tap', p_name, jsonb_build_object('blocks', p_blocks)) AS s
$$;

-- after reads the charge's output; note does not
SELECT pg_temp.seq('plain', $$[
    {"id": "charge", "type": "step", "handler": "x.pay", "params": {"amount": 5}},
    {"id": "after", "type": "step", "handler": "transform",
     "params": {"expression": "outputs.charge.id"}}]$$);
SELECT pg_temp.seq('lonely', $$[
    {"id": "charge", "type": "step", "handler": "x.pay", "params": {"amount": 5}},
    {"id": "note", "type": "step", "handler": "log", "params": {"message": "done"}}]$$);
SELECT pg_temp.seq('keyed', $$[
    {"id": "charge", "type": "step", "handler": "x.pay", "params": {"amount": 5},
     "provider_idempotency": true}]$$);
SELECT pg_temp.seq('fresh', $$[
    {"id": "charge", "type": "step", "handler": "x.pay", "params": {"amount": 5},
     "retry": {"on_ambiguous": "new_attempt"}}]$$);
SELECT pg_temp.seq('checked', $$[
    {"id": "charge", "type": "step", "handler": "x.pay", "params": {"amount": 5},
     "verify": {"http": {"url": "https://pay.example/charges?key={{ effect.idempotency_key }}"},
                "applied_if": "response.status == 200", "schedule": [1000, 2000]}},
    {"id": "after", "type": "step", "handler": "transform",
     "params": {"expression": "outputs.charge.id"}}]$$);
SELECT pg_temp.seq('stopper', $$[
    {"id": "charge", "type": "step", "handler": "x.pay", "params": {"amount": 5},
     "verify": {"handler": true, "on_verified": "stop", "schedule": [0]}}]$$);

SELECT orch8.declare_invariant(
    'st', 'pay once', '{"type": "effect_at_most_once", "kind": "worker"}',
    true, p_sequence_id => (
        SELECT n.id FROM names AS n
        WHERE n.name = 'keyed'
    )
);

CREATE FUNCTION pg_temp.id(p_name text)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT n.id FROM names AS n WHERE n.name = p_name $$;

CREATE FUNCTION pg_temp.token(p_name text)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT n.token FROM names AS n WHERE n.name = p_name $$;

-- claim this instance: the others that are scheduled wait (claim_work takes any due one)
CREATE FUNCTION pg_temp.claim(p_name text)
RETURNS integer
LANGUAGE sql
AS $$
    UPDATE orch8.execution_nodes AS n
    SET next_fire_at = CASE WHEN n.instance_id = pg_temp.id(p_name)
                            THEN orch8.now() - interval '1 day' ELSE '2100-01-01' END
    WHERE n.tenant_id = 'st' AND n.state = 'ready';
    UPDATE names AS n SET token = c.lease_token
    FROM orch8.claim_work('tap-runner', 1, '1 hour') AS c
    WHERE n.name = p_name AND c.id = n.id
    RETURNING c.current_attempt
$$;

-- start an instance of a sequence that wins the next claim, and claim it
CREATE FUNCTION pg_temp.start(p_name text, p_seq text)
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO names (name, id)
    SELECT p_name, c.id
    FROM orch8.create_instance('st', pg_temp.id(p_seq), p_priority => 1000,
                               p_next_fire_at => orch8.now() - interval '1 day') AS c;
    SELECT pg_temp.claim(p_name);
$$;

CREATE FUNCTION pg_temp.begin(p_name text, p_attempt integer)
RETURNS orch8.effect_outcome
LANGUAGE sql
AS $$
    SELECT orch8.begin_step('st', pg_temp.id(p_name), pg_temp.token(p_name), 'charge', 'x.pay',
                            '{"amount": 5}', p_attempt)
$$;

CREATE FUNCTION pg_temp.finish(
    p_name text, p_attempt integer, p_result text, p_output jsonb DEFAULT '{}',
    p_retry_in interval DEFAULT '1 minute'
)
RETURNS text
LANGUAGE sql
AS $$
    SELECT f.state::text FROM orch8.finish_step(
        'st', pg_temp.id(p_name), pg_temp.token(p_name), 'charge', p_attempt,
        (SELECT r.id FROM orch8.effect_receipts AS r
         WHERE r.instance_id = pg_temp.id(p_name) AND r.attempt = p_attempt),
        p_result, p_output, CASE WHEN p_result = 'error' THEN 'timed out after 10s' END,
        p_retry_in) AS f
$$;

CREATE FUNCTION pg_temp.receipt(p_name text, p_attempt integer DEFAULT 0)
RETURNS orch8.effect_receipts
LANGUAGE sql
AS $$
    SELECT r.* FROM orch8.effect_receipts AS r
    WHERE r.instance_id = pg_temp.id(p_name) AND r.attempt = p_attempt
$$;

CREATE FUNCTION pg_temp.state(p_name text)
RETURNS text
LANGUAGE sql
AS $$ SELECT t.state::text FROM orch8.task_instances AS t WHERE t.id = pg_temp.id(p_name) $$;

CREATE FUNCTION pg_temp.last_row(p_name text)
RETURNS orch8.block_outputs
LANGUAGE sql
AS $$ SELECT orch8.latest_block_row('st', pg_temp.id(p_name), 'charge') $$;

-- 1. The ambiguity mode and the key -------------------------------------------------------

SELECT results_eq(
    $$SELECT orch8.step_ambiguity_mode('{"handler": "x"}'),
             orch8.step_ambiguity_mode('{"provider_idempotency": true}'),
             orch8.step_ambiguity_mode('{"params": {"idempotency_key": "k"}}'),
             orch8.step_ambiguity_mode('{"provider_idempotency": true,
                                         "retry": {"on_ambiguous": "new_attempt"}}')$$,
    $$VALUES ('settle', 'same_key', 'same_key', 'new_attempt')$$,
    'step_ambiguity_mode: settle by default, same_key when the provider deduplicates, '
    'else what retry.on_ambiguous says'
);

-- 2. settle (the default): an ambiguous outcome is never resent ---------------------------

SELECT pg_temp.start('p1', 'plain');
SELECT is((pg_temp.begin('p1', 0)).outcome, 'dispatched', 'plain: attempt 0 dispatched');
SELECT is(
    (pg_temp.receipt('p1')).idempotency_key::text, (pg_temp.receipt('p1')).id::text,
    'without a key param or provider_idempotency, the key is the receipt''s own id'
);
SELECT is(
    (pg_temp.begin('p1', 0)).idempotency_key, (pg_temp.receipt('p1')).id::text,
    'begin_step returns the key the receipt records (repeated under the same lease)'
);
SELECT is(
    pg_temp.finish('p1', 0, 'error'), 'failed',
    'settle: the runner''s proposed retry is dropped; no verifier, so failed'
);
SELECT results_eq(
    $$SELECT o.sentinel::text, o.attempt::integer, o.effect_id, o.output ->> 'error'
      FROM pg_temp.last_row('p1') AS o$$,
    $$SELECT '__unsettled__'::text, 0, (pg_temp.receipt('p1')).id, 'timed out after 10s'::text$$,
    'an ambiguous outcome that is not resent appends __unsettled__'
);
SELECT is(
    orch8.compute_attempt('st', pg_temp.id('p1'), 'charge'), 0,
    'compute_attempt after __unsettled__: the same attempt (its receipt blocks a resend)'
);
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.effect_verifications
        WHERE effect_id = (pg_temp.receipt('p1')).id
    ),
    0, 'no verify in the step: no verification'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.retry_instance('st', pg_temp.id('p1'), 'alice')$$,
    'O8006', NULL, 'retry while the receipt is unknown: O8006'
);
SELECT orch8.resolve_effect(
    'st', (pg_temp.receipt('p1')).id, 'unknown', 'committed', 'ch_1',
    '{"looked": "dashboard"}', 'alice'
);
SELECT throws_like(
    $$SELECT * FROM orch8.retry_instance('st', pg_temp.id('p1'), 'alice')$$,
    '%carries no output for block charge, and other blocks read it (after)%',
    'committed without an output while a later block reads it: retry refuses, naming it'
);
SELECT results_eq(
    $$SELECT outcome, block_id FROM orch8.retry_instance('st', pg_temp.id('p1'), 'alice',
                                                          '{"id": "ch_1"}')$$,
    $$VALUES ('completed_from_evidence', 'charge')$$,
    'retry with an output: the step completes from the evidence'
);
SELECT results_eq(
    $$SELECT o.sentinel::text, o.attempt::integer, o.output, t.state, t.current_block
      FROM pg_temp.last_row('p1') AS o, orch8.task_instances AS t
      WHERE t.id = pg_temp.id('p1')$$,
    $$VALUES (NULL::text, 0, '{"id": "ch_1"}'::jsonb, 'scheduled'::orch8.instance_state,
              'after'::text)$$,
    'the output row holds the given output; the next block is scheduled'
);

-- the output a resolution carries is used when retry gives none
SELECT pg_temp.start('p2', 'plain');
SELECT pg_temp.begin('p2', 0);
SELECT pg_temp.finish('p2', 0, 'error');
SELECT orch8.resolve_effect(
    'st', (pg_temp.receipt('p2')).id, 'unknown', 'verified', NULL,
    '{"looked": "dashboard"}', 'alice', NULL, '{"id": "ch_2"}'
);
CREATE TEMP TABLE retried AS
SELECT * FROM orch8.retry_instance('st', pg_temp.id('p2'), 'bob');
SELECT results_eq(
    $$SELECT r.outcome, o.output FROM retried AS r, pg_temp.last_row('p2') AS o$$,
    $$VALUES ('completed_from_evidence', '{"id": "ch_2"}'::jsonb)$$,
    'retry without an output: the resolution''s output'
);

-- a step nobody reads completes with a marker; abandoned runs again as the next attempt
SELECT pg_temp.start('l1', 'lonely');
SELECT pg_temp.begin('l1', 0);
SELECT pg_temp.finish('l1', 0, 'error');
SELECT orch8.resolve_effect(
    'st', (pg_temp.receipt('l1')).id, 'unknown', 'verified', 'ch_3', '{}',
    'alice'
);
SELECT orch8.retry_instance('st', pg_temp.id('l1'), 'alice');
SELECT results_eq(
    $$SELECT o.output FROM pg_temp.last_row('l1') AS o$$,
    $$SELECT jsonb_build_object('settled', true, 'settled_by', 'alice',
                                'effect_id', (pg_temp.receipt('l1')).id,
                                'effect_state', 'verified', 'provider_receipt_id', 'ch_3')$$,
    'no later block reads it: the step completes with a marker output'
);
SELECT pg_temp.start('l2', 'lonely');
SELECT pg_temp.begin('l2', 0);
SELECT pg_temp.finish('l2', 0, 'error');
SELECT orch8.resolve_effect(
    'st', (pg_temp.receipt('l2')).id, 'unknown', 'abandoned', NULL,
    '{"provider": "no such charge"}', 'alice'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.retry_instance('st', pg_temp.id('l2'), 'alice', '{"id": 1}')$$,
    'O8008', NULL, 'an output for a step that runs again: O8008'
);
DELETE FROM retried;
INSERT INTO retried SELECT * FROM orch8.retry_instance('st', pg_temp.id('l2'), 'alice');
SELECT results_eq(
    $$SELECT r.outcome, o.sentinel::text,
             orch8.compute_attempt('st', pg_temp.id('l2'), 'charge')
      FROM retried AS r, pg_temp.last_row('l2') AS o$$,
    $$VALUES ('rerun', '__retry__', 1)$$,
    'abandoned: rerun, a __retry__ row after __unsettled__, the next attempt is 1'
);

-- 3. A crash found on the same attempt is settled, not resent ------------------------------

SELECT pg_temp.start('c1', 'checked');
SELECT pg_temp.begin('c1', 0);
UPDATE orch8.execution_nodes SET lease_expires_at = orch8.now() - interval '1 second'
WHERE instance_id = pg_temp.id('c1') AND lease_token IS NOT NULL;
SELECT is(pg_temp.claim('c1'), 0, 'after the lease expired, the claim resumes attempt 0');
CREATE TEMP TABLE began AS SELECT (pg_temp.begin('c1', 0)).outcome;
SELECT results_eq(
    $$SELECT b.outcome, pg_temp.state('c1'), (pg_temp.last_row('c1')).sentinel::text,
             (pg_temp.receipt('c1')).state
      FROM began AS b$$,
    $$VALUES ('blocked', 'waiting', '__unsettled__', 'unknown'::orch8.effect_state)$$,
    'the same attempt begun again: blocked, receipt unknown, and the instance waits for its '
    'verifier'
);

-- 4. same_key: retried under one key, and the guard lets the replay through --------------

SELECT pg_temp.start('k1', 'keyed');
SELECT pg_temp.begin('k1', 0);
SELECT is(
    pg_temp.finish('k1', 0, 'error'), 'scheduled',
    'same_key: the ambiguous outcome is retried'
);
SELECT is(pg_temp.claim('k1'), 1, 'the retry is attempt 1');
SELECT is(
    (pg_temp.begin('k1', 1)).outcome, 'dispatched',
    'the commit guard does not call the same-key resend a duplicate'
);
SELECT results_eq(
    $$SELECT (pg_temp.receipt('k1', 1)).idempotency_key, (pg_temp.receipt('k1', 0)).id::text$$,
    $$SELECT (pg_temp.receipt('k1', 0)).idempotency_key, (pg_temp.receipt('k1', 0)).id::text$$,
    'both attempts carry one key: the id of attempt 0'
);
SELECT is(
    pg_temp.finish('k1', 1, 'ok', '{"receipt_id": "ch_9"}'), 'completed',
    'attempt 1 commits'
);
SELECT results_eq(
    $$SELECT r.state, r.provider_receipt_id::text, r.error,
             r.evidence #>> '{resolution,evidence,same_key_as}'
      FROM pg_temp.receipt('k1', 0) AS r$$,
    $$SELECT 'verified'::orch8.effect_state, 'ch_9'::text, NULL::text,
             (pg_temp.receipt('k1', 1)).id::text$$,
    'the unknown attempt under the same key is settled verified with the provider''s id'
);

-- 5. new_attempt leaves history that blocks nothing --------------------------------------

SELECT pg_temp.start('f1', 'fresh');
SELECT pg_temp.begin('f1', 0);
SELECT pg_temp.finish('f1', 0, 'error');
SELECT pg_temp.claim('f1');
SELECT pg_temp.begin('f1', 1);
SELECT is(
    (pg_temp.receipt('f1', 1)).idempotency_key::text, (pg_temp.receipt('f1', 1)).id::text,
    'new_attempt: the retry sends under a new key'
);
SELECT pg_temp.finish('f1', 1, 'ok', '{}');
SELECT results_eq(
    $$SELECT u.effect_id, u.blocking FROM orch8.unresolved_effects AS u
      WHERE u.instance_id IN (pg_temp.id('f1'), pg_temp.id('c1')) ORDER BY u.blocking$$,
    $$VALUES ((pg_temp.receipt('f1')).id, false), ((pg_temp.receipt('c1')).id, true)$$,
    'unresolved_effects.blocking: false once a later attempt completed, true while it holds one'
);
SELECT results_eq(
    $$SELECT effect_id, outcome FROM orch8.request_verifications('st', NULL, true, 'ops')$$,
    $$VALUES ((pg_temp.receipt('f1')).id, 'no_verifier')$$,
    'request_verifications for the superseded: each with its outcome (this step has no verify)'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.request_verifications('st', NULL, false, 'ops')$$,
    'O8008', NULL, 'request_verifications with neither ids nor superseded: O8008'
);

-- 6. The verifier: claim, inconclusive, escalation, verdicts -------------------------------

SELECT results_eq(
    $$SELECT v.method, v.state, v.tries, v.schedule, v.next_at, v.requested_by
      FROM orch8.effect_verifications AS v WHERE v.effect_id = (pg_temp.receipt('c1')).id$$,
    $$VALUES ('http', 'pending', 0, ARRAY[1000, 2000],
              '2030-01-01 00:00:01+00'::timestamptz, 'engine')$$,
    'waiting: a pending http verification, first try after schedule[1]'
);
SELECT is(
    (SELECT count(
        *)::integer FROM orch8.claim_verifications(
        'v1', 5, '10 seconds',
        '{}', '{}'
    )),
    0, 'claim_verifications: nothing before it is due'
);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:02+00', true);
CREATE TEMP TABLE claims AS
SELECT * FROM orch8.claim_verifications('v1', 5, '10 seconds', '{}', '{}');
SELECT results_eq(
    $$SELECT effect_id, method, try, tries, timeout_seconds, step ->> 'id',
             receipt ->> 'state', context -> 'data'
      FROM claims$$,
    $$SELECT (pg_temp.receipt('c1')).id, 'http'::text, 1, 2, 30::numeric, 'charge'::text,
             'unknown'::text, '{}'::jsonb$$,
    'claim: the due try, counted, with what rendering needs'
);
SELECT is(
    (SELECT count(
        *)::integer FROM orch8.claim_verifications(
        'v2', 5, '10 seconds',
        '{}', '{}'
    )),
    0, 'a claimed try is not handed to a second verifier while its lease lasts'
);
SELECT is(
    (
        SELECT v.lease_expires_at FROM orch8.effect_verifications AS v
        WHERE v.effect_id = (pg_temp.receipt('c1')).id
    ),
    '2030-01-01 00:00:42+00'::timestamptz,
    'the lease lasts the margin plus the try''s timeout (10 s + 30 s)'
);
SELECT results_eq(
    $$SELECT outcome FROM orch8.record_verification('st', (pg_temp.receipt('c1')).id,
                                                    gen_random_uuid(), 'applied', '{}')$$,
    $$VALUES ('stale')$$,
    'record_verification with another token: stale, nothing written'
);
SELECT results_eq(
    $$SELECT outcome, instance_state FROM orch8.record_verification(
          'st', (pg_temp.receipt('c1')).id, (SELECT lease_token FROM claims), 'inconclusive',
          '{"status": 503}')$$,
    $$VALUES ('inconclusive', NULL::orch8.instance_state)$$,
    'inconclusive: the next try follows the schedule'
);
SELECT results_eq(
    $$SELECT e.from_state, e.to_state, e.actor, e.note, e.evidence ->> 'status',
             e.evidence ->> 'try'
      FROM orch8.effect_receipt_events AS e WHERE e.receipt_id = (pg_temp.receipt('c1')).id
      ORDER BY e.event_id DESC LIMIT 1$$,
    $$VALUES ('unknown'::orch8.effect_state, 'unknown'::orch8.effect_state, 'verifier:http',
              'inconclusive (try 1 of 2)', '503', '1')$$,
    'each verifier call is an event on the receipt, by verifier:<method>'
);
SELECT is(
    (
        SELECT v.next_at FROM orch8.effect_verifications AS v
        WHERE v.effect_id = (pg_temp.receipt('c1')).id
    ),
    '2030-01-01 00:00:04+00'::timestamptz, 'the next try after schedule[2] (2000 ms)'
);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:05+00', true);
DELETE FROM claims;
INSERT INTO claims SELECT * FROM orch8.claim_verifications('v1', 5, '10 seconds', '{}', '{}');
CREATE TEMP TABLE verdicts AS
SELECT * FROM orch8.record_verification(
    'st', (pg_temp.receipt('c1')).id,
    (SELECT lease_token FROM claims), 'inconclusive', '{}'
);
SELECT results_eq(
    $$SELECT r.outcome, r.instance_state, pg_temp.state('c1'), (pg_temp.receipt('c1')).state,
             (SELECT v.state FROM orch8.effect_verifications AS v
              WHERE v.effect_id = (pg_temp.receipt('c1')).id)
      FROM verdicts AS r$$,
    $$VALUES ('escalated', 'failed'::orch8.instance_state, 'failed',
              'unknown'::orch8.effect_state, 'escalated')$$,
    'the last try inconclusive: escalated, the instance fails, the receipt stays unknown'
);
SELECT is(
    (SELECT count(
        *)::integer FROM orch8.claim_verifications(
        'v1', 5, '10 seconds',
        '{}', '{}'
    )),
    0, 'an escalated verification is left to people'
);
SELECT is(
    orch8.schedule_verification('st', (pg_temp.receipt('c1')).id, 'alice'), 'rescheduled',
    'an operator asks again: rescheduled, tries reset'
);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:07+00', true);
DELETE FROM claims;
INSERT INTO claims SELECT * FROM orch8.claim_verifications('v1', 5, '10 seconds', '{}', '{}');
SELECT results_eq(
    $$SELECT r.outcome, r.instance_state
      FROM orch8.record_verification('st', (pg_temp.receipt('c1')).id,
          (SELECT lease_token FROM claims), 'applied', '{"status": 200}', NULL,
          '{"id": "ch_5", "receipt_id": "ch_5"}') AS r$$,
    $$VALUES ('verified', 'scheduled'::orch8.instance_state)$$,
    'applied: verified, and the step continues on its own'
);
SELECT results_eq(
    $$SELECT r.provider_receipt_id::text, r.evidence #>> '{resolution,actor}',
             r.evidence #> '{resolution,output}', o.output, o.sentinel::text, t.current_block
      FROM pg_temp.receipt('c1') AS r, pg_temp.last_row('c1') AS o, orch8.task_instances AS t
      WHERE t.id = pg_temp.id('c1')$$,
    $$VALUES ('ch_5'::text, 'verifier:http'::text, '{"id": "ch_5", "receipt_id": "ch_5"}'::jsonb,
              '{"id": "ch_5", "receipt_id": "ch_5"}'::jsonb, NULL::text, 'after'::text)$$,
    'the provider id from the output, the output on the receipt and as the step''s output'
);
SELECT is(
    (
        SELECT v.state FROM orch8.effect_verifications AS v
        WHERE v.effect_id = (pg_temp.receipt('c1')).id
    ),
    'settled', 'the verification is settled'
);

-- not applied: abandoned and retried as the next attempt
SELECT pg_temp.start('c2', 'checked');
SELECT pg_temp.begin('c2', 0);
SELECT pg_temp.finish('c2', 0, 'error');
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:09+00', true);
DELETE FROM claims;
INSERT INTO claims SELECT * FROM orch8.claim_verifications('v1', 5, '10 seconds', '{}', '{}');
DELETE FROM verdicts;
INSERT INTO verdicts
SELECT * FROM orch8.record_verification(
    'st', (pg_temp.receipt('c2')).id,
    (SELECT lease_token FROM claims), 'not_applied',
    '{"status": 404}'
);
SELECT results_eq(
    $$SELECT r.outcome, r.instance_state, (pg_temp.receipt('c2')).state,
             orch8.compute_attempt('st', pg_temp.id('c2'), 'charge')
      FROM verdicts AS r$$,
    $$VALUES ('abandoned', 'scheduled'::orch8.instance_state, 'abandoned'::orch8.effect_state,
              1)$$,
    'not applied: abandoned, and the step runs again as attempt 1'
);

-- a handler verifier is claimed only by a runner that has it; on_verified stop
SELECT pg_temp.start('s1', 'stopper');
SELECT pg_temp.begin('s1', 0);
SELECT is(pg_temp.finish('s1', 0, 'error'), 'waiting', 'stopper: waiting for its verifier');
SELECT is(
    (SELECT count(
        *)::integer FROM orch8.claim_verifications(
        'v1', 5, '10 seconds',
        ARRAY['x.pay'], '{}'
    )),
    0, 'a handler verification is not claimed by a runner without that verifier'
);
DELETE FROM claims;
INSERT INTO claims SELECT * FROM orch8.claim_verifications(
    'v1', 5, '10 seconds',
    '{}', ARRAY['x.pay']
);
DELETE FROM verdicts;
INSERT INTO verdicts
SELECT * FROM orch8.record_verification(
    'st', (pg_temp.receipt('s1')).id,
    (SELECT lease_token FROM claims), 'applied',
    '{"found": true}'
);
SELECT results_eq(
    $$SELECT r.outcome, r.instance_state, pg_temp.state('s1'), (pg_temp.receipt('s1')).state
      FROM verdicts AS r$$,
    $$VALUES ('verified', 'failed'::orch8.instance_state, 'failed',
              'verified'::orch8.effect_state)$$,
    'on_verified stop: verified, and the instance fails for a person to retry'
);
SELECT results_eq(
    $$SELECT outcome FROM orch8.retry_instance('st', pg_temp.id('s1'), 'alice')$$,
    $$VALUES ('completed_from_evidence')$$,
    'the person''s retry completes it from the evidence'
);

-- a verifier whose last try died holding it: escalated at the next claim
SELECT pg_temp.start('s2', 'stopper');
SELECT pg_temp.begin('s2', 0);
SELECT pg_temp.finish('s2', 0, 'error');
SELECT is(
    (SELECT count(
        *)::integer FROM orch8.claim_verifications(
        'v1', 5, '1 second',
        '{}', ARRAY['x.pay']
    )),
    1, 'stopper s2: its one try is claimed (and its holder dies)'
);
SELECT set_config('orch8.fake_now', '2030-01-01 00:01:00+00', true);
SELECT is(
    (SELECT count(
        *)::integer FROM orch8.claim_verifications(
        'v1', 5, '1 second',
        '{}', ARRAY['x.pay']
    )),
    0, 'the lease ran out with no try left: nothing to claim'
);
SELECT results_eq(
    $$SELECT v.state, pg_temp.state('s2') FROM orch8.effect_verifications AS v
      WHERE v.effect_id = (pg_temp.receipt('s2')).id$$,
    $$VALUES ('escalated', 'failed')$$,
    'it was escalated and its instance failed'
);

-- 7. The validator: verify and on_ambiguous ---------------------------------------------

CREATE FUNCTION pg_temp.problems(p_step jsonb)
RETURNS SETOF text
LANGUAGE sql
AS $$
    SELECT p.path || ': ' || p.message
    FROM orch8.validate_sequence(jsonb_build_object('blocks', jsonb_build_array(
        jsonb_build_object('id', 's', 'type', 'step', 'handler', 'x.pay') || p_step))) AS p
$$;

SELECT is_empty(
    $$SELECT * FROM pg_temp.problems('{"provider_idempotency": true,
        "retry": {"on_ambiguous": "same_key"},
        "verify": {"replay": true, "schedule": [0, 1000], "on_verified": "continue",
                   "on_not_applied": "stop"}}')$$,
    'a replay verifier with provider_idempotency is valid'
);
SELECT is_empty(
    $$SELECT * FROM pg_temp.problems('{"verify": {"http": {"method": "POST",
        "url": "{{ config.base }}/find?k={{ effect.idempotency_key }}&a={{ params.amount }}",
        "headers": {"Authorization": "Bearer {{ config.token }}"}},
        "applied_if": "response.json.found", "not_applied_if": "response.status == 404",
        "receipt_path": "json.id"}}')$$,
    'an http verifier over effect, params and config is valid'
);
SELECT results_eq(
    $$SELECT * FROM pg_temp.problems('{"retry": {"on_ambiguous": "same_key"}}')$$,
    $$VALUES ('$.blocks[0].retry.on_ambiguous: same_key resends under the same key, which is '
              'harmless only when the provider deduplicates: set provider_idempotency to true '
              'or give an idempotency_key param')$$,
    'same_key without a deduplicating provider is refused'
);
SELECT results_eq(
    $$SELECT * FROM pg_temp.problems('{"retry": {"on_ambiguous": "again"},
                                      "provider_idempotency": "yes"}')$$,
    $$VALUES ('$.blocks[0].retry.on_ambiguous: on_ambiguous must be one of same_key, '
              'new_attempt, settle'),
             ('$.blocks[0].provider_idempotency: provider_idempotency must be true or false')$$,
    'a bad on_ambiguous and a non-boolean provider_idempotency are refused'
);
SELECT results_eq(
    $$SELECT * FROM pg_temp.problems('{"verify": {"replay": true, "handler": true}}')$$,
    $$VALUES ('$.blocks[0].verify: verify needs exactly one of http, replay, handler'),
             ('$.blocks[0].verify.replay: replay resends the request, which is safe only when '
              'the provider deduplicates it: set provider_idempotency to true')$$,
    'two methods, and a replay without provider_idempotency, are refused'
);
SELECT results_eq(
    $$SELECT * FROM pg_temp.problems('{"verify": {"http": {"url": "{{ outputs.x }}",
        "method": "PUT", "timeout": 5}, "schedule": [-1], "on_verified": "go",
        "receipt_path": 7}}')$$,
    $$VALUES ('$.blocks[0].verify.http.timeout: unknown field'),
             ('$.blocks[0].verify.http.method: method must be one of GET, POST'),
             ('$.blocks[0].verify.http.url: template "{{ outputs.x }}" has an unknown root '
              '"outputs" (roots: effect, params, data, config, instance_id)'),
             ('$.blocks[0].verify.applied_if: applied_if is required with http (an expression '
              'over response, effect, params that is true when the effect happened)'),
             ('$.blocks[0].verify.receipt_path: receipt_path must be a non-empty string'),
             ('$.blocks[0].verify.schedule: schedule must be 1 to 50 delays, each an integer '
              'from 0 to 86400000 (milliseconds)'),
             ('$.blocks[0].verify.on_verified: on_verified must be continue or stop')$$,
    'an http verifier''s fields are each checked, with the verifier''s template roots'
);
SELECT results_eq(
    $$SELECT p.path || ': ' || p.message FROM orch8.validate_sequence(
        '{"blocks": [{"id": "s", "type": "step", "handler": "transform",
                      "verify": {"handler": true}, "provider_idempotency": true},
                     {"id": "h", "type": "step", "handler": "http_request",
                      "verify": {"handler": true}}]}') AS p$$,
    $$VALUES ('$.blocks[0].provider_idempotency: provider_idempotency is about side effects; '
              'handler "transform" has none'),
             ('$.blocks[0].verify: verify settles side effects; handler "transform" has none'),
             ('$.blocks[0].verify.handler: handler "transform" is a builtin, which has no '
              'Python verifier: use http or replay'),
             ('$.blocks[1].verify.handler: handler "http_request" is a builtin, which has no '
              'Python verifier: use http or replay')$$,
    'verify and provider_idempotency need a side-effecting handler; a builtin has no '
    'Python verifier'
);

SELECT * FROM finish();
ROLLBACK;
