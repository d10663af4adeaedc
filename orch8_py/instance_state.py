"""ctx.state for the runner's steps: an instance's key-value store, in the database
(orch8.set_instance_state and friends through the door). Writes are fenced by the
instance's lease token: a runner that lost its lease gets StaleLease and writes nothing.
Each call runs in its own transaction."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from . import sqlapi
from .sqlapi.base import Conn


class SqlInstanceState:
    """``connection()`` returns a context manager yielding a psycopg connection (for
    example a psycopg_pool ConnectionPool's ``.connection``)."""

    def __init__(
        self,
        connection: Callable[[], AbstractContextManager[Conn]],
        tenant_id: str,
        instance_id: uuid.UUID,
        lease_token: uuid.UUID,
    ):
        self.connection = connection
        self.tenant_id = tenant_id
        self.instance_id = instance_id
        self.lease_token = lease_token

    def get(self, key: str, default: Any = None) -> Any:
        with self.connection() as conn, conn.transaction():
            found = sqlapi.steps.get_instance_state(
                conn, tenant_id=self.tenant_id, instance_id=self.instance_id, key=key
            )
        return default if found is sqlapi.steps.MISSING else found

    def set(self, key: str, value: Any) -> None:
        with self.connection() as conn, conn.transaction():
            sqlapi.steps.set_instance_state(
                conn,
                tenant_id=self.tenant_id,
                instance_id=self.instance_id,
                lease_token=self.lease_token,
                key=key,
                value_=value,
            )

    def delete(self, key: str) -> bool:
        with self.connection() as conn, conn.transaction():
            return sqlapi.steps.delete_instance_state(
                conn,
                tenant_id=self.tenant_id,
                instance_id=self.instance_id,
                lease_token=self.lease_token,
                key=key,
            )

    def merge(self, key: str, patch: dict[str, Any]) -> dict[str, Any]:
        with self.connection() as conn, conn.transaction():
            return sqlapi.steps.merge_instance_state(
                conn,
                tenant_id=self.tenant_id,
                instance_id=self.instance_id,
                lease_token=self.lease_token,
                key=key,
                patch=patch,
            )
