"""Webhooks: subscriptions (list, create with orch8.create_webhook_subscription, read,
disable and enable with orch8.set_webhook_subscription_enabled; a secret is never read
back), and the outbox: list deliveries, and the operator's two moves
(orch8.redeliver_webhook, orch8.discard_webhook)."""

from __future__ import annotations

import secrets
import uuid

from flask import Blueprint, g

from orch8_py.states import OUTBOX_STATES, WEBHOOK_EVENTS

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
    not_found,
    one_of,
    path_int,
    path_uuid,
    query,
)

bp = Blueprint("webhooks", __name__)

COLUMNS = (
    "id, subscription_id, event, instance_id, payload, state, attempts, next_attempt_at,"
    " last_error, last_status, claimed_by, claim_expires_at, created_at, delivered_at"
)
NO_FIELDS: dict[str, Field] = {}

# what is read back of a subscription: never its secret
SUBSCRIPTION = "id, url, events, enabled, created_at"
SUBSCRIBE = {
    # the URL's rules (http:// or https:// with a host) are create_webhook_subscription's
    "url": Field(str, required=True),
    "events": Field(list, nullable=True, enum=WEBHOOK_EVENTS, min=1),  # default: every event
    "secret": Field(str, nullable=True, min_bytes=1),  # default: generated, answered once
}


# --- subscriptions -----------------------------------------------------------------------


def _load_subscription(conn, sub_id: uuid.UUID) -> dict:
    row = conn.execute(
        f"SELECT {SUBSCRIPTION} FROM orch8.webhook_subscriptions WHERE tenant_id = %s AND id = %s",
        (g.tenant, sub_id),
    ).fetchone()
    if row is None:
        raise not_found(f"webhook subscription {sub_id}")
    return row


@bp.get("/webhooks/subscriptions")
@require(*OPERATOR)
def subscriptions():
    query({})
    with tenant_tx() as conn:
        rows = conn.execute(
            f"SELECT {SUBSCRIPTION} FROM orch8.webhook_subscriptions WHERE tenant_id = %s"
            " ORDER BY created_at, id",
            (g.tenant,),
        ).fetchall()
    return answer({"items": rows})


@bp.post("/webhooks/subscriptions")
@require(*OPERATOR)
def subscribe():
    query({})
    body = json_body(SUBSCRIBE)
    generated = "secret" not in body
    secret = secrets.token_urlsafe(32) if generated else body["secret"]
    with tenant_tx() as conn:
        sub_id = conn.execute(
            "SELECT orch8.create_webhook_subscription(%s, %s, %s, %s::text[]) AS id",
            (g.tenant, body["url"], secret, body.get("events", list(WEBHOOK_EVENTS))),
        ).fetchone()["id"]
        row = _load_subscription(conn, sub_id)
    if generated:
        row["secret"] = secret  # shown this once: it is never read back
    return answer(row, 201)


@bp.get("/webhooks/subscriptions/<subscription_id>")
@require(*OPERATOR)
def subscription(subscription_id: str):
    query({})
    sid = path_uuid(subscription_id)
    with tenant_tx() as conn:
        return answer(_load_subscription(conn, sid))


def _set_enabled(subscription_id: str, enabled: bool):
    query({})
    sid = path_uuid(subscription_id)
    json_body(NO_FIELDS, optional=True)
    with tenant_tx() as conn:
        row = conn.execute(
            f"SELECT {SUBSCRIPTION} FROM orch8.set_webhook_subscription_enabled(%s, %s, %s)",
            (g.tenant, sid, enabled),
        ).fetchone()
    return answer(row)


@bp.post("/webhooks/subscriptions/<subscription_id>/disable")
@require(*OPERATOR)
def disable(subscription_id: str):
    return _set_enabled(subscription_id, False)


@bp.post("/webhooks/subscriptions/<subscription_id>/enable")
@require(*OPERATOR)
def enable(subscription_id: str):
    return _set_enabled(subscription_id, True)


# --- the outbox --------------------------------------------------------------------------


@bp.get("/webhooks/outbox")
@require(*OPERATOR)
def outbox():
    q = query(
        {"state": one_of(*OUTBOX_STATES), "limit": LIMIT, "cursor": cursor(cursor_int)},
        {"limit": 50},
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
