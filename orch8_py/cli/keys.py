"""`orch8 api-key create|list|revoke`: keys for the operator service. The secret is shown
once, when it is created; the database keeps only its SHA-256 and a short prefix."""

from __future__ import annotations

import argparse

from .. import apikeys, db, rules, sqlapi
from ..errors import NotFound
from .common import (
    EXIT_OK,
    Subparsers,
    command,
    common_flags,
    emit,
    parse_duration,
    parse_uuid,
    table,
    ts,
)

WARNING = (
    "this secret is shown once and is not stored (orch8 keeps only its SHA-256): "
    "copy it now; if it is lost, revoke the key and create another"
)


@command
def api_key_create(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        expires_in = parse_duration(args.expires_in, "--expires-in") if args.expires_in else None
        key_id, secret = apikeys.create(
            conn, args.tenant, args.role, args.name or "", expires_in=expires_in
        )
        found = sqlapi.keys.get_api_key(conn, tenant_id=args.tenant, key_id=key_id)
    assert found is not None  # created just now, in this connection
    row = {
        k: found[k]
        for k in ("id", "tenant_id", "name", "role", "key_prefix", "created_at", "expires_at")
    }
    if args.json:
        emit({**row, "secret": secret, "warning": WARNING}, True, "")
        return EXIT_OK
    print(
        "\n".join(
            [
                f"created API key {row['id']} ({row['key_prefix']}) for tenant "
                f"{row['tenant_id']!r}, role {row['role']}, name {row['name']!r}, "
                + (f"expires {ts(row['expires_at'])}" if row["expires_at"] else "no expiry"),
                "",
                f"    {secret}",
                "",
                f"WARNING: {WARNING}.",
                "Use it as `Authorization: Bearer <key>` on the operator service.",
            ]
        ),
        flush=True,
    )
    return EXIT_OK


@command
def api_key_list(args: argparse.Namespace, url: str) -> int:
    with db.connect(url, autocommit=True) as conn:
        rows = sqlapi.keys.list_api_keys(conn, tenant_id=args.tenant)
    if args.json:
        emit(rows, True, "")
        return EXIT_OK
    if not rows:
        print(f"no API keys in tenant {args.tenant!r}", flush=True)
        return EXIT_OK
    print(
        table(
            ["id", "prefix", "role", "name", "created", "last used", "expires", "revoked"],
            [
                (
                    r["id"],
                    r["key_prefix"],
                    r["role"],
                    r["name"],
                    r["created_at"],
                    r["last_used_at"] or "never",
                    (f"{ts(r['expires_at'])} (expired)" if r["expired"] else r["expires_at"])
                    or "never",
                    r["revoked_at"] or "no",
                )
                for r in rows
            ],
        ),
        flush=True,
    )
    return EXIT_OK


@command
def api_key_revoke(args: argparse.Namespace, url: str) -> int:
    key_id = parse_uuid(args.id, "an API key id")
    with db.connect(url, autocommit=True) as conn:
        revoked = sqlapi.keys.revoke_api_key(conn, tenant_id=args.tenant, key_id=key_id)
        row = sqlapi.keys.get_api_key(conn, tenant_id=args.tenant, key_id=key_id)
    if row is None:
        raise NotFound(
            f"API key {key_id} not found in tenant {args.tenant!r}; "
            "see `orch8 api-key list` (and --tenant)"
        )
    prefix, revoked_at = row["key_prefix"], row["revoked_at"]
    result = {
        "id": key_id,
        "key_prefix": prefix,
        "revoked": revoked,
        "already_revoked": not revoked,
        "revoked_at": revoked_at,
    }
    if revoked:
        text = f"revoked API key {key_id} ({prefix}): it no longer authenticates"
    else:
        text = f"API key {key_id} ({prefix}) was already revoked at {ts(revoked_at)}"
    emit(result, args.json, text)
    return EXIT_OK


def add_parsers(sub: Subparsers) -> None:
    keys = sub.add_parser("api-key", help="API keys for the operator service")
    keysub = keys.add_subparsers(dest="key_command", required=True, metavar="COMMAND")
    create = keysub.add_parser("create", help="create a key; its secret is printed once")
    create.add_argument("--role", required=True, choices=rules.API_KEY_ROLES)
    create.add_argument("--name", default=None, help="a label (default: the role)")
    create.add_argument(
        "--expires-in",
        default=None,
        metavar="DURATION",
        help="the key stops working after this long (90d, 12h, 30m; default: never)",
    )
    common_flags(create)
    create.set_defaults(db_func=api_key_create)
    lst = keysub.add_parser("list", help="the tenant's keys (never their secrets)")
    common_flags(lst)
    lst.set_defaults(db_func=api_key_list)
    revoke = keysub.add_parser("revoke", help="revoke a key at once")
    revoke.add_argument("id", help="key id (from `orch8 api-key list`)")
    common_flags(revoke)
    revoke.set_defaults(db_func=api_key_revoke)
