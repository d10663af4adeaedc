"""Schedules: create one (orch8.create_schedule), list and read them
(orch8.schedule_overview), their fire history (orch8.schedule_fires), the three moves
(pause, resume, end), and the runner's tick (orch8.fire_due_schedules)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from .base import Conn, Jsonb, Row, all_rows, first, value

# What is answered of a schedule (orch8.schedule_overview, less the tenant).
SCHEDULE = (
    "id, name, sequence_namespace, sequence_name, cron, timezone, data, priority,"
    " overlap_policy, starts_at, ends_at, state, next_fire_at, last_fire_at,"
    " last_instance_id, last_instance_state, buffered_fire_at, created_by, updated_by,"
    " created_at, updated_at, ended_at"
)
FIRE = (
    "seq, schedule_id, fire_at, outcome, instance_id, previous_instance_id, missed_count,"
    " missed_from, count_capped, error, actor, recorded_at"
)


def create_schedule(
    conn: Conn,
    *,
    tenant_id: str,
    name: str,
    sequence_name: str,
    cron: str,
    timezone: str = "UTC",
    namespace: str = "default",
    data: dict[str, Any] | None = None,
    priority: int = 0,
    overlap_policy: str = "skip",
    starts_at: dt.datetime | None = None,
    ends_at: dt.datetime | None = None,
    actor: str | None = None,
) -> uuid.UUID:
    """The new schedule's id; bad input is InvalidInput with ``facts["field"]``."""
    schedule_id: uuid.UUID = value(
        conn,
        "SELECT orch8.create_schedule(p_tenant_id => %(tenant)s, p_name => %(name)s,"
        " p_sequence_name => %(sequence)s, p_cron => %(cron)s, p_timezone => %(tz)s,"
        " p_namespace => %(namespace)s, p_data => %(data)s, p_priority => %(priority)s,"
        " p_overlap_policy => %(policy)s, p_starts_at => %(starts)s, p_ends_at => %(ends)s,"
        " p_actor => %(actor)s)",
        {
            "tenant": tenant_id,
            "name": name,
            "sequence": sequence_name,
            "cron": cron,
            "tz": timezone,
            "namespace": namespace,
            "data": Jsonb(data if data is not None else {}),
            "priority": priority,
            "policy": overlap_policy,
            "starts": starts_at,
            "ends": ends_at,
            "actor": actor,
        },
    )
    return schedule_id


def list_schedules(
    conn: Conn,
    *,
    tenant_id: str,
    limit: int,
    state: str | None = None,
    after: tuple[str, uuid.UUID] | None = None,
) -> list[Row]:
    """The tenant's schedules by name (ended ones too, unless ``state`` says otherwise);
    ``after`` (name, id) pages on."""
    name, sid = after if after is not None else (None, None)
    return all_rows(
        conn,
        f"SELECT {SCHEDULE} FROM orch8.schedule_overview WHERE tenant_id = %(tenant)s"
        " AND (%(state)s::text IS NULL OR state = %(state)s)"
        " AND (%(name)s::text IS NULL OR (name, id) > (%(name)s::text, %(id)s::uuid))"
        " ORDER BY name, id LIMIT %(limit)s",
        {"tenant": tenant_id, "state": state, "name": name, "id": sid, "limit": limit},
    )


def get_schedule(conn: Conn, *, tenant_id: str, schedule_id: uuid.UUID) -> Row | None:
    return first(
        conn,
        f"SELECT {SCHEDULE} FROM orch8.schedule_overview"
        " WHERE tenant_id = %(tenant)s AND id = %(id)s",
        {"tenant": tenant_id, "id": schedule_id},
    )


def find_schedule(conn: Conn, *, tenant_id: str, name: str) -> Row | None:
    """The schedule of that name that has not ended, else the last one that has."""
    return first(
        conn,
        f"SELECT {SCHEDULE} FROM orch8.schedule_overview"
        " WHERE tenant_id = %(tenant)s AND name = %(name)s"
        " ORDER BY state = 'ended', created_at DESC LIMIT 1",
        {"tenant": tenant_id, "name": name},
    )


def list_fires(conn: Conn, *, tenant_id: str, schedule_id: uuid.UUID, limit: int) -> list[Row]:
    """A schedule's fire history, newest first."""
    return all_rows(
        conn,
        f"SELECT {FIRE} FROM orch8.schedule_fires"
        " WHERE tenant_id = %(tenant)s AND schedule_id = %(id)s"
        " ORDER BY seq DESC LIMIT %(limit)s",
        {"tenant": tenant_id, "id": schedule_id, "limit": limit},
    )


def pause_schedule(
    conn: Conn, *, tenant_id: str, schedule_id: uuid.UUID, actor: str | None = None
) -> str:
    """paused, or unchanged; an ended schedule is InvalidTransition."""
    state: str = value(
        conn,
        "SELECT orch8.pause_schedule(p_tenant_id => %(tenant)s, p_id => %(id)s,"
        " p_actor => %(actor)s)",
        {"tenant": tenant_id, "id": schedule_id, "actor": actor},
    )
    return state


def resume_schedule(
    conn: Conn, *, tenant_id: str, schedule_id: uuid.UUID, actor: str | None = None
) -> str:
    """active, ended (no fire time left) or unchanged; an ended schedule is
    InvalidTransition."""
    state: str = value(
        conn,
        "SELECT orch8.resume_schedule(p_tenant_id => %(tenant)s, p_id => %(id)s,"
        " p_actor => %(actor)s)",
        {"tenant": tenant_id, "id": schedule_id, "actor": actor},
    )
    return state


def end_schedule(
    conn: Conn, *, tenant_id: str, schedule_id: uuid.UUID, actor: str | None = None
) -> str:
    """ended, or unchanged."""
    state: str = value(
        conn,
        "SELECT orch8.end_schedule(p_tenant_id => %(tenant)s, p_id => %(id)s,"
        " p_actor => %(actor)s)",
        {"tenant": tenant_id, "id": schedule_id, "actor": actor},
    )
    return state


def cron_next(conn: Conn, *, cron: str, timezone: str, after: dt.datetime) -> dt.datetime | None:
    """The first fire time of ``cron`` in ``timezone`` after ``after`` (orch8.cron_next)."""
    at: dt.datetime | None = value(
        conn,
        "SELECT orch8.cron_next(p_expr => %(cron)s, p_tz => %(tz)s, p_after => %(after)s)",
        {"cron": cron, "tz": timezone, "after": after},
    )
    return at


# --- the runner's tick -----------------------------------------------------------------


def fire_due_schedules(conn: Conn, *, limit: int, actor: str) -> list[Row]:
    """Fire up to ``limit`` due schedules of every tenant in one transaction (the
    caller's, or the statement's in autocommit); the fires recorded."""
    return all_rows(
        conn,
        "SELECT tenant_id, schedule_id, fire_at, outcome, instance_id, missed_count, error"
        " FROM orch8.fire_due_schedules(p_limit => %(limit)s, p_actor => %(actor)s)",
        {"limit": limit, "actor": actor},
    )
