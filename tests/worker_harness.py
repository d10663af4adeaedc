"""The pieces of an external-worker test: the operator service on a real waitress server
on loopback (its long-polls included), API keys, registered handlers, a raw worker that
speaks the protocol by hand (for fencing races), `orch8 worker` processes, and what the
ledger says about a task."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg

from orch8_py import apikeys, serving
from tests.runner_helpers import TENANT
from web import create_app


@dataclass
class Api:
    """The operator service on 127.0.0.1, with an operator and a worker key of TENANT."""

    base: str  # http://127.0.0.1:port
    operator_key: str
    worker_key: str
    app: Any

    def client(self, key: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.base + "/api/v1",
            headers={"Authorization": f"Bearer {key or self.worker_key}"},
            timeout=httpx.Timeout(10.0, read=90.0),
        )

    def register(self, handler: str, **body: Any) -> dict[str, Any]:
        with self.client(self.operator_key) as c:
            resp = c.put(f"/workers/handlers/{handler}", json=body)
        assert resp.status_code == 200, resp.text
        return resp.json()


@contextlib.contextmanager
def serve(db_url: str, *, long_polls: int = 8) -> Iterator[Api]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        _, operator_key = apikeys.create(conn, TENANT, "operator", "test-operator")
        _, worker_key = apikeys.create(conn, TENANT, "worker", "test-worker")
    app = create_app(db_url, secret_key="workers-test")
    app.config["ORCH8_LONG_POLLS"] = long_polls
    server = serving.create_server(
        app, "127.0.0.1", 0, serving.Limits(threads=long_polls + 4, channel_timeout=10)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    port = server.effective_port  # type: ignore[union-attr]
    try:
        yield Api(f"http://127.0.0.1:{port}", operator_key, worker_key, app)
    finally:
        server.close()
        wakeup = app.extensions.get("orch8.task_wakeup")
        if wakeup is not None:
            wakeup.close()
        app.extensions["orch8.pool"].close()


class RawWorker:
    """A worker driven call by call (no library): poll, heartbeat, complete, fail."""

    def __init__(self, api: Api, worker_id: str, key: str | None = None):
        self.worker_id = worker_id
        self.http = api.client(key)

    def poll(self, handlers: list[str], **body: Any) -> httpx.Response:
        return self.http.post(
            "/workers/tasks/poll", json={"worker_id": self.worker_id, "handlers": handlers, **body}
        )

    def tasks(self, handlers: list[str], **body: Any) -> list[dict[str, Any]]:
        resp = self.poll(handlers, **body)
        assert resp.status_code == 200, resp.text
        tasks: list[dict[str, Any]] = resp.json()["tasks"]
        return tasks

    def call(self, task: dict[str, Any], what: str, **body: Any) -> httpx.Response:
        return self.http.post(
            f"/workers/tasks/{task['task_id']}/{what}",
            json={"worker_id": self.worker_id, "claim_epoch": task["claim_epoch"], **body},
        )

    def close(self) -> None:
        self.http.close()


def spawn_worker(
    api: Api,
    worker_id: str,
    log_path: Any,
    *args: str,
    key: str | None = None,
    module: str = "tests.worker_handlers",
) -> subprocess.Popen[bytes]:
    """`orch8 worker --import tests.worker_handlers` (or ``module``) as a real process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH8_")}
    env.update(ORCH8_API_KEY=key or api.worker_key, PYTHONPATH=os.getcwd())
    log = open(log_path, "ab")  # noqa: SIM115 (closed by the process's exit)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orch8_py",
            "worker",
            "--import",
            module,
            "--url",
            api.base,
            "--worker-id",
            worker_id,
            "--poll-wait",
            "2",  # a stop waits for the poll in flight: keep it short in tests
            *args,
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def stop(proc: subprocess.Popen[bytes], timeout: float = 20) -> int:
    """SIGTERM, and the exit status (SIGKILL after ``timeout``)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def task_of(conn: psycopg.Connection, instance: uuid.UUID, path: str = "charge") -> dict[str, Any]:
    """The latest task of a step, with its receipt's state and its events."""
    row = conn.execute(
        "SELECT w.id, w.state, w.claim_epoch, w.worker_id, w.attempt, w.effect_id,"
        " r.state::text, w.result FROM orch8.worker_tasks AS w"
        " JOIN orch8.effect_receipts AS r ON r.tenant_id = w.tenant_id AND r.id = w.effect_id"
        " WHERE w.instance_id = %s AND w.path = %s ORDER BY w.attempt DESC LIMIT 1",
        (instance, path),
    ).fetchone()
    assert row is not None, f"no task for {instance} {path}"
    events = [
        e
        for (e,) in conn.execute(
            "SELECT event FROM orch8.worker_task_events WHERE task_id = %s ORDER BY seq",
            (row[0],),
        ).fetchall()
    ]
    keys = ("id", "state", "claim_epoch", "worker_id", "attempt", "effect_id", "receipt", "result")
    return dict(zip(keys, row, strict=True)) | {"events": events}
