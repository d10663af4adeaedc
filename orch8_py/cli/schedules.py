"""`orch8 schedules create|list|show|pause|resume|delete`: a tenant's cron schedules and
their fire history (firing itself runs in every runner process)."""

from __future__ import annotations

import argparse
import uuid
from datetime import UTC, datetime
from typing import Any

from .. import db, rules, sqlapi
from ..errors import InvalidInput, NotFound
from .common import (
    EXIT_OK,
    Subparsers,
    actor_flag,
    actor_of,
    check_limit,
    command,
    common_flags,
    emit,
    indent,
    json_object,
    table,
    tenant_flag,
    ts,
)


def _time(raw: str | None, flag: str) -> datetime | None:
    """An ISO 8601 date-time; without an offset it is UTC."""
    if raw is None:
        return None
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidInput(
            f"{flag} {raw!r} is not a date-time (ISO 8601, e.g. 2030-01-31T12:00:00Z)"
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _find(conn: sqlapi.Conn, args: argparse.Namespace) -> dict[str, Any]:
    """The schedule named by id or by name (one that has not ended, else the last one)."""
    try:
        row = sqlapi.schedules.get_schedule(
            conn, tenant_id=args.tenant, schedule_id=uuid.UUID(args.schedule)
        )
    except ValueError:
        row = sqlapi.schedules.find_schedule(conn, tenant_id=args.tenant, name=args.schedule)
    if row is None:
        raise NotFound(
            f"schedule {args.schedule!r} not found in tenant {args.tenant!r}; "
            f"see `orch8 schedules list{tenant_flag(args)}`"
        )
    return row


@command
def schedules_create(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        schedule_id = sqlapi.schedules.create_schedule(
            conn,
            tenant_id=args.tenant,
            name=args.name,
            sequence_name=args.sequence,
            namespace=args.namespace,
            cron=args.cron,
            timezone=args.timezone,
            data=json_object(args.data, "--data"),
            priority=args.priority,
            overlap_policy=args.overlap,
            starts_at=_time(args.starts_at, "--starts-at"),
            ends_at=_time(args.ends_at, "--ends-at"),
            actor=actor_of(args),
        )
        row = sqlapi.schedules.get_schedule(conn, tenant_id=args.tenant, schedule_id=schedule_id)
    assert row is not None
    text = (
        f"created schedule {row['name']} ({schedule_id}): {row['cron']} in {row['timezone']} "
        f"starts {row['sequence_namespace']}/{row['sequence_name']}, "
        f"overlap {row['overlap_policy']}; next fire {ts(row['next_fire_at'])}"
    )
    emit(row, args.json, text)
    return EXIT_OK


@command
def schedules_list(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        rows = sqlapi.schedules.list_schedules(
            conn, tenant_id=args.tenant, limit=check_limit(args.limit), state=args.state
        )
    text = (
        table(
            ["name", "state", "cron", "timezone", "sequence", "overlap", "next fire", "last fire"],
            [
                (
                    r["name"],
                    r["state"],
                    r["cron"],
                    r["timezone"],
                    f"{r['sequence_namespace']}/{r['sequence_name']}",
                    r["overlap_policy"],
                    r["next_fire_at"],
                    r["last_fire_at"],
                )
                for r in rows
            ],
        )
        if rows
        else f"no schedules in tenant {args.tenant!r}"
    )
    emit(rows, args.json, text)
    return EXIT_OK


@command
def schedules_show(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        row = _find(conn, args)
        fires = sqlapi.schedules.list_fires(
            conn, tenant_id=args.tenant, schedule_id=row["id"], limit=check_limit(args.fires)
        )
    lines = [
        f"schedule {row['name']} ({row['id']}): {row['state']}",
        f"  cron          {row['cron']} ({row['timezone']})",
        f"  sequence      {row['sequence_namespace']}/{row['sequence_name']} (latest version)",
        f"  overlap       {row['overlap_policy']}",
        f"  window        {ts(row['starts_at'])} .. {ts(row['ends_at'])}",
        f"  next fire     {ts(row['next_fire_at'])}",
        f"  last fire     {ts(row['last_fire_at'])} (instance {row['last_instance_id'] or '-'}, "
        f"{row['last_instance_state'] or '-'})",
    ]
    if row["buffered_fire_at"] is not None:
        lines.append(f"  buffered      {ts(row['buffered_fire_at'])}")
    lines.append(f"  created       {ts(row['created_at'])} by {row['created_by']}")
    if fires:
        lines.append("fires (newest first):")
        lines.append(
            indent(
                table(
                    ["fire time", "outcome", "instance", "missed"],
                    [
                        (
                            f["fire_at"],
                            f["outcome"],
                            f["instance_id"],
                            (
                                f"{f['missed_count']}{'+' if f['count_capped'] else ''}"
                                f" from {ts(f['missed_from'])}"
                            )
                            if f["missed_count"]
                            else None,
                        )
                        for f in fires
                    ],
                ),
                "  ",
            )
        )
    else:
        lines.append("no fires yet")
    emit({**row, "fires": fires}, args.json, "\n".join(lines))
    return EXIT_OK


def _move(args: argparse.Namespace, url: str, move: str) -> int:
    do = {
        "pause": sqlapi.schedules.pause_schedule,
        "resume": sqlapi.schedules.resume_schedule,
        "end": sqlapi.schedules.end_schedule,
    }[move]
    actor = actor_of(args)
    with db.connect(url, autocommit=True) as conn:
        row = _find(conn, args)
        outcome = do(conn, tenant_id=args.tenant, schedule_id=row["id"], actor=actor)
        after = sqlapi.schedules.get_schedule(conn, tenant_id=args.tenant, schedule_id=row["id"])
    assert after is not None
    label = f"schedule {row['name']} ({row['id']})"
    if outcome == "unchanged":
        text = f"{label} is already {after['state']}: nothing to do"
    elif outcome == "paused":
        text = f"paused {label}: no fire until `orch8 schedules resume {row['name']}`"
    elif outcome == "active":
        text = (
            f"resumed {label}: next fire {ts(after['next_fire_at'])} "
            "(the paused period is not caught up)"
        )
    else:
        text = f"ended {label}: no more fires; it and its history stay"
    emit({**after, "outcome": outcome}, args.json, text)
    return EXIT_OK


@command
def schedules_pause(args: argparse.Namespace, url: str) -> int:
    return _move(args, url, "pause")


@command
def schedules_resume(args: argparse.Namespace, url: str) -> int:
    return _move(args, url, "resume")


@command
def schedules_delete(args: argparse.Namespace, url: str) -> int:
    return _move(args, url, "end")


def add_parsers(sub: Subparsers) -> None:
    sch = sub.add_parser("schedules", help="cron schedules that start instances")
    schsub = sch.add_subparsers(dest="schedule_command", required=True, metavar="COMMAND")
    create = schsub.add_parser("create", help="start an instance at every fire time of a cron")
    create.add_argument("name", help="the schedule's name (unique among those not ended)")
    create.add_argument("--sequence", required=True, help="the sequence name (latest version)")
    create.add_argument("--namespace", default="default", help="the sequence's namespace")
    create.add_argument(
        "--cron", required=True, help="minute hour day-of-month month day-of-week, quoted"
    )
    create.add_argument("--timezone", default="UTC", help="IANA zone (default: UTC)")
    create.add_argument("--data", default=None, help="the instances' data: JSON object or @FILE")
    create.add_argument("--priority", type=int, default=0)
    create.add_argument(
        "--overlap",
        choices=rules.OVERLAP_POLICIES,
        default="skip",
        help="while the last instance runs (default: skip)",
    )
    create.add_argument("--starts-at", default=None, help="no fire before (ISO 8601; UTC)")
    create.add_argument("--ends-at", default=None, help="fires before this only (ISO 8601)")
    common_flags(create)
    actor_flag(create)
    create.set_defaults(db_func=schedules_create)
    lst = schsub.add_parser("list", help="the tenant's schedules")
    lst.add_argument("--state", choices=rules.SCHEDULE_STATES)
    lst.add_argument("--limit", type=int, default=100)
    common_flags(lst)
    lst.set_defaults(db_func=schedules_list)
    show = schsub.add_parser("show", help="one schedule and its latest fires")
    show.add_argument("schedule", help="its id or name")
    show.add_argument("--fires", type=int, default=10, help="how many fires to show")
    common_flags(show)
    show.set_defaults(db_func=schedules_show)
    for name, func, text in (
        ("pause", schedules_pause, "no fire until resumed"),
        ("resume", schedules_resume, "fire again, from now (no catch-up)"),
        ("delete", schedules_delete, "end it for good (it and its history stay)"),
    ):
        sp = schsub.add_parser(name, help=text, aliases=["end"] if name == "delete" else [])
        sp.add_argument("schedule", help="its id or name")
        common_flags(sp)
        actor_flag(sp)
        sp.set_defaults(db_func=func)
