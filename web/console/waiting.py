"""What instances wait for: sleeps, signals, children, verifiers, and people. A
wait_for_input is answered here (operators and admins) with one of its choices."""

from __future__ import annotations

import uuid

from flask import abort, flash, g, redirect, request, url_for
from flask.typing import ResponseReturnValue

from orch8_py import errors, rules, sqlapi

from ..db import tenant_tx
from .blueprint import bp, log
from .formatting import engine_message
from .pages import page
from .session import login_required, write_required

PAGE_SIZE = 100


@bp.get("/waiting")
@login_required
def waiting() -> ResponseReturnValue:
    """Longest waiting first; ``for`` narrows to one reason (input: people's answers)."""
    reason = request.args.get("for") or None
    if reason is not None and reason not in rules.WAIT_REASONS:
        abort(400, f"unknown wait reason {reason!r} (one of {', '.join(rules.WAIT_REASONS)})")
    with tenant_tx(g.tenant) as conn:
        rows = sqlapi.instances.waiting_nodes(
            conn, tenant_id=g.tenant, waiting_for=reason, limit=PAGE_SIZE
        )
        return page("waiting.html", conn, rows=rows, reason=reason, reasons=rules.WAIT_REASONS)


@bp.post("/instances/<uuid:instance_id>/answer")
@login_required
@write_required
def answer(instance_id: uuid.UUID) -> ResponseReturnValue:
    path = request.form.get("path", "")
    choice = request.form.get("choice", "")
    comment = request.form.get("comment", "").strip() or None
    try:
        with tenant_tx(g.tenant) as conn:
            done = sqlapi.instances.answer_input(
                conn,
                tenant_id=g.tenant,
                instance_id=instance_id,
                path=path,
                choice=choice,
                comment=comment,
                actor=g.actor,
            )
    except errors.Orch8Error as exc:
        flash(f"Answer refused: {engine_message(exc)}", "error")
    else:
        flash(f"Answered {done.path}: {choice}. The instance is {done.state}.", "ok")
        log.info(
            "event=console.answer tenant=%s instance=%s path=%s actor=%s",
            g.tenant,
            instance_id,
            path,
            g.actor,
        )
    return redirect(url_for("console.waiting") + "?for=input")
