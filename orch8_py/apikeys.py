"""API keys: generated here, stored in the database only as SHA-256 and a short prefix.

A key looks like ``o8_<8 hex prefix>_<43 url-safe random characters>``; the prefix is
shown in listings so people can tell keys apart without the secret.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid

import psycopg

from .db import engine_errors

ROLES = ("operator", "worker", "auditor", "admin")


def generate() -> tuple[str, str]:
    """A new secret and its prefix."""
    prefix = f"o8_{secrets.token_hex(4)}"
    return f"{prefix}_{secrets.token_urlsafe(32)}", prefix


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def create(conn: psycopg.Connection, tenant_id: str, role: str, name: str) -> tuple[uuid.UUID, str]:
    """Create a key; returns (key id, secret). The secret is not stored: show it once."""
    secret, prefix = generate()
    with engine_errors():
        key_id = conn.execute(
            "SELECT orch8.create_api_key(%s, %s, %s, %s, %s)",
            (tenant_id, name, role, prefix, key_hash(secret)),
        ).fetchone()[0]
    return key_id, secret


def list_keys(conn: psycopg.Connection, tenant_id: str | None = None) -> list[dict]:
    rows = conn.execute(
        "SELECT id, tenant_id, name, role, key_prefix, created_at, last_used_at, revoked_at"
        " FROM orch8.api_keys WHERE %s::text IS NULL OR tenant_id = %s"
        " ORDER BY tenant_id, created_at",
        (tenant_id, tenant_id),
    )
    cols = [c.name for c in rows.description]
    return [dict(zip(cols, r, strict=True)) for r in rows.fetchall()]


def revoke(conn: psycopg.Connection, tenant_id: str, key_id: uuid.UUID) -> bool:
    row = conn.execute("SELECT orch8.revoke_api_key(%s, %s)", (tenant_id, key_id)).fetchone()
    return bool(row and row[0])
