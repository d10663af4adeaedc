"""Effect pages: the unresolved queue, one receipt with its history, and resolving it."""

from __future__ import annotations

import json
import uuid

from flask import abort, flash, g, redirect, request, url_for
from psycopg.types.json import Jsonb

from orch8_py import errors
from orch8_py.states import EFFECT_KINDS, EFFECT_STATES

from ..db import tenant_tx
from .blueprint import bp, log
from .formatting import engine_message
from .pages import page, queue_depth
from .receipts import load_receipt, receipt_events
from .session import login_required, write_required

QUEUE_LIMIT = 200

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
