"""http_request steps end to end: the engine, a real local HTTP provider, real receipts."""

from __future__ import annotations

import socket
import time

import pytest

from tests.runner_helpers import make_sequence, running, start, wait_for


@pytest.fixture(autouse=True)
def allow_loopback(monkeypatch):
    monkeypatch.setenv("ORCH8_ALLOW_PRIVATE_URLS", "1")


def charge_step(url, block_id="charge", **extra):
    return {
        "type": "step",
        "id": block_id,
        "handler": "http_request",
        "params": {"method": "POST", "url": url, "json": {"amount": "{{ data.amount }}"}},
        "retry": {"max_attempts": 3, "initial_backoff": 10, "max_backoff": 20},
        **extra,
    }


def receipts(conn, instance):
    return conn.execute(
        "SELECT id, attempt, state::text, provider_receipt_id FROM orch8.effect_receipts"
        " WHERE instance_id = %s ORDER BY attempt, created_at",
        (instance,),
    ).fetchall()


def test_success_commits_with_the_provider_receipt(db_url, conn, provider):
    seq = make_sequence(conn, [charge_step(provider.url + "/charge")])
    instance = start(conn, seq, {"amount": 42})
    with running(db_url):
        assert wait_for(conn, [instance])[instance] == ("completed", None)
    [(effect_id, attempt, state, provider_receipt)] = receipts(conn, instance)
    [request] = provider.requests_to("/charge")
    assert (attempt, state) == (0, "committed")
    assert provider_receipt == "r-1"
    assert request.headers["idempotency-key"] == str(effect_id)
    assert request.json == {"amount": 42}


def test_a_503_is_not_resent_by_default(db_url, conn, provider):
    # a 503 may have charged: without a deduplicating provider nothing is sent again, the
    # receipt stays unknown for an operator (the README's rule)
    provider.reply("/charge", status=503, json={"error": "busy"})
    seq = make_sequence(conn, [charge_step(provider.url + "/charge")])
    instance = start(conn, seq, {"amount": 1})
    with running(db_url):
        state, error = wait_for(conn, [instance])[instance]
    assert state == "failed" and "HTTP 503" in error
    assert [(a, s) for _, a, s, _ in receipts(conn, instance)] == [(0, "unknown")]
    assert len(provider.requests_to("/charge")) == 1


def test_a_503_then_success_under_the_same_key(db_url, conn, provider):
    provider.reply("/charge", status=503, json={"error": "busy"})
    seq = make_sequence(conn, [charge_step(provider.url + "/charge", provider_idempotency=True)])
    instance = start(conn, seq, {"amount": 1})
    with running(db_url):
        assert wait_for(conn, [instance])[instance] == ("completed", None)
    rows = receipts(conn, instance)
    # the first attempt is settled by the second: one key, one provider object
    assert [(a, s, p) for _, a, s, p in rows] == [(0, "verified", "r-2"), (1, "committed", "r-2")]
    requests = provider.requests_to("/charge")
    assert [r.headers["idempotency-key"] for r in requests] == [str(rows[0][0])] * 2


def test_connection_refused_is_abandoned_with_evidence_and_retried(db_url, conn):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seq = make_sequence(conn, [charge_step(f"http://127.0.0.1:{port}/charge")])
    instance = start(conn, seq, {"amount": 1})
    with running(db_url):
        state, _error = wait_for(conn, [instance])[instance]
    assert state == "failed"  # all three attempts refused
    rows = conn.execute(
        "SELECT attempt, state::text, evidence -> 'not_applied' FROM orch8.effect_receipts"
        " WHERE instance_id = %s ORDER BY attempt",
        (instance,),
    ).fetchall()
    assert [(a, s) for a, s, _ in rows] == [(0, "abandoned"), (1, "abandoned"), (2, "abandoned")]
    assert all(ev and "error" in ev for _, _, ev in rows)
    unresolved = conn.execute(
        "SELECT count(*) FROM orch8.unresolved_effects WHERE instance_id = %s", (instance,)
    ).fetchone()[0]
    assert unresolved == 0  # nothing for an operator to chase: nothing was sent


def test_commit_guard_stops_the_second_identical_send(db_url, conn, provider):
    url = provider.url + "/charge"
    seq = make_sequence(
        conn,
        [charge_step(url, "charge"), charge_step(url, "charge_again")],
        invariants=[
            {
                "name": "charge once",
                "type": "effect_at_most_once",
                "kind": "http",
                "commit_guard": True,
            }
        ],
    )
    instance = start(conn, seq, {"amount": 7})
    with running(db_url):
        state, error = wait_for(conn, [instance])[instance]
    assert state == "failed" and error.startswith("InvariantViolation"), error
    assert len(provider.requests_to("/charge")) == 1
    states = conn.execute(
        "SELECT block_id, state::text FROM orch8.effect_receipts WHERE instance_id = %s"
        " ORDER BY block_id",
        (instance,),
    ).fetchall()
    assert states == [("charge", "committed"), ("charge_again", "prepared")]


def test_completion_and_failure_webhooks_are_delivered_signed(db_url, conn, provider):
    from orch8_py.webhooks import verify

    conn.execute(
        "SELECT orch8.create_webhook_subscription('t1', %s, 'hush', %s)",
        (provider.url + "/hook", ["instance.completed", "instance.failed"]),
    )
    ok_seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    bad_seq = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "a",
                "handler": "fail",
                "params": {"message": "no"},
                "retry": {"max_attempts": 1},
            }
        ],
    )
    done, failed = start(conn, ok_seq), start(conn, bad_seq)
    with running(db_url):
        wait_for(conn, [done, failed])
        deadline = time.monotonic() + 20
        while len(provider.requests_to("/hook")) < 2:
            assert time.monotonic() < deadline, "webhooks not delivered"
            time.sleep(0.05)
    events = {}
    for r in provider.requests_to("/hook"):
        h = r.headers
        assert verify("hush", h["x-orch8-timestamp"], r.body, h["x-orch8-signature"])
        events[r.json["instance_id"]] = r.json["event"]
    assert events == {str(done): "instance.completed", str(failed): "instance.failed"}
