"""`orch8 db history list|ensure|archive`: the history tables' monthly partitions and the
archive (docs/STORAGE.md, "Archiving a month"). Run with the tables' owner (the URL
`orch8 db migrate` uses): archiving is the owner's alone."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt

from .. import db, sqlapi
from ..errors import InvalidInput
from .common import EXIT_OK, Subparsers, command, emit, table


def parse_month(raw: str) -> dt.date:
    """YYYY-MM (a UTC month) as its first day; InvalidInput in one line otherwise."""
    try:
        return dt.datetime.strptime(raw, "%Y-%m").date()
    except ValueError:
        raise InvalidInput(f"month {raw!r} is not YYYY-MM (for example 2026-11)") from None


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


@command
def history_list(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        parts = sqlapi.history.partitions(conn)
    text = table(
        ["table", "partition", "month", "where", "rows (estimate)", "size"],
        [
            (
                p.table_name,
                p.partition_name,
                p.month.strftime("%Y-%m") if p.month else "default",
                "archive" if p.archived else "live",
                p.row_estimate,
                _size(p.total_bytes),
            )
            for p in parts
        ],
    )
    emit([dataclasses.asdict(p) for p in parts], args.json, text)
    return EXIT_OK


@command
def history_ensure(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        made = sqlapi.history.ensure_partitions(conn, months_ahead=args.months_ahead)
    text = (
        "\n".join(
            f"made {m.partition_name}"
            + (f" ({m.rows_moved} rows moved in)" if m.rows_moved else "")
            for m in made
        )
        or f"every history table has this month and the next {args.months_ahead}"
    )
    emit([dataclasses.asdict(m) for m in made], args.json, text)
    return EXIT_OK


@command
def history_archive(args: argparse.Namespace, url: str) -> int:
    month = parse_month(args.month)
    with db.connect(url, autocommit=True) as conn:
        moved = sqlapi.history.archive_month(conn, month=month)
    total = sum(p.row_count for p in moved)
    text = "\n".join(
        [f"archived {p.partition_name}: {p.row_count} rows" for p in moved]
        + [
            f"{args.month}: {total} rows now in schema orch8_archive, still readable; "
            "to take them out of the database see docs/STORAGE.md"
        ]
    )
    emit([dataclasses.asdict(p) for p in moved], args.json, text)
    return EXIT_OK


def add_parsers(dbsub: Subparsers) -> None:
    hp = dbsub.add_parser("history", help="the history tables' monthly partitions and archive")
    hsub = hp.add_subparsers(dest="history_command", required=True, metavar="COMMAND")
    lst = hsub.add_parser("list", help="every partition, live and archived, with its size")
    lst.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    lst.set_defaults(db_func=history_list)
    ens = hsub.add_parser(
        "ensure", help="make this month's and the coming months' partitions (runners do hourly)"
    )
    ens.add_argument(
        "--months-ahead",
        type=int,
        default=2,
        help="months after this one to make (0-24, default 2)",
    )
    ens.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    ens.set_defaults(db_func=history_ensure)
    arc = hsub.add_parser(
        "archive", help="move an ended month to schema orch8_archive (still readable)"
    )
    arc.add_argument("month", help="the UTC month, YYYY-MM")
    arc.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    arc.set_defaults(db_func=history_archive)
