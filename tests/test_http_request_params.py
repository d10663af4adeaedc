"""http_request's receipt_path, form and body, and the response table (classify), against
the real loopback provider in tests/http_provider.py. No mocks."""

from __future__ import annotations

from urllib.parse import parse_qs

import pytest

from orch8_py.handlers import NotApplied, StepError
from orch8_py.handlers import http as handler_http
from tests.handler_helpers import make_ctx, run
from tests.http_provider import provider_fixture  # noqa: F401  (fixture: provider)

CHARGE = {"id": "ch_1", "object": "charge", "amount": 1250, "data": [{"id": "li_1"}, 7]}


@pytest.fixture(autouse=True)
def allow_private(monkeypatch):
    monkeypatch.setenv("ORCH8_ALLOW_PRIVATE_URLS", "1")


def refused(params, provider):
    """The handler refuses ``params`` as invalid_params without sending anything."""
    with pytest.raises(StepError) as info:
        run("http_request", {"url": provider.url + "/x", **params})
    assert (info.value.code, info.value.retryable) == ("invalid_params", False)
    assert not isinstance(info.value, NotApplied)
    assert provider.requests == []
    return str(info.value)


# --- receipt_path -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "receipt"),
    [
        ("json.id", "ch_1"),
        ("json.data.0.id", "li_1"),
        ("json.amount", "1250"),  # an integer id, as a string
        ("headers.request-id", "req_9"),
        ("headers.Request-Id", "req_9"),  # header names are matched lowercased
    ],
)
def test_receipt_path_sets_provider_receipt_id(provider, path, receipt):
    provider.reply("/charges", 200, CHARGE, headers={"Request-Id": "req_9"})
    out = run("http_request", {"url": provider.url + "/charges", "receipt_path": path})
    assert out["provider_receipt_id"] == receipt
    assert out["json"] == CHARGE


@pytest.mark.parametrize(
    "path",
    ["json.nope", "json.id.deeper", "json.data.5", "json.data.x", "json.data", "json.data.1.id"],
)
def test_a_receipt_path_that_does_not_resolve_adds_nothing(provider, path):
    provider.reply("/charges", 200, CHARGE)
    out = run("http_request", {"url": provider.url + "/charges", "receipt_path": path})
    assert out["status"] == 200
    assert "provider_receipt_id" not in out


def test_receipt_path_wins_over_the_json_receipt_and_works_on_a_text_answer(provider):
    provider.reply("/a", 200, {"provider_receipt_id": "top", "id": "ch_2"})
    out = run("http_request", {"url": provider.url + "/a", "receipt_path": "json.id"})
    assert out["provider_receipt_id"] == "ch_2"
    provider.reply("/b", body="ch_3")
    out = run("http_request", {"url": provider.url + "/b", "receipt_path": "body"})
    assert out["provider_receipt_id"] == "ch_3"
    provider.reply("/c", body="not json")
    out = run("http_request", {"url": provider.url + "/c", "receipt_path": "json.id"})
    assert "provider_receipt_id" not in out


@pytest.mark.parametrize("path", [5, "", "json..id", ".id", "json.", ["json", "id"], True])
def test_a_bad_receipt_path_is_refused(provider, path):
    assert "receipt_path" in refused({"receipt_path": path}, provider)


# --- form and body ----------------------------------------------------------------------


def test_form_is_sent_urlencoded(provider):
    form = {"amount": 1250, "currency": "eur", "capture": False, "tags[]": ["a b", "c&d"]}
    run("http_request", {"method": "POST", "url": provider.url + "/f", "form": form})
    [req] = provider.requests
    assert req.headers["content-type"] == "application/x-www-form-urlencoded"
    assert parse_qs(req.body.decode()) == {
        "amount": ["1250"],
        "currency": ["eur"],
        "capture": ["false"],
        "tags[]": ["a b", "c&d"],
    }


def test_form_keeps_a_given_content_type(provider):
    ctype = "application/x-www-form-urlencoded; charset=utf-8"
    params = {"form": {"a": True}, "headers": {"content-type": ctype}}
    run("http_request", {"method": "POST", "url": provider.url + "/f", **params})
    [req] = provider.requests
    assert req.headers["content-type"] == ctype
    assert req.body == b"a=true"


def test_body_without_a_content_type_is_text_plain(provider):
    run("http_request", {"method": "POST", "url": provider.url + "/t", "body": "héllo"})
    run(
        "http_request",
        {
            "method": "POST",
            "url": provider.url + "/t",
            "body": "<a/>",
            "headers": {"Content-Type": "application/xml"},
        },
    )
    first, second = provider.requests
    assert first.headers["content-type"] == "text/plain; charset=utf-8"
    assert first.body == "héllo".encode()
    assert second.headers["content-type"] == "application/xml"


@pytest.mark.parametrize(
    "names", [("json", "form"), ("json", "body"), ("form", "body"), ("json", "form", "body")]
)
def test_json_form_and_body_are_exclusive(provider, names):
    values = {"json": {"a": 1}, "form": {"a": 1}, "body": "a"}
    message = refused({name: values[name] for name in names}, provider)
    assert all(name in message for name in names)


@pytest.mark.parametrize(
    "form", ["a=1", ["a", 1], {"a": None}, {"a": {"b": 1}}, {"a": [1, [2]]}, {"a": [None]}]
)
def test_bad_form_values_are_refused(provider, form):
    assert "form" in refused({"method": "POST", "form": form}, provider)


# --- the response table -----------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 402, 404, 422])
def test_a_definitive_4xx_is_not_applied_with_the_answer(provider, status):
    provider.reply("/charge", status, {"error": {"type": "card_error"}}, headers={"X-A": "1"})
    with pytest.raises(NotApplied) as info:
        run("http_request", {"method": "POST", "url": provider.url + "/charge", "json": {}})
    err = info.value
    assert (err.code, err.retryable, err.reached) == (str(status), True, True)
    assert str(status) in str(err) and "card_error" in str(err)
    ev = err.evidence
    assert (ev["stage"], ev["url"]) == ("response", provider.url + "/charge")
    assert ev["response"]["status"] == status
    assert ev["response"]["json"] == {"error": {"type": "card_error"}}
    assert ev["response"]["headers"]["x-a"] == "1"
    assert "body" not in ev["response"]
    assert len(provider.requests) == 1


def test_a_not_applied_text_answer_keeps_the_body(provider):
    provider.reply("/charge", 400, body="missing amount")
    with pytest.raises(NotApplied) as info:
        run("http_request", {"url": provider.url + "/charge"})
    assert info.value.evidence["response"]["body"] == "missing amount"
    assert "json" not in info.value.evidence["response"]


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 503, 302])
def test_ambiguous_statuses_are_step_errors(provider, status):
    provider.reply("/charge", status, body="try later", headers={"Location": "/elsewhere"})
    with pytest.raises(StepError) as info:
        run("http_request", {"url": provider.url + "/charge"})
    err = info.value
    assert not isinstance(err, NotApplied)
    assert (err.code, err.retryable) == (str(status), True)
    assert "try later" in str(err)
    assert len(provider.requests) == 1  # a redirect is not followed


@pytest.mark.parametrize(
    ("responses", "status", "outcome"),
    [
        ({"404": "ambiguous"}, 404, "ambiguous"),
        ({"5xx": "not_applied"}, 503, "not_applied"),
        ({"409": "applied"}, 409, "applied"),
        ({"4xx": "ambiguous", "404": "not_applied"}, 404, "not_applied"),
        ({"4xx": "ambiguous", "404": "not_applied"}, 400, "ambiguous"),
        ({"4xx": "applied"}, 429, "applied"),  # the step's class beats the default's 429
        ({"2xx": "ambiguous"}, 201, "ambiguous"),
        ({"3xx": "applied"}, 302, "applied"),
        ({"500": "not_applied"}, 502, "ambiguous"),  # unlisted: the default table
    ],
)
def test_responses_overrides(provider, responses, status, outcome):
    assert handler_http.classify(status, responses) == outcome
    provider.reply("/r", status, {"n": 1})
    params = {"url": provider.url + "/r", "responses": responses}
    if outcome == "applied":
        out = run("http_request", params)
        assert (out["status"], out["json"]) == (status, {"n": 1})
        return
    with pytest.raises(StepError) as info:
        run("http_request", params)
    assert isinstance(info.value, NotApplied) == (outcome == "not_applied")
    assert info.value.code == str(status)


def test_the_default_table():
    expect = {200: "applied", 204: "applied", 301: "ambiguous", 400: "not_applied"}
    expect |= {401: "not_applied", 403: "not_applied", 404: "not_applied", 422: "not_applied"}
    expect |= {408: "ambiguous", 409: "ambiguous", 425: "ambiguous", 429: "ambiguous"}
    expect |= {500: "ambiguous", 599: "ambiguous", 101: "ambiguous"}
    assert {s: handler_http.classify(s) for s in expect} == expect


@pytest.mark.parametrize(
    ("responses", "word"),
    [
        (["404"], "object"),
        ({"4xx": "maybe"}, "maybe"),
        ({"404": True}, "True"),
        ({"600": "applied"}, "600"),
        ({"099": "applied"}, "099"),
        ({"4XX": "applied"}, "4XX"),
        ({"40x": "applied"}, "40x"),
        ({"4044": "applied"}, "4044"),
        ({"": "applied"}, "''"),
    ],
)
def test_bad_responses_are_refused(provider, responses, word):
    message = refused({"responses": responses}, provider)
    assert "responses" in message and word in message


def test_llm_call_and_tool_call_use_the_default_table(provider):
    ctx = make_ctx(context={"data": {}, "config": {}, "runtime": {}})
    params = {"base_url": provider.url, "model": "m", "messages": [{"role": "user"}]}
    provider.reply("/chat/completions", 400, {"error": {"message": "bad model"}})
    with pytest.raises(NotApplied) as info:
        run("llm_call", params, ctx)
    assert (info.value.code, info.value.reached) == ("400", True)
    provider.reply("/chat/completions", 429, {"error": {"message": "slow down"}})
    with pytest.raises(StepError) as info:
        run("llm_call", params, ctx)
    assert not isinstance(info.value, NotApplied)
    provider.reply("/tools", 422, {"error": "bad arguments"})
    with pytest.raises(NotApplied) as info:
        run("tool_call", {"url": provider.url + "/tools", "tool": "t"})
    assert info.value.evidence["response"]["json"] == {"error": "bad arguments"}


# --- the idempotency key ----------------------------------------------------------------


def test_the_receipts_key_is_sent_when_the_engine_sets_it(provider):
    ctx = make_ctx(handler="http_request", idempotency_key="order-7:charge")
    run("http_request", {"url": provider.url + "/k", "idempotency_key": "order-7:charge"}, ctx)
    run("http_request", {"url": provider.url + "/k"}, ctx)  # it wins over the effect id
    assert [r.headers["idempotency-key"] for r in provider.requests] == ["order-7:charge"] * 2
    run("http_request", {"url": provider.url + "/k"}, make_ctx(idempotency_key=None))
    assert provider.requests[-1].headers["idempotency-key"] != "order-7:charge"


# --- output_from_response ---------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        {"json": CHARGE, "headers": {"Request-Id": "req_1"}},
        {"body": "plain words"},
        {"body": "x" * (100 * 1024)},  # truncated
        {"json": {"receipt_id": "r-9"}, "status": 201},
    ],
)
def test_output_from_response_round_trips_the_handler_output(provider, reply):
    provider.reply("/o", **reply)
    out = run("http_request", {"url": provider.url + "/o", "receipt_path": "json.id"})
    assert handler_http.output_from_response(out, "json.id") == out
    recorded = {k: out[k] for k in ("status", "headers", "json", "body", "truncated") if k in out}
    assert handler_http.output_from_response(recorded, "json.id") == out


def test_the_not_applied_evidence_gives_the_output_the_handler_would_have_returned(provider):
    provider.reply("/o", 404, CHARGE)
    with pytest.raises(NotApplied) as info:
        run("http_request", {"url": provider.url + "/o"})
    provider.reply("/o", 404, CHARGE)
    params = {
        "url": provider.url + "/o",
        "responses": {"404": "applied"},
        "receipt_path": "json.id",
    }
    out = run("http_request", params)
    derived = handler_http.output_from_response(info.value.evidence["response"], "json.id")
    # the two replies are separate requests: their Date headers may fall in different seconds
    derived["headers"].pop("date"), out["headers"].pop("date")
    assert derived == {
        **out,
        "body": '{"id":"ch_1","object":"charge","amount":1250,"data":[{"id":"li_1"},7]}',
    }
    assert derived["provider_receipt_id"] == "ch_1"


def test_output_from_response_without_headers_or_body():
    assert handler_http.output_from_response({"status": 204}, None) == {
        "status": 204,
        "headers": {},
        "body": "",
    }
    assert handler_http.output_from_response(
        {"status": 200, "headers": {"Request-Id": "q"}, "json": None}, "headers.request-id"
    ) == {
        "status": 200,
        "headers": {"request-id": "q"},
        "json": None,
        "body": "null",
        "provider_receipt_id": "q",
    }


@pytest.mark.parametrize(
    ("response", "path", "reason"),
    [
        ([200], None, "object"),
        ({}, None, "status"),
        ({"status": "200"}, None, "status"),
        ({"status": True}, None, "status"),
        ({"status": 99}, None, "status"),
        ({"status": 200, "headers": ["a"]}, None, "headers"),
        ({"status": 200, "headers": {"a": 1}}, None, "header"),
        ({"status": 200, "body": 5}, None, "body"),
        ({"status": 200, "truncated": "yes"}, None, "truncated"),
        ({"status": 200, "jsn": {}}, None, "jsn"),
        ({"status": 200}, "", "receipt_path"),
    ],
)
def test_output_from_response_refuses_a_bad_shape(response, path, reason):
    with pytest.raises(ValueError) as info:
        handler_http.output_from_response(response, path)
    assert reason in str(info.value)
    assert "\n" not in str(info.value)
