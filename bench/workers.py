"""External workers under load: N instances of a one-step sequence whose handler is served
by W `orch8 worker` processes through the operator service (waitress, on loopback), an
in-process runner dispatching the steps.

    python -m bench.workers [--instances 1000] [--workers 4] [--concurrency 8]

The instances are created first; then one in-process runner dispatches them and the
time runs until the last completes. Prints instances/s, and from the tasks' own events:
queued -> claimed (the long-poll's pick-up latency) and queued -> completed, p50 and
p99. Uses ORCH8_DATABASE_URL (else
ORCH8_TEST_DATABASE_URL); a fresh database is created there and dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from bench.measure import percentile
from orch8_py import migrate, sqlapi
from tests import pgserver
from tests.runner_helpers import TENANT, running, wait_for
from tests.worker_harness import serve, spawn_worker, stop

HANDLER_MODULE = "bench.worker_noop"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.workers", description=__doc__)
    p.add_argument("--instances", type=int, default=1000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=8, help="tasks per worker at once")
    args = p.parse_args(argv)
    admin = os.environ.get("ORCH8_DATABASE_URL") or os.environ.get("ORCH8_TEST_DATABASE_URL")
    if not admin:
        print("set ORCH8_DATABASE_URL (or ORCH8_TEST_DATABASE_URL)", file=sys.stderr)
        return 2
    dbname = f"orch8_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as c:
        sqlapi.server.ensure_database(c, dbname)
    url = pgserver.with_dbname(admin, dbname)
    logs = Path(tempfile.mkdtemp(prefix="orch8-bench-workers-"))
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            migrate.migrate(conn)
            seq = sqlapi.sequences.create_sequence(
                conn,
                tenant_id=TENANT,
                namespace="default",
                name="bench",
                definition={"blocks": [{"type": "step", "id": "s", "handler": "bench.noop"}]},
            )["id"]
            with serve(url, long_polls=args.workers + 2) as api:
                api.register("bench.noop")
                workers = [
                    spawn_worker(
                        api,
                        f"w{i}",
                        logs / f"w{i}.log",
                        "--concurrency",
                        str(args.concurrency),
                        module=HANDLER_MODULE,
                    )
                    for i in range(args.workers)
                ]
                time.sleep(2)  # the workers are up and polling
                try:
                    # created first, then one runner drains them: the time is the engine's
                    ids = [
                        sqlapi.instances.create_instance(
                            conn, tenant_id=TENANT, sequence_id=seq, data={}
                        ).id
                        for _ in range(args.instances)
                    ]
                    with running(url, concurrency=8):
                        started = time.monotonic()
                        wait_for(conn, ids, timeout=600)
                        elapsed = time.monotonic() - started
                finally:
                    for w in workers:
                        stop(w)
            lags = sqlapi.observe.worker_task_lags(conn)
            version = sqlapi.server.server_version(conn)
    finally:
        pgserver.drop(admin, dbname)
    pickup = [r["claimed_s"] * 1000 for r in lags]
    whole = [r["completed_s"] * 1000 for r in lags]
    print(
        f"machine: {os.cpu_count()} cores, {platform.machine()}, PostgreSQL {version}; "
        f"{args.workers} worker processes x {args.concurrency}, one in-process runner"
    )
    print(
        f"{args.instances} instances in {elapsed:.1f} s: {args.instances / elapsed:.0f}/s; "
        f"queued -> claimed p50 {percentile(pickup, 0.5):.1f} ms p99 {percentile(pickup, 0.99):.1f}"
        f" ms; queued -> completed p50 {percentile(whole, 0.5):.1f} ms p99 "
        f"{percentile(whole, 0.99):.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
