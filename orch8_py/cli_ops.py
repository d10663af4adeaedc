"""`orch8 sequences ...` and `orch8 instances ...`: define workflows, start and inspect
instances from the shell. Human-readable by default, ``--json`` for scripts."""

from __future__ import annotations

import json
import uuid
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from . import db
from .errors import InvalidInput, NotFound
from .sequences import InvalidSequence, create_sequence, load_definition_file


def _print(value: Any, as_json: bool, text: str) -> None:
    print(json.dumps(value, default=str, indent=2) if as_json else text, flush=True)


def _json_arg(raw: str, flag: str) -> dict:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise InvalidInput(f"{flag} is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{flag} must be a JSON object")
    return value


def sequences_create(args, url: str) -> int:
    definition = load_definition_file(args.file)
    with db.connect(url, autocommit=True) as conn:
        try:
            row = create_sequence(conn, args.tenant, args.namespace, args.name, definition)
        except InvalidSequence as exc:
            lines = [f"orch8: error: {exc}"] + [
                f"  {p.get('path')}: {p.get('message')}" for p in exc.problems
            ]
            print("\n".join(lines), file=__import__("sys").stderr, flush=True)
            return 2
    _print(
        row,
        args.json,
        f"created {row['namespace']}/{row['name']} version {row['version']} (id {row['id']})",
    )
    return 0


def instances_start(args, url: str) -> int:
    data = _json_arg(args.data, "--data")
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
    _print(result, args.json, f"instance {row[0]} {row[1]}{note}")
    return 0


def instances_show(args, url: str) -> int:
    try:
        instance_id = uuid.UUID(args.id)
    except ValueError:
        raise InvalidInput(f"{args.id!r} is not an instance id (a UUID)") from None
    with db.connect(url, autocommit=True) as conn, conn.cursor(row_factory=dict_row) as cur:
        inst = cur.execute(
            "SELECT id, state::text AS state, current_block, error, created_at, updated_at,"
            " context FROM orch8.task_instances WHERE tenant_id = %s AND id = %s",
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
        _print({**inst, "outputs": outputs, "effects": receipts}, True, "")
        return 0
    lines = [f"instance {inst['id']}  {inst['state']}"]
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
    return 0


def add_parsers(sub, tenant_default: str = "default") -> None:
    def common(sp):
        sp.add_argument("--tenant", default=tenant_default, help="tenant (default: default)")
        sp.add_argument("--json", action="store_true", help="print JSON")

    seqs = sub.add_parser("sequences", help="workflow definitions")
    seqsub = seqs.add_subparsers(dest="seq_command", required=True, metavar="COMMAND")
    create = seqsub.add_parser("create", help="validate and store the next version of a sequence")
    create.add_argument("file", help="the definition, a JSON file")
    create.add_argument("--name", required=True, help="sequence name")
    create.add_argument("--namespace", default="default")
    common(create)
    create.set_defaults(db_func=sequences_create)

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
    show = instsub.add_parser("show", help="an instance with its steps and effect receipts")
    show.add_argument("id", help="instance id")
    common(show)
    show.set_defaults(db_func=instances_show)
