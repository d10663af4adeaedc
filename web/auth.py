"""API keys: ``Authorization: Bearer <key>`` (or ``X-Api-Key``). A key belongs to a tenant
and has a role:

- operator: everything in its tenant;
- worker: the worker endpoints only;
- auditor: read-only (GET) in its tenant;
- admin: everything, in any tenant named by ``X-Tenant-Id`` (its own by default).

``g.tenant``, ``g.role``, ``g.key_id`` and ``g.actor`` are set for the route.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar, cast

from flask import g, request

from orch8_py import apikeys, rules, sqlapi

from .db import connection
from .problems import Problem

# tenant ids are orch8.identifier values (matched in full: a trailing newline cannot pass)
TENANT_RE = re.compile(rules.PATTERNS["identifier"]["pattern"])
TENANT_RULE = rules.PATTERNS["identifier"]["rule"]
READ_METHODS = {"GET", "HEAD", "OPTIONS"}
F = TypeVar("F", bound=Callable[..., Any])


def presented_key() -> str | None:
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return request.headers.get("X-Api-Key") or None


def authenticate(secret: str) -> sqlapi.keys.Principal | None:
    with connection() as conn:
        return sqlapi.keys.authenticate_api_key(conn, key_hash=apikeys.key_hash(secret))


def establish(principal: sqlapi.keys.Principal, secret: str) -> None:
    """Set g from an authenticated principal, honouring X-Tenant-Id for admins."""
    tenant = principal.tenant_id
    asked = request.headers.get("X-Tenant-Id")
    if asked and asked != tenant:
        if principal.role != "admin":
            # another tenant's resources are invisible, not forbidden
            raise Problem(404, "not found", "no such tenant for this key")
        if not TENANT_RE.fullmatch(asked):
            raise Problem(422, "invalid input", f"X-Tenant-Id must be {TENANT_RULE}")
        tenant = asked
    g.tenant = tenant
    g.role = principal.role
    g.key_id = principal.key_id
    g.actor = f"key:{principal.name}"
    g.credential = ("api_key", apikeys.key_hash(secret))


def require(*roles: str) -> Callable[[F], F]:
    """Allow the listed roles (admin always). Auditors may only read."""

    def decorate(view: F) -> F:
        @functools.wraps(view)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            secret = presented_key()
            if not secret:
                raise Problem(401, "unauthorized", "send Authorization: Bearer <api key>")
            principal = authenticate(secret)
            if principal is None:
                raise Problem(401, "unauthorized", "unknown or revoked API key")
            establish(principal, secret)
            role = principal.role
            allowed = role == "admin" or role in roles
            if role == "auditor" and request.method not in READ_METHODS:
                allowed = False
            if not allowed:
                raise Problem(403, "forbidden", f"a {role} key cannot do this")
            return view(*args, **kwargs)

        return cast(F, wrapped)

    return decorate


OPERATOR = ("operator", "auditor")  # auditors pass only for reads (checked above)
WORKER = ("worker", "operator")
