"""The PostgreSQL server around the schema: its version, databases, and who is connected
(the demo refuses to run beside another runner)."""

from __future__ import annotations

import contextlib

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


def in_recovery(conn: Conn) -> bool:
    """Whether the server is a standby (in recovery): it answers reads, refuses writes."""
    standby: bool = value(conn, "SELECT pg_is_in_recovery()")
    return standby
