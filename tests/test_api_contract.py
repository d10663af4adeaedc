"""The REST API's contract, as one declaration per request and answer makes it: the
served OpenAPI document is the generated one and a valid one; undeclared methods are 405
with Allow; query strings, bodies and paths are refused exactly as their models say
(unknown or repeated parameters, unknown fields, NUL, byte limits at the boundary);
every problem is an RFC 9457 document; answers carry exactly their model's fields."""

from __future__ import annotations

import json
import re
import uuid

import pytest

from orch8_py import apikeys, rules
from tests.test_api import CHARGE, HELLO, Api, fail_with_unknown_receipt, make_seq, ok, problem
from web import create_app
from web.api.fields import NO_NUL
from web.api.spec import generate

ACME = "acme"
PREFIX = "/api/v1"
NOTE = rules.LIMITS["note_bytes"]
KEY = rules.LIMITS["idempotency_key_bytes"]
RECEIPT = rules.LIMITS["provider_receipt_id_bytes"]


@pytest.fixture
def app(db_url):
    app = create_app(db_url, secret_key="api-contract-test")
    app.testing = True
    yield app
    app.extensions["orch8.pool"].close()


@pytest.fixture
def api(app, conn):
    return Api(app.test_client(), apikeys.create(conn, ACME, "operator", "alice")[1])


@pytest.fixture
def doc(app):
    return ok(app.test_client().get(f"{PREFIX}/openapi.json"))


def _routes(app):
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith(PREFIX + "/"):
            yield rule


def _schema(doc, name):
    return doc["components"]["schemas"][name]


# --- the document ----------------------------------------------------------------------------


def test_the_served_document_is_the_generated_one_and_valid(app, doc):
    with app.app_context():
        assert doc == json.loads(json.dumps(generate()))
    validator = pytest.importorskip("openapi_spec_validator")
    validator.validate(doc)  # a valid OpenAPI 3.1 document
    assert doc["openapi"] == "3.1.0"
    # every route is in it, with its path parameters, and nothing else
    documented = {(p, m.upper()) for p, item in doc["paths"].items() for m in item}
    routed = {
        (re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule), method)
        for rule in _routes(app)
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    assert documented == routed


def test_enums_limits_and_patterns_come_from_the_rules(doc):
    props = _schema(doc, "InstanceSummary")["properties"]
    assert props["state"]["enum"] == list(rules.INSTANCE_STATES)
    assert _schema(doc, "EffectReceipt")["properties"]["kind"]["enum"] == list(rules.EFFECT_KINDS)
    resolve = _schema(doc, "ResolveRequest")
    resolvable = sorted({s for moves in rules.RESOLUTIONS.values() for s in moves})
    assert resolve["properties"]["state"]["enum"] == resolvable
    assert resolve["properties"]["expected_state"]["enum"] == list(rules.EFFECT_STATES)
    assert {"state", "expected_state", "evidence"} == set(resolve["required"])
    evidence_rule, output_rule = resolve["allOf"]
    assert evidence_rule["then"]["properties"]["evidence"] == {"minProperties": 1}
    assert evidence_rule["if"]["properties"]["state"]["enum"] == list(
        rules.RESOLUTIONS_NEEDING_EVIDENCE
    )
    # an output only for the resolutions after which the step completes
    assert output_rule["then"] == {"properties": {"output": False}}
    assert set(output_rule["if"]["properties"]["state"]["enum"]) == set(resolvable) - {
        "committed",
        "verified",
    }
    queue = doc["paths"][f"{PREFIX}/effects/unresolved"]["get"]["parameters"]
    blocking = next(p for p in queue if p["name"] == "blocking")
    assert blocking["schema"]["type"] == "boolean" and not blocking["required"]
    verification = _schema(doc, "UnresolvedEffect")["properties"]["verification"]["anyOf"][0]
    assert verification["enum"] == list(rules.VERIFICATION_STATES)
    key = _schema(doc, "InstanceCreate")["properties"]["idempotency_key"]["anyOf"][0]
    assert (key["x-minBytes"], key["x-maxBytes"], key["maxLength"]) == (1, KEY, KEY)
    note = resolve["properties"]["note"]["anyOf"][0]
    assert note["x-maxBytes"] == NOTE and note["pattern"] == "^[^\\x00]*$"
    assert resolve["properties"]["provider_receipt_id"]["anyOf"][0]["x-maxBytes"] == RECEIPT
    name = _schema(doc, "SequenceCreate")["properties"]["name"]
    assert name["pattern"] == rules.PATTERNS["sequence_name"]["pattern"]
    events = _schema(doc, "SubscriptionCreate")["properties"]["events"]["anyOf"][0]
    assert events["items"]["enum"] == list(rules.WEBHOOK_EVENTS)
    outbox = doc["paths"][f"{PREFIX}/webhooks/outbox"]["get"]["parameters"]
    assert next(p for p in outbox if p["name"] == "state")["schema"]["enum"] == list(
        rules.OUTBOX_STATES
    )


def test_every_string_a_request_sends_is_declared_without_nul(doc):
    """Every string of a request body, query or path has a pattern that refuses NUL (or
    is an enum, a uuid, a date-time or a cursor)."""

    def strings(schema, where):
        if "$ref" in schema:
            yield from strings(_schema(doc, schema["$ref"].rsplit("/", 1)[1]), where)
            return
        for sub in schema.get("anyOf", []):
            yield from strings(sub, where)
        if schema.get("type") == "string":
            yield where, schema
        for name, sub in schema.get("properties", {}).items():
            yield from strings(sub, f"{where}.{name}")
        if isinstance(schema.get("items"), dict):
            yield from strings(schema["items"], f"{where}[]")

    found = 0
    for path, item in doc["paths"].items():
        for method, op in item.items():
            sources = [(p["schema"], f"{p['in']} {p['name']}") for p in op.get("parameters", [])]
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                sources.append((body["schema"], "body"))
            for schema, where in sources:
                for at, s in strings(schema, f"{method} {path} {where}"):
                    found += 1
                    pattern = s.get("pattern", "")
                    safe = "enum" in s or s.get("format") in {"uuid", "date-time"}
                    safe = safe or s.get("format", "").startswith("orch8-")
                    assert safe or (pattern and not re.search(pattern, "a\x00b")), at
    assert found > 20


def test_problem_answers_are_declared_as_problem_documents(doc):
    for path, item in doc["paths"].items():
        for method, op in item.items():
            for code, answer in op["responses"].items():
                if code[0] in "45":
                    assert answer["content"] == {
                        "application/problem+json": {
                            "schema": {"$ref": "#/components/schemas/Problem"}
                        }
                    }, (method, path, code)
            if path != f"{PREFIX}/openapi.json":
                assert {"401", "403", "404", "422", "503"} <= set(op["responses"]), path
    problem_schema = _schema(doc, "Problem")
    assert {"type", "title", "status", "error"} <= set(problem_schema["required"])


def test_optional_bodies_are_not_required(doc):
    bodies = {
        (path, method): op["requestBody"]["required"]
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if "requestBody" in op
    }
    assert bodies[(f"{PREFIX}/instances", "post")] is True
    assert bodies[(f"{PREFIX}/continuity/effects/{{effect_id}}/resolve", "post")] is True
    # no field of it alone is required, but one of two must be sent
    assert bodies[(f"{PREFIX}/continuity/effects/verify", "post")] is True
    for action in ("cancel", "pause", "resume", "retry"):
        assert bodies[(f"{PREFIX}/instances/{{instance_id}}/{action}", "post")] is False
    assert bodies[(f"{PREFIX}/webhooks/outbox/{{delivery_id}}/discard", "post")] is False


# --- methods ----------------------------------------------------------------------------------


def test_every_route_answers_405_with_allow_for_other_methods(app, api):
    allowed: dict[str, set[str]] = {}
    for rule in _routes(app):
        # a path variable is x, or a UUID where the route takes only one (<uuid:...>)
        path = re.sub(r"<uuid:[a-z_]+>", "00000000-0000-4000-8000-000000000000", rule.rule)
        path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", "x", path)
        allowed.setdefault(path, set()).update(rule.methods)
    # 30 (with /effects/find and /instances/{id}/requests), /bulk/instances,
    # /bulk/instances/start, 3 waits, 6 /schedules, 2 /rate-limits, 9 /workers
    assert len(allowed) == 52
    for path, methods in allowed.items():
        for method in {"GET", "POST", "PUT", "PATCH", "DELETE"} - methods:
            resp = api.client.open(path, method=method, headers=api.headers)
            body = problem(resp, 405, "method not allowed")
            assert set(resp.headers["Allow"].split(", ")) == methods, (method, path)
            assert body["detail"]


# --- query strings ------------------------------------------------------------------------------


def test_a_repeated_query_parameter_is_refused(api):
    for path in ("/instances?limit=1&limit=2", "/sequences?namespace=a&namespace=a"):
        body = problem(api.get(path), 422, "invalid input")
        name = path.split("?")[1].split("=")[0]
        assert body["problems"] == [{"path": name, "message": "given more than once"}]
        assert "in the query" in body["detail"]


def test_an_unknown_query_parameter_is_refused(api, conn):
    inst = ok(api.post("/sequences", {"name": "hello", "definition": HELLO}), 201)
    for path in (
        "/instances?sort=id",
        "/webhooks/subscriptions?x=1",
        "/sequences/default/hello?v=1",
    ):
        body = problem(api.get(path), 422, "invalid input")
        name = path.split("?")[1].split("=")[0]
        assert body["problems"] == [{"path": name, "message": "unknown query parameter"}]
    assert inst["name"] == "hello"


# --- bodies -------------------------------------------------------------------------------------


def test_an_unknown_body_field_is_refused_and_named(api, conn):
    seq = make_seq(conn)
    inst, effect_id = fail_with_unknown_receipt(conn, seq)
    for path, body in [
        ("/sequences", {"name": "x", "definition": HELLO, "colour": 1}),
        ("/instances", {"sequence": "x", "colour": 1}),
        (f"/instances/{inst}/pause", {"colour": 1}),
        (f"/instances/{inst}/retry", {"colour": 1}),
        (
            f"/continuity/effects/{effect_id}/resolve",
            {"state": "committed", "evidence": {}, "expected_state": "unknown", "colour": 1},
        ),
        ("/continuity/effects/verify", {"superseded": True, "colour": 1}),
        ("/webhooks/subscriptions", {"url": "http://127.0.0.1:9/h", "colour": 1}),
    ]:
        got = problem(api.post(path, body), 422, "invalid input")
        assert got["problems"] == [{"path": "colour", "message": "unknown field"}], path
        assert got["detail"] == "1 problem in the body: colour: unknown field"


def test_a_body_that_is_not_an_object_is_refused_even_where_it_is_optional(api, conn):
    seq = make_seq(conn)
    inst, _ = fail_with_unknown_receipt(conn, seq)
    for raw in ("[]", "null", "false", "0", '""', "[1]"):
        resp = api.post(f"/instances/{inst}/retry", data=raw, content_type="application/json")
        body = problem(resp, 422, "invalid input")
        assert body["problems"] == [{"path": "$", "message": "must be a JSON object"}]
    # no body, or a form-typed empty one, is no body: the optional one is accepted
    resp = api.post(f"/instances/{inst}/pause", content_type="application/x-www-form-urlencoded")
    assert resp.status_code == 409  # failed: not pausable, but the request was well formed
    problem(api.post("/instances", content_type="application/x-www-form-urlencoded"), 400)
    problem(
        api.post("/instances", data="a=1", content_type="application/x-www-form-urlencoded"), 415
    )


def test_nul_is_refused_in_every_part_of_a_request(api):
    ok(api.post("/sequences", {"name": "hello", "definition": HELLO}), 201)
    body = problem(api.post("/instances", {"sequence": "hello", "idempotency_key": "a\x00b"}), 422)
    assert body["problems"] == [{"path": "idempotency_key", "message": NO_NUL}]
    body = problem(api.post("/instances", {"sequence": "hello", "data": {"k": ["\x00"]}}), 422)
    assert body["problems"] == [{"path": "data.k[0]", "message": NO_NUL}]
    body = problem(api.post("/webhooks/subscriptions", {"url": "http://h/", "secret": "\x00"}), 422)
    assert body["problems"] == [{"path": "secret", "message": NO_NUL}]
    body = problem(api.get("/instances?sequence=a%00b"), 422)
    assert body["problems"][0]["path"] == "sequence"
    assert rules.PATTERNS["sequence_name"]["rule"] in body["problems"][0]["message"]
    body = problem(api.get("/sequences/default/a%00b/versions"), 422)
    assert [p["path"] for p in body["problems"]] == ["name"]


def test_byte_limits_hold_exactly_at_the_boundary(api, conn):
    ok(api.post("/sequences", {"name": "hello", "definition": HELLO}), 201)
    # idempotency_key: 1..KEY bytes, counted in UTF-8
    for fits in ("k" * KEY, "é" * (KEY // 2), "😀" * (KEY // 4), "k"):
        ok(api.post("/instances", {"sequence": "hello", "idempotency_key": fits}), 201)
    for over in ("k" * (KEY + 1), "é" * (KEY // 2) + "k", "😀" * (KEY // 4) + "k", ""):
        body = problem(api.post("/instances", {"sequence": "hello", "idempotency_key": over}), 422)
        assert [p["path"] for p in body["problems"]] == ["idempotency_key"]
    # reason (note_bytes)
    inst = ok(api.post("/instances", {"sequence": "hello"}), 201)["id"]
    body = problem(api.post(f"/instances/{inst}/pause", {"reason": "é" * (NOTE // 2) + "x"}), 422)
    assert body["problems"] == [
        {"path": "reason", "message": f"must be at most {NOTE} bytes of UTF-8 (it is {NOTE + 1})"}
    ]
    assert ok(api.post(f"/instances/{inst}/pause", {"reason": "é" * (NOTE // 2)}))["state"] == (
        "paused"
    )
    # note and provider_receipt_id of a resolution
    seq = make_seq(conn, CHARGE)
    _, effect_id = fail_with_unknown_receipt(conn, seq)
    url = f"/continuity/effects/{effect_id}/resolve"
    base = {"state": "committed", "evidence": {"seen": True}, "expected_state": "unknown"}
    for field, limit in (("note", NOTE), ("provider_receipt_id", RECEIPT)):
        body = problem(api.post(url, {**base, field: "é" * (limit // 2) + "x"}), 422)
        assert [p["path"] for p in body["problems"]] == [field]
    resolved = ok(
        api.post(url, {**base, "note": "é" * (NOTE // 2), "provider_receipt_id": "r" * RECEIPT})
    )
    assert resolved["provider_receipt_id"] == "r" * RECEIPT


# --- problems -----------------------------------------------------------------------------------


def test_problem_documents_have_their_members_and_media_type(app, api, conn):
    client = app.test_client()
    seq = make_seq(conn)
    inst, effect_id = fail_with_unknown_receipt(conn, seq)
    cases = [
        (client.get(f"{PREFIX}/instances"), 401, "unauthorized"),
        (api.get("/nowhere"), 404, "not found"),
        (api.get(f"/instances/{uuid.uuid4()}"), 404, "not found"),
        (api.client.delete(f"{PREFIX}/instances", headers=api.headers), 405, "method not allowed"),
        (api.post("/instances", data="{", content_type="application/json"), 400, "bad request"),
        (
            api.post("/instances", data="{}", content_type="text/plain"),
            415,
            "unsupported media type",
        ),
        (api.post("/instances", {}), 422, "invalid input"),
        (api.post(f"/instances/{inst}/retry"), 409, "blocked by an unresolved effect"),
    ]
    for resp, status, error in cases:
        body = problem(resp, status, error)
        assert body["type"] == "urn:orch8:problem:" + error.replace(" ", "-")
        assert body["title"] == error[0].upper() + error[1:]
        assert isinstance(body["detail"], str) and body["detail"]
    blocked = cases[-1][0].get_json()
    assert blocked["effect_id"] == str(effect_id)
    auditor = Api(client, apikeys.create(conn, ACME, "auditor", "eve")[1])
    problem(auditor.post("/instances", {"sequence": "x"}), 403, "forbidden")


# --- answers ------------------------------------------------------------------------------------


def test_answers_carry_exactly_their_models_fields(api, conn, doc):
    def fields(name):
        return set(_schema(doc, name)["properties"])

    ok(api.post("/sequences", {"name": "hello", "definition": HELLO}), 201)
    listed = ok(api.get("/sequences"))["items"][0]
    assert set(listed) == fields("SequenceOverview")
    assert (listed["versions"], listed["blocks"], listed["problems"]) == (1, 1, 0)
    assert listed["latest_version"] == listed["version"] == 1
    versions = ok(api.get("/sequences/default/hello/versions"))["items"]
    assert set(versions[0]) == fields("SequenceVersionOverview")
    made = ok(api.post("/instances", {"sequence": "hello"}), 201)
    assert set(made) == fields("InstanceCreated")
    assert set(ok(api.get("/instances"))["items"][0]) == fields("InstanceSummary")
    ok(api.post("/webhooks/subscriptions", {"url": "http://127.0.0.1:9/h"}), 201)
    seq = make_seq(conn)
    _, effect_id = fail_with_unknown_receipt(conn, seq)
    shown = ok(api.get(f"/effects/{effect_id}"))
    assert set(shown) == fields("EffectDetail")
    assert shown["instance_state"] == "failed" and shown["age_seconds"] >= 0
    queued = ok(api.get("/effects/unresolved"))["items"][0]
    assert set(queued) == fields("UnresolvedEffect")
    assert {"blocking", "verification", "verification_tries"} <= set(queued)
    asked = ok(api.post("/continuity/effects/verify", {"effect_ids": [str(effect_id)]}))
    assert set(asked["items"][0]) == fields("VerificationRequested")
    assert set(ok(api.get("/webhooks/outbox"))["items"][0]) == fields("Delivery")
