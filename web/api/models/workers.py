"""External workers: a handler to register, a worker's poll and its answer (tasks and
verifier tries), the callbacks (heartbeat, complete, fail, a verdict), and tasks as the
operator reads them."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, Strict, StringConstraints, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from orch8_py import rules

from ..cursors import TaskCursor
from ..fields import (
    INT64_MAX,
    NUL_FREE,
    EffectState,
    Identifier,
    InstanceState,
    Int64,
    JsonObject,
    JsonValue,
    Limit,
    OneOf,
    ProviderReceiptId,
    Whole,
    optional,
    present_means_given,
)
from .base import Answer, Body, Path, Query

TaskState = Annotated[str, OneOf(rules.WORKER_TASK_STATES)]
TaskEvent = Annotated[str, OneOf(rules.WORKER_TASK_EVENTS)]
WorkerId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=rules.LIMITS["actor_chars"], pattern=NUL_FREE),
    Field(description="who the worker is (a host and process, say); every callback names it"),
]
ClaimEpoch = Annotated[
    int,
    Field(ge=1, le=INT64_MAX, description="the claim_epoch the poll answered with the task"),
    Whole,
]
Timeout = Annotated[
    Annotated[int, Field(ge=1000, le=rules.LIMITS["wait_ms"]), Whole]
    | Annotated[str, StringConstraints(pattern=r"^([0-9]{1,12}(ms|s|m|h|d))+$")],
    Field(
        description="a duration: milliseconds, or a string of units such as 30s, 5m, 1h30m "
        "(at least 1 s, at most 366 days; checked by orch8.register_worker_handler)"
    ),
]
ErrorCode = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=NUL_FREE)]
POLL_WAIT_MS = rules.LIMITS["worker_poll_wait_ms"]


class WorkerHandlerSet(Body):
    queue: Identifier | None = Field(
        default=None, description="the queue its tasks go to; default `default` (or unchanged)"
    )
    timeout: Timeout | None = Field(
        default=None,
        description="schedule-to-close for steps that declare no timeout: a task not "
        "closed this long after it was queued times out; default 5m (or unchanged)",
    )
    redeliver_unstarted: bool | None = Field(
        default=None,
        description="queue a task again when its lease runs out before its worker's first "
        "heartbeat (the handler sends nothing before it heartbeats, as orch8_py.worker "
        "does); otherwise such a task blocks with its receipt unknown. Default false",
    )


class WorkerHandler(Answer):
    handler: str
    queue: str
    timeout_ms: Int64
    redeliver_unstarted: bool
    queued: Int64 = Field(description="tasks waiting for a worker now")
    oldest_queued_at: dt.datetime | None = Field(description="since when the oldest waits")
    running: Int64 = Field(description="tasks a worker holds now")
    created_by: str
    updated_by: str
    created_at: dt.datetime
    updated_at: dt.datetime


class WorkerHandlerList(Answer):
    items: list[WorkerHandler] = Field(description="by handler")


class WorkerHandlerPath(Path):
    handler: Identifier


class Unregistered(Answer):
    handler: str
    unregistered: bool = Field(description="false: it was not registered")


class PollBody(Body):
    worker_id: WorkerId
    handlers: list[Identifier] = Field(
        min_length=1,
        max_length=rules.LIMITS["worker_poll_handlers"],
        description="the handlers this worker runs",
    )
    verifiers: list[Identifier] = Field(
        default_factory=list,
        max_length=rules.LIMITS["worker_poll_handlers"],
        description="the handlers whose verifier this worker runs (steps with verify "
        "{handler: true}): their due tries come in `verifications`, as do replays "
        "(verify {replay: true}) of the handlers it runs",
    )
    queue: Identifier | None = Field(default=None, description="only this queue's tasks")
    max_tasks: Annotated[int, Field(ge=1, le=rules.LIMITS["worker_poll_tasks"]), Whole] = Field(
        default=1, description="at most this many tasks and verifier tries together"
    )
    wait_ms: Annotated[int, Field(ge=0, le=POLL_WAIT_MS), Whole] = Field(
        default=0,
        description="with nothing to claim, wait up to this long for a task (a long-poll: "
        "answered as soon as one is queued)",
    )
    lease_ms: Annotated[int, Field(ge=1000, le=rules.LIMITS["worker_lease_ms"]), Whole] = Field(
        default=30000,
        description="the lease of each task claimed; each heartbeat extends it as much",
    )


class ClaimedTask(Answer):
    task_id: uuid.UUID
    handler: str
    queue: str
    params: dict[str, Any] = Field(description="the step's params as the runner rendered them")
    effect_id: uuid.UUID = Field(description="the receipt, dispatched before you got the task")
    idempotency_key: str = Field(
        description="hand this to the provider as its idempotency key (the receipt's)"
    )
    attempt: int
    claim_epoch: Int64 = Field(description="name it in every callback about this task")
    lease_ms: int
    lease_expires_at: dt.datetime = Field(description="heartbeat before this")
    close_by: dt.datetime = Field(description="the task times out then (schedule-to-close)")
    instance_id: uuid.UUID
    block_id: str = Field(description="the step's path in its instance")
    checkpoint: JsonValue = Field(
        description="what an earlier attempt of this step saved with a heartbeat, or null"
    )


class ClaimedVerification(Answer):
    effect_id: uuid.UUID = Field(description="the receipt whose outcome is unknown")
    method: Literal["handler", "replay"] = Field(
        description="handler: ask your verifier of the handler; replay: call the handler "
        "again with the same idempotency key (the provider deduplicates)"
    )
    claim_token: uuid.UUID = Field(description="name it in the verdict")
    try_number: int = Field(description="this try (1-based)")
    tries: int = Field(description="tries in the step's verify.schedule")
    lease_expires_at: dt.datetime = Field(description="answer before this")
    handler: str
    params: dict[str, Any] = Field(description="the params as they were dispatched")
    idempotency_key: str
    attempt: int
    instance_id: uuid.UUID
    block_id: str
    receipt: dict[str, Any] = Field(
        description="id, state, kind, provider_receipt_id, error, evidence, created_at, updated_at"
    )


class PollAnswer(Answer):
    tasks: list[ClaimedTask]
    verifications: list[ClaimedVerification]


class TaskPath(Path):
    task_id: uuid.UUID


class HeartbeatBody(Body):
    worker_id: WorkerId
    claim_epoch: ClaimEpoch
    checkpoint: JsonValue = Field(
        default=None,
        description="saved with the task (at most "
        f"{rules.LIMITS['worker_checkpoint_bytes']} bytes as JSON) and handed to the "
        "step's next attempt; left out: the saved one stays",
        json_schema_extra=present_means_given,
    )


class HeartbeatAnswer(Answer):
    lease_expires_at: dt.datetime
    cancel_requested: bool = Field(
        description="the instance (or the branch) was cancelled: finish or fail it soon; "
        "its report is still recorded"
    )
    close_by: dt.datetime


class CompleteBody(Body):
    worker_id: WorkerId
    claim_epoch: ClaimEpoch
    output: JsonValue = Field(
        default=None,
        description="the step's output (its provider_receipt_id, receipt_id or request_id "
        "becomes the receipt's provider receipt id); left out: {}",
        json_schema_extra=present_means_given,
    )


class CompleteAnswer(Answer):
    task_state: TaskState
    instance_state: InstanceState
    repeated: bool = Field(description="this worker had reported it already (same epoch)")


class FailBody(Body):
    model_config = ConfigDict(
        json_schema_extra={
            # not_applied needs evidence (orch8.fail_worker_task), in the schema as well
            "if": {"properties": {"not_applied": {"const": True}}, "required": ["not_applied"]},
            "then": {
                "required": ["evidence"],
                "properties": {"evidence": {"type": "object", "minProperties": 1}},
            },
        }
    )

    worker_id: WorkerId
    claim_epoch: ClaimEpoch
    error: Annotated[str, StringConstraints(min_length=1, max_length=10000, pattern=NUL_FREE)]
    code: ErrorCode | None = Field(
        default=None, description="matched against the step's retry.non_retryable_codes"
    )
    retryable: bool = Field(default=True, description="false: never retry this failure")
    not_applied: bool = Field(
        default=False,
        description="true: nothing was sent (connection refused, a definitive refusal): the "
        "receipt is abandoned, not unknown, and a retry is safe; needs evidence",
    )
    evidence: JsonObject | None = Field(
        default=None,
        validate_default=True,
        description="with not_applied: what shows nothing was sent (not empty)",
    )

    @field_validator("evidence")
    @classmethod
    def _evidence_given(
        cls, evidence: dict[str, Any] | None, info: ValidationInfo
    ) -> dict[str, Any] | None:
        if info.data.get("not_applied") and not evidence:
            raise PydanticCustomError(
                "evidence_needed", "not_applied needs evidence (a non-empty object)"
            )
        return evidence


class FailAnswer(Answer):
    task_state: TaskState
    receipt_state: EffectState
    instance_state: InstanceState
    repeated: bool


class VerdictPath(Path):
    effect_id: uuid.UUID


class VerdictBody(Body):
    worker_id: WorkerId
    claim_token: Annotated[uuid.UUID, Strict(False)] = Field(
        description="the claim_token the poll answered with the try"
    )
    verdict: Literal["applied", "not_applied", "inconclusive"]
    evidence: JsonObject = Field(default_factory=dict, description="what the verifier found")
    provider_receipt_id: ProviderReceiptId | None = None
    output: JsonValue = Field(
        default=None,
        description="applied: what the step would have returned (the workflow continues with it)",
        json_schema_extra=present_means_given,
    )


class VerdictAnswer(Answer):
    outcome: str = Field(description="verified, abandoned, inconclusive or escalated")
    instance_state: InstanceState | None
    detail: str | None


class WorkerTask(Answer):
    id: uuid.UUID
    instance_id: uuid.UUID
    path: str
    attempt: int
    effect_id: uuid.UUID
    handler: str
    queue: str
    params: dict[str, Any]
    idempotency_key: str
    priority: int
    state: TaskState
    claim_epoch: Int64
    worker_id: str | None
    lease_expires_at: dt.datetime | None
    claimed_at: dt.datetime | None
    started_at: dt.datetime | None = Field(description="the latest claim's first heartbeat")
    heartbeat_at: dt.datetime | None
    timeout_ms: Int64
    close_by: dt.datetime
    redeliver_unstarted: bool
    cancel_requested: bool
    result: str | None
    error: str | None
    error_code: str | None
    retryable: bool | None
    evidence: dict[str, Any] | None
    created_at: dt.datetime
    updated_at: dt.datetime
    ended_at: dt.datetime | None


class WorkerTaskEvent(Answer):
    seq: Int64
    event: TaskEvent
    from_state: TaskState | None
    to_state: TaskState
    claim_epoch: Int64
    worker_id: str | None
    detail: dict[str, Any] | None
    actor: str
    recorded_at: dt.datetime


class WorkerTaskDetail(WorkerTask):
    events: list[WorkerTaskEvent] = Field(description="every move, oldest first")


class WorkerTaskPage(Answer):
    items: list[WorkerTask]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null last")


class WorkerTaskQuery(Query):
    state: TaskState | None = optional()
    handler: Identifier | None = optional()
    instance_id: uuid.UUID | None = optional()
    limit: Limit = 50
    cursor: TaskCursor | None = optional()
