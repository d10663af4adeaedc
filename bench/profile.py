"""Where PostgreSQL spends a step: one orch8 run of a scenario with every function's
calls and time counted (track_functions = all), printed per step.

    python -m bench.profile [--scenario "3-step effect"] [--instances 2000]
                            [--concurrency 128] [--top 25]

Self time is a function's own work, without the functions it calls; total time includes
them, and lock waits inside either. Counting costs a little itself (a clock read per
call), so compare profiles with each other, not with a bench run. Uses ORCH8_DATABASE_URL
(else ORCH8_TEST_DATABASE_URL) as the server, on a fresh database it drops afterwards.
"""

from __future__ import annotations

import argparse
import os
import sys

import psycopg

from bench import run_bench
from orch8_py import config, sqlapi
from tests import pgserver


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="3-step effect", choices=sorted(run_bench.SCENARIOS))
    p.add_argument("--instances", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=config.DEFAULT_CONCURRENCY)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    admin = os.environ.get("ORCH8_DATABASE_URL") or os.environ.get("ORCH8_TEST_DATABASE_URL")
    if not admin:
        print("bench.profile: set ORCH8_DATABASE_URL (this user must be able to create databases)")
        return 2
    steps = run_bench.SCENARIOS[args.scenario]
    dbname, url, seq = run_bench.create_bench_database(admin, "orch8_profile", steps)
    try:
        with psycopg.connect(admin, autocommit=True) as c:
            sqlapi.benchmarks.track_functions(c, dbname=dbname)
        r = run_bench.run_scenario(
            admin, args.scenario, steps, args.instances, args.concurrency, existing=(url, seq)
        )
        with psycopg.connect(url, autocommit=True) as conn:
            rows = sqlapi.benchmarks.function_profile(conn)
        n = r["steps"]
        print(
            f"{args.scenario}, {args.instances} instances, concurrency {args.concurrency}:"
            f" {r['steps_per_s']:.0f} steps/s, {r['round_trips_per_step']:.2f} round trips"
            f" and {r['commits_per_step']:.2f} commits per step"
        )
        print(f"{'function':40} {'calls/step':>10} {'self ms/step':>13} {'total ms/step':>14}")
        for row in rows[: args.top]:
            print(
                f"{row['name']:40} {row['calls'] / n:10.2f} {row['self_ms'] / n:13.3f}"
                f" {row['total_ms'] / n:14.3f}"
            )
        total = sum(float(x["self_ms"]) for x in rows) / n
        print(f"{'(all orch8 functions, self)':40} {'':10} {total:13.3f}")
    finally:
        pgserver.drop(admin, dbname)
    return 0


if __name__ == "__main__":
    sys.exit(main())
