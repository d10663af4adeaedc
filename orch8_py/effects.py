"""The effect ledger from Python: thin calls to the SQL functions, plus independent
implementations of the id, hash and canonical-JSON rules (used to verify the SQL and to
let people recompute an effect id by hand).

The SQL functions return an outcome rather than raising when they wrote a trace (a
receipt moved to unknown, an invariant result); this module turns those outcomes into
exceptions: blocked and stale -> EffectBlocked, duplicate -> InvariantViolation.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import dict_row, namedtuple_row
from psycopg.types.json import Jsonb

from .db import engine_errors
from .errors import EffectBlocked, InvariantViolation, StaleEffect
from .states import EFFECT_STATES

STATES = EFFECT_STATES

TRANSITIONS = {
    "planned": {"prepared", "abandoned"},
    "prepared": {"dispatched", "abandoned"},
    "dispatched": {"committed", "unknown"},
    "unknown": {"verified", "committed", "compensated", "abandoned"},
    "committed": {"compensated"},
    "verified": {"compensated"},
    "compensated": set(),
    "abandoned": set(),
}

DESTINATION_KEYS = ("url", "provider", "model", "topic", "queue", "resource", "endpoint")


# --- the rules, recomputed in Python -------------------------------------------------


def uuid_from_digest(digest: bytes) -> uuid.UUID:
    b = bytearray(digest[:16])
    b[6] = (b[6] & 0x0F) | 0x80  # version 8
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    return uuid.UUID(bytes=bytes(b))


def deterministic_effect_id(
    continuity_id: uuid.UUID, epoch: int, instance_id: uuid.UUID, block_id: str, attempt: int
) -> uuid.UUID:
    h = hashlib.sha256(b"orch8-effect-v1\x00")
    h.update(continuity_id.bytes)
    h.update(epoch.to_bytes(8, "big"))
    h.update(instance_id.bytes)
    h.update(block_id.encode("utf-8"))
    h.update(attempt.to_bytes(4, "big"))
    return uuid_from_digest(h.digest())


def scope_id(prefix: str, instance_id: uuid.UUID) -> uuid.UUID:
    return uuid_from_digest(hashlib.sha256(prefix.encode() + b"\x00" + instance_id.bytes).digest())


def continuity_id_for(instance_id: uuid.UUID) -> uuid.UUID:
    return scope_id("orch8-effect-scope-v1", instance_id)


def runtime_id_for(instance_id: uuid.UUID) -> uuid.UUID:
    return scope_id("orch8-effect-runtime-v1", instance_id)


def _number(value: int | float | Decimal) -> str:
    d = value if isinstance(value, Decimal) else Decimal(repr(value))
    if d == 0:
        d = abs(d)  # PostgreSQL prints -0 as 0
    return format(d, "f")


def canonical_json(value: Any) -> str:
    """The canonical form that orch8.canonical_json() computes (see docs/SQL_API.md)."""
    if isinstance(value, dict):
        items = sorted(value.items())  # str order is code-point order
        return (
            "{"
            + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{canonical_json(v)}" for k, v in items)
            + "}"
        )
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int | float | Decimal):
        return _number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def request_sha256(handler: str, params: Any) -> str:
    return sha256_hex(canonical_json({"handler": handler, "params": params}))


def destination_fingerprint(handler: str, params: Any) -> str:
    dest = {k: params[k] for k in DESTINATION_KEYS if isinstance(params, dict) and k in params}
    return sha256_hex(canonical_json({"handler": handler, "destination": dest}))


# --- calls into the ledger -------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    outcome: str
    effect_id: uuid.UUID | None
    state: str | None
    kind: str | None
    block_id: str | None
    attempt: int | None
    invariant_id: uuid.UUID | None
    competing_effect_id: uuid.UUID | None
    detail: str | None


def _outcome(conn: psycopg.Connection, sql: str, args: tuple) -> Outcome | None:
    with engine_errors(), conn.cursor(row_factory=namedtuple_row) as cur:
        row = cur.execute(sql, args).fetchone()
    if row is None or row.outcome is None:
        return None
    return Outcome(**row._asdict())


def raise_for(outcome: Outcome) -> Outcome:
    """Turn a refusal into its exception; return a dispatched (or settled) outcome."""
    if outcome.outcome in ("blocked", "stale"):
        err = EffectBlocked(
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
    err.outcome = outcome
    raise err


def begin_effect(
    conn: psycopg.Connection,
    tenant_id: str,
    instance_id: uuid.UUID,
    block_id: str,
    handler: str,
    params: Any,
    attempt: int,
) -> Outcome | None:
    """Write the receipt and move it to dispatched before the handler runs.

    Returns None for a pure handler, the dispatched outcome otherwise; raises
    EffectBlocked (blocked, stale) or InvariantViolation (duplicate).
    """
    out = _outcome(
        conn,
        "SELECT * FROM orch8.begin_effect(%s, %s, %s, %s, %s, %s)",
        (tenant_id, instance_id, block_id, handler, Jsonb(params), attempt),
    )
    return None if out is None else raise_for(out)


def _settled(out: Outcome | None) -> Outcome:
    if out is None:  # only a pure handler yields no outcome, and those are never settled
        raise StaleEffect("no receipt to settle")
    if out.outcome == "stale":
        err = StaleEffect(f"effect {out.effect_id} is {out.state}: {out.detail}")
        err.outcome = out
        raise err
    return out


def commit_effect(conn, tenant_id: str, effect_id: uuid.UUID, output: Any) -> Outcome:
    return _settled(
        _outcome(
            conn,
            "SELECT * FROM orch8.commit_effect(%s, %s, %s)",
            (tenant_id, effect_id, Jsonb(output)),
        )
    )


def mark_effect_unknown(conn, tenant_id: str, effect_id: uuid.UUID, error: str) -> Outcome:
    return _settled(
        _outcome(
            conn,
            "SELECT * FROM orch8.mark_effect_unknown(%s, %s, %s)",
            (tenant_id, effect_id, error),
        )
    )


def abandon_effect_not_applied(
    conn, tenant_id: str, effect_id: uuid.UUID, evidence: dict
) -> Outcome:
    return _settled(
        _outcome(
            conn,
            "SELECT * FROM orch8.abandon_effect_not_applied(%s, %s, %s)",
            (tenant_id, effect_id, Jsonb(evidence)),
        )
    )


def resolve_effect(
    conn,
    tenant_id: str,
    effect_id: uuid.UUID,
    state: str,
    *,
    actor: str,
    evidence: dict | None = None,
    provider_receipt_id: str | None = None,
    note: str | None = None,
    expected_state: str | None = None,
) -> dict:
    """The operator path; returns the receipt as a dict. Raises InvalidTransition,
    InvalidInput, NotFound or StaleEffect ("reload before resolving")."""
    with engine_errors(), conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT * FROM orch8.resolve_effect(%s, %s, %s, %s, %s, %s, %s, %s)",
            (
                tenant_id,
                effect_id,
                state,
                provider_receipt_id,
                Jsonb(evidence or {}),
                actor,
                note,
                expected_state,
            ),
        ).fetchone()
