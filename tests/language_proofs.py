"""The registry of language proofs: which test shows that a (scope, field) of
orch8.sequence_language() changes what runs. tests/test_language.py and
tests/test_workflows.py record their proofs here, and
test_every_supported_field_is_proven_end_to_end checks that every supported field has
one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PROOFS: dict[tuple[str, str], str] = {}


def proves(*fields: tuple[str, str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Record that the decorated test shows these (scope, field) change what runs."""

    def register(test: Callable[..., Any]) -> Callable[..., Any]:
        for f in fields:
            PROOFS[f] = test.__name__
        return test

    return register
