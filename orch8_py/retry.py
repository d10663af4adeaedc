"""The retry policy of a step: exponential backoff with jitter, bounded attempts, and
error codes that are never retried."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from . import rules


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = int(rules.RETRY_DEFAULTS["max_attempts"])
    initial_backoff_ms: int = int(rules.RETRY_DEFAULTS["initial_backoff"])
    max_backoff_ms: int = int(rules.RETRY_DEFAULTS["max_backoff"])
    backoff_multiplier: float = float(rules.RETRY_DEFAULTS["backoff_multiplier"])
    non_retryable_codes: tuple[str, ...] = ()

    @classmethod
    def from_block(cls, block: dict[str, Any]) -> RetryPolicy:
        """From a step's ``retry`` object (fields as in the sequence document)."""
        r = block.get("retry") or {}
        return cls(
            max_attempts=int(r.get("max_attempts", cls.max_attempts)),
            initial_backoff_ms=int(r.get("initial_backoff", cls.initial_backoff_ms)),
            max_backoff_ms=int(r.get("max_backoff", cls.max_backoff_ms)),
            backoff_multiplier=float(r.get("backoff_multiplier", cls.backoff_multiplier)),
            non_retryable_codes=tuple(str(c) for c in r.get("non_retryable_codes", ())),
        )

    def delay(self, attempt: int, rng: random.Random | None = None) -> timedelta:
        """Backoff before attempt ``attempt + 1``: the exponential step, jittered to
        between half and all of it so that failing peers spread out."""
        step = min(self.max_backoff_ms, self.initial_backoff_ms * self.backoff_multiplier**attempt)
        jittered = (rng or random).uniform(step / 2, step)
        return timedelta(milliseconds=jittered)

    def next_delay(
        self,
        attempt: int,
        *,
        retryable: bool,
        code: str | None,
        rng: random.Random | None = None,
    ) -> timedelta | None:
        """How long to wait before the next attempt after ``attempt`` failed, or None for
        a permanent failure (not retryable, a non-retryable code, attempts exhausted)."""
        if not retryable or (code is not None and code in self.non_retryable_codes):
            return None
        if attempt + 1 >= self.max_attempts:
            return None
        return self.delay(attempt, rng)

    def retry_at(
        self,
        attempt: int,
        now: datetime,
        *,
        retryable: bool,
        code: str | None,
        rng: random.Random | None = None,
    ) -> datetime | None:
        """``now`` plus next_delay, or None for a permanent failure."""
        delay = self.next_delay(attempt, retryable=retryable, code=code, rng=rng)
        return None if delay is None else now + delay
