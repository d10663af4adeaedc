"""Liveness (the process answers) and readiness (database reachable, schema current)."""

from __future__ import annotations

import psycopg
from flask import Blueprint, current_app, jsonify
from flask.typing import ResponseReturnValue
from psycopg_pool import PoolTimeout

from orch8_py import migrate

bp = Blueprint("health", __name__)


@bp.get("/health/live")
def live() -> ResponseReturnValue:
    return jsonify(status="ok")


@bp.get("/health/ready")
def ready() -> ResponseReturnValue:
    pool = current_app.extensions["orch8.pool"]
    try:
        if pool.closed:
            pool.open(wait=False)
        with pool.connection(timeout=2) as conn:
            st = migrate.status(conn)
    except (PoolTimeout, psycopg.OperationalError) as exc:
        return jsonify(
            status="unavailable", error="database unreachable", detail=str(exc)[:300]
        ), 503
    if not st.current:
        return (
            jsonify(
                status="unavailable",
                error="schema not current",
                detail=f"database at version {st.database_version}, "
                f"orch8 expects {st.known_version}; run `orch8 db migrate`",
            ),
            503,
        )
    return jsonify(status="ok", schema_version=st.database_version)
