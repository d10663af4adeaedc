"""GET /metrics against a real PostgreSQL: the database-derived gauges, the runner's
process-local counters, and the answer when the database is down.

The app factory serves /metrics itself; the output is parsed with prometheus_client's own
text parser. The runner registry is process-global, so runner-side assertions compare
values before and after.
"""

from __future__ import annotations

import socket
import uuid

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.types.json import Jsonb

from orch8_py import metrics
from orch8_py.errors import ConfigError
from tests import ledger
from tests.queue_helpers import (
    VERIFIED_HANDLER,
    escalate,
    supersede,
    unknown_receipt,
    verified_sequence,
)
from tests.runner_helpers import TENANT, make_sequence, running, start, wait_for
from web import create_app

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def make_client(url: str):
    app = create_app(url)  # the factory must serve /metrics itself (orch8 up, orch8 serve)
    return app, app.test_client()


@pytest.fixture
def client(db_url):
    app, client = make_client(db_url)
    yield client
    app.extensions["orch8.pool"].close()


def scrape(client) -> Samples:
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.content_type.startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(resp.get_data(as_text=True)):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


def registry_value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def begin_effect(conn, tenant, handler, *, ago=None) -> uuid.UUID:
    """A dispatched receipt for a fresh instance, created ``ago`` (an interval) ago."""
    instance = ledger.instance(conn, tenant)
    if ago:
        conn.execute(
            "SELECT set_config('orch8.fake_now', (now() - %s::interval)::text, false)", (ago,)
        )
    try:
        row = conn.execute(
            "SELECT outcome, effect_id FROM orch8.begin_effect(%s, %s, 'charge', %s, %s, 0)",
            (tenant, instance, handler, Jsonb({"url": "https://x.example"})),
        ).fetchone()
    finally:
        conn.execute("RESET orch8.fake_now")
    assert row[0] == "dispatched"
    return row[1]


# --- database-derived gauges ------------------------------------------------------------


def test_unresolved_effects_by_tenant_kind_state_and_oldest_age(conn, client):
    old = begin_effect(conn, "t1", "http_request", ago="2 hours")
    new = begin_effect(conn, "t1", "http_request")
    for effect_id in (old, new):
        state = conn.execute(
            "SELECT state::text FROM orch8.mark_effect_unknown('t1', %s, 'timeout')",
            (effect_id,),
        ).fetchone()[0]
        assert state == "unknown"
    # dispatched 10 minutes ago: past orch8.dispatched_alert_after (5 minutes), so queued
    begin_effect(conn, "t2", "payments.charge", ago="10 minutes")
    # dispatched just now: not (yet) unresolved
    begin_effect(conn, "t2", "http_request")

    s = scrape(client)
    # their instances are still scheduled: each waits on its receipt (blocking="true")
    waits = {"blocking": "true"}
    assert value(s, "orch8_database_up") == 1
    assert (
        value(s, "orch8_unresolved_effects", tenant="t1", kind="http", state="unknown", **waits)
        == 2
    )
    t2 = {"tenant": "t2", "state": "dispatched", **waits}
    assert value(s, "orch8_unresolved_effects", kind="worker", **t2) == 1
    assert value(s, "orch8_unresolved_effects", kind="http", **t2) is None  # too recent
    unresolved = {labels for name, labels in s if name == "orch8_unresolved_effects"}
    assert len(unresolved) == 2

    t1_age = value(
        s, "orch8_unresolved_effect_oldest_age_seconds", tenant="t1", kind="http", **waits
    )
    assert 2 * 3600 - 60 < t1_age < 2 * 3600 + 300  # the older of the two
    t2_age = value(
        s, "orch8_unresolved_effect_oldest_age_seconds", tenant="t2", kind="worker", **waits
    )
    assert 600 - 60 < t2_age < 600 + 300

    # the same numbers as the view
    view = conn.execute(
        "SELECT count(*), extract(epoch FROM max(age)) FROM orch8.unresolved_effects"
        " WHERE tenant_id = 't1'"
    ).fetchone()
    assert view[0] == 2 and abs(float(view[1]) - t1_age) < 60

    # resolving drops the receipt from the queue
    conn.execute(
        "SELECT orch8.resolve_effect(p_tenant_id => 't1', p_id => %s,"
        " p_expected_state => 'unknown', p_state => 'committed',"
        " p_provider_receipt_id => 'ch_1', p_evidence => %s, p_actor => 'ops@test')",
        (old, Jsonb({"checked": "provider dashboard"})),
    )
    s = scrape(client)
    assert (
        value(s, "orch8_unresolved_effects", tenant="t1", kind="http", state="unknown", **waits)
        == 1
    )
    t1_age = value(
        s, "orch8_unresolved_effect_oldest_age_seconds", tenant="t1", kind="http", **waits
    )
    assert 0 < t1_age < 300


def test_unresolved_effects_blocking_or_superseded_and_verifications_by_state(conn, client):
    verified = verified_sequence(conn, TENANT)
    _, escalated = unknown_receipt(conn, verified, TENANT, VERIFIED_HANDLER)
    escalate(conn, TENANT, escalated)  # its instance fails; an instance still waits on it
    unknown_receipt(conn, verified, TENANT, VERIFIED_HANDLER)  # pending, its instance waiting
    gone, _ = unknown_receipt(conn, verified, TENANT, VERIFIED_HANDLER)
    supersede(conn, TENANT, gone)  # pending, and nothing waits on it

    s = scrape(client)
    worker = {"tenant": TENANT, "kind": "worker", "state": "unknown"}
    assert value(s, "orch8_unresolved_effects", blocking="true", **worker) == 2
    assert value(s, "orch8_unresolved_effects", blocking="false", **worker) == 1
    for blocking in ("true", "false"):
        age = value(
            s,
            "orch8_unresolved_effect_oldest_age_seconds",
            tenant=TENANT,
            kind="worker",
            blocking=blocking,
        )
        assert 0 <= age < 300
    assert value(s, "orch8_effect_verifications", tenant=TENANT, state="pending") == 2
    assert value(s, "orch8_effect_verifications", tenant=TENANT, state="escalated") == 1
    assert value(s, "orch8_effect_verifications", tenant=TENANT, state="settled") is None

    # an escalated receipt settled by hand: its verification is settled, not counted
    conn.execute(
        "SELECT orch8.resolve_effect(p_tenant_id => %s, p_id => %s,"
        " p_expected_state => 'unknown', p_state => 'verified', p_provider_receipt_id => NULL,"
        " p_evidence => '{}', p_actor => 'ops')",
        (TENANT, escalated),
    )
    s = scrape(client)
    assert value(s, "orch8_effect_verifications", tenant=TENANT, state="escalated") == 0
    assert value(s, "orch8_effect_verifications", tenant=TENANT, state="pending") == 2
    assert value(s, "orch8_unresolved_effects", blocking="true", **worker) == 1


def test_empty_database_has_up_and_zero_reclaims_only(client):
    s = scrape(client)
    assert value(s, "orch8_database_up") == 1
    assert value(s, "orch8_lease_reclaims_total") == 0
    assert value(s, "orch8_database_query_seconds") >= 0
    for name in (
        "orch8_unresolved_effects",
        "orch8_effect_verifications",
        "orch8_instances",
        "orch8_webhook_outbox",
    ):
        assert name not in names(s)


def test_instances_by_state(conn, client):
    seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    start(conn, seq)
    start(conn, seq)
    cancelled = start(conn, seq)
    assert conn.execute(
        "SELECT orch8.transition_instance(%s, %s, 'scheduled', 'cancelled', 'test')",
        (TENANT, cancelled),
    ).fetchone()[0]
    other = conn.execute(
        "SELECT id FROM orch8.create_sequence('t2', 'default', 'other', %s)",
        (Jsonb({"blocks": [{"type": "step", "id": "a", "handler": "noop"}]}),),
    ).fetchone()[0]
    start(conn, other, tenant="t2")

    s = scrape(client)
    assert value(s, "orch8_instances", tenant=TENANT, state="scheduled") == 2
    assert value(s, "orch8_instances", tenant=TENANT, state="cancelled") == 1
    # every state of a tenant that has instances is present, zero when empty
    for state in ("running", "waiting", "paused", "completed", "failed"):
        assert value(s, "orch8_instances", tenant=TENANT, state=state) == 0
    assert value(s, "orch8_instances", tenant="t2", state="scheduled") == 1
    assert value(s, "orch8_instances", tenant="t2", state="cancelled") == 0


def test_webhook_outbox_states_and_deliveries(conn, client):
    sub = conn.execute(
        "SELECT orch8.create_webhook_subscription('t1', 'https://hooks.example/x', 'secret')"
    ).fetchone()[0]

    def outbox(state: str, n: int) -> None:
        for _ in range(n):
            conn.execute(
                "INSERT INTO orch8.webhook_outbox (tenant_id, subscription_id, event,"
                " instance_id, payload, state, claimed_by, claim_expires_at, delivered_at)"
                " VALUES ('t1', %s, 'instance.completed', %s, '{}', %s,"
                " CASE WHEN %s = 'delivering' THEN 'w1' END,"
                " CASE WHEN %s = 'delivering' THEN now() + interval '1 minute' END,"
                " CASE WHEN %s = 'delivered' THEN now() END)",
                (sub, uuid.uuid4(), state, state, state, state),
            )

    outbox("pending", 2)
    outbox("delivering", 1)
    outbox("delivered", 3)
    outbox("parked", 1)

    s = scrape(client)
    expected = {"pending": 2, "delivering": 1, "delivered": 3, "parked": 1, "discarded": 0}
    for state, n in expected.items():
        assert value(s, "orch8_webhook_outbox", tenant="t1", state=state) == n, state
    assert value(s, "orch8_webhook_deliveries_total", tenant="t1") == 3


def test_lease_reclaims(conn, client):
    seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    start(conn, seq)
    claimed = conn.execute(
        "SELECT instance_id AS id FROM orch8.claim_due_nodes('dead-runner', 5, '1 second')"
    ).fetchall()
    assert len(claimed) == 1
    assert value(scrape(client), "orch8_lease_reclaims_total") == 0
    conn.execute("SELECT set_config('orch8.fake_now', (now() + interval '1 hour')::text, false)")
    try:
        assert conn.execute("SELECT orch8.reclaim_expired_leases(10)").fetchone()[0] == 1
    finally:
        conn.execute("RESET orch8.fake_now")
    s = scrape(client)
    assert value(s, "orch8_lease_reclaims_total") == 1
    assert value(s, "orch8_instances", tenant=TENANT, state="scheduled") == 1


def test_database_down_still_answers_with_process_metrics():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app, client = make_client(f"postgresql://postgres@127.0.0.1:{port}/postgres")
    try:
        s = scrape(client)
    finally:
        app.extensions["orch8.pool"].close()
    assert value(s, "orch8_database_up") == 0
    assert "orch8_lease_lost_total" in names(s)  # the process metrics are still there
    assert "orch8_claim_batch_size_count" in names(s)
    for name in ("orch8_unresolved_effects", "orch8_instances", "orch8_lease_reclaims_total"):
        assert name not in names(s)


def test_schema_missing_reports_database_down(admin_url):
    app, client = make_client(admin_url)  # reachable, but no orch8 schema there
    try:
        s = scrape(client)
    finally:
        app.extensions["orch8.pool"].close()
    assert value(s, "orch8_database_up") == 0


# --- process-local runner metrics ------------------------------------------------------


def test_classify():
    assert metrics.classify("ok", "running") == "succeeded"
    assert metrics.classify("ok", "completed") == "succeeded"
    assert metrics.classify("error", "scheduled") == "retried"
    assert metrics.classify("not_applied", "scheduled") == "retried"
    assert metrics.classify("error", "failed") == "failed"
    assert metrics.classify("not_applied", "failed") == "failed"
    assert metrics.classify("ok", "failed") == "failed"  # receipt moved meanwhile


def test_runner_functions_show_in_the_scrape(client):
    h = f"test.metrics.{uuid.uuid4().hex[:6]}"
    before = {
        "lost": registry_value("orch8_lease_lost_total"),
        "claims": registry_value("orch8_claim_batch_size_count"),
        "claimed": registry_value("orch8_claim_batch_size_sum"),
        "le1": registry_value("orch8_claim_batch_size_bucket", le="1.0"),
    }
    metrics.step_started(h, True)
    metrics.step_started(h, True)
    metrics.step_started(h, True)
    metrics.step_started("noop", False)
    metrics.step_finished(h, "ok", "running", 0.003)
    metrics.step_finished(h, "error", "scheduled", 0.2)
    metrics.step_finished(h, "error", "failed", 2.0)
    metrics.claimed(0)
    metrics.claimed(5)
    metrics.lease_lost()

    s = scrape(client)
    assert value(s, "orch8_steps_started_total", handler=h, handler_kind="effect") == 3
    assert value(s, "orch8_steps_started_total", handler="noop", handler_kind="pure") >= 1
    assert value(s, "orch8_steps_succeeded_total", handler=h) == 1
    assert value(s, "orch8_steps_retried_total", handler=h) == 1
    assert value(s, "orch8_steps_failed_total", handler=h) == 1
    assert value(s, "orch8_step_duration_seconds_count", handler=h) == 3
    assert value(s, "orch8_step_duration_seconds_sum", handler=h) == pytest.approx(2.203)
    assert value(s, "orch8_step_duration_seconds_bucket", handler=h, le="0.005") == 1
    assert value(s, "orch8_step_duration_seconds_bucket", handler=h, le="0.25") == 2
    assert value(s, "orch8_step_duration_seconds_bucket", handler=h, le="60.0") == 3
    # >=: a runner elsewhere in this process may claim or lose leases meanwhile
    assert value(s, "orch8_claim_batch_size_count") >= before["claims"] + 2
    assert value(s, "orch8_claim_batch_size_sum") >= before["claimed"] + 5
    assert value(s, "orch8_claim_batch_size_bucket", le="1.0") >= before["le1"] + 1
    assert value(s, "orch8_lease_lost_total") >= before["lost"] + 1
    assert value(s, "orch8_database_up") == 1  # both sources in one answer


def test_serve_exposes_the_registry():
    assert metrics.serve_from_env({}) is None
    with pytest.raises(ConfigError, match="not a number"):
        metrics.serve_from_env({"ORCH8_METRICS_PORT": "nine"})
    with pytest.raises(ConfigError, match="TCP port"):
        metrics.serve_from_env({"ORCH8_METRICS_PORT": "70000"})
    metrics.lease_lost()
    server, thread = metrics.serve(0)
    try:
        body = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5).text
        families = {f.name for f in text_string_to_metric_families(body)}
        assert {"orch8_lease_lost", "orch8_claim_batch_size"} <= families
        assert "orch8_database_up" not in families  # the runner alone reads no database
        with pytest.raises(ConfigError, match="already in use"):
            metrics.serve(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_runner_counts_its_steps(conn, db_url):
    seq = make_sequence(
        conn,
        [
            {"type": "step", "id": "a", "handler": "noop"},
            {"type": "step", "id": "b", "handler": "fail", "params": {"retryable": False}},
        ],
    )
    before = {
        "started": registry_value("orch8_steps_started_total", handler="noop", handler_kind="pure"),
        "ok": registry_value("orch8_steps_succeeded_total", handler="noop"),
        "failed": registry_value("orch8_steps_failed_total", handler="fail"),
        "claims": registry_value("orch8_claim_batch_size_sum"),
    }
    instances = [start(conn, seq) for _ in range(3)]
    with running(db_url):
        states = wait_for(conn, instances)
    assert {s for s, _ in states.values()} == {"failed"}
    after = {
        "started": registry_value("orch8_steps_started_total", handler="noop", handler_kind="pure"),
        "ok": registry_value("orch8_steps_succeeded_total", handler="noop"),
        "failed": registry_value("orch8_steps_failed_total", handler="fail"),
        "claims": registry_value("orch8_claim_batch_size_sum"),
    }
    assert after["started"] - before["started"] == 3
    assert after["ok"] - before["ok"] == 3
    assert after["failed"] - before["failed"] == 3
    assert after["claims"] - before["claims"] >= 3


def test_orch8_run_serves_its_metrics_when_asked(conn, db_url, tmp_path):
    """README: ORCH8_METRICS_PORT makes `orch8 run` serve its runner metrics, on
    ORCH8_METRICS_HOST (default 127.0.0.1)."""
    import signal

    from tests.runner_helpers import spawn_runner

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    instance = start(conn, seq)
    log = tmp_path / "run.log"
    proc = spawn_runner(db_url, log, ORCH8_METRICS_PORT=str(port))
    try:
        assert wait_for(conn, [instance])[instance][0] == "completed"
        body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    succeeded = [
        s.value
        for f in text_string_to_metric_families(body)
        for s in f.samples
        if s.name == "orch8_steps_succeeded_total" and s.labels.get("handler") == "noop"
    ]
    assert succeeded == [1.0], body  # this process ran the one step
    assert f"runner metrics on http://127.0.0.1:{port}/metrics" in log.read_text()
