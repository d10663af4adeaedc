"""Webhooks: subscriptions (a secret is never read back, except the generated one, once)
and the outbox with the operator's two moves."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from pydantic import Field, RootModel

from ..cursors import DeliveryCursor
from ..fields import (
    DeliveryId,
    Int64,
    Limit,
    NonEmptyText,
    OutboxState,
    WebhookEvent,
    WebhookUrl,
    optional,
)
from .base import Answer, Body, Path, Query


class SubscriptionCreate(Body):
    url: WebhookUrl
    events: list[WebhookEvent] | None = Field(
        default=None, min_length=1, description="default: every event; duplicates fold"
    )
    secret: NonEmptyText | None = Field(
        default=None,
        description="the HMAC-SHA256 signing secret; default: generated and answered once",
    )


class Subscription(Answer):
    id: uuid.UUID
    url: str
    events: list[WebhookEvent]
    enabled: bool = Field(description="false: no new events; queued deliveries wait")
    created_at: dt.datetime


class SubscriptionWithSecret(Subscription):
    secret: str = Field(description="generated: shown this once, never again")


class SubscriptionCreated(RootModel[SubscriptionWithSecret | Subscription]):
    """The new subscription; with ``secret`` only when it was generated."""


class SubscriptionList(Answer):
    items: list[Subscription]


class Delivery(Answer):
    id: Int64
    subscription_id: uuid.UUID
    event: WebhookEvent
    instance_id: uuid.UUID
    payload: dict[str, Any]
    state: OutboxState
    attempts: int
    next_attempt_at: dt.datetime
    last_error: str | None
    last_status: int | None
    claimed_by: str | None
    claim_expires_at: dt.datetime | None
    created_at: dt.datetime
    delivered_at: dt.datetime | None


class DeliveryPage(Answer):
    items: list[Delivery]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null last")


class DeliveryMove(Answer):
    id: Int64
    state: OutboxState


class OutboxQuery(Query):
    state: OutboxState | None = optional()
    limit: Limit = 50
    cursor: DeliveryCursor | None = optional()


class SubscriptionPath(Path):
    subscription_id: uuid.UUID


class DeliveryPath(Path):
    delivery_id: DeliveryId
