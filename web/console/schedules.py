"""The schedules page: every cron schedule of the tenant (its state, policy, next and last
fire) with pause and resume buttons for operators. Fires happen in the runners."""

from __future__ import annotations

import uuid

from flask import abort, flash, g, redirect, url_for
from flask.typing import ResponseReturnValue

from orch8_py import errors, sqlapi

from ..db import tenant_tx
from .blueprint import bp
from .formatting import engine_message
from .pages import page
from .session import login_required, write_required

LIST_LIMIT = 500


@bp.get("/schedules")
@login_required
def schedules() -> ResponseReturnValue:
    with tenant_tx(g.tenant) as conn:
        rows = sqlapi.schedules.list_schedules(conn, tenant_id=g.tenant, limit=LIST_LIMIT + 1)
        return page("schedules.html", conn, rows=rows[:LIST_LIMIT], more=len(rows) > LIST_LIMIT)


def _move(schedule_id: uuid.UUID, move: str) -> ResponseReturnValue:
    do = {
        "pause": sqlapi.schedules.pause_schedule,
        "resume": sqlapi.schedules.resume_schedule,
    }[move]
    try:
        with tenant_tx(g.tenant) as conn:
            outcome = do(conn, tenant_id=g.tenant, schedule_id=schedule_id, actor=g.actor)
    except errors.NotFound:
        abort(404)
    except errors.Orch8Error as exc:
        flash(f"{move.capitalize()} refused: {engine_message(exc)}", "error")
    else:
        messages = {
            "paused": "Paused: no fire until it is resumed.",
            "active": "Resumed: the next fire is counted from now (no catch-up).",
            "ended": "Resumed, but no fire time is left before its end: it ended.",
            "unchanged": "Nothing to do: it already was.",
        }
        flash(messages.get(outcome, f"{move}: {outcome}."), "ok")
    return redirect(url_for("console.schedules"))


@bp.post("/schedules/<uuid:schedule_id>/pause")
@login_required
@write_required
def pause_schedule(schedule_id: uuid.UUID) -> ResponseReturnValue:
    return _move(schedule_id, "pause")


@bp.post("/schedules/<uuid:schedule_id>/resume")
@login_required
@write_required
def resume_schedule(schedule_id: uuid.UUID) -> ResponseReturnValue:
    return _move(schedule_id, "resume")
