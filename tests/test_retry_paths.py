"""Retry paths promised by docs/CONTINUITY_OPERATIONS.md (#5-retry-the-instance),
docs/API.md (POST /instances/{id}/retry), docs/CLI.md (`orch8 instances retry`, exit 3)
and orch8.retry_instance (sql/functions/operations.sql), plus the lease sweep applying a
cancel requested while an instance ran:

- refused (O8006 / 409 / exit 3) while the deciding receipt is still ``dispatched``;
- a commit guard's duplicate is decided by the receipt that holds the content;
- after ``compensated`` the step runs again as a new attempt, with a new effect id;
- a pure step that failed (no receipt at all) runs again;
- a cancel requested while running is applied by the sweep when the lease expires.

Every test uses its own fresh database; time moves with orch8.fake_now, never by sleeping.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from orch8_py import apikeys
from orch8_py.handlers import StepError, handler
from tests.cli_helpers import assert_one_line_error, orch8_env, run_orch8
from tests.runner_helpers import TENANT, make_sequence, running, start, wait_for
from web import create_app

CHARGE = "test.retry_paths.charge"  # always succeeds
FLAKY = "test.retry_paths.flaky"  # attempt 0 fails retryably (the effect may have happened)
PARAMS = {"amount": 12, "currency": "EUR"}
ACTOR = "alice@ops"

# (handler, block, attempt, effect id) of every handler call, in order
calls: list[tuple[str, str, int, str]] = []


@handler(CHARGE)
def charge(params, ctx):
    calls.append((CHARGE, ctx.block_id, ctx.attempt, str(ctx.effect_id)))
    return {"receipt_id": f"ch_{ctx.attempt}"}


@handler(FLAKY)
def flaky(params, ctx):
    calls.append((FLAKY, ctx.block_id, ctx.attempt, str(ctx.effect_id)))
    if ctx.attempt == 0:
        raise StepError("gateway timeout after sending", code="timeout", retryable=True)
    return {"receipt_id": f"ch_{ctx.attempt}"}


@pytest.fixture(autouse=True)
def _clear_calls():
    calls.clear()
    yield
    calls.clear()


def charge_then_ship(handler_name=CHARGE, retry=None):
    charge_block = {"type": "step", "id": "charge", "handler": handler_name, "params": PARAMS}
    if retry is not None:
        charge_block["retry"] = retry
    return [charge_block, {"type": "step", "id": "ship", "handler": "noop"}]


# --- engine helpers -----------------------------------------------------------------------


def claim(conn, instance) -> uuid.UUID:
    rows = conn.execute(
        "SELECT instance_id AS id, lease_token FROM orch8.claim_due_nodes('w1', 10, '30 seconds')"
    ).fetchall()
    assert [r[0] for r in rows] == [instance], rows
    return rows[0][1]


def begin(conn, instance, token, block="charge", attempt=0, handler_name=CHARGE):
    return conn.execute(
        "SELECT outcome, effect_id FROM orch8.begin_step(%s, %s, %s, %s, %s, %s, %s)",
        (TENANT, instance, token, block, handler_name, Jsonb(PARAMS), attempt),
    ).fetchone()


def instance_row(conn, instance):
    return conn.execute(
        "SELECT state::text, requested_state::text, error, current_block,"
        " (SELECT n.lease_token FROM orch8.execution_nodes AS n WHERE n.tenant_id = t.tenant_id"
        "  AND n.instance_id = t.id AND n.lease_token IS NOT NULL LIMIT 1)"
        " FROM orch8.task_instances AS t WHERE tenant_id = %s AND id = %s",
        (TENANT, instance),
    ).fetchone()


def receipt_state(conn, effect_id) -> str:
    return conn.execute(
        "SELECT state::text FROM orch8.effect_receipts WHERE tenant_id = %s AND id = %s",
        (TENANT, effect_id),
    ).fetchone()[0]


def receipts(conn, instance):
    return conn.execute(
        "SELECT block_id, attempt, state::text, id FROM orch8.effect_receipts"
        " WHERE tenant_id = %s AND instance_id = %s ORDER BY created_at, attempt, block_id",
        (TENANT, instance),
    ).fetchall()


def retry_sql(conn, instance, actor=ACTOR):
    return conn.execute(
        "SELECT outcome, block_id, effect_id, detail FROM orch8.retry_instance(%s, %s, %s)",
        (TENANT, instance, actor),
    ).fetchone()


def assert_retry_refused_in_sql(conn, instance, effect_id, state, block="charge", attempt=0):
    """orch8.retry_instance raises SQLSTATE O8006 naming the receipt (message and detail)."""
    with pytest.raises(psycopg.Error) as info:
        retry_sql(conn, instance)
    err = info.value
    assert err.sqlstate == "O8006", (err.sqlstate, str(err))
    assert err.diag.message_primary == (
        f"receipt {effect_id} (block {block}, attempt {attempt}) is {state}:"
        " resolve it before retrying"
    )
    assert json.loads(err.diag.message_detail) == {
        "effect_id": str(effect_id),
        "effect_state": state,
        "block_id": block,
        "attempt": attempt,
    }


def footprint(conn, instance):
    """What a refused retry must leave untouched."""
    return conn.execute(
        "SELECT (SELECT count(*) FROM orch8.block_outputs WHERE instance_id = %(i)s),"
        " (SELECT count(*) FROM orch8.instance_transitions WHERE instance_id = %(i)s),"
        " (SELECT count(*) FROM orch8.effect_receipt_events AS e JOIN orch8.effect_receipts"
        "   AS r ON r.tenant_id = e.tenant_id AND r.id = e.receipt_id"
        "   WHERE r.instance_id = %(i)s),"
        " (SELECT array_agg(state::text ORDER BY id) FROM orch8.effect_receipts"
        "   WHERE instance_id = %(i)s),"
        " (SELECT state::text FROM orch8.task_instances WHERE id = %(i)s)",
        {"i": instance},
    ).fetchone()


def fail_with_unknown_receipt(conn, seq):
    """Failed with EffectBlocked, the charge receipt unknown: a run began attempt 0 and
    was lost; another claim began the same attempt (as tests/test_operations.py)."""
    a = start(conn, seq)
    token = claim(conn, a)
    assert begin(conn, a, token)[0] == "dispatched"
    conn.execute("SELECT orch8.release_lease(%s, %s, %s)", (TENANT, a, token))
    outcome, effect_id = begin(conn, a, claim(conn, a))
    assert outcome == "blocked"
    assert instance_row(conn, a)[0] == "failed"
    assert receipt_state(conn, effect_id) == "unknown"
    return a, effect_id


def set_clock(conn, at: dt.datetime | None) -> None:
    conn.execute("SELECT set_config('orch8.fake_now', %s, false)", (at.isoformat() if at else "",))


# --- the three front doors ----------------------------------------------------------------


@pytest.fixture
def api_retry(db_url, conn):
    """POST /api/v1/instances/{id}/retry with an operator key of the tenant."""
    app = create_app(db_url, secret_key="retry-paths-secret")
    app.testing = True
    _, secret = apikeys.create(conn, TENANT, "operator", "alice")
    client = app.test_client()

    def post(instance):
        resp = client.post(
            f"/api/v1/instances/{instance}/retry", headers={"Authorization": f"Bearer {secret}"}
        )
        assert resp.is_json, resp.get_data(as_text=True)
        return resp.status_code, resp.get_json()

    yield post
    app.extensions["orch8.pool"].close()


def cli(db_url, *args):
    return run_orch8(*args, env=orch8_env(ORCH8_DATABASE_URL=db_url, USER="tester"))


def assert_api_refusal(api_retry, instance, effect_id, state):
    status, body = api_retry(instance)
    assert status == 409, body
    assert body["error"] == "blocked by an unresolved effect", body
    assert body["effect_id"] == str(effect_id), body
    assert f"receipt {effect_id}" in body["detail"] and f"is {state}" in body["detail"], body


# --- 1. refused while the deciding receipt is still dispatched ------------------------------


def test_retry_is_refused_while_the_receipt_is_still_dispatched(db_url, conn, api_retry):
    seq = make_sequence(conn, charge_then_ship())
    a = start(conn, seq)
    token = claim(conn, a)
    outcome, effect_id = begin(conn, a, token)
    assert outcome == "dispatched"
    # No engine path fails an instance while its step's receipt is dispatched: begin_step
    # turns a dispatched receipt of the same attempt into unknown before failing, and
    # finish_step settles the receipt before failing. So the state is reached as a DBA
    # would after a crash: the runner host is gone mid-step and the DBA fails the stuck
    # instance by hand with the engine's own audited CAS (running -> failed is in the
    # transition table). The latest block output is the step's __in_progress__ row.
    assert conn.execute(
        "SELECT orch8.transition_instance(%s, %s, 'running', 'failed', 'dba@ops', %s)",
        (TENANT, a, "runner host lost mid-step; failed by hand"),
    ).fetchone()[0]
    assert instance_row(conn, a)[0] == "failed"
    assert receipt_state(conn, effect_id) == "dispatched"
    before = footprint(conn, a)

    assert_retry_refused_in_sql(conn, a, effect_id, "dispatched")
    assert_api_refusal(api_retry, a, effect_id, "dispatched")
    proc = cli(db_url, "instances", "retry", str(a), "--tenant", TENANT)
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    assert_one_line_error(proc, str(effect_id), "is dispatched", "(block charge, attempt 0)")
    assert f"orch8 effects show {effect_id} --tenant {TENANT}" in proc.stderr
    assert proc.stdout == ""

    assert footprint(conn, a) == before  # nothing moved, nothing was written
    assert calls == []


def test_retry_of_a_duplicate_is_refused_while_the_holder_is_dispatched(conn, api_retry):
    # Two branches with identical content under a commit guard: the first branch's charge
    # is dispatched (the holder) when the second branch's begins, and the guard refuses it
    # as a duplicate. The parallel fails at once; its retry is decided by the holder.
    seq = make_sequence(
        conn,
        [
            {
                "type": "parallel",
                "id": "both",
                "branches": [
                    [{"type": "step", "id": "charge", "handler": CHARGE, "params": PARAMS}],
                    [{"type": "step", "id": "charge_again", "handler": CHARGE, "params": PARAMS}],
                ],
            }
        ],
        invariants=[
            {"name": "once", "type": "effect_at_most_once", "kind": "worker", "commit_guard": True}
        ],
    )
    a = start(conn, seq)
    tokens = dict(
        conn.execute(
            "SELECT path, lease_token FROM orch8.claim_due_nodes('w1', 10, '30 seconds')"
        ).fetchall()
    )
    outcome, holder = begin(conn, a, tokens["both#0/charge"], block="both#0/charge")
    assert outcome == "dispatched"
    outcome, candidate = begin(conn, a, tokens["both#1/charge_again"], block="both#1/charge_again")
    assert outcome == "duplicate"
    state, _, error, _, _ = instance_row(conn, a)
    assert state == "failed" and error.startswith("InvariantViolation: "), error
    before = footprint(conn, a)

    # the holder decides, not the candidate (which is only prepared)
    assert_retry_refused_in_sql(conn, a, holder, "dispatched", block="both#0/charge")
    assert_api_refusal(api_retry, a, holder, "dispatched")
    assert footprint(conn, a) == before
    assert receipt_state(conn, candidate) == "prepared"  # a refused retry supersedes nothing


# --- 2. a commit guard's duplicate: the receipt holding the content decides -----------------


def test_duplicate_retry_is_decided_by_the_holder(db_url, conn, api_retry):
    seq = make_sequence(
        conn,
        charge_then_ship(
            FLAKY,
            retry={
                "max_attempts": 2,
                "initial_backoff": 0,
                "max_backoff": 0,
                "on_ambiguous": "new_attempt",  # resend under a new key: the guard objects
            },
        ),
        invariants=[
            {
                "name": "charge once",
                "type": "effect_at_most_once",
                "kind": "worker",
                "commit_guard": True,
            }
        ],
    )
    a = start(conn, seq)
    # attempt 0 fails after sending (receipt unknown); attempt 1 has the same content and
    # the guard refuses it as a duplicate: the instance fails with InvariantViolation
    with running(db_url):
        state, error = wait_for(conn, [a])[a]
    assert state == "failed" and error.startswith("InvariantViolation: "), error
    [(b0, at0, holder_state, holder), (b1, at1, cand_state, candidate)] = receipts(conn, a)
    assert (b0, at0, holder_state, b1, at1, cand_state) == (
        "charge",
        0,
        "unknown",
        "charge",
        1,
        "prepared",
    )
    assert calls == [(FLAKY, "charge", 0, str(holder))]  # attempt 1 never reached the handler
    last = conn.execute(
        "SELECT sentinel, attempt, effect_id, output FROM orch8.block_outputs"
        " WHERE instance_id = %s ORDER BY seq DESC LIMIT 1",
        (a,),
    ).fetchone()
    assert last[:3] == ("__error__", 1, candidate)
    assert last[3]["outcome"] == "duplicate"
    assert last[3]["competing_effect_id"] == str(holder)

    # holder still unknown: refused, naming the holder (not the candidate)
    assert_retry_refused_in_sql(conn, a, holder, "unknown")
    assert_api_refusal(api_retry, a, holder, "unknown")
    assert receipt_state(conn, candidate) == "prepared"
    assert instance_row(conn, a)[0] == "failed"

    # the provider has it: resolve the holder committed, then retry
    conn.execute(
        "SELECT orch8.resolve_effect(%s, %s, 'unknown', 'committed', 'ch_3LkP', %s, %s, %s)",
        (TENANT, holder, Jsonb({"checked": "provider API by key"}), ACTOR, "provider has it"),
    )
    outcome, block, effect_id, detail = retry_sql(conn, a)
    assert (outcome, block, effect_id) == ("completed_from_evidence", "charge", holder)
    assert detail == (
        f"receipt {holder} is committed (provider receipt ch_3LkP): the step is not sent again"
    )
    # the never-dispatched candidate is superseded, with the reason the retry writes
    assert receipt_state(conn, candidate) == "abandoned"
    event = conn.execute(
        "SELECT from_state::text, to_state::text, actor, note, evidence"
        " FROM orch8.effect_receipt_events WHERE receipt_id = %s ORDER BY event_id DESC LIMIT 1",
        (candidate,),
    ).fetchone()
    assert event == (
        "prepared",
        "abandoned",
        ACTOR,
        "superseded by an operator retry",
        {"superseded_by_retry": True},
    )
    evidence = conn.execute(
        "SELECT evidence FROM orch8.effect_receipts WHERE id = %s", (candidate,)
    ).fetchone()[0]
    assert evidence["superseded_by_retry"] is True
    state, _, error, current_block, _ = instance_row(conn, a)
    assert (state, error, current_block) == ("scheduled", None, "ship")

    with running(db_url):
        assert wait_for(conn, [a])[a] == ("completed", None)
    assert len(calls) == 1  # never sent again
    settled = conn.execute(
        "SELECT attempt, effect_id, output FROM orch8.block_outputs"
        " WHERE instance_id = %s AND block_id = 'charge' AND sentinel IS NULL",
        (a,),
    ).fetchall()
    assert len(settled) == 1
    assert settled[0][:2] == (1, holder)
    # ship does not read the charge's output, so a marker stands for it
    assert settled[0][2] == {
        "settled": True,
        "settled_by": ACTOR,
        "effect_id": str(holder),
        "effect_state": "committed",
        "provider_receipt_id": "ch_3LkP",
    }
    assert [(r[2]) for r in receipts(conn, a)] == ["committed", "abandoned"]


# --- 3. after compensated: a new attempt, a new effect id ----------------------------------


def test_retry_after_compensated_runs_the_step_again_as_a_new_attempt(db_url, conn):
    seq = make_sequence(conn, charge_then_ship())
    a, effect_id = fail_with_unknown_receipt(conn, seq)
    resolved = conn.execute(
        "SELECT state::text FROM orch8.resolve_effect("
        "%s, %s, 'unknown', 'compensated', NULL, %s, %s, 'refunded at the provider')",
        (TENANT, effect_id, Jsonb({"refund": "re_1", "checked": "provider dashboard"}), ACTOR),
    ).fetchone()[0]
    assert resolved == "compensated"

    outcome, block, decided_by, detail = retry_sql(conn, a)
    assert (outcome, block, decided_by) == ("rerun", "charge", effect_id)
    assert detail == f"receipt {effect_id} is compensated: the step runs again as a new attempt"
    state, _, error, current_block, _ = instance_row(conn, a)
    assert (state, error, current_block) == ("scheduled", None, "charge")
    attempt = conn.execute(
        "SELECT orch8.compute_attempt(%s, %s, 'charge')", (TENANT, a)
    ).fetchone()[0]
    assert attempt == 1

    with running(db_url):
        assert wait_for(conn, [a])[a] == ("completed", None)
    assert len(calls) == 1, calls  # exactly once more
    _, called_block, called_attempt, new_effect = calls[0]
    assert (called_block, called_attempt) == ("charge", 1)
    assert new_effect != str(effect_id)
    assert [(b, n, s, str(i)) for b, n, s, i in receipts(conn, a)] == [
        ("charge", 0, "compensated", str(effect_id)),
        ("charge", 1, "committed", new_effect),
    ]


# --- 4. a pure step that failed: no receipt, it runs again ---------------------------------


def test_retry_of_a_failed_pure_step_reruns_it(db_url, conn):
    seq = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "check",
                "handler": "fail",
                "params": {"message": "attempt {{ runtime.attempt }} refused"},
                "retry": {"max_attempts": 1},
            }
        ],
    )
    a = start(conn, seq)
    with running(db_url):
        assert wait_for(conn, [a])[a] == ("failed", "attempt 0 refused")
    assert receipts(conn, a) == []

    proc = cli(db_url, "instances", "retry", str(a), "--tenant", TENANT, "--json")
    assert proc.returncode == 0 and proc.stderr == "", (proc.stdout, proc.stderr)
    out = json.loads(proc.stdout)
    assert (out["outcome"], out["block_id"], out["effect_id"], out["state"]) == (
        "rerun",
        "check",
        None,
        "scheduled",
    )
    assert out["detail"] == "the failed step runs again as a new attempt"

    with running(db_url):
        assert wait_for(conn, [a])[a] == ("failed", "attempt 1 refused")  # it ran again
    errors = conn.execute(
        "SELECT attempt, sentinel, effect_id FROM orch8.block_outputs"
        " WHERE instance_id = %s ORDER BY seq",
        (a,),
    ).fetchall()
    assert errors == [(0, "__error__", None), (1, "__error__", None)]
    assert receipts(conn, a) == []
    audit = conn.execute(
        "SELECT from_state::text, to_state::text, actor, reason FROM orch8.instance_transitions"
        " WHERE instance_id = %s AND from_state = 'failed'",
        (a,),
    ).fetchall()
    assert audit == [("failed", "scheduled", "cli:tester", "retry: step runs again")]


def test_retry_of_a_failed_pure_step_can_complete_the_instance(db_url, conn):
    seq = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "check",
                "handler": "assert",
                "params": {"condition": "runtime.attempt >= 1", "message": "not yet"},
                "retry": {"max_attempts": 1},
            },
            {"type": "step", "id": "after", "handler": "transform", "params": {"value": 1}},
        ],
    )
    a = start(conn, seq)
    with running(db_url):
        assert wait_for(conn, [a])[a] == ("failed", "not yet")
    assert retry_sql(conn, a) == (
        "rerun",
        "check",
        None,
        "the failed step runs again as a new attempt",
    )
    with running(db_url):
        assert wait_for(conn, [a])[a] == ("completed", None)
    outputs = conn.execute(
        "SELECT block_id, attempt, sentinel FROM orch8.block_outputs"
        " WHERE instance_id = %s ORDER BY seq",
        (a,),
    ).fetchall()
    assert outputs == [("check", 0, "__error__"), ("check", 1, None), ("after", 0, None)]
    assert receipts(conn, a) == []


# --- 5. a cancel requested while running, applied by the lease sweep -----------------------


@pytest.mark.parametrize("sweep", ["reclaim_expired_leases", "claim_due_nodes"])
def test_a_cancel_requested_while_running_is_applied_when_the_lease_expires(conn, sweep):
    seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    a = start(conn, seq)
    token = claim(conn, a)
    expires = conn.execute(
        "SELECT lease_expires_at FROM orch8.execution_nodes"
        " WHERE instance_id = %s AND lease_token IS NOT NULL",
        (a,),
    ).fetchone()[0]
    cancelled = conn.execute(
        "SELECT orch8.cancel_instance(%s, %s, 'op', 'customer asked')", (TENANT, a)
    ).fetchone()[0]
    assert cancelled == "requested"
    assert instance_row(conn, a)[:2] == ("running", "cancelled")

    def run_sweep():
        if sweep == "reclaim_expired_leases":
            return conn.execute("SELECT orch8.reclaim_expired_leases()").fetchone()[0]
        claimed = conn.execute(
            "SELECT instance_id AS id FROM orch8.claim_due_nodes('w2', 10, '30 seconds')"
        ).fetchall()
        assert claimed == []  # the sweep runs first; a cancelled instance is never claimed
        return None

    try:
        set_clock(conn, expires)  # not expired yet: the lease is still held
        swept = run_sweep()
        assert swept in (0, None)
        assert instance_row(conn, a)[:2] == ("running", "cancelled")

        set_clock(conn, expires + dt.timedelta(seconds=1))  # the runner died; lease expired
        swept = run_sweep()
        assert swept in (1, None)
        state, requested, _, _, lease_token = instance_row(conn, a)
        assert (state, requested, lease_token) == ("cancelled", None, None)
        lease = conn.execute(
            "SELECT lease_owner, lease_expires_at FROM orch8.instance_overview WHERE id = %s", (a,)
        ).fetchone()
        assert lease == (None, None)
        audit = conn.execute(
            "SELECT from_state::text, to_state::text, actor, reason, at"
            " FROM orch8.instance_transitions WHERE instance_id = %s ORDER BY seq",
            (a,),
        ).fetchall()
        assert [r[:4] for r in audit] == [
            (None, "scheduled", "create", None),
            ("scheduled", "running", "w1", None),
            ("running", "cancelled", "lease-sweep", "lease expired"),
        ]
        assert audit[-1][4] == expires + dt.timedelta(seconds=1)  # at the engine's clock
        # the dead runner's token can write nothing any more
        with pytest.raises(psycopg.Error) as info:
            conn.execute(
                "SELECT orch8.finish_step(%s, %s, %s, 'a', 0, NULL, 'ok', '{}')",
                (TENANT, a, token),
            )
        assert info.value.sqlstate == "O8001"
        assert conn.execute("SELECT orch8.reclaim_expired_leases()").fetchone()[0] == 0
        assert instance_row(conn, a)[0] == "cancelled"
    finally:
        set_clock(conn, None)


def test_a_swept_cancel_does_not_strand_the_step_in_flight_as_dispatched(conn):
    seq = make_sequence(conn, charge_then_ship())
    a = start(conn, seq)
    token = claim(conn, a)
    outcome, effect_id = begin(conn, a, token)  # the runner sends the charge ...
    assert outcome == "dispatched"
    requested = conn.execute("SELECT orch8.cancel_instance(%s, %s, 'op')", (TENANT, a)).fetchone()[
        0
    ]
    assert requested == "requested"
    expires = conn.execute(
        "SELECT lease_expires_at FROM orch8.execution_nodes"
        " WHERE instance_id = %s AND lease_token IS NOT NULL",
        (a,),
    ).fetchone()[0]
    try:
        set_clock(conn, expires + dt.timedelta(seconds=1))  # ... and dies before recording
        assert conn.execute("SELECT orch8.reclaim_expired_leases()").fetchone()[0] == 1
    finally:
        set_clock(conn, None)
    assert instance_row(conn, a)[0] == "cancelled"
    # documented: a dead runner's dispatched receipt ends unknown, so an operator can
    # follow the procedure (resolve it); a dispatched one cannot be resolved by anyone
    assert receipt_state(conn, effect_id) == "unknown"
    actor, note = conn.execute(
        "SELECT actor, note FROM orch8.effect_receipt_events WHERE receipt_id = %s"
        " AND to_state = 'unknown'",
        (effect_id,),
    ).fetchone()
    assert actor == "lease-sweep" and "lost its lease" in note
    resolved = conn.execute(
        "SELECT (orch8.resolve_effect(%s, %s, 'unknown', 'abandoned', NULL,"
        " '{\"checked\": \"provider\"}', 'op')).state::text",
        (TENANT, effect_id),
    ).fetchone()[0]
    assert resolved == "abandoned"  # the operator can settle it
