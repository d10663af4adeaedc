"""The handler registry: names to callables. The builtins register themselves when
orch8_py.handlers is imported; your own register with ``@handler("name")``."""

from __future__ import annotations

from collections.abc import Callable

from ..steps import Handler

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
    return _REGISTRY.get(name)


def names() -> list[str]:
    return sorted(_REGISTRY)
