"""Schedules: create (orch8.create_schedule), list and read them
(orch8.schedule_overview), their fire history (orch8.schedule_fires), and the three moves
(orch8.pause_schedule, orch8.resume_schedule, orch8.end_schedule). Fires happen in the
runners (orch8.fire_due_schedules), never here."""

from __future__ import annotations

import uuid
from typing import Any

from flask import Blueprint, g

from orch8_py import sqlapi

from ..auth import OPERATOR
from ..db import tenant_tx
from ..problems import Problem
from .cursors import encode_cursor
from .models.base import NoBody
from .models.schedules import (
    FireListQuery,
    Schedule,
    ScheduleCreate,
    ScheduleFireList,
    ScheduleListQuery,
    ScheduleMove,
    SchedulePage,
    SchedulePath,
)
from .spec import READ, WRITE, operation

bp = Blueprint("schedules", __name__)
TAG = "schedules"
AT_ID = {"schedule_id": "$response.body#/id"}


@bp.post("/schedules")
@operation(
    roles=OPERATOR,
    ok={201: Schedule},
    errors=WRITE,
    tag=TAG,
    operation_id="createSchedule",
    links={
        201: {
            "GetSchedule": ("getSchedule", AT_ID),
            "ListFires": ("listScheduleFires", AT_ID),
            "PauseSchedule": ("pauseSchedule", AT_ID),
            "ResumeSchedule": ("resumeSchedule", AT_ID),
            "EndSchedule": ("endSchedule", AT_ID),
        }
    },
)
def create(json: ScheduleCreate) -> tuple[Schedule, int]:
    """Create a cron schedule (orch8.create_schedule)

    Each fire time of `cron` in `timezone` starts an instance of the latest version of
    the sequence, with `data`. Bad input is 422 with `field` (cron: with every problem);
    an unknown sequence is 422 with `field` sequence_name."""
    with tenant_tx() as conn:
        schedule_id = sqlapi.schedules.create_schedule(
            conn,
            tenant_id=g.tenant,
            name=json.name,
            sequence_name=json.sequence_name,
            namespace=json.namespace or "default",
            cron=json.cron,
            timezone=json.timezone or "UTC",
            data=json.data,
            priority=json.priority or 0,
            overlap_policy=json.overlap_policy or "skip",
            starts_at=json.starts_at,
            ends_at=json.ends_at,
            actor=g.actor,
        )
        return Schedule.model_validate(_load(conn, schedule_id)), 201


def _load(conn: sqlapi.Conn, schedule_id: uuid.UUID) -> dict[str, Any]:
    row = sqlapi.schedules.get_schedule(conn, tenant_id=g.tenant, schedule_id=schedule_id)
    if row is None:
        raise Problem(404, "not found", f"schedule {schedule_id} not found")
    return row


@bp.get("/schedules")
@operation(
    roles=OPERATOR, ok={200: SchedulePage}, errors=READ, tag=TAG, operation_id="listSchedules"
)
def list_all(query: ScheduleListQuery) -> SchedulePage:
    """The tenant's schedules by name, ended ones included unless `state` says otherwise"""
    with tenant_tx() as conn:
        rows = sqlapi.schedules.list_schedules(
            conn, tenant_id=g.tenant, limit=query.limit + 1, state=query.state, after=query.cursor
        )
    items = rows[: query.limit]
    more = len(rows) > query.limit
    next_cursor = encode_cursor(items[-1]["name"], items[-1]["id"]) if more else None
    return SchedulePage.model_validate({"items": items, "next_cursor": next_cursor})


@bp.get("/schedules/<schedule_id>")
@operation(roles=OPERATOR, ok={200: Schedule}, errors=READ, tag=TAG, operation_id="getSchedule")
def get_one(path: SchedulePath) -> Schedule:
    """One schedule: its next and last fire, its state and its last instance's"""
    with tenant_tx() as conn:
        return Schedule.model_validate(_load(conn, path.schedule_id))


@bp.get("/schedules/<schedule_id>/fires")
@operation(
    roles=OPERATOR,
    ok={200: ScheduleFireList},
    errors=READ,
    tag=TAG,
    operation_id="listScheduleFires",
)
def fires(path: SchedulePath, query: FireListQuery) -> ScheduleFireList:
    """The fire history of a schedule, newest first: every fire time considered and what
    came of it (started, skipped_overlap, buffered, missed, cancelled_previous)"""
    with tenant_tx() as conn:
        _load(conn, path.schedule_id)
        rows = sqlapi.schedules.list_fires(
            conn, tenant_id=g.tenant, schedule_id=path.schedule_id, limit=query.limit
        )
    return ScheduleFireList.model_validate({"items": rows})


def _move(move: str, schedule_id: uuid.UUID) -> ScheduleMove:
    do = {
        "pause": sqlapi.schedules.pause_schedule,
        "resume": sqlapi.schedules.resume_schedule,
        "end": sqlapi.schedules.end_schedule,
    }[move]
    with tenant_tx() as conn:
        outcome = do(conn, tenant_id=g.tenant, schedule_id=schedule_id, actor=g.actor)
        row = _load(conn, schedule_id)
    return ScheduleMove.model_validate(
        {
            "id": row["id"],
            "outcome": outcome,
            "state": row["state"],
            "next_fire_at": row["next_fire_at"],
        }
    )


@bp.post("/schedules/<schedule_id>/pause")
@operation(
    roles=OPERATOR, ok={200: ScheduleMove}, errors=WRITE, tag=TAG, operation_id="pauseSchedule"
)
def pause(path: SchedulePath, json: NoBody) -> ScheduleMove:
    """Pause (orch8.pause_schedule): no fire until resumed; an ended one is 409"""
    return _move("pause", path.schedule_id)


@bp.post("/schedules/<schedule_id>/resume")
@operation(
    roles=OPERATOR, ok={200: ScheduleMove}, errors=WRITE, tag=TAG, operation_id="resumeSchedule"
)
def resume(path: SchedulePath, json: NoBody) -> ScheduleMove:
    """Resume (orch8.resume_schedule): the next fire is computed from now (the paused
    period is not caught up); an ended one is 409"""
    return _move("resume", path.schedule_id)


@bp.post("/schedules/<schedule_id>/end")
@operation(
    roles=OPERATOR, ok={200: ScheduleMove}, errors=WRITE, tag=TAG, operation_id="endSchedule"
)
def end(path: SchedulePath, json: NoBody) -> ScheduleMove:
    """End a schedule for good (orch8.end_schedule): no more fires, its name is free again;
    it and its history stay readable"""
    return _move("end", path.schedule_id)
