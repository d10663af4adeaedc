"""Retry policy arithmetic."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from orch8_py.retry import RetryPolicy

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def test_defaults_and_from_block():
    p = RetryPolicy.from_block(
        {
            "retry": {
                "max_attempts": 5,
                "initial_backoff": 100,
                "max_backoff": 1000,
                "backoff_multiplier": 3,
                "non_retryable_codes": [404, "card_declined"],
            }
        }
    )
    assert (p.max_attempts, p.initial_backoff_ms, p.max_backoff_ms) == (5, 100, 1000)
    assert p.non_retryable_codes == ("404", "card_declined")
    assert RetryPolicy.from_block({}) == RetryPolicy()


def test_backoff_grows_is_capped_and_jittered():
    p = RetryPolicy(max_attempts=10, initial_backoff_ms=100, max_backoff_ms=1000)
    rng = random.Random(7)
    for attempt, step in [(0, 100), (1, 200), (2, 400), (3, 800), (4, 1000), (8, 1000)]:
        for _ in range(50):
            d = p.delay(attempt, rng)
            assert timedelta(milliseconds=step / 2) <= d <= timedelta(milliseconds=step)


def test_when_not_to_retry():
    p = RetryPolicy(max_attempts=3, non_retryable_codes=("404",))
    assert p.retry_at(0, NOW, retryable=True, code="503") is not None
    assert p.retry_at(1, NOW, retryable=True, code=None) is not None
    assert p.retry_at(2, NOW, retryable=True, code=None) is None  # third attempt was the last
    assert p.retry_at(0, NOW, retryable=True, code="404") is None
    assert p.retry_at(0, NOW, retryable=False, code=None) is None
