"""API keys: stored as SHA-256 and a short prefix (never the secret), checked on every
request through SECURITY DEFINER functions (the web role cannot read the table)."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from .base import Conn, Row, all_rows, first, objects, value

KEY = (
    "id, tenant_id, name, role, key_prefix, created_at, last_used_at, expires_at, revoked_at,"
    " coalesce(expires_at <= orch8.now(), false) AS expired"
)


@dataclass(frozen=True)
class Principal:
    """Who an API key is: its tenant, id, role and name."""

    tenant_id: str
    key_id: uuid.UUID
    role: str
    name: str


def create_api_key(
    conn: Conn,
    *,
    tenant_id: str,
    name: str,
    role: str,
    key_prefix: str,
    key_hash: str,
    expires_in: dt.timedelta | None = None,
) -> uuid.UUID:
    """A key that works until revoked, or for ``expires_in`` from the database's now."""
    key_id: uuid.UUID = value(
        conn,
        "SELECT orch8.create_api_key(p_tenant_id => %(tenant)s, p_name => %(name)s,"
        " p_role => %(role)s, p_key_prefix => %(prefix)s, p_key_hash => %(hash)s,"
        " p_expires_at => orch8.now() + %(expires)s::interval)",
        {
            "tenant": tenant_id,
            "name": name,
            "role": role,
            "prefix": key_prefix,
            "hash": key_hash,
            "expires": expires_in,
        },
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


@dataclass(frozen=True)
class ConsoleSession:
    """Who a console session belongs to, and until when."""

    tenant_id: str
    key_id: uuid.UUID
    role: str
    name: str
    expires_at: dt.datetime


_SESSION = "tenant_id, key_id, role, name, expires_at"


def open_console_session(
    conn: Conn, *, key_hash: str, token_hash: str, max_age_seconds: int
) -> ConsoleSession | None:
    """Log in: a session for the usable key whose hash is ``key_hash`` (None when it is not
    usable). The cookie carries the token; the database keeps only ``token_hash``."""
    found = objects(
        conn,
        ConsoleSession,
        f"SELECT {_SESSION} FROM orch8.open_console_session(p_key_hash => %(key)s,"
        " p_token_hash => %(token)s, p_max_age => make_interval(secs => %(age)s))",
        {"key": key_hash, "token": token_hash, "age": max_age_seconds},
    )
    return found[0] if found else None


def console_session(conn: Conn, *, token_hash: str) -> ConsoleSession | None:
    """The open session of a token (None once logged out, expired, or its key revoked)."""
    found = objects(
        conn,
        ConsoleSession,
        f"SELECT {_SESSION} FROM orch8.console_session(p_token_hash => %(token)s)",
        {"token": token_hash},
    )
    return found[0] if found else None


def end_console_session(conn: Conn, *, token_hash: str) -> bool:
    """Log out: every copy of the session's cookie stops working."""
    return bool(
        value(conn, "SELECT orch8.end_console_session(p_token_hash => %(t)s)", {"t": token_hash})
    )
