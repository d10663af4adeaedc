"""Schema migrations: versioned files applied once, repeatable function files re-applied
when they change, all under one advisory lock so several nodes may migrate at once.

sql/migrations/NNNN_name.sql  versioned: applied once, in order; editing one after it
                              was applied is refused (its checksum is recorded).
sql/functions/name.sql        repeatable: CREATE OR REPLACE bodies, re-applied whenever
                              the file's checksum differs from the recorded one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from .errors import MigrationError, SchemaMismatch

# A fixed key for pg_advisory_lock: 'orch8' in ASCII, padded. Any constant works as
# long as every migrator uses the same one.
MIGRATION_LOCK_KEY = 0x6F72636838_000001

VERSIONED = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS orch8;
CREATE TABLE IF NOT EXISTS orch8.schema_migrations (
    kind       text        NOT NULL CHECK (kind IN ('versioned', 'repeatable')),
    name       text        NOT NULL,
    version    integer     CHECK ((kind = 'versioned') = (version IS NOT NULL)),
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (kind, name)
);
COMMENT ON TABLE orch8.schema_migrations IS
'Migrations applied by orch8 db migrate: versioned files once, '
'repeatable files at their latest checksum.';
"""


def sql_dir() -> Path:
    """The sql/ directory: packaged inside orch8_py in a wheel, beside it in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "sql", here.parent / "sql"):
        if (candidate / "migrations").is_dir():
            return candidate
    raise MigrationError(f"no sql/migrations directory found near {here}; reinstall orch8-py")


@dataclass(frozen=True)
class Migration:
    kind: str  # 'versioned' | 'repeatable'
    name: str
    version: int | None
    checksum: str
    path: Path

    def sql(self) -> str:
        return self.path.read_text(encoding="utf-8")


def _checksum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def discover(root: Path | None = None) -> list[Migration]:
    """All migrations on disk: versioned in version order, then repeatable by name."""
    root = root or sql_dir()
    versioned: list[Migration] = []
    seen: dict[int, str] = {}
    for path in sorted((root / "migrations").glob("*.sql")):
        m = VERSIONED.match(path.name)
        if not m:
            raise MigrationError(
                f"{path.name}: versioned migrations are named NNNN_lower_snake.sql"
            )
        version = int(m.group(1))
        if version in seen:
            raise MigrationError(f"{path.name} and {seen[version]} share version {version}")
        seen[version] = path.name
        versioned.append(Migration("versioned", path.name, version, _checksum(path), path))
    repeatable = [
        Migration("repeatable", p.name, None, _checksum(p), p)
        for p in sorted((root / "functions").glob("*.sql"))
    ]
    return versioned + repeatable


def known_version(migrations: list[Migration] | None = None) -> int:
    migrations = migrations if migrations is not None else discover()
    return max((m.version or 0 for m in migrations), default=0)


@dataclass
class Status:
    database_version: int
    known_version: int
    pending: list[Migration]
    unknown: list[str]  # versioned migrations in the database this build has never seen
    edited: list[str]  # applied versioned migrations whose file changed since

    @property
    def current(self) -> bool:
        return not (self.pending or self.unknown or self.edited)


def _applied(conn: psycopg.Connection) -> dict[tuple[str, str], tuple[int | None, str]]:
    exists = conn.execute("SELECT to_regclass('orch8.schema_migrations') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return {}
    rows = conn.execute("SELECT kind, name, version, checksum FROM orch8.schema_migrations")
    return {(k, n): (v, c) for k, n, v, c in rows.fetchall()}


def status(conn: psycopg.Connection, migrations: list[Migration] | None = None) -> Status:
    migrations = migrations if migrations is not None else discover()
    applied = _applied(conn)
    known_names = {("versioned", m.name) for m in migrations if m.kind == "versioned"}
    pending: list[Migration] = []
    edited: list[Migration] = []
    for m in migrations:
        record = applied.get((m.kind, m.name))
        if record is None:
            pending.append(m)
        elif record[1] != m.checksum:
            (edited if m.kind == "versioned" else pending).append(m)
    unknown = sorted(
        name for (kind, name) in applied if kind == "versioned" and (kind, name) not in known_names
    )
    db_version = max((v or 0 for (k, _), (v, _c) in applied.items() if k == "versioned"), default=0)
    return Status(db_version, known_version(migrations), pending, unknown, [m.name for m in edited])


def check_schema(conn: psycopg.Connection) -> Status:
    """Refuse to run against a schema this build does not match (runner and web service)."""
    st = status(conn)
    if st.unknown or st.database_version > st.known_version:
        raise SchemaMismatch(
            f"the database schema is at version {st.database_version} "
            f"(with {', '.join(st.unknown) or 'migrations'} this build does not know); "
            f"this orch8 knows up to version {st.known_version}: upgrade orch8-py"
        )
    if st.edited:
        raise SchemaMismatch(
            f"applied migration {st.edited[0]} differs from the file this build ships; "
            "versioned migrations are immutable: restore the file or reinstall orch8-py"
        )
    if st.pending and st.database_version == st.known_version:
        # only repeatable function files differ: say which, not "version 18 needs 18"
        raise SchemaMismatch(
            f"the database schema is at version {st.database_version}, but "
            f"{len(st.pending)} function file(s) changed since it was migrated "
            f"({', '.join(m.name for m in st.pending[:3])}): run `orch8 db migrate`"
        )
    if st.pending:
        raise SchemaMismatch(
            f"the database schema is at version {st.database_version}, this orch8 needs "
            f"version {st.known_version} ({len(st.pending)} migration(s) pending): "
            "run `orch8 db migrate`"
        )
    return st


def migrate(
    conn: psycopg.Connection,
    progress: Callable[[str], None] = lambda _msg: None,
    migrations: list[Migration] | None = None,
) -> list[Migration]:
    """Apply what is pending; return what was applied. ``conn`` must be in autocommit."""
    migrations = migrations if migrations is not None else discover()
    if not conn.autocommit:
        raise MigrationError("migrate() needs an autocommit connection")
    conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
    try:
        conn.execute(BOOTSTRAP)
        st = status(conn, migrations)
        if st.unknown or st.database_version > st.known_version:
            raise MigrationError(
                f"the database is at schema version {st.database_version}, newer than this "
                f"orch8 ({st.known_version}); upgrade orch8-py instead of migrating"
            )
        if st.edited:
            raise MigrationError(
                f"migration {st.edited[0]} was edited after it was applied (checksum differs); "
                "applied migrations are immutable: restore the file and put the change "
                "in a new migration"
            )
        applied = _apply_pending(conn, st.pending, progress)
        # A versioned migration may ask for function files to be applied again (0033
        # drops the functions bound to tables it rebuilds and forgets their files).
        again = [m for m in status(conn, migrations).pending if m not in applied]
        applied += _apply_pending(conn, again, progress)
        if applied:
            _after_apply(conn)
        _ensure_partitions(conn, progress)
        return applied
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))


# Called after every run that applied something, each once its migration exists:
# - orch8.secure_functions (0010): CREATE OR REPLACE resets a function's SECURITY DEFINER
#   and search_path; it restores them, the owner and the grants. Until it runs a replaced
#   writer is SECURITY INVOKER, which fails closed for application roles (no DML).
# - orch8.refresh_domain_checks (0029): a session folds a domain's check once, so a rule
#   function it calls (limit_of, node_kinds, ...) replaced by this run would go unseen by
#   open sessions until they are made to prepare it again.
_AFTER_APPLY = ("orch8.secure_functions()", "orch8.refresh_domain_checks()")


def _apply_pending(
    conn: psycopg.Connection, pending: list[Migration], progress: Callable[[str], None]
) -> list[Migration]:
    for i, m in enumerate(pending, 1):
        progress(f"[{i}/{len(pending)}] applying {m.kind} {m.name}")
        _apply(conn, m)
    return list(pending)


def _ensure_partitions(conn: psycopg.Connection, progress: Callable[[str], None]) -> None:
    """This month's and the next months' history partitions (migration 0033 on)."""
    row = conn.execute(
        "SELECT to_regprocedure('orch8.ensure_history_partitions(integer)') IS NOT NULL"
        " AND to_regclass('orch8.history_tables') IS NOT NULL"
    ).fetchone()
    if not (row and row[0]):
        return
    with conn.transaction():
        made = conn.execute(
            "SELECT partition_name, rows_moved FROM orch8.ensure_history_partitions()"
        ).fetchall()
    for name, moved in made:
        progress(f"made history partition {name}" + (f" ({moved} rows moved)" if moved else ""))


def _after_apply(conn: psycopg.Connection) -> None:
    for call in _AFTER_APPLY:
        row = conn.execute("SELECT to_regprocedure(%s) IS NOT NULL", (call,)).fetchone()
        if row and row[0]:
            with conn.transaction():
                conn.execute(f"SELECT {call}")


def _apply(conn: psycopg.Connection, m: Migration) -> None:
    try:
        with conn.transaction():
            conn.execute(m.sql())
            conn.execute(
                """
                INSERT INTO orch8.schema_migrations (kind, name, version, checksum)
                VALUES (%s, %s, %s, %s)
                ON CONFLICT (kind, name) DO UPDATE
                    SET checksum = EXCLUDED.checksum, applied_at = clock_timestamp()
                """,
                (m.kind, m.name, m.version, m.checksum),
            )
    except psycopg.Error as exc:
        diag = exc.diag
        where = f" ({diag.context.splitlines()[0]})" if diag and diag.context else ""
        raise MigrationError(
            f"{m.name} failed: {str(exc).strip().splitlines()[0]}{where}"
        ) from None
