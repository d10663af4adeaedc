"""`orch8 effects unresolved|show|resolve`: the operator's queue of effects that may have
happened, the evidence of one, and recording what the provider says
(docs/CONTINUITY_OPERATIONS.md)."""

from __future__ import annotations

import argparse
import json

from .. import db, rules, sqlapi
from ..errors import NotFound
from .common import (
    EXIT_OK,
    Subparsers,
    actor_flag,
    check_limit,
    command,
    common_flags,
    emit,
    indent,
    parse_duration,
    parse_uuid,
    table,
    tenant_flag,
    ts,
)
from .common import actor_of as _actor_of
from .common import json_object as _json_object

# every state an operator may resolve some receipt to (orch8.effect_resolutions)
RESOLVE_STATES = tuple(
    s for s in rules.EFFECT_STATES if any(s in to for to in rules.RESOLUTIONS.values())
)
NEEDS_EVIDENCE = ", ".join(rules.RESOLUTIONS_NEEDING_EVIDENCE)


@command
def effects_unresolved(args: argparse.Namespace, url: str) -> int:
    limit = check_limit(args.limit)
    older = parse_duration(args.older_than, "--older-than") if args.older_than else None
    with db.connect(url, autocommit=True) as conn:
        rows = sqlapi.effects.unresolved_effects(
            conn, tenant_id=args.tenant, kind=args.kind, older_than=older, limit=limit
        )
    if args.json:
        hidden = ("destination_fingerprint", "request_sha256", "evidence", "continuity_id")
        out = []
        for r in rows:
            r = {k: v for k, v in r.items() if k not in hidden}
            r["age_seconds"] = r.pop("age").total_seconds()
            out.append(r)
        emit(out, True, "")
        return EXIT_OK
    if not rows:
        filters = []
        if args.kind:
            filters.append(f"kind {args.kind}")
        if args.older_than:
            filters.append(f"older than {args.older_than}")
        which = ", ".join(filters)
        print(
            f"no unresolved effects in tenant {args.tenant!r}" + (f" ({which})" if which else ""),
            flush=True,
        )
        return EXIT_OK
    text = table(
        ["effect id", "kind", "state", "age", "instance", "block", "attempt", "idempotency key"],
        [
            (
                r["effect_id"],
                r["kind"],
                r["state"],
                r["age"],
                r["instance_id"],
                r["block_id"],
                r["attempt"],
                r["idempotency_key"],
            )
            for r in rows
        ],
    )
    if len(rows) == limit:
        text += f"\n(the oldest {limit}; use --limit for more)"
    text += f"\nlook at one: orch8 effects show EFFECT_ID{tenant_flag(args)}"
    print(text, flush=True)
    return EXIT_OK


@command
def effects_show(args: argparse.Namespace, url: str) -> int:
    effect_id = parse_uuid(args.id, "an effect id")
    with db.connect(url, autocommit=True) as conn:
        found = sqlapi.effects.effect_receipt(conn, tenant_id=args.tenant, effect_id=effect_id)
        if found is None:
            raise NotFound(
                f"effect receipt {effect_id} not found in tenant {args.tenant!r}; "
                f"see `orch8 effects unresolved{tenant_flag(args)}`"
            )
        events = sqlapi.effects.receipt_events(
            conn, tenant_id=args.tenant, receipt_ids=[effect_id]
        )[effect_id]
        others = sqlapi.effects.other_receipts_of_step(conn, tenant_id=args.tenant, receipt=found)
    receipt = {
        "effect_id": found["id"],
        "tenant_id": args.tenant,
        **{k: v for k, v in found.items() if k not in ("id", "updated_at", "age")},
        "state_since": found["updated_at"],
    }
    if args.json:
        brief = (
            "epoch",
            "attempt",
            "state",
            "provider_receipt_id",
            "idempotency_key",
            "created_at",
        )
        other_attempts = [{"effect_id": o["id"], **{k: o[k] for k in brief}} for o in others]
        emit({**receipt, "events": events, "other_attempts": other_attempts}, True, "")
        return EXIT_OK
    r = receipt
    fields = [
        ("effect id", r["effect_id"]),
        ("instance", f"{r['instance_id']} ({r['instance_state'] or 'not found'})"),
        ("block", r["block_id"]),
        ("attempt", r["attempt"]),
        ("epoch", r["epoch"]),
        ("continuity id", r["continuity_id"]),
        ("handler", r["handler"]),
        ("kind", r["kind"]),
        ("state", f"{r['state']} (since {ts(r['state_since'])})"),
        ("created", ts(r["created_at"])),
        ("request sha256", r["request_sha256"]),
        ("destination fingerprint", r["destination_fingerprint"]),
        ("idempotency key", r["idempotency_key"] or "- (the effect id was sent as the key)"),
        ("provider receipt id", r["provider_receipt_id"] or "-"),
        ("error", r["error"] or "-"),
    ]
    lines = [f"effect {r['effect_id']}  {r['state']}"]
    lines += [f"  {name:<24} {value}" for name, value in fields]
    lines.append("  evidence:")
    lines.append(indent(json.dumps(r["evidence"], indent=2, sort_keys=True)))
    lines.append("history:")
    lines.append(
        indent(
            table(
                ["at", "from", "to", "actor", "note", "evidence"],
                [
                    (
                        e["at"],
                        e["from_state"],
                        e["to_state"],
                        e["actor"],
                        e["note"],
                        e["evidence"] or None,
                    )
                    for e in events
                ],
            ),
            "  ",
        )
    )
    if others:
        lines.append("other receipts of this step:")
        lines.append(
            indent(
                table(
                    ["effect id", "epoch", "attempt", "state", "provider receipt", "created"],
                    [
                        (
                            o["id"],
                            o["epoch"],
                            o["attempt"],
                            o["state"],
                            o["provider_receipt_id"],
                            o["created_at"],
                        )
                        for o in others
                    ],
                ),
                "  ",
            )
        )
    t = tenant_flag(args)
    if r["state"] == "unknown":
        lines.append(
            f"next: ask the provider, then `orch8 effects resolve {r['effect_id']}{t} "
            f"--state {'|'.join(rules.RESOLUTIONS['unknown'])} --evidence JSON --note TEXT`"
        )
    elif r["state"] == "dispatched":
        lines.append(
            "next: still dispatched; it cannot be resolved until its runner records the "
            "answer or the lease expires and the receipt becomes unknown"
        )
    print("\n".join(lines), flush=True)
    return EXIT_OK


@command
def effects_resolve(args: argparse.Namespace, url: str) -> int:
    effect_id = parse_uuid(args.id, "an effect id")
    evidence = _json_object(args.evidence, "--evidence")
    actor = _actor_of(args)
    with db.connect(url, autocommit=True) as conn:
        row = sqlapi.effects.resolve_effect(
            conn,
            tenant_id=args.tenant,
            effect_id=effect_id,
            state=args.state,
            actor=actor,
            evidence=evidence,
            provider_receipt_id=args.provider_receipt_id,
            note=args.note,
            expected_state=args.expected_state,
        )
        instance_state = sqlapi.instances.instance_state(
            conn, tenant_id=args.tenant, instance_id=row["instance_id"]
        )
    if args.json:
        emit({**row, "instance_state": instance_state}, True, "")
        return EXIT_OK
    receipt = (
        f" (provider receipt {row['provider_receipt_id']})" if row["provider_receipt_id"] else ""
    )
    lines = [f"effect {row['id']} is now {row['state']}{receipt}, recorded as {actor}"]
    if instance_state == "failed":
        again = "runs again as a new attempt"
        if row["state"] in ("committed", "verified"):
            again = "is completed from this evidence, not sent again"
        lines.append(
            f"next: `orch8 instances retry {row['instance_id']}{tenant_flag(args)}` "
            f"(the step {again})"
        )
    print("\n".join(lines), flush=True)
    return EXIT_OK


def add_parsers(sub: Subparsers) -> None:
    eff = sub.add_parser("effects", help="effect receipts: the unresolved queue, resolution")
    effsub = eff.add_subparsers(dest="effects_command", required=True, metavar="COMMAND")

    unresolved = effsub.add_parser(
        "unresolved", help="receipts that may have happened and nobody settled, oldest first"
    )
    unresolved.add_argument(
        "--kind", choices=rules.EFFECT_KINDS, default=None, help="only this effect kind"
    )
    unresolved.add_argument(
        "--older-than",
        default=None,
        metavar="AGE",
        help="only receipts older than this: 30s, 10m, 2h, 1d",
    )
    unresolved.add_argument("--limit", type=int, default=100, help="at most N rows (default 100)")
    common_flags(unresolved)
    unresolved.set_defaults(db_func=effects_unresolved)

    show = effsub.add_parser("show", help="one receipt: every evidence field and its history")
    show.add_argument("id", help="effect id")
    common_flags(show)
    show.set_defaults(db_func=effects_show)

    resolve = effsub.add_parser(
        "resolve", help="record what the provider says about an unknown receipt"
    )
    resolve.add_argument("id", help="effect id")
    resolve.add_argument(
        "--state",
        required=True,
        choices=RESOLVE_STATES,
        metavar="STATE",
        help=f"what happened: {', '.join(RESOLVE_STATES)}",
    )
    resolve.add_argument(
        "--provider-receipt-id", default=None, metavar="ID", help="the provider's own id"
    )
    resolve.add_argument(
        "--evidence",
        default=None,
        metavar="JSON",
        help=f"what you looked at and found, a JSON object (required for {NEEDS_EVIDENCE})",
    )
    resolve.add_argument("--note", default=None, metavar="TEXT")
    resolve.add_argument(
        "--expected-state",
        choices=rules.EFFECT_STATES,
        default=None,
        metavar="STATE",
        help="refuse (exit 4) unless the receipt is still in this state (e.g. unknown)",
    )
    actor_flag(resolve)
    common_flags(resolve)
    resolve.set_defaults(db_func=effects_resolve)
