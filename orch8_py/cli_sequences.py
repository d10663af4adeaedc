"""`orch8 sequences create|list|show`: store and read workflow definitions."""

from __future__ import annotations

import json
import sys

from psycopg.rows import dict_row

from . import db
from .cli_common import (
    EXIT_OK,
    EXIT_USAGE,
    cell,
    command,
    common_flags,
    emit,
    indent,
    table,
    tenant_flag,
    ts,
)
from .errors import InvalidInput, NotFound
from .sequences import InvalidSequence, create_sequence, load_definition_file


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


def add_parsers(sub) -> None:
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
