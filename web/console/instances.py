"""Instance pages: the filtered list, one instance's history, and retry / cancel."""

from __future__ import annotations

import datetime as dt
import uuid

from flask import abort, flash, g, redirect, request, url_for
from flask.typing import ResponseReturnValue

from orch8_py import errors, rules, sqlapi
from orch8_py.sqlapi import Row
from orch8_py.tree_rows import nest

from ..api.cursors import cursor, cursor_time, cursor_uuid, encode_cursor
from ..db import tenant_tx
from .blueprint import bp, log
from .effects import parse_output
from .formatting import engine_message
from .pages import page
from .receipts import receipt_events
from .session import login_required, write_required

PAGE_SIZE = 25
PAGE_CURSOR = cursor(cursor_time, cursor_uuid)  # the REST API's (created_at, id) cursor

# states an operator may cancel from (a running one at its next step boundary)
CANCELLABLE = tuple(s for s, to in rules.INSTANCE_TRANSITIONS.items() if "cancelled" in to)


def _page_cursor(name: str) -> tuple[dt.datetime, uuid.UUID] | None:
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
def instances() -> ResponseReturnValue:
    """Newest first, keyset-paged on (created_at, id) like the REST API: ``cursor`` is
    the page of instances older than it, ``newer`` the page just newer than it. Instances
    created meanwhile are newer than every cursor, so a walk never repeats or skips one."""
    state = request.args.get("state") or None
    if state is not None and state not in rules.INSTANCE_STATES:
        abort(400, f"unknown instance state {state!r}")
    older = _page_cursor("cursor")
    newer = _page_cursor("newer")
    if older is not None and newer is not None:
        abort(400, "give cursor or newer, not both")
    with tenant_tx(g.tenant) as conn:
        rows = sqlapi.instances.list_instances(
            conn,
            tenant_id=g.tenant,
            state=state,
            limit=PAGE_SIZE + 1,
            older_than=older,
            newer_than=newer,
        )
        more = len(rows) > PAGE_SIZE
        # newest first; of a newer page, the nearest PAGE_SIZE newer ones
        rows = rows[-PAGE_SIZE:] if newer is not None else rows[:PAGE_SIZE]
        if newer is not None:
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
            states=rules.INSTANCE_STATES,
        )


def _key(row: Row) -> str:
    return encode_cursor(row["created_at"], row["id"])


@bp.get("/instances/<uuid:instance_id>")
@login_required
def instance(instance_id: uuid.UUID) -> ResponseReturnValue:
    with tenant_tx(g.tenant) as conn:
        inst = sqlapi.instances.get_instance(conn, tenant_id=g.tenant, instance_id=instance_id)
        if inst is None:
            abort(404)
        outputs = sqlapi.instances.instance_outputs(
            conn, tenant_id=g.tenant, instance_id=instance_id
        )
        rows = sqlapi.instances.instance_tree(conn, tenant_id=g.tenant, instance_id=instance_id)
        receipts = sqlapi.effects.receipts_of_instance(
            conn, tenant_id=g.tenant, instance_id=instance_id
        )
        events = receipt_events(conn, [r["id"] for r in receipts])
        transitions = sqlapi.instances.instance_audit(
            conn, tenant_id=g.tenant, instance_id=instance_id
        )
        requests = sqlapi.instances.instance_requests(
            conn, tenant_id=g.tenant, instance_id=instance_id
        )
        blocking = [r for r in receipts if r["state"] in ("unknown", "dispatched")]
        return page(
            "instance.html",
            conn,
            inst=inst,
            tree=nest(rows),
            outputs=outputs,
            receipts=receipts,
            events=events,
            transitions=transitions,
            requests=requests,
            blocking=blocking,
            # failed, or a node waits on a person: blocked (its branch stopped while others
            # run), or waiting on a verifier for a receipt settled by hand meanwhile
            can_retry=inst["state"] == "failed"
            or any(r["state"] == "blocked" for r in rows)
            or (inst["state"] == "waiting" and not blocking),
            can_cancel=inst["state"] in CANCELLABLE and inst["requested_state"] != "cancelled",
        )


@bp.post("/instances/<uuid:instance_id>/retry")
@login_required
@write_required
def retry(instance_id: uuid.UUID) -> ResponseReturnValue:
    try:
        output = parse_output(request.form.get("output", ""))
        with tenant_tx(g.tenant) as conn:
            done = sqlapi.instances.retry_instance(
                conn, tenant_id=g.tenant, instance_id=instance_id, actor=g.actor, output=output
            )
    except errors.NotFound:
        abort(404)
    except errors.Orch8Error as exc:
        flash(f"Retry refused: {engine_message(exc)}", "error")
    else:
        detail = f": {done.detail}" if done.detail else ""
        flash(f"Retried ({done.outcome}){detail}.", "ok")
        log.info(
            "event=console.retry tenant=%s instance=%s actor=%s", g.tenant, instance_id, g.actor
        )
    return redirect(url_for("console.instance", instance_id=instance_id))


@bp.post("/instances/<uuid:instance_id>/cancel")
@login_required
@write_required
def cancel(instance_id: uuid.UUID) -> ResponseReturnValue:
    try:
        with tenant_tx(g.tenant) as conn:
            outcome = sqlapi.instances.request_instance_state(
                conn,
                move="cancel",
                tenant_id=g.tenant,
                instance_id=instance_id,
                actor=g.actor,
                reason=request.form.get("reason", "").strip()[:1000]
                or "cancelled from the console",
            )
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
