"""An instance's execution tree (orch8.execution_tree rows) nested for drawing: the CLI's
`orch8 instances show` and the console's instance page draw the same structure."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TreeNode:
    row: dict[str, Any]
    children: list[TreeNode] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The node's own part of its path: an id, a branch (#1), an iteration ([3]), a
        part (.try, .route0, .undo, .on_failure[0])."""
        path, parent = str(self.row["path"]), self.row["parent_path"]
        if not parent:
            return path or "(root)"
        return path[len(parent) :].lstrip("/") if path.startswith(parent) else path

    def walk(self, depth: int = 0) -> Iterator[tuple[int, TreeNode]]:
        yield depth, self
        for child in self.children:
            yield from child.walk(depth + 1)


def nest(rows: list[dict[str, Any]]) -> list[TreeNode]:
    """The top-level nodes (the root's children, then on_failure / on_cancel), each with
    its children in the order they started; the root list itself is left out."""
    by_path = {r["path"]: TreeNode(r) for r in rows}
    top: list[TreeNode] = []
    for r in rows:  # rows come in the order nodes started
        node = by_path[r["path"]]
        if r["path"] == "":
            continue
        parent = by_path.get(r["parent_path"] or "")
        if parent is None or r["parent_path"] == "":
            top.append(node)
        else:
            parent.children.append(node)
    return top


def as_json(nodes: list[TreeNode]) -> list[dict[str, Any]]:
    """The nested tree as plain JSON (each node's row and its ``children``)."""
    return [{**n.row, "children": as_json(n.children)} for n in nodes]
