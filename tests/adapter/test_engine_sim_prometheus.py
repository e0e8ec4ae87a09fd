"""A real Prometheus scraping the engine simulator: histogram_quantile over its TTFT buckets
matches the simulator's own per-request records within bucket resolution."""

from __future__ import annotations

import bisect
import math
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from poolpilot.engine_sim.stats import histogram_quantile
from poolpilot.testkit.engine_sim import EngineSimProcess
from poolpilot.testkit.prometheus import PrometheusProcess, Target

from poolpilot import metrics as m

pytestmark = pytest.mark.adapter
NAME = "sim-llama"
N = 48


def query(prom: PrometheusProcess, q: str) -> list[dict]:
    r = httpx.get(prom.url + "/api/v1/query", params={"query": q}, timeout=10)
    r.raise_for_status()
    return r.json()["data"]["result"]


def test_histogram_quantile_over_a_real_scrape_matches_the_records() -> None:
    with EngineSimProcess(role="decode", speed=10, served_name=NAME) as sim, \
            PrometheusProcess(scrape_interval=0.5).start(
                [Target(sim.url.removeprefix("http://"),
                        {"namespace": "t", "pool": "p", "role": "decode"})]) as prom:
        rng = np.random.default_rng(1)
        prompts = [int(n) for n in rng.integers(200, 12000, size=N)]

        def one(n: int) -> None:
            httpx.post(sim.url + "/v1/completions", timeout=60, json={
                "model": NAME, "prompt": list(range(n)), "max_tokens": 20, "ignore_eos": True})

        with ThreadPoolExecutor(16) as pool:  # concurrent: prefills queue behind each other
            list(pool.map(one, prompts))
        recs = httpx.get(sim.url + "/sim/requests").json()["requests"]
        ttft = np.array([r["first_token_at"] - r["arrival"] for r in recs])
        assert len(ttft) == N

        deadline = time.monotonic() + 60
        while True:  # until Prometheus has scraped the final counts
            got = query(prom, f'sum({m.VLLM_TTFT}_count{{pool="p",role="decode"}})')
            if got and float(got[0]["value"][1]) == N:
                break
            assert time.monotonic() < deadline, f"Prometheus never saw {N} requests: {got}"
            time.sleep(0.25)
        for q in (0.5, 0.9, 0.99):
            res = query(prom, f"histogram_quantile({q}, sum by (le) "
                              f'({m.VLLM_TTFT}_bucket{{pool="p",role="decode"}}))')
            estimate = float(res[0]["value"][1])
            # the sample at Prometheus's rank (q x count); its bucket holds the estimate
            exact = float(np.sort(ttft)[math.ceil(q * N) - 1])
            i = bisect.bisect_left(m.TTFT_BUCKETS, exact)
            lo = m.TTFT_BUCKETS[i - 1] if i > 0 else 0.0
            hi = m.TTFT_BUCKETS[i]
            assert lo <= estimate <= hi, (q, exact, estimate)
            # and Prometheus agrees with the simulator's own histogram_quantile
            counts = [(le, float(np.sum(ttft <= le))) for le in (*m.TTFT_BUCKETS, np.inf)]
            assert estimate == pytest.approx(histogram_quantile(q, counts), rel=1e-6)
        # the spread is real: queueing put requests in more than one bucket
        assert len({bisect.bisect_left(m.TTFT_BUCKETS, t) for t in ttft}) >= 3
