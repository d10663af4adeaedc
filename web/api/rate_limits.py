"""Rate limits: define or change a tenant's token bucket (orch8.set_rate_limit) and read
them (orch8.rate_limit_status). Steps name one with `rate_limit_key`; the claim takes
their tokens (docs/WORKFLOWS.md, "Rate limits")."""

from __future__ import annotations

from flask import Blueprint, g

from orch8_py import sqlapi

from ..auth import OPERATOR
from ..db import tenant_tx
from ..problems import Problem
from .models.rate_limits import RateLimit, RateLimitList, RateLimitPath, RateLimitSet
from .spec import READ, WRITE, operation

bp = Blueprint("rate_limits", __name__)
TAG = "rate limits"


@bp.put("/rate-limits/<key>")
@operation(roles=OPERATOR, ok={200: RateLimit}, errors=WRITE, tag=TAG, operation_id="setRateLimit")
def put(path: RateLimitPath, json: RateLimitSet) -> RateLimit:
    """Define or change a rate limit (orch8.set_rate_limit)

    `rate` tokens per `per`, holding at most `burst`. A new bucket starts full; a changed
    one keeps its tokens (capped to the new burst). Steps the key deferred become due at
    once, to be admitted under the new limit. A bad `per` is 422 with `field` per."""
    with tenant_tx() as conn:
        row = sqlapi.flow_control.set_rate_limit(
            conn,
            tenant_id=g.tenant,
            key=path.key,
            rate=json.rate,
            per=str(json.per),
            burst=json.burst,
            actor=g.actor,
        )
        return RateLimit.model_validate(row)


@bp.get("/rate-limits")
@operation(
    roles=OPERATOR, ok={200: RateLimitList}, errors=READ, tag=TAG, operation_id="listRateLimits"
)
def list_all() -> RateLimitList:
    """The tenant's rate limits by key, with their tokens now and what waits on them"""
    with tenant_tx() as conn:
        rows = sqlapi.flow_control.list_rate_limits(conn, tenant_id=g.tenant)
    return RateLimitList.model_validate({"items": rows})


@bp.get("/rate-limits/<key>")
@operation(roles=OPERATOR, ok={200: RateLimit}, errors=READ, tag=TAG, operation_id="getRateLimit")
def get_one(path: RateLimitPath) -> RateLimit:
    """One rate limit: its tokens now, what it admitted and deferred, what waits on it"""
    with tenant_tx() as conn:
        row = sqlapi.flow_control.get_rate_limit(conn, tenant_id=g.tenant, key=path.key)
    if row is None:
        raise Problem(404, "not found", f"rate limit {path.key!r} not found")
    return RateLimit.model_validate(row)
