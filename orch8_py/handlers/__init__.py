"""Step handlers: the registry, what a handler receives, and how it reports failure.

A handler is a callable ``(params: dict, ctx: StepContext) -> JSON-able output``. It
raises ``StepError`` for a failure the retry policy should see (``retryable`` and an
optional ``code`` matched against the step's ``non_retryable_codes``), and
``NotApplied`` when it can prove nothing left the process (the receipt is then
abandoned with that evidence instead of marked unknown). Any other exception is a
retryable StepError with the exception's text.

Register your own with the decorator::

    from orch8_py.handlers import handler

    @handler("payments.charge")
    def charge(params, ctx):
        # ctx.effect_id is the idempotency key to hand to the provider
        ...
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class StepError(Exception):
    """A handler failure. ``code`` is matched against retry.non_retryable_codes."""

    def __init__(self, message: str, *, code: str | None = None, retryable: bool = True):
        super().__init__(message)
        self.code = code
        self.retryable = retryable


class NotApplied(StepError):
    """The handler can prove the effect was not applied (nothing left the process)."""

    def __init__(self, message: str, evidence: dict | None = None, *, code: str | None = None):
        super().__init__(message, code=code, retryable=True)
        self.evidence = {"error": message, **(evidence or {})}


@dataclass
class StepContext:
    tenant_id: str
    instance_id: uuid.UUID
    block_id: str
    attempt: int
    handler: str
    effect_id: uuid.UUID | None  # set for side-effecting handlers: the idempotency key
    context: dict  # {"data": ..., "config": ..., "runtime": ...}
    outputs: dict  # block id -> latest output
    timeout: float  # seconds the handler has
    state: Any = None  # per-instance key-value store (get/set), when the runner offers one
    extra: dict = field(default_factory=dict)


Handler = Callable[[dict, StepContext], Any]

_REGISTRY: dict[str, Handler] = {}


def handler(name: str) -> Callable[[Handler], Handler]:
    """Register a handler under ``name`` (a non-builtin name is treated as side-effecting)."""
    if not name or not isinstance(name, str):
        raise ValueError("a handler needs a non-empty name")

    def register(fn: Handler) -> Handler:
        _REGISTRY[name] = fn
        return fn

    return register


def get(name: str) -> Handler | None:
    _load_builtins()
    return _REGISTRY.get(name)


def names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


_loaded = threading.Event()
_loading = threading.Lock()


def _load_builtins() -> None:
    # Runner threads ask at once: the first imports, the others wait for it to finish.
    if _loaded.is_set():
        return
    with _loading:
        if not _loaded.is_set():
            from . import builtin  # noqa: F401  (registers the builtins)

            _loaded.set()
