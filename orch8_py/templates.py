"""Template placeholders in step params: ``{{ data.x }}``, ``{{ config.x }}``,
``{{ outputs.<block>.<path> }}``, ``{{ instance_id }}``, ``{{ runtime.attempt }}``, the
variables bound around the step (``{{ item.sku }}``, ``{{ index }}``, ``{{ iteration }}``,
``{{ error.message }}``), with a fallback ``{{ data.a | 'default' }}``.

The grammar is the database's (orch8.template_placeholder_pattern and
orch8.template_expression_pattern, through rules.py), so what the validator accepts is
exactly what renders. A string that is exactly one placeholder keeps the value's type;
placeholders inside a longer string are rendered as text (JSON for objects and arrays).
A missing path without a fallback raises TemplateError naming the placeholder.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from . import rules
from .scope import outputs_seen_from

PLACEHOLDER = re.compile(rules.TEMPLATE_PLACEHOLDER, re.DOTALL)


@dataclass(frozen=True)
class Grammar:
    """Which roots a placeholder may start with, and the expression pattern they make."""

    roots: tuple[str, ...]
    expression: re.Pattern[str]


PARAMS = Grammar(rules.TEMPLATE_ROOTS, re.compile(rules.TEMPLATE_EXPRESSION))  # step params
VERIFY = Grammar(rules.VERIFY_TEMPLATE_ROOTS, re.compile(rules.VERIFY_TEMPLATE_EXPRESSION))
WHITESPACE = " \t\r\n"  # what the validator trims around an expression (btrim)

_MISSING = object()


@functools.lru_cache(maxsize=256)
def params_grammar(variables: tuple[str, ...] = ()) -> Grammar:
    """The grammar of a step's params where ``variables`` are bound (for_each's item and
    index, a loop's iteration, a catch's error): the database's pattern with those roots
    added, as the validator checks it (orch8.template_expression_pattern)."""
    if not variables:
        return PARAMS
    names = (*rules.TEMPLATE_ROOTS, *variables)
    pattern = rules.TEMPLATE_EXPRESSION_SHAPE.replace(
        "(ROOTS)", "(" + "|".join(re.escape(n) for n in names) + ")", 1
    )
    return Grammar(names, re.compile(pattern))


class TemplateError(ValueError):
    pass


def _lookup(scope: dict[str, Any], root: str, path: str) -> Any:
    value: Any = scope.get(root, _MISSING)
    for segment in filter(None, path.split(".")):
        if isinstance(value, dict) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            return _MISSING
    return value


def _evaluate(placeholder: str, inner: str, scope: dict[str, Any], grammar: Grammar) -> Any:
    expr = inner.strip(WHITESPACE)
    m = grammar.expression.fullmatch(expr)
    if not m:  # only in a definition stored before the validator checked templates
        first = re.match(r"[A-Za-z_][A-Za-z0-9_]*", expr)
        if first and first.group(0) not in grammar.roots:
            raise TemplateError(
                f"unknown root {first.group(0)!r} in template {placeholder!r} "
                f"(use one of {', '.join(grammar.roots)})"
            )
        raise TemplateError(f"cannot parse template {placeholder!r}")
    value = _lookup(scope, m.group(1), m.group(2))
    root, path, fallback = m.group(1), m.group(2), m.group(3)
    if value is _MISSING:
        if fallback is not None:
            return fallback
        raise TemplateError(f"template {placeholder!r}: {root}{path} not found")
    return value


def _render_string(text: str, scope: dict[str, Any], grammar: Grammar) -> Any:
    matches = list(PLACEHOLDER.finditer(text))
    if "{{" in PLACEHOLDER.sub("", text):
        raise TemplateError(f"unclosed '{{{{' in {text!r}")
    if not matches:
        return text
    only = matches[0]
    if len(matches) == 1 and text.strip() == only.group(0):
        return _evaluate(only.group(0), only.group(1), scope, grammar)

    def sub(m: re.Match[str]) -> str:
        value = _evaluate(m.group(0), m.group(1), scope, grammar)
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))

    return PLACEHOLDER.sub(sub, text)


def params_scope(
    context: dict[str, Any],
    instance_id: Any,
    attempt: int,
    outputs: dict[str, Any],
    variables: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What {{ templates }} in a step's params see (rules.TEMPLATE_ROOTS, and the
    variables bound around the step)."""
    return {
        "data": context.get("data", {}),
        "config": context.get("config", {}),
        "outputs": outputs,
        "instance_id": str(instance_id),
        "runtime": {**context.get("runtime", {}), "attempt": attempt},
        **(variables or {}),
    }


def render_params(
    params: Any, scope: dict[str, Any], variables: dict[str, Any] | None = None
) -> Any:
    """Render a step's params (or a sub_sequence's input) with the grammar of the variables
    in scope. Raises TemplateError."""
    return render(params, scope, params_grammar(tuple(variables or ())))


def params_as_sent(
    step: dict[str, Any],
    context: dict[str, Any],
    progress: dict[str, Any],
    instance_id: Any,
    attempt: int,
    path: str | None = None,
    variables: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A step's params rendered again as the runner rendered them for ``attempt``, from the
    instance's context and progress (orch8.instance_progress), as seen from the step's
    node (its path and variables). Templates are deterministic; the verifier still checks
    the result against the receipt's request hash before relying on it. Raises
    TemplateError."""
    outputs = outputs_seen_from(progress, path if path is not None else str(step.get("id")))
    rendered = render_params(
        step.get("params") or {},
        params_scope(context, instance_id, attempt, outputs, variables),
        variables,
    )
    return rendered if isinstance(rendered, dict) else {}


def render(value: Any, scope: dict[str, Any], grammar: Grammar = PARAMS) -> Any:
    """Resolve every placeholder in a JSON value (dicts and lists walked recursively)."""
    if isinstance(value, str):
        return _render_string(value, scope, grammar)
    if isinstance(value, dict):
        return {k: render(v, scope, grammar) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, scope, grammar) for v in value]
    return value
