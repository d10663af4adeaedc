"""The API's request transaction: web.db.tenant_tx, handing the connection back to the
pool with its default row factory.

tenant_tx sets ``dict_row`` on the pooled connection and leaves it there, while
web.auth.authenticate reads the next request's key with positional indexes (``row[0]``)
on whichever pooled connection it gets: a connection that served a tenant_tx would make
that a KeyError (a 500). Restoring ``tuple_row`` before the connection goes back keeps
both working.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from psycopg.rows import tuple_row

from ..db import tenant_tx


@contextlib.contextmanager
def api_tx() -> Iterator[psycopg.Connection]:
    with tenant_tx() as conn:
        try:
            yield conn
        finally:
            conn.row_factory = tuple_row
