"""`orch8 instances start|list|show|retry|cancel|pause|resume|signal`: start and operate
workflow instances."""

from __future__ import annotations

import json
import re

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from . import db
from .cli_common import (
    EXIT_BLOCKED,
    EXIT_OK,
    actor_flag,
    actor_of,
    cell,
    check_limit,
    command,
    common_flags,
    emit,
    fail,
    json_object,
    parse_uuid,
    table,
    tenant_flag,
)
from .errors import EffectBlocked, NotFound
from .states import INSTANCE_STATES


@command
def instances_start(args, url: str) -> int:
    data = json_object(args.data, "--data") or {}
    with db.connect(url, autocommit=True) as conn, db.engine_errors():
        seq = conn.execute(
            "SELECT id, version FROM orch8.get_sequence(%s, %s, %s, %s)",
            (args.tenant, args.namespace, args.sequence, args.version),
        ).fetchone()
        if seq is None or seq[0] is None:
            raise NotFound(
                f"sequence {args.namespace}/{args.sequence} not found in tenant {args.tenant!r}; "
                "create it with `orch8 sequences create`"
            )
        row = conn.execute(
            "SELECT id, state::text, deduplicated FROM orch8.create_instance("
            "%s, %s, %s, p_idempotency_key => %s, p_priority => %s)",
            (args.tenant, seq[0], Jsonb(data), args.idempotency_key, args.priority),
        ).fetchone()
    result = {"id": row[0], "state": row[1], "deduplicated": row[2], "sequence_version": seq[1]}
    note = " (existing instance for this idempotency key)" if row[2] else ""
    emit(result, args.json, f"instance {row[0]} {row[1]}{note}")
    return EXIT_OK


@command
def instances_list(args, url: str) -> int:
    limit = check_limit(args.limit)
    with db.connect(url, autocommit=True) as conn, conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT t.id, t.state::text AS state, t.requested_state::text AS requested_state,"
            " s.namespace, s.name AS sequence, t.sequence_version, t.current_block, t.error,"
            " t.created_at, t.updated_at"
            " FROM orch8.task_instances AS t"
            " JOIN orch8.sequences AS s ON s.tenant_id = t.tenant_id AND s.id = t.sequence_id"
            " WHERE t.tenant_id = %(tenant)s"
            " AND (%(state)s::text IS NULL OR t.state::text = %(state)s)"
            " AND (%(seq)s::text IS NULL OR s.name = %(seq)s)"
            " AND (%(ns)s::text IS NULL OR s.namespace = %(ns)s)"
            " ORDER BY t.created_at DESC, t.id DESC LIMIT %(limit)s",
            {
                "tenant": args.tenant,
                "state": args.state,
                "seq": args.sequence,
                "ns": args.namespace,
                "limit": limit,
            },
        ).fetchall()
    if args.json:
        emit(rows, True, "")
        return EXIT_OK
    if not rows:
        print(f"no instances in tenant {args.tenant!r} match", flush=True)
        return EXIT_OK
    out = table(
        ["id", "state", "sequence", "block", "updated", "error"],
        [
            (
                r["id"],
                r["state"]
                + (f" ({r['requested_state']} requested)" if r["requested_state"] else ""),
                f"{r['sequence']} v{r['sequence_version']}",
                r["current_block"],
                r["updated_at"],
                cell(r["error"], 70),
            )
            for r in rows
        ],
    )
    if len(rows) == limit:
        out += f"\n(the newest {limit}; use --limit for more)"
    print(out, flush=True)
    return EXIT_OK


@command
def instances_show(args, url: str) -> int:
    instance_id = parse_uuid(args.id, "an instance id")
    with db.connect(url, autocommit=True) as conn, conn.cursor(row_factory=dict_row) as cur:
        inst = cur.execute(
            "SELECT id, state::text AS state, requested_state::text AS requested_state,"
            " current_block, error, created_at, updated_at, context"
            " FROM orch8.task_instances WHERE tenant_id = %s AND id = %s",
            (args.tenant, instance_id),
        ).fetchone()
        if inst is None:
            raise NotFound(f"instance {instance_id} not found in tenant {args.tenant!r}")
        outputs = cur.execute(
            "SELECT block_id, attempt, coalesce(sentinel, 'output') AS kind, output"
            " FROM orch8.block_outputs WHERE tenant_id = %s AND instance_id = %s ORDER BY seq",
            (args.tenant, instance_id),
        ).fetchall()
        receipts = cur.execute(
            "SELECT id, block_id, attempt, kind, state::text AS state, provider_receipt_id,"
            " idempotency_key, error FROM orch8.effect_receipts"
            " WHERE tenant_id = %s AND instance_id = %s ORDER BY created_at, id",
            (args.tenant, instance_id),
        ).fetchall()
    if args.json:
        emit({**inst, "outputs": outputs, "effects": receipts}, True, "")
        return EXIT_OK
    requested = f" ({inst['requested_state']} requested)" if inst["requested_state"] else ""
    lines = [f"instance {inst['id']}  {inst['state']}{requested}"]
    if inst["error"]:
        lines.append(f"  error: {inst['error']}")
    lines.append("  steps:")
    lines += [
        f"    {o['block_id']:<16} attempt {o['attempt']}  {o['kind']}"
        + (f"  {json.dumps(o['output'])[:80]}" if o["kind"] == "output" else "")
        for o in outputs
    ] or ["    (none yet)"]
    lines.append("  effects:")
    lines += [
        f"    {r['id']}  {r['block_id']:<12} attempt {r['attempt']}  {r['kind']:<7} "
        f"{r['state']:<10} provider receipt {r['provider_receipt_id'] or '-'}"
        for r in receipts
    ] or ["    (none)"]
    print("\n".join(lines), flush=True)
    return EXIT_OK


def _blocked_message(args, exc: EffectBlocked) -> str:
    detail = getattr(exc, "detail", None) or ""
    found = re.search(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}", detail or str(exc))
    effect = found.group(0) if found else "EFFECT_ID"
    t = tenant_flag(args)
    if " is dispatched" in str(exc):
        # Not resolvable yet: a runner may still record it, or its lease must run out.
        return (
            f"{exc}; it is still dispatched: if a runner is recording it, try again shortly; "
            "if none is (the instance was failed by hand mid-step), mark it unknown in SQL "
            f"with orch8.mark_effect_unknown('{args.tenant}', '{effect}', 'reason'), then "
            f"resolve it (`orch8 effects show {effect}{t}`)"
        )
    return (
        f"{exc}; look at it with `orch8 effects show {effect}{t}`, ask the provider what "
        f"happened, record it with `orch8 effects resolve {effect}{t} "
        "--state committed|verified|abandoned|compensated --evidence JSON --note TEXT`, "
        "then retry"
    )


@command
def instances_retry(args, url: str) -> int:
    instance_id = parse_uuid(args.id, "an instance id")
    with db.connect(url, autocommit=True) as conn, conn.cursor(row_factory=dict_row) as cur:
        try:
            with db.engine_errors():
                row = cur.execute(
                    "SELECT outcome, block_id, effect_id, detail"
                    " FROM orch8.retry_instance(%s, %s, %s)",
                    (args.tenant, instance_id, actor_of(args)),
                ).fetchone()
        except EffectBlocked as exc:
            return fail(_blocked_message(args, exc), EXIT_BLOCKED)
        state = conn.execute(
            "SELECT state::text FROM orch8.task_instances WHERE tenant_id = %s AND id = %s",
            (args.tenant, instance_id),
        ).fetchone()[0]
    result = {"instance_id": instance_id, **row, "state": state}
    block = f" (block {row['block_id']})" if row["block_id"] else ""
    text = f"{row['outcome']}{block}: {row['detail']}\ninstance {instance_id} is now {state}"
    emit(result, args.json, text)
    return EXIT_OK


_STATE_CHANGE_TEXT = {
    "requested": "is running: {what} requested, applied at the next step boundary",
    "unchanged": "is already {state}: nothing to do",
}


def _state_change(args, url: str, sql: str, params: tuple, what: str, target: str) -> int:
    instance_id = params[1]
    with db.connect(url, autocommit=True) as conn, db.engine_errors():
        outcome = conn.execute(sql, params).fetchone()[0]
    template = _STATE_CHANGE_TEXT.get(outcome, "is now {state}")
    state = target if outcome == "unchanged" else outcome
    text = f"instance {instance_id} " + template.format(what=what, state=state)
    if what == "resume" and outcome == "running":
        text = f"instance {instance_id} is running: the pending pause was withdrawn"
    emit({"instance_id": instance_id, "outcome": outcome}, args.json, text)
    return EXIT_OK


@command
def instances_cancel(args, url: str) -> int:
    instance_id = parse_uuid(args.id, "an instance id")
    return _state_change(
        args,
        url,
        "SELECT orch8.cancel_instance(%s, %s, %s, %s)",
        (args.tenant, instance_id, actor_of(args), args.reason),
        "cancel",
        "cancelled",
    )


@command
def instances_pause(args, url: str) -> int:
    instance_id = parse_uuid(args.id, "an instance id")
    return _state_change(
        args,
        url,
        "SELECT orch8.pause_instance(%s, %s, %s, %s)",
        (args.tenant, instance_id, actor_of(args), args.reason),
        "pause",
        "paused",
    )


@command
def instances_resume(args, url: str) -> int:
    instance_id = parse_uuid(args.id, "an instance id")
    return _state_change(
        args,
        url,
        "SELECT orch8.resume_instance(%s, %s, %s)",
        (args.tenant, instance_id, actor_of(args)),
        "resume",
        "scheduled",
    )


@command
def instances_signal(args, url: str) -> int:
    instance_id = parse_uuid(args.id, "an instance id")
    payload = json_object(args.payload, "--payload") or {}
    with db.connect(url, autocommit=True) as conn, db.engine_errors():
        signal_id, outcome = conn.execute(
            "SELECT signal_id, outcome FROM orch8.send_signal(%s, %s, %s, %s, %s)",
            (args.tenant, instance_id, args.type, Jsonb(payload), actor_of(args)),
        ).fetchone()
    result = {
        "instance_id": instance_id,
        "signal_id": signal_id,
        "signal_type": args.type,
        "outcome": outcome,
    }
    emit(
        result,
        args.json,
        f"signal {args.type} sent to instance {instance_id} (signal {signal_id}): {outcome}",
    )
    return EXIT_OK


def add_parsers(sub) -> None:
    insts = sub.add_parser("instances", help="workflow instances")
    instsub = insts.add_subparsers(dest="inst_command", required=True, metavar="COMMAND")
    start = instsub.add_parser("start", help="start an instance of a sequence")
    start.add_argument("sequence", help="sequence name")
    start.add_argument("--namespace", default="default")
    start.add_argument("--version", type=int, default=None, help="default: the latest")
    start.add_argument("--data", default="{}", help="context data, a JSON object")
    start.add_argument("--idempotency-key", default=None)
    start.add_argument("--priority", type=int, default=0)
    common_flags(start)
    start.set_defaults(db_func=instances_start)
    lst = instsub.add_parser("list", help="instances, newest first")
    lst.add_argument("--state", choices=INSTANCE_STATES, default=None)
    lst.add_argument("--sequence", default=None, metavar="NAME", help="only this sequence")
    lst.add_argument("--namespace", default=None, help="only sequences of this namespace")
    lst.add_argument("--limit", type=int, default=50, help="at most N rows (default 50)")
    common_flags(lst)
    lst.set_defaults(db_func=instances_list)
    show = instsub.add_parser("show", help="an instance with its steps and effect receipts")
    show.add_argument("id", help="instance id")
    common_flags(show)
    show.set_defaults(db_func=instances_show)
    retry = instsub.add_parser(
        "retry",
        help="retry a failed instance (exit 3 while an effect receipt is still unknown)",
    )
    retry.add_argument("id", help="instance id")
    actor_flag(retry)
    common_flags(retry)
    retry.set_defaults(db_func=instances_retry)
    for name, func, text in (
        ("cancel", instances_cancel, "cancel an instance (a running one at its next step)"),
        ("pause", instances_pause, "pause an instance (a running one at its next step)"),
        ("resume", instances_resume, "resume a paused instance"),
    ):
        sp = instsub.add_parser(name, help=text)
        sp.add_argument("id", help="instance id")
        if name != "resume":
            sp.add_argument("--reason", default=None, help="recorded with the change")
        actor_flag(sp)
        common_flags(sp)
        sp.set_defaults(db_func=func)
    sig = instsub.add_parser("signal", help="send a signal (cancel, pause, resume act)")
    sig.add_argument("id", help="instance id")
    sig.add_argument("type", help="signal type, e.g. approved (cancel, pause, resume act)")
    sig.add_argument("--payload", default=None, help="a JSON object (default {})")
    actor_flag(sig)
    common_flags(sig)
    sig.set_defaults(db_func=instances_signal)
