"""External workers killed at random (`make chaos` runs it at scale; `make test` a short
variant): `orch8 worker` processes serve a charge step on a real HTTP provider while a
killer sends SIGKILL to a random one now and then and starts a replacement. Whatever the
kills hit (a worker between its poll and its first heartbeat, in the middle of a charge,
between the charge and its report), afterwards:

- no idempotency key reached the provider twice (the step settles an unknown receipt,
  never resends);
- nothing is lost: every instance completed, or failed on a blocked charge whose receipt
  is unknown (in the operator queue), and no task is left queued or running;
- a committed receipt's key reached the provider exactly once.

ORCH8_CHAOS_WORKER_INSTANCES and ORCH8_CHAOS_WORKER_KILLS set the size."""

from __future__ import annotations

import collections
import os
import random
import signal
import threading
import time

import pytest

from tests.http_provider import Provider, Reply
from tests.runner_helpers import make_sequence, running, start, wait_for
from tests.worker_harness import serve, spawn_worker, stop

INSTANCES = int(os.environ.get("ORCH8_CHAOS_WORKER_INSTANCES", "80"))
KILLS = int(os.environ.get("ORCH8_CHAOS_WORKER_KILLS", "3"))
WORKERS = 3

pytestmark = pytest.mark.timeout(900)


def test_workers_killed_at_random_lose_nothing_and_send_nothing_twice(db_url, conn, tmp_path):
    provider = Provider().start()
    rng = random.Random(13)
    # every charge takes a while (so kills land mid-task), answered with a receipt id
    provider.script(
        "/charge",
        *[
            Reply(json={"receipt_id": f"ch_{i}"}, delay=rng.uniform(0.05, 0.4))
            for i in range(INSTANCES * 2)
        ],
    )
    seq = make_sequence(
        conn,
        [
            {
                "type": "step",
                "id": "charge",
                "handler": "test.charge",
                "params": {"url": provider.url + "/charge", "amount": "{{ data.n }}"},
            },
            {"type": "step", "id": "done", "handler": "noop"},
        ],
    )
    kills = 0
    workers: dict[str, object] = {}
    try:
        with serve(db_url, long_polls=WORKERS + 2) as api:
            api.register("test.charge", redeliver_unstarted=True)
            serial = iter(range(1000))

            def spawn() -> None:
                name = f"w{next(serial)}"
                workers[name] = spawn_worker(
                    api, name, tmp_path / f"{name}.log", "--lease", "3", "--concurrency", "4"
                )

            for _ in range(WORKERS):
                spawn()
            done = threading.Event()

            def killer() -> None:
                nonlocal kills
                # paced so that every kill lands while work remains (a full run takes
                # about 25 s; the short one in make test a few seconds)
                while kills < KILLS and not done.wait(rng.uniform(0.3, 0.9)):
                    name = rng.choice(sorted(workers))
                    proc = workers.pop(name)
                    proc.send_signal(signal.SIGKILL)  # type: ignore[attr-defined]
                    proc.wait(10)  # type: ignore[attr-defined]
                    kills += 1
                    spawn()

            with running(db_url, concurrency=8):
                instances = [start(conn, seq, {"n": i}) for i in range(INSTANCES)]
                chaos = threading.Thread(target=killer, daemon=True)
                chaos.start()
                started = time.monotonic()
                states = wait_for(conn, instances, timeout=600)
                elapsed = time.monotonic() - started
                done.set()
                chaos.join(10)
            for proc in workers.values():
                stop(proc)  # type: ignore[arg-type]
    finally:
        provider.stop()

    charges = provider.requests_to("/charge")
    sent = collections.Counter(r.headers["idempotency-key"] for r in charges)
    twice = [k for k, n in sent.items() if n > 1]
    assert twice == [], f"{len(twice)} key(s) reached the provider twice"

    rows = conn.execute(
        "SELECT t.id, t.state::text, r.state::text, r.idempotency_key, n.state::text"
        " FROM orch8.task_instances AS t"
        " JOIN orch8.execution_nodes AS n ON n.instance_id = t.id AND n.path = 'charge'"
        " JOIN orch8.effect_receipts AS r ON r.instance_id = t.id AND r.block_id = 'charge'"
        " WHERE t.id = ANY(%s)",
        (instances,),
    ).fetchall()
    outcome = collections.Counter()
    for instance, state, receipt, key, node in rows:
        if state == "completed":
            assert receipt == "committed" and sent[key] == 1, (instance, receipt, sent[key])
            outcome["completed"] += 1
        else:
            assert (state, node, receipt) == ("failed", "blocked", "unknown"), (
                instance,
                state,
                node,
                receipt,
            )
            assert sent[key] <= 1
            outcome["blocked"] += 1
    assert sum(outcome.values()) == INSTANCES == len(states)
    left = conn.execute(
        "SELECT count(*) FROM orch8.worker_tasks WHERE state IN ('queued', 'running')"
    ).fetchone()[0]
    assert left == 0, "every task was closed"
    redelivered = conn.execute(
        "SELECT count(*) FROM orch8.worker_task_events WHERE event = 'redelivered'"
    ).fetchone()[0]
    print(
        f"worker chaos: {INSTANCES} instances, {kills} SIGKILLs in {elapsed:.1f} s: "
        f"{outcome['completed']} completed, {outcome['blocked']} blocked with an unknown "
        f"receipt (killed mid-charge), {redelivered} task(s) redelivered unstarted; "
        f"{len(sent)} keys sent, none twice"
    )
    assert kills == KILLS
