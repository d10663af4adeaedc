"""`orch8 instances bulk ACTION --FILTER...`: retry, cancel, pause or resume every
instance that matches a filter. The dry-run count comes first; without ``--yes`` a
terminal is asked to confirm (without one the command refuses); then batches, each its
own transaction, with progress on stderr (a bar on a terminal, a line per batch
otherwise) and a summary on stdout. Ctrl-C stops after the current batch."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from .. import bulk, db, rules, sqlapi
from ..errors import InvalidInput
from ..sqlapi.base import Conn
from .common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    Subparsers,
    actor_flag,
    actor_of,
    cell,
    command,
    common_flags,
    emit,
    fail,
    parse_duration,
    to_json,
)

EXIT_INTERRUPTED = 130  # as for any command stopped by Ctrl-C
BAR = 30
TIME_FLAGS = ("created_after", "created_before", "updated_after", "updated_before")


def parse_time(raw: str, flag: str) -> str:
    """An ISO 8601 date or date-time (UTC when it has no offset), or a duration meaning
    that long ago (``2d``, ``90m``); the filter gets it with its offset."""
    try:
        when = datetime.fromisoformat(raw.strip())
    except ValueError:
        try:
            when = datetime.now(UTC) - parse_duration(raw, flag)
        except InvalidInput:
            raise InvalidInput(
                f"{flag} {raw!r} is neither a date or time (2030-01-31, "
                "2030-01-31T12:00:00Z) nor a duration ago (30m, 2h, 3d)"
            ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.isoformat()


def filter_of(args: argparse.Namespace) -> dict[str, Any]:
    """The filter the flags say (flags left out are not part of it); SQL checks it."""
    found: dict[str, Any] = {
        "sequence": args.sequence,
        "namespace": args.namespace,
        "state": args.state,
        "error_contains": args.error_contains,
    }
    for name in TIME_FLAGS:
        raw = getattr(args, name)
        if raw is not None:
            found[name] = parse_time(raw, "--" + name.replace("_", "-"))
    return {k: v for k, v in found.items() if v is not None}


class Reporter:
    """Progress on stderr: a bar redrawn in place on a terminal, else a line a batch."""

    def __init__(self, action: str, tty: bool) -> None:
        self.action = action
        self.tty = tty

    def __call__(self, p: bulk.Progress) -> None:
        counts = f"applied {p.applied}  skipped {p.skipped}  {p.rate():.0f}/s"
        if self.tty:
            share = min(1.0, p.processed / p.matched) if p.matched else 1.0
            filled = round(share * BAR)
            bar = "#" * filled + "." * (BAR - filled)
            end = "\n" if p.finished else ""
            line = f"\r{self.action} [{bar}] {p.processed}/{p.matched}  {counts}"
            print(line, end=end, file=sys.stderr, flush=True)
        else:
            print(
                f"{self.action}: batch {p.batches}: processed {p.processed}/{p.matched}, "
                f"applied {p.applied}, skipped {p.skipped} ({p.rate():.0f}/s)",
                file=sys.stderr,
                flush=True,
            )


class StopAfterBatch:
    """The first Ctrl-C asks the run to stop after the current batch; a second one
    interrupts at once (KeyboardInterrupt: that batch's transaction rolls back)."""

    def __init__(self) -> None:
        self.asked = False

    def __call__(self) -> bool:
        return self.asked

    def _on_sigint(self, _signum: int, _frame: FrameType | None) -> None:
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True
        print(
            "\norch8: stopping after the current batch (Ctrl-C again to stop now)",
            file=sys.stderr,
            flush=True,
        )

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        before = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, before)


def confirmed(action: str, matched: int) -> bool:
    print(f"{action} {matched} instance(s)? [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def summary_text(p: bulk.Progress) -> str:
    lines = [
        f"{p.action}: {p.applied} applied, {p.skipped} skipped of {p.processed} processed "
        f"({p.matched} matched at the dry run)"
    ]
    for reason, count in p.skip_reasons.most_common():
        lines.append(f"  skipped {count}: {reason}")
    for s in p.skip_sample[:3]:
        lines.append(f"    e.g. instance {s.get('instance_id')}: {cell(s.get('reason'), 80)}")
    if p.interrupted:
        lines.append("interrupted after the current batch: run the same command again for the rest")
    return "\n".join(lines)


@command
def instances_bulk(args: argparse.Namespace, url: str) -> int:
    action: str = args.action
    actor = actor_of(args)
    wanted = filter_of(args)
    with db.connect(url, autocommit=True) as conn:
        matched = sqlapi.bulk.bulk_count(conn, tenant_id=args.tenant, filter=wanted)
        if args.dry_run:
            result = {"action": action, "filter": wanted, "matched": matched, "dry_run": True}
            emit(result, args.json, f"{matched} instance(s) match: dry run, nothing changed")
            return EXIT_OK
        print(f"{matched} instance(s) match the filter", file=sys.stderr, flush=True)
        if matched and not args.yes:
            if not sys.stdin.isatty():
                return fail(
                    f"{matched} instance(s) match; {action} them with --yes (no terminal to "
                    "confirm on), or look first with --dry-run; nothing changed",
                    EXIT_USAGE,
                )
            if not confirmed(action, matched):
                return fail("not confirmed; nothing changed", EXIT_ERROR)

        @contextlib.contextmanager
        def transaction() -> Iterator[Conn]:
            yield conn  # autocommit: each bulk_apply is its own transaction

        stop = StopAfterBatch()
        with stop.installed():
            progress = bulk.run(
                transaction,
                tenant_id=args.tenant,
                action=action,
                filter=wanted,
                actor=actor,
                matched=matched,
                reason=args.reason,
                batch=args.batch,
                on_batch=Reporter(action, sys.stderr.isatty()),
                stop=stop,
            )
    if args.json:
        print(to_json(progress.summary()), flush=True)
    else:
        print(summary_text(progress), flush=True)
    return EXIT_INTERRUPTED if progress.interrupted else EXIT_OK


def add_parser(instsub: Subparsers) -> None:
    sp = instsub.add_parser(
        "bulk",
        help="retry, cancel, pause or resume every instance matching a filter",
        description="Count the instances matching the filter (the dry run), then, with "
        "--yes or once confirmed on a terminal, act on them in batches (each its own "
        "transaction). An instance that refuses (not failed any more, a receipt to "
        "resolve) is skipped with its reason. Ctrl-C stops after the current batch.",
    )
    sp.add_argument("action", choices=rules.BULK_ACTIONS)
    sp.add_argument("--sequence", default=None, metavar="NAME", help="of this sequence")
    sp.add_argument("--namespace", default=None, help="of sequences of this namespace")
    sp.add_argument(
        "--state",
        action="append",
        choices=rules.INSTANCE_STATES,
        default=None,
        help="in this state (repeat for several)",
    )
    sp.add_argument(
        "--error-contains", default=None, metavar="TEXT", help="whose error has TEXT (any case)"
    )
    for name in TIME_FLAGS:
        what, side = name.split("_")
        sp.add_argument(
            "--" + name.replace("_", "-"),
            default=None,
            metavar="WHEN",
            help=f"{what} {'at or after' if side == 'after' else 'before'} WHEN: a date, "
            "a date-time (UTC without an offset) or a duration ago (3d)",
        )
    sp.add_argument("--dry-run", action="store_true", help="only count; change nothing")
    sp.add_argument("--yes", action="store_true", help="act without asking")
    sp.add_argument(
        "--batch",
        type=int,
        default=bulk.DEFAULT_BATCH,
        metavar="N",
        help=f"instances per transaction (default {bulk.DEFAULT_BATCH}, at most "
        f"{rules.LIMITS['bulk_batch']})",
    )
    sp.add_argument("--reason", default=None, help="recorded with a cancel or a pause")
    actor_flag(sp)
    common_flags(sp)
    sp.set_defaults(db_func=instances_bulk)
