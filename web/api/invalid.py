"""A request a model refused, as a 422 problem: every problem at once, each with its
field path (``name``, ``events[1]``, ``data.items[0].sku``) and a message that states the
rule (the pattern's rule from rules.py, not the regular expression)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from ..problems import Problem
from .fields import PATTERN_RULES

UNKNOWN = {"body": "unknown field", "query": "unknown query parameter", "path": "unknown"}


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "$"


def _message(error: ErrorDetails, where: str) -> str:
    kind = error["type"]
    ctx: dict[str, Any] = dict(error.get("ctx") or {})
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return UNKNOWN[where]
    if kind == "string_pattern_mismatch" and ctx.get("pattern") in PATTERN_RULES:
        return PATTERN_RULES[ctx["pattern"]]
    return error["msg"]


def problems_of(
    err: ValidationError, where: str, repeated: Collection[str] = ()
) -> list[dict[str, str]]:
    """Each problem of ``err`` as {path, message}; a query parameter named in
    ``repeated`` was given more than once."""
    found: list[dict[str, str]] = []
    for error in err.errors():
        loc = tuple(error["loc"])
        path = _path(loc)
        ctx = error.get("ctx") or {}
        if error["type"] == "json_value":  # problems inside a JSON document, at their paths
            for inner in ctx["problems"]:
                found.append({"path": _join(path, inner["path"]), "message": inner["message"]})
            continue
        if where == "query" and loc and loc[0] in repeated:
            message = "given more than once"
        else:
            message = _message(error, where)
        found.append({"path": path, "message": message})
    unique: list[dict[str, str]] = []
    for problem in found:
        if problem not in unique:
            unique.append(problem)
    return unique


def _join(path: str, inner: str) -> str:
    if not inner:
        return path
    return f"{path}{inner}" if inner.startswith("[") else f"{path}.{inner}"


def invalid(where: str, problems: list[dict[str, str]]) -> Problem:
    """422 invalid input, naming the first problems in ``detail`` too."""
    shown = "; ".join(f"{p['path']}: {p['message']}" for p in problems[:3])
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
    return Problem(
        422, "invalid input", f"{count} in the {where}: {shown}{more}", problems=problems
    )
