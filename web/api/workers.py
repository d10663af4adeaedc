"""External workers (docs/WORKERS.md): operators register the handlers workers serve;
workers long-poll for tasks (and verifier tries), heartbeat, and report. Every callback
names the worker and the claim epoch it got with the task: a worker that no longer holds
the task is answered 409 and changes nothing (sql/functions/workers.sql)."""

from __future__ import annotations

import time
from typing import Any

from flask import Blueprint, current_app, g

from orch8_py import sqlapi
from orch8_py.schemas import output_problem

from ..auth import OPERATOR, WORKER
from ..db import tenant_tx
from ..problems import Problem
from . import long_poll
from .cursors import encode_cursor
from .models.workers import (
    CompleteAnswer,
    CompleteBody,
    FailAnswer,
    FailBody,
    HeartbeatAnswer,
    HeartbeatBody,
    PollAnswer,
    PollBody,
    TaskPath,
    Unregistered,
    VerdictAnswer,
    VerdictBody,
    VerdictPath,
    WorkerHandler,
    WorkerHandlerList,
    WorkerHandlerPath,
    WorkerHandlerSet,
    WorkerTaskDetail,
    WorkerTaskPage,
    WorkerTaskQuery,
)
from .spec import READ, WRITE, operation

bp = Blueprint("workers", __name__)
TAG = "workers"
# verifier tries become due by time, not by a notification: a waiting poll that asks for
# them claims again this often
VERIFY_RECHECK = 2.0
CALLBACK = (400, 401, 403, 404, 409, 413, 415, 422, 503)
AT_TASK = {"task_id": "$response.body#/tasks/0/task_id"}


# --- registrations ----------------------------------------------------------------------


@bp.put("/workers/handlers/<handler>")
@operation(
    roles=OPERATOR,
    ok={200: WorkerHandler},
    errors=WRITE,
    tag=TAG,
    operation_id="registerWorkerHandler",
)
def register(path: WorkerHandlerPath, json: WorkerHandlerSet) -> WorkerHandler:
    """Register (or change) a handler external workers serve
    (orch8.register_worker_handler)

    From now on a step naming it is dispatched as a worker task, whatever a runner has
    loaded. Fields left out keep what the registration had. A builtin handler is 422."""
    with tenant_tx() as conn:
        row = sqlapi.workers.register_worker_handler(
            conn,
            tenant_id=g.tenant,
            handler=path.handler,
            queue=json.queue,
            timeout=None if json.timeout is None else str(json.timeout),
            redeliver_unstarted=json.redeliver_unstarted,
            actor=g.actor,
        )
    return WorkerHandler.model_validate(row)


@bp.get("/workers/handlers")
@operation(
    roles=(*WORKER, *OPERATOR),
    ok={200: WorkerHandlerList},
    errors=READ,
    tag=TAG,
    operation_id="listWorkerHandlers",
)
def list_handlers() -> WorkerHandlerList:
    """The handlers the tenant's workers serve, with their tasks queued and running"""
    with tenant_tx() as conn:
        rows = sqlapi.workers.list_worker_handlers(conn, tenant_id=g.tenant)
    return WorkerHandlerList.model_validate({"items": rows})


@bp.get("/workers/handlers/<handler>")
@operation(
    roles=(*WORKER, *OPERATOR),
    ok={200: WorkerHandler},
    errors=READ,
    tag=TAG,
    operation_id="getWorkerHandler",
)
def get_handler(path: WorkerHandlerPath) -> WorkerHandler:
    """One registered handler, with its tasks queued and running"""
    with tenant_tx() as conn:
        row = sqlapi.workers.get_worker_handler(conn, tenant_id=g.tenant, handler=path.handler)
    if row is None:
        raise Problem(404, "not found", f"handler {path.handler!r} is not registered")
    return WorkerHandler.model_validate(row)


@bp.delete("/workers/handlers/<handler>")
@operation(
    roles=OPERATOR,
    ok={200: Unregistered},
    errors=(401, 403, 404, 422, 503),
    tag=TAG,
    operation_id="unregisterWorkerHandler",
)
def unregister(path: WorkerHandlerPath) -> Unregistered:
    """Stop dispatching a handler to workers (orch8.unregister_worker_handler)

    Its steps run in runners again (or fail where none has it); tasks already queued or
    running are still served."""
    with tenant_tx() as conn:
        done = sqlapi.workers.unregister_worker_handler(
            conn, tenant_id=g.tenant, handler=path.handler
        )
    return Unregistered(handler=path.handler, unregistered=done)


# --- the worker's calls -----------------------------------------------------------------


def _claim(body: PollBody) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    with tenant_tx() as conn:
        tasks = sqlapi.workers.claim_worker_tasks(
            conn,
            tenant_id=g.tenant,
            worker_id=body.worker_id,
            handlers=body.handlers,
            queue=body.queue,
            max_tasks=body.max_tasks,
            lease_ms=body.lease_ms,
        )
        # verifier tries (by a verifier named, or a replay by a handler named) fill what
        # room the tasks left: a worker gets at most max_tasks things to do
        room = body.max_tasks - len(tasks)
        tries = (
            sqlapi.workers.claim_worker_verifications(
                conn,
                tenant_id=g.tenant,
                worker_id=body.worker_id,
                verifiers=body.verifiers,
                handlers=body.handlers,
                max_tries=room,
                lease_ms=body.lease_ms,
            )
            if room > 0
            else []
        )
    return tasks, tries


@bp.post("/workers/tasks/poll")
@operation(
    roles=WORKER,
    ok={200: PollAnswer},
    errors=(400, 401, 403, 404, 413, 415, 422, 503),
    tag=TAG,
    operation_id="pollWorkerTasks",
    links={
        200: {
            "Heartbeat": ("heartbeatWorkerTask", AT_TASK),
            "Complete": ("completeWorkerTask", AT_TASK),
            "Fail": ("failWorkerTask", AT_TASK),
        }
    },
)
def poll(json: PollBody) -> PollAnswer:
    """Claim tasks of these handlers, waiting up to `wait_ms` for one (a long-poll)

    Answers as soon as a task is claimed: at once when one is queued, else when one is
    queued while the poll waits (woken by NOTIFY), else after `wait_ms` with empty lists.
    Each task comes with its params, the effect id and the idempotency key to hand to the
    provider, the attempt, the claim epoch every callback must name, and the lease
    expiry: heartbeat before it. A server with every long-poll slot taken answers at
    once."""
    wake = long_poll.wakeup(current_app)
    end = time.monotonic() + json.wait_ms / 1000
    handlers = set(json.handlers)
    slot = False
    try:
        while True:
            mark = wake.mark()
            tasks, tries = _claim(json)
            left = end - time.monotonic()
            if tasks or tries or left <= 0:
                break
            if not slot:
                slot = wake.take_slot()
                if not slot:
                    break
            recheck = min(left, VERIFY_RECHECK) if json.verifiers else left
            wake.wait(mark, g.tenant, handlers, recheck)
    finally:
        if slot:
            wake.give_slot()
    return PollAnswer.model_validate({"tasks": tasks, "verifications": tries})


@bp.post("/workers/tasks/<uuid:task_id>/heartbeat")
@operation(
    roles=WORKER,
    ok={200: HeartbeatAnswer},
    errors=CALLBACK,
    tag=TAG,
    operation_id="heartbeatWorkerTask",
)
def heartbeat(path: TaskPath, json: HeartbeatBody) -> HeartbeatAnswer:
    """Keep a task: extend its lease (the first heartbeat confirms pickup)

    Optionally saves a checkpoint for the step's next attempt. `cancel_requested` says
    the instance was cancelled meanwhile. 409: this worker no longer holds the task (its
    lease ran out, it was claimed again, it timed out): stop, and do not report it."""
    with tenant_tx() as conn:
        row = sqlapi.workers.heartbeat_worker_task(
            conn,
            tenant_id=g.tenant,
            task_id=path.task_id,
            worker_id=json.worker_id,
            claim_epoch=json.claim_epoch,
            **({"checkpoint": json.checkpoint} if "checkpoint" in json.model_fields_set else {}),
        )
    return HeartbeatAnswer.model_validate(row)


@bp.post("/workers/tasks/<uuid:task_id>/complete")
@operation(
    roles=WORKER,
    ok={200: CompleteAnswer},
    errors=CALLBACK,
    tag=TAG,
    operation_id="completeWorkerTask",
)
def complete(path: TaskPath, json: CompleteBody) -> CompleteAnswer:
    """Report a task done, in one transaction: its receipt committed, the output recorded,
    the instance moved on

    An output that breaks the step's output_schema is recorded as it is (the effect
    happened) and fails the step. Repeating the same call answers the same
    (`repeated`). 409: this worker no longer holds the task; nothing changed."""
    output = json.output if "output" in json.model_fields_set else {}
    with tenant_tx() as conn:
        step = sqlapi.workers.task_step(conn, tenant_id=g.tenant, task_id=path.task_id)
        if step is None:
            raise Problem(404, "not found", f"worker task {path.task_id} not found")
        schema = step.get("output_schema")
        row = sqlapi.workers.complete_worker_task(
            conn,
            tenant_id=g.tenant,
            task_id=path.task_id,
            worker_id=json.worker_id,
            claim_epoch=json.claim_epoch,
            output=output,
            invalid=output_problem(schema, output) if isinstance(schema, dict) else None,
        )
    return CompleteAnswer.model_validate(row)


@bp.post("/workers/tasks/<uuid:task_id>/fail")
@operation(
    roles=WORKER,
    ok={200: FailAnswer},
    errors=CALLBACK,
    tag=TAG,
    operation_id="failWorkerTask",
)
def fail(path: TaskPath, json: FailBody) -> FailAnswer:
    """Report a task failed: its receipt becomes unknown (or abandoned, with
    `not_applied` and evidence), then the step's retry policy decides

    A new attempt (after the backoff) is a new task with a new receipt; an unknown
    receipt is retried only as the step's ambiguity mode says. 409: this worker no
    longer holds the task; nothing changed."""
    with tenant_tx() as conn:
        row = sqlapi.workers.fail_worker_task(
            conn,
            tenant_id=g.tenant,
            task_id=path.task_id,
            worker_id=json.worker_id,
            claim_epoch=json.claim_epoch,
            error=json.error,
            code=json.code,
            retryable=json.retryable,
            not_applied=json.not_applied,
            evidence=json.evidence,
        )
    return FailAnswer.model_validate(row)


@bp.post("/workers/verifications/<effect_id>/verdict")
@operation(
    roles=WORKER,
    ok={200: VerdictAnswer},
    errors=CALLBACK,
    tag=TAG,
    operation_id="recordWorkerVerdict",
)
def verdict(path: VerdictPath, json: VerdictBody) -> VerdictAnswer:
    """A verifier's verdict on a try this worker claimed (orch8.record_worker_verdict)

    applied: the receipt is verified (with `output`, the step completes with it);
    not_applied: abandoned (the step retries, as its verify says); inconclusive: the next
    try follows the schedule. 409: the try is no longer this worker's."""
    with tenant_tx() as conn:
        row = sqlapi.workers.record_worker_verdict(
            conn,
            tenant_id=g.tenant,
            effect_id=path.effect_id,
            worker_id=json.worker_id,
            claim_token=json.claim_token,
            verdict=json.verdict,
            evidence=json.evidence,
            provider_receipt_id=json.provider_receipt_id,
            **({"output": json.output} if "output" in json.model_fields_set else {}),
        )
    return VerdictAnswer.model_validate(row)


# --- what operators read ----------------------------------------------------------------


@bp.get("/workers/tasks")
@operation(
    roles=OPERATOR, ok={200: WorkerTaskPage}, errors=READ, tag=TAG, operation_id="listWorkerTasks"
)
def list_tasks(query: WorkerTaskQuery) -> WorkerTaskPage:
    """The tenant's worker tasks, newest first"""
    with tenant_tx() as conn:
        rows = sqlapi.workers.list_worker_tasks(
            conn,
            tenant_id=g.tenant,
            limit=query.limit + 1,
            state=query.state,
            handler=query.handler,
            instance_id=query.instance_id,
            older_than=query.cursor,
        )
    items = rows[: query.limit]
    more = len(rows) > query.limit
    next_cursor = encode_cursor(items[-1]["created_at"], items[-1]["id"]) if more else None
    return WorkerTaskPage.model_validate({"items": items, "next_cursor": next_cursor})


@bp.get("/workers/tasks/<uuid:task_id>")
@operation(
    roles=OPERATOR, ok={200: WorkerTaskDetail}, errors=READ, tag=TAG, operation_id="getWorkerTask"
)
def get_task(path: TaskPath) -> WorkerTaskDetail:
    """One worker task with every move it made (claims, heartbeats confirmed, its end)"""
    with tenant_tx() as conn:
        row = sqlapi.workers.get_worker_task(conn, tenant_id=g.tenant, task_id=path.task_id)
    if row is None:
        raise Problem(404, "not found", f"worker task {path.task_id} not found")
    return WorkerTaskDetail.model_validate(row)
