"""`orch8 instances start|list|show|retry|cancel|pause|resume|signal|waiting|answer` (and
`bulk`, in bulk.py): start and operate workflow instances."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import uuid
from collections.abc import Callable

from .. import db, rules, sqlapi
from ..errors import EffectBlocked, InvalidInput, NotFound
from ..sqlapi.base import NO_OUTPUT, Conn, Row
from ..tree_rows import TreeNode, as_json, nest
from .bulk import add_parser as add_bulk_parser
from .common import (
    EXIT_BLOCKED,
    EXIT_OK,
    EXIT_USAGE,
    Subparsers,
    actor_flag,
    actor_of,
    cell,
    check_limit,
    command,
    common_flags,
    emit,
    fail,
    json_object,
    json_value,
    parse_uuid,
    table,
    tenant_flag,
)
from .effects import resolve_hint


def find_sequence(conn: Conn, args: argparse.Namespace) -> Row:
    seq = sqlapi.sequences.get_sequence(
        conn,
        tenant_id=args.tenant,
        namespace=args.namespace,
        name=args.sequence,
        version=args.version,
    )
    if seq is None:
        raise NotFound(
            f"sequence {args.namespace}/{args.sequence} not found in tenant {args.tenant!r}; "
            "create it with `orch8 sequences create`"
        )
    return seq


@command
def instances_start(args: argparse.Namespace, url: str) -> int:
    data = json_object(args.data, "--data") or {}
    with db.connect(url, autocommit=True) as conn:
        seq = find_sequence(conn, args)
        made = sqlapi.instances.create_instance(
            conn,
            tenant_id=args.tenant,
            sequence_id=seq["id"],
            data=data,
            idempotency_key=args.idempotency_key,
            priority=args.priority,
        )
    result = {
        "id": made.id,
        "state": made.state,
        "deduplicated": made.deduplicated,
        "sequence_version": seq["version"],
    }
    note = " (existing instance for this idempotency key)" if made.deduplicated else ""
    emit(result, args.json, f"instance {made.id} {made.state}{note}")
    return EXIT_OK


ITEM_FIELDS = ("data", "config", "priority", "idempotency_key")


def read_items(path: str) -> list[dict[str, object]]:
    """JSON Lines (``-``: stdin): one instance per non-empty line, {data, config, priority,
    idempotency_key}, each optional. Every line is read and checked before anything starts:
    InvalidInput naming the first bad line."""
    try:
        if path == "-":
            lines = sys.stdin.read().splitlines()
        else:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
    except OSError as exc:
        raise InvalidInput(f"--file {path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"--file {path}: not UTF-8 text") from None
    items: list[dict[str, object]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"--file {path} line {number}: not JSON ({exc.msg})") from None
        if not isinstance(item, dict):
            raise InvalidInput(f"--file {path} line {number}: an instance must be a JSON object")
        unknown = sorted(set(item) - set(ITEM_FIELDS))
        if unknown:
            raise InvalidInput(
                f"--file {path} line {number}: unknown field(s) {', '.join(unknown)}"
                f" (allowed: {', '.join(ITEM_FIELDS)})"
            )
        items.append(item)
    if not items:
        raise InvalidInput(f"--file {path}: no instances (one JSON object per line)")
    return items


@command
def instances_start_many(args: argparse.Namespace, url: str) -> int:
    items = read_items(args.file)
    batch = args.batch
    if not 1 <= batch <= rules.LIMITS["create_batch"]:
        raise InvalidInput(f"--batch must be 1 to {rules.LIMITS['create_batch']}")
    started = deduplicated = 0
    t0 = time.perf_counter()
    with db.connect(url, autocommit=True) as conn:
        seq = find_sequence(conn, args)
        for first in range(0, len(items), batch):
            chunk = items[first : first + batch]
            try:
                made = sqlapi.instances.start_instances(
                    conn, tenant_id=args.tenant, sequence_id=seq["id"], items=chunk
                )
            except InvalidInput as exc:
                index = exc.facts.get("index")
                where = f"instance {first + index}" if isinstance(index, int) else "a batch"
                problem = re.sub(r"^instance \d+: ", "", str(exc))
                raise InvalidInput(
                    f"{where} refused after {started + deduplicated} were started "
                    f"(each batch of {batch} is all or nothing): {problem}",
                    facts=exc.facts,
                ) from None
            fresh = sum(not m.deduplicated for m in made)
            started += fresh
            deduplicated += len(made) - fresh
            print(
                f"{started + deduplicated}/{len(items)} started",
                file=sys.stderr,
                flush=True,
            )
    seconds = time.perf_counter() - t0
    result = {
        "started": started,
        "deduplicated": deduplicated,
        "sequence_version": seq["version"],
        "seconds": round(seconds, 3),
    }
    emit(
        result,
        args.json,
        f"{started} instance(s) started, {deduplicated} already existed "
        f"(version {seq['version']}, {seconds:.1f} s)",
    )
    return EXIT_OK


@command
def instances_list(args: argparse.Namespace, url: str) -> int:
    limit = check_limit(args.limit)
    with db.connect(url, autocommit=True) as conn:
        found = sqlapi.instances.list_instances(
            conn,
            tenant_id=args.tenant,
            limit=limit,
            state=args.state,
            sequence=args.sequence,
            namespace=args.namespace,
        )
    rows = [
        {
            **{k: r[k] for k in ("id", "state", "requested_state")},
            "namespace": r["sequence_namespace"],
            "sequence": r["sequence_name"],
            **{
                k: r[k]
                for k in ("sequence_version", "current_block", "error", "created_at", "updated_at")
            },
        }
        for r in found
    ]
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
def instances_show(args: argparse.Namespace, url: str) -> int:
    instance_id = parse_uuid(args.id, "an instance id")
    with db.connect(url, autocommit=True) as conn:
        found = sqlapi.instances.get_instance(conn, tenant_id=args.tenant, instance_id=instance_id)
        if found is None:
            raise NotFound(f"instance {instance_id} not found in tenant {args.tenant!r}")
        tree = nest(
            sqlapi.instances.instance_tree(conn, tenant_id=args.tenant, instance_id=instance_id)
        )
        effects = sqlapi.effects.receipts_of_instance(
            conn, tenant_id=args.tenant, instance_id=instance_id
        )
        waits = sqlapi.instances.waiting_nodes(conn, tenant_id=args.tenant, instance_id=instance_id)
        requests = sqlapi.instances.instance_requests(
            conn, tenant_id=args.tenant, instance_id=instance_id
        )
    shown = ("id", "state", "requested_state", "current_block", "error", "created_at")
    inst = {k: found[k] for k in (*shown, "updated_at", "context")}
    brief = ("id", "block_id", "attempt", "kind", "state", "provider_receipt_id")
    receipts = [{k: r[k] for k in (*brief, "idempotency_key", "error")} for r in effects]
    if args.json:
        emit(
            {
                **inst,
                "tree": as_json(tree),
                "effects": receipts,
                "waiting": waits,
                "requests": requests,
            },
            True,
            "",
        )
        return EXIT_OK
    requested = f" ({inst['requested_state']} requested)" if inst["requested_state"] else ""
    lines = [f"instance {inst['id']}  {inst['state']}{requested}"]
    if inst["error"]:
        lines.append(f"  error: {inst['error']}")
    if found["sla_breached_at"] is not None:
        lines.append(
            f"  sla: missed (due by {found['sla_at']}, found at {found['sla_breached_at']})"
        )
    elif found["sla_at"] is not None:
        lines.append(f"  sla: to end by {found['sla_at']}")
    lines.append("  tree:")
    lines += [tree_line(depth, node) for top in tree for depth, node in top.walk()] or [
        "    (nothing started yet)"
    ]
    if waits:
        lines.append("  waiting for:")
        lines += [
            f"    {w['path']:<30} {w['waiting_for']:<12} until {w['until'] or '-'}  "
            f"{_waiting_what(w)}"
            for w in waits
        ]
    lines.append("  effects:")
    lines += [
        f"    {r['id']}  {r['block_id']:<12} attempt {r['attempt']}  {r['kind']:<7} "
        f"{r['state']:<10} provider receipt {r['provider_receipt_id'] or '-'}"
        for r in receipts
    ] or ["    (none)"]
    if requests:
        lines.append("  requests:")
        lines += [
            f"    {r['at']:%Y-%m-%d %H:%M:%S}  {r['action']:<6} by {r['actor']}: {r['outcome']}"
            + (f"  ({r['reason']})" if r["reason"] else "")
            for r in requests
        ]
    print("\n".join(lines), flush=True)
    return EXIT_OK


def tree_line(depth: int, node: TreeNode) -> str:
    """One node: its part of the path (indented by depth), state, attempt, receipt, why."""
    r = node.row
    label = "  " * depth + node.label
    parts = [f"    {label:<30} {r['state']:<10}"]
    if r["attempt"] is not None:
        parts.append(f"attempt {r['attempt']}")
    if r["effect_id"] is not None:
        parts.append(f"receipt {r['effect_id']} {r['receipt_state']}")
    if r["child_instance_id"] is not None:
        parts.append(f"child {r['child_instance_id']}")
    if r["state"] == "waiting" and r.get("wake_at") is not None:
        parts.append(f"until {r['wake_at']}")
    if r["state"] == "ready" and r.get("deferred_by") == "rate_limit":
        parts.append(
            f"deferred by rate limit {r['rate_limit_key']} until {r['next_fire_at']} "
            f"({r['deferrals']} time(s))"
        )
    elif r["state"] == "ready" and r.get("deferred_by") == "rate_limit_undefined":
        parts.append(
            f"waits: rate limit {r['rate_limit_key']} is not defined "
            f"(`orch8 rate-limits set {r['rate_limit_key']} --rate N --per 1m`)"
        )
    if r["state"] == "completed" and r["output"] is not None and r["kind"] != "sequence":
        parts.append(json.dumps(r["output"])[:80])
    why = r["error"] if r["state"] in ("failed", "blocked") else r["cancel_reason"]
    if why and r["state"] in ("failed", "blocked", "cancelled"):
        parts.append(f"({cell(why, 80)})")
    return "  ".join(parts).rstrip()


def _blocked_message(args: argparse.Namespace, exc: EffectBlocked) -> str:
    effect = exc.facts.get("effect_id") or "EFFECT_ID"
    t = tenant_flag(args)
    if exc.facts.get("effect_state") == "dispatched":
        # Not resolvable yet: a runner may still record it, or its lease must run out.
        return (
            f"{exc}; it is still dispatched: if a runner is recording it, try again shortly; "
            "if none is (the instance was failed by hand mid-step), mark it unknown in psql "
            f"with `{sqlapi.psql.mark_effect_unknown(args.tenant, effect)}`, then "
            f"resolve it (`orch8 effects show {effect}{t}`)"
        )
    return (
        f"{exc}; look at it with `orch8 effects show {effect}{t}`, ask the provider what "
        f"happened, record it with `{resolve_hint(effect, t)}`, then retry"
    )


@command
def instances_retry(args: argparse.Namespace, url: str) -> int:
    instance_id = parse_uuid(args.id, "an instance id")
    output = NO_OUTPUT if args.output is None else json_value(args.output, "--output")
    with db.connect(url, autocommit=True) as conn:
        try:
            done = sqlapi.instances.retry_instance(
                conn,
                tenant_id=args.tenant,
                instance_id=instance_id,
                actor=actor_of(args),
                output=output,
            )
        except EffectBlocked as exc:
            return fail(_blocked_message(args, exc), EXIT_BLOCKED)
        except InvalidInput as exc:
            if exc.facts.get("read_by"):
                return fail(_needs_output_message(args, exc), EXIT_USAGE)
            raise
        state = sqlapi.instances.instance_state(
            conn, tenant_id=args.tenant, instance_id=instance_id
        )
    result = {
        "instance_id": instance_id,
        "outcome": done.outcome,
        "block_id": done.block_id,
        "effect_id": done.effect_id,
        "detail": done.detail,
        "state": state,
    }
    block = f" (block {done.block_id})" if done.block_id else ""
    text = f"{done.outcome}{block}: {done.detail}\ninstance {instance_id} is now {state}"
    emit(result, args.json, text)
    return EXIT_OK


def _needs_output_message(args: argparse.Namespace, exc: InvalidInput) -> str:
    """The step settled without an output that later blocks read: name them and the flag."""
    readers = ", ".join(str(b) for b in exc.facts["read_by"])
    return (
        f"{exc} (read by: {readers}); retry with "
        f"`orch8 instances retry {args.id}{tenant_flag(args)} --output JSON` (or @FILE)"
    )


_STATE_CHANGE_TEXT = {
    "requested": "is running: {what} requested, applied at the next step boundary",
    "unchanged": "is already {state}: nothing to do",
}


def _state_change(
    args: argparse.Namespace,
    url: str,
    what: str,
    target: str,
    move: Callable[[Conn, uuid.UUID], str],
) -> int:
    instance_id = parse_uuid(args.id, "an instance id")
    with db.connect(url, autocommit=True) as conn:
        outcome = move(conn, instance_id)
    template = _STATE_CHANGE_TEXT.get(outcome, "is now {state}")
    state = target if outcome == "unchanged" else outcome
    text = f"instance {instance_id} " + template.format(what=what, state=state)
    if what == "resume" and outcome == "running":
        text = f"instance {instance_id} is running: the pending pause was withdrawn"
    emit({"instance_id": instance_id, "outcome": outcome}, args.json, text)
    return EXIT_OK


@command
def instances_cancel(args: argparse.Namespace, url: str) -> int:
    return _state_change(args, url, "cancel", "cancelled", _request(args, "cancel"))


@command
def instances_pause(args: argparse.Namespace, url: str) -> int:
    return _state_change(args, url, "pause", "paused", _request(args, "pause"))


def _request(args: argparse.Namespace, move: str) -> Callable[[Conn, uuid.UUID], str]:
    actor = actor_of(args)
    return lambda conn, instance_id: sqlapi.instances.request_instance_state(
        conn,
        move=move,
        tenant_id=args.tenant,
        instance_id=instance_id,
        actor=actor,
        reason=args.reason,
    )


@command
def instances_resume(args: argparse.Namespace, url: str) -> int:
    actor = actor_of(args)
    return _state_change(
        args,
        url,
        "resume",
        "scheduled",
        lambda conn, instance_id: sqlapi.instances.resume_instance(
            conn, tenant_id=args.tenant, instance_id=instance_id, actor=actor, reason=args.reason
        ),
    )


@command
def instances_signal(args: argparse.Namespace, url: str) -> int:
    instance_id = parse_uuid(args.id, "an instance id")
    payload = json_object(args.payload, "--payload") or {}
    with db.connect(url, autocommit=True) as conn:
        sent = sqlapi.instances.send_signal(
            conn,
            tenant_id=args.tenant,
            instance_id=instance_id,
            signal_type=args.type,
            payload=payload,
            actor=actor_of(args),
            idempotency_key=args.idempotency_key,
        )
    signal_id, outcome = sent.signal_id, sent.outcome
    result = {
        "instance_id": instance_id,
        "signal_id": signal_id,
        "signal_type": args.type,
        "outcome": outcome,
        "deduplicated": sent.deduplicated,
    }
    said = (
        f"signal {args.type} was sent before with this key (signal {signal_id}): {outcome}; "
        "nothing acted again"
        if sent.deduplicated
        else f"signal {args.type} sent to instance {instance_id} (signal {signal_id}): {outcome}"
    )
    emit(result, args.json, said)
    return EXIT_OK


@command
def instances_waiting(args: argparse.Namespace, url: str) -> int:
    instance_id = parse_uuid(args.id, "an instance id") if args.id else None
    check_limit(args.limit)
    with db.connect(url, autocommit=True) as conn:
        rows = sqlapi.instances.waiting_nodes(
            conn,
            tenant_id=args.tenant,
            instance_id=instance_id,
            waiting_for=args.waiting_for,
            limit=args.limit,
        )
    text = (
        table(
            ["instance", "path", "waits for", "until", "what"],
            [
                (
                    r["instance_id"],
                    r["path"],
                    r["waiting_for"],
                    r["until"] or "-",
                    _waiting_what(r),
                )
                for r in rows
            ],
        )
        if rows
        else "nothing is waiting"
    )
    emit(rows, args.json, text)
    return EXIT_OK


def _waiting_what(row: dict[str, object]) -> str:
    if row["waiting_for"] == "input":
        choices = row["choices"] if isinstance(row["choices"], list) else []
        return f"{row['prompt']} [{' / '.join(str(c) for c in choices)}]"
    if row["waiting_for"] == "signal":
        return f"signal {row['signal']}"
    if row["waiting_for"] == "child":
        return f"child {row['child_instance_id']}"
    if row["waiting_for"] == "worker":
        return f"worker task {row['worker_task_id']}"
    return str(row["kind"])


@command
def instances_answer(args: argparse.Namespace, url: str) -> int:
    instance_id = parse_uuid(args.id, "an instance id")
    with db.connect(url, autocommit=True) as conn:
        done = sqlapi.instances.answer_input(
            conn,
            tenant_id=args.tenant,
            instance_id=instance_id,
            path=args.path,
            choice=args.choice,
            comment=args.comment,
            actor=actor_of(args),
        )
    emit(
        {"instance_id": instance_id, "path": done.path, "state": done.state, "output": done.output},
        args.json,
        f"answered {done.path} of instance {instance_id}: {args.choice} "
        f"(by {done.output['answered_by']}); the instance is {done.state}",
    )
    return EXIT_OK


def add_parsers(sub: Subparsers) -> None:
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
    many = instsub.add_parser(
        "start-many",
        help="start many instances of a sequence from JSON Lines, in batches",
        description="Start one instance per line of FILE ({data, config, priority, "
        "idempotency_key}, each optional), a batch per transaction (orch8.create_instances). "
        "Give every line an idempotency_key to make a rerun after a failure start only "
        "what is missing.",
    )
    many.add_argument("sequence", help="sequence name")
    many.add_argument("--file", required=True, help="JSON Lines, one instance a line (-: stdin)")
    many.add_argument("--namespace", default="default")
    many.add_argument("--version", type=int, default=None, help="default: the latest")
    many.add_argument(
        "--batch",
        type=int,
        default=rules.LIMITS["create_batch"],
        help=f"instances per transaction (default and most: {rules.LIMITS['create_batch']})",
    )
    common_flags(many)
    many.set_defaults(db_func=instances_start_many)
    lst = instsub.add_parser("list", help="instances, newest first")
    lst.add_argument("--state", choices=rules.INSTANCE_STATES, default=None)
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
    retry.add_argument(
        "--output",
        default=None,
        metavar="JSON",
        help="what the settled step returns (its receipt committed or verified), any JSON "
        "or @FILE; default: the output its resolution carries",
    )
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
        sp.add_argument(
            "--reason", default=None, help="recorded with who asked (instances show: requests)"
        )
        actor_flag(sp)
        common_flags(sp)
        sp.set_defaults(db_func=func)
    sig = instsub.add_parser(
        "signal", help="send a signal, exactly once (a custom one wakes its wait_for_signal)"
    )
    sig.add_argument("id", help="instance id")
    sig.add_argument(
        "type",
        help=f"signal type: {', '.join(rules.BUILTIN_SIGNALS[:-1])} act; any other name is a "
        "custom signal for a wait_for_signal block (kept until one starts)",
    )
    sig.add_argument(
        "--payload", default=None, help="a JSON object (default {}); update_context merges it"
    )
    sig.add_argument(
        "--idempotency-key", default=None, help="a repeat with the same key acts on nothing"
    )
    actor_flag(sig)
    common_flags(sig)
    sig.set_defaults(db_func=instances_signal)
    wait = instsub.add_parser(
        "waiting", help="what instances wait for (a sleep, a signal, a person) and until when"
    )
    wait.add_argument("id", nargs="?", default=None, help="only this instance")
    wait.add_argument(
        "--for", dest="waiting_for", choices=rules.WAIT_REASONS, default=None, help="only these"
    )
    wait.add_argument("--limit", type=int, default=100, help="at most N rows (default 100)")
    common_flags(wait)
    wait.set_defaults(db_func=instances_waiting)
    ans = instsub.add_parser("answer", help="answer a wait_for_input with one of its choices")
    ans.add_argument("id", help="instance id")
    ans.add_argument("path", help="the waiting node's path (see `orch8 instances waiting`)")
    ans.add_argument("choice", help="one of its choices")
    ans.add_argument("--comment", default=None, help="kept with the answer")
    actor_flag(ans)
    common_flags(ans)
    ans.set_defaults(db_func=instances_answer)
    add_bulk_parser(instsub)
