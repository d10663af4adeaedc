-- The receipt lookups of every guarded step are planned at each call: a plan cached
-- while the receipts table was nearly empty (a new database's first minute, before
-- autovacuum's first ANALYZE) walked the tenant's whole receipts index on every later
-- call (docs/ARCHITECTURE.md, "Lookups planned for the table they meet").
BEGIN;
SELECT plan(2);

SELECT is(
    (
        SELECT p.proconfig FROM pg_proc AS p
        WHERE p.oid = 'orch8.require_own_receipt(text, uuid, uuid, text, integer)'::regprocedure
    ),
    ARRAY['plan_cache_mode=force_custom_plan'],
    'require_own_receipt plans for the table it meets'
);

SELECT is(
    (
        SELECT p.proconfig FROM pg_proc AS p
        WHERE
            p.oid
            = 'orch8.find_unresolved_effect_receipt(text, uuid, uuid, text, integer)'::regprocedure
    ),
    ARRAY['plan_cache_mode=force_custom_plan'],
    'find_unresolved_effect_receipt plans for the table it meets'
);

SELECT * FROM finish();
ROLLBACK;
