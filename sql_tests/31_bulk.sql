-- Bulk operator actions by filter (sql/functions/bulk.sql): the filter checked in SQL
-- (O8008 with DETAIL {field}), the dry-run count, batches in keyset order by id with
-- their cursor, refusals skipped with their reason (never aborting the batch), the filter
-- re-checked on the locked row, and tenant isolation. Instances fail through the engine
-- (claim, finish_step with an error); time moves with orch8.fake_now.
BEGIN;
SELECT plan(44);

SELECT set_config('tap.tenant', 'bk', true);
SELECT set_config('orch8.fake_now', '2030-01-01 00:00:00+00', true);

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

-- the transitions of an instance from failed to scheduled (one per retry)
CREATE FUNCTION pg_temp.retries(p_name text)
RETURNS bigint
LANGUAGE sql
AS $$
    SELECT count(*) FROM orch8.instance_transitions AS x
    WHERE x.instance_id = tap.id(p_name) AND x.from_state = 'failed'
      AND x.to_state = 'scheduled'
$$;

-- Fixtures: in tenant bk, f1 f2 (day 1) and f3 f4 (day 2) of sequence one failed, three
-- of them on a timeout; o1 of sequence other failed; s1 of one still scheduled. In tenant
-- bk2, x1 of its own sequence one failed on a timeout too.
SELECT tap.seq('one', '{"blocks": [{"id": "a", "type": "step", "handler": "noop"}]}');
SELECT tap.seq('other', '{"blocks": [{"id": "a", "type": "step", "handler": "noop"}]}');
SELECT tap.new('f1', 'one');
SELECT tap.new('f2', 'one');
SELECT tap.new('o1', 'other');
SELECT set_config('orch8.fake_now', '2030-01-02 00:00:00+00', true);
SELECT tap.new('f3', 'one');
SELECT tap.new('f4', 'one');
SELECT set_config('tap.tenant', 'bk2', true);
SELECT tap.seq('bk2one', '{"blocks": [{"id": "a", "type": "step", "handler": "noop"}]}');
INSERT INTO tap.names (name, id)
SELECT
    'x1' AS name,
    c.id
FROM orch8.create_instance('bk2', tap.id('bk2one')) AS c;
SELECT set_config('tap.tenant', 'bk', true);
SELECT tap.claim(20);
SELECT tap.finish('f1', 'a', 'error', NULL, 'Timeout talking to the provider');
SELECT tap.finish('f2', 'a', 'error', NULL, 'timeout again');
SELECT tap.finish('f3', 'a', 'error', NULL, 'TIMEOUT, third');
SELECT tap.finish('f4', 'a', 'error', NULL, 'card declined');
SELECT tap.finish('o1', 'a', 'error', NULL, 'timeout elsewhere');
SELECT set_config('tap.tenant', 'bk2', true);
SELECT tap.finish('x1', 'a', 'error', NULL, 'timeout in bk2');
SELECT set_config('tap.tenant', 'bk', true);
SELECT tap.new('s1', 'one');

SELECT is(
    (SELECT array_agg(tap.state(n) ORDER BY n) FROM unnest(ARRAY['f1', 'f4', 'o1', 's1']) AS n),
    ARRAY['failed', 'failed', 'failed', 'scheduled'],
    'fixtures: four failed and one scheduled instance'
);

-- 1. The filter ---------------------------------------------------------------------------

SELECT throws_ok(
    $$SELECT orch8.bulk_filter('{"bogus": 1}')$$, 'O8008',
    'bulk filter: unknown key ''bogus''', 'an unknown key is refused'
);
SELECT throws_ok($$SELECT orch8.bulk_filter('{}')$$, 'O8008', NULL, 'an empty filter is refused');
SELECT throws_ok(
    $$SELECT orch8.bulk_filter('{"state": null}')$$, 'O8008', NULL,
    'a filter of nulls only is empty'
);
SELECT throws_ok($$SELECT orch8.bulk_filter('[1]')$$, 'O8008', NULL, 'not an object');
SELECT throws_ok(
    $$SELECT orch8.bulk_filter('{"state": ["failed", "broken"]}')$$, 'O8008', NULL,
    'a state that is not an instance_state'
);
SELECT throws_ok(
    $$SELECT orch8.bulk_filter('{"state": []}')$$, 'O8008', NULL,
    'an empty list of states'
);
SELECT throws_ok(
    $$SELECT orch8.bulk_filter('{"created_after": "2030-01-01"}')$$, 'O8008', NULL,
    'a time without its offset'
);
SELECT throws_ok(
    $$SELECT orch8.bulk_filter('{"updated_before": "tuesday"}')$$, 'O8008', NULL,
    'a time that is not one'
);
SELECT throws_ok(
    $$SELECT orch8.bulk_filter('{"sequence": "a b"}')$$, 'O8008', NULL,
    'a sequence name that breaks its pattern'
);
SELECT throws_ok(
    $$SELECT orch8.bulk_filter('{"error_contains": 5}')$$, 'O8008', NULL,
    'a value of the wrong JSON type'
);

-- DETAIL names the field (the facts the front ends show)
CREATE FUNCTION pg_temp.refusal_detail(p_filter jsonb)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    v_detail text;
BEGIN
    PERFORM orch8.bulk_filter(p_filter);
    RETURN NULL;
EXCEPTION WHEN SQLSTATE 'O8008' THEN
    GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL;
    RETURN v_detail::jsonb;
END
$$;

SELECT is(
    pg_temp.refusal_detail('{"bogus": 1}') ->> 'field', 'filter.bogus',
    'DETAIL.field names the unknown key'
);
SELECT ok(
    pg_temp.refusal_detail('{"bogus": 1}') -> 'allowed' ? 'error_contains',
    'DETAIL.allowed lists the keys'
);
SELECT is(
    pg_temp.refusal_detail('{"state": "broken"}') ->> 'field', 'filter.state',
    'DETAIL.field names the bad value''s key'
);
SELECT is(
    orch8.bulk_filter(
        '{"state": "failed", "namespace": null, '
        '"created_after": "2030-01-02T01:00:00+01:00"}'
    ),
    '{"state": ["failed"], "created_after": "2030-01-02T00:00:00+00:00"}'::jsonb,
    'normalised: one state becomes a list, nulls are dropped, times are timestamptz'
);

-- 2. The dry run --------------------------------------------------------------------------

SELECT is(
    orch8.bulk_count('bk', '{"state": "failed"}'), 5::bigint,
    'every failed instance of the tenant, not another tenant''s'
);
SELECT is(
    orch8.bulk_count('bk', '{"state": "failed", "sequence": "one"}'), 4::bigint,
    'by sequence name'
);
SELECT is(
    orch8.bulk_count('bk', '{"state": "failed", "namespace": "nope"}'), 0::bigint,
    'by namespace'
);
SELECT is(
    orch8.bulk_count('bk', '{"error_contains": "TimeOut"}'), 4::bigint,
    'error_contains ignores case'
);
SELECT is(
    orch8.bulk_count('bk', '{"error_contains": "%"}'), 0::bigint,
    'error_contains is a literal, not a LIKE pattern'
);
SELECT is(
    orch8.bulk_count('bk', '{"sequence": "one", "created_after": "2030-01-02T00:00:00Z"}'),
    3::bigint, 'created_after is inclusive (f3, f4 and s1)'
);
SELECT is(
    orch8.bulk_count(
        'bk', '{"state": ["failed", "scheduled"], '
        '"created_before": "2030-01-02T00:00:00Z"}'
    ),
    3::bigint, 'a list of states; created_before is exclusive (f1, f2, o1)'
);

-- 3. The checks of bulk_apply -------------------------------------------------------------

SELECT throws_ok(
    $$SELECT * FROM orch8.bulk_apply('bk', 'zap', '{"state": "failed"}', 'op')$$,
    'O8008', NULL, 'an action not of bulk_actions'
);
SELECT throws_ok(
    $$SELECT * FROM orch8.bulk_apply('bk', 'retry', '{"state": "failed"}', 'op',
                                                  NULL, NULL, 0)$$,
    'O8008', NULL, 'a batch of 0'
);
SELECT throws_ok(format(
    $$SELECT * FROM orch8.bulk_apply('bk', 'retry', '{"state": "failed"}',
                                                         'op', NULL, NULL, %s)$$,
    orch8.limit_of('bulk_batch') + 1
),
'O8008', NULL, 'a batch over bulk_batch');
SELECT throws_ok(
    $$SELECT * FROM orch8.bulk_apply('bk', 'retry', '{"nope": 1}', 'op')$$,
    'O8008', NULL, 'the filter is checked by bulk_filter'
);

SELECT throws_ok(
    $$SELECT * FROM orch8.bulk_apply('bk', 'retry', '{"state": "failed"}', 'op', 'why')$$,
    'O8008', NULL, 'a reason for an action that records none'
);

-- 4. Batches in keyset order, refusals skipped --------------------------------------------

-- retry f1..f4 and s1 (not failed: retry_instance refuses it) two at a time
CREATE TEMP TABLE batches AS
SELECT
    1 AS n,
    b.*
FROM orch8.bulk_apply(
    'bk', 'retry', '{"sequence": "one", "state": ["failed", "scheduled"]}',
    'ops:bulk', NULL, NULL, 2
) AS b;
INSERT INTO batches
SELECT
    2 AS n,
    b.*
FROM orch8.bulk_apply(
    'bk', 'retry', '{"sequence": "one", "state": ["failed", "scheduled"]}',
    'ops:bulk', NULL, (
        SELECT b1.last_id FROM batches AS b1
        WHERE b1.n = 1
    ),
    2
) AS b;
INSERT INTO batches
SELECT
    3 AS n,
    b.*
FROM orch8.bulk_apply(
    'bk', 'retry', '{"sequence": "one", "state": ["failed", "scheduled"]}',
    'ops:bulk', NULL, (
        SELECT b2.last_id FROM batches AS b2
        WHERE b2.n = 2
    ),
    2
) AS b;
INSERT INTO batches
SELECT
    4 AS n,
    b.*
FROM orch8.bulk_apply(
    'bk', 'retry', '{"sequence": "one", "state": ["failed", "scheduled"]}',
    'ops:bulk', NULL, (
        SELECT b3.last_id FROM batches AS b3
        WHERE b3.n = 3
    ),
    2
) AS b;

SELECT results_eq(
    $$SELECT processed FROM batches ORDER BY n$$, ARRAY[2, 2, 1, 0],
    'batches of 2 until one comes back short; the last is empty'
);
SELECT is(
    (
        SELECT array_agg(b.last_id ORDER BY b.n) FROM batches AS b
        WHERE b.n < 4
    ),
    (SELECT ARRAY[o.ids[2], o.ids[4], o.ids[5]] FROM (
        SELECT array_agg(tap.id(n) ORDER BY tap.id(n)) AS ids
        FROM unnest(ARRAY['f1', 'f2', 'f3', 'f4', 's1']) AS n
    ) AS o),
    'the cursor is the last id of each batch, in id order'
);
SELECT is((
    SELECT b.last_id FROM batches AS b
    WHERE b.n = 4
), NULL, 'an empty batch has no cursor');
SELECT is((SELECT sum(b.applied)::integer FROM batches AS b), 4, 'the four failed ones retried');
SELECT is((SELECT sum(b.skipped)::integer FROM batches AS b), 1, 's1 skipped');
SELECT is(
    (SELECT jsonb_object_agg(r.key, r.value) FROM batches AS b, jsonb_each(b.skip_reasons) AS r),
    '{"instance is scheduled: only a failed instance can be retried": 1}'::jsonb,
    'the refusal is counted by its message, the instance id taken out'
);
SELECT is(
    (SELECT s.value FROM batches AS b, jsonb_array_elements(b.skip_sample) AS s),
    jsonb_build_object(
        'reason', 'instance is scheduled: only a failed instance can be retried',
        'instance_id', tap.id('s1'), 'error', 'O8004',
        'current_state', 'scheduled'
    ),
    'the sample names the instance, the SQLSTATE and the refusal''s facts'
);
SELECT is(
    (
        SELECT array_agg(tap.state(n) || ':' || pg_temp.retries(n) ORDER BY n)
        FROM unnest(ARRAY['f1', 'f2', 'f3', 'f4', 'o1', 's1']) AS n
    ),
    ARRAY['scheduled:1', 'scheduled:1', 'scheduled:1', 'scheduled:1', 'failed:0', 'scheduled:0'],
    'each matching failed instance retried once; s1 untouched; o1 (other sequence) not matched'
);

-- 5. The re-check at apply time, and unchanged as a skip ----------------------------------

SELECT is(
    (SELECT row(a.applied, a.reason)::text FROM orch8.bulk_apply_one(
        'bk', 'cancel', orch8.bulk_filter('{"state": "failed"}'), tap.id('f1'), 'op', NULL
    ) AS a),
    '(f,"no longer matches the filter")',
    'an instance that changed since it was read is skipped, not acted on'
);
SELECT is(tap.state('f1'), 'scheduled', 'and it was not cancelled');
SELECT is(
    (SELECT row(a.applied, a.reason)::text FROM orch8.bulk_apply_one(
        'bk', 'pause', orch8.bulk_filter('{"error_contains": "timeout"}'), tap.id('f2'), 'op',
        NULL
    ) AS a),
    '(f,"no longer matches the filter")',
    'an instance whose error is gone no longer matches error_contains (never NULL: unknown)'
);
SELECT is(
    (SELECT row(b.applied, b.skipped, b.skip_reasons)::text FROM orch8.bulk_apply(
        'bk', 'pause', '{"state": ["paused", "scheduled"], "sequence": "one"}', 'op',
        'maintenance'
    ) AS b),
    '(5,0,{})', 'pause every scheduled instance of one'
);
SELECT is(
    (SELECT row(b.applied, b.skipped)::text FROM orch8.bulk_apply(
        'bk', 'pause', '{"state": "paused"}', 'op'
    ) AS b),
    '(0,5)', 'pausing them again: unchanged, so skipped'
);

-- 6. Tenants ------------------------------------------------------------------------------

SELECT
    is((
        SELECT t.state::text FROM orch8.task_instances AS t
        WHERE t.id = tap.id('x1')
    ), 'failed', 'bk2''s instance was matched by none of bk''s calls');
SELECT orch8.create_api_key('bk', 'bk-ops', 'operator', 'o8_bk', encode(sha256('bk-key'), 'hex'));
SELECT is(
    pg_temp.as_role('orch8_web', format(
        -- the tenant argument comes from the seal, so the seal is made first
        $$SELECT b.processed FROM (SELECT orch8.enter_tenant('api_key', %L, 'bk') AS t) AS e,
                 orch8.bulk_apply(replace(e.t, 'bk', 'bk2'), 'retry', '{"state": "failed"}',
                                  'op') AS b$$,
        encode(sha256('bk-key'), 'hex')
    )),
    'O8009', 'the web role sealed to bk cannot act in bk2'
);
SELECT is(
    pg_temp.as_role('orch8_web', format(
        $$SELECT b.processed FROM (SELECT orch8.enter_tenant('api_key', %L, 'bk') AS t) AS e,
                 orch8.bulk_apply(e.t, 'resume', '{"state": "paused"}', 'op') AS b$$,
        encode(sha256('bk-key'), 'hex')
    )),
    'ok', 'the web role sealed to bk acts in bk'
);
SELECT is(orch8.bulk_count('bk', '{"state": "paused"}'), 0::bigint, 'every paused one resumed');

SELECT * FROM finish();
ROLLBACK;
