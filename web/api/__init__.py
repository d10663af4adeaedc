"""The REST API under /api/v1: one blueprint per resource, nested in ``api``.

Routes call the same SQL functions as the CLI and the runner (docs/SQL_API.md), each in
one ``tenant_tx``, so a request writes everything or nothing and row-level security
confines it to the caller's tenant. Errors are JSON problems (web/problems.py); engine
errors raised by a route here are answered with the structured facts of their DETAIL
(``current_state``, ``effect_id``) besides the message.
"""

from __future__ import annotations

import re

from flask import Blueprint, Flask

from orch8_py import errors

from .. import problems
from . import effects, instances, openapi, sequences, webhooks

PREFIX = "/api/v1"

_CURRENT_STATE = re.compile(r"current state: ([a-z_]+)")
_EFFECT_ID = re.compile(r"effect_id: ([0-9a-fA-F-]{36})")


def engine_problem(exc: errors.Orch8Error):
    """An engine error as a problem: the status of problems.STATUS, the message, the
    problems of an invalid definition, and what the SQL DETAIL names."""
    status, error = 400, "bad request"
    for cls, mapped in problems.STATUS.items():
        if isinstance(exc, cls):
            status, error = mapped
            break
    extra: dict = {}
    if getattr(exc, "problems", None):
        extra["problems"] = exc.problems
    sql_detail = getattr(exc, "detail", None)
    if sql_detail:
        m = _CURRENT_STATE.search(sql_detail)
        if m:
            extra["current_state"] = m.group(1)
        m = _EFFECT_ID.search(sql_detail)
        if m:
            extra["effect_id"] = m.group(1).lower()
        if "problems" not in extra:
            extra["sql_detail"] = sql_detail
    for name in ("current_state", "effect_id"):
        value = getattr(exc, name, None)
        if value and name not in extra:
            extra[name] = value
    return problems.problem(status, error, str(exc), **extra)


def register(app: Flask) -> None:
    api = Blueprint("api", __name__, url_prefix=PREFIX)
    api.register_error_handler(errors.Orch8Error, engine_problem)
    for module in (sequences, instances, effects, webhooks, openapi):
        api.register_blueprint(module.bp)
    app.register_blueprint(api)
