"""Group commit (orch8.begin_steps, orch8.finish_steps, orch8_py/group_commit.py), against
a real PostgreSQL: a batch is one transaction whose calls each keep begin_step's and
finish_step's own semantics (a refused call undoes only itself), and a busy runner sends
many steps per round trip while every receipt is still written before its dispatch."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from orch8_py import rules, sqlapi
from orch8_py.errors import InvalidInput, StaleLease
from orch8_py.handlers import handler
from orch8_py.sqlapi.steps import BeginCall, FinishCall, Outcome
from tests.runner_helpers import TENANT, make_sequence, running, start, wait_for

SEEN: dict[str, str] = {}  # effect id -> the receipt's state the handler saw
SEEN_LOCK = threading.Lock()


@handler("test.group.charge")
def charge(params, ctx):
    # the receipt must be committed (durable, visible to another session) before this runs
    with ctx.state.connection() as c:  # another session: it sees only committed rows
        state = c.execute(
            "SELECT state::text FROM orch8.effect_receipts WHERE id = %s", (ctx.effect_id,)
        ).fetchone()
    with SEEN_LOCK:
        SEEN[str(ctx.effect_id)] = state[0] if state else "missing"
    return {"receipt_id": f"ch-{ctx.effect_id}"}


def claim(conn, n):
    return conn.execute(
        "SELECT instance_id, lease_token FROM orch8.claim_due_nodes('t', %s, '1 minute')", (n,)
    ).fetchall()


def begin(instance, token, block="a"):
    return BeginCall(TENANT, instance, token, block, "test.group.charge", {"n": 1}, 0)


def test_one_refused_call_leaves_the_rest_of_the_batch(conn):
    seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "test.group.charge"}])
    for _ in range(3):
        start(conn, seq, {})
    rows = claim(conn, 3)
    calls = [begin(i, t) for i, t in rows]
    calls[1] = begin(rows[1][0], uuid.uuid4())  # a lease this caller does not hold
    answers = sqlapi.steps.begin_steps(conn, calls)
    assert isinstance(answers[0], Outcome) and answers[0].outcome == "dispatched"
    assert isinstance(answers[1], StaleLease)
    assert answers[2].outcome == "dispatched"
    states = dict(
        conn.execute(
            "SELECT instance_id, state::text FROM orch8.effect_receipts WHERE tenant_id = %s",
            (TENANT,),
        ).fetchall()
    )
    assert states == {rows[0][0]: "dispatched", rows[2][0]: "dispatched"}

    finishes = [
        FinishCall(TENANT, i, t, "a", 0, a.effect_id, "ok", {"receipt_id": "p-1"})
        for (i, t), a in zip([rows[0], rows[2]], [answers[0], answers[2]], strict=True)
    ]
    finishes.insert(1, FinishCall(TENANT, rows[1][0], rows[1][1], "a", 0, None, "nonsense", {}))
    done = sqlapi.steps.finish_steps(conn, finishes)
    assert [getattr(d, "state", None) for d in done] == ["completed", None, "completed"]
    assert isinstance(done[1], InvalidInput)
    receipts = conn.execute(
        "SELECT state::text, provider_receipt_id FROM orch8.effect_receipts WHERE tenant_id = %s",
        (TENANT,),
    ).fetchall()
    assert receipts == [("committed", "p-1")] * 2


def test_a_batch_is_bounded_in_sql(conn):
    calls = [begin(uuid.uuid4(), uuid.uuid4())] * (rules.LIMITS["step_batch"] + 1)
    with pytest.raises(InvalidInput, match="over the limit step_batch"):
        sqlapi.steps.begin_steps(conn, calls)


def test_a_busy_runner_batches_and_every_receipt_is_durable_before_its_dispatch(db_url, conn):
    SEEN.clear()
    seq = make_sequence(
        conn, [{"type": "step", "id": f"s{i}", "handler": "test.group.charge"} for i in range(2)]
    )
    made = sqlapi.instances.create_instances(conn, tenant_id=TENANT, sequence_id=seq, count=300)
    assert made == 300
    with running(db_url, concurrency=24) as r:
        ids = [i for (i,) in conn.execute("SELECT id FROM orch8.task_instances").fetchall()]
        done = wait_for(conn, ids, timeout=120)
        begins, finishes = r.begins, r.finishes
        assert begins is not None and finishes is not None
        batched = (begins.calls, begins.batches, finishes.calls, finishes.batches)
    assert {s for s, _ in done.values()} == {"completed"}
    assert batched[0] == batched[2] == 600
    # calls really shared transactions: fewer batches than calls, each kind
    assert batched[1] < 600 and batched[3] < 600, batched
    # the handler saw its receipt dispatched and committed, from another session
    assert len(SEEN) == 600 and set(SEEN.values()) == {"dispatched"}
    events = conn.execute(
        "SELECT array_agg(e.to_state::text ORDER BY e.event_id) FROM orch8.effect_receipt_events"
        " AS e GROUP BY e.receipt_id"
    ).fetchall()
    assert {tuple(e) for (e,) in events} == {("planned", "prepared", "dispatched", "committed")}
    # the receipts' one update (dispatched -> committed) changes no indexed column: HOT,
    # as long as its page has room (the runner's sessions reported their counts on exit)
    updates = hot = 0
    for _ in range(50):
        # the partitions' counts: a partitioned parent keeps none of its own
        updates, hot = conn.execute(
            "SELECT coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0)"
            " FROM pg_stat_user_tables WHERE relid IN (SELECT inhrelid FROM pg_inherits"
            " WHERE inhparent = 'orch8.effect_receipts'::regclass)"
        ).fetchone()
        if updates >= 600:
            break
        time.sleep(0.1)
    print(f"receipt updates: {updates}, HOT: {hot}")
    assert updates == 600 and hot >= 300, (updates, hot)
