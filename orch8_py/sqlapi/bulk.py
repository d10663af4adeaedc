"""Bulk operator actions by filter (sql/functions/bulk.sql): the dry-run count and one
batch of an action. The filter is a JSON object checked in SQL (orch8.bulk_filter): an
unknown key or a bad value is InvalidInput with ``facts["field"]`` naming it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from .base import Conn, Jsonb, objects, value


@dataclass(frozen=True)
class BulkBatch:
    """One call of orch8.bulk_apply: ``last_id`` is the cursor for the next batch (None
    when nothing was left); a batch shorter than asked was the last."""

    processed: int
    applied: int
    skipped: int
    last_id: uuid.UUID | None
    skip_reasons: dict[str, int]
    skip_sample: list[dict[str, Any]]


def bulk_count(conn: Conn, *, tenant_id: str, filter: dict[str, Any]) -> int:
    """How many instances of the tenant match the filter now (the dry run)."""
    count: int = value(
        conn,
        "SELECT orch8.bulk_count(p_tenant_id => %(tenant)s, p_filter => %(filter)s)",
        {"tenant": tenant_id, "filter": Jsonb(filter)},
    )
    return count


def bulk_apply(
    conn: Conn,
    *,
    tenant_id: str,
    action: str,
    filter: dict[str, Any],
    actor: str,
    reason: str | None = None,
    after_id: uuid.UUID | None = None,
    batch: int = 50,
) -> BulkBatch:
    """One batch: up to ``batch`` matching instances with an id after ``after_id``, each
    moved by its single-instance function (a refusal is a skip with its reason)."""
    return objects(
        conn,
        BulkBatch,
        "SELECT processed, applied, skipped, last_id, skip_reasons, skip_sample"
        " FROM orch8.bulk_apply(p_tenant_id => %(tenant)s, p_action => %(action)s,"
        " p_filter => %(filter)s, p_actor => %(actor)s, p_reason => %(reason)s,"
        " p_after_id => %(after)s, p_batch => %(batch)s::integer)",
        {
            "tenant": tenant_id,
            "action": action,
            "filter": Jsonb(filter),
            "actor": actor,
            "reason": reason,
            "after": after_id,
            "batch": batch,
        },
    )[0]
