"""The REST API (/api/v1) through Flask's test client on a real migrated database:
every route, its errors, roles, tenant isolation, retry after resolution, pagination and
bad input of every kind."""

from __future__ import annotations

import datetime as dt
import json
import re
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.types.json import Jsonb

from orch8_py import apikeys, rules, sqlapi
from orch8_py.handlers import handler
from orch8_py.handlers.http import output_from_response
from tests.queue_helpers import (
    VERIFIED_HANDLER,
    escalate,
    supersede,
    unknown_receipt,
    verified_sequence,
)
from tests.runner_helpers import running, wait_for
from web import create_app

ACME, OTHER, ROOT = "acme", "other", "root"
PARAMS = {"url": "https://pay.example/charge", "idempotency_key": "order-7"}
HELLO = {"blocks": [{"id": "hello", "type": "step", "handler": "log", "params": {"m": "hi"}}]}
CHARGE = {
    "blocks": [
        {"type": "step", "id": "charge", "handler": "test.api.charge"},
        {"type": "step", "id": "ship", "handler": "noop"},
    ]
}

SENT: list[tuple[int, str]] = []


@handler("test.api.charge")
def charge(params, ctx):
    SENT.append((ctx.attempt, str(ctx.effect_id)))
    return {"receipt_id": "ch_new"}


# --- engine helpers (the same path as tests/test_operations.py) ---------------------------


def claim(conn, instance):
    rows = conn.execute(
        "SELECT instance_id AS id, lease_token FROM orch8.claim_due_nodes('w1', 10, '30 seconds')"
    ).fetchall()
    token = None
    for iid, tok in rows:
        if iid == instance:
            token = tok
        else:  # not ours: hand it back untouched
            conn.execute(
                "SELECT orch8.release_lease(t.tenant_id, t.id, %s) FROM"
                " orch8.task_instances AS t WHERE t.id = %s",
                (tok, iid),
            )
    assert token is not None, "the instance was not claimed"
    return token


def fail_with_unknown_receipt(conn, seq, tenant=ACME):
    """An instance failed with EffectBlocked, its charge receipt unknown: begin_step,
    release the lease, claim again, begin_step again (the second run finds it dispatched)."""
    a = conn.execute(
        "SELECT id FROM orch8.create_instance(%s, %s, %s)", (tenant, seq, Jsonb({"order": 7}))
    ).fetchone()[0]
    begin = (
        "SELECT outcome, effect_id FROM orch8.begin_step("
        "%s, %s, %s, 'charge', 'test.api.charge', %s, 0)"
    )
    token = claim(conn, a)
    conn.execute(begin, (tenant, a, token, Jsonb(PARAMS)))
    conn.execute("SELECT orch8.release_lease(%s, %s, %s)", (tenant, a, token))
    token = claim(conn, a)
    outcome, effect_id = conn.execute(begin, (tenant, a, token, Jsonb(PARAMS))).fetchone()
    assert outcome == "blocked"
    return a, effect_id


def make_seq(conn, definition=None, tenant=ACME, name=None):
    return conn.execute(
        "SELECT id FROM orch8.create_sequence(%s, 'default', %s, %s)",
        (tenant, name or f"s{uuid.uuid4().hex[:8]}", Jsonb(definition or CHARGE)),
    ).fetchone()[0]


def count(conn, table):
    return conn.execute(f"SELECT count(*) FROM orch8.{table}").fetchone()[0]


# --- fixtures ----------------------------------------------------------------------------


class Api:
    """The test client with one key's headers and the /api/v1 prefix."""

    def __init__(self, client, key=None, **headers):
        self.client = client
        self.headers = dict(headers)
        if key:
            self.headers["Authorization"] = f"Bearer {key}"

    def get(self, path, **kw):
        return self.client.get(f"/api/v1{path}", headers=self.headers, **kw)

    def post(self, path, body=None, **kw):
        if body is not None:
            kw["json"] = body
        return self.client.post(f"/api/v1{path}", headers=self.headers, **kw)

    def put(self, path, body=None, **kw):
        if body is not None:
            kw["json"] = body
        return self.client.put(f"/api/v1{path}", headers=self.headers, **kw)


@pytest.fixture
def app(db_url):
    app = create_app(db_url, secret_key="api-test-secret")
    app.testing = True
    yield app
    app.extensions["orch8.pool"].close()


@pytest.fixture
def keys(conn):
    made = {
        role: apikeys.create(conn, ACME, role, f"{role}-alice")[1]
        for role in ("operator", "worker", "auditor")
    }
    made["other"] = apikeys.create(conn, OTHER, "operator", "bob")[1]
    made["admin"] = apikeys.create(conn, ROOT, "admin", "root-admin")[1]
    return made


@pytest.fixture
def api(app, keys):
    return Api(app.test_client(), keys["operator"])


@pytest.fixture
def as_role(app, keys):
    return lambda role, **headers: Api(app.test_client(), keys[role], **headers)


@pytest.fixture(autouse=True)
def _clear_sent():
    SENT.clear()


def problem(resp, status, error=None):
    """An RFC 9457 problem document with this status (and error code)."""
    assert resp.status_code == status, (resp.status_code, resp.get_data(as_text=True))
    assert resp.mimetype == "application/problem+json", resp.get_data(as_text=True)
    body = resp.get_json()
    assert isinstance(body["error"], str)
    assert body["status"] == status
    assert body["type"] == "urn:orch8:problem:" + body["error"].replace(" ", "-")
    assert body["title"].lower() == body["error"]
    if error:
        assert body["error"] == error, body
    return body


def ok(resp, status=200):
    assert resp.status_code == status, (resp.status_code, resp.get_data(as_text=True))
    return resp.get_json()


# --- the document ------------------------------------------------------------------------


def test_openapi_document_describes_every_route(app):
    doc = ok(app.test_client().get("/api/v1/openapi.json"))
    assert doc["openapi"].startswith("3.1")
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    documented = {(path, method.upper()) for path, item in doc["paths"].items() for method in item}
    routed = set()
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/api/v1/"):
            continue
        path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule)
        routed |= {(path, m) for m in rule.methods - {"HEAD", "OPTIONS"}}
    assert routed == documented
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            names = set(re.findall(r"{([a-z_]+)}", path))
            declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert names == declared, (path, method)
            if path != "/api/v1/openapi.json":
                assert {"401", "403", "404", "422"} <= set(operation["responses"]), path


# --- authentication, roles, tenants ------------------------------------------------------


def test_a_key_is_required_and_checked(app, conn, keys):
    client = app.test_client()
    body = problem(client.get("/api/v1/instances"), 401, "unauthorized")
    assert "Bearer" in body["detail"]
    problem(client.get("/api/v1/instances", headers={"Authorization": "Bearer nope"}), 401)
    assert (
        client.get("/api/v1/instances", headers={"X-Api-Key": keys["operator"]}).status_code == 200
    )
    key_id, secret = apikeys.create(conn, ACME, "operator", "short-lived")
    assert Api(client, secret).get("/instances").status_code == 200
    sqlapi.keys.revoke_api_key(conn, tenant_id=ACME, key_id=key_id)
    problem(Api(client, secret).get("/instances"), 401)
    problem(client.get("/api/v1/nowhere", headers={"X-Api-Key": keys["operator"]}), 404)


def test_roles(conn, as_role):
    operator = as_role("operator")
    created = ok(operator.post("/sequences", {"name": "hello", "definition": HELLO}), 201)
    inst = ok(operator.post("/instances", {"sequence": "hello"}), 201)["id"]

    auditor = as_role("auditor")
    assert ok(auditor.get(f"/instances/{inst}"))["id"] == inst
    assert ok(auditor.get("/sequences"))["items"][0]["id"] == created["id"]
    for path, body in [
        ("/sequences", {"name": "x", "definition": HELLO}),
        ("/instances", {"sequence": "hello"}),
        (f"/instances/{inst}/cancel", None),
        (f"/instances/{inst}/signals", {"type": "x"}),
        ("/continuity/effects/verify", {"superseded": True}),
    ]:
        problem(auditor.post(path, body), 403, "forbidden")

    worker = as_role("worker")
    assert ok(worker.get(f"/instances/{inst}"))["state"] == "scheduled"
    for path in [
        "/instances",
        "/sequences",
        "/effects/unresolved",
        "/webhooks/outbox",
        f"/instances/{inst}/audit",
        "/sequences/default/hello",
    ]:
        problem(worker.get(path), 403, "forbidden")
    problem(worker.post(f"/instances/{inst}/pause"), 403)
    problem(worker.post("/instances", {"sequence": "hello"}), 403)

    # admin: its own tenant by default, any tenant with X-Tenant-Id
    problem(as_role("admin").get(f"/instances/{inst}"), 404)
    admin = as_role("admin", **{"X-Tenant-Id": ACME})
    assert ok(admin.get(f"/instances/{inst}"))["id"] == inst
    assert ok(admin.post(f"/instances/{inst}/pause"))["state"] == "paused"
    audit = ok(admin.get(f"/instances/{inst}/audit"))["items"]
    assert audit[-1]["actor"] == "key:root-admin"
    problem(as_role("admin", **{"X-Tenant-Id": "bad tenant!"}).get("/instances"), 422)
    # a non-admin naming another tenant sees nothing there
    problem(as_role("operator", **{"X-Tenant-Id": OTHER}).get("/instances"), 404)


def test_another_tenants_resources_are_not_found(conn, api, as_role):
    seq = make_seq(conn, tenant=OTHER, name="theirs")
    conn.execute(
        "SELECT orch8.create_webhook_subscription(%s, 'http://127.0.0.1:9/h', 's')", (OTHER,)
    )
    theirs, effect_id = fail_with_unknown_receipt(conn, seq, tenant=OTHER)
    continuity = conn.execute(
        "SELECT continuity_id FROM orch8.effect_receipts WHERE id = %s", (effect_id,)
    ).fetchone()[0]
    for path in [
        f"/instances/{theirs}",
        f"/instances/{theirs}/outputs",
        f"/instances/{theirs}/audit",
        f"/instances/{theirs}/signals",
        f"/instances/{theirs}/effects",
        f"/effects/{effect_id}",
        f"/continuity/executions/{continuity}/effects",
        "/sequences/default/theirs",
        "/sequences/default/theirs/versions",
        "/sequences/default/theirs/versions/1",
    ]:
        problem(api.get(path), 404, "not found")
    for path, body in [
        (f"/instances/{theirs}/cancel", None),
        (f"/instances/{theirs}/pause", None),
        (f"/instances/{theirs}/resume", None),
        (f"/instances/{theirs}/retry", None),
        (f"/instances/{theirs}/signals", {"type": "approved"}),
        (
            f"/continuity/effects/{effect_id}/resolve",
            {"state": "committed", "evidence": {}, "expected_state": "unknown"},
        ),
        ("/instances", {"sequence": "theirs"}),
    ]:
        problem(api.post(path, body), 404, "not found")
    # asking a verifier for their receipt: not found here, and nothing scheduled
    asked = ok(api.post("/continuity/effects/verify", {"effect_ids": [str(effect_id)]}))
    assert asked == {"items": [{"effect_id": str(effect_id), "outcome": "not_found"}]}
    assert count(conn, "effect_verifications") == 0
    assert ok(api.get("/instances"))["items"] == []
    assert ok(api.get("/sequences"))["items"] == []
    assert ok(api.get("/webhooks/outbox"))["items"] == []
    # the queue view runs with its owner's rights: the route's tenant filter must hold
    assert ok(api.get("/effects/unresolved"))["items"] == []
    assert ok(api.get(f"/effects/find?key={effect_id}"))["items"] == []
    theirs_queue = ok(as_role("other").get("/effects/unresolved"))["items"]
    assert [e["effect_id"] for e in theirs_queue] == [str(effect_id)]
    # nothing of theirs moved
    assert (
        conn.execute(
            "SELECT state::text FROM orch8.effect_receipts WHERE id = %s", (effect_id,)
        ).fetchone()[0]
        == "unknown"
    )
    (delivery,) = conn.execute("SELECT id FROM orch8.webhook_outbox").fetchone()
    problem(api.post(f"/webhooks/outbox/{delivery}/discard"), 404)
    problem(api.post(f"/webhooks/outbox/{delivery}/redeliver"), 404)
    assert conn.execute("SELECT state FROM orch8.webhook_outbox").fetchone()[0] == "pending"


# --- sequences ---------------------------------------------------------------------------


def test_sequences_create_list_and_read(api):
    first = ok(api.post("/sequences", {"name": "checkout", "definition": HELLO}), 201)
    assert first["version"] == 1 and first["namespace"] == "default"
    assert first["definition"] == HELLO
    second = ok(
        api.post("/sequences", {"namespace": "default", "name": "checkout", "definition": CHARGE}),
        201,
    )
    assert second["version"] == 2
    ok(
        api.post("/sequences", {"namespace": "billing", "name": "invoice", "definition": HELLO}),
        201,
    )

    listed = ok(api.get("/sequences"))
    assert [(s["namespace"], s["name"], s["version"]) for s in listed["items"]] == [
        ("billing", "invoice", 1),
        ("default", "checkout", 2),
    ]
    assert listed["next_cursor"] is None and "definition" not in listed["items"][0]
    assert [s["name"] for s in ok(api.get("/sequences?namespace=billing"))["items"]] == ["invoice"]
    page1 = ok(api.get("/sequences?limit=1"))
    page2 = ok(api.get(f"/sequences?limit=1&cursor={page1['next_cursor']}"))
    assert [page1["items"][0]["name"], page2["items"][0]["name"]] == ["invoice", "checkout"]
    assert page2["next_cursor"] is None

    latest = ok(api.get("/sequences/default/checkout"))
    assert latest["version"] == 2 and latest["definition"] == CHARGE
    assert ok(api.get("/sequences/default/checkout/versions/1"))["definition"] == HELLO
    versions = ok(api.get("/sequences/default/checkout/versions"))["items"]
    assert [v["version"] for v in versions] == [1, 2]

    problem(api.get("/sequences/default/nope"), 404, "not found")
    problem(api.get("/sequences/default/nope/versions"), 404)
    problem(api.get("/sequences/default/checkout/versions/3"), 404)
    problem(api.get("/sequences/default/checkout/versions/abc"), 422)
    problem(api.get("/sequences/default/checkout/versions/0"), 422)
    problem(api.get("/sequences/default/checkout/versions/99999999999"), 422)
    problem(api.get("/sequences/default/a%00b"), 422)
    problem(api.get("/sequences?limit=0"), 422)
    problem(api.get("/sequences?cursor=garbage"), 422)
    problem(api.get("/sequences?color=red"), 422)


def test_an_invalid_definition_lists_every_problem(api):
    bad = {
        "blocks": [
            {"id": "a", "type": "step", "handler": "noop", "retry": {"max_attempts": 0}},
            {"id": "a", "type": "step"},
        ],
        "colour": "blue",
    }
    body = problem(api.post("/sequences", {"name": "broken", "definition": bad}), 422)
    assert body["error"] == "invalid definition"
    paths = {p["path"] for p in body["problems"]}
    assert {"$.colour", "$.blocks[0].retry.max_attempts", "$.blocks[1].handler"} <= paths
    assert all(set(p) == {"path", "message"} for p in body["problems"])
    problem(api.get("/sequences/default/broken"), 404)  # nothing stored
    # a name outside its pattern is refused by create_sequence itself
    body = problem(api.post("/sequences", {"name": "no spaces", "definition": HELLO}), 422)
    assert "name" in body["detail"]
    # request shape: every problem, with its field
    body = problem(api.post("/sequences", {"namespace": 7, "definition": [], "x": 1}), 422)
    assert {(p["path"], p["message"]) for p in body["problems"]} == {
        ("x", "unknown field"),
        ("name", "is required"),
        ("namespace", "Input should be a valid string"),
        ("definition", "Input should be a valid dictionary"),
    }
    assert body["detail"].startswith("4 problems in the body: ")


# --- instances ---------------------------------------------------------------------------


def test_create_instance_and_idempotency(api):
    ok(api.post("/sequences", {"name": "hello", "definition": HELLO}), 201)
    ok(api.post("/sequences", {"name": "hello", "definition": CHARGE}), 201)
    body = {"sequence": "hello", "data": {"order": 7}, "idempotency_key": "order-7"}
    first = ok(api.post("/instances", body), 201)
    assert first["deduplicated"] is False and first["state"] == "scheduled"
    assert first["sequence_version"] == 2 and first["context"]["data"] == {"order": 7}
    again = ok(api.post("/instances", {**body, "data": {"order": 8}}), 200)
    assert again["deduplicated"] is True and again["id"] == first["id"]
    assert again["context"]["data"] == {"order": 7}

    pinned = ok(
        api.post(
            "/instances",
            {
                "sequence": "hello",
                "namespace": "default",
                "version": 1,
                "priority": 5,
                "config": {"currency": "EUR"},
                "idempotency_key": None,
            },
        ),
        201,
    )
    assert pinned["sequence_version"] == 1 and pinned["priority"] == 5
    assert pinned["context"]["config"] == {"currency": "EUR"}

    problem(api.post("/instances", {"sequence": "nope"}), 404)
    problem(api.post("/instances", {"sequence": "hello", "version": 9}), 404)
    for bad in [
        {"sequence": "hello", "idempotency_key": ""},
        {"sequence": "hello", "idempotency_key": "k" * 257},
        {"sequence": "hello", "idempotency_key": "é" * 129},  # 258 bytes
        {"sequence": "hello", "priority": True},
        {"sequence": "hello", "priority": 2**31},
        {"sequence": "hello", "version": 0},
        {"sequence": "hello", "data": [1]},
        {"sequence": "hello", "data": {"big": "x" * 300_000}},  # over orch8.max_context_bytes
    ]:
        problem(api.post("/instances", bad), 422, "invalid input")
    assert len(ok(api.get("/instances"))["items"]) == 2


def test_list_instances_filters_and_pages(conn, api):
    ok(api.post("/sequences", {"name": "hello", "definition": HELLO}), 201)
    ok(api.post("/sequences", {"name": "other", "definition": HELLO}), 201)
    made = [ok(api.post("/instances", {"sequence": "hello"}), 201)["id"] for _ in range(5)]
    extra = ok(api.post("/instances", {"sequence": "other"}), 201)["id"]
    ok(api.post(f"/instances/{made[0]}/pause"))

    seen, cursor, pages = [], None, 0
    while True:
        page = ok(
            api.get(
                "/instances", query_string={"limit": 2, **({"cursor": cursor} if cursor else {})}
            )
        )
        pages += 1
        assert len(page["items"]) <= 2
        seen += [i["id"] for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3 and seen == [extra, *reversed(made)]  # newest first, no repeats
    assert "context" not in page["items"][0]

    assert [i["id"] for i in ok(api.get("/instances?state=paused"))["items"]] == [made[0]]
    assert {i["id"] for i in ok(api.get("/instances?sequence=hello"))["items"]} == set(made)
    assert ok(api.get("/instances?sequence=hello&namespace=elsewhere"))["items"] == []
    created = {
        r[0]: r[1]
        for r in conn.execute("SELECT id::text, created_at FROM orch8.task_instances").fetchall()
    }
    pivot = created[made[2]].isoformat()
    after = ok(api.get("/instances", query_string={"created_after": pivot}))["items"]
    assert {i["id"] for i in after} == {made[2], made[3], made[4], extra}
    before = ok(api.get("/instances", query_string={"created_before": pivot}))["items"]
    assert {i["id"] for i in before} == {made[0], made[1]}
    naive = created[made[2]].astimezone(dt.UTC).replace(tzinfo=None)
    assert (
        len(ok(api.get("/instances", query_string={"created_after": naive.isoformat()}))["items"])
        == 4
    )

    for qs in [
        "limit=0",
        "limit=201",
        "limit=abc",
        "limit=-1",
        "state=bogus",
        "created_after=yesterday",
        "cursor=!!!",
        "cursor=WzFd",
        "limit=1&limit=2",
        "sort=id",
        "sequence=a%00b",
    ]:
        body = problem(api.get(f"/instances?{qs}"), 422, "invalid input")
        assert body["problems"] and body["problems"][0]["path"]


def test_instance_detail_outputs_audit_and_signals(conn, api, as_role):
    ok(api.post("/sequences", {"name": "hello", "definition": HELLO}), 201)
    inst = ok(api.post("/instances", {"sequence": "hello", "data": {"a": 1}}), 201)["id"]
    detail = ok(api.get(f"/instances/{inst}"))
    assert detail["context"] == {"data": {"a": 1}, "config": {}, "runtime": {}}
    assert detail["current_block"] == "hello" and detail["error"] is None  # its next block
    assert detail["requested_state"] is None and "lease_token" not in detail
    assert ok(api.get(f"/instances/{inst}/outputs"))["items"] == []
    assert [t["to_state"] for t in ok(api.get(f"/instances/{inst}/audit"))["items"]] == [
        "scheduled"
    ]

    sent = ok(
        api.post(f"/instances/{inst}/signals", {"type": "approved", "payload": {"by": "bob"}}), 201
    )
    assert sent["outcome"] == "pending" and sent["state"] == "scheduled"
    sent = ok(api.post(f"/instances/{inst}/signals", {"type": "pause"}), 201)
    assert sent["outcome"] == "paused" and sent["state"] == "paused"
    signals = ok(api.get(f"/instances/{inst}/signals"))["items"]
    assert [(s["type"], s["payload"], s["actor"]) for s in signals] == [
        ("approved", {"by": "bob"}, "key:operator-alice"),
        ("pause", {}, "key:operator-alice"),
    ]
    problem(api.post(f"/instances/{inst}/signals", {"type": "not ok!"}), 422)
    problem(api.post(f"/instances/{inst}/signals", {"payload": {}}), 422)

    missing = uuid.uuid4()
    for path in ["", "/outputs", "/audit", "/signals", "/effects"]:
        problem(api.get(f"/instances/{missing}{path}"), 404, "not found")
        body = problem(api.get(f"/instances/not-a-uuid{path}"), 422, "invalid input")
        assert [p["path"] for p in body["problems"]] == ["instance_id"]
        assert "valid UUID" in body["problems"][0]["message"]
    problem(api.get(f"/instances/{inst}?x=1"), 422)
    problem(as_role("worker").get(f"/instances/{missing}"), 404)


def test_cancel_pause_resume(conn, api):
    ok(api.post("/sequences", {"name": "hello", "definition": HELLO}), 201)
    inst = ok(api.post("/instances", {"sequence": "hello"}), 201)["id"]
    assert ok(api.post(f"/instances/{inst}/pause", {"reason": "look first"}))["outcome"] == "paused"
    assert ok(api.post(f"/instances/{inst}/pause"))["outcome"] == "unchanged"
    moved = ok(api.post(f"/instances/{inst}/resume", {"reason": "looked"}))
    assert moved == {
        "id": inst,
        "outcome": "scheduled",
        "state": "scheduled",
        "requested_state": None,
    }
    body = problem(api.post(f"/instances/{inst}/resume"), 409, "conflict")
    assert body["current_state"] == "scheduled"

    # a running instance: the request waits for the step boundary
    token = claim(conn, uuid.UUID(inst))
    assert token
    moved = ok(api.post(f"/instances/{inst}/pause"))
    assert (moved["outcome"], moved["state"], moved["requested_state"]) == (
        "requested",
        "running",
        "paused",
    )
    assert ok(api.post(f"/instances/{inst}/resume"))["requested_state"] is None
    moved = ok(api.post(f"/instances/{inst}/cancel", {"reason": "customer asked"}))
    assert moved["requested_state"] == "cancelled"
    # the next step boundary applies it (begin_step here; release_lease and the sweep too)
    outcome = conn.execute(
        "SELECT outcome FROM orch8.begin_step('acme', %s, %s, 'hello', 'test.api.charge', '{}', 0)",
        (inst, token),
    ).fetchone()[0]
    assert outcome == "stopped"
    assert ok(api.get(f"/instances/{inst}"))["state"] == "cancelled"
    body = problem(api.post(f"/instances/{inst}/pause"), 409)
    assert body["current_state"] == "cancelled"
    problem(api.post(f"/instances/{inst}/signals", {"type": "resume"}), 409)
    problem(api.post(f"/instances/{inst}/retry"), 409)
    audit = ok(api.get(f"/instances/{inst}/audit"))["items"]
    assert {a["actor"] for a in audit[1:3]} == {"key:operator-alice"}
    assert [a["reason"] for a in audit[1:3]] == ["look first", "looked"]
    # the cancel asked while running is applied by the runner, in the asker's name
    assert (audit[-1]["to_state"], audit[-1]["actor"], audit[-1]["reason"]) == (
        "cancelled",
        "key:operator-alice",
        "customer asked",
    )
    asked = ok(api.get(f"/instances/{inst}/requests"))["items"]
    assert [(r["action"], r["reason"], r["outcome"]) for r in asked] == [
        ("pause", "look first", "paused"),
        ("pause", None, "unchanged"),
        ("resume", "looked", "scheduled"),
        ("pause", None, "requested"),
        ("resume", None, "withdrawn"),
        ("cancel", "customer asked", "requested"),
    ]
    assert {r["actor"] for r in asked} == {"key:operator-alice"}
    assert all(r["api_key_id"] and r["db_user"] for r in asked)
    problem(api.get(f"/instances/{uuid.uuid4()}/requests"), 404)
    # bodies of the moves are checked too
    problem(api.post(f"/instances/{inst}/cancel", {"why": "x"}), 422)
    problem(api.post(f"/instances/{inst}/resume", {"why": "x"}), 422)
    problem(api.post(f"/instances/{inst}/resume", {"reason": "x" * 3000}), 422)
    problem(api.post(f"/instances/{uuid.uuid4()}/cancel"), 404)
    problem(api.post("/instances/123/cancel"), 422)


# --- effects, resolution and retry -------------------------------------------------------


def test_effect_lists_queue_and_detail(conn, api):
    seq = make_seq(conn)
    inst, effect_id = fail_with_unknown_receipt(conn, seq)
    receipts = ok(api.get(f"/instances/{inst}/effects"))["items"]
    assert [(r["id"], r["state"], r["kind"]) for r in receipts] == [
        (str(effect_id), "unknown", "worker")
    ]
    continuity = receipts[0]["continuity_id"]
    assert ok(api.get(f"/continuity/executions/{continuity}/effects"))["items"] == receipts
    problem(api.get(f"/continuity/executions/{uuid.uuid4()}/effects"), 404)
    problem(api.get("/continuity/executions/nope/effects"), 422)

    queue = ok(api.get("/effects/unresolved"))["items"]
    assert [q["effect_id"] for q in queue] == [str(effect_id)]
    assert queue[0]["instance_id"] == str(inst) and queue[0]["age_seconds"] >= 0
    assert queue[0]["idempotency_key"] == "order-7"
    # its failed instance waits on it; its step declares no verifier
    assert queue[0]["blocking"] is True
    assert (
        queue[0]["verification"],
        queue[0]["verification_tries"],
        queue[0]["verification_max_tries"],
        queue[0]["verification_next_at"],
    ) == (None, None, None, None)
    assert [q["effect_id"] for q in ok(api.get("/effects/unresolved?blocking=true"))["items"]] == [
        str(effect_id)
    ]
    assert ok(api.get("/effects/unresolved?blocking=false"))["items"] == []
    assert ok(api.get("/effects/unresolved?kind=worker&older_than=0s&limit=1"))["items"]
    assert ok(api.get("/effects/unresolved?kind=http"))["items"] == []
    assert ok(api.get("/effects/unresolved?older_than=1d"))["items"] == []
    for qs in [
        "kind=bogus",
        "older_than=10",
        "older_than=10y",
        "older_than=1234567d",
        "limit=500",
        "blocking=maybe",
    ]:
        problem(api.get(f"/effects/unresolved?{qs}"), 422)

    shown = ok(api.get(f"/effects/{effect_id}"))
    assert shown["state"] == "unknown" and shown["block_id"] == "charge"
    assert [(e["from_state"], e["to_state"]) for e in shown["events"]] == [
        (None, "planned"),
        ("planned", "prepared"),
        ("prepared", "dispatched"),
        ("dispatched", "unknown"),
    ]
    assert shown["invariant_results"] == []
    problem(api.get(f"/effects/{uuid.uuid4()}"), 404)
    problem(api.get("/effects/xyz"), 422)

    # found by the key a provider shows: the idempotency key sent, or the receipt id
    for key in ("order-7", str(effect_id), str(effect_id).upper()):
        assert [r["id"] for r in ok(api.get(f"/effects/find?key={key}"))["items"]] == [
            str(effect_id)
        ]
    assert ok(api.get("/effects/find?key=nothing-sent-so"))["items"] == []
    for qs in ["", "key=", "key=" + "k" * 257, "key=a&x=1"]:
        problem(api.get(f"/effects/find?{qs}"), 422)


def test_effect_detail_names_invariant_results(conn, api):
    seq = make_seq(
        conn,
        {
            "blocks": [{"type": "step", "id": "charge", "handler": "test.api.charge"}],
        },
    )
    a = conn.execute("SELECT id FROM orch8.create_instance('acme', %s)", (seq,)).fetchone()[0]
    conn.execute(
        "SELECT orch8.declare_invariant('acme', 'charge once',"
        ' \'{"type": "effect_at_most_once", "kind": "worker"}\', true, p_instance_id => %s)',
        (a,),
    )
    token = claim(conn, a)
    out = conn.execute(
        "SELECT outcome, effect_id FROM orch8.begin_step('acme', %s, %s, 'charge',"
        " 'test.api.charge', %s, 0)",
        (a, token, Jsonb(PARAMS)),
    ).fetchone()
    assert out[0] == "dispatched"
    shown = ok(api.get(f"/effects/{out[1]}"))
    assert [(r["invariant_name"], r["status"]) for r in shown["invariant_results"]] == [
        ("charge once", "pass")
    ]


def test_resolve_flow(conn, api, as_role):
    seq = make_seq(conn)
    _, effect_id = fail_with_unknown_receipt(conn, seq)
    url = f"/continuity/effects/{effect_id}/resolve"
    seen = {"expected_state": "unknown"}

    body = problem(api.post(url, {"state": "abandoned", "evidence": {}, **seen}), 422)
    assert body["error"] == "invalid input" and "evidence" in body["detail"]
    body = problem(api.post(url, {"state": "compensated", "evidence": {}, **seen}), 422)
    body = problem(api.post(url, {"state": "committed", **seen}), 422)
    assert body["problems"] == [{"path": "evidence", "message": "is required"}]
    body = problem(api.post(url, {"state": "done", "evidence": "yes", **seen}), 422)
    assert {p["path"] for p in body["problems"]} == {"state", "evidence"}
    problem(
        api.post(
            url,
            {"state": "committed", "evidence": {}, "provider_receipt_id": "x" * 300, **seen},
        ),
        422,
    )
    body = problem(
        api.post(url, {"state": "committed", "evidence": {"a": 1}, "expected_state": "dispatched"}),
        409,
        "reload before resolving",
    )
    assert body["current_state"] == "unknown"
    problem(as_role("auditor").post(url, {"state": "committed", "evidence": {}, **seen}), 403)

    resolved = ok(
        api.post(
            url,
            {
                "state": "committed",
                "provider_receipt_id": "ch_3LkP",
                "evidence": {"checked": "provider dashboard"},
                "note": "provider shows the charge",
                "expected_state": "unknown",
            },
        )
    )
    assert resolved["state"] == "committed" and resolved["provider_receipt_id"] == "ch_3LkP"
    assert resolved["evidence"]["resolution"]["actor"] == "key:operator-alice"
    last = ok(api.get(f"/effects/{effect_id}"))["events"][-1]
    assert (last["from_state"], last["to_state"], last["actor"], last["note"]) == (
        "unknown",
        "committed",
        "key:operator-alice",
        "provider shows the charge",
    )
    # someone resolved it meanwhile: a second operator still expecting unknown must reload
    body = problem(
        api.post(url, {"state": "abandoned", "evidence": {"x": 1}, **seen}),
        409,
        "reload before resolving",
    )
    assert body["current_state"] == "committed"
    # an illegal move names the current state and where it may go
    body = problem(
        api.post(url, {"state": "abandoned", "evidence": {"x": 1}, "expected_state": "committed"}),
        409,
        "conflict",
    )
    assert body["current_state"] == "committed"
    assert body["allowed_states"] == ["compensated"]
    # committed -> compensated is legal, with evidence
    compensated = ok(
        api.post(
            url,
            {"state": "compensated", "evidence": {"refund": "re_1"}, "expected_state": "committed"},
        )
    )
    assert compensated["state"] == "compensated"
    problem(
        api.post(
            f"/continuity/effects/{uuid.uuid4()}/resolve",
            {"state": "committed", "evidence": {}, **seen},
        ),
        404,
    )
    problem(
        api.post("/continuity/effects/42/resolve", {"state": "committed", "evidence": {}, **seen}),
        422,
    )


def test_resolve_needs_expected_state_and_a_target_a_receipt_can_be_resolved_to(conn, api):
    seq = make_seq(conn)
    _, effect_id = fail_with_unknown_receipt(conn, seq)
    url = f"/continuity/effects/{effect_id}/resolve"
    body = problem(api.post(url, {"state": "committed", "evidence": {"a": 1}}), 422)
    assert body["error"] == "invalid input"
    assert body["problems"] == [{"path": "expected_state", "message": "is required"}]
    allowed = "'abandoned', 'committed', 'compensated' or 'verified'"
    for state in ("dispatched", "planned", "unknown", "prepared"):
        body = problem(
            api.post(url, {"state": state, "evidence": {"a": 1}, "expected_state": "unknown"}),
            422,
            "invalid input",  # refused by the request's declaration, not 409 by the engine
        )
        assert body["problems"] == [{"path": "state", "message": f"Input should be {allowed}"}]
    body = problem(
        api.post(url, {"state": "committed", "evidence": {}, "expected_state": "settled"}), 422
    )
    assert [p["path"] for p in body["problems"]] == ["expected_state"]
    # an output belongs to committed or verified only
    body = problem(
        api.post(
            url,
            {"state": "abandoned", "evidence": {"a": 1}, "expected_state": "unknown", "output": 1},
        ),
        422,
    )
    assert body["problems"] == [
        {
            "path": "output",
            "message": "an output belongs to a committed or verified resolution (the step then"
            " completes with it), not to abandoned",
        }
    ]
    body = problem(
        api.post(
            url,
            {
                "state": "committed",
                "evidence": {},
                "expected_state": "unknown",
                "output": {"k": "a\u0000b"},
            },
        ),
        422,
    )
    assert [p["path"] for p in body["problems"]] == ["output.k"]
    assert ok(api.get(f"/effects/{effect_id}"))["state"] == "unknown"  # nothing moved


def test_of_two_resolutions_from_the_same_state_the_second_is_409_and_the_first_stays(conn, api):
    seq = make_seq(conn)
    _, effect_id = fail_with_unknown_receipt(conn, seq)
    url = f"/continuity/effects/{effect_id}/resolve"
    first = {
        "state": "committed",
        "evidence": {"by": "alice"},
        "provider_receipt_id": "ch_alice",
        "expected_state": "unknown",
    }
    second = {"state": "abandoned", "evidence": {"by": "bob"}, "expected_state": "unknown"}
    ok(api.post(url, first))
    body = problem(api.post(url, second), 409, "reload before resolving")
    assert body["current_state"] == "committed" and body["effect_id"] == str(effect_id)
    shown = ok(api.get(f"/effects/{effect_id}"))
    assert (shown["state"], shown["provider_receipt_id"]) == ("committed", "ch_alice")
    assert shown["evidence"]["resolution"]["evidence"] == {"by": "alice"}
    assert [e["to_state"] for e in shown["events"]].count("abandoned") == 0


def test_concurrent_resolutions_from_the_same_state_one_wins(app, conn, keys):
    seq = make_seq(conn)
    _, effect_id = fail_with_unknown_receipt(conn, seq)
    url = f"/continuity/effects/{effect_id}/resolve"
    barrier = threading.Barrier(6)

    def attempt(n):
        client = Api(app.test_client(), keys["operator"])
        barrier.wait()
        return n, client.post(
            url,
            {
                "state": "verified" if n % 2 else "abandoned",
                "evidence": {"by": f"operator {n}"},
                "expected_state": "unknown",
            },
        )

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(attempt, range(6)))
    statuses = sorted(resp.status_code for _, resp in answers)
    assert statuses == [200, 409, 409, 409, 409, 409], statuses
    [(winner, _)] = [(n, r) for n, r in answers if r.status_code == 200]
    for _, resp in answers:
        if resp.status_code == 409:
            assert resp.get_json()["error"] == "reload before resolving"
    shown = ok(Api(app.test_client(), keys["operator"]).get(f"/effects/{effect_id}"))
    assert shown["evidence"]["resolution"]["evidence"] == {"by": f"operator {winner}"}
    moves = [(e["from_state"], e["to_state"]) for e in shown["events"]]
    assert moves.count(("unknown", shown["state"])) == 1 and len(moves) == 5


def test_a_resolution_clears_the_error_and_later_ones_keep_the_first(conn, api):
    seq = make_seq(conn)
    _, effect_id = fail_with_unknown_receipt(conn, seq)
    url = f"/continuity/effects/{effect_id}/resolve"
    assert ok(api.get(f"/effects/{effect_id}"))["error"]  # unknown: why it is
    committed = ok(
        api.post(
            url,
            {
                "state": "committed",
                "evidence": {"dashboard": "paid"},
                "output": {"receipt_id": "ch_1"},
                "expected_state": "unknown",
            },
        )
    )
    assert committed["error"] is None
    assert committed["evidence"]["resolution"]["output"] == {"receipt_id": "ch_1"}
    refunded = ok(
        api.post(
            url,
            {
                "state": "compensated",
                "evidence": {"refund": "re_1"},
                "note": "customer refunded",
                "expected_state": "committed",
            },
        )
    )
    assert refunded["state"] == "compensated" and refunded["error"] is None
    history = refunded["evidence"]["resolutions"]
    assert [(h["state"], h["evidence"]) for h in history] == [
        ("committed", {"dashboard": "paid"}),
        ("compensated", {"refund": "re_1"}),
    ]
    assert history[0]["output"] == {"receipt_id": "ch_1"}
    assert refunded["evidence"]["resolution"]["state"] == "compensated"


def test_retry_while_the_receipt_is_unknown_is_refused_naming_it(conn, api):
    seq = make_seq(conn)
    inst, effect_id = fail_with_unknown_receipt(conn, seq)
    body = problem(api.post(f"/instances/{inst}/retry"), 409, "blocked by an unresolved effect")
    assert body["effect_id"] == str(effect_id)
    assert str(effect_id) in body["detail"] and "resolve it" in body["detail"]
    assert ok(api.get(f"/instances/{inst}"))["state"] == "failed"


def test_retry_after_committed_completes_from_evidence_without_sending(db_url, conn, api):
    seq = make_seq(conn)
    inst, effect_id = fail_with_unknown_receipt(conn, seq)
    ok(
        api.post(
            f"/continuity/effects/{effect_id}/resolve",
            {
                "state": "committed",
                "provider_receipt_id": "ch_1",
                "evidence": {"dashboard": "paid"},
                "expected_state": "unknown",
            },
        )
    )
    out = ok(api.post(f"/instances/{inst}/retry"))
    assert (out["outcome"], out["block_id"], out["effect_id"]) == (
        "completed_from_evidence",
        "charge",
        str(effect_id),
    )
    assert out["state"] == "scheduled" and "not sent again" in out["detail"]
    with running(db_url):
        assert wait_for(conn, [inst])[inst] == ("completed", None)
    assert SENT == []  # the handler never ran again
    outputs = ok(api.get(f"/instances/{inst}/outputs"))["items"]
    settled = [o for o in outputs if o["block_id"] == "charge" and o["sentinel"] is None]
    # nobody reads charge's output: it completes with a marker naming the resolution
    assert settled[0]["output"] == {
        "settled": True,
        "settled_by": "key:operator-alice",
        "effect_id": str(effect_id),
        "effect_state": "committed",
        "provider_receipt_id": "ch_1",
    }
    assert ok(api.get(f"/instances/{inst}"))["state"] == "completed"
    audit = ok(api.get(f"/instances/{inst}/audit"))["items"]
    assert any(a["actor"] == "key:operator-alice" and a["to_state"] == "scheduled" for a in audit)


def test_retry_after_abandoned_reruns_as_a_new_attempt(db_url, conn, api):
    seq = make_seq(conn)
    inst, effect_id = fail_with_unknown_receipt(conn, seq)
    ok(
        api.post(
            f"/continuity/effects/{effect_id}/resolve",
            {
                "state": "abandoned",
                "evidence": {"provider": "no such charge"},
                "expected_state": "unknown",
            },
        )
    )
    body = problem(api.post(f"/instances/{inst}/retry", {"output": {"id": "x"}}), 422)
    assert body["field"] == "output" and "runs again" in body["detail"]
    out = ok(api.post(f"/instances/{inst}/retry", {}))
    assert (out["outcome"], out["block_id"], out["effect_id"]) == (
        "rerun",
        "charge",
        str(effect_id),
    )
    with running(db_url):
        assert wait_for(conn, [inst])[inst] == ("completed", None)
    assert len(SENT) == 1 and SENT[0][0] == 1 and SENT[0][1] != str(effect_id)
    receipts = ok(api.get(f"/instances/{inst}/effects"))["items"]
    assert [(r["attempt"], r["state"]) for r in receipts] == [(0, "abandoned"), (1, "committed")]


READS_CHARGE = {
    "blocks": [
        {"type": "step", "id": "charge", "handler": "test.api.charge"},
        {
            "type": "step",
            "id": "ship",
            "handler": "test.api.ship",
            "params": {"receipt": "{{ outputs.charge.receipt_id }}"},
        },
    ]
}
SHIPPED: list[dict] = []


@handler("test.api.ship")
def ship(params, ctx):
    SHIPPED.append(params)
    return {"shipped": params["receipt"]}


def test_resolve_with_an_output_then_retry_completes_the_step_with_it(db_url, conn, api):
    SHIPPED.clear()
    seq = make_seq(conn, READS_CHARGE)
    inst, effect_id = fail_with_unknown_receipt(conn, seq)
    ok(
        api.post(
            f"/continuity/effects/{effect_id}/resolve",
            {
                "state": "verified",
                "evidence": {"dashboard": "ch_9 paid"},
                "output": {"receipt_id": "ch_9"},
                "expected_state": "unknown",
            },
        )
    )
    out = ok(api.post(f"/instances/{inst}/retry"))
    assert (out["outcome"], out["state"]) == ("completed_from_evidence", "scheduled")
    outputs = ok(api.get(f"/instances/{inst}/outputs"))["items"]
    charge = [o for o in outputs if o["block_id"] == "charge" and o["sentinel"] is None]
    assert [(o["output"], o["effect_id"]) for o in charge] == [
        ({"receipt_id": "ch_9"}, str(effect_id))
    ]
    with running(db_url):
        assert wait_for(conn, [inst])[inst] == ("completed", None)
    assert SENT == [] and SHIPPED == [{"receipt": "ch_9"}]  # ship read the resolution's output
    outputs = ok(api.get(f"/instances/{inst}/outputs"))["items"]
    shipped = [o["output"] for o in outputs if o["block_id"] == "ship" and not o["sentinel"]]
    assert shipped == [{"shipped": "ch_9"}]


def test_retry_without_an_output_that_later_blocks_read_is_refused_naming_them(db_url, conn, api):
    SHIPPED.clear()
    seq = make_seq(conn, READS_CHARGE)
    inst, effect_id = fail_with_unknown_receipt(conn, seq)
    ok(
        api.post(
            f"/continuity/effects/{effect_id}/resolve",
            {"state": "committed", "evidence": {"dashboard": "paid"}, "expected_state": "unknown"},
        )
    )
    body = problem(api.post(f"/instances/{inst}/retry"), 422, "invalid input")
    assert (body["field"], body["read_by"], body["block_id"], body["effect_id"]) == (
        "output",
        ["ship"],
        "charge",
        str(effect_id),
    )
    assert "ship" in body["detail"]
    assert ok(api.get(f"/instances/{inst}"))["state"] == "failed"  # nothing moved
    # the retry gives it
    out = ok(api.post(f"/instances/{inst}/retry", {"output": {"receipt_id": "ch_given"}}))
    assert out["outcome"] == "completed_from_evidence"
    outputs = ok(api.get(f"/instances/{inst}/outputs"))["items"]
    assert [o["output"] for o in outputs if o["block_id"] == "charge" and not o["sentinel"]] == [
        {"receipt_id": "ch_given"}
    ]
    with running(db_url):
        assert wait_for(conn, [inst])[inst] == ("completed", None)
    assert SHIPPED == [{"receipt": "ch_given"}]


def test_null_is_an_output_too_and_leaving_it_out_is_none(conn, api):
    seq = make_seq(conn, READS_CHARGE)
    a, ea = fail_with_unknown_receipt(conn, seq)
    b, eb = fail_with_unknown_receipt(conn, seq)
    committed = {"state": "committed", "evidence": {"seen": 1}, "expected_state": "unknown"}
    resolved = ok(api.post(f"/continuity/effects/{ea}/resolve", {**committed, "output": None}))
    assert "output" in resolved["evidence"]["resolution"]
    assert resolved["evidence"]["resolution"]["output"] is None
    assert ok(api.post(f"/instances/{a}/retry"))["outcome"] == "completed_from_evidence"
    resolved = ok(api.post(f"/continuity/effects/{eb}/resolve", committed))
    assert "output" not in resolved["evidence"]["resolution"]
    problem(api.post(f"/instances/{b}/retry", {}), 422)  # left out: none, and ship reads it
    assert ok(api.post(f"/instances/{b}/retry", {"output": None}))["outcome"] == (
        "completed_from_evidence"
    )
    for instance in (a, b):
        outputs = ok(api.get(f"/instances/{instance}/outputs"))["items"]
        charge = [o for o in outputs if o["block_id"] == "charge" and not o["sentinel"]]
        assert [o["output"] for o in charge] == [None]


def test_an_http_response_in_the_evidence_becomes_the_steps_output(conn, api):
    definition = {
        "blocks": [
            {
                "type": "step",
                "id": "charge",
                "handler": "http_request",
                "params": {
                    "method": "POST",
                    "url": "https://pay.example/charges",
                    "receipt_path": "json.id",
                },
            },
            {
                "type": "step",
                "id": "ship",
                "handler": "noop",
                "params": {"r": "{{ outputs.charge }}"},
            },
        ]
    }
    seq = make_seq(conn, definition)
    inst = conn.execute(
        "SELECT id FROM orch8.create_instance('acme', %s, '{}')", (seq,)
    ).fetchone()[0]
    begin = (
        "SELECT outcome, effect_id FROM orch8.begin_step('acme', %s, %s, 'charge',"
        " 'http_request', %s, 0)"
    )
    params = Jsonb(definition["blocks"][0]["params"])
    token = claim(conn, inst)
    conn.execute(begin, (inst, token, params))
    conn.execute("SELECT orch8.release_lease('acme', %s, %s)", (inst, token))
    outcome, effect_id = conn.execute(begin, (inst, claim(conn, inst), params)).fetchone()
    assert outcome == "blocked"
    url = f"/continuity/effects/{effect_id}/resolve"
    # keys in order: the test client sends JSON with sorted keys, and without a body the
    # handler's body is the compact JSON text of json
    response = {"json": {"amount": 1250, "id": "ch_77"}, "status": 201}
    # a response the handler cannot read is refused, naming the evidence
    body = problem(
        api.post(
            url,
            {
                "state": "committed",
                "evidence": {"response": {"status": "ok"}},
                "expected_state": "unknown",
            },
        ),
        422,
    )
    assert body["field"] == "evidence" and "status" in body["detail"]
    resolved = ok(
        api.post(
            url,
            {"state": "committed", "evidence": {"response": response}, "expected_state": "unknown"},
        )
    )
    expected = output_from_response(response, "json.id")
    assert expected["status"] == 201 and expected["json"] == response["json"]
    assert resolved["evidence"]["resolution"]["output"] == expected
    assert ok(api.post(f"/instances/{inst}/retry"))["outcome"] == "completed_from_evidence"
    outputs = ok(api.get(f"/instances/{inst}/outputs"))["items"]
    assert [o["output"] for o in outputs if o["block_id"] == "charge" and not o["sentinel"]] == [
        expected
    ]


def test_verify_route_schedules_verifiers_and_says_what_it_did_per_receipt(conn, api):
    url = "/continuity/effects/verify"
    plain = make_seq(conn)
    _, no_verifier = fail_with_unknown_receipt(conn, plain)
    _, committed = fail_with_unknown_receipt(conn, plain)
    ok(
        api.post(
            f"/continuity/effects/{committed}/resolve",
            {"state": "committed", "evidence": {}, "expected_state": "unknown"},
        )
    )
    verified = verified_sequence(conn, ACME)
    waiting, pending = unknown_receipt(conn, verified, ACME, VERIFIED_HANDLER)
    assert ok(api.get(f"/instances/{waiting}"))["state"] == "waiting"
    escalate(conn, ACME, pending)  # its one try was inconclusive
    missing = uuid.uuid4()

    answer = ok(api.post(url, {"effect_ids": [str(no_verifier), str(committed), str(missing)]}))
    assert {(i["effect_id"], i["outcome"]) for i in answer["items"]} == {
        (str(no_verifier), "no_verifier"),
        (str(committed), "not_unknown"),
        (str(missing), "not_found"),
    }
    queue = {q["effect_id"]: q for q in ok(api.get("/effects/unresolved"))["items"]}
    assert (queue[str(pending)]["verification"], queue[str(pending)]["verification_tries"]) == (
        "escalated",
        1,
    )
    assert queue[str(pending)]["verification_max_tries"] == 1
    assert queue[str(pending)]["verification_next_at"] is None
    # an escalated one tries again; asking twice changes nothing
    assert ok(api.post(url, {"effect_ids": [str(pending)]}))["items"] == [
        {"effect_id": str(pending), "outcome": "rescheduled"}
    ]
    assert ok(api.post(url, {"effect_ids": [str(pending)]}))["items"] == [
        {"effect_id": str(pending), "outcome": "already_scheduled"}
    ]
    again = ok(api.get("/effects/unresolved?blocking=true"))["items"]
    row = next(q for q in again if q["effect_id"] == str(pending))
    assert (row["verification"], row["verification_tries"]) == ("pending", 0)
    assert row["verification_next_at"] is not None

    # superseded: an unknown receipt whose instance ended
    waiting2, superseded = unknown_receipt(conn, verified, ACME, VERIFIED_HANDLER)
    supersede(conn, ACME, waiting2)
    listed = ok(api.get("/effects/unresolved?blocking=false"))["items"]
    assert [(q["effect_id"], q["blocking"]) for q in listed] == [(str(superseded), False)]
    bulk = ok(api.post(url, {"superseded": True}))["items"]
    assert bulk == [{"effect_id": str(superseded), "outcome": "already_scheduled"}]
    events = ok(api.get(f"/effects/{pending}"))["events"]
    assert any(
        e["actor"] == "key:operator-alice" and e["note"] == "verification scheduled again"
        for e in events
    )

    # exactly one of effect_ids and superseded
    for body in (
        {},
        {"effect_ids": [str(pending)], "superseded": True},
        {"superseded": False},
        {"effect_ids": []},
        {"effect_ids": ["nope"]},
        {"effect_ids": None, "superseded": None},
    ):
        got = problem(api.post(url, body), 422, "invalid input")
        assert got["problems"], body
    got = problem(api.post(url, {}), 422)
    assert got["problems"] == [
        {"path": "$", "message": "send either effect_ids or superseded: true (exactly one of them)"}
    ]
    problem(api.post(url), 400)  # a body is required
    too_many = [str(uuid.uuid4()) for _ in range(rules.LIMITS["verify_request_receipts"] + 1)]
    got = problem(api.post(url, {"effect_ids": too_many}), 422)
    assert [p["path"] for p in got["problems"]] == ["effect_ids"], got


# --- webhooks ----------------------------------------------------------------------------


def test_webhook_outbox_list_redeliver_discard(conn, api):
    conn.execute("SELECT orch8.create_webhook_subscription('acme', 'http://127.0.0.1:9/h', 's')")
    seq = make_seq(conn)
    inst, _ = fail_with_unknown_receipt(conn, seq)
    inst2, _ = fail_with_unknown_receipt(conn, seq)
    rows = ok(api.get("/webhooks/outbox"))
    assert [r["instance_id"] for r in rows["items"]] == [str(inst2), str(inst)]  # newest first
    assert rows["items"][0]["event"] == "instance.failed" and rows["next_cursor"] is None
    first = ok(api.get("/webhooks/outbox?limit=1"))
    rest = ok(api.get(f"/webhooks/outbox?limit=1&cursor={first['next_cursor']}"))
    assert [first["items"][0]["id"], rest["items"][0]["id"]] == [r["id"] for r in rows["items"]]
    delivery = rows["items"][1]["id"]

    assert ok(api.post(f"/webhooks/outbox/{delivery}/discard")) == {
        "id": delivery,
        "state": "discarded",
    }
    body = problem(api.post(f"/webhooks/outbox/{delivery}/discard"), 409, "conflict")
    assert "discarded" in body["detail"]
    assert [r["id"] for r in ok(api.get("/webhooks/outbox?state=discarded"))["items"]] == [delivery]
    assert ok(api.post(f"/webhooks/outbox/{delivery}/redeliver", {}))["state"] == "pending"
    problem(api.post(f"/webhooks/outbox/{delivery}/redeliver"), 409)
    problem(api.post("/webhooks/outbox/999999/redeliver"), 404)
    problem(api.post("/webhooks/outbox/abc/discard"), 422)
    problem(api.post(f"/webhooks/outbox/{2**63}/discard"), 422)
    problem(api.post(f"/webhooks/outbox/{delivery}/discard", {"force": True}), 422)
    problem(api.get("/webhooks/outbox?state=lost"), 422)


# --- bad input, everywhere ---------------------------------------------------------------

POSTS = [
    "/sequences",
    "/instances",
    "/instances/{inst}/signals",
    "/instances/{inst}/cancel",
    "/instances/{inst}/pause",
    "/instances/{inst}/resume",
    "/instances/{inst}/retry",
    "/continuity/effects/{effect}/resolve",
    "/webhooks/outbox/1/discard",
    "/webhooks/outbox/1/redeliver",
]
TABLES = [
    "sequences",
    "task_instances",
    "instance_transitions",
    "instance_signals",
    "effect_receipt_events",
    "webhook_outbox",
    "block_outputs",
]


def test_malformed_bodies_are_refused_and_write_nothing(conn, api):
    seq = make_seq(conn)
    inst, effect_id = fail_with_unknown_receipt(conn, seq)
    before = {t: count(conn, t) for t in TABLES}
    raw = lambda data, ct="application/json": {"data": data, "content_type": ct}  # noqa: E731
    cases = [
        (raw("{bad json"), 400),
        (raw(b"\xff\xfe{}"), 400),
        (raw('{"a": NaN}'), 400),
        (raw('{"a": 1e400}'), 400),
        (raw("[" * 5000 + "]" * 5000), 400),
        (raw('"just a string"'), 422),
        (raw("[1, 2]"), 422),
        (raw('{"state": "committed"}', "text/plain"), 415),
        (raw('{"zzz_unknown": 1}'), 422),
        (raw('{"zzz": "\\u0000"}'), 422),
        (
            raw(
                '{"sequence": "\\ud800", "type": "\\ud800", "name": "\\ud800", "state": "\\ud800"}'
            ),
            422,
        ),
        (raw(json.dumps({"pad": "x" * (1024 * 1024)})), 413),
    ]
    for template in POSTS:
        path = template.format(inst=inst, effect=effect_id)
        for kwargs, status in cases:
            resp = api.post(path, **kwargs)
            problem(resp, status)
    # nested bad values are found at their path
    body = problem(api.post("/instances", {"sequence": "s", "data": {"a": [{"b": "\u0000"}]}}), 422)
    assert body["problems"] == [
        {"path": "data.a[0].b", "message": "must not contain NUL characters (\\u0000)"}
    ]
    body = problem(api.post("/instances", {"sequence": "s", "data": {"\u0000": 1}}), 422)
    # a body is required where the route needs one
    problem(api.post("/instances"), 400)
    problem(api.post(f"/instances/{inst}/signals"), 400)
    assert {t: count(conn, t) for t in TABLES} == before


def test_oversize_body_is_413_json(api):
    resp = api.post(
        "/sequences", data=b"{" + b" " * (1024 * 1024 + 10) + b"}", content_type="application/json"
    )
    body = problem(resp, 413)
    assert body["error"] == "request entity too large"


def test_get_routes_never_fail_on_odd_paths(api):
    for path in [
        "/instances/%00",
        "/effects/%ff%fe",
        "/sequences/%20/%20",
        "/sequences/default/x/versions/-1",
        "/webhooks/outbox?cursor=%00",
        "/effects/unresolved?older_than=%00",
        "/instances?created_after=9999-12-31T23:59:59-23:59",
        "/instances?created_before=0001-01-01T00:00:00%2B23:59",
    ]:
        resp = api.get(path)
        assert 200 <= resp.status_code < 500 and resp.status_code != 500, (path, resp.status_code)
        assert resp.is_json


def test_deep_json_is_stored_and_read_back_up_to_the_limit(api):
    ok(api.post("/sequences", {"name": "hello", "definition": HELLO}), 201)
    deep = '{"sequence": "hello", "data": {"x": ' + "[" * 510 + "]" * 510 + "}}"
    made = ok(api.post("/instances", data=deep, content_type="application/json"), 201)
    shown = api.get(f"/instances/{made['id']}")
    assert shown.status_code == 200 and shown.mimetype == "application/json"
    assert json.dumps(shown.get_json()["context"]["data"]).count("[") == 510
    deeper = '{"sequence": "hello", "data": {"x": ' + "[" * 600 + "]" * 600 + "}}"
    body = problem(api.post("/instances", data=deeper, content_type="application/json"), 422)
    assert body["problems"][0]["message"] == "nested deeper than 512"


def test_a_connection_left_by_tenant_tx_does_not_break_api_authentication(app, api, keys):
    from flask import g

    from web.db import tenant_tx

    # tenant_tx sets dict_row; authenticate reads rows by position on whichever pooled
    # connection it gets, so the row factory must not outlive the transaction
    with app.test_request_context():
        g.tenant = ACME
        g.credential = ("api_key", apikeys.key_hash(keys["operator"]))
        with tenant_tx() as conn:  # what a console page does
            conn.execute("SELECT 1")
    assert api.get("/instances").status_code == 200


def test_request_transactions_run_under_row_level_security(app, conn, keys):
    """Routes also name the tenant in their queries, so cross-tenant 404s alone would not
    show that RLS is in force: here an unfiltered query inside tenant_tx sees one tenant,
    cannot write a table, and the pooled connection outside the transaction, still
    orch8_web, sees no tenant at all."""
    from flask import g

    from web.db import tenant_tx

    def start(tenant):
        seq = make_seq(conn, HELLO, tenant=tenant)
        return conn.execute(
            "SELECT id FROM orch8.create_instance(%s, %s)", (tenant, seq)
        ).fetchone()[0]

    mine, theirs = start(ACME), start(OTHER)
    with app.test_request_context():
        g.tenant = ACME
        g.credential = ("api_key", apikeys.key_hash(keys["operator"]))
        with tenant_tx() as tx:
            row = tx.execute(
                "SELECT current_user AS who, orch8.current_tenant() AS tenant"
            ).fetchone()
            assert tuple(row) == ("orch8_web", ACME)
            ids = {r[0] for r in tx.execute("SELECT id FROM orch8.task_instances")}
            assert ids == {mine}
            with pytest.raises(psycopg.errors.InsufficientPrivilege), tx.transaction():
                tx.execute("UPDATE orch8.task_instances SET priority = 9 WHERE id = %s", (mine,))
        pool = app.extensions["orch8.pool"]
        with pool.connection() as again:
            assert again.execute("SELECT current_user").fetchone()[0] == "orch8_web"
            assert again.execute("SELECT count(*) FROM orch8.task_instances").fetchone()[0] == 0
    assert conn.execute(
        "SELECT priority FROM orch8.task_instances WHERE id = %s", (theirs,)
    ).fetchone() == (0,)


def test_a_database_that_is_down_or_not_migrated_answers_503(empty_db_url):
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there
    down = create_app(f"host=127.0.0.1 port={port} dbname=x user=postgres connect_timeout=1")
    try:
        client = down.test_client()
        assert client.get("/health/live").status_code == 200
        ready = client.get("/health/ready")
        assert ready.status_code == 503
        assert ready.get_json()["error"] == "database unreachable"
        started = time.monotonic()
        resp = client.get("/api/v1/instances", headers={"Authorization": "Bearer o8_x_y"})
        assert resp.status_code == 503 and resp.mimetype == "application/problem+json"
        assert resp.get_json()["error"] == "database unavailable"
        assert time.monotonic() - started < 10  # the pool's wait, not 30 s
    finally:
        down.extensions["orch8.pool"].close()
    bare = create_app(empty_db_url)
    try:
        ready = bare.test_client().get("/health/ready")
        assert ready.status_code == 503
        body = ready.get_json()
        assert body["error"] == "schema not current" and "orch8 db migrate" in body["detail"]
    finally:
        bare.extensions["orch8.pool"].close()


def test_walking_instance_pages_while_instances_are_created_never_repeats_or_skips(conn, api):
    """The documented paging promise: a cursor walk visits every instance that existed when
    it began exactly once, even while new ones arrive (same created_at included: one
    transaction creates a batch with one clock)."""
    ok(api.post("/sequences", {"name": "hello", "definition": HELLO}), 201)
    seq = conn.execute("SELECT id FROM orch8.sequences WHERE name = 'hello'").fetchone()[0]

    def create(n):
        with conn.transaction():  # one transaction: every row gets the same created_at
            return {
                str(
                    conn.execute(
                        "SELECT id FROM orch8.create_instance(%s, %s)", (ACME, seq)
                    ).fetchone()[0]
                )
                for _ in range(n)
            }

    before = create(23) | create(20)
    seen: list[str] = []
    cursor = None
    while True:
        query = {"limit": 7, **({"cursor": cursor} if cursor else {})}
        page = ok(api.get("/instances", query_string=query))
        seen += [i["id"] for i in page["items"]]
        create(3)  # newer than every cursor handed out so far
        cursor = page["next_cursor"]
        if cursor is None:
            break
    new = [i for i in seen if i not in before]
    assert len(seen) == len(set(seen))  # nothing twice
    assert set(seen) - set(new) == before  # nothing that existed was skipped
