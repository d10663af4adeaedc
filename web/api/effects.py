"""Effect receipts: an instance's or a continuity's receipts, the operator queue (the
view orch8.unresolved_effects), one receipt with its history, and resolving one
(orch8.resolve_effect)."""

from __future__ import annotations

import uuid

from flask import Blueprint, g
from psycopg.types.json import Jsonb

from orch8_py import errors
from orch8_py.states import EFFECT_KINDS, EFFECT_STATES

from ..auth import OPERATOR, require
from ..db import tenant_tx
from . import instances
from .validation import (
    LIMIT,
    Field,
    answer,
    duration,
    json_body,
    not_found,
    one_of,
    path_uuid,
    query,
)

bp = Blueprint("effects", __name__)


RECEIPT = (
    "id, continuity_id, epoch, instance_id, block_id, attempt, kind, state::text AS state,"
    " handler, destination_fingerprint, request_sha256, idempotency_key, provider_receipt_id,"
    " error, evidence, created_at, updated_at"
)

RESOLVE = {
    # which moves are legal is orch8.resolve_effect's decision (409), not this schema's
    "state": Field(str, required=True, enum=EFFECT_STATES),
    "provider_receipt_id": Field(str, nullable=True),
    "evidence": Field(dict, required=True),
    "note": Field(str, nullable=True, max_bytes=2000),
    "expected_state": Field(str, nullable=True, enum=EFFECT_STATES),
}


@bp.get("/instances/<instance_id>/effects")
@require(*OPERATOR)
def of_instance(instance_id: str):
    query({})
    iid = path_uuid(instance_id)
    with tenant_tx() as conn:
        instances.exists(conn, iid)
        rows = conn.execute(
            f"SELECT {RECEIPT} FROM orch8.effect_receipts"
            " WHERE tenant_id = %s AND instance_id = %s ORDER BY created_at, id",
            (g.tenant, iid),
        ).fetchall()
    return answer({"items": rows})


@bp.get("/continuity/executions/<continuity_id>/effects")
@require(*OPERATOR)
def of_continuity(continuity_id: str):
    query({})
    cid = path_uuid(continuity_id, "continuity_id")
    with tenant_tx() as conn:
        scope = conn.execute(
            "SELECT 1 FROM orch8.continuity_executions WHERE tenant_id = %s AND continuity_id = %s",
            (g.tenant, cid),
        ).fetchone()
        if scope is None:
            raise not_found(f"continuity execution {cid}")
        rows = conn.execute(
            f"SELECT {RECEIPT} FROM orch8.effect_receipts"
            " WHERE tenant_id = %s AND continuity_id = %s ORDER BY created_at, id",
            (g.tenant, cid),
        ).fetchall()
    return answer({"items": rows})


@bp.get("/effects/unresolved")
@require(*OPERATOR)
def unresolved():
    q = query(
        {"kind": one_of(*EFFECT_KINDS), "older_than": duration, "limit": LIMIT}, {"limit": 50}
    )
    # RLS confines the view (security_invoker); the tenant filter is kept as a second guard
    where = ["tenant_id = %s"]
    args: list = [g.tenant]
    if "kind" in q:
        where.append("kind = %s")
        args.append(q["kind"])
    if "older_than" in q:
        where.append("age > %s")
        args.append(q["older_than"])
    with tenant_tx() as conn:
        rows = conn.execute(
            "SELECT effect_id, kind, state::text AS state,"
            " extract(epoch FROM age)::float8 AS age_seconds, state_since, instance_id,"
            " block_id, attempt, epoch, continuity_id, handler, destination_fingerprint,"
            " request_sha256, idempotency_key, provider_receipt_id, error, evidence, created_at"
            f" FROM orch8.unresolved_effects WHERE {' AND '.join(where)}"
            " ORDER BY created_at, effect_id LIMIT %s",
            [*args, q["limit"]],
        ).fetchall()
    return answer({"items": rows})


def _receipt(conn, effect_id: uuid.UUID) -> dict | None:
    row = conn.execute(
        f"SELECT {RECEIPT} FROM orch8.load_effect_receipt(%s, %s)", (g.tenant, effect_id)
    ).fetchone()
    return None if row is None or row["id"] is None else row


@bp.get("/effects/<effect_id>")
@require(*OPERATOR)
def show(effect_id: str):
    query({})
    eid = path_uuid(effect_id)
    with tenant_tx() as conn:
        receipt = _receipt(conn, eid)
        if receipt is None:
            raise not_found(f"effect receipt {eid}")
        receipt["events"] = conn.execute(
            "SELECT event_id, from_state::text AS from_state, to_state::text AS to_state,"
            " actor, note, evidence, at FROM orch8.effect_receipt_events"
            " WHERE tenant_id = %s AND receipt_id = %s ORDER BY event_id",
            (g.tenant, eid),
        ).fetchall()
        receipt["invariant_results"] = conn.execute(
            "SELECT r.id, r.invariant_id, w.name AS invariant_name, w.rule, r.status,"
            " r.effect_id, r.competing_effect_id, r.instance_id, r.block_id, r.epoch,"
            " r.evidence, r.created_at"
            " FROM orch8.invariant_results AS r"
            " LEFT JOIN orch8.workflow_invariants AS w"
            "   ON w.tenant_id = r.tenant_id AND w.id = r.invariant_id"
            " WHERE r.tenant_id = %s AND (r.effect_id = %s OR r.competing_effect_id = %s)"
            " ORDER BY r.id",
            (g.tenant, eid, eid),
        ).fetchall()
    return answer(receipt)


@bp.post("/continuity/effects/<effect_id>/resolve")
@require(*OPERATOR)
def resolve(effect_id: str):
    """Resolve a receipt with evidence; the actor is the API key. Illegal move: 409 with
    ``current_state``; changed meanwhile or not ``expected_state``: 409 "reload before
    resolving" (with ``current_state``)."""
    query({})
    eid = path_uuid(effect_id)
    body = json_body(RESOLVE)
    try:
        with tenant_tx() as conn:
            row = conn.execute(
                f"SELECT {RECEIPT} FROM orch8.resolve_effect("
                "%s, %s, %s::orch8.effect_state, %s, %s, %s, %s, %s::orch8.effect_state)",
                (
                    g.tenant,
                    eid,
                    body["state"],
                    body.get("provider_receipt_id"),
                    Jsonb(body["evidence"]),
                    g.actor,
                    body.get("note"),
                    body.get("expected_state"),
                ),
            ).fetchone()
    except (errors.StaleEffect, errors.InvalidTransition) as exc:
        if "current state:" not in (getattr(exc, "detail", None) or ""):
            with tenant_tx() as conn:  # a lost CAS names no state: read it afresh
                now = _receipt(conn, eid)
            exc.current_state = now["state"] if now else None
        raise
    return answer(row)
