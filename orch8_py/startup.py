"""Getting a database ready for a command: ORCH8_DATABASE_URL or the embedded server,
migrations with progress lines, and the check that the schema is the one this build
expects (orch8 run and serve refuse anything else)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from . import config, db, migrate, sqlapi
from .embedded import EmbeddedPostgres
from .errors import ConfigError


def say(msg: str) -> None:
    print(msg, flush=True)


@contextlib.contextmanager
def database(settings: config.Settings, quiet: bool = False) -> Iterator[str]:
    """Yield the database URL: ORCH8_DATABASE_URL, or the embedded server (stopped after,
    if this process started it)."""
    if settings.database_url:
        db.validate_url(settings.database_url)
        yield settings.database_url
        return
    server = EmbeddedPostgres(settings.data_dir)
    url = server.start()
    if not quiet:
        verb = "started" if server.started_here else "reusing running"
        say(f"orch8: {verb} embedded PostgreSQL, data in {server.pgdata}")
    try:
        yield url
    finally:
        server.stop()


@contextlib.contextmanager
def service_database(settings: config.Settings, role_url: str | None, source: str) -> Iterator[str]:
    """The URL a service connects with: its own least-privilege login (``role_url``, from
    the variable ``source``) when one is configured, else what ``database`` yields."""
    if role_url:
        db.validate_url(role_url, source)
        yield role_url
        return
    with database(settings) as url:
        yield url


def require_primary(url: str) -> None:
    """orch8 writes on every step: refuse a standby with one line, before anything starts
    (its schema check would pass, and the first claim would fail read-only). Warn when
    standbys replicate asynchronously: a failover can then lose a receipt."""
    with db.connect(url, autocommit=True) as conn:
        rep = sqlapi.server.replication(conn)
    if rep.standby:
        raise ConfigError(
            f"{db.describe(url)} is a standby (in recovery) and refuses writes: point the URL "
            "at the primary, or list every node and add target_session_attrs=read-write"
        )
    if rep.standbys and not rep.synchronous:
        say(f"orch8: warning: {describe_replication(rep)}")


def describe_replication(rep: sqlapi.server.Replication) -> str:
    """The server's role in one line, for `orch8 db status` and the start-up warning."""
    if rep.standby:
        return "standby (in recovery): refuses writes"
    if not rep.standbys:
        return "primary, no standby streaming from it"
    if rep.synchronous:
        return f"primary, {rep.standbys} standby(s), synchronous commit"
    return (
        f"primary, {rep.standbys} standby(s) replicating asynchronously: a failover can "
        "lose the last commits, receipts included (docs/HA.md)"
    )


def run_migrations(url: str, progress: Callable[[str], None] = say) -> None:
    with db.connect(url, autocommit=True) as conn:
        applied = migrate.migrate(conn, progress=lambda m: progress(f"orch8: {m}"))
        version = migrate.status(conn).database_version
    if applied:
        progress(f"orch8: schema at version {version} ({len(applied)} migration(s) applied)")
    else:
        progress(f"orch8: schema at version {version}, nothing to apply")


def check_schema(url: str) -> None:
    with db.connect(url, autocommit=True) as conn:
        migrate.check_schema(conn)
