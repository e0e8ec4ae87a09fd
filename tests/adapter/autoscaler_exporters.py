"""Fixture exporters with known values, served by prometheus_client on free loopback ports.

Each `FakeEngine` exports vLLM-named series whose values a test chooses: gauges as given,
counters growing at exact rates (from a large offset, so Prometheus's rate() extrapolation
never clips at zero), and histograms whose observations all fall in one bucket at a steady
rate, so histogram_quantile(q) is `lower + (upper - lower) * q` exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from poolpilot.testkit.prometheus import MetricsPage, Target, free_port
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from poolpilot import metrics as m

COUNTER_OFFSET = 1_000_000.0


@dataclass
class Hist:
    """Observations per second, all in the bucket (lower, upper] of `buckets`."""

    upper: float
    per_second: float = 10.0
    buckets: tuple[float, ...] = m.TTFT_BUCKETS

    def lower(self) -> float:
        i = self.buckets.index(self.upper)
        return 0.0 if i == 0 else self.buckets[i - 1]

    def quantile(self, q: float) -> float:
        """What Prometheus's histogram_quantile(q) must return for this histogram."""
        return self.lower() + (self.upper - self.lower()) * q


@dataclass(eq=False)  # identity hash: the registry keys collectors by object
class FakeExporter(Collector):
    """A /metrics page: gauges {name: value}, counters {name: per-second rate} and
    histograms {name: Hist}; extra labels on every series (e.g. the router's own)."""

    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Hist] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    port: int = 0
    # True: always serve the text format 0.0.4 (names keep their colons). False: let
    # prometheus_client negotiate, which gives Prometheus 2.x OpenMetrics with the colons
    # escaped to underscores (vllm_num_requests_waiting): the autoscaler must read both.
    text_only: bool = False
    _started: float = field(default_factory=time.time)
    _stop: Callable[[], None] | None = None

    def collect(self) -> Iterator[Metric]:
        elapsed = time.time() - self._started
        names, values = list(self.labels), list(self.labels.values())
        for name, value in self.gauges.items():
            g = GaugeMetricFamily(name, "fixture gauge", labels=names)
            g.add_metric(values, value)
            yield g
        for name, rate in self.counters.items():
            c = CounterMetricFamily(name.removesuffix("_total"), "fixture counter", labels=names)
            c.add_metric(values, COUNTER_OFFSET + rate * elapsed)
            yield c
        for name, h in self.histograms.items():
            count = COUNTER_OFFSET + h.per_second * elapsed
            buckets = [(_le(b), 0.0 if b < h.upper else count) for b in h.buckets]
            buckets.append(("+Inf", count))
            hist = HistogramMetricFamily(name, "fixture histogram", labels=names)
            hist.add_metric(values, buckets, sum_value=count * h.upper)
            yield hist

    def start(self) -> FakeExporter:
        registry = CollectorRegistry()
        registry.register(self)
        self.port = free_port()
        if self.text_only:
            self._stop = MetricsPage(lambda: generate_latest(registry), self.port,
                                     content_type=CONTENT_TYPE_LATEST).close
            return self
        server, _ = start_http_server(self.port, addr="127.0.0.1", registry=registry)

        def stop() -> None:
            server.shutdown()
            server.server_close()

        self._stop = stop
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None

    def target(self, namespace: str, pool: str, role: str) -> Target:
        return Target(f"127.0.0.1:{self.port}",
                      {"namespace": namespace, "pool": pool, "role": role})


def _le(bound: float) -> str:
    return repr(float(bound))


def engine(waiting: float = 0, running: float = 0, kv: float | None = 0.0,
           prompt_rate: float = 0, generation_rate: float = 0,
           ttft: Hist | None = None, itl: Hist | None = None, old_names: bool = False,
           text_only: bool = False, request_rate: float = 0,
           prefix: tuple[float, float, float | None] | None = None) -> FakeExporter:
    """A vLLM engine's page; `old_names` uses the names older vLLM releases exported;
    `prefix`: prefix-cache queries, hits and external hits per second (None: not exported)."""
    kv_name = m.VLLM_RENAMED[m.VLLM_KV_USAGE] if old_names else m.VLLM_KV_USAGE
    itl_name = m.VLLM_RENAMED[m.VLLM_ITL] if old_names else m.VLLM_ITL
    gauges = {m.VLLM_WAITING: waiting, m.VLLM_RUNNING: running}
    if kv is not None:
        gauges[kv_name] = kv
    hists = {}
    if ttft is not None:
        hists[m.VLLM_TTFT] = ttft
    if itl is not None:
        hists[itl_name] = itl
    counters = {m.VLLM_PROMPT_TOKENS: prompt_rate, m.VLLM_GENERATION_TOKENS: generation_rate,
                m.VLLM_REQUEST_SUCCESS: request_rate}
    if prefix is not None:
        names = [m.VLLM_PREFIX_CACHE_QUERIES, m.VLLM_PREFIX_CACHE_HITS]
        queries, hits = (m.VLLM_RENAMED[n] for n in names) if old_names else names
        counters[queries], counters[hits] = prefix[:2]
        if prefix[2] is not None:
            counters[m.VLLM_EXTERNAL_PREFIX_CACHE_HITS] = prefix[2]
    return FakeExporter(
        gauges=gauges,
        counters=counters,
        histograms=hists,
        text_only=text_only,
    )


def router(pool: str, inflight: float = 0, request_rate: float = 0,
           ttft: Hist | None = None, held: float = 0) -> FakeExporter:
    """The router's page; its own `pool` label clashes with the target's (as in a cluster)."""
    return FakeExporter(
        gauges={m.ROUTER_INFLIGHT: inflight, m.ROUTER_HELD: held},
        counters={m.ROUTER_REQUESTS: request_rate},
        histograms={m.ROUTER_TTFT: ttft} if ttft else {},
        labels={"pool": pool},
    )


def router_fallback(pool: str, reason: str, local_prefill_rate: float,
                    kv_failure_rate: float = 0) -> FakeExporter:
    """The router's local-prefill counter for one reason (and its failed-handoff counter)."""
    return FakeExporter(
        counters={m.ROUTER_LOCAL_PREFILL: local_prefill_rate,
                  m.ROUTER_KV_TRANSFER_FAILURES: kv_failure_rate},
        labels={"pool": pool, "reason": reason},
    )
