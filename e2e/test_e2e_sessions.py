"""`poolpilot sandbox --workload sessions`, as a user runs it: a generated session workload
(chats and agent loops on shared system prompts, each turn extending the last) replayed as
prompts whose shared blocks are shared text, through the router to simulated engines that keep
a prefix cache. The report must show the caches hitting (from the engines' own counters in
Prometheus) and what that did to TTFT; the workload it replayed is left beside the report.
Budget: about 80 s of wall time (200 simulated seconds at speed 8, half the workload's rate).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from poolpilot.engine_sim.traces import ideal_prefix_hit_rate, load_trace

SANDBOX = [sys.executable, "-m", "poolpilot.cli", "sandbox", "--no-progress"]


def test_a_session_workload_hits_the_prefix_caches_and_the_report_shows_it(
        tmp_path: Path) -> None:
    out = tmp_path / "report"
    r = subprocess.run([*SANDBOX, "--workload", "sessions", "--speed", "8", "--rate-scale",
                        "0.5", "--duration", "200", "--report", str(out)],
                       capture_output=True, text=True, timeout=600)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert report["workload"] == "sessions"
    assert report["requests"]["sent"] > 300 and report["requests"]["failed"] == 0, \
        report["requests"]
    # The workload replayed is the generated one, kept for --trace.
    trace = load_trace(out / "workload-sessions.jsonl")
    assert report["trace"] == str(out / "workload-sessions.jsonl")
    assert all(req.hash_ids for req in trace)
    prefix = report["prefix_cache"]
    assert set(prefix) == {"ideal_hit_rate", "hit_rate", "by_role", "router_expected_hit_rate",
                           "ttft_by_reusable_share", "over_time"}
    # What the engines served from their caches: well above nothing, at most what the sent
    # part of the trace allowed.
    assert prefix["hit_rate"] is not None and prefix["hit_rate"] > 0.3, prefix
    assert prefix["ideal_hit_rate"] > 0.3
    assert ideal_prefix_hit_rate(trace) > 0.5  # the whole workload: a prefix-heavy one
    assert prefix["by_role"]["prefill"]["hit_rate"] > 0.3, prefix["by_role"]
    # The router's own record of what it sent where expected hits too (its counters).
    assert prefix["router_expected_hit_rate"] is not None
    assert prefix["router_expected_hit_rate"] > 0.3, prefix
    assert prefix["over_time"]["hit_rate"]["prefill"], "no hit-rate series over time"
    # TTFT beside it: requests grouped by how much of their prompt an earlier one had sent.
    groups = prefix["ttft_by_reusable_share"]
    assert sum(g["requests"] for g in groups) == report["requests"]["ok"]
    assert groups[-1]["requests"] > 0 and groups[-1]["ttft_seconds"]["p50"] > 0
    assert (out / "prefix_cache.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The summary and the printed graph link say it too.
    assert re.search(r"ideal \d+\.\d%", log), log[-3000:]  # the summary's hit-rate row
    assert re.search(r"engine prefix-cache hit rate per role: http://\S+/classic/graph\?", log)
    assert "workload sessions: " in log and "written to" in log
