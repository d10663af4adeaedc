"""The checks of a sequence definition that need Python: the syntax of every expression
(``when``, ``retry.retry_if``, a loop's ``condition`` and ``break_on``, a for_each's
``collection``, a route's ``condition``, a verifier's ``applied_if`` and
``not_applied_if``), in the expression language the runner parses (orch8_py.expression),
with the names in scope where each one stands; and that ``input_schema`` and
``output_schema`` are JSON Schemas (orch8_py.schemas). orch8.validate_sequence checks
everything else; sqlapi.sequences runs both, so nothing stored fails to parse later.

The blocks come from the database's walk (orch8.definition_blocks: every block with its
JSON path and the variables bound around it), so the tree's shape is read from one
place."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import expression, rules
from .schemas import schema_problem

VERIFY_EXPRESSIONS = ("applied_if", "not_applied_if")


def _check(text: Any, path: str, names: tuple[str, ...], out: list[dict[str, str]]) -> None:
    if not isinstance(text, str) or not text:
        return  # the SQL validator names a missing or non-string one
    try:
        expression.compile(text, names)
    except expression.ExpressionError as exc:
        out.append({"path": path, "message": str(exc)})


def block_problems(
    block: dict[str, Any], at: str, scope_vars: Iterable[str]
) -> list[dict[str, str]]:
    """The expressions and schemas of one block that do not parse."""
    names = tuple(dict.fromkeys((*expression.ROOTS, *scope_vars)))
    out: list[dict[str, str]] = []
    kind = block.get("type")
    if kind == "step":
        _check(block.get("when"), f"{at}.when", names, out)
        for call, where in ((block, at), (block.get("compensation"), f"{at}.compensation")):
            retry = call.get("retry") if isinstance(call, dict) else None
            if isinstance(retry, dict):
                _check(retry.get("retry_if"), f"{where}.retry.retry_if", (*names, "error"), out)
        if "output_schema" in block and isinstance(block["output_schema"], dict):
            problem = schema_problem(block["output_schema"])
            if problem:
                out.append({"path": f"{at}.output_schema", "message": problem})
        verify = block.get("verify")
        if isinstance(verify, dict):
            for name in VERIFY_EXPRESSIONS:
                _check(verify.get(name), f"{at}.verify.{name}", rules.VERIFY_EXPRESSION_ROOTS, out)
    elif kind == "loop":
        for name in ("condition", "break_on"):
            _check(block.get(name), f"{at}.{name}", (*names, "iteration"), out)
    elif kind == "for_each":
        _check(block.get("collection"), f"{at}.collection", names, out)
    elif kind == "router" and isinstance(block.get("routes"), list):
        for i, route in enumerate(block["routes"]):
            if isinstance(route, dict):
                _check(route.get("condition"), f"{at}.routes[{i}].condition", names, out)
    return out


def definition_problems(definition: Any, blocks: Iterable[dict[str, Any]]) -> list[dict[str, str]]:
    """One {path, message} per expression that does not parse and per schema that is not
    one; ``blocks`` are the rows of orch8.definition_blocks(definition)."""
    out: list[dict[str, str]] = []
    if isinstance(definition, dict) and isinstance(definition.get("input_schema"), dict):
        problem = schema_problem(definition["input_schema"])
        if problem:
            out.append({"path": "$.input_schema", "message": problem})
    for row in blocks:
        if isinstance(row.get("definition"), dict):
            out.extend(block_problems(row["definition"], row["json_path"], row["scope_vars"]))
    return out
