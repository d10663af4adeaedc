"""What a step handler receives (``StepContext``) and how it reports failure
(``StepError``, ``NotApplied``). Kept apart from the handler registry so that the
expression language and the builtins can both use them without importing each other.

A handler is a callable ``(params: dict, ctx: StepContext) -> JSON-able output``. It
raises ``StepError`` for a failure the retry policy should see (``retryable`` and an
optional ``code`` matched against the step's ``non_retryable_codes``), and
``NotApplied`` when it can prove nothing left the process (the receipt is then
abandoned with that evidence instead of marked unknown). Any other exception is a
retryable StepError with the exception's text.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


class StepError(Exception):
    """A handler failure. ``code`` is matched against retry.non_retryable_codes."""

    def __init__(self, message: str, *, code: str | None = None, retryable: bool = True):
        super().__init__(message)
        self.code = code
        self.retryable = retryable


class NotApplied(StepError):
    """The handler can prove the effect was not applied (nothing left the process)."""

    def __init__(
        self, message: str, evidence: dict[str, Any] | None = None, *, code: str | None = None
    ):
        super().__init__(message, code=code, retryable=True)
        self.evidence: dict[str, Any] = {"error": message, **(evidence or {})}


class InstanceState(Protocol):
    """ctx.state: the instance's key-value store (orch8_py.instance_state)."""

    def get(self, key: str, default: Any = None) -> Any: ...
    def set(self, key: str, value: Any) -> None: ...
    def delete(self, key: str) -> bool: ...
    def merge(self, key: str, patch: dict[str, Any]) -> dict[str, Any]: ...


@dataclass
class StepContext:
    tenant_id: str
    instance_id: uuid.UUID
    block_id: str
    attempt: int
    handler: str
    effect_id: uuid.UUID | None  # set for side-effecting handlers: the idempotency key
    context: dict[str, Any]  # {"data": ..., "config": ..., "runtime": ...}
    outputs: dict[str, Any]  # block id -> latest output
    timeout: float  # seconds the handler has
    state: InstanceState | None = None  # per-instance key-value store, when the runner has one
    extra: dict[str, Any] = field(default_factory=dict)


Handler = Callable[[dict[str, Any], StepContext], Any]
