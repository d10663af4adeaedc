"""Database access for requests: every request's queries run in one transaction as the
``orch8_web`` role with ``orch8.tenant_id`` set, so row-level security confines them to
the caller's tenant even if a route forgets a WHERE clause. Statements come from the
door, orch8_py.sqlapi."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from flask import current_app, g
from psycopg_pool import ConnectionPool

from orch8_py import sqlapi
from orch8_py.sqlapi import Conn


def pool() -> ConnectionPool[Conn]:
    p: ConnectionPool[Conn] = current_app.extensions["orch8.pool"]
    if p.closed:
        p.open(wait=False)
    return p


@contextlib.contextmanager
def tenant_tx(tenant: str | None = None) -> Iterator[Conn]:
    """A transaction confined to ``tenant`` (default: the authenticated caller's)."""
    with pool().connection() as conn, conn.transaction():
        sqlapi.tenancy.enter_tenant(conn, tenant or g.tenant)
        yield conn
