-- Every column of every table and view of schema orch8 is documented with COMMENT ON, so
-- that a DBA reading \d+ in psql learns what it holds (issue 15). A failure lists the
-- undocumented columns (table.column) or relations in the diagnostics.
BEGIN;
SELECT plan(4);

SELECT cmp_ok(
    (
        SELECT count(*)::integer FROM pg_class AS c
        INNER JOIN pg_namespace AS n ON c.relnamespace = n.oid
        WHERE n.nspname = 'orch8' AND c.relkind IN ('r', 'p', 'v', 'm')
    ),
    '>=', 40,
    'sanity: schema orch8 has its tables and views'
);

SELECT cmp_ok(
    (
        SELECT count(*)::integer FROM pg_attribute AS a
        INNER JOIN pg_class AS c ON a.attrelid = c.oid
        INNER JOIN pg_namespace AS n ON c.relnamespace = n.oid
        WHERE
            n.nspname = 'orch8' AND c.relkind IN ('r', 'p', 'v', 'm')
            AND a.attnum > 0 AND NOT a.attisdropped
    ),
    '>=', 400,
    'sanity: the tables and views of schema orch8 have their columns (the check is not vacuous)'
);

-- System columns (attnum <= 0) and dropped ones are not the schema's to document.
SELECT is_empty(
    $$SELECT format('%s.%s', c.relname, a.attname)
      FROM pg_attribute AS a
      INNER JOIN pg_class AS c ON a.attrelid = c.oid
      INNER JOIN pg_namespace AS n ON c.relnamespace = n.oid
      WHERE n.nspname = 'orch8'
        AND c.relkind IN ('r', 'p', 'v', 'm')
        AND NOT c.relispartition
        AND a.attnum > 0 AND NOT a.attisdropped
        AND coalesce(btrim(col_description(c.oid, a.attnum)), '') = ''
      ORDER BY c.relname, a.attnum$$,
    'every column of every table and view in schema orch8 has a non-empty comment (a '
    'partition''s are its parent''s)'
);

SELECT is_empty(
    $$SELECT c.relname::text
      FROM pg_class AS c
      INNER JOIN pg_namespace AS n ON c.relnamespace = n.oid
      WHERE n.nspname = 'orch8'
        AND c.relkind IN ('r', 'p', 'v', 'm')
        AND coalesce(btrim(obj_description(c.oid, 'pg_class')), '') = ''
      ORDER BY 1$$,
    'every table and view in schema orch8 has a non-empty comment'
);

SELECT * FROM finish();
ROLLBACK;
