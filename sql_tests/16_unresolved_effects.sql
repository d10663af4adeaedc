-- The operator queue: orch8.unresolved_effects shows unknown receipts, and dispatched
-- ones once they have been dispatched for longer than orch8.dispatched_alert_after
-- (default 5 minutes). Time is moved with orch8.fake_now.
BEGIN;
SELECT plan(13);
-- the instances the vectors name (a receipt needs a real instance)
SELECT
    tap.instances(
        't1',
        ARRAY[
            '00000000-0000-0000-0000-0000000000a1', '00000000-0000-0000-0000-0000000000e9'
        ]::uuid[]
    );

SELECT set_config('orch8.fake_now', '2030-01-01 00:00:00+00', true);

CREATE TEMP TABLE r AS
SELECT
    b.block,
    (orch8.begin_effect(
        't1', '00000000-0000-0000-0000-0000000000a1', b.block, 'http_request',
        jsonb_build_object('url', 'https://x.example/' || b.block), 0
    )).effect_id AS id
FROM unnest(ARRAY['dispatched', 'unknown', 'committed', 'abandoned']) AS b (block);

SELECT orch8.mark_effect_unknown('t1', r.id, 'timeout') FROM r
WHERE r.block = 'unknown';
SELECT orch8.commit_effect('t1', r.id, '{}') FROM r
WHERE r.block = 'committed';
SELECT orch8.abandon_effect_not_applied('t1', r.id, '{"error": "refused"}')
FROM r
WHERE r.block = 'abandoned';

-- A receipt created at 00:00 but dispatched only at 00:10.
SELECT orch8.ensure_effect_receipt(
    't1', '00000000-0000-0000-0000-0000000000e9',
    orch8.effect_scope_id('orch8-effect-scope-v1', '00000000-0000-0000-0000-0000000000a1'), 0,
    '00000000-0000-0000-0000-0000000000a1', 'late', 0, 'http', 'http_request',
    repeat('a', 64), repeat('b', 64)
);
SELECT orch8.cas_effect_receipt(
    't1', '00000000-0000-0000-0000-0000000000e9', 'planned', 'prepared'
);

CREATE FUNCTION pg_temp.queue_at(p_at text)
RETURNS SETOF text
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM set_config('orch8.fake_now', p_at, true);
    RETURN QUERY SELECT u.block_id::text FROM orch8.unresolved_effects AS u
                 WHERE u.tenant_id = 't1' ORDER BY u.created_at, u.block_id;
END
$$;

SELECT results_eq(
    $$SELECT * FROM pg_temp.queue_at('2030-01-01 00:00:00+00')$$,
    $$VALUES ('unknown')$$,
    'right away: only the unknown receipt (not dispatched, committed, abandoned, prepared)'
);

SELECT results_eq(
    $$SELECT * FROM pg_temp.queue_at('2030-01-01 00:05:00+00')$$,
    $$VALUES ('unknown')$$,
    'dispatched for exactly 5 minutes: not yet in the queue'
);

SELECT results_eq(
    $$SELECT * FROM pg_temp.queue_at('2030-01-01 00:05:01+00')$$,
    $$VALUES ('dispatched'), ('unknown')$$,
    'dispatched for more than 5 minutes: in the queue'
);

SELECT results_eq(
    $$SELECT state, age, state_since, kind::text, handler::text FROM orch8.unresolved_effects
      WHERE tenant_id = 't1' AND block_id = 'dispatched'$$,
    $$VALUES ('dispatched'::orch8.effect_state, '00:05:01'::interval,
              '2030-01-01 00:00:00+00'::timestamptz, 'http', 'http_request')$$,
    'the queue row shows state, age, since when and what'
);

-- dispatch the late one at 00:10
SELECT set_config('orch8.fake_now', '2030-01-01 00:10:00+00', true);
SELECT orch8.cas_effect_receipt(
    't1', '00000000-0000-0000-0000-0000000000e9', 'prepared', 'dispatched'
);

SELECT results_eq(
    $$SELECT * FROM pg_temp.queue_at('2030-01-01 00:12:00+00')$$,
    $$VALUES ('dispatched'), ('unknown')$$,
    'the threshold counts from the dispatch, not from creation (late is 12 min old)'
);

SELECT results_eq(
    $$SELECT * FROM pg_temp.queue_at('2030-01-01 00:15:01+00')$$,
    $$VALUES ('dispatched'), ('late'), ('unknown')$$,
    '... and it appears 5 minutes after its dispatch'
);

SELECT set_config('orch8.dispatched_alert_after', '1 minute', true);

SELECT results_eq(
    $$SELECT * FROM pg_temp.queue_at('2030-01-01 00:02:00+00')$$,
    $$VALUES ('dispatched'), ('unknown')$$,
    'orch8.dispatched_alert_after = 1 minute: a 2-minute-old dispatch is in the queue'
);

SELECT set_config('orch8.dispatched_alert_after', '1 hour', true);

SELECT results_eq(
    $$SELECT * FROM pg_temp.queue_at('2030-01-01 00:30:00+00')$$,
    $$VALUES ('unknown')$$,
    'orch8.dispatched_alert_after = 1 hour: a 30-minute-old dispatch is not'
);

SELECT set_config('orch8.dispatched_alert_after', '', true);

SELECT results_eq(
    $$SELECT * FROM pg_temp.queue_at('2030-01-01 00:30:00+00')$$,
    $$VALUES ('dispatched'), ('late'), ('unknown')$$,
    'an empty setting means the default 5 minutes'
);

SELECT results_eq(
    $$SELECT * FROM pg_temp.queue_at('2031-01-01 00:00:00+00')$$,
    $$VALUES ('dispatched'), ('late'), ('unknown')$$,
    'committed and abandoned receipts never appear, however old'
);

SELECT orch8.commit_effect('t1', r.id, '{}') FROM r
WHERE r.block = 'dispatched';

SELECT results_eq(
    $$SELECT * FROM pg_temp.queue_at('2031-01-01 00:00:00+00')$$,
    $$VALUES ('late'), ('unknown')$$,
    'a committed receipt leaves the queue'
);

SELECT
    orch8.resolve_effect(
        't1', r.id, 'unknown', 'abandoned', NULL, '{"provider_search": "nothing"}', 'alice'
    )
FROM r
WHERE r.block = 'unknown';

SELECT results_eq(
    $$SELECT * FROM pg_temp.queue_at('2031-01-01 00:00:00+00')$$,
    $$VALUES ('late')$$,
    'a resolved unknown receipt leaves the queue'
);

SELECT is(
    (
        SELECT count(*)::integer FROM orch8.unresolved_effects
        WHERE tenant_id = 't2'
    ),
    0,
    'another tenant sees an empty queue'
);

SELECT * FROM finish();
ROLLBACK;
