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
import hashlib
import re

from flask import g, request

from .db import pool
from .problems import Problem

TENANT_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
READ_METHODS = {"GET", "HEAD", "OPTIONS"}


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def presented_key() -> str | None:
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return request.headers.get("X-Api-Key") or None


def authenticate(secret: str) -> dict | None:
    with pool().connection() as conn:
        row = conn.execute(
            "SELECT tenant_id, key_id, role, name FROM orch8.authenticate_api_key(%s)",
            (key_hash(secret),),
        ).fetchone()
    if row is None:
        return None
    return {"tenant": row[0], "key_id": row[1], "role": row[2], "name": row[3]}


def establish(principal: dict) -> None:
    """Set g from an authenticated principal, honouring X-Tenant-Id for admins."""
    tenant = principal["tenant"]
    asked = request.headers.get("X-Tenant-Id")
    if asked and asked != tenant:
        if principal["role"] != "admin":
            # another tenant's resources are invisible, not forbidden
            raise Problem(404, "not found", "no such tenant for this key")
        if not TENANT_RE.match(asked):
            raise Problem(422, "invalid input", "X-Tenant-Id must be 1-100 of A-Z a-z 0-9 _ . -")
        tenant = asked
    g.tenant = tenant
    g.role = principal["role"]
    g.key_id = principal["key_id"]
    g.actor = f"key:{principal['name']}"


def require(*roles: str):
    """Allow the listed roles (admin always). Auditors may only read."""

    def decorate(view):
        @functools.wraps(view)
        def wrapped(*args, **kwargs):
            secret = presented_key()
            if not secret:
                raise Problem(401, "unauthorized", "send Authorization: Bearer <api key>")
            principal = authenticate(secret)
            if principal is None:
                raise Problem(401, "unauthorized", "unknown or revoked API key")
            establish(principal)
            role = principal["role"]
            allowed = role == "admin" or role in roles
            if role == "auditor" and request.method not in READ_METHODS:
                allowed = False
            if not allowed:
                raise Problem(403, "forbidden", f"a {role} key cannot do this")
            return view(*args, **kwargs)

        return wrapped

    return decorate


OPERATOR = ("operator", "auditor")  # auditors pass only for reads (checked above)
WORKER = ("worker", "operator")
