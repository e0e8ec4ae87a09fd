"""`poolpilot perf router` runs as documented and writes its JSON fields; `--workers` routers
share one port and their metrics (smoke tests: numbers are for docs/benchmarks.md, never
asserted)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from poolpilot.perf.router import bucket_quantile, cpu_list, pinned_to, split_cpus
from router_support import FAST, POOLPILOT, metric_value, running, start_fake_engine, start_router

pytestmark = pytest.mark.adapter

FIELDS = {"added_ttft_p99_ms", "added_itl_p99_ms", "throughput_ratio", "router_cpu_seconds",
          "added_p50_ms", "added_p99_ms", "rps_ratio", "errors", "direct", "routed"}


CPUS = sorted(os.sched_getaffinity(0))


def test_perf_router_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "router.json"
    # With two CPUs or more, the router runs pinned to the last one, as the docs measure it,
    # and the P/D prefill engine beside it.
    pin = (["--router-cpus", str(CPUS[-1]), "--prefill-cpus", str(CPUS[-1])] if len(CPUS) > 1
           else [])
    done = subprocess.run(
        [POOLPILOT, "perf", "router", "--streams", "2", "--engine-speed", "inf", "--duration", "1",
         "--warmup", "0.5", "--output-tokens", "8", *pin, "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    assert {(r["mode"], r["streams"]) for r in data["runs"]} == {("aggregated", 2),
                                                                   ("disaggregated", 2)}
    for run in data["runs"]:
        assert set(run) >= FIELDS
        assert run["errors"] == 0 and run["routed"]["requests"] > 0
        assert run["router_cpu_seconds"] > 0
        assert run["router_cpus"] == (CPUS[-1:] if pin else CPUS)
        # the streaming engine's own ITL, read from its histogram (engine-sim's are instant)
        for side in ("direct", "routed"):
            assert run[side]["engine_itl_p99_le_ms"] == 10.0, run[side]
        if run["mode"] == "disaggregated":
            assert run["prefill_cpus"] == (CPUS[-1:] if pin else CPUS)
        else:
            assert "prefill_cpus" not in run
    assert len(data["machine"]["load_before"]) == 3


def test_router_cpus_are_read_as_taskset_writes_them() -> None:
    assert cpu_list("1") == {1}
    assert cpu_list("2-5") == {2, 3, 4, 5}
    assert cpu_list("0,3-4") == {0, 3, 4}
    assert split_cpus(None, {0, 1}) == (None, None)
    assert split_cpus("1", {0, 1, 2}) == ({1}, {0, 2})
    with pytest.raises(ValueError, match="'x' is not a CPU number or range"):
        cpu_list("x")
    with pytest.raises(ValueError, match="leaves no CPU for the engines and clients"):
        split_cpus("0-1", {0, 1})
    with pytest.raises(ValueError, match=r"must name CPUs among \[0, 1\]"):
        split_cpus("7", {0, 1})
    assert pinned_to(None, {0, 1}, "--prefill-cpus") is None
    assert pinned_to("1", {0, 1}, "--prefill-cpus") == {1}
    with pytest.raises(ValueError, match=r"--prefill-cpus 2: must name CPUs among \[0, 1\]"):
        pinned_to("2", {0, 1}, "--prefill-cpus")


def test_a_router_cpu_list_that_leaves_nothing_is_refused() -> None:
    done = subprocess.run([POOLPILOT, "perf", "router", "--router-cpus", ",".join(map(str, CPUS))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--router-cpus" in done.stderr and "leaves no CPU" in done.stderr


def test_workers_share_the_port_and_their_metrics() -> None:
    with (
        running(start_fake_engine("P"), start_fake_engine("D")) as (p, d),
        running(start_router("--prefill", p.url, "--decode", d.url, "--workers", "3",
                             *FAST)) as (r,),
    ):
        assert r.output is not None and r.output.shows("workers=3")
        with httpx.Client() as client:  # one connection: stays with one worker
            for _ in range(10):
                assert client.post(r.url + "/v1/completions", json={
                    "model": "fake", "prompt": "hi " * 50, "max_tokens": 3}).status_code == 200
        for _ in range(10):  # new connections: spread over the workers by the kernel
            assert httpx.post(r.url + "/v1/completions", json={
                "model": "fake", "prompt": "hi " * 50, "max_tokens": 3}).status_code == 200
        # Whichever worker answers /metrics, it counts every worker's requests.
        pages = [httpx.get(r.url + "/metrics").text for _ in range(6)]
        assert {metric_value(page, "poolpilot_router_requests_total", {"code": "200"})
                for page in pages} == {20}
        assert r.stop() == 0  # SIGTERM: every worker drains and exits


def test_the_engines_itl_quantile_is_read_between_two_scrapes_of_its_histogram() -> None:
    before = {0.01: 90.0, 0.025: 95.0, 0.05: 100.0, float("inf"): 100.0}
    after = {0.01: 980.0, 0.025: 1095.0, 0.05: 1100.0, float("inf"): 1100.0}
    # 1,000 gaps in the run: 890 within 10 ms, 1,000 within 25 ms
    assert bucket_quantile(before, after, 0.5) == 0.01
    assert bucket_quantile(before, after, 0.99) == 0.025
    assert bucket_quantile(before, {**after, float("inf"): 1200.0}, 0.99) == float("inf")
    assert bucket_quantile(after, after, 0.99) is None  # nothing measured in between
    assert bucket_quantile({}, {}, 0.99) is None  # an engine without the histogram
