"""The operator console through Flask's test client, on a real migrated database: login,
pages, tenant isolation, roles, CSRF, resolving an unknown receipt and retrying."""

from __future__ import annotations

import re
import uuid

import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from orch8_py import apikeys, sqlapi
from tests.queue_helpers import (
    VERIFIED_HANDLER,
    escalate,
    supersede,
    unknown_receipt,
    verified_sequence,
)
from tests.runner_helpers import TENANT, make_sequence, start
from web import create_app

PARAMS = {"url": "https://pay.example/charge", "idempotency_key": "order-7"}
OTHER = "other"


def claim(conn):
    return conn.execute(
        "SELECT lease_token FROM orch8.claim_due_nodes('w1', 1, '30 seconds')"
    ).fetchone()[0]


def instance_state(conn, instance):
    return conn.execute(
        "SELECT state::text FROM orch8.task_instances WHERE id = %s", (instance,)
    ).fetchone()[0]


def receipt(conn, effect_id):
    return conn.execute(
        "SELECT state::text, provider_receipt_id, evidence FROM orch8.effect_receipts"
        " WHERE id = %s",
        (effect_id,),
    ).fetchone()


def charge_sequence(conn, tenant=TENANT):
    definition = {
        "blocks": [
            {"type": "step", "id": "charge", "handler": "test.console.charge"},
            {"type": "step", "id": "ship", "handler": "noop"},
        ]
    }
    return conn.execute(
        "SELECT id FROM orch8.create_sequence(%s, 'default', %s, %s)",
        (tenant, f"checkout{uuid.uuid4().hex[:6]}", Jsonb(definition)),
    ).fetchone()[0]


def reads_charge_sequence(conn, tenant=TENANT):
    """charge, then ship, which reads charge's output."""
    definition = {
        "blocks": [
            {"type": "step", "id": "charge", "handler": "test.console.charge"},
            {
                "type": "step",
                "id": "ship",
                "handler": "noop",
                "params": {"receipt": "{{ outputs.charge.receipt_id }}"},
            },
        ]
    }
    return conn.execute(
        "SELECT id FROM orch8.create_sequence(%s, 'default', %s, %s)",
        (tenant, f"reads{uuid.uuid4().hex[:6]}", Jsonb(definition)),
    ).fetchone()[0]


def charge_output(conn, instance):
    return conn.execute(
        "SELECT output FROM orch8.block_outputs WHERE instance_id = %s AND block_id = 'charge'"
        " AND sentinel IS NULL",
        (instance,),
    ).fetchone()[0]


def fail_with_unknown_receipt(conn, seq, tenant=TENANT, data=None):
    """An instance that failed with EffectBlocked: its charge receipt is unknown (the same
    path as tests/test_operations.py: a second claim begins the same attempt)."""
    a = start(conn, seq, data=data, tenant=tenant)
    begin = "SELECT outcome, effect_id FROM orch8.begin_step(%s, %s, %s, 'charge', 'x.y', %s, 0)"
    token = claim(conn)
    conn.execute(begin, (tenant, a, token, Jsonb(PARAMS)))
    conn.execute("SELECT orch8.release_lease(%s, %s, %s)", (tenant, a, token))
    token = claim(conn)
    outcome, effect_id = conn.execute(begin, (tenant, a, token, Jsonb(PARAMS))).fetchone()
    assert outcome == "blocked" and instance_state(conn, a) == "failed"
    return a, effect_id


@pytest.fixture
def app(db_url):
    app = create_app(db_url, secret_key="console-test-secret")
    app.testing = True
    yield app
    app.extensions["orch8.pool"].close()


@pytest.fixture
def keys(conn):
    return {
        role: apikeys.create(conn, TENANT, role, f"{role}-alice")[1]
        for role in ("operator", "auditor", "worker")
    }


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "no CSRF field on the page"
    return match.group(1)


def login(client, secret):
    page = client.get("/console/login")
    return client.post("/console/login", data={"api_key": secret, "csrf_token": csrf_of(page.text)})


@pytest.fixture
def operator(app, keys):
    client = app.test_client()
    assert login(client, keys["operator"]).status_code == 302
    return client


@pytest.fixture
def auditor(app, keys):
    client = app.test_client()
    assert login(client, keys["auditor"]).status_code == 302
    return client


@pytest.fixture
def failed(conn):
    seq = charge_sequence(conn)
    return fail_with_unknown_receipt(conn, seq)


def resolve_form(client, effect_id, **fields):
    page = client.get(f"/console/effects/{effect_id}")
    data = {
        "csrf_token": csrf_of(page.text),
        "expected_state": "unknown",
        "state": "committed",
        "provider_receipt_id": "ch_3LkP",
        "evidence": '{"checked": "provider dashboard", "found": "ch_3LkP"}',
        "note": "provider shows the charge",
        **fields,
    }
    return client.post(f"/console/effects/{effect_id}/resolve", data=data)


def test_login_with_a_bad_key_fails_with_a_message(app, keys):
    client = app.test_client()
    assert client.get("/").headers["Location"].endswith("/console/")
    first = client.get("/console/")
    assert first.status_code == 302 and "/console/login" in first.headers["Location"]
    bad = login(client, "o8_nope_" + uuid.uuid4().hex)
    assert bad.status_code == 401
    assert "Unknown, revoked or expired API key." in bad.text
    assert client.get("/console/").status_code == 302  # still logged out
    worker = login(client, keys["worker"])
    assert worker.status_code == 403 and "cannot use the console" in worker.text


@pytest.mark.parametrize("secure", ["1", None])
def test_session_cookie_flags(db_url, keys, monkeypatch, secure):
    if secure:
        monkeypatch.setenv("ORCH8_SECURE_COOKIES", secure)
    else:
        monkeypatch.delenv("ORCH8_SECURE_COOKIES", raising=False)
    app = create_app(db_url, secret_key="console-test-secret")
    try:
        resp = login(app.test_client(), keys["operator"])
        assert resp.status_code == 302
        [cookie] = [c for c in resp.headers.getlist("Set-Cookie") if c.startswith("session=")]
        flags = {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "samesite"} <= flags
        assert ("secure" in flags) == bool(secure)
    finally:
        app.extensions["orch8.pool"].close()


def test_login_keeps_who_not_the_secret_and_logout_forgets(app, keys, conn):
    client = app.test_client()
    resp = login(client, keys["operator"])
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/console/")
    with client.session_transaction() as sess:
        # only a random token: who it is lives in orch8.console_sessions, keyed by its hash
        assert set(sess["console"]) == {"token"}
        assert keys["operator"] not in repr(dict(sess))
    stored = conn.execute(
        "SELECT k.tenant_id, k.role, k.name FROM orch8.console_sessions AS s"
        " JOIN orch8.api_keys AS k ON k.tenant_id = s.tenant_id AND k.id = s.key_id"
        " WHERE s.token_hash = encode(sha256(convert_to(%s, 'UTF8')), 'hex')",
        (sess["console"]["token"],),
    ).fetchall()
    assert stored == [(TENANT, "operator", "operator-alice")]
    page = client.get("/console/")
    assert page.status_code == 200 and "operator-alice" in page.text
    out = client.post("/console/logout", data={"csrf_token": csrf_of(page.text)})
    assert out.status_code == 302
    with client.session_transaction() as sess:
        assert "console" not in sess
    assert client.get("/console/").status_code == 302


def test_login_redirects_back_to_the_page_asked_for_but_never_off_site(app, keys):
    client = app.test_client()
    asked = client.get("/console/instances?state=failed")
    assert "next=" in asked.headers["Location"]
    page = client.get(asked.headers["Location"])
    token = csrf_of(page.text)
    resp = client.post(
        "/console/login",
        data={"api_key": keys["operator"], "csrf_token": token, "next": "//evil.example/x"},
    )
    assert resp.headers["Location"].endswith("/console/")
    client = app.test_client()
    token = csrf_of(client.get("/console/login").text)
    resp = client.post(
        "/console/login",
        data={
            "api_key": keys["operator"],
            "csrf_token": token,
            "next": "/console/instances?state=failed",
        },
    )
    assert resp.headers["Location"].endswith("/console/instances?state=failed")


def test_pages_render_for_an_operator(operator, conn, failed):
    instance, effect_id = failed
    seq_name = conn.execute(
        "SELECT s.name FROM orch8.sequences s JOIN orch8.task_instances t"
        " ON t.sequence_id = s.id WHERE t.id = %s",
        (instance,),
    ).fetchone()[0]
    dash = operator.get("/console/")
    assert dash.status_code == 200
    assert re.search(r'id="queue-depth">1<', dash.text)
    assert "1 blocking an instance</a> · <a" in dash.text and "0 superseded" in dash.text
    assert "Instances by state" in dash.text and "Recently failed" in dash.text
    listing = operator.get("/console/instances?state=failed")
    assert listing.status_code == 200 and str(instance) in listing.text
    assert str(instance) not in operator.get("/console/instances?state=completed").text
    detail = operator.get(f"/console/instances/{instance}")
    assert detail.status_code == 200
    for text in ("EffectBlocked", "__in_progress__", "__unsettled__", str(effect_id)):
        assert text in detail.text
    assert "Retry instance" in detail.text and "Resolve receipt" in detail.text
    queue = operator.get("/console/effects/unresolved")
    assert queue.status_code == 200
    assert 'data-count="1"' in queue.text
    row = receipt(conn, effect_id)
    fields = conn.execute(
        "SELECT request_sha256, destination_fingerprint, continuity_id, epoch, attempt"
        " FROM orch8.effect_receipts WHERE id = %s",
        (effect_id,),
    ).fetchone()
    for value in (effect_id, instance, "order-7", "charge", *fields):
        assert str(value) in queue.text
    assert row[0] == "unknown"
    effect = operator.get(f"/console/effects/{effect_id}")
    assert effect.status_code == 200
    assert (
        'id="resolve-form"' in effect.text
        and 'name="expected_state" value="unknown"' in effect.text
    )
    for target in ("committed", "verified", "abandoned", "compensated"):
        assert f'<option value="{target}"' in effect.text
    # only the targets a receipt can be resolved to are offered; an output may go with it
    options = re.findall(r'<option value="([a-z]+)"', effect.text)
    assert sorted(options) == ["abandoned", "committed", "compensated", "verified"]
    assert 'name="output"' in effect.text
    assert operator.get("/console/sequences").status_code == 200
    versions = operator.get(f"/console/sequences/default/{seq_name}")
    assert versions.status_code == 200 and "v1" in versions.text
    v1 = operator.get(f"/console/sequences/default/{seq_name}/1")
    assert v1.status_code == 200 and "test.console.charge" in v1.text
    assert operator.get(f"/console/sequences/default/{seq_name}/2").status_code == 404
    css = operator.get("/console/static/console.css")
    assert css.status_code == 200 and "text/css" in css.content_type
    css.close()


def test_everything_is_escaped(operator, conn):
    seq = charge_sequence(conn)
    evil = "<script>alert('x')</script>"
    instance, _ = fail_with_unknown_receipt(conn, seq, data={"name": evil})
    detail = operator.get(f"/console/instances/{instance}")
    assert evil not in detail.text
    assert "&lt;script&gt;" in detail.text
    assert "default-src 'self'" in detail.headers["Content-Security-Policy"]


def test_instance_list_filters_and_pages(operator, conn):
    seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    for _ in range(30):
        start(conn, seq)
    first = operator.get("/console/instances?state=scheduled")
    assert first.text.count('class="instance-row"') == 25 and 'rel="next"' in first.text
    second = operator.get(pager_link(first.text, "next"))
    assert second.text.count('class="instance-row"') == 5 and 'rel="next"' not in second.text
    assert 'rel="prev"' in second.text
    assert operator.get("/console/instances?state=nope").status_code == 400
    assert operator.get("/console/instances?cursor=x").status_code == 400
    assert operator.get("/console/instances?state=failed").text.count("instance-row") == 0


def test_other_tenants_are_invisible(operator, conn, failed):
    seq = charge_sequence(conn, tenant=OTHER)
    theirs, their_effect = fail_with_unknown_receipt(conn, seq, tenant=OTHER)
    resp = operator.get(f"/console/instances/{theirs}")
    assert resp.status_code == 404
    assert "<html" in resp.text and "Traceback" not in resp.text
    assert operator.get(f"/console/effects/{their_effect}").status_code == 404
    assert operator.get(f"/console/instances/{uuid.uuid4()}").status_code == 404
    assert operator.get("/console/instances/not-a-uuid").status_code == 404
    # the queue, the dashboard and the lists show this tenant's rows only
    queue = operator.get("/console/effects/unresolved")
    assert 'data-count="1"' in queue.text and str(their_effect) not in queue.text
    assert re.search(r'id="queue-depth">1<', operator.get("/console/").text)
    assert str(theirs) not in operator.get("/console/instances").text
    # and nothing can be done to them
    token = csrf_of(queue.text)
    assert (
        operator.post(f"/console/instances/{theirs}/retry", data={"csrf_token": token}).status_code
        == 404
    )
    forged = operator.post(
        f"/console/effects/{their_effect}/resolve",
        data={
            "csrf_token": token,
            "state": "committed",
            "expected_state": "unknown",
            "evidence": "x",
        },
    )
    assert forged.status_code == 404
    assert receipt(conn, their_effect)[0] == "unknown"


def test_auditor_sees_no_forms_and_a_forged_post_is_refused(auditor, conn, failed):
    instance, effect_id = failed
    effect = auditor.get(f"/console/effects/{effect_id}")
    assert effect.status_code == 200 and str(effect_id) in effect.text
    assert "resolve-form" not in effect.text and 'name="state"' not in effect.text
    detail = auditor.get(f"/console/instances/{instance}")
    assert "Retry instance" not in detail.text and "Cancel instance" not in detail.text
    token = csrf_of(detail.text)  # the logout form's: a valid token for this session
    forged = auditor.post(
        f"/console/effects/{effect_id}/resolve",
        data={
            "csrf_token": token,
            "state": "committed",
            "expected_state": "unknown",
            "evidence": "{}",
        },
    )
    assert forged.status_code == 403 and "can only read" in forged.text
    assert receipt(conn, effect_id)[0] == "unknown"
    retry = auditor.post(f"/console/instances/{instance}/retry", data={"csrf_token": token})
    assert retry.status_code == 403
    cancel = auditor.post(f"/console/instances/{instance}/cancel", data={"csrf_token": token})
    assert cancel.status_code == 403 and instance_state(conn, instance) == "failed"


def test_csrf_token_is_required(app, operator, conn, failed, keys):
    instance, effect_id = failed
    data = {"state": "committed", "expected_state": "unknown", "evidence": "seen"}
    missing = operator.post(f"/console/effects/{effect_id}/resolve", data=data)
    assert missing.status_code == 403 and "security token" in missing.text
    wrong = operator.post(
        f"/console/effects/{effect_id}/resolve", data={**data, "csrf_token": "forged"}
    )
    assert wrong.status_code == 403
    assert receipt(conn, effect_id)[0] == "unknown"
    assert operator.post(f"/console/instances/{instance}/retry").status_code == 403
    # another session's token is no good either
    other = app.test_client()
    login(other, keys["operator"])
    their_token = csrf_of(other.get("/console/").text)
    mine = csrf_of(operator.get("/console/").text)
    assert their_token != mine
    crossed = operator.post(
        f"/console/effects/{effect_id}/resolve", data={**data, "csrf_token": their_token}
    )
    assert crossed.status_code == 403
    # the login form needs one too
    fresh = app.test_client()
    assert fresh.post("/console/login", data={"api_key": keys["operator"]}).status_code == 403


def test_resolve_from_the_form_commits_and_records_the_actor(operator, conn, failed):
    _, effect_id = failed
    resp = resolve_form(operator, effect_id)
    assert resp.status_code == 302
    assert resp.headers["Location"].endswith(f"/console/effects/{effect_id}")
    page = operator.get(resp.headers["Location"])
    assert f"Receipt {effect_id} is now committed." in page.text
    state, provider_receipt_id, evidence = receipt(conn, effect_id)
    assert (state, provider_receipt_id) == ("committed", "ch_3LkP")
    resolution = evidence["resolution"]
    assert resolution["actor"] == "key:operator-alice"
    assert resolution["evidence"] == {"checked": "provider dashboard", "found": "ch_3LkP"}
    assert resolution["note"] == "provider shows the charge"
    event = conn.execute(
        "SELECT from_state::text, to_state::text, actor, note FROM orch8.effect_receipt_events"
        " WHERE receipt_id = %s ORDER BY event_id DESC LIMIT 1",
        (effect_id,),
    ).fetchone()
    assert event == ("unknown", "committed", "key:operator-alice", "provider shows the charge")
    assert "key:operator-alice" in page.text  # on the timeline
    assert 'data-count="0"' in operator.get("/console/effects/unresolved").text


def test_free_text_evidence_is_wrapped_and_bad_json_is_refused(operator, conn, failed):
    _, effect_id = failed
    bad = resolve_form(operator, effect_id, evidence='{"checked": ')
    assert bad.status_code == 422 and "not valid JSON" in bad.text
    assert "{&#34;checked&#34;: " in bad.text  # what was typed is kept, escaped
    assert receipt(conn, effect_id)[0] == "unknown"
    empty = resolve_form(operator, effect_id, state="abandoned", evidence="")
    assert empty.status_code == 422 and "needs evidence" in empty.text
    assert "Traceback" not in empty.text
    ok = resolve_form(operator, effect_id, state="abandoned", evidence="no charge at pay.example")
    assert ok.status_code == 302
    state, _, evidence = receipt(conn, effect_id)
    assert state == "abandoned"
    assert evidence["resolution"]["evidence"] == {"note": "no charge at pay.example"}


def test_a_concurrent_change_says_reload_before_resolving(operator, conn, failed):
    _, effect_id = failed
    page = operator.get(f"/console/effects/{effect_id}")
    token = csrf_of(page.text)
    # somebody else resolves it while the form is open
    conn.execute(
        "SELECT orch8.resolve_effect(p_tenant_id => 't1', p_id => %s,"
        " p_expected_state => 'unknown', p_state => 'verified', p_provider_receipt_id => NULL,"
        " p_evidence => '{\"by\": \"bob\"}', p_actor => 'bob')",
        (effect_id,),
    )
    resp = operator.post(
        f"/console/effects/{effect_id}/resolve",
        data={
            "csrf_token": token,
            "expected_state": "unknown",
            "state": "committed",
            "evidence": "seen",
        },
    )
    assert resp.status_code == 409
    assert "reload before resolving" in resp.text
    assert receipt(conn, effect_id)[0] == "verified"
    assert 'name="expected_state" value="verified"' in resp.text  # the page shows it now


def test_retry_refused_while_unknown_then_completes_from_evidence(operator, conn, failed):
    instance, effect_id = failed
    page = operator.get(f"/console/instances/{instance}")
    token = csrf_of(page.text)
    refused = operator.post(f"/console/instances/{instance}/retry", data={"csrf_token": token})
    assert refused.status_code == 302
    shown = operator.get(refused.headers["Location"]).text
    assert "Retry refused" in shown and "resolve it before retrying" in shown
    assert instance_state(conn, instance) == "failed"
    assert resolve_form(operator, effect_id).status_code == 302
    effect = operator.get(f"/console/effects/{effect_id}")
    assert "not sent again" in effect.text and 'id="retry"' in effect.text
    retried = operator.post(
        f"/console/instances/{instance}/retry", data={"csrf_token": csrf_of(effect.text)}
    )
    shown = operator.get(retried.headers["Location"]).text
    assert "Retried (completed_from_evidence)" in shown
    assert instance_state(conn, instance) == "scheduled"  # on to the next step, "ship"
    actor = conn.execute(
        "SELECT actor FROM orch8.instance_transitions WHERE instance_id = %s"
        " ORDER BY seq DESC LIMIT 1",
        (instance,),
    ).fetchone()[0]
    assert actor == "key:operator-alice"


def test_the_resolve_form_needs_expected_state_and_a_target(operator, conn, failed):
    _, effect_id = failed
    token = csrf_of(operator.get(f"/console/effects/{effect_id}").text)
    url = f"/console/effects/{effect_id}/resolve"
    base = {"csrf_token": token, "evidence": "seen", "state": "committed"}
    for data in (
        base,  # no expected_state
        {**base, "expected_state": ""},
        {**base, "expected_state": "whatever"},
        {**base, "expected_state": "unknown", "state": "dispatched"},
        {**base, "expected_state": "unknown", "state": "planned"},
    ):
        resp = operator.post(url, data=data)
        assert resp.status_code == 400, data
        assert "choose a state" in resp.text and "Traceback" not in resp.text
    assert receipt(conn, effect_id)[0] == "unknown"


def test_resolve_with_an_output_from_the_form_then_retry_completes_with_it(operator, conn):
    seq = reads_charge_sequence(conn)
    instance, effect_id = fail_with_unknown_receipt(conn, seq)
    bad = resolve_form(operator, effect_id, output='{"receipt_id": ')
    assert bad.status_code == 422 and "the output is not valid JSON" in bad.text
    assert "{&#34;receipt_id&#34;: " in bad.text  # what was typed is kept, escaped
    wrong = resolve_form(
        operator, effect_id, state="abandoned", evidence="no charge", output='{"x": 1}'
    )
    assert wrong.status_code == 422
    assert "an output belongs to a committed or verified resolution" in wrong.text
    assert receipt(conn, effect_id)[0] == "unknown"

    resp = resolve_form(operator, effect_id, output='{"receipt_id": "ch_form"}')
    assert resp.status_code == 302
    state, _, evidence = receipt(conn, effect_id)
    assert state == "committed"
    assert evidence["resolution"]["output"] == {"receipt_id": "ch_form"}
    assert evidence["resolutions"][-1]["output"] == {"receipt_id": "ch_form"}
    effect = operator.get(f"/console/effects/{effect_id}")
    assert "with the output recorded on this receipt" in effect.text
    retried = operator.post(
        f"/console/instances/{instance}/retry", data={"csrf_token": csrf_of(effect.text)}
    )
    assert "Retried (completed_from_evidence)" in operator.get(retried.headers["Location"]).text
    assert charge_output(conn, instance) == {"receipt_id": "ch_form"}


def test_the_retry_form_takes_an_output_and_names_the_blocks_that_need_one(operator, conn):
    seq = reads_charge_sequence(conn)
    instance, effect_id = fail_with_unknown_receipt(conn, seq)
    assert resolve_form(operator, effect_id).status_code == 302  # committed, no output
    page = operator.get(f"/console/instances/{instance}")
    assert 'id="retry-output"' in page.text and 'name="output"' in page.text
    token = csrf_of(page.text)
    url = f"/console/instances/{instance}/retry"
    refused = operator.post(url, data={"csrf_token": token, "output": ""})
    shown = operator.get(refused.headers["Location"]).text
    assert "Retry refused" in shown and "read by: ship" in shown
    assert "retry form&#39;s output field" in shown
    assert instance_state(conn, instance) == "failed"
    bad = operator.post(url, data={"csrf_token": token, "output": "{nope"})
    assert "the output is not valid JSON" in operator.get(bad.headers["Location"]).text
    done = operator.post(url, data={"csrf_token": token, "output": '{"receipt_id": "ch_r"}'})
    assert "Retried (completed_from_evidence)" in operator.get(done.headers["Location"]).text
    assert instance_state(conn, instance) == "scheduled"
    assert charge_output(conn, instance) == {"receipt_id": "ch_r"}


def test_the_queue_shows_blocking_superseded_and_verification_and_asks_verifiers(
    operator, auditor, conn, failed
):
    _, plain = failed
    verified = verified_sequence(conn, TENANT)
    _, escalated = unknown_receipt(conn, verified, TENANT, VERIFIED_HANDLER)
    escalate(conn, TENANT, escalated)
    _, pending = unknown_receipt(conn, verified, TENANT, VERIFIED_HANDLER)
    gone, superseded = unknown_receipt(conn, verified, TENANT, VERIFIED_HANDLER)
    supersede(conn, TENANT, gone)

    queue = operator.get("/console/effects/unresolved")
    html = queue.text
    assert 'data-count="4"' in html
    for which, n in (("blocking", 3), ("superseded", 1), ("verifying", 2), ("escalated", 1)):
        assert f'id="count-{which}" data-count="{n}"' in html, which
    articles = re.findall(r'<article class="receipt queue-item".*?</article>', html, re.S)
    blocks = {
        re.search(r'id="q-([0-9a-f-]+)"', a).group(1): re.search(
            r'data-blocking="(\w+)" data-verification="(\w*)"', a
        ).groups()
        for a in articles
    }
    assert blocks == {
        str(plain): ("true", ""),
        str(escalated): ("true", "escalated"),
        str(pending): ("true", "pending"),
        str(superseded): ("false", "pending"),
    }
    assert "Verification escalated: 1 of 1 tries were inconclusive" in html
    assert re.search(r"Being verified: 0 of 1 tries used, next try \d{4}-\d\d-\d\d", html)
    assert "Superseded</span>: no instance waits on it" in html
    # verify again: offered for the escalated receipt only
    forms = re.findall(r'action="/console/effects/([0-9a-f-]+)/verify"', html)
    assert forms == [str(escalated)]
    assert 'id="verify-superseded"' in html
    token = csrf_of(html)
    assert operator.post(f"/console/effects/{escalated}/verify").status_code == 403  # no token
    auditor_token = csrf_of(auditor.get("/console/effects/unresolved").text)
    forged = auditor.post(
        f"/console/effects/{escalated}/verify", data={"csrf_token": auditor_token}
    )
    assert forged.status_code == 403 and "can only read" in forged.text
    assert "verify-again" not in auditor.get("/console/effects/unresolved").text
    resp = operator.post(f"/console/effects/{escalated}/verify", data={"csrf_token": token})
    assert resp.status_code == 302
    page = operator.get(resp.headers["Location"]).text
    assert f"Receipt {escalated}: its verification starts over, with its tries reset." in page
    assert 'id="count-escalated" data-count="0"' in page
    again = operator.post(f"/console/effects/{plain}/verify", data={"csrf_token": token})
    assert "its step declares no verifier" in operator.get(again.headers["Location"]).text
    assert (
        operator.post(
            f"/console/effects/{uuid.uuid4()}/verify", data={"csrf_token": token}
        ).status_code
        == 404
    )
    bulk = operator.post("/console/effects/verify-superseded", data={"csrf_token": token})
    assert bulk.headers["Location"].endswith("/console/effects/unresolved?which=superseded")
    shown = operator.get(bulk.headers["Location"]).text
    assert "Verification requested for 1 superseded receipt(s): 1 already scheduled." in shown
    assert str(superseded) in shown and str(plain) not in shown.split("queue-item", 1)[-1]
    blocking_only = operator.get("/console/effects/unresolved?which=blocking").text
    assert str(superseded) not in blocking_only and str(plain) in blocking_only
    assert operator.get("/console/effects/unresolved?which=maybe").status_code == 400


def test_cancel_from_the_instance_page(operator, conn):
    seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    instance = start(conn, seq)
    page = operator.get(f"/console/instances/{instance}")
    assert "Cancel instance" in page.text and "Retry instance" not in page.text
    assert 'name="reason"' in page.text and "No pause, cancel or resume asked." in page.text
    resp = operator.post(
        f"/console/instances/{instance}/cancel",
        data={"csrf_token": csrf_of(page.text), "reason": "duplicate order"},
    )
    shown = operator.get(resp.headers["Location"]).text
    assert "Cancelled." in shown
    assert instance_state(conn, instance) == "cancelled"
    # the request and its reason are in the page's audit trail, in the operator's name
    [row] = re.findall(r'<table id="requests">.*?<tbody>(.*?)</tbody>', shown, re.S)
    assert "cancel" in row and "duplicate order" in row and ">cancelled<" in row
    actor = conn.execute(
        "SELECT actor FROM orch8.instance_requests WHERE instance_id = %s", (instance,)
    ).fetchone()[0]
    assert actor.startswith("key:") and actor in row
    # a blank reason falls back to saying where the cancel came from
    other = start(conn, seq)
    page = operator.get(f"/console/instances/{other}")
    operator.post(
        f"/console/instances/{other}/cancel",
        data={"csrf_token": csrf_of(page.text), "reason": "  "},
    )
    assert (
        conn.execute(
            "SELECT reason FROM orch8.instance_requests WHERE instance_id = %s", (other,)
        ).fetchone()[0]
        == "cancelled from the console"
    )


def test_unknown_pages_and_database_errors_are_pages_not_tracebacks(operator, app):
    missing = operator.get("/console/no/such/page")
    assert missing.status_code == 404 and "<html" in missing.text
    app.extensions["orch8.pool"].close()  # the database goes away
    app.extensions["orch8.pool"] = ConnectionPool(
        "postgresql://nobody@127.0.0.1:1/none",
        min_size=1,
        open=False,
        timeout=1,
        kwargs={"connect_timeout": 1},
    )
    down = operator.get("/console/instances")
    assert down.status_code == 503 and "Database unavailable" in down.text
    assert "Traceback" not in down.text


def test_revoking_a_key_ends_its_console_sessions(db_url, conn):
    from orch8_py import apikeys
    from web import create_app

    key_id, secret = apikeys.create(conn, "t1", "operator", "soon-revoked")
    app = create_app(db_url)
    client = app.test_client()
    page = client.get("/console/login")
    token = page.get_data(as_text=True).split('name="csrf_token" value="')[1].split('"')[0]
    assert client.post(
        "/console/login", data={"api_key": secret, "csrf_token": token}
    ).status_code in (
        302,
        303,
    )
    assert client.get("/console/").status_code == 200
    sqlapi.keys.revoke_api_key(conn, tenant_id="t1", key_id=key_id)
    assert client.get("/console/").status_code == 302  # back to the login page


# --- an admin's tenant switch ------------------------------------------------------------


def switch(client, tenant, token=None):
    if token is None:
        token = csrf_of(client.get("/console/").text)
    return client.post("/console/tenant", data={"tenant": tenant, "csrf_token": token})


def acting_tenant_shown(html: str) -> str:
    match = re.search(r'id="acting-tenant">([^<]*)<', html)
    assert match, "the header names no tenant"
    return match.group(1)


@pytest.fixture
def admin(app, conn):
    _, secret = apikeys.create(conn, TENANT, "admin", "admin-root")
    client = app.test_client()
    assert login(client, secret).status_code == 302
    return client


def test_admin_switches_tenant_and_sees_only_that_tenant(admin, conn, failed, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="orch8.web.console")
    mine, my_effect = failed
    theirs, their_effect = fail_with_unknown_receipt(
        conn, charge_sequence(conn, tenant=OTHER), tenant=OTHER
    )
    dash = admin.get("/console/")
    assert acting_tenant_shown(dash.text) == TENANT
    assert 'id="tenant-switch"' in dash.text and 'id="tenant-home"' not in dash.text
    # the datalist offers the tenants that exist (read across tenants for the admin)
    assert '<option value="other">' in dash.text and f'<option value="{TENANT}">' in dash.text
    assert str(mine) in admin.get("/console/instances").text

    resp = switch(admin, OTHER)
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/console/")
    page = admin.get(resp.headers["Location"])
    assert "Now acting for tenant other." in page.text
    assert acting_tenant_shown(page.text) == OTHER
    assert "the key's tenant is t1" in page.text and 'id="tenant-home"' in page.text
    assert re.search(r'id="queue-depth">1<', page.text)
    with admin.session_transaction() as sess:
        assert sess["console"]["acting"] == OTHER
    listing = admin.get("/console/instances").text
    assert str(theirs) in listing and str(mine) not in listing
    queue = admin.get("/console/effects/unresolved").text
    assert 'data-count="1"' in queue and str(their_effect) in queue
    assert str(my_effect) not in queue
    assert admin.get(f"/console/instances/{theirs}").status_code == 200
    assert admin.get(f"/console/instances/{mine}").status_code == 404
    assert admin.get(f"/console/effects/{my_effect}").status_code == 404
    # writes land in the acting tenant too
    assert resolve_form(admin, their_effect).status_code == 302
    assert receipt(conn, their_effect)[0] == "committed"
    assert receipt(conn, my_effect)[0] == "unknown"
    [record] = [r for r in caplog.records if "event=console.tenant_switch " in r.getMessage()]
    assert record.levelno == logging.INFO
    message = record.getMessage()
    assert "actor=key:admin-root" in message and f"from={TENANT} to={OTHER}" in message

    # and back to the key's own tenant
    back = switch(admin, TENANT)
    assert back.status_code == 302
    page = admin.get(back.headers["Location"])
    assert "Back in your key&#39;s own tenant t1." in page.text
    assert acting_tenant_shown(page.text) == TENANT and 'id="tenant-home"' not in page.text
    with admin.session_transaction() as sess:
        assert "acting" not in sess["console"]
    listing = admin.get("/console/instances").text
    assert str(mine) in listing and str(theirs) not in listing
    assert f"from={OTHER} to={TENANT}" in caplog.records[-1].getMessage()


def test_switching_to_a_tenant_with_nothing_yet_says_so(admin, conn):
    resp = switch(admin, "brand-new.tenant_1")
    page = admin.get(resp.headers["Location"])
    assert "Now acting for tenant brand-new.tenant_1. It has no sequences" in page.text
    assert acting_tenant_shown(page.text) == "brand-new.tenant_1"
    assert admin.get("/console/instances").text.count('class="instance-row"') == 0


@pytest.mark.parametrize("role", ["operator", "auditor"])
def test_only_an_admin_may_switch_tenant(app, keys, conn, failed, role):
    mine, _ = failed
    theirs, _ = fail_with_unknown_receipt(conn, charge_sequence(conn, tenant=OTHER), tenant=OTHER)
    client = app.test_client()
    assert login(client, keys[role]).status_code == 302
    dash = client.get("/console/")
    assert "tenant-switch" not in dash.text and 'name="tenant"' not in dash.text
    assert "known-tenants" not in dash.text and '<option value="other">' not in dash.text
    refused = switch(client, OTHER, csrf_of(dash.text))
    assert refused.status_code == 403 and "needs an admin key" in refused.text
    with client.session_transaction() as sess:
        assert "acting" not in sess["console"]
    listing = client.get("/console/instances").text
    assert str(mine) in listing and str(theirs) not in listing
    assert client.get(f"/console/instances/{theirs}").status_code == 404
    # even an acting tenant in the session would not move a non-admin
    with client.session_transaction() as sess:
        sess["console"] = {**sess["console"], "acting": OTHER}
    assert acting_tenant_shown(client.get("/console/").text) == TENANT
    assert client.get(f"/console/instances/{theirs}").status_code == 404


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("", "enter the id of the tenant"),
        ("   ", "enter the id of the tenant"),
        ("a" * 101, "1 to 100 characters"),
        ("two words", "1 to 100 characters"),
        ("../etc", "1 to 100 characters"),
        ("ac\nme", "1 to 100 characters"),
        ("tënant", "1 to 100 characters"),
        ("<script>", "1 to 100 characters"),
    ],
)
def test_a_bad_tenant_is_refused_and_changes_nothing(admin, conn, value, says):
    assert switch(admin, OTHER).status_code == 302
    resp = switch(admin, value)
    assert resp.status_code == 422
    assert "Tenant not switched: " in resp.text and says in resp.text
    assert "<script>" not in resp.text and "Traceback" not in resp.text
    with admin.session_transaction() as sess:
        assert sess["console"]["acting"] == OTHER
    assert acting_tenant_shown(admin.get("/console/").text) == OTHER


def test_the_tenant_switch_needs_the_csrf_token(admin, conn):
    missing = admin.post("/console/tenant", data={"tenant": OTHER})
    assert missing.status_code == 403 and "security token" in missing.text
    forged = admin.post("/console/tenant", data={"tenant": OTHER, "csrf_token": "forged"})
    assert forged.status_code == 403
    with admin.session_transaction() as sess:
        assert "acting" not in sess["console"]
    assert acting_tenant_shown(admin.get("/console/").text) == TENANT
    # logged out, the switch is refused before anything else
    anonymous = admin.application.test_client()
    assert anonymous.post("/console/tenant", data={"tenant": OTHER}).status_code == 403


# --- keyset paging of the instance list ---------------------------------------------------


def listed_ids(html: str) -> list[str]:
    return re.findall(
        r'<tr class="instance-row">\s*<td><a href="/console/instances/([0-9a-f-]{36})"', html
    )


def pager_link(html: str, rel: str) -> str | None:
    import html as html_lib

    match = re.search(rf'<a rel="{rel}" id="\w+" href="([^"]+)"', html)
    return html_lib.unescape(match.group(1)) if match else None


def test_instance_pages_walk_by_cursor_without_repeats_while_instances_are_created(operator, conn):
    seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    with conn.transaction():  # 30 with the very same created_at: the id breaks the tie
        original = {str(start(conn, seq)) for _ in range(30)}
    original |= {str(start(conn, seq)) for _ in range(30)}
    assert len(original) == 60
    walked: list[str] = []
    added: set[str] = set()
    url = "/console/instances"
    pages = []
    while url:
        resp = operator.get(url)
        assert resp.status_code == 200
        ids = listed_ids(resp.text)
        assert len(ids) <= 25
        walked.extend(ids)
        pages.append(resp.text)
        url = pager_link(resp.text, "next")
        # meanwhile new instances arrive, newest first in the list
        added |= {str(start(conn, seq)) for _ in range(7)}
    assert len(pages) == 3 and [len(listed_ids(p)) for p in pages] == [25, 25, 10]
    assert len(walked) == len(set(walked)) == 60
    assert set(walked) == original
    assert pager_link(pages[0], "prev") is None and 'id="newest"' not in pages[0]
    assert pager_link(pages[-1], "next") is None
    # back up with the Newer links from the last page: no repeats, and the new ones too
    url = pager_link(pages[-1], "prev")
    back = list(listed_ids(pages[-1]))
    while url:
        resp = operator.get(url)
        assert resp.status_code == 200 and 'id="newest"' in resp.text
        back.extend(listed_ids(resp.text))
        url = pager_link(resp.text, "prev")
    assert len(back) == len(set(back)) == 60 + len(added)
    assert set(back) == original | added
    # the state filter travels with the cursor
    filtered = operator.get("/console/instances?state=scheduled")
    older = pager_link(filtered.text, "next")
    assert "state=scheduled" in older and "cursor=" in older
    assert (
        operator.get(older.replace("state=scheduled", "state=failed")).text.count("instance-row")
        == 0
    )


@pytest.mark.parametrize(
    "query",
    [
        "cursor=garbage",
        "cursor=",
        "newer=%00%FF",
        "cursor=WyIyMDMwLTAxLTAxVDAwOjAwOjAwWiIsICJub3QtYS11dWlkIl0",  # a bad uuid inside
        "cursor=WzEsMiwzXQ",  # [1,2,3]
        "state=failed&cursor=bm90IGpzb24",
    ],
)
def test_a_garbage_cursor_is_a_400_page(operator, query):
    resp = operator.get(f"/console/instances?{query}")
    assert resp.status_code == 400 and "<html" in resp.text
    assert "This page link is not valid" in resp.text and "Traceback" not in resp.text


def test_cursor_and_newer_together_are_refused(operator, conn):
    seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    for _ in range(26):
        start(conn, seq)
    older = pager_link(operator.get("/console/instances").text, "next")
    assert operator.get(older).text.count('class="instance-row"') == 1
    newer = pager_link(operator.get(older).text, "prev")
    assert operator.get(older + "&" + newer.split("?", 1)[1]).status_code == 400


def test_without_a_tenant_list_the_admin_still_switches_by_typing(admin, conn, monkeypatch):
    from orch8_py import sqlapi

    def refused(conn, **_kw):
        # what a login role that cannot read across tenants meets
        conn.execute("SELECT tenant_id FROM orch8.no_such_table")

    monkeypatch.setattr(sqlapi.tenancy, "known_tenants", refused)
    seq = charge_sequence(conn, tenant=OTHER)
    theirs = start(conn, seq, tenant=OTHER)
    dash = admin.get("/console/")
    assert dash.status_code == 200 and 'id="switch-tenant"' in dash.text
    assert '<option value="other">' not in dash.text
    page = admin.get(switch(admin, OTHER, csrf_of(dash.text)).headers["Location"])
    assert "Now acting for tenant other." in page.text and "no sequences" not in page.text
    assert str(theirs) in admin.get("/console/instances").text


def test_short_ids_tell_apart_what_was_made_together(app, conn):
    """Ids made in the same minute share their first digits (an instance id's time, and
    since migration 0032 a receipt id's); the console's short form shows their ends."""
    short = app.jinja_env.get_template("console/_macros.html").module.short
    instance = conn.execute("SELECT orch8.time_ordered_uuid()").fetchone()[0]
    receipts = [
        conn.execute(
            "SELECT orch8.effect_receipt_id(2, %s, 0, %s, 'charge', %s)",
            (uuid.uuid4(), instance, attempt),
        ).fetchone()[0]
        for attempt in (0, 1)
    ]
    labels = [str(short(i)) for i in receipts]
    assert str(receipts[0])[:12] == str(receipts[1])[:12]
    assert labels[0] != labels[1]
    for i, label in zip(receipts, labels, strict=True):
        assert f">…{str(i)[-8:]}</code>" in label
