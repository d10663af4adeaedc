"""Problem answers (RFC 9457, ``application/problem+json``) for every error the service
can meet, and the one mapping from engine exceptions to them.

A problem document has the standard members ``type`` (a URN naming the kind of problem),
``title``, ``status`` and ``detail``, and these extensions: ``error`` (a short, stable
code: the same words as ``title`` in lower case), ``problems`` (every problem of the
input as ``{path, message}``), and the facts the engine named (``current_state``,
``effect_id``, ``allowed_states``, ``field``, ``limit``...). The console shows the same
mapping's status and message on its pages.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from typing import Any

import psycopg
from flask import Flask, Response
from psycopg_pool import PoolTimeout
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from werkzeug.exceptions import HTTPException
from werkzeug.sansio.response import Response as AnyResponse

from orch8_py import errors

log = logging.getLogger("orch8.web")

MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:orch8:problem:"

# Engine exceptions -> (status, error). 404 for anything not visible to the caller. The
# first matching class wins (subclasses before their bases).
STATUS: tuple[tuple[type[errors.Orch8Error], int, str], ...] = (
    (errors.NotFound, 404, "not found"),
    (errors.InvalidSequence, 422, "invalid definition"),
    (errors.InvalidInput, 422, "invalid input"),
    (errors.InvalidConfig, 422, "invalid definition"),
    (errors.InvalidTransition, 409, "conflict"),
    (errors.StaleEffect, 409, "reload before resolving"),
    (errors.EffectBlocked, 409, "blocked by an unresolved effect"),
    (errors.InvariantViolation, 409, "invariant violation"),
    (errors.StaleLease, 409, "lease lost"),
    (errors.Forbidden, 403, "forbidden"),
)

# Engine facts shown as extension members (anything else stays in the log).
FACTS = (
    "current_state",
    "effect_id",
    "effect_state",
    "instance_id",
    "allowed_states",
    "allowed",
    "field",
    "limit",
    "size",
    "problems",
    "block_id",
    "read_by",
    "pointer",
    "schema_error",
)


class FieldProblem(BaseModel):
    """One problem of the input: where (a field path) and what."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)

    path: str = Field(description="the field: `name`, `data.items[0].sku`; `$` is the whole body")
    message: str


class ProblemDocument(BaseModel):
    """The declaration of every problem document (RFC 9457): what ``Problem.document``
    builds, checked against this model before it is sent, and the schema of every 4xx and
    5xx answer in the OpenAPI document."""

    model_config = ConfigDict(
        title="Problem",
        extra="allow",  # RFC 9457 extension members; the known ones are declared below
        json_schema_extra={
            "description": "An RFC 9457 problem document "
            "(application/problem+json): every 4xx and 5xx answer."
        },
    )

    type: str = Field(description=f"a URN naming the kind of problem: {TYPE_PREFIX}<error>")
    title: str = Field(description="the error code as a heading")
    status: int = Field(ge=400, le=599, description="the HTTP status, repeated")
    error: str = Field(
        description="short and stable: not found, invalid input, conflict, reload before "
        "resolving, blocked by an unresolved effect, ..."
    )
    detail: str | None = Field(default=None, description="what happened, for people")
    problems: list[FieldProblem] | None = Field(
        default=None, description="every problem of the input (422)"
    )
    current_state: str | None = Field(
        default=None, description="the state that made a move illegal (409)"
    )
    allowed_states: list[str] | None = Field(
        default=None, description="the states a move from current_state may go to (409)"
    )
    effect_id: uuid.UUID | None = Field(default=None, description="the receipt to resolve first")
    effect_state: str | None = None
    instance_id: uuid.UUID | None = None
    allowed: list[str] | None = Field(default=None, description="the values a field allows")
    field: str | None = Field(default=None, description="the field the engine refused")
    limit: int | None = Field(default=None, description="the limit that field is over")
    size: int | None = None
    block_id: str | None = Field(default=None, description="the step the engine named")
    read_by: list[str] | None = Field(
        default=None,
        description="the later blocks that read the step's output (a retry without one, 422)",
    )


class Problem(Exception):
    """Raise from a route to answer with a problem document."""

    def __init__(
        self,
        status: int,
        error: str,
        detail: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(detail or error)
        self.status, self.error, self.detail = status, error, detail
        self.headers = dict(headers or {})
        self.extensions = extensions

    def document(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": TYPE_PREFIX + self.error.replace(" ", "-"),
            "title": self.error[:1].upper() + self.error[1:],
            "status": self.status,
            "error": self.error,
        }
        if self.detail:
            body["detail"] = self.detail
        body.update(self.extensions)
        return body

    def checked_document(self) -> dict[str, Any]:
        """The document as ProblemDocument declares it (members without a value left out)."""
        document = self.document()
        try:
            checked = ProblemDocument.model_validate(document)
        except ValidationError:  # a route built a problem its declaration does not allow
            log.exception("event=web.problem_undeclared status=%s", self.status)
            return document
        return checked.model_dump(mode="json", exclude_none=True)

    def response(self) -> Response:
        resp = Response(
            json.dumps(self.checked_document(), default=str, ensure_ascii=False) + "\n",
            status=self.status,
            mimetype=MEDIA_TYPE,
        )
        for name, value in self.headers.items():
            resp.headers[name] = value
        return resp


def for_engine_error(exc: errors.Orch8Error) -> Problem:
    """The one mapping of an engine exception to a problem: its status, stable error code,
    message, and the facts the SQL named."""
    status, error = 400, "bad request"
    for cls, mapped_status, mapped_error in STATUS:
        if isinstance(exc, cls):
            status, error = mapped_status, mapped_error
            break
    facts = {k: exc.facts[k] for k in FACTS if k in exc.facts}
    return Problem(status, error, str(exc), **facts)


def install(app: Flask) -> None:
    @app.errorhandler(Problem)
    def _problem(exc: Problem) -> Response:
        return exc.response()

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> AnyResponse:
        if exc.response is not None:  # abort(response): already an answer
            return exc.response
        # get_headers keeps what the exception carries, e.g. Allow on a 405
        headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
        problem = Problem(
            exc.code or 500, (exc.name or "error").lower(), exc.description, headers=headers
        )
        return problem.response()

    @app.errorhandler(errors.Orch8Error)
    def _engine(exc: errors.Orch8Error) -> Response:
        return for_engine_error(exc).response()

    @app.errorhandler(PoolTimeout)
    @app.errorhandler(psycopg.OperationalError)
    @app.errorhandler(psycopg.errors.ReadOnlySqlTransaction)  # a standby, after a failover
    def _unavailable(exc: Exception) -> Response:
        log.warning("event=web.db_unavailable error=%r", str(exc)[:200])
        return Problem(503, "database unavailable", "try again shortly").response()

    @app.errorhandler(Exception)
    def _internal(exc: Exception) -> Response:
        log.exception("event=web.internal_error")
        return Problem(500, "internal error", "the error was logged").response()
