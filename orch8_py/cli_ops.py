"""`orch8 sequences ...` and `orch8 instances ...`: define workflows, start, inspect and
operate instances from the shell. Human-readable tables by default, ``--json`` for scripts.

The effect commands live in ``cli_effects``, the API key commands in ``cli_keys``; the
helpers they share (output, argument parsing, exit codes) are here.

Exit codes (docs/CLI.md): 0 ok, 1 error, 2 bad input or usage, 3 blocked by an
unresolved effect, 4 stale (something changed meanwhile: reload and look again).
"""

from __future__ import annotations

import functools
import getpass
import json
import os
import re
import sys
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from . import db
from .errors import (
    EffectBlocked,
    InvalidInput,
    InvalidTransition,
    NotFound,
    StaleEffect,
)
from .sequences import InvalidSequence, create_sequence, load_definition_file
from .states import INSTANCE_STATES

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_BLOCKED = 3
EXIT_STALE = 4

DEFAULT_TENANT = "default"


MAX_LIMIT = 10_000

# --- shared helpers (also used by cli_effects and cli_keys) ----------------------------


def fail(message: str, code: int) -> int:
    """Print one ``orch8: error:`` line on stderr and return the exit code."""
    line = " ".join(str(message).split())
    print(f"orch8: error: {line}", file=sys.stderr, flush=True)
    return code


def _with_detail(exc: BaseException) -> str:
    """An illegal move with its DETAIL (the current state) and HINT (the allowed moves)."""
    extra = []
    if getattr(exc, "detail", None):
        extra.append(exc.detail)
    if getattr(exc, "hint", None):
        extra.append(f"allowed: {exc.hint}")
    return f"{exc} ({'; '.join(extra)})" if extra else str(exc)


def command(func: Callable[[Any, str], int]) -> Callable[[Any, str], int]:
    """Map the engine's refusals to exit codes: bad input 2, blocked 3, stale 4, an illegal
    state move 1 (with the current state). Other Orch8Errors (NotFound...) go to cli.main,
    which prints them in one line with exit code 1."""

    @functools.wraps(func)
    def run(args, url: str) -> int:
        try:
            return func(args, url)
        except InvalidInput as exc:
            return fail(str(exc), EXIT_USAGE)
        except EffectBlocked as exc:
            return fail(str(exc), EXIT_BLOCKED)
        except StaleEffect as exc:
            return fail(str(exc), EXIT_STALE)
        except InvalidTransition as exc:
            return fail(_with_detail(exc), EXIT_ERROR)
        except psycopg.Error as exc:
            text = str(exc).strip().splitlines()
            state = f" [SQLSTATE {exc.sqlstate}]" if exc.sqlstate else ""
            return fail(f"database error: {text[0] if text else type(exc).__name__}{state}", 1)

    return run


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return str(value)


def to_json(value: Any) -> str:
    return json.dumps(value, default=_json_default, indent=2)


def emit(value: Any, as_json: bool, text: str) -> None:
    """``--json``: the value as JSON; else the human-readable text."""
    print(to_json(value) if as_json else text, flush=True)


def json_object(raw: str | None, flag: str) -> dict | None:
    """Parse a flag's JSON object (None stays None); InvalidInput in one line otherwise."""
    if raw is None:
        return None

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        value = json.loads(raw, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"{flag} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        ) from None
    except ValueError as exc:
        raise InvalidInput(f"{flag} is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise InvalidInput(f'{flag} must be a JSON object, e.g. \'{{"checked": "..."}}\'')
    return value


def parse_uuid(raw: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except (ValueError, AttributeError):
        raise InvalidInput(f"{raw!r} is not {what} (a UUID)") from None


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"--limit must be from 1 to {MAX_LIMIT}, got {limit}")
    return limit


_DURATION_PART = re.compile(r"(\d+)([smhd])")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(raw: str, flag: str) -> timedelta:
    """``30s``, ``10m``, ``2h``, ``1d`` (or a sum such as ``1h30m``)."""
    text = raw.strip().lower()
    if not text or _DURATION_PART.sub("", text):
        raise InvalidInput(
            f"{flag} {raw!r} is not a duration: use a number and a unit s, m, h or d "
            "(30s, 10m, 2h, 1d, 1h30m)"
        )
    seconds = sum(int(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART.findall(text))
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise InvalidInput(f"{flag} {raw!r} is too long") from None


def default_actor() -> str:
    """``cli:$USER`` (or the login name), recorded as who did it."""
    name = os.environ.get("USER") or os.environ.get("LOGNAME")
    if not name:
        try:
            name = getpass.getuser()
        except Exception:
            name = "unknown"
    return f"cli:{name}"


def actor_of(args) -> str:
    actor = getattr(args, "actor", None)
    if actor is not None and not actor.strip():
        raise InvalidInput("--actor must not be empty")
    return actor or default_actor()


def tenant_flag(args) -> str:
    """`` --tenant T`` for the commands a message suggests, empty for the default tenant."""
    return "" if args.tenant == DEFAULT_TENANT else f" --tenant {args.tenant}"


def ts(value: datetime | None) -> str:
    """A timestamp for people: UTC, to the second."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def fmt_age(value: timedelta | None) -> str:
    if value is None:
        return "-"
    s = max(0, int(value.total_seconds()))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h:02d}h"
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def cell(value: Any, width: int | None = None) -> str:
    if value is None or value == "":
        text = "-"
    elif isinstance(value, datetime):
        text = ts(value)
    elif isinstance(value, timedelta):
        text = fmt_age(value)
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, dict | list):
        text = json.dumps(value, default=_json_default)
    else:
        text = " ".join(str(value).split())
    if width is not None and len(text) > width:
        text = text[: width - 1] + "…"
    return text


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns under upper-case headers."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    return "\n".join([line([h.upper() for h in headers])] + [line(r) for r in cells])


def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + ln for ln in text.splitlines())


# --- sequences -------------------------------------------------------------------------


@command
def sequences_create(args, url: str) -> int:
    definition = load_definition_file(args.file)
    with db.connect(url, autocommit=True) as conn:
        try:
            row = create_sequence(conn, args.tenant, args.namespace, args.name, definition)
        except InvalidSequence as exc:
            lines = [f"orch8: error: {exc}"] + [
                f"  {p.get('path')}: {p.get('message')}" for p in exc.problems
            ]
            print("\n".join(lines), file=sys.stderr, flush=True)
            return EXIT_USAGE
    emit(
        row,
        args.json,
        f"created {row['namespace']}/{row['name']} version {row['version']} (id {row['id']})",
    )
    return EXIT_OK


@command
def sequences_list(args, url: str) -> int:
    with db.connect(url, autocommit=True) as conn, conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT * FROM ("
            " SELECT DISTINCT ON (namespace, name) namespace, name, version AS latest_version,"
            "  count(*) OVER (PARTITION BY namespace, name) AS versions, id,"
            "  jsonb_array_length(definition -> 'blocks') AS blocks,"
            "  definition ->> 'status' AS status, created_at"
            " FROM orch8.sequences"
            " WHERE tenant_id = %(tenant)s AND (%(ns)s::text IS NULL OR namespace = %(ns)s)"
            " ORDER BY namespace, name, version DESC) AS latest"
            " ORDER BY namespace, name",
            {"tenant": args.tenant, "ns": args.namespace},
        ).fetchall()
    if args.json:
        emit(rows, True, "")
    elif not rows:
        where = f" in namespace {args.namespace!r}" if args.namespace else ""
        print(
            f"no sequences in tenant {args.tenant!r}{where}; "
            f"create one with `orch8 sequences create FILE --name NAME{tenant_flag(args)}`",
            flush=True,
        )
    else:
        print(
            table(
                ["namespace", "name", "latest", "versions", "blocks", "status", "created"],
                [
                    (
                        r["namespace"],
                        r["name"],
                        r["latest_version"],
                        r["versions"],
                        r["blocks"],
                        r["status"],
                        r["created_at"],
                    )
                    for r in rows
                ],
            ),
            flush=True,
        )
    return EXIT_OK


@command
def sequences_show(args, url: str) -> int:
    if args.version is not None and args.version < 1:
        raise InvalidInput(f"--version must be 1 or more, got {args.version}")
    with db.connect(url, autocommit=True) as conn, conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            "SELECT id, tenant_id, namespace, name, version, definition, created_at"
            " FROM orch8.get_sequence(%s, %s, %s, %s)",
            (args.tenant, args.namespace, args.name, args.version),
        ).fetchone()
        if row is None or row["id"] is None:
            which = f" version {args.version}" if args.version is not None else ""
            raise NotFound(
                f"sequence {args.namespace}/{args.name}{which} not found in tenant "
                f"{args.tenant!r}; see `orch8 sequences list{tenant_flag(args)}`"
            )
        versions = [
            v
            for (v,) in conn.execute(
                "SELECT version FROM orch8.sequences WHERE tenant_id = %s AND namespace = %s"
                " AND name = %s ORDER BY version",
                (args.tenant, args.namespace, args.name),
            ).fetchall()
        ]
    if args.json:
        emit({**row, "versions": versions}, True, "")
        return EXIT_OK
    blocks = row["definition"].get("blocks") or []
    lines = [
        f"sequence {row['namespace']}/{row['name']} version {row['version']}"
        f" (versions: {', '.join(map(str, versions))})",
        f"  id       {row['id']}",
        f"  created  {ts(row['created_at'])}",
        "  blocks:",
    ]
    lines += [
        f"    {cell(b.get('id')):<20} {cell(b.get('type')):<10} {cell(b.get('handler'))}"
        for b in blocks
        if isinstance(b, dict)
    ]
    invariants = row["definition"].get("invariants") or []
    if invariants:
        lines.append("  invariants:")
        lines += [f"    {json.dumps(i)}" for i in invariants]
    lines += ["  definition:", indent(json.dumps(row["definition"], indent=2))]
    print("\n".join(lines), flush=True)
    return EXIT_OK


# --- instances -------------------------------------------------------------------------


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


# --- the parsers -----------------------------------------------------------------------


def add_parsers(sub, tenant_default: str = DEFAULT_TENANT) -> None:
    from . import cli_effects, cli_keys, cli_webhooks

    def common(sp):
        sp.add_argument(
            "--tenant", default=tenant_default, help=f"tenant (default: {tenant_default})"
        )
        sp.add_argument("--json", action="store_true", help="print JSON (for scripts)")

    def actor(sp):
        sp.add_argument(
            "--actor", default=None, help="who is doing this, recorded (default: cli:$USER)"
        )

    seqs = sub.add_parser("sequences", help="workflow definitions")
    seqsub = seqs.add_subparsers(dest="seq_command", required=True, metavar="COMMAND")
    create = seqsub.add_parser("create", help="validate and store the next version of a sequence")
    create.add_argument("file", help="the definition, a JSON file")
    create.add_argument("--name", required=True, help="sequence name")
    create.add_argument("--namespace", default="default")
    common(create)
    create.set_defaults(db_func=sequences_create)
    lst = seqsub.add_parser("list", help="sequences: the latest version of each, with counts")
    lst.add_argument("--namespace", default=None, help="only this namespace")
    common(lst)
    lst.set_defaults(db_func=sequences_list)
    show = seqsub.add_parser("show", help="one sequence's definition")
    show.add_argument("name", help="sequence name")
    show.add_argument("--namespace", default="default")
    show.add_argument("--version", type=int, default=None, help="default: the latest")
    common(show)
    show.set_defaults(db_func=sequences_show)

    insts = sub.add_parser("instances", help="workflow instances")
    instsub = insts.add_subparsers(dest="inst_command", required=True, metavar="COMMAND")
    start = instsub.add_parser("start", help="start an instance of a sequence")
    start.add_argument("sequence", help="sequence name")
    start.add_argument("--namespace", default="default")
    start.add_argument("--version", type=int, default=None, help="default: the latest")
    start.add_argument("--data", default="{}", help="context data, a JSON object")
    start.add_argument("--idempotency-key", default=None)
    start.add_argument("--priority", type=int, default=0)
    common(start)
    start.set_defaults(db_func=instances_start)
    lst = instsub.add_parser("list", help="instances, newest first")
    lst.add_argument("--state", choices=INSTANCE_STATES, default=None)
    lst.add_argument("--sequence", default=None, metavar="NAME", help="only this sequence")
    lst.add_argument("--namespace", default=None, help="only sequences of this namespace")
    lst.add_argument("--limit", type=int, default=50, help="at most N rows (default 50)")
    common(lst)
    lst.set_defaults(db_func=instances_list)
    show = instsub.add_parser("show", help="an instance with its steps and effect receipts")
    show.add_argument("id", help="instance id")
    common(show)
    show.set_defaults(db_func=instances_show)
    retry = instsub.add_parser(
        "retry",
        help="retry a failed instance (exit 3 while an effect receipt is still unknown)",
    )
    retry.add_argument("id", help="instance id")
    actor(retry)
    common(retry)
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
        actor(sp)
        common(sp)
        sp.set_defaults(db_func=func)
    sig = instsub.add_parser("signal", help="send a signal (cancel, pause, resume act)")
    sig.add_argument("id", help="instance id")
    sig.add_argument("type", help="signal type, e.g. approved (cancel, pause, resume act)")
    sig.add_argument("--payload", default=None, help="a JSON object (default {})")
    actor(sig)
    common(sig)
    sig.set_defaults(db_func=instances_signal)

    cli_effects.add_parsers(sub, common, actor)
    cli_keys.add_parsers(sub, common)
    cli_webhooks.add_parsers(sub, common)
