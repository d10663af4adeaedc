"""What a node of the execution tree sees (docs/ARCHITECTURE.md, "Outputs and
variables"): the outputs of the other blocks as seen from its path, the variables bound
around it, and the expression scope its conditions are evaluated in.

``outputs.<id>`` means the output of block *id* on the node sharing the longest path with
the node evaluating, among equals the latest iteration: inside ``items[3]`` it is that
item's, after the loop the last one's. The path grammar is the database's (migration
0012: ids hold A-Z a-z 0-9 _ -, markers # [ ] . join them)."""

from __future__ import annotations

import re
from typing import Any

from . import expression

_ID = re.compile(r"[A-Za-z0-9_-]*")
_NUMBERS = re.compile(r"[#\[](\d+)")
COMPENSATION = ".undo/"  # a compensation's path: saga.undo/step (not the step's output)


def block_id_of(path: str) -> str | None:
    """The block id a node path names: its last segment up to the first marker."""
    match = _ID.match(path.rsplit("/", 1)[-1])
    return (match.group(0) if match else "") or None


def outputs_seen_from(progress: dict[str, Any], path: str) -> dict[str, Any]:
    """{block id: output} as the node at ``path`` sees them, from an instance's progress
    ({path: {attempt, sentinel, output}}, orch8.instance_progress)."""
    here = path.split("/") if path else []
    best: dict[str, tuple[tuple[int, tuple[int, ...]], Any]] = {}
    for other, row in progress.items():
        block_id = block_id_of(other)
        if block_id is None or COMPENSATION in other:
            continue
        shared = 0
        for a, b in zip(here, other.split("/"), strict=False):
            if a != b:
                break
            shared += 1
        rank = (shared, tuple(int(n) for n in _NUMBERS.findall(other)))
        if block_id not in best or rank > best[block_id][0]:
            best[block_id] = (rank, (row or {}).get("output"))
    return {k: v for k, (_rank, v) in best.items()}


def expression_scope(
    context: dict[str, Any], outputs: dict[str, Any], variables: dict[str, Any], **runtime: Any
) -> dict[str, Any]:
    """What a condition sees: data, config, runtime (with ``runtime``'s entries), outputs,
    and the variables bound around the node (item, index, iteration, error...)."""
    return {
        "data": context.get("data") or {},
        "config": context.get("config") or {},
        "runtime": {**(context.get("runtime") or {}), **runtime},
        "outputs": outputs,
        **variables,
    }


def roots(variables: dict[str, Any] | tuple[str, ...], *extra: str) -> tuple[str, ...]:
    """The names an expression may start with: the language's, the variables', ``extra``
    (each once)."""
    return tuple(dict.fromkeys((*expression.ROOTS, *variables, *extra)))


def evaluate(text: str, scope: dict[str, Any], names: tuple[str, ...]) -> Any:
    """Evaluate ``text`` over ``scope`` with the roots ``names`` (ExpressionError)."""
    return expression.evaluate(text, scope, names)
