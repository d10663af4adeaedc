"""Rendering a console page, and the pages shown instead when something goes wrong."""

from __future__ import annotations

from typing import Any

import psycopg
from flask import abort, g, render_template
from flask.typing import ResponseReturnValue
from psycopg_pool import PoolTimeout
from werkzeug.exceptions import HTTPException

from orch8_py import errors, rules, sqlapi
from orch8_py.sqlapi import Conn

from .blueprint import bp, log
from .session import can_write, current_user
from .tenants import known_tenants


def queue_depth(conn: Conn) -> int:
    depth: int = sqlapi.effects.unresolved_summary(conn, tenant_id=g.tenant)["depth"]
    return depth


def page(template: str, conn: Conn, status: int = 200, **ctx: Any) -> tuple[str, int]:
    ctx.setdefault("nav_queue", queue_depth(conn))
    if g.get("role") == "admin":
        # the header's tenant switch offers these (an admin's own tenant among them)
        ctx.setdefault("known_tenants", sorted({*(known_tenants() or ()), g.home_tenant}))
    return render_template(
        f"console/{template}",
        user=current_user(),
        can_write=can_write(),
        limits=rules.LIMITS,
        **ctx,
    ), status


# --- error pages ----------------------------------------------------------------------


def _error_page(status: int, title: str, message: str) -> tuple[str, int]:
    try:
        user = current_user()
    except (PoolTimeout, psycopg.Error):  # the database is what failed: no one to show
        user = None
    if user is not None:
        g.role = user["role"]
    return render_template(
        "console/error.html", status=status, title=title, message=message, user=user
    ), status


@bp.errorhandler(HTTPException)
def _http_error(exc: HTTPException) -> ResponseReturnValue:
    status = exc.code or 500
    messages = {404: "There is no such page, or nothing with that id in your tenant."}
    message = messages.get(status) or exc.description or "error"
    return _error_page(status, f"{status} {exc.name}", message)


@bp.errorhandler(errors.NotFound)
def _engine_not_found(exc: Exception) -> ResponseReturnValue:
    return _error_page(404, "404 Not Found", "Nothing with that id in your tenant.")


@bp.errorhandler(PoolTimeout)
@bp.errorhandler(psycopg.OperationalError)
@bp.errorhandler(psycopg.errors.ReadOnlySqlTransaction)  # a standby, after a failover
def _unavailable(exc: Exception) -> ResponseReturnValue:
    log.warning("event=console.db_unavailable error=%r", str(exc)[:200])
    return _error_page(503, "Database unavailable", "The database cannot be reached. Try again.")


@bp.errorhandler(Exception)
def _internal(exc: Exception) -> ResponseReturnValue:
    log.exception("event=console.internal_error")
    return _error_page(500, "Something went wrong", "The error was logged. Try again.")


# Any other path under /console gets the console's own 404 page, not the app's.
@bp.route("/<path:rest>", methods=["GET", "POST"])
def not_found(rest: str) -> ResponseReturnValue:
    abort(404)
