"""The composite blocks, each end to end on a real runner against a real PostgreSQL:
parallel, race, loop, for_each, router, try_catch, saga with compensations, sub_sequence,
a step's when, output_schema and retry_if, a definition's input_schema, on_failure and
on_cancel; nesting; and retry of a blocked node inside a composite.

Every field these tests prove is registered with ``proves`` (tests/language_proofs.py):
tests/test_language.py checks that every field the language supports has such a test."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import pytest

from orch8_py import sqlapi
from orch8_py.errors import InvalidInput
from orch8_py.handlers import NotApplied, StepError, handler
from orch8_py.steps import StepContext
from tests.cli_helpers import orch8_env, run_orch8
from tests.language_proofs import proves
from tests.runner_helpers import TENANT, make_sequence, running, start, wait_for

CALLS: list[tuple[str, dict[str, Any]]] = []  # (node path, params) per handler call
LOCK = threading.Lock()
FLAKY: dict[str, int] = {}  # path -> failures left


def called(path: str, params: dict[str, Any]) -> None:
    with LOCK:
        CALLS.append((path, params))


@handler("wf.record")
def record(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    called(ctx.block_id, params)
    return {"path": ctx.block_id, **params}


@handler("wf.sleep")
def sleep(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    called(ctx.block_id, params)
    time.sleep(float(params.get("seconds", 1)))
    return {"slept": params.get("seconds", 1), "path": ctx.block_id}


@handler("wf.fail")
def fail(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    called(ctx.block_id, params)
    raise NotApplied(str(params.get("message", "boom")), code=params.get("code"), retryable=False)


@handler("wf.flaky")
def flaky(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    """Fails (nothing applied) while failures are left for its path, with params' code."""
    called(ctx.block_id, params)
    with LOCK:
        left = FLAKY.get(ctx.block_id, int(params.get("failures", 0)))
        FLAKY[ctx.block_id] = left - 1
    if left > 0:
        raise NotApplied("try again", code=params.get("code"))
    return {"ok": True, "attempt": ctx.attempt}


@handler("wf.unsure")
def unsure(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    """Ambiguous the first time for its path (the receipt goes unknown), fine afterwards."""
    called(ctx.block_id, params)
    with LOCK:
        first = ctx.block_id not in FLAKY
        FLAKY[ctx.block_id] = 0
    if first:
        raise StepError("the provider went quiet")
    return {"ok": True}


@pytest.fixture(autouse=True)
def fresh():
    CALLS.clear()
    FLAKY.clear()
    yield


@pytest.fixture
def runner(db_url):
    with running(db_url, concurrency=6) as r:
        yield r


def step(block_id: str, handler_name: str = "wf.record", **fields: Any) -> dict[str, Any]:
    return {"type": "step", "id": block_id, "handler": handler_name, **fields}


def run(conn, blocks, data=None, timeout=60.0, **top):
    seq = make_sequence(conn, blocks) if not top else define(conn, {"blocks": blocks, **top})
    instance = start(conn, seq, data or {})
    state, error = wait_for(conn, [instance], ("completed", "failed", "cancelled"), timeout)[
        instance
    ]
    return instance, state, error


def define(conn, definition: dict[str, Any], name: str | None = None, namespace="default"):
    return sqlapi.sequences.create_sequence(
        conn,
        tenant_id=TENANT,
        namespace=namespace,
        name=name or f"wf{uuid.uuid4().hex[:8]}",
        definition=definition,
    )["id"]


def nodes(conn, instance) -> dict[str, str]:
    return dict(
        conn.execute(
            "SELECT path, state::text FROM orch8.execution_nodes WHERE instance_id = %s",
            (instance,),
        ).fetchall()
    )


def output(conn, instance, path):
    row = conn.execute(
        "SELECT output FROM orch8.block_outputs WHERE instance_id = %s AND block_id = %s"
        " AND sentinel IS NULL ORDER BY seq DESC LIMIT 1",
        (instance, path),
    ).fetchone()
    return row[0] if row else None


def paths_called() -> list[str]:
    return [p for p, _ in CALLS]


# --- parallel -----------------------------------------------------------------------------


@proves(
    ("block_type", "parallel"),
    ("parallel", "type"),
    ("parallel", "id"),
    ("parallel", "branches"),
)
def test_parallel_branches_run_at_the_same_time(conn, runner):
    blocks = [
        {
            "type": "parallel",
            "id": "fan",
            "branches": [
                [step("left", "wf.sleep", params={"seconds": 2})],
                [step("right", "wf.sleep", params={"seconds": 2})],
            ],
        },
        step("after", params={"sum": "{{ outputs.fan }}"}),
    ]
    started = time.monotonic()
    instance, state, error = run(conn, blocks)
    elapsed = time.monotonic() - started
    assert (state, error) == ("completed", None)
    assert elapsed < 3.5, f"two 2 s branches took {elapsed:.1f} s"
    assert sorted(paths_called()[:2]) == ["fan#0/left", "fan#1/right"]
    assert output(conn, instance, "fan") == [
        {"slept": 2, "path": "fan#0/left"},
        {"slept": 2, "path": "fan#1/right"},
    ]
    # the step after the join saw both branches' outputs, whoever ran them
    assert CALLS[-1] == ("after", {"sum": output(conn, instance, "fan")})
    assert set(nodes(conn, instance).values()) == {"completed"}


@proves(("parallel", "on_branch_failure"))
def test_a_failed_branch_cancels_the_others_unless_they_continue(conn, runner):
    def branches(mode=None):
        block: dict[str, Any] = {
            "type": "parallel",
            "id": "fan",
            "branches": [
                [step("bad", "wf.fail", params={"message": "no stock"})],
                [step("slow", "wf.sleep", params={"seconds": 1}), step("later")],
            ],
        }
        if mode:
            block["on_branch_failure"] = mode
        return [block]

    instance, state, error = run(conn, branches())
    assert state == "failed" and error == "no stock", error
    # slow had begun (its step finishes), later never starts; wait for slow to end
    deadline = time.monotonic() + 10
    while nodes(conn, instance).get("fan#1/slow") not in ("completed", "cancelled"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert "fan#1/later" not in paths_called()
    states = nodes(conn, instance)
    assert states["fan#1"] == "cancelled" and "fan#1/later" not in states

    CALLS.clear()
    instance, state, error = run(conn, branches("continue"))
    assert (state, error) == ("completed", None)
    assert "fan#1/later" in paths_called()
    first, second = output(conn, instance, "fan")
    assert first == {"error": "no stock", "state": "failed", "path": "fan#0/bad"}
    assert second["path"] == "fan#1/later"


# --- race ---------------------------------------------------------------------------------


@proves(
    ("block_type", "race"),
    ("race", "type"),
    ("race", "id"),
    ("race", "branches"),
    ("race", "semantics"),
)
def test_race_takes_the_first_and_cancels_the_losers(conn, runner):
    race = {
        "type": "race",
        "id": "quote",
        "branches": [
            [step("slow", "wf.sleep", params={"seconds": 1.5}), step("slow_after")],
            [step("fast", params={"price": 9})],
        ],
    }
    instance, state, error = run(conn, [race, step("use", params={"p": "{{ outputs.quote }}"})])
    assert (state, error) == ("completed", None)
    assert output(conn, instance, "quote") == {"path": "quote#1/fast", "price": 9}
    assert ("use", {"p": {"path": "quote#1/fast", "price": 9}}) in CALLS
    # the loser's step was already sent: it keeps its receipt, its result is recorded...
    deadline = time.monotonic() + 10
    while output(conn, instance, "quote#0/slow") is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    receipt = conn.execute(
        "SELECT state::text FROM orch8.effect_receipts WHERE instance_id = %s"
        " AND block_id = 'quote#0/slow'",
        (instance,),
    ).fetchone()
    assert receipt == ("committed",)
    # ... but not used: nothing after it in its branch ran
    assert "quote#0/slow_after" not in paths_called()
    assert nodes(conn, instance)["quote#0"] == "cancelled"

    # first_to_succeed: a failure does not decide; first_to_resolve: it does
    failing = [
        [step("broken", "wf.fail", params={"message": "down"})],
        [step("late", "wf.sleep", params={"seconds": 0.3})],
    ]
    instance, state, _ = run(
        conn,
        [{"type": "race", "id": "r", "branches": failing, "semantics": "first_to_succeed"}],
    )
    assert state == "completed"
    assert output(conn, instance, "r")["path"] == "r#1/late"
    instance, state, error = run(conn, [{"type": "race", "id": "r", "branches": failing}])
    assert (state, error) == ("failed", "down")
    both = [[step("x1", "wf.fail", params={"message": "a"})], [step("x2", "wf.fail")]]
    _, state, error = run(
        conn, [{"type": "race", "id": "r", "branches": both, "semantics": "first_to_succeed"}]
    )
    assert state == "failed" and error.startswith("every branch failed"), error


# --- loop ---------------------------------------------------------------------------------


@proves(
    ("block_type", "loop"),
    ("loop", "type"),
    ("loop", "id"),
    ("loop", "condition"),
    ("loop", "body"),
    ("loop", "max_iterations"),
    ("loop", "break_on"),
)
def test_loop_runs_its_body_while_the_condition_holds(conn, runner):
    loop = {
        "type": "loop",
        "id": "poll",
        "condition": "iteration < 3",
        "body": [step("check", "wf.pay", params={"n": "{{ iteration }}"})],
    }
    instance, state, error = run(conn, [loop])
    assert (state, error) == ("completed", None)
    assert [(f"poll[{n}]/check", {"n": n}) for n in range(3)] == CALLS
    # every iteration has its own receipt, effect id and output rows, none deleted
    receipts = conn.execute(
        "SELECT block_id, attempt, state::text, id FROM orch8.effect_receipts"
        " WHERE instance_id = %s ORDER BY created_at",
        (instance,),
    ).fetchall()
    assert [r[:3] for r in receipts] == [(f"poll[{n}]/check", 0, "committed") for n in range(3)]
    assert len({r[3] for r in receipts}) == 3
    assert output(conn, instance, "poll") == {"receipt_id": "r-poll[2]/check", "n": 2}
    decisions = conn.execute(
        "SELECT output FROM orch8.block_outputs WHERE instance_id = %s AND block_id = 'poll'"
        " AND sentinel = '__decision__' ORDER BY seq",
        (instance,),
    ).fetchall()
    assert [d[0]["value"] for d in decisions] == [True, True, True, False]

    CALLS.clear()
    loop_break = {**loop, "condition": "true", "break_on": "outputs.check.n == 1"}
    instance, state, _ = run(conn, [loop_break])
    assert state == "completed" and len(CALLS) == 2

    CALLS.clear()
    endless = {**loop, "condition": "true", "max_iterations": 2}
    _, state, error = run(conn, [endless])
    assert state == "failed"
    assert error == "loop poll: its condition still held after max_iterations (2) iterations"
    assert len(CALLS) == 2


# --- for_each -----------------------------------------------------------------------------


@proves(
    ("block_type", "for_each"),
    ("for_each", "type"),
    ("for_each", "id"),
    ("for_each", "collection"),
    ("for_each", "body"),
    ("for_each", "item_var"),
    ("for_each", "index_var"),
    ("for_each", "concurrency"),
    ("for_each", "max_iterations"),
)
def test_for_each_runs_its_body_per_item(conn, runner):
    items = [{"sku": "a"}, {"sku": "b"}, {"sku": "c"}, {"sku": "d"}]
    each = {
        "type": "for_each",
        "id": "lines",
        "collection": "data.items",
        "item_var": "line",
        "index_var": "k",
        "body": [step("ship", params={"sku": "{{ line.sku }}", "k": "{{ k }}"})],
    }
    instance, state, error = run(conn, [each], {"items": items})
    assert (state, error) == ("completed", None)
    assert [(f"lines[{k}]/ship", {"sku": s["sku"], "k": k}) for k, s in enumerate(items)] == CALLS
    assert [o["sku"] for o in output(conn, instance, "lines")] == ["a", "b", "c", "d"]

    # the default names, and two items at a time: four 1 s items take about 2 s
    CALLS.clear()
    wide = {
        "type": "for_each",
        "id": "lines",
        "collection": "data.items",
        "concurrency": 2,
        "body": [step("pack", "wf.sleep", params={"seconds": 1, "sku": "{{ item.sku }}"})],
    }
    started = time.monotonic()
    _, state, _ = run(conn, [wide], {"items": items})
    elapsed = time.monotonic() - started
    assert state == "completed"
    assert 1.9 < elapsed < 3.5, elapsed
    assert sorted(p["sku"] for _, p in CALLS) == ["a", "b", "c", "d"]

    # more items than max_iterations: refused, none run
    CALLS.clear()
    _, state, error = run(conn, [{**each, "max_iterations": 3}], {"items": items})
    assert state == "failed"
    assert error == "for_each lines: the collection has 4 items, over max_iterations (3)"
    assert CALLS == []
    _, state, error = run(conn, [each], {"items": "not a list"})
    assert state == "failed" and "not a list" in error, error


# --- router -------------------------------------------------------------------------------


@proves(
    ("block_type", "router"),
    ("router", "type"),
    ("router", "id"),
    ("router", "routes"),
    ("router", "default"),
    ("route", "condition"),
    ("route", "blocks"),
)
def test_router_takes_the_first_route_that_holds(conn, runner):
    router = {
        "type": "router",
        "id": "tier",
        "routes": [
            {"condition": "data.amount > 1000", "blocks": [step("review")]},
            {"condition": "data.amount > 100", "blocks": [step("fast_lane")]},
        ],
        "default": [step("standard")],
    }
    for amount, expected in (
        (5000, "tier.route0/review"),
        (500, "tier.route1/fast_lane"),
        (5, "tier.default/standard"),
    ):
        CALLS.clear()
        instance, state, _ = run(conn, [router], {"amount": amount})
        assert state == "completed"
        assert paths_called() == [expected]
        assert output(conn, instance, "tier")["path"] == expected
    # no route and no default: the router completes with nothing
    CALLS.clear()
    no_default = {k: v for k, v in router.items() if k != "default"}
    instance, state, _ = run(conn, [no_default], {"amount": 1})
    assert state == "completed" and CALLS == []
    assert output(conn, instance, "tier") is None


# --- try_catch ----------------------------------------------------------------------------


@proves(
    ("block_type", "try_catch"),
    ("try_catch", "type"),
    ("try_catch", "id"),
    ("try_catch", "try_block"),
    ("try_catch", "catch_block"),
    ("try_catch", "finally_block"),
)
def test_try_catch_handles_the_failure_then_finally_runs(conn, runner):
    block = {
        "type": "try_catch",
        "id": "pay",
        "try_block": [
            step("charge", "wf.fail", params={"message": "card declined", "code": "declined"})
        ],
        "catch_block": [
            step(
                "notify",
                params={
                    "msg": "{{ error.message }}",
                    "code": "{{ error.code }}",
                    "at": "{{ error.path }}",
                },
            )
        ],
        "finally_block": [step("cleanup")],
    }
    instance, state, error = run(conn, [block])
    assert (state, error) == ("completed", None)
    assert CALLS[1:] == [
        (
            "pay.catch/notify",
            {"msg": "card declined", "code": "declined", "at": "pay.try/charge"},
        ),
        ("pay.finally/cleanup", {}),
    ]
    assert output(conn, instance, "pay")["path"] == "pay.catch/notify"
    # a try that succeeds skips the catch; finally still runs; no catch: the failure stays
    CALLS.clear()
    ok = {**block, "try_block": [step("charge")]}
    _, state, _ = run(conn, [ok])
    assert state == "completed" and paths_called() == ["pay.try/charge", "pay.finally/cleanup"]
    CALLS.clear()
    no_catch = {k: v for k, v in block.items() if k != "catch_block"}
    _, state, error = run(conn, [no_catch])
    assert (state, error) == ("failed", "card declined")
    assert paths_called() == ["pay.try/charge", "pay.finally/cleanup"]


# --- saga ---------------------------------------------------------------------------------


def booking(block_id: str, **compensation: Any) -> dict[str, Any]:
    return step(
        block_id,
        "wf.pay",
        params={"what": block_id},
        compensation={
            "handler": "wf.record",
            "params": {"undo": "{{ outputs." + block_id + ".what }}"},
            **compensation,
        },
    )


@handler("wf.pay")
def pay(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    called(ctx.block_id, params)
    return {"receipt_id": f"r-{ctx.block_id}", **params}


@proves(
    ("block_type", "saga"),
    ("saga", "type"),
    ("saga", "id"),
    ("saga", "blocks"),
    ("step", "compensation"),
    ("compensation", "handler"),
    ("compensation", "params"),
)
def test_saga_compensates_the_completed_steps_in_reverse(conn, runner):
    saga = {
        "type": "saga",
        "id": "trip",
        "blocks": [booking("flight"), booking("hotel"), step("car", "wf.fail")],
    }
    instance, state, error = run(conn, [saga])
    assert state == "failed"
    assert error.startswith("saga trip compensated 2 step(s) after trip/car failed"), error
    assert CALLS[3:] == [
        ("trip.undo/hotel", {"undo": "hotel"}),
        ("trip.undo/flight", {"undo": "flight"}),
    ]
    receipts = dict(
        conn.execute(
            "SELECT block_id, state::text FROM orch8.effect_receipts WHERE instance_id = %s",
            (instance,),
        ).fetchall()
    )
    assert receipts["trip/flight"] == "compensated" and receipts["trip/hotel"] == "compensated"
    assert receipts["trip.undo/hotel"] == "committed"
    evidence = conn.execute(
        "SELECT r.evidence, c.id FROM orch8.effect_receipts AS r, orch8.effect_receipts AS c"
        " WHERE r.instance_id = %s AND r.block_id = 'trip/hotel'"
        " AND c.instance_id = r.instance_id AND c.block_id = 'trip.undo/hotel'",
        (instance,),
    ).fetchone()
    assert evidence[0]["compensated_by"] == "trip.undo/hotel"
    assert evidence[0]["compensating_effect_id"] == str(evidence[1])
    # a saga failure is a failure like any other: a try_catch around it handles it
    CALLS.clear()
    wrapped = {"type": "try_catch", "id": "t", "try_block": [saga], "catch_block": [step("sorry")]}
    _, state, _ = run(conn, [wrapped])
    assert state == "completed" and paths_called()[-1] == "t.catch/sorry"


@proves(("compensation", "retry"), ("compensation", "timeout"))
def test_a_compensation_retries_and_one_that_times_out_leaves_both_receipts_queued(conn, runner):
    saga = {
        "type": "saga",
        "id": "trip",
        "blocks": [
            step(
                "flight",
                "wf.pay",
                params={},
                compensation={
                    "handler": "wf.flaky",
                    "params": {"failures": 1},
                    "retry": {"max_attempts": 2, "initial_backoff": 10},
                },
            ),
            step("car", "wf.fail"),
        ],
    }
    instance, state, _ = run(conn, [saga])
    assert state == "failed"
    assert paths_called().count("trip.undo/flight") == 2  # retried once, then compensated
    flight = conn.execute(
        "SELECT state::text FROM orch8.effect_receipts WHERE instance_id = %s"
        " AND block_id = 'trip/flight'",
        (instance,),
    ).fetchone()
    assert flight == ("compensated",)

    slow_undo = {
        **saga,
        "blocks": [
            step(
                "flight",
                "wf.pay",
                params={},
                compensation={"handler": "wf.sleep", "params": {"seconds": 2}, "timeout": 300},
            ),
            step("car", "wf.fail"),
        ],
    }
    instance, state, error = run(conn, [slow_undo])
    # the undo may or may not have happened: its receipt is unknown, the original still
    # committed, and both are on the operator's queue
    assert state == "failed" and "timed out after 0.3s" in error, error
    queued = conn.execute(
        "SELECT block_id, state::text, awaiting_compensation FROM orch8.unresolved_effects"
        " WHERE instance_id = %s ORDER BY block_id",
        (instance,),
    ).fetchall()
    assert queued == [
        ("trip.undo/flight", "unknown", None),
        ("trip/flight", "committed", "trip.undo/flight"),
    ]


# --- sub_sequence -------------------------------------------------------------------------


@proves(
    ("block_type", "sub_sequence"),
    ("sub_sequence", "type"),
    ("sub_sequence", "id"),
    ("sub_sequence", "sequence_name"),
    ("sub_sequence", "namespace"),
    ("sub_sequence", "version"),
    ("sub_sequence", "input"),
)
def test_sub_sequence_runs_a_child_and_takes_its_output(conn, runner):
    child_name = f"child{uuid.uuid4().hex[:6]}"
    for version in (1, 2):
        define(
            conn,
            {
                "blocks": [step("work", params={"n": "{{ data.n }}", "v": version})],
                "input_schema": {"type": "object", "required": ["n"]},
            },
            name=child_name,
            namespace="billing",
        )
    parent = [
        {
            "type": "sub_sequence",
            "id": "kid",
            "sequence_name": child_name,
            "namespace": "billing",
            "input": {"n": "{{ data.n }}"},
        },
        step("after", params={"got": "{{ outputs.kid.n }}", "v": "{{ outputs.kid.v }}"}),
    ]
    instance, state, error = run(conn, parent, {"n": 7})
    assert (state, error) == ("completed", None)
    assert CALLS[-1] == ("after", {"got": 7, "v": 2})  # the latest version by default
    child = conn.execute(
        "SELECT id, state::text, parent_instance_id, parent_path, depth"
        " FROM orch8.task_instances WHERE parent_instance_id = %s",
        (instance,),
    ).fetchone()
    assert child[1:] == ("completed", instance, "kid", 1)
    assert nodes(conn, instance)["kid"] == "completed"

    CALLS.clear()
    pinned = [{**parent[0], "version": 1}, parent[1]]
    _, state, _ = run(conn, pinned, {"n": 8})
    assert state == "completed" and CALLS[-1] == ("after", {"got": 8, "v": 1})

    # the child's input is checked against its input_schema before it starts
    bad_input = [{**parent[0], "input": {"m": 1}}]
    _, state, error = run(conn, bad_input, {"n": 1})
    assert state == "failed"
    assert "data does not match input_schema at /: 'n' is a required property" in error, error


def test_a_child_failure_fails_the_block_and_a_cancel_reaches_the_child(conn, runner):
    failing = define(conn, {"blocks": [step("oops", "wf.fail", params={"message": "bad"})]})
    name = conn.execute("SELECT name FROM orch8.sequences WHERE id = %s", (failing,)).fetchone()[0]
    _, state, error = run(conn, [{"type": "sub_sequence", "id": "kid", "sequence_name": name}])
    assert state == "failed" and error.startswith("child ") and error.endswith("failed: bad")

    slow = define(conn, {"blocks": [step("long", "wf.sleep", params={"seconds": 30})]})
    slow_name = conn.execute("SELECT name FROM orch8.sequences WHERE id = %s", (slow,)).fetchone()[
        0
    ]
    seq = make_sequence(conn, [{"type": "sub_sequence", "id": "kid", "sequence_name": slow_name}])
    parent = start(conn, seq)
    deadline = time.monotonic() + 20
    child = None
    while child is None:
        assert time.monotonic() < deadline, "the child never started"
        row = conn.execute(
            "SELECT id FROM orch8.task_instances WHERE parent_instance_id = %s", (parent,)
        ).fetchone()
        child = row and row[0]
        time.sleep(0.05)
    # the parent waits for its child without holding a runner thread or a lease
    wait_for(conn, [parent], ("waiting",), 20)
    lease = conn.execute(
        "SELECT count(*) FROM orch8.execution_nodes WHERE instance_id = %s"
        " AND lease_token IS NOT NULL",
        (parent,),
    ).fetchone()[0]
    assert lease == 0
    conn.execute("SELECT orch8.cancel_instance(%s, %s, 'op', 'no longer needed')", (TENANT, parent))
    assert wait_for(conn, [parent], ("cancelled",), 20)[parent][0] == "cancelled"
    # the child, mid-step, is asked to cancel and ends cancelled when that step is done
    child_state = conn.execute(
        "SELECT state::text, requested_state::text FROM orch8.task_instances WHERE id = %s",
        (child,),
    ).fetchone()
    assert child_state in (("running", "cancelled"), ("cancelled", None)), child_state


def test_sub_sequences_stop_at_the_depth_limit(conn, runner):
    name = f"recursive{uuid.uuid4().hex[:6]}"
    define(conn, {"blocks": [{"type": "sub_sequence", "id": "again", "sequence_name": name}]}, name)
    seq = conn.execute("SELECT id FROM orch8.sequences WHERE name = %s", (name,)).fetchone()[0]
    top = start(conn, seq)
    assert wait_for(conn, [top], ("failed",), 60)[top][0] == "failed"
    limit = conn.execute("SELECT orch8.limit_of('sub_sequence_depth')").fetchone()[0]
    depth = conn.execute(
        "SELECT max(depth) FROM orch8.task_instances WHERE sequence_id = %s", (seq,)
    ).fetchone()[0]
    assert depth == limit
    deepest = conn.execute(
        "SELECT error FROM orch8.task_instances WHERE sequence_id = %s AND depth = %s",
        (seq, limit),
    ).fetchone()[0]
    assert f"over the limit sub_sequence_depth ({limit})" in deepest, deepest


# --- a step's options ---------------------------------------------------------------------


@proves(("step", "when"))
def test_when_skips_a_step_and_records_why(conn, runner):
    blocks = [step("maybe", "wf.pay", when="data.vip == true"), step("always")]
    instance, state, _ = run(conn, blocks, {"vip": False})
    assert state == "completed" and paths_called() == ["always"]
    assert nodes(conn, instance)["maybe"] == "skipped"
    skipped = conn.execute(
        "SELECT sentinel, output FROM orch8.block_outputs WHERE instance_id = %s"
        " AND block_id = 'maybe'",
        (instance,),
    ).fetchall()
    assert skipped == [("__skipped__", {"when": "data.vip == true", "value": False})]
    receipts = conn.execute(
        "SELECT count(*) FROM orch8.effect_receipts WHERE instance_id = %s AND block_id = 'maybe'",
        (instance,),
    ).fetchone()[0]
    assert receipts == 0  # a skipped step never begins its effect
    CALLS.clear()
    _, state, _ = run(conn, blocks, {"vip": True})
    assert paths_called() == ["maybe", "always"]


@proves(("step", "output_schema"))
def test_an_output_that_breaks_output_schema_fails_the_step_for_good(conn, runner):
    blocks = [
        step(
            "charge",
            "wf.pay",
            params={"amount": "ten"},
            output_schema={
                "type": "object",
                "properties": {"amount": {"type": "integer"}},
                "required": ["amount"],
            },
            retry={"max_attempts": 3, "initial_backoff": 10},
        )
    ]
    instance, state, error = run(conn, blocks)
    assert state == "failed"
    assert (
        error
        == "the output does not match output_schema at /amount: 'ten' is not of type 'integer'"
    )
    assert len(CALLS) == 1  # not retried
    receipt = conn.execute(
        "SELECT state::text FROM orch8.effect_receipts WHERE instance_id = %s", (instance,)
    ).fetchone()
    assert receipt == ("committed",)  # it happened: the provider answered


@proves(("retry", "retry_if"))
def test_retry_if_decides_from_the_error(conn, runner):
    def flaky_step(code):
        return step(
            "call",
            "wf.flaky",
            params={"failures": 2, "code": code},
            retry={"max_attempts": 5, "initial_backoff": 10, "retry_if": "error.code == '503'"},
        )

    _, state, _ = run(conn, [flaky_step("503")])
    assert state == "completed" and len(CALLS) == 3
    CALLS.clear()
    FLAKY.clear()
    _, state, error = run(conn, [flaky_step("400")])
    assert (state, error) == ("failed", "try again") and len(CALLS) == 1


# --- the definition's options ---------------------------------------------------------------


@proves(("definition", "input_schema"))
def test_input_schema_is_checked_when_an_instance_starts(db_url, conn, runner):
    seq = define(
        conn,
        {
            "blocks": [step("go")],
            "input_schema": {
                "type": "object",
                "properties": {"order": {"type": "object", "required": ["id"]}},
                "required": ["order"],
            },
        },
    )
    with pytest.raises(InvalidInput) as refused:
        sqlapi.instances.create_instance(
            conn, tenant_id=TENANT, sequence_id=seq, data={"order": {"sku": "x"}}
        )
    assert refused.value.facts["pointer"] == "/order"
    assert str(refused.value) == (
        "data does not match the sequence's input_schema at /order: 'id' is a required property"
    )
    created = sqlapi.instances.create_instance(
        conn, tenant_id=TENANT, sequence_id=seq, data={"order": {"id": 1}}
    )
    assert wait_for(conn, [created.id])[created.id] == ("completed", None)
    # the API answers 422 with the pointer; nothing was started
    from orch8_py import apikeys
    from web import create_app

    app = create_app(db_url, secret_key="schema-test")
    _, secret = apikeys.create(conn, TENANT, "operator", "alice")
    name = conn.execute("SELECT name FROM orch8.sequences WHERE id = %s", (seq,)).fetchone()[0]
    try:
        resp = app.test_client().post(
            "/api/v1/instances",
            json={"sequence": name, "data": {"order": 5}},
            headers={"Authorization": f"Bearer {secret}"},
        )
    finally:
        app.extensions["orch8.pool"].close()
    assert resp.status_code == 422, resp.get_json()
    body = resp.get_json()
    assert (body["field"], body["pointer"]) == ("data", "/order")
    assert body["schema_error"] == "5 is not of type 'object'"
    count = conn.execute(
        "SELECT count(*) FROM orch8.task_instances WHERE sequence_id = %s", (seq,)
    ).fetchone()[0]
    assert count == 1


@proves(("definition", "on_failure"))
def test_on_failure_blocks_run_before_the_instance_fails(conn, runner):
    blocks = [step("charge", "wf.fail", params={"message": "card declined", "code": "c1"})]
    on_failure = [step("page", params={"why": "{{ error.message }}", "at": "{{ error.path }}"})]
    instance, state, error = run(conn, blocks, on_failure=on_failure)
    assert (state, error) == ("failed", "card declined")
    assert CALLS[-1] == (".on_failure[0]/page", {"why": "card declined", "at": "charge"})
    assert nodes(conn, instance)[".on_failure[0]"] == "completed"


@proves(("definition", "on_cancel"))
def test_on_cancel_blocks_run_before_the_instance_is_cancelled(conn, runner):
    seq = define(
        conn,
        {
            "blocks": [step("hold", "wf.sleep", params={"seconds": 1}), step("never")],
            "on_cancel": [step("release")],
        },
    )
    instance = start(conn, seq)
    deadline = time.monotonic() + 10
    while "hold" not in paths_called():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    asked = conn.execute(
        "SELECT orch8.cancel_instance(%s, %s, 'op', 'customer left')", (TENANT, instance)
    ).fetchone()[0]
    assert asked == "requested"  # hold is in flight: it finishes first
    assert wait_for(conn, [instance], ("cancelled",), 20)[instance][0] == "cancelled"
    assert paths_called() == ["hold", ".on_cancel/release"]
    assert "never" not in nodes(conn, instance)  # withdrawn before it started


# --- nesting, and retry inside a composite ---------------------------------------------------


def test_a_for_each_inside_a_parallel_inside_a_try_catch(conn, runner):
    block = {
        "type": "try_catch",
        "id": "outer",
        "try_block": [
            {
                "type": "parallel",
                "id": "fan",
                "branches": [
                    [
                        {
                            "type": "for_each",
                            "id": "each",
                            "collection": "data.items",
                            "body": [
                                step("bill", "wf.pay", params={"n": "{{ item }}"}),
                                step(
                                    "check",
                                    "wf.fail",
                                    when="item == 2",
                                    params={"message": "item 2 is bad"},
                                ),
                            ],
                        }
                    ],
                    [step("side")],
                ],
            }
        ],
        "catch_block": [step("handled", params={"at": "{{ error.path }}"})],
    }
    instance, state, error = run(conn, [block], {"items": [1, 2, 3]})
    assert (state, error) == ("completed", None)
    assert ("outer.catch/handled", {"at": "outer.try/fan#0/each[1]/check"}) in CALLS
    states = nodes(conn, instance)
    assert states["outer.try/fan#0/each[0]/check"] == "skipped"
    assert states["outer.try/fan#0/each[1]/check"] == "failed"


def test_a_saga_inside_a_loop_compensates_each_iteration_on_its_own(conn, runner):
    loop = {
        "type": "loop",
        "id": "rounds",
        "condition": "iteration < 2",
        "body": [
            {
                "type": "try_catch",
                "id": "guard",
                "try_block": [
                    {
                        "type": "saga",
                        "id": "trip",
                        "blocks": [
                            booking("hotel"),
                            step("car", "wf.fail", when="iteration == 1"),
                        ],
                    }
                ],
                "catch_block": [step("noted")],
            }
        ],
    }
    instance, state, _ = run(conn, [loop])
    assert state == "completed"
    receipts = dict(
        conn.execute(
            "SELECT block_id, state::text FROM orch8.effect_receipts WHERE instance_id = %s",
            (instance,),
        ).fetchall()
    )
    assert receipts["rounds[0]/guard.try/trip/hotel"] == "committed"  # iteration 0 succeeded
    assert receipts["rounds[1]/guard.try/trip/hotel"] == "compensated"  # iteration 1 undone
    assert ("rounds[1]/guard.try/trip.undo/hotel", {"undo": "hotel"}) in CALLS


def test_retry_after_resolution_resumes_only_the_blocked_node(conn, runner):
    blocks = [
        {
            "type": "parallel",
            "id": "fan",
            "branches": [[step("unsure", "wf.unsure")], [step("sure")]],
        },
        step("after"),
    ]
    instance, state, error = run(conn, blocks)
    # the ambiguous branch blocks; the other one finished
    assert state == "failed" and "the provider went quiet" in error, error
    states = nodes(conn, instance)
    assert (states["fan#0/unsure"], states["fan#1/sure"], states["fan"]) == (
        "blocked",
        "completed",
        "running",
    )
    effect_id = conn.execute(
        "SELECT id FROM orch8.effect_receipts WHERE instance_id = %s AND block_id = 'fan#0/unsure'",
        (instance,),
    ).fetchone()[0]
    conn.execute(
        "SELECT orch8.resolve_effect(%s, %s, 'unknown', 'abandoned', NULL, %s, 'op')",
        (TENANT, effect_id, '{"checked": "the provider has no such request"}'),
    )
    retried = sqlapi.instances.retry_instance(
        conn, tenant_id=TENANT, instance_id=instance, actor="op"
    )
    assert (retried.outcome, retried.block_id) == ("rerun", "fan#0/unsure")
    assert wait_for(conn, [instance])[instance] == ("completed", None)
    assert paths_called().count("fan#1/sure") == 1  # the other branch never ran again
    assert paths_called().count("fan#0/unsure") == 2
    assert paths_called()[-1] == "after"


def test_instances_show_draws_the_tree(db_url, conn, runner):
    blocks = [
        {
            "type": "parallel",
            "id": "fan",
            "branches": [[step("left", "wf.pay", params={"n": 1})], [step("right")]],
        },
        step("skip_me", when="false"),
    ]
    instance, state, _ = run(conn, blocks)
    assert state == "completed"
    env = orch8_env(ORCH8_DATABASE_URL=db_url)
    shown = run_orch8("instances", "show", str(instance), "--tenant", TENANT, env=env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    tree = lines[lines.index("  tree:") + 1 : lines.index("  effects:")]
    labels = [line.split()[0] for line in tree]
    assert labels == ["fan", "#0", "left", "#1", "right", "skip_me"]
    indent = {line.split()[0]: len(line) - len(line.lstrip()) for line in tree}
    assert indent["fan"] < indent["#0"] < indent["left"] and indent["#1"] == indent["#0"]
    left = next(line for line in tree if line.split()[0] == "left")
    receipt = conn.execute(
        "SELECT id FROM orch8.effect_receipts WHERE instance_id = %s AND block_id = 'fan#0/left'",
        (instance,),
    ).fetchone()[0]
    assert "completed" in left and "attempt 0" in left and f"receipt {receipt} committed" in left
    assert tree[-1].split()[:2] == ["skip_me", "skipped"]
    as_json = run_orch8("instances", "show", str(instance), "--tenant", TENANT, "--json", env=env)
    body = json.loads(as_json.stdout)
    assert [n["path"] for n in body["tree"]] == ["fan", "skip_me"]
    assert [c["path"] for c in body["tree"][0]["children"]] == ["fan#0", "fan#1"]
