"""Operator operations in SQL: cancel, pause, resume, signals, retry after resolution,
API keys, and tenant isolation by row-level security."""

from __future__ import annotations

import hashlib
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from orch8_py import apikeys
from orch8_py.errors import EffectBlocked, InvalidTransition, NotFound
from orch8_py.sqlapi.base import engine_errors
from tests import ledger
from tests.runner_helpers import TENANT, make_sequence, running, start, wait_for

PARAMS = {"url": "https://pay.example/charge"}


def call(conn, sql, *args):
    with engine_errors():
        return conn.execute(sql, args).fetchone()


def state(conn, instance):
    return conn.execute(
        "SELECT state::text, requested_state::text FROM orch8.task_instances WHERE id = %s",
        (instance,),
    ).fetchone()


@pytest.fixture
def seq(conn):
    return make_sequence(
        conn,
        [
            {"type": "step", "id": "charge", "handler": "test.ops.charge"},
            {"type": "step", "id": "ship", "handler": "noop"},
        ],
    )


def claim(conn):
    return conn.execute(
        "SELECT lease_token FROM orch8.claim_due_nodes('w1', 1, '30 seconds')"
    ).fetchone()[0]


def test_cancel_pause_resume_and_signals(conn, seq):
    a = start(conn, seq)
    assert call(conn, "SELECT orch8.pause_instance(%s, %s, 'op')", TENANT, a)[0] == "paused"
    assert call(conn, "SELECT orch8.pause_instance(%s, %s, 'op')", TENANT, a)[0] == "unchanged"
    assert call(conn, "SELECT orch8.resume_instance(%s, %s, 'op')", TENANT, a)[0] == "scheduled"
    row = call(conn, "SELECT * FROM orch8.send_signal(%s, %s, 'cancel', '{}', 'op')", TENANT, a)
    assert row[1] == "cancelled" and state(conn, a) == ("cancelled", None)
    with pytest.raises(InvalidTransition, match="cannot be paused"):
        call(conn, "SELECT orch8.pause_instance(%s, %s, 'op')", TENANT, a)
    with pytest.raises(InvalidTransition, match="not paused"):
        call(conn, "SELECT orch8.resume_instance(%s, %s, 'op')", TENANT, a)
    with pytest.raises(InvalidTransition, match="no wait will ever read signal approved"):
        call(
            conn,
            "SELECT * FROM orch8.send_signal(%s, %s, 'approved', %s, 'op')",
            TENANT,
            a,
            Jsonb({"by": "bob"}),
        )
    with pytest.raises(NotFound):
        call(conn, "SELECT orch8.cancel_instance(%s, %s, 'op')", TENANT, uuid.uuid4())


def test_pause_of_a_running_instance_waits_for_the_step_boundary(conn, seq):
    a = start(conn, seq)
    token = claim(conn)
    assert call(conn, "SELECT orch8.pause_instance(%s, %s, 'op')", TENANT, a)[0] == "requested"
    assert state(conn, a) == ("running", "paused")
    out = call(
        conn,
        "SELECT outcome FROM orch8.begin_step(%s, %s, %s, 'charge', 'x.y', %s, 0)",
        TENANT,
        a,
        token,
        Jsonb(PARAMS),
    )
    assert out[0] == "stopped"
    assert state(conn, a) == ("paused", None)
    assert conn.execute("SELECT count(*) FROM orch8.effect_receipts").fetchone()[0] == 0


def test_cancel_requested_while_running_applies_after_the_step(conn, seq):
    a = start(conn, seq)
    token = claim(conn)
    began = call(
        conn,
        "SELECT effect_id FROM orch8.begin_step(%s, %s, %s, 'charge', 'x.y', %s, 0)",
        TENANT,
        a,
        token,
        Jsonb(PARAMS),
    )
    assert call(conn, "SELECT orch8.cancel_instance(%s, %s, 'op')", TENANT, a)[0] == "requested"
    final = call(
        conn,
        "SELECT state::text FROM orch8.finish_step(%s, %s, %s, 'charge', 0, %s, 'ok', '{}')",
        TENANT,
        a,
        token,
        began[0],
    )
    assert final[0] == "cancelled"
    receipt = conn.execute("SELECT state::text FROM orch8.effect_receipts").fetchone()[0]
    assert receipt == "committed"  # the step in flight was recorded, not abandoned


def fail_with_unknown_receipt(conn, seq):
    """An instance that failed with EffectBlocked: its charge receipt is unknown."""
    a = start(conn, seq)
    token = claim(conn)
    call(
        conn,
        "SELECT * FROM orch8.begin_step(%s, %s, %s, 'charge', 'x.y', %s, 0)",
        TENANT,
        a,
        token,
        Jsonb(PARAMS),
    )
    conn.execute("SELECT orch8.release_lease(%s, %s, %s)", (TENANT, a, token))
    token = claim(conn)  # another claim begins the same attempt: blocked, unknown, failed
    out = call(
        conn,
        "SELECT outcome, effect_id FROM orch8.begin_step(%s, %s, %s, 'charge', 'x.y', %s, 0)",
        TENANT,
        a,
        token,
        Jsonb(PARAMS),
    )
    assert out[0] == "blocked" and state(conn, a)[0] == "failed"
    return a, out[1]


def test_retry_refuses_while_the_receipt_is_unknown(conn, seq):
    a, effect_id = fail_with_unknown_receipt(conn, seq)
    with pytest.raises(EffectBlocked, match=str(effect_id)):
        call(conn, "SELECT * FROM orch8.retry_instance(%s, %s, 'op')", TENANT, a)
    assert state(conn, a)[0] == "failed"


def test_retry_after_committed_completes_the_step_without_sending(db_url, conn, seq):
    sent = []
    from orch8_py.handlers import handler

    @handler("test.ops.charge")
    def charge(params, ctx):
        sent.append(ctx.effect_id)
        return {"receipt_id": "new"}

    a, effect_id = fail_with_unknown_receipt(conn, seq)
    ledger.resolve_effect(
        conn,
        TENANT,
        effect_id,
        "committed",
        actor="alice",
        provider_receipt_id="ch_1",
        evidence={"dashboard": "paid"},
        expected_state="unknown",
    )
    out = call(conn, "SELECT * FROM orch8.retry_instance(%s, %s, 'alice')", TENANT, a)
    assert out[0] == "completed_from_evidence" and out[1] == "charge"
    with running(db_url):
        assert wait_for(conn, [a])[a] == ("completed", None)
    assert sent == []  # never sent again
    settled = conn.execute(
        "SELECT output FROM orch8.block_outputs WHERE instance_id = %s AND block_id = 'charge'"
        " AND sentinel IS NULL",
        (a,),
    ).fetchone()[0]
    assert settled["settled"] and settled["provider_receipt_id"] == "ch_1"
    assert settled["settled_by"] == "alice"


def test_retry_after_abandoned_runs_the_step_as_a_new_attempt(db_url, conn, seq):
    sent = []
    from orch8_py.handlers import handler

    @handler("test.ops.charge")
    def charge(params, ctx):
        sent.append((ctx.attempt, ctx.effect_id))
        return {"receipt_id": "new"}

    a, effect_id = fail_with_unknown_receipt(conn, seq)
    ledger.resolve_effect(
        conn,
        TENANT,
        effect_id,
        "abandoned",
        actor="alice",
        evidence={"provider": "no such charge"},
        expected_state="unknown",
    )
    out = call(conn, "SELECT * FROM orch8.retry_instance(%s, %s, 'alice')", TENANT, a)
    assert out[0] == "rerun"
    with running(db_url):
        assert wait_for(conn, [a])[a] == ("completed", None)
    assert len(sent) == 1 and sent[0][0] == 1 and sent[0][1] != effect_id


def test_retry_of_the_last_step_settled_completes_the_instance(conn):
    seq = make_sequence(conn, [{"type": "step", "id": "charge", "handler": "test.ops.charge"}])
    a, effect_id = fail_with_unknown_receipt(conn, seq)
    ledger.resolve_effect(
        conn,
        TENANT,
        effect_id,
        "verified",
        actor="alice",
        evidence={"provider": "found it"},
        expected_state="unknown",
    )
    out = call(conn, "SELECT * FROM orch8.retry_instance(%s, %s, 'alice')", TENANT, a)
    assert out[0] == "completed_from_evidence" and state(conn, a)[0] == "completed"
    with pytest.raises(InvalidTransition, match="only a failed instance"):
        call(conn, "SELECT * FROM orch8.retry_instance(%s, %s, 'alice')", TENANT, a)


def test_api_keys_authenticate_and_revoke(conn):
    secret = "o8_test_" + uuid.uuid4().hex
    digest = hashlib.sha256(secret.encode()).hexdigest()
    key_id = call(
        conn, "SELECT orch8.create_api_key('acme', 'ci', 'operator', 'o8_test', %s)", digest
    )[0]
    got = call(conn, "SELECT tenant_id, key_id, role FROM orch8.authenticate_api_key(%s)", digest)
    assert got == ("acme", key_id, "operator")
    assert call(conn, "SELECT orch8.revoke_api_key('acme', %s)", key_id)[0] is True
    assert call(conn, "SELECT * FROM orch8.authenticate_api_key(%s)", digest) is None


def test_rls_isolates_tenants_for_the_web_role(db_url, conn, seq):
    mine = start(conn, seq)
    other_seq = conn.execute(
        "SELECT id FROM orch8.create_sequence('other', 'default', 'x', %s)",
        (Jsonb({"blocks": [{"type": "step", "id": "a", "handler": "noop"}]}),),
    ).fetchone()[0]
    theirs = start(conn, other_seq, tenant="other")
    for tenant, instance in ((TENANT, mine), ("other", theirs)):  # an unknown receipt each
        out = ledger.begin_effect(conn, tenant, instance, "charge", "x.y", PARAMS, 0)
        ledger.mark_effect_unknown(conn, tenant, out.effect_id, "timeout")
    _, secret = apikeys.create(conn, TENANT, "operator", "ops")
    with psycopg.connect(db_url) as web:
        web.execute("SET ROLE orch8_web")
        assert web.execute("SELECT count(*) FROM orch8.task_instances").fetchone()[0] == 0
        # a tenant named by hand is no tenant: only a credential seals one
        web.execute("SELECT set_config('orch8.tenant_id', %s, true)", (TENANT,))
        assert web.execute("SELECT count(*) FROM orch8.task_instances").fetchone()[0] == 0
        web.execute(
            "SELECT orch8.enter_tenant('api_key', %s, %s)", (apikeys.key_hash(secret), TENANT)
        )
        ids = {r[0] for r in web.execute("SELECT id FROM orch8.task_instances")}
        assert ids == {mine}
        # views apply the caller's policies too (security_invoker)
        tenants = {r[0] for r in web.execute("SELECT tenant_id FROM orch8.unresolved_effects")}
        assert tenants <= {TENANT}
        assert theirs not in ids
        # no direct writes at all (into another tenant or its own)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            web.execute(
                "INSERT INTO orch8.instance_signals (tenant_id, instance_id, signal_type, actor)"
                " VALUES ('other', %s, 'x', 'me')",
                (theirs,),
            )
        web.rollback()
        web.execute("SET ROLE orch8_web")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            web.execute("SELECT * FROM orch8.api_keys")


def test_a_cancel_requested_while_running_survives_a_graceful_release(conn, seq):
    a = start(conn, seq)
    token = claim(conn)
    assert call(conn, "SELECT orch8.cancel_instance(%s, %s, 'op')", TENANT, a)[0] == "requested"
    conn.execute("SELECT orch8.release_lease(%s, %s, %s)", (TENANT, a, token))
    assert state(conn, a) == ("cancelled", None)


def test_idempotency_key_length_is_input_error(conn, seq):
    from orch8_py.errors import InvalidInput

    for key in ("", "k" * 257):
        with pytest.raises(InvalidInput, match="1 to 256 bytes"):
            call(
                conn,
                "SELECT * FROM orch8.create_instance(%s, %s, p_idempotency_key => %s)",
                TENANT,
                seq,
                key,
            )
