"""Logging in with an API key, logging out, and ``/`` leading to the console."""

from __future__ import annotations

import secrets

from flask import flash, redirect, render_template, request, session, url_for
from flask.blueprints import BlueprintSetupState
from flask.typing import ResponseReturnValue

from orch8_py import apikeys, sqlapi

from ..auth import authenticate
from ..db import connection
from .blueprint import bp, log
from .session import (
    CONSOLE_ROLES,
    SESSION_KEY,
    SESSION_MAX_AGE,
    TOKEN,
    csrf_token,
    current_user,
    safe_next,
)


def root() -> ResponseReturnValue:
    return redirect(url_for("console.dashboard"))


@bp.record_once
def _register_root(state: BlueprintSetupState) -> None:
    """``/`` leads people to the console (registered with the blueprint, once per app)."""
    state.app.add_url_rule("/", endpoint="console_root", view_func=root, methods=["GET"])


@bp.route("/login", methods=["GET", "POST"])
def login() -> ResponseReturnValue:
    next_url = safe_next(request.values.get("next"))
    if request.method == "GET":
        if current_user() is not None:
            return redirect(next_url or url_for("console.dashboard"))
        return render_template("console/login.html", user=None, next_url=next_url)
    secret = request.form.get("api_key", "").strip()
    principal = authenticate(secret) if secret else None
    if principal is None:
        flash("Unknown, revoked or expired API key.", "error")
        return render_template("console/login.html", user=None, next_url=next_url), 401
    if principal.role not in CONSOLE_ROLES:
        flash(f"A {principal.role} key cannot use the console.", "error")
        return render_template("console/login.html", user=None, next_url=next_url), 403
    # The cookie carries a random token; the server keeps its hash, so logging out (or
    # revoking the key) ends the session for every copy of the cookie.
    token = secrets.token_urlsafe(32)
    with connection() as conn:
        opened = sqlapi.keys.open_console_session(
            conn,
            key_hash=apikeys.key_hash(secret),
            token_hash=apikeys.key_hash(token),
            max_age_seconds=SESSION_MAX_AGE,
        )
    if opened is None:  # revoked between the two calls
        flash("Unknown, revoked or expired API key.", "error")
        return render_template("console/login.html", user=None, next_url=next_url), 401
    session.clear()  # a fresh session (and CSRF token) for the new identity
    session[SESSION_KEY] = {TOKEN: token}
    csrf_token()
    log.info(
        "event=console.login tenant=%s key_id=%s role=%s",
        principal.tenant_id,
        principal.key_id,
        principal.role,
    )
    return redirect(next_url or url_for("console.dashboard"))


@bp.post("/logout")
def logout() -> ResponseReturnValue:
    cookie = session.get(SESSION_KEY)
    if isinstance(cookie, dict) and isinstance(cookie.get(TOKEN), str):
        # ended in the database first: a copy of this cookie must not outlive the logout
        with connection() as conn:
            sqlapi.keys.end_console_session(conn, token_hash=apikeys.key_hash(cookie[TOKEN]))
    session.clear()
    flash("Logged out.", "ok")
    return redirect(url_for("console.login"))
