"""The README's quick start, as a user types it: the example sequence and handler, a real
`orch8 run` loading the handler module, the CLI to create, start and show."""

from __future__ import annotations

import json
import re
import signal
import uuid
from pathlib import Path

from tests.cli_helpers import assert_one_line_error, orch8_env, run_orch8
from tests.runner_helpers import spawn_runner, wait_for

ROOT = Path(__file__).resolve().parent.parent


def test_quick_start_runs_the_example_checkout(db_url, conn, tmp_path):
    env = orch8_env(ORCH8_DATABASE_URL=db_url)
    made = run_orch8(
        "sequences", "create", str(ROOT / "examples/checkout.json"), "--name", "checkout", env=env
    )
    assert made.returncode == 0 and "created default/checkout version 1" in made.stdout, made
    started = run_orch8(
        "instances", "start", "checkout", "--data", '{"order_id": 7, "amount": 1250}', env=env
    )
    assert started.returncode == 0, started
    instance = uuid.UUID(re.search(r"instance ([0-9a-f-]{36}) scheduled", started.stdout)[1])
    # ORCH8_HANDLER_MODULES here; the README's `--import examples.payments` is the same list
    runner = spawn_runner(db_url, tmp_path / "run.log", ORCH8_HANDLER_MODULES="examples.payments")
    try:
        state, error = wait_for(conn, [instance])[instance]
    finally:
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=30) == 0, (tmp_path / "run.log").read_text()
    assert (state, error) == ("completed", None)
    shown = run_orch8("instances", "show", str(instance), "--json", env=env)
    assert shown.returncode == 0, shown
    body = json.loads(shown.stdout)
    [receipt] = body["effects"]
    assert (receipt["block_id"], receipt["kind"], receipt["state"]) == (
        "charge",
        "worker",
        "committed",
    )
    assert receipt["provider_receipt_id"].startswith("ch_")
    text = run_orch8("instances", "show", str(instance), env=env).stdout
    assert f"instance {instance}  completed" in text
    assert '"paid": "' + receipt["provider_receipt_id"] + '"' in text


def test_a_handler_module_that_cannot_be_imported_is_one_line(db_url):
    proc = run_orch8(
        "run", "--import", "examples.no_such_module", env=orch8_env(ORCH8_DATABASE_URL=db_url)
    )
    assert_one_line_error(proc, "cannot import handler module 'examples.no_such_module'")
    assert proc.returncode == 1


def test_the_readme_crash_settled_by_hand_and_retried_completes_the_checkout(
    db_url, conn, tmp_path
):
    """README "When the runner dies between sending and recording", as typed: the receipt
    is unknown, an operator resolves it committed with the provider's id (the example
    handler derives the step's output from it) and retries; the summary reads the id."""
    env = orch8_env(ORCH8_DATABASE_URL=db_url)
    run_orch8(
        "sequences", "create", str(ROOT / "examples/checkout.json"), "--name", "checkout", env=env
    )
    started = run_orch8(
        "instances", "start", "checkout", "--data", '{"order_id": 8, "amount": 990}', env=env
    )
    instance = uuid.UUID(re.search(r"instance ([0-9a-f-]{36}) scheduled", started.stdout)[1])
    fast = {"ORCH8_LEASE_SECONDS": "1", "ORCH8_HEARTBEAT_SECONDS": "0.3"}
    dying = spawn_runner(
        db_url,
        tmp_path / "dying.log",
        ORCH8_HANDLER_MODULES="examples.payments",
        ORCH8_FAULT_POINT="before_finish",
        **fast,
    )
    assert dying.wait(timeout=60) == -signal.SIGKILL
    runner = spawn_runner(
        db_url, tmp_path / "run.log", ORCH8_HANDLER_MODULES="examples.payments", **fast
    )
    try:
        state, error = wait_for(conn, [instance])[instance]
        assert state == "failed" and "is unknown" in error, error
        [(effect_id,)] = conn.execute(
            "SELECT id FROM orch8.effect_receipts WHERE instance_id = %s", (instance,)
        ).fetchall()
        resolved = run_orch8(
            "effects", "resolve", str(effect_id), "--import", "examples.payments",
            "--expected-state", "unknown", "--state", "committed",
            "--provider-receipt-id", "ch_settled", "--evidence",
            '{"checked": "provider dashboard"}', env=env,
        )  # fmt: skip
        assert resolved.returncode == 0, resolved
        retried = run_orch8("instances", "retry", str(instance), env=env)
        assert retried.returncode == 0 and "completed_from_evidence" in retried.stdout, retried
        assert wait_for(conn, [instance])[instance] == ("completed", None)
    finally:
        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=30)
    text = run_orch8("instances", "show", str(instance), env=env).stdout
    assert '"paid": "ch_settled"' in text  # the summary read the settled charge's id
    receipts = conn.execute(
        "SELECT state::text FROM orch8.effect_receipts WHERE instance_id = %s", (instance,)
    ).fetchall()
    assert receipts == [("committed",)]  # not charged again
