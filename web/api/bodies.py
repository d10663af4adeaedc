"""Request bodies before any model sees them: JSON only (415 otherwise), UTF-8 and strict
JSON (400 for malformed text, ``NaN``, ``Infinity``, numbers that overflow a double,
nesting past the parser's reach), a JSON object (422 otherwise). Werkzeug answers 413
past MAX_CONTENT_LENGTH while the body is read.

``StrictRequest`` is the app's request class: every ``get_json()`` (spectree's too) goes
through ``read_json``, whatever its ``force``/``silent`` arguments.
"""

from __future__ import annotations

import json
import math
from typing import Any

from flask import Request, request

from ..problems import Problem

_PARSED = "orch8.json_body"


def is_json_media_type(mimetype: str) -> bool:
    return mimetype == "application/json" or (
        mimetype.startswith("application/") and mimetype.endswith("+json")
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def parse_json(raw: bytes) -> Any:
    """Strict JSON: UTF-8, no NaN/Infinity, no numbers that overflow a double; a 400
    Problem for anything that is not JSON text."""
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


def has_body(req: Request) -> bool:
    return bool(req.get_data(cache=True).strip())


def read_json(req: Request) -> Any:
    """The request's JSON body (None when there is none), parsed once."""
    if _PARSED not in req.environ:
        value: Any = None
        if has_body(req):
            if not is_json_media_type(req.mimetype or ""):
                raise Problem(
                    415,
                    "unsupported media type",
                    "send the body as JSON with Content-Type: application/json",
                )
            value = parse_json(req.get_data(cache=True))
        req.environ[_PARSED] = value
    return req.environ[_PARSED]


def require_object() -> None:
    """A body, when there is one, must be a JSON object (before any model reads it:
    spectree would read ``[]``, ``null`` or ``false`` as ``{}``)."""
    if has_body(request) and not isinstance(read_json(request), dict):
        raise Problem(
            422,
            "invalid input",
            "the body must be a JSON object",
            problems=[{"path": "$", "message": "must be a JSON object"}],
        )


class StrictRequest(Request):
    """A request whose get_json() is read_json(): strict, cached, JSON media types only."""

    def get_json(self, force: bool = False, silent: bool = False, cache: bool = True) -> Any:
        return read_json(self)
