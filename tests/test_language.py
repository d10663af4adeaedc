"""The sequence language accepts only what runs: every field orch8.sequence_language()
lists as supported has a test (here for steps, in tests/test_workflows.py for the
composite blocks) that runs a real instance on a real runner and shows that the field
changes what happens. A field added to the language without such a test
fails test_every_supported_field_is_proven_end_to_end.

Definitions stored before a field was refused keep running as they were stored, and
`orch8 sequences list` flags them."""

from __future__ import annotations

import time
from typing import Any

import pytest

from orch8_py.handlers import StepError, handler
from orch8_py.steps import (
    Applied,
    EffectReceipt,
    Inconclusive,
    NotApplied,
    StepContext,
    Verdict,
)
from tests.cli_helpers import orch8_env, run_orch8
from tests.http_provider import provider_fixture  # noqa: F401  (fixture: provider)
from tests.language_proofs import PROOFS, proves
from tests.runner_helpers import (
    TENANT,
    make_sequence,
    running,
    start,
    store_sequence,
    wait_for,
)

CALLS: list[tuple[str, dict[str, Any], int]] = []  # (block, params, attempt) per call


@handler("lang.record")
def record(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    CALLS.append((ctx.block_id, params, ctx.attempt))
    return {"seen": params, "block": ctx.block_id}


@handler("lang.fail")
def always_fail(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    # a clean failure (nothing was done): the retry policy decides, as for any step
    CALLS.append((ctx.block_id, params, ctx.attempt))
    raise NotApplied("no", code=params.get("code"))


KEYS: list[str | None] = []  # ctx.idempotency_key per call of lang.unsure
VERIFIED: list[tuple[str, str | None]] = []  # (verdict asked for, key) per verifier call


@handler("lang.unsure")
def unsure(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    """Sends, then cannot tell whether it landed (ambiguous) until ``ok_from`` calls."""
    CALLS.append((ctx.block_id, params, ctx.attempt))
    KEYS.append(ctx.idempotency_key)
    if len(KEYS) <= params.get("unsure_calls", 1):
        raise StepError("the provider went quiet after the request")
    return {"charged": True, "attempt": ctx.attempt, "receipt_id": f"ch-{len(KEYS)}"}


@unsure.verifier
def unsure_verifier(params: dict[str, Any], effect: EffectReceipt, ctx: StepContext) -> Verdict:
    verdict = params.get("verdict", "applied")
    VERIFIED.append((verdict, effect.idempotency_key))
    if verdict == "applied":
        return Applied({"looked": "ledger"}, "ch-found", {"charged": True, "by": "verifier"})
    if verdict == "not_applied":
        return NotApplied("no such charge", {"looked": "ledger"})
    return Inconclusive("the ledger is down")


@handler("lang.slow")
def slow(params: dict[str, Any], ctx: StepContext) -> dict[str, Any]:
    time.sleep(params["seconds"])
    return {"slept": params["seconds"]}


@pytest.fixture(autouse=True)
def fresh_calls():
    CALLS.clear()
    KEYS.clear()
    VERIFIED.clear()
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


UNSURE = {"initial_backoff": 0, "max_attempts": 3}


@proves(("step", "provider_idempotency"), ("retry", "on_ambiguous"))
def test_an_ambiguous_outcome_is_resent_only_as_the_step_says(conn, runner):
    _, state, _ = run_one(conn, [step("pay", "lang.unsure", retry=UNSURE)])
    assert state == "failed" and len(KEYS) == 1  # settle, the default: never resent
    KEYS.clear()
    blocks = [step("pay", "lang.unsure", retry=UNSURE, provider_idempotency=True)]
    _, state, _ = run_one(conn, blocks)
    assert state == "completed" and len(KEYS) == 2 and KEYS[0] == KEYS[1]  # one key
    KEYS.clear()
    fresh = {**UNSURE, "on_ambiguous": "new_attempt"}
    _, state, _ = run_one(conn, [step("pay", "lang.unsure", retry=fresh)])
    assert state == "completed" and len(KEYS) == 2 and KEYS[0] != KEYS[1]  # a new key


@proves(
    ("step", "verify"),
    ("verify", "handler"),
    ("verify", "schedule"),
    ("verify", "on_verified"),
    ("verify", "on_not_applied"),
)
def test_a_python_verifier_settles_the_unknown_outcome(conn, runner):
    def verified(verdict: str, **verify: Any) -> tuple[Any, str, str | None]:
        KEYS.clear()
        VERIFIED.clear()
        blocks = [
            step(
                "pay",
                "lang.unsure",
                params={"verdict": verdict},
                retry=UNSURE,
                verify={"handler": True, "schedule": [0, 0], **verify},
            ),
            step("after", params={"paid": "{{ outputs.pay.by | 'handler' }}"}),
        ]
        return run_one(conn, blocks)

    instance, state, _ = verified("applied")
    assert state == "completed" and len(KEYS) == 1  # continued, with the verifier's output
    assert outputs(conn, instance)[0] == ("pay", {"charged": True, "by": "verifier"})
    assert CALLS[-1] == ("after", {"paid": "verifier"}, 0)
    _, state, error = verified("applied", on_verified="stop")
    assert state == "failed" and "on_verified is stop" in error
    _, state, _ = verified("not_applied")
    assert state == "completed" and len(KEYS) == 2  # not applied: run again, and it lands
    _, state, error = verified("not_applied", on_not_applied="stop")
    assert state == "failed" and len(KEYS) == 1 and "on_not_applied is stop" in error
    _, state, error = verified("inconclusive")
    assert state == "failed" and len(VERIFIED) == 2  # one verifier call per scheduled try
    assert "still unknown after its verifier's last try" in error


@proves(("verify", "replay"))
def test_a_replay_resends_the_same_request_under_the_same_key(conn, runner):
    blocks = [
        step(
            "pay",
            "lang.unsure",
            params={"amount": 5},
            retry={"max_attempts": 1},
            provider_idempotency=True,
            verify={"replay": True, "schedule": [0]},
        )
    ]
    instance, state, _ = run_one(conn, blocks)
    assert state == "completed" and len(KEYS) == 2 and KEYS[0] == KEYS[1]
    assert [c[1] for c in CALLS] == [{"amount": 5}, {"amount": 5}]  # the identical request
    assert outputs(conn, instance) == [
        ("pay", {"charged": True, "attempt": 0, "receipt_id": "ch-2"})
    ]


@proves(
    ("verify", "http"),
    ("verify_http", "method"),
    ("verify_http", "url"),
    ("verify_http", "headers"),
    ("verify", "applied_if"),
    ("verify", "not_applied_if"),
    ("verify", "receipt_path"),
)
def test_an_http_verifier_looks_the_effect_up(conn, runner, provider, monkeypatch):
    monkeypatch.setenv("ORCH8_ALLOW_PRIVATE_URLS", "1")
    lookup = {
        "method": "POST",
        "url": provider.url + "/find/{{ effect.idempotency_key }}?amount={{ params.amount }}",
        "headers": {"X-Check": "{{ effect.block_id }}"},
    }
    verify = {
        "http": lookup,
        "applied_if": "response.json.found == true",
        "not_applied_if": "response.status == 404",
        "receipt_path": "json.charge",
        "schedule": [0],
    }
    pay = step("pay", "lang.unsure", params={"amount": 5}, retry={"max_attempts": 1})
    provider.always("/find/", json={"found": True, "charge": "ch-lookup"})
    instance, state, _ = run_one(conn, [{**pay, "verify": verify}])
    assert state == "completed"
    [req] = provider.requests
    assert (req.method, req.path, req.query) == ("POST", f"/find/{KEYS[0]}", "amount=5")
    assert req.headers["x-check"] == "pay"
    provider_id = conn.execute(
        "SELECT state::text, provider_receipt_id FROM orch8.effect_receipts WHERE instance_id = %s",
        (instance,),
    ).fetchone()
    assert provider_id == ("verified", "ch-lookup")
    KEYS.clear()
    provider.clear()
    provider.always("/find/", status=404, json={"found": False})
    instance, state, _ = run_one(conn, [{**pay, "verify": verify}])
    assert state == "failed"  # not applied, and no attempt left to run again
    receipt = conn.execute(
        "SELECT state::text FROM orch8.effect_receipts WHERE instance_id = %s", (instance,)
    ).fetchone()[0]
    assert receipt == "abandoned"


def test_every_supported_field_is_proven_end_to_end(conn):
    import tests.test_flow_control
    import tests.test_waits
    import tests.test_workflows  # noqa: F401

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
    seq = store_sequence(conn, [step("a", queue_name="billing")], status="draft")
    instance = start(conn, seq, {})
    assert wait_for(conn, [instance])[instance][0] == "completed"
    assert [c[0] for c in CALLS] == ["a"]  # as before: queue_name is not honoured


def test_sequences_list_flags_definitions_with_refused_fields(db_url, conn):
    store_sequence(conn, [step("a", queue_name="x")], name="old-flow", status="draft")
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
    assert "$.blocks[0].queue_name: queue_name is not supported yet" in shown.stdout


def test_a_verifier_expression_that_does_not_parse_is_refused_before_storing(conn):
    """applied_if is the runner's expression language: the door checks its syntax with
    the SQL validator's problems, so nothing stored fails to parse at the first try."""
    from orch8_py import sqlapi
    from orch8_py.errors import InvalidSequence

    definition = {
        "blocks": [
            step(
                "pay",
                "lang.unsure",
                retry={"max_attempts": 0},
                verify={"http": {"url": "https://x.example"}, "applied_if": "response.status =="},
            )
        ]
    }
    with pytest.raises(InvalidSequence) as refused:
        sqlapi.sequences.create_sequence(
            conn, tenant_id=TENANT, namespace="default", name="bad-verify", definition=definition
        )
    paths = [p["path"] for p in refused.value.problems]
    assert paths == ["$.blocks[0].retry.max_attempts", "$.blocks[0].verify.applied_if"]
    assert "response.status ==" in refused.value.problems[1]["message"]
    assert sqlapi.sequences.validate_sequence(conn, definition=definition) == refused.value.problems
    stored = conn.execute("SELECT count(*) FROM orch8.sequences WHERE name = 'bad-verify'")
    assert stored.fetchone()[0] == 0
