"""The console's front page: instances by state, the unresolved-effects queue, recent failures."""

from __future__ import annotations

from flask import g
from flask.typing import ResponseReturnValue

from orch8_py import sqlapi

from ..db import tenant_tx
from .blueprint import bp
from .pages import page
from .session import login_required


@bp.get("/")
@login_required
def dashboard() -> ResponseReturnValue:
    with tenant_tx(g.tenant) as conn:
        counts = sqlapi.instances.count_by_state(conn, tenant_id=g.tenant)
        states = [{"state": state, "n": n} for state, n in counts.items()]
        queue = sqlapi.effects.unresolved_summary(conn, tenant_id=g.tenant)
        failed = sqlapi.instances.recent_failures(conn, tenant_id=g.tenant, limit=10)
        return page(
            "dashboard.html",
            conn,
            nav_queue=queue["depth"],
            states=states,
            total=sum(r["n"] for r in states),
            queue=queue,
            failed=failed,
        )
