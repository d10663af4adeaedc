"""Effect pages: the unresolved queue, one receipt with its history, and resolving it."""

from __future__ import annotations

import json
import uuid
from typing import Any

from flask import abort, flash, g, redirect, request, url_for
from flask.typing import ResponseReturnValue

from orch8_py import errors, rules, sqlapi
from orch8_py.sqlapi import Conn

from .. import problems
from ..db import tenant_tx
from .blueprint import bp, log
from .formatting import engine_message
from .pages import page, queue_depth
from .receipts import load_receipt, receipt_events
from .session import login_required, write_required

QUEUE_LIMIT = 200

# What each resolution means to a person; which ones need evidence is the engine's rule.
RESOLVE_HELP = {
    "committed": "the provider confirms it happened",
    "verified": "reconciled against the provider's records",
    "abandoned": "it did not happen, or is written off",
    "compensated": "it was undone: a refund, a retraction",
}
# states nobody moves on their own any more (the targets of a resolution)
SETTLED = tuple(sorted({s for targets in rules.RESOLUTIONS.values() for s in targets}))


@bp.get("/effects/unresolved")
@login_required
def unresolved() -> ResponseReturnValue:
    kind = request.args.get("kind") or None
    if kind is not None and kind not in rules.EFFECT_KINDS:
        abort(400, f"unknown effect kind {kind!r}")
    with tenant_tx(g.tenant) as conn:
        total = queue_depth(conn)
        rows = sqlapi.effects.unresolved_effects(
            conn, tenant_id=g.tenant, kind=kind, limit=QUEUE_LIMIT + 1
        )
        return page(
            "unresolved.html",
            conn,
            nav_queue=total,
            rows=rows[:QUEUE_LIMIT],
            more=len(rows) > QUEUE_LIMIT,
            kind=kind,
            kinds=rules.EFFECT_KINDS,
            total=total,
        )


def parse_evidence(text: str) -> dict[str, Any]:
    """A JSON object as it is; anything else that is not JSON as {"note": text}."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise errors.InvalidInput(
                f"evidence starts with {{ but is not valid JSON ({exc.msg}, line {exc.lineno}"
                f" column {exc.colno}): fix it, or write plain text"
            ) from None
        if isinstance(value, dict):
            return {str(k): v for k, v in value.items()}
    return {"note": text}


def effect_page(
    conn: Conn, effect_id: uuid.UUID, status: int = 200, form: dict[str, str] | None = None
) -> ResponseReturnValue:
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
        targets=rules.RESOLUTIONS.get(receipt["state"], ()),
        target_help=RESOLVE_HELP,
        needs_evidence=rules.RESOLUTIONS_NEEDING_EVIDENCE,
        form=form or {},
        settled=receipt["state"] in SETTLED,
    )


@bp.get("/effects/<uuid:effect_id>")
@login_required
def effect(effect_id: uuid.UUID) -> ResponseReturnValue:
    with tenant_tx(g.tenant) as conn:
        return effect_page(conn, effect_id)


@bp.post("/effects/<uuid:effect_id>/resolve")
@login_required
@write_required
def resolve(effect_id: uuid.UUID) -> ResponseReturnValue:
    form = {
        "state": request.form.get("state", ""),
        "provider_receipt_id": request.form.get("provider_receipt_id", "").strip(),
        "evidence": request.form.get("evidence", ""),
        "note": request.form.get("note", "").strip(),
    }
    expected = request.form.get("expected_state", "")
    if form["state"] not in rules.EFFECT_STATES or expected not in rules.EFFECT_STATES:
        abort(400, "choose a state to resolve to (the form names the legal ones)")
    status, message = 200, None
    try:
        evidence = parse_evidence(form["evidence"])
        with tenant_tx(g.tenant) as conn:
            row = sqlapi.effects.resolve_effect(
                conn,
                tenant_id=g.tenant,
                effect_id=effect_id,
                state=form["state"],
                actor=g.actor,
                evidence=evidence,
                provider_receipt_id=form["provider_receipt_id"] or None,
                note=form["note"] or None,
                expected_state=expected,
            )
    except errors.NotFound:
        abort(404)
    except errors.Orch8Error as exc:
        status = problems.for_engine_error(exc).status
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
