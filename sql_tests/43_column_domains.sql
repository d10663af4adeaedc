-- The single-column rules of the four tables a guarded step writes live in domains, which a
-- session prepares once, instead of table CHECKs, which every statement prepares again
-- (docs/ARCHITECTURE.md, "Column rules live in domains"; migration 0029).
BEGIN;
SELECT plan(37);

SELECT is_empty(
    $$SELECT c.conrelid::regclass::text, c.conname::text
      FROM pg_constraint AS c
      WHERE c.contype = 'c' AND cardinality(c.conkey) = 1
        AND c.conrelid IN ('orch8.effect_receipts'::regclass, 'orch8.task_instances'::regclass,
                           'orch8.execution_nodes'::regclass, 'orch8.block_outputs'::regclass)
        AND c.conname <> 'task_instances_requested_state_check'$$,
    'the hot tables keep no single-column CHECK (requested_state: a domain over an enum '
    'has no = operator)'
);

SELECT set_eq(
    $$SELECT a.attrelid::regclass::text, a.attname::text, a.atttypid::regtype::text
      FROM pg_attribute AS a JOIN pg_type AS t ON t.oid = a.atttypid
      WHERE t.typtype = 'd' AND t.typnamespace = 'orch8'::regnamespace
        AND a.attrelid IN ('orch8.effect_receipts'::regclass, 'orch8.task_instances'::regclass,
                           'orch8.execution_nodes'::regclass, 'orch8.block_outputs'::regclass)$$,
    $$VALUES
      ('orch8.effect_receipts', 'attempt', 'orch8.natural_int'),
      ('orch8.effect_receipts', 'block_id', 'orch8.nonempty_text'),
      ('orch8.effect_receipts', 'destination_fingerprint', 'orch8.sha256_digest'),
      ('orch8.effect_receipts', 'epoch', 'orch8.natural_bigint'),
      ('orch8.effect_receipts', 'evidence', 'orch8.object_jsonb'),
      ('orch8.effect_receipts', 'handler', 'orch8.nonempty_text'),
      ('orch8.effect_receipts', 'idempotency_key', 'orch8.receipt_idempotency_key'),
      ('orch8.effect_receipts', 'kind', 'orch8.receipt_kind'),
      ('orch8.effect_receipts', 'provider_receipt_id', 'orch8.provider_receipt_ref'),
      ('orch8.effect_receipts', 'request_sha256', 'orch8.sha256_digest'),
      ('orch8.task_instances', 'context', 'orch8.object_jsonb'),
      ('orch8.task_instances', 'depth', 'orch8.natural_int'),
      ('orch8.task_instances', 'idempotency_key', 'orch8.instance_idempotency_key'),
      ('orch8.task_instances', 'max_concurrency', 'orch8.positive_int'),
      ('orch8.execution_nodes', 'deferrals', 'orch8.natural_int'),
      ('orch8.execution_nodes', 'deferred_by', 'orch8.deferral_reason'),
      ('orch8.execution_nodes', 'kind', 'orch8.node_kind'),
      ('orch8.execution_nodes', 'max_concurrency', 'orch8.positive_int'),
      ('orch8.execution_nodes', 'rate_limit_key', 'orch8.identifier'),
      ('orch8.execution_nodes', 'vars', 'orch8.object_jsonb'),
      ('orch8.block_outputs', 'attempt', 'orch8.natural_int'),
      ('orch8.block_outputs', 'sentinel', 'orch8.output_sentinel')$$,
    'each moved column has the domain that holds its rule (rate_limit_key had one before)'
);

-- A domain named like a function turns a call with one literal argument into a cast:
-- orch8.sha256_hex('') would be ''::orch8.sha256_hex.
SELECT is_empty(
    $$SELECT t.typname::text FROM pg_type AS t
      WHERE t.typtype = 'd' AND t.typnamespace = 'orch8'::regnamespace
        AND EXISTS (SELECT 1 FROM pg_proc AS p WHERE p.proname = t.typname
                    AND p.pronamespace IN ('orch8'::regnamespace, 'pg_catalog'::regnamespace))$$,
    'no orch8 domain shares its name with a function'
);

-- Each rule as the table CHECK it replaces: the last value in, the first value out.
SELECT
    CASE
        WHEN v.fits
            THEN lives_ok(format('SELECT %L::%s', v.val, v.dom), v.dom || ' takes ' || v.what)
        ELSE throws_ok(
            format('SELECT %L::%s', v.val, v.dom), '23514', NULL, v.dom || ' refuses ' || v.what
        )
    END
FROM (
    VALUES
    (1, 'orch8.object_jsonb', '{}', true, '{}'),
    (2, 'orch8.object_jsonb', '[]', false, 'an array'),
    (3, 'orch8.natural_int', '0', true, '0'),
    (4, 'orch8.natural_int', '-1', false, '-1'),
    (5, 'orch8.natural_bigint', '0', true, '0'),
    (6, 'orch8.natural_bigint', '-1', false, '-1'),
    (7, 'orch8.positive_int', '1', true, '1'),
    (8, 'orch8.positive_int', '0', false, '0'),
    (9, 'orch8.nonempty_text', 'x', true, 'one character'),
    (10, 'orch8.nonempty_text', '', false, 'the empty text'),
    (11, 'orch8.sha256_digest', repeat('0a', 32), true, '64 lower-case hex digits'),
    (12, 'orch8.sha256_digest', repeat('0A', 32), false, 'capitals'),
    (13, 'orch8.sha256_digest', repeat('0a', 31), false, '62 digits'),
    (14, 'orch8.receipt_kind', 'worker', true, 'worker'),
    (15, 'orch8.receipt_kind', 'fax', false, 'a kind effect_kinds() does not list'),
    (16, 'orch8.receipt_idempotency_key', repeat('é', 128), true, '256 bytes'),
    (17, 'orch8.receipt_idempotency_key', repeat('é', 128) || 'x', false, '257 bytes'),
    (18, 'orch8.provider_receipt_ref', repeat('x', 256), true, '256 bytes'),
    (19, 'orch8.provider_receipt_ref', repeat('x', 257), false, '257 bytes'),
    (20, 'orch8.instance_idempotency_key', 'k', true, 'one byte'),
    (21, 'orch8.instance_idempotency_key', '', false, 'the empty key'),
    (22, 'orch8.instance_idempotency_key', repeat('x', 257), false, '257 bytes'),
    (23, 'orch8.node_kind', 'step', true, 'step'),
    (24, 'orch8.node_kind', 'stepp', false, 'a kind node_kinds() does not list'),
    (25, 'orch8.deferral_reason', (orch8.deferral_reasons())[1], true, 'a listed reason'),
    (26, 'orch8.deferral_reason', 'whim', false, 'an unlisted reason'),
    (27, 'orch8.output_sentinel', '__decision__', true, '__decision__'),
    (28, 'orch8.output_sentinel', '__done__', false, 'an unknown sentinel')
) AS v (n, dom, val, fits, what)
ORDER BY v.n;

-- A rule still holds where it matters, in a write: a receipt with a bad hash is refused
-- whole.
SELECT throws_ok(
    $$INSERT INTO orch8.effect_receipts
          (tenant_id, id, continuity_id, epoch, instance_id, block_id, attempt, kind, state,
           handler, destination_fingerprint, request_sha256)
      VALUES ('dom', gen_random_uuid(), gen_random_uuid(), 0, gen_random_uuid(), 'b', 0,
              'http', 'planned', 'h', repeat('0', 64), 'not-a-hash')$$,
    '23514', NULL,
    'a receipt whose request hash is not 64 hex digits is not stored'
);

-- A session folds a rule function into the domain's check once, so a rule changed later
-- goes unseen until orch8.refresh_domain_checks(), which migrate runs after every run.
SELECT throws_ok(
    $$SELECT 'gate'::orch8.node_kind$$, '23514', NULL,
    'gate is not a node kind'
);
CREATE OR REPLACE FUNCTION orch8.node_kinds()
RETURNS text[]
LANGUAGE sql
IMMUTABLE
AS $$ SELECT ARRAY['step', 'gate'] $$;
SELECT throws_ok(
    $$SELECT 'gate'::orch8.node_kind$$, '23514', NULL,
    'the session still holds the old list after node_kinds() changed'
);
SELECT cmp_ok(
    orch8.refresh_domain_checks(), '>=', 6,
    'refresh_domain_checks touches every domain that calls a rule function'
);
SELECT lives_ok(
    $$SELECT 'gate'::orch8.node_kind$$,
    'after refresh_domain_checks the session checks against the new list'
);
SELECT is(
    (
        SELECT array_agg(c.conname::text ORDER BY c.conname) FROM pg_constraint AS c
        WHERE c.contypid = 'orch8.node_kind'::regtype
    ),
    ARRAY['node_kind_known'],
    'refresh_domain_checks leaves the constraint names as they were'
);

SELECT * FROM finish();
ROLLBACK;
