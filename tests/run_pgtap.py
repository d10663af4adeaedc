"""Run the pgTAP suite (sql_tests/*.sql) with pg_prove on a fresh migrated database.

When pgTAP or pg_prove is missing the suite is skipped with a loud reason, except when
CI=true, where that is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import psycopg
from psycopg import conninfo

from tests import pgserver


def skip_or_fail(reason: str, what: str = "pgTAP suite") -> int:
    if os.environ.get("CI", "").lower() == "true":
        print(f"{what}: FAILED: {reason} (CI=true requires it)", file=sys.stderr)
        return 1
    bar = "!" * 78
    print(f"{bar}\n!! {what.upper()} SKIPPED: {reason}\n{bar}", file=sys.stderr)
    return 0


def main() -> int:
    files = sorted(str(p) for p in (pgserver.ROOT / "sql_tests").glob("*.sql"))
    if not files:
        return skip_or_fail("no files in sql_tests/")
    pg_prove = shutil.which("pg_prove")
    if pg_prove is None:
        return skip_or_fail(
            "pg_prove is not installed (Debian: libtap-parser-sourcehandler-pgtap-perl)"
        )
    with pgserver.server() as admin_url:
        template = pgserver.create_template(admin_url)
        name = pgserver.clone(admin_url, template, prefix="orch8_tap")
        try:
            url = pgserver.with_dbname(admin_url, name)
            with psycopg.connect(url, autocommit=True) as conn:
                try:
                    conn.execute("CREATE EXTENSION IF NOT EXISTS pgtap")
                except (psycopg.errors.FeatureNotSupported, psycopg.errors.UndefinedFile) as exc:
                    return skip_or_fail(
                        f"the pgtap extension is not installed in the server ({exc})"
                    )
                for fixture in sorted((pgserver.ROOT / "sql_tests" / "fixtures").glob("*.sql")):
                    conn.execute(fixture.read_text(encoding="utf-8"))
            params = conninfo.conninfo_to_dict(url)
            env = dict(os.environ)
            for key, var in (
                ("host", "PGHOST"),
                ("port", "PGPORT"),
                ("user", "PGUSER"),
                ("password", "PGPASSWORD"),
                ("dbname", "PGDATABASE"),
            ):
                if params.get(key):
                    env[var] = str(params[key])
            cmd = [pg_prove, "--failures", "--timer", *files]
            return subprocess.call(cmd, env=env)
        finally:
            pgserver.drop(admin_url, name)
            pgserver.drop(admin_url, template)


if __name__ == "__main__":
    sys.exit(main())
