-- External workers (sql/functions/workers.sql; begin_step and finish_step in steps.sql):
-- registration; dispatch in begin_step (receipt dispatched, task queued, node waiting);
-- the claim; fencing by worker id and claim epoch; complete in one transaction; a failure
-- settled at once and decided by the runner's finish_step; lease expiry blocks (or, for
-- a handler that allows it, redelivers a task never started); timeouts; cancel; the
-- concurrency slot; verifiers served by workers; the event trail. Time starts at
-- 2031-05-01 12:00 and only moves forward.
BEGIN;
SELECT plan(138);
SELECT set_config('orch8.fake_now', '2031-05-01 12:00:00+00', true);
SELECT set_config('tap.tenant', 'workers', true);

-- the latest task of a step; a poll as worker p_worker for p_handlers
CREATE FUNCTION tap.task(p_name text, p_path text)
RETURNS orch8.worker_tasks
LANGUAGE sql
AS $$
    SELECT w.* FROM orch8.worker_tasks AS w
    WHERE w.tenant_id = current_setting('tap.tenant') AND w.instance_id = tap.id(p_name)
      AND w.path = p_path
    ORDER BY w.created_at DESC, w.attempt DESC LIMIT 1
$$;

CREATE FUNCTION tap.poll(p_worker text, p_handlers text[], p_max integer DEFAULT 10)
RETURNS SETOF uuid
LANGUAGE sql
AS $$
    SELECT c.task_id FROM orch8.claim_worker_tasks(
        current_setting('tap.tenant'), p_worker, p_handlers, NULL, p_max, 60000) AS c
$$;

CREATE FUNCTION tap.events(p_task uuid)
RETURNS SETOF text
LANGUAGE sql
AS $$
    SELECT e.event FROM orch8.worker_task_events AS e
    WHERE e.tenant_id = current_setting('tap.tenant') AND e.task_id = p_task ORDER BY e.seq
$$;

-- 1. Registration ---------------------------------------------------------------------------

SELECT throws_ok(
    $$SELECT orch8.register_worker_handler('workers', 'http_request')$$, 'O8008',
    'handler http_request is a builtin: runners run it, no worker can',
    'a builtin cannot be served by workers'
);
SELECT throws_ok(
    $$SELECT orch8.register_worker_handler('workers', 'pay charge')$$, 'O8008',
    'invalid handler: ''pay charge''', 'a handler name is an identifier'
);
SELECT throws_ok(
    $$SELECT orch8.register_worker_handler('workers', 'pay.charge', NULL, '10ms')$$, 'O8008',
    'timeout must be a duration such as 30s, 5m, 1h or milliseconds, at least 1s and at '
    'most 366 days', 'a timeout under a second is refused'
);
SELECT is(
    (
        SELECT (w.queue, w.timeout_ms, w.redeliver_unstarted)::text
        FROM orch8.register_worker_handler('workers', 'pay.charge', NULL, NULL, NULL, 'ops') AS w
    ),
    '(default,300000,f)', 'registered with the defaults: queue default, 5 minutes'
);
SELECT is(
    (
        SELECT (w.queue, w.timeout_ms, w.redeliver_unstarted)::text
        FROM orch8.register_worker_handler('workers', 'pay.charge', 'money', '10m') AS w
    ),
    '(money,600000,f)', 'registering again changes what it names and keeps the rest'
);
SELECT lives_ok(
    $$SELECT orch8.register_worker_handler('workers', 'gpu.render', NULL, '10m', true)$$,
    'a handler whose unstarted tasks may be redelivered'
);

-- 2. Dispatch: in begin_step's transaction -------------------------------------------------

SELECT tap.seq('pay', $${"blocks": [
    {"type": "step", "id": "charge", "handler": "pay.charge", "timeout": 120000},
    {"type": "step", "id": "mail", "handler": "noop"}]}$$);
SELECT tap.new('p1', 'pay');
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('p1:charge')$$, 'a runner claims the step'
);
SELECT is(
    (
        SELECT b.outcome FROM
            orch8.begin_step(
                'workers', tap.id('p1'), tap.tok('p1', 'charge'),
                'charge', 'pay.charge', '{"amount": 5}', 0, 'not loaded here'
            ) AS b
    ),
    'queued', 'begin_step queues a registered handler''s step for workers, whatever the runner has'
);
SELECT is(
    (tap.receipt('p1', 'charge')).state::text, 'dispatched',
    'the receipt is dispatched before any worker can see the task'
);
SELECT is(
    (SELECT (
        t.state, t.handler, t.queue, t.params, t.attempt, t.claim_epoch,
        t.effect_id = (tap.receipt('p1', 'charge')).id,
        t.idempotency_key = (tap.receipt('p1', 'charge')).idempotency_key,
        t.close_by
    )::text
    FROM tap.task('p1', 'charge') AS t),
    (
        '(queued,pay.charge,money,"{""amount"": 5}",0,0,t,t,"'
        || '2031-05-01 12:02:00+00'::timestamptz || '")'
    ),
    'the task holds the params, the receipt and its key, the queue, close_by = now + timeout'
);
SELECT is(
    (
        SELECT (
            n.state, n.lease_token IS NULL, n.worker_task_id = (tap.task('p1', 'charge')).id
        )::text
        FROM tap.node('p1', 'charge') AS n
    ),
    '(waiting,t,t)', 'the node waits on the task, holding no lease'
);
SELECT is(tap.state('p1'), 'waiting', 'and so does the instance');
SELECT is(
    (
        SELECT (w.waiting_for, w.until)::text FROM orch8.waiting_nodes AS w
        WHERE w.instance_id = tap.id('p1')
    ),
    '(worker,"' || '2031-05-01 12:02:00+00'::timestamptz || '")',
    'waiting_nodes: waiting for a worker, until close_by'
);
SELECT is(
    (
        SELECT o.sentinel FROM orch8.block_outputs AS o
        WHERE o.instance_id = tap.id('p1')
        ORDER BY o.seq DESC LIMIT 1
    ),
    '__in_progress__', 'the attempt is in progress'
);

SELECT tap.seq('lost', $${"blocks": [{"type": "step", "id": "go", "handler": "nobody.has.it"}]}$$);
SELECT tap.new('l1', 'lost');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('l1:go')$$, 'a step no one serves');
SELECT is(
    (
        SELECT b.outcome FROM
            orch8.begin_step(
                'workers', tap.id('l1'), tap.tok('l1', 'go'), 'go',
                'nobody.has.it', '{}', 0, 'handler nobody.has.it is not loaded'
            ) AS b
    ),
    'stopped', 'a handler neither loaded nor registered fails at begin_step'
);
SELECT is(
    (tap.state(
        'l1'), (
        SELECT count(*) FROM orch8.effect_receipts AS r
        WHERE r.instance_id = tap.id('l1')
    ))::text,
    '(failed,0)', 'before any receipt'
);

-- 3. The claim and the fence ------------------------------------------------------------------

SELECT is_empty(
    $$SELECT * FROM tap.poll('w1', ARRAY['other'])$$, 'another handler''s poll gets nothing'
);
SELECT is_empty(
    $$SELECT * FROM orch8.claim_worker_tasks(
          'workers', 'w1', ARRAY['pay.charge'], 'default', 5, 60000)$$,
    'nor does a poll of another queue'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.claim_worker_tasks(
          'workers', 'w1', ARRAY['pay.charge'], NULL, 0, 60000)$$,
    'O8008', 'max_tasks must be from 1 to 100', 'a poll takes 1 to 100 tasks'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.claim_worker_tasks('workers', '', ARRAY['pay.charge'], NULL, 1, 60000)$$,
    'O8008', 'a worker id is 1 to 200 characters', 'a poll names its worker'
);
SELECT is(
    (SELECT (
        c.handler, c.params, c.attempt, c.claim_epoch, c.lease_expires_at,
        c.effect_id = (tap.receipt('p1', 'charge')).id
    )::text
    FROM orch8.claim_worker_tasks('workers', 'w1', ARRAY['pay.charge', 'x'], NULL, 5, 60000) AS c),
    '(pay.charge,"{""amount"": 5}",0,1,"' || '2031-05-01 12:01:00+00'::timestamptz || '",t)',
    'the poll gets the task: params, attempt, epoch 1, the lease, the effect id'
);
SELECT is((tap.task('p1', 'charge')).state, 'running', 'it is running');
SELECT is_empty($$SELECT * FROM tap.poll('w2', ARRAY['pay.charge'])$$, 'no second worker gets it');
SELECT throws_ok(
    format(
        $$SELECT * FROM orch8.heartbeat_worker_task('workers', %L, 'w1', 2)$$,
        (tap.task('p1', 'charge')).id
    ),
    'O8001', NULL, 'a heartbeat naming another epoch is refused'
);
SELECT throws_ok(
    format(
        $$SELECT * FROM orch8.heartbeat_worker_task('workers', %L, 'w2', 1)$$,
        (tap.task('p1', 'charge')).id
    ),
    'O8001', NULL, 'so is another worker''s'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.heartbeat_worker_task('workers', gen_random_uuid(), 'w1', 1)$$,
    'O8007', NULL, 'a task that does not exist is not found'
);
SELECT set_config('orch8.fake_now', '2031-05-01 12:00:30+00', true);
SELECT is(
    (
        SELECT (h.lease_expires_at, h.cancel_requested)::text
        FROM orch8.heartbeat_worker_task(
            'workers', (tap.task('p1', 'charge')).id, 'w1', 1,
            '{"step": 1}'
        ) AS h
    ),
    '("' || '2031-05-01 12:01:30+00'::timestamptz || '",f)',
    'the holder''s heartbeat extends the lease by the claim''s lease'
);
SELECT is(
    ((tap.task('p1', 'charge')).started_at, (tap.task('p1', 'charge')).checkpoint)::text,
    '("' || '2031-05-01 12:00:30+00'::timestamptz || '","{""step"": 1}")',
    'and confirms pickup, keeping the checkpoint'
);
SELECT throws_ok(
    format(
        $$SELECT * FROM orch8.heartbeat_worker_task('workers', %L, 'w1', 1, %L)$$,
        (tap.task('p1', 'charge')).id, jsonb_build_object('x', repeat('a', 70000))
    ),
    'O8008', NULL, 'a checkpoint over worker_checkpoint_bytes is refused'
);

-- 4. Complete: one transaction ------------------------------------------------------------

SELECT throws_ok(
    format(
        $$SELECT * FROM orch8.complete_worker_task('workers', %L, 'w2', 1, '{}')$$,
        (tap.task('p1', 'charge')).id
    ),
    'O8001', NULL, 'a complete from a worker that does not hold the task is refused'
);
SELECT is((tap.receipt('p1', 'charge')).state::text, 'dispatched', 'and changed nothing');
SELECT is(
    (
        SELECT (c.task_state, c.instance_state, c.repeated)::text
        FROM orch8.complete_worker_task(
            'workers', (tap.task('p1', 'charge')).id, 'w1', 1,
            '{"receipt_id": "ch_1"}'
        ) AS c
    ),
    '(completed,scheduled,f)', 'the holder''s complete moves the instance on to its next step'
);
SELECT is(
    ((tap.receipt('p1', 'charge')).state, (tap.receipt('p1', 'charge')).provider_receipt_id)::text,
    '(committed,ch_1)', 'the receipt is committed with the provider''s receipt id'
);
SELECT is(
    (
        SELECT o.output FROM orch8.block_outputs AS o
        WHERE o.instance_id = tap.id('p1') AND o.block_id = 'charge' AND o.sentinel IS NULL
    ),
    '{"receipt_id": "ch_1"}'::jsonb, 'the output is recorded'
);
SELECT is(
    ((tap.node('p1', 'charge')).state, (tap.node('p1', 'charge')).worker_task_id)::text,
    '(completed,)', 'the node completed and let go of the task'
);
SELECT is(
    (
        SELECT (c.task_state, c.repeated)::text
        FROM orch8.complete_worker_task(
            'workers', (tap.task('p1', 'charge')).id, 'w1', 1,
            '{"receipt_id": "ch_1"}'
        ) AS c
    ),
    '(completed,t)', 'the same complete again (its answer lost) answers the same'
);
SELECT throws_ok(
    format(
        $$SELECT * FROM orch8.fail_worker_task('workers', %L, 'w1', 1, 'late')$$,
        (tap.task('p1', 'charge')).id
    ),
    'O8001', NULL, 'a completed task cannot fail afterwards'
);
SELECT results_eq(
    format($$SELECT * FROM tap.events(%L)$$, (tap.task('p1', 'charge')).id),
    $$VALUES ('queued'), ('claimed'), ('started'), ('completed')$$,
    'every move is an event: queued, claimed, started, completed'
);
SELECT throws_ok(
    $$UPDATE orch8.worker_task_events SET event = 'failed'$$, 'O8004', NULL,
    'the events are append-only'
);
SELECT throws_ok(
    format(
        $$UPDATE orch8.worker_tasks SET state = 'queued' WHERE id = %L$$,
        (tap.task('p1', 'charge')).id
    ),
    'O8004', NULL, 'a completed task moves nowhere'
);
SELECT
    results_eq(
        $$SELECT * FROM tap.claim()$$, $$VALUES ('p1:mail')$$, 'the next step runs in a runner'
    );

-- 5. Fail: the receipt at once, the retry decided by the runner ------------------------------

SELECT tap.seq('same', $${"blocks": [
    {"type": "step", "id": "charge", "handler": "pay.charge", "provider_idempotency": true,
     "retry": {"max_attempts": 3}}]}$$);
SELECT tap.new('f1', 'same');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('f1:charge')$$, 'claimed');
SELECT is(tap.begin('f1', 'charge', 'pay.charge'), 'queued', 'queued');
SELECT is(
    (SELECT count(*)::integer FROM tap.poll('w1', ARRAY['pay.charge'])), 1, 'polled'
);
SELECT is(
    (
        SELECT (f.task_state, f.receipt_state, f.instance_state, f.repeated)::text
        FROM orch8.fail_worker_task(
            'workers', (tap.task('f1', 'charge')).id, 'w1', 1,
            'provider timed out', 'timeout', true
        ) AS f
    ),
    '(failed,unknown,scheduled,f)',
    'a failure: the receipt is unknown at once, the step waits for a runner''s decision'
);
SELECT is(
    (
        (tap.node('f1', 'charge')).state, (tap.node('f1', 'charge')).worker_task_id
        = (tap.task('f1', 'charge')).id
    )::text,
    '(ready,t)', 'its node is ready, still naming the task'
);
SELECT is(
    (SELECT (
        c.worker_result ->> 'result', c.worker_result ->> 'code',
        c.worker_result ->> 'retryable', c.current_attempt
    )::text
    FROM orch8.claim_work('workers-runner', 10, '1 hour') AS c),
    '(error,timeout,true,0)', 'claim_work answers the worker''s result with the node'
);
SELECT throws_ok(
    format(
        $$SELECT * FROM orch8.finish_step('workers', %L, %L, 'charge', 0, %L, 'ok', '{}')$$,
        tap.id('f1'), tap.tok('f1', 'charge'), (tap.task('f1', 'charge')).effect_id
    ),
    'O8008', NULL, 'the runner must finish it with the worker''s result'
);
SELECT is(
    (
        SELECT f.state::text FROM
            tap.finish(
                'f1', 'charge', 'error', '{}', 'provider timed out',
                '1 second', 'timeout'
            ) AS f
    ),
    'scheduled', 'same_key: the runner''s retry policy retries it'
);
SELECT is(
    ((tap.node('f1', 'charge')).state, (tap.node('f1', 'charge')).worker_task_id)::text,
    '(ready,)', 'the node is ready for its next attempt and holds no task'
);
SELECT set_config('orch8.fake_now', '2031-05-01 12:01:00+00', true);
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('f1:charge')$$, 'after the backoff');
SELECT is(tap.begin('f1', 'charge', 'pay.charge'), 'queued', 'attempt 1 is a new task');
SELECT is(
    (SELECT (t.attempt, t.idempotency_key = (
        SELECT r.idempotency_key FROM orch8.effect_receipts AS r
        WHERE r.instance_id = tap.id('f1') AND r.attempt = 0
    ))::text
    FROM tap.task('f1', 'charge') AS t),
    '(1,t)', 'with a new receipt and, for provider_idempotency, the same key'
);
SELECT is(
    (SELECT (t.checkpoint IS NULL)::text FROM tap.task('f1', 'charge') AS t), 'true',
    'no checkpoint was saved, so none is handed on'
);

-- not applied, with evidence: abandoned, then a new attempt
SELECT tap.seq('clean', $${"blocks": [
    {"type": "step", "id": "charge", "handler": "pay.charge"}]}$$);
SELECT tap.new('n1', 'clean');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('n1:charge')$$, 'claimed');
SELECT is(tap.begin('n1', 'charge', 'pay.charge'), 'queued', 'n1 queued');
SELECT is(
    (SELECT count(*)::integer FROM tap.poll('w1', ARRAY['pay.charge'])), 2,
    'polled with f1''s second attempt'
);
SELECT is(
    (SELECT (h.cancel_requested)::text FROM orch8.heartbeat_worker_task(
        'workers', (tap.task('n1', 'charge')).id, 'w1', 1, '{"page": 3}'
    ) AS h),
    'false', 'n1''s worker saves a checkpoint'
);
SELECT throws_ok(
    format(
        $$SELECT * FROM orch8.fail_worker_task(
              'workers', %L, 'w1', 1, 'refused', NULL, true, true)$$,
        (tap.task('n1', 'charge')).id
    ),
    'O8008', NULL, 'not_applied needs evidence'
);
SELECT is(
    (
        SELECT f.receipt_state::text
        FROM orch8.fail_worker_task(
            'workers', (tap.task('n1', 'charge')).id, 'w1', 1,
            'card declined before sending', 'declined', true, true, '{"http_status": 402}'
        ) AS f
    ),
    'abandoned', 'not_applied with evidence abandons the receipt'
);
SELECT is(
    (tap.receipt('n1', 'charge')).evidence -> 'not_applied' ->> 'http_status', '402',
    'keeping the evidence'
);
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('n1:charge')$$, 'a runner decides');
SELECT is(
    (
        SELECT f.state::text FROM
            tap.finish(
                'n1', 'charge', 'not_applied', '{}',
                'card declined before sending', '1 second'
            ) AS f
    ),
    'scheduled', 'a clean failure is retried by the retry policy'
);
SELECT set_config('orch8.fake_now', '2031-05-01 12:02:00+00', true);
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('n1:charge')$$, 'after the backoff');
SELECT is(tap.begin('n1', 'charge', 'pay.charge'), 'queued', 'attempt 1 queued');
SELECT is(
    (tap.task('n1', 'charge')).checkpoint, '{"page": 3}'::jsonb,
    'the earlier attempt''s checkpoint is handed on'
);

-- an ambiguous failure of a settle-mode step blocks
SELECT is(
    (
        SELECT (f.receipt_state, f.instance_state)::text
        FROM orch8.fail_worker_task(
            'workers', (tap.task('f1', 'charge')).id, 'w1', 1,
            'connection reset'
        ) AS f
    ),
    '(unknown,scheduled)', 'f1''s second attempt fails ambiguously'
);
SELECT is((SELECT count(*)::integer FROM tap.poll('w1', ARRAY['pay.charge'])), 1, 'n1 polled');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('f1:charge')$$, 'f1 to decide');

-- 6. Lease expiry: blocked, never silently redelivered -------------------------------------

SELECT set_config('orch8.fake_now', '2031-05-01 12:03:30+00', true);
SELECT is(orch8.sweep_worker_tasks(10), 1, 'the sweep takes n1''s task, whose lease ran out');
SELECT is(
    ((tap.task('n1', 'charge')).state, (tap.receipt('n1', 'charge')).state)::text,
    '(blocked,unknown)', 'its receipt is unknown and the task blocked (no other worker gets it)'
);
SELECT is(
    ((tap.node('n1', 'charge')).state, tap.state('n1'))::text, '(blocked,failed)',
    'the step blocks, the instance fails: an operator settles it'
);
SELECT ok(
    EXISTS (
        SELECT 1 FROM orch8.unresolved_effects AS u
        WHERE u.effect_id = (tap.receipt('n1', 'charge')).id AND u.state = 'unknown'
    ),
    'the receipt is in the unresolved queue'
);
SELECT throws_ok(
    format(
        $$SELECT * FROM orch8.complete_worker_task('workers', %L, 'w1', 1, '{}')$$,
        (tap.task('n1', 'charge')).id
    ),
    'O8001', NULL, 'the worker''s late complete is refused'
);

-- a handler that allows it: a task never started is queued again
SELECT tap.seq('render', $${"blocks": [
    {"type": "step", "id": "frame", "handler": "gpu.render"}]}$$);
SELECT tap.new('g1', 'render');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('g1:frame')$$, 'claimed');
SELECT is(tap.begin('g1', 'frame', 'gpu.render'), 'queued', 'queued');
SELECT is((SELECT count(*)::integer FROM tap.poll('w1', ARRAY['gpu.render'])), 1, 'w1 takes it');
SELECT set_config('orch8.fake_now', '2031-05-01 12:05:00+00', true);
SELECT is(orch8.sweep_worker_tasks(10), 1, 'its lease runs out before any heartbeat');
SELECT is(
    ((tap.task('g1', 'frame')).state, (tap.receipt('g1', 'frame')).state)::text,
    '(queued,dispatched)', 'redeliver_unstarted: queued again, the receipt still dispatched'
);
SELECT is(
    (
        SELECT c.claim_epoch FROM
            orch8.claim_worker_tasks(
                'workers', 'w2', ARRAY['gpu.render'],
                NULL, 1, 600000
            ) AS c
    ),
    2::bigint, 'w2 takes it, with a new epoch'
);
SELECT throws_ok(
    format(
        $$SELECT * FROM orch8.complete_worker_task('workers', %L, 'w1', 1, '{}')$$,
        (tap.task('g1', 'frame')).id
    ),
    'O8001', NULL, 'the first worker''s complete is fenced'
);
SELECT results_eq(
    format($$SELECT * FROM tap.events(%L)$$, (tap.task('g1', 'frame')).id),
    $$VALUES ('queued'), ('claimed'), ('redelivered'), ('claimed')$$,
    'the trail shows the redelivery'
);

-- 7. Timeouts (schedule-to-close) ---------------------------------------------------------

SELECT set_config('orch8.fake_now', '2031-05-01 12:06:00+00', true);
SELECT lives_ok(
    format(
        $$SELECT * FROM orch8.heartbeat_worker_task('workers', %L, 'w2', 2)$$,
        (tap.task('g1', 'frame')).id
    ),
    'w2 heartbeats'
);
SELECT set_config('orch8.fake_now', '2031-05-01 12:14:00+00', true);
SELECT is(orch8.sweep_worker_tasks(10), 1, 'past close_by (10 minutes) the task times out');
SELECT is(
    (
        (tap.task('g1', 'frame')).state, (tap.task('g1', 'frame')).error_code,
        (tap.receipt('g1', 'frame')).state
    )::text,
    '(timed_out,timeout,unknown)', 'held by a worker: the receipt is unknown, code timeout'
);
SELECT throws_ok(
    format(
        $$SELECT * FROM orch8.heartbeat_worker_task('workers', %L, 'w2', 2)$$,
        (tap.task('g1', 'frame')).id
    ),
    'O8001', NULL, 'the worker learns it at its next heartbeat'
);
SELECT tap.new('g2', 'render');
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('g1:frame'), ('g2:frame')$$,
    'g1 is claimed for the runner''s decision, g2 to start'
);
SELECT is(tap.begin('g2', 'frame', 'gpu.render'), 'queued', 'g2 queued; no worker comes');
SELECT set_config('orch8.fake_now', '2031-05-01 12:24:01+00', true);
SELECT is(orch8.sweep_worker_tasks(10), 1, 'past its close_by');
SELECT is(
    (
        (tap.task('g2', 'frame')).result, (tap.receipt('g2', 'frame')).state,
        (tap.receipt('g2', 'frame')).evidence -> 'not_applied' ->> 'never_claimed'
    )::text,
    '(not_applied,abandoned,true)', 'a task never claimed times out not applied'
);

-- 8. Cancel -----------------------------------------------------------------------------

SELECT tap.new('c1', 'clean');
SELECT tap.new('c2', 'clean');
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('c1:charge'), ('c2:charge'), ('g2:frame')$$,
    'claimed (g2 for the runner''s decision)'
);
SELECT is(tap.begin('c1', 'charge', 'pay.charge'), 'queued', 'c1 queued');
SELECT is(tap.begin('c2', 'charge', 'pay.charge'), 'queued', 'c2 queued');
SELECT is((SELECT count(*)::integer FROM tap.poll('w3', ARRAY['pay.charge'], 1)), 1, 'c1 runs');
SELECT is(
    orch8.cancel_instance('workers', tap.id('c2'), 'ops', 'wrong amount'), 'cancelled',
    'cancelling an instance whose task is queued'
);
SELECT is(
    ((tap.task('c2', 'charge')).state, (tap.receipt('c2', 'charge')).state)::text,
    '(cancelled,abandoned)', 'withdraws the task: nothing was sent, the receipt is abandoned'
);
SELECT is(
    orch8.cancel_instance('workers', tap.id('c1'), 'ops', 'wrong amount'), 'requested',
    'an instance whose task runs is cancelled once the worker reports'
);
SELECT is(
    (SELECT h.cancel_requested FROM orch8.heartbeat_worker_task(
        'workers', (tap.task('c1', 'charge')).id, 'w3', 1
    ) AS h),
    true, 'its worker hears it at its next heartbeat'
);
SELECT is(
    (
        SELECT (c.task_state, c.instance_state)::text
        FROM orch8.complete_worker_task(
            'workers', (tap.task('c1', 'charge')).id, 'w3', 1,
            '{"receipt_id": "ch_9"}'
        ) AS c
    ),
    '(completed,cancelled)', 'its report is recorded, then the instance is cancelled'
);
SELECT is((tap.receipt('c1', 'charge')).state::text, 'committed', 'with its receipt committed');

-- 9. The concurrency slot -------------------------------------------------------------------

SELECT tap.seq('serial', $${"blocks": [
    {"type": "step", "id": "charge", "handler": "pay.charge",
     "concurrency_key": "acct", "max_concurrency": 1}]}$$);
SELECT tap.new('k1', 'serial');
SELECT tap.new('k2', 'serial');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('k1:charge')$$, 'one at a time');
SELECT is(tap.begin('k1', 'charge', 'pay.charge'), 'queued', 'k1 is handed to workers');
SELECT is_empty($$SELECT * FROM tap.claim()$$, 'k2 waits: k1''s task holds the slot');
SELECT is((SELECT count(*)::integer FROM tap.poll('w3', ARRAY['pay.charge'])), 1, 'k1 runs');
SELECT lives_ok(
    format(
        $$SELECT * FROM orch8.complete_worker_task('workers', %L, 'w3', 1, '{}')$$,
        (tap.task('k1', 'charge')).id
    ),
    'and completes'
);
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('k2:charge')$$, 'then k2 runs');

-- 10. A verifier served by a worker ---------------------------------------------------------

SELECT tap.seq('verified', $${"blocks": [
    {"type": "step", "id": "charge", "handler": "pay.charge",
     "verify": {"handler": true, "schedule": [1000, 1000]}},
    {"type": "step", "id": "mail", "handler": "noop"}]}$$);
SELECT tap.new('v1', 'verified');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('v1:charge')$$, 'claimed');
SELECT is(tap.begin('v1', 'charge', 'pay.charge'), 'queued', 'queued');
SELECT is((SELECT count(*)::integer FROM tap.poll('w4', ARRAY['pay.charge'])), 1, 'polled');
SELECT lives_ok(
    format(
        $$SELECT * FROM orch8.fail_worker_task('workers', %L, 'w4', 1, 'connection reset')$$,
        (tap.task('v1', 'charge')).id
    ),
    'an ambiguous failure'
);
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('v1:charge')$$, 'a runner decides');
SELECT is(
    (SELECT f.state::text FROM tap.finish('v1', 'charge', 'error', '{}', 'connection reset') AS f),
    'waiting', 'not retried: the step waits for its verifier'
);
SELECT is_empty(
    $$SELECT * FROM orch8.claim_worker_verifications(
          'workers', 'w4', ARRAY['pay.charge'], 5, 60000)$$,
    'not before its first delay'
);
SELECT set_config('orch8.fake_now', '2031-05-01 12:24:03+00', true);
SELECT is_empty(
    $$SELECT * FROM orch8.claim_verifications(
          'a-runner', 5, '1 minute', ARRAY['pay.charge'], ARRAY['pay.charge'])$$,
    'a runner with a pay.charge of its own does not take a worker''s verifier try'
);
SELECT is(
    (SELECT (
        c.params, c.try_number, c.tries, c.handler,
        c.effect_id = (tap.receipt('v1', 'charge')).id
    )::text
    FROM orch8.claim_worker_verifications('workers', 'w4', ARRAY['pay.charge'], 5, 60000) AS c),
    '("{""path"": ""charge""}",1,2,pay.charge,t)',
    'a worker serving the verifier claims the try, with the params as dispatched'
);
SELECT throws_ok(
    format(
        $$SELECT * FROM orch8.record_worker_verdict('workers', %L, 'w4', gen_random_uuid(),
                                                       'applied', '{}')$$,
        (tap.receipt('v1', 'charge')).id
    ),
    'O8001', NULL, 'a verdict without the claim''s token is refused'
);
SELECT is(
    (SELECT (r.outcome, r.instance_state)::text FROM orch8.record_worker_verdict(
        'workers', (tap.receipt('v1', 'charge')).id, 'w4',
        (
            SELECT v.lease_token FROM orch8.effect_verifications AS v
            WHERE v.effect_id = (tap.receipt('v1', 'charge')).id
        ),
        'applied', '{"found": "ch_77"}', 'ch_77', '{"receipt_id": "ch_77"}'
    ) AS r),
    '(verified,scheduled)', 'applied: the receipt is verified and the instance goes on'
);
SELECT is(
    (
        SELECT o.output FROM orch8.block_outputs AS o
        WHERE o.instance_id = tap.id('v1') AND o.block_id = 'charge' AND o.sentinel IS NULL
    ),
    '{"receipt_id": "ch_77"}'::jsonb, 'with the output the verdict carried'
);

-- 11. A complete after the step's deadline, an output that breaks output_schema -------------

SELECT tap.seq('late', $${"blocks": [
    {"type": "step", "id": "charge", "handler": "pay.charge", "deadline": "30s",
     "on_deadline_breach": "fail"}]}$$);
SELECT tap.new('d1', 'late');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('d1:charge'), ('v1:mail')$$, 'claimed');
SELECT is(tap.begin('d1', 'charge', 'pay.charge'), 'queued', 'queued in time');
SELECT is((SELECT count(*)::integer FROM tap.poll('w4', ARRAY['pay.charge'])), 1, 'polled');
SELECT set_config('orch8.fake_now', '2031-05-01 12:24:40+00', true);
SELECT is(
    (
        SELECT (c.task_state, c.instance_state)::text
        FROM orch8.complete_worker_task(
            'workers', (tap.task('d1', 'charge')).id, 'w4', 1,
            '{"receipt_id": "ch_late"}'
        ) AS c
    ),
    '(completed,failed)', 'a complete after the step''s deadline: recorded, and the step fails'
);
SELECT is((tap.receipt('d1', 'charge')).state::text, 'committed', 'its receipt committed');

SELECT tap.new('o1', 'clean');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('o1:charge')$$, 'claimed');
SELECT is(tap.begin('o1', 'charge', 'pay.charge'), 'queued', 'queued');
SELECT is((SELECT count(*)::integer FROM tap.poll('w4', ARRAY['pay.charge'])), 1, 'polled');
SELECT is(
    (
        SELECT (c.task_state, c.instance_state)::text
        FROM orch8.complete_worker_task(
            'workers', (tap.task('o1', 'charge')).id, 'w4', 1,
            '{"amount": "x"}', 'amount: ''x'' is not an integer'
        ) AS c
    ),
    '(completed,failed)', 'an output the caller found invalid: committed, and the step fails'
);
SELECT is(
    (
        (tap.receipt('o1', 'charge')).state, (tap.task('o1', 'charge')).result,
        (tap.node('o1', 'charge')).error
    )::text,
    '(committed,invalid_output,"amount: ''x'' is not an integer")',
    'it happened (committed); the task says invalid_output, the node why'
);

-- a pause does not hold back a task in flight: its report completes the instance
SELECT tap.new('z1', 'clean');
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('z1:charge')$$, 'claimed');
SELECT is(tap.begin('z1', 'charge', 'pay.charge'), 'queued', 'queued');
SELECT is((SELECT count(*)::integer FROM tap.poll('w4', ARRAY['pay.charge'])), 1, 'polled');
SELECT is(orch8.pause_instance('workers', tap.id('z1'), 'ops'), 'paused', 'paused meanwhile');
SELECT is(
    (
        SELECT (c.task_state, c.instance_state)::text
        FROM orch8.complete_worker_task(
            'workers', (tap.task('z1', 'charge')).id, 'w4', 1, '{}'
        ) AS c
    ),
    '(completed,completed)', 'the worker''s report of its last step completes it'
);

-- 12. The rules as tables ----------------------------------------------------------------

SELECT results_eq(
    $$SELECT from_state || '->' || to_state FROM orch8.worker_task_transitions ORDER BY 1$$,
    $$VALUES ('queued->cancelled'), ('queued->running'), ('queued->timed_out'),
             ('running->blocked'), ('running->completed'), ('running->failed'),
             ('running->queued'), ('running->timed_out')$$,
    'the task transition table'
);
SELECT is(
    (
        SELECT (s.queued, s.running)::text FROM orch8.worker_handler_status AS s
        WHERE s.tenant_id = 'workers' AND s.handler = 'pay.charge'
    ),
    '(0,0)', 'worker_handler_status counts what is queued and running'
);
SELECT ok(orch8.unregister_worker_handler('workers', 'gpu.render'), 'unregistering');
SELECT ok(NOT orch8.unregister_worker_handler('workers', 'gpu.render'), 'only once');

SELECT * FROM finish();
ROLLBACK;
