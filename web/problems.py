"""JSON problem answers: ``{"error": ..., "detail": ...}`` with the right status, for
every error the service can meet — bad input, engine refusals, HTTP errors — and a 500
without internals for the rest."""

from __future__ import annotations

import logging

import psycopg
from flask import Flask, jsonify
from psycopg_pool import PoolTimeout
from werkzeug.exceptions import HTTPException

from orch8_py import errors

log = logging.getLogger("orch8.web")

# Engine exceptions -> (status, error). 404 for anything not visible to the caller.
STATUS = {
    errors.NotFound: (404, "not found"),
    errors.InvalidInput: (422, "invalid input"),
    errors.InvalidConfig: (422, "invalid definition"),
    errors.InvalidTransition: (409, "conflict"),
    errors.StaleEffect: (409, "reload before resolving"),
    errors.EffectBlocked: (409, "blocked by an unresolved effect"),
    errors.InvariantViolation: (409, "invariant violation"),
    errors.StaleLease: (409, "lease lost"),
}


class Problem(Exception):
    """Raise from a route to answer with a JSON problem."""

    def __init__(self, status: int, error: str, detail: str | None = None, **extra):
        super().__init__(detail or error)
        self.status, self.error, self.detail, self.extra = status, error, detail, extra


def problem(status: int, error: str, detail: str | None = None, **extra):
    body = {"error": error, **({"detail": detail} if detail else {}), **extra}
    return jsonify(body), status


def install(app: Flask) -> None:
    @app.errorhandler(Problem)
    def _problem(exc: Problem):
        return problem(exc.status, exc.error, exc.detail, **exc.extra)

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        return problem(exc.code or 500, (exc.name or "error").lower(), exc.description)

    @app.errorhandler(errors.Orch8Error)
    def _engine(exc: errors.Orch8Error):
        for cls, (status, error) in STATUS.items():
            if isinstance(exc, cls):
                extra = {}
                if getattr(exc, "problems", None):
                    extra["problems"] = exc.problems
                detail = str(exc)
                if getattr(exc, "detail", None):
                    extra["sql_detail"] = exc.detail
                return problem(status, error, detail, **extra)
        return problem(400, "bad request", str(exc))

    @app.errorhandler(PoolTimeout)
    @app.errorhandler(psycopg.OperationalError)
    def _unavailable(exc):
        log.warning("event=web.db_unavailable error=%r", str(exc)[:200])
        return problem(503, "database unavailable", "try again shortly")

    @app.errorhandler(Exception)
    def _internal(exc):
        log.exception("event=web.internal_error")
        return problem(500, "internal error", "the error was logged")
