"""Tenant confinement for the web service: a transaction as the role orch8_web, sealed to
one tenant by the caller's credential (orch8.enter_tenant); row-level security then shows
that tenant only. And the tenant ids an admin may pick from."""

from __future__ import annotations

from .base import Conn, all_rows, one

WEB_ROLE = "orch8_web"
CREDENTIAL_KINDS = ("api_key", "console_session")


def enter_tenant(conn: Conn, *, kind: str, credential_hash: str, tenant_id: str) -> None:
    """In the caller's open transaction: act as orch8_web for ``tenant_id`` until it ends,
    sealed by a credential (``kind`` api_key or console_session, and the SHA-256 of its
    secret). One round trip; a credential that is not usable, or another tenant's, raises
    Forbidden."""
    one(
        conn,
        "SELECT set_config('role', %(role)s, true),"
        " orch8.enter_tenant(p_kind => %(kind)s, p_hash => %(hash)s, p_tenant_id => %(tenant)s)",
        {"role": WEB_ROLE, "kind": kind, "hash": credential_hash, "tenant": tenant_id},
    )


def known_tenants(conn: Conn, *, limit: int, timeout: str) -> list[str]:
    """Tenant ids that have sequences or instances, read within ``timeout`` (a PostgreSQL
    interval such as '2s'). In a transaction sealed with an admin key (else Forbidden)."""
    one(conn, "SELECT set_config('statement_timeout', %(t)s, true)", {"t": timeout})
    return [
        r["tenant"]
        for r in all_rows(conn, "SELECT orch8.known_tenants(%(limit)s) AS tenant", {"limit": limit})
    ]
