"""`orch8 effects unresolved|show|resolve|verify`: the operator's queue of effects that may
have happened, the evidence of one, recording what the provider says, and asking the
steps' verifiers to settle receipts (docs/CONTINUITY_OPERATIONS.md)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import db, rules, settlement, sqlapi
from ..errors import InvalidInput, NotFound
from ..sqlapi.base import NO_OUTPUT, Row
from .common import (
    EXIT_OK,
    Subparsers,
    actor_flag,
    check_limit,
    command,
    common_flags,
    emit,
    import_flag,
    import_handler_modules,
    indent,
    json_value,
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
OUTPUT_STATES = " or ".join(settlement.OUTPUT_STATES)

# what each outcome of orch8.request_verifications means, for people
VERIFY_OUTCOMES = {
    "scheduled": "its verifier will try to settle it",
    "rescheduled": "its escalated verification starts over, with its tries reset",
    "already_scheduled": "its verifier is already on it",
    "no_verifier": "its step declares no verify: resolve it yourself (orch8 effects resolve)",
    "not_unknown": "it is not unknown (settled already, or still dispatched)",
    "not_found": "no such receipt in this tenant",
}


def resolve_hint(effect_id: Any, tenant: str) -> str:
    """The command that records what the provider says about an unknown receipt."""
    return (
        f"orch8 effects resolve {effect_id}{tenant} --expected-state unknown "
        f"--state {'|'.join(rules.RESOLUTIONS['unknown'])} --evidence JSON --note TEXT"
    )


def blocking_text(row: Row) -> str:
    """Whether an instance waits on the receipt: yes, or superseded (history)."""
    if row["blocking"] is None:
        return "-"
    return "yes" if row["blocking"] else "superseded"


def verification_text(row: Row) -> str:
    """The verifier's progress: verifying 2/5, escalated 5/5, settled 1/5, or -."""
    state = row["verification"]
    if state is None:
        return "-"
    tries = f"{row['verification_tries']}/{row['verification_max_tries']}"
    return f"{'verifying' if state == 'pending' else state} {tries}"


@command
def effects_unresolved(args: argparse.Namespace, url: str) -> int:
    limit = check_limit(args.limit)
    older = parse_duration(args.older_than, "--older-than") if args.older_than else None
    blocking = True if args.blocking else False if args.superseded else None
    with db.connect(url, autocommit=True) as conn:
        rows = sqlapi.effects.unresolved_effects(
            conn,
            tenant_id=args.tenant,
            kind=args.kind,
            older_than=older,
            blocking=blocking,
            limit=limit,
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
        if blocking is not None:
            filters.append("blocking an instance" if blocking else "superseded")
        which = ", ".join(filters)
        print(
            f"no unresolved effects in tenant {args.tenant!r}" + (f" ({which})" if which else ""),
            flush=True,
        )
        return EXIT_OK
    text = table(
        [
            "effect id",
            "kind",
            "state",
            "age",
            "instance",
            "block",
            "attempt",
            "blocking",
            "verification",
            "idempotency key",
        ],
        [
            (
                r["effect_id"],
                r["kind"],
                r["state"],
                r["age"],
                r["instance_id"],
                r["block_id"],
                r["attempt"],
                blocking_text(r),
                verification_text(r),
                r["idempotency_key"],
            )
            for r in rows
        ],
    )
    if len(rows) == limit:
        text += f"\n(the oldest {limit}; use --limit for more)"
    t = tenant_flag(args)
    text += f"\nlook at one: orch8 effects show EFFECT_ID{t}"
    if any(r["blocking"] is False and r["state"] == "unknown" for r in rows):
        text += (
            "\nsuperseded: no instance waits on them; let their verifiers settle them with "
            f"`orch8 effects verify --superseded{t}`"
        )
    print(text, flush=True)
    return EXIT_OK


@command
def effects_find(args: argparse.Namespace, url: str) -> int:
    key = args.key.strip()
    most = rules.LIMITS["idempotency_key_bytes"]
    if not key or len(key.encode()) > most or "\x00" in key:
        raise InvalidInput(f"the key must be 1 to {most} bytes, without NUL")
    with db.connect(url, autocommit=True) as conn:
        rows = sqlapi.effects.find_receipts(conn, tenant_id=args.tenant, key=key)
    if args.json:
        emit(rows, True, "")
        return EXIT_OK
    if not rows:
        print(
            f"no receipt in tenant {args.tenant!r} has the id, idempotency key or provider "
            f"receipt id {key!r}",
            flush=True,
        )
        return EXIT_OK
    text = table(
        ["effect id", "state", "instance", "block", "attempt", "idempotency key", "provider id"],
        [
            (
                r["id"],
                r["state"],
                r["instance_id"],
                r["block_id"],
                r["attempt"],
                r["idempotency_key"],
                r["provider_receipt_id"],
            )
            for r in rows
        ],
    )
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
                ["at", "from", "to", "actor", "login", "note", "evidence"],
                [
                    (
                        e["at"],
                        e["from_state"],
                        e["to_state"],
                        e["actor"],
                        e["db_user"],
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
        lines.append(f"next: ask the provider, then `{resolve_hint(r['effect_id'], t)}`")
    elif r["state"] == "dispatched":
        lines.append(
            "next: still dispatched; it cannot be resolved until its runner records the "
            "answer or the lease expires and the receipt becomes unknown"
        )
    print("\n".join(lines), flush=True)
    return EXIT_OK


def _response(raw: str | None) -> dict[str, Any] | None:
    """--response: the provider's answer {status, json?, body?, headers?}."""
    response = _json_object(raw, "--response")
    if response is None:
        return None
    status = response.get("status")
    if isinstance(status, bool) or not isinstance(status, int):
        raise InvalidInput(
            "--response needs the provider's HTTP status as an integer, e.g. "
            '\'{"status": 200, "json": {"id": "ch_1"}}\''
        )
    return response


@command
def effects_resolve(args: argparse.Namespace, url: str) -> int:
    effect_id = parse_uuid(args.id, "an effect id")
    import_handler_modules(args.imports)
    evidence = _json_object(args.evidence, "--evidence")
    response = _response(args.response)
    if response is not None:
        if evidence is not None and "response" in evidence:
            raise InvalidInput(
                'give the provider\'s response once: --response, or "response" in --evidence'
            )
        evidence = {**(evidence or {}), "response": response}
    output = NO_OUTPUT if args.output is None else json_value(args.output, "--output")
    actor = _actor_of(args)
    with db.connect(url, autocommit=True) as conn:
        row = settlement.resolve(
            conn,
            tenant_id=args.tenant,
            effect_id=effect_id,
            expected_state=args.expected_state,
            state=args.state,
            actor=actor,
            evidence=evidence,
            provider_receipt_id=args.provider_receipt_id,
            note=args.note,
            output=output,
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
    resolution = row["evidence"].get("resolution") or {}
    if "output" in resolution:
        shown = json.dumps(resolution["output"], sort_keys=True)
        lines.append(f"the step's output: {shown if len(shown) <= 200 else shown[:199] + '…'}")
    if instance_state in ("failed", "waiting"):
        again = "runs again as a new attempt"
        if row["state"] in settlement.OUTPUT_STATES:
            again = "is completed from this evidence, not sent again"
        lines.append(
            f"next: `orch8 instances retry {row['instance_id']}{tenant_flag(args)}` "
            f"(the step {again})"
        )
    print("\n".join(lines), flush=True)
    return EXIT_OK


@command
def effects_verify(args: argparse.Namespace, url: str) -> int:
    if bool(args.ids) == bool(args.superseded):
        raise InvalidInput(
            "name the receipts to verify (EFFECT_ID ...) or give --superseded, not both"
            if args.ids
            else "name the receipts to verify (EFFECT_ID ...), or give --superseded"
        )
    effect_ids = [parse_uuid(raw, "an effect id") for raw in args.ids] or None
    with db.connect(url, autocommit=True) as conn:
        rows = sqlapi.effects.request_verifications(
            conn,
            tenant_id=args.tenant,
            actor=_actor_of(args),
            effect_ids=effect_ids,
            superseded=args.superseded,
        )
    if args.json:
        emit(rows, True, "")
        return EXIT_OK
    if not rows:
        print(f"no superseded unknown receipts in tenant {args.tenant!r}", flush=True)
        return EXIT_OK
    lines = []
    for r in rows:
        meaning = VERIFY_OUTCOMES.get(r["outcome"])
        lines.append(f"{r['effect_id']}  {r['outcome']}" + (f": {meaning}" if meaning else ""))
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
    which = unresolved.add_mutually_exclusive_group()
    which.add_argument("--blocking", action="store_true", help="only receipts an instance waits on")
    which.add_argument(
        "--superseded",
        action="store_true",
        help="only receipts no instance waits on (it ended, or a later attempt completed)",
    )
    common_flags(unresolved)
    unresolved.set_defaults(db_func=effects_unresolved)

    find = effsub.add_parser(
        "find",
        help="the receipts a key points at: a receipt id, an idempotency key or a "
        "provider's receipt id",
    )
    find.add_argument("key", help="what the provider shows (at most 256 bytes)")
    common_flags(find)
    find.set_defaults(db_func=effects_find)

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
        "--expected-state",
        required=True,
        choices=rules.EFFECT_STATES,
        metavar="STATE",
        help="the state you saw (normally unknown): refused (exit 4) unless the receipt is "
        "still in it",
    )
    resolve.add_argument(
        "--provider-receipt-id", default=None, metavar="ID", help="the provider's own id"
    )
    resolve.add_argument(
        "--evidence",
        default=None,
        metavar="JSON",
        help="what you looked at and found, a JSON object or @FILE "
        f"(required for {NEEDS_EVIDENCE})",
    )
    resolve.add_argument(
        "--response",
        default=None,
        metavar="JSON",
        help='the provider\'s answer {"status": 200, "json"?: ..., "body"?: "...", '
        '"headers"?: {...}}, or @FILE: kept as evidence.response; for http_request the '
        "step's output is derived from it",
    )
    resolve.add_argument(
        "--output",
        default=None,
        metavar="JSON",
        help=f"the output the step would have returned ({OUTPUT_STATES} only), any JSON "
        "or @FILE: a retry completes the step with it",
    )
    resolve.add_argument("--note", default=None, metavar="TEXT")
    import_flag(resolve)  # the handler's output_from_evidence, for a custom handler
    actor_flag(resolve)
    common_flags(resolve)
    resolve.set_defaults(db_func=effects_resolve)

    verify = effsub.add_parser("verify", help="ask the steps' verifiers to settle unknown receipts")
    verify.add_argument("ids", nargs="*", metavar="EFFECT_ID", help="the receipts to verify")
    verify.add_argument(
        "--superseded",
        action="store_true",
        help="every unknown receipt of the tenant that no instance waits on",
    )
    actor_flag(verify)
    common_flags(verify)
    verify.set_defaults(db_func=effects_verify)
