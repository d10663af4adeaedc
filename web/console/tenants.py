"""An admin's tenant switch: the tenant the console acts for, and the tenants to pick from.

Over the REST API an admin key names the tenant to act for in ``X-Tenant-Id``; in the
console it picks one in the header, and the session keeps it (``session.ACTING``). Every
page then runs in ``tenant_tx(<that tenant>)``, so row-level security confines it there
exactly as it confines the key's own tenant. Other roles never see the form, and their
POST is refused (403).
"""

from __future__ import annotations

import psycopg
from flask import abort, flash, g, redirect, request, session, url_for
from flask.typing import ResponseReturnValue
from psycopg_pool import PoolTimeout

from orch8_py import sqlapi

from ..auth import TENANT_RE, TENANT_RULE
from ..db import tenant_tx
from .blueprint import bp, log
from .session import ACTING, SESSION_KEY, login_required

KNOWN_LIMIT = 500  # tenants offered in the datalist
KNOWN_TIMEOUT = "2s"


def known_tenants() -> list[str] | None:
    """The tenants that have sequences or instances, for an admin's datalist (None when
    they cannot be read).

    ``orch8_web`` cannot list them itself: row-level security shows it one tenant's rows.
    orch8.known_tenants reads tenant ids (nothing else) across tenants, for a transaction
    sealed with an admin key, who may act for any tenant anyway. When it cannot answer the
    form offers the free-text field alone."""
    if g.get("role") != "admin":
        return None
    if "console_known_tenants" in g:
        known: list[str] | None = g.console_known_tenants
        return known
    tenants: list[str] | None = None
    try:
        with tenant_tx() as conn:
            tenants = sqlapi.tenancy.known_tenants(conn, limit=KNOWN_LIMIT, timeout=KNOWN_TIMEOUT)
    except (psycopg.Error, PoolTimeout) as exc:
        log.warning("event=console.tenant_list_unavailable error=%r", str(exc)[:200])
    g.console_known_tenants = tenants
    return tenants


def tenant_problem(value: str) -> str | None:
    """Why ``value`` cannot be a tenant id, or None. The character rule is the API's for
    X-Tenant-Id (web.auth.TENANT_RE, matched in full so a trailing newline cannot pass)."""
    if not value:
        return "enter the id of the tenant to act for."
    if not TENANT_RE.fullmatch(value):
        return f"a tenant id is {TENANT_RULE} (the rule the API applies to X-Tenant-Id)."
    return None


@bp.post("/tenant")
@login_required
def switch_tenant() -> ResponseReturnValue:
    if g.role != "admin":
        log.warning(
            "event=console.tenant_switch_refused key_id=%s actor=%s role=%s tenant=%s",
            g.key_id,
            g.actor,
            g.role,
            g.tenant,
        )
        abort(403, f"a {g.role} key works in its own tenant: switching tenants needs an admin key")
    asked = request.form.get("tenant", "").strip()
    problem = tenant_problem(asked)
    if problem:
        abort(422, f"Tenant not switched: {problem}")
    cookie = dict(session[SESSION_KEY])  # login_required has checked it
    before = g.tenant
    if asked == g.home_tenant:
        cookie.pop(ACTING, None)
        flash(f"Back in your key's own tenant {asked}.", "ok")
    else:
        cookie[ACTING] = asked
        known = known_tenants()
        note = "" if known is None or asked in known else " It has no sequences or instances yet."
        flash(f"Now acting for tenant {asked}.{note}", "ok")
    session[SESSION_KEY] = cookie
    log.info(
        "event=console.tenant_switch key_id=%s actor=%s home=%s from=%s to=%s",
        g.key_id,
        g.actor,
        g.home_tenant,
        before,
        asked,
    )
    # The page the admin was on belongs to the old tenant: start from the dashboard.
    return redirect(url_for("console.dashboard"))
