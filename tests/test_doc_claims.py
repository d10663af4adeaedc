"""Documented claims that had no test of their own (docs/CLI.md, docs/WEBHOOKS.md,
docs/HANDLERS.md). Each test asserts what the doc states, against a real PostgreSQL, a
real HTTP provider on loopback and the real `orch8` command in a subprocess."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import uuid
from datetime import timedelta

import pytest
from psycopg.types.json import Jsonb

import orch8_py
from orch8_py.handlers import StepError
from orch8_py.handlers import http as handler_http
from orch8_py.webhooks import WebhookDeliverer
from tests.cli_helpers import assert_one_line_error, orch8_env, run_orch8
from tests.handler_helpers import make_ctx, run
from tests.http_provider import provider_fixture  # noqa: F401  (fixture "provider")
from tests.runner_helpers import TENANT, make_sequence

SECRET = "whsec-doc-claims-42"


# --- helpers ----------------------------------------------------------------------------


def orch8(db_url: str, *args: str, **env: str):
    return run_orch8(*args, env=orch8_env(ORCH8_DATABASE_URL=db_url, USER="tester", **env))


def refused(db_url: str, code: int, *args: str, fragments=()) -> str:
    """The command exits ``code`` with one ``orch8: error:`` line and nothing on stdout."""
    proc = orch8(db_url, *args)
    assert proc.returncode == code, (args, proc.returncode, proc.stdout, proc.stderr)
    assert_one_line_error(proc, *fragments)
    assert proc.stdout == "", proc.stdout
    return next(ln for ln in proc.stderr.splitlines() if ln.startswith("orch8: error:"))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _claim(conn) -> uuid.UUID:
    return conn.execute(
        "SELECT lease_token FROM orch8.claim_due_nodes('w1', 1, '30 seconds')"
    ).fetchone()[0]


def _begin(conn, instance, token):
    return conn.execute(
        "SELECT outcome, effect_id FROM orch8.begin_step("
        "%s, %s, %s, 'charge', 'test.docs.charge', %s, 0)",
        (TENANT, instance, token, Jsonb({"url": "https://pay.example/charge"})),
    ).fetchone()


def charge_sequence(conn) -> uuid.UUID:
    return make_sequence(conn, [{"type": "step", "id": "charge", "handler": "test.docs.charge"}])


def dispatched_receipt(conn) -> uuid.UUID:
    """A receipt the runner dispatched and has not settled (its instance is running)."""
    instance = conn.execute(
        "SELECT id FROM orch8.create_instance(%s, %s)", (TENANT, charge_sequence(conn))
    ).fetchone()[0]
    outcome, effect_id = _begin(conn, instance, _claim(conn))
    assert outcome != "blocked", outcome
    assert _receipt_state(conn, effect_id) == "dispatched"
    return effect_id


def unknown_receipt(conn) -> uuid.UUID:
    """A receipt left unknown: its attempt began, the run was lost, another claim began it
    again (the instance is failed, blocked on it)."""
    instance = conn.execute(
        "SELECT id FROM orch8.create_instance(%s, %s)", (TENANT, charge_sequence(conn))
    ).fetchone()[0]
    token = _claim(conn)
    _begin(conn, instance, token)
    conn.execute("SELECT orch8.release_lease(%s, %s, %s)", (TENANT, instance, token))
    outcome, effect_id = _begin(conn, instance, _claim(conn))
    assert outcome == "blocked"
    assert _receipt_state(conn, effect_id) == "unknown"
    return effect_id


def _receipt_state(conn, effect_id) -> str:
    return conn.execute(
        "SELECT state::text FROM orch8.effect_receipts WHERE id = %s", (effect_id,)
    ).fetchone()[0]


# --- docs/CLI.md: exit codes ------------------------------------------------------------


def test_cli_schema_not_current_is_exit_1_telling_to_migrate(empty_db_url):
    # CLI.md:14 "The schema must be current (`orch8 db migrate`), otherwise ... exit 1"
    # CLI.md:32 exit 1: "schema not current"
    refused(empty_db_url, 1, "instances", "list", "--json", fragments=("orch8 db migrate",))


def test_cli_database_unreachable_is_exit_1_in_one_line():
    # CLI.md:32 exit 1: "database unreachable"
    url = f"postgresql://postgres@127.0.0.1:{closed_port()}/postgres"
    refused(url, 1, "instances", "list", fragments=("cannot connect to PostgreSQL",))


# --- docs/CLI.md: limits, durations, resolve refusals -----------------------------------


def test_cli_limit_above_10000_is_exit_2_and_10000_is_accepted(db_url):
    # CLI.md:113 "at most `--limit` rows (default 50, at most 10000)"; CLI.md:33 exit 2
    refused(db_url, 2, "instances", "list", "--limit", "10001", fragments=("--limit",))
    proc = orch8(db_url, "instances", "list", "--limit", "10000", "--json")
    assert (proc.returncode, proc.stderr, json.loads(proc.stdout)) == (0, "", [])


def test_cli_older_than_accepts_a_sum_such_as_1h30m(db_url, conn):
    # CLI.md:213-214 "`--older-than` ... (`30s`, `10m`, `2h`, `1d`, also sums such as `1h30m`)"
    effect_id = unknown_receipt(conn)
    created = conn.execute(
        "SELECT created_at FROM orch8.effect_receipts WHERE id = %s", (effect_id,)
    ).fetchone()[0]

    def listed(age: timedelta) -> list[str]:
        clock = (created + age).isoformat()  # the engine clock, orch8.fake_now
        proc = orch8(
            db_url,
            "effects",
            "unresolved",
            "--older-than",
            "1h30m",
            "--tenant",
            TENANT,
            "--json",
            PGOPTIONS=f"-c orch8.fake_now={clock}",
        )
        assert proc.returncode == 0 and proc.stderr == "", (proc.returncode, proc.stderr)
        return [r["effect_id"] for r in json.loads(proc.stdout)]

    assert listed(timedelta(minutes=91)) == [str(effect_id)]  # 1h30m is 90 minutes
    assert listed(timedelta(minutes=89)) == []


def test_cli_resolve_compensated_without_evidence_is_exit_2(db_url, conn):
    # CLI.md:272 "`--evidence` ... is required for `abandoned` and `compensated`"; CLI.md:291
    effect_id = unknown_receipt(conn)
    refused(
        db_url,
        2,
        "effects",
        "resolve",
        str(effect_id),
        "--state",
        "compensated",
        "--expected-state",
        "unknown",
        "--tenant",
        TENANT,
        fragments=("resolving to compensated needs evidence (what you looked at)",),
    )
    assert _receipt_state(conn, effect_id) == "unknown"


def test_cli_resolve_committed_to_committed_is_exit_1_naming_the_current_state(db_url, conn):
    # CLI.md:32 and the refusal table, CLI.md:290 (message quoted there)
    effect_id = unknown_receipt(conn)
    conn.execute(
        "SELECT orch8.resolve_effect(%s, %s, 'unknown', 'committed', 'ch_1', %s, 'test')",
        (TENANT, effect_id, Jsonb({"found": "ch_1"})),
    )
    line = refused(
        db_url,
        1,
        "effects",
        "resolve",
        str(effect_id),
        "--state",
        "committed",
        "--expected-state",
        "committed",
        "--tenant",
        TENANT,
    )
    assert line == (
        f"orch8: error: receipt {effect_id} cannot be resolved from committed to committed"
        " (current state: committed; it can be resolved to: compensated)"
    )
    assert _receipt_state(conn, effect_id) == "committed"


def test_cli_resolve_a_dispatched_receipt_is_exit_1_naming_the_current_state(db_url, conn):
    # CLI.md:290 "a move the transition table does not allow (a `dispatched` receipt, ...)"
    effect_id = dispatched_receipt(conn)
    refused(
        db_url,
        1,
        "effects",
        "resolve",
        str(effect_id),
        "--state",
        "committed",
        "--evidence",
        '{"checked": "dashboard"}',
        "--expected-state",
        "dispatched",
        "--tenant",
        TENANT,
        fragments=(
            f"receipt {effect_id} cannot be resolved from dispatched to committed",
            "current state: dispatched",
        ),
    )
    assert _receipt_state(conn, effect_id) == "dispatched"


# --- docs/CLI.md: idempotent start ------------------------------------------------------


def test_cli_start_with_a_repeated_idempotency_key_returns_the_existing_instance(db_url, conn):
    # CLI.md:109 "A repeated `--idempotency-key` returns the existing instance
    # (`"deduplicated": true`)."
    make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}], name="checkout")
    args = ("instances", "start", "checkout", "--idempotency-key", "order-7", "--tenant", TENANT)
    runs = []
    for _ in range(2):
        proc = orch8(db_url, *args, "--json")
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        runs.append(json.loads(proc.stdout))
    first, second = runs
    assert first["deduplicated"] is False
    assert second["deduplicated"] is True
    assert second["id"] == first["id"]
    count = conn.execute(
        "SELECT count(*) FROM orch8.task_instances WHERE tenant_id = %s", (TENANT,)
    ).fetchone()[0]
    assert count == 1


# --- docs/WEBHOOKS.md -------------------------------------------------------------------


def _finished_instance(conn, tenant: str = TENANT) -> uuid.UUID:
    """An instance moved to completed (which writes the outbox rows)."""
    seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    instance = conn.execute(
        "SELECT id FROM orch8.create_instance(%s, %s)", (tenant, seq)
    ).fetchone()[0]
    _claim(conn)
    assert conn.execute(
        "SELECT orch8.transition_instance(%s, %s, 'running', 'completed', 'runner')",
        (tenant, instance),
    ).fetchone()[0]
    return instance


def _subscribe(conn, url: str) -> uuid.UUID:
    return conn.execute(
        "SELECT orch8.create_webhook_subscription(%s, %s, %s)", (TENANT, url, SECRET)
    ).fetchone()[0]


def _expected_signature(timestamp: str, body: bytes) -> str:
    digest = hmac.new(SECRET.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def _outbox(conn, delivery_id):
    return conn.execute(
        "SELECT state, attempts, last_status, last_error, payload FROM orch8.webhook_outbox"
        " WHERE tenant_id = %s AND id = %s",
        (TENANT, delivery_id),
    ).fetchone()


def test_webhook_headers_user_agent_and_signature(db_url, conn, provider):
    # WEBHOOKS.md:80 compact JSON with sorted keys; WEBHOOKS.md:108-115 the headers
    _subscribe(conn, provider.url + "/hook")
    _finished_instance(conn)
    (delivery_id,) = (r[0] for r in conn.execute("SELECT id FROM orch8.webhook_outbox"))
    with WebhookDeliverer(db_url, "doc-claims") as d:
        assert d.deliver_once() == 1
    (req,) = provider.requests_to("/hook")
    h = req.headers
    assert req.method == "POST"
    assert h["user-agent"] == f"orch8-py/{orch8_py.__version__} (webhooks)"
    assert h["content-type"] == "application/json"
    assert h["x-orch8-event"] == "instance.completed"
    assert h["x-orch8-delivery"] == str(delivery_id)
    assert h["x-orch8-timestamp"].isdigit()
    assert h["x-orch8-signature"] == _expected_signature(h["x-orch8-timestamp"], req.body)
    payload = _outbox(conn, delivery_id)[4]
    assert req.body == json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


def test_webhook_redelivery_sends_the_identical_body(db_url, conn, provider):
    # WEBHOOKS.md:104 "a redelivery sends the same body"; WEBHOOKS.md:113 same X-Orch8-Delivery
    _subscribe(conn, provider.url + "/hook")
    _finished_instance(conn)
    (delivery_id,) = (r[0] for r in conn.execute("SELECT id FROM orch8.webhook_outbox"))
    with WebhookDeliverer(db_url, "doc-claims") as d:
        assert d.deliver_once() == 1
        assert _outbox(conn, delivery_id)[0] == "delivered"
        assert (
            conn.execute(
                "SELECT orch8.redeliver_webhook(%s, %s)", (TENANT, delivery_id)
            ).fetchone()[0]
            == "pending"
        )
        assert d.deliver_once() == 1
    first, again = provider.requests_to("/hook")
    assert again.body == first.body
    assert again.headers["x-orch8-delivery"] == first.headers["x-orch8-delivery"]
    ts = again.headers["x-orch8-timestamp"]
    assert again.headers["x-orch8-signature"] == _expected_signature(ts, again.body)
    assert _outbox(conn, delivery_id)[:2] == ("delivered", 1)


def test_webhook_last_error_is_cut_to_2000_characters(db_url, conn, provider):
    # WEBHOOKS.md:211 last_error `http_status: 503 <start of the body>`;
    # WEBHOOKS.md:284 "`last_error` is cut to 2000 characters" (record_webhook_delivery)
    body = "e" * 5000
    provider.reply("/hook", status=500, body=body)
    _subscribe(conn, provider.url + "/hook")
    _finished_instance(conn)
    (delivery_id,) = (r[0] for r in conn.execute("SELECT id FROM orch8.webhook_outbox"))
    with WebhookDeliverer(db_url, "doc-claims", backoff=0) as d:
        assert d.deliver_once() == 1
    state, attempts, status, error, _ = _outbox(conn, delivery_id)
    assert (state, attempts, status) == ("pending", 1, 500)
    assert error.startswith("http_status: 500 eeee") and len(error) <= 2000

    # the cut itself, by the SQL function any deliverer reports through
    claimed = conn.execute(
        "SELECT id FROM orch8.claim_webhook_deliveries('sql-worker', 1)"
    ).fetchall()
    assert claimed == [(delivery_id,)]
    long_error = "x" * 1990 + "0123456789" + "y" * 3000
    assert (
        conn.execute(
            "SELECT orch8.record_webhook_delivery(%s, %s, 'sql-worker', false, 500, %s)",
            (TENANT, delivery_id, long_error),
        ).fetchone()[0]
        == "pending"
    )
    error = _outbox(conn, delivery_id)[3]
    assert len(error) == 2000 and error == long_error[:2000]


# --- docs/HANDLERS.md -------------------------------------------------------------------


@pytest.fixture
def allow_private(monkeypatch):
    """The provider listens on 127.0.0.1 (HANDLERS.md:270 turns the SSRF guard off)."""
    monkeypatch.setenv("ORCH8_ALLOW_PRIVATE_URLS", "1")


def test_http_request_ignores_a_host_header(allow_private, provider):
    # HANDLERS.md:189 "a `Host` in `headers` is ignored"
    out = run(
        "http_request",
        {"url": provider.url + "/h", "headers": {"Host": "evil.example", "X-Kept": "yes"}},
    )
    assert out["status"] == 200
    (req,) = provider.requests_to("/h")
    assert req.headers["host"] == f"127.0.0.1:{provider.port}"
    assert req.headers["x-kept"] == "yes"


def test_http_request_joins_repeated_response_headers(allow_private, provider):
    # HANDLERS.md:197 "names lowercased (repeated headers joined with `, `)"
    # (two dict keys that differ in case: the provider sends two X-Multi lines)
    provider.reply("/m", json={"ok": True}, headers={"X-Multi": "a", "x-multi": "b"})
    out = run("http_request", {"url": provider.url + "/m"})
    assert out["headers"]["x-multi"] == "a, b"
    assert "X-Multi" not in out["headers"]


def test_http_request_parses_a_plus_json_body(allow_private, provider):
    # HANDLERS.md:198 "`json`: the parsed body when the response is `application/json` or
    # `*+json` and parses"
    problem = {"type": "about:blank", "title": "still processing", "status": 200}
    provider.reply(
        "/p",
        body=json.dumps(problem),
        headers={"Content-Type": "application/problem+json; charset=utf-8"},
    )
    out = run("http_request", {"url": provider.url + "/p"})
    assert out["json"] == problem
    assert json.loads(out["body"]) == problem


def test_http_request_default_timeout_ms_is_10000():
    # HANDLERS.md:185 `timeout_ms` default `10000`, "capped at `ctx.timeout`". Waiting 10 s
    # for a behavioural check is too slow: this asserts the seconds the handler uses.
    assert handler_http.timeout_seconds({}, make_ctx(timeout=300.0)) == 10.0
    assert handler_http.timeout_seconds({}, make_ctx(timeout=0)) == 10.0  # no cap
    assert handler_http.timeout_seconds({}, make_ctx(timeout=2.0)) == 2.0  # the cap


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/file", "file:///etc/passwd", "not a url"])
def test_http_request_non_http_url_is_invalid_url_not_retryable(allow_private, url):
    # HANDLERS.md:180 `url`: `http` or `https`; HANDLERS.md:212 "bad URL or scheme"
    with pytest.raises(StepError) as err:
        run("http_request", {"url": url})
    assert (err.value.code, err.value.retryable) == ("invalid_url", False)


def test_http_request_bad_method_is_invalid_params_not_retryable(allow_private, provider):
    # HANDLERS.md:181 methods `GET POST PUT PATCH DELETE HEAD OPTIONS` (any case);
    # HANDLERS.md:213 "bad params": `invalid_params`, retryable False
    for method in ("TRACE", "CONNECT", "", 7):
        with pytest.raises(StepError) as err:
            run("http_request", {"url": provider.url + "/x", "method": method})
        assert (err.value.code, err.value.retryable) == ("invalid_params", False), method
    assert provider.requests == []
    assert run("http_request", {"url": provider.url + "/x", "method": "patch"})["status"] == 200
    assert [r.method for r in provider.requests] == ["PATCH"]


def test_fail_default_message():
    # HANDLERS.md:107-115 `message` default `step failed (fail handler)`, retryable `true`
    with pytest.raises(StepError) as err:
        run("fail", {})
    assert str(err.value) == "step failed (fail handler)"
    assert (err.value.code, err.value.retryable) == (None, True)


def test_assert_default_message():
    # HANDLERS.md:122-125 `message` default `assertion failed: <condition>`,
    # code="assertion_failed", retryable=False
    ctx = make_ctx(handler="assert", context={"data": {"total": 0}, "config": {}, "runtime": {}})
    with pytest.raises(StepError) as err:
        run("assert", {"condition": "data.total > 0"}, ctx)
    assert str(err.value) == "assertion failed: data.total > 0"
    assert (err.value.code, err.value.retryable) == ("assertion_failed", False)
