-- Flow control (sql/functions/flow_control.sql): the validator's rules for concurrency_key,
-- max_concurrency and rate_limit_key; render_key; a step's and a definition's concurrency
-- key enforced by the claim and by hand_over; a rate limit's token bucket admitting what
-- it holds and deferring the rest to when their tokens will be (never failing them); an
-- undefined key deferring until set_rate_limit defines it. Time only moves forward.
BEGIN;
SELECT plan(33);
SELECT set_config('orch8.fake_now', '2031-03-01 12:00:00+00', true);
SELECT set_config('tap.tenant', 'flow', true);

-- 1. The validator ---------------------------------------------------------------------------

SELECT set_eq(
    $$SELECT path, message FROM orch8.validate_sequence('{
        "concurrency_key": "{{ instance_id }}", "max_concurrency": 2,
        "blocks": [
        {"type": "step", "id": "a", "handler": "noop", "concurrency_key": "k"},
        {"type": "step", "id": "b", "handler": "noop", "max_concurrency": 2},
        {"type": "step", "id": "c", "handler": "noop", "concurrency_key": "k",
         "max_concurrency": 0},
        {"type": "step", "id": "d", "handler": "noop", "concurrency_key": "{{ outputs.a.x }}",
         "max_concurrency": 1},
        {"type": "step", "id": "e", "handler": "noop", "rate_limit_key": "{{ data.api }}"},
        {"type": "step", "id": "f", "handler": "noop", "concurrency_key": "",
         "max_concurrency": 1},
        {"type": "step", "id": "g", "handler": "noop", "rate_limit_key": "stripe",
         "concurrency_key": "c-{{ data.customer | ''none'' }}-{{ instance_id }}",
         "max_concurrency": 3}]}')$$,
    $$VALUES
        ('$.concurrency_key', 'template "{{ instance_id }}" has an unknown root "instance_id" (roots: data, config)'),
        ('$.blocks[0].max_concurrency', 'max_concurrency is required with a concurrency_key'),
        ('$.blocks[1].max_concurrency', 'max_concurrency needs a concurrency_key'),
        ('$.blocks[2].max_concurrency', 'max_concurrency must be an integer from 1 to 100000'),
        ('$.blocks[3].concurrency_key', 'template "{{ outputs.a.x }}" has an unknown root "outputs" (roots: data, config, instance_id)'),
        ('$.blocks[4].rate_limit_key', 'rate_limit_key must be a key of 1 to 100 of A-Z a-z 0-9 _ . - (no templates), defined per tenant with orch8.set_rate_limit'),
        ('$.blocks[5].concurrency_key', 'concurrency_key must be a string of 1 to 200 characters (with {{ }} templates over data, config, instance_id)')$$,
    'the validator: a key and its max go together, a key renders only from the context, '
    'a rate limit key is a plain key'
);

-- 2. render_key ------------------------------------------------------------------------------

SELECT is(
    orch8.render_key(
        'cust-{{ data.customer.id }}/{{config.region}}',
        '{"data": {"customer": {"id": "c1"}}, "config": {"region": "eu"}}', NULL
    ),
    'cust-c1/eu', 'render_key: strings as they are, any depth'
);
SELECT is(
    orch8.render_key(
        'n={{ data.n }} {{ data.gone | ''x'' }} [{{ data.gone }}] {{ data.obj }}',
        '{"data": {"n": 7, "obj": {"a": 1}}}', NULL
    ),
    'n=7 x [] {"a": 1}',
    'render_key: numbers and objects as JSON, a fallback, a missing value empty'
);
SELECT is(
    orch8.render_key('i-{{ instance_id }}', '{}', '00000000-0000-0000-0000-000000000001'),
    'i-00000000-0000-0000-0000-000000000001', 'render_key: the instance id'
);
SELECT is(
    orch8.render_key('{{ data.x }}', '{"data": {"x": "{{ data.y }}", "y": "no"}}', NULL),
    '{{ data.y }}', 'render_key: a rendered value is not rendered again'
);

-- 3. A step's concurrency key, in the claim and in hand_over ---------------------------------

SELECT tap.seq('charge', $${"blocks": [
    {"type": "step", "id": "pay", "handler": "x.pay",
     "concurrency_key": "customer-{{ data.customer }}", "max_concurrency": 1},
    {"type": "step", "id": "mail", "handler": "noop"}]}$$);
SELECT tap.new('a', 'charge', '{"customer": "c1"}');
SELECT tap.new('b', 'charge', '{"customer": "c1"}');
SELECT tap.new('c', 'charge', '{"customer": "c2"}');
SELECT is((tap.node('a', 'pay')).concurrency_key, 'customer-c1', 'the node holds its rendered key');
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('a:pay'), ('c:pay')$$,
    'one step per customer: b waits for a, c has its own key'
);
SELECT is((tap.node('b', 'pay')).state::text, 'ready', 'b stays ready');
SELECT is_empty($$SELECT * FROM tap.claim()$$, 'b is not claimed while a holds the key');
SELECT is(tap.begin('a', 'pay', 'x.pay'), 'dispatched', 'a dispatches');
SELECT is(
    (SELECT f.next_block FROM tap.finish('a', 'pay', 'ok', '{}') AS f), 'mail',
    'a finishes and walks on to its next step'
);
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('b:pay')$$, 'then b is claimed');

-- 4. A definition's key: every step holds it; hand_over keeps the chain within it -------------

SELECT tap.seq('serial', $${"concurrency_key": "acct-{{ data.account }}", "max_concurrency": 1,
    "blocks": [
    {"type": "step", "id": "one", "handler": "noop"},
    {"type": "step", "id": "two", "handler": "noop"}]}$$);
SELECT tap.new('x', 'serial', '{"account": 9}');
SELECT tap.new('y', 'serial', '{"account": 9}');
SELECT is(
    ((tap.node('x', 'one')).concurrency_key, (tap.node('x', 'one')).max_concurrency::integer),
    ('acct-9'::text, 1), 'a step without a key of its own holds its definition''s'
);
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('x:one')$$, 'x first, y waits');
SELECT is(
    (SELECT f.next_block FROM tap.finish('x', 'one', 'ok', '{}') AS f), 'two',
    'x''s next step is handed over: its first step freed the key'
);
SELECT is_empty($$SELECT * FROM tap.claim()$$, 'y still waits while x runs its second step');
SELECT is(
    (SELECT f.state FROM tap.finish('x', 'two', 'ok', '{}') AS f), 'completed', 'x completes'
);
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('y:one')$$, 'then y starts');

-- 5. A rate limit: admitted while tokens last, the rest deferred to their tokens -------------

SELECT throws_ok(
    $$SELECT orch8.set_rate_limit('flow', 'stripe', 0, '1m')$$, 'O8008',
    'rate must be an integer from 1 to 1000000 (tokens per period)', 'a rate of 0 is refused'
);
SELECT throws_ok(
    $$SELECT orch8.set_rate_limit('flow', 'stripe', 2, 'soon')$$, 'O8008',
    'per must be a duration such as 1s, 1m, 1h or milliseconds, more than 0 and at most 366 days',
    'a period that is no duration is refused'
);
SELECT is(
    (
        SELECT (r.rate, r.per_ms, r.burst, r.tokens)::text
        FROM orch8.set_rate_limit('flow', 'stripe', 2, '1m', NULL, 'ops') AS r
    ),
    '(2,60000,2,2)', 'set_rate_limit: 2 per minute, burst 2 by default, starting full'
);
SELECT tap.seq('api', $${"blocks": [
    {"type": "step", "id": "call", "handler": "x.call", "rate_limit_key": "stripe"}]}$$);
SELECT tap.new('r1', 'api');
SELECT tap.new('r2', 'api');
SELECT tap.new('r3', 'api');
SELECT tap.new('r4', 'api');
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('r1:call'), ('r2:call')$$,
    'the bucket''s two tokens admit two steps'
);
SELECT results_eq(
    $$SELECT n.deferred_by::text, n.deferrals::integer, n.next_fire_at, n.state::text
      FROM orch8.execution_nodes AS n
      WHERE n.tenant_id = 'flow' AND n.instance_id IN (tap.id('r3'), tap.id('r4'))
        AND n.path = 'call'
      ORDER BY n.next_fire_at$$,
    $$VALUES ('rate_limit', 1, '2031-03-01 12:00:30+00'::timestamptz, 'ready'),
             ('rate_limit', 1, '2031-03-01 12:01:00+00'::timestamptz, 'ready')$$,
    'the others are deferred, not failed: each to when its token will be there'
);
SELECT is(
    (
        SELECT (s.admitted, s.deferred, s.waiting)::text FROM orch8.rate_limit_status AS s
        WHERE s.tenant_id = 'flow' AND s.key = 'stripe'
    ),
    '(2,2,2)', 'rate_limit_status counts what was admitted, deferred, and waits now'
);
SELECT set_config('orch8.fake_now', '2031-03-01 12:00:30+00', true);
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('r3:call')$$,
    'thirty seconds later one token: r3 runs'
);
SELECT is((tap.node('r3', 'call')).deferred_by, NULL, 'leased, it is no longer deferred');
SELECT is(
    (
        SELECT (r.rate, r.burst, round(r.tokens::numeric, 3))::text
        FROM orch8.set_rate_limit('flow', 'stripe', 60, '1m', 5, 'ops') AS r
    ),
    '(60,5,0.000)', 'a changed limit keeps what the bucket held'
);
SELECT is(
    (tap.node('r4', 'call')).next_fire_at, '2031-03-01 12:00:30+00'::timestamptz,
    'and what it deferred is due again, to be admitted under the new limit'
);
SELECT set_config('orch8.fake_now', '2031-03-01 12:01:00+00', true);
SELECT results_eq($$SELECT * FROM tap.claim()$$, $$VALUES ('r4:call')$$, 'and r4 at its time');

-- 6. An undefined key waits until it is defined ------------------------------------------------

SELECT tap.seq('unset', $${"blocks": [
    {"type": "step", "id": "call", "handler": "x.call", "rate_limit_key": "nobody"}]}$$);
SELECT tap.new('u1', 'unset');
SELECT is_empty($$SELECT * FROM tap.claim()$$, 'a step whose rate limit is undefined does not run');
SELECT is(
    ((tap.node('u1', 'call')).deferred_by::text, (tap.node('u1', 'call')).next_fire_at),
    ('rate_limit_undefined'::text, '2031-03-01 12:01:10+00'::timestamptz),
    'it is deferred, looking again in ten seconds'
);
SELECT lives_ok($$SELECT orch8.set_rate_limit('flow', 'nobody', 1, '1h')$$, 'defining it');
SELECT results_eq(
    $$SELECT * FROM tap.claim()$$, $$VALUES ('u1:call')$$,
    'makes what waited for it due at once'
);

SELECT * FROM finish();
ROLLBACK;
