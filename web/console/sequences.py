"""Sequence pages: every sequence, one sequence's versions, one version's definition."""

from __future__ import annotations

from flask import abort, g

from ..db import tenant_tx
from .blueprint import bp
from .pages import page
from .session import login_required

LIST_LIMIT = 500


@bp.get("/sequences")
@login_required
def sequences():
    with tenant_tx(g.tenant) as conn:
        rows = conn.execute(
            "SELECT namespace, name, max(version) AS latest, count(*) AS versions,"
            " max(created_at) AS updated_at FROM orch8.sequences WHERE tenant_id = %s"
            " GROUP BY namespace, name ORDER BY namespace, name LIMIT %s",
            (g.tenant, LIST_LIMIT + 1),
        ).fetchall()
        return page("sequences.html", conn, rows=rows[:LIST_LIMIT], more=len(rows) > LIST_LIMIT)


@bp.get("/sequences/<namespace>/<name>")
@login_required
def sequence(namespace: str, name: str):
    with tenant_tx(g.tenant) as conn:
        versions = conn.execute(
            "SELECT s.id, s.version, s.created_at,"
            " jsonb_array_length(coalesce(s.definition -> 'blocks', '[]')) AS blocks,"
            " (SELECT count(*) FROM orch8.task_instances AS t"
            "   WHERE t.tenant_id = s.tenant_id AND t.sequence_id = s.id) AS instances"
            " FROM orch8.sequences AS s"
            " WHERE s.tenant_id = %s AND s.namespace = %s AND s.name = %s"
            " ORDER BY s.version DESC",
            (g.tenant, namespace, name),
        ).fetchall()
        if not versions:
            abort(404)
        return page("sequence.html", conn, namespace=namespace, name=name, versions=versions)


@bp.get("/sequences/<namespace>/<name>/<int:version>")
@login_required
def sequence_version(namespace: str, name: str, version: int):
    with tenant_tx(g.tenant) as conn:
        row = conn.execute(
            "SELECT id, version, created_at, definition FROM orch8.sequences"
            " WHERE tenant_id = %s AND namespace = %s AND name = %s AND version = %s",
            (g.tenant, namespace, name, version),
        ).fetchone()
        if row is None:
            abort(404)
        return page("sequence_version.html", conn, namespace=namespace, name=name, s=row)
