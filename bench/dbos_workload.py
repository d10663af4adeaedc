"""The bench's workloads on DBOS Transact (3.4.0), for bench/run_bench.py to run beside
orch8's: N workflows of 1 or 3 ``@DBOS.step()`` steps that do nothing but return a small
dict, on a DBOS queue with worker concurrency 8 (the runner's concurrency), each run in
a fresh database on the same server, dropped afterwards.

    python -m bench.dbos_workload --scenario "3-step effect" --instances 2000

prints one JSON line. DBOS has no pure step (nothing like orch8's transform, which
needs no receipt): the "pure" scenarios run the very same steps as the "effect" ones, so
DBOS's two rows of a size measure the same thing twice.

How the run matches orch8's (instances created first, then drained): a DBOSClient
migrates the system database, registers the queue and enqueues all N while no executor
is running; the clock starts just before DBOS.launch() (the executor's start-up is in
the time, as the runner's is in orch8's) and stops when the Nth workflow is SUCCESS.
The queue's polling interval is the orch8 runner's poll interval (--polling-interval):
a DBOS worker dequeues only on its polls, while the runner also claims again at once
when a slot frees, so at concurrency C DBOS starts at most C workflows a poll.
Latency is per workflow from dequeue (started_at_epoch_ms) to completed_at, the
counterpart of orch8's first claim to completion. Commits are this database's
xact_commit delta (read-only transactions and the bench's polls included, ten a second).
WAL bytes are the WAL records of this database (pg_walinspect, over a temporary
replication slot that keeps them from being recycled) and, as server_wal_bytes_per_step,
the whole server's pg_current_wal_lsn() delta, which includes anything else writing to
the server meanwhile; when the server refuses pg_walinspect or the slot, only the latter
is known. DBOS is one per process, so every run is a process of its own, which also
makes its peak RSS (VmHWM) the run's.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import time
import uuid
from typing import Any

import psycopg
import sqlalchemy as sa
from dbos import DBOS, DBOSClient
from psycopg import conninfo

from bench.measure import cpu_now, cpu_per_step, peak_rss_mb, percentile
from orch8_py import sqlapi
from tests import pgserver

APP = "orch8-bench"
QUEUE = "orch8_bench"
STALL_SECONDS = 120  # a run with no workflow completing for this long has failed


@DBOS.step()
def effect(n: int) -> dict[str, Any]:
    """Does nothing but answer like a provider would: the engine is what is measured."""
    return {"receipt_id": uuid.uuid4().hex, "n": n}


@DBOS.workflow(name="bench_1_step")
def one_step(n: int) -> dict[str, Any]:
    return effect(n)


@DBOS.workflow(name="bench_3_step")
def three_steps(n: int) -> dict[str, Any]:
    effect(n)
    effect(n)
    return effect(n)


# scenario (bench/run_bench.py's names) -> (workflow name, steps per workflow)
WORKFLOWS = {
    "1-step effect": ("bench_1_step", 1),
    "3-step effect": ("bench_3_step", 3),
    "1-step pure": ("bench_1_step", 1),
    "3-step pure": ("bench_3_step", 3),
}


def sqlalchemy_url(admin_url: str, dbname: str) -> str:
    """The server of ``admin_url`` (a URL or key=value conninfo), database ``dbname``, as
    the SQLAlchemy URL DBOS takes."""
    params = conninfo.conninfo_to_dict(admin_url)
    port = params.pop("port", None)
    host = params.pop("host", None)
    if isinstance(host, str) and host.startswith("/"):
        # a socket directory (the embedded server's) goes in the query: as the URL's host
        # SQLAlchemy renders it into the path, and DBOS found another server
        params["host"], host = host, None
    url = sa.engine.URL.create(
        "postgresql+psycopg",
        username=params.pop("user", None),
        password=params.pop("password", None),
        host=host,
        port=int(port) if port else None,
        database=dbname,
        query={k: str(v) for k, v in params.items() if k != "dbname"},
    )
    return url.render_as_string(hide_password=False)


def enqueue_all(url: str, workflow: str, n: int, concurrency: int, polling: float) -> float:
    """Register the queue and enqueue ``n`` workflows with no executor running; seconds."""
    t0 = time.perf_counter()
    # A client enqueues one workflow a round trip: threads keep setup short at 10000.
    client = DBOSClient(system_database_url=url, application_name=APP, system_database_pool_size=8)
    try:
        client.register_queue(QUEUE, worker_concurrency=concurrency, polling_interval_sec=polling)
        with cf.ThreadPoolExecutor(8) as pool:
            for _ in pool.map(
                lambda i: client.enqueue({"workflow_name": workflow, "queue_name": QUEUE}, i),
                range(1, n + 1),
            ):
                pass
    finally:
        client.destroy()
    return time.perf_counter() - t0


def wait_for_sessions_to_end(conn: psycopg.Connection[Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while sqlapi.benchmarks.other_sessions_here(conn) and time.monotonic() < deadline:
        time.sleep(0.05)


def run(admin_url: str, scenario: str, n: int, concurrency: int, polling: float) -> dict[str, Any]:
    workflow, steps = WORKFLOWS[scenario]
    dbname = f"orch8_bench_dbos_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as c:
        sqlapi.server.ensure_database(c, dbname)
    url = sqlalchemy_url(admin_url, dbname)
    try:
        DBOS.migrate(url)
        enqueue_s = enqueue_all(url, workflow, n, concurrency, polling)
        with psycopg.connect(pgserver.with_dbname(admin_url, dbname), autocommit=True) as conn:
            wait_for_sessions_to_end(conn)  # the client's, so its commits are not the run's
            own_wal = sqlapi.benchmarks.watch_wal(conn)
            before = sqlapi.benchmarks.counters(conn)
            DBOS(config={"name": APP, "system_database_url": url, "log_level": "WARNING"})
            t0 = time.perf_counter()
            cpu_start = cpu_now()
            DBOS.launch()
            launch_s = time.perf_counter() - t0
            done = 0
            progressed = time.monotonic()
            while done < n:
                time.sleep(0.1)
                counts = sqlapi.benchmarks.dbos_status_counts(conn)
                if counts.get("ERROR"):
                    raise SystemExit(f"{counts['ERROR']} DBOS workflow(s) failed in {scenario}")
                if counts.get("SUCCESS", 0) > done:
                    progressed = time.monotonic()
                done = counts.get("SUCCESS", 0)
                # DBOS logs and carries on when its queue thread fails: do not wait forever
                if time.monotonic() - progressed > STALL_SECONDS:
                    raise SystemExit(
                        f"no progress for {STALL_SECONDS} s at {done}/{n} in {scenario}"
                    )
            elapsed = time.perf_counter() - t0
            cpu_end = cpu_now()
            wal_end = sqlapi.benchmarks.wal_position(conn)
            DBOS.destroy()
            wait_for_sessions_to_end(conn)  # a backend flushes its statistics as it exits
            after = sqlapi.benchmarks.counters(conn)
            latencies = sqlapi.benchmarks.dbos_run_latencies(conn)
            wal = (
                sqlapi.benchmarks.database_wal(conn, start=before.wal_bytes, end=wal_end)
                if own_wal
                else None
            )
    finally:
        pgserver.drop(admin_url, dbname)
    total_steps = n * steps
    return {
        "engine": "dbos",
        "scenario": scenario,
        "instances": n,
        "steps": total_steps,
        "seconds": elapsed,
        "setup_seconds": enqueue_s,
        "launch_seconds": launch_s,
        "steps_per_s": total_steps / elapsed,
        "instances_per_s": n / elapsed,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "round_trips_per_step": None,  # DBOS counts none; see commits_per_step
        "commits_per_step": (after.commits - before.commits) / total_steps,
        "rollbacks_per_step": (after.rollbacks - before.rollbacks) / total_steps,
        "server_commits_per_step": (after.server_commits - before.server_commits) / total_steps,
        "wal_bytes_per_step": None if wal is None else wal.bytes / total_steps,
        "wal_fpi_share": None if wal is None else wal.fpi_bytes / max(wal.bytes, 1),
        "server_wal_bytes_per_step": (wal_end - before.wal_bytes) / total_steps,
        "peak_rss_mb": peak_rss_mb(),
        **cpu_per_step(cpu_start, cpu_end, total_steps),
        "polling_interval_s": polling,
        "concurrency": concurrency,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", required=True, choices=sorted(WORKFLOWS))
    p.add_argument("--instances", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--polling-interval", type=float, default=0.05)
    args = p.parse_args(argv)
    url = os.environ.get("ORCH8_DATABASE_URL") or os.environ.get("ORCH8_TEST_DATABASE_URL")
    if not url:
        print("bench: set ORCH8_DATABASE_URL to the server to benchmark", file=sys.stderr)
        return 2
    result = run(url, args.scenario, args.instances, args.concurrency, args.polling_interval)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
