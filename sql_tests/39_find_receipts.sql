-- Finding a receipt by the key a person holds (migration 0024): its id, the idempotency
-- key it was sent with, or the receipt id the provider answered with, per tenant, each
-- through an index; the settle stays free of any index on provider_receipt_id.
BEGIN;
SELECT plan(11);
SELECT
    tap.instances(
        't1', ARRAY['00000000-0000-0000-0000-0000000000a1']::uuid[]
    );
SELECT
    tap.instances(
        't2', ARRAY['00000000-0000-0000-0000-0000000000b1']::uuid[]
    );

-- keyed: sent with its own key; echoed: the provider answers with our key; charged: the
-- provider answers with an id of its own; plain: the provider answers with the receipt id
CREATE TEMP TABLE r AS
SELECT
    b.block,
    (orch8.begin_effect(
        't1', '00000000-0000-0000-0000-0000000000a1', b.block, 'http_request',
        jsonb_build_object('url', 'https://x.example/' || b.block)
        || CASE
            WHEN b.block IN ('keyed', 'echoed')
                THEN jsonb_build_object('idempotency_key', 'order-' || b.block)
            ELSE '{}'
        END, 0
    )).effect_id AS id
FROM unnest(ARRAY['keyed', 'echoed', 'charged', 'plain']) AS b (block);

SELECT orch8.commit_effect('t1', r.id, '{}') FROM r
WHERE r.block = 'keyed';
SELECT orch8.commit_effect('t1', r.id, '{"receipt_id": "order-echoed"}') FROM r
WHERE r.block = 'echoed';
SELECT orch8.commit_effect('t1', r.id, '{"receipt_id": "ch_123"}') FROM r
WHERE r.block = 'charged';
SELECT orch8.commit_effect('t1', r.id, jsonb_build_object('receipt_id', r.id::text)) FROM r
WHERE r.block = 'plain';

-- another tenant's receipt answered with the same provider id
SELECT orch8.commit_effect(
    't2',
    (orch8.begin_effect(
        't2', '00000000-0000-0000-0000-0000000000b1', 'charged', 'http_request',
        '{"url": "https://x.example/charged"}', 0
    )).effect_id,
    '{"receipt_id": "ch_123"}'
);

SELECT results_eq(
    $$SELECT block_id::text FROM orch8.find_receipts('t1', 'order-keyed')$$,
    $$VALUES ('keyed')$$,
    'by the idempotency key a step was sent with'
);

SELECT results_eq(
    $$SELECT block_id::text FROM orch8.find_receipts('t1', 'order-echoed')$$,
    $$VALUES ('echoed')$$,
    'a provider id equal to the key: found once, through the key'
);

SELECT results_eq(
    $$SELECT block_id::text FROM orch8.find_receipts('t1', 'ch_123')$$,
    $$VALUES ('charged')$$,
    'by the provider''s own receipt id, in the caller''s tenant only'
);

SELECT results_eq(
    $$SELECT f.block_id::text FROM r, orch8.find_receipts('t1', r.id::text) AS f
      WHERE r.block = 'plain'$$,
    $$VALUES ('plain')$$,
    'by the receipt id (the default idempotency key)'
);

SELECT results_eq(
    $$SELECT f.block_id::text FROM r, orch8.find_receipts('t1', upper(r.id::text)) AS f
      WHERE r.block = 'plain'$$,
    $$VALUES ('plain')$$,
    'the receipt id in capitals finds it too'
);

SELECT is_empty(
    $$SELECT * FROM orch8.find_receipts('t1', 'no such key')$$,
    'a key nothing was sent or answered with: no receipt'
);

SELECT is_empty(
    $$SELECT * FROM orch8.find_receipts('t2', 'order-keyed')$$,
    'another tenant''s key: no receipt'
);

SELECT results_eq(
    $$SELECT p.tenant_id, p.provider_receipt_id, p.receipt_id = r.id
      FROM orch8.receipt_provider_ids AS p
      LEFT JOIN r ON r.block = 'charged' AND p.tenant_id = 't1'
      ORDER BY p.tenant_id$$,
    $$VALUES ('t1', 'ch_123', true), ('t2', 'ch_123', NULL)$$,
    'receipt_provider_ids holds only the provider ids no receipt index finds'
);

SELECT is(
    (
        SELECT
            indexdef LIKE '%(tenant_id, idempotency_key)%'
            AND indexdef LIKE '%WHERE ((idempotency_key)::text <> (id)::text)'
        FROM pg_indexes
        WHERE schemaname = 'orch8' AND indexname = 'effect_receipts_idempotency_key_idx'
    ),
    true,
    'the idempotency key index leaves out keys that are the receipt id'
);

SELECT throws_ok(
    $$UPDATE orch8.receipt_provider_ids SET provider_receipt_id = 'x'$$,
    NULL, NULL,
    'receipt_provider_ids is append-only'
);

CREATE FUNCTION pg_temp.plan_of(p_query text)
RETURNS SETOF text
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN QUERY EXECUTE 'EXPLAIN ' || p_query;
END
$$;

-- the table is tiny here, so the planner is told what a big one would make it choose
SET LOCAL enable_seqscan = off;
SET LOCAL enable_bitmapscan = off;

SELECT ok(
    (
        SELECT string_agg(p, ' ') FROM (
            SELECT p FROM pg_temp.plan_of(
                $$SELECT id FROM orch8.effect_receipts WHERE tenant_id = 't1'
                  AND idempotency_key = 'order-keyed' AND idempotency_key <> id::text$$
            ) AS p
        ) AS x
    ) LIKE '%effect_receipts_%idempotency_key_idx%',
    'the key path is an index scan'
);

SELECT * FROM finish();
ROLLBACK;
