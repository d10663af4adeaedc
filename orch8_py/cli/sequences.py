"""`orch8 sequences create|list|show`: store and read workflow definitions."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from .. import db, sqlapi
from ..errors import InvalidInput, InvalidSequence, NotFound
from .common import (
    EXIT_OK,
    EXIT_USAGE,
    MAX_LIMIT,
    Subparsers,
    cell,
    command,
    common_flags,
    emit,
    indent,
    table,
    tenant_flag,
    ts,
)

_JSON_KINDS = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def load_definition_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a sequence definition (a JSON object) from a file.

    Raises InvalidInput with a one-line message when the file cannot be read or does not
    hold a JSON object.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(f"sequence definition file {p} not found") from None
    except IsADirectoryError:
        raise InvalidInput(f"sequence definition file {p} is a directory") from None
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"sequence definition file {p} is not UTF-8 text (byte {exc.start})"
        ) from None
    except OSError as exc:
        raise InvalidInput(f"cannot read sequence definition file {p}: {exc.strerror}") from None

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        value = json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"sequence definition file {p} is not valid JSON: {exc.msg} "
            f"at line {exc.lineno}, column {exc.colno}"
        ) from None
    except ValueError as exc:
        raise InvalidInput(f"sequence definition file {p} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        kind = _JSON_KINDS.get(type(value), "a number")
        raise InvalidInput(f"sequence definition file {p} must hold a JSON object, not {kind}")
    return value


@command
def sequences_create(args: argparse.Namespace, url: str) -> int:
    definition = load_definition_file(args.file)
    with db.connect(url, autocommit=True) as conn:
        try:
            row = sqlapi.sequences.create_sequence(
                conn,
                tenant_id=args.tenant,
                namespace=args.namespace,
                name=args.name,
                definition=definition,
            )
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
def sequences_list(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        rows = sqlapi.sequences.list_sequences(
            conn, tenant_id=args.tenant, namespace=args.namespace, limit=MAX_LIMIT
        )
    if args.json:
        emit(rows, True, "")
        return EXIT_OK
    if not rows:
        where = f" in namespace {args.namespace!r}" if args.namespace else ""
        print(
            f"no sequences in tenant {args.tenant!r}{where}; "
            f"create one with `orch8 sequences create FILE --name NAME{tenant_flag(args)}`",
            flush=True,
        )
        return EXIT_OK
    lines = [
        table(
            ["namespace", "name", "latest", "versions", "blocks", "created", "problems"],
            [
                (
                    r["namespace"],
                    r["name"],
                    r["latest_version"],
                    r["versions"],
                    r["blocks"],
                    r["created_at"],
                    f"{r['problems']} (!)" if r["problems"] else "-",
                )
                for r in rows
            ],
        )
    ]
    flagged = [r for r in rows if r["problems"]]
    if flagged:
        lines.append(
            f"(!) {len(flagged)} sequence(s) use fields this orch8 no longer accepts: they "
            "keep running as they were stored, but a new version must drop them; see "
            f"`orch8 sequences show {flagged[0]['name']}{tenant_flag(args)}`"
        )
    print("\n".join(lines), flush=True)
    return EXIT_OK


@command
def sequences_show(args: argparse.Namespace, url: str) -> int:
    if args.version is not None and args.version < 1:
        raise InvalidInput(f"--version must be 1 or more, got {args.version}")
    with db.connect(url, autocommit=True) as conn:
        row = sqlapi.sequences.get_sequence(
            conn,
            tenant_id=args.tenant,
            namespace=args.namespace,
            name=args.name,
            version=args.version,
        )
        if row is None:
            which = f" version {args.version}" if args.version is not None else ""
            raise NotFound(
                f"sequence {args.namespace}/{args.name}{which} not found in tenant "
                f"{args.tenant!r}; see `orch8 sequences list{tenant_flag(args)}`"
            )
        versions = [
            v["version"]
            for v in sqlapi.sequences.sequence_versions(
                conn, tenant_id=args.tenant, namespace=args.namespace, name=args.name
            )
        ]
        problems = sqlapi.sequences.validate_sequence(conn, definition=row["definition"])
    row = {**row, "tenant_id": args.tenant, "problems": problems}
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
    if problems:
        lines.append(
            "  problems (stored before this orch8 refused them; the version runs as stored,"
            " a new version must drop them):"
        )
        lines += [f"    {p['path']}: {p['message']}" for p in problems]
    lines += ["  definition:", indent(json.dumps(row["definition"], indent=2))]
    print("\n".join(lines), flush=True)
    return EXIT_OK


def add_parsers(sub: Subparsers) -> None:
    seqs = sub.add_parser("sequences", help="workflow definitions")
    seqsub = seqs.add_subparsers(dest="seq_command", required=True, metavar="COMMAND")
    create = seqsub.add_parser("create", help="validate and store the next version of a sequence")
    create.add_argument("file", help="the definition, a JSON file")
    create.add_argument("--name", required=True, help="sequence name")
    create.add_argument("--namespace", default="default")
    common_flags(create)
    create.set_defaults(db_func=sequences_create)
    lst = seqsub.add_parser("list", help="sequences: the latest version of each, with counts")
    lst.add_argument("--namespace", default=None, help="only this namespace")
    common_flags(lst)
    lst.set_defaults(db_func=sequences_list)
    show = seqsub.add_parser("show", help="one sequence's definition")
    show.add_argument("name", help="sequence name")
    show.add_argument("--namespace", default="default")
    show.add_argument("--version", type=int, default=None, help="default: the latest")
    common_flags(show)
    show.set_defaults(db_func=sequences_show)
