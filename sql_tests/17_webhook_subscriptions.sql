-- Webhook subscriptions turned off and on (orch8.set_webhook_subscription_enabled): the
-- answer (never the secret), idempotence, not found in the tenant, and what a disabled
-- subscription receives (no new outbox rows) and sends (nothing until enabled again).
BEGIN;
SELECT plan(25);

SELECT has_function(
    'orch8', 'set_webhook_subscription_enabled', ARRAY['text', 'uuid', 'boolean'],
    'set_webhook_subscription_enabled(text, uuid, boolean) exists'
);
SELECT is_empty(
    $$SELECT 1 FROM pg_proc AS p
      INNER JOIN pg_namespace AS n ON p.pronamespace = n.oid
      WHERE n.nspname = 'orch8' AND p.proname = 'set_webhook_subscription_enabled'
        AND 'secret' = ANY(p.proargnames)$$,
    'its answer has no secret column'
);

-- Fixtures: a sequence, two subscriptions in tenant tap and one in tap2.
-- pg_temp.id(name) reads the ids saved in the temp table ids.
CREATE TEMP TABLE ids (name text PRIMARY KEY, id text NOT NULL);

CREATE FUNCTION pg_temp.id(p_name text)
RETURNS uuid
LANGUAGE sql
AS $$ SELECT i.id::uuid FROM ids AS i WHERE i.name = p_name $$;

CREATE FUNCTION pg_temp.complete_instance(p_name text)
RETURNS boolean
LANGUAGE sql
AS $$
    INSERT INTO ids (name, id)
    SELECT p_name, c.id::text
    FROM orch8.create_instance('tap', pg_temp.id('seq')) AS c;
    SELECT count(*) FROM orch8.claim_due_nodes('tap-runner', 1, '30 seconds');
    SELECT orch8.transition_instance('tap', pg_temp.id(p_name), 'running', 'completed', 'runner');
$$;

CREATE FUNCTION pg_temp.outbox_of(p_sub text, p_instance text)
RETURNS integer
LANGUAGE sql
AS $$
    SELECT count(*)::integer FROM orch8.webhook_outbox AS o
    WHERE o.subscription_id = pg_temp.id(p_sub) AND o.instance_id = pg_temp.id(p_instance)
$$;

INSERT INTO orch8.sequences (tenant_id, name, version, definition)
VALUES ('tap', 'flow', 1, '{"blocks": [{"id": "a", "type": "step", "handler": "noop"}]}');
INSERT INTO ids (name, id)
SELECT
    'seq' AS name,
    s.id::text AS id
FROM orch8.sequences AS s
WHERE s.tenant_id = 'tap';
INSERT INTO ids (name, id) VALUES
(
    'sub_a',
    orch8.create_webhook_subscription('tap', 'https://hooks.example/a', 'sec-a')::text
),
(
    'sub_b',
    orch8.create_webhook_subscription('tap', 'https://hooks.example/b', 'sec-b')::text
),
(
    'sub_other',
    orch8.create_webhook_subscription('tap2', 'https://hooks.example/t2', 'sec-t2')::text
);

-- 1. Disable, then enable; both idempotent ---------------------------------------------

SELECT results_eq(
    $$SELECT id, url, events, enabled, changed
      FROM orch8.set_webhook_subscription_enabled('tap', pg_temp.id('sub_a'), false)$$,
    $$VALUES (
        pg_temp.id('sub_a'), 'https://hooks.example/a'::text,
        orch8.webhook_events(), false, true
    )$$,
    'disable answers the subscription, now disabled, changed'
);
SELECT is(
    (
        SELECT s.enabled FROM orch8.webhook_subscriptions AS s
        WHERE s.id = pg_temp.id('sub_a')
    ),
    false,
    'the stored subscription is disabled'
);
SELECT is(
    (
        SELECT s.changed
        FROM orch8.set_webhook_subscription_enabled('tap', pg_temp.id('sub_a'), false) AS s
    ),
    false,
    'disabling a disabled subscription changes nothing'
);
SELECT is(
    (
        SELECT s.enabled FROM orch8.webhook_subscriptions AS s
        WHERE s.id = pg_temp.id('sub_b')
    ),
    true,
    'the other subscription of the tenant is untouched'
);
SELECT results_eq(
    $$SELECT enabled, changed
      FROM orch8.set_webhook_subscription_enabled('tap', pg_temp.id('sub_a'), true)$$,
    $$VALUES (true, true)$$,
    'enable answers the subscription, enabled again, changed'
);
SELECT is(
    (
        SELECT s.changed
        FROM orch8.set_webhook_subscription_enabled('tap', pg_temp.id('sub_a'), true) AS s
    ),
    false,
    'enabling an enabled subscription changes nothing'
);
SELECT results_eq(
    $$SELECT url::text, secret, enabled FROM orch8.webhook_subscriptions
      WHERE id = pg_temp.id('sub_a')$$,
    $$VALUES ('https://hooks.example/a'::text, 'sec-a'::text, true)$$,
    'url and secret are kept'
);

-- 2. Not found in the tenant (O8007); bad argument (O8008) -------------------------------

SELECT throws_ok(
    $$SELECT * FROM orch8.set_webhook_subscription_enabled(
        'tap', '00000000-0000-4000-8000-000000000000', false)$$,
    'O8007', 'webhook subscription 00000000-0000-4000-8000-000000000000 not found',
    'an unknown id is not found'
);
SELECT throws_ok(
    format(
        'SELECT * FROM orch8.set_webhook_subscription_enabled(%L, %L, false)',
        'tap', pg_temp.id('sub_other')
    ),
    'O8007', NULL,
    'another tenant''s subscription is not found'
);
SELECT is(
    (
        SELECT s.enabled FROM orch8.webhook_subscriptions AS s
        WHERE s.id = pg_temp.id('sub_other')
    ),
    true,
    'the other tenant''s subscription stays enabled'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.set_webhook_subscription_enabled('tap', NULL, false)$$,
    'O8007', NULL, 'a NULL id is not found'
);
SELECT throws_ok(
    format(
        'SELECT * FROM orch8.set_webhook_subscription_enabled(%L, %L, NULL)',
        'tap', pg_temp.id('sub_a')
    ),
    'O8008', NULL, 'enabled NULL is refused'
);

-- 3. A disabled subscription gets no new outbox rows -------------------------------------

SELECT is(
    (
        SELECT s.enabled
        FROM orch8.set_webhook_subscription_enabled('tap', pg_temp.id('sub_b'), false) AS s
    ),
    false,
    'subscription b is disabled'
);
SELECT ok(pg_temp.complete_instance('i1'), 'an instance completes');
SELECT is(pg_temp.outbox_of('sub_a', 'i1'), 1, 'the enabled subscription gets its row');
SELECT is(pg_temp.outbox_of('sub_b', 'i1'), 0, 'the disabled subscription gets none');

-- 4. Queued deliveries of a disabled subscription wait until it is enabled again ----------

SELECT lives_ok(
    $$SELECT * FROM orch8.set_webhook_subscription_enabled('tap', pg_temp.id('sub_b'), true)$$,
    'subscription b is enabled again'
);
SELECT ok(pg_temp.complete_instance('i2'), 'a second instance completes');
SELECT is(pg_temp.outbox_of('sub_b', 'i2'), 1, 'enabled again, it gets new rows');
SELECT lives_ok(
    $$SELECT * FROM orch8.set_webhook_subscription_enabled('tap', pg_temp.id('sub_b'), false)$$,
    'subscription b is disabled with a delivery queued'
);
SELECT is(
    (
        SELECT array_agg(c.subscription_id::text ORDER BY c.id)
        FROM orch8.claim_webhook_deliveries('d1', 10, '1 minute') AS c
    ),
    ARRAY[pg_temp.id('sub_a')::text, pg_temp.id('sub_a')::text],
    'the claim takes only the enabled subscription''s deliveries'
);
SELECT lives_ok(
    $$SELECT * FROM orch8.set_webhook_subscription_enabled('tap', pg_temp.id('sub_b'), true)$$,
    'subscription b is enabled again'
);
SELECT is(
    (
        SELECT array_agg(c.subscription_id::text)
        FROM orch8.claim_webhook_deliveries('d1', 10, '1 minute') AS c
    ),
    ARRAY[pg_temp.id('sub_b')::text],
    'its queued delivery is claimed now'
);

SELECT * FROM finish();
ROLLBACK;
