-- Repeatable: re-applied whenever this file's checksum changes.

CREATE OR REPLACE FUNCTION orch8.schema_version()
RETURNS integer
LANGUAGE sql
STABLE
AS $$
    SELECT coalesce(max(version), 0)
    FROM orch8.schema_migrations
    WHERE kind = 'versioned'
$$;

COMMENT ON FUNCTION orch8.schema_version() IS
'The highest versioned migration applied to this database (0 when none). '
'Runners and the web service compare it with the version they were built for.';
