"""The database defends itself (docs/SECURITY.md): what needs real logins, real
transactions and the real services. sql_tests/23_ledger_defence.sql covers the rest of
the issue's findings inside one transaction; the slow-client, trickling-provider and
login-hint findings have their own modules (test_slow_clients, test_http_deadline,
test_console_login_hint)."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import psycopg
import pytest
from psycopg import conninfo, errors

from orch8_py import apikeys, db
from tests.cli_helpers import assert_one_line_error, orch8_env, run_orch8
from tests.runner_helpers import TENANT, make_sequence, running, start, wait_for
from web import create_app

OTHER = "other"


def login_as(url: str, user: str) -> str:
    """``url`` logged in as ``user`` (trust authentication on the test server)."""
    return conninfo.make_conninfo(url, user=user)


def key_hash(secret: str) -> str:
    return apikeys.key_hash(secret)


def test_a_web_login_cannot_leave_its_role(db_url):
    """With ORCH8_WEB_DATABASE_URL the service logs in as orch8_web: RESET ROLE and SET
    ROLE lead nowhere, and nothing it sends writes a table or reads a tenant."""
    with psycopg.connect(login_as(db_url, db.WEB_ROLE), autocommit=True) as web:
        web.execute("RESET ROLE")
        assert web.execute("SELECT current_user").fetchone()[0] == "orch8_web"
        for role in ("orch8_runner", "orch8_ledger", "postgres"):
            with pytest.raises(errors.InsufficientPrivilege):
                web.execute(f"SET ROLE {role}")
        with pytest.raises(errors.InsufficientPrivilege):
            web.execute("UPDATE orch8.builtin_handlers SET has_side_effects = false")
        with pytest.raises(errors.InsufficientPrivilege):
            web.execute("SELECT * FROM orch8.claim_work('w', 1, '1 hour')")


def test_a_seal_does_not_travel(conn, db_url):
    """The settings enter_tenant writes, copied by hand into another transaction or onto
    another connection, give no tenant."""
    seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    start(conn, seq)
    _, secret = apikeys.create(conn, TENANT, "operator", "ops")
    names = ("orch8.tenant_id", "orch8.key_id", "orch8.key_role", "orch8.tenant_seal")
    count = "SELECT count(*) FROM orch8.task_instances"
    with psycopg.connect(login_as(db_url, db.WEB_ROLE)) as web:
        with web.transaction():
            web.execute("SELECT orch8.enter_tenant('api_key', %s, %s)", (key_hash(secret), TENANT))
            assert web.execute(count).fetchone()[0] == 1
            sealed = [web.execute("SELECT current_setting(%s)", (n,)).fetchone()[0] for n in names]
        with web.transaction():
            for name, value in zip(names, sealed, strict=True):
                web.execute("SELECT set_config(%s, %s, true)", (name, value))
            assert web.execute(count).fetchone()[0] == 0
            assert web.execute("SELECT orch8.current_tenant()").fetchone()[0] is None
    with psycopg.connect(login_as(db_url, db.WEB_ROLE)) as other, other.transaction():
        for name, value in zip(names, sealed, strict=True):
            other.execute("SELECT set_config(%s, %s, true)", (name, value))
        assert other.execute(count).fetchone()[0] == 0


def test_runner_and_service_work_as_their_own_logins(conn, db_url):
    """A deployment with three logins (docs/SECURITY.md): the runner as orch8_runner and the
    service as orch8_web do their whole job, and the history names those logins."""
    seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    _, secret = apikeys.create(conn, TENANT, "operator", "ops")
    app = create_app(login_as(db_url, db.WEB_ROLE), secret_key="s")
    try:
        client = app.test_client()
        auth = {"Authorization": f"Bearer {secret}"}
        name = conn.execute("SELECT name FROM orch8.sequences WHERE id = %s", (seq,)).fetchone()[0]
        created = client.post("/api/v1/instances", json={"sequence": name}, headers=auth)
        assert created.status_code == 201, created.text
        instance = uuid.UUID(created.get_json()["id"])
        with running(login_as(db_url, db.RUNNER_ROLE)):
            assert wait_for(conn, [instance])[instance][0] == "completed"
        # the audit trail shows who really made each move
        audit = client.get(f"/api/v1/instances/{instance}/audit", headers=auth).get_json()
        who = [(a["to_state"], a["db_user"], a["api_key_id"] is not None) for a in audit["items"]]
        assert who == [
            ("scheduled", "orch8_web", True),
            ("running", "orch8_runner", False),
            ("completed", "orch8_runner", False),
        ]
    finally:
        app.extensions["orch8.pool"].close()


def test_bad_role_url_is_one_line(db_url):
    proc = run_orch8(
        "serve", env=orch8_env(ORCH8_DATABASE_URL=db_url, ORCH8_WEB_DATABASE_URL="x y")
    )
    assert_one_line_error(proc, "ORCH8_WEB_DATABASE_URL")


def test_a_sealed_caller_is_recorded_by_its_key_not_by_what_it_says(conn, db_url):
    """Finding 2a through the web role: the actor argument and the event_actor setting do
    not name the caller; the key and the login do."""
    from tests.queue_helpers import unknown_receipt, verified_sequence

    seq = verified_sequence(conn, TENANT)
    instance, effect_id = unknown_receipt(conn, seq, TENANT, "test.queue.charge")
    key_id, secret = apikeys.create(conn, TENANT, "operator", "ops-bob")
    with psycopg.connect(login_as(db_url, db.WEB_ROLE)) as web, web.transaction():
        web.execute("SELECT orch8.enter_tenant('api_key', %s, %s)", (key_hash(secret), TENANT))
        web.execute("SELECT set_config('orch8.event_actor', 'alice@ops', true)")
        web.execute(
            "SELECT orch8.resolve_effect(%s, %s, 'unknown', 'abandoned', NULL,"
            " '{\"checked\": \"dashboard\"}', 'alice@ops')",
            (TENANT, effect_id),
        )
    actor, user, key = conn.execute(
        "SELECT actor, db_user, api_key_id FROM orch8.effect_receipt_events"
        " WHERE receipt_id = %s AND to_state = 'abandoned'",
        (effect_id,),
    ).fetchone()
    assert (actor, user, key) == ("key:ops-bob", "orch8_web", key_id)
    assert instance


def test_another_tenants_key_cannot_be_probed(conn, db_url):
    """Finding 4: a key's status answers for its own tenant only (api_key_active is gone;
    the web role cannot read api_keys, and revoke_api_key is not the web's)."""
    other_key, _ = apikeys.create(conn, OTHER, "operator", "theirs")
    with psycopg.connect(login_as(db_url, db.WEB_ROLE), autocommit=True) as web:
        with pytest.raises(errors.InsufficientPrivilege):
            web.execute("SELECT revoked_at FROM orch8.api_keys WHERE id = %s", (other_key,))
        with pytest.raises(errors.InsufficientPrivilege):
            web.execute("SELECT orch8.revoke_api_key(%s, %s)", (OTHER, other_key))


def test_an_expired_key_is_refused_and_listed_with_its_expiry(conn, db_url):
    key_id, secret = apikeys.create(conn, TENANT, "operator", "temp", expires_in=timedelta(days=1))
    app = create_app(db_url, secret_key="s")
    try:
        client = app.test_client()
        auth = {"Authorization": f"Bearer {secret}"}
        assert client.get("/api/v1/instances", headers=auth).status_code == 200
        # a day later (the key's expiry moved instead of the clock: same comparison)
        conn.execute(
            "UPDATE orch8.api_keys SET expires_at = orch8.now() - interval '1 second'"
            " WHERE id = %s",
            (key_id,),
        )
        refused = client.get("/api/v1/instances", headers=auth)
        assert refused.status_code == 401, refused.text
    finally:
        app.extensions["orch8.pool"].close()
    listed = run_orch8(
        "api-key", "list", "--tenant", TENANT, env=orch8_env(ORCH8_DATABASE_URL=db_url)
    )
    assert listed.returncode == 0, listed.stderr
    line = next(ln for ln in listed.stdout.splitlines() if "temp" in ln)
    assert re.search(r"\d{4}-\d\d-\d\d", line) and "expired" in line


def test_logging_out_ends_every_copy_of_the_session(conn, db_url):
    """Finding 9: after logout, the copied cookie opens nothing."""
    from tests.test_console import csrf_of, login

    _, secret = apikeys.create(conn, TENANT, "operator", "ops")
    app = create_app(db_url, secret_key="console-test-secret")
    app.testing = True
    try:
        client = app.test_client()
        assert login(client, secret).status_code == 302
        cookie = client.get_cookie("session")
        assert cookie is not None
        copy = app.test_client()
        copy.set_cookie("session", cookie.value)
        assert copy.get("/console/instances").status_code == 200
        page = client.get("/console/")
        client.post("/console/logout", data={"csrf_token": csrf_of(page.text)})
        replay = copy.get("/console/instances")
        assert replay.status_code == 302 and "/console/login" in replay.headers["Location"]
        ended = conn.execute(
            "SELECT count(*) FROM orch8.console_sessions WHERE ended_at IS NOT NULL"
        ).fetchone()[0]
        assert ended == 1
    finally:
        app.extensions["orch8.pool"].close()
