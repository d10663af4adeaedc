"""Request checking for the REST API: JSON bodies against a small dict schema, query
parameters, path ids, opaque cursors, and rows made JSON-safe.

Every problem is listed with its field path before anything reaches the database, so a
request is refused whole (422 with ``problems``) or passed on whole. What is checked here
is the *shape* of a request (types, sizes PostgreSQL cannot store, unknown fields); the
rules of the engine stay in the SQL functions, which answer with their own errors.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from flask import Response, request

from ..problems import Problem

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_JSON_DEPTH = 512


# --- strings PostgreSQL can store --------------------------------------------------------


def string_problem(value: str) -> str | None:
    """Why PostgreSQL cannot store ``value`` as text (or in jsonb), or None."""
    if "\x00" in value:
        return "must not contain NUL characters (\\u0000)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must not contain unpaired surrogates"
    return None


def json_problems(value: Any, path: str) -> list[dict[str, str]]:
    """Problems of a JSON value PostgreSQL's jsonb would refuse: NUL characters or unpaired
    surrogates in strings or keys, nesting deeper than MAX_JSON_DEPTH. Iterative, so a
    deep document cannot exhaust the stack."""
    found: list[dict[str, str]] = []
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack and len(found) < 50:
        item, where, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            found.append({"path": where, "message": f"nested deeper than {MAX_JSON_DEPTH}"})
            continue
        if isinstance(item, str):
            why = string_problem(item)
            if why:
                found.append({"path": where, "message": why})
        elif isinstance(item, dict):
            for key, child in item.items():
                why = string_problem(key)
                if why:
                    found.append({"path": where, "message": f"a key {why}"})
                    continue
                stack.append((child, f"{where}.{key}" if where else key, depth + 1))
        elif isinstance(item, list):
            for i, child in enumerate(item):
                stack.append((child, f"{where}[{i}]", depth + 1))
    return found


# --- JSON bodies -------------------------------------------------------------------------

_JSON_TYPES: dict[Any, str] = {
    str: "a string",
    int: "an integer",
    bool: "a boolean",
    dict: "an object",
    list: "an array",
    float: "a number",
}


@dataclass(frozen=True)
class Field:
    """One body field: its JSON type, whether it is required, and shape limits."""

    type: type
    required: bool = False
    nullable: bool = False  # null accepted, meaning "not given"
    enum: tuple[str, ...] | None = None  # for a string, or each item of a list
    min: int | None = None  # for an integer; for a list of enum names, its least length
    max: int | None = None
    min_bytes: int | None = None
    max_bytes: int | None = None


Schema = Mapping[str, "Field | tuple[type, bool]"]


def _field(spec: Field | tuple[type, bool]) -> Field:
    return spec if isinstance(spec, Field) else Field(spec[0], spec[1])


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def parse_json(raw: bytes) -> Any:
    """Strict JSON: UTF-8, no NaN/Infinity, no numbers that overflow a double. Raises a
    400 Problem when the text is not JSON."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Problem(400, "bad request", "the body is not UTF-8 text") from None
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise Problem(
            400,
            "bad request",
            f"malformed JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}",
        ) from None
    except RecursionError:
        raise Problem(400, "bad request", "malformed JSON: nested too deeply") from None
    except ValueError as exc:  # NaN, Infinity, 1e400, an integer of too many digits
        raise Problem(400, "bad request", f"malformed JSON: {exc}") from None


def check_fields(body: Mapping[str, Any], schema: Schema, prefix: str = "") -> list[dict]:
    """Every problem of ``body`` against ``schema``: unknown fields, missing required
    ones, wrong types, values out of range; each with its field path."""
    problems: list[dict[str, str]] = []

    def add(name: str, message: str) -> None:
        problems.append({"path": f"{prefix}{name}", "message": message})

    for name in body:
        if name not in schema:
            why = string_problem(name)
            add("?" if why else name, f"unknown field (its name {why})" if why else "unknown field")
    for name, raw_spec in schema.items():
        spec = _field(raw_spec)
        if name not in body or (body[name] is None and spec.nullable):
            if spec.required:
                add(name, "is required")
            continue
        value = body[name]
        ok = isinstance(value, spec.type) and not (spec.type is int and isinstance(value, bool))
        if not ok:
            kind = _JSON_TYPES.get(spec.type, spec.type.__name__)
            add(name, f"must be {kind}{' or null' if spec.nullable else ''}")
            continue
        if isinstance(value, str):
            why = string_problem(value)
            if why:
                add(name, why)
                continue
            size = len(value.encode("utf-8"))
            if spec.min_bytes is not None and size < spec.min_bytes:
                add(name, f"must be at least {spec.min_bytes} byte(s)")
            if spec.max_bytes is not None and size > spec.max_bytes:
                add(name, f"must be at most {spec.max_bytes} bytes")
            if spec.enum is not None and value not in spec.enum:
                add(name, f"must be one of {', '.join(spec.enum)}")
        elif isinstance(value, int) and not isinstance(value, bool):
            if spec.min is not None and value < spec.min:
                add(name, f"must be at least {spec.min}")
            if spec.max is not None and value > spec.max:
                add(name, f"must be at most {spec.max}")
        elif isinstance(value, dict | list):
            problems.extend(json_problems(value, f"{prefix}{name}"))
            if isinstance(value, list) and spec.enum is not None:  # a list of names
                choices = ", ".join(spec.enum)
                if spec.min is not None and len(value) < spec.min:
                    add(name, f"must name at least {spec.min} of {choices}")
                bad = [
                    i
                    for i, item in enumerate(value)
                    if item not in spec.enum
                    and not (isinstance(item, str) and string_problem(item))
                ]
                for i in bad[:50]:
                    add(f"{name}[{i}]", f"must be one of {choices}")
    return problems


def json_body(schema: Schema, *, optional: bool = False) -> dict[str, Any]:
    """The request's JSON object body, checked against ``schema``; ``None`` values of
    nullable fields are dropped. ``optional``: an empty body counts as ``{}``.

    400 for a missing or malformed body, 415 for a body that is not JSON, 413 (raised by
    Werkzeug) past MAX_CONTENT_LENGTH, 422 listing every problem otherwise."""
    raw = request.get_data(cache=True)
    if not raw.strip():
        if optional:
            return {}
        raise Problem(400, "bad request", "send a JSON object as the request body")
    mimetype = request.mimetype or ""
    if mimetype != "application/json" and not mimetype.endswith("+json"):
        raise Problem(
            415,
            "unsupported media type",
            "send the body as JSON with Content-Type: application/json",
        )
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise Problem(
            422,
            "invalid input",
            "the body must be a JSON object",
            problems=[{"path": "$", "message": "must be a JSON object"}],
        )
    problems = check_fields(body, schema)
    if problems:
        raise Problem(
            422, "invalid input", f"{len(problems)} problem(s) in the body", problems=problems
        )
    return {k: v for k, v in body.items() if not (v is None and _field(schema[k]).nullable)}


# --- query parameters --------------------------------------------------------------------

Parser = Callable[[str], Any]


def query(params: Mapping[str, Parser], defaults: Mapping[str, Any] | None = None) -> dict:
    """Parse the query string: each known parameter at most once, through its parser (a
    ValueError's message becomes the problem); unknown parameters are problems too."""
    out: dict[str, Any] = dict(defaults or {})
    problems: list[dict[str, str]] = []
    for name in request.args:
        values = request.args.getlist(name)
        label = name if not string_problem(name) else "?"
        if name not in params:
            problems.append({"path": label, "message": "unknown query parameter"})
            continue
        if len(values) > 1:
            problems.append({"path": name, "message": "given more than once"})
            continue
        why = string_problem(values[0])
        if why:
            problems.append({"path": name, "message": why})
            continue
        try:
            out[name] = params[name](values[0])
        except ValueError as exc:
            problems.append({"path": name, "message": str(exc)})
    if problems:
        raise Problem(
            422, "invalid input", f"{len(problems)} problem(s) in the query", problems=problems
        )
    return out


def one_of(*choices: str) -> Parser:
    def parse(value: str) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return value

    return parse


def text(max_chars: int = 200) -> Parser:
    def parse(value: str) -> str:
        if not value or len(value) > max_chars:
            raise ValueError(f"must be 1-{max_chars} characters")
        return value

    return parse


def int_range(low: int, high: int) -> Parser:
    def parse(value: str) -> int:
        if not re.fullmatch(r"[0-9]{1,12}", value):
            raise ValueError(f"must be an integer from {low} to {high}")
        number = int(value)
        if not low <= number <= high:
            raise ValueError(f"must be an integer from {low} to {high}")
        return number

    return parse


def timestamp(value: str) -> dt.datetime:
    """An ISO 8601 / RFC 3339 date-time; without an offset it is taken as UTC."""
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("must be an ISO 8601 date-time, e.g. 2030-01-31T12:00:00Z") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError:
        raise ValueError("is out of range") from None


_DURATION = re.compile(r"([0-9]{1,6})([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def duration(value: str) -> dt.timedelta:
    """'30s', '10m', '2h', '1d' (at most 999999 of a unit)."""
    m = _DURATION.fullmatch(value)
    if not m:
        raise ValueError("must be a number and a unit s, m, h or d, e.g. 10m")
    return dt.timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})


LIMIT = int_range(1, 200)


# --- path values -------------------------------------------------------------------------


def path_uuid(value: str, what: str = "id") -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise Problem(
            422,
            "invalid input",
            f"{what} must be a UUID",
            problems=[{"path": what, "message": "must be a UUID"}],
        ) from None


def path_int(value: str, what: str, high: int) -> int:
    if not re.fullmatch(r"[0-9]{1,19}", value) or not 1 <= int(value) <= high:
        raise Problem(
            422,
            "invalid input",
            f"{what} must be an integer from 1 to {high}",
            problems=[{"path": what, "message": f"must be an integer from 1 to {high}"}],
        )
    return int(value)


def path_text(value: str, what: str) -> str:
    why = string_problem(value)
    if why:
        raise Problem(
            422, "invalid input", f"{what} {why}", problems=[{"path": what, "message": why}]
        )
    return value


# --- cursors -----------------------------------------------------------------------------


def encode_cursor(*parts: Any) -> str:
    raw = dumps(list(parts))
    return base64.urlsafe_b64encode(raw.encode("utf-8")).decode("ascii").rstrip("=")


def cursor(*kinds: Callable[[Any], Any]) -> Parser:
    """A parser for an opaque cursor made by encode_cursor from values of ``kinds``."""

    def parse(value: str) -> tuple:
        try:
            raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
            parts = json.loads(raw.decode("utf-8"))
            if not isinstance(parts, list) or len(parts) != len(kinds):
                raise ValueError
            return tuple(kind(p) for kind, p in zip(kinds, parts, strict=True))
        except (ValueError, TypeError, binascii.Error, UnicodeDecodeError, OverflowError):
            raise ValueError("is not a cursor this API returned") from None

    return parse


def cursor_text(value: Any) -> str:
    if not isinstance(value, str) or string_problem(value):
        raise ValueError
    return value


def cursor_int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= INT64_MAX:
        raise ValueError
    return value


def cursor_time(value: Any) -> dt.datetime:
    if not isinstance(value, str):
        raise ValueError
    return timestamp(value.replace("Z", "+00:00"))


def cursor_uuid(value: Any) -> uuid.UUID:
    if not isinstance(value, str):
        raise ValueError
    return uuid.UUID(value)


# --- answers -----------------------------------------------------------------------------


def to_json(value: Any) -> Any:
    """A scalar from psycopg made JSON-safe: UUIDs as strings, times as RFC 3339 UTC,
    intervals as seconds, Decimals as numbers. Raises TypeError for anything else."""
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
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(value: Any) -> str:
    """JSON text of rows: scalars through to_json, at any depth (the C encoder walks
    stored documents as deep as MAX_JSON_DEPTH without Python recursion)."""
    return json.dumps(value, default=to_json, ensure_ascii=False, separators=(",", ":"))


def answer(value: Any, status: int = 200) -> Response:
    return Response(dumps(value) + "\n", status=status, mimetype="application/json")


def not_found(what: str) -> Problem:
    return Problem(404, "not found", f"{what} not found")
