"""How a route of /api/v1 declares itself, and the OpenAPI document made from those
declarations.

A route is a plain Flask view under ``@operation(...)``; its parameters ``path``,
``query`` and ``json`` are annotated with their pydantic models (web/api/models/), and
``operation`` names its roles, its success answers (a model per status) and the problem
statuses it can answer. From that one declaration:

- spectree 3 validates the query string and the JSON body and serializes the answer
  through its model; web.auth.require checks the key first; the path is validated here
  (spectree has no path model);
- every refusal is a problem document (web/problems.py): a model's ValidationError
  becomes 422 with ``problems`` in spectree's ``before`` hook;
- the OpenAPI 3.1 document is spectree's, completed by ``complete``: path parameters
  from the path models, problem answers as ``application/problem+json``, optional
  bodies not ``required``, the X-Tenant-Id header, links between operations, and this
  document's own route. It is served at GET /api/v1/openapi.json (no key needed).
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import json
import logging
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from flask import Request, request
from pydantic import BaseModel, ValidationError
from spectree import Response, SecurityScheme, SpecTree
from spectree.model_adapter.pydantic_adapter import PydanticModelAdapter
from spectree.models import InType, SecureType, SecuritySchemeData

from orch8_py import rules

from ..auth import require
from ..problems import MEDIA_TYPE, Problem, ProblemDocument
from .bodies import has_body, require_object
from .invalid import invalid, problems_of
from .models.base import NoQuery, Path

log = logging.getLogger("orch8.web.api")

PREFIX = "/api/v1"
View = Callable[..., Any]
Link = tuple[str, Mapping[str, str]]  # (operationId, {parameter: runtime expression})

ERRORS: dict[int, str] = {
    400: "Malformed request: the body is missing (where one is required), not UTF-8 or not JSON.",
    401: "No API key, or an unknown or revoked one.",
    403: "The key's role may not do this (workers: only the /workers routes and GET "
    "/instances/{instance_id}; auditors: only GET).",
    404: "No such resource in the caller's tenant (another tenant's resources are "
    "invisible), or X-Tenant-Id names another tenant and the key is not an admin's.",
    409: "The engine refused the move: an illegal state change (current_state, "
    "allowed_states), a receipt to resolve first (effect_id), reload before resolving, or "
    "(workers) a task this worker no longer holds (current_state, claim_epoch).",
    413: "The body is over 1 MiB.",
    415: "The body is not sent as application/json.",
    422: "Invalid input: every problem with its field path in `problems`, or the engine's "
    "refusal of one value (`field`).",
    503: "The database is unavailable; try again shortly.",
}
READ = (401, 403, 404, 422, 503)
WRITE = (400, 401, 403, 404, 409, 413, 415, 422, 503)

TENANT_HEADER: dict[str, Any] = {
    "name": "X-Tenant-Id",
    "in": "header",
    "required": False,
    "description": "admin keys: act in this tenant; any other key gets 404 unless it names "
    "the key's own tenant. Empty: the key's own tenant. A tenant id is "
    + rules.PATTERNS["identifier"]["rule"],
    "schema": {"type": "string", "pattern": "^$|" + rules.PATTERNS["identifier"]["pattern"]},
}


def dumps(value: Any) -> str:
    """JSON text of a dumped model: UUIDs as strings, times as RFC 3339 UTC. The C encoder
    walks stored documents as deep as they may be (pydantic's JSON serializer stops
    sooner)."""
    return json.dumps(value, default=_scalar, ensure_ascii=False, separators=(",", ":"))


def _scalar(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class _Adapter(PydanticModelAdapter):
    """Answers are dumped by the model (its fields, validated), then encoded by ``dumps``."""

    def dump_json(self, value: Any) -> bytes:
        if isinstance(value, BaseModel):
            return dumps(value.model_dump(mode="python")).encode("utf-8")
        return super().dump_json(value)


def _name(model: Any) -> str:
    """Component names without spectree's hash suffix (ProblemDocument is "Problem")."""
    config = getattr(model, "model_config", {})
    return str(config.get("title") or model.__name__)


spec = SpecTree(
    "flask",
    title="orch8 operator API",
    version="1",
    description="Durable workflows with at-most-once side effects. Every route but this "
    "document needs an API key (Authorization: Bearer <key>, or X-Api-Key). Errors are "
    "RFC 9457 problem documents (application/problem+json). See docs/API.md.",
    mode="strict",  # only the routes declared with @operation
    page_templates={},  # no UI pages; the document is served by web/api/__init__.py
    annotations=False,  # operation() hands the models to the view
    naming_strategy=_name,
    nested_naming_strategy=lambda _parent, child: child,
    validation_error_model=ProblemDocument,
    model_adapter=typing.cast(Any, _Adapter()),  # spectree types its adapters loosely
    security_schemes=[
        SecurityScheme(
            name="bearer",
            data=SecuritySchemeData(
                type=SecureType.HTTP, scheme="bearer", description="an orch8 API key"
            ),
        ),
        SecurityScheme(
            name="apiKeyHeader",
            data=SecuritySchemeData(
                type=SecureType.API_KEY, name="X-Api-Key", field_in=InType.HEADER
            ),
        ),
    ],
    security=[{"bearer": []}, {"apiKeyHeader": []}],
)


@dataclass(frozen=True)
class Declared:
    """What spectree cannot say of an operation, for ``complete``."""

    path: type[Path] | None
    body_required: bool
    links: Mapping[int, Mapping[str, Link]] = field(default_factory=dict)


DECLARED: dict[str, Declared] = {}


def _part(err: ValidationError, json_model: type[BaseModel] | None) -> str:
    return "body" if json_model is not None and err.title == json_model.__name__ else "query"


def _before_hook(json_model: type[BaseModel] | None) -> Callable[..., None]:
    def before(req: Request, resp: Any, err: Exception | None, *_: Any) -> None:
        """spectree calls this after validating the query and the body: a refusal is
        raised as a 422 problem (spectree's own answer is not used)."""
        if isinstance(err, ValidationError):
            part = _part(err, json_model)
            repeated = {k for k in req.args if len(req.args.getlist(k)) > 1}
            raise invalid(part, problems_of(err, part, repeated))

    return before


def _after(req: Request, resp: Any, err: Exception | None, *_: Any) -> None:
    if err is not None:
        log.error("event=web.answer_undeclared path=%s error=%r", req.path, str(err)[:500])
        raise Problem(500, "internal error", "the answer did not match its declaration")


def operation(
    *,
    roles: Iterable[str],
    ok: Mapping[int, type[BaseModel]],
    errors: Iterable[int],
    tag: str,
    operation_id: str,
    links: Mapping[int, Mapping[str, Link]] | None = None,
) -> Callable[[View], View]:
    """Declare a route: who may call it (web.auth.require), its models (the view's
    ``path``, ``query`` and ``json`` annotations; no ``query`` means none is accepted),
    its answers: ``ok`` {status: model} and the problem statuses ``errors``."""

    def decorate(view: View) -> View:
        hints = typing.get_type_hints(view)
        path_model: type[Path] | None = hints.get("path")
        query_model: type[BaseModel] = hints.get("query", NoQuery)
        json_model: type[BaseModel] | None = hints.get("json")
        # a body is required when a field is, or when the model says so (one of several)
        body_required = json_model is not None and (
            getattr(json_model, "body_required", False)
            or any(f.is_required() for f in json_model.model_fields.values())
        )
        answers: dict[str, Any] = {f"HTTP_{code}": model for code, model in ok.items()}
        answers |= {f"HTTP_{code}": (ProblemDocument, ERRORS[code]) for code in errors}

        @functools.wraps(view)
        def with_models(**kwargs: Any) -> Any:
            context = request.context  # type: ignore[attr-defined]  # set by spectree
            if "query" in hints:
                kwargs["query"] = context.query
            if json_model is not None:
                # spectree leaves a form-typed empty body unread
                kwargs["json"] = context.json if context.json is not None else json_model()
            return view(**kwargs)

        validated = spec.validate(
            query=query_model,
            json=json_model,
            resp=Response(**answers),
            tags=[tag],
            operation_id=operation_id,
            before=_before_hook(json_model),
            after=_after,
        )(with_models)

        @functools.wraps(validated)
        def endpoint(**url_values: str) -> Any:
            if json_model is not None:
                if body_required and not has_body(request):
                    raise Problem(400, "bad request", "send a JSON object as the request body")
                require_object()
            kwargs: dict[str, Any] = {}
            if path_model is not None:
                try:
                    kwargs["path"] = path_model.model_validate(url_values)
                except ValidationError as err:
                    raise invalid("path", problems_of(err, "path")) from None
            return validated(**kwargs)

        DECLARED[operation_id] = Declared(path_model, body_required, links or {})
        wrapped: View = require(*roles)(endpoint)
        return wrapped

    return decorate


# --- the document ---------------------------------------------------------------------------


def _path_parameter(parameter: dict[str, Any], model: type[Path] | None) -> dict[str, Any]:
    if model is None:
        return parameter
    schema = dict(model.model_json_schema()["properties"][parameter["name"]])
    schema.pop("title", None)
    described = schema.get("description") or parameter.get("description") or ""
    return {**parameter, "schema": schema, "description": described}


def complete(doc: dict[str, Any]) -> dict[str, Any]:
    """Spectree's document, completed with what only the declarations know (see the
    module's docstring). ``doc`` is changed in place and returned."""
    for item in doc["paths"].values():
        for op in item.values():
            declared = DECLARED[op["operationId"]]
            if not op.get("description"):
                op.pop("description", None)
            op["parameters"] = [
                _path_parameter(p, declared.path) if p["in"] == "path" else p
                for p in op.get("parameters", [])
            ] + [TENANT_HEADER]
            for p in op["parameters"]:
                if not p.get("description"):
                    p.pop("description", None)
            if "requestBody" in op:
                # spectree marks every body required; a model without required fields is not
                op["requestBody"]["required"] = declared.body_required
            for code, answer in op["responses"].items():
                content = answer.get("content", {})
                if code[0] in "45" and "application/json" in content:
                    answer["content"] = {MEDIA_TYPE: content["application/json"]}
                for name, (target, parameters) in declared.links.get(int(code), {}).items():
                    answer.setdefault("links", {})[name] = {
                        "operationId": target,
                        "parameters": dict(parameters),
                    }
    doc["paths"][PREFIX + "/openapi.json"] = {
        "get": {
            "summary": "This document (OpenAPI 3.1)",
            "operationId": "getOpenApiDocument",
            "tags": ["meta"],
            "security": [],
            "responses": {
                "200": {
                    "description": "The OpenAPI document of /api/v1",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            },
        }
    }
    return doc


def generate() -> dict[str, Any]:
    """The document of the current app's routes (needs an app context)."""
    return complete(copy.deepcopy(spec.spec))


@functools.cache
def document() -> dict[str, Any]:
    """generate(), once per process (the routes do not change)."""
    return generate()
