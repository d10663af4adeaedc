"""Sequence pages: every sequence, one sequence's versions, one version's definition."""

from __future__ import annotations

from flask import abort, g
from flask.typing import ResponseReturnValue

from orch8_py import sqlapi

from ..db import tenant_tx
from .blueprint import bp
from .pages import page
from .session import login_required

LIST_LIMIT = 500


@bp.get("/sequences")
@login_required
def sequences() -> ResponseReturnValue:
    with tenant_tx(g.tenant) as conn:
        rows = sqlapi.sequences.list_sequences(conn, tenant_id=g.tenant, limit=LIST_LIMIT + 1)
        return page("sequences.html", conn, rows=rows[:LIST_LIMIT], more=len(rows) > LIST_LIMIT)


@bp.get("/sequences/<namespace>/<name>")
@login_required
def sequence(namespace: str, name: str) -> ResponseReturnValue:
    with tenant_tx(g.tenant) as conn:
        versions = sqlapi.sequences.sequence_versions(
            conn, tenant_id=g.tenant, namespace=namespace, name=name
        )
        if not versions:
            abort(404)
        started = sqlapi.sequences.instances_per_version(
            conn, tenant_id=g.tenant, namespace=namespace, name=name
        )
        versions = [{**v, "instances": started.get(v["version"], 0)} for v in reversed(versions)]
        return page("sequence.html", conn, namespace=namespace, name=name, versions=versions)


@bp.get("/sequences/<namespace>/<name>/<int:version>")
@login_required
def sequence_version(namespace: str, name: str, version: int) -> ResponseReturnValue:
    with tenant_tx(g.tenant) as conn:
        row = sqlapi.sequences.get_sequence(
            conn, tenant_id=g.tenant, namespace=namespace, name=name, version=version
        )
        if row is None:
            abort(404)
        problems = sqlapi.sequences.validate_sequence(conn, definition=row["definition"])
        return page(
            "sequence_version.html",
            conn,
            namespace=namespace,
            name=name,
            s=row,
            problems=problems,
        )
