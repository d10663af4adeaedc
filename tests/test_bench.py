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

import pytest

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
        "--no-dbos",
    )
    [run] = result["runs"]
    assert run["engine"] == "orch8" and run["instances"] == 60
    assert run["steps_per_s"] > 0 and run["round_trips_per_step"] > 0
    assert run["peak_rss_mb"] > 0 and run["wal_bytes_per_step"] > 0
    assert result["claim"]["claimed"] == 600
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
    )
    engines = [r["engine"] for r in result["runs"]]
    assert engines == ["orch8", "dbos"]
    assert all(r["steps"] == 120 for r in result["runs"])
