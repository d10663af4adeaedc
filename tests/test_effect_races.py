"""Races on the effect ledger, with real concurrent sessions released by a barrier.

Each race runs many rounds; no test waits by sleeping: where one session must be
blocked behind another, the test watches pg_stat_activity for its lock wait.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests import ledger

TENANT = "race"
SESSIONS = 16
ROUNDS = 50
PARAMS = {"url": "https://pay.example/charge", "json": {"amount": 500}}


@pytest.fixture
def sessions(db_url):
    conns = [psycopg.connect(db_url, autocommit=True) for _ in range(SESSIONS)]
    yield conns
    for c in conns:
        c.close()


def race(conns, call):
    """Run call(conn, i) in every session at once; return the results in session order."""
    barrier = threading.Barrier(len(conns))

    def one(i):
        barrier.wait(timeout=30)
        return call(conns[i], i)

    with ThreadPoolExecutor(len(conns)) as pool:
        return list(pool.map(one, range(len(conns))))


def begin(conn, instance, block, attempt):
    return conn.execute(
        "SELECT outcome, effect_id FROM orch8.begin_effect(%s, %s, %s, 'http_request', %s, %s)",
        (TENANT, instance, block, Jsonb(PARAMS), attempt),
    ).fetchone()


def test_same_attempt_from_16_sessions_dispatches_once(sessions):
    check = sessions[0]
    for _ in range(ROUNDS):
        instance = ledger.instance(check, TENANT)
        results = race(sessions, lambda c, _i, inst=instance: begin(c, inst, "charge", 0))
        outcomes = Counter(outcome for outcome, _ in results)
        assert outcomes == {"dispatched": 1, "blocked": SESSIONS - 1}, outcomes
        assert len({effect_id for _, effect_id in results}) == 1
        n_receipts, n_scopes = check.execute(
            "SELECT (SELECT count(*) FROM orch8.effect_receipts WHERE instance_id = %s),"
            " (SELECT count(*) FROM orch8.continuity_executions WHERE current_instance_id = %s)",
            (instance, instance),
        ).fetchone()
        assert (n_receipts, n_scopes) == (1, 1)


def test_same_content_under_commit_guard_dispatches_once(sessions):
    check = sessions[0]
    for _ in range(ROUNDS):
        instance = ledger.instance(check, TENANT)
        check.execute(
            "SELECT orch8.declare_invariant(%s, 'charge once', %s, true, %s)",
            (TENANT, Jsonb({"type": "effect_at_most_once", "kind": "http"}), instance),
        )
        # The scope exists already, so nothing but the guard serialises the sessions.
        check.execute("SELECT orch8.ensure_effect_scope(%s, %s)", (TENANT, instance))
        # each session is a different attempt: different receipts, identical content
        results = race(sessions, lambda c, i, inst=instance: begin(c, inst, "charge", i))
        outcomes = Counter(outcome for outcome, _ in results)
        assert outcomes == {"dispatched": 1, "duplicate": SESSIONS - 1}, outcomes
        states = Counter(
            state
            for (state,) in check.execute(
                "SELECT state::text FROM orch8.effect_receipts WHERE instance_id = %s", (instance,)
            )
        )
        assert states == {"dispatched": 1, "prepared": SESSIONS - 1}, states
        results_by_status = dict(
            check.execute(
                "SELECT status, count(*) FROM orch8.invariant_results WHERE instance_id = %s"
                " GROUP BY status",
                (instance,),
            ).fetchall()
        )
        assert results_by_status == {"pass": 1, "fail": 1}, results_by_status


def wait_until_blocked(observer, pid, timeout=10.0):
    """Poll until backend `pid` waits on a lock (a condition, not a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = observer.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row and row[0] == "Lock":
            return
        time.sleep(0.005)
    raise AssertionError(f"backend {pid} never blocked on a lock")


def test_lost_cas_reports_the_current_state_and_is_not_retried(db_url):
    with (
        psycopg.connect(db_url, autocommit=True) as setup,
        psycopg.connect(db_url) as winner,
        psycopg.connect(db_url, autocommit=True) as loser,
    ):
        for _ in range(ROUNDS):
            instance = ledger.instance(setup, TENANT)
            out = ledger.begin_effect(setup, TENANT, instance, "charge", "http_request", PARAMS, 0)
            # The winner moves the receipt and holds its row lock...
            assert winner.execute(
                "SELECT orch8.cas_effect_receipt(%s, %s, 'dispatched', 'unknown')",
                (TENANT, out.effect_id),
            ).fetchone()[0]
            # ...while the loser tries to commit the same receipt and has to wait.
            result = {}
            t = threading.Thread(
                target=lambda eid=out.effect_id, result=result: result.update(
                    row=loser.execute(
                        "SELECT outcome, state::text FROM orch8.commit_effect(%s, %s, '{}')",
                        (TENANT, eid),
                    ).fetchone()
                )
            )
            t.start()
            wait_until_blocked(setup, loser.info.backend_pid)
            winner.commit()
            t.join(timeout=10)
            assert result["row"] == ("stale", "unknown")
            moves = setup.execute(
                "SELECT count(*) FROM orch8.effect_receipt_events"
                " WHERE receipt_id = %s AND from_state = 'dispatched'",
                (out.effect_id,),
            ).fetchone()[0]
            assert moves == 1  # the loser wrote nothing and did not try again
