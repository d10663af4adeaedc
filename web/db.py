"""Database access for requests: every request's queries run in one transaction as the
``orch8_web`` role, sealed to the caller's tenant by the caller's own credential
(orch8.enter_tenant), so row-level security confines them to that tenant even if a route
forgets a WHERE clause, and a connection without a credential reaches nothing. Statements
come from the door, orch8_py.sqlapi."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from flask import current_app, g
from psycopg_pool import ConnectionPool

from orch8_py import db, sqlapi
from orch8_py.sqlapi import Conn


def pool() -> ConnectionPool[Conn]:
    p: ConnectionPool[Conn] = current_app.extensions["orch8.pool"]
    if p.closed:
        p.open(wait=False)
    return p


@contextlib.contextmanager
def connection() -> Iterator[Conn]:
    """A pooled connection; one that reached a read-only server (a standby after a
    failover) is closed so the pool does not hand it out again."""
    with pool().connection() as conn:
        try:
            yield conn
        except db.CONNECTION_LOST as exc:
            db.drop_if_read_only(conn, exc)
            raise


@contextlib.contextmanager
def tenant_tx(tenant: str | None = None) -> Iterator[Conn]:
    """A transaction confined to ``tenant`` (default: the authenticated caller's), sealed
    by the request's credential (``g.credential``: its kind and the SHA-256 of its secret,
    set by the API's key check or the console's session check)."""
    kind, credential_hash = g.credential
    with connection() as conn, conn.transaction():
        sqlapi.tenancy.enter_tenant(
            conn, kind=kind, credential_hash=credential_hash, tenant_id=tenant or g.tenant
        )
        yield conn
