"""Database access for requests: every request's queries run in one transaction as the
``orch8_web`` role with ``orch8.tenant_id`` set, so row-level security confines them to
the caller's tenant even if a route forgets a WHERE clause."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from flask import current_app, g
from psycopg.rows import dict_row, tuple_row

from orch8_py import db as engine_db


def pool():
    p = current_app.extensions["orch8.pool"]
    if p.closed:
        p.open(wait=False)
    return p


@contextlib.contextmanager
def tenant_tx(tenant: str | None = None) -> Iterator[psycopg.Connection]:
    """A transaction confined to ``tenant`` (default: the authenticated caller's).
    Engine SQLSTATEs surface as Orch8Error subclasses."""
    tenant = tenant or g.tenant
    with pool().connection() as conn:
        conn.row_factory = dict_row
        try:
            with conn.transaction(), engine_db.engine_errors():
                # one round trip: the role and the tenant, both for this transaction only
                conn.execute(
                    "SELECT set_config('role', 'orch8_web', true),"
                    " set_config('orch8.tenant_id', %s, true)",
                    (tenant,),
                )
                yield conn
        finally:
            conn.row_factory = tuple_row  # the connection goes back to a shared pool
