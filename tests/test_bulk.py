"""Bulk operator actions by filter (issue 12): `orch8 instances bulk` as a real process
over 1,000 failed instances (the count first, progress lines, the summary, every instance
retried exactly once by the audit trail), the refusal without --yes off a terminal, Ctrl-C
after the current batch, and POST /api/v1/bulk/instances (dry run, run, skips by reason,
an auditor's 403). Instances fail through the engine: claimed, and finished with an error.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys

import pytest

from orch8_py import apikeys
from tests.cli_helpers import assert_one_line_error, orch8_env
from tests.runner_helpers import TENANT, make_sequence
from tests.test_api import CHARGE, fail_with_unknown_receipt, make_seq
from web import create_app

STEP = [{"type": "step", "id": "call", "handler": "noop"}]


def failed_instances(conn, name: str, count: int, error: str) -> None:
    """``count`` failed instances of a new sequence ``name``, each failed by finish_step
    with ``error`` under its claim (no retry)."""
    seq = make_sequence(conn, STEP, name=name)
    conn.execute(
        "SELECT count(*) FROM generate_series(1, %s) AS g,"
        " LATERAL orch8.create_instance(%s, %s, jsonb_build_object('n', g)) AS c",
        (count, TENANT, seq),
    )
    finished = conn.execute(
        "SELECT count(*) FROM orch8.claim_due_nodes('bulk-test', %s, '1 minute') AS n,"
        " LATERAL orch8.finish_step(n.tenant_id, n.instance_id, n.lease_token, n.path, 0,"
        " NULL, 'error', NULL, %s) AS f",
        (count, error),
    ).fetchone()[0]
    assert finished == count


def states(conn, name: str) -> dict[str, int]:
    rows = conn.execute(
        "SELECT t.state::text, count(*) FROM orch8.task_instances AS t"
        " JOIN orch8.sequences AS s ON s.tenant_id = t.tenant_id AND s.id = t.sequence_id"
        " WHERE s.name = %s GROUP BY 1",
        (name,),
    ).fetchall()
    return dict(rows)


def retries_by(conn, name: str, actor: str) -> tuple[int, int, int]:
    """(instances of the sequence, instances with a retry by actor, such retries)."""
    return conn.execute(
        "SELECT count(DISTINCT t.id), count(DISTINCT x.instance_id), count(x.seq)"
        " FROM orch8.task_instances AS t"
        " JOIN orch8.sequences AS s ON s.tenant_id = t.tenant_id AND s.id = t.sequence_id"
        " LEFT JOIN orch8.instance_transitions AS x ON x.tenant_id = t.tenant_id"
        "  AND x.instance_id = t.id AND x.from_state = 'failed' AND x.to_state = 'scheduled'"
        "  AND x.actor = %s"
        " WHERE s.name = %s",
        (actor, name),
    ).fetchone()


def orch8(db_url: str, *args: str) -> subprocess.CompletedProcess:
    """The real command, stdin not a terminal."""
    return subprocess.run(
        [sys.executable, "-m", "orch8_py", "instances", "bulk", *args, "--tenant", TENANT],
        env=orch8_env(ORCH8_DATABASE_URL=db_url, USER="tester"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_bulk_retry_of_1000_failed_instances_with_progress(db_url, conn):
    failed_instances(conn, "flaky", 1000, "Timeout from the provider")
    failed_instances(conn, "declined", 3, "card declined")
    flags = ("--sequence", "flaky", "--state", "failed", "--error-contains", "TIMEOUT")

    dry = orch8(db_url, "retry", *flags, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip() == "1000 instance(s) match: dry run, nothing changed"
    refused = orch8(db_url, "retry", *flags)
    assert refused.returncode == 2
    assert_one_line_error(refused, "1000 instance(s) match", "--yes", "nothing changed")
    assert states(conn, "flaky") == {"failed": 1000}

    done = orch8(db_url, "retry", *flags, "--yes", "--batch", "100", "--actor", "ops:bulk")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "1000 instance(s) match the filter"  # the count first
    progress = lines[1:]
    assert len(progress) == 11, lines  # 10 full batches and the empty one that ends the run
    for n, line in enumerate(progress, 1):
        processed = min(100 * n, 1000)
        expected = rf"retry: batch {n}: processed {processed}/1000, applied {processed}, "
        assert re.fullmatch(re.escape(expected) + r"skipped 0 \(\d+/s\)", line), line
    assert done.stdout.splitlines() == [
        "retry: 1000 applied, 0 skipped of 1000 processed (1000 matched at the dry run)"
    ]
    assert states(conn, "flaky") == {"scheduled": 1000}
    assert retries_by(conn, "flaky", "ops:bulk") == (1000, 1000, 1000)  # each exactly once
    assert states(conn, "declined") == {"failed": 3}  # not matched

    # refusals are skips, summed up by reason: a failed instance cannot be cancelled
    skipped = orch8(db_url, "cancel", "--sequence", "declined", "--state", "failed", "--yes")
    assert skipped.returncode == 0, skipped.stderr
    out = skipped.stdout.splitlines()
    assert out[0] == "cancel: 0 applied, 3 skipped of 3 processed (3 matched at the dry run)"
    assert out[1] == "  skipped 3: instance is failed, it cannot be cancelled"
    assert states(conn, "declined") == {"failed": 3}


def test_cli_bulk_refusals_are_one_line(db_url, conn):
    failed_instances(conn, "few", 2, "boom")
    for args, code, fragment in (
        (("retry", "--yes"), 2, "a bulk filter needs at least one of"),
        (("retry", "--state", "failed", "--created-after", "tuesday"), 2, "--created-after"),
        (("retry", "--state", "failed", "--yes", "--batch", "0"), 2, "a bulk batch is 1 to"),
        (("retry", "--state", "failed", "--yes", "--reason", "x"), 2, "a reason is recorded"),
    ):
        proc = orch8(db_url, *args)
        assert proc.returncode == code, (args, proc.stderr)
        assert_one_line_error(proc, fragment)
    assert states(conn, "few") == {"failed": 2}


def test_ctrl_c_stops_after_the_current_batch(db_url, conn):
    failed_instances(conn, "long", 400, "boom")
    proc = subprocess.Popen(
        [sys.executable, "-m", "orch8_py", "instances", "bulk", "retry", "--sequence", "long",
         "--state", "failed", "--yes", "--batch", "1", "--json", "--actor", "ops:ctrl-c",
         "--tenant", TENANT],
        env=orch8_env(ORCH8_DATABASE_URL=db_url, USER="tester"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    assert proc.stderr.readline().strip() == "400 instance(s) match the filter"
    assert proc.stderr.readline().startswith("retry: batch 1: ")
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    summary = json.loads(out)
    assert summary["interrupted"] is True
    assert 1 <= summary["applied"] < 400
    assert "stopping after the current batch" in err
    # what the summary says was applied is what the audit trail holds: no batch half-done
    assert retries_by(conn, "long", "ops:ctrl-c") == (400, summary["applied"], summary["applied"])


def on_a_terminal(db_url: str, answer: str, *args: str) -> tuple[int, str, str]:
    """The command with stdin and stderr on a pseudo-terminal, answering the prompt with
    ``answer``: (exit code, what the terminal showed, stdout)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orch8_py", "instances", "bulk", *args, "--tenant", TENANT],
        env=orch8_env(ORCH8_DATABASE_URL=db_url, USER="tester"),
        stdin=slave,
        stderr=slave,
        stdout=subprocess.PIPE,
        text=True,
    )
    os.close(slave)
    shown, answered = b"", False
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            assert ready, shown  # the command answers within a minute
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal closed: the command ended
                break
            if not chunk:
                break
            shown += chunk
            if not answered and b"[y/N] " in shown:
                os.write(master, answer.encode() + b"\n")
                answered = True
    finally:
        os.close(master)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, shown.decode(), out


def test_on_a_terminal_it_asks_and_draws_a_bar(db_url, conn):
    failed_instances(conn, "tty", 20, "boom")
    flags = ("--sequence", "tty", "--state", "failed", "--batch", "5")
    code, shown, out = on_a_terminal(db_url, "n", "retry", *flags)
    assert code == 1 and out == "", shown
    assert "retry 20 instance(s)? [y/N]" in shown and "not confirmed; nothing changed" in shown
    assert states(conn, "tty") == {"failed": 20}

    code, shown, out = on_a_terminal(db_url, "y", "retry", *flags, "--actor", "ops:tty")
    assert code == 0, shown
    bars = re.findall(r"\rretry \[([#.]{30})\] (\d+)/20", shown)
    assert [int(n) for _, n in bars] == [5, 10, 15, 20, 20], shown  # redrawn in place
    assert bars[-1][0] == "#" * 30
    assert (
        out.splitlines()[0]
        == "retry: 20 applied, 0 skipped of 20 processed (20 matched at the dry run)"
    )
    assert retries_by(conn, "tty", "ops:tty") == (20, 20, 20)


# --- REST ---------------------------------------------------------------------------------


@pytest.fixture
def client(db_url):
    app = create_app(db_url, secret_key="bulk-test")
    app.testing = True
    yield app.test_client()
    app.extensions["orch8.pool"].close()


def post(client, key, body):
    return client.post(
        "/api/v1/bulk/instances", json=body, headers={"Authorization": f"Bearer {key}"}
    )


def test_rest_bulk_dry_run_run_and_roles(client, conn):
    failed_instances(conn, "api", 30, "Timeout")
    operator = apikeys.create(conn, TENANT, "operator", "ops")[1]
    auditor = apikeys.create(conn, TENANT, "auditor", "audit")[1]
    other = apikeys.create(conn, "other", "operator", "elsewhere")[1]
    wanted = {"sequence": "api", "state": ["failed"], "created_after": "2000-01-01T00:00:00Z"}

    dry = post(client, operator, {"action": "retry", "filter": wanted, "dry_run": True})
    assert dry.status_code == 200, dry.get_data(as_text=True)
    assert dry.get_json() == {
        "action": "retry",
        "dry_run": True,
        "matched": 30,
        "processed": None,
        "applied": None,
        "skipped": None,
        "skipped_reasons": None,
        "skipped_sample": None,
    }
    assert states(conn, "api") == {"failed": 30}
    elsewhere = post(client, other, {"action": "retry", "filter": wanted, "dry_run": True})
    assert elsewhere.get_json()["matched"] == 0  # another tenant's key sees none of them

    denied = post(client, auditor, {"action": "retry", "filter": wanted, "dry_run": False})
    assert denied.status_code == 403
    assert states(conn, "api") == {"failed": 30}

    run = post(
        client, operator, {"action": "retry", "filter": wanted, "dry_run": False, "batch": 7}
    )
    assert run.status_code == 200, run.get_data(as_text=True)
    body = run.get_json()
    counts = (body["matched"], body["processed"], body["applied"], body["skipped"])
    assert counts == (30, 30, 30, 0)
    assert body["skipped_reasons"] == {} and body["skipped_sample"] == []
    assert retries_by(conn, "api", "key:ops") == (30, 30, 30)

    # now scheduled: pausing them twice, the second run skips every one as unchanged
    again = {"action": "pause", "filter": {"sequence": "api"}, "dry_run": False}
    assert post(client, operator, {**again, "reason": "maintenance"}).get_json()["applied"] == 30
    skipped = post(client, operator, again).get_json()
    assert skipped["skipped_reasons"] == {"already paused (or a pause was asked)": 30}
    assert len(skipped["skipped_sample"]) == 5  # one batch (of 50), up to 5 examples each
    assert {"instance_id", "reason", "current_state"} <= set(skipped["skipped_sample"][0])


def test_rest_bulk_refusals(client, conn):
    operator = apikeys.create(conn, TENANT, "operator", "ops")[1]
    for body, field in (
        ({"action": "retry", "filter": {"bogus": 1}, "dry_run": True}, "filter.bogus"),
        ({"action": "zap", "filter": {"state": "failed"}, "dry_run": True}, "action"),
        ({"action": "retry", "filter": {"state": "done"}, "dry_run": True}, "filter.state"),
        ({"action": "retry", "filter": {"state": "failed"}}, "dry_run"),
        ({"action": "retry", "filter": {}, "dry_run": True}, "filter"),
        ({"action": "retry", "filter": {"state": None}, "dry_run": True}, "filter.state"),
        ({"action": "retry", "filter": {"state": "failed"}, "dry_run": False, "reason": "x"},
         "reason"),
    ):  # fmt: skip
        resp = post(client, operator, body)
        assert resp.status_code == 422, resp.get_data(as_text=True)
        paths = [p["path"] for p in resp.get_json()["problems"]]
        assert any(p.startswith(field) for p in paths), paths


def test_rest_bulk_retry_skips_an_instance_whose_receipt_is_unknown(client, conn):
    """The receipt decides as in a single retry: still unknown is O8006, a skip naming
    the receipt to resolve; the other instances of the run are retried."""
    seq = make_seq(conn, CHARGE, tenant=TENANT, name="pay")
    blocked, effect_id = fail_with_unknown_receipt(conn, seq, tenant=TENANT)
    failed_instances(conn, "plain", 3, "boom")
    operator = apikeys.create(conn, TENANT, "operator", "ops")[1]
    run = post(
        client, operator, {"action": "retry", "filter": {"state": "failed"}, "dry_run": False}
    )
    body = run.get_json()
    assert (body["matched"], body["applied"], body["skipped"]) == (4, 3, 1), body
    reason = "receipt (block charge, attempt 0) is unknown: resolve it before retrying"
    assert body["skipped_reasons"] == {reason: 1}
    [sample] = body["skipped_sample"]
    assert (sample["instance_id"], sample["error"]) == (str(blocked), "O8006")
    assert (sample["effect_id"], sample["effect_state"]) == (str(effect_id), "unknown")
    state = conn.execute("SELECT state::text FROM orch8.task_instances WHERE id = %s", (blocked,))
    assert state.fetchone()[0] == "failed"  # its move was undone, nothing else
    assert states(conn, "plain") == {"scheduled": 3}
