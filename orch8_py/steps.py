"""What a step handler receives (``StepContext``) and how it reports failure
(``StepError``, ``NotApplied``). Kept apart from the handler registry so that the
expression language and the builtins can both use them without importing each other.

A handler is a callable ``(params: dict, ctx: StepContext) -> JSON-able output``. It
raises ``StepError`` for a failure the retry policy should see (``retryable`` and an
optional ``code`` matched against the step's ``non_retryable_codes``), and
``NotApplied`` when it can prove nothing left the process (the receipt is then
abandoned with that evidence instead of marked unknown). Any other exception is a
retryable StepError with the exception's text. A handler may be ``async def``: the runner
awaits it on its event loop, holding no thread while it waits (orch8_py.handler_loop).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import time
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
    """The handler can prove the effect was not applied: nothing left the process, or
    (``reached=True``) the provider answered with a definitive refusal."""

    def __init__(
        self,
        message: str,
        evidence: dict[str, Any] | None = None,
        *,
        code: str | None = None,
        retryable: bool = True,
        reached: bool = False,
    ):
        super().__init__(message, code=code, retryable=retryable)
        self.evidence: dict[str, Any] = {"error": message, **(evidence or {})}
        self.reached = reached  # the provider saw the request and refused it


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
    block_id: str  # the node's path: a top-level block's id, else e.g. items[3]/charge
    attempt: int
    handler: str
    effect_id: uuid.UUID | None  # set for side-effecting handlers: the receipt's id
    context: dict[str, Any]  # {"data": ..., "config": ..., "runtime": ...}
    outputs: dict[str, Any]  # block id -> its output as this node sees it (orch8_py.scope)
    timeout: float  # seconds the handler has
    state: InstanceState | None = None  # per-instance key-value store, when the runner has one
    extra: dict[str, Any] = field(default_factory=dict)
    # the variables bound around the step: a for_each's item and index, a loop's
    # iteration, a catch's error ({} at the top level)
    vars: dict[str, Any] = field(default_factory=dict)
    # The key the receipt records, to send as the provider's idempotency key: the step's
    # idempotency_key param, else one key for every attempt when the step declares
    # provider_idempotency, else the effect id. None for pure handlers.
    idempotency_key: str | None = None
    # When the handler's time is up, on the time.monotonic() clock. Left None, it is set
    # from ``timeout`` when the context is made: the runner makes it just before it starts
    # waiting ``timeout`` seconds, so the time a handler spends queued for a thread counts.
    # Stays None when ``timeout`` is 0 (no limit).
    deadline: float | None = None

    def __post_init__(self) -> None:
        if self.deadline is None and self.timeout and self.timeout > 0:
            self.deadline = time.monotonic() + float(self.timeout)

    def remaining(self) -> float | None:
        """Seconds left before the step's deadline (0.0 once it has passed), or None when
        the step has no time limit."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())


Handler = Callable[[dict[str, Any], StepContext], Any]


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` makes a coroutine: an ``async def``, a partial of one, or an
    object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def call_user(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on this thread; an ``async def`` is run to its end on a loop of its own.
    For the paths that hold a thread per call anyway (a verifier, a replay, an output
    deriver, an external worker's handler), so that async code registered there runs
    instead of handing back a coroutine nobody awaits."""
    if is_async(fn):
        return asyncio.run(fn(*args))
    return fn(*args)


# --- verifiers: settling an unknown receipt -----------------------------------------------


@dataclass(frozen=True)
class EffectReceipt:
    """The receipt a verifier settles, or an output is derived for (the ledger's row)."""

    id: uuid.UUID
    tenant_id: str
    instance_id: uuid.UUID
    block_id: str
    attempt: int
    handler: str
    state: str
    idempotency_key: str | None
    provider_receipt_id: str | None
    evidence: dict[str, Any]

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> EffectReceipt:
        return cls(
            id=uuid.UUID(str(row["id"])),
            tenant_id=row["tenant_id"],
            instance_id=uuid.UUID(str(row["instance_id"])),
            block_id=row["block_id"],
            attempt=row["attempt"],
            handler=row["handler"],
            state=row["state"],
            idempotency_key=row.get("idempotency_key"),
            provider_receipt_id=row.get("provider_receipt_id"),
            evidence=row.get("evidence") or {},
        )


@dataclass(frozen=True)
class Applied:
    """A verifier's verdict: the effect happened. ``output`` is what the step would have
    returned (the workflow continues with it; None: derived from the evidence by the
    handler's output_from_evidence); ``provider_receipt_id`` the provider's id."""

    evidence: dict[str, Any]
    provider_receipt_id: str | None = None
    output: Any = None


@dataclass(frozen=True)
class Inconclusive:
    """A verifier's verdict: it could not tell (the next try follows the schedule)."""

    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


Verdict = Applied | NotApplied | Inconclusive
# verifier(params as sent, the receipt, the step's context) -> Applied | NotApplied | Inconclusive
Verifier = Callable[[dict[str, Any], EffectReceipt, StepContext], Verdict]
# output_from_evidence(evidence, the receipt, the step's params as sent) -> output or None
OutputDeriver = Callable[[dict[str, Any], EffectReceipt, dict[str, Any]], Any]


def replay_verdict(answer: Callable[[], Any], idempotency_key: str | None) -> Verdict:
    """What a replay says (verify.replay: the step's handler called again with the same
    params and idempotency key, for a provider that deduplicates): an answer means the
    original request was applied, and it is the step's output; a refusal the provider
    gave (NotApplied with ``reached``) means it was not; NotApplied before reaching it
    cannot tell. Other exceptions are the caller's to treat as inconclusive. The runner's
    verifier and an external worker use this one rule."""
    try:
        output = answer()
    except NotApplied as exc:
        if exc.reached:  # the provider refused the very request: nothing under this key
            return NotApplied(str(exc), {"replay": exc.evidence})
        return Inconclusive(f"the replay did not reach the provider: {exc}")
    evidence: dict[str, Any] = {
        "replay": {"idempotency_key": idempotency_key, "answered": True},
        "output_sha256": hashlib.sha256(
            json.dumps(output, sort_keys=True, default=str).encode()
        ).hexdigest(),
    }
    if isinstance(output, dict) and isinstance(output.get("status"), int):
        evidence["response"] = {
            k: output[k] for k in ("status", "headers", "json", "body") if k in output
        }
    # the provider receipt id is read from the output in SQL, as for a commit
    return Applied(evidence, output=output)
