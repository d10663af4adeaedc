"""`orch8 rate-limits set|list`: a tenant's token buckets, which steps name with
`rate_limit_key` (the claim takes their tokens; a step without one is deferred)."""

from __future__ import annotations

import argparse
from typing import Any

from .. import db, sqlapi
from .common import (
    EXIT_OK,
    Subparsers,
    actor_flag,
    actor_of,
    command,
    common_flags,
    emit,
    table,
)


def _per(ms: int) -> str:
    """A period in the largest unit that divides it (60000 -> 1m)."""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _line(r: dict[str, Any]) -> str:
    return (
        f"{r['key']}: {r['rate']} per {_per(r['per_ms'])}, burst {r['burst']}; "
        f"{r['tokens_now']:.2f} tokens now, {r['waiting']} step(s) waiting; "
        f"admitted {r['admitted']}, deferred {r['deferred']} time(s)"
    )


@command
def rate_limits_set(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        row = sqlapi.flow_control.set_rate_limit(
            conn,
            tenant_id=args.tenant,
            key=args.key,
            rate=args.rate,
            per=args.per,
            burst=args.burst,
            actor=actor_of(args),
        )
    emit(row, args.json, "set rate limit " + _line(row))
    return EXIT_OK


@command
def rate_limits_list(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        rows = sqlapi.flow_control.list_rate_limits(conn, tenant_id=args.tenant)
    text = (
        table(
            ["key", "rate", "burst", "tokens now", "waiting", "admitted", "deferred"],
            [
                (
                    r["key"],
                    f"{r['rate']}/{_per(r['per_ms'])}",
                    r["burst"],
                    f"{r['tokens_now']:.2f}",
                    r["waiting"],
                    r["admitted"],
                    r["deferred"],
                )
                for r in rows
            ],
        )
        if rows
        else f"no rate limits in tenant {args.tenant!r}"
    )
    emit(rows, args.json, text)
    return EXIT_OK


def add_parsers(sub: Subparsers) -> None:
    rl = sub.add_parser("rate-limits", help="token buckets that steps' rate_limit_key names")
    rlsub = rl.add_subparsers(dest="rate_limit_command", required=True, metavar="COMMAND")
    st = rlsub.add_parser("set", help="define or change one (a new one starts full)")
    st.add_argument("key", help="the rate_limit_key steps name (A-Z a-z 0-9 _ . -)")
    st.add_argument("--rate", type=int, required=True, help="tokens per period")
    st.add_argument("--per", required=True, help="the period: 1s, 1m, 1h, 1h30m or milliseconds")
    st.add_argument("--burst", type=int, default=None, help="most tokens held (default: rate)")
    common_flags(st)
    actor_flag(st)
    st.set_defaults(db_func=rate_limits_set)
    lst = rlsub.add_parser("list", help="the tenant's rate limits and what waits on them")
    common_flags(lst)
    lst.set_defaults(db_func=rate_limits_list)
