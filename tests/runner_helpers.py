"""Shared pieces for tests that run the engine: sequences, instances, waiting, runners."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from psycopg.types.json import Jsonb

from orch8_py.runner import Runner, Settings

TENANT = "t1"


def wait_until(predicate: Any, timeout: float = 30.0, what: str = "the condition") -> Any:
    """Call ``predicate`` until it returns something truthy (returned); fail after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def make_sequence(conn, blocks, name=None, invariants=None) -> uuid.UUID:
    definition = {"blocks": blocks, **({"invariants": invariants} if invariants else {})}
    return conn.execute(
        "SELECT id FROM orch8.create_sequence(%s, 'default', %s, %s)",
        (TENANT, name or f"s{uuid.uuid4().hex[:8]}", Jsonb(definition)),
    ).fetchone()[0]


def store_sequence(conn, blocks, name=None, **top) -> uuid.UUID:
    """A definition stored as an older orch8 accepted it: written past create_sequence, so
    fields today's validator refuses (when, status, composite blocks...) are kept."""
    return conn.execute(
        "INSERT INTO orch8.sequences (tenant_id, name, version, definition)"
        " VALUES (%s, %s, 1, %s) RETURNING id",
        (TENANT, name or f"old{uuid.uuid4().hex[:8]}", Jsonb({"blocks": blocks, **top})),
    ).fetchone()[0]


def start(conn, seq, data=None, tenant=TENANT) -> uuid.UUID:
    return conn.execute(
        "SELECT id FROM orch8.create_instance(%s, %s, %s)", (tenant, seq, Jsonb(data or {}))
    ).fetchone()[0]


def wait_for(conn, instances, states=("completed", "failed"), timeout=60.0) -> dict:
    """Poll until every instance is in one of ``states``; {id: (state, error)}."""
    deadline = time.monotonic() + timeout
    rows: list = []
    while time.monotonic() < deadline:
        rows = conn.execute(
            "SELECT id, state::text, error FROM orch8.task_instances WHERE id = ANY(%s)",
            (list(instances),),
        ).fetchall()
        if len(rows) == len(instances) and all(state in states for _, state, _ in rows):
            return {i: (s, e) for i, s, e in rows}
        time.sleep(0.05)
    pending = [(i, s) for i, s, _ in rows if s not in states]
    raise AssertionError(f"{len(pending)} instance(s) did not finish, e.g. {pending[:3]}")


@contextlib.contextmanager
def running(db_url: str, **settings) -> Iterator[Runner]:
    """An in-process runner on a thread, stopped (and checked stopped) afterwards."""
    defaults = {
        "concurrency": 4,
        "lease": 30,
        "heartbeat": 5,
        "poll_interval": 0.05,
        "grace": 5,
        "verify_interval": 0.05,
    }
    r = Runner(db_url, Settings(**{**defaults, **settings}))
    stop = threading.Event()
    t = threading.Thread(target=r.run, args=(stop,), daemon=True)
    t.start()
    try:
        yield r
    finally:
        stop.set()
        t.join(timeout=20)
        assert not t.is_alive(), "the runner did not stop"


def spawn_runner(db_url: str, log_path, **env: str) -> subprocess.Popen:
    """`orch8 run` as a real process, its output in ``log_path``."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("ORCH8_")}
    full.update(
        ORCH8_DATABASE_URL=db_url,
        ORCH8_ALLOW_PRIVATE_URLS="1",
        ORCH8_TICK_INTERVAL="0.05",
        ORCH8_VERIFY_INTERVAL="0.05",
        **env,
    )
    log = open(log_path, "ab")  # noqa: SIM115 (closed by the process's exit)
    return subprocess.Popen(
        [sys.executable, "-m", "orch8_py", "run"], env=full, stdout=log, stderr=subprocess.STDOUT
    )
