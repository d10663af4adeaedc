"""API keys: stored as SHA-256 and a short prefix (never the secret), checked on every
request through SECURITY DEFINER functions (the web role cannot read the table)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from .base import Conn, Row, all_rows, first, objects, value

KEY = "id, tenant_id, name, role, key_prefix, created_at, last_used_at, revoked_at"


@dataclass(frozen=True)
class Principal:
    """Who an API key is: its tenant, id, role and name."""

    tenant_id: str
    key_id: uuid.UUID
    role: str
    name: str


def create_api_key(
    conn: Conn, *, tenant_id: str, name: str, role: str, key_prefix: str, key_hash: str
) -> uuid.UUID:
    key_id: uuid.UUID = value(
        conn,
        "SELECT orch8.create_api_key(p_tenant_id => %(tenant)s, p_name => %(name)s,"
        " p_role => %(role)s, p_key_prefix => %(prefix)s, p_key_hash => %(hash)s)",
        {"tenant": tenant_id, "name": name, "role": role, "prefix": key_prefix, "hash": key_hash},
    )
    return key_id


def list_api_keys(conn: Conn, *, tenant_id: str | None = None) -> list[Row]:
    """A tenant's keys (every tenant's when None), never their secrets."""
    return all_rows(
        conn,
        f"SELECT {KEY} FROM orch8.api_keys"
        " WHERE %(tenant)s::text IS NULL OR tenant_id = %(tenant)s"
        " ORDER BY tenant_id, created_at",
        {"tenant": tenant_id},
    )


def get_api_key(conn: Conn, *, tenant_id: str, key_id: uuid.UUID) -> Row | None:
    return first(
        conn,
        f"SELECT {KEY} FROM orch8.api_keys WHERE tenant_id = %(tenant)s AND id = %(id)s",
        {"tenant": tenant_id, "id": key_id},
    )


def any_api_key(conn: Conn) -> bool:
    """Whether any key exists at all (orch8 up creates one on the first start)."""
    return bool(value(conn, "SELECT EXISTS (SELECT 1 FROM orch8.api_keys)"))


def revoke_api_key(conn: Conn, *, tenant_id: str, key_id: uuid.UUID) -> bool:
    """True when this call revoked it; False when there is no such unrevoked key."""
    return bool(
        value(
            conn,
            "SELECT orch8.revoke_api_key(p_tenant_id => %(tenant)s, p_key_id => %(id)s)",
            {"tenant": tenant_id, "id": key_id},
        )
    )


def authenticate_api_key(conn: Conn, *, key_hash: str) -> Principal | None:
    found = objects(
        conn,
        Principal,
        "SELECT tenant_id, key_id, role, name"
        " FROM orch8.authenticate_api_key(p_key_hash => %(hash)s)",
        {"hash": key_hash},
    )
    return found[0] if found else None


def api_key_active(conn: Conn, *, key_id: uuid.UUID) -> bool:
    return bool(value(conn, "SELECT orch8.api_key_active(p_key_id => %(id)s)", {"id": key_id}))
