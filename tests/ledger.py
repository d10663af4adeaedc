"""The ledger's calls as the tests use them: positional arguments, and a refusal
(blocked, stale, duplicate) raised as its exception instead of returned as an outcome."""

from __future__ import annotations

import uuid
from typing import Any

from orch8_py import sqlapi
from orch8_py.errors import EffectBlocked, InvariantViolation, StaleEffect
from orch8_py.sqlapi import Conn, Row
from orch8_py.sqlapi.steps import Outcome


def instance(conn: Conn, tenant_id: str, instance_id: uuid.UUID | None = None) -> uuid.UUID:
    """A scheduled instance (of a one-step fixture sequence) to hang receipts on: the ledger
    refuses receipts and scopes for instances that do not exist. ``instance_id`` when a
    test needs a given id (inserted directly: the test connection is the owner's)."""
    from psycopg.types.json import Jsonb

    seq = conn.execute(
        "SELECT id FROM orch8.sequences WHERE tenant_id = %s AND namespace = 'tests'"
        " AND name = 'ledger_fixture'",
        (tenant_id,),
    ).fetchone()
    if seq is None:
        blocks = {"blocks": [{"id": "pay", "type": "step", "handler": "x.pay"}]}
        seq = conn.execute(
            "SELECT id FROM orch8.create_sequence(%s, 'tests', 'ledger_fixture', %s)",
            (tenant_id, Jsonb(blocks)),
        ).fetchone()
    assert seq is not None
    if instance_id is None:
        row = conn.execute(
            "SELECT id FROM orch8.create_instance(%s, %s)", (tenant_id, seq[0])
        ).fetchone()
        assert row is not None
        return uuid.UUID(str(row[0]))
    conn.execute(
        "INSERT INTO orch8.task_instances (tenant_id, id, sequence_id, sequence_version)"
        " VALUES (%s, %s, %s, 1) ON CONFLICT DO NOTHING",
        (tenant_id, instance_id, seq[0]),
    )
    return instance_id


def raise_for(outcome: Outcome) -> Outcome:
    """Turn a refusal into its exception; return a dispatched (or settled) outcome."""
    if outcome.outcome in ("blocked", "stale"):
        err: Exception = EffectBlocked(
            f"effect {outcome.effect_id} (block {outcome.block_id}, attempt {outcome.attempt}) "
            f"is {outcome.state}: {outcome.detail or 'blocked'}"
        )
    elif outcome.outcome == "duplicate":
        err = InvariantViolation(
            f"invariant {outcome.invariant_id} refused effect {outcome.effect_id} "
            f"(block {outcome.block_id}): {outcome.detail}"
        )
    else:
        return outcome
    err.outcome = outcome  # type: ignore[attr-defined]
    raise err


def begin_effect(
    conn: Conn,
    tenant_id: str,
    instance_id: uuid.UUID,
    block_id: str,
    handler: str,
    params: Any,
    attempt: int,
) -> Outcome | None:
    """None for a pure handler, the dispatched outcome otherwise; EffectBlocked (blocked,
    stale) or InvariantViolation (duplicate) raised."""
    out = sqlapi.effects.begin_effect(
        conn,
        tenant_id=tenant_id,
        instance_id=instance_id,
        block_id=block_id,
        handler=handler,
        params=params,
        attempt=attempt,
    )
    return None if out.outcome is None else raise_for(out)


def _settled(out: Outcome) -> Outcome:
    if out.outcome == "stale":
        err = StaleEffect(f"effect {out.effect_id} is {out.state}: {out.detail}")
        err.outcome = out  # type: ignore[attr-defined]
        raise err
    return out


def commit_effect(conn: Conn, tenant_id: str, effect_id: uuid.UUID, output: Any) -> Outcome:
    return _settled(
        sqlapi.effects.commit_effect(conn, tenant_id=tenant_id, effect_id=effect_id, output=output)
    )


def mark_effect_unknown(conn: Conn, tenant_id: str, effect_id: uuid.UUID, error: str) -> Outcome:
    return _settled(
        sqlapi.effects.mark_effect_unknown(
            conn, tenant_id=tenant_id, effect_id=effect_id, error=error
        )
    )


def abandon_effect_not_applied(
    conn: Conn, tenant_id: str, effect_id: uuid.UUID, evidence: dict[str, Any]
) -> Outcome:
    return _settled(
        sqlapi.effects.abandon_effect_not_applied(
            conn, tenant_id=tenant_id, effect_id=effect_id, evidence=evidence
        )
    )


def resolve_effect(
    conn: Conn,
    tenant_id: str,
    effect_id: uuid.UUID,
    state: str,
    *,
    expected_state: str = "unknown",
    **kwargs: Any,
) -> Row:
    """resolve_effect from the state tests usually resolve from (unknown)."""
    return sqlapi.effects.resolve_effect(
        conn,
        tenant_id=tenant_id,
        effect_id=effect_id,
        expected_state=expected_state,
        state=state,
        **kwargs,
    )
