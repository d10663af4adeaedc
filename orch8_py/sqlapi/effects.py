"""The effect ledger: beginning and settling a side effect, the operator's resolution, and
the reads every front end shows (one receipt, its history, an instance's receipts, the
unresolved queue)."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from .base import NO_OUTPUT, Conn, Jsonb, Row, all_rows, first, objects, one, value
from .steps import OUTCOME, Outcome

# The columns of a receipt as every front end shows it (orch8.effect_receipt_overview).
RECEIPT = (
    "id, continuity_id, epoch, instance_id, block_id, attempt, kind, state::text AS state,"
    " handler, destination_fingerprint, request_sha256, idempotency_key, provider_receipt_id,"
    " error, evidence, created_at, updated_at"
)


def _outcome(conn: Conn, call: str, params: dict[str, Any]) -> Outcome:
    return objects(conn, Outcome, f"SELECT {OUTCOME} FROM {call}", params)[0]


def begin_effect(
    conn: Conn,
    *,
    tenant_id: str,
    instance_id: uuid.UUID,
    block_id: str,
    handler: str,
    params: dict[str, Any],
    attempt: int,
) -> Outcome:
    """Write the receipt and move it to dispatched; ``outcome`` is None for a pure handler,
    else dispatched, blocked, duplicate or stale (returned, never raised)."""
    return _outcome(
        conn,
        "orch8.begin_effect(p_tenant_id => %(tenant)s, p_instance_id => %(instance)s,"
        " p_block_id => %(block)s, p_handler => %(handler)s, p_params => %(params)s,"
        " p_attempt => %(attempt)s)",
        {
            "tenant": tenant_id,
            "instance": instance_id,
            "block": block_id,
            "handler": handler,
            "params": Jsonb(params),
            "attempt": attempt,
        },
    )


def commit_effect(conn: Conn, *, tenant_id: str, effect_id: uuid.UUID, output: Any) -> Outcome:
    return _outcome(
        conn,
        "orch8.commit_effect(p_tenant_id => %(tenant)s, p_id => %(id)s, p_output => %(output)s)",
        {"tenant": tenant_id, "id": effect_id, "output": Jsonb(output)},
    )


def mark_effect_unknown(conn: Conn, *, tenant_id: str, effect_id: uuid.UUID, error: str) -> Outcome:
    return _outcome(
        conn,
        "orch8.mark_effect_unknown(p_tenant_id => %(tenant)s, p_id => %(id)s,"
        " p_error => %(error)s)",
        {"tenant": tenant_id, "id": effect_id, "error": error},
    )


def abandon_effect_not_applied(
    conn: Conn, *, tenant_id: str, effect_id: uuid.UUID, evidence: dict[str, Any]
) -> Outcome:
    return _outcome(
        conn,
        "orch8.abandon_effect_not_applied(p_tenant_id => %(tenant)s, p_id => %(id)s,"
        " p_evidence => %(evidence)s)",
        {"tenant": tenant_id, "id": effect_id, "evidence": Jsonb(evidence)},
    )


def resolve_effect(
    conn: Conn,
    *,
    tenant_id: str,
    effect_id: uuid.UUID,
    expected_state: str,
    state: str,
    actor: str,
    evidence: dict[str, Any] | None = None,
    provider_receipt_id: str | None = None,
    note: str | None = None,
    output: Any = NO_OUTPUT,
) -> Row:
    """The operator path (orch8.resolve_effect); the resolved receipt. ``output`` is what
    the step would have returned (committed or verified only). Raises InvalidTransition,
    InvalidInput, NotFound or StaleEffect ("reload before resolving"), each with the
    current state in ``facts``."""
    return one(
        conn,
        f"SELECT {RECEIPT} FROM orch8.resolve_effect(p_tenant_id => %(tenant)s,"
        " p_id => %(id)s, p_expected_state => %(expected)s::orch8.effect_state,"
        " p_state => %(state)s::orch8.effect_state,"
        " p_provider_receipt_id => %(receipt)s, p_evidence => %(evidence)s,"
        " p_actor => %(actor)s, p_note => %(note)s, p_output => %(output)s)",
        {
            "tenant": tenant_id,
            "id": effect_id,
            "state": state,
            "receipt": provider_receipt_id,
            "evidence": Jsonb(evidence or {}),
            "actor": actor,
            "note": note,
            "expected": expected_state,
            "output": None if output is NO_OUTPUT else Jsonb(output),
        },
    )


# --- reads --------------------------------------------------------------------------------


def effect_receipt(conn: Conn, *, tenant_id: str, effect_id: uuid.UUID) -> Row | None:
    """One receipt with its age and its instance's state, or None; a receipt of an
    archived month (orch8.archive_history_month) is read from the archive."""
    params = {"tenant": tenant_id, "id": effect_id}
    return first(
        conn,
        f"SELECT {RECEIPT}, age, instance_state::text AS instance_state"
        " FROM orch8.effect_receipt_overview WHERE tenant_id = %(tenant)s AND id = %(id)s",
        params,
    ) or first(
        conn,
        f"SELECT {RECEIPT}, age, instance_state::text AS instance_state FROM ("
        " SELECT r.*, orch8.now() - r.created_at AS age, t.state AS instance_state"
        " FROM orch8_archive.effect_receipts AS r LEFT JOIN orch8.task_instances AS t"
        "   ON t.tenant_id = r.tenant_id AND t.id = r.instance_id"
        " WHERE r.tenant_id = %(tenant)s AND r.id = %(id)s) AS archived",
        params,
    )


def verification(conn: Conn, *, tenant_id: str, effect_id: uuid.UUID) -> Row | None:
    """A receipt's verification (state, method, tries, tries in all, next try, requested
    by, last result), or None when none was scheduled."""
    return first(
        conn,
        "SELECT state, method, tries, cardinality(schedule) AS max_tries,"
        " CASE WHEN state = 'pending' THEN next_at END AS next_at, requested_by, last_result,"
        " updated_at FROM orch8.effect_verifications"
        " WHERE tenant_id = %(tenant)s AND effect_id = %(id)s",
        {"tenant": tenant_id, "id": effect_id},
    )


@dataclass(frozen=True)
class ReceiptInContext:
    """A receipt with what rendering its step's params again needs."""

    receipt: Row  # the receipt's columns, its tenant included
    step: dict[str, Any]  # the step's definition ({} when the sequence lost it)
    context: dict[str, Any]  # the instance's context {data, config, runtime}
    progress: dict[str, Any]  # orch8.instance_progress
    vars: dict[str, Any]  # the variables bound around the step's node (orch8.node_vars)


def receipt_in_context(
    conn: Conn, *, tenant_id: str, effect_id: uuid.UUID
) -> ReceiptInContext | None:
    """A receipt, its step's definition and its instance's context and progress, or None."""
    row = first(
        conn,
        f"SELECT {RECEIPT}, tenant_id, step, context, progress, vars FROM ("
        " SELECT r.*, orch8.instance_step(r.tenant_id, r.instance_id, r.block_id) AS step,"
        " t.context, orch8.instance_progress(r.tenant_id, r.instance_id) AS progress,"
        " orch8.node_vars(r.tenant_id, r.instance_id, r.block_id) AS vars"
        " FROM orch8.effect_receipts AS r JOIN orch8.task_instances AS t"
        "   ON t.tenant_id = r.tenant_id AND t.id = r.instance_id"
        " WHERE r.tenant_id = %(tenant)s AND r.id = %(id)s) AS found",
        {"tenant": tenant_id, "id": effect_id},
    )
    if row is None:
        return None
    step, context, progress = row.pop("step"), row.pop("context"), row.pop("progress")
    return ReceiptInContext(row, step or {}, context or {}, progress or {}, row.pop("vars") or {})


def receipts_of_instance(conn: Conn, *, tenant_id: str, instance_id: uuid.UUID) -> list[Row]:
    return all_rows(
        conn,
        f"SELECT {RECEIPT} FROM orch8.effect_receipts"
        " WHERE tenant_id = %(tenant)s AND instance_id = %(instance)s ORDER BY created_at, id",
        {"tenant": tenant_id, "instance": instance_id},
    )


def find_receipts(conn: Conn, *, tenant_id: str, key: str) -> list[Row]:
    """orch8.find_receipts: the receipts a key points at (their id, the idempotency key
    they were sent with, or the provider's receipt id), oldest first."""
    return all_rows(
        conn,
        f"SELECT {RECEIPT} FROM orch8.find_receipts(%(tenant)s, %(key)s)",
        {"tenant": tenant_id, "key": key},
    )


def receipts_of_continuity(
    conn: Conn, *, tenant_id: str, continuity_id: uuid.UUID
) -> list[Row] | None:
    """A ledger scope's receipts in order; None when there is no such scope."""
    scope = first(
        conn,
        "SELECT 1 AS found FROM orch8.continuity_executions"
        " WHERE tenant_id = %(tenant)s AND continuity_id = %(id)s",
        {"tenant": tenant_id, "id": continuity_id},
    )
    if scope is None:
        return None
    return all_rows(
        conn,
        f"SELECT {RECEIPT} FROM orch8.effect_receipts"
        " WHERE tenant_id = %(tenant)s AND continuity_id = %(id)s ORDER BY created_at, id",
        {"tenant": tenant_id, "id": continuity_id},
    )


def other_receipts_of_step(conn: Conn, *, tenant_id: str, receipt: Row) -> list[Row]:
    """The other receipts of the same (instance, block): earlier and later attempts."""
    return all_rows(
        conn,
        f"SELECT {RECEIPT} FROM orch8.effect_receipts"
        " WHERE tenant_id = %(tenant)s AND instance_id = %(instance)s"
        " AND block_id = %(block)s AND id <> %(id)s ORDER BY epoch, attempt, created_at",
        {
            "tenant": tenant_id,
            "instance": receipt["instance_id"],
            "block": receipt["block_id"],
            "id": receipt["id"],
        },
    )


def receipt_events(
    conn: Conn, *, tenant_id: str, receipt_ids: list[uuid.UUID]
) -> dict[uuid.UUID, list[Row]]:
    """The history of each receipt (effect_receipt_events, or the archive's for a receipt
    of an archived month), oldest first."""
    events: dict[uuid.UUID, list[Row]] = {rid: [] for rid in receipt_ids}
    for table in ("orch8.effect_receipt_events", "orch8_archive.effect_receipt_events"):
        # every receipt has events: one without any in the live table is archived
        missing = [rid for rid, found in events.items() if not found]
        if not missing:
            break
        for row in all_rows(
            conn,
            "SELECT receipt_id, event_id, from_state::text AS from_state,"
            " to_state::text AS to_state, actor, note, evidence, at, db_user, api_key_id"
            f" FROM {table}"
            " WHERE tenant_id = %(tenant)s AND receipt_id = ANY(%(ids)s) ORDER BY event_id",
            {"tenant": tenant_id, "ids": missing},
        ):
            events.setdefault(row.pop("receipt_id"), []).append(row)
    return events


def invariant_results(conn: Conn, *, tenant_id: str, effect_id: uuid.UUID) -> list[Row]:
    """The guard decisions that name the receipt, as the dispatched one or the competing one."""
    return all_rows(
        conn,
        "SELECT r.id, r.invariant_id, w.name AS invariant_name, w.rule, r.status,"
        " r.effect_id, r.competing_effect_id, r.instance_id, r.block_id, r.epoch,"
        " r.evidence, r.created_at"
        " FROM orch8.invariant_results AS r"
        " LEFT JOIN orch8.workflow_invariants AS w"
        "   ON w.tenant_id = r.tenant_id AND w.id = r.invariant_id"
        " WHERE r.tenant_id = %(tenant)s"
        " AND (r.effect_id = %(id)s OR r.competing_effect_id = %(id)s)"
        " ORDER BY r.id",
        {"tenant": tenant_id, "id": effect_id},
    )


def unresolved_effects(
    conn: Conn,
    *,
    tenant_id: str,
    kind: str | None = None,
    older_than: dt.timedelta | None = None,
    blocking: bool | None = None,
    limit: int,
) -> list[Row]:
    """The operator queue (orch8.unresolved_effects), oldest first; ``blocking`` keeps only
    the receipts that hold an instance (True) or only the superseded ones (False)."""
    return all_rows(
        conn,
        "SELECT effect_id, kind, state::text AS state, age, state_since, instance_id,"
        " block_id, attempt, epoch, continuity_id, handler, destination_fingerprint,"
        " request_sha256, idempotency_key, provider_receipt_id, error, evidence, created_at,"
        " blocking, verification, verification_tries, verification_max_tries,"
        " verification_next_at"
        " FROM orch8.unresolved_effects"
        " WHERE tenant_id = %(tenant)s AND (%(kind)s::text IS NULL OR kind = %(kind)s)"
        " AND (%(older)s::interval IS NULL OR age > %(older)s::interval)"
        " AND (%(blocking)s::boolean IS NULL OR blocking = %(blocking)s::boolean)"
        " ORDER BY created_at, effect_id LIMIT %(limit)s",
        {
            "tenant": tenant_id,
            "kind": kind,
            "older": older_than,
            "blocking": blocking,
            "limit": limit,
        },
    )


def unresolved_summary(conn: Conn, *, tenant_id: str) -> Row:
    """The queue's depth, by state, by whether it holds an instance, verifications
    escalated to people, and the age of its oldest receipt."""
    return one(
        conn,
        "SELECT count(*) AS depth, max(age) AS oldest,"
        " count(*) FILTER (WHERE state = 'unknown') AS unknown,"
        " count(*) FILTER (WHERE state = 'dispatched') AS dispatched,"
        " count(*) FILTER (WHERE blocking) AS blocking,"
        " count(*) FILTER (WHERE NOT blocking) AS superseded,"
        " count(*) FILTER (WHERE verification = 'pending') AS verifying,"
        " count(*) FILTER (WHERE verification = 'escalated') AS escalated"
        " FROM orch8.unresolved_effects WHERE tenant_id = %(tenant)s",
        {"tenant": tenant_id},
    )


# --- verifiers ----------------------------------------------------------------------------


def request_verifications(
    conn: Conn,
    *,
    tenant_id: str,
    actor: str,
    effect_ids: list[uuid.UUID] | None = None,
    superseded: bool = False,
) -> list[Row]:
    """Schedule the steps' verifiers for the receipts named, or for every superseded
    unknown receipt: one {effect_id, outcome} per receipt (orch8.schedule_verification's
    outcomes: scheduled, rescheduled, already_scheduled, no_verifier, not_unknown,
    not_found)."""
    return all_rows(
        conn,
        "SELECT effect_id, outcome FROM orch8.request_verifications(p_tenant_id => %(tenant)s,"
        " p_effect_ids => %(ids)s::uuid[], p_superseded => %(superseded)s,"
        " p_actor => %(actor)s)",
        {"tenant": tenant_id, "ids": effect_ids, "superseded": superseded, "actor": actor},
    )


@dataclass(frozen=True)
class VerificationClaim:
    """A verifier's try of one receipt (orch8.claim_verifications)."""

    tenant_id: str
    effect_id: uuid.UUID
    lease_token: uuid.UUID
    method: str
    try_: int  # this try, counted from 1
    tries: int  # tries in all
    timeout_seconds: float  # how long the try may take (its lease lasts longer)
    receipt: dict[str, Any]
    step: dict[str, Any]
    context: dict[str, Any]
    progress: dict[str, Any]
    vars: dict[str, Any]  # the variables bound around the step's node


def claim_verifications(
    conn: Conn,
    *,
    worker_id: str,
    batch: int,
    lease_seconds: float,
    handlers: list[str],
    verifiers: list[str],
) -> list[VerificationClaim]:
    return objects(
        conn,
        VerificationClaim,
        "SELECT tenant_id, effect_id, lease_token, method, try AS try_, tries,"
        " timeout_seconds::float8 AS timeout_seconds, receipt, step, context, progress, vars"
        " FROM orch8.claim_verifications(p_worker_id => %(worker)s,"
        " p_batch => %(batch)s, p_lease => make_interval(secs => %(lease)s),"
        " p_handlers => %(handlers)s, p_verifiers => %(verifiers)s)",
        {
            "worker": worker_id,
            "batch": batch,
            "lease": lease_seconds,
            "handlers": handlers,
            "verifiers": verifiers,
        },
    )


def verification_request_matches(
    conn: Conn, *, tenant_id: str, effect_id: uuid.UUID, params: dict[str, Any]
) -> bool:
    """Whether re-rendered params hash to the receipt's request_sha256."""
    return bool(
        value(
            conn,
            "SELECT orch8.verification_request_matches(p_tenant_id => %(tenant)s,"
            " p_effect_id => %(id)s, p_params => %(params)s)",
            {"tenant": tenant_id, "id": effect_id, "params": Jsonb(params)},
        )
    )


def record_verification(
    conn: Conn,
    *,
    tenant_id: str,
    effect_id: uuid.UUID,
    lease_token: uuid.UUID,
    verdict: str,
    evidence: dict[str, Any],
    provider_receipt_id: str | None = None,
    output: Any = NO_OUTPUT,
) -> Row:
    """A verifier's verdict (applied, not_applied, inconclusive) on its try: {outcome,
    instance_state, detail}; outcome stale when the try is no longer this one's."""
    return one(
        conn,
        "SELECT outcome, instance_state::text AS instance_state, detail"
        " FROM orch8.record_verification(p_tenant_id => %(tenant)s, p_effect_id => %(id)s,"
        " p_lease_token => %(lease)s, p_verdict => %(verdict)s, p_evidence => %(evidence)s,"
        " p_provider_receipt_id => %(receipt)s, p_output => %(output)s)",
        {
            "tenant": tenant_id,
            "id": effect_id,
            "lease": lease_token,
            "verdict": verdict,
            "evidence": Jsonb(evidence),
            "receipt": provider_receipt_id,
            "output": None if output is NO_OUTPUT else Jsonb(output),
        },
    )
