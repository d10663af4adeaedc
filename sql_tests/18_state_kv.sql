-- Per-instance key-value state: set, get, delete and merge, each write fenced by the
-- lease token (O8001 for a stale one), input errors O8008 with nothing written.
BEGIN;
SELECT plan(17);

INSERT INTO orch8.sequences (tenant_id, name, version, definition)
VALUES ('tap', 'flow', 1, '{"blocks": [{"id": "a", "type": "step", "handler": "noop"}]}');

CREATE TEMP TABLE lease AS
SELECT
    c.id AS instance_id,
    NULL::uuid AS token
FROM orch8.create_instance(
    'tap', (
        SELECT s.id FROM orch8.sequences AS s
        WHERE s.tenant_id = 'tap'
    )
) AS c;
UPDATE lease SET token = (
    SELECT c.lease_token FROM orch8.claim_due_nodes('tap-runner', 1, '30 seconds') AS c
);

CREATE FUNCTION pg_temp.kv(p_key text)
RETURNS jsonb
LANGUAGE sql
AS $$ SELECT orch8.get_instance_state('tap', l.instance_id, p_key) FROM lease AS l $$;

CREATE FUNCTION pg_temp.merge(p_key text, p_patch jsonb)
RETURNS jsonb
LANGUAGE sql
AS $$
    SELECT orch8.merge_instance_state('tap', l.instance_id, l.token, p_key, p_patch)
    FROM lease AS l
$$;

CREATE FUNCTION pg_temp.del(p_key text)
RETURNS boolean
LANGUAGE sql
AS $$
    SELECT orch8.delete_instance_state('tap', l.instance_id, l.token, p_key) FROM lease AS l
$$;

SELECT is(pg_temp.kv('cart'), NULL, 'a key never set reads SQL NULL');

SELECT orch8.set_instance_state('tap', l.instance_id, l.token, 'cart', '{"items": [1]}')
FROM lease AS l;
SELECT is(pg_temp.kv('cart'), '{"items": [1]}'::jsonb, 'set, then get');

SELECT is(
    pg_temp.merge('cart', '{"note": "gift", "items": [1, 2]}'),
    '{"items": [1, 2], "note": "gift"}'::jsonb,
    'merge: the patch''s top-level keys replace the stored ones, the rest stay'
);
SELECT is(
    pg_temp.kv('cart'), '{"items": [1, 2], "note": "gift"}'::jsonb, 'the merge is stored'
);
SELECT is(pg_temp.merge('fresh', '{"a": 1}'), '{"a": 1}'::jsonb, 'merge into a missing key');

SELECT orch8.set_instance_state('tap', l.instance_id, l.token, 'count', '3')
FROM lease AS l;
SELECT throws_ok(
    $$SELECT pg_temp.merge('count', '{"a": 1}')$$,
    'O8008', NULL, 'merge into a value that is not an object: O8008'
);
SELECT throws_ok(
    $$SELECT pg_temp.merge('cart', '[1]')$$,
    'O8008', NULL, 'a patch that is not an object: O8008'
);
SELECT throws_ok(
    $$SELECT pg_temp.merge('', '{}')$$, 'O8008', NULL, 'an empty key: O8008'
);
SELECT set_config('orch8.max_state_value_bytes', '40', true);
SELECT throws_ok(
    $$SELECT pg_temp.merge('cart', jsonb_build_object('big', repeat('x', 40)))$$,
    'O8008', NULL, 'a merged value over the size limit: O8008'
);
SELECT set_config('orch8.max_state_value_bytes', '', true);
SELECT is(
    pg_temp.kv('cart'), '{"items": [1, 2], "note": "gift"}'::jsonb,
    'refused merges wrote nothing'
);

SELECT throws_ok(
    $$SELECT orch8.merge_instance_state('tap', l.instance_id, gen_random_uuid(), 'cart',
                                        '{"x": 1}') FROM lease AS l$$,
    'O8001', NULL, 'merge with a stale lease token: O8001'
);
SELECT throws_ok(
    $$SELECT orch8.delete_instance_state('tap', l.instance_id, gen_random_uuid(), 'cart')
      FROM lease AS l$$,
    'O8001', NULL, 'delete with a stale lease token: O8001'
);
SELECT throws_ok(
    $$SELECT orch8.set_instance_state('tap', l.instance_id, gen_random_uuid(), 'cart', '1')
      FROM lease AS l$$,
    'O8001', NULL, 'set with a stale lease token: O8001'
);

SELECT is(pg_temp.del('cart'), true, 'delete an existing key: true');
SELECT is(pg_temp.kv('cart'), NULL, 'the deleted key reads SQL NULL');
SELECT is(pg_temp.del('cart'), false, 'delete a missing key: false, not an error');
SELECT is(
    (
        SELECT count(*)::integer FROM orch8.instance_kv_state AS s
        WHERE s.tenant_id = 'tap'
    ),
    2, 'fresh and count remain'
);

SELECT * FROM finish();
ROLLBACK;
