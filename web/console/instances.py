"""Instance pages: the filtered list, one instance's history, and retry / cancel."""

from __future__ import annotations

import uuid

from flask import abort, flash, g, redirect, request, url_for

from orch8_py import errors
from orch8_py.states import INSTANCE_STATES

from ..db import tenant_tx
from .blueprint import bp, log
from .formatting import engine_message
from .pages import page
from .receipts import receipt_events
from .session import login_required, write_required

PAGE_SIZE = 25

CANCELLABLE = ("scheduled", "running", "waiting", "paused")


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
