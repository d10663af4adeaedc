"""The operator console: server-rendered pages (Jinja, no build step) for people.

Log in with an API key; the session keeps who you are (tenant, role, key id, name), never
the secret. Every read and write runs in ``tenant_tx(<session tenant>)``, so row-level
security confines it to that tenant, and every query also names the tenant (the view
``orch8.unresolved_effects`` runs as its owner, so RLS alone would not filter it).

Auditors read; operators and admins may also resolve receipts, retry and cancel. Every
POST carries the session's CSRF token. Engine refusals are shown as a message on the page.
"""

from __future__ import annotations

import datetime as dt
import functools
import hmac
import json
import logging
import secrets
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import psycopg
from flask import (
    Blueprint,
    abort,
    flash,
    g,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from psycopg.types.json import Jsonb
from psycopg_pool import PoolTimeout
from werkzeug.exceptions import HTTPException

from orch8_py import errors
from orch8_py.states import EFFECT_KINDS, EFFECT_STATES, INSTANCE_STATES

from .auth import authenticate
from .db import pool, tenant_tx

log = logging.getLogger("orch8.web.console")

bp = Blueprint(
    "console",
    __name__,
    url_prefix="/console",
    static_folder="static",
    static_url_path="/static",
)

SESSION_KEY = "console"
CSRF_KEY = "console_csrf"
SESSION_MAX_AGE = 12 * 3600  # seconds after login before the console asks for the key again
PAGE_SIZE = 25
QUEUE_LIMIT = 200
LIST_LIMIT = 500
MAX_PRETTY_CHARS = 100_000

CONSOLE_ROLES = ("operator", "auditor", "admin")
WRITE_ROLES = ("operator", "admin")

CANCELLABLE = ("scheduled", "running", "waiting", "paused")


# What an operator may resolve a receipt to (orch8.resolve_effect), by its current state.
RESOLVE_TARGETS = {
    "unknown": ("committed", "verified", "abandoned", "compensated"),
    "committed": ("compensated",),
    "verified": ("compensated",),
}
RESOLVE_HELP = {
    "committed": "the provider confirms it happened",
    "verified": "reconciled against the provider's records",
    "abandoned": "it did not happen, or is written off (evidence required)",
    "compensated": "it was undone: a refund, a retraction (evidence required)",
}
SETTLED = ("committed", "verified", "abandoned", "compensated")


# --- identity, CSRF, guards -----------------------------------------------------------


def csrf_token() -> str:
    token = session.get(CSRF_KEY)
    if not token:
        token = session[CSRF_KEY] = secrets.token_urlsafe(32)
    return token


def current_user() -> dict | None:
    user = session.get(SESSION_KEY)
    if not isinstance(user, dict):
        return None
    if time.time() - float(user.get("at", 0)) > SESSION_MAX_AGE:
        session.pop(SESSION_KEY, None)
        return None
    # a revoked key ends its sessions at once
    try:
        with pool().connection() as conn:
            active = conn.execute(
                "SELECT orch8.api_key_active(%s)", (uuid.UUID(str(user["key_id"])),)
            ).fetchone()[0]
    except (PoolTimeout, psycopg.OperationalError):
        return user  # cannot check now; the page itself will report the outage
    if not active:
        session.pop(SESSION_KEY, None)
        return None
    return user


def can_write() -> bool:
    return g.get("role") in WRITE_ROLES


def _safe_next(target: str | None) -> str | None:
    """Only a path inside the console: never another host (no open redirect)."""
    if not target:
        return None
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/console/"):
        return None
    if "\\" in target or target.startswith("//"):
        return None
    return target


def login_required(view):
    @functools.wraps(view)
    def wrapped(*args, **kwargs):
        user = current_user()
        if user is None:
            if request.method == "GET":
                return redirect(url_for("console.login", next=request.full_path.rstrip("?")))
            abort(401, "log in first")
        g.tenant = user["tenant"]
        g.role = user["role"]
        g.key_id = user["key_id"]
        g.user_name = user["name"]
        g.actor = f"key:{user['name']}"
        return view(*args, **kwargs)

    return wrapped


def write_required(view):
    """For POST actions: operators and admins only (checked after login_required)."""

    @functools.wraps(view)
    def wrapped(*args, **kwargs):
        if not can_write():
            abort(403, f"a {g.role} key can only read: this action needs an operator key")
        return view(*args, **kwargs)

    return wrapped


@bp.before_request
def _check_csrf():
    if request.method not in ("POST", "PUT", "PATCH", "DELETE"):
        return None
    expected = session.get(CSRF_KEY)
    sent = request.form.get("csrf_token", "")
    if not expected or not sent or not hmac.compare_digest(str(expected), str(sent)):
        abort(403, "the form's security token is missing or expired: reload the page and retry")
    return None


@bp.after_request
def _headers(resp):
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


# --- formatting -----------------------------------------------------------------------


@bp.app_template_filter("o8_ts")
def format_ts(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC)
        return value.strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)


@bp.app_template_filter("o8_age")
def format_age(value: Any) -> str:
    if value is None:
        return "-"
    seconds = int(value.total_seconds()) if isinstance(value, dt.timedelta) else int(value)
    seconds = max(seconds, 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


@bp.app_template_filter("o8_json")
def format_json(value: Any) -> str:
    if value is None:
        return "-"
    text = json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)
    if len(text) > MAX_PRETTY_CHARS:
        text = text[:MAX_PRETTY_CHARS] + f"\n… ({len(text) - MAX_PRETTY_CHARS} more characters)"
    return text


# --- error pages ----------------------------------------------------------------------


def _error_page(status: int, title: str, message: str):
    user = current_user()
    if user is not None:
        g.role = user["role"]
    return render_template(
        "console/error.html", status=status, title=title, message=message, user=user
    ), status


@bp.errorhandler(HTTPException)
def _http_error(exc: HTTPException):
    status = exc.code or 500
    messages = {404: "There is no such page, or nothing with that id in your tenant."}
    message = messages.get(status) or exc.description or "error"
    return _error_page(status, f"{status} {exc.name}", message)


@bp.errorhandler(errors.NotFound)
def _engine_not_found(exc):
    return _error_page(404, "404 Not Found", "Nothing with that id in your tenant.")


@bp.errorhandler(PoolTimeout)
@bp.errorhandler(psycopg.OperationalError)
def _unavailable(exc):
    log.warning("event=console.db_unavailable error=%r", str(exc)[:200])
    return _error_page(503, "Database unavailable", "The database cannot be reached. Try again.")


@bp.errorhandler(Exception)
def _internal(exc):
    log.exception("event=console.internal_error")
    return _error_page(500, "Something went wrong", "The error was logged. Try again.")


def engine_message(exc: errors.Orch8Error) -> str:
    """What a person reads for an engine refusal (the message, plus its DETAIL if any)."""
    message = str(exc)
    if isinstance(exc, errors.StaleEffect) and "reload" not in message:
        message = f"reload before resolving: {message}"
    detail = getattr(exc, "detail", None)
    if detail and detail not in message:
        message = f"{message} ({detail})"
    return message


# --- small query helpers --------------------------------------------------------------


def queue_depth(conn) -> int:
    return conn.execute(
        "SELECT count(*) AS n FROM orch8.unresolved_effects WHERE tenant_id = %s", (g.tenant,)
    ).fetchone()["n"]


def page(template: str, conn, status: int = 200, **ctx):
    ctx.setdefault("nav_queue", queue_depth(conn))
    return render_template(
        f"console/{template}",
        user=current_user(),
        can_write=can_write(),
        **ctx,
    ), status


def load_receipt(conn, effect_id: uuid.UUID) -> dict | None:
    return conn.execute(
        "SELECT r.*, r.state::text AS state, orch8.now() - r.created_at AS age,"
        " t.state::text AS instance_state"
        " FROM orch8.effect_receipts AS r"
        " LEFT JOIN orch8.task_instances AS t"
        "   ON t.tenant_id = r.tenant_id AND t.id = r.instance_id"
        " WHERE r.tenant_id = %s AND r.id = %s",
        (g.tenant, effect_id),
    ).fetchone()


def receipt_events(conn, receipt_ids: list) -> dict:
    events: dict = {rid: [] for rid in receipt_ids}
    if not receipt_ids:
        return events
    rows = conn.execute(
        "SELECT receipt_id, event_id, from_state::text AS from_state,"
        " to_state::text AS to_state, actor, note, evidence, at"
        " FROM orch8.effect_receipt_events"
        " WHERE tenant_id = %s AND receipt_id = ANY(%s) ORDER BY at, event_id",
        (g.tenant, receipt_ids),
    ).fetchall()
    for row in rows:
        events.setdefault(row["receipt_id"], []).append(row)
    return events


# --- login ----------------------------------------------------------------------------


def root():
    return redirect(url_for("console.dashboard"))


@bp.record_once
def _register_root(state) -> None:
    """``/`` leads people to the console (registered with the blueprint, once per app)."""
    state.app.add_url_rule("/", endpoint="console_root", view_func=root, methods=["GET"])


@bp.route("/login", methods=["GET", "POST"])
def login():
    next_url = _safe_next(request.values.get("next"))
    if request.method == "GET":
        if current_user() is not None:
            return redirect(next_url or url_for("console.dashboard"))
        return render_template("console/login.html", user=None, next_url=next_url)
    secret = request.form.get("api_key", "").strip()
    principal = authenticate(secret) if secret else None
    if principal is None:
        flash("Unknown or revoked API key.", "error")
        return render_template("console/login.html", user=None, next_url=next_url), 401
    if principal["role"] not in CONSOLE_ROLES:
        flash(f"A {principal['role']} key cannot use the console.", "error")
        return render_template("console/login.html", user=None, next_url=next_url), 403
    session.clear()  # a fresh session (and CSRF token) for the new identity
    session[SESSION_KEY] = {
        "tenant": principal["tenant"],
        "role": principal["role"],
        "key_id": str(principal["key_id"]),
        "name": principal["name"],
        "at": time.time(),
    }
    csrf_token()
    log.info(
        "event=console.login tenant=%s key_id=%s role=%s",
        principal["tenant"],
        principal["key_id"],
        principal["role"],
    )
    return redirect(next_url or url_for("console.dashboard"))


@bp.post("/logout")
def logout():
    session.clear()
    flash("Logged out.", "ok")
    return redirect(url_for("console.login"))


# --- dashboard ------------------------------------------------------------------------


@bp.get("/")
@login_required
def dashboard():
    with tenant_tx(g.tenant) as conn:
        states = conn.execute(
            "SELECT s.state::text AS state, count(t.id) AS n"
            " FROM unnest(enum_range(NULL::orch8.instance_state)) AS s(state)"
            " LEFT JOIN orch8.task_instances AS t ON t.tenant_id = %s AND t.state = s.state"
            " GROUP BY s.state ORDER BY s.state",
            (g.tenant,),
        ).fetchall()
        queue = conn.execute(
            "SELECT count(*) AS depth, max(age) AS oldest,"
            " count(*) FILTER (WHERE state = 'unknown') AS unknown,"
            " count(*) FILTER (WHERE state = 'dispatched') AS dispatched"
            " FROM orch8.unresolved_effects WHERE tenant_id = %s",
            (g.tenant,),
        ).fetchone()
        failed = conn.execute(
            "SELECT id, error, updated_at FROM orch8.task_instances"
            " WHERE tenant_id = %s AND state = 'failed'"
            " ORDER BY updated_at DESC, id DESC LIMIT 10",
            (g.tenant,),
        ).fetchall()
        return page(
            "dashboard.html",
            conn,
            nav_queue=queue["depth"],
            states=states,
            total=sum(r["n"] for r in states),
            queue=queue,
            failed=failed,
        )


# --- instances ------------------------------------------------------------------------


@bp.get("/instances")
@login_required
def instances():
    state = request.args.get("state") or None
    if state is not None and state not in INSTANCE_STATES:
        abort(400, f"unknown instance state {state!r}")
    page_no = request.args.get("page", "1")
    if not page_no.isdigit() or not 1 <= int(page_no) <= 100_000:
        abort(400, "page must be a number from 1")
    page_no = int(page_no)
    with tenant_tx(g.tenant) as conn:
        rows = conn.execute(
            "SELECT t.id, t.state::text AS state, t.current_block, t.error, t.created_at,"
            " t.updated_at, t.sequence_version, s.namespace, s.name"
            " FROM orch8.task_instances AS t"
            " LEFT JOIN orch8.sequences AS s ON s.tenant_id = t.tenant_id AND s.id = t.sequence_id"
            " WHERE t.tenant_id = %s AND (%s::text IS NULL OR t.state = %s::orch8.instance_state)"
            " ORDER BY t.created_at DESC, t.id DESC LIMIT %s OFFSET %s",
            (g.tenant, state, state, PAGE_SIZE + 1, (page_no - 1) * PAGE_SIZE),
        ).fetchall()
        return page(
            "instances.html",
            conn,
            rows=rows[:PAGE_SIZE],
            has_next=len(rows) > PAGE_SIZE,
            page_no=page_no,
            state=state,
            states=INSTANCE_STATES,
        )


@bp.get("/instances/<uuid:instance_id>")
@login_required
def instance(instance_id: uuid.UUID):
    with tenant_tx(g.tenant) as conn:
        inst = conn.execute(
            "SELECT t.*, t.state::text AS state, t.requested_state::text AS requested_state,"
            " s.namespace, s.name"
            " FROM orch8.task_instances AS t"
            " LEFT JOIN orch8.sequences AS s ON s.tenant_id = t.tenant_id AND s.id = t.sequence_id"
            " WHERE t.tenant_id = %s AND t.id = %s",
            (g.tenant, instance_id),
        ).fetchone()
        if inst is None:
            abort(404)
        outputs = conn.execute(
            "SELECT block_id, seq, attempt, sentinel, output, retryable, effect_id, created_at"
            " FROM orch8.block_outputs WHERE tenant_id = %s AND instance_id = %s ORDER BY seq",
            (g.tenant, instance_id),
        ).fetchall()
        receipts = conn.execute(
            "SELECT *, state::text AS state FROM orch8.effect_receipts"
            " WHERE tenant_id = %s AND instance_id = %s ORDER BY created_at, id",
            (g.tenant, instance_id),
        ).fetchall()
        events = receipt_events(conn, [r["id"] for r in receipts])
        transitions = conn.execute(
            "SELECT seq, from_state::text AS from_state, to_state::text AS to_state, actor,"
            " reason, at FROM orch8.instance_transitions"
            " WHERE tenant_id = %s AND instance_id = %s ORDER BY seq",
            (g.tenant, instance_id),
        ).fetchall()
        blocking = [r for r in receipts if r["state"] in ("unknown", "dispatched")]
        return page(
            "instance.html",
            conn,
            inst=inst,
            outputs=outputs,
            receipts=receipts,
            events=events,
            transitions=transitions,
            blocking=blocking,
            can_retry=inst["state"] == "failed",
            can_cancel=inst["state"] in CANCELLABLE and inst["requested_state"] != "cancelled",
        )


@bp.post("/instances/<uuid:instance_id>/retry")
@login_required
@write_required
def retry(instance_id: uuid.UUID):
    try:
        with tenant_tx(g.tenant) as conn:
            row = conn.execute(
                "SELECT * FROM orch8.retry_instance(%s, %s, %s)", (g.tenant, instance_id, g.actor)
            ).fetchone()
    except errors.NotFound:
        abort(404)
    except errors.Orch8Error as exc:
        flash(f"Retry refused: {engine_message(exc)}", "error")
    else:
        outcome = row["outcome"] if row else "done"
        detail = f": {row['detail']}" if row and row.get("detail") else ""
        flash(f"Retried ({outcome}){detail}.", "ok")
        log.info(
            "event=console.retry tenant=%s instance=%s actor=%s", g.tenant, instance_id, g.actor
        )
    return redirect(url_for("console.instance", instance_id=instance_id))


@bp.post("/instances/<uuid:instance_id>/cancel")
@login_required
@write_required
def cancel(instance_id: uuid.UUID):
    try:
        with tenant_tx(g.tenant) as conn:
            outcome = conn.execute(
                "SELECT orch8.cancel_instance(%s, %s, %s, 'cancelled from the console') AS o",
                (g.tenant, instance_id, g.actor),
            ).fetchone()["o"]
    except errors.NotFound:
        abort(404)
    except errors.Orch8Error as exc:
        flash(f"Cancel refused: {engine_message(exc)}", "error")
    else:
        messages = {
            "cancelled": "Cancelled.",
            "requested": "Cancel requested: it applies when the running step finishes.",
            "unchanged": "It was already cancelled.",
        }
        flash(messages.get(outcome, f"Cancel: {outcome}."), "ok")
    return redirect(url_for("console.instance", instance_id=instance_id))


# --- effects --------------------------------------------------------------------------


@bp.get("/effects/unresolved")
@login_required
def unresolved():
    kind = request.args.get("kind") or None
    if kind is not None and kind not in EFFECT_KINDS:
        abort(400, f"unknown effect kind {kind!r}")
    with tenant_tx(g.tenant) as conn:
        total = queue_depth(conn)
        rows = conn.execute(
            "SELECT *, state::text AS state FROM orch8.unresolved_effects"
            " WHERE tenant_id = %s AND (%s::text IS NULL OR kind = %s)"
            " ORDER BY created_at, effect_id LIMIT %s",
            (g.tenant, kind, kind, QUEUE_LIMIT + 1),
        ).fetchall()
        return page(
            "unresolved.html",
            conn,
            nav_queue=total,
            rows=rows[:QUEUE_LIMIT],
            more=len(rows) > QUEUE_LIMIT,
            kind=kind,
            kinds=EFFECT_KINDS,
            total=total,
        )


def parse_evidence(text: str) -> dict:
    """A JSON object as it is; anything else that is not JSON as {"note": text}."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise errors.InvalidInput(
                f"evidence starts with {{ but is not valid JSON ({exc.msg}, line {exc.lineno}"
                f" column {exc.colno}): fix it, or write plain text"
            ) from None
        if isinstance(value, dict):
            return value
    return {"note": text}


def effect_page(conn, effect_id: uuid.UUID, status: int = 200, form: dict | None = None):
    receipt = load_receipt(conn, effect_id)
    if receipt is None:
        abort(404)
    events = receipt_events(conn, [receipt["id"]])[receipt["id"]]
    return page(
        "effect.html",
        conn,
        status=status,
        r=receipt,
        events=events,
        targets=RESOLVE_TARGETS.get(receipt["state"], ()),
        target_help=RESOLVE_HELP,
        form=form or {},
        settled=receipt["state"] in SETTLED,
    )


@bp.get("/effects/<uuid:effect_id>")
@login_required
def effect(effect_id: uuid.UUID):
    with tenant_tx(g.tenant) as conn:
        return effect_page(conn, effect_id)


@bp.post("/effects/<uuid:effect_id>/resolve")
@login_required
@write_required
def resolve(effect_id: uuid.UUID):
    form = {
        "state": request.form.get("state", ""),
        "provider_receipt_id": request.form.get("provider_receipt_id", "").strip(),
        "evidence": request.form.get("evidence", ""),
        "note": request.form.get("note", "").strip(),
    }
    expected = request.form.get("expected_state", "")
    if form["state"] not in EFFECT_STATES or expected not in EFFECT_STATES:
        abort(400, "choose a state to resolve to (the form names the legal ones)")
    status, message = 200, None
    try:
        evidence = parse_evidence(form["evidence"])
        with tenant_tx(g.tenant) as conn:
            row = conn.execute(
                "SELECT state::text AS state, provider_receipt_id"
                " FROM orch8.resolve_effect(%s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    g.tenant,
                    effect_id,
                    form["state"],
                    form["provider_receipt_id"] or None,
                    Jsonb(evidence),
                    g.actor,
                    form["note"] or None,
                    expected,
                ),
            ).fetchone()
    except errors.NotFound:
        abort(404)
    except errors.Orch8Error as exc:
        status = 409 if isinstance(exc, errors.StaleEffect | errors.InvalidTransition) else 422
        message = engine_message(exc)
    if message is not None:
        flash(f"Not resolved: {message}", "error")
        with tenant_tx(g.tenant) as conn:
            return effect_page(conn, effect_id, status=status, form=form)
    log.info(
        "event=console.resolve tenant=%s effect=%s state=%s actor=%s",
        g.tenant,
        effect_id,
        row["state"],
        g.actor,
    )
    flash(f"Receipt {effect_id} is now {row['state']}.", "ok")
    return redirect(url_for("console.effect", effect_id=effect_id))


# --- sequences ------------------------------------------------------------------------


@bp.get("/sequences")
@login_required
def sequences():
    with tenant_tx(g.tenant) as conn:
        rows = conn.execute(
            "SELECT namespace, name, max(version) AS latest, count(*) AS versions,"
            " max(created_at) AS updated_at FROM orch8.sequences WHERE tenant_id = %s"
            " GROUP BY namespace, name ORDER BY namespace, name LIMIT %s",
            (g.tenant, LIST_LIMIT + 1),
        ).fetchall()
        return page("sequences.html", conn, rows=rows[:LIST_LIMIT], more=len(rows) > LIST_LIMIT)


@bp.get("/sequences/<namespace>/<name>")
@login_required
def sequence(namespace: str, name: str):
    with tenant_tx(g.tenant) as conn:
        versions = conn.execute(
            "SELECT s.id, s.version, s.created_at,"
            " jsonb_array_length(coalesce(s.definition -> 'blocks', '[]')) AS blocks,"
            " (SELECT count(*) FROM orch8.task_instances AS t"
            "   WHERE t.tenant_id = s.tenant_id AND t.sequence_id = s.id) AS instances"
            " FROM orch8.sequences AS s"
            " WHERE s.tenant_id = %s AND s.namespace = %s AND s.name = %s"
            " ORDER BY s.version DESC",
            (g.tenant, namespace, name),
        ).fetchall()
        if not versions:
            abort(404)
        return page("sequence.html", conn, namespace=namespace, name=name, versions=versions)


@bp.get("/sequences/<namespace>/<name>/<int:version>")
@login_required
def sequence_version(namespace: str, name: str, version: int):
    with tenant_tx(g.tenant) as conn:
        row = conn.execute(
            "SELECT id, version, created_at, definition FROM orch8.sequences"
            " WHERE tenant_id = %s AND namespace = %s AND name = %s AND version = %s",
            (g.tenant, namespace, name, version),
        ).fetchone()
        if row is None:
            abort(404)
        return page("sequence_version.html", conn, namespace=namespace, name=name, s=row)


@bp.route("/<path:rest>", methods=["GET", "POST"])
def not_found(rest: str):
    abort(404)
