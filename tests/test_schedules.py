"""Cron schedules end to end on a real PostgreSQL: the REST API and the CLI round trip,
two sessions racing fire_due_schedules across many fire times (orch8.fake_now moved,
never slept for), two real `orch8 run` processes firing the same due schedules, and the
console page. The cron arithmetic, DST and each policy are proven in
sql_tests/30_schedules.sql."""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid

import psycopg
import pytest
from psycopg import conninfo
from psycopg.types.json import Jsonb

from orch8_py import apikeys, sqlapi
from orch8_py.cli import main as cli_main
from tests.runner_helpers import spawn_runner
from tests.test_api import Api, ok, problem
from web import create_app

ACME, OTHER = "acme", "other"
T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
NOOP = {"blocks": [{"id": "a", "type": "step", "handler": "noop"}]}


def fake_now(conn, at: dt.datetime) -> None:
    conn.execute("SELECT set_config('orch8.fake_now', %s, false)", (at.isoformat(),))


def make_job(conn, tenant=ACME, name="job"):
    conn.execute("SELECT orch8.create_sequence(%s, 'default', %s, %s)", (tenant, name, Jsonb(NOOP)))


def started(conn, schedule_id):
    """(fire time, instance) of every started fire, and the instances by their keys."""
    fires = conn.execute(
        "SELECT fire_at, instance_id FROM orch8.schedule_fires WHERE schedule_id = %s"
        " AND outcome IN ('started', 'cancelled_previous') ORDER BY fire_at",
        (schedule_id,),
    ).fetchall()
    keys = conn.execute(
        "SELECT idempotency_key, count(*) FROM orch8.task_instances"
        " WHERE idempotency_key LIKE %s GROUP BY 1",
        (f"orch8:schedule:{schedule_id}:%",),
    ).fetchall()
    return fires, dict(keys)


# --- REST ------------------------------------------------------------------------------------


@pytest.fixture
def app(db_url):
    app = create_app(db_url, secret_key="schedules-test")
    app.testing = True
    yield app
    app.extensions["orch8.pool"].close()


@pytest.fixture
def as_role(app, conn):
    made = {r: apikeys.create(conn, ACME, r, f"{r}-alice")[1] for r in ("operator", "auditor")}
    made["other"] = apikeys.create(conn, OTHER, "operator", "bob")[1]
    return lambda role: Api(app.test_client(), made[role])


def test_rest_create_list_get_pause_resume_end_and_fires(conn, as_role):
    api = as_role("operator")
    make_job(conn)
    body = {
        "name": "hourly",
        "sequence_name": "job",
        "cron": "0 * * * *",
        "timezone": "Europe/Berlin",
        "data": {"report": "sales"},
        "overlap_policy": "buffer_one",
    }
    made = ok(api.post("/schedules", body), 201)
    assert made["state"] == "active" and made["overlap_policy"] == "buffer_one"
    assert made["created_by"] == "key:operator-alice"
    assert made["next_fire_at"] is not None and made["last_fire_at"] is None
    sid = made["id"]

    # bad input: 422 with the field; a name in use too; the engine's word on cron
    bad = problem(api.post("/schedules", {**body, "name": "x", "cron": "0 0 30 2 *"}), 422)
    assert bad["field"] == "cron" and bad["problems"] == [
        {"path": "cron", "message": "no date matches: day-of-month 30 never falls in month 2"}
    ]
    assert problem(api.post("/schedules", {**body, "timezone": "Mars/X"}), 422)["field"] == (
        "timezone"
    )
    assert problem(api.post("/schedules", body), 422)["field"] == "name"
    assert (
        problem(api.post("/schedules", {**body, "name": "y", "sequence_name": "nope"}), 422)[
            "field"
        ]
        == "sequence_name"
    )
    problem(api.post("/schedules", {**body, "overlap_policy": "sometimes"}), 422)

    page = ok(api.get("/schedules"))
    assert [s["name"] for s in page["items"]] == ["hourly"] and page["next_cursor"] is None
    assert ok(api.get(f"/schedules/{sid}"))["data"] == {"report": "sales"}

    # a fire, as a runner would make it: the fires list shows it
    fake_now(conn, dt.datetime.fromisoformat(made["next_fire_at"]))
    assert [f["outcome"] for f in sqlapi.schedules.fire_due_schedules(conn, limit=10, actor="t")]
    fires = ok(api.get(f"/schedules/{sid}/fires"))["items"]
    assert [(f["outcome"], f["fire_at"]) for f in fires] == [("started", made["next_fire_at"])]
    assert ok(api.get(f"/schedules/{sid}"))["last_instance_state"] == "scheduled"

    moved = ok(api.post(f"/schedules/{sid}/pause"))
    assert (moved["outcome"], moved["state"], moved["next_fire_at"]) == ("paused", "paused", None)
    assert ok(api.post(f"/schedules/{sid}/pause"))["outcome"] == "unchanged"
    assert ok(api.post(f"/schedules/{sid}/resume"))["state"] == "active"
    assert ok(api.post(f"/schedules/{sid}/end"))["state"] == "ended"
    refused = problem(api.post(f"/schedules/{sid}/pause"), 409)
    assert refused["current_state"] == "ended"
    assert ok(api.get(f"/schedules/{sid}"))["state"] == "ended"  # it stays readable
    assert ok(api.get("/schedules?state=active"))["items"] == []

    # roles and tenants
    auditor = as_role("auditor")
    assert ok(auditor.get(f"/schedules/{sid}"))["id"] == sid
    problem(auditor.post("/schedules", {**body, "name": "z"}), 403)
    problem(auditor.post(f"/schedules/{sid}/resume"), 403)
    other = as_role("other")
    problem(other.get(f"/schedules/{sid}"), 404)
    problem(other.post(f"/schedules/{sid}/end"), 404)
    assert ok(other.get("/schedules"))["items"] == []
    problem(api.get(f"/schedules/{uuid.uuid4()}"), 404)


def test_rest_pages_by_name(conn, as_role):
    api = as_role("operator")
    make_job(conn)
    for name in ("c", "a", "b"):
        ok(api.post("/schedules", {"name": name, "sequence_name": "job", "cron": "0 0 * * *"}), 201)
    first = ok(api.get("/schedules?limit=2"))
    assert [s["name"] for s in first["items"]] == ["a", "b"]
    rest = ok(api.get(f"/schedules?limit=2&cursor={first['next_cursor']}"))
    assert [s["name"] for s in rest["items"]] == ["c"] and rest["next_cursor"] is None


# --- CLI -------------------------------------------------------------------------------------


def cli(monkeypatch, capsys, db_url, *args):
    monkeypatch.setenv("ORCH8_DATABASE_URL", db_url)
    monkeypatch.setenv("USER", "tester")
    code = cli_main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_create_list_show_pause_resume_delete(db_url, conn, monkeypatch, capsys):
    make_job(conn, tenant="default")
    code, out, err = cli(
        monkeypatch, capsys, db_url, "schedules", "create", "nightly", "--sequence", "job",
        "--cron", "30 2 * * *", "--timezone", "America/New_York", "--data", '{"x": 1}',
        "--overlap", "cancel_previous", "--json",
    )  # fmt: skip
    assert code == 0, err
    made = json.loads(out)
    assert made["cron"] == "30 2 * * *" and made["created_by"] == "cli:tester"

    code, out, _ = cli(monkeypatch, capsys, db_url, "schedules", "list")
    assert code == 0 and "nightly" in out and "cancel_previous" in out
    code, out, _ = cli(monkeypatch, capsys, db_url, "schedules", "show", "nightly")
    assert code == 0 and "30 2 * * * (America/New_York)" in out and "no fires yet" in out
    code, out, _ = cli(monkeypatch, capsys, db_url, "schedules", "pause", made["id"])
    assert code == 0 and out.startswith("paused schedule nightly")
    code, out, _ = cli(monkeypatch, capsys, db_url, "schedules", "resume", "nightly")
    assert code == 0 and "not caught up" in out
    code, out, _ = cli(monkeypatch, capsys, db_url, "schedules", "delete", "nightly", "--json")
    assert code == 0 and json.loads(out)["state"] == "ended"

    # refusals: one line each; bad input exits 2, an illegal move 1, not found 1
    for args, want, fragment in (
        (("create", "x", "--sequence", "job", "--cron", "0 0 30 2 *"), 2, "never falls"),
        (("create", "x", "--sequence", "job", "--cron", "* * * *"), 2, "5 fields"),
        (("create", "x", "--sequence", "job", "--cron", "* * * * *", "--ends-at", "soon"), 2,
         "--ends-at"),
        (("pause", "nightly"), 1, "current state: ended"),
        (("show", "nope"), 1, "not found"),
    ):  # fmt: skip
        code, out, err = cli(monkeypatch, capsys, db_url, "schedules", *args)
        lines = [ln for ln in err.splitlines() if ln.startswith("orch8: error:")]
        assert (code, len(lines), out) == (want, 1, ""), (args, code, err)
        assert fragment in lines[0], lines[0]


# --- two sessions, many fire times: one instance per fire time -------------------------------


def test_two_sessions_racing_across_many_fire_times_start_one_instance_per_fire_time(db_url, conn):
    make_job(conn)
    fake_now(conn, T0)
    ids = {
        policy: sqlapi.schedules.create_schedule(
            conn, tenant_id=ACME, name=f"every-minute-{policy}", sequence_name="job",
            cron="* * * * *", overlap_policy=policy,
        )
        for policy in ("allow", "cancel_previous")
    }  # fmt: skip
    ids["every-2"] = sqlapi.schedules.create_schedule(
        conn, tenant_id=ACME, name="every-2", sequence_name="job", cron="*/2 * * * *",
        overlap_policy="allow",
    )  # fmt: skip
    moves = 90  # every 40 s: each minute is due once, some moves find nothing due
    barrier = threading.Barrier(2)
    results: list[list[list[dict]]] = [[], []]
    failures: list[BaseException] = []

    def session(n: int) -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as c:
                for i in range(1, moves + 1):
                    fake_now(c, T0 + dt.timedelta(seconds=40 * i))
                    barrier.wait(timeout=30)
                    results[n].append(
                        sqlapi.schedules.fire_due_schedules(c, limit=100, actor=f"s{n}")
                    )
        except BaseException as exc:  # reported below, the other side released
            failures.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=session, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures
    end = T0 + dt.timedelta(seconds=40 * moves)
    minutes = [
        T0 + dt.timedelta(minutes=m) for m in range(1, int((end - T0).total_seconds()) // 60 + 1)
    ]
    for name, sid in ids.items():
        want = minutes if name != "every-2" else [m for m in minutes if m.minute % 2 == 0]
        fires, keys = started(conn, sid)
        assert [f for f, _ in fires] == want, name  # every fire time, in order, once
        assert len({i for _, i in fires}) == len(want)
        assert set(keys.values()) == {1} and len(keys) == len(want), name
        assert not conn.execute(
            "SELECT 1 FROM orch8.schedule_fires WHERE schedule_id = %s AND outcome = 'missed'",
            (sid,),
        ).fetchone(), "no fire time was missed: each was due on some move"
    both = [sum(len(r) for r in results[n]) for n in (0, 1)]
    assert sum(both) == conn.execute("SELECT count(*) FROM orch8.schedule_fires").fetchone()[0]


# --- two real runner processes ---------------------------------------------------------------


def test_two_runner_processes_fire_each_due_schedule_once(db_url, conn, tmp_path):
    make_job(conn)
    fake_now(conn, T0)
    schedules = [
        sqlapi.schedules.create_schedule(
            conn, tenant_id=ACME, name=f"s{i}", sequence_name="job", cron="* * * * *"
        )
        for i in range(40)
    ]
    # both runners' clocks stand at 00:01:10: every schedule is due once (00:01)
    at = (T0 + dt.timedelta(seconds=70)).strftime("%Y-%m-%dT%H:%M:%SZ")
    url = conninfo.make_conninfo(db_url, options=f"-c orch8.fake_now={at}")
    procs = [spawn_runner(url, tmp_path / f"runner{n}.log") for n in (0, 1)]
    try:
        deadline = dt.datetime.now() + dt.timedelta(seconds=30)
        while dt.datetime.now() < deadline:
            done = conn.execute(
                "SELECT count(*) FROM orch8.task_instances WHERE state = 'completed'"
            ).fetchone()[0]
            if done >= len(schedules):
                break
            threading.Event().wait(0.1)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    logs = "".join((tmp_path / f"runner{n}.log").read_text() for n in (0, 1))
    for sid in schedules:
        fires, keys = started(conn, sid)
        assert [f for f, _ in fires] == [T0 + dt.timedelta(minutes=1)], logs[-2000:]
        assert list(keys.values()) == [1]
    assert conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE state = 'completed') FROM orch8.task_instances"
    ).fetchone() == (len(schedules), len(schedules))
    assert "event=schedule.fire" in logs


# --- the console -----------------------------------------------------------------------------


def test_console_lists_schedules_and_pauses_and_resumes_them(app, conn):
    from tests.test_console import csrf_of, login

    make_job(conn)
    sid = sqlapi.schedules.create_schedule(
        conn, tenant_id=ACME, name="nightly", sequence_name="job", cron="30 2 * * *",
        timezone="Europe/Berlin", overlap_policy="cancel_previous",
    )  # fmt: skip
    keys = {r: apikeys.create(conn, ACME, r, f"{r}-carol")[1] for r in ("operator", "auditor")}

    def state():
        return conn.execute("SELECT state FROM orch8.schedules WHERE id = %s", (sid,)).fetchone()[0]

    operator = app.test_client()
    assert login(operator, keys["operator"]).status_code == 302
    html = operator.get("/console/schedules").text
    assert "nightly" in html and "30 2 * * *" in html and "cancel_previous" in html
    assert 'aria-current="page">Schedules' in html
    row = sqlapi.schedules.get_schedule(conn, tenant_id=ACME, schedule_id=sid)
    assert row is not None
    assert row["next_fire_at"].astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC") in html
    assert 'id="pause-nightly"' in html

    resp = operator.post(f"/console/schedules/{sid}/pause", data={"csrf_token": csrf_of(html)})
    assert resp.status_code == 302 and state() == "paused"
    html = operator.get("/console/schedules").text
    assert "Paused: no fire until it is resumed." in html and 'id="resume-nightly"' in html
    operator.post(f"/console/schedules/{sid}/resume", data={"csrf_token": csrf_of(html)})
    assert state() == "active"
    assert operator.post(f"/console/schedules/{sid}/pause", data={}).status_code in (400, 403)
    assert state() == "active"

    auditor = app.test_client()
    assert login(auditor, keys["auditor"]).status_code == 302
    html = auditor.get("/console/schedules").text
    assert "nightly" in html and 'id="pause-nightly"' not in html
    forged = auditor.post(f"/console/schedules/{sid}/pause", data={"csrf_token": csrf_of(html)})
    assert forged.status_code == 403 and "can only read" in forged.text
    assert state() == "active"


def test_the_schedule_loop_rides_out_a_database_that_does_not_answer(caplog):
    from psycopg_pool import ConnectionPool

    from orch8_py.schedules import ScheduleFirer

    # nothing listens on port 1: every tick is a lost connection (PoolTimeout), logged
    pool: ConnectionPool = ConnectionPool(
        "postgresql://postgres@127.0.0.1:1/none",
        min_size=1,
        open=False,
        timeout=0.2,
        kwargs={"connect_timeout": 1},
    )
    pool.open(wait=False)
    firer = ScheduleFirer(pool, "w:schedules", interval=0.01)
    stop = threading.Event()
    thread = threading.Thread(target=firer.run, args=(stop,), daemon=True)
    caplog.set_level("WARNING", logger="orch8.schedules")
    thread.start()
    try:
        for _ in range(100):
            if sum("event=schedules.db_lost" in r.getMessage() for r in caplog.records) >= 2:
                break
            stop.wait(0.05)
    finally:
        stop.set()
        thread.join(timeout=5)
        pool.close()
    assert not thread.is_alive(), "the loop did not stop"
    lost = [r for r in caplog.records if "event=schedules.db_lost" in r.getMessage()]
    assert len(lost) >= 2, "it kept ticking after the first loss"
    assert not [r for r in caplog.records if "event=schedules.error" in r.getMessage()]
