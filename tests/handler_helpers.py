"""Calling a registered handler directly, with a StepContext made for the test."""

from __future__ import annotations

import uuid

from orch8_py import handlers
from orch8_py.handlers import StepContext
from tests.runner_helpers import TENANT


def make_ctx(**kw) -> StepContext:
    values = {
        "tenant_id": TENANT,
        "instance_id": uuid.uuid4(),
        "block_id": "b1",
        "attempt": 0,
        "handler": "test",
        "effect_id": uuid.uuid4(),
        "context": {"data": {}, "config": {}, "runtime": {}},
        "outputs": {},
        "timeout": 30.0,
    }
    values.update(kw)
    return StepContext(**values)


def run(name: str, params, ctx: StepContext | None = None):
    fn = handlers.get(name)
    assert fn is not None, f"{name} is not registered"
    return fn(params, ctx or make_ctx(handler=name))
