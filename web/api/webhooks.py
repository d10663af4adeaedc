"""Webhooks: subscriptions (list, create with orch8.create_webhook_subscription, read,
disable and enable with orch8.set_webhook_subscription_enabled; a secret is never read
back), and the outbox: list deliveries, and the operator's two moves
(orch8.redeliver_webhook, orch8.discard_webhook)."""

from __future__ import annotations

import secrets
import uuid

from flask import Blueprint, g

from orch8_py import sqlapi

from ..auth import OPERATOR
from ..db import tenant_tx
from ..problems import Problem
from .cursors import encode_cursor
from .models.base import NoBody
from .models.webhooks import (
    DeliveryMove,
    DeliveryPage,
    DeliveryPath,
    OutboxQuery,
    Subscription,
    SubscriptionCreate,
    SubscriptionCreated,
    SubscriptionList,
    SubscriptionPath,
    SubscriptionWithSecret,
)
from .spec import READ, WRITE, operation

bp = Blueprint("webhooks", __name__)
TAG = "webhooks"
AT_ID = {"subscription_id": "$response.body#/id"}


# --- subscriptions ---------------------------------------------------------------------------


@bp.get("/webhooks/subscriptions")
@operation(
    roles=OPERATOR,
    ok={200: SubscriptionList},
    errors=READ,
    tag=TAG,
    operation_id="listWebhookSubscriptions",
)
def subscriptions() -> SubscriptionList:
    """The tenant's webhook subscriptions, oldest first (never their secrets)"""
    with tenant_tx() as conn:
        rows = sqlapi.webhooks.list_subscriptions(conn, tenant_id=g.tenant)
    return SubscriptionList.model_validate({"items": rows})


@bp.post("/webhooks/subscriptions")
@operation(
    roles=OPERATOR,
    ok={201: SubscriptionCreated},
    errors=WRITE,
    tag=TAG,
    operation_id="createWebhookSubscription",
    links={
        201: {
            "GetSubscription": ("getWebhookSubscription", AT_ID),
            "DisableSubscription": ("disableWebhookSubscription", AT_ID),
            "EnableSubscription": ("enableWebhookSubscription", AT_ID),
        }
    },
)
def subscribe(json: SubscriptionCreate) -> tuple[SubscriptionCreated, int]:
    """Subscribe a URL (orch8.create_webhook_subscription)

    Without a secret one is generated and answered once, as `secret`; a secret you send
    is never echoed."""
    generated = json.secret is None
    secret = secrets.token_urlsafe(32) if json.secret is None else json.secret
    with tenant_tx() as conn:
        sub_id = sqlapi.webhooks.create_subscription(
            conn, tenant_id=g.tenant, url=json.url, secret=secret, events=json.events
        )
        row = _load(conn, sub_id)
    made: Subscription = (
        SubscriptionWithSecret.model_validate({**row, "secret": secret})
        if generated
        else Subscription.model_validate(row)
    )
    return SubscriptionCreated(made), 201


def _load(conn: sqlapi.Conn, sub_id: uuid.UUID) -> dict[str, object]:
    row = sqlapi.webhooks.get_subscription(conn, tenant_id=g.tenant, subscription_id=sub_id)
    if row is None:
        raise Problem(404, "not found", f"webhook subscription {sub_id} not found")
    return row


@bp.get("/webhooks/subscriptions/<subscription_id>")
@operation(
    roles=OPERATOR,
    ok={200: Subscription},
    errors=READ,
    tag=TAG,
    operation_id="getWebhookSubscription",
)
def subscription(path: SubscriptionPath) -> Subscription:
    """One webhook subscription (never its secret)"""
    with tenant_tx() as conn:
        return Subscription.model_validate(_load(conn, path.subscription_id))


def _set_enabled(subscription_id: uuid.UUID, enabled: bool) -> Subscription:
    with tenant_tx() as conn:
        row = sqlapi.webhooks.set_subscription_enabled(
            conn, tenant_id=g.tenant, subscription_id=subscription_id, enabled=enabled
        )
    # `changed` (whether this call changed it) is not answered: doing either twice answers
    # the same, the subscription as it is now
    row.pop("changed")
    return Subscription.model_validate(row)


@bp.post("/webhooks/subscriptions/<subscription_id>/disable")
@operation(
    roles=OPERATOR,
    ok={200: Subscription},
    errors=WRITE,
    tag=TAG,
    operation_id="disableWebhookSubscription",
)
def disable(path: SubscriptionPath, json: NoBody) -> Subscription:
    """No new events for this subscription; its queued deliveries wait"""
    return _set_enabled(path.subscription_id, False)


@bp.post("/webhooks/subscriptions/<subscription_id>/enable")
@operation(
    roles=OPERATOR,
    ok={200: Subscription},
    errors=WRITE,
    tag=TAG,
    operation_id="enableWebhookSubscription",
)
def enable(path: SubscriptionPath, json: NoBody) -> Subscription:
    """Events again for this subscription, and its queued deliveries go out"""
    return _set_enabled(path.subscription_id, True)


# --- the outbox ------------------------------------------------------------------------------


@bp.get("/webhooks/outbox")
@operation(
    roles=OPERATOR, ok={200: DeliveryPage}, errors=READ, tag=TAG, operation_id="listDeliveries"
)
def outbox(query: OutboxQuery) -> DeliveryPage:
    """Webhook deliveries, newest first"""
    with tenant_tx() as conn:
        rows = sqlapi.webhooks.list_deliveries(
            conn,
            tenant_id=g.tenant,
            limit=query.limit + 1,
            state=query.state,
            before_id=query.cursor[0] if query.cursor else None,
        )
    items = rows[: query.limit]
    next_cursor = encode_cursor(items[-1]["id"]) if len(rows) > query.limit else None
    return DeliveryPage.model_validate({"items": items, "next_cursor": next_cursor})


@bp.post("/webhooks/outbox/<delivery_id>/redeliver")
@operation(roles=OPERATOR, ok={200: DeliveryMove}, errors=WRITE, tag=TAG, operation_id="redeliver")
def redeliver(path: DeliveryPath, json: NoBody) -> DeliveryMove:
    """Send a parked, discarded or delivered delivery again (orch8.redeliver_webhook)"""
    with tenant_tx() as conn:
        state = sqlapi.webhooks.redeliver(conn, tenant_id=g.tenant, delivery_id=path.delivery_id)
    return DeliveryMove(id=path.delivery_id, state=state)


@bp.post("/webhooks/outbox/<delivery_id>/discard")
@operation(roles=OPERATOR, ok={200: DeliveryMove}, errors=WRITE, tag=TAG, operation_id="discard")
def discard(path: DeliveryPath, json: NoBody) -> DeliveryMove:
    """Give up on a pending or parked delivery (orch8.discard_webhook)"""
    with tenant_tx() as conn:
        state = sqlapi.webhooks.discard(conn, tenant_id=g.tenant, delivery_id=path.delivery_id)
    return DeliveryMove(id=path.delivery_id, state=state)
