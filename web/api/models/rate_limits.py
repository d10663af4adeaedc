"""Rate limits: one to define or change, and a limit as orch8.rate_limit_status shows it."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import Field, StringConstraints

from orch8_py import rules

from ..fields import Identifier, Int64, Whole
from .base import Answer, Body, Path

Tokens = Annotated[int, Field(ge=1, le=1_000_000), Whole]
Period = Annotated[
    Annotated[int, Field(ge=1, le=rules.LIMITS["wait_ms"]), Whole]
    | Annotated[str, StringConstraints(pattern=r"^([0-9]{1,12}(ms|s|m|h|d))+$")],
    Field(
        description="a duration: milliseconds, or a string of units such as 1s, 1m, 1h, "
        "1h30m (more than 0, at most 366 days; checked by orch8.set_rate_limit)"
    ),
]


class RateLimitSet(Body):
    rate: Tokens = Field(description="tokens added per `per`")
    per: Period
    burst: Tokens | None = Field(
        default=None,
        description="the most tokens the bucket holds (how many steps may start at once "
        "after a quiet time); default: rate",
    )


class RateLimit(Answer):
    key: str
    rate: int
    per_ms: Int64
    burst: int
    tokens_now: float = Field(description="tokens the bucket holds now")
    admitted: Int64 = Field(description="steps that took a token, ever")
    deferred: Int64 = Field(description="times a step found no token and was deferred, ever")
    waiting: Int64 = Field(description="steps deferred by this limit now")
    created_by: str
    updated_by: str
    created_at: dt.datetime
    updated_at: dt.datetime


class RateLimitList(Answer):
    items: list[RateLimit] = Field(description="by key")


class RateLimitPath(Path):
    key: Identifier
