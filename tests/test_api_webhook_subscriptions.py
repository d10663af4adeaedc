"""Webhook subscriptions over the REST API (/api/v1/webhooks/subscriptions) on a real
migrated database: create (a generated secret is answered once and never read back),
bad input, read, disable and enable, tenants, roles, and what a disabled subscription
receives when an instance completes under a real runner."""

from __future__ import annotations

import json
import uuid

import pytest

from orch8_py import apikeys, rules
from tests.runner_helpers import running, wait_for
from tests.test_api import HELLO, Api, ok, problem
from web import create_app

ACME, OTHER, ROOT = "acme", "other", "root"
URL = "https://hooks.acme.example/orch8"
EVERY = list(rules.WEBHOOK_EVENTS)  # the default: every event
FIELDS = {"id", "url", "events", "enabled", "created_at"}


@pytest.fixture
def app(db_url):
    app = create_app(db_url, secret_key="webhook-subscriptions-test")
    app.testing = True
    yield app
    app.extensions["orch8.pool"].close()


@pytest.fixture
def as_role(app, conn):
    made = {
        role: apikeys.create(conn, ACME, role, f"{role}-alice")[1]
        for role in ("operator", "worker", "auditor")
    }
    made["other"] = apikeys.create(conn, OTHER, "operator", "bob")[1]
    made["admin"] = apikeys.create(conn, ROOT, "admin", "root-admin")[1]
    return lambda role, **headers: Api(app.test_client(), made[role], **headers)


@pytest.fixture
def api(as_role):
    return as_role("operator")


def stored(conn, tenant=ACME):
    """The tenant's subscriptions as stored (secret included), oldest first."""
    return conn.execute(
        "SELECT id::text, url, secret, events, enabled FROM orch8.webhook_subscriptions"
        " WHERE tenant_id = %s ORDER BY created_at, id",
        (tenant,),
    ).fetchall()


def subscribe_sql(conn, tenant, url=URL, secret="whsec-sql"):
    return str(
        conn.execute(
            "SELECT orch8.create_webhook_subscription(%s, %s, %s)", (tenant, url, secret)
        ).fetchone()[0]
    )


# --- create, list, read ------------------------------------------------------------------


def test_a_generated_secret_is_answered_once_and_never_read_back(conn, api):
    resp = api.post("/webhooks/subscriptions", {"url": URL})
    made = ok(resp, 201)
    assert set(made) == FIELDS | {"secret"}
    assert (made["url"], made["events"], made["enabled"]) == (URL, EVERY, True)
    secret = made["secret"]
    assert len(secret) >= 43  # secrets.token_urlsafe(32)
    assert stored(conn) == [(made["id"], URL, secret, EVERY, True)]

    listed = api.get("/webhooks/subscriptions")
    assert ok(listed) == {"items": [{k: made[k] for k in FIELDS}]}
    shown = api.get(f"/webhooks/subscriptions/{made['id']}")
    assert ok(shown) == {k: made[k] for k in FIELDS}
    for resp in (listed, shown):
        assert secret not in resp.get_data(as_text=True)
        assert "secret" not in resp.get_data(as_text=True)


def test_a_given_secret_is_stored_and_not_echoed(conn, api):
    resp = api.post(
        "/webhooks/subscriptions",
        {"url": URL, "events": ["instance.failed", "instance.failed"], "secret": "whsec_given"},
    )
    made = ok(resp, 201)
    assert set(made) == FIELDS
    assert made["events"] == ["instance.failed"]  # duplicates collapse
    assert "whsec_given" not in resp.get_data(as_text=True)
    # null means "not given": both events, and a generated secret answered once
    second = ok(
        api.post(
            "/webhooks/subscriptions",
            {"url": "http://127.0.0.1:9/h", "events": None, "secret": None},
        ),
        201,
    )
    assert second["events"] == EVERY and len(second["secret"]) >= 43
    assert stored(conn) == [
        (made["id"], URL, "whsec_given", ["instance.failed"], True),
        (second["id"], "http://127.0.0.1:9/h", second["secret"], EVERY, True),
    ]
    items = ok(api.get("/webhooks/subscriptions"))["items"]
    assert [i["id"] for i in items] == [made["id"], second["id"]]  # oldest first
    assert all(set(i) == FIELDS for i in items)


def test_invalid_bodies_are_422_and_write_nothing(conn, api):
    conn.execute("SELECT orch8.create_webhook_subscription(%s, %s, 's3cret')", (ACME, URL))
    before = stored(conn)
    cases = [
        {},
        {"url": None},
        {"url": 7},
        {"url": ["https://x.example/h"]},
        {"url": "ftp://x.example/h"},
        {"url": "https://"},
        {"url": "hooks.acme.example/orch8"},
        {"url": "https://x.example/a b"},
        {"url": "https://x.example/\u0000"},
        {"url": "https://x.example/\ud800"},
        {"url": URL, "colour": "blue"},
        {"url": URL, "enabled": False},
        {"url": URL, "events": "instance.failed"},
        {"url": URL, "events": []},
        {"url": URL, "events": ["instance.started"]},
        {"url": URL, "events": ["instance.completed", 1, None, {}]},
        {"url": URL, "events": ["\u0000"]},
        {"url": URL, "secret": ""},
        {"url": URL, "secret": 5},
        {"url": URL, "secret": "\u0000"},
    ]
    for body in cases:
        resp = api.post(
            "/webhooks/subscriptions", data=json.dumps(body), content_type="application/json"
        )
        problem(resp, 422, "invalid input")
    # every problem at once, each at its path
    body = problem(
        api.post(
            "/webhooks/subscriptions",
            {"url": 7, "events": ["instance.completed", "nope"], "secret": "", "colour": 1},
        ),
        422,
    )
    assert sorted(p["path"] for p in body["problems"]) == ["colour", "events[1]", "secret", "url"]
    # the engine's URL rule comes back as a 422 naming it
    body = problem(api.post("/webhooks/subscriptions", {"url": "ftp://x.example/h"}), 422)
    assert "http:// or https://" in body["detail"]
    # not JSON, not an object, not sent as JSON, no body
    raw = api.post("/webhooks/subscriptions", data="{bad", content_type="application/json")
    problem(raw, 400)
    problem(api.post("/webhooks/subscriptions", data="[1]", content_type="application/json"), 422)
    problem(api.post("/webhooks/subscriptions", data=json.dumps({"url": URL})), 415)
    problem(api.post("/webhooks/subscriptions"), 400)
    problem(api.post("/webhooks/subscriptions?dry_run=1", {"url": URL}), 422)
    assert stored(conn) == before


# --- disable, enable ---------------------------------------------------------------------


def test_get_disable_enable(conn, api):
    made = ok(api.post("/webhooks/subscriptions", {"url": URL}), 201)
    sid = made["id"]
    path = f"/webhooks/subscriptions/{sid}"
    view = {k: made[k] for k in FIELDS}
    assert ok(api.get(path)) == view

    off = ok(api.post(f"{path}/disable"))
    assert off == {**view, "enabled": False}
    assert stored(conn)[0][4] is False
    assert ok(api.post(f"{path}/disable", {})) == off  # again: nothing to do, same answer
    assert ok(api.get(path))["enabled"] is False
    assert ok(api.get("/webhooks/subscriptions"))["items"] == [off]

    on = ok(api.post(f"{path}/enable"))
    assert on == view
    assert ok(api.post(f"{path}/enable")) == view
    assert stored(conn) == [(sid, URL, made["secret"], EVERY, True)]  # url and secret kept

    missing = f"/webhooks/subscriptions/{uuid.uuid4()}"
    problem(api.get(missing), 404, "not found")
    problem(api.post(f"{missing}/disable"), 404, "not found")
    problem(api.post(f"{missing}/enable"), 404, "not found")
    problem(api.get("/webhooks/subscriptions/abc"), 422)
    problem(api.post("/webhooks/subscriptions/abc/disable"), 422)
    problem(api.post(f"{path}/disable", {"force": True}), 422)
    problem(api.post(f"{path}/disable?now=1"), 422)
    problem(api.get("/webhooks/subscriptions?limit=5"), 422)
    assert stored(conn)[0][4] is True


def test_another_tenants_subscription_is_not_found(conn, api, as_role):
    theirs = subscribe_sql(conn, OTHER)
    path = f"/webhooks/subscriptions/{theirs}"
    problem(api.get(path), 404, "not found")
    problem(api.post(f"{path}/disable"), 404, "not found")
    problem(api.post(f"{path}/enable"), 404, "not found")
    assert ok(api.get("/webhooks/subscriptions"))["items"] == []
    assert stored(conn, OTHER)[0][4] is True
    # a non-admin naming the other tenant sees nothing there either
    problem(as_role("operator", **{"X-Tenant-Id": OTHER}).post(f"{path}/disable"), 404)
    # their own operator, and an admin acting for them, can
    assert ok(as_role("other").get(path))["id"] == theirs
    admin = as_role("admin", **{"X-Tenant-Id": OTHER})
    assert ok(admin.post(f"{path}/disable"))["enabled"] is False
    assert stored(conn, OTHER)[0][4] is False
    # a subscription created by acme's operator is acme's
    mine = ok(api.post("/webhooks/subscriptions", {"url": URL}), 201)["id"]
    problem(as_role("other").get(f"/webhooks/subscriptions/{mine}"), 404)
    assert [s[0] for s in stored(conn, ACME)] == [mine]


def test_auditors_read_but_cannot_write(conn, api, as_role):
    made = ok(api.post("/webhooks/subscriptions", {"url": URL}), 201)
    path = f"/webhooks/subscriptions/{made['id']}"
    auditor = as_role("auditor")
    assert [i["id"] for i in ok(auditor.get("/webhooks/subscriptions"))["items"]] == [made["id"]]
    assert ok(auditor.get(path))["enabled"] is True
    problem(auditor.post("/webhooks/subscriptions", {"url": URL}), 403, "forbidden")
    problem(auditor.post(f"{path}/disable"), 403, "forbidden")
    problem(auditor.post(f"{path}/enable"), 403, "forbidden")
    worker = as_role("worker")
    problem(worker.get("/webhooks/subscriptions"), 403, "forbidden")
    problem(worker.get(path), 403, "forbidden")
    problem(worker.post(f"{path}/disable"), 403, "forbidden")
    problem(Api(api.client).get("/webhooks/subscriptions"), 401, "unauthorized")
    assert stored(conn) == [(made["id"], URL, made["secret"], EVERY, True)]


# --- what a disabled subscription receives -----------------------------------------------


def test_a_disabled_subscription_gets_no_outbox_row_for_a_completed_instance(db_url, conn, api):
    on = ok(api.post("/webhooks/subscriptions", {"url": "http://127.0.0.1:9/on"}), 201)["id"]
    off = ok(api.post("/webhooks/subscriptions", {"url": "http://127.0.0.1:9/off"}), 201)["id"]
    ok(api.post(f"/webhooks/subscriptions/{off}/disable"))
    ok(api.post("/sequences", {"name": "hello", "definition": HELLO}), 201)

    def complete() -> str:
        inst = ok(api.post("/instances", {"sequence": "hello"}), 201)["id"]
        with running(db_url, webhooks=False):  # no delivery: the outbox rows stay put
            assert wait_for(conn, [uuid.UUID(inst)])[uuid.UUID(inst)] == ("completed", None)
        return inst

    def rows_for(inst: str) -> list[tuple[str, str]]:
        items = ok(api.get("/webhooks/outbox"))["items"]
        return sorted((i["subscription_id"], i["event"]) for i in items if i["instance_id"] == inst)

    first = complete()
    assert rows_for(first) == [(on, "instance.completed")]

    ok(api.post(f"/webhooks/subscriptions/{off}/enable"))
    second = complete()
    assert rows_for(second) == sorted([(on, "instance.completed"), (off, "instance.completed")])
    assert rows_for(first) == [(on, "instance.completed")]  # nothing after the fact
