"""Instances and lease-fenced claiming, against a real PostgreSQL with real sessions."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg.types.json import Jsonb

from orch8_py.errors import InvalidInput, InvalidTransition, NotFound, StaleLease
from orch8_py.sqlapi.base import engine_errors

TENANT = "t1"


@pytest.fixture
def sequence_id(conn):
    return conn.execute(
        "INSERT INTO orch8.sequences (tenant_id, name, version, definition)"
        " VALUES (%s, 'flow', 1, %s) RETURNING id",
        (TENANT, Jsonb({"blocks": [{"type": "step", "id": "a", "handler": "noop"}]})),
    ).fetchone()[0]


def create(conn, sequence_id, **kw):
    with engine_errors():
        return conn.execute(
            "SELECT id, state::text, deduplicated FROM orch8.create_instance("
            "%s, %s, %s, '{}', %s, %s, %s)",
            (
                TENANT,
                sequence_id,
                Jsonb(kw.get("data", {})),
                kw.get("priority", 0),
                kw.get("key"),
                kw.get("fire_at"),
            ),
        ).fetchone()


def claim(conn, worker, batch=10, lease="30 seconds"):
    return conn.execute(
        "SELECT instance_id AS id, lease_token FROM orch8.claim_due_nodes(%s, %s, %s::interval)",
        (worker, batch, lease),
    ).fetchall()


def test_create_with_idempotency_key_returns_the_same_instance(conn, sequence_id):
    first = create(conn, sequence_id, key="order-7")
    again = create(conn, sequence_id, key="order-7", data={"other": True})
    assert first[1:] == ("scheduled", False)
    assert again == (first[0], "scheduled", True)
    audit = conn.execute(
        "SELECT from_state, to_state::text, actor FROM orch8.instance_transitions"
        " WHERE instance_id = %s",
        (first[0],),
    ).fetchall()
    assert audit == [(None, "scheduled", "create")]


def test_create_rejects_oversize_context_and_unknown_sequence(conn, sequence_id):
    conn.execute("SET orch8.max_context_bytes = 1000")
    with pytest.raises(InvalidInput, match="over the limit of 1000 bytes"):
        create(conn, sequence_id, data={"blob": "x" * 1000})
    with pytest.raises(NotFound):
        create(conn, uuid.uuid4())
    assert conn.execute("SELECT count(*) FROM orch8.task_instances").fetchone()[0] == 0


def test_claim_order_priority_then_time(conn, sequence_id):
    low = create(conn, sequence_id, priority=0)[0]
    high = create(conn, sequence_id, priority=5)[0]
    future = create(conn, sequence_id, priority=9, fire_at="2999-01-01T00:00:00Z")[0]
    claimed = [row[0] for row in claim(conn, "w1")]
    assert claimed == [high, low]
    assert future not in claimed


def test_claim_uses_the_partial_index(conn, sequence_id):
    for _ in range(50):
        create(conn, sequence_id)
    conn.execute("ANALYZE orch8.task_instances")
    conn.execute("ANALYZE orch8.execution_nodes")
    plan = "\n".join(
        r[0]
        for r in conn.execute(  # the due nodes, as orch8.claim_due_nodes selects them
            "EXPLAIN SELECT n.tenant_id, n.instance_id, n.path FROM orch8.execution_nodes AS n"
            " JOIN orch8.task_instances AS t ON t.tenant_id = n.tenant_id AND t.id = n.instance_id"
            " WHERE n.state = 'ready' AND n.next_fire_at <= orch8.now()"
            " AND t.state IN ('scheduled', 'running', 'waiting')"
            " AND t.requested_state IS DISTINCT FROM 'paused'"
            " ORDER BY n.priority DESC, n.next_fire_at LIMIT 10 FOR UPDATE OF n, t SKIP LOCKED"
        )
    )
    assert "execution_nodes_ready_idx" in plan, plan


def test_concurrent_claimers_never_share_an_instance(db_url, conn, sequence_id):
    workers = 4
    sessions = [psycopg.connect(db_url, autocommit=True) for _ in range(workers)]
    try:
        for _round in range(10):
            ids = {create(conn, sequence_id)[0] for _ in range(60)}
            barrier = threading.Barrier(workers)

            def drain(i, barrier=barrier):
                barrier.wait(timeout=30)
                got = []
                while batch := claim(sessions[i], f"w{i}", batch=7):
                    got.extend(row[0] for row in batch)
                return got

            with ThreadPoolExecutor(workers) as pool:
                results = list(pool.map(drain, range(workers)))
            claimed = [i for r in results for i in r]
            assert len(claimed) == len(set(claimed)), "an instance was claimed twice"
            assert set(claimed) == ids
    finally:
        for s in sessions:
            s.close()


def test_stale_token_is_rejected_after_the_lease_is_reclaimed(db_url, conn, sequence_id):
    instance = create(conn, sequence_id)[0]
    [(_, old_token)] = claim(conn, "w-old", lease="30 seconds")
    with psycopg.connect(db_url, autocommit=True) as later:
        later.execute("SET orch8.fake_now = '2999-01-01 00:00:00+00'")  # the lease has expired
        assert (
            later.execute(
                "SELECT orch8.heartbeat_leases(%s, '30 seconds')", ([old_token],)
            ).fetchall()
            == []
        )
        [(again, new_token)] = claim(later, "w-new")
        assert again == instance and new_token != old_token
        later.execute("RESET orch8.fake_now")
        later.execute(
            "SELECT orch8.heartbeat_leases(%s, '300 years')", ([new_token],)
        )  # keep it valid at real time
    with pytest.raises(StaleLease), engine_errors():
        conn.execute(
            "SELECT orch8.append_block_output(%s, %s, %s, 'a', 0, NULL, '{}')",
            (TENANT, instance, old_token),
        )
    conn.execute(
        "SELECT orch8.append_block_output(%s, %s, %s, 'a', 0, NULL, '{}')",
        (TENANT, instance, new_token),
    )
    audit = conn.execute(
        "SELECT to_state::text, actor FROM orch8.instance_transitions WHERE instance_id = %s"
        " ORDER BY seq",
        (instance,),
    ).fetchall()
    assert audit == [
        ("scheduled", "create"),
        ("running", "w-old"),
        ("scheduled", "lease-sweep"),
        ("running", "w-new"),
    ]


def test_heartbeat_extends_held_leases_only(conn, sequence_id):
    for _ in range(3):
        create(conn, sequence_id)
    tokens = [tok for _, tok in claim(conn, "w1", lease="5 seconds")]
    held = {
        r[0]
        for r in conn.execute(
            "SELECT orch8.heartbeat_leases(%s, '60 seconds')", ([*tokens, uuid.uuid4()],)
        )
    }
    assert held == set(tokens)
    remaining = conn.execute(
        "SELECT min(lease_expires_at - orch8.now()) FROM orch8.execution_nodes"
    ).fetchone()[0]
    assert 55 < remaining.total_seconds() <= 60  # was 5 s before the heartbeat


def test_release_and_illegal_transitions(conn, sequence_id):
    instance = create(conn, sequence_id)[0]
    [(_, token)] = claim(conn, "w1")
    conn.execute("SELECT orch8.release_lease(%s, %s, %s)", (TENANT, instance, token))
    row = conn.execute(
        "SELECT t.state::text, n.state::text, n.lease_token FROM orch8.task_instances AS t"
        " JOIN orch8.execution_nodes AS n ON n.instance_id = t.id AND n.path = 'a'"
        " WHERE t.id = %s",
        (instance,),
    ).fetchone()
    assert row == ("scheduled", "ready", None)
    with pytest.raises(StaleLease), engine_errors():
        conn.execute("SELECT orch8.release_lease(%s, %s, %s)", (TENANT, instance, token))
    with pytest.raises(InvalidTransition), engine_errors():
        conn.execute(
            "SELECT orch8.transition_instance(%s, %s, 'completed', 'running', 'x')",
            (TENANT, instance),
        )
    # a CAS from the wrong state loses and changes nothing
    lost = conn.execute(
        "SELECT orch8.transition_instance(%s, %s, 'paused', 'scheduled', 'x')", (TENANT, instance)
    ).fetchone()[0]
    assert lost is False


@pytest.mark.parametrize(
    "rows, expected",
    [
        ([], 0),
        ([(0, "__in_progress__")], 0),
        ([(0, "__retry__")], 1),
        ([(0, "__retry__"), (1, "__in_progress__")], 1),
        ([(0, "__retry__"), (1, "__error__")], 2),
        ([(0, None)], 1),
    ],
)
def test_compute_attempt(conn, sequence_id, rows, expected):
    instance = create(conn, sequence_id)[0]
    [(_, token)] = claim(conn, "w1")
    for attempt, sentinel in rows:
        conn.execute(
            "SELECT orch8.append_block_output(%s, %s, %s, 'a', %s, %s, '{}', %s)",
            (
                TENANT,
                instance,
                token,
                attempt,
                sentinel,
                False if sentinel == "__error__" else None,
            ),
        )
    got = conn.execute("SELECT orch8.compute_attempt(%s, %s, 'a')", (TENANT, instance)).fetchone()[
        0
    ]
    assert got == expected


def test_sequence_declared_commit_guard_covers_its_instances(conn, sequence_id):
    conn.execute(
        "SELECT orch8.declare_invariant(%s, 'charge once', %s, true,"
        " p_sequence_id => %s, p_sequence_version => 1)",
        (TENANT, Jsonb({"type": "effect_at_most_once", "kind": "http"}), sequence_id),
    )
    instance = create(conn, sequence_id)[0]
    params = Jsonb({"url": "https://pay.example/charge"})
    outcomes = [
        conn.execute(
            "SELECT outcome FROM orch8.begin_effect(%s, %s, %s, 'http_request', %s, 0)",
            (TENANT, instance, block, params),
        ).fetchone()[0]
        for block in ("charge", "charge_again")
    ]
    assert outcomes == ["dispatched", "duplicate"]
    # another version of the sequence is not covered by a version-1 declaration
    v2 = conn.execute(
        "INSERT INTO orch8.sequences (tenant_id, name, version, definition)"
        " VALUES (%s, 'flow', 2, '{}') RETURNING id",
        (TENANT,),
    ).fetchone()[0]
    other = create(conn, v2)[0]
    guards = conn.execute(
        "SELECT count(*) FROM orch8.effect_commit_guards(%s, %s, 'http')", (TENANT, other)
    ).fetchone()[0]
    assert guards == 0


def test_heartbeat_keeps_a_lease_handed_over_while_it_waited(db_url, conn):
    """A heartbeat that waits on a node's lock while the step's finish hands the lease
    over to the instance's next node must extend the lease on that next node (its
    second pass), not report it lost. Real sessions: the finish holds its locks until
    the heartbeat is seen waiting on them, then commits."""
    from tests.runner_helpers import make_sequence

    seq = make_sequence(conn, [{"type": "step", "id": s, "handler": "noop"} for s in ("a", "b")])
    for round_ in range(5):
        instance = create(conn, seq)[0]
        token = conn.execute(
            "SELECT lease_token FROM orch8.claim_due_nodes('w', 1, '5 seconds')"
            " WHERE instance_id = %s",
            (instance,),
        ).fetchone()[0]
        with (
            psycopg.connect(db_url) as finisher,
            psycopg.connect(db_url, autocommit=True) as beat,
        ):
            beat_pid = beat.info.backend_pid
            finisher.execute(
                "SELECT orch8.finish_step(%s, %s, %s, 'a', 0, NULL, 'ok', '{}')",
                (TENANT, instance, token),
            )  # not committed: it holds node a and the handed-over node b
            held: list = []

            def heartbeat(beat=beat, token=token, held=held):
                held.extend(
                    r[0]
                    for r in beat.execute(
                        "SELECT orch8.heartbeat_leases(%s, '10 minutes')", ([token],)
                    )
                )

            thread = threading.Thread(target=heartbeat)
            thread.start()
            # the barrier: the heartbeat is waiting on the finisher's lock
            for _ in range(500):
                waiting = conn.execute(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                    (beat_pid,),
                ).fetchone()[0]
                if waiting:
                    break
                threading.Event().wait(0.01)
            assert waiting, f"round {round_}: the heartbeat never waited on the finish"
            finisher.commit()
            thread.join(timeout=30)
        assert held == [token], f"round {round_}: the handed-over lease was reported lost"
        lease = conn.execute(
            "SELECT path, extract(epoch FROM lease_expires_at - orch8.now())"
            " FROM orch8.execution_nodes WHERE lease_token = %s",
            (token,),
        ).fetchone()
        assert lease[0] != "" and 590 < lease[1] <= 600, lease
