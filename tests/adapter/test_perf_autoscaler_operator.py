"""`poolpilot perf autoscaler` and `poolpilot perf operator` run as documented and write their
JSON fields (smoke tests on one pool: the numbers are for docs/benchmarks.md, never asserted).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from poolpilot.autoscaler.shard import Shard
from poolpilot.perf.autoscaler import pool_name

pytestmark = [pytest.mark.adapter, pytest.mark.cluster]

POOLPILOT = [sys.executable, "-m", "poolpilot.cli"]
AUTOSCALER_FIELDS = {"cycle_seconds_p50", "cycle_seconds_p99", "first_cycle_seconds",
                     "queries_per_cycle"}


def perf_autoscaler(tmp_path: Path, *args: str) -> tuple[dict[str, Any], str]:
    """A small, fast `poolpilot perf autoscaler` run: (its JSON, its output)."""
    out = tmp_path / "autoscaler.json"
    done = subprocess.run(
        [*POOLPILOT, "perf", "autoscaler", "--repeat", "2", "--scrape", "0.5", "--window", "2",
         "--rules-interval", "0.5", *args, "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text()), done.stdout


def test_perf_autoscaler_writes_its_json(tmp_path: Path) -> None:
    data, _ = perf_autoscaler(tmp_path, "--pools", "2", "--modes", "list+raw,watch+rules",
                              "--history", "3")
    assert set(data) >= AUTOSCALER_FIELDS | {"runs", "ratios", "load_average"}
    assert data["setup"]["history_cycles"] == 3
    runs = {r["mode"]: r for r in data["runs"]}
    assert set(runs) == {"list+raw", "watch+rules"}
    # The recorded signals come in one query; the raw ones in one query per signal.
    assert runs["watch+rules"]["queries_per_cycle"] == 1 == data["queries_per_cycle"]
    assert runs["list+raw"]["queries_per_cycle"] > 1
    for run in runs.values():
        assert set(run) >= AUTOSCALER_FIELDS and run["first_cycle_fresh_writes"] > 0
    # A steady cycle on the watch-fed view reads nothing from the API.
    assert runs["watch+rules"]["cycle_api_requests_p50"] == 0
    assert runs["list+raw"]["cycle_api_requests_p50"] >= 3


def test_perf_autoscaler_measures_one_shard(tmp_path: Path) -> None:
    data, output = perf_autoscaler(tmp_path, "--pools", "12", "--modes", "watch+rules",
                                   "--total-shards", "3", "--every-shard")
    assert data["setup"]["shards"] == 3
    # Each shard decided exactly its own pools (the harness fails a cycle that decides others),
    # and together they decided every pool once.
    assert [r["shard"] for r in data["runs"]] == [0, 1, 2]
    for run in data["runs"]:
        mine = sum(Shard(run["shard"], 3).owns(*pool_name(i)) for i in range(12))
        assert 0 < run["shard_pools"] == mine < 12
        assert f"shard {run['shard']}: {mine} pools" in output
    assert sum(r["shard_pools"] for r in data["runs"]) == 12


def test_perf_operator_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "operator.json"
    done = subprocess.run([*POOLPILOT, "perf", "operator", "--pools", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = json.loads(out.read_text())["runs"]
    assert run["pools"] == 2 and run["reconciles"] >= 2
    assert run["resume_reconciles"] >= 3  # the two pools and the idle one, after a restart
    assert run["operator_cpu_seconds"] > 0 and run["operator_rss_loaded_mib"] > 0
    assert run["reconciles_per_operator_cpu_second"] > 0
    # (its CPU per reconcile is the process's less the first one's start-up: at 2 pools, noise)
    assert run["resume_operator_cpu_ms_per_reconcile"] >= 0
