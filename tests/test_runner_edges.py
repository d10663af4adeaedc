"""Edges of the runner: heartbeats under a long step, the SIGTERM grace period, arbitrary
handler exceptions, StaleLease from ctx.state, the default step timeout, and the
configuration defaults. Real PostgreSQL, real HTTP, real `orch8 run` processes."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from orch8_py import config
from orch8_py import runner as runner_module
from orch8_py.cli import engine
from orch8_py.errors import ConfigError, StaleLease
from orch8_py.handlers import handler
from tests.runner_helpers import (
    TENANT,
    make_sequence,
    running,
    spawn_runner,
    start,
    wait_for,
    wait_until,
)

FAST_LEASE = {"ORCH8_LEASE_SECONDS": "2", "ORCH8_HEARTBEAT_SECONDS": "0.5"}


# --- helpers ----------------------------------------------------------------------------


def wait_exit(proc: subprocess.Popen, timeout: float) -> int | None:
    """The exit code, or None when the process is still running after ``timeout``."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def reap(proc: subprocess.Popen | None) -> None:
    """Stop a runner this test started (SIGTERM, then SIGKILL)."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    if wait_exit(proc, 10) is None:
        proc.kill()
        proc.wait(timeout=10)


def log_text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def slow_http_sequence(conn, url: str, **block):
    return make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "charge",
                "handler": "http_request",
                "params": {"method": "POST", "url": url, "timeout_ms": 20000},
                "retry": {"max_attempts": 1},
                **block,
            }
        ],
    )


def receipts(conn, instance) -> list[tuple]:
    return conn.execute(
        "SELECT attempt, state::text, provider_receipt_id, error FROM orch8.effect_receipts"
        " WHERE instance_id = %s ORDER BY attempt",
        (instance,),
    ).fetchall()


def lease_sweeps(conn, instance) -> int:
    return conn.execute(
        "SELECT count(*) FROM orch8.instance_transitions"
        " WHERE instance_id = %s AND actor = 'lease-sweep'",
        (instance,),
    ).fetchone()[0]


# --- custom handlers --------------------------------------------------------------------

FLAKY_CALLS: list[tuple] = []


@handler("test.edges.flaky")
def flaky(params, ctx):
    """Raises a plain RuntimeError on attempt 0, succeeds afterwards."""
    FLAKY_CALLS.append((ctx.instance_id, ctx.attempt, ctx.effect_id))
    if ctx.attempt == 0:
        raise RuntimeError("socket went away")
    return {"receipt_id": f"flaky-{ctx.attempt}"}


TIMEOUTS: dict[str, float] = {}


@handler("test.edges.timeout")
def record_timeout(params, ctx):
    TIMEOUTS[str(ctx.instance_id)] = ctx.timeout
    return {"timeout": ctx.timeout}


STEAL: dict = {}  # "url": the test database; filled in by the handler with what happened


@handler("test.edges.steal")
def steal_then_set(params, ctx):
    """Another worker takes the lease (expired, swept, re-claimed in one transaction, so the
    runner under test cannot claim it back in between), then the handler writes state."""
    with psycopg.connect(STEAL["url"]) as c:  # one transaction, committed on exit
        c.execute(
            "UPDATE orch8.execution_nodes SET lease_expires_at = orch8.now() - interval '1 second'"
            " WHERE tenant_id = %s AND instance_id = %s AND lease_token IS NOT NULL",
            (ctx.tenant_id, ctx.instance_id),
        )
        STEAL["claimed"] = [
            r[0]
            for r in c.execute(
                "SELECT instance_id AS id"
                " FROM orch8.claim_due_nodes('thief', 1, interval '10 minutes')"
            ).fetchall()
        ]
    try:
        ctx.state.set("written", {"by": "the runner that lost its lease"})
    except StaleLease as exc:
        STEAL["raised"] = exc
        raise
    STEAL["raised"] = None
    return {"wrote": True}


# --- 1. heartbeats keep a long step's lease ---------------------------------------------


def test_heartbeats_keep_the_lease_of_a_step_longer_than_the_lease(
    db_url, conn, provider, tmp_path
):
    provider.reply("/slow", json={"receipt_id": "slow-1"}, delay=5.0)
    seq = slow_http_sequence(conn, provider.url + "/slow")
    instance = start(conn, seq, {})
    a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
    a = spawn_runner(db_url, a_log, **FAST_LEASE)
    b = None
    expiries = set()

    def lease():
        return conn.execute(
            "SELECT state::text, lease_owner, lease_expires_at FROM orch8.instance_overview"
            " WHERE id = %s",
            (instance,),
        ).fetchone()

    try:
        wait_until(lambda: provider.requests_to("/slow"), 30, "the request: " + log_text(a_log))
        state, owner, expires = lease()
        assert state == "running", state
        expiries.add(expires)
        # a second runner polls for work all the time the step runs: had A stopped
        # heartbeating, the 2 s lease would expire and B would sweep and take it over
        b = spawn_runner(db_url, b_log, **FAST_LEASE)
        wait_until(lambda: "event=runner.start" in log_text(b_log), 30, "runner B to start")

        def finished():
            s, o, e = lease()
            if e is not None:
                expiries.add(e)
            assert s in ("running", "completed"), (s, log_text(a_log), log_text(b_log))
            if s == "running":
                assert o == owner, "the instance changed hands"
            return s == "completed"

        # B is up while the step is still in flight: the two runners overlap
        assert lease()[0] == "running", "the step finished before runner B was up"
        wait_until(finished, 30, "the instance to complete")
    finally:
        reap(b)
        reap(a)
    assert wait_for(conn, [instance], timeout=1)[instance] == ("completed", None)
    assert receipts(conn, instance) == [(0, "committed", "slow-1", None)]
    assert len(provider.requests_to("/slow")) == 1
    assert lease_sweeps(conn, instance) == 0, "the lease expired and was reclaimed"
    claims = conn.execute(
        "SELECT count(*) FROM orch8.instance_transitions"
        " WHERE instance_id = %s AND to_state = 'running'",
        (instance,),
    ).fetchone()[0]
    assert claims == 1
    # the step took 5 s against a 2 s lease: the expiry was pushed forward repeatedly
    assert len(expiries) >= 3, sorted(expiries)
    assert "lease_lost" not in log_text(a_log) + log_text(b_log)


# --- 2. the SIGTERM grace period --------------------------------------------------------


def grace_runner(db_url, conn, provider, tmp_path):
    """A runner with a 1 s grace period, busy with a step the provider answers after 8 s,
    and SIGTERM sent to it; returns (instance, process, log path, time of the signal)."""
    provider.reply("/slow", json={"receipt_id": "late"}, delay=8.0)
    seq = slow_http_sequence(conn, provider.url + "/slow", timeout=30000)
    instance = start(conn, seq, {})
    a_log = tmp_path / "a.log"
    a = spawn_runner(db_url, a_log, ORCH8_GRACE_SECONDS="1", **FAST_LEASE)
    try:
        wait_until(lambda: provider.requests_to("/slow"), 30, "the request: " + log_text(a_log))
    except BaseException:
        a.kill()
        a.wait(timeout=10)
        raise
    signalled = time.monotonic()
    a.send_signal(signal.SIGTERM)
    return instance, a, a_log, signalled


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def test_sigterm_with_a_step_past_the_grace_period_exits_promptly_with_0(
    db_url, conn, provider, tmp_path
):
    """README: ORCH8_GRACE_SECONDS is "on SIGTERM, how long in-flight steps may finish";
    the drain log says "their leases will expire". With a 1 s grace and a step needing 8 s,
    the process should be gone within about a second plus shutdown overhead, exit code 0
    (cli.cmd_run returns 0)."""
    _instance, a, a_log, signalled = grace_runner(db_url, conn, provider, tmp_path)
    try:
        code = wait_exit(a, 5.0)  # grace 1 s + overhead; the provider answers after 8 s
        elapsed = time.monotonic() - signalled
        assert "event=runner.drain_timeout still_running=1" in log_text(a_log)
        assert code is not None, f"still running {elapsed:.1f}s after SIGTERM"
        assert code == 0, log_text(a_log)
        assert elapsed < 5.0
        assert "still running after the grace period" in log_text(a_log)
    finally:
        kill(a)


def test_after_sigterm_past_the_grace_period_the_next_runner_sends_nothing_again(
    db_url, conn, provider, tmp_path
):
    """The step outlived the grace period: once the lease expires a second runner takes the
    instance over (a lease sweep), finds the receipt dispatched, marks it unknown and fails
    the instance with EffectBlocked. The provider saw one request."""
    instance, a, a_log, _signalled = grace_runner(db_url, conn, provider, tmp_path)
    b_log = tmp_path / "b.log"
    b = None
    try:
        wait_until(
            lambda: "event=runner.drain_timeout" in log_text(a_log), 15, "the grace to run out"
        )
        b = spawn_runner(db_url, b_log, **FAST_LEASE)
        state, error = wait_for(conn, [instance], timeout=30)[instance]
    finally:
        reap(b)
        kill(a)  # it exits by itself (the test above); a failure must not leak it
    assert state == "failed" and error.startswith("EffectBlocked"), (error, log_text(b_log))
    assert [r[:2] for r in receipts(conn, instance)] == [(0, "unknown")]
    assert lease_sweeps(conn, instance) == 1  # taken over after the lease expired
    assert len(provider.requests_to("/slow")) == 1


# --- 3. an arbitrary exception is a retryable error ----------------------------------------


def test_an_arbitrary_exception_is_a_retryable_error_named_by_its_type(db_url, conn):
    seq = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "charge",
                "handler": "test.edges.flaky",
                "retry": {
                    "max_attempts": 2,
                    "initial_backoff": 10,
                    "max_backoff": 20,
                    "on_ambiguous": "new_attempt",  # resend an ambiguous outcome
                },
            }
        ],
    )
    instance = start(conn, seq, {})
    with running(db_url):
        assert wait_for(conn, [instance], timeout=30)[instance] == ("completed", None)
    got = receipts(conn, instance)
    assert [r[:3] for r in got] == [(0, "unknown", None), (1, "committed", "flaky-1")]
    assert got[0][3] == "RuntimeError: socket went away"
    [(output, retryable)] = conn.execute(
        "SELECT output, retryable FROM orch8.block_outputs"
        " WHERE instance_id = %s AND sentinel = '__retry__'",
        (instance,),
    ).fetchall()
    assert retryable is True
    assert output["error"].startswith("RuntimeError:"), output
    assert [c[1] for c in FLAKY_CALLS if c[0] == instance] == [0, 1]  # attempt 1 ran


# --- 4. StaleLease from ctx.state.set stops the instance quietly ----------------------------


def test_stale_lease_from_state_set_stops_that_instance_quietly(db_url, conn, caplog):
    caplog.set_level(logging.INFO, logger="orch8.runner")
    STEAL.clear()
    STEAL["url"] = db_url
    seq = make_sequence(conn, [{"type": "step", "id": "steal", "handler": "test.edges.steal"}])
    other_seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    instance = start(conn, seq, {})
    with running(db_url) as r:
        wait_until(
            lambda: any("event=instance.lease_lost" in m for m in caplog.messages),
            30,
            "the runner to log lease_lost",
        )
        # the runner is still running and takes further work
        other = start(conn, other_seq, {})
        assert wait_for(conn, [other], timeout=30)[other] == ("completed", None)
        wait_until(lambda: not r.inflight, 10, "the stolen instance to leave the runner")
    assert STEAL["claimed"] == [instance]  # the thief really took this instance
    assert isinstance(STEAL["raised"], StaleLease), STEAL
    written = conn.execute(
        "SELECT count(*) FROM orch8.instance_kv_state WHERE instance_id = %s", (instance,)
    ).fetchone()[0]
    assert written == 0
    row = conn.execute(
        "SELECT state::text, lease_owner, error FROM orch8.instance_overview WHERE id = %s",
        (instance,),
    ).fetchone()
    assert row == ("running", "thief", None)  # the runner did not touch it afterwards
    sentinels = conn.execute(
        "SELECT sentinel FROM orch8.block_outputs WHERE instance_id = %s ORDER BY seq",
        (instance,),
    ).fetchall()
    assert sentinels == [("__in_progress__",)]
    [message] = [m for m in caplog.messages if "event=instance.lease_lost" in m]
    assert f"instance={instance}" in message
    assert not [m for m in caplog.messages if "runner_error" in m], caplog.messages
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.messages


# --- 5. the default step timeout ---------------------------------------------------------


def test_the_step_timeout_defaults_to_300_seconds_and_is_given_in_milliseconds(db_url, conn):
    default = make_sequence(conn, [{"type": "step", "id": "t", "handler": "test.edges.timeout"}])
    explicit = make_sequence(
        conn, [{"type": "step", "id": "t", "handler": "test.edges.timeout", "timeout": 1500}]
    )
    a, b = start(conn, default, {}), start(conn, explicit, {})
    with running(db_url):
        assert set(wait_for(conn, [a, b], timeout=30).values()) == {("completed", None)}
    assert TIMEOUTS[str(a)] == 300.0
    assert TIMEOUTS[str(b)] == 1.5
    assert runner_module.DEFAULT_STEP_TIMEOUT == 300.0


# --- 6. configuration ---------------------------------------------------------------------


@pytest.fixture
def empty_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("ORCH8_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_config_defaults_with_an_empty_environment(empty_env):
    s = config.load()
    assert s.database_url is None and s.embedded
    assert (s.host, s.port) == ("127.0.0.1", 8080)
    assert s.tick_interval == 0.1
    assert s.concurrency == 128 and isinstance(s.concurrency, int)
    assert s.group_commit is True
    assert (s.lease, s.heartbeat, s.grace) == (30.0, 10.0, 30.0)
    # the runner's own defaults (used when it is built without config) agree
    r = runner_module.Settings()
    assert r.group_commit is True
    assert (r.concurrency, r.lease, r.heartbeat, r.poll_interval, r.grace) == (
        128,
        30.0,
        10.0,
        0.1,
        30.0,
    )


@pytest.mark.parametrize(
    ("lease", "heartbeat"), [(None, "10"), (None, "30"), ("2", "2"), ("2", "5")]
)
def test_a_heartbeat_not_shorter_than_the_lease_is_refused(empty_env, lease, heartbeat):
    if lease is not None:
        empty_env.setenv("ORCH8_LEASE_SECONDS", lease)
    empty_env.setenv("ORCH8_HEARTBEAT_SECONDS", heartbeat)
    if lease is None and heartbeat == "10":  # the defaults themselves: 10 < 30 is fine
        assert config.load().heartbeat == 10.0
        return
    with pytest.raises(ConfigError) as info:
        config.load()
    message = str(info.value)
    assert "\n" not in message
    assert "ORCH8_HEARTBEAT_SECONDS" in message and "ORCH8_LEASE_SECONDS" in message
    assert "shorter" in message


@pytest.mark.parametrize(("raw", "on"), [("off", False), ("0", False), ("ON", True), ("1", True)])
def test_group_commit_is_switched_by_the_environment(empty_env, raw, on):
    empty_env.setenv("ORCH8_GROUP_COMMIT", raw)
    assert config.load().group_commit is on
    assert engine.make_runner("postgresql://x/y", config.load()).settings.group_commit is on


def test_a_group_commit_switch_that_is_neither_is_refused(empty_env):
    empty_env.setenv("ORCH8_GROUP_COMMIT", "sometimes")
    with pytest.raises(ConfigError, match="ORCH8_GROUP_COMMIT='sometimes' must be on or off"):
        config.load()


def test_orch8_run_refuses_a_heartbeat_as_long_as_the_lease_in_one_line(db_url):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH8_")}
    env.update(ORCH8_DATABASE_URL=db_url, ORCH8_LEASE_SECONDS="5", ORCH8_HEARTBEAT_SECONDS="5")
    done = subprocess.run(
        [sys.executable, "-m", "orch8_py", "run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("orch8: error: ORCH8_HEARTBEAT_SECONDS (5) must be shorter"), lines
    assert "ORCH8_LEASE_SECONDS (5)" in lines[0]
    assert "runner started" not in done.stdout


# --- 6. a heartbeat racing finished steps reports no lost lease -----------------------------


def test_a_heartbeat_racing_finishing_steps_reports_no_lost_lease(db_url, conn, caplog):
    """A step's finish can commit (its lease token gone from the database) between the
    heartbeat reading the runner's tokens and the worker dropping the token: the lease
    was not lost, it ended. Only a token missing from two heartbeats in a row, still in
    flight, is reported. A heartbeat every 10 ms over 1,500 two-step instances makes the
    race frequent. The heartbeat never deadlocks with a batch either: a deadlock showed
    as the database going away (heartbeat_failed, db_down), four to eight times a run,
    while its second pass waited for a node holding the first pass's locks."""
    caplog.set_level(logging.INFO, logger="orch8.runner")
    seq = make_sequence(conn, [{"type": "step", "id": s, "handler": "noop"} for s in "ab"])
    ids = [
        r[0]
        for r in conn.execute(
            "SELECT id FROM orch8.create_instances(%s, %s, %s)",
            (TENANT, seq, Jsonb([{} for _ in range(1500)])),
        )
    ]
    with running(db_url, heartbeat=0.01, concurrency=32):
        done = wait_for(conn, ids, timeout=120)
    assert {s for s, _ in done.values()} == {"completed"}
    assert [m for m in caplog.messages if "lease_lost" in m] == []
    assert [m for m in caplog.messages if "heartbeat_failed" in m or "db_down" in m] == []


@handler("test.edges.stolen_then_slow")
def stolen_then_slow(params, ctx):
    """Another worker takes the lease, then the handler keeps running for a while: the
    runner's heartbeats find the token gone while it is still in flight."""
    with psycopg.connect(STEAL["url"]) as c:
        c.execute(
            "UPDATE orch8.execution_nodes SET lease_expires_at = orch8.now() - interval '1 second'"
            " WHERE tenant_id = %s AND instance_id = %s AND lease_token IS NOT NULL",
            (ctx.tenant_id, ctx.instance_id),
        )
        c.execute("SELECT * FROM orch8.claim_due_nodes('thief', 1, interval '10 minutes')")
    time.sleep(2.5)  # longer than runner.LOST_AFTER: a token is lost after a second missing
    return {}


def test_a_lease_really_lost_is_still_reported_by_the_heartbeat(db_url, conn, caplog):
    caplog.set_level(logging.INFO, logger="orch8.runner")
    STEAL.clear()
    STEAL["url"] = db_url
    seq = make_sequence(
        conn, [{"type": "step", "id": "a", "handler": "test.edges.stolen_then_slow"}]
    )
    instance = start(conn, seq, {})
    with running(db_url, heartbeat=0.05):
        wait_until(
            lambda: any("event=runner.lease_lost" in m for m in caplog.messages),
            30,
            "the heartbeat to report the stolen lease",
        )
    owner = conn.execute(
        "SELECT lease_owner FROM orch8.execution_nodes WHERE instance_id = %s"
        " AND lease_token IS NOT NULL",
        (instance,),
    ).fetchone()
    assert owner == ("thief",)
