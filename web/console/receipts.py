"""Effect-receipt queries shared by the instance and effect pages."""

from __future__ import annotations

import uuid

from flask import g


def load_receipt(conn, effect_id: uuid.UUID) -> dict | None:
    return conn.execute(
        "SELECT r.*, r.state::text AS state, orch8.now() - r.created_at AS age,"
        " t.state::text AS instance_state"
        " FROM orch8.effect_receipts AS r"
        " LEFT JOIN orch8.task_instances AS t"
        "   ON t.tenant_id = r.tenant_id AND t.id = r.instance_id"
        " WHERE r.tenant_id = %s AND r.id = %s",
        (g.tenant, effect_id),
    ).fetchone()


def receipt_events(conn, receipt_ids: list) -> dict:
    events: dict = {rid: [] for rid in receipt_ids}
    if not receipt_ids:
        return events
    rows = conn.execute(
        "SELECT receipt_id, event_id, from_state::text AS from_state,"
        " to_state::text AS to_state, actor, note, evidence, at"
        " FROM orch8.effect_receipt_events"
        " WHERE tenant_id = %s AND receipt_id = ANY(%s) ORDER BY at, event_id",
        (g.tenant, receipt_ids),
    ).fetchall()
    for row in rows:
        events.setdefault(row["receipt_id"], []).append(row)
    return events
