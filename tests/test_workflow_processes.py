"""Composite blocks under real `orch8 run` processes: a runner killed with SIGKILL at each
fault point inside a parallel branch, a for_each iteration and a saga's compensation
(every request the provider saw arrived once; the crashed node's receipt is unknown and
blocks only its own branch; resolving it and retrying finishes the instance), and two
runner processes sharing the branches of one instance. The chaos run (`make chaos` raises
ORCH8_CHAOS_TREE_INSTANCES and ORCH8_CHAOS_TREE_KILLS) pushes a sequence of parallel,
for_each and saga through two runners while one of them is killed again and again."""

from __future__ import annotations

import collections
import os
import random
import re
import signal
import time

import psycopg
import pytest

from tests.http_provider import Provider
from tests.runner_helpers import TENANT, make_sequence, spawn_runner, start, wait_for

FAST_LEASE = {"ORCH8_LEASE_SECONDS": "2", "ORCH8_HEARTBEAT_SECONDS": "0.5"}
# `make chaos` raises these; `make test` runs the short variant
TREE_INSTANCES = int(os.environ.get("ORCH8_CHAOS_TREE_INSTANCES", "30"))
TREE_KILLS = int(os.environ.get("ORCH8_CHAOS_TREE_KILLS", "3"))


@pytest.fixture
def provider_proc():
    p = Provider().start()
    yield p
    p.stop()


def post(block_id: str, url: str, **fields):
    return {
        "type": "step",
        "id": block_id,
        "handler": "http_request",
        "params": {"method": "POST", "url": url, "json": {"n": "{{ instance_id }}"}},
        "retry": {"max_attempts": 1},
        **fields,
    }


def stop(proc, timeout=30):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=timeout)
    return proc.returncode


def keys_sent(provider: Provider) -> collections.Counter:
    return collections.Counter(r.headers.get("idempotency-key") for r in provider.requests)


def structures(url: str) -> dict[str, tuple[list, str, str]]:
    """name -> (blocks, the path that crashes, the paths whose requests must arrive once)."""
    return {
        "branch": (
            [
                {
                    "type": "parallel",
                    "id": "fan",
                    "branches": [
                        [post("charge_a", url + "/a")],
                        [post("charge_b", url + "/b"), post("ship_b", url + "/ship")],
                    ],
                }
            ],
            r"^fan#0/charge_a$",
            "fan#0/charge_a",
        ),
        "iteration": (
            [
                {
                    "type": "for_each",
                    "id": "items",
                    "collection": "data.items",
                    "body": [post("charge", url + "/item")],
                }
            ],
            r"^items\[1\]/charge$",
            "items[1]/charge",
        ),
        "compensation": (
            [
                {
                    "type": "saga",
                    "id": "trip",
                    "blocks": [
                        post(
                            "book",
                            url + "/book",
                            compensation={
                                "handler": "http_request",
                                "params": {"method": "POST", "url": url + "/unbook"},
                            },
                        ),
                        {"type": "step", "id": "car", "handler": "fail"},
                    ],
                }
            ],
            r"^trip\.undo/book$",
            "trip.undo/book",
        ),
    }


@pytest.mark.parametrize("fault", ["after_dispatch", "before_finish"])
@pytest.mark.parametrize("where", ["branch", "iteration", "compensation"])
def test_sigkill_inside_a_composite_blocks_only_the_crashed_node(
    db_url, conn, provider_proc, tmp_path, fault, where
):
    blocks, crash_at, crashed = structures(provider_proc.url)[where]
    seq = make_sequence(conn, blocks)
    instance = start(conn, seq, {"items": [1, 2, 3]})
    # one instance thread: the other branch is at most claimed, never begun, at the kill
    crashing = spawn_runner(
        db_url,
        tmp_path / "crash.log",
        ORCH8_FAULT_POINT=fault,
        ORCH8_FAULT_PATH=crash_at,
        ORCH8_CONCURRENCY="1",
        **FAST_LEASE,
    )
    assert crashing.wait(timeout=60) == -signal.SIGKILL, (tmp_path / "crash.log").read_text()
    survivor = spawn_runner(db_url, tmp_path / "survivor.log", **FAST_LEASE)
    try:
        state, error = wait_for(conn, [instance])[instance]
        assert state == "failed" and error.startswith("EffectBlocked"), error
        node = conn.execute(
            "SELECT state::text FROM orch8.execution_nodes WHERE instance_id = %s AND path = %s",
            (instance, crashed),
        ).fetchone()
        assert node == ("blocked",)
        receipt_id, receipt_state = conn.execute(
            "SELECT id, state::text FROM orch8.effect_receipts WHERE instance_id = %s"
            " AND block_id = %s",
            (instance, crashed),
        ).fetchone()
        assert receipt_state == "unknown"
        queued = conn.execute(
            "SELECT block_id FROM orch8.unresolved_effects WHERE instance_id = %s AND blocking",
            (instance,),
        ).fetchall()
        assert (crashed,) in queued
        if where == "branch":  # the other branch went on and finished
            done = conn.execute(
                "SELECT path FROM orch8.execution_nodes WHERE instance_id = %s"
                " AND state = 'completed' AND path LIKE 'fan#1%%' ORDER BY path",
                (instance,),
            ).fetchall()
            assert done == [("fan#1",), ("fan#1/charge_b",), ("fan#1/ship_b",)]
        # the operator asks the provider, which did or did not get it
        arrived = any(
            r.headers.get("idempotency-key") == str(receipt_id) for r in provider_proc.requests
        )
        assert arrived == (fault == "before_finish")
        if arrived:
            conn.execute(
                "SELECT orch8.resolve_effect(%s, %s, 'unknown', 'committed', NULL,"
                " '{\"checked\": \"provider\"}', 'op', NULL, '{\"status\": 200}')",
                (TENANT, receipt_id),
            )
        else:
            conn.execute(
                "SELECT orch8.resolve_effect(%s, %s, 'unknown', 'abandoned', NULL,"
                " '{\"checked\": \"provider has none\"}', 'op')",
                (TENANT, receipt_id),
            )
        conn.execute("SELECT * FROM orch8.retry_instance(%s, %s, 'op')", (TENANT, instance))
        state, error = wait_for(conn, [instance])[instance]
    finally:
        assert stop(survivor) == 0, (tmp_path / "survivor.log").read_text()
    if where == "compensation":  # the saga compensated, then failed as it should
        assert state == "failed" and error.startswith("saga trip compensated 1 step(s)"), error
        book = conn.execute(
            "SELECT state::text FROM orch8.effect_receipts WHERE instance_id = %s"
            " AND block_id = 'trip/book'",
            (instance,),
        ).fetchone()
        assert book == ("compensated",)
    else:
        assert (state, error) == ("completed", None)
    # every effect reached the provider at most once, whatever crashed where
    assert max(keys_sent(provider_proc).values()) == 1, keys_sent(provider_proc)


def test_two_runner_processes_share_the_branches_of_one_instance(
    db_url, conn, provider_proc, tmp_path
):
    provider_proc.always("/slow", json={"receipt_id": "ok"}, delay=1.0)
    branches = [[post(f"b{i}", provider_proc.url + "/slow")] for i in range(4)]
    seq = make_sequence(conn, [{"type": "parallel", "id": "fan", "branches": branches}])
    logs = [tmp_path / "one.log", tmp_path / "two.log"]
    # one instance thread each: a runner holds one node running and one queued, so the
    # other must take the rest
    runners = [spawn_runner(db_url, log, ORCH8_CONCURRENCY="1") for log in logs]
    try:
        deadline = time.monotonic() + 30
        while not all("event=runner.start" in log.read_text() for log in logs):
            assert time.monotonic() < deadline, [log.read_text() for log in logs]
            time.sleep(0.05)
        time.sleep(0.3)  # both listening
        started = time.monotonic()
        instance = start(conn, seq)
        assert wait_for(conn, [instance])[instance] == ("completed", None)
        elapsed = time.monotonic() - started
    finally:
        for proc, log in zip(runners, logs, strict=True):
            assert stop(proc) == 0, log.read_text()
    ran = [
        set(re.findall(r"event=step.done .*?block=(fan#\d/b\d)", log.read_text())) for log in logs
    ]
    assert ran[0] and ran[1], ran  # each runner ran branches of the same instance
    assert ran[0] | ran[1] == {f"fan#{i}/b{i}" for i in range(4)} and not ran[0] & ran[1]
    assert elapsed < 3.6, f"four 1 s branches on two runners took {elapsed:.1f} s"
    assert len(provider_proc.requests) == 4
    with psycopg.connect(db_url) as fresh:
        owners = fresh.execute(
            "SELECT count(DISTINCT lease_owner) FROM orch8.execution_nodes WHERE instance_id = %s",
            (instance,),
        ).fetchone()
        assert owners == (0,)  # no lease left behind


def chaos_sequence(conn, url: str, saga_fails: bool) -> object:
    """parallel(for_each(charge per item), saga(book with unbook, ship or a failure))."""
    item = post("charge", url + "/item")
    item["params"]["json"] = {"n": "{{ instance_id }}", "item": "{{ item }}"}
    book = post(
        "book",
        url + "/book",
        compensation={
            "handler": "http_request",
            "params": {"method": "POST", "url": url + "/unbook"},
        },
    )
    last = (
        {"type": "step", "id": "ship", "handler": "fail"}
        if saga_fails
        else post("ship", url + "/ship")
    )
    return make_sequence(
        conn,
        [
            {
                "type": "parallel",
                "id": "fan",
                "branches": [
                    [
                        {
                            "type": "for_each",
                            "id": "items",
                            "collection": "data.items",
                            "concurrency": 2,
                            "body": [item],
                        }
                    ],
                    [{"type": "saga", "id": "trip", "blocks": [book, last]}],
                ],
            },
            post("notify", url + "/notify"),
        ],
    )


def test_chaos_a_tree_of_blocks_through_runners_killed_again_and_again(
    db_url, conn, provider_proc, tmp_path
):
    url = provider_proc.url
    for path in ("/item", "/book", "/unbook", "/ship", "/notify"):
        provider_proc.always(path, json={"receipt_id": "ok"}, delay=0.05)
    ok_seq, failing_seq = chaos_sequence(conn, url, False), chaos_sequence(conn, url, True)
    instances = {
        start(conn, failing_seq if i % 5 == 0 else ok_seq, {"items": [1, 2, 3]}): i % 5 == 0
        for i in range(TREE_INSTANCES)
    }
    steady = spawn_runner(db_url, tmp_path / "steady.log", ORCH8_CONCURRENCY="4", **FAST_LEASE)
    rng = random.Random(11)
    logs = []
    try:
        for n in range(TREE_KILLS):  # a runner killed at a random moment, then a new one
            logs.append(tmp_path / f"victim{n}.log")
            victim = spawn_runner(db_url, logs[-1], ORCH8_CONCURRENCY="4", **FAST_LEASE)
            deadline = time.monotonic() + 60
            while "event=step.done" not in logs[-1].read_text():  # it is working
                assert time.monotonic() < deadline and victim.poll() is None, logs[-1].read_text()
                time.sleep(0.005)
            seen = len(provider_proc.requests)
            while len(provider_proc.requests) < seen + rng.randint(2, 12):
                assert time.monotonic() < deadline, logs[-1].read_text()[-3000:]
                time.sleep(0.005)
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
        states = wait_for(conn, list(instances), timeout=120 + TREE_INSTANCES)
    finally:
        assert stop(steady) == 0, (tmp_path / "steady.log").read_text()[-3000:]
    # every effect reached the provider at most once, whichever runner died where
    sent = keys_sent(provider_proc)
    assert max(sent.values()) == 1, [k for k, c in sent.items() if c > 1]
    receipts = {
        str(i): (s, b)
        for i, s, b in conn.execute(
            "SELECT id, state::text, block_id FROM orch8.effect_receipts"
            " WHERE instance_id = ANY(%s)",
            (list(instances),),
        ).fetchall()
    }
    assert set(sent) <= set(receipts)  # nothing was sent without its receipt first
    outcomes: collections.Counter = collections.Counter()
    for instance, saga_fails in instances.items():
        state, error = states[instance]
        mine = conn.execute(
            "SELECT block_id, state::text FROM orch8.effect_receipts WHERE instance_id = %s",
            (instance,),
        ).fetchall()
        if state == "failed" and error.startswith("EffectBlocked"):
            # a crash in the middle of a dispatch: that receipt waits for an operator
            blocking = conn.execute(
                "SELECT count(*) FROM orch8.unresolved_effects WHERE instance_id = %s AND blocking",
                (instance,),
            ).fetchone()[0]
            assert blocking >= 1, (instance, mine)
            outcomes["blocked"] += 1
        elif saga_fails:
            assert state == "failed" and error.startswith("saga trip compensated"), error
            assert ("fan#1/trip/book", "compensated") in mine, mine
            outcomes["compensated"] += 1
        else:
            assert (state, error) == ("completed", None)
            paths = sorted(b for b, s in mine if s == "committed")
            assert paths == [
                "fan#0/items[0]/charge",
                "fan#0/items[1]/charge",
                "fan#0/items[2]/charge",
                "fan#1/trip/book",
                "fan#1/trip/ship",
                "notify",
            ], mine
            outcomes["completed"] += 1
    # no step that completed ran again: one committed receipt per node path at most
    committed = collections.Counter(
        (str(i), b)
        for i, b in conn.execute(
            "SELECT instance_id, block_id FROM orch8.effect_receipts"
            " WHERE instance_id = ANY(%s) AND state IN ('committed', 'compensated')",
            (list(instances),),
        ).fetchall()
    )
    assert max(committed.values()) == 1
    print(
        f"\nchaos tree: {TREE_INSTANCES} instances, {TREE_KILLS} runner(s) killed;"
        f" {dict(outcomes)}; {len(sent)} request(s), none twice"
    )
