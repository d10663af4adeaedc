"""Instances: starting one, the operator's moves (cancel, pause, resume, signal, retry),
and the reads every front end shows (orch8.instance_overview, outputs, the audit trail,
signals, counts)."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput
from ..rules import LIMITS
from ..schemas import first_violation
from .base import NO_OUTPUT, Conn, Jsonb, Row, all_rows, first, objects, value

# An instance as the lists show it (orch8.instance_overview).
SUMMARY = (
    "id, sequence_id, sequence_namespace, sequence_name, sequence_version,"
    " state::text AS state, requested_state::text AS requested_state, current_block,"
    " priority, idempotency_key, parent_instance_id, error, next_fire_at, created_at,"
    " updated_at"
)
DETAIL = SUMMARY + ", context, lease_owner, lease_expires_at, sla_at, sla_breached_at"


@dataclass(frozen=True)
class Created:
    id: uuid.UUID
    state: str
    deduplicated: bool


@dataclass(frozen=True)
class Retried:
    """orch8.retry_instance: completed_from_evidence or rerun, and for which block."""

    outcome: str
    block_id: str | None
    effect_id: uuid.UUID | None
    detail: str


@dataclass(frozen=True)
class Signalled:
    signal_id: int
    outcome: str
    deduplicated: bool  # the idempotency key was used before: nothing acted again


@dataclass(frozen=True)
class Answered:
    """orch8.answer_input: the instance's state after the answer, and the node's output."""

    state: str
    path: str
    output: dict[str, Any]


def create_instance(
    conn: Conn,
    *,
    tenant_id: str,
    sequence_id: uuid.UUID,
    data: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    priority: int = 0,
    idempotency_key: str | None = None,
    next_fire_at: dt.datetime | None = None,
) -> Created:
    """Start an instance. Its data is checked against the sequence's input_schema first
    (PostgreSQL has no JSON Schema validator): InvalidInput naming the JSON pointer."""
    require_input_schema(conn, tenant_id=tenant_id, sequence_id=sequence_id, data=data or {})
    return objects(
        conn,
        Created,
        "SELECT id, state::text AS state, deduplicated FROM orch8.create_instance("
        "p_tenant_id => %(tenant)s, p_sequence_id => %(sequence)s, p_data => %(data)s,"
        " p_config => %(config)s, p_priority => %(priority)s::integer,"
        " p_idempotency_key => %(key)s, p_next_fire_at => %(at)s)",
        {
            "tenant": tenant_id,
            "sequence": sequence_id,
            "data": Jsonb(data or {}),
            "config": Jsonb(config or {}),
            "priority": priority,
            "key": idempotency_key,
            "at": next_fire_at,
        },
    )[0]


def start_instances(
    conn: Conn,
    *,
    tenant_id: str,
    sequence_id: uuid.UUID,
    items: list[dict[str, Any]],
    next_fire_at: dt.datetime | None = None,
) -> list[Created]:
    """Start a batch in one call and one transaction (orch8.create_instances, at most the
    limit create_batch): each item {data, config, priority, idempotency_key}, one Created
    per item in order. Every item's data is checked against the input_schema first; the
    first that breaks it (or that the engine refuses) starts nothing."""
    schema = input_schema(conn, tenant_id=tenant_id, sequence_id=sequence_id)
    if schema is not None:
        for index, item in enumerate(items):
            data = item.get("data") if isinstance(item, dict) else None
            check_input(schema, data if isinstance(data, dict) else {}, index)
    return objects(
        conn,
        Created,
        "SELECT id, state::text AS state, deduplicated FROM orch8.create_instances("
        "p_tenant_id => %(tenant)s, p_sequence_id => %(sequence)s, p_items => %(items)s,"
        " p_next_fire_at => %(at)s) ORDER BY ord",
        {"tenant": tenant_id, "sequence": sequence_id, "items": Jsonb(items), "at": next_fire_at},
    )


def create_instances(conn: Conn, *, tenant_id: str, sequence_id: uuid.UUID, count: int) -> int:
    """Start ``count`` instances of one sequence whose data is {"n": 1..count} (the bench),
    in batches of the limit create_batch built in the database."""
    require_input_schema(conn, tenant_id=tenant_id, sequence_id=sequence_id, data={"n": 1})
    created = 0
    while created < count:
        made: int = value(
            conn,
            "SELECT count(*) FROM orch8.create_instances(%(tenant)s, %(sequence)s,"
            " (SELECT jsonb_agg(jsonb_build_object('data', jsonb_build_object('n', g)))"
            "  FROM generate_series(%(first)s::integer, %(last)s::integer) AS g))",
            {
                "tenant": tenant_id,
                "sequence": sequence_id,
                "first": created + 1,
                "last": min(count, created + LIMITS["create_batch"]),
            },
        )
        created += made
    return created


def input_schema(conn: Conn, *, tenant_id: str, sequence_id: uuid.UUID) -> dict[str, Any] | None:
    """The sequence's input_schema, or None."""
    schema = value(
        conn,
        "SELECT definition -> 'input_schema' FROM orch8.sequences"
        " WHERE tenant_id = %(tenant)s AND id = %(id)s",
        {"tenant": tenant_id, "id": sequence_id},
    )
    return schema if isinstance(schema, dict) else None


def check_input(schema: dict[str, Any], data: dict[str, Any], index: int | None = None) -> None:
    """InvalidInput when ``data`` breaks ``schema``, with the JSON pointer of the first
    place it does (facts: field data, pointer, schema_error, and in a batch the item's
    index)."""
    found = first_violation(schema, data)
    if found is None:
        return
    pointer, message = found
    facts: dict[str, Any] = {"field": "data", "pointer": pointer, "schema_error": message}
    where = ""
    if index is not None:
        facts["index"] = index
        where = f"instance {index}: "
    raise InvalidInput(
        f"{where}data does not match the sequence's input_schema at {pointer}: {message}",
        facts=facts,
    )


def require_input_schema(
    conn: Conn, *, tenant_id: str, sequence_id: uuid.UUID, data: dict[str, Any]
) -> None:
    """InvalidInput when ``data`` breaks the sequence's input_schema (check_input)."""
    schema = input_schema(conn, tenant_id=tenant_id, sequence_id=sequence_id)
    if schema is not None:
        check_input(schema, data)


def get_instance(conn: Conn, *, tenant_id: str, instance_id: uuid.UUID) -> Row | None:
    return first(
        conn,
        f"SELECT {DETAIL} FROM orch8.instance_overview"
        " WHERE tenant_id = %(tenant)s AND id = %(id)s",
        {"tenant": tenant_id, "id": instance_id},
    )


def instance_state(conn: Conn, *, tenant_id: str, instance_id: uuid.UUID) -> str | None:
    state: str | None = value(
        conn,
        "SELECT state::text FROM orch8.task_instances WHERE tenant_id = %(tenant)s AND id = %(id)s",
        {"tenant": tenant_id, "id": instance_id},
    )
    return state


def instance_states(conn: Conn, *, tenant_id: str, instance_ids: list[uuid.UUID]) -> list[Row]:
    """(id, state, error) of several instances (the demo waits on them)."""
    return all_rows(
        conn,
        "SELECT id, state::text AS state, error FROM orch8.task_instances"
        " WHERE tenant_id = %(tenant)s AND id = ANY(%(ids)s)",
        {"tenant": tenant_id, "ids": instance_ids},
    )


def list_instances(
    conn: Conn,
    *,
    tenant_id: str,
    limit: int,
    state: str | None = None,
    sequence: str | None = None,
    namespace: str | None = None,
    created_after: dt.datetime | None = None,
    created_before: dt.datetime | None = None,
    older_than: tuple[dt.datetime, uuid.UUID] | None = None,
    newer_than: tuple[dt.datetime, uuid.UUID] | None = None,
) -> list[Row]:
    """Newest first, keyset-paged on (created_at, id): ``older_than`` is a page of instances
    older than that key; ``newer_than`` the nearest newer ones (still newest first)."""
    if older_than is not None and newer_than is not None:
        raise ValueError("give older_than or newer_than, not both")
    order = "ASC" if newer_than is not None else "DESC"
    key = older_than or newer_than
    rows = all_rows(
        conn,
        f"SELECT {SUMMARY} FROM orch8.instance_overview"
        " WHERE tenant_id = %(tenant)s"
        " AND (%(state)s::text IS NULL OR state = %(state)s::orch8.instance_state)"
        " AND (%(sequence)s::text IS NULL OR sequence_name = %(sequence)s)"
        " AND (%(namespace)s::text IS NULL OR sequence_namespace = %(namespace)s)"
        " AND (%(after)s::timestamptz IS NULL OR created_at >= %(after)s)"
        " AND (%(before)s::timestamptz IS NULL OR created_at < %(before)s)"
        " AND (%(older)s::boolean IS NOT true OR (created_at, id) < (%(k_at)s, %(k_id)s))"
        " AND (%(newer)s::boolean IS NOT true OR (created_at, id) > (%(k_at)s, %(k_id)s))"
        f" ORDER BY created_at {order}, id {order} LIMIT %(limit)s",
        {
            "tenant": tenant_id,
            "state": state,
            "sequence": sequence,
            "namespace": namespace,
            "after": created_after,
            "before": created_before,
            "older": older_than is not None,
            "newer": newer_than is not None,
            "k_at": key[0] if key else None,
            "k_id": key[1] if key else None,
            "limit": limit,
        },
    )
    if newer_than is not None:
        rows.reverse()
    return rows


def instance_outputs(conn: Conn, *, tenant_id: str, instance_id: uuid.UUID) -> list[Row]:
    """Every block_outputs row of the instance, in order."""
    return all_rows(
        conn,
        "SELECT seq, block_id, attempt, sentinel, output, retryable, effect_id, created_at"
        " FROM orch8.block_outputs WHERE tenant_id = %(tenant)s AND instance_id = %(id)s"
        " ORDER BY seq",
        {"tenant": tenant_id, "id": instance_id},
    )


def instance_tree(conn: Conn, *, tenant_id: str, instance_id: uuid.UUID) -> list[Row]:
    """The instance's execution tree (orch8.execution_tree), in the order nodes started:
    every node with its state, attempt, latest receipt, error and lease."""
    return all_rows(
        conn,
        "SELECT path, parent_path, block_id, kind, state::text AS state, attempt, effect_id,"
        " receipt_state::text AS receipt_state, output, error, cancel_reason, child_instance_id,"
        " lease_owner, lease_expires_at, next_fire_at, wake_at, created_at, ended_at,"
        " concurrency_key, rate_limit_key, deferred_by, deferrals"
        " FROM orch8.execution_tree WHERE tenant_id = %(tenant)s AND instance_id = %(id)s"
        " ORDER BY created_at, path",
        {"tenant": tenant_id, "id": instance_id},
    )


def instance_audit(conn: Conn, *, tenant_id: str, instance_id: uuid.UUID) -> list[Row]:
    """The instance's transitions (orch8.instance_transitions), in order."""
    return all_rows(
        conn,
        "SELECT seq, from_state::text AS from_state, to_state::text AS to_state, actor,"
        " reason, at, db_user, api_key_id FROM orch8.instance_transitions"
        " WHERE tenant_id = %(tenant)s AND instance_id = %(id)s ORDER BY seq",
        {"tenant": tenant_id, "id": instance_id},
    )


def instance_requests(conn: Conn, *, tenant_id: str, instance_id: uuid.UUID) -> list[Row]:
    """The pauses, cancels and resumes asked of the instance (orch8.instance_requests), in
    order."""
    return all_rows(
        conn,
        "SELECT seq, action, actor, reason, outcome, at, db_user, api_key_id"
        " FROM orch8.instance_requests"
        " WHERE tenant_id = %(tenant)s AND instance_id = %(id)s ORDER BY seq",
        {"tenant": tenant_id, "id": instance_id},
    )


def instance_signals(conn: Conn, *, tenant_id: str, instance_id: uuid.UUID) -> list[Row]:
    return all_rows(
        conn,
        "SELECT id, signal_type::text AS type, payload, actor, outcome, idempotency_key,"
        " consumed_by, consumed_at, created_at"
        " FROM orch8.instance_signals WHERE tenant_id = %(tenant)s AND instance_id = %(id)s"
        " ORDER BY id",
        {"tenant": tenant_id, "id": instance_id},
    )


def waiting_nodes(
    conn: Conn,
    *,
    tenant_id: str,
    instance_id: uuid.UUID | None = None,
    waiting_for: str | None = None,
    limit: int = 100,
) -> list[Row]:
    """What instances wait for (orch8.waiting_nodes): a sleep, a signal, a person's
    answer, a child, a verifier, an external worker; until when. Longest waiting first."""
    return all_rows(
        conn,
        "SELECT instance_id, path, kind, waiting_for, signal, prompt, choices,"
        " child_instance_id, until, since, instance_state::text AS instance_state,"
        " sequence_name, namespace, worker_task_id FROM orch8.waiting_nodes"
        " WHERE tenant_id = %(tenant)s"
        " AND (%(instance)s::uuid IS NULL OR instance_id = %(instance)s::uuid)"
        " AND (%(for)s::text IS NULL OR waiting_for = %(for)s::text)"
        " ORDER BY since, instance_id, path LIMIT %(limit)s",
        {"tenant": tenant_id, "instance": instance_id, "for": waiting_for, "limit": limit},
    )


def count_by_state(conn: Conn, *, tenant_id: str) -> dict[str, int]:
    """Instances of the tenant per state, every state present (zero when none)."""
    rows = all_rows(
        conn,
        "SELECT s.state::text AS state, count(t.id) AS n"
        " FROM unnest(enum_range(NULL::orch8.instance_state)) AS s (state)"
        " LEFT JOIN orch8.task_instances AS t ON t.tenant_id = %(tenant)s AND t.state = s.state"
        " GROUP BY s.state ORDER BY s.state",
        {"tenant": tenant_id},
    )
    return {r["state"]: r["n"] for r in rows}


def recent_failures(conn: Conn, *, tenant_id: str, limit: int) -> list[Row]:
    return all_rows(
        conn,
        "SELECT id, error, updated_at FROM orch8.task_instances"
        " WHERE tenant_id = %(tenant)s AND state = 'failed'"
        " ORDER BY updated_at DESC, id DESC LIMIT %(limit)s",
        {"tenant": tenant_id, "limit": limit},
    )


# --- the operator's moves -------------------------------------------------------------------

_REQUESTS = {
    "cancel": "orch8.cancel_instance",
    "pause": "orch8.pause_instance",
}


def request_instance_state(
    conn: Conn,
    *,
    move: str,
    tenant_id: str,
    instance_id: uuid.UUID,
    actor: str,
    reason: str | None = None,
) -> str:
    """cancel or pause: the new state, ``requested`` (a running instance, at its next step
    boundary) or ``unchanged``."""
    outcome: str = value(
        conn,
        f"SELECT {_REQUESTS[move]}(p_tenant_id => %(tenant)s, p_instance_id => %(id)s,"
        " p_actor => %(actor)s, p_reason => %(reason)s)",
        {"tenant": tenant_id, "id": instance_id, "actor": actor, "reason": reason},
    )
    return outcome


def resume_instance(
    conn: Conn, *, tenant_id: str, instance_id: uuid.UUID, actor: str, reason: str | None = None
) -> str:
    """scheduled (or waiting, or failed, as its tree says), or running (a pending pause
    withdrawn)."""
    outcome: str = value(
        conn,
        "SELECT orch8.resume_instance(p_tenant_id => %(tenant)s, p_instance_id => %(id)s,"
        " p_actor => %(actor)s, p_reason => %(reason)s)",
        {"tenant": tenant_id, "id": instance_id, "actor": actor, "reason": reason},
    )
    return outcome


def send_signal(
    conn: Conn,
    *,
    tenant_id: str,
    instance_id: uuid.UUID,
    signal_type: str,
    payload: dict[str, Any],
    actor: str,
    idempotency_key: str | None = None,
) -> Signalled:
    """orch8.send_signal: acts once; a repeated ``idempotency_key`` answers the first
    signal with ``deduplicated``."""
    return objects(
        conn,
        Signalled,
        "SELECT signal_id, outcome, deduplicated FROM orch8.send_signal("
        "p_tenant_id => %(tenant)s, p_instance_id => %(id)s, p_signal_type => %(type)s,"
        " p_payload => %(payload)s, p_actor => %(actor)s, p_idempotency_key => %(key)s)",
        {
            "tenant": tenant_id,
            "id": instance_id,
            "type": signal_type,
            "payload": Jsonb(payload),
            "actor": actor,
            "key": idempotency_key,
        },
    )[0]


def answer_input(
    conn: Conn,
    *,
    tenant_id: str,
    instance_id: uuid.UUID,
    path: str,
    choice: str,
    comment: str | None,
    actor: str,
) -> Answered:
    """orch8.answer_input: a person's answer to the wait_for_input at ``path``."""
    return objects(
        conn,
        Answered,
        "SELECT state::text AS state, path, output FROM orch8.answer_input("
        "p_tenant_id => %(tenant)s, p_instance_id => %(id)s, p_path => %(path)s,"
        " p_choice => %(choice)s, p_comment => %(comment)s, p_actor => %(actor)s)",
        {
            "tenant": tenant_id,
            "id": instance_id,
            "path": path,
            "choice": choice,
            "comment": comment,
            "actor": actor,
        },
    )[0]


def retry_instance(
    conn: Conn, *, tenant_id: str, instance_id: uuid.UUID, actor: str, output: Any = NO_OUTPUT
) -> Retried:
    """Retry a failed instance; the receipt that stopped it decides (orch8.retry_instance).
    ``output``: what the settled step returns (else its resolution's). Still unknown or
    dispatched: EffectBlocked with the receipt in ``facts``; no output while later blocks
    read it: InvalidInput with ``read_by``."""
    return objects(
        conn,
        Retried,
        "SELECT outcome, block_id, effect_id, detail FROM orch8.retry_instance("
        "p_tenant_id => %(tenant)s, p_instance_id => %(id)s, p_actor => %(actor)s,"
        " p_output => %(output)s)",
        {
            "tenant": tenant_id,
            "id": instance_id,
            "actor": actor,
            "output": None if output is NO_OUTPUT else Jsonb(output),
        },
    )[0]
