"""Liveness (the process answers) and readiness (database reachable, schema current)."""

from __future__ import annotations

import psycopg
from flask import Blueprint, current_app, jsonify
from flask.typing import ResponseReturnValue
from psycopg_pool import PoolTimeout

from orch8_py import migrate, sqlapi

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
            rep = sqlapi.server.replication(conn)
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
    if rep.standby:  # after a failover: the URL reaches a node that refuses writes
        return jsonify(
            status="unavailable",
            error="database is a standby",
            detail="the server is in recovery and refuses writes; point the URL at the "
            "primary (with every node listed: target_session_attrs=read-write)",
        ), 503
    return jsonify(
        status="ok",
        schema_version=st.database_version,
        standbys=rep.standbys,
        synchronous=rep.synchronous,
    )
