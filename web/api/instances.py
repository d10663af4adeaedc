"""Instances: start (orch8.create_instance), list and read, their outputs, audit trail and
signals, and the operator's moves: cancel, pause, resume, signal, retry."""

from __future__ import annotations

import uuid

from flask import Blueprint, g
from psycopg.types.json import Jsonb

from ..auth import OPERATOR, require
from ..db import tenant_tx
from .validation import (
    INT32_MAX,
    INT32_MIN,
    LIMIT,
    Field,
    answer,
    cursor,
    cursor_time,
    cursor_uuid,
    encode_cursor,
    json_body,
    not_found,
    one_of,
    path_uuid,
    query,
    text,
    timestamp,
)

bp = Blueprint("instances", __name__)

STATES = ("scheduled", "running", "waiting", "paused", "completed", "failed", "cancelled")

SUMMARY = (
    "t.id, t.sequence_id, s.namespace AS sequence_namespace, s.name AS sequence_name,"
    " t.sequence_version, t.state::text AS state, t.requested_state::text AS requested_state,"
    " t.current_block, t.priority, t.idempotency_key, t.parent_instance_id, t.error,"
    " t.next_fire_at, t.created_at, t.updated_at"
)
DETAIL = SUMMARY + ", t.context, t.lease_owner, t.lease_expires_at"
FROM = (
    " FROM orch8.task_instances AS t"
    " JOIN orch8.sequences AS s ON s.tenant_id = t.tenant_id AND s.id = t.sequence_id"
)

CREATE = {
    "sequence": Field(str, required=True),
    "namespace": Field(str, nullable=True),
    "version": Field(int, nullable=True, min=1, max=INT32_MAX),
    "data": Field(dict, nullable=True),
    "config": Field(dict, nullable=True),
    "priority": Field(int, nullable=True, min=INT32_MIN, max=INT32_MAX),
    # the column's CHECK (1-256 bytes); create_instance itself does not check it
    "idempotency_key": Field(str, nullable=True, min_bytes=1, max_bytes=256),
}
REASON = {"reason": Field(str, nullable=True, max_bytes=2000)}
SIGNAL = {"type": Field(str, required=True), "payload": Field(dict, nullable=True)}
NO_FIELDS: dict = {}


def load(conn, instance_id: uuid.UUID) -> dict:
    row = conn.execute(
        f"SELECT {DETAIL}{FROM} WHERE t.tenant_id = %s AND t.id = %s", (g.tenant, instance_id)
    ).fetchone()
    if row is None:
        raise not_found(f"instance {instance_id}")
    return row


def exists(conn, instance_id: uuid.UUID) -> None:
    found = conn.execute(
        "SELECT 1 FROM orch8.task_instances WHERE tenant_id = %s AND id = %s",
        (g.tenant, instance_id),
    ).fetchone()
    if found is None:
        raise not_found(f"instance {instance_id}")


@bp.post("/instances")
@require(*OPERATOR)
def create():
    query({})
    body = json_body(CREATE)
    namespace = body.get("namespace", "default")
    with tenant_tx() as conn:
        seq = conn.execute(
            "SELECT id FROM orch8.get_sequence(%s, %s, %s, %s::integer)",
            (g.tenant, namespace, body["sequence"], body.get("version")),
        ).fetchone()
        if seq is None or seq["id"] is None:
            version = f" version {body['version']}" if "version" in body else ""
            raise not_found(f"sequence {namespace}/{body['sequence']}{version}")
        made = conn.execute(
            "SELECT id, deduplicated FROM orch8.create_instance(%s, %s, %s, %s, %s::integer, %s)",
            (
                g.tenant,
                seq["id"],
                Jsonb(body.get("data", {})),
                Jsonb(body.get("config", {})),
                body.get("priority", 0),
                body.get("idempotency_key"),
            ),
        ).fetchone()
        row = load(conn, made["id"])
    row["deduplicated"] = made["deduplicated"]
    return answer(row, 200 if made["deduplicated"] else 201)


@bp.get("/instances")
@require(*OPERATOR)
def list_instances():
    q = query(
        {
            "state": one_of(*STATES),
            "sequence": text(200),
            "namespace": text(100),
            "created_after": timestamp,
            "created_before": timestamp,
            "limit": LIMIT,
            "cursor": cursor(cursor_time, cursor_uuid),
        },
        {"limit": 50},
    )
    where = ["t.tenant_id = %s"]
    args: list = [g.tenant]
    if "state" in q:
        where.append("t.state = %s::orch8.instance_state")
        args.append(q["state"])
    if "sequence" in q:
        where.append("s.name = %s")
        args.append(q["sequence"])
    if "namespace" in q:
        where.append("s.namespace = %s")
        args.append(q["namespace"])
    if "created_after" in q:
        where.append("t.created_at >= %s")
        args.append(q["created_after"])
    if "created_before" in q:
        where.append("t.created_at < %s")
        args.append(q["created_before"])
    if "cursor" in q:
        where.append("(t.created_at, t.id) < (%s, %s)")
        args.extend(q["cursor"])
    with tenant_tx() as conn:
        rows = conn.execute(
            f"SELECT {SUMMARY}{FROM} WHERE {' AND '.join(where)}"
            " ORDER BY t.created_at DESC, t.id DESC LIMIT %s",
            [*args, q["limit"] + 1],
        ).fetchall()
    items = rows[: q["limit"]]
    more = len(rows) > q["limit"]
    next_cursor = encode_cursor(items[-1]["created_at"], items[-1]["id"]) if more else None
    return answer({"items": items, "next_cursor": next_cursor})


@bp.get("/instances/<instance_id>")
@require("worker", *OPERATOR)
def get(instance_id: str):
    query({})
    iid = path_uuid(instance_id)
    with tenant_tx() as conn:
        return answer(load(conn, iid))


def _list(instance_id: str, sql: str):
    query({})
    iid = path_uuid(instance_id)
    with tenant_tx() as conn:
        exists(conn, iid)
        rows = conn.execute(sql, (g.tenant, iid)).fetchall()
    return answer({"items": rows})


@bp.get("/instances/<instance_id>/outputs")
@require(*OPERATOR)
def outputs(instance_id: str):
    return _list(
        instance_id,
        "SELECT seq, block_id, attempt, sentinel, output, retryable, effect_id, created_at"
        " FROM orch8.block_outputs WHERE tenant_id = %s AND instance_id = %s ORDER BY seq",
    )


@bp.get("/instances/<instance_id>/audit")
@require(*OPERATOR)
def audit(instance_id: str):
    return _list(
        instance_id,
        "SELECT seq, from_state::text AS from_state, to_state::text AS to_state, actor,"
        " reason, at FROM orch8.instance_transitions"
        " WHERE tenant_id = %s AND instance_id = %s ORDER BY seq",
    )


@bp.get("/instances/<instance_id>/signals")
@require(*OPERATOR)
def signals(instance_id: str):
    return _list(
        instance_id,
        "SELECT id, signal_type AS type, payload, actor, outcome, created_at"
        " FROM orch8.instance_signals WHERE tenant_id = %s AND instance_id = %s ORDER BY id",
    )


def _moved(conn, iid: uuid.UUID, outcome: str, **extra) -> dict:
    row = load(conn, iid)
    return {
        "id": iid,
        "outcome": outcome,
        **extra,
        "state": row["state"],
        "requested_state": row["requested_state"],
    }


@bp.post("/instances/<instance_id>/signals")
@require(*OPERATOR)
def send_signal(instance_id: str):
    query({})
    iid = path_uuid(instance_id)
    body = json_body(SIGNAL)
    with tenant_tx() as conn:
        sent = conn.execute(
            "SELECT signal_id, outcome FROM orch8.send_signal(%s, %s, %s, %s, %s)",
            (g.tenant, iid, body["type"], Jsonb(body.get("payload", {})), g.actor),
        ).fetchone()
        result = _moved(conn, iid, sent["outcome"], signal_id=sent["signal_id"])
    return answer(result, 201)


def _request(instance_id: str, function: str):
    query({})
    iid = path_uuid(instance_id)
    body = json_body(REASON, optional=True)
    with tenant_tx() as conn:
        outcome = conn.execute(
            f"SELECT orch8.{function}(%s, %s, %s, %s) AS outcome",
            (g.tenant, iid, g.actor, body.get("reason")),
        ).fetchone()["outcome"]
        return answer(_moved(conn, iid, outcome))


@bp.post("/instances/<instance_id>/cancel")
@require(*OPERATOR)
def cancel(instance_id: str):
    return _request(instance_id, "cancel_instance")


@bp.post("/instances/<instance_id>/pause")
@require(*OPERATOR)
def pause(instance_id: str):
    return _request(instance_id, "pause_instance")


@bp.post("/instances/<instance_id>/resume")
@require(*OPERATOR)
def resume(instance_id: str):
    query({})
    iid = path_uuid(instance_id)
    json_body(NO_FIELDS, optional=True)
    with tenant_tx() as conn:
        outcome = conn.execute(
            "SELECT orch8.resume_instance(%s, %s, %s) AS outcome", (g.tenant, iid, g.actor)
        ).fetchone()["outcome"]
        return answer(_moved(conn, iid, outcome))


@bp.post("/instances/<instance_id>/retry")
@require(*OPERATOR)
def retry(instance_id: str):
    """Retry after resolution: the receipt that stopped the instance decides (see
    orch8.retry_instance). Still unknown: 409 naming the receipt (``effect_id``)."""
    query({})
    iid = path_uuid(instance_id)
    json_body(NO_FIELDS, optional=True)
    with tenant_tx() as conn:
        out = conn.execute(
            "SELECT outcome, block_id, effect_id, detail FROM orch8.retry_instance(%s, %s, %s)",
            (g.tenant, iid, g.actor),
        ).fetchone()
        result = _moved(conn, iid, out["outcome"])
    result.update(block_id=out["block_id"], effect_id=out["effect_id"], detail=out["detail"])
    return answer(result)
