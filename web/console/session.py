"""Who is logged in, what they may do, and the guards every console request passes:
the login session, CSRF, the role checks, safe redirects and the security headers."""

from __future__ import annotations

import functools
import hmac
import secrets
from collections.abc import Callable
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

from flask import Response, abort, g, redirect, request, session, url_for
from flask.typing import ResponseReturnValue

from orch8_py import apikeys, sqlapi

from ..db import connection
from .blueprint import bp

SESSION_KEY = "console"
CSRF_KEY = "console_csrf"
SESSION_MAX_AGE = 12 * 3600  # seconds after login before the console asks for the key again
# In the cookie's SESSION_KEY: the session token, whose SHA-256 names the server-side
# session (orch8.console_sessions), and an admin's chosen tenant (ACTING).
TOKEN = "token"

CONSOLE_ROLES = ("operator", "auditor", "admin")
WRITE_ROLES = ("operator", "admin")
# In the session's user: the tenant an admin switched to (absent: the key's own tenant).
ACTING = "acting"


# who is logged in, from the server-side session: tenant, role, key_id, name, token_hash
# (, acting: from the cookie)
User = dict[str, Any]
F = TypeVar("F", bound=Callable[..., ResponseReturnValue])


def csrf_token() -> str:
    token = session.get(CSRF_KEY)
    if not token:
        token = session[CSRF_KEY] = secrets.token_urlsafe(32)
    return str(token)


def current_user() -> User | None:
    """Who the cookie's session belongs to, read from the database on every request: a
    logout, the session's expiry, or its key's revocation or expiry end it at once, for
    every copy of the cookie. Read once per request (kept in ``g``). A database outage
    raises (the page reports it)."""
    if "console_user" in g:
        return cast(User | None, g.console_user)
    g.console_user = _read_user()
    return cast(User | None, g.console_user)


def _read_user() -> User | None:
    cookie = session.get(SESSION_KEY)
    if not isinstance(cookie, dict) or not isinstance(cookie.get(TOKEN), str):
        return None
    token_hash = apikeys.key_hash(cookie[TOKEN])
    with connection() as conn:
        found = sqlapi.keys.console_session(conn, token_hash=token_hash)
    if found is None:
        session.pop(SESSION_KEY, None)
        return None
    user: User = {
        "tenant": found.tenant_id,
        "role": found.role,
        "key_id": str(found.key_id),
        "name": found.name,
        "token_hash": token_hash,
    }
    if cookie.get(ACTING):
        user[ACTING] = cookie[ACTING]
    return user


def acting_tenant(user: User) -> str:
    """The tenant the session reads and writes in: an admin's chosen one, else the key's."""
    if user.get("role") == "admin" and user.get(ACTING):
        return str(user[ACTING])
    return str(user["tenant"])


def can_write() -> bool:
    return g.get("role") in WRITE_ROLES


def safe_next(target: str | None) -> str | None:
    """Only a path inside the console: never another host (no open redirect)."""
    if not target:
        return None
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/console/"):
        return None
    if "\\" in target or target.startswith("//"):
        return None
    return target


def login_required(view: F) -> F:
    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> ResponseReturnValue:
        user = current_user()
        if user is None:
            if request.method == "GET":
                return redirect(url_for("console.login", next=request.full_path.rstrip("?")))
            abort(401, "log in first")
        g.tenant = acting_tenant(user)
        g.home_tenant = user["tenant"]
        g.role = user["role"]
        g.key_id = user["key_id"]
        g.user_name = user["name"]
        g.actor = f"key:{user['name']}"
        g.credential = ("console_session", user["token_hash"])
        return view(*args, **kwargs)

    return cast(F, wrapped)


def write_required(view: F) -> F:
    """For POST actions: operators and admins only (checked after login_required)."""

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> ResponseReturnValue:
        if not can_write():
            abort(403, f"a {g.role} key can only read: this action needs an operator key")
        return view(*args, **kwargs)

    return cast(F, wrapped)


@bp.before_request
def _check_csrf() -> None:
    if request.method not in ("POST", "PUT", "PATCH", "DELETE"):
        return None
    expected = session.get(CSRF_KEY)
    sent = request.form.get("csrf_token", "")
    if not expected or not sent or not hmac.compare_digest(str(expected), str(sent)):
        abort(403, "the form's security token is missing or expired: reload the page and retry")
    return None


@bp.after_request
def _headers(resp: Response) -> Response:
    resp.headers.setdefault(
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'",
    )
    resp.headers.setdefault("X-Frame-Options", "DENY")
    resp.headers.setdefault("X-Content-Type-Options", "nosniff")
    resp.headers.setdefault("Referrer-Policy", "same-origin")
    if request.endpoint != "console.static":
        resp.headers.setdefault("Cache-Control", "no-store")
    return resp


@bp.app_template_global("console_csrf_token")
def _csrf_token_global() -> str:
    return csrf_token()


@bp.app_template_global("console_acting_tenant")
def _acting_tenant_global(user: User) -> str:
    return acting_tenant(user)
