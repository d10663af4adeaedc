"""The builtin handlers, against a real HTTP provider on loopback and a real PostgreSQL.

No mocks: HTTP goes over sockets to tests/http_provider.py; state goes through the SQL
functions. The only patching is a tripwire that fails a test if the SSRF guard lets a
connection attempt through to a non-loopback address.
"""

from __future__ import annotations

import functools
import logging
import socket
import time
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from orch8_py import handlers
from orch8_py.errors import StaleLease
from orch8_py.handlers import NotApplied, StepContext, StepError
from orch8_py.handlers import http as handler_http
from orch8_py.instance_state import SqlInstanceState
from orch8_py.sqlapi.base import engine_errors
from tests.handler_helpers import make_ctx, run
from tests.http_provider import Provider, provider_fixture  # noqa: F401  (fixture: provider)

TENANT = "t1"
PURE = (
    "noop",
    "log",
    "sleep",
    "fail",
    "assert",
    "transform",
    "set_state",
    "get_state",
    "delete_state",
    "merge_state",
)
SIDE_EFFECTING = ("http_request", "llm_call", "tool_call")


@pytest.fixture(autouse=True)
def allow_private(monkeypatch):
    """The provider listens on 127.0.0.1; SSRF tests remove this again."""
    monkeypatch.setenv("ORCH8_ALLOW_PRIVATE_URLS", "1")


# --- registry ---------------------------------------------------------------------------


def test_builtins_are_registered_under_the_sql_names(conn):
    names = set(handlers.names())
    assert set(PURE + SIDE_EFFECTING) <= names
    rows = dict(
        conn.execute(
            "SELECT name, orch8.handler_has_side_effects(name) FROM unnest(%s::text[]) AS name",
            (list(PURE + SIDE_EFFECTING),),
        ).fetchall()
    )
    assert {n for n, side in rows.items() if side} == set(SIDE_EFFECTING)


# --- pure handlers ----------------------------------------------------------------------


def test_noop():
    assert run("noop", {}) == {}


def test_log_writes_one_structured_line(caplog):
    ctx = make_ctx(block_id="greet", attempt=3)
    with caplog.at_level(logging.DEBUG, logger="orch8.handlers"):
        out = run("log", {"message": 'hello "world"\nsecond line', "level": "warning"}, ctx)
    assert out == {"message": 'hello "world"\nsecond line'}
    [record] = [r for r in caplog.records if r.name == "orch8.handlers"]
    assert record.levelno == logging.WARNING
    line = record.getMessage()
    assert "\n" not in line
    for part in (f"tenant={TENANT}", f"instance={ctx.instance_id}", "block=greet", "attempt=3"):
        assert part in line
    assert 'message="hello \\"world\\"\\nsecond line"' in line


def test_log_rejects_an_unknown_level():
    with pytest.raises(StepError) as info:
        run("log", {"message": "x", "level": "loud"})
    assert info.value.retryable is False


def test_sleep_sleeps_and_refuses_to_outlast_the_step_timeout():
    t0 = time.monotonic()
    assert run("sleep", {"duration_ms": 60}) == {"slept_ms": 60}
    assert time.monotonic() - t0 >= 0.055
    # never cut short in silence: a sleep longer than the step's timeout fails at once
    t0 = time.monotonic()
    with pytest.raises(StepError) as info:
        run("sleep", {"duration_ms": 86_400_000}, make_ctx(timeout=2.0))
    assert time.monotonic() - t0 < 0.5
    assert info.value.retryable is False and info.value.code == "sleep_too_long"
    assert "sleep block" in str(info.value)
    with pytest.raises(StepError):
        run("sleep", {"duration_ms": -1})
    with pytest.raises(StepError):
        run("sleep", {"duration_ms": "10"})


def test_fail_raises_step_error():
    with pytest.raises(StepError) as info:
        run("fail", {"message": "boom"})
    assert str(info.value) == "boom"
    assert info.value.retryable is True
    assert info.value.code is None
    with pytest.raises(StepError) as info:
        run("fail", {"message": "card declined", "code": "declined", "retryable": False})
    assert (info.value.code, info.value.retryable) == ("declined", False)
    assert not isinstance(info.value, NotApplied)


def test_assert_with_an_expression_and_a_boolean():
    ctx = make_ctx(
        context={"data": {"total": 12}, "config": {"limit": 10}, "runtime": {}},
        outputs={"check": {"ok": True}},
    )
    assert run("assert", {"condition": "outputs.check.ok and data.total > 0"}, ctx) == {
        "passed": True
    }
    assert run("assert", {"condition": True}) == {"passed": True}
    with pytest.raises(StepError) as info:
        run("assert", {"condition": "data.total <= config.limit", "message": "too much"}, ctx)
    assert (str(info.value), info.value.retryable) == ("too much", False)
    assert info.value.code == "assertion_failed"
    with pytest.raises(StepError) as info:
        run("assert", {"condition": False})
    assert info.value.retryable is False
    with pytest.raises(StepError) as info:
        run("assert", {"condition": "data.total >"}, ctx)
    assert info.value.retryable is False
    assert "position" in str(info.value)
    with pytest.raises(StepError):
        run("assert", {})


def test_transform_expression_and_value():
    ctx = make_ctx(
        attempt=4,
        context={"data": {"items": [1, 2, 3]}, "config": {"rate": 2}, "runtime": {}},
        outputs={"fetch": {"json": {"name": "Ada"}}},
    )
    out = run(
        "transform",
        {
            "expression": "{n: sum(data.items) * config.rate, who: upper(outputs.fetch.json.name),"
            " attempt: runtime.attempt, block: runtime.block_id}"
        },
        ctx,
    )
    assert out == {"result": {"n": 12, "who": "ADA", "attempt": 4, "block": "b1"}}
    assert run("transform", {"value": {"a": [1, None]}}) == {"result": {"a": [1, None]}}
    assert run("transform", {"value": "data.items"}) == {"result": "data.items"}  # not evaluated
    for bad in ({}, {"expression": "1", "value": 1}, {"expression": 5}):
        with pytest.raises(StepError) as info:
            run("transform", bad)
        assert info.value.retryable is False
    with pytest.raises(StepError) as info:
        run("transform", {"expression": "data.nope"}, ctx)
    assert "data has no key 'nope'" in str(info.value)
    assert info.value.retryable is False
    with pytest.raises(StepError) as info:
        run("transform", {"expression": "__import__('os').system('id')"})
    assert info.value.retryable is False


# --- http_request -----------------------------------------------------------------------


def test_http_request_success_sends_the_effect_id_and_copies_the_receipt(provider):
    ctx = make_ctx(handler="http_request")
    out = run("http_request", {"url": provider.url + "/charge?x=1"}, ctx)
    assert out["status"] == 200
    assert out["json"] == {"ok": True, "receipt_id": "r-1"}
    assert out["receipt_id"] == "r-1"
    assert out["headers"]["content-type"] == "application/json"
    assert all(name == name.lower() for name in out["headers"])
    assert out["body"] == '{"ok": true, "receipt_id": "r-1"}'
    [req] = provider.requests
    assert (req.method, req.path, req.query) == ("GET", "/charge", "x=1")
    assert req.headers["idempotency-key"] == str(ctx.effect_id)


def test_http_request_post_json_headers_and_explicit_idempotency_key(provider):
    provider.reply("/orders", 201, {"provider_receipt_id": "pr-9", "request_id": "q-1"})
    out = run(
        "http_request",
        {
            "method": "post",
            "url": provider.url + "/orders",
            "json": {"amount": 5, "items": ["a"]},
            "headers": {"X-Trace": "abc", "idempotency-key": "from-headers-ignored"},
            "idempotency_key": "order-42",
        },
    )
    assert out["status"] == 201
    assert (out["provider_receipt_id"], out["request_id"]) == ("pr-9", "q-1")
    [req] = provider.requests
    assert req.method == "POST"
    assert req.json == {"amount": 5, "items": ["a"]}
    assert req.headers["content-type"] == "application/json"
    assert req.headers["x-trace"] == "abc"
    assert req.headers["idempotency-key"] == "order-42"


def test_http_request_plain_body_without_json(provider):
    provider.reply("/text", body="plain words")
    out = run("http_request", {"method": "PUT", "url": provider.url + "/text", "body": "hi"})
    assert "json" not in out
    assert out["body"] == "plain words"
    assert provider.requests[0].body == b"hi"
    assert "receipt_id" not in out


def test_http_request_without_effect_id_sends_no_key(provider):
    run("http_request", {"url": provider.url + "/x"}, make_ctx(effect_id=None))
    assert "idempotency-key" not in provider.requests[0].headers


def test_http_request_truncates_a_large_body(provider):
    provider.reply("/big", body="x" * (100 * 1024))
    out = run("http_request", {"url": provider.url + "/big"})
    assert len(out["body"]) == 64 * 1024
    assert out["truncated"] is True


@pytest.mark.parametrize("status", [503, 500, 429, 409, 408])
def test_ambiguous_statuses_are_retryable_step_errors_with_the_status_code(provider, status):
    provider.reply("/flaky", status, {"error": "nope"})
    with pytest.raises(StepError) as info:
        run("http_request", {"url": provider.url + "/flaky"})
    err = info.value
    assert not isinstance(err, NotApplied)
    assert (err.code, err.retryable) == (str(status), True)
    assert str(status) in str(err)
    assert len(provider.requests) == 1


@pytest.mark.parametrize("status", [404, 400])
def test_a_refusing_4xx_is_not_applied_with_the_status_code(provider, status):
    provider.reply("/flaky", status, {"error": "nope"})
    with pytest.raises(NotApplied) as info:
        run("http_request", {"url": provider.url + "/flaky"})
    err = info.value
    assert (err.code, err.retryable, err.reached) == (str(status), True, True)
    assert err.evidence["response"]["json"] == {"error": "nope"}
    assert len(provider.requests) == 1


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_connection_refused_is_not_applied_with_evidence():
    url = f"http://127.0.0.1:{closed_port()}/charge"
    with pytest.raises(NotApplied) as info:
        run("http_request", {"url": url, "method": "POST", "json": {"a": 1}})
    ev = info.value.evidence
    assert ev["url"] == url
    assert ev["stage"] == "connect"
    assert ev["reason"] == "refused"
    assert "refused" in ev["error"].lower()
    assert info.value.retryable is True


def test_a_connect_timeout_is_not_applied():
    """A listener whose accept queue is full drops new SYNs, so connecting times out on
    loopback: no connection, so nothing was sent."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", port))
            fillers.append(c)
        url = f"http://127.0.0.1:{port}/charge"
        with pytest.raises(NotApplied) as info:
            run("http_request", {"url": url, "method": "POST", "timeout_ms": 300})
        assert (info.value.evidence["stage"], info.value.evidence["reason"]) == (
            "connect",
            "connect timeout",
        )
        assert info.value.retryable is True
    finally:
        for c in fillers:
            c.close()
        listener.close()


def test_a_read_timeout_is_ambiguous_not_not_applied(provider):
    provider.reply("/slow", delay=1.5)
    t0 = time.monotonic()
    with pytest.raises(StepError) as info:
        run("http_request", {"url": provider.url + "/slow", "timeout_ms": 200})
    assert time.monotonic() - t0 < 1.4
    assert not isinstance(info.value, NotApplied)
    assert (info.value.code, info.value.retryable) == ("timeout", True)
    assert len(provider.requests) == 1  # it did arrive


def test_the_step_timeout_caps_timeout_ms(provider):
    provider.reply("/slow", delay=1.5)
    with pytest.raises(StepError) as info:
        run("http_request", {"url": provider.url + "/slow"}, make_ctx(timeout=0.2))
    assert info.value.code == "timeout"
    assert not isinstance(info.value, NotApplied)


def test_a_broken_connection_is_ambiguous(provider):
    provider.reply("/drop", drop=True)
    with pytest.raises(StepError) as info:
        run("http_request", {"url": provider.url + "/drop", "method": "POST", "json": {}})
    assert not isinstance(info.value, NotApplied)
    assert info.value.retryable is True
    assert info.value.code == "connection_error"


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"url": 5},
        {"url": "ftp://127.0.0.1/x"},
        {"url": "file:///etc/passwd"},
        {"url": "http://user:pw@127.0.0.1/"},
        {"url": "http://127.0.0.1/", "method": "BREW"},
        {"url": "http://127.0.0.1/", "json": {}, "body": "x"},
        {"url": "http://127.0.0.1/", "body": {"not": "a string"}},
        {"url": "http://127.0.0.1/", "headers": ["x"]},
        {"url": "http://127.0.0.1/", "headers": {"X-A": "a\r\nInjected: 1"}},
        {"url": "http://127.0.0.1/", "timeout_ms": 0},
    ],
)
def test_bad_params_are_permanent(params):
    with pytest.raises(StepError) as info:
        run("http_request", params)
    assert info.value.retryable is False
    assert not isinstance(info.value, NotApplied)


# --- the SSRF guard ---------------------------------------------------------------------


@pytest.fixture
def no_connections(monkeypatch):
    """A tripwire: any outgoing connection attempt fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"a connection was attempted: {args!r}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


BLOCKED = [
    "http://127.0.0.1:9/x",
    "http://127.1.2.3/",
    "http://10.0.0.1/",
    "http://172.16.5.4/",
    "http://192.168.1.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://100.64.0.1/",
    "http://0.0.0.0/",
    "http://224.0.0.1/",
    "http://240.0.0.1/",
    "http://[::1]:9/",
    "http://[::]/",
    "http://[fe80::1]/",
    "http://[fc00::1]/",
    "http://[ff02::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:169.254.169.254]/",
    "https://localhost/",
]


@pytest.mark.parametrize("url", BLOCKED)
def test_ssrf_guard_refuses_before_connecting(monkeypatch, no_connections, url):
    monkeypatch.delenv("ORCH8_ALLOW_PRIVATE_URLS")
    with pytest.raises(StepError) as info:
        run("http_request", {"url": url})
    assert (info.value.code, info.value.retryable) == ("ssrf_blocked", False)
    assert not isinstance(info.value, NotApplied)


def test_ssrf_guard_covers_llm_call_and_tool_call(monkeypatch, no_connections):
    monkeypatch.setenv("ORCH8_ALLOW_PRIVATE_URLS", "0")
    ctx = make_ctx(context={"data": {}, "config": {"llm_api_key": "k"}, "runtime": {}})
    with pytest.raises(StepError) as info:
        run(
            "llm_call",
            {
                "base_url": "http://169.254.169.254/v1",
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
            },
            ctx,
        )
    assert info.value.code == "ssrf_blocked"
    with pytest.raises(StepError) as info:
        run("tool_call", {"url": "http://10.0.0.1/tools", "tool": "t"})
    assert info.value.code == "ssrf_blocked"


def test_ssrf_guard_is_off_with_the_variable(provider):
    # loopback over IPv4 reaches the provider
    assert run("http_request", {"url": provider.url + "/ok"})["status"] == 200
    # non-loopback destinations pass the guard (checked without connecting anywhere)
    for url in ("http://10.0.0.1/", "http://169.254.169.254/latest/meta-data/"):
        target = handler_http.check_url(url)
        assert str(target.url) == url


def test_ssrf_guard_is_off_for_ipv6_loopback():
    with Provider(host="::1") as p6:
        out = run("http_request", {"url": p6.url + "/v6"})
        assert out["status"] == 200
        assert p6.requests[0].path == "/v6"


def test_public_addresses_pass_the_guard():
    import ipaddress

    for ip in ("8.8.8.8", "1.1.1.1", "2001:4860:4860::8888", "::ffff:8.8.8.8"):
        assert handler_http.address_blocked(ipaddress.ip_address(ip)) is None, ip
    for ip in ("127.0.0.1", "10.1.2.3", "169.254.1.1", "::1", "fd00::1", "2002:7f00:1::"):
        assert handler_http.address_blocked(ipaddress.ip_address(ip)), ip


def fake_resolver(monkeypatch, answers):
    """Patch DNS only (no connection is ever made to these addresses)."""

    def getaddrinfo(host, port, *args, **kwargs):
        if isinstance(answers, Exception):
            raise answers
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, 1, 6, "", (a, port)) for a in answers
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_the_guard_pins_the_checked_address(monkeypatch, no_connections):
    monkeypatch.delenv("ORCH8_ALLOW_PRIVATE_URLS")
    fake_resolver(monkeypatch, ["93.184.216.34"])
    target = handler_http.check_url("https://api.example.com:8443/v1/x?q=1")
    assert str(target.url) == "https://93.184.216.34:8443/v1/x?q=1"
    assert target.host_header == "api.example.com:8443"
    assert target.extensions == {"sni_hostname": "api.example.com"}
    # one private answer among public ones is enough to refuse (DNS rebinding)
    fake_resolver(monkeypatch, ["93.184.216.34", "10.0.0.7"])
    with pytest.raises(StepError) as info:
        handler_http.check_url("http://api.example.com/")
    assert info.value.code == "ssrf_blocked"
    assert "10.0.0.7" in str(info.value)


def test_a_name_that_does_not_resolve_is_not_applied(monkeypatch, no_connections):
    monkeypatch.delenv("ORCH8_ALLOW_PRIVATE_URLS")
    fake_resolver(monkeypatch, socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    with pytest.raises(NotApplied) as info:
        run("http_request", {"url": "http://no-such-host.example/"})
    assert info.value.evidence["stage"] == "connect"
    assert info.value.evidence["url"] == "http://no-such-host.example/"
    assert "resolve" in info.value.evidence["error"]


def test_redirects_are_not_followed(provider):
    provider.reply("/moved", 302, body="", headers={"Location": "http://169.254.169.254/"})
    with pytest.raises(StepError) as info:  # ambiguous by default: whether it acted is unknown
        run("http_request", {"url": provider.url + "/moved"})
    assert (info.value.code, type(info.value)) == ("302", StepError)
    provider.reply("/moved", 302, body="", headers={"Location": "http://169.254.169.254/"})
    out = run("http_request", {"url": provider.url + "/moved", "responses": {"3xx": "applied"}})
    assert out["status"] == 302
    assert out["headers"]["location"] == "http://169.254.169.254/"
    assert len(provider.requests) == 2


# --- llm_call ---------------------------------------------------------------------------

COMPLETION = {
    "id": "chatcmpl-123",
    "object": "chat.completion",
    "model": "tiny-model-0613",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello there."},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12},
}


def llm_ctx(**config):
    config = {"llm_api_key": "sk-test", **config}
    return make_ctx(handler="llm_call", context={"data": {}, "config": config, "runtime": {}})


def test_llm_call_chat_completions(provider):
    provider.reply("/v1/chat/completions", json=COMPLETION)
    ctx = llm_ctx()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    out = run(
        "llm_call",
        {
            "base_url": provider.url + "/v1/",
            "model": "tiny",
            "messages": messages,
            "temperature": 0,
        },
        ctx,
    )
    assert out == {
        "content": "Hello there.",
        "usage": COMPLETION["usage"],
        "model": "tiny-model-0613",
        "request_id": "chatcmpl-123",
        "finish_reason": "stop",
    }
    [req] = provider.requests
    assert (req.method, req.path) == ("POST", "/v1/chat/completions")
    assert req.headers["authorization"] == "Bearer sk-test"
    assert req.headers["idempotency-key"] == str(ctx.effect_id)
    assert req.json == {"model": "tiny", "messages": messages, "temperature": 0}


def test_llm_call_base_url_and_key_from_config(provider):
    provider.reply("/chat/completions", json=COMPLETION)
    ctx = llm_ctx(llm_base_url=provider.url, other_key="sk-other")
    params = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    run("llm_call", {**params, "api_key_config": "other_key"}, ctx)
    assert provider.requests[0].headers["authorization"] == "Bearer sk-other"
    with pytest.raises(StepError) as info:
        run("llm_call", {**params, "api_key": "sk-leak"}, ctx)
    assert info.value.retryable is False
    with pytest.raises(StepError) as info:
        run("llm_call", {**params, "api_key_config": "absent"}, ctx)
    assert info.value.retryable is False
    assert len(provider.requests) == 1


def test_llm_call_errors(provider):
    ctx = llm_ctx()
    params = {
        "base_url": provider.url,
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
    }
    provider.reply("/chat/completions", 500, {"error": {"message": "overloaded"}})
    with pytest.raises(StepError) as info:
        run("llm_call", params, ctx)
    assert (info.value.code, info.value.retryable) == ("500", True)
    provider.reply("/chat/completions", 200, {"unexpected": True})
    with pytest.raises(StepError) as info:
        run("llm_call", params, ctx)
    assert info.value.code == "bad_response"
    with pytest.raises(NotApplied):
        run("llm_call", {**params, "base_url": f"http://127.0.0.1:{closed_port()}"}, ctx)
    with pytest.raises(StepError) as info:
        run("llm_call", {**params, "messages": []}, ctx)
    assert info.value.retryable is False


# --- tool_call --------------------------------------------------------------------------


def test_tool_call(provider):
    provider.reply("/tools", 200, {"result": {"temp": 21}, "receipt_id": "tool-7"})
    ctx = make_ctx(handler="tool_call")
    out = run(
        "tool_call",
        {"url": provider.url + "/tools", "tool": "weather", "arguments": {"city": "Oslo"}},
        ctx,
    )
    assert out == {
        "status": 200,
        "json": {"result": {"temp": 21}, "receipt_id": "tool-7"},
        "receipt_id": "tool-7",
    }
    [req] = provider.requests
    assert req.method == "POST"
    assert req.json == {"tool": "weather", "arguments": {"city": "Oslo"}}
    assert req.headers["idempotency-key"] == str(ctx.effect_id)


def test_tool_call_errors(provider):
    provider.reply("/tools", 422, {"error": "bad arguments"})
    with pytest.raises(NotApplied) as info:
        run("tool_call", {"url": provider.url + "/tools", "tool": "t"})
    assert (info.value.code, info.value.retryable, info.value.reached) == ("422", True, True)
    provider.reply("/tools", 503, {"error": "busy"})
    with pytest.raises(StepError) as info:
        run("tool_call", {"url": provider.url + "/tools", "tool": "t"})
    assert (info.value.code, type(info.value)) == ("503", StepError)
    with pytest.raises(NotApplied):
        run("tool_call", {"url": f"http://127.0.0.1:{closed_port()}/t", "tool": "t"})
    with pytest.raises(StepError) as info:
        run("tool_call", {"url": provider.url + "/tools", "tool": "t", "arguments": [1]})
    assert info.value.retryable is False


# --- set_state / get_state --------------------------------------------------------------


@pytest.fixture
def claimed(conn):
    """(instance id, lease token) of a freshly claimed instance."""
    seq_id = conn.execute(
        "INSERT INTO orch8.sequences (tenant_id, name, version, definition)"
        " VALUES ('t1', 'flow', 1,"
        ' \'{"blocks": [{"id": "a", "type": "step", "handler": "noop"}]}\')'
        " RETURNING id"
    ).fetchone()[0]
    instance_id = conn.execute(
        "SELECT id FROM orch8.create_instance('t1', %s)", (seq_id,)
    ).fetchone()[0]
    token = conn.execute(
        "SELECT lease_token FROM orch8.claim_due_nodes('w1', 1, '30 seconds')"
    ).fetchone()[0]
    return instance_id, token


def state_ctx(db_url, instance_id, token) -> StepContext:
    store = SqlInstanceState(functools.partial(psycopg.connect, db_url), TENANT, instance_id, token)
    return make_ctx(instance_id=instance_id, effect_id=None, state=store)


def test_set_and_get_state(db_url, conn, claimed):
    instance_id, token = claimed
    ctx = state_ctx(db_url, instance_id, token)
    assert run("get_state", {"key": "cart"}, ctx) == {"key": "cart", "value": None, "found": False}
    assert run("get_state", {"key": "cart", "default": []}, ctx)["value"] == []
    value = {"items": [1, 2], "note": "ünïcode"}
    assert run("set_state", {"key": "cart", "value": value}, ctx) == {"key": "cart", "value": value}
    assert run("get_state", {"key": "cart", "default": []}, ctx) == {
        "key": "cart",
        "value": value,
        "found": True,
    }
    run("set_state", {"key": "cart", "value": 7}, ctx)
    assert run("get_state", {"key": "cart"}, ctx)["value"] == 7
    run("set_state", {"key": "empty", "value": None}, ctx)
    assert run("get_state", {"key": "empty", "default": "d"}, ctx) == {
        "key": "empty",
        "value": None,
        "found": True,
    }
    rows = conn.execute(
        "SELECT key, value FROM orch8.instance_kv_state WHERE instance_id = %s ORDER BY key",
        (instance_id,),
    ).fetchall()
    assert rows == [("cart", 7), ("empty", None)]
    # another tenant sees nothing
    other = SqlInstanceState(functools.partial(psycopg.connect, db_url), "t2", instance_id, token)
    assert other.get("cart", "none") == "none"


def test_merge_and_delete_state(db_url, conn, claimed):
    instance_id, token = claimed
    ctx = state_ctx(db_url, instance_id, token)
    merged = run("merge_state", {"key": "cart", "value": {"items": [1]}}, ctx)
    assert merged == {"key": "cart", "value": {"items": [1]}}
    merged = run("merge_state", {"key": "cart", "value": {"note": "gift", "items": [2]}}, ctx)
    assert merged["value"] == {"items": [2], "note": "gift"}
    assert run("get_state", {"key": "cart"}, ctx)["value"] == {"items": [2], "note": "gift"}
    run("set_state", {"key": "n", "value": 3}, ctx)
    with pytest.raises(StepError) as info:  # the stored value is not an object
        run("merge_state", {"key": "n", "value": {"a": 1}}, ctx)
    assert (info.value.code, info.value.retryable) == ("invalid_params", False)
    assert "not an object" in str(info.value)
    with pytest.raises(StepError) as info:
        run("merge_state", {"key": "cart", "value": [1]}, ctx)
    assert info.value.retryable is False
    assert run("delete_state", {"key": "cart"}, ctx) == {"key": "cart", "deleted": True}
    assert run("delete_state", {"key": "cart"}, ctx) == {"key": "cart", "deleted": False}
    assert run("get_state", {"key": "cart"}, ctx)["found"] is False
    stale = state_ctx(db_url, instance_id, uuid.uuid4())
    for name, params in (
        ("delete_state", {"key": "n"}),
        ("merge_state", {"key": "m", "value": {}}),
    ):
        with pytest.raises(StaleLease):
            run(name, params, stale)
    assert run("get_state", {"key": "n"}, ctx)["value"] == 3


def test_state_through_a_connection_pool(db_url, claimed):
    instance_id, token = claimed
    with ConnectionPool(db_url, min_size=1, max_size=2, open=True) as pool:
        store = SqlInstanceState(pool.connection, TENANT, instance_id, token)
        store.set("k", {"v": 1})
        assert store.get("k") == {"v": 1}
        assert store.get("absent", 5) == 5


def test_set_state_with_a_stale_lease_raises_stale_lease(db_url, conn, claimed):
    instance_id, _token = claimed
    ctx = state_ctx(db_url, instance_id, uuid.uuid4())
    with pytest.raises(StaleLease):
        run("set_state", {"key": "k", "value": 1}, ctx)
    # the raw SQL error carries SQLSTATE O8001, which engine_errors translates
    with pytest.raises(psycopg.Error) as info:
        conn.execute(
            "SELECT orch8.set_instance_state('t1', %s, %s, 'k', '1')", (instance_id, uuid.uuid4())
        )
    assert info.value.sqlstate == "O8001"
    with pytest.raises(StaleLease), engine_errors():
        conn.execute(
            "SELECT orch8.set_instance_state('t1', %s, %s, 'k', '1')", (instance_id, uuid.uuid4())
        )
    assert conn.execute("SELECT count(*) FROM orch8.instance_kv_state").fetchone()[0] == 0


def test_set_state_after_the_lease_is_released_is_stale(db_url, conn, claimed):
    instance_id, token = claimed
    ctx = state_ctx(db_url, instance_id, token)
    run("set_state", {"key": "k", "value": 1}, ctx)
    conn.execute("SELECT orch8.release_lease('t1', %s, %s)", (instance_id, token))
    with pytest.raises(StaleLease):
        run("set_state", {"key": "k", "value": 2}, ctx)
    assert run("get_state", {"key": "k"}, ctx)["value"] == 1  # reads need no lease


def test_state_limits_in_sql(conn, claimed):
    instance_id, token = claimed
    conn.execute("SET orch8.max_state_value_bytes = '10'")
    call = "SELECT orch8.set_instance_state('t1', %s, %s, %s, %s)"
    with pytest.raises(psycopg.Error) as info:
        conn.execute(call, (instance_id, token, "k", Jsonb("x" * 20)))
    assert info.value.sqlstate == "O8008"
    with pytest.raises(psycopg.Error) as info:
        conn.execute(call, (instance_id, token, "", Jsonb(1)))
    assert info.value.sqlstate == "O8008"
    with pytest.raises(psycopg.Error) as info:
        conn.execute(call, (instance_id, token, "k" * 257, Jsonb(1)))
    assert info.value.sqlstate == "O8008"
    conn.execute(call, (instance_id, token, "k", None))  # SQL NULL is stored as JSON null
    assert conn.execute(
        "SELECT orch8.get_instance_state('t1', %s, 'k')::text", (instance_id,)
    ).fetchone() == ("null",)


def test_state_handlers_need_a_store_and_a_key():
    with pytest.raises(StepError) as info:
        run("set_state", {"key": "k", "value": 1}, make_ctx(state=None))
    assert (str(info.value), info.value.retryable) == ("no state store", False)
    with pytest.raises(StepError) as info:
        run("get_state", {"key": "k"}, make_ctx(state=None))
    assert str(info.value) == "no state store"
    for params in ({"value": 1}, {"key": "", "value": 1}, {"key": "x" * 300, "value": 1}):
        with pytest.raises(StepError) as info:
            run("set_state", params, make_ctx(state=object()))
        assert info.value.retryable is False
    with pytest.raises(StepError) as info:
        run("set_state", {"key": "k"}, make_ctx(state=object()))
    assert info.value.retryable is False
