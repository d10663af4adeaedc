"""``async def`` handlers, against a real PostgreSQL and an in-process runner: awaited on the
runner's event loop (orch8_py.handler_loop), holding no thread while they wait, with the
same receipts, deadlines and failures as a synchronous handler; and run to their end on
the paths that hold a thread anyway (a verifier's replay)."""

from __future__ import annotations

import asyncio
import collections
import threading
import time

import pytest

from orch8_py.handler_loop import HandlerLoop
from orch8_py.handlers import NotApplied, StepError, handler
from orch8_py.steps import call_user, is_async
from tests.runner_helpers import make_sequence, running, start, wait_for, wait_until

SENT: collections.Counter = collections.Counter()  # effect id -> calls


@handler("test.async_charge")
async def async_charge(params, ctx):
    SENT[ctx.effect_id] += 1
    await asyncio.sleep(0.01)
    return {"receipt_id": f"r-{ctx.block_id}", "key": ctx.idempotency_key}


class Gate:
    """Holds async handlers until opened and counts those inside, whichever event loop (or
    loops) they run on."""

    def __init__(self) -> None:
        self.inside = 0
        self.lock = threading.Lock()
        self.events: dict[asyncio.AbstractEventLoop, asyncio.Event] = {}

    async def wait(self) -> None:
        with self.lock:
            event = self.events.setdefault(asyncio.get_running_loop(), asyncio.Event())
            self.inside += 1
        await event.wait()

    def open(self) -> None:
        with self.lock:
            for loop, event in self.events.items():
                loop.call_soon_threadsafe(event.set)


GATE = Gate()


@handler("test.async_gated")
async def async_gated(params, ctx):
    SENT[ctx.effect_id] += 1
    await GATE.wait()
    return {"receipt_id": str(ctx.effect_id)}


CANCELLED: list = []
REPLAYS: list = []


@handler("test.async_slow_then_quick")
async def async_slow_then_quick(params, ctx):
    """The first call hangs past its timeout (and is cancelled); a replay answers."""
    if ctx.attempt == 0 and not REPLAYS and not CANCELLED:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            CANCELLED.append(ctx.effect_id)
            raise
    REPLAYS.append(ctx.effect_id)
    return {"receipt_id": "ch_replayed"}


@handler("test.async_refused")
async def async_refused(params, ctx):
    await asyncio.sleep(0)
    if params.get("not_applied"):
        raise NotApplied("the provider refused before charging", {"status": 409})
    raise StepError("card declined", code="card_declined", retryable=False)


@handler("test.async_counter")
async def async_counter(params, ctx):
    """ctx.state from an async handler, as docs/HANDLERS.md says: through a thread."""
    n = await asyncio.to_thread(ctx.state.get, "n", 0)
    await asyncio.to_thread(ctx.state.set, "n", n + 1)
    return {"n": n + 1}


# a plain function handing back a coroutine: is_async cannot tell, so nothing awaits it
handler("test.returns_coroutine")(lambda params, ctx: async_refused(params, ctx))


def receipts(conn, instance) -> list[tuple]:
    return conn.execute(
        "SELECT block_id, state::text, provider_receipt_id FROM orch8.effect_receipts"
        " WHERE instance_id = %s ORDER BY block_id, attempt",
        (instance,),
    ).fetchall()


def step(handler_name: str, block_id: str, **fields) -> dict:
    return {"type": "step", "id": block_id, "handler": handler_name, **fields}


def test_an_async_handler_guards_each_step_with_a_receipt_and_sends_once(db_url, conn):
    seq = make_sequence(conn, [step("test.async_charge", b) for b in ("a", "b", "c")])
    SENT.clear()
    instances = [start(conn, seq, {"n": i}) for i in range(20)]
    with running(db_url, concurrency=8):
        done = wait_for(conn, instances)
    assert set(done.values()) == {("completed", None)}
    assert len(SENT) == 60 and set(SENT.values()) == {1}  # every effect id sent once
    for inst in instances:
        assert receipts(conn, inst) == [
            ("a", "committed", "r-a"),
            ("b", "committed", "r-b"),
            ("c", "committed", "r-c"),
        ]
    out = conn.execute(
        "SELECT output FROM orch8.block_outputs WHERE instance_id = %s AND block_id = 'b'"
        " AND sentinel IS NULL",
        (instances[0],),
    ).fetchone()[0]
    assert out["receipt_id"] == "r-b" and out["key"]  # the coroutine's return is the output


def test_async_handlers_waiting_at_once_hold_no_thread(db_url, conn):
    """300 calls inside their handlers at once: a synchronous handler would hold 300
    threads (one each); async ones hold none, so the process stays at the runner's few."""
    n = 300
    seq = make_sequence(conn, [step("test.async_gated", "charge")])
    SENT.clear()
    GATE.__init__()
    instances = [start(conn, seq, {"n": i}) for i in range(n)]
    before = threading.active_count()
    with running(db_url, concurrency=n):
        wait_until(lambda: GATE.inside == n, 60, f"all {n} calls inside the handler")
        threads = threading.active_count()
        GATE.open()
        done = wait_for(conn, instances)
    assert threads - before < 40, f"{threads - before} threads with {n} calls waiting"
    assert set(done.values()) == {("completed", None)}
    assert len(SENT) == n and set(SENT.values()) == {1}


def test_an_async_handler_past_its_timeout_is_cancelled_and_a_replay_settles_it(db_url, conn):
    """The deadline takes the call (receipt unknown) and cancels the coroutine, which a
    thread could not be; the verifier's replay awaits the handler on its own thread and
    its answer settles the receipt, so the instance completes."""
    seq = make_sequence(
        conn,
        [
            step(
                "test.async_slow_then_quick",
                "charge",
                timeout=300,
                retry={"max_attempts": 1},
                verify={"replay": True, "schedule": [100]},
                provider_idempotency=True,
            )
        ],
    )
    CANCELLED.clear()
    REPLAYS.clear()
    inst = start(conn, seq, {})
    with running(db_url, concurrency=2):
        wait_until(lambda: CANCELLED, 10, "the deadline to cancel the coroutine")
        assert wait_for(conn, [inst], timeout=30)[inst] == ("completed", None)
    assert len(CANCELLED) == 1 and len(REPLAYS) == 1
    [(_, state, provider_id)] = receipts(conn, inst)
    assert (state, provider_id) == ("verified", "ch_replayed")
    actor = conn.execute(
        "SELECT e.actor FROM orch8.effect_receipt_events AS e JOIN orch8.effect_receipts AS r"
        " ON r.tenant_id = e.tenant_id AND r.id = e.receipt_id"
        " WHERE r.instance_id = %s AND e.to_state = 'verified'",
        (inst,),
    ).fetchone()[0]
    assert actor == "verifier:replay"


def test_an_async_handler_fails_as_a_synchronous_one_does(db_url, conn):
    declined = make_sequence(conn, [step("test.async_refused", "charge")])
    refused = make_sequence(
        conn,
        [
            step(
                "test.async_refused",
                "charge",
                params={"not_applied": True},
                retry={"max_attempts": 1},
            )
        ],
    )
    a, b = start(conn, declined, {}), start(conn, refused, {})
    with running(db_url, concurrency=2):
        done = wait_for(conn, [a, b])
    assert done[a] == ("failed", "card declined")
    assert done[b] == ("failed", "the provider refused before charging")
    # a non-retryable error leaves the provider's outcome open; NotApplied proves nothing left
    assert [r[1] for r in receipts(conn, a)] == ["unknown"]
    assert [r[1] for r in receipts(conn, b)] == ["abandoned"]


def test_an_async_handler_reaches_the_instance_state_through_a_thread(db_url, conn):
    seq = make_sequence(
        conn,
        [
            step("test.async_counter", "one"),
            step("test.async_counter", "two"),
            step("get_state", "read", params={"key": "n"}),
        ],
    )
    inst = start(conn, seq, {})
    with running(db_url, concurrency=1):
        assert wait_for(conn, [inst])[inst] == ("completed", None)
    out = conn.execute(
        "SELECT output FROM orch8.block_outputs WHERE instance_id = %s AND block_id = 'read'"
        " AND sentinel IS NULL",
        (inst,),
    ).fetchone()[0]
    assert out == {"key": "n", "value": 2, "found": True}


def test_a_function_that_returns_a_coroutine_is_refused_and_sends_nothing(db_url, conn):
    seq = make_sequence(conn, [step("test.returns_coroutine", "charge")])
    inst = start(conn, seq, {})
    with running(db_url, concurrency=1):
        [(state, error)] = wait_for(conn, [inst]).values()
    assert state == "failed" and "returned an awaitable: declare it async def" in error
    assert [r[1] for r in receipts(conn, inst)] == ["abandoned"]  # it never ran


def test_is_async_and_call_user():
    class Callable:
        async def __call__(self, x):
            return x + 1

    async def coro(x):
        await asyncio.sleep(0)
        return x * 2

    assert is_async(coro) and is_async(Callable()) and not is_async(lambda x: x)
    assert call_user(coro, 21) == 42 and call_user(Callable(), 1) == 2
    assert call_user(lambda x: x, 7) == 7
    t0 = time.monotonic()
    assert call_user(coro, 1) == 2 and time.monotonic() - t0 < 1


def test_the_handler_loop_cancels_what_runs_when_closed_and_refuses_more():
    """What a runner stopping past its grace period does to async calls still waiting."""
    loop = HandlerLoop()
    cancelled = threading.Event()

    async def waits_forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    future = loop.submit(waits_forever())
    time.sleep(0.05)
    assert not future.done()
    loop.close(timeout=5)
    assert cancelled.is_set() and future.cancelled()
    with pytest.raises(RuntimeError, match="closed"):
        loop.submit(waits_forever())
    loop.close(timeout=5)  # twice is harmless
