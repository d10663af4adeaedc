-- Every object of schema orch8 is documented with COMMENT ON. A failure lists the
-- undocumented objects in the diagnostics.
BEGIN;
SELECT plan(6);

SELECT cmp_ok(
    (
        SELECT count(*)::integer FROM pg_proc AS p
        INNER JOIN pg_namespace AS n ON p.pronamespace = n.oid
        WHERE n.nspname = 'orch8'
    ),
    '>=', 30,
    'sanity: schema orch8 has its functions (the checks below are not vacuous)'
);

SELECT is_empty(
    $$SELECT p.oid::regprocedure::text
      FROM pg_proc AS p
      INNER JOIN pg_namespace AS n ON p.pronamespace = n.oid
      WHERE n.nspname = 'orch8'
        AND coalesce(btrim(obj_description(p.oid, 'pg_proc')), '') = ''
      ORDER BY 1$$,
    'every function in schema orch8 has a non-empty comment'
);

SELECT cmp_ok(
    (
        SELECT count(*)::integer FROM pg_class AS c
        INNER JOIN pg_namespace AS n ON c.relnamespace = n.oid
        WHERE n.nspname = 'orch8' AND c.relkind IN ('r', 'p', 'v', 'm')
    ),
    '>=', 9,
    'sanity: schema orch8 has its tables and views'
);

SELECT is_empty(
    $$SELECT c.relname::text
      FROM pg_class AS c
      INNER JOIN pg_namespace AS n ON c.relnamespace = n.oid
      WHERE n.nspname = 'orch8'
        AND c.relkind IN ('r', 'p', 'f')
        AND coalesce(btrim(obj_description(c.oid, 'pg_class')), '') = ''
      ORDER BY 1$$,
    'every table in schema orch8 has a non-empty comment'
);

SELECT is_empty(
    $$SELECT c.relname::text
      FROM pg_class AS c
      INNER JOIN pg_namespace AS n ON c.relnamespace = n.oid
      WHERE n.nspname = 'orch8'
        AND c.relkind IN ('v', 'm')
        AND coalesce(btrim(obj_description(c.oid, 'pg_class')), '') = ''
      ORDER BY 1$$,
    'every view in schema orch8 has a non-empty comment'
);

-- Enums, domains and standalone composite types (not the row types of tables and views).
SELECT is_empty(
    $$SELECT t.typname::text
      FROM pg_type AS t
      INNER JOIN pg_namespace AS n ON t.typnamespace = n.oid
      LEFT JOIN pg_class AS c ON t.typrelid = c.oid
      WHERE n.nspname = 'orch8'
        AND (t.typtype IN ('e', 'd') OR (t.typtype = 'c' AND c.relkind = 'c'))
        AND coalesce(btrim(obj_description(t.oid, 'pg_type')), '') = ''
      ORDER BY 1$$,
    'every enum, domain and composite type in schema orch8 has a non-empty comment'
);

SELECT * FROM finish();
ROLLBACK;
