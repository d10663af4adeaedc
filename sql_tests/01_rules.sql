-- Rules defined once (migration 0008): named sets, limits, identifier domains, the
-- resolution table, the shared views, and engine errors whose DETAIL is a JSON object.
BEGIN;
SELECT plan(28);

-- The DETAIL of the error a statement raises, as jsonb (NULL when it raises nothing).
CREATE FUNCTION pg_temp.detail(p_sql text)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_detail text;
BEGIN
    EXECUTE p_sql;
    RETURN NULL;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
    RETURN v_detail::jsonb;
END
$$;

-- 1. Named sets, and the CHECKs that read them -----------------------------------------------

SELECT is(
    orch8.effect_kinds(), ARRAY['http', 'model', 'message', 'storage', 'custom', 'worker'],
    'effect_kinds: the six kinds in their documented order'
);
SELECT is(
    orch8.webhook_events(), ARRAY['instance.completed', 'instance.failed', 'instance.sla_breached'],
    'webhook_events'
);
SELECT is(
    orch8.outbox_states(),
    ARRAY['pending', 'delivering', 'delivered', 'parked', 'discarded'], 'outbox_states'
);
SELECT is(
    orch8.api_key_roles(), ARRAY['operator', 'worker', 'auditor', 'admin'],
    'api_key_roles'
);

SELECT throws_ok(
    $$INSERT INTO orch8.api_keys (tenant_id, name, role, key_prefix, key_hash)
      VALUES ('t', 'n', 'root', 'p', repeat('a', 64))$$,
    '23514', NULL,
    'the api_keys role CHECK reads api_key_roles()'
);
SELECT throws_ok(
    $$SELECT orch8.create_webhook_subscription('t', 'https://x.example', 's',
          ARRAY['instance.started'])$$,
    'O8008', 'unknown webhook event(s): instance.started',
    'create_webhook_subscription refuses an event outside webhook_events()'
);
SELECT is(
    pg_temp.detail($$SELECT orch8.create_webhook_subscription('t', 'https://x.example', 's',
                       ARRAY['instance.started'])$$),
    jsonb_build_object('field', 'events', 'allowed', to_jsonb(orch8.webhook_events())),
    'its DETAIL names the field and the allowed events'
);

-- 2. Limits -------------------------------------------------------------------------------

SELECT is(orch8.limit_of('idempotency_key_bytes'), 256::bigint, 'limit_of reads limits()');
SELECT throws_ok(
    $$SELECT orch8.limit_of('no_such_limit')$$, 'O8005', 'no limit named no_such_limit',
    'limit_of: an unknown name is O8005, never NULL'
);
SELECT is_empty(
    $$SELECT l.name FROM orch8.limits() AS l
      WHERE l.value IS NULL OR l.value <= 0 OR l.unit IS NULL OR l.description IS NULL$$,
    'every limit has a positive value, a unit and a description'
);
SELECT throws_ok(
    $$INSERT INTO orch8.effect_receipts (tenant_id, id, continuity_id, epoch, instance_id,
          block_id, attempt, kind, handler, destination_fingerprint, request_sha256,
          provider_receipt_id)
      VALUES ('t', gen_random_uuid(), gen_random_uuid(), 0, gen_random_uuid(), 'b', 0,
              'http', 'h', repeat('a', 64), repeat('a', 64), repeat('r', 257))$$,
    '23514', NULL,
    'the provider_receipt_id CHECK reads the limit (257 bytes refused)'
);

-- 3. Identifier domains ------------------------------------------------------------------

SELECT is(
    orch8.require_domain('acme-1.x_y', 'orch8.identifier', 'tenant id'), 'acme-1.x_y',
    'require_domain: a fitting value comes back'
);
SELECT throws_ok(
    $$SELECT orch8.require_domain(repeat('a', 101), 'orch8.identifier', 'tenant id')$$,
    'O8008', NULL, 'require_domain: 101 characters is not an identifier'
);
SELECT throws_ok(
    $$SELECT orch8.require_domain(NULL, 'orch8.identifier', 'tenant id')$$,
    'O8008', 'invalid tenant id: NULL', 'require_domain: NULL never fits'
);
SELECT is(
    pg_temp.detail($$SELECT orch8.require_domain('a b', 'orch8.signal_type', 'signal type')$$),
    '{"field": "signal type", "rule": "1 to 100 characters among A-Z a-z 0-9 _ . : -"}'::jsonb,
    'require_domain: DETAIL names the field and the domain''s rule (its comment)'
);
SELECT ok(
    'x:y'::orch8.signal_type IS NOT NULL AND 'x.y'::orch8.sequence_name IS NOT NULL,
    'the domains accept their characters'
);
SELECT throws_ok(
    $$SELECT 'x:y'::orch8.identifier$$, '23514', NULL,
    'a colon is a signal type character, not an identifier one'
);
SELECT is(
    (
        SELECT atttypid::regtype::text FROM pg_attribute
        WHERE attrelid = 'orch8.sequences'::regclass AND attname = 'namespace'
    ),
    'orch8.identifier',
    'sequences.namespace is an orch8.identifier'
);
SELECT throws_ok(
    $$SELECT orch8.create_api_key('bad tenant', 'k', 'operator', 'p', repeat('a', 64))$$,
    'O8008', 'invalid tenant id: ''bad tenant''',
    'create_api_key checks the tenant with the identifier domain'
);

-- 4. Resolutions ------------------------------------------------------------------------

SELECT bag_eq(
    $$SELECT from_state::text, to_state::text, needs_evidence FROM orch8.effect_resolutions$$,
    $$VALUES ('unknown', 'committed', false), ('unknown', 'verified', false),
             ('unknown', 'abandoned', true), ('unknown', 'compensated', true),
             ('committed', 'compensated', true), ('verified', 'compensated', true)$$,
    'effect_resolutions: what an operator may resolve, and which moves need evidence'
);
SELECT ok(
    NOT orch8.can_resolve_to('dispatched', 'committed')
    AND NOT orch8.can_resolve_to('planned', 'abandoned'),
    'can_resolve_to: engine moves (dispatched -> committed, planned -> abandoned) are not an '
    'operator''s'
);
SELECT bag_eq(
    $$SELECT from_state::text, to_state::text FROM orch8.instance_transition_table$$,
    $$SELECT f.s::text AS from_state, t.s::text AS to_state
      FROM unnest(enum_range(NULL::orch8.instance_state)) AS f (s)
      CROSS JOIN unnest(enum_range(NULL::orch8.instance_state)) AS t (s)
      WHERE orch8.instance_can_transition(f.s, t.s)$$,
    'instance_transition_table lists exactly instance_can_transition'
);

-- 5. Structured errors of the operator paths --------------------------------------------

INSERT INTO orch8.sequences (tenant_id, name, version, definition)
VALUES ('r', 'flow', 1, '{"blocks": [{"id": "a", "type": "step", "handler": "noop"}]}');
SELECT set_config('tap.instance', (
    SELECT c.id::text FROM orch8.create_instance(
        'r', (
            SELECT s.id FROM orch8.sequences AS s
            WHERE s.tenant_id = 'r'
        )
    ) AS c
), true);
SELECT orch8.cancel_instance('r', current_setting('tap.instance')::uuid, 'tap');

SELECT is(
    pg_temp.detail(format(
        $$SELECT orch8.resume_instance('r', %L, 'tap')$$,
        current_setting('tap.instance')
    )),
    jsonb_build_object(
        'instance_id', current_setting('tap.instance'),
        'current_state', 'cancelled'
    ),
    'resume_instance of a cancelled instance: DETAIL {instance_id, current_state}'
);
SELECT is(
    pg_temp.detail(format(
        $$SELECT * FROM orch8.retry_instance('r', %L, 'tap')$$,
        current_setting('tap.instance')
    )) ->> 'current_state',
    'cancelled',
    'retry_instance of an instance that is not failed: current_state in DETAIL'
);
SELECT throws_ok(
    format(
        $$SELECT orch8.pause_instance('r', %L, 'tap', repeat('r', 2001))$$,
        current_setting('tap.instance')
    ),
    'O8008', NULL,
    'a reason over note_bytes is refused'
);
SELECT is(
    pg_temp.detail(format(
        $$SELECT orch8.pause_instance('r', %L, 'tap', repeat('r', 2001))$$,
        current_setting('tap.instance')
    )),
    '{"field": "reason", "limit": 2000}'::jsonb,
    'its DETAIL names the field and the limit'
);

-- 6. The shared views apply row-level security ------------------------------------------

SELECT is(
    (
        SELECT count(*)::integer FROM orch8.instance_overview AS o
        WHERE o.tenant_id = 'r'
    ),
    1,
    'instance_overview shows the instance with its sequence'
);
SET LOCAL ROLE orch8_web;
SELECT set_config('orch8.tenant_id', 'someone-else', true);
SELECT is(
    (SELECT count(*)::integer FROM orch8.instance_overview)
    + (SELECT count(*)::integer FROM orch8.effect_receipt_overview)
    + (SELECT count(*)::integer FROM orch8.sequence_overview),
    0,
    'the views apply the caller''s row-level security (another tenant sees nothing)'
);
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
