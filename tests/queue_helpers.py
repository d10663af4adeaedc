"""Receipts in the operator queue in each of its situations, made through the engine's own
calls: unknown (the same attempt began twice), waiting on a verifier, escalated by it,
superseded (its instance ended). Used by the API, CLI and console tests."""

from __future__ import annotations

import uuid

from psycopg.types.json import Jsonb

from orch8_py import sqlapi

VERIFIED_HANDLER = "test.queue.charge"  # a custom handler: its steps may declare verify


def verified_sequence(conn, tenant: str, *, then: list | None = None) -> uuid.UUID:
    """A charge step whose verifier (verify.handler, one try, due at once) settles unknown
    receipts, then the blocks ``then``."""
    blocks = [
        {
            "type": "step",
            "id": "charge",
            "handler": VERIFIED_HANDLER,
            "verify": {"handler": True, "schedule": [0]},
        },
        *(then or []),
    ]
    return conn.execute(
        "SELECT id FROM orch8.create_sequence(%s, 'default', %s, %s)",
        (tenant, f"verified{uuid.uuid4().hex[:8]}", Jsonb({"blocks": blocks})),
    ).fetchone()[0]


def _claim(conn, instance: uuid.UUID) -> uuid.UUID:
    rows = conn.execute(
        "SELECT tenant_id, instance_id AS id, lease_token"
        " FROM orch8.claim_due_nodes('w1', 50, '30 seconds')"
    ).fetchall()
    token = None
    for tenant, iid, tok in rows:
        if iid == instance:
            token = tok
        else:  # not ours: hand it back untouched
            conn.execute("SELECT orch8.release_lease(%s, %s, %s)", (tenant, iid, tok))
    assert token is not None, "the instance was not claimed"
    return token


def unknown_receipt(
    conn, seq: uuid.UUID, tenant: str, handler: str, params: dict | None = None
) -> tuple[uuid.UUID, uuid.UUID]:
    """(instance, receipt): the charge attempt began, its run was lost, and another claim
    began the same attempt, which finds it dispatched and makes it unknown. The instance is
    failed, or waiting when the step declares verify."""
    instance = conn.execute(
        "SELECT id FROM orch8.create_instance(%s, %s, %s)", (tenant, seq, Jsonb({}))
    ).fetchone()[0]
    begin = "SELECT outcome, effect_id FROM orch8.begin_step(%s, %s, %s, 'charge', %s, %s, 0)"
    args = (handler, Jsonb(params or {"url": "https://pay.example/charge"}))
    token = _claim(conn, instance)
    conn.execute(begin, (tenant, instance, token, *args))
    conn.execute("SELECT orch8.release_lease(%s, %s, %s)", (tenant, instance, token))
    outcome, effect_id = conn.execute(
        begin, (tenant, instance, _claim(conn, instance), *args)
    ).fetchone()
    assert outcome == "blocked", outcome
    return instance, effect_id


def escalate(conn, tenant: str, effect_id: uuid.UUID) -> None:
    """The verifier's one try is inconclusive: the verification is escalated, the receipt
    stays unknown and its instance fails."""
    claims = sqlapi.effects.claim_verifications(
        conn, worker_id="w1", batch=50, lease_seconds=30, handlers=[], verifiers=[VERIFIED_HANDLER]
    )
    mine = [c for c in claims if c.effect_id == effect_id]
    assert mine, "the verification was not due"
    done = sqlapi.effects.record_verification(
        conn,
        tenant_id=tenant,
        effect_id=effect_id,
        lease_token=mine[0].lease_token,
        verdict="inconclusive",
        evidence={"lookup": "no answer"},
    )
    assert done["outcome"] == "escalated", done


def supersede(conn, tenant: str, instance: uuid.UUID) -> None:
    """Cancel the (waiting) instance: its unknown receipt blocks nothing any more."""
    conn.execute("SELECT orch8.cancel_instance(%s, %s, 'test', 'superseded')", (tenant, instance))
    state = conn.execute(
        "SELECT state::text FROM orch8.task_instances WHERE id = %s", (instance,)
    ).fetchone()[0]
    assert state == "cancelled", state
