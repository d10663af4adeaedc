"""`orch8 webhooks subscribe|list|disable|enable|outbox`: a tenant's webhook subscriptions
and what waits in the outbox (delivery itself runs in every runner process)."""

from __future__ import annotations

import argparse
import secrets

from .. import db, rules, sqlapi
from ..errors import NotFound
from .common import (
    EXIT_OK,
    Subparsers,
    check_limit,
    command,
    common_flags,
    emit,
    parse_uuid,
    table,
    tenant_flag,
)


@command
def webhooks_subscribe(args: argparse.Namespace, url: str) -> int:
    secret = args.secret or secrets.token_urlsafe(32)
    with db.connect(url, autocommit=True) as conn:
        sub_id = sqlapi.webhooks.create_subscription(
            conn, tenant_id=args.tenant, url=args.url, secret=secret, events=args.events
        )
    result = {"id": sub_id, "url": args.url, "events": args.events or list(rules.WEBHOOK_EVENTS)}
    if not args.secret:
        result["secret"] = secret
    text = f"subscribed {args.url} to {', '.join(result['events'])} (subscription {sub_id})"
    if not args.secret:
        text += f"\nsigning secret (verify X-Orch8-Signature with it): {secret}"
    emit(result, args.json, text)
    return EXIT_OK


@command
def webhooks_list(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        rows = sqlapi.webhooks.list_subscriptions(conn, tenant_id=args.tenant)
    text = (
        table(
            ["id", "url", "events", "enabled", "created"],
            [
                (r["id"], r["url"], ",".join(r["events"]), r["enabled"], r["created_at"])
                for r in rows
            ],
        )
        if rows
        else f"no webhook subscriptions in tenant {args.tenant!r}"
    )
    emit(rows, args.json, text)
    return EXIT_OK


def _set_enabled(args: argparse.Namespace, url: str, enabled: bool) -> int:
    sub_id = parse_uuid(args.id, "a webhook subscription id")
    try:
        with db.connect(url, autocommit=True) as conn:
            row = sqlapi.webhooks.set_subscription_enabled(
                conn, tenant_id=args.tenant, subscription_id=sub_id, enabled=enabled
            )
    except NotFound:
        raise NotFound(
            f"webhook subscription {sub_id} not found in tenant {args.tenant!r}; "
            f"see `orch8 webhooks list{tenant_flag(args)}`"
        ) from None
    word = "enabled" if enabled else "disabled"
    if not row["changed"]:
        text = f"webhook subscription {sub_id} ({row['url']}) is already {word}: nothing to do"
    elif enabled:
        text = (
            f"enabled webhook subscription {sub_id} ({row['url']}): it gets new events, "
            "and its queued deliveries go out"
        )
    else:
        text = (
            f"disabled webhook subscription {sub_id} ({row['url']}): it gets no new events; "
            "its queued deliveries wait until it is enabled again"
        )
    emit(row, args.json, text)
    return EXIT_OK


@command
def webhooks_disable(args: argparse.Namespace, url: str) -> int:
    return _set_enabled(args, url, False)


@command
def webhooks_enable(args: argparse.Namespace, url: str) -> int:
    return _set_enabled(args, url, True)


@command
def webhooks_outbox(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        found = sqlapi.webhooks.list_deliveries(
            conn, tenant_id=args.tenant, state=args.state, limit=check_limit(args.limit)
        )
    shown = ("id", "event", "instance_id", "state", "attempts", "next_attempt_at")
    rows = [{k: r[k] for k in (*shown, "last_status", "last_error")} for r in found]
    text = (
        table(
            ["id", "event", "instance", "state", "attempts", "next attempt", "last"],
            [
                (
                    r["id"],
                    r["event"],
                    r["instance_id"],
                    r["state"],
                    r["attempts"],
                    r["next_attempt_at"],
                    r["last_status"] or r["last_error"] or "-",
                )
                for r in rows
            ],
        )
        if rows
        else "the outbox is empty"
    )
    emit(rows, args.json, text)
    return EXIT_OK


def add_parsers(sub: Subparsers) -> None:
    hooks = sub.add_parser("webhooks", help="webhook subscriptions and the outbox")
    hooksub = hooks.add_subparsers(dest="hook_command", required=True, metavar="COMMAND")
    subscribe = hooksub.add_parser("subscribe", help="send instance events to a URL, signed")
    subscribe.add_argument("url", help="http(s) endpoint")
    subscribe.add_argument(
        "--event",
        dest="events",
        action="append",
        choices=rules.WEBHOOK_EVENTS,
        help="repeatable; default both",
    )
    subscribe.add_argument("--secret", default=None, help="signing secret (default: generated)")
    common_flags(subscribe)
    subscribe.set_defaults(db_func=webhooks_subscribe)
    lst = hooksub.add_parser("list", help="the tenant's subscriptions")
    common_flags(lst)
    lst.set_defaults(db_func=webhooks_list)
    disable = hooksub.add_parser(
        "disable", help="no new events for a subscription; its queued deliveries wait"
    )
    disable.add_argument("id", help="the subscription id (see `orch8 webhooks list`)")
    common_flags(disable)
    disable.set_defaults(db_func=webhooks_disable)
    enable = hooksub.add_parser(
        "enable", help="events again for a subscription; its queued deliveries go out"
    )
    enable.add_argument("id", help="the subscription id (see `orch8 webhooks list`)")
    common_flags(enable)
    enable.set_defaults(db_func=webhooks_enable)
    outbox = hooksub.add_parser("outbox", help="deliveries, newest first")
    outbox.add_argument("--state", choices=rules.OUTBOX_STATES)
    outbox.add_argument("--limit", type=int, default=50)
    common_flags(outbox)
    outbox.set_defaults(db_func=webhooks_outbox)
