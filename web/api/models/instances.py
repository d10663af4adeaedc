"""Instances: starting one, the list and one instance, its outputs, audit trail and
signals, and the operator's moves."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, Literal

from pydantic import Field

from orch8_py.rules import LIMITS
from orch8_py.sqlapi.base import NO_OUTPUT

from ..cursors import InstanceCursor
from ..fields import (
    DateTime,
    DeferralReason,
    EffectState,
    IdempotencyKey,
    Identifier,
    InstanceState,
    Int32,
    Int64,
    JsonObject,
    JsonValue,
    Limit,
    NodeKind,
    NodeState,
    NonEmptyText,
    Note,
    SequenceName,
    SignalType,
    Version,
    WaitReason,
    optional,
    present_means_given,
)
from .base import Answer, Body, Path, Query


class InstanceCreate(Body):
    sequence: SequenceName = Field(description="the sequence's name")
    namespace: Identifier | None = Field(default=None, description="default: `default`")
    version: Version | None = Field(default=None, description="default: the latest")
    data: JsonObject | None = None
    config: JsonObject | None = None
    priority: Int32 | None = Field(default=None, description="default: 0")
    idempotency_key: IdempotencyKey | None = Field(
        default=None, description="a key used before in the tenant answers that instance (200)"
    )


class BatchItem(Body):
    data: JsonObject | None = None
    config: JsonObject | None = None
    priority: Int32 | None = Field(default=None, description="default: 0")
    idempotency_key: IdempotencyKey | None = Field(
        default=None,
        description="a key used before in the tenant (or earlier in the batch) answers that "
        "instance",
    )


class InstanceBatchCreate(Body):
    sequence: SequenceName = Field(description="the sequence's name")
    namespace: Identifier | None = Field(default=None, description="default: `default`")
    version: Version | None = Field(default=None, description="default: the latest")
    instances: list[BatchItem] = Field(
        min_length=1,
        max_length=LIMITS["create_batch"],
        description="the instances to start, all in one transaction (the limit create_batch)",
    )


class BatchStarted(Answer):
    id: uuid.UUID
    state: InstanceState
    deduplicated: bool = Field(description="true: the idempotency key was used before")


class InstanceBatchCreated(Answer):
    sequence_id: uuid.UUID
    sequence_version: int
    created: int = Field(description="instances started by this call")
    deduplicated: int = Field(description="items answered by an instance started before")
    items: list[BatchStarted] = Field(description="one per item, in the order given")


class InstanceSummary(Answer):
    id: uuid.UUID
    sequence_id: uuid.UUID
    sequence_namespace: str
    sequence_name: str
    sequence_version: int
    state: InstanceState
    requested_state: InstanceState | None = Field(
        description="a pause or cancel waiting for the running step to end"
    )
    current_block: str | None
    priority: int
    idempotency_key: str | None
    parent_instance_id: uuid.UUID | None
    error: str | None
    next_fire_at: dt.datetime
    created_at: dt.datetime
    updated_at: dt.datetime


class Instance(InstanceSummary):
    context: dict[str, Any] = Field(description="{data, config, runtime}")
    lease_owner: str | None
    lease_expires_at: dt.datetime | None
    sla_at: dt.datetime | None = Field(description="when it must have ended (its sla), or null")
    sla_breached_at: dt.datetime | None = Field(description="when it was found past its sla")


class InstanceCreated(Instance):
    deduplicated: bool = Field(description="true: the idempotency key was used before")


class InstancePage(Answer):
    items: list[InstanceSummary]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null last")


class Output(Answer):
    seq: Int64
    block_id: str
    attempt: int
    sentinel: str | None = Field(description="a runner's marker instead of an output, or null")
    output: Any
    retryable: bool | None
    effect_id: uuid.UUID | None
    created_at: dt.datetime


class OutputList(Answer):
    items: list[Output]


class TreeNode(Answer):
    path: str = Field(description="the node's path: a top-level block's id, else e.g. fan#1/ship")
    parent_path: str | None = Field(description="the node it belongs to ('' is the root list)")
    block_id: str | None = Field(description="the block it executes (null for a root list)")
    kind: NodeKind
    state: NodeState
    attempt: int | None = Field(description="a step's latest attempt")
    effect_id: uuid.UUID | None = Field(description="its latest receipt")
    receipt_state: EffectState | None
    output: Any = Field(description="its latest output (a composite's too), or null")
    error: str | None
    cancel_reason: str | None = Field(description="why it was cancelled (a race lost...)")
    child_instance_id: uuid.UUID | None = Field(description="a sub_sequence's child")
    lease_owner: str | None
    lease_expires_at: dt.datetime | None
    next_fire_at: dt.datetime
    wake_at: dt.datetime | None = Field(
        description="a waiting node's timer: when a sleep ends or a wait times out"
    )
    created_at: dt.datetime
    ended_at: dt.datetime | None
    concurrency_key: str | None = Field(
        description="the rendered concurrency key the step holds while it runs"
    )
    rate_limit_key: str | None = Field(description="the rate limit it takes a token from")
    deferred_by: DeferralReason | None = Field(
        description="why a ready step waits past when it was due: rate_limit (no token "
        "yet: due at next_fire_at, when one will be) or rate_limit_undefined"
    )
    deferrals: int = Field(description="how many times a rate limit deferred it")


class TreeList(Answer):
    items: list[TreeNode] = Field(description="every node, in the order they started")


class Transition(Answer):
    seq: Int64
    from_state: InstanceState | None
    to_state: InstanceState
    actor: str
    reason: str | None
    at: dt.datetime
    db_user: str = Field(description="the PostgreSQL login that made the change")
    api_key_id: uuid.UUID | None = Field(description="the API key it was made with, if any")


class TransitionList(Answer):
    items: list[Transition]


class OperatorRequest(Answer):
    seq: Int64
    action: Literal["pause", "cancel", "resume"]
    actor: str = Field(description="who asked (an API key appears as key:<name>)")
    reason: str | None
    outcome: str = Field(
        description="what the call answered: the new state, requested (applied at the step "
        "in flight's boundary), unchanged, or withdrawn (a resume that withdrew a pending "
        "pause)"
    )
    at: dt.datetime
    db_user: str = Field(description="the PostgreSQL login that asked")
    api_key_id: uuid.UUID | None = Field(description="the API key it was asked with, if any")


class OperatorRequestList(Answer):
    items: list[OperatorRequest]


class Signal(Answer):
    id: Int64
    type: str
    payload: Any
    actor: str
    outcome: str | None = Field(
        description="what it did: a built-in's state, context_updated, consumed, or pending "
        "(kept for a wait_for_signal that has not started)"
    )
    idempotency_key: str | None
    consumed_by: str | None = Field(description="the path of the wait that consumed it")
    consumed_at: dt.datetime | None
    created_at: dt.datetime


class SignalList(Answer):
    items: list[Signal]


class SignalSend(Body):
    type: SignalType = Field(
        description="cancel, pause, resume and update_context (merge the payload into the "
        "instance's data) act; any other name is a custom signal for a wait_for_signal "
        "block: consumed now by the wait for it, else kept until one starts"
    )
    payload: JsonObject | None = None
    idempotency_key: IdempotencyKey | None = Field(
        default=None,
        description="a signal with a key used before for this instance acts on nothing: "
        "200 with the first one (`deduplicated`)",
    )


class Waiting(Answer):
    instance_id: uuid.UUID
    path: str = Field(description="the waiting node")
    kind: NodeKind
    waiting_for: WaitReason
    signal: str | None = Field(description="the signal a wait_for_signal waits for")
    prompt: str | None = Field(description="what a wait_for_input asks (rendered)")
    choices: list[str] | None = Field(description="the answers a wait_for_input accepts")
    child_instance_id: uuid.UUID | None
    worker_task_id: uuid.UUID | None = Field(
        description="the task an external worker runs for the step (waiting for worker)"
    )
    until: dt.datetime | None = Field(
        description="its timer: a sleep's end, a timeout, a worker task's close_by; or null"
    )
    since: dt.datetime
    instance_state: InstanceState
    sequence_name: str
    namespace: str


class WaitingList(Answer):
    items: list[Waiting]


class WaitingQuery(Query):
    waiting_for: WaitReason | None = optional("only nodes waiting for this")
    limit: Limit = 50


class AnswerInput(Body):
    path: NonEmptyText = Field(description="the wait_for_input node's path (see /waiting)")
    choice: NonEmptyText = Field(description="one of the node's choices")
    comment: Note | None = Field(default=None, description="kept with the answer")


class InputAnswered(Answer):
    id: uuid.UUID
    path: str
    state: InstanceState = Field(description="the instance's state after the answer")
    output: dict[str, Any] = Field(
        description="the node's output: choice, comment, answered_by, answered_at"
    )


class Reason(Body):
    reason: Note | None = Field(default=None, description="kept in the audit trail")


class RetryRequest(Body):
    output: JsonValue = Field(
        default=None,
        description="what the settled step returns (null is an output too), when its "
        "receipt is committed or verified; else the output its resolution carries. Refused "
        "(422) for a step that runs again",
        json_schema_extra=present_means_given,
    )

    def given_output(self) -> Any:
        """The output sent (null included), or NO_OUTPUT when the field was left out."""
        return self.output if "output" in self.model_fields_set else NO_OUTPUT


class InstanceMove(Answer):
    id: uuid.UUID
    outcome: str = Field(description="what the SQL function answered")
    state: InstanceState
    requested_state: InstanceState | None


class SignalSent(InstanceMove):
    signal_id: Int64
    deduplicated: bool = Field(description="the idempotency key was used before: nothing acted")


class RetryResult(InstanceMove):
    outcome: str = Field(description="completed_from_evidence or rerun (orch8.retry_instance)")
    block_id: str | None
    effect_id: uuid.UUID | None
    detail: str | None


class InstanceListQuery(Query):
    state: InstanceState | None = optional()
    sequence: SequenceName | None = optional("the sequence's name")
    namespace: Identifier | None = optional("the sequence's namespace")
    created_after: DateTime | None = optional("created at or after (UTC without an offset)")
    created_before: DateTime | None = optional("created before (UTC without an offset)")
    limit: Limit = 50
    cursor: InstanceCursor | None = optional()


class InstancePath(Path):
    instance_id: uuid.UUID
