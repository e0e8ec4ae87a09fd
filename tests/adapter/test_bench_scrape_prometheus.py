"""The benchmark's Prometheus emulation against a real Prometheus, on the same samples.

A tiny exporter serves a counter and a histogram that grow irregularly (with a counter reset);
a real Prometheus scrapes it every second. The test reads back the raw samples Prometheus
stored (`metric[range]`), feeds them to `PromView` with their scrape timestamps, and compares
`rate()`, `increase()` and `histogram_quantile()` at several evaluation times with what
Prometheus itself answers for the same PromQL.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from collections.abc import Iterator

import httpx
import pytest
from poolpilot.bench.scrape import PromView, labels_of
from poolpilot.testkit.prometheus import (
    MetricsPage,
    PrometheusNotInstalled,
    PrometheusProcess,
    Target,
)

pytestmark = pytest.mark.adapter

BUCKETS = (0.1, 0.5, 1.0, 2.5, math.inf)


class State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counter = 5.0
        self.buckets = [0.0] * len(BUCKETS)
        self.count = 0.0
        self.sum = 0.0

    def text(self) -> str:
        with self.lock:
            lines = ["# TYPE bench_tokens_total counter",
                     f'bench_tokens_total{{role="prefill"}} {self.counter}',
                     "# TYPE bench_latency_seconds histogram"]
            for le, c in zip(BUCKETS, self.buckets, strict=True):
                le_s = "+Inf" if math.isinf(le) else str(le)
                lines.append(f'bench_latency_seconds_bucket{{role="decode",le="{le_s}"}} {c}')
            lines.append(f'bench_latency_seconds_count{{role="decode"}} {self.count}')
            lines.append(f'bench_latency_seconds_sum{{role="decode"}} {self.sum}')
        return "\n".join(lines) + "\n"

    def observe(self, v: float) -> None:
        with self.lock:
            for i, le in enumerate(BUCKETS):
                if v <= le:
                    self.buckets[i] += 1
            self.count += 1
            self.sum += v


@pytest.fixture
def exporter() -> Iterator[tuple[State, str]]:
    state = State()
    with MetricsPage(lambda: state.text().encode()) as page:
        yield state, page.address


def query(url: str, promql: str, t: float) -> list[dict]:
    r = httpx.get(f"{url}/api/v1/query", params={"query": promql, "time": f"{t:.3f}"},
                  timeout=10)
    r.raise_for_status()
    result: list[dict] = r.json()["data"]["result"]
    return result


def test_rate_and_quantile_match_real_prometheus(exporter: tuple[State, str]) -> None:
    state, address = exporter
    prom = PrometheusProcess(scrape_interval=1.0)
    try:
        prom.start([Target(address, {"role_target": "x"})])
    except PrometheusNotInstalled as exc:
        pytest.skip(str(exc))
    try:
        # Wait (with a deadline) until Prometheus has scraped the exporter once.
        deadline = time.monotonic() + 30
        while not query(prom.url, "bench_tokens_total", time.time()):
            assert time.monotonic() < deadline, prom.log_tail()
            time.sleep(0.2)
        values = [0.05, 0.3, 0.3, 0.7, 2.0, 0.2, 5.0, 0.4, 0.9, 0.12]
        for i in range(40):  # ~8 s of irregular growth, one counter reset half-way
            with state.lock:
                state.counter = 3.0 if i == 20 else state.counter + 7 * (i % 3) + 1
            state.observe(values[i % len(values)])
            time.sleep(0.2)
        end = time.time()
        # Wait until the newest scrape is in the TSDB.
        time.sleep(1.5)

        view = PromView(scrape_interval=1.0, retention=3600)
        by_time: dict[float, list] = defaultdict(list)
        for name in ("bench_tokens_total", "bench_latency_seconds_bucket"):
            for series in query(prom.url, f"{name}[60s]", end):
                labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
                for ts, v in series["values"]:
                    by_time[float(ts)].append((name, labels_of(labels), float(v)))
        for ts in sorted(by_time):
            view.scrape(ts, by_time[ts])
        assert view.scrapes >= 6

        checked = 0
        for t in (round(end - 4.3, 3), round(end - 2.1, 3), round(end, 3)):
            for w in (3.0, 5.0):
                want = query(prom.url, f"sum(rate(bench_tokens_total[{w:g}s]))", t)
                got = view.rate("bench_tokens_total", w, at=t)
                if want:
                    assert got[()] == pytest.approx(float(want[0]["value"][1]), rel=1e-6)
                    checked += 1
                want = query(prom.url, f"sum(increase(bench_tokens_total[{w:g}s]))", t)
                if want:
                    assert view.increase("bench_tokens_total", w, at=t)[()] == pytest.approx(
                        float(want[0]["value"][1]), rel=1e-6)
                want = query(
                    prom.url,
                    f"histogram_quantile(0.9, sum by (le) (rate(bench_latency_seconds_bucket"
                    f"[{w:g}s])))", t)
                got_q = view.histogram_quantile(0.9, "bench_latency_seconds", w, at=t)
                if want and want[0]["value"][1] != "NaN":
                    assert got_q[()] == pytest.approx(float(want[0]["value"][1]), rel=1e-6)
                    checked += 1
        assert checked >= 8
    finally:
        prom.stop()
