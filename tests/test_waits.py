"""Time, signals and people, end to end on real runners against a real PostgreSQL: sleep
and delay park an instance without a runner thread and wake when the engine clock has
passed (orch8.fake_now, never a sleep in the test); signals are consumed exactly once
under concurrent senders, also when they come before the wait; update_context reaches
the next block of a running chain; wait_for_input is answered by an operator (SQL, REST,
CLI) or times out into its on_timeout; cancel withdraws a sleep, a wait and a child.

Every field these tests prove is registered with ``proves`` (tests/language_proofs.py)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from orch8_py import apikeys, sqlapi
from orch8_py.errors import InvalidInput, InvalidTransition, NotFound
from orch8_py.handlers import handler
from orch8_py.steps import NotApplied, StepContext
from tests.cli_helpers import orch8_env, run_orch8
from tests.language_proofs import proves
from tests.runner_helpers import TENANT, make_sequence, running, start, wait_for
from web import create_app

T0 = dt.datetime(2031, 3, 1, 12, 0, tzinfo=dt.UTC)  # the engine clock these tests start at


def at(url: str, clock: dt.datetime) -> str:
    """The database's conninfo with the engine clock frozen at ``clock`` for every
    connection made with it."""
    return make_conninfo(url, options=f"-c orch8.fake_now={clock.isoformat()}")


def clock(conn: psycopg.Connection, when: dt.datetime | None) -> None:
    conn.execute(
        "SELECT set_config('orch8.fake_now', %s, false)", (when.isoformat() if when else "",)
    )


def tree(conn, instance) -> dict[str, tuple[str, str]]:
    rows = conn.execute(
        "SELECT path, kind, state::text FROM orch8.execution_nodes WHERE instance_id = %s",
        (instance,),
    ).fetchall()
    return {p: (k, s) for p, k, s in rows}


def output(conn, instance, path) -> Any:
    return conn.execute(
        "SELECT output FROM orch8.block_outputs WHERE instance_id = %s AND block_id = %s"
        " AND sentinel IS NULL ORDER BY seq DESC LIMIT 1",
        (instance, path),
    ).fetchone()[0]


def instance(conn, instance_id) -> tuple[str, dt.datetime | None, str | None]:
    return conn.execute(
        "SELECT state::text, next_fire_at, error FROM orch8.task_instances WHERE id = %s",
        (instance_id,),
    ).fetchone()


CHAIN: list[str] = []


@handler("waits.slow")
def slow(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    CHAIN.append(ctx.block_id)
    time.sleep(float(params.get("seconds", 0.5)))
    return {"data_x": ctx.context.get("data", {}).get("x")}


# --- durable time ---------------------------------------------------------------------


@proves(("block_type", "sleep"), ("sleep", "type"), ("sleep", "id"), ("sleep", "duration"))
def test_a_sleep_holds_no_runner_and_ends_when_the_clock_passes_it(conn, db_url):
    clock(conn, T0)
    seq = make_sequence(
        conn,
        [
            {"type": "sleep", "id": "nap", "duration": "1h30m"},
            {"type": "step", "id": "after", "handler": "transform", "params": {"value": 1}},
        ],
    )
    i = start(conn, seq)
    state, next_fire_at, _ = instance(conn, i)
    assert (state, next_fire_at) == ("waiting", T0 + dt.timedelta(minutes=90))
    assert tree(conn, i)["nap"] == ("sleep", "waiting")
    with running(at(db_url, T0 + dt.timedelta(minutes=89))) as r:
        time.sleep(0.5)  # a runner whose clock has not reached the wake time does nothing
        assert r.steps_run == 0
    assert instance(conn, i)[0] == "waiting"
    # a runner restarted after the wake time finds the sleep over
    with running(at(db_url, T0 + dt.timedelta(minutes=90))):
        wait_for(conn, [i])
    assert instance(conn, i)[0] == "completed"
    assert output(conn, i, "nap") == {"slept_ms": 5_400_000}
    audit = conn.execute(
        "SELECT actor, reason FROM orch8.instance_transitions WHERE instance_id = %s"
        " AND from_state = 'waiting'",
        (i,),
    ).fetchall()
    assert ("timer", "sleep nap: slept") in audit


@proves(("step", "delay"))
def test_a_step_delay_waits_before_the_first_attempt_only(conn, db_url):
    clock(conn, T0)
    seq = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "later",
                "handler": "transform",
                "params": {"value": 2},
                "delay": 600_000,
            }
        ],
    )
    i = start(conn, seq)
    state, next_fire_at, _ = instance(conn, i)
    assert (state, next_fire_at) == ("scheduled", T0 + dt.timedelta(minutes=10))
    with running(at(db_url, T0 + dt.timedelta(minutes=9, seconds=59))) as r:
        time.sleep(0.5)
        assert r.steps_run == 0
    with running(at(db_url, T0 + dt.timedelta(minutes=10))):
        wait_for(conn, [i])
    assert output(conn, i, "later") == {"result": 2}


BERLIN_OFFICE = {
    "timezone": "Europe/Berlin",
    "days": ["mon", "tue", "wed", "thu", "fri"],
    "start": "09:00",
    "end": "17:00",
}
MONDAY_9_BERLIN = dt.datetime(2031, 3, 3, 8, 0, tzinfo=dt.UTC)  # 09:00 CET


@proves(
    ("step", "send_window"),
    ("send_window", "timezone"),
    ("send_window", "days"),
    ("send_window", "start"),
    ("send_window", "end"),
)
def test_a_step_outside_its_send_window_waits_for_the_next_opening(conn, db_url):
    clock(conn, T0)  # a Saturday, 13:00 in Berlin
    seq = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "mail",
                "handler": "transform",
                "params": {"value": 3},
                "send_window": BERLIN_OFFICE,
            }
        ],
    )
    i = start(conn, seq)
    state, next_fire_at, _ = instance(conn, i)
    assert (state, next_fire_at) == ("scheduled", MONDAY_9_BERLIN)
    with running(at(db_url, MONDAY_9_BERLIN - dt.timedelta(seconds=1))) as r:
        time.sleep(0.5)
        assert r.steps_run == 0
    assert instance(conn, i)[0] == "scheduled"
    with running(at(db_url, MONDAY_9_BERLIN)):
        wait_for(conn, [i])
    assert output(conn, i, "mail") == {"result": 3}


def test_a_step_inside_its_send_window_is_due_at_once(conn):
    clock(conn, MONDAY_9_BERLIN + dt.timedelta(hours=2))
    seq = make_sequence(
        conn,
        [{"type": "step", "id": "mail", "handler": "noop", "send_window": BERLIN_OFFICE}],
    )
    i = start(conn, seq)
    assert instance(conn, i)[:2] == ("scheduled", MONDAY_9_BERLIN + dt.timedelta(hours=2))


def test_a_malformed_send_window_is_refused_with_its_paths(conn):
    window = {"timezone": "Europe/Atlantis", "days": ["mon", "someday"], "start": "9", "end": "8"}
    with pytest.raises(psycopg.Error) as info:
        make_sequence(conn, [{"type": "step", "id": "s", "handler": "noop", "send_window": window}])
    text = str(info.value)
    for field in ("timezone", "days", "start", "end"):
        assert f"$.blocks[0].send_window.{field}" in text, text


@handler("waits.busy")
def busy(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    CHAIN.append(ctx.block_id)
    raise NotApplied("the provider is busy: nothing was sent")


@proves(("step", "deadline"), ("step", "on_deadline_breach"))
def test_a_step_not_completed_by_its_deadline_fails_with_code_deadline(conn, db_url):
    clock(conn, T0)
    CHAIN.clear()
    seq = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "call",
                "handler": "waits.busy",
                "retry": {
                    "max_attempts": 5,
                    "initial_backoff": 7_200_000,
                    "max_backoff": 7_200_000,
                },
                "deadline": "30m",
                "on_deadline_breach": "fail",
            }
        ],
    )
    i = start(conn, seq)
    with running(at(db_url, T0)):
        give_up = time.monotonic() + 30
        while not CHAIN or instance(conn, i)[1] <= T0:
            assert time.monotonic() < give_up, instance(conn, i)
            time.sleep(0.05)
    state, retry_at, _ = instance(conn, i)
    assert state == "scheduled" and retry_at > T0 + dt.timedelta(minutes=30), retry_at
    assert CHAIN == ["call"]  # one attempt; the retry is at least an hour away
    with running(at(db_url, T0 + dt.timedelta(minutes=29))) as r:
        time.sleep(0.5)
        assert r.steps_run == 0
    assert instance(conn, i)[0] == "scheduled"
    with running(at(db_url, T0 + dt.timedelta(minutes=30))):
        wait_for(conn, [i])
    state, _, error = instance(conn, i)
    assert state == "failed" and "missed its deadline of 30m" in (error or ""), error
    code = conn.execute(
        "SELECT output ->> 'code' FROM orch8.block_outputs WHERE instance_id = %s"
        " AND sentinel = '__error__'",
        (i,),
    ).fetchone()[0]
    assert code == "deadline"
    assert CHAIN == ["call"]  # the retry never ran


def test_the_sleep_handler_is_refused_for_the_sleep_block(conn):
    with pytest.raises(psycopg.Error) as info:
        make_sequence(
            conn, [{"type": "step", "id": "s", "handler": "sleep", "params": {"duration_ms": 5}}]
        )
    assert "use a sleep block" in str(info.value)


# --- signals ----------------------------------------------------------------------------


def send(conn, i, name, payload=None, key=None, actor="ops") -> tuple[int, str, bool]:
    return conn.execute(
        "SELECT signal_id, outcome, deduplicated FROM orch8.send_signal(%s, %s, %s, %s, %s, %s)",
        (TENANT, i, name, Jsonb(payload or {}), actor, key),
    ).fetchone()


@proves(
    ("block_type", "wait_for_signal"),
    ("wait_for_signal", "type"),
    ("wait_for_signal", "id"),
    ("wait_for_signal", "signal"),
)
def test_a_signal_before_the_wait_is_kept_for_it_and_its_payload_read_later(conn, db_url):
    clock(conn, T0)
    seq = make_sequence(
        conn,
        [
            {"type": "sleep", "id": "nap", "duration": "1h"},
            {"type": "wait_for_signal", "id": "approval", "signal": "approved"},
            {
                "type": "step",
                "id": "use",
                "handler": "transform",
                "params": {"value": "{{ outputs.approval.payload.by }}"},
            },
        ],
    )
    i = start(conn, seq)
    assert send(conn, i, "approved", {"by": "ann"}, key="k-1") == (1, "pending", False)
    assert send(conn, i, "approved", {"by": "bob"}, key="k-1") == (1, "pending", True)
    with running(at(db_url, T0 + dt.timedelta(hours=1))):
        wait_for(conn, [i])
    assert output(conn, i, "use") == {"result": "ann"}
    assert output(conn, i, "approval")["payload"] == {"by": "ann"}
    rows = conn.execute(
        "SELECT outcome, consumed_by FROM orch8.instance_signals WHERE instance_id = %s", (i,)
    ).fetchall()
    assert rows == [("consumed", "approval")]


def test_a_signal_to_a_waiting_wait_is_consumed_at_once_and_the_instance_goes_on(conn, db_url):
    seq = make_sequence(
        conn,
        [
            {"type": "wait_for_signal", "id": "go", "signal": "go"},
            {"type": "step", "id": "done", "handler": "transform", "params": {"value": 3}},
        ],
    )
    i = start(conn, seq)
    assert instance(conn, i)[0] == "waiting"
    with running(db_url):
        _, outcome, _ = send(conn, i, "go", {"n": 1})
        assert outcome == "consumed"
        wait_for(conn, [i])
    with pytest.raises(psycopg.Error) as info:  # nothing will ever read it now
        send(conn, i, "go")
    assert info.value.sqlstate == "O8004"


def signal_twice(url: str, i: uuid.UUID, n: int, barrier: threading.Barrier, answers: list) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        for _round in range(2):
            barrier.wait(timeout=30)
            answers.append(send(c, i, "go", {"n": n}, key=f"key-{n}"))  # list.append is atomic


def test_concurrent_senders_consume_each_wait_exactly_once(db_url, conn):
    """Three waits for the same signal in parallel branches (a fourth keeps the instance
    open), eight senders released by a
    barrier, each with its own key, and a second round repeating every key: three signals
    consumed (one per wait), five kept pending, every repeat deduplicated. 15 rounds."""
    seq = make_sequence(
        conn,
        [
            {
                "type": "parallel",
                "id": "fan",
                "branches": [
                    *(
                        [{"type": "wait_for_signal", "id": f"w{b}", "signal": "go"}]
                        for b in range(3)
                    ),
                    [{"type": "wait_for_signal", "id": "hold", "signal": "hold"}],  # stays open
                ],
            }
        ],
    )
    senders = 8
    for _ in range(15):
        i = start(conn, seq)
        barrier = threading.Barrier(senders)
        answers: list[tuple[int, str, bool]] = []
        threads = [
            threading.Thread(target=signal_twice, args=(db_url, i, n, barrier, answers))
            for n in range(senders)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rows = conn.execute(
            "SELECT outcome, consumed_by FROM orch8.instance_signals WHERE instance_id = %s",
            (i,),
        ).fetchall()
        assert len(rows) == senders  # the repeats made no row
        consumed = sorted(p for o, p in rows if o == "consumed")
        assert consumed == ["fan#0/w0", "fan#1/w1", "fan#2/w2"]
        assert sum(1 for o, _ in rows if o == "pending") == senders - 3
        assert sum(1 for *_, dup in answers if dup) == senders
        assert instance(conn, i)[0] == "waiting"
        send(conn, i, "hold")
        assert instance(conn, i)[0] == "completed"


def test_update_context_reaches_the_next_block_of_a_running_chain(conn, db_url):
    CHAIN.clear()
    seq = make_sequence(
        conn,
        [
            {"type": "step", "id": "first", "handler": "waits.slow", "params": {"seconds": 1}},
            {"type": "step", "id": "second", "handler": "waits.slow", "params": {"seconds": 0}},
        ],
    )
    i = start(conn, seq, {"x": 1})
    with running(db_url):
        deadline = time.monotonic() + 10
        while "first" not in CHAIN and time.monotonic() < deadline:
            time.sleep(0.02)
        assert send(conn, i, "update_context", {"x": 42})[1] == "context_updated"
        wait_for(conn, [i])
    assert output(conn, i, "first") == {"data_x": 1}
    assert output(conn, i, "second") == {"data_x": 42}  # the same lease, a fresh context
    signal = conn.execute(
        "SELECT signal_type::text, actor, outcome FROM orch8.instance_signals"
        " WHERE instance_id = %s",
        (i,),
    ).fetchone()
    assert signal == ("update_context", "ops", "context_updated")


@proves(("wait_for_signal", "timeout"), ("wait_for_signal", "on_timeout"))
def test_a_wait_that_times_out_runs_its_on_timeout_or_fails_with_code_timeout(conn, db_url):
    clock(conn, T0)
    seq = make_sequence(
        conn,
        [
            {
                "type": "wait_for_signal",
                "id": "ack",
                "signal": "ack",
                "timeout": "2h",
                "on_timeout": [
                    {
                        "type": "step",
                        "id": "nudge",
                        "handler": "transform",
                        "params": {"value": "nudged"},
                    }
                ],
            },
            {
                "type": "try_catch",
                "id": "guard",
                "try_block": [
                    {"type": "wait_for_signal", "id": "ack2", "signal": "ack2", "timeout": 1000}
                ],
                "catch_block": [
                    {
                        "type": "step",
                        "id": "why",
                        "handler": "transform",
                        "params": {"expression": "error.code + ': ' + error.message"},
                    }
                ],
            },
        ],
    )
    i = start(conn, seq)
    with running(at(db_url, T0 + dt.timedelta(hours=2))):
        wait_for(conn, [i], states=("waiting",))
        deadline = time.monotonic() + 10
        while tree(conn, i).get("ack2", ("", ""))[1] != "waiting" and time.monotonic() < deadline:
            time.sleep(0.05)
    assert output(conn, i, "ack") == {"result": "nudged"}  # the wait ends as on_timeout did
    assert tree(conn, i)["ack.timeout/nudge"] == ("step", "completed")
    with running(at(db_url, T0 + dt.timedelta(hours=2, seconds=1))):
        wait_for(conn, [i])
    assert output(conn, i, "guard") == {
        "result": "timeout: wait_for_signal ack2 timed out after 1000 waiting for signal ack2"
    }


# --- people ------------------------------------------------------------------------------


def approval_sequence(conn, **extra) -> uuid.UUID:
    return make_sequence(
        conn,
        [
            {
                "type": "wait_for_input",
                "id": "approve",
                "prompt": "Refund {{ data.amount }} to {{ data.who }}?",
                "choices": ["approve", "reject"],
                **extra,
            },
            {
                "type": "step",
                "id": "decided",
                "handler": "transform",
                "params": {"value": "{{ outputs.approve.choice }}"},
            },
        ],
    )


def waiting_input(conn, i, timeout=10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = sqlapi.instances.waiting_nodes(conn, tenant_id=TENANT, instance_id=i)
        if rows and rows[0]["waiting_for"] == "input":
            return rows[0]
        time.sleep(0.05)
    raise AssertionError("the instance never waited for input")


@proves(
    ("block_type", "wait_for_input"),
    ("wait_for_input", "type"),
    ("wait_for_input", "id"),
    ("wait_for_input", "prompt"),
    ("wait_for_input", "choices"),
)
def test_an_operator_answers_and_who_and_when_are_in_the_audit_trail(conn, db_url):
    seq = approval_sequence(conn)
    i = start(conn, seq, {"amount": 40, "who": "Ann"})
    with running(db_url):
        row = waiting_input(conn, i)
        assert (row["prompt"], row["choices"]) == ("Refund 40 to Ann?", ["approve", "reject"])
        assert instance(conn, i)[0] == "waiting"
        with pytest.raises(InvalidInput):
            sqlapi.instances.answer_input(
                conn,
                tenant_id=TENANT,
                instance_id=i,
                path="approve",
                choice="maybe",
                comment=None,
                actor="ann@ops",
            )
        with pytest.raises(NotFound):
            sqlapi.instances.answer_input(
                conn,
                tenant_id=TENANT,
                instance_id=i,
                path="nope",
                choice="approve",
                comment=None,
                actor="ann@ops",
            )
        done = sqlapi.instances.answer_input(
            conn,
            tenant_id=TENANT,
            instance_id=i,
            path="approve",
            choice="approve",
            comment="ok by phone",
            actor="ann@ops",
        )
        assert done.output["answered_by"] == "ann@ops"
        with pytest.raises(InvalidTransition):  # answered once
            sqlapi.instances.answer_input(
                conn,
                tenant_id=TENANT,
                instance_id=i,
                path="approve",
                choice="reject",
                comment=None,
                actor="bob@ops",
            )
        wait_for(conn, [i])
    assert output(conn, i, "decided") == {"result": "approve"}
    audit = conn.execute(
        "SELECT actor, reason FROM orch8.instance_transitions WHERE instance_id = %s"
        " AND from_state = 'waiting'",
        (i,),
    ).fetchall()
    assert ("ann@ops", "answered approve: approve") in audit
    signal = conn.execute(
        "SELECT signal_type::text, actor, payload FROM orch8.instance_signals"
        " WHERE instance_id = %s",
        (i,),
    ).fetchone()
    assert signal == (
        "input",
        "ann@ops",
        {"path": "approve", "choice": "approve", "comment": "ok by phone"},
    )


@proves(("wait_for_input", "timeout"), ("wait_for_input", "on_timeout"))
def test_nobody_answers_and_the_on_timeout_escalates(conn, db_url):
    clock(conn, T0)
    seq = make_sequence(
        conn,
        [
            {
                "type": "wait_for_input",
                "id": "approve",
                "prompt": "ok?",
                "choices": ["yes", "no"],
                "timeout": "1d",
                "on_timeout": [
                    {
                        "type": "wait_for_input",
                        "id": "manager",
                        "prompt": "still ok?",
                        "choices": ["yes", "no"],
                    }
                ],
            }
        ],
    )
    i = start(conn, seq)
    with running(at(db_url, T0)):
        row = waiting_input(conn, i)
    assert row["until"] == T0 + dt.timedelta(days=1)
    with running(at(db_url, T0 + dt.timedelta(days=1))):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rows = sqlapi.instances.waiting_nodes(conn, tenant_id=TENANT, instance_id=i)
            if rows and rows[0]["path"] == "approve.timeout/manager":
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the escalation never waited")
        sqlapi.instances.answer_input(
            conn,
            tenant_id=TENANT,
            instance_id=i,
            path="approve.timeout/manager",
            choice="no",
            comment=None,
            actor="boss",
        )
        wait_for(conn, [i])
    assert output(conn, i, "approve")["choice"] == "no"  # the wait ends as its escalation did


class Client:
    def __init__(self, client: Any, keys: dict[str, str]) -> None:
        self.client, self.keys = client, keys

    def get(self, path: str, role: str = "operator") -> Any:
        return self.client.get(path, headers={"Authorization": f"Bearer {self.keys[role]}"})

    def post(self, path: str, body: dict[str, Any], role: str = "operator") -> Any:
        return self.client.post(
            path, json=body, headers={"Authorization": f"Bearer {self.keys[role]}"}
        )


@pytest.fixture
def api(db_url, conn):
    app = create_app(db_url, secret_key="waits-test-secret")
    app.testing = True
    keys = {
        role: apikeys.create(conn, TENANT, role, f"{role}-w")[1] for role in ("operator", "auditor")
    }
    yield Client(app.test_client(), keys)
    app.extensions["orch8.pool"].close()


def test_answering_over_rest_and_cli_needs_an_operator(conn, db_url, api):
    seq = approval_sequence(conn)
    a = start(conn, seq, {"amount": 1, "who": "A"})
    b = start(conn, seq, {"amount": 2, "who": "B"})
    with running(db_url):
        waiting_input(conn, a)
        waiting_input(conn, b)
        listed = api.get("/api/v1/waiting?waiting_for=input")
        assert listed.status_code == 200
        assert {(w["instance_id"], w["prompt"]) for w in listed.get_json()["items"]} == {
            (str(a), "Refund 1 to A?"),
            (str(b), "Refund 2 to B?"),
        }
        body = {"path": "approve", "choice": "reject", "comment": "no receipt"}
        refused = api.post(f"/api/v1/instances/{a}/answer", body, role="auditor")
        assert refused.status_code == 403
        bad = api.post(f"/api/v1/instances/{a}/answer", {**body, "choice": "x"})
        assert bad.status_code == 422 and bad.get_json()["field"] == "choice"
        ok = api.post(f"/api/v1/instances/{a}/answer", body)
        assert ok.status_code == 200, ok.text
        assert ok.get_json()["output"]["answered_by"].startswith("key:")
        again = api.post(f"/api/v1/instances/{a}/answer", body)
        assert again.status_code == 409
        env = orch8_env(ORCH8_DATABASE_URL=db_url)
        shown = run_orch8("instances", "waiting", "--for", "input", "--tenant", TENANT, env=env)
        assert shown.returncode == 0 and f"{b}" in shown.stdout and "Refund 2 to B?" in shown.stdout
        cli = run_orch8(
            "instances",
            "answer",
            str(b),
            "approve",
            "approve",
            "--actor",
            "cli-op",
            "--tenant",
            TENANT,
            env=env,
        )
        assert cli.returncode == 0, cli.stderr
        wrong = run_orch8(
            "instances", "answer", str(b), "approve", "approve", "--tenant", TENANT, env=env
        )
        assert wrong.returncode != 0 and len(wrong.stderr.strip().splitlines()) == 1
        wait_for(conn, [a, b])
    assert output(conn, a, "decided") == {"result": "reject"}
    assert output(conn, b, "decided") == {"result": "approve"}


# --- cancel ------------------------------------------------------------------------------


def test_cancel_withdraws_a_sleep_a_wait_and_a_child(conn):
    child = make_sequence(conn, [{"type": "sleep", "id": "zz", "duration": "1d"}], name="napchild")
    seq = make_sequence(
        conn,
        [
            {
                "type": "parallel",
                "id": "all",
                "branches": [
                    [{"type": "sleep", "id": "nap", "duration": "1d"}],
                    [{"type": "wait_for_signal", "id": "w", "signal": "go"}],
                    [{"type": "sub_sequence", "id": "kid", "sequence_name": "napchild"}],
                ],
            }
        ],
    )
    assert child
    i = start(conn, seq)
    # the sub_sequence is claimable: start its child the way a runner does
    row = next(
        r
        for r in sqlapi.steps.claim_work(conn, worker_id="w", batch=5, lease_seconds=30)
        if r.id == i
    )
    child_seq = sqlapi.sequences.get_sequence(
        conn, tenant_id=TENANT, namespace="default", name="napchild", version=None
    )
    sqlapi.steps.run_child(
        conn,
        tenant_id=TENANT,
        instance_id=i,
        lease_token=row.lease_token,
        path="all#2/kid",
        sequence_id=child_seq["id"],
        input_={},
    )
    kid = conn.execute(
        "SELECT child_instance_id FROM orch8.execution_nodes WHERE instance_id = %s"
        " AND path = 'all#2/kid'",
        (i,),
    ).fetchone()[0]
    assert instance(conn, kid)[0] == "waiting"
    conn.execute("SELECT orch8.cancel_instance(%s, %s, 'ops', 'not needed')", (TENANT, i))
    assert instance(conn, i)[0] == "cancelled"
    assert instance(conn, kid)[0] == "cancelled"
    nodes = tree(conn, i)
    assert {nodes[p][1] for p in ("all#0/nap", "all#1/w", "all#2/kid")} == {"cancelled"}
    assert (
        conn.execute(
            "SELECT count(*) FROM orch8.waiting_nodes WHERE instance_id IN (%s, %s)", (i, kid)
        ).fetchone()[0]
        == 0
    )
    assert conn.execute("SELECT count(*) FROM orch8.effect_receipts").fetchone()[0] == 0


# --- the cost of waiting -------------------------------------------------------------------


def runner_threads_and_rss(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/status") as f:
        status = f.read()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0])


def test_ten_thousand_sleeping_instances_cost_the_runner_nothing(conn, db_url, tmp_path):
    """A runner process, measured with nothing to do, then beside 10,000 instances that
    sleep for an hour, then restarted after 30 minutes, when the 100 that sleep for 30
    minutes wake and complete while the 10,000 sleep on."""
    clock(conn, T0)
    long = make_sequence(
        conn,
        [
            {"type": "sleep", "id": "nap", "duration": "1h"},
            {"type": "step", "id": "s", "handler": "noop"},
        ],
    )
    short = make_sequence(
        conn,
        [
            {"type": "sleep", "id": "nap", "duration": "30m"},
            {"type": "step", "id": "s", "handler": "noop"},
        ],
    )
    env = orch8_env(ORCH8_CONCURRENCY="8")

    def runner(url: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "orch8_py", "run"],
            env={**env, "ORCH8_DATABASE_URL": url},
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "runner.log", "ab"),
        )

    proc = runner(at(db_url, T0 + dt.timedelta(minutes=1)))
    try:
        time.sleep(3)  # started, idle
        threads_idle, rss_idle = runner_threads_and_rss(proc.pid)
        # Two bulk calls (orch8.create_instances, at most the limit create_batch each): the
        # same rows as 10,100 create_instance calls, which are a batch of one each, in ~6 s
        # instead of ~130 s (one create_instance per row in one statement slows as the
        # tables grow, its plans cached while they were empty).
        batch = "(SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, %s))"
        made = conn.execute(
            f"SELECT count(*) FROM orch8.create_instances(%s, %s, {batch})", (TENANT, long, 10_000)
        ).fetchone()[0]
        assert made == 10_000
        woken = [
            r[0]
            for r in conn.execute(
                f"SELECT id FROM orch8.create_instances(%s, %s, {batch})", (TENANT, short, 100)
            ).fetchall()
        ]
        assert len(woken) == 100
        time.sleep(3)  # ticks with 10,100 sleeping instances
        threads_busy, rss_busy = runner_threads_and_rss(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(
        f"\nrunner idle: {threads_idle} threads, {rss_idle} kB; beside 10,100 sleeping "
        f"instances: {threads_busy} threads, {rss_busy} kB"
    )
    assert threads_busy == threads_idle
    assert rss_busy - rss_idle < 4096  # kB: nothing per sleeping instance
    counts = dict(
        conn.execute(
            "SELECT state::text, count(*) FROM orch8.task_instances GROUP BY state"
        ).fetchall()
    )
    assert counts == {"waiting": 10_100}
    assert (
        conn.execute(
            "SELECT count(*) FROM orch8.execution_nodes WHERE lease_token IS NOT NULL"
        ).fetchone()[0]
        == 0
    )
    proc = runner(at(db_url, T0 + dt.timedelta(minutes=30)))
    try:
        wait_for(conn, woken, timeout=60)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    counts = dict(
        conn.execute(
            "SELECT state::text, count(*) FROM orch8.task_instances GROUP BY state"
        ).fetchall()
    )
    assert counts == {"waiting": 10_000, "completed": 100}
    assert os.path.getsize(tmp_path / "runner.log") >= 0
    json.dumps(counts)


# --- the console ---------------------------------------------------------------------------


def test_the_console_lists_what_waits_and_an_operator_answers_there(conn, db_url):
    from tests.test_console import csrf_of, login

    clock(conn, T0)
    nap = make_sequence(conn, [{"type": "sleep", "id": "nap", "duration": "1d"}])
    sleeping = start(conn, nap)
    asking = start(conn, approval_sequence(conn), {"amount": 7, "who": "Cy"})
    clock(conn, None)
    app = create_app(db_url, secret_key="waits-console-secret")
    app.testing = True
    keys = {r: apikeys.create(conn, TENANT, r, f"{r}-c")[1] for r in ("operator", "auditor")}
    try:
        with running(at(db_url, T0)):
            waiting_input(conn, asking)
        operator = app.test_client()
        assert login(operator, keys["operator"]).status_code == 302
        html = operator.get("/console/waiting").text
        assert f'data-instance="{sleeping}"' in html and "Sleeps" in html
        assert "Refund 7 to Cy?" in html and 'value="approve"' in html
        assert "2031-03-02" in html  # the sleep's end, until when
        only = operator.get("/console/waiting?for=input").text
        assert f'data-instance="{sleeping}"' not in only and "Refund 7 to Cy?" in only
        assert operator.get("/console/waiting?for=nonsense").status_code == 400
        auditor = app.test_client()
        assert login(auditor, keys["auditor"]).status_code == 302
        seen = auditor.get("/console/waiting?for=input").text
        assert "Refund 7 to Cy?" in seen and "answer-form" not in seen
        forged = auditor.post(
            f"/console/instances/{asking}/answer",
            data={"csrf_token": csrf_of(seen), "path": "approve", "choice": "approve"},
        )
        assert forged.status_code == 403
        answered = operator.post(
            f"/console/instances/{asking}/answer",
            data={
                "csrf_token": csrf_of(only),
                "path": "approve",
                "choice": "reject",
                "comment": "no receipt",
            },
            follow_redirects=True,
        )
        assert answered.status_code == 200 and "Answered approve: reject" in answered.text
        assert output(conn, asking, "approve")["answered_by"] == "key:operator-c"
        again = operator.post(
            f"/console/instances/{asking}/answer",
            data={"csrf_token": csrf_of(only), "path": "approve", "choice": "approve"},
            follow_redirects=True,
        )
        assert "Answer refused" in again.text
    finally:
        app.extensions["orch8.pool"].close()


@proves(("definition", "sla"), ("definition", "on_sla_breach"))
def test_an_instance_sla_fails_it_or_only_notifies(conn, db_url):
    clock(conn, T0)
    conn.execute(
        "SELECT orch8.create_webhook_subscription(%s, 'https://hooks.example/sla', 's',"
        " ARRAY['instance.sla_breached'])",
        (TENANT,),
    )
    nap = {"type": "sleep", "id": "nap", "duration": "2h"}
    after = {"type": "step", "id": "after", "handler": "transform", "params": {"value": 1}}
    strict = sqlapi.sequences.create_sequence(
        conn,
        tenant_id=TENANT,
        namespace="default",
        name="strict",
        definition={
            "sla": "1h",
            "blocks": [nap, after],
            "on_failure": [
                {
                    "type": "step",
                    "id": "page",
                    "handler": "transform",
                    "params": {"expression": "error.code + ': ' + error.message"},
                }
            ],
        },
    )["id"]
    gentle = sqlapi.sequences.create_sequence(
        conn,
        tenant_id=TENANT,
        namespace="default",
        name="gentle",
        definition={"sla": "1h", "on_sla_breach": "notify", "blocks": [nap, after]},
    )["id"]
    a, b = start(conn, strict), start(conn, gentle)
    with running(at(db_url, T0 + dt.timedelta(minutes=59, seconds=59)), webhooks=False):
        time.sleep(0.5)
    assert [instance(conn, i)[0] for i in (a, b)] == ["waiting", "waiting"]
    with running(at(db_url, T0 + dt.timedelta(hours=1)), webhooks=False):
        states = wait_for(conn, [a], ("failed",))
        for _ in range(100):  # the same sweep marks b; it goes on waiting
            breached = conn.execute(
                "SELECT sla_breached_at FROM orch8.task_instances WHERE id = %s", (b,)
            ).fetchone()[0]
            if breached is not None:
                break
            time.sleep(0.05)
    assert states[a] == ("failed", "the instance missed its sla of 1h")
    assert output(conn, a, ".on_failure[0]/page") == {
        "result": "sla: the instance missed its sla of 1h"
    }
    assert tree(conn, a)["nap"] == ("sleep", "cancelled")  # the sleep was withdrawn
    assert (breached, instance(conn, b)[0]) == (T0 + dt.timedelta(hours=1), "waiting")
    with running(at(db_url, T0 + dt.timedelta(hours=2)), webhooks=False):
        wait_for(conn, [b])
    assert output(conn, b, "after") == {"result": 1}  # notify: it went on to the end
    events = conn.execute(
        "SELECT instance_id, event FROM orch8.webhook_outbox ORDER BY id"
    ).fetchall()
    assert sorted(events) == sorted([(a, "instance.sla_breached"), (b, "instance.sla_breached")])
