"""Template placeholders in step params: ``{{ data.x }}``, ``{{ config.x }}``,
``{{ outputs.<block>.<path> }}``, ``{{ instance_id }}``, ``{{ runtime.attempt }}``, with
a fallback ``{{ data.a | 'default' }}``.

A string that is exactly one placeholder keeps the value's type; placeholders inside a
longer string are rendered as text (JSON for objects and arrays). An unknown root, or a
missing path without a fallback, raises TemplateError naming the placeholder.
"""

from __future__ import annotations

import json
import re
from typing import Any

ROOTS = ("data", "config", "outputs", "instance_id", "runtime")

PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.S)
EXPRESSION = re.compile(
    r"^\s*(?P<root>[A-Za-z_][A-Za-z0-9_]*)"
    r"(?P<path>(?:\.[A-Za-z0-9_\-]+)*)"
    r"\s*(?:\|\s*'(?P<fallback>[^']*)')?\s*$"
)

_MISSING = object()


class TemplateError(ValueError):
    pass


def check(text: str) -> list[str]:
    """Problems with the placeholders in one string (empty when it parses)."""
    problems = []
    rest = PLACEHOLDER.sub("", text)
    if "{{" in rest:
        problems.append("unclosed '{{'")
    for m in PLACEHOLDER.finditer(text):
        expr = EXPRESSION.match(m.group(1))
        if not expr:
            problems.append(f"cannot parse {m.group(0)!r}")
        elif expr.group("root") not in ROOTS:
            problems.append(
                f"unknown root {expr.group('root')!r} in {m.group(0)!r} "
                f"(use one of {', '.join(ROOTS)})"
            )
    return problems


def _lookup(scope: dict, root: str, path: str) -> Any:
    value: Any = scope.get(root, _MISSING)
    for segment in filter(None, path.split(".")):
        if isinstance(value, dict) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            return _MISSING
    return value


def _evaluate(placeholder: str, inner: str, scope: dict) -> Any:
    m = EXPRESSION.match(inner)
    if not m:
        raise TemplateError(f"cannot parse template {placeholder!r}")
    root, path, fallback = m.group("root"), m.group("path"), m.group("fallback")
    if root not in ROOTS:
        raise TemplateError(
            f"unknown root {root!r} in template {placeholder!r} (use one of {', '.join(ROOTS)})"
        )
    value = _lookup(scope, root, path)
    if value is _MISSING:
        if fallback is not None:
            return fallback
        raise TemplateError(f"template {placeholder!r}: {root}{path} not found")
    return value


def _render_string(text: str, scope: dict) -> Any:
    whole = PLACEHOLDER.fullmatch(text.strip()) if text.strip().startswith("{{") else None
    if whole and text.strip().count("{{") == 1:
        return _evaluate(whole.group(0), whole.group(1), scope)
    if "{{" not in text:
        return text

    def sub(m: re.Match) -> str:
        value = _evaluate(m.group(0), m.group(1), scope)
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))

    rendered = PLACEHOLDER.sub(sub, text)
    if "{{" in PLACEHOLDER.sub("", text):
        raise TemplateError(f"unclosed '{{{{' in {text!r}")
    return rendered


def render(value: Any, scope: dict) -> Any:
    """Resolve every placeholder in a JSON value (dicts and lists walked recursively)."""
    if isinstance(value, str):
        return _render_string(value, scope)
    if isinstance(value, dict):
        return {k: render(v, scope) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, scope) for v in value]
    return value
