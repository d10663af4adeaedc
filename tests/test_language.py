"""The sequence language accepts only what runs: every field orch8.sequence_language()
lists as supported has a test here that runs a real instance on a real runner and shows
that the field changes what happens. A field added to the language without such a test
fails test_every_supported_field_is_proven_end_to_end.

Definitions stored before a field was refused keep running as they were stored, and
`orch8 sequences list` flags them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from orch8_py.handlers import StepError, handler
from orch8_py.steps import StepContext
from tests.cli_helpers import orch8_env, run_orch8
from tests.runner_helpers import (
    TENANT,
    make_sequence,
    running,
    start,
    store_sequence,
    wait_for,
)

PROOFS: dict[tuple[str, str], str] = {}


def proves(*fields: tuple[str, str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Record that the decorated test shows these (scope, field) change what runs."""

    def register(test: Callable[..., Any]) -> Callable[..., Any]:
        for f in fields:
            PROOFS[f] = test.__name__
        return test

    return register


CALLS: list[tuple[str, dict[str, Any], int]] = []  # (block, params, attempt) per call


@handler("lang.record")
def record(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    CALLS.append((ctx.block_id, params, ctx.attempt))
    return {"seen": params, "block": ctx.block_id}


@handler("lang.fail")
def always_fail(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    CALLS.append((ctx.block_id, params, ctx.attempt))
    raise StepError("no", code=params.get("code"))


@handler("lang.slow")
def slow(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    time.sleep(params["seconds"])
    return {"slept": params["seconds"]}


@pytest.fixture(autouse=True)
def fresh_calls():
    CALLS.clear()
    yield


@pytest.fixture
def runner(db_url):
    with running(db_url) as r:
        yield r


def step(block_id: str, handler_name: str = "lang.record", **fields: Any) -> dict[str, Any]:
    return {"type": "step", "id": block_id, "handler": handler_name, **fields}


def run_one(conn, blocks, invariants=None, data=None):
    seq = make_sequence(conn, blocks, invariants=invariants)
    instance = start(conn, seq, data or {})
    state, error = wait_for(conn, [instance], timeout=30)[instance]
    return instance, state, error


def outputs(conn, instance) -> list[tuple[str, Any]]:
    """The steps' real outputs (no sentinels), in order."""
    return conn.execute(
        "SELECT block_id, output FROM orch8.block_outputs"
        " WHERE instance_id = %s AND sentinel IS NULL ORDER BY seq",
        (instance,),
    ).fetchall()


def waits(conn, instance) -> list[float]:
    """Seconds between the end of each attempt of the (only) step and the start of the
    next: the backoff the runner honoured."""
    rows = conn.execute(
        "SELECT attempt, min(created_at) FILTER (WHERE sentinel = '__in_progress__'),"
        " max(created_at) FILTER (WHERE sentinel IN ('__retry__', '__error__'))"
        " FROM orch8.block_outputs WHERE instance_id = %s GROUP BY attempt ORDER BY attempt",
        (instance,),
    ).fetchall()
    return [(rows[i][1] - rows[i - 1][2]).total_seconds() for i in range(1, len(rows))]


# --- the language's supported fields, each shown changing what runs ----------------------


@proves(("definition", "blocks"), ("block_type", "step"), ("step", "type"))
def test_blocks_run_in_order(conn, runner):
    instance, state, _ = run_one(conn, [step("first"), step("second"), step("third")])
    assert state == "completed"
    assert [c[0] for c in CALLS] == ["first", "second", "third"]
    assert [o[0] for o in outputs(conn, instance)] == ["first", "second", "third"]


@proves(("step", "id"), ("step", "params"))
def test_params_reach_the_handler_and_an_id_names_an_output(conn, runner):
    blocks = [
        step("lookup", params={"order": "{{ data.order }}"}),
        step("use", params={"from_lookup": "{{ outputs.lookup.seen.order }}", "n": 3}),
    ]
    _, state, _ = run_one(conn, blocks, data={"order": 42})
    assert state == "completed"
    assert CALLS == [("lookup", {"order": 42}, 0), ("use", {"from_lookup": 42, "n": 3}, 0)]


@proves(("step", "handler"))
def test_the_handler_decides_what_runs(conn, runner):
    _, ok, _ = run_one(conn, [step("a", "lang.record")])
    _, failed, error = run_one(conn, [step("a", "lang.fail", retry={"max_attempts": 1})])
    assert (ok, failed) == ("completed", "failed")
    assert error == "no"


@proves(("step", "timeout"))
def test_timeout_cuts_a_slow_handler(conn, runner):
    slow_step = step("s", "lang.slow", params={"seconds": 1.0}, retry={"max_attempts": 1})
    _, state, error = run_one(conn, [{**slow_step, "timeout": 200}])
    assert (state, error) == ("failed", "timed out after 0.2s")
    _, state, _ = run_one(conn, [{**slow_step, "timeout": 5000}])
    assert state == "completed"


@proves(("step", "retry"), ("retry", "max_attempts"))
def test_max_attempts_bounds_the_attempts(conn, runner):
    fast = {"initial_backoff": 0}
    _, state, _ = run_one(conn, [step("a", "lang.fail", retry={**fast, "max_attempts": 1})])
    assert state == "failed" and len(CALLS) == 1
    CALLS.clear()
    _, state, _ = run_one(conn, [step("a", "lang.fail", retry={**fast, "max_attempts": 4})])
    assert state == "failed" and [c[2] for c in CALLS] == [0, 1, 2, 3]


@proves(("retry", "initial_backoff"))
def test_initial_backoff_delays_the_second_attempt(conn, runner):
    quick, _, _ = run_one(
        conn, [step("a", "lang.fail", retry={"max_attempts": 2, "initial_backoff": 0})]
    )
    slow, _, _ = run_one(
        conn, [step("a", "lang.fail", retry={"max_attempts": 2, "initial_backoff": 800})]
    )
    assert waits(conn, quick)[0] < 0.35
    assert waits(conn, slow)[0] >= 0.4  # jittered to between half and all of it


@proves(("retry", "max_backoff"))
def test_max_backoff_caps_the_delay(conn, runner):
    retry = {"max_attempts": 3, "initial_backoff": 100, "backoff_multiplier": 10}
    capped, _, _ = run_one(conn, [step("a", "lang.fail", retry={**retry, "max_backoff": 150})])
    free, _, _ = run_one(conn, [step("a", "lang.fail", retry=retry)])
    assert waits(conn, capped)[1] < 0.35  # 75-150 ms, not the 500-1000 ms uncapped
    assert waits(conn, free)[1] >= 0.5


@proves(("retry", "backoff_multiplier"))
def test_backoff_multiplier_grows_the_delay(conn, runner):
    retry = {"max_attempts": 3, "initial_backoff": 100, "max_backoff": 60000}
    flat, _, _ = run_one(conn, [step("a", "lang.fail", retry={**retry, "backoff_multiplier": 1})])
    steep, _, _ = run_one(conn, [step("a", "lang.fail", retry={**retry, "backoff_multiplier": 10})])
    assert waits(conn, flat)[1] < 0.35  # 50-100 ms
    assert waits(conn, steep)[1] >= 0.5  # 500-1000 ms


@proves(("retry", "non_retryable_codes"))
def test_non_retryable_codes_stop_retrying(conn, runner):
    retry = {"max_attempts": 3, "initial_backoff": 0, "non_retryable_codes": ["declined"]}
    _, state, _ = run_one(conn, [step("a", "lang.fail", params={"code": "declined"}, retry=retry)])
    assert state == "failed" and len(CALLS) == 1
    CALLS.clear()
    _, state, _ = run_one(conn, [step("a", "lang.fail", params={"code": "busy"}, retry=retry)])
    assert state == "failed" and len(CALLS) == 3


GUARD = {
    "name": "charge once",
    "type": "effect_at_most_once",
    "kind": "worker",
    "commit_guard": True,
}


@proves(
    ("definition", "invariants"),
    ("invariant", "name"),
    ("invariant", "type"),
    ("invariant", "commit_guard"),
    ("invariant_type", "effect_at_most_once"),
)
def test_a_commit_guard_refuses_the_same_content_twice(conn, runner):
    same = {"amount": 5}
    blocks = [step("charge", params=same), step("again", params=same)]
    _, state, _ = run_one(conn, blocks)
    assert state == "completed" and len(CALLS) == 2  # without the invariant: both sent
    CALLS.clear()
    instance, state, error = run_one(conn, blocks, invariants=[GUARD])
    assert state == "failed" and error.startswith("InvariantViolation")
    assert [c[0] for c in CALLS] == ["charge"]  # the second was never dispatched
    refused = conn.execute(
        "SELECT w.name, r.status FROM orch8.invariant_results AS r"
        " JOIN orch8.workflow_invariants AS w"
        "  ON w.tenant_id = r.tenant_id AND w.id = r.invariant_id"
        " WHERE r.instance_id = %s ORDER BY r.id",
        (instance,),
    ).fetchall()
    assert refused == [("charge once", "pass"), ("charge once", "fail")]


@proves(("invariant", "kind"))
def test_a_guard_covers_only_its_kind(conn, runner):
    same = {"amount": 5}
    blocks = [step("charge", params=same), step("again", params=same)]
    _, state, _ = run_one(conn, blocks, invariants=[{**GUARD, "kind": "http"}])
    assert state == "completed" and len(CALLS) == 2  # custom handlers are kind worker


def test_every_supported_field_is_proven_end_to_end(conn):
    supported = set(
        conn.execute(
            "SELECT scope, field FROM orch8.sequence_language() WHERE supported"
        ).fetchall()
    )
    assert supported == set(PROOFS), (
        f"fields without an end-to-end test: {sorted(supported - set(PROOFS))}; "
        f"tests for fields the language does not accept: {sorted(set(PROOFS) - supported)}"
    )


# --- definitions stored before a field was refused ----------------------------------------


def test_a_definition_stored_before_a_field_was_refused_runs_as_stored(conn, runner):
    seq = store_sequence(conn, [step("a", when="false")], status="draft")
    instance = start(conn, seq, {})
    assert wait_for(conn, [instance])[instance][0] == "completed"
    assert [c[0] for c in CALLS] == ["a"]  # as before: when was never evaluated


def test_sequences_list_flags_definitions_with_refused_fields(db_url, conn):
    store_sequence(conn, [step("a", when="false")], name="old-flow", status="draft")
    make_sequence(conn, [step("a")], name="new-flow")
    env = orch8_env(ORCH8_DATABASE_URL=db_url)
    out = run_orch8("sequences", "list", "--tenant", TENANT, env=env)
    assert out.returncode == 0, out.stderr
    lines = {line.split()[1]: line for line in out.stdout.splitlines()[1:] if "-flow" in line}
    assert lines["old-flow"].rstrip().endswith("2 (!)")
    assert lines["new-flow"].rstrip().endswith("-")
    assert "1 sequence(s) use fields this orch8 no longer accepts" in out.stdout
    shown = run_orch8("sequences", "show", "old-flow", "--tenant", TENANT, env=env)
    assert "$.status: status is not supported yet" in shown.stdout
    assert "$.blocks[0].when: when is not supported yet" in shown.stdout
