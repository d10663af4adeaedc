"""Instance pages: the filtered list, one instance's history, and retry / cancel."""

from __future__ import annotations

import uuid

from flask import abort, flash, g, redirect, request, url_for

from orch8_py import errors
from orch8_py.states import INSTANCE_STATES

from ..api.validation import cursor, cursor_time, cursor_uuid, encode_cursor
from ..db import tenant_tx
from .blueprint import bp, log
from .formatting import engine_message
from .pages import page
from .receipts import receipt_events
from .session import login_required, write_required

PAGE_SIZE = 25
PAGE_CURSOR = cursor(cursor_time, cursor_uuid)  # the REST API's (created_at, id) cursor

CANCELLABLE = ("scheduled", "running", "waiting", "paused")


def _page_cursor(name: str) -> tuple | None:
    value = request.args.get(name)
    if value is None:
        return None
    try:
        return PAGE_CURSOR(value)
    except ValueError:
        abort(
            400,
            "This page link is not valid: its position in the list (the cursor) is not one"
            " the console made. Start again from the newest instances.",
        )


@bp.get("/instances")
@login_required
def instances():
    """Newest first, keyset-paged on (created_at, id) like the REST API: ``cursor`` is
    the page of instances older than it, ``newer`` the page just newer than it. Instances
    created meanwhile are newer than every cursor, so a walk never repeats or skips one."""
    state = request.args.get("state") or None
    if state is not None and state not in INSTANCE_STATES:
        abort(400, f"unknown instance state {state!r}")
    older = _page_cursor("cursor")
    newer = _page_cursor("newer")
    if older is not None and newer is not None:
        abort(400, "give cursor or newer, not both")
    where = "t.tenant_id = %s AND (%s::text IS NULL OR t.state = %s::orch8.instance_state)"
    args: list = [g.tenant, state, state]
    order = "DESC"
    if older is not None:
        where += " AND (t.created_at, t.id) < (%s, %s)"
        args.extend(older)
    elif newer is not None:
        where += " AND (t.created_at, t.id) > (%s, %s)"
        args.extend(newer)
        order = "ASC"  # the nearest newer ones, turned newest first below
    with tenant_tx(g.tenant) as conn:
        rows = conn.execute(
            "SELECT t.id, t.state::text AS state, t.current_block, t.error, t.created_at,"
            " t.updated_at, t.sequence_version, s.namespace, s.name"
            " FROM orch8.task_instances AS t"
            " LEFT JOIN orch8.sequences AS s ON s.tenant_id = t.tenant_id AND s.id = t.sequence_id"
            f" WHERE {where}"
            f" ORDER BY t.created_at {order}, t.id {order} LIMIT %s",
            (*args, PAGE_SIZE + 1),
        ).fetchall()
        more = len(rows) > PAGE_SIZE
        rows = rows[:PAGE_SIZE]
        if newer is not None:
            rows.reverse()
            has_newer, has_older = more, True  # the cursor's own row is older
        else:
            has_newer, has_older = older is not None, more
        return page(
            "instances.html",
            conn,
            rows=rows,
            newer_cursor=_key(rows[0]) if rows and has_newer else None,
            older_cursor=_key(rows[-1]) if rows and has_older else None,
            paged=older is not None or newer is not None,
            state=state,
            states=INSTANCE_STATES,
        )


def _key(row: dict) -> str:
    return encode_cursor(row["created_at"], row["id"])


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
