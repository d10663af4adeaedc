"""Baseline benchmark: N instances of 1- and 3-step sequences, side-effecting (a guarded
in-process no-op) and pure (transform), run by one in-process runner.

    python -m bench.run_bench [--instances 2000] [--concurrency 8]

Uses ORCH8_DATABASE_URL (else ORCH8_TEST_DATABASE_URL) as the server; each scenario runs
in a fresh database created there and dropped afterwards. Prints steps/s, instances/s,
p50/p99 start-to-completion latency and database round trips per step, counted by the
runner.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
import uuid

import psycopg

from orch8_py import migrate, sqlapi
from orch8_py.handlers import handler
from orch8_py.runner import Runner, Settings
from tests import pgserver

TENANT = "bench"


@handler("bench.effect")
def effect(params, ctx):
    """Side-effecting (not a builtin), does nothing: measures the engine, not a provider."""
    return {"receipt_id": str(ctx.effect_id)}


SCENARIOS = {
    "1-step effect": [{"handler": "bench.effect"}],
    "3-step effect": [{"handler": "bench.effect"}] * 3,
    "1-step pure": [{"handler": "transform", "params": {"expression": "data.n + 1"}}],
    "3-step pure": [{"handler": "transform", "params": {"expression": "data.n + 1"}}] * 3,
}


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run_scenario(admin_url: str, name: str, steps: list[dict], n: int, concurrency: int) -> dict:
    dbname = f"orch8_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as c:
        sqlapi.server.ensure_database(c, dbname)
    url = pgserver.with_dbname(admin_url, dbname)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            migrate.migrate(conn)
            blocks = [{"type": "step", "id": f"s{i}", **s} for i, s in enumerate(steps)]
            seq = sqlapi.sequences.create_sequence(
                conn,
                tenant_id=TENANT,
                namespace="default",
                name="bench",
                definition={"blocks": blocks},
            )["id"]
            print(f"  {name}: creating {n} instances ...", flush=True)
            sqlapi.instances.create_instances(conn, tenant_id=TENANT, sequence_id=seq, count=n)
            runner = Runner(url, Settings(concurrency=concurrency, poll_interval=0.05))
            stop = threading.Event()
            t0 = time.perf_counter()
            thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
            thread.start()
            done = 0
            while done < n:
                time.sleep(0.25)
                counts = sqlapi.observe.completion_counts(conn)
                done, failed = counts["completed"], counts["failed"]
                if failed:
                    raise SystemExit(f"{failed} instance(s) failed in scenario {name}")
                print(f"\r  {name}: {done}/{n} completed", end="", flush=True)
            elapsed = time.perf_counter() - t0
            stop.set()
            thread.join(timeout=30)
            print(flush=True)
            latencies = sqlapi.observe.run_latencies(conn)
            total_steps = n * len(steps)
            return {
                "scenario": name,
                "instances": n,
                "steps": total_steps,
                "seconds": elapsed,
                "steps_per_s": total_steps / elapsed,
                "instances_per_s": n / elapsed,
                "p50_ms": percentile([float(v) for v in latencies], 0.5) * 1000,
                "p99_ms": percentile([float(v) for v in latencies], 0.99) * 1000,
                "round_trips_per_step": runner.round_trips / total_steps,
            }
    finally:
        pgserver.drop(admin_url, dbname)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instances", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    args = p.parse_args(argv)
    url = os.environ.get("ORCH8_DATABASE_URL") or os.environ.get("ORCH8_TEST_DATABASE_URL")
    if not url:
        print("bench: set ORCH8_DATABASE_URL to the server to benchmark", file=sys.stderr)
        return 2
    with psycopg.connect(url) as c:
        version = sqlapi.server.server_version(c)
    print(
        f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, PostgreSQL {version}"
    )
    results = [
        run_scenario(url, name, SCENARIOS[name], args.instances, args.concurrency)
        for name in (args.scenario or SCENARIOS)
    ]
    print()
    header = (
        f"{'scenario':<15} {'steps/s':>9} {'inst/s':>8} {'p50 ms':>9} {'p99 ms':>9} {'RT/step':>8}"
    )
    print(header)
    for r in results:
        print(
            f"{r['scenario']:<15} {r['steps_per_s']:>9.0f} {r['instances_per_s']:>8.0f} "
            f"{r['p50_ms']:>9.1f} {r['p99_ms']:>9.1f} {r['round_trips_per_step']:>8.2f}"
        )
    print(f"\n({args.instances} instances per scenario, runner concurrency {args.concurrency})")
    print(
        f"mean steps/s across scenarios: {statistics.mean(r['steps_per_s'] for r in results):.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
