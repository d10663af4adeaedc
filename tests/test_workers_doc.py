"""docs/WORKERS.md runs as written: its Python worker serves a step through a live
operator service and runner, and its curl walkthrough (the shell blocks after the
`runnable` marker, in one bash session) drives the protocol by hand: poll, heartbeat,
complete, fail with not_applied, and a 409 for a callback after the task was closed."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from orch8_py.migrate import sql_dir
from tests.http_provider import Provider
from tests.runner_helpers import make_sequence, running, start, wait_for, wait_until
from tests.worker_harness import serve, task_of

DOC = sql_dir().parent / "docs" / "WORKERS.md"
pytestmark = pytest.mark.timeout(180)


def blocks(language: str, after: str | None = None) -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    if after is not None:
        text = text[text.index(after) :]
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_the_python_worker_of_the_doc_serves_a_step(db_url, conn, tmp_path):
    [program] = [b for b in blocks("python") if "Worker(" in b]
    (tmp_path / "billing_worker.py").write_text(program, encoding="utf-8")
    provider = Provider().start()
    provider.reply("/charge", json={"receipt_id": "ch_doc"})
    seq = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "charge",
                "handler": "payments.charge",
                "params": {"url": provider.url + "/charge", "amount": 42},
            }
        ],
    )
    try:
        with serve(db_url) as api:
            api.register("payments.charge")
            env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH8_")}
            env.update(ORCH8_API_URL=api.base, ORCH8_API_KEY=api.worker_key)
            with open(tmp_path / "worker.log", "wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "billing_worker.py"],
                    cwd=tmp_path,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
                try:
                    with running(db_url):
                        inst = start(conn, seq, {})
                        assert wait_for(conn, [inst])[inst][0] == "completed"
                finally:
                    proc.send_signal(signal.SIGTERM)
                    code = proc.wait(30)
    finally:
        provider.stop()
    assert code == 0, (tmp_path / "worker.log").read_text()
    [sent] = provider.requests_to("/charge")
    receipt = conn.execute(
        "SELECT state::text, provider_receipt_id, idempotency_key FROM orch8.effect_receipts"
        " WHERE instance_id = %s",
        (inst,),
    ).fetchone()
    assert receipt[:2] == ("committed", "ch_doc")
    assert sent.headers["idempotency-key"] == receipt[2]


@pytest.mark.skipif(shutil.which("jq") is None, reason="the walkthrough uses jq")
def test_the_curl_walkthrough_runs_as_written(db_url, conn):
    shell = blocks("sh", after="<!-- runnable")
    assert "export ORCH8=" in shell[0]
    script = "\n".join(shell[1:])  # the first one sets what the test sets below
    with serve(db_url) as api, running(db_url):
        env = {
            **os.environ,
            "ORCH8": api.base + "/api/v1",
            "OPERATOR_KEY": api.operator_key,
            "WORKER_KEY": api.worker_key,
        }
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        lines = proc.stdout.splitlines()
        assert "completed" in lines, proc.stdout
        assert lines[-1] == "409", proc.stdout
        first, second = (
            r[0]
            for r in conn.execute(
                "SELECT id FROM orch8.task_instances ORDER BY created_at"
            ).fetchall()
        )
        receipt = conn.execute(
            "SELECT state::text, provider_receipt_id FROM orch8.effect_receipts"
            " WHERE instance_id = %s",
            (first,),
        ).fetchone()
        assert receipt == ("committed", "ch_123")
        # the not_applied failure: abandoned, and the step's retry policy queues attempt 1
        retried = wait_until(
            lambda: (t := task_of(conn, second))["attempt"] == 1 and t, what="the retry's task"
        )
        assert retried["state"] == "queued" and retried["receipt"] == "dispatched"
        assert (
            conn.execute(
                "SELECT state::text FROM orch8.effect_receipts"
                " WHERE instance_id = %s AND attempt = 0",
                (second,),
            ).fetchone()[0]
            == "abandoned"
        )
