"""The console's front page: instances by state, the unresolved-effects queue, recent failures."""

from __future__ import annotations

from flask import g

from ..db import tenant_tx
from .blueprint import bp
from .pages import page
from .session import login_required


@bp.get("/")
@login_required
def dashboard():
    with tenant_tx(g.tenant) as conn:
        states = conn.execute(
            "SELECT s.state::text AS state, count(t.id) AS n"
            " FROM unnest(enum_range(NULL::orch8.instance_state)) AS s(state)"
            " LEFT JOIN orch8.task_instances AS t ON t.tenant_id = %s AND t.state = s.state"
            " GROUP BY s.state ORDER BY s.state",
            (g.tenant,),
        ).fetchall()
        queue = conn.execute(
            "SELECT count(*) AS depth, max(age) AS oldest,"
            " count(*) FILTER (WHERE state = 'unknown') AS unknown,"
            " count(*) FILTER (WHERE state = 'dispatched') AS dispatched"
            " FROM orch8.unresolved_effects WHERE tenant_id = %s",
            (g.tenant,),
        ).fetchone()
        failed = conn.execute(
            "SELECT id, error, updated_at FROM orch8.task_instances"
            " WHERE tenant_id = %s AND state = 'failed'"
            " ORDER BY updated_at DESC, id DESC LIMIT 10",
            (g.tenant,),
        ).fetchall()
        return page(
            "dashboard.html",
            conn,
            nav_queue=queue["depth"],
            states=states,
            total=sum(r["n"] for r in states),
            queue=queue,
            failed=failed,
        )
