"""Instances: start one (orch8.create_instance), list and read them, their outputs,
audit trail and signals, and the operator's moves: cancel, pause, resume, signal, retry."""

from __future__ import annotations

import uuid
from typing import Any

from flask import Blueprint, g

from orch8_py import sqlapi
from orch8_py.sqlapi import Conn

from ..auth import OPERATOR
from ..db import tenant_tx
from ..problems import Problem
from .cursors import encode_cursor
from .models.instances import (
    AnswerInput,
    InputAnswered,
    Instance,
    InstanceBatchCreate,
    InstanceBatchCreated,
    InstanceCreate,
    InstanceCreated,
    InstanceListQuery,
    InstanceMove,
    InstancePage,
    InstancePath,
    OperatorRequestList,
    OutputList,
    Reason,
    RetryRequest,
    RetryResult,
    SignalList,
    SignalSend,
    SignalSent,
    TransitionList,
    TreeList,
    WaitingList,
    WaitingQuery,
)
from .spec import READ, WRITE, operation

bp = Blueprint("instances", __name__)
TAG = "instances"
AT_ID = {"instance_id": "$response.body#/id"}
FOLLOW = {
    "GetInstance": ("getInstance", AT_ID),
    "GetOutputs": ("listInstanceOutputs", AT_ID),
    "GetTree": ("getInstanceTree", AT_ID),
    "GetAudit": ("listInstanceAudit", AT_ID),
    "GetSignals": ("listInstanceSignals", AT_ID),
    "GetEffects": ("listInstanceEffects", AT_ID),
}


def not_found(instance_id: uuid.UUID) -> Problem:
    return Problem(404, "not found", f"instance {instance_id} not found")


def load(conn: Conn, instance_id: uuid.UUID) -> dict[str, Any]:
    row = sqlapi.instances.get_instance(conn, tenant_id=g.tenant, instance_id=instance_id)
    if row is None:
        raise not_found(instance_id)
    return row


def exists(conn: Conn, instance_id: uuid.UUID) -> None:
    if sqlapi.instances.instance_state(conn, tenant_id=g.tenant, instance_id=instance_id) is None:
        raise not_found(instance_id)


def find_sequence(conn: Conn, namespace: str, name: str, version: int | None) -> dict[str, Any]:
    seq = sqlapi.sequences.get_sequence(
        conn, tenant_id=g.tenant, namespace=namespace, name=name, version=version
    )
    if seq is None:
        which = f" version {version}" if version is not None else ""
        raise Problem(404, "not found", f"sequence {namespace}/{name}{which} not found")
    return seq


@bp.post("/instances")
@operation(
    roles=OPERATOR,
    ok={201: InstanceCreated, 200: InstanceCreated},
    errors=WRITE,
    tag=TAG,
    operation_id="createInstance",
    links={201: FOLLOW, 200: FOLLOW},
)
def create(json: InstanceCreate) -> tuple[InstanceCreated, int]:
    """Start an instance of a sequence (orch8.create_instance)

    201 with the new instance; 200 with the existing one (`deduplicated`: true) when the
    idempotency key was used before in the tenant."""
    namespace = json.namespace or "default"
    with tenant_tx() as conn:
        seq = find_sequence(conn, namespace, json.sequence, json.version)
        made = sqlapi.instances.create_instance(
            conn,
            tenant_id=g.tenant,
            sequence_id=seq["id"],
            data=json.data,
            config=json.config,
            priority=json.priority or 0,
            idempotency_key=json.idempotency_key,
        )
        row = load(conn, made.id)
    answer = InstanceCreated.model_validate({**row, "deduplicated": made.deduplicated})
    return answer, 200 if made.deduplicated else 201


@bp.post("/bulk/instances/start")
@operation(
    roles=OPERATOR,
    ok={201: InstanceBatchCreated, 200: InstanceBatchCreated},
    errors=WRITE,
    tag=TAG,
    operation_id="createInstances",
)
def create_batch(json: InstanceBatchCreate) -> tuple[InstanceBatchCreated, int]:
    """Start many instances of a sequence in one transaction (orch8.create_instances)

    One answer per item, in order. 201 when at least one instance was started; 200 when
    every item's idempotency key was used before. An item that cannot start refuses the
    whole batch (422 naming its index): nothing is written."""
    with tenant_tx() as conn:
        seq = find_sequence(conn, json.namespace or "default", json.sequence, json.version)
        made = sqlapi.instances.start_instances(
            conn,
            tenant_id=g.tenant,
            sequence_id=seq["id"],
            items=[item.model_dump(exclude_none=True) for item in json.instances],
        )
    created = sum(not m.deduplicated for m in made)
    answer = InstanceBatchCreated.model_validate(
        {
            "sequence_id": seq["id"],
            "sequence_version": seq["version"],
            "created": created,
            "deduplicated": len(made) - created,
            "items": [vars(m) for m in made],
        }
    )
    return answer, 201 if created else 200


@bp.get("/instances")
@operation(
    roles=OPERATOR, ok={200: InstancePage}, errors=READ, tag=TAG, operation_id="listInstances"
)
def list_instances(query: InstanceListQuery) -> InstancePage:
    """Instances, newest first, without their context

    Paged on (created_at, id): a walk never repeats or skips an instance, even while new
    ones are created."""
    with tenant_tx() as conn:
        rows = sqlapi.instances.list_instances(
            conn,
            tenant_id=g.tenant,
            limit=query.limit + 1,
            state=query.state,
            sequence=query.sequence,
            namespace=query.namespace,
            created_after=query.created_after,
            created_before=query.created_before,
            older_than=query.cursor,
        )
    items = rows[: query.limit]
    more = len(rows) > query.limit
    next_cursor = encode_cursor(items[-1]["created_at"], items[-1]["id"]) if more else None
    return InstancePage.model_validate({"items": items, "next_cursor": next_cursor})


@bp.get("/instances/<instance_id>")
@operation(
    roles=("worker", *OPERATOR),
    ok={200: Instance},
    errors=READ,
    tag=TAG,
    operation_id="getInstance",
)
def get(path: InstancePath) -> Instance:
    """One instance with its context (worker keys too)"""
    with tenant_tx() as conn:
        return Instance.model_validate(load(conn, path.instance_id))


@bp.get("/instances/<instance_id>/outputs")
@operation(
    roles=OPERATOR, ok={200: OutputList}, errors=READ, tag=TAG, operation_id="listInstanceOutputs"
)
def outputs(path: InstancePath) -> OutputList:
    """The instance's block outputs and sentinels, in order"""
    with tenant_tx() as conn:
        exists(conn, path.instance_id)
        rows = sqlapi.instances.instance_outputs(
            conn, tenant_id=g.tenant, instance_id=path.instance_id
        )
    return OutputList.model_validate({"items": rows})


@bp.get("/instances/<instance_id>/tree")
@operation(roles=OPERATOR, ok={200: TreeList}, errors=READ, tag=TAG, operation_id="getInstanceTree")
def tree(path: InstancePath) -> TreeList:
    """The instance's execution tree (orch8.execution_tree): every node, in the order it
    started, with its state, attempt, latest receipt and output; parent_path links it to
    its parent"""
    with tenant_tx() as conn:
        exists(conn, path.instance_id)
        rows = sqlapi.instances.instance_tree(
            conn, tenant_id=g.tenant, instance_id=path.instance_id
        )
    return TreeList.model_validate({"items": rows})


@bp.get("/instances/<instance_id>/audit")
@operation(
    roles=OPERATOR, ok={200: TransitionList}, errors=READ, tag=TAG, operation_id="listInstanceAudit"
)
def audit(path: InstancePath) -> TransitionList:
    """The instance's state changes (orch8.instance_transitions), in order"""
    with tenant_tx() as conn:
        exists(conn, path.instance_id)
        rows = sqlapi.instances.instance_audit(
            conn, tenant_id=g.tenant, instance_id=path.instance_id
        )
    return TransitionList.model_validate({"items": rows})


@bp.get("/instances/<instance_id>/requests")
@operation(
    roles=OPERATOR,
    ok={200: OperatorRequestList},
    errors=READ,
    tag=TAG,
    operation_id="listInstanceRequests",
)
def requests(path: InstancePath) -> OperatorRequestList:
    """The pauses, cancels and resumes asked of the instance (orch8.instance_requests):
    who asked, why, and what each answered, in order"""
    with tenant_tx() as conn:
        exists(conn, path.instance_id)
        rows = sqlapi.instances.instance_requests(
            conn, tenant_id=g.tenant, instance_id=path.instance_id
        )
    return OperatorRequestList.model_validate({"items": rows})


@bp.get("/instances/<instance_id>/signals")
@operation(
    roles=OPERATOR, ok={200: SignalList}, errors=READ, tag=TAG, operation_id="listInstanceSignals"
)
def signals(path: InstancePath) -> SignalList:
    """The signals sent to the instance"""
    with tenant_tx() as conn:
        exists(conn, path.instance_id)
        rows = sqlapi.instances.instance_signals(
            conn, tenant_id=g.tenant, instance_id=path.instance_id
        )
    return SignalList.model_validate({"items": rows})


def _moved(conn: Conn, instance_id: uuid.UUID, outcome: str) -> dict[str, Any]:
    row = load(conn, instance_id)
    return {
        "id": instance_id,
        "outcome": outcome,
        "state": row["state"],
        "requested_state": row["requested_state"],
    }


@bp.post("/instances/<instance_id>/signals")
@operation(
    roles=OPERATOR,
    ok={201: SignalSent, 200: SignalSent},
    errors=WRITE,
    tag=TAG,
    operation_id="sendSignal",
    links={201: {"GetInstance": ("getInstance", AT_ID)}},
)
def send_signal(path: InstancePath, json: SignalSend) -> tuple[SignalSent, int]:
    """Send a signal, exactly once (orch8.send_signal)

    cancel, pause, resume and update_context act; a custom signal is consumed by the
    instance's wait_for_signal for it, or kept until one starts. 409 for a custom signal
    to an instance that ended. A repeated `idempotency_key`: 200 with the first signal."""
    with tenant_tx() as conn:
        exists(conn, path.instance_id)
        sent = sqlapi.instances.send_signal(
            conn,
            tenant_id=g.tenant,
            instance_id=path.instance_id,
            signal_type=json.type,
            payload=json.payload or {},
            actor=g.actor,
            idempotency_key=json.idempotency_key,
        )
        moved = _moved(conn, path.instance_id, sent.outcome)
    answer = SignalSent.model_validate(
        {**moved, "signal_id": sent.signal_id, "deduplicated": sent.deduplicated}
    )
    return answer, 200 if sent.deduplicated else 201


@bp.get("/instances/<instance_id>/waiting")
@operation(
    roles=OPERATOR,
    ok={200: WaitingList},
    errors=READ,
    tag=TAG,
    operation_id="listInstanceWaiting",
)
def instance_waiting(path: InstancePath) -> WaitingList:
    """What the instance waits for (orch8.waiting_nodes), and until when"""
    with tenant_tx() as conn:
        exists(conn, path.instance_id)
        rows = sqlapi.instances.waiting_nodes(
            conn, tenant_id=g.tenant, instance_id=path.instance_id
        )
    return WaitingList.model_validate({"items": rows})


@bp.get("/waiting")
@operation(roles=OPERATOR, ok={200: WaitingList}, errors=READ, tag=TAG, operation_id="listWaiting")
def waiting(query: WaitingQuery) -> WaitingList:
    """Everything the tenant's instances wait for, longest waiting first

    A sleep (`time`), a signal, a person's answer (`input`: the prompt and the choices), a
    child instance, a verifier; `until` is the node's timer."""
    with tenant_tx() as conn:
        rows = sqlapi.instances.waiting_nodes(
            conn, tenant_id=g.tenant, waiting_for=query.waiting_for, limit=query.limit
        )
    return WaitingList.model_validate({"items": rows})


@bp.post("/instances/<instance_id>/answer")
@operation(
    roles=OPERATOR, ok={200: InputAnswered}, errors=WRITE, tag=TAG, operation_id="answerInput"
)
def answer(path: InstancePath, json: AnswerInput) -> InputAnswered:
    """Answer a wait_for_input (orch8.answer_input)

    The choice must be one of the node's choices (422); a node that is not waiting is
    409, no such node 404. Who answered (the key) and when are kept with the output and
    in the audit trail."""
    with tenant_tx() as conn:
        exists(conn, path.instance_id)
        done = sqlapi.instances.answer_input(
            conn,
            tenant_id=g.tenant,
            instance_id=path.instance_id,
            path=json.path,
            choice=json.choice,
            comment=json.comment,
            actor=g.actor,
        )
    return InputAnswered.model_validate(
        {"id": path.instance_id, "path": done.path, "state": done.state, "output": done.output}
    )


def _request(move: str, instance_id: uuid.UUID, reason: str | None) -> InstanceMove:
    with tenant_tx() as conn:
        outcome = sqlapi.instances.request_instance_state(
            conn,
            move=move,
            tenant_id=g.tenant,
            instance_id=instance_id,
            actor=g.actor,
            reason=reason,
        )
        return InstanceMove.model_validate(_moved(conn, instance_id, outcome))


@bp.post("/instances/<instance_id>/cancel")
@operation(
    roles=OPERATOR, ok={200: InstanceMove}, errors=WRITE, tag=TAG, operation_id="cancelInstance"
)
def cancel(path: InstancePath, json: Reason) -> InstanceMove:
    """Cancel (orch8.cancel_instance); a running instance at its next step boundary"""
    return _request("cancel", path.instance_id, json.reason)


@bp.post("/instances/<instance_id>/pause")
@operation(
    roles=OPERATOR, ok={200: InstanceMove}, errors=WRITE, tag=TAG, operation_id="pauseInstance"
)
def pause(path: InstancePath, json: Reason) -> InstanceMove:
    """Pause (orch8.pause_instance); a running instance at its next step boundary"""
    return _request("pause", path.instance_id, json.reason)


@bp.post("/instances/<instance_id>/resume")
@operation(
    roles=OPERATOR, ok={200: InstanceMove}, errors=WRITE, tag=TAG, operation_id="resumeInstance"
)
def resume(path: InstancePath, json: Reason) -> InstanceMove:
    """Resume (orch8.resume_instance), or withdraw a pending pause"""
    with tenant_tx() as conn:
        outcome = sqlapi.instances.resume_instance(
            conn,
            tenant_id=g.tenant,
            instance_id=path.instance_id,
            actor=g.actor,
            reason=json.reason,
        )
        return InstanceMove.model_validate(_moved(conn, path.instance_id, outcome))


@bp.post("/instances/<instance_id>/retry")
@operation(
    roles=OPERATOR, ok={200: RetryResult}, errors=WRITE, tag=TAG, operation_id="retryInstance"
)
def retry(path: InstancePath, json: RetryRequest) -> RetryResult:
    """Retry a failed instance after resolution (orch8.retry_instance)

    The receipt that stopped it decides: committed or verified completes the step (not
    sent again) with `output` when sent, else the output its resolution carries; abandoned,
    compensated or none reruns it; still unknown is 409 naming the receipt (`effect_id`).
    No output while later blocks read the step's is 422 with `field` output and `read_by`
    (the blocks). An instance waiting on a verifier whose receipt was settled by hand can
    be retried too."""
    with tenant_tx() as conn:
        out = sqlapi.instances.retry_instance(
            conn,
            tenant_id=g.tenant,
            instance_id=path.instance_id,
            actor=g.actor,
            output=json.given_output(),
        )
        moved = _moved(conn, path.instance_id, out.outcome)
    return RetryResult.model_validate(
        {**moved, "block_id": out.block_id, "effect_id": out.effect_id, "detail": out.detail}
    )
