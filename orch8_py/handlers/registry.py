"""The handler registry: names to callables. The builtins register themselves when
orch8_py.handlers is imported; your own register with ``@handler("name")``.

Beside a handler you may register how to settle its unknown outcomes::

    @handler("payments.charge")
    def charge(params, ctx): ...

    @charge.verifier                   # verify: {"handler": true} in the step
    def charge_verifier(params, effect, ctx): ...   # -> Applied | NotApplied | Inconclusive

    @charge.output_from_evidence       # what the step returns when a resolution says so
    def charge_output(evidence, effect, params): ...   # -> output, or None
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..steps import Handler, OutputDeriver, StepContext, Verifier

_REGISTRY: dict[str, Handler] = {}
_VERIFIERS: dict[str, Verifier] = {}
_DERIVERS: dict[str, OutputDeriver] = {}


class Registered:
    """A registered handler: callable as the function itself, with decorators for its
    verifier and its output deriver."""

    def __init__(self, name: str, fn: Handler):
        self.name = name
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __call__(self, params: dict[str, Any], ctx: StepContext) -> Any:
        return self.fn(params, ctx)

    def verifier(self, fn: Verifier) -> Verifier:
        _VERIFIERS[self.name] = fn
        return fn

    def output_from_evidence(self, fn: OutputDeriver) -> OutputDeriver:
        _DERIVERS[self.name] = fn
        return fn


def handler(name: str) -> Callable[[Handler], Registered]:
    """Register a handler under ``name`` (a non-builtin name is treated as side-effecting)."""
    if not name or not isinstance(name, str):
        raise ValueError("a handler needs a non-empty name")

    def register(fn: Handler) -> Registered:
        _REGISTRY[name] = fn
        return Registered(name, fn)

    return register


def get(name: str) -> Handler | None:
    return _REGISTRY.get(name)


def names() -> list[str]:
    return sorted(_REGISTRY)


def verifier_of(name: str) -> Verifier | None:
    return _VERIFIERS.get(name)


def verifier_names() -> list[str]:
    return sorted(_VERIFIERS)


def deriver_of(name: str) -> OutputDeriver | None:
    return _DERIVERS.get(name)
