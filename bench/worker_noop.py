"""The handler bench/workers.py's worker processes serve: it does nothing, so the bench
measures the engine and the protocol, not a provider."""

from __future__ import annotations

from typing import Any

from orch8_py.worker import Task, handler


@handler("bench.noop")
def noop(task: Task) -> dict[str, Any]:
    return {"receipt_id": str(task.effect_id)}
