"""External workers (sql/functions/workers.sql): register the handlers they serve, the
worker's calls (claim tasks and verifier tries, heartbeat, complete, fail, a verdict),
and the reads the API, the CLI and /metrics show (handlers with their queues, tasks with
their events)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from .base import NO_OUTPUT, Conn, Jsonb, Row, all_rows, first, one, value

TASK_CHANNEL = "orch8_tasks"  # NOTIFY'd with {tenant, handler} for every task queued
# What is answered of a registration (orch8.worker_handler_status, less the tenant).
HANDLER = (
    "handler, queue, timeout_ms, redeliver_unstarted, queued, oldest_queued_at, running,"
    " created_by, updated_by, created_at, updated_at"
)
# What is answered of a task (orch8.worker_tasks, less the tenant and the checkpoint).
TASK = (
    "id, instance_id, path, attempt, effect_id, handler, queue, params, idempotency_key,"
    " priority, state, claim_epoch, worker_id, lease_expires_at, claimed_at, started_at,"
    " heartbeat_at, timeout_ms, close_by, redeliver_unstarted, cancel_requested, result,"
    " error, error_code, retryable, evidence, created_at, updated_at, ended_at"
)
EVENT = "seq, event, from_state, to_state, claim_epoch, worker_id, detail, actor, recorded_at"


# --- registrations ----------------------------------------------------------------------


def register_worker_handler(
    conn: Conn,
    *,
    tenant_id: str,
    handler: str,
    queue: str | None = None,
    timeout: str | None = None,
    redeliver_unstarted: bool | None = None,
    actor: str | None = None,
) -> Row:
    """Register (or change) a handler workers serve; None keeps what it had. ``timeout`` is
    a duration (30s, 5m or milliseconds). Bad input is InvalidInput with
    ``facts["field"]``. Returns it as worker_handler_status shows it."""
    one(
        conn,
        "SELECT 1 FROM orch8.register_worker_handler(p_tenant_id => %(tenant)s,"
        " p_handler => %(handler)s, p_queue => %(queue)s, p_timeout => %(timeout)s,"
        " p_redeliver_unstarted => %(redeliver)s, p_actor => %(actor)s)",
        {
            "tenant": tenant_id,
            "handler": handler,
            "queue": queue,
            "timeout": timeout,
            "redeliver": redeliver_unstarted,
            "actor": actor,
        },
    )
    found = get_worker_handler(conn, tenant_id=tenant_id, handler=handler)
    assert found is not None  # just written, in this transaction
    return found


def unregister_worker_handler(conn: Conn, *, tenant_id: str, handler: str) -> bool:
    """Whether it was registered (its queued and running tasks stay)."""
    return bool(
        value(
            conn,
            "SELECT orch8.unregister_worker_handler(p_tenant_id => %(tenant)s,"
            " p_handler => %(handler)s)",
            {"tenant": tenant_id, "handler": handler},
        )
    )


def get_worker_handler(conn: Conn, *, tenant_id: str, handler: str) -> Row | None:
    return first(
        conn,
        f"SELECT {HANDLER} FROM orch8.worker_handler_status"
        " WHERE tenant_id = %(tenant)s AND handler = %(handler)s",
        {"tenant": tenant_id, "handler": handler},
    )


def list_worker_handlers(conn: Conn, *, tenant_id: str) -> list[Row]:
    return all_rows(
        conn,
        f"SELECT {HANDLER} FROM orch8.worker_handler_status WHERE tenant_id = %(tenant)s"
        " ORDER BY handler",
        {"tenant": tenant_id},
    )


# --- the worker's calls -----------------------------------------------------------------


def claim_worker_tasks(
    conn: Conn,
    *,
    tenant_id: str,
    worker_id: str,
    handlers: list[str],
    queue: str | None,
    max_tasks: int,
    lease_ms: int,
) -> list[Row]:
    """Up to ``max_tasks`` queued tasks, now running under this worker's claim."""
    return all_rows(
        conn,
        "SELECT * FROM orch8.claim_worker_tasks(p_tenant_id => %(tenant)s,"
        " p_worker_id => %(worker)s, p_handlers => %(handlers)s, p_queue => %(queue)s,"
        " p_max => %(max)s, p_lease_ms => %(lease)s)",
        {
            "tenant": tenant_id,
            "worker": worker_id,
            "handlers": handlers,
            "queue": queue,
            "max": max_tasks,
            "lease": lease_ms,
        },
    )


def claim_worker_verifications(
    conn: Conn,
    *,
    tenant_id: str,
    worker_id: str,
    verifiers: list[str],
    handlers: list[str],
    max_tries: int,
    lease_ms: int,
) -> list[Row]:
    """Up to ``max_tries`` due verifier tries: by the verifier of one of ``verifiers``
    (verify.handler), or a replay by one of ``handlers`` (verify.replay)."""
    return all_rows(
        conn,
        "SELECT * FROM orch8.claim_worker_verifications(p_tenant_id => %(tenant)s,"
        " p_worker_id => %(worker)s, p_verifiers => %(verifiers)s, p_max => %(max)s,"
        " p_lease_ms => %(lease)s, p_handlers => %(handlers)s)",
        {
            "tenant": tenant_id,
            "worker": worker_id,
            "verifiers": verifiers,
            "handlers": handlers,
            "max": max_tries,
            "lease": lease_ms,
        },
    )


def heartbeat_worker_task(
    conn: Conn,
    *,
    tenant_id: str,
    task_id: uuid.UUID,
    worker_id: str,
    claim_epoch: int,
    checkpoint: Any = NO_OUTPUT,
) -> Row:
    """The new lease expiry, whether a cancel was asked, and close_by. A worker that no
    longer holds the task: StaleLease (no such task: NotFound)."""
    return one(
        conn,
        "SELECT * FROM orch8.heartbeat_worker_task(p_tenant_id => %(tenant)s,"
        " p_task_id => %(task)s, p_worker_id => %(worker)s, p_claim_epoch => %(epoch)s,"
        " p_checkpoint => %(checkpoint)s)",
        {
            "tenant": tenant_id,
            "task": task_id,
            "worker": worker_id,
            "epoch": claim_epoch,
            "checkpoint": None if checkpoint is NO_OUTPUT else Jsonb(checkpoint),
        },
    )


def task_step(conn: Conn, *, tenant_id: str, task_id: uuid.UUID) -> dict[str, Any] | None:
    """The definition of the step a task runs (its output_schema is checked before a
    complete is recorded); None when there is no such task."""
    row = first(
        conn,
        "SELECT orch8.instance_step(w.tenant_id, w.instance_id, w.path) AS step"
        " FROM orch8.worker_tasks AS w WHERE w.tenant_id = %(tenant)s AND w.id = %(task)s",
        {"tenant": tenant_id, "task": task_id},
    )
    return None if row is None else dict(row["step"] or {})


def complete_worker_task(
    conn: Conn,
    *,
    tenant_id: str,
    task_id: uuid.UUID,
    worker_id: str,
    claim_epoch: int,
    output: Any,
    invalid: str | None = None,
) -> Row:
    """Record a worker's success (``invalid``: why the output breaks output_schema):
    task_state, instance_state, repeated."""
    return one(
        conn,
        "SELECT task_state, instance_state::text AS instance_state, repeated"
        " FROM orch8.complete_worker_task(p_tenant_id => %(tenant)s, p_task_id => %(task)s,"
        " p_worker_id => %(worker)s, p_claim_epoch => %(epoch)s, p_output => %(output)s,"
        " p_invalid => %(invalid)s)",
        {
            "tenant": tenant_id,
            "task": task_id,
            "worker": worker_id,
            "epoch": claim_epoch,
            "output": Jsonb(output),
            "invalid": invalid,
        },
    )


def fail_worker_task(
    conn: Conn,
    *,
    tenant_id: str,
    task_id: uuid.UUID,
    worker_id: str,
    claim_epoch: int,
    error: str,
    code: str | None = None,
    retryable: bool = True,
    not_applied: bool = False,
    evidence: dict[str, Any] | None = None,
) -> Row:
    """Record a worker's failure: task_state, receipt_state, instance_state, repeated."""
    return one(
        conn,
        "SELECT task_state, receipt_state::text AS receipt_state,"
        " instance_state::text AS instance_state, repeated"
        " FROM orch8.fail_worker_task(p_tenant_id => %(tenant)s, p_task_id => %(task)s,"
        " p_worker_id => %(worker)s, p_claim_epoch => %(epoch)s, p_error => %(error)s,"
        " p_code => %(code)s, p_retryable => %(retryable)s, p_not_applied => %(not_applied)s,"
        " p_evidence => %(evidence)s)",
        {
            "tenant": tenant_id,
            "task": task_id,
            "worker": worker_id,
            "epoch": claim_epoch,
            "error": error,
            "code": code,
            "retryable": retryable,
            "not_applied": not_applied,
            "evidence": None if evidence is None else Jsonb(evidence),
        },
    )


def record_worker_verdict(
    conn: Conn,
    *,
    tenant_id: str,
    effect_id: uuid.UUID,
    worker_id: str,
    claim_token: uuid.UUID,
    verdict: str,
    evidence: dict[str, Any],
    provider_receipt_id: str | None = None,
    output: Any = NO_OUTPUT,
) -> Row:
    """A worker's verdict on a verifier try it claimed: outcome, instance_state, detail."""
    return one(
        conn,
        "SELECT outcome, instance_state::text AS instance_state, detail"
        " FROM orch8.record_worker_verdict(p_tenant_id => %(tenant)s,"
        " p_effect_id => %(effect)s, p_worker_id => %(worker)s, p_claim_token => %(token)s,"
        " p_verdict => %(verdict)s, p_evidence => %(evidence)s,"
        " p_provider_receipt_id => %(receipt)s, p_output => %(output)s)",
        {
            "tenant": tenant_id,
            "effect": effect_id,
            "worker": worker_id,
            "token": claim_token,
            "verdict": verdict,
            "evidence": Jsonb(evidence),
            "receipt": provider_receipt_id,
            "output": None if output is NO_OUTPUT else Jsonb(output),
        },
    )


# --- reads ------------------------------------------------------------------------------


def list_worker_tasks(
    conn: Conn,
    *,
    tenant_id: str,
    limit: int,
    state: str | None = None,
    handler: str | None = None,
    instance_id: uuid.UUID | None = None,
    older_than: tuple[dt.datetime, uuid.UUID] | None = None,
) -> list[Row]:
    """Tasks newest first (keyset: ``older_than`` is the (created_at, id) of the last one
    seen)."""
    created, last_id = older_than if older_than is not None else (None, None)
    return all_rows(
        conn,
        f"SELECT {TASK} FROM orch8.worker_tasks WHERE tenant_id = %(tenant)s"
        " AND (%(state)s::text IS NULL OR state = %(state)s::text)"
        " AND (%(handler)s::text IS NULL OR handler = %(handler)s::text)"
        " AND (%(instance)s::uuid IS NULL OR instance_id = %(instance)s::uuid)"
        " AND (%(created)s::timestamptz IS NULL"
        "      OR (created_at, id) < (%(created)s::timestamptz, %(last)s::uuid))"
        " ORDER BY created_at DESC, id DESC LIMIT %(limit)s",
        {
            "tenant": tenant_id,
            "state": state,
            "handler": handler,
            "instance": instance_id,
            "created": created,
            "last": last_id,
            "limit": limit,
        },
    )


def get_worker_task(conn: Conn, *, tenant_id: str, task_id: uuid.UUID) -> Row | None:
    """One task with its events (oldest first), or None."""
    task = first(
        conn,
        f"SELECT {TASK} FROM orch8.worker_tasks WHERE tenant_id = %(tenant)s AND id = %(task)s",
        {"tenant": tenant_id, "task": task_id},
    )
    if task is None:
        return None
    task["events"] = all_rows(
        conn,
        f"SELECT {EVENT} FROM orch8.worker_task_events"
        " WHERE tenant_id = %(tenant)s AND task_id = %(task)s ORDER BY seq",
        {"tenant": tenant_id, "task": task_id},
    )
    return task


def listen_for_tasks(conn: Conn) -> None:
    """LISTEN on the channel every queued task notifies ({tenant, handler})."""
    conn.execute(f"LISTEN {TASK_CHANNEL}")
