"""API keys: generated here, stored in the database only as SHA-256 and a short prefix.

A key looks like ``o8_<8 hex prefix>_<43 url-safe random characters>``; the prefix is
shown in listings so people can tell keys apart without the secret.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import timedelta

from . import sqlapi
from .sqlapi.base import Conn


def generate() -> tuple[str, str]:
    """A new secret and its prefix."""
    prefix = f"o8_{secrets.token_hex(4)}"
    return f"{prefix}_{secrets.token_urlsafe(32)}", prefix


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def create(
    conn: Conn, tenant_id: str, role: str, name: str, expires_in: timedelta | None = None
) -> tuple[uuid.UUID, str]:
    """Create a key (valid until revoked, or for ``expires_in``); returns (key id, secret).
    The secret is not stored: show it once."""
    secret, prefix = generate()
    key_id = sqlapi.keys.create_api_key(
        conn,
        tenant_id=tenant_id,
        name=name,
        role=role,
        key_prefix=prefix,
        key_hash=key_hash(secret),
        expires_in=expires_in,
    )
    return key_id, secret
