"""Benchmark: N instances of 1- and 3-step sequences, side-effecting (a guarded in-process
no-op) and pure (transform), run by one in-process orch8 runner, side by side with the
same workloads on DBOS Transact (bench/dbos_workload.py), plus the claim rate.

    python -m bench.run_bench [--instances 2000 --instances 10000] [--pairs 3]
                              [--concurrency 128] [--scenario NAME ...]
                              [--claim-instances 100000] [--claim-runs 3]
                              [--memory-instances 5000] [--no-dbos]

Uses ORCH8_DATABASE_URL (else ORCH8_TEST_DATABASE_URL) as the server; every run is a
process of its own (DBOS is one per process, and each engine's peak RSS is then its
run's) on a fresh database created there and dropped afterwards. Each scenario and size
runs orch8 then DBOS, --pairs times, interleaved, so both see the same drift of a
shared machine; the table gives each engine's medians and their ratio: steps/s,
instances/s, p50/p99 claim-to-completion latency, database round trips per step
(orch8's runner counts them), commits per step (the run's database), WAL bytes per step
(the run's database's records, by pg_walinspect; the whole server's where that is
refused), peak RSS, and CPU per step of the engine's process and of the local
PostgreSQL's processes (bench/measure.py). Then 4 connections claim --claim-instances
due one-step instances with orch8.claim_due_nodes, 256 at a time, --claim-runs times on
fresh databases (the median is reported, every run's rate kept), and --memory-instances
guarded instances run all in flight at once, their handler returning at once, then
blocked as a def and as an async def, for the runner's peak RSS. Results go to
bench/results/<UTC time>.json and .md. Without DBOS installed (pip install -e '.[bench]')
it says so and runs orch8 alone.

    python -m bench.run_bench --one-run --scenario NAME --instances N [--concurrency C]
                              [--handler-seconds S] [--async-handler]

runs one orch8 scenario in this process and prints its figures as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from bench.measure import cpu_now, cpu_per_step, peak_rss_mb, percentile
from orch8_py import config, migrate, sqlapi
from orch8_py.handlers import handler
from orch8_py.runner import Runner, Settings
from tests import pgserver

TENANT = "bench"
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DEFAULT_SIZES = [2000, 10000]
STALL_SECONDS = 120  # a run with no instance completing for this long has failed


HANDLER_SECONDS = 0.0  # --handler-seconds: how long bench.effect waits, as on a provider


@handler("bench.effect")
def effect(params, ctx):
    """Side-effecting (not a builtin), does nothing (or waits --handler-seconds): measures
    the engine, not a provider."""
    if HANDLER_SECONDS:
        time.sleep(HANDLER_SECONDS)
    return {"receipt_id": str(ctx.effect_id)}


async def effect_async(params, ctx):
    """bench.effect as an async def (--async-handler): a wait that holds no thread."""
    if HANDLER_SECONDS:
        await asyncio.sleep(HANDLER_SECONDS)
    return {"receipt_id": str(ctx.effect_id)}


# make bench's memory runs: the handler, and what --one-run is told for it (WAIT: the
# --memory-handler-seconds); a def handler blocked holds a thread, an async def one none
MEMORY_RUNS = [
    ("def, returns at once", []),
    ("def, blocked WAIT s", ["--handler-seconds", "WAIT"]),
    ("async def, blocked WAIT s", ["--handler-seconds", "WAIT", "--async-handler"]),
]

SCENARIOS = {
    "1-step effect": [{"handler": "bench.effect"}],
    "3-step effect": [{"handler": "bench.effect"}] * 3,
    "1-step pure": [{"handler": "transform", "params": {"expression": "data.n + 1"}}],
    "3-step pure": [{"handler": "transform", "params": {"expression": "data.n + 1"}}] * 3,
}

# (key, column header, format) of the table; ratios are orch8 / DBOS of the same key
COLUMNS = [
    ("steps_per_s", "steps/s", "{:.0f}"),
    ("instances_per_s", "inst/s", "{:.0f}"),
    ("p50_ms", "p50 ms", "{:.1f}"),
    ("p99_ms", "p99 ms", "{:.1f}"),
    ("round_trips_per_step", "RT/step", "{:.2f}"),
    ("commits_per_step", "commits/step", "{:.2f}"),
    ("wal_bytes_per_step", "WAL B/step", "{:.0f}"),
    ("peak_rss_mb", "RSS MB", "{:.0f}"),
    ("engine_cpu_ms_per_step", "engine CPU ms/step", "{:.2f}"),
    ("server_cpu_ms_per_step", "PG CPU ms/step", "{:.2f}"),
]


def wait_for_sessions_to_end(conn: psycopg.Connection[Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while sqlapi.benchmarks.other_sessions_here(conn) and time.monotonic() < deadline:
        time.sleep(0.05)


def create_bench_database(admin_url: str, prefix: str, steps: list[dict]) -> tuple[str, str, Any]:
    """A fresh migrated database holding the bench sequence: (name, url, sequence id)."""
    dbname = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as c:
        sqlapi.server.ensure_database(c, dbname)
    url = pgserver.with_dbname(admin_url, dbname)
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
    return dbname, url, seq


def run_scenario(
    admin_url: str,
    name: str,
    steps: list[dict],
    n: int,
    concurrency: int,
    poll_interval: float = 0.05,
    progress: bool = True,
    existing: tuple[str, str] | None = None,
) -> dict:
    """One orch8 run on a fresh database, or on ``existing`` (url, sequence id), which it
    keeps: bench/history.py runs there beside a history of finished instances, which is
    why progress and latencies count only the instances this run created."""
    if existing is None:
        dbname, url, seq = create_bench_database(admin_url, "orch8_bench", steps)
    else:
        dbname, (url, seq) = None, existing
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            if progress:
                print(f"  {name}: creating {n} instances ...", flush=True)
            since = sqlapi.benchmarks.server_now(conn)
            t_setup = time.perf_counter()
            sqlapi.instances.create_instances(conn, tenant_id=TENANT, sequence_id=seq, count=n)
            setup_s = time.perf_counter() - t_setup
            own_wal = sqlapi.benchmarks.watch_wal(conn)
            before = sqlapi.benchmarks.counters(conn)
            runner = Runner(url, Settings(concurrency=concurrency, poll_interval=poll_interval))
            stop = threading.Event()
            t0 = time.perf_counter()
            cpu_start = cpu_now()
            thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
            thread.start()
            done = 0
            progressed = time.monotonic()
            threads = 0
            while done < n:
                time.sleep(0.1)
                threads = max(threads, threading.active_count())
                counts = sqlapi.benchmarks.run_counts(conn, tenant_id=TENANT, since=since)
                if counts["completed"] > done:
                    progressed = time.monotonic()
                done, failed = counts["completed"], counts["failed"]
                if failed:
                    raise SystemExit(f"{failed} instance(s) failed in scenario {name}")
                # a runner that died or wedged would otherwise keep the bench waiting forever
                if done < n and not thread.is_alive():
                    raise SystemExit(f"the runner stopped at {done}/{n} in scenario {name}")
                if time.monotonic() - progressed > STALL_SECONDS:
                    raise SystemExit(f"no progress for {STALL_SECONDS} s at {done}/{n} in {name}")
                if progress:
                    print(f"\r  {name}: {done}/{n} completed", end="", flush=True)
            elapsed = time.perf_counter() - t0
            cpu_end = cpu_now()
            wal_end = sqlapi.benchmarks.wal_position(conn)
            stop.set()
            thread.join(timeout=30)
            wait_for_sessions_to_end(conn)  # a backend flushes its statistics as it exits
            after = sqlapi.benchmarks.counters(conn)
            if progress:
                print(flush=True)
            latencies = sqlapi.benchmarks.run_latencies(conn, tenant_id=TENANT, since=since)
            wal = (
                sqlapi.benchmarks.database_wal(conn, start=before.wal_bytes, end=wal_end)
                if own_wal
                else None
            )
            total_steps = n * len(steps)
            return {
                "engine": "orch8",
                "scenario": name,
                "instances": n,
                "steps": total_steps,
                "seconds": elapsed,
                "setup_seconds": setup_s,
                "steps_per_s": total_steps / elapsed,
                "instances_per_s": n / elapsed,
                "p50_ms": percentile([float(v) for v in latencies], 0.5) * 1000,
                "p99_ms": percentile([float(v) for v in latencies], 0.99) * 1000,
                "round_trips_per_step": runner.round_trips / total_steps,
                "commits_per_step": (after.commits - before.commits) / total_steps,
                "rollbacks_per_step": (after.rollbacks - before.rollbacks) / total_steps,
                "server_commits_per_step": (after.server_commits - before.server_commits)
                / total_steps,
                "wal_bytes_per_step": None if wal is None else wal.bytes / total_steps,
                "wal_fpi_share": None if wal is None else wal.fpi_bytes / max(wal.bytes, 1),
                "server_wal_bytes_per_step": (wal_end - before.wal_bytes) / total_steps,
                "peak_rss_mb": peak_rss_mb(),
                "peak_threads": threads,  # sampled every 0.1 s
                **cpu_per_step(cpu_start, cpu_end, total_steps),
                "polling_interval_s": poll_interval,
                "concurrency": concurrency,
            }
    finally:
        if dbname is not None:
            pgserver.drop(admin_url, dbname)


def claim_rate(admin_url: str, n: int, clients: int = 4, batch: int = 256) -> dict:
    """``n`` due one-step instances claimed by ``clients`` connections, ``batch`` a call,
    until none is left (nothing runs them: the claim alone is measured)."""
    dbname, url, seq = create_bench_database(
        admin_url, "orch8_bench_claim", SCENARIOS["1-step pure"]
    )
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            print(f"claim: creating {n} due instances ...", flush=True)
            t_setup = time.perf_counter()
            sqlapi.instances.create_instances(conn, tenant_id=TENANT, sequence_id=seq, count=n)
            create_s = time.perf_counter() - t_setup
            print(f"claim: created in {create_s:.1f} s; {clients} clients claiming ...", flush=True)
            claimed = [0] * clients
            calls = [0] * clients
            errors: list[BaseException] = []
            # connections are opened before the clock starts and everyone starts at once
            ready = threading.Barrier(clients + 1)

            def client(i: int) -> None:
                try:
                    with psycopg.connect(url, autocommit=True) as c:
                        ready.wait()
                        while True:
                            got = sqlapi.benchmarks.claim_due(
                                c, worker_id=f"bench-claim-{i}", batch=batch, lease_seconds=3600
                            )
                            calls[i] += 1
                            claimed[i] += got
                            if got == 0:  # none left that another client is not claiming
                                return
                except BaseException as exc:
                    errors.append(exc)
                    ready.abort()

            threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
            for t in threads:
                t.start()
            own_wal = sqlapi.benchmarks.watch_wal(conn)
            before = sqlapi.benchmarks.counters(conn)
            try:
                ready.wait()
            except threading.BrokenBarrierError:
                for t in threads:
                    t.join()
                raise errors[0] from None
            t0 = time.perf_counter()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - t0
            wal_end = sqlapi.benchmarks.wal_position(conn)
            if errors:
                raise errors[0]
            wait_for_sessions_to_end(conn)
            after = sqlapi.benchmarks.counters(conn)
            wal = (
                sqlapi.benchmarks.database_wal(conn, start=before.wal_bytes, end=wal_end)
                if own_wal
                else sqlapi.benchmarks.Wal(bytes=wal_end - before.wal_bytes, fpi_bytes=0)
            )
        total = sum(claimed)
        if total != n:
            raise SystemExit(f"claim: {total} of {n} instances claimed")
        return {
            "instances": n,
            "clients": clients,
            "batch": batch,
            "create_seconds": create_s,
            "created_per_s": n / create_s,
            "seconds": elapsed,
            "claimed": total,
            "claimed_per_s": total / elapsed,
            "claim_calls": sum(calls),
            "commits_per_instance": (after.commits - before.commits) / n,
            "wal_bytes_per_instance": wal.bytes / n,
            "wal_counted": "database" if own_wal else "server",
        }
    finally:
        pgserver.drop(admin_url, dbname)


def machine(url: str) -> dict:
    cpu = platform.processor() or platform.machine()
    mem_kb = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kb = int(line.split()[1])
                    break
    except OSError:
        pass  # not Linux: platform's answer stands
    with psycopg.connect(url, autocommit=True) as c:
        pg_version = sqlapi.server.server_version(c)
        pg_settings = sqlapi.benchmarks.settings(c)

    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
            return out.stdout.strip()
        except OSError:
            return ""

    try:
        dbos_version: str | None = importlib.metadata.version("dbos")
    except importlib.metadata.PackageNotFoundError:
        dbos_version = None
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kb / 1024 / 1024, 1) if mem_kb else None,
        "os": platform.platform(),
        "python": platform.python_version(),
        "postgresql": pg_version,
        "postgresql_settings": pg_settings,
        "git_commit": git("rev-parse", "HEAD"),
        # uncommitted changes make the commit an approximation of what ran
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "dbos_version": dbos_version,
    }


def one_run(cmd: list[str]) -> dict:
    """Run one engine's scenario in a process of its own; its last stdout line is JSON."""
    out = subprocess.run(
        [sys.executable, "-m", *cmd], cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"bench: {' '.join(cmd)} exited {out.returncode}\n{out.stdout}")
    r: dict = json.loads(out.stdout.strip().splitlines()[-1])
    # the run's own WAL when the server let it be counted, else the whole server's
    r["wal_counted"] = "server" if r["wal_bytes_per_step"] is None else "database"
    if r["wal_bytes_per_step"] is None:
        r["wal_bytes_per_step"] = r["server_wal_bytes_per_step"]
    return r


def describe(r: dict) -> str:
    rt = r.get("round_trips_per_step")
    return (
        f"{r['steps_per_s']:.0f} steps/s, {r['instances_per_s']:.0f} inst/s, "
        f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
        + (f"{rt:.2f} RT/step, " if rt is not None else "")
        + f"{r['commits_per_step']:.2f} commits/step, {r['wal_bytes_per_step']:.0f} WAL B/step"
        + (f" ({r['wal_fpi_share']:.0%} page images), " if r.get("wal_fpi_share") else ", ")
        + f"RSS {r['peak_rss_mb']:.0f} MB ({r['seconds']:.1f} s, setup {r['setup_seconds']:.1f} s)"
    )


def medians(runs: list[dict]) -> dict:
    out: dict[str, Any] = {"runs": len(runs)}
    for key, _, _ in COLUMNS:
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    return out


def table(summary: list[dict], with_dbos: bool) -> str:
    head = ["instances", "scenario", "engine", *(h for _, h, _ in COLUMNS)]
    lines = [
        "| " + " | ".join(head) + " |",
        "| --- | --- | --- | " + " | ".join("---:" for _ in COLUMNS) + " |",
    ]

    def row(size: Any, scenario: str, engine: str, cells: list[str]) -> None:
        lines.append("| " + " | ".join([str(size), scenario, engine, *cells]) + " |")

    def cell(v: Any, fmt: str) -> str:
        return "-" if v is None else fmt.format(v)

    for s in summary:
        o, d = s["orch8"], s.get("dbos")
        row(s["instances"], s["scenario"], "orch8", [cell(o.get(k), f) for k, _, f in COLUMNS])
        if with_dbos and d is not None:
            row("", "", "DBOS", [cell(d.get(k), f) for k, _, f in COLUMNS])
            ratios = [
                cell(o[k] / d[k] if o.get(k) is not None and d.get(k) else None, "{:.2f}")
                for k, _, _ in COLUMNS
            ]
            row("", "", "orch8/DBOS", ratios)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--instances",
        type=int,
        action="append",
        help=f"instances per run; repeat for several sizes (default {DEFAULT_SIZES})",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=config.DEFAULT_CONCURRENCY,
        help="instances in flight, the same for both engines (default: the runner's, "
        f"{config.DEFAULT_CONCURRENCY})",
    )
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    p.add_argument("--pairs", type=int, default=3, help="orch8/DBOS runs per scenario and size")
    p.add_argument("--poll-interval", type=float, default=0.05, help="the runner's poll")
    p.add_argument(
        "--dbos-polling-interval",
        type=float,
        default=0.01,
        help="the DBOS queue's polling_interval_sec (default 0.01, its fastest setting "
        "measured here); DBOS dequeues only when it polls, so its throughput at a "
        "concurrency is bound by it",
    )
    p.add_argument("--claim-instances", type=int, default=100000, help="0: no claim run")
    p.add_argument("--claim-clients", type=int, default=4)
    p.add_argument(
        "--claim-runs",
        type=int,
        default=3,
        help="claim runs, each on a fresh database; the median is reported (default 3)",
    )
    p.add_argument("--no-dbos", action="store_true", help="orch8 only")
    p.add_argument("--results", default=str(RESULTS), help=f"where to write (default {RESULTS})")
    p.add_argument(
        "--handler-seconds",
        type=float,
        default=0.0,
        help="with --one-run: the guarded handler waits this long, as a slow provider would "
        "(the runner's memory with that many calls in flight)",
    )
    p.add_argument(
        "--memory-instances",
        type=int,
        default=5000,
        help="the memory runs: this many guarded instances all in flight at once, their "
        "handler returning at once, then blocked --memory-handler-seconds as a def and "
        "as an async def handler (0: no memory runs; default 5000)",
    )
    p.add_argument("--memory-handler-seconds", type=float, default=20.0)
    p.add_argument(
        "--async-handler",
        action="store_true",
        help="with --one-run: bench.effect is an async def handler (awaited on the runner's "
        "event loop, no thread while it waits)",
    )
    p.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    # --one-run in a database that exists (bench/history.py): its url and the sequence id
    p.add_argument("--existing", nargs=2, metavar=("URL", "SEQUENCE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    url = os.environ.get("ORCH8_DATABASE_URL") or os.environ.get("ORCH8_TEST_DATABASE_URL")
    if not url:
        print("bench: set ORCH8_DATABASE_URL to the server to benchmark", file=sys.stderr)
        return 2
    sizes = args.instances or DEFAULT_SIZES
    dbos_poll = args.dbos_polling_interval
    scenarios = args.scenario or list(SCENARIOS)

    if args.one_run:
        if len(sizes) != 1 or len(scenarios) != 1:
            p.error("--one-run takes one --scenario and one --instances")
        name = scenarios[0]
        global HANDLER_SECONDS
        HANDLER_SECONDS = args.handler_seconds
        if args.async_handler:
            handler("bench.effect")(effect_async)
        result = run_scenario(
            url,
            name,
            SCENARIOS[name],
            sizes[0],
            args.concurrency,
            args.poll_interval,
            False,
            existing=tuple(args.existing) if args.existing else None,
        )
        print(json.dumps(result), flush=True)
        return 0

    with_dbos = not args.no_dbos
    if with_dbos:
        try:
            import dbos  # noqa: F401
        except ImportError as exc:
            with_dbos = False
            banner = "!" * 78
            print(
                f"{banner}\n!! DBOS Transact is not installed ({exc}): running orch8 ONLY.\n"
                "!! Install it with: .venv/bin/pip install -e '.[bench]'"
                "  (make bench does this)\n"
                f"{banner}",
                flush=True,
            )

    started = dt.datetime.now(dt.UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    info = machine(url)
    s = info["postgresql_settings"]
    header = (
        f"machine: {info['cores']} cores, {info['cpu']}, {info['memory_gib']} GiB, "
        f"Python {info['python']}, PostgreSQL {info['postgresql']} "
        f"(shared_buffers {s.get('shared_buffers')}, synchronous_commit "
        f"{s.get('synchronous_commit')}, wal_level {s.get('wal_level')}, max_wal_size "
        f"{s.get('max_wal_size')}, fsync {s.get('fsync')}), commit {info['git_commit'][:12]}"
        + (" (with uncommitted changes)" if info["git_dirty"] else "")
        + (f", DBOS {info['dbos_version']}" if with_dbos else "")
    )
    print(header, flush=True)

    total = len(sizes) * len(scenarios) * args.pairs * (2 if with_dbos else 1)
    runs: list[dict] = []
    summary: list[dict] = []
    k = 0
    for n in sizes:
        for name in scenarios:
            common = [
                "--scenario",
                name,
                "--instances",
                str(n),
                "--concurrency",
                str(args.concurrency),
            ]
            engines = [("orch8", ["bench.run_bench", "--one-run", *common])]
            if with_dbos:
                engines.append(("dbos", ["bench.dbos_workload", *common]))
            for pair in range(args.pairs):
                for engine, cmd in engines:
                    k += 1
                    poll = (
                        ["--poll-interval", str(args.poll_interval)]
                        if engine == "orch8"
                        else ["--polling-interval", str(dbos_poll)]
                    )
                    r = one_run([*cmd, *poll])
                    r["pair"] = pair
                    runs.append(r)
                    label = "orch8" if engine == "orch8" else "DBOS"
                    print(f"[{k:>3}/{total}] {label:<5} {n} x {name}: {describe(r)}", flush=True)
            entry: dict[str, Any] = {"instances": n, "scenario": name}
            for engine, _ in engines:
                entry[engine] = medians(
                    [
                        r
                        for r in runs
                        if r["engine"] == engine and r["instances"] == n and r["scenario"] == name
                    ]
                )
            summary.append(entry)

    claim = None
    if args.claim_instances > 0:
        # one claim run is a few seconds: whatever else the server does meanwhile (a
        # checkpoint, autovacuum) can move it by a third, so it gets a median like the pairs
        claims = []
        for i in range(max(args.claim_runs, 1)):
            c = claim_rate(url, args.claim_instances, clients=args.claim_clients)
            claims.append(c)
            print(
                f"claim [{i + 1}/{max(args.claim_runs, 1)}]: {c['claimed']} instances in "
                f"{c['seconds']:.1f} s by {c['clients']} clients, {c['batch']} a call: "
                f"{c['claimed_per_s']:.0f} claimed/s",
                flush=True,
            )
        ranked = sorted(claims, key=lambda c: c["claimed_per_s"])
        claim = {**ranked[(len(ranked) - 1) // 2], "runs": [c["claimed_per_s"] for c in claims]}

    memory = []
    if args.memory_instances > 0:
        n, wait = args.memory_instances, args.memory_handler_seconds
        for label, extra in MEMORY_RUNS:
            cmd = ["bench.run_bench", "--one-run", "--scenario", "1-step effect"]
            cmd += ["--instances", str(n), "--concurrency", str(n)]
            cmd += [a if a != "WAIT" else str(wait) for a in extra]
            r = one_run(cmd)
            memory.append({"handler": label.replace("WAIT", f"{wait:g}"), **r})
            print(
                f"memory, {n} in flight, {memory[-1]['handler']}: peak RSS "
                f"{r['peak_rss_mb']:.1f} MB, {r['peak_threads']} threads, "
                f"{r['steps_per_s']:.0f} steps/s",
                flush=True,
            )

    if all(r["wal_counted"] == "database" for r in runs):
        wal_note = (
            "the WAL records of the run's own database (pg_walinspect: records touching "
            "its relations and the commits of its transactions), whatever else the server "
            "did meanwhile; the whole server's pg_current_wal_lsn() delta is in the JSON"
        )
    else:
        wal_note = (
            "**the whole server's** pg_current_wal_lsn() delta for some or all runs (the "
            "server refused pg_walinspect or a temporary replication slot), so anything "
            "else writing to the server meanwhile (a database created from a template copies "
            "the template into the WAL) is in it"
        )
    md = [
        f"# orch8 bench {stamp}",
        "",
        header,
        "",
        f"Medians of {args.pairs} run(s) per engine"
        + (", runs interleaved" if with_dbos else "")
        + f"; runner concurrency {args.concurrency}, poll interval {args.poll_interval} s"
        + (
            f"; DBOS queue worker_concurrency {args.concurrency}, polling_interval_sec "
            f"{dbos_poll} s (DBOS dequeues only when it polls: at most "
            f"{args.concurrency} workflows a poll)"
            if with_dbos
            else ""
        )
        + ".",
        "",
        table(summary, with_dbos),
        "",
        "steps/s, inst/s: from the start of the engine until all instances are done. "
        "p50/p99: per instance, claim (DBOS: dequeue) to completion. RT/step: round trips "
        "the orch8 runner counted. commits/step: xact_commit of the run's own database "
        "(read-only transactions and the bench's 10 completion polls a second included). "
        f"WAL B/step: {wal_note}. "
        "RSS: peak (VmHWM) of the engine's process. orch8/DBOS: the ratio of the medians.",
    ]
    if not with_dbos:
        md += ["", "**DBOS Transact was not installed: orch8 only** (pip install -e '.[bench]')."]
    if claim is not None:
        md += [
            "",
            f"Claim rate: {claim['claimed']} due one-step instances claimed by "
            f"{claim['clients']} connections with orch8.claim_due_nodes, {claim['batch']} a "
            f"call: **{claim['claimed_per_s']:.0f} instances/s**, the median of "
            f"{len(claim['runs'])} run(s) on fresh databases "
            f"({', '.join(f'{r:.0f}' for r in claim['runs'])}; the median's run: "
            f"{claim['seconds']:.1f} s, "
            f"{claim['claim_calls']} calls, {claim['commits_per_instance']:.3f} commits and "
            f"{claim['wal_bytes_per_instance']:.0f} WAL bytes ({claim['wal_counted']}) per "
            f"instance). Creating them "
            f"took {claim['create_seconds']:.1f} s ({claim['created_per_s']:.0f}/s).",
        ]
    if memory:
        md += [
            "",
            f"Memory: {args.memory_instances} guarded instances in flight at once (concurrency "
            f"{args.memory_instances}), one run each, the runner's peak RSS and threads:",
            "",
            "| handler | peak RSS MB | peak threads | steps/s |",
            "| --- | ---: | ---: | ---: |",
            *(
                f"| {m['handler']} | {m['peak_rss_mb']:.1f} | {m['peak_threads']} | "
                f"{m['steps_per_s']:.0f} |"
                for m in memory
            ),
        ]
    text = "\n".join(md) + "\n"
    print()
    print(text)
    result = {
        "started_at": started.isoformat(),
        "finished_at": dt.datetime.now(dt.UTC).isoformat(),
        "machine": info,
        "config": {
            "sizes": sizes,
            "scenarios": scenarios,
            "pairs": args.pairs,
            "concurrency": args.concurrency,
            "poll_interval_s": args.poll_interval,
            "dbos_polling_interval_s": dbos_poll if with_dbos else None,
            "dbos": with_dbos,
            "claim_instances": args.claim_instances,
            "claim_clients": args.claim_clients,
            "claim_runs": args.claim_runs,
            "memory_instances": args.memory_instances,
            "memory_handler_seconds": args.memory_handler_seconds,
        },
        "runs": runs,
        "medians": summary,
        "claim": claim,
        "memory": memory,
    }
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stamp}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (out / f"{stamp}.md").write_text(text, encoding="utf-8")
    print(f"results: {out / stamp}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
