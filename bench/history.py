"""Benchmark: is a guarded step as fast beside a large history as on an empty database?

    python -m bench.history [--history 1000000] [--scenario "1-step effect"]
                            [--instances 2000] [--pairs 3] [--span-days 365] [--keep]

Builds a database holding --history finished instances of the scenario: a sample of them
run by the real runner, then copied with new ids (every row each one left: instance,
nodes, transitions, outputs, continuity, receipts and their events) and timestamps spread
evenly over the --span-days before (ids time-ordered as the dates are, so each row lands
in the history tables' partition of its month, as a real history's would), then VACUUM
ANALYZE and a checkpoint. Then it runs the scenario --pairs times on a fresh empty
database and on the history database, interleaved, each run a
process of its own (bench/run_bench.py --one-run), and prints each side's medians and
their ratio. Results go to bench/results/history-<UTC time>.json and .md. The history
database is dropped at the end unless --keep (then its name is printed, and --reuse NAME
runs against it again without rebuilding it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import psycopg

from bench import run_bench
from orch8_py import config, sqlapi
from orch8_py.runner import Runner, Settings
from tests import pgserver

CHUNK = 200_000  # history instances copied per transaction
KEYS = ("steps_per_s", "p50_ms", "p99_ms", "wal_bytes_per_step", "commits_per_step")


def build_history(
    admin_url: str, steps: list[dict], n: int, sample: int, span_days: float
) -> tuple[str, str, str]:
    """A database with ``n`` finished instances of ``steps`` dated over the ``span_days``
    before now: (name, url, sequence id)."""
    dbname, url, seq = run_bench.create_bench_database(admin_url, "orch8_hist", steps)
    t0 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        print(f"history: running a sample of {sample} instances ...", flush=True)
        sqlapi.instances.create_instances(
            conn, tenant_id=run_bench.TENANT, sequence_id=seq, count=sample
        )
        runner = Runner(url, Settings(concurrency=32, poll_interval=0.05))
        stop = threading.Event()
        thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
        thread.start()
        since = dt.datetime.min.replace(tzinfo=dt.UTC)
        while (
            sqlapi.benchmarks.run_counts(conn, tenant_id=run_bench.TENANT, since=since)["completed"]
            < sample
        ):
            if not thread.is_alive():
                raise SystemExit("history: the runner stopped before the sample finished")
            time.sleep(0.1)
        stop.set()
        thread.join(timeout=30)
        run_bench.wait_for_sessions_to_end(conn)
        got = sqlapi.benchmarks.history_sample(conn, tenant_id=run_bench.TENANT)
        copies = max(0, n // got - 1)
        per_chunk = max(1, CHUNK // got)
        spacing = span_days * 86400 / max(1, copies)
        months = sqlapi.benchmarks.make_history_months(conn, span_days=span_days)
        print(f"history: {months} partitions made for the past months", flush=True)
        k = 1
        while k <= copies:
            last = min(copies, k + per_chunk - 1)
            sqlapi.benchmarks.fill_history(conn, first=k, last=last, spacing=spacing)
            made = (last + 1) * got
            rate = (last * got) / (time.perf_counter() - t0)
            print(f"\rhistory: {made:,}/{n:,} instances ({rate:,.0f}/s)", end="", flush=True)
            k = last + 1
        print(flush=True)
        print("history: VACUUM ANALYZE and CHECKPOINT ...", flush=True)
        sqlapi.benchmarks.settle_history(conn)
    print(f"history: built in {time.perf_counter() - t0:.0f} s", flush=True)
    return dbname, url, seq


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--history", type=int, default=1_000_000, help="finished instances beside")
    p.add_argument("--sample", type=int, default=1000, help="instances run for real, copied")
    p.add_argument("--scenario", default="1-step effect", choices=sorted(run_bench.SCENARIOS))
    p.add_argument("--instances", type=int, default=2000, help="instances per measured run")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument(
        "--span-days", type=float, default=365, help="days the history's dates spread over"
    )
    p.add_argument("--concurrency", type=int, default=config.DEFAULT_CONCURRENCY)
    p.add_argument("--keep", action="store_true", help="keep the history database")
    p.add_argument("--reuse", metavar="NAME", help="a history database kept by --keep")
    p.add_argument("--results", default=str(run_bench.RESULTS))
    args = p.parse_args(argv)
    url = os.environ.get("ORCH8_DATABASE_URL") or os.environ.get("ORCH8_TEST_DATABASE_URL")
    if not url:
        print("bench: set ORCH8_DATABASE_URL to the server to benchmark", file=sys.stderr)
        return 2
    steps = run_bench.SCENARIOS[args.scenario]
    started = dt.datetime.now(dt.UTC)
    if args.reuse:
        dbname = args.reuse
        hist_url = pgserver.with_dbname(url, dbname)
        with psycopg.connect(hist_url, autocommit=True) as conn:
            seq = sqlapi.benchmarks.bench_sequence(conn, tenant_id=run_bench.TENANT)
    else:
        dbname, hist_url, seq = build_history(url, steps, args.history, args.sample, args.span_days)
    with psycopg.connect(hist_url, autocommit=True) as conn:
        held = sqlapi.benchmarks.history_size(conn)
    print(
        f"history database {dbname}: {held['instances']:,} instances, "
        f"{held['bytes'] / 2**30:.1f} GiB"
    )
    common = ["--scenario", args.scenario, "--instances", str(args.instances)]
    common += ["--concurrency", str(args.concurrency)]
    runs: dict[str, list[dict]] = {"empty": [], "history": []}
    try:
        for pair in range(args.pairs):
            for side in ("empty", "history"):
                cmd = ["bench.run_bench", "--one-run", *common]
                if side == "history":
                    cmd += ["--existing", hist_url, str(seq)]
                r = run_bench.one_run(cmd)
                r["pair"] = pair
                runs[side].append(r)
                print(f"[{pair + 1}/{args.pairs}] {side:<7} {run_bench.describe(r)}", flush=True)
    finally:
        if not args.keep and not args.reuse:
            pgserver.drop(url, dbname)
    med = {
        side: {k: statistics.median(r[k] for r in rs) for k in KEYS} for side, rs in runs.items()
    }
    ratio = med["history"]["steps_per_s"] / med["empty"]["steps_per_s"]
    info = run_bench.machine(url)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    lines = [
        f"# orch8 history bench {stamp}",
        "",
        f"{info['cores']} cores, {info['cpu']}, PostgreSQL {info['postgresql']}, "
        f"shared_buffers {info['postgresql_settings'].get('shared_buffers')}, commit "
        f"{info['git_commit'][:12]}" + (" (with uncommitted changes)" if info["git_dirty"] else ""),
        "",
        f"{args.scenario}, {args.instances} instances a run, concurrency {args.concurrency}, "
        f"medians of {args.pairs} interleaved pairs; history: {held['instances']:,} finished "
        f"instances, {held['bytes'] / 2**30:.1f} GiB.",
        "",
        "| database | steps/s | p50 ms | p99 ms | WAL B/step | commits/step |",
        "|---|---|---|---|---|---|",
    ]
    for side in ("empty", "history"):
        m = med[side]
        lines.append(
            f"| {side} | {m['steps_per_s']:.0f} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} | "
            f"{m['wal_bytes_per_step']:.0f} | {m['commits_per_step']:.2f} |"
        )
    lines += ["", f"history / empty: **{ratio:.2f}** of the empty database's steps/s"]
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    result = {"machine": info, "config": vars(args), "history": held, "runs": runs, "medians": med}
    (out / f"history-{stamp}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / f"history-{stamp}.md").write_text(text)
    if args.keep:
        print(f"kept {dbname}: rerun with --reuse {dbname}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
