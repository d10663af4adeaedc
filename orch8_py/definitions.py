"""The checks of a sequence definition that need Python: the syntax of a verifier's
expressions (``verify.applied_if``, ``verify.not_applied_if``), in the expression
language the runner parses (orch8_py.expression). orch8.validate_sequence checks
everything else; sqlapi.sequences runs both, so nothing stored fails to parse later."""

from __future__ import annotations

from typing import Any

from . import expression, rules

VERIFY_EXPRESSIONS = ("applied_if", "not_applied_if")


def expression_problems(definition: Any) -> list[dict[str, str]]:
    """One {path, message} per verifier expression that does not parse."""
    blocks = definition.get("blocks") if isinstance(definition, dict) else None
    problems: list[dict[str, str]] = []
    for i, block in enumerate(blocks if isinstance(blocks, list) else []):
        verify = block.get("verify") if isinstance(block, dict) else None
        if not isinstance(verify, dict):
            continue
        for name in VERIFY_EXPRESSIONS:
            text = verify.get(name)
            if not isinstance(text, str) or not text:
                continue  # the SQL validator names a missing or non-string one
            try:
                expression.compile(text, rules.VERIFY_EXPRESSION_ROOTS)
            except expression.ExpressionError as exc:
                problems.append({"path": f"$.blocks[{i}].verify.{name}", "message": str(exc)})
    return problems
