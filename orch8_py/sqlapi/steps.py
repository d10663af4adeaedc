"""The runner's calls: claim a batch of nodes, begin and finish a step, answer a
composite's question (decide) and start or collect a child (run_child), keep and hand
back leases, read a sequence's blocks, wait for work, and an instance's key-value state."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import errors
from .base import Conn, Jsonb, Row, all_rows, first, objects, one, value

T = TypeVar("T")

WORK_CHANNEL = "orch8_work"
# the columns of orch8.effect_outcome, as Outcome has them
OUTCOME = (
    "outcome, effect_id, state::text AS state, kind, block_id, attempt, invariant_id,"
    " competing_effect_id, detail, idempotency_key"
)


@dataclass(frozen=True)
class Node:
    """A node of an execution tree leased to this runner: what running it needs."""

    path: str  # the ledger's block_id (a top-level block's is its id)
    attempt: int
    block_id: str | None  # the definition's block
    kind: str  # rules.CLAIMABLE_KINDS
    position: int  # a loop's iteration
    phase: str | None  # what a composite asks for: condition, break_on, collection, route
    child_instance_id: uuid.UUID | None  # a sub_sequence's child, once started
    vars: dict[str, Any]  # the variables bound around it
    # a step whose external worker failed or timed out, to decide on (finish_step): the
    # task's id, effect_id, result, error, code, retryable, evidence
    worker_result: dict[str, Any] | None = None


@dataclass(frozen=True)
class Claimed:
    """A node the runner now holds a lease on, with its instance (orch8.claim_work)."""

    tenant_id: str
    id: uuid.UUID  # the instance
    sequence_id: uuid.UUID
    sequence_version: int
    context: dict[str, Any]
    current_block: str  # the node's path
    current_attempt: int
    block_id: str | None
    kind: str
    node_position: int
    phase: str | None
    child_instance_id: uuid.UUID | None
    vars: dict[str, Any]
    parent_instance_id: uuid.UUID | None
    lease_token: uuid.UUID
    progress: dict[str, Any]
    context_version: int = 0  # bumped by update_context: a newer one means re-read context
    worker_result: dict[str, Any] | None = None  # Node.worker_result

    @property
    def node(self) -> Node:
        return Node(
            self.current_block,
            self.current_attempt,
            self.block_id,
            self.kind,
            self.node_position,
            self.phase,
            self.child_instance_id,
            self.vars or {},
            self.worker_result,
        )


@dataclass(frozen=True)
class Outcome:
    """orch8.effect_outcome: what begin_effect, begin_step and the settle functions say."""

    outcome: str | None
    effect_id: uuid.UUID | None
    state: str | None
    kind: str | None
    block_id: str | None
    attempt: int | None
    invariant_id: uuid.UUID | None
    competing_effect_id: uuid.UUID | None
    detail: str | None
    idempotency_key: str | None  # the key the receipt records: what the handler sends


@dataclass(frozen=True)
class Finished:
    """What finish_step, decide and run_child answer: the instance's state and, when the
    database handed this runner the instance's next node under the same lease, that node
    (with the instance's outputs when other runners may have written some)."""

    state: str
    next_block: str | None = None
    next_attempt: int | None = None
    next_block_id: str | None = None
    next_kind: str | None = None
    next_position: int | None = None
    next_phase: str | None = None
    next_child_instance_id: uuid.UUID | None = None
    next_vars: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None
    context_version: int | None = None  # the instance's: newer than the claim's -> re-read

    @property
    def next(self) -> Node | None:
        if self.next_block is None or self.next_kind is None:
            return None
        return Node(
            self.next_block,
            self.next_attempt or 0,
            self.next_block_id,
            self.next_kind,
            self.next_position or 0,
            self.next_phase,
            self.next_child_instance_id,
            self.next_vars or {},
        )


# the columns of a node answer (orch8.node_answer), as Finished has them
ANSWER = (
    "state::text AS state, next_block, next_attempt, next_block_id, next_kind,"
    " next_position, next_phase, next_child_instance_id, next_vars, progress, context_version"
)


def claim_work(conn: Conn, *, worker_id: str, batch: int, lease_seconds: float) -> list[Claimed]:
    return objects(
        conn,
        Claimed,
        "SELECT * FROM orch8.claim_work(p_worker_id => %(worker)s, p_batch => %(batch)s,"
        " p_lease => make_interval(secs => %(lease)s))",
        {"worker": worker_id, "batch": batch, "lease": lease_seconds},
    )


@dataclass(frozen=True)
class BeginCall:
    """One begin_step call: ``not_runnable`` is why this runner cannot run the handler
    itself; the step then goes to external workers if they serve it (outcome queued),
    else fails with it."""

    tenant_id: str
    instance_id: uuid.UUID
    lease_token: uuid.UUID
    block_id: str
    handler: str
    params: dict[str, Any]
    attempt: int
    not_runnable: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            **vars(self),
            "instance_id": str(self.instance_id),
            "lease_token": str(self.lease_token),
        }


@dataclass(frozen=True)
class FinishCall:
    """One finish_step call."""

    tenant_id: str
    instance_id: uuid.UUID
    lease_token: uuid.UUID
    block_id: str
    attempt: int
    effect_id: uuid.UUID | None
    result: str
    output: Any
    error: str | None = None
    retry_in: dt.timedelta | None = None
    error_code: str | None = None

    def as_json(self) -> dict[str, Any]:
        fields = {k: v for k, v in vars(self).items() if k != "retry_in"}
        return {
            **fields,
            "instance_id": str(self.instance_id),
            "lease_token": str(self.lease_token),
            "effect_id": None if self.effect_id is None else str(self.effect_id),
            "retry_in_ms": None
            if self.retry_in is None
            else round(self.retry_in.total_seconds() * 1000),
        }


def begin_step(conn: Conn, **call: Any) -> Outcome:
    """orch8.begin_step, one call in its own transaction (the fields of BeginCall)."""
    c = BeginCall(**call)
    return objects(
        conn,
        Outcome,
        f"SELECT {OUTCOME} FROM orch8.begin_step("
        "p_tenant_id => %(tenant_id)s, p_instance_id => %(instance_id)s,"
        " p_lease_token => %(lease_token)s, p_block_id => %(block_id)s,"
        " p_handler => %(handler)s, p_params => %(params)s, p_attempt => %(attempt)s,"
        " p_not_runnable => %(not_runnable)s)",
        {**vars(c), "params": Jsonb(c.params)},
    )[0]


def finish_step(conn: Conn, **call: Any) -> Finished:
    """orch8.finish_step, one call in its own transaction (the fields of FinishCall)."""
    c = FinishCall(**call)
    return objects(
        conn,
        Finished,
        f"SELECT {ANSWER} FROM orch8.finish_step("
        "p_tenant_id => %(tenant_id)s, p_instance_id => %(instance_id)s,"
        " p_lease_token => %(lease_token)s, p_block_id => %(block_id)s,"
        " p_attempt => %(attempt)s, p_effect_id => %(effect_id)s, p_result => %(result)s,"
        " p_output => %(output)s, p_error => %(error)s, p_retry_in => %(retry_in)s,"
        " p_error_code => %(error_code)s)",
        {**vars(c), "output": Jsonb(c.output)},
    )[0]


def _answers(rows: list[Row], cls: type[T]) -> list[T | Exception]:
    """A batch's rows in call order: the answer, or the exception its call raised."""
    out: list[T | Exception] = []
    for r in sorted(rows, key=lambda r: r["ord"]):
        if r["error_state"] is not None:
            out.append(
                errors.engine_error(
                    r["error_state"], r["error_message"], r["error_detail"], r["error_hint"]
                )
            )
        else:
            out.append(cls(**{k: v for k, v in r.items() if not k.startswith(("ord", "error_"))}))
    return out


def _batch(conn: Conn, function: str, columns: str, calls: list[Any]) -> list[Row]:
    """One group-committed batch: each call's answer columns and its error, if any."""
    return all_rows(
        conn,
        f"SELECT ord, {columns}, error_state, error_message, error_detail, error_hint"
        f" FROM orch8.{function}(%(calls)s)",
        {"calls": Jsonb([c.as_json() for c in calls])},
    )


def begin_steps(conn: Conn, calls: list[BeginCall]) -> list[Outcome | Exception]:
    """orch8.begin_steps: the calls in one transaction (group commit); per call its
    outcome or the exception begin_step raised (that call's writes undone)."""
    return _answers(_batch(conn, "begin_steps", OUTCOME, calls), Outcome)


def finish_steps(conn: Conn, calls: list[FinishCall]) -> list[Finished | Exception]:
    """orch8.finish_steps: the calls in one transaction (group commit); per call its
    answer or the exception finish_step raised (that call's writes undone)."""
    return _answers(_batch(conn, "finish_steps", ANSWER, calls), Finished)


def decide(
    conn: Conn,
    *,
    tenant_id: str,
    instance_id: uuid.UUID,
    lease_token: uuid.UUID,
    path: str,
    value: Any,
    error: str | None = None,
) -> Finished:
    """orch8.decide: the value a loop, for_each or router asked for (or why it could not
    be evaluated)."""
    return objects(
        conn,
        Finished,
        f"SELECT {ANSWER} FROM orch8.decide(p_tenant_id => %(tenant)s,"
        " p_instance_id => %(instance)s, p_lease_token => %(lease)s, p_path => %(path)s,"
        " p_value => %(value)s, p_error => %(error)s)",
        {
            "tenant": tenant_id,
            "instance": instance_id,
            "lease": lease_token,
            "path": path,
            "value": Jsonb(value),
            "error": error,
        },
    )[0]


def run_child(
    conn: Conn,
    *,
    tenant_id: str,
    instance_id: uuid.UUID,
    lease_token: uuid.UUID,
    path: str,
    sequence_id: uuid.UUID | None,
    input_: dict[str, Any] | None,
    error: str | None = None,
) -> Finished:
    """orch8.run_child: start a sub_sequence's child with ``input_`` (or fail the node with
    ``error``), or collect the child that ended."""
    return objects(
        conn,
        Finished,
        f"SELECT {ANSWER} FROM orch8.run_child(p_tenant_id => %(tenant)s,"
        " p_instance_id => %(instance)s, p_lease_token => %(lease)s, p_path => %(path)s,"
        " p_sequence_id => %(sequence)s, p_input => %(input)s, p_error => %(error)s)",
        {
            "tenant": tenant_id,
            "instance": instance_id,
            "lease": lease_token,
            "path": path,
            "sequence": sequence_id,
            "input": None if input_ is None else Jsonb(input_),
            "error": error,
        },
    )[0]


def await_input(
    conn: Conn,
    *,
    tenant_id: str,
    instance_id: uuid.UUID,
    lease_token: uuid.UUID,
    path: str,
    prompt: str | None,
    error: str | None = None,
) -> Finished:
    """orch8.await_input: park a wait_for_input node for a person with the ``prompt`` this
    runner rendered (or fail it with ``error``)."""
    return objects(
        conn,
        Finished,
        f"SELECT {ANSWER} FROM orch8.await_input(p_tenant_id => %(tenant)s,"
        " p_instance_id => %(instance)s, p_lease_token => %(lease)s, p_path => %(path)s,"
        " p_prompt => %(prompt)s, p_error => %(error)s)",
        {
            "tenant": tenant_id,
            "instance": instance_id,
            "lease": lease_token,
            "path": path,
            "prompt": prompt,
            "error": error,
        },
    )[0]


def instance_context(
    conn: Conn, *, tenant_id: str, instance_id: uuid.UUID
) -> tuple[dict[str, Any], int]:
    """An instance's context and its context_version (after an update_context signal)."""
    row = first(
        conn,
        "SELECT context, context_version FROM orch8.task_instances"
        " WHERE tenant_id = %(tenant)s AND id = %(instance)s",
        {"tenant": tenant_id, "instance": instance_id},
    )
    if row is None:
        return {}, 0
    return dict(row["context"]), int(row["context_version"])


@dataclass(frozen=True)
class LostReceipt:
    """A side effect the runner dispatched and finished, as keep_lost_receipts takes it."""

    tenant_id: str
    instance_id: uuid.UUID
    block_id: str
    attempt: int
    effect_id: uuid.UUID
    result: str
    output: Any
    error: str | None


def keep_lost_receipts(conn: Conn, items: list[LostReceipt]) -> list[tuple[uuid.UUID, str]]:
    """orch8.keep_lost_receipts: (effect id, "recorded" or why not) for each receipt it
    recorded or could not handle; nothing for receipts that exist."""
    payload = [
        {
            "tenant_id": i.tenant_id,
            "instance_id": str(i.instance_id),
            "block_id": i.block_id,
            "attempt": i.attempt,
            "effect_id": str(i.effect_id),
            "result": i.result,
            "output": i.output,
            "error": i.error,
        }
        for i in items
    ]
    rows = all_rows(
        conn,
        "SELECT effect_id, outcome FROM orch8.keep_lost_receipts(%(items)s)",
        {"items": Jsonb(payload)},
    )
    return [(r["effect_id"], r["outcome"]) for r in rows]


def heartbeat_leases(
    conn: Conn, *, lease_tokens: list[uuid.UUID], lease_seconds: float
) -> set[uuid.UUID]:
    """The tokens still held, each extended to now + lease."""
    rows = all_rows(
        conn,
        "SELECT orch8.heartbeat_leases(p_lease_tokens => %(tokens)s,"
        " p_lease => make_interval(secs => %(lease)s)) AS token",
        {"tokens": lease_tokens, "lease": lease_seconds},
    )
    return {r["token"] for r in rows}


def release_lease(
    conn: Conn,
    *,
    tenant_id: str,
    instance_id: uuid.UUID,
    lease_token: uuid.UUID,
    reason: str,
    next_fire_at: dt.datetime | None = None,
) -> None:
    one(
        conn,
        "SELECT orch8.release_lease(p_tenant_id => %(tenant)s, p_instance_id => %(instance)s,"
        " p_lease_token => %(lease)s, p_next_fire_at => %(at)s, p_reason => %(reason)s)",
        {
            "tenant": tenant_id,
            "instance": instance_id,
            "lease": lease_token,
            "at": next_fire_at,
            "reason": reason,
        },
    )


def sequence_definition(conn: Conn, *, tenant_id: str, sequence_id: uuid.UUID) -> dict[str, Any]:
    """A stored definition (immutable: callers may cache it forever)."""
    definition: dict[str, Any] = value(
        conn,
        "SELECT definition FROM orch8.sequences WHERE tenant_id = %(tenant)s AND id = %(id)s",
        {"tenant": tenant_id, "id": sequence_id},
    )
    return definition


@dataclass(frozen=True)
class StoredSequence:
    """A stored sequence as the runner caches it: where it lives and its blocks by id
    (orch8.sequence_blocks, every depth)."""

    namespace: str
    name: str
    definition: dict[str, Any]
    blocks: dict[str, dict[str, Any]]


def stored_sequence(conn: Conn, *, tenant_id: str, sequence_id: uuid.UUID) -> StoredSequence:
    """A sequence with its blocks by id (immutable: callers may cache it forever)."""
    row = one(
        conn,
        "SELECT s.namespace::text AS namespace, s.name::text AS name, s.definition,"
        " coalesce((SELECT jsonb_object_agg(b.block_id, b.definition)"
        " FROM orch8.sequence_blocks AS b"
        " WHERE b.tenant_id = s.tenant_id AND b.sequence_id = s.id), '{}') AS blocks"
        " FROM orch8.sequences AS s WHERE s.tenant_id = %(tenant)s AND s.id = %(id)s",
        {"tenant": tenant_id, "id": sequence_id},
    )
    return StoredSequence(row["namespace"], row["name"], row["definition"], row["blocks"])


def builtin_handlers(conn: Conn) -> dict[str, bool]:
    """Every builtin name with whether it has side effects (orch8.builtin_handlers)."""
    rows = all_rows(conn, "SELECT name, has_side_effects FROM orch8.builtin_handlers")
    return {r["name"]: r["has_side_effects"] for r in rows}


def listen_for_work(conn: Conn) -> None:
    """LISTEN on the channel create_instance and every move to scheduled notify."""
    conn.execute(f"LISTEN {WORK_CHANNEL}")


# --- an instance's key-value state (the state builtins) ----------------------------------

MISSING: Any = object()  # get_instance_state's answer for a key that was never set


def get_instance_state(conn: Conn, *, tenant_id: str, instance_id: uuid.UUID, key: str) -> Any:
    """The stored JSON value, or the sentinel ``MISSING`` when the key was never set."""
    text = value(
        conn,
        "SELECT orch8.get_instance_state(p_tenant_id => %(tenant)s,"
        " p_instance_id => %(instance)s, p_key => %(key)s)::text",
        {"tenant": tenant_id, "instance": instance_id, "key": key},
    )
    return MISSING if text is None else json.loads(text)


def set_instance_state(
    conn: Conn,
    *,
    tenant_id: str,
    instance_id: uuid.UUID,
    lease_token: uuid.UUID,
    key: str,
    value_: Any,
) -> None:
    one(
        conn,
        "SELECT orch8.set_instance_state(p_tenant_id => %(tenant)s,"
        " p_instance_id => %(instance)s, p_lease_token => %(lease)s, p_key => %(key)s,"
        " p_value => %(value)s)",
        {
            "tenant": tenant_id,
            "instance": instance_id,
            "lease": lease_token,
            "key": key,
            "value": Jsonb(value_),
        },
    )


def delete_instance_state(
    conn: Conn, *, tenant_id: str, instance_id: uuid.UUID, lease_token: uuid.UUID, key: str
) -> bool:
    return bool(
        value(
            conn,
            "SELECT orch8.delete_instance_state(p_tenant_id => %(tenant)s,"
            " p_instance_id => %(instance)s, p_lease_token => %(lease)s, p_key => %(key)s)",
            {"tenant": tenant_id, "instance": instance_id, "lease": lease_token, "key": key},
        )
    )


def merge_instance_state(
    conn: Conn,
    *,
    tenant_id: str,
    instance_id: uuid.UUID,
    lease_token: uuid.UUID,
    key: str,
    patch: dict[str, Any],
) -> dict[str, Any]:
    merged: dict[str, Any] = json.loads(
        value(
            conn,
            "SELECT orch8.merge_instance_state(p_tenant_id => %(tenant)s,"
            " p_instance_id => %(instance)s, p_lease_token => %(lease)s, p_key => %(key)s,"
            " p_patch => %(patch)s)::text",
            {
                "tenant": tenant_id,
                "instance": instance_id,
                "lease": lease_token,
                "key": key,
                "patch": Jsonb(patch),
            },
        )
    )
    return merged
