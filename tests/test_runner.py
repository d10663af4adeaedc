"""The runner in-process against a real PostgreSQL: steps, templates, retries, failures,
and the two-round-trip budget of a guarded step."""

from __future__ import annotations

import re
import sys
import threading
import time

import psycopg
import pytest

from orch8_py.handlers import StepError, handler
from orch8_py.runner import Runner, Settings
from tests.runner_helpers import (
    TENANT,
    make_sequence,
    running,
    start,
    store_sequence,
    wait_for,
    wait_until,
)

CALLS: list[tuple] = []
FAIL_FIRST: dict[str, int] = {}


@handler("test.charge")
def charge(params, ctx):
    CALLS.append((ctx.instance_id, ctx.block_id, ctx.attempt, ctx.effect_id, params))
    remaining = FAIL_FIRST.get(str(ctx.instance_id), 0)
    if remaining:
        FAIL_FIRST[str(ctx.instance_id)] = remaining - 1
        raise StepError("provider said 503", code="503")
    return {"receipt_id": f"r-{ctx.block_id}-{ctx.attempt}", "amount": params.get("amount")}


@handler("test.permanent")
def permanent(params, ctx):
    raise StepError("card declined", code="card_declined")


HUNG: list = []  # effect ids of test.hang calls that started
RELEASE = threading.Event()


@handler("test.hang")
def hang(params, ctx):
    HUNG.append(ctx.effect_id)
    RELEASE.wait(30)
    return {"receipt_id": "late"}


@pytest.fixture
def runner(db_url):
    with running(db_url) as r:
        yield r


def test_three_steps_with_templates_complete(conn, runner):
    seq = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "charge",
                "handler": "test.charge",
                "params": {"amount": "{{ data.amount }}", "note": "order {{ data.order }}"},
            },
            {"type": "step", "id": "log", "handler": "noop"},
            {
                "type": "step",
                "id": "confirm",
                "handler": "test.charge",
                "params": {
                    "amount": "{{ outputs.charge.amount }}",
                    "ref": "{{ outputs.charge.receipt_id }}",
                },
            },
        ],
    )
    ids = [start(conn, seq, {"amount": 100 + i, "order": i}) for i in range(10)]
    assert set(wait_for(conn, ids).values()) == {("completed", None)}
    receipts = conn.execute(
        "SELECT block_id, state::text, provider_receipt_id, id FROM orch8.effect_receipts"
        " WHERE instance_id = %s ORDER BY created_at, block_id",
        (ids[0],),
    ).fetchall()
    assert [(b, s, p) for b, s, p, _ in receipts] == [
        ("charge", "committed", "r-charge-0"),
        ("confirm", "committed", "r-confirm-0"),
    ]
    calls = [c for c in CALLS if c[0] == ids[0]]
    assert calls[0][4] == {"amount": 100, "note": "order 0"}  # a lone placeholder keeps its type
    assert calls[1][4] == {"amount": 100, "ref": "r-charge-0"}
    assert {c[3] for c in calls} == {r[3] for r in receipts}  # handlers got their effect ids
    noop_receipts = conn.execute(
        "SELECT count(*) FROM orch8.effect_receipts WHERE block_id = 'log'"
    ).fetchone()[0]
    assert noop_receipts == 0


def test_retryable_error_then_success(conn, runner):
    seq = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "charge",
                "handler": "test.charge",
                "params": {"amount": 1},
                # an error of a side-effecting step is ambiguous: resent only when asked
                "retry": {
                    "max_attempts": 3,
                    "initial_backoff": 10,
                    "max_backoff": 20,
                    "on_ambiguous": "new_attempt",
                },
            }
        ],
    )
    instance = start(conn, seq, {})
    FAIL_FIRST[str(instance)] = 1
    assert wait_for(conn, [instance])[instance] == ("completed", None)
    receipts = conn.execute(
        "SELECT attempt, state::text FROM orch8.effect_receipts WHERE instance_id = %s"
        " ORDER BY attempt",
        (instance,),
    ).fetchall()
    assert receipts == [(0, "unknown"), (1, "committed")]
    sentinels = conn.execute(
        "SELECT coalesce(sentinel, 'output') FROM orch8.block_outputs WHERE instance_id = %s"
        " ORDER BY seq",
        (instance,),
    ).fetchall()
    assert [s for (s,) in sentinels] == [
        "__in_progress__",
        "__retry__",
        "__in_progress__",
        "output",
    ]


def test_non_retryable_code_and_exhausted_attempts_fail(conn, runner):
    seq = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "charge",
                "handler": "test.permanent",
                "retry": {
                    "max_attempts": 5,
                    "initial_backoff": 10,
                    "non_retryable_codes": ["card_declined"],
                },
            }
        ],
    )
    declined = start(conn, seq, {})
    seq2 = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "charge",
                "handler": "test.charge",
                "retry": {
                    "max_attempts": 2,
                    "initial_backoff": 10,
                    "max_backoff": 10,
                    "on_ambiguous": "new_attempt",
                },
            }
        ],
    )
    exhausted = start(conn, seq2, {})
    FAIL_FIRST[str(exhausted)] = 5
    states = wait_for(conn, [declined, exhausted])
    assert states[declined] == ("failed", "card declined")
    assert states[exhausted] == ("failed", "provider said 503")
    attempts = conn.execute(
        "SELECT count(*) FROM orch8.effect_receipts WHERE instance_id = %s", (exhausted,)
    ).fetchone()[0]
    assert attempts == 2


def test_unregistered_handler_and_bad_template_fail_clearly(conn, runner):
    seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "nobody.registered.this"}])
    seq2 = make_sequence(
        conn,
        [{"type": "step", "id": "a", "handler": "test.charge", "params": {"x": "{{ data.nope }}"}}],
    )
    # stored before the validator refused unimplemented builtins: it still fails clearly
    seq3 = store_sequence(conn, [{"type": "step", "id": "a", "handler": "human_review"}])
    a, b, c = start(conn, seq, {}), start(conn, seq2, {}), start(conn, seq3, {})
    states = wait_for(conn, [a, b, c])
    assert states[a][0] == "failed"
    assert "'nobody.registered.this' is neither registered in this runner" in states[a][1]
    assert "nor served by external workers" in states[a][1]
    assert "--import MODULE or ORCH8_HANDLER_MODULES" in states[a][1]
    assert states[b][0] == "failed" and "data.nope not found" in states[b][1]
    assert states[c][0] == "failed"
    assert "'human_review' is a builtin name that orch8-py does not implement yet" in states[c][1]
    # nothing was dispatched for any
    n = conn.execute(
        "SELECT count(*) FROM orch8.effect_receipts WHERE instance_id = ANY(%s)", ([a, b, c],)
    ).fetchone()[0]
    assert n == 0


def test_idle_runner_picks_up_new_work_quickly(conn, runner):
    seq = make_sequence(conn, [{"type": "step", "id": "a", "handler": "noop"}])
    time.sleep(0.3)  # let the runner go idle
    delays = []
    for _ in range(9):  # the median of nine: robust to one slow scheduling hiccup
        instance = start(conn, seq, {})
        wait_for(conn, [instance])
        created, claimed = conn.execute(
            "SELECT min(at) FILTER (WHERE to_state = 'scheduled'),"
            " min(at) FILTER (WHERE to_state = 'running')"
            " FROM orch8.instance_transitions WHERE instance_id = %s",
            (instance,),
        ).fetchone()
        delays.append((claimed - created).total_seconds())
    delays.sort()
    assert delays[len(delays) // 2] < 0.1, delays


def test_guarded_step_costs_two_round_trips(db_url, conn):
    seq = make_sequence(
        conn, [{"type": "step", "id": f"s{i}", "handler": "test.charge"} for i in range(3)]
    )
    instance = start(conn, seq, {})
    executed = []

    class CountingCursor(psycopg.Cursor):
        """Counts every statement the driver sends, whoever asks for it."""

        def execute(self, query, params=None, **kw):
            executed.append(str(query))
            return super().execute(query, params, **kw)

    r = Runner(db_url, Settings(concurrency=1))
    r.pool.kwargs["cursor_factory"] = CountingCursor
    r.pool.open(wait=True)
    try:
        r.has_side_effects("test.charge")  # the builtin list, read once per runner
        r.definition(TENANT, seq)
        [row] = r.claim(1)
        before, executed_before = r.round_trips, len(executed)
        r._run_instance(row)
        assert r.round_trips - before == 3 * 2  # begin_step + finish_step per step
        statements = executed[executed_before:]
        assert len(statements) == 6, statements  # the driver agrees: six statements
        assert [re.search(r"orch8\.\w+(?=\()", q).group() for q in statements] == [
            "orch8.begin_step",
            "orch8.finish_step",
        ] * 3
    finally:
        r.pool.close()
        r.deadlines.close()
    state = conn.execute("SELECT state::text FROM orch8.task_instances WHERE id = %s", (instance,))
    assert state.fetchone()[0] == "completed"
    with psycopg.connect(db_url) as check:
        n = check.execute(
            "SELECT count(*) FROM orch8.effect_receipts"
            " WHERE instance_id = %s AND state = 'committed'",
            (instance,),
        ).fetchone()[0]
    assert n == 3


def test_a_call_that_never_started_is_abandoned_not_unknown(db_url, conn):
    """One instance thread gives two handler threads. Two calls overrun their timeout and
    keep both threads; the third call waits in the queue past its own timeout. It is
    cancelled, so it never runs: its receipt is abandoned (nothing was sent), while the two
    that did start stay unknown."""
    seq = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "charge",
                "handler": "test.hang",
                "timeout": 300,
                "retry": {"max_attempts": 1},
            }
        ],
    )
    HUNG.clear()
    RELEASE.clear()
    instances = [start(conn, seq, {}) for _ in range(3)]
    try:
        with running(db_url, concurrency=1):
            done = wait_for(conn, instances, timeout=30)
    finally:
        RELEASE.set()
    assert {state for state, _ in done.values()} == {"failed"}
    rows = conn.execute(
        "SELECT id, state::text, evidence FROM orch8.effect_receipts WHERE instance_id = ANY(%s)",
        (instances,),
    ).fetchall()
    started = {r[0] for r in rows if r[1] == "unknown"}
    [(never_id, _, evidence)] = [r for r in rows if r[1] == "abandoned"]
    assert len(started) == 2 and set(HUNG) == started
    assert evidence["not_applied"]["not_started"] is True
    assert never_id not in HUNG  # and it cannot run later: its future was cancelled
    errors = sorted(error for _, error in done.values())
    assert errors[0].startswith("did not start within 0.3s"), errors


def _threads_in(function_name: str) -> list[str]:
    """The names of the threads whose stack is inside this file's function of that name."""
    names = {t.ident: t.name for t in threading.enumerate()}
    found = []
    for ident, frame in sys._current_frames().items():
        f = frame
        while f is not None:
            if f.f_code.co_name == function_name and f.f_code.co_filename == __file__:
                found.append(names.get(ident, "?"))
                break
            f = f.f_back
    return found


def test_a_handler_runs_on_its_instance_thread(db_url, conn):
    """A step in flight costs one thread, not two: the handler's (orch8_py/deadlines.py).
    Four instances blocked in a handler: the four threads in the handler are the only
    instance threads, and no other thread waits for them."""
    seq = make_sequence(conn, [{"type": "step", "id": "charge", "handler": "test.hang"}])
    HUNG.clear()
    RELEASE.clear()
    instances = [start(conn, seq, {}) for _ in range(4)]
    try:
        with running(db_url, concurrency=4):
            wait_until(lambda: len(HUNG) == 4, 20, "four calls")
            in_handler = _threads_in("hang")
            assert len(in_handler) == 4 and all(n.startswith("instance") for n in in_handler)
            instance_threads = [t for t in threading.enumerate() if t.name.startswith("instance")]
            assert len(instance_threads) == 4, [t.name for t in instance_threads]
            RELEASE.set()
            done = wait_for(conn, instances)
    finally:
        RELEASE.set()
    assert set(done.values()) == {("completed", None)}


def test_instances_waiting_for_their_batch_hold_no_thread(db_url, conn):
    """200 instances in flight, every one waiting for its begin_step batch (held back by
    a lock on the receipts' table): the runner holds them with a handful of threads, not
    one each (docs/ARCHITECTURE.md, "An instance waits without a thread"). Once the lock
    goes, every one completes."""
    seq = make_sequence(conn, [{"type": "step", "id": "charge", "handler": "test.charge"}])
    instances = [start(conn, seq, {}) for _ in range(200)]
    with psycopg.connect(db_url) as blocker:
        blocker.execute("LOCK TABLE orch8.effect_receipts IN SHARE MODE")
        with running(db_url, concurrency=200) as r:
            try:
                wait_until(lambda: r.active == 200, 20, "200 instances in flight")
                assert r.begins is not None
                wait_until(
                    lambda: r.begins.calls + len(r.begins.waiting) == 200,
                    20,
                    "200 begin_step calls sent or queued",
                )
                threads = [t.name for t in threading.enumerate()]
                runner_threads = [n for n in threads if n.startswith(("steps", "instance"))]
                assert len(runner_threads) <= 8, runner_threads
                assert not _threads_in("charge")
            finally:
                blocker.rollback()
            done = wait_for(conn, instances)
    assert set(done.values()) == {("completed", None)}


def test_a_handler_past_its_timeout_keeps_its_thread_and_the_instance_carries_on(db_url, conn):
    """The deadline wins the call: the instance goes on from another thread (its receipt
    unknown, the step failed) while the handler still holds its own, and the slot is free
    for the next instance. When the handler returns at last, its result is dropped: the
    receipt stays unknown and the thread ends."""
    seq = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "charge",
                "handler": "test.hang",
                "timeout": 300,
                "retry": {"max_attempts": 1},
            }
        ],
    )
    quick = make_sequence(conn, [{"type": "step", "id": "charge", "handler": "test.charge"}])
    HUNG.clear()
    RELEASE.clear()
    hung = start(conn, seq, {})
    try:
        with running(db_url, concurrency=1) as r:
            [(state, error)] = wait_for(conn, [hung], timeout=30).values()
            assert (state, error) == ("failed", "timed out after 0.3s")
            assert len(HUNG) == 1 and _threads_in("hang")  # still in the handler
            nxt = start(conn, quick, {})
            assert wait_for(conn, [nxt], timeout=30)[nxt] == ("completed", None)
            RELEASE.set()
            wait_until(lambda: not _threads_in("hang"), 20, "the late handler's thread to end")
            with r.lock:
                assert r.active == 0 and not r.inflight
    finally:
        RELEASE.set()
    receipt = conn.execute(
        "SELECT state::text, provider_receipt_id FROM orch8.effect_receipts WHERE instance_id = %s",
        (hung,),
    ).fetchone()
    assert receipt == ("unknown", None)
    late = conn.execute(
        "SELECT count(*) FROM orch8.block_outputs WHERE instance_id = %s AND output::text LIKE %s",
        (hung, "%late%"),
    ).fetchone()[0]
    assert late == 0
