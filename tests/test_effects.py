"""The effect ledger from Python: the SQL agrees with independent Python implementations
of ids, hashes and canonical JSON; outcomes become the right exceptions; traces survive."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from orch8_py.errors import (
    EffectBlocked,
    InvalidConfig,
    InvalidInput,
    InvalidTransition,
    InvariantViolation,
    NotFound,
    StaleEffect,
)
from orch8_py.sqlapi.base import engine_errors
from tests import effect_rules, ledger

TENANT = "t1"
PARAMS = {"url": "https://pay.example/charge", "json": {"amount": 1250}, "idempotency_key": "o-7"}

uuids = st.builds(uuid.UUID, st.uuids().map(str))
block_ids = st.text(min_size=1, max_size=40).filter(lambda s: "\x00" not in s)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    continuity=uuids,
    epoch=st.integers(0, 2**63 - 1),
    instance=uuids,
    block=block_ids,
    attempt=st.integers(0, 2**31 - 1),
)
def test_effect_id_agrees_with_python(conn, continuity, epoch, instance, block, attempt):
    sql = conn.execute(
        "SELECT orch8.deterministic_effect_id(%s, %s, %s, %s, %s)",
        (continuity, epoch, instance, block, attempt),
    ).fetchone()[0]
    assert sql == effect_rules.deterministic_effect_id(continuity, epoch, instance, block, attempt)
    assert sql.version == 8 and sql.variant == uuid.RFC_4122


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    version=st.sampled_from([1, 2]),
    continuity=uuids,
    epoch=st.integers(0, 2**63 - 1),
    instance=uuids,
    block=block_ids,
    attempt=st.integers(0, 2**31 - 1),
)
def test_receipt_id_of_each_version_agrees_with_python(
    conn, version, continuity, epoch, instance, block, attempt
):
    sql = conn.execute(
        "SELECT orch8.effect_receipt_id(%s, %s, %s, %s, %s, %s)",
        (version, continuity, epoch, instance, block, attempt),
    ).fetchone()[0]
    assert sql == effect_rules.effect_receipt_id(
        version, continuity, epoch, instance, block, attempt
    )
    assert sql.version == 8 and sql.variant == uuid.RFC_4122


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(instance=uuids)
def test_scope_ids_agree_with_python(conn, instance):
    ledger.instance(conn, TENANT, instance)
    scope = conn.execute(
        "SELECT continuity_id, owner_runtime_id, epoch FROM orch8.ensure_effect_scope(%s, %s)",
        (TENANT, instance),
    ).fetchone()
    assert scope == (
        effect_rules.continuity_id_for(instance),
        effect_rules.runtime_id_for(instance),
        0,
    )


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.decimals(
        allow_nan=False, allow_infinity=False, places=4, min_value=-(10**9), max_value=10**9
    )
    | st.text(max_size=20).filter(lambda s: "\x00" not in s)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(max_size=8).filter(lambda s: "\x00" not in s), children, max_size=4
        )
    ),
    max_leaves=20,
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=json_values)
def test_canonical_json_agrees_with_python(conn, value):
    text = _json_text(value)
    sql = conn.execute("SELECT orch8.canonical_json(%s::jsonb)", (text,)).fetchone()[0]
    parsed = json.loads(text, parse_float=Decimal, parse_int=Decimal)
    assert sql == effect_rules.canonical_json(parsed)
    handler = "http_request"
    hashes = conn.execute(
        "SELECT orch8.request_sha256(%s, %s::jsonb), orch8.destination_fingerprint(%s, %s::jsonb)",
        (handler, text, handler, text),
    ).fetchone()
    assert hashes == (
        effect_rules.request_sha256(handler, parsed),
        effect_rules.destination_fingerprint(handler, parsed),
    )


def _json_text(value) -> str:
    """JSON text with Decimals written exactly as their digits."""
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_json_text(v) for v in value) + "]"
    return json.dumps(value)


def test_canonical_json_fixed_vectors(conn):
    cases = {
        '{"b":1,"a":{"d":[3,"x"],"c":null}}': '{"a":{"c":null,"d":[3,"x"]},"b":1}',
        '{"é":"ü","e":"\\u00e9","E":true}': '{"E":true,"e":"é","é":"ü"}',
        '["a\\"b\\\\c\\n\\t\\u0001"]': '["a\\"b\\\\c\\n\\t\\u0001"]',
        "[1.50, 1e2, -0, 0.1, 12345678901234567890]": "[1.50,100,0,0.1,12345678901234567890]",
        "{}": "{}",
        "[]": "[]",
    }
    for source, expected in cases.items():
        assert (
            conn.execute("SELECT orch8.canonical_json(%s::jsonb)", (source,)).fetchone()[0]
            == expected
        )
        parsed = json.loads(source, parse_float=Decimal, parse_int=Decimal)
        assert effect_rules.canonical_json(parsed) == expected


# --- begin and settle through the Python wrappers --------------------------------------


def receipt(conn, effect_id):
    return conn.execute(
        "SELECT state, provider_receipt_id, error FROM orch8.effect_receipts WHERE id = %s",
        (effect_id,),
    ).fetchone()


def test_pure_handler_writes_nothing(conn):
    instance = ledger.instance(conn, TENANT)
    assert ledger.begin_effect(conn, TENANT, instance, "t", "transform", {"x": 1}, 0) is None
    counts = conn.execute(
        "SELECT (SELECT count(*) FROM orch8.continuity_executions),"
        " (SELECT count(*) FROM orch8.effect_receipts)"
    ).fetchone()
    assert counts == (0, 0)


def test_begin_commit_and_the_effect_id(conn):
    instance = ledger.instance(conn, TENANT)
    out = ledger.begin_effect(conn, TENANT, instance, "charge", "http_request", PARAMS, 0)
    expected = effect_rules.effect_receipt_id(
        2, effect_rules.continuity_id_for(instance), 0, instance, "charge", 0
    )
    assert (out.outcome, out.state, out.kind, out.effect_id) == (
        "dispatched",
        "dispatched",
        "http",
        expected,
    )
    stored = conn.execute(
        "SELECT request_sha256, destination_fingerprint, idempotency_key FROM orch8.effect_receipts"
        " WHERE id = %s",
        (out.effect_id,),
    ).fetchone()
    assert stored == (
        effect_rules.request_sha256("http_request", PARAMS),
        effect_rules.destination_fingerprint("http_request", PARAMS),
        "o-7",
    )
    done = ledger.commit_effect(conn, TENANT, out.effect_id, {"receipt_id": "ch_123", "ok": True})
    assert done.outcome == "committed"
    assert receipt(conn, out.effect_id) == ("committed", "ch_123", None)
    with pytest.raises(StaleEffect, match="committed"):
        ledger.commit_effect(conn, TENANT, out.effect_id, {})


def test_blocked_begin_leaves_unknown_visible_to_other_sessions(db_url):
    with psycopg.connect(db_url, autocommit=True) as a:
        instance = ledger.instance(a, TENANT)
        first = ledger.begin_effect(a, TENANT, instance, "charge", "http_request", PARAMS, 0)
    # "the process died": nothing settled the receipt. The same attempt begins again.
    with psycopg.connect(db_url, autocommit=True) as b:
        with pytest.raises(EffectBlocked, match="unknown") as info:
            ledger.begin_effect(b, TENANT, instance, "charge", "http_request", PARAMS, 0)
        assert info.value.outcome.effect_id == first.effect_id
    with psycopg.connect(db_url) as c:  # a separate session and transaction
        assert receipt(c, first.effect_id)[0] == "unknown"
        n = c.execute(
            "SELECT count(*) FROM orch8.effect_receipts WHERE instance_id = %s", (instance,)
        )
        assert n.fetchone()[0] == 1
        moves = c.execute(
            "SELECT from_state::text, to_state::text FROM orch8.effect_receipt_events"
            " WHERE receipt_id = %s ORDER BY event_id",
            (first.effect_id,),
        ).fetchall()
    assert moves == [
        (None, "planned"),
        ("planned", "prepared"),
        ("prepared", "dispatched"),
        ("dispatched", "unknown"),
    ]


def test_next_attempt_proceeds_after_unknown(conn):
    instance = ledger.instance(conn, TENANT)
    first = ledger.begin_effect(conn, TENANT, instance, "charge", "http_request", PARAMS, 0)
    ledger.mark_effect_unknown(conn, TENANT, first.effect_id, "503 Service Unavailable")
    second = ledger.begin_effect(conn, TENANT, instance, "charge", "http_request", PARAMS, 1)
    assert second.outcome == "dispatched" and second.effect_id != first.effect_id
    assert receipt(conn, first.effect_id) == ("unknown", None, "503 Service Unavailable")


def test_commit_guard_duplicate_raises_invariant_violation(conn):
    instance = ledger.instance(conn, TENANT)
    conn.execute(
        "SELECT orch8.declare_invariant(%s, 'one charge', %s, true, %s)",
        (TENANT, Jsonb({"type": "effect_at_most_once", "kind": "http"}), instance),
    )
    # without a key of its own each attempt sends under its receipt id: a new key, so the
    # identical content after an unknown outcome is a duplicate
    unkeyed = {k: v for k, v in PARAMS.items() if k != "idempotency_key"}
    first = ledger.begin_effect(conn, TENANT, instance, "charge", "http_request", unkeyed, 0)
    ledger.mark_effect_unknown(conn, TENANT, first.effect_id, "timeout")
    with pytest.raises(InvariantViolation) as info:
        ledger.begin_effect(conn, TENANT, instance, "charge", "http_request", unkeyed, 1)
    assert info.value.outcome.competing_effect_id == first.effect_id
    assert receipt(conn, info.value.outcome.effect_id)[0] == "prepared"
    # under the same key it is a replay the provider deduplicates, not a duplicate
    keyed = ledger.begin_effect(conn, TENANT, instance, "pay", "http_request", PARAMS, 0)
    ledger.mark_effect_unknown(conn, TENANT, keyed.effect_id, "timeout")
    again = ledger.begin_effect(conn, TENANT, instance, "pay", "http_request", PARAMS, 1)
    assert again.outcome == "dispatched" and again.idempotency_key == keyed.idempotency_key
    # different content is not a duplicate
    other = dict(PARAMS, json={"amount": 99})
    assert (
        ledger.begin_effect(conn, TENANT, instance, "refund", "http_request", other, 0).outcome
        == "dispatched"
    )


def test_abandon_not_applied_and_resolution(conn):
    instance = ledger.instance(conn, TENANT)
    out = ledger.begin_effect(conn, TENANT, instance, "charge", "payments.charge", PARAMS, 0)
    assert out.kind == "worker"
    with pytest.raises(InvalidInput):
        ledger.abandon_effect_not_applied(conn, TENANT, out.effect_id, {})
    done = ledger.abandon_effect_not_applied(
        conn, TENANT, out.effect_id, {"error": "connection refused", "bytes_sent": 0}
    )
    assert done.outcome == "abandoned"
    with pytest.raises(InvalidTransition):
        ledger.resolve_effect(
            conn, TENANT, out.effect_id, "committed", actor="alice", expected_state="abandoned"
        )

    second = ledger.begin_effect(conn, TENANT, instance, "charge", "payments.charge", PARAMS, 1)
    ledger.mark_effect_unknown(conn, TENANT, second.effect_id, "timeout")
    with pytest.raises(InvalidInput, match="needs evidence"):
        ledger.resolve_effect(conn, TENANT, second.effect_id, "abandoned", actor="alice")
    with pytest.raises(StaleEffect, match="reload before resolving"):
        ledger.resolve_effect(
            conn, TENANT, second.effect_id, "committed", actor="alice", expected_state="dispatched"
        )
    with pytest.raises(NotFound):
        ledger.resolve_effect(conn, TENANT, uuid.uuid4(), "committed", actor="alice")
    row = ledger.resolve_effect(
        conn,
        TENANT,
        second.effect_id,
        "committed",
        actor="alice",
        provider_receipt_id="ch_9",
        evidence={"dashboard": "charge ch_9 at 10:02"},
        expected_state="unknown",
    )
    assert (row["state"], row["provider_receipt_id"]) == ("committed", "ch_9")
    assert row["evidence"]["resolution"]["actor"] == "alice"
    event = conn.execute(
        "SELECT actor, to_state::text FROM orch8.effect_receipt_events WHERE receipt_id = %s"
        " ORDER BY event_id DESC LIMIT 1",
        (second.effect_id,),
    ).fetchone()
    assert event == ("alice", "committed")


def test_identity_mismatch_is_invalid_config(conn):
    instance = ledger.instance(conn, TENANT)
    out = ledger.begin_effect(conn, TENANT, instance, "charge", "http_request", PARAMS, 0)
    scope = effect_rules.continuity_id_for(instance)
    with pytest.raises(InvalidConfig, match="collided"), engine_errors():
        conn.execute(
            "SELECT orch8.ensure_effect_receipt(%s, %s, %s, 0, %s, 'charge', 0, 'http',"
            " 'http_request', %s, %s)",
            (TENANT, out.effect_id, scope, instance, "0" * 64, "f" * 64),
        )


def test_every_function_is_documented_and_commented(conn):
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "SQL_API.md").read_text()
    rows = conn.execute(
        "SELECT p.proname, obj_description(p.oid, 'pg_proc') FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'orch8'"
    ).fetchall()
    assert rows
    undocumented = sorted({name for name, _ in rows if f"orch8.{name}(" not in doc})
    uncommented = sorted({name for name, comment in rows if not comment})
    assert (undocumented, uncommented) == ([], [])
