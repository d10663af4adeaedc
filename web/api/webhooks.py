"""The webhook outbox: list deliveries, and the operator's two moves
(orch8.redeliver_webhook, orch8.discard_webhook)."""

from __future__ import annotations

from flask import Blueprint, g

from ..auth import OPERATOR, require
from ..db import tenant_tx
from .validation import (
    INT64_MAX,
    LIMIT,
    Field,
    answer,
    cursor,
    cursor_int,
    encode_cursor,
    json_body,
    one_of,
    path_int,
    query,
)

bp = Blueprint("webhooks", __name__)

STATES = ("pending", "delivering", "delivered", "parked", "discarded")
COLUMNS = (
    "id, subscription_id, event, instance_id, payload, state, attempts, next_attempt_at,"
    " last_error, last_status, claimed_by, claim_expires_at, created_at, delivered_at"
)
NO_FIELDS: dict[str, Field] = {}


@bp.get("/webhooks/outbox")
@require(*OPERATOR)
def outbox():
    q = query(
        {"state": one_of(*STATES), "limit": LIMIT, "cursor": cursor(cursor_int)}, {"limit": 50}
    )
    where = ["tenant_id = %s"]
    args: list = [g.tenant]
    if "state" in q:
        where.append("state = %s")
        args.append(q["state"])
    if "cursor" in q:
        where.append("id < %s")
        args.append(q["cursor"][0])
    with tenant_tx() as conn:
        rows = conn.execute(
            f"SELECT {COLUMNS} FROM orch8.webhook_outbox WHERE {' AND '.join(where)}"
            " ORDER BY id DESC LIMIT %s",
            [*args, q["limit"] + 1],
        ).fetchall()
    items = rows[: q["limit"]]
    next_cursor = encode_cursor(items[-1]["id"]) if len(rows) > q["limit"] else None
    return answer({"items": items, "next_cursor": next_cursor})


def _move(delivery_id: str, function: str):
    query({})
    did = path_int(delivery_id, "id", INT64_MAX)
    json_body(NO_FIELDS, optional=True)
    with tenant_tx() as conn:
        state = conn.execute(
            f"SELECT orch8.{function}(%s, %s::bigint) AS state", (g.tenant, did)
        ).fetchone()["state"]
    return answer({"id": did, "state": state})


@bp.post("/webhooks/outbox/<delivery_id>/redeliver")
@require(*OPERATOR)
def redeliver(delivery_id: str):
    return _move(delivery_id, "redeliver_webhook")


@bp.post("/webhooks/outbox/<delivery_id>/discard")
@require(*OPERATOR)
def discard(delivery_id: str):
    return _move(delivery_id, "discard_webhook")
