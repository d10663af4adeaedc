"""Webhooks: a tenant's subscriptions (a secret is never read back), the outbox, the
operator's two moves on a delivery, and the delivery loop's claim and record."""

from __future__ import annotations

import datetime as dt
import uuid

from .base import Conn, Row, all_rows, first, one, value

# What is read back of a subscription: never its secret.
SUBSCRIPTION = "id, url, events, enabled, created_at"
DELIVERY = (
    "id, subscription_id, event, instance_id, payload, state, attempts, next_attempt_at,"
    " last_error, last_status, claimed_by, claim_expires_at, created_at, delivered_at"
)


def create_subscription(
    conn: Conn, *, tenant_id: str, url: str, secret: str, events: list[str] | None = None
) -> uuid.UUID:
    """Subscribe ``url``; ``events`` None means every event (the function's default)."""
    sub_id: uuid.UUID = value(
        conn,
        "SELECT orch8.create_webhook_subscription(p_tenant_id => %(tenant)s, p_url => %(url)s,"
        " p_secret => %(secret)s,"
        " p_events => coalesce(%(events)s::text[], orch8.webhook_events()))",
        {"tenant": tenant_id, "url": url, "secret": secret, "events": events},
    )
    return sub_id


def list_subscriptions(conn: Conn, *, tenant_id: str) -> list[Row]:
    return all_rows(
        conn,
        f"SELECT {SUBSCRIPTION} FROM orch8.webhook_subscriptions WHERE tenant_id = %(tenant)s"
        " ORDER BY created_at, id",
        {"tenant": tenant_id},
    )


def get_subscription(conn: Conn, *, tenant_id: str, subscription_id: uuid.UUID) -> Row | None:
    return first(
        conn,
        f"SELECT {SUBSCRIPTION} FROM orch8.webhook_subscriptions"
        " WHERE tenant_id = %(tenant)s AND id = %(id)s",
        {"tenant": tenant_id, "id": subscription_id},
    )


def set_subscription_enabled(
    conn: Conn, *, tenant_id: str, subscription_id: uuid.UUID, enabled: bool
) -> Row:
    """The subscription after the change, with ``changed`` (false: it already was)."""
    return one(
        conn,
        f"SELECT {SUBSCRIPTION}, changed FROM orch8.set_webhook_subscription_enabled("
        "p_tenant_id => %(tenant)s, p_id => %(id)s, p_enabled => %(enabled)s)",
        {"tenant": tenant_id, "id": subscription_id, "enabled": enabled},
    )


def list_deliveries(
    conn: Conn,
    *,
    tenant_id: str,
    limit: int,
    state: str | None = None,
    before_id: int | None = None,
) -> list[Row]:
    """The outbox, newest first; ``before_id`` pages on."""
    return all_rows(
        conn,
        f"SELECT {DELIVERY} FROM orch8.webhook_outbox WHERE tenant_id = %(tenant)s"
        " AND (%(state)s::text IS NULL OR state = %(state)s)"
        " AND (%(before)s::bigint IS NULL OR id < %(before)s)"
        " ORDER BY id DESC LIMIT %(limit)s",
        {"tenant": tenant_id, "state": state, "before": before_id, "limit": limit},
    )


def redeliver(conn: Conn, *, tenant_id: str, delivery_id: int) -> str:
    state: str = value(
        conn,
        "SELECT orch8.redeliver_webhook(p_tenant_id => %(tenant)s, p_id => %(id)s::bigint)",
        {"tenant": tenant_id, "id": delivery_id},
    )
    return state


def discard(conn: Conn, *, tenant_id: str, delivery_id: int) -> str:
    state: str = value(
        conn,
        "SELECT orch8.discard_webhook(p_tenant_id => %(tenant)s, p_id => %(id)s::bigint)",
        {"tenant": tenant_id, "id": delivery_id},
    )
    return state


# --- the delivery loop ---------------------------------------------------------------------

CHANNEL = "orch8_webhooks"


def claim_deliveries(conn: Conn, *, worker: str, batch: int, lease: dt.timedelta) -> list[Row]:
    """Due deliveries of every tenant, claimed for ``worker``, with their endpoint and
    secret (orch8.claim_webhook_deliveries)."""
    return all_rows(
        conn,
        "WITH claimed AS ("
        " SELECT * FROM orch8.claim_webhook_deliveries(p_worker => %(worker)s,"
        " p_batch => %(batch)s, p_lease => %(lease)s))"
        " SELECT c.tenant_id, c.id, c.event, c.instance_id, c.payload, c.attempts, s.url,"
        " s.secret FROM claimed AS c"
        " INNER JOIN orch8.webhook_subscriptions AS s"
        "  ON s.tenant_id = c.tenant_id AND s.id = c.subscription_id"
        " ORDER BY c.id",
        {"worker": worker, "batch": batch, "lease": lease},
    )


def record_delivery(
    conn: Conn,
    *,
    tenant_id: str,
    delivery_id: int,
    worker: str,
    ok: bool,
    status: int | None,
    error: str | None,
    max_attempts: int,
    backoff: dt.timedelta,
) -> str:
    """The delivery's new state, or stale when the claim was lost (nothing written)."""
    state: str = value(
        conn,
        "SELECT orch8.record_webhook_delivery(p_tenant_id => %(tenant)s, p_id => %(id)s,"
        " p_worker => %(worker)s, p_ok => %(ok)s, p_status => %(status)s,"
        " p_error => %(error)s, p_max_attempts => %(max_attempts)s, p_backoff => %(backoff)s)",
        {
            "tenant": tenant_id,
            "id": delivery_id,
            "worker": worker,
            "ok": ok,
            "status": status,
            "error": error,
            "max_attempts": max_attempts,
            "backoff": backoff,
        },
    )
    return state


def listen_for_deliveries(conn: Conn) -> None:
    conn.execute(f"LISTEN {CHANNEL}")
