"""Step handlers: register your own, look one up by name.

    from orch8_py.handlers import handler

    @handler("payments.charge")
    def charge(params, ctx):
        # ctx.idempotency_key is the key to hand to the provider
        ...

    @charge.verifier                 # settles an unknown outcome (verify: {"handler": true})
    def charge_verifier(params, effect, ctx): ...

    @charge.output_from_evidence     # the output a resolution's evidence stands for
    def charge_output(evidence, effect, params): ...

What a handler receives and raises is in orch8_py.steps (re-exported here). Importing
this package registers the builtins (orch8_py.handlers.builtin); docs/HANDLERS.md
describes each.
"""

from __future__ import annotations

from ..steps import (
    Applied,
    EffectReceipt,
    Handler,
    Inconclusive,
    NotApplied,
    StepContext,
    StepError,
)
from . import builtin as _builtin  # noqa: F401  (registers the builtins)
from .registry import deriver_of, get, handler, names, verifier_names, verifier_of

__all__ = [
    "Applied",
    "EffectReceipt",
    "Handler",
    "Inconclusive",
    "NotApplied",
    "StepContext",
    "StepError",
    "deriver_of",
    "get",
    "handler",
    "names",
    "verifier_names",
    "verifier_of",
]
