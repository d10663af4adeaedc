"""Step handlers: register your own, look one up by name.

    from orch8_py.handlers import handler

    @handler("payments.charge")
    def charge(params, ctx):
        # ctx.effect_id is the idempotency key to hand to the provider
        ...

What a handler receives and raises is in orch8_py.steps (re-exported here). Importing
this package registers the builtins (orch8_py.handlers.builtin); docs/HANDLERS.md
describes each.
"""

from __future__ import annotations

from ..steps import Handler, NotApplied, StepContext, StepError
from . import builtin as _builtin  # noqa: F401  (registers the builtins)
from .registry import get, handler, names

__all__ = ["Handler", "NotApplied", "StepContext", "StepError", "get", "handler", "names"]
