"""`orch8 demo` as a real process on a fresh database, and its fake payment provider."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
import uuid

import httpx
import psycopg
import pytest

from orch8_py.demo.provider import FakeProvider
from tests.cli_helpers import assert_one_line_error, orch8_env
from tests.runner_helpers import running, wait_for


def run_demo(db_url: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orch8_py", "demo", "--no-wait", *args],
        env=orch8_env(ORCH8_DATABASE_URL=db_url),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_demo_completes_and_leaves_exactly_one_unknown_receipt(db_url, conn):
    proc = run_demo(db_url, "--json", "--orders", "3")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    summary = json.loads(proc.stdout)  # stdout is the JSON alone; progress went to stderr
    assert "runner crashed between charge and commit" in proc.stderr, proc.stderr
    assert "its verifier found the charge" in proc.stderr, proc.stderr

    receipts = conn.execute(
        "SELECT id::text, instance_id::text, state::text, provider_receipt_id, evidence"
        " FROM orch8.effect_receipts ORDER BY created_at"
    ).fetchall()
    assert len(receipts) == 3  # one charge per order: nothing was sent twice
    by_state = {}
    for r in receipts:
        by_state.setdefault(r[2], []).append(r)
    assert sorted(by_state) == ["committed", "unknown", "verified"]
    [(effect_id, crashed_instance, _, _, _)] = by_state["unknown"]
    [(late_effect, late_instance, _, late_receipt, evidence)] = by_state["verified"]
    assert evidence["resolution"]["actor"] == "verifier:http"

    states = dict(conn.execute("SELECT id::text, state::text FROM orch8.task_instances").fetchall())
    assert states.pop(crashed_instance) == "failed"
    assert sorted(states.values()) == ["completed", "completed"]
    queue = conn.execute(
        "SELECT effect_id::text, blocking, verification FROM orch8.unresolved_effects"
    ).fetchall()
    assert queue == [(effect_id, True, "escalated")]

    orders = summary["orders"]
    assert [o["order_id"] for o in orders] == [1001, 1002, 1003]
    for order in orders:
        assert len(order["provider_charges"]) == 1, order  # the provider charged it once
    assert summary["provider"]["requests"] == 3 and summary["provider"]["charges"] == 3
    # the late order's verifier looked once; the crashed one's three times, in the outage
    assert summary["provider"]["lookups"] == 4
    late = orders[0]
    assert late["answered_late"] and late["instance_id"] == late_instance
    assert (late["state"], late["receipt_state"], late["verification"]) == (
        "completed",
        "verified",
        "settled",
    )
    assert late["provider_receipt_id"] == late_receipt == late["provider_charges"][0]
    assert summary["verified_effect"]["effect_id"] == late_effect
    crashed = [o for o in orders if o["crashed"]]
    assert [o["instance_id"] for o in crashed] == [crashed_instance]
    assert crashed[0]["state"] == "failed" and crashed[0]["receipt_state"] == "unknown"
    assert "still unknown after its verifier's last try" in crashed[0]["error"]
    assert summary["unknown_effect"]["effect_id"] == effect_id
    assert summary["unknown_effect"]["idempotency_key"] == effect_id
    assert summary["unknown_effect"]["verification"] == "escalated"
    # the provider holds the charge the engine never recorded, under the effect id
    assert summary["unknown_effect"]["provider_charge_id"] == crashed[0]["provider_charges"][0]
    middle = orders[1]
    assert (middle["state"], middle["receipt_state"]) == ("completed", "committed")
    assert middle["provider_receipt_id"] == middle["provider_charges"][0]


def guide_commands(out: str) -> list[list[str]]:
    """The `orch8 ...` commands of the guide's steps 3 and 4, as a person would type them
    (continuation lines joined)."""
    commands, pending = [], ""
    for line in out.splitlines():
        text = line.strip()
        if pending or text.startswith(("orch8 effects resolve", "orch8 instances retry")):
            pending += text.removesuffix("\\").strip() + " "
            if not text.endswith("\\"):
                commands.append(shlex.split(pending))
                pending = ""
    return commands


def test_the_demo_guide_typed_as_printed_finishes_the_order(db_url, conn):
    proc = run_demo(db_url, "--orders", "2")
    assert proc.returncode == 0, proc.stderr
    [resolve, retry] = guide_commands(proc.stdout)
    assert resolve[:3] == ["orch8", "effects", "resolve"] and retry[:3] == [
        "orch8",
        "instances",
        "retry",
    ]
    env = orch8_env(ORCH8_DATABASE_URL=db_url)
    for command in (resolve, retry):
        done = subprocess.run(
            [sys.executable, "-m", "orch8_py", *command[1:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (command, done.stdout, done.stderr)
    instance = uuid.UUID(retry[3])
    with running(db_url):
        assert wait_for(conn, [instance])[instance] == ("completed", None)
    charge_id = resolve[resolve.index("--provider-receipt-id") + 1]
    summary = conn.execute(
        "SELECT output FROM orch8.block_outputs WHERE instance_id = %s AND block_id = 'summary'",
        (instance,),
    ).fetchone()[0]
    assert summary["result"]["paid"] == charge_id  # the provider's answer fed the summary
    receipts = conn.execute(
        "SELECT state::text FROM orch8.effect_receipts WHERE instance_id = %s", (instance,)
    ).fetchall()
    assert receipts == [("committed",)]  # completed from the evidence: never sent again


def test_demo_guide_names_the_receipt_and_the_commands(db_url):
    proc = run_demo(db_url, "--orders", "2")
    assert proc.returncode == 0, proc.stderr
    with psycopg.connect(db_url, autocommit=True) as c:
        effect_id, instance_id = c.execute(
            "SELECT effect_id::text, instance_id::text FROM orch8.unresolved_effects"
        ).fetchone()
    out = proc.stdout
    assert "order 1002: runner crashed between charge and commit (on purpose)" in out
    assert "order 1001 completed: its verifier found the charge" in out
    assert "escalated receipt" in out
    assert f"orch8 effects show {effect_id}" in out
    assert "orch8 effects unresolved" in out
    assert "SELECT * FROM orch8.unresolved_effects;" in out
    assert f"/v1/charges?idempotency_key={effect_id}" in out
    assert f"orch8 effects resolve {effect_id} --expected-state unknown --state committed" in out
    assert "orch8.resolve_effect('default'" in out
    assert f"orch8 instances retry {instance_id}" in out
    assert "http://127.0.0.1:8080/console" in out


def test_provider_port_in_use_is_one_line_error(db_url, conn):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_demo(db_url, "--provider-port", str(port), timeout=60)
    assert_one_line_error(proc, f"port {port}", "already in use", "--provider-port")
    assert conn.execute("SELECT count(*) FROM orch8.task_instances").fetchone()[0] == 0


def test_refuses_while_another_runner_is_connected(db_url, conn):
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN orch8_work")  # what a runner's listener does
        proc = run_demo(db_url, timeout=60)
    assert_one_line_error(proc, "runner is already connected")
    assert conn.execute("SELECT count(*) FROM orch8.task_instances").fetchone()[0] == 0


def test_bad_orders_flag_is_one_line_error(db_url):
    assert_one_line_error(run_demo(db_url, "--orders", "0", timeout=60), "--orders 0")


# --- the fake provider ------------------------------------------------------------------


@pytest.fixture
def fake():
    with FakeProvider() as p:
        yield p


def test_provider_charges_once_per_idempotency_key(fake):
    body = {"amount": 1250, "currency": "EUR", "order_id": 7}
    first = httpx.post(f"{fake.url}/v1/charges", json=body, headers={"Idempotency-Key": "k1"})
    assert first.status_code == 201
    charge = first.json()
    assert charge["id"].startswith("ch_") and charge["receipt_id"] == charge["id"]
    assert charge["status"] == "succeeded" and charge["amount"] == 1250
    again = httpx.post(f"{fake.url}/v1/charges", json=body, headers={"Idempotency-Key": "k1"})
    assert again.status_code == 200 and again.json() == charge
    other = httpx.post(f"{fake.url}/v1/charges", json=body, headers={"Idempotency-Key": "k2"})
    assert other.status_code == 201 and other.json()["id"] != charge["id"]
    assert len(fake.charges_for_order(7)) == 2 and fake.requests == 3

    changed = {**body, "amount": 1}
    clash = httpx.post(f"{fake.url}/v1/charges", json=changed, headers={"Idempotency-Key": "k1"})
    assert clash.status_code == 409
    bad = httpx.post(f"{fake.url}/v1/charges", json={"amount": -5, "currency": "EUR"})
    assert bad.status_code == 400


def test_provider_answers_did_you_receive_this(fake):
    created = httpx.post(
        f"{fake.url}/v1/charges",
        json={"amount": 990, "currency": "EUR", "order_id": 8},
        headers={"Idempotency-Key": "effect-1"},
    ).json()
    by_query = httpx.get(f"{fake.url}/v1/charges", params={"idempotency_key": "effect-1"})
    assert by_query.status_code == 200 and by_query.json() == created
    assert httpx.get(f"{fake.url}/v1/charges/by-key/effect-1").json() == created
    assert httpx.get(f"{fake.url}/v1/charges/{created['id']}").json() == created
    missing = httpx.get(f"{fake.url}/v1/charges", params={"idempotency_key": "nope"})
    assert missing.status_code == 404
    assert httpx.get(f"{fake.url}/v1/charges").json() == {"data": [created]}


def test_provider_port_in_use(fake):
    from orch8_py.errors import ConfigError

    with pytest.raises(ConfigError, match="already in use"):
        FakeProvider(fake.port).start()
    with pytest.raises(ConfigError, match="loopback"):
        FakeProvider(host="0.0.0.0")
