"""The PostgreSQL server around the schema: its version, databases, and who is connected
(the demo refuses to run beside another runner)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import psycopg
from psycopg import sql

from .base import Conn, value
from .steps import WORK_CHANNEL


def server_version(conn: Conn) -> str:
    version: str = value(conn, "SHOW server_version")
    return version


def ensure_database(conn: Conn, name: str) -> None:
    """Create database ``name`` unless it exists (an autocommit connection; another
    process creating it first is fine)."""
    if value(conn, "SELECT 1 FROM pg_database WHERE datname = %(n)s", {"n": name}) is None:
        # another process may create it first; either way it exists afterwards
        with contextlib.suppress(psycopg.errors.DuplicateDatabase):
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def other_client_sessions(conn: Conn) -> int:
    """Client sessions on the server besides this one."""
    n: int = value(
        conn,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
    )
    return n


def runners_listening(conn: Conn) -> int:
    """Sessions of this database waiting for work the way a runner does."""
    n: int = value(
        conn,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND query = %(q)s",
        {"q": f"LISTEN {WORK_CHANNEL}"},
    )
    return n


@dataclass(frozen=True)
class Replication:
    """The server's place in a replicated cluster, from what any role may read."""

    standby: bool  # in recovery: answers reads, refuses writes
    standbys: int  # standbys streaming from this server (pg_stat_replication rows)
    synchronous: bool  # commits wait for a standby (synchronous_standby_names set, and
    # synchronous_commit at on, remote_write or remote_apply)


def replication(conn: Conn) -> Replication:
    row = conn.execute(
        "SELECT pg_is_in_recovery(), (SELECT count(*) FROM pg_stat_replication),"
        " current_setting('synchronous_standby_names') <> ''"
        " AND current_setting('synchronous_commit') IN ('on', 'remote_write', 'remote_apply')"
    ).fetchone()
    assert row is not None
    return Replication(standby=bool(row[0]), standbys=int(row[1]), synchronous=bool(row[2]))
