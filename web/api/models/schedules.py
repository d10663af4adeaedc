"""Schedules: one to create, the schedule as the overview shows it, its moves (pause,
resume, end) and its fire history."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any

from pydantic import Field, StringConstraints

from orch8_py import rules

from ..cursors import ScheduleCursor
from ..fields import (
    NUL_FREE,
    DateTime,
    Identifier,
    InstanceState,
    Int32,
    Int64,
    JsonObject,
    Limit,
    OneOf,
    SequenceName,
    optional,
)
from .base import Answer, Body, Path, Query

ScheduleState = Annotated[str, OneOf(rules.SCHEDULE_STATES)]
OverlapPolicy = Annotated[str, OneOf(rules.OVERLAP_POLICIES)]
FireOutcome = Annotated[str, OneOf(rules.SCHEDULE_FIRE_OUTCOMES)]
Cron = Annotated[
    str,
    StringConstraints(min_length=1, max_length=200, pattern=NUL_FREE),
    Field(
        description="5 fields: minute hour day-of-month month day-of-week (*, n, a-b, */n, "
        "a-b/n, lists, JAN-DEC, SUN-SAT; 0 and 7 are Sunday), validated by "
        "orch8.cron_problems (422 `field` cron with every problem)"
    ),
]
TimeZone = Annotated[
    str,
    StringConstraints(min_length=1, max_length=100, pattern=NUL_FREE),
    Field(description="an IANA time zone name (pg_timezone_names), e.g. Europe/Berlin"),
]


class ScheduleCreate(Body):
    name: Identifier
    sequence_name: SequenceName = Field(description="each fire starts its latest version")
    namespace: Identifier | None = Field(default=None, description="default: `default`")
    cron: Cron
    timezone: TimeZone | None = Field(default=None, description="default: UTC")
    data: JsonObject | None = Field(default=None, description="the instances' data; default {}")
    priority: Int32 | None = Field(default=None, description="the instances' priority; default 0")
    overlap_policy: OverlapPolicy | None = Field(
        default=None,
        description="while the last instance has not ended: allow, skip (the default), "
        "buffer_one or cancel_previous",
    )
    starts_at: DateTime | None = Field(default=None, description="no fire time before this")
    ends_at: DateTime | None = Field(
        default=None, description="fire times are before this; then the schedule ends"
    )


class Schedule(Answer):
    id: uuid.UUID
    name: str
    sequence_namespace: str
    sequence_name: str
    cron: str
    timezone: str
    data: dict[str, Any]
    priority: int
    overlap_policy: OverlapPolicy
    starts_at: dt.datetime | None
    ends_at: dt.datetime | None
    state: ScheduleState
    next_fire_at: dt.datetime | None = Field(description="null unless active")
    last_fire_at: dt.datetime | None = Field(description="the last fire time that started")
    last_instance_id: uuid.UUID | None
    last_instance_state: InstanceState | None
    buffered_fire_at: dt.datetime | None = Field(
        description="buffer_one: the fire time waiting for the last instance to end"
    )
    created_by: str
    updated_by: str
    created_at: dt.datetime
    updated_at: dt.datetime
    ended_at: dt.datetime | None


class SchedulePage(Answer):
    items: list[Schedule]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null last")


class ScheduleMove(Answer):
    id: uuid.UUID
    outcome: str = Field(description="what the SQL function answered (unchanged: nothing to do)")
    state: ScheduleState
    next_fire_at: dt.datetime | None


class ScheduleFire(Answer):
    seq: Int64
    schedule_id: uuid.UUID
    fire_at: dt.datetime = Field(description="the fire time (missed: the last one missed)")
    outcome: FireOutcome
    instance_id: uuid.UUID | None
    previous_instance_id: uuid.UUID | None = Field(description="cancelled_previous: cancelled")
    missed_count: int | None = Field(description="missed: how many (counted up to 1000)")
    missed_from: dt.datetime | None = Field(description="missed: the first one missed")
    count_capped: bool = Field(description="missed: more than missed_count were missed")
    error: str | None = Field(description="failed: the engine's refusal")
    actor: str
    recorded_at: dt.datetime


class ScheduleFireList(Answer):
    items: list[ScheduleFire] = Field(description="newest first")


class ScheduleListQuery(Query):
    state: ScheduleState | None = optional()
    limit: Limit = 50
    cursor: ScheduleCursor | None = optional()


class FireListQuery(Query):
    limit: Limit = 50


class SchedulePath(Path):
    schedule_id: uuid.UUID
