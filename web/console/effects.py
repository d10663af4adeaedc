"""Effect pages: the unresolved queue, one receipt with its history, resolving it, and
asking verifiers to settle receipts (one escalated receipt again, or every superseded one)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from flask import abort, flash, g, redirect, request, url_for
from flask.typing import ResponseReturnValue

from orch8_py import errors, rules, settlement, sqlapi
from orch8_py.sqlapi import Conn
from orch8_py.sqlapi.base import NO_OUTPUT

from .. import problems
from ..db import tenant_tx
from .blueprint import bp, log
from .formatting import engine_message
from .pages import page
from .receipts import load_receipt, receipt_events
from .session import login_required, write_required

QUEUE_LIMIT = 200

# What each resolution means to a person; which ones need evidence is the engine's rule.
# What each outcome of a verification request means, for people.
VERIFY_OUTCOMES = {
    "scheduled": "its verifier will try to settle it",
    "rescheduled": "its verification starts over, with its tries reset",
    "already_scheduled": "its verifier is already on it",
    "no_verifier": "its step declares no verifier: resolve it yourself",
    "not_unknown": "it is not unknown any more",
}
RESOLVE_HELP = {
    "committed": "the provider confirms it happened",
    "verified": "reconciled against the provider's records",
    "abandoned": "it did not happen, or is written off",
    "compensated": "it was undone: a refund, a retraction",
}
# states nobody moves on their own any more (the targets of a resolution)
SETTLED = tuple(sorted({s for targets in rules.RESOLUTIONS.values() for s in targets}))
# the queue's filter: every receipt, those an instance waits on, the superseded ones
WHICH = {"": None, "blocking": True, "superseded": False}


@bp.get("/effects/unresolved")
@login_required
def unresolved() -> ResponseReturnValue:
    kind = request.args.get("kind") or None
    if kind is not None and kind not in rules.EFFECT_KINDS:
        abort(400, f"unknown effect kind {kind!r}")
    which = request.args.get("which") or ""
    if which not in WHICH:
        abort(400, f"unknown filter which={which!r}: blocking or superseded")
    with tenant_tx(g.tenant) as conn:
        summary = sqlapi.effects.unresolved_summary(conn, tenant_id=g.tenant)
        rows = sqlapi.effects.unresolved_effects(
            conn, tenant_id=g.tenant, kind=kind, blocking=WHICH[which], limit=QUEUE_LIMIT + 1
        )
        return page(
            "unresolved.html",
            conn,
            nav_queue=summary["depth"],
            rows=rows[:QUEUE_LIMIT],
            more=len(rows) > QUEUE_LIMIT,
            kind=kind,
            kinds=rules.EFFECT_KINDS,
            which=which,
            total=summary["depth"],
            summary=summary,
        )


@bp.post("/effects/<uuid:effect_id>/verify")
@login_required
@write_required
def verify(effect_id: uuid.UUID) -> ResponseReturnValue:
    """Ask the step's verifier to settle one receipt (an escalated one starts over)."""
    with tenant_tx(g.tenant) as conn:
        rows = sqlapi.effects.request_verifications(
            conn, tenant_id=g.tenant, actor=g.actor, effect_ids=[effect_id]
        )
    outcome = rows[0]["outcome"] if rows else "not_found"
    if outcome == "not_found":
        abort(404)
    ok = outcome in ("scheduled", "rescheduled", "already_scheduled")
    flash(f"Receipt {effect_id}: {VERIFY_OUTCOMES.get(outcome, outcome)}.", "ok" if ok else "error")
    log.info(
        "event=console.verify tenant=%s effect=%s outcome=%s actor=%s",
        g.tenant,
        effect_id,
        outcome,
        g.actor,
    )
    if request.form.get("back") == "effect":
        return redirect(url_for("console.effect", effect_id=effect_id))
    return redirect(url_for("console.unresolved"))


@bp.post("/effects/verify-superseded")
@login_required
@write_required
def verify_superseded() -> ResponseReturnValue:
    """Ask the verifiers to settle every superseded unknown receipt of the tenant."""
    with tenant_tx(g.tenant) as conn:
        rows = sqlapi.effects.request_verifications(
            conn, tenant_id=g.tenant, actor=g.actor, superseded=True
        )
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    if not rows:
        flash("No superseded unknown receipt to verify.", "ok")
    else:
        said = ", ".join(
            f"{n} {outcome.replace('_', ' ')}" for outcome, n in sorted(counts.items())
        )
        flash(f"Verification requested for {len(rows)} superseded receipt(s): {said}.", "ok")
    log.info(
        "event=console.verify_superseded tenant=%s receipts=%d actor=%s",
        g.tenant,
        len(rows),
        g.actor,
    )
    return redirect(url_for("console.unresolved", which="superseded"))


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


def parse_output(text: str) -> Any:
    """The output field: empty is no output; anything else must be JSON (any value)."""
    if not text.strip():
        return NO_OUTPUT
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise errors.InvalidInput(
            f"the output is not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno}):"
            " write the JSON the step would have returned, or leave it empty"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise errors.InvalidInput(f"the output is not valid JSON ({exc})") from None


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
        output_states=settlement.OUTPUT_STATES,
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
        "output": request.form.get("output", ""),
        "note": request.form.get("note", "").strip(),
    }
    expected = request.form.get("expected_state", "")
    if form["state"] not in SETTLED or expected not in rules.EFFECT_STATES:
        abort(400, "choose a state to resolve to (the form names the legal ones)")
    status, message = 200, None
    try:
        evidence = parse_evidence(form["evidence"])
        output = parse_output(form["output"])
        with tenant_tx(g.tenant) as conn:
            row = settlement.resolve(
                conn,
                tenant_id=g.tenant,
                effect_id=effect_id,
                expected_state=expected,
                state=form["state"],
                actor=g.actor,
                evidence=evidence,
                provider_receipt_id=form["provider_receipt_id"] or None,
                note=form["note"] or None,
                output=output,
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
