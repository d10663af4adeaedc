"""begin_step / finish_step: the runner's two calls around a step, fenced by the lease."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from orch8_py.errors import StaleLease
from orch8_py.sqlapi.base import engine_errors

TENANT = "t1"
PARAMS = Jsonb({"url": "https://pay.example/charge", "json": {"amount": 10}})


@pytest.fixture
def claimed(conn):
    """A running instance of a sequence of two steps (charge, ship) and its lease token.
    charge resends after an ambiguous outcome when asked to (retry_in), as a new attempt."""
    blocks = [{"id": "charge", "retry": {"on_ambiguous": "new_attempt"}}, {"id": "ship"}]
    seq = conn.execute(
        "INSERT INTO orch8.sequences (tenant_id, name, version, definition)"
        " VALUES (%s, 'flow', 1, %s) RETURNING id",
        (TENANT, Jsonb({"blocks": blocks})),
    ).fetchone()[0]
    instance = conn.execute(
        "SELECT id FROM orch8.create_instance(%s, %s)", (TENANT, seq)
    ).fetchone()[0]
    token = conn.execute(
        "SELECT lease_token FROM orch8.claim_due_nodes('w1', 1, '30 seconds')"
    ).fetchone()[0]
    return instance, token


def begin(conn, instance, token, attempt=0, block="charge", handler="http_request"):
    with engine_errors():
        return conn.execute(
            "SELECT outcome, effect_id, state::text, detail FROM orch8.begin_step("
            "%s, %s, %s, %s, %s, %s, %s)",
            (TENANT, instance, token, block, handler, PARAMS, attempt),
        ).fetchone()


def finish(conn, instance, token, effect_id, result, output=None, block="charge", **kw):
    """finish_step's answer: (state, next block, its attempt)."""
    with engine_errors():
        return conn.execute(
            "SELECT state::text, next_block, next_attempt FROM orch8.finish_step("
            "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                TENANT,
                instance,
                token,
                block,
                kw.get("attempt", 0),
                effect_id,
                result,
                Jsonb(output or {}),
                kw.get("error"),
                kw.get("retry_in"),
            ),
        ).fetchone()


def instance_state(conn, instance):
    return conn.execute(
        "SELECT state::text, error FROM orch8.task_instances WHERE id = %s", (instance,)
    ).fetchone()


def receipt_state(conn, effect_id):
    return conn.execute(
        "SELECT state::text, provider_receipt_id FROM orch8.effect_receipts WHERE id = %s",
        (effect_id,),
    ).fetchone()


def sentinels(conn, instance):
    return [
        r[0]
        for r in conn.execute(
            "SELECT coalesce(sentinel, 'output') FROM orch8.block_outputs"
            " WHERE instance_id = %s ORDER BY seq",
            (instance,),
        )
    ]


def test_success_commits_and_completes(conn, claimed):
    instance, token = claimed
    _, first, _, _ = begin(conn, instance, token)
    assert finish(conn, instance, token, first, "ok", {"receipt_id": "ch_0"}) == (
        "running",
        "ship",
        0,
    )  # the next step is handed over under the same lease
    outcome, effect_id, state, _ = begin(conn, instance, token, block="ship")
    assert (outcome, state) == ("dispatched", "dispatched")
    assert sentinels(conn, instance) == ["__in_progress__", "output", "__in_progress__"]
    done = finish(conn, instance, token, effect_id, "ok", {"receipt_id": "ch_1"}, block="ship")
    assert done == ("completed", None, None)
    assert receipt_state(conn, effect_id) == ("committed", "ch_1")
    assert sentinels(conn, instance)[-1] == "output"
    assert instance_state(conn, instance) == ("completed", None)


def test_a_lease_is_for_its_node_only(conn, claimed):
    instance, token = claimed
    with pytest.raises(StaleLease):  # the lease holds charge, not ship
        begin(conn, instance, token, block="ship")


def test_next_block_keeps_the_instance_running(conn, claimed):
    instance, token = claimed
    _, effect_id, _, _ = begin(conn, instance, token)
    assert finish(conn, instance, token, effect_id, "ok") == ("running", "ship", 0)
    row = conn.execute(
        "SELECT state::text, current_block FROM orch8.task_instances WHERE id = %s", (instance,)
    ).fetchone()
    assert row == ("running", "ship")


def test_crash_after_dispatch_blocks_and_fails_durably(db_url, conn, claimed):
    instance, _old_token = claimed
    _, effect_id, _, _ = begin(conn, instance, _old_token)
    # the runner dies here; its lease expires and another runner claims the instance
    with psycopg.connect(db_url, autocommit=True) as other:
        other.execute("SET orch8.fake_now = '2999-01-01 00:00:00+00'")
        token = other.execute(
            "SELECT lease_token FROM orch8.claim_due_nodes('w2', 1, '30 seconds')"
        ).fetchone()[0]
        attempt = other.execute(
            "SELECT orch8.compute_attempt(%s, %s, 'charge')", (TENANT, instance)
        ).fetchone()[0]
        assert attempt == 0  # __in_progress__ resumes the same attempt
        outcome, same_id, state, _ = begin(other, instance, token, attempt)
        assert (outcome, same_id, state) == ("blocked", effect_id, "unknown")
    with psycopg.connect(db_url) as fresh:  # the trace survived: another session sees it
        assert receipt_state(fresh, effect_id)[0] == "unknown"
        state, error = instance_state(fresh, instance)
        assert state == "failed" and error.startswith("EffectBlocked")
        # settled first: the same attempt stays on the receipt until someone says what happened
        assert sentinels(fresh, instance) == ["__in_progress__", "__unsettled__"]


def test_retryable_error_marks_unknown_and_schedules_next_attempt(conn, claimed):
    instance, token = claimed
    _, first, _, _ = begin(conn, instance, token)
    state = finish(conn, instance, token, first, "error", error="503", retry_in="0 seconds")
    assert state == ("scheduled", None, None)
    assert receipt_state(conn, first)[0] == "unknown"
    attempt = conn.execute(
        "SELECT orch8.compute_attempt(%s, %s, 'charge')", (TENANT, instance)
    ).fetchone()[0]
    assert attempt == 1
    token = conn.execute(
        "SELECT lease_token FROM orch8.claim_due_nodes('w1', 1, '30 seconds')"
    ).fetchone()[0]
    outcome, second, _, _ = begin(conn, instance, token, attempt=1)
    assert outcome == "dispatched" and second != first


def test_permanent_error_and_not_applied(conn, claimed):
    instance, token = claimed
    _, effect_id, _, _ = begin(conn, instance, token)
    state = finish(
        conn,
        instance,
        token,
        effect_id,
        "not_applied",
        {"error": "connection refused"},
        error="connection refused",
    )
    assert state == ("failed", None, None)
    assert receipt_state(conn, effect_id)[0] == "abandoned"
    assert sentinels(conn, instance) == ["__in_progress__", "__error__"]


def test_stale_lease_writes_nothing(conn, claimed):
    instance, token = claimed
    _, effect_id, _, _ = begin(conn, instance, token)
    with pytest.raises(StaleLease):
        finish(conn, instance, uuid.uuid4(), effect_id, "ok", {"receipt_id": "late"})
    assert receipt_state(conn, effect_id) == ("dispatched", None)
    assert sentinels(conn, instance) == ["__in_progress__"]


def test_duplicate_under_guard_fails_with_invariant_violation(conn, claimed):
    instance, token = claimed
    conn.execute(
        "SELECT orch8.declare_invariant(%s, 'once', %s, true, %s)",
        (TENANT, Jsonb({"type": "effect_at_most_once", "kind": "http"}), instance),
    )
    _, effect_id, _, _ = begin(conn, instance, token)
    assert finish(conn, instance, token, effect_id, "ok") == ("running", "ship", 0)
    outcome, _, state, _ = begin(conn, instance, token, block="ship")
    assert (outcome, state) == ("duplicate", "prepared")
    state, error = instance_state(conn, instance)
    assert state == "failed" and error.startswith("InvariantViolation")


def test_pure_handler_writes_nothing_before_it_runs(conn, claimed):
    instance, token = claimed
    assert begin(conn, instance, token, handler="transform") == (None, None, None, None)
    assert sentinels(conn, instance) == []


def test_repeating_begin_and_finish_under_the_same_lease_is_safe(conn, claimed):
    """A runner whose connection dropped after the server committed asks again."""
    instance, token = claimed
    first = begin(conn, instance, token)
    again = begin(conn, instance, token)
    assert again[:3] == first[:3] == ("dispatched", first[1], "dispatched")
    assert sentinels(conn, instance) == ["__in_progress__"]
    done = finish(conn, instance, token, first[1], "ok", {"receipt_id": "r1"})
    assert done == ("running", "ship", 0)
    assert finish(conn, instance, token, first[1], "ok", {"receipt_id": "r1"}) == done
    assert sentinels(conn, instance) == ["__in_progress__", "output"]
    assert receipt_state(conn, first[1]) == ("committed", "r1")


def test_a_different_lease_repeating_begin_is_blocked(conn, claimed):
    instance, token = claimed
    _, effect_id, _, _ = begin(conn, instance, token)
    conn.execute("SELECT orch8.release_lease(%s, %s, %s)", (TENANT, instance, token))
    new_token = conn.execute(
        "SELECT lease_token FROM orch8.claim_due_nodes('w2', 1, '30 seconds')"
    ).fetchone()[0]
    outcome, same, state, _ = begin(conn, instance, new_token)
    assert (outcome, same, state) == ("blocked", effect_id, "unknown")
