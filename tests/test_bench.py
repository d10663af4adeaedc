"""`make bench` in miniature: the harness runs each engine in a process of its own,
interleaved, and writes its medians, ratios and the claim rate (the full run is `make
bench`, docs/PERFORMANCE.md). DBOS is an optional dependency: without it the run is
orch8's alone, and says so."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import psycopg
import pytest

from tests import pgserver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench(tmp_path, admin_url, *args):
    env = {**os.environ, "ORCH8_DATABASE_URL": admin_url}
    done = subprocess.run(
        [sys.executable, "-m", "bench.run_bench", "--results", str(tmp_path), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [result] = [p for p in tmp_path.iterdir() if p.suffix == ".json"]
    return done.stdout, json.loads(result.read_text())


def test_the_bench_measures_orch8_and_the_claim(tmp_path, admin_url):
    out, result = bench(
        tmp_path,
        admin_url,
        "--instances",
        "60",
        "--pairs",
        "1",
        "--scenario",
        "1-step effect",
        "--claim-instances",
        "600",
        "--claim-runs",
        "3",
        "--memory-instances",
        "40",
        "--memory-handler-seconds",
        "1",
        "--no-dbos",
    )
    [run] = result["runs"]
    assert run["engine"] == "orch8" and run["instances"] == 60
    assert run["steps_per_s"] > 0 and run["round_trips_per_step"] > 0
    assert run["peak_rss_mb"] > 0 and run["wal_bytes_per_step"] > 0
    assert result["claim"]["claimed"] == 600
    # the median of three runs, each on its own database, every run's rate kept
    runs = result["claim"]["runs"]
    assert len(runs) == 3 and result["claim"]["claimed_per_s"] == sorted(runs)[1]
    # the memory runs: 40 in flight; blocked, a def handler holds a thread each, async none
    _, blocked, awaited = result["memory"]
    assert [m["handler"] for m in result["memory"]] == [
        "def, returns at once",
        "def, blocked 1 s",
        "async def, blocked 1 s",
    ]
    assert all(m["steps"] == 40 and m["peak_rss_mb"] > 0 for m in result["memory"])
    assert blocked["peak_threads"] - awaited["peak_threads"] >= 30, result["memory"]
    assert "| async def, blocked 1 s |" in out
    assert result["machine"]["cores"] == os.cpu_count()
    assert "Claim rate" in out


@pytest.mark.skipif(importlib.util.find_spec("dbos") is None, reason="DBOS not installed")
def test_the_bench_runs_dbos_beside_orch8(tmp_path, admin_url):
    _out, result = bench(
        tmp_path,
        admin_url,
        "--instances",
        "40",
        "--pairs",
        "1",
        "--scenario",
        "3-step pure",
        "--claim-instances",
        "0",
        "--memory-instances",
        "0",
    )
    engines = [r["engine"] for r in result["runs"]]
    assert engines == ["orch8", "dbos"]
    assert all(r["steps"] == 120 for r in result["runs"])


def test_the_history_bench_copies_whole_instances(tmp_path, admin_url):
    """bench/history.py in miniature: the history it builds holds whole finished
    instances (every row a real run leaves, nothing dangling), and it runs the scenario
    beside it and on an empty database."""
    env = {**os.environ, "ORCH8_DATABASE_URL": admin_url}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.history",
            "--history",
            "3000",
            "--sample",
            "100",
            "--instances",
            "100",
            "--pairs",
            "1",
            "--keep",
            "--results",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [name] = [w.split(":")[0] for w in done.stdout.split("kept ")[1:]]
    [result] = [p for p in tmp_path.iterdir() if p.suffix == ".json"]
    result = json.loads(result.read_text())
    assert result["history"]["instances"] == 3000
    assert [len(result["runs"][side]) for side in ("empty", "history")] == [1, 1]
    url = pgserver.with_dbname(admin_url, name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            counts = dict(
                conn.execute(
                    "SELECT 'instances', count(*) FROM orch8.task_instances"
                    " UNION ALL SELECT 'completed', count(*) FROM orch8.task_instances"
                    "  WHERE state = 'completed'"
                    " UNION ALL SELECT 'receipts', count(*) FROM orch8.effect_receipts"
                    "  WHERE state = 'committed'"
                    " UNION ALL SELECT 'events', count(*) FROM orch8.effect_receipt_events"
                    " UNION ALL SELECT 'scopes', count(*) FROM orch8.continuity_executions"
                    " UNION ALL SELECT 'dangling', count(*) FROM orch8.effect_receipts AS r"
                    "  WHERE NOT EXISTS (SELECT 1 FROM orch8.task_instances AS i"
                    "   WHERE i.tenant_id = r.tenant_id AND i.id = r.instance_id)"
                    "  OR NOT EXISTS (SELECT 1 FROM orch8.continuity_executions AS c"
                    "   WHERE c.tenant_id = r.tenant_id AND c.continuity_id = r.continuity_id"
                    "   AND c.current_instance_id = r.instance_id)"
                    "  OR NOT EXISTS (SELECT 1 FROM orch8.block_outputs AS o"
                    "   WHERE o.tenant_id = r.tenant_id AND o.effect_id = r.id"
                    "   AND o.instance_id = r.instance_id)"
                    "  OR (SELECT count(*) FROM orch8.effect_receipt_events AS e"
                    "   WHERE e.tenant_id = r.tenant_id AND e.receipt_id = r.id) <> 4"
                    # each row in the partition of the month it is dated in, as real
                    # history's (time-ordered ids), none in a default partition
                    " UNION ALL SELECT 'months', count(DISTINCT tableoid) FROM"
                    "  orch8.effect_receipts"
                    " UNION ALL SELECT 'misfiled', count(*) FROM orch8.effect_receipts"
                    "  WHERE right(tableoid::regclass::text, 6)"
                    "   <> to_char(created_at AT TIME ZONE 'UTC', 'YYYYMM')"
                    " UNION ALL SELECT 'misfiled transitions', count(*)"
                    "  FROM orch8.instance_transitions AS t"
                    "  JOIN orch8.task_instances AS i ON i.id = t.instance_id"
                    "  WHERE right(t.tableoid::regclass::text, 6)"
                    "   <> to_char(i.created_at AT TIME ZONE 'UTC', 'YYYYMM')"
                ).fetchall()
            )
            defaults = conn.execute(
                "SELECT (SELECT count(*) FROM orch8.effect_receipts_default)"
                " + (SELECT count(*) FROM orch8.effect_receipt_events_default)"
                " + (SELECT count(*) FROM orch8.block_outputs_default)"
                " + (SELECT count(*) FROM orch8.instance_transitions_default)"
            ).fetchone()[0]
    finally:
        pgserver.drop(admin_url, name)
    # the history's 3,000 and the measured run's 100, all finished, one receipt each
    assert counts["instances"] == counts["completed"] == 3100
    assert counts["receipts"] == counts["scopes"] == 3100
    assert counts["events"] == 4 * 3100
    assert counts["dangling"] == 0
    # spread over the default --span-days 365: twelve or thirteen months
    assert counts["months"] >= 12
    assert counts["misfiled"] == counts["misfiled transitions"] == 0
    assert defaults == 0


def test_the_profile_counts_each_function_per_step(admin_url):
    """bench/profile.py: a real run with track_functions on, per step: begin_step and
    finish_step once each for a guarded one-step instance."""
    env = {**os.environ, "ORCH8_DATABASE_URL": admin_url}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.profile",
            "--scenario",
            "1-step effect",
            "--instances",
            "40",
            "--top",
            "200",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    calls = {
        line.split()[0]: float(line.split()[1])
        for line in done.stdout.splitlines()
        if line.split() and line.split()[0] in ("begin_step", "finish_step")
    }
    assert calls == {"begin_step": 1.0, "finish_step": 1.0}, done.stdout
