"""Outbound webhooks against a real PostgreSQL and a real local HTTP receiver.

The receiver is an http.server on 127.0.0.1 (port 0) in a thread: it records every
request and answers from a script of statuses. No test sleeps to wait for backoff: the
deliverer's connection moves orch8.fake_now, or the backoff is 0.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
from collections import Counter
from datetime import UTC, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
import pytest

from orch8_py import webhooks
from orch8_py.errors import InvalidInput, InvalidTransition, NotFound
from orch8_py.sqlapi.base import engine_errors
from orch8_py.webhooks import WebhookDeliverer, sign, verify

SECRET = "whsec-test-0123456789"


# --- the receiver ----------------------------------------------------------------------


class Receiver:
    """Records POSTs; answers each with the next scripted status (then ``default``).

    A scripted answer is a status code, or ("sleep", seconds) to hold the request.
    """

    def __init__(self):
        self.requests: list[dict] = []
        self.script: list = []
        self.default = 200
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.requests.append(
                        {"path": self.path, "headers": dict(self.headers.items()), "body": body}
                    )
                    answer = receiver.script.pop(0) if receiver.script else receiver.default
                if isinstance(answer, tuple):
                    time.sleep(answer[1])
                    answer = 200
                try:
                    self.send_response(answer)
                    if 300 <= answer < 400:
                        self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                    self.send_header("Content-Length", "4")
                    self.end_headers()
                    self.wfile.write(b"ok!\n" if answer < 300 else b"boom")
                except OSError:
                    pass  # the client gave up (timeout test)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/orch8?token=abc"

    def answer(self, *statuses, default: int | None = None) -> None:
        with self.lock:
            self.script = list(statuses)
            if default is not None:
                self.default = default

    def received(self) -> list[dict]:
        with self.lock:
            return list(self.requests)

    def per_delivery(self) -> Counter:
        return Counter(r["headers"]["X-Orch8-Delivery"] for r in self.received())

    def wait_for(self, count: int, timeout: float = 10.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.received()
            if len(got) >= count:
                return got
            time.sleep(0.02)
        raise AssertionError(f"receiver got {len(self.received())} requests, wanted {count}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def other_receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def deliverers(db_url):
    made: list[WebhookDeliverer] = []

    def make(worker="d1", **kw) -> WebhookDeliverer:
        d = WebhookDeliverer(db_url, worker, **kw)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- database helpers ------------------------------------------------------------------


def sequence(conn, tenant="t1") -> str:
    return conn.execute(
        "INSERT INTO orch8.sequences (tenant_id, name, version, definition)"
        " VALUES (%s, 'flow', 1,"
        ' \'{"blocks": [{"id": "a", "type": "step", "handler": "noop"}]}\')'
        " RETURNING id",
        (tenant,),
    ).fetchone()[0]


@pytest.fixture
def seq(conn):
    return sequence(conn)


def subscribe(conn, url, tenant="t1", events=None, secret=SECRET):
    with engine_errors():
        if events is None:
            return conn.execute(
                "SELECT orch8.create_webhook_subscription(%s, %s, %s)", (tenant, url, secret)
            ).fetchone()[0]
        return conn.execute(
            "SELECT orch8.create_webhook_subscription(%s, %s, %s, %s)",
            (tenant, url, secret, events),
        ).fetchone()[0]


def start(conn, seq_id, tenant="t1"):
    """Create an instance and claim it (it is then running). Returns its id."""
    instance = conn.execute(
        "SELECT id FROM orch8.create_instance(%s, %s)", (tenant, seq_id)
    ).fetchone()[0]
    claimed = conn.execute(
        "SELECT instance_id AS id FROM orch8.claim_due_nodes('w1', 1, '30 seconds')"
    ).fetchall()
    assert claimed == [(instance,)]
    return instance


def finish(conn, seq_id, tenant="t1", to="completed", reason=None):
    instance = start(conn, seq_id, tenant)
    moved = conn.execute(
        "SELECT orch8.transition_instance(%s, %s, 'running', %s, 'runner', %s)",
        (tenant, instance, to, reason),
    ).fetchone()[0]
    assert moved
    return instance


def outbox(conn, tenant="t1"):
    return conn.execute(
        "SELECT id, subscription_id, event, instance_id, payload, state, attempts, last_status,"
        " last_error, next_attempt_at, delivered_at FROM orch8.webhook_outbox"
        " WHERE tenant_id = %s ORDER BY id",
        (tenant,),
    ).fetchall()


def row_state(conn, delivery_id, tenant="t1"):
    return conn.execute(
        "SELECT state, attempts, last_status, last_error FROM orch8.webhook_outbox"
        " WHERE tenant_id = %s AND id = %s",
        (tenant, delivery_id),
    ).fetchone()


def call(conn, sql, *params):
    with engine_errors():
        return conn.execute(sql, params).fetchone()[0]


# --- signing ---------------------------------------------------------------------------


def test_sign_is_hmac_sha256_over_timestamp_dot_body():
    body = b'{"event":"instance.completed"}'
    expected = hmac.new(SECRET.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign(SECRET, 1700000000, body) == expected
    assert sign(SECRET, "1700000000", body) == expected


def test_verify_accepts_the_right_signature_and_nothing_else():
    body = b'{"a":1}'
    now = 1_700_000_000
    header = "sha256=" + sign(SECRET, now, body)
    assert verify(SECRET, str(now), body, header, now=now)
    assert verify(SECRET, now, body, header.upper().replace("SHA256=", "sha256="), now=now)
    assert not verify(SECRET, now, b'{"a":2}', header, now=now)  # tampered body
    assert not verify("other-secret", now, body, header, now=now)
    assert not verify(SECRET, now + 1, body, header, now=now)  # timestamp is signed too
    assert not verify(SECRET, now, body, header.removeprefix("sha256="), now=now)
    assert not verify(SECRET, now, body, None, now=now)
    assert not verify(SECRET, "12x", body, header, now=now)
    assert not verify(SECRET, now, body, "sha256=zz\u00e9", now=now)
    # replay window: 300 s by default, configurable, or off
    assert not verify(SECRET, now, body, header, now=now + 301)
    assert verify(SECRET, now, body, header, now=now + 301, tolerance=600)
    assert verify(SECRET, now, body, header, tolerance=None)


# --- the outbox trigger ----------------------------------------------------------------


def test_completion_writes_one_outbox_row_in_the_same_transaction(conn, db_url, seq, receiver):
    sub = subscribe(conn, receiver.url)
    instance = start(conn, seq)
    assert outbox(conn) == []  # created, claimed: no events

    listener = psycopg.connect(db_url, autocommit=True)
    listener.execute("LISTEN orch8_webhooks")
    try:
        # rolled back: no row, no notification
        with conn.transaction():
            assert conn.execute(
                "SELECT orch8.transition_instance('t1', %s, 'running', 'completed', 'runner')",
                (instance,),
            ).fetchone()[0]
            assert len(outbox(conn)) == 1  # visible inside the transaction
            raise psycopg.Rollback()
        assert outbox(conn) == []
        state = conn.execute(
            "SELECT state::text FROM orch8.task_instances WHERE id = %s", (instance,)
        ).fetchone()[0]
        assert state == "running"
        assert list(listener.notifies(timeout=0.3)) == []

        # committed: exactly one row and one notification
        assert conn.execute(
            "SELECT orch8.transition_instance('t1', %s, 'running', 'completed', 'runner')",
            (instance,),
        ).fetchone()[0]
        notes = list(listener.notifies(timeout=5, stop_after=1))
        assert [n.channel for n in notes] == ["orch8_webhooks"]
    finally:
        listener.close()

    rows = outbox(conn)
    assert len(rows) == 1
    _id, sub_id, event, inst, payload, state, attempts, *_ = rows[0]
    assert (sub_id, event, inst, state, attempts) == (
        sub,
        "instance.completed",
        instance,
        "pending",
        0,
    )
    at = conn.execute(
        "SELECT at FROM orch8.instance_transitions WHERE instance_id = %s"
        " AND to_state = 'completed'",
        (instance,),
    ).fetchone()[0]
    assert payload == {
        "event": "instance.completed",
        "tenant_id": "t1",
        "instance_id": str(instance),
        "state": "completed",
        "reason": None,
        "at": at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "sequence_id": str(seq),
        "sequence_version": 1,
    }


def test_each_subscription_gets_only_the_events_it_asked_for(conn, seq, receiver):
    on_complete = subscribe(conn, receiver.url, events=["instance.completed"])
    on_fail = subscribe(conn, receiver.url, events=["instance.failed"])
    both = subscribe(conn, receiver.url)
    disabled = subscribe(conn, receiver.url)
    conn.execute(
        "UPDATE orch8.webhook_subscriptions SET enabled = false WHERE id = %s", (disabled,)
    )

    done = finish(conn, seq)
    failed = finish(conn, seq, to="failed", reason="step charge: card declined")
    # non-terminal moves write nothing
    paused = start(conn, seq)
    conn.execute("SELECT orch8.transition_instance('t1', %s, 'running', 'paused', 'op')", (paused,))

    got = {(r[1], r[2], r[3]) for r in outbox(conn)}
    assert got == {
        (on_complete, "instance.completed", done),
        (both, "instance.completed", done),
        (on_fail, "instance.failed", failed),
        (both, "instance.failed", failed),
    }
    failed_payload = next(r[4] for r in outbox(conn) if r[2] == "instance.failed")
    assert failed_payload["state"] == "failed"
    assert failed_payload["reason"] == "step charge: card declined"


def test_create_subscription_validates_its_input(conn):
    for url in ("ftp://example.com/x", "http://", "example.com/hook", "https:// space", None):
        with pytest.raises(InvalidInput):
            subscribe(conn, url)
    with pytest.raises(InvalidInput, match=r"unknown webhook event\(s\): instance.started"):
        subscribe(conn, "https://example.com/h", events=["instance.completed", "instance.started"])
    with pytest.raises(InvalidInput, match="at least one event"):
        subscribe(conn, "https://example.com/h", events=[])
    with pytest.raises(InvalidInput, match="secret"):
        subscribe(conn, "https://example.com/h", secret="")
    with pytest.raises(InvalidInput):
        subscribe(conn, "https://example.com/h", tenant="")
    assert conn.execute("SELECT count(*) FROM orch8.webhook_subscriptions").fetchone()[0] == 0
    sub = subscribe(conn, "HTTPS://hooks.example.com:8443/x?y=1", events=["instance.failed"] * 2)
    events = conn.execute(
        "SELECT events FROM orch8.webhook_subscriptions WHERE id = %s", (sub,)
    ).fetchone()[0]
    assert events == ["instance.failed"]


# --- delivery --------------------------------------------------------------------------


def test_deliver_once_posts_a_signed_request(conn, seq, receiver, deliverers):
    subscribe(conn, receiver.url)
    instance = finish(conn, seq)
    ((delivery_id, *_rest),) = outbox(conn)

    before = int(time.time())
    assert deliverers().deliver_once() == 1
    (req,) = receiver.received()
    h = req["headers"]
    assert req["path"] == "/hooks/orch8?token=abc"
    assert h["Content-Type"] == "application/json"
    assert h["X-Orch8-Event"] == "instance.completed"
    assert h["X-Orch8-Delivery"] == str(delivery_id)
    assert before <= int(h["X-Orch8-Timestamp"]) <= int(time.time())
    assert h["X-Orch8-Signature"].startswith("sha256=")
    assert verify(SECRET, h["X-Orch8-Timestamp"], req["body"], h["X-Orch8-Signature"])
    assert not verify("wrong", h["X-Orch8-Timestamp"], req["body"], h["X-Orch8-Signature"])
    body = json.loads(req["body"])
    assert body["event"] == "instance.completed"
    assert body["instance_id"] == str(instance)
    assert body["tenant_id"] == "t1"

    state, attempts, status, error, *_ = row_state(conn, delivery_id)
    assert (state, attempts, status, error) == ("delivered", 1, 200, None)
    assert deliverers("d2").deliver_once() == 0  # nothing left
    assert len(receiver.received()) == 1


def test_500_then_200_is_retried_after_the_backoff(conn, seq, receiver, deliverers):
    subscribe(conn, receiver.url)
    finish(conn, seq)
    ((delivery_id, *_rest),) = outbox(conn)
    receiver.answer(500, 503, 200)
    d = deliverers(backoff=timedelta(seconds=5))
    clock = conn.execute("SELECT now() + interval '1 second'").fetchone()[0]
    d.conn.execute("SELECT set_config('orch8.fake_now', %s, false)", (clock.isoformat(),))

    assert d.deliver_once() == 1
    assert row_state(conn, delivery_id)[:3] == ("pending", 1, 500)
    assert "http_status: 500" in row_state(conn, delivery_id)[3]
    due = conn.execute(
        "SELECT next_attempt_at FROM orch8.webhook_outbox WHERE id = %s", (delivery_id,)
    ).fetchone()[0]
    assert due == clock + timedelta(seconds=5)  # backoff * 2^0
    assert d.deliver_once() == 0  # not due yet

    clock = due
    d.conn.execute("SELECT set_config('orch8.fake_now', %s, false)", (clock.isoformat(),))
    assert d.deliver_once() == 1
    assert row_state(conn, delivery_id)[:3] == ("pending", 2, 503)
    due = conn.execute(
        "SELECT next_attempt_at FROM orch8.webhook_outbox WHERE id = %s", (delivery_id,)
    ).fetchone()[0]
    assert due == clock + timedelta(seconds=10)  # backoff * 2^1

    d.conn.execute("SELECT set_config('orch8.fake_now', %s, false)", (due.isoformat(),))
    assert d.deliver_once() == 1
    assert row_state(conn, delivery_id) == ("delivered", 3, 200, None)
    reqs = receiver.received()
    assert [r["headers"]["X-Orch8-Delivery"] for r in reqs] == [str(delivery_id)] * 3
    for r in reqs:
        h = r["headers"]
        assert verify(
            SECRET, h["X-Orch8-Timestamp"], r["body"], h["X-Orch8-Signature"], tolerance=None
        )


def test_parked_after_max_attempts_then_redeliver_and_discard(conn, seq, receiver, deliverers):
    subscribe(conn, receiver.url)
    finish(conn, seq)
    finish(conn, seq)
    first, second = (r[0] for r in outbox(conn))
    receiver.answer(default=500)
    d = deliverers(max_attempts=3, backoff=0)

    assert [d.deliver_once() for _ in range(4)] == [2, 2, 2, 0]
    for delivery_id in (first, second):
        state, attempts, status, error = row_state(conn, delivery_id)
        assert (state, attempts, status) == ("parked", 3, 500)
        assert error.startswith("http_status: 500")
    assert len(receiver.received()) == 6

    # redeliver: back to pending with a fresh attempt budget
    assert call(conn, "SELECT orch8.redeliver_webhook('t1', %s)", first) == "pending"
    assert row_state(conn, first)[:2] == ("pending", 0)
    receiver.answer(default=200)
    assert d.deliver_once() == 1
    assert row_state(conn, first)[:3] == ("delivered", 1, 200)

    # discard the other one; it is never sent again
    assert call(conn, "SELECT orch8.discard_webhook('t1', %s)", second) == "discarded"
    assert d.deliver_once() == 0
    with pytest.raises(InvalidTransition):
        call(conn, "SELECT orch8.discard_webhook('t1', %s)", second)
    with pytest.raises(InvalidTransition):
        call(conn, "SELECT orch8.discard_webhook('t1', %s)", first)  # delivered
    # a delivered one can be sent again on request; a pending one cannot be redelivered
    assert call(conn, "SELECT orch8.redeliver_webhook('t1', %s)", first) == "pending"
    with pytest.raises(InvalidTransition):
        call(conn, "SELECT orch8.redeliver_webhook('t1', %s)", first)
    with pytest.raises(NotFound):
        call(conn, "SELECT orch8.redeliver_webhook('t1', %s)", 999_999)
    with pytest.raises(NotFound):
        call(conn, "SELECT orch8.discard_webhook('t2', %s)", first)  # another tenant's row
    assert d.deliver_once() == 1
    assert receiver.per_delivery() == {str(first): 5, str(second): 3}


def test_network_errors_redirects_and_timeouts_are_failures(conn, seq, receiver, deliverers):
    dead = subscribe(conn, f"http://127.0.0.1:{closed_port()}/hook")
    finish(conn, seq)
    d = deliverers(backoff=0, timeout=0.5)
    assert d.deliver_once() == 1
    state, attempts, status, error = conn.execute(
        "SELECT state, attempts, last_status, last_error FROM orch8.webhook_outbox"
        " WHERE subscription_id = %s",
        (dead,),
    ).fetchone()
    assert (state, attempts, status) == ("pending", 1, None)
    assert error.startswith("connect: ")
    conn.execute("SELECT orch8.discard_webhook('t1', id) FROM orch8.webhook_outbox")

    conn.execute("UPDATE orch8.webhook_subscriptions SET enabled = false")
    subscribe(conn, receiver.url)
    finish(conn, seq)
    receiver.answer(302, ("sleep", 1.5), 200)
    assert d.deliver_once() == 1
    ((_, _, _, _, _, state, _, status, error, *_),) = [
        r for r in outbox(conn) if r[5] != "discarded"
    ]
    assert (state, status) == ("pending", 302)
    assert error.startswith("redirect_rejected: 302")
    assert d.deliver_once() == 1
    ((_, _, _, _, _, state, attempts, status, error, *_),) = [
        r for r in outbox(conn) if r[5] != "discarded"
    ]
    assert (state, attempts, status) == ("pending", 2, None)
    assert error.startswith("timeout: ")
    assert d.deliver_once() == 1
    assert [r[5] for r in outbox(conn) if r[5] != "discarded"] == ["delivered"]


def test_other_tenants_subscriptions_get_nothing(conn, seq, receiver, other_receiver, deliverers):
    subscribe(conn, receiver.url, tenant="t1")
    subscribe(conn, other_receiver.url, tenant="t2", secret="t2-secret")
    t2_seq = sequence(conn, "t2")

    finish(conn, seq, tenant="t1")
    finish(conn, seq, tenant="t1", to="failed", reason="boom")
    assert outbox(conn, "t2") == []
    assert deliverers().deliver_once() == 2
    assert len(receiver.received()) == 2
    assert other_receiver.received() == []

    finish(conn, t2_seq, tenant="t2")
    assert deliverers("d2").deliver_once() == 1
    (req,) = other_receiver.received()
    h = req["headers"]
    assert json.loads(req["body"])["tenant_id"] == "t2"
    assert verify("t2-secret", h["X-Orch8-Timestamp"], req["body"], h["X-Orch8-Signature"])
    assert not verify(SECRET, h["X-Orch8-Timestamp"], req["body"], h["X-Orch8-Signature"])
    assert len(receiver.received()) == 2


def test_disabled_subscription_holds_its_queued_deliveries(conn, seq, receiver, deliverers):
    sub = subscribe(conn, receiver.url)
    finish(conn, seq)
    conn.execute("UPDATE orch8.webhook_subscriptions SET enabled = false WHERE id = %s", (sub,))
    d = deliverers()
    assert d.deliver_once() == 0
    assert [r[5] for r in outbox(conn)] == ["pending"]
    conn.execute("UPDATE orch8.webhook_subscriptions SET enabled = true WHERE id = %s", (sub,))
    assert d.deliver_once() == 1
    assert [r[5] for r in outbox(conn)] == ["delivered"]


def test_an_expired_claim_is_taken_over_and_the_late_result_is_stale(
    conn, seq, receiver, deliverers
):
    subscribe(conn, receiver.url)
    finish(conn, seq)
    ((delivery_id, *_rest),) = outbox(conn)
    # a deliverer claims it and dies before recording anything
    crashed = conn.execute(
        "SELECT id FROM orch8.claim_webhook_deliveries('crashed', 10, '30 seconds')"
    ).fetchall()
    assert crashed == [(delivery_id,)]
    d = deliverers("d2")
    assert d.deliver_once() == 0  # still claimed
    d.conn.execute("SET orch8.fake_now = '2999-01-01 00:00:00+00'")
    assert d.deliver_once() == 1
    state, attempts, _, error = row_state(conn, delivery_id)
    assert (state, attempts, error) == ("delivered", 1, None)
    late = call(
        conn,
        "SELECT orch8.record_webhook_delivery('t1', %s, 'crashed', false, 500, 'late')",
        delivery_id,
    )
    assert late == "stale"
    assert row_state(conn, delivery_id)[0] == "delivered"
    assert len(receiver.received()) == 1


def test_two_deliverers_racing_never_deliver_a_row_twice(conn, seq, receiver, deliverers):
    subscribe(conn, receiver.url)
    racers = [deliverers("racer-a", batch=3), deliverers("racer-b", batch=3)]
    rounds, per_round = 20, 5
    claimed_by_both = 0
    for _ in range(rounds):
        for _ in range(per_round):
            finish(conn, seq)
        barrier = threading.Barrier(len(racers))
        results: list[int] = [0] * len(racers)

        def go(i, barrier=barrier, results=results):
            barrier.wait(timeout=30)
            results[i] = racers[i].deliver_once()

        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(racers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        claimed_by_both += all(results)
        # whatever neither racer reached this round
        while racers[0].deliver_once():
            pass
    counts = receiver.per_delivery()
    assert len(counts) == rounds * per_round
    assert set(counts.values()) == {1}, [k for k, v in counts.items() if v > 1]
    states = conn.execute(
        "SELECT state, count(*) FROM orch8.webhook_outbox GROUP BY state"
    ).fetchall()
    assert states == [("delivered", rounds * per_round)]
    assert claimed_by_both > 0  # the race really happened


def test_a_pool_can_back_the_deliverer(db_url, conn, seq, receiver):
    from psycopg_pool import ConnectionPool

    subscribe(conn, receiver.url)
    finish(conn, seq)
    with ConnectionPool(db_url, min_size=1, max_size=2, open=True) as pool:
        d = WebhookDeliverer(pool, "pooled")
        assert d.deliver_once() == 1
        assert d.deliver_once() == 0
        with pytest.raises(TypeError):
            _ = d.conn
    assert [r[5] for r in outbox(conn)] == ["delivered"]


def test_run_wakes_on_notify_survives_a_lost_connection_and_bad_endpoints(
    conn, seq, receiver, deliverers, caplog
):
    caplog.set_level("INFO", logger="orch8.webhooks")
    subscribe(conn, receiver.url)
    subscribe(conn, f"http://127.0.0.1:{closed_port()}/dead")
    # a 30 s poll: only the NOTIFY can wake it within the test's waits
    d = deliverers("looper", backoff=0, max_attempts=2, poll_interval=30)
    pid = d.conn.info.backend_pid
    stop = threading.Event()
    loop = threading.Thread(target=d.run, args=(stop,), daemon=True)
    loop.start()
    try:
        time.sleep(0.3)  # let it reach the wait
        finish(conn, seq)
        receiver.wait_for(1)

        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "event=webhook.db_error" not in caplog.text:
            time.sleep(0.02)
        assert "event=webhook.db_error" in caplog.text
        finish(conn, seq)
        receiver.wait_for(2)
        assert loop.is_alive()
    finally:
        stop.set()
        loop.join(timeout=10)
    assert not loop.is_alive()
    assert "event=webhook.delivered" in caplog.text
    assert "error=" in caplog.text and "connect:" in caplog.text
    assert "token=abc" not in caplog.text  # query strings (secrets) stay out of logs
    assert receiver.per_delivery() and set(receiver.per_delivery().values()) == {1}


def test_post_never_raises_on_a_malformed_url():
    attempt = webhooks.post("http://[::1", b"{}", {}, 1.0)
    assert not attempt.ok and attempt.status is None and attempt.error
