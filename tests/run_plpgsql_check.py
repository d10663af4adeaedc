"""plpgsql_check over every PL/pgSQL function of schema orch8 on a fresh migrated
database: errors and warnings (extra warnings included) fail the run.

Trigger functions are checked against each table they are attached to, with the
transition tables their trigger names. When the
extension is missing the check is skipped with a loud reason, except when CI=true,
where that is a failure (Debian: postgresql-15-plpgsql-check).
"""

from __future__ import annotations

import sys

import psycopg

from tests import pgserver
from tests.run_pgtap import skip_or_fail

CHECK = """
WITH targets AS (
    SELECT p.oid, 0::oid AS relid, NULL::name AS oldtable, NULL::name AS newtable
    FROM pg_proc AS p
    JOIN pg_language AS l ON l.oid = p.prolang AND l.lanname = 'plpgsql'
    WHERE p.pronamespace = 'orch8'::regnamespace AND p.prorettype <> 'trigger'::regtype
    UNION
    SELECT t.tgfoid, t.tgrelid, t.tgoldtable, t.tgnewtable FROM pg_trigger AS t
    JOIN pg_proc AS p ON p.oid = t.tgfoid
    JOIN pg_language AS l ON l.oid = p.prolang AND l.lanname = 'plpgsql'
    WHERE p.pronamespace = 'orch8'::regnamespace AND NOT t.tgisinternal
)
SELECT t.oid::regprocedure::text AS fn, nullif(t.relid, 0)::regclass::text AS rel,
       c.lineno, c.level, c.sqlstate, c.message, c.detail
FROM targets AS t
CROSS JOIN LATERAL plpgsql_check_function_tb(
    t.oid, t.relid, extra_warnings => true, performance_warnings => false,
    oldtable => t.oldtable, newtable => t.newtable
) AS c
ORDER BY 1, 2, 3
"""


def main() -> int:
    with pgserver.server() as admin_url:
        template = pgserver.create_template(admin_url)
        name = pgserver.clone(admin_url, template, prefix="orch8_plc")
        try:
            with psycopg.connect(pgserver.with_dbname(admin_url, name), autocommit=True) as conn:
                try:
                    conn.execute("CREATE EXTENSION plpgsql_check")
                # FeatureNotSupported: the server has no such extension at all (the
                # embedded server); UndefinedFile: its control file is there, the library not
                except (psycopg.errors.FeatureNotSupported, psycopg.errors.UndefinedFile):
                    return skip_or_fail(
                        "the plpgsql_check extension is not installed "
                        "(Debian: postgresql-15-plpgsql-check)",
                        "plpgsql_check",
                    )
                checked = conn.execute(
                    "SELECT count(*) FROM pg_proc AS p JOIN pg_language AS l"
                    " ON l.oid = p.prolang AND l.lanname = 'plpgsql'"
                    " WHERE p.pronamespace = 'orch8'::regnamespace"
                ).fetchone()[0]
                findings = conn.execute(CHECK).fetchall()
        finally:
            pgserver.drop(admin_url, name)
            pgserver.drop(admin_url, template)
    for fn, rel, line, level, sqlstate, message, detail in findings:
        where = f"{fn}" + (f" on {rel}" if rel else "") + f" line {line}"
        print(
            f"plpgsql_check: {level} {sqlstate} {where}: {message}"
            + (f" ({detail})" if detail else "")
        )
    print(f"plpgsql_check: {checked} PL/pgSQL functions checked, {len(findings)} finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
