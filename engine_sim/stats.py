"""Cumulative vLLM metrics of one engine (or summed over a role), Prometheus-shaped.

The HTTP server exposes these through prometheus_client; the discrete-event simulator hands
them out as plain numbers, so a scrape emulation computes rate() and histogram_quantile()
from exactly what a real scrape would read.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from poolpilot import metrics as m

HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    m.VLLM_TTFT: m.TTFT_BUCKETS,
    m.VLLM_ITL: m.ITL_BUCKETS,
    m.VLLM_QUEUE_TIME: m.REQUEST_LATENCY_BUCKETS,
    m.VLLM_E2E: m.REQUEST_LATENCY_BUCKETS,
    m.VLLM_PREFILL_TIME: m.REQUEST_LATENCY_BUCKETS,
    m.VLLM_DECODE_TIME: m.REQUEST_LATENCY_BUCKETS,
    m.VLLM_INFERENCE_TIME: m.REQUEST_LATENCY_BUCKETS,
    m.VLLM_NIXL_XFER_TIME: m.NIXL_XFER_BUCKETS,
}
COUNTERS = (
    m.VLLM_PROMPT_TOKENS,
    m.VLLM_GENERATION_TOKENS,
    m.VLLM_PREEMPTIONS,
    m.VLLM_PREFIX_CACHE_QUERIES,
    m.VLLM_PREFIX_CACHE_HITS,
    m.VLLM_NIXL_FAILED,
    m.VLLM_NIXL_EXPIRED,
)
GAUGES = (m.VLLM_RUNNING, m.VLLM_WAITING, m.VLLM_KV_USAGE)
FINISH_REASONS = ("stop", "length", "abort")

HELP = {
    m.VLLM_TTFT: "Histogram of time to first token in seconds.",
    m.VLLM_ITL: "Histogram of inter-token latency in seconds.",
    m.VLLM_QUEUE_TIME: "Histogram of time spent in WAITING phase for request.",
    m.VLLM_E2E: "Histogram of e2e request latency in seconds.",
    m.VLLM_PREFILL_TIME: "Histogram of time spent in PREFILL phase for request.",
    m.VLLM_DECODE_TIME: "Histogram of time spent in DECODE phase for request.",
    m.VLLM_INFERENCE_TIME: "Histogram of time spent in RUNNING phase for request.",
    m.VLLM_NIXL_XFER_TIME: "Histogram of transfer duration for NIXL KV Cache transfers.",
    m.VLLM_PROMPT_TOKENS: "Number of prefill tokens processed.",
    m.VLLM_GENERATION_TOKENS: "Number of generation tokens processed.",
    m.VLLM_PREEMPTIONS: "Cumulative number of preemption from the engine.",
    m.VLLM_PREFIX_CACHE_QUERIES: "Prefix cache queries, in terms of number of queried tokens.",
    m.VLLM_PREFIX_CACHE_HITS: "Prefix cache hits, in terms of number of cached tokens.",
    m.VLLM_EXTERNAL_PREFIX_CACHE_QUERIES: "External prefix cache queries from KV connector "
    "cross-instance cache sharing, in terms of number of queried tokens.",
    m.VLLM_EXTERNAL_PREFIX_CACHE_HITS: "External prefix cache hits from KV connector "
    "cross-instance cache sharing, in terms of number of cached tokens.",
    m.VLLM_NIXL_FAILED: "Number of failed NIXL KV Cache transfers.",
    m.VLLM_NIXL_EXPIRED: "Number of requests that had their KV expire.",
    m.VLLM_REQUEST_SUCCESS: "Count of successfully processed requests.",
    m.VLLM_RUNNING: "Number of requests in model execution batches.",
    m.VLLM_WAITING: "Number of requests waiting to be processed.",
    m.VLLM_KV_USAGE: "KV-cache usage. 1 means 100 percent usage.",
}


@dataclass
class Histogram:
    """Prometheus histogram: per-bucket counts (not cumulative) plus +Inf, sum and count."""

    buckets: tuple[float, ...]
    counts: list[float] = field(default_factory=list)
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0.0] * (len(self.buckets) + 1)

    def observe(self, value: float, times: float = 1.0) -> None:
        # le semantics: value v falls into the first bucket whose bound is >= v
        self.counts[bisect.bisect_left(self.buckets, value)] += times
        self.sum += value * times

    def observe_many(self, values: np.ndarray, times: float = 1.0) -> None:
        if len(values) == 0:
            return
        idx = np.searchsorted(np.asarray(self.buckets), values, side="left")
        add = np.bincount(idx, minlength=len(self.counts)) * times
        for i in np.nonzero(add)[0]:
            self.counts[int(i)] += float(add[i])
        self.sum += float(values.sum()) * times

    @property
    def count(self) -> float:
        return float(sum(self.counts))

    def cumulative(self) -> list[tuple[float, float]]:
        """[(le, cumulative count)] including (+Inf, count), as exposed."""
        out: list[tuple[float, float]] = []
        acc = 0.0
        for b, c in zip((*self.buckets, float("inf")), self.counts, strict=True):
            acc += c
            out.append((b, acc))
        return out

    def merge(self, other: Histogram) -> None:
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.sum += other.sum

    def quantile(self, q: float) -> float:
        """histogram_quantile() as Prometheus computes it (linear within a bucket)."""
        return histogram_quantile(q, self.cumulative())


def histogram_quantile(q: float, cumulative: list[tuple[float, float]]) -> float:
    """Prometheus's histogram_quantile over [(le, cumulative count)] (le ascending, +Inf last)."""
    if not cumulative:
        return float("nan")
    total = cumulative[-1][1]
    if total == 0:
        return float("nan")
    rank = q * total
    prev_b, prev_c = 0.0, 0.0
    for b, c in cumulative:
        if c >= rank:
            if b == float("inf"):
                return prev_b  # Prometheus returns the highest finite bound
            if c == prev_c:
                return b
            return prev_b + (b - prev_b) * (rank - prev_c) / (c - prev_c)
        prev_b, prev_c = b, c
    return prev_b


@dataclass
class EngineStats:
    """Counters and histograms of one engine since start; gauges are read live."""

    histograms: dict[str, Histogram] = field(
        default_factory=lambda: {n: Histogram(b) for n, b in HISTOGRAM_BUCKETS.items()}
    )
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0.0))
    success: dict[str, float] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0.0))

    def merge(self, other: EngineStats) -> None:
        for n, h in other.histograms.items():
            self.histograms[n].merge(h)
        for n, v in other.counters.items():
            self.counters[n] += v
        for r, v in other.success.items():
            self.success[r] += v


@dataclass
class MetricsSnapshot:
    """What one scrape of an engine (or the sum over a role's engines) reads."""

    counters: dict[str, float]
    success: dict[str, float]  # vllm:request_success_total by finished_reason
    gauges: dict[str, float]
    histograms: dict[str, Histogram]

    def exposition(self, labels: dict[str, str] | None = None) -> str:
        """Prometheus text format (0.0.4), the same names, types and buckets as /metrics."""
        lab = dict(labels or {})
        lines: list[str] = []

        def fmt(extra: dict[str, str]) -> str:
            items = {**lab, **extra}
            if not items:
                return ""
            return "{" + ",".join(f'{k}="{v}"' for k, v in items.items()) + "}"

        for name in GAUGES:
            lines += [f"# HELP {name} {HELP[name]}", f"# TYPE {name} gauge",
                      f"{name}{fmt({})} {self.gauges.get(name, 0.0)!r}"]
        for name, value in self.counters.items():
            base = name.removesuffix("_total")
            lines += [f"# HELP {base} {HELP[name]}", f"# TYPE {base} counter",
                      f"{base}_total{fmt({})} {float(value)!r}"]
        base = m.VLLM_REQUEST_SUCCESS.removesuffix("_total")
        lines += [f"# HELP {base} {HELP[m.VLLM_REQUEST_SUCCESS]}", f"# TYPE {base} counter"]
        for reason, value in self.success.items():
            lines.append(f"{base}_total{fmt({'finished_reason': reason})} {float(value)!r}")
        for name, h in self.histograms.items():
            lines += [f"# HELP {name} {HELP[name]}", f"# TYPE {name} histogram"]
            for le, c in h.cumulative():
                le_s = "+Inf" if le == float("inf") else repr(float(le))
                lines.append(f"{name}_bucket{fmt({'le': le_s})} {c!r}")
            lines.append(f"{name}_count{fmt({})} {h.count!r}")
            lines.append(f"{name}_sum{fmt({})} {h.sum!r}")
        return "\n".join(lines) + "\n"


def sum_snapshots(snaps: Iterable[MetricsSnapshot], kv_mean: bool = True) -> MetricsSnapshot:
    """Sum over engines (counters, histograms, running/waiting); KV usage is averaged."""
    out = MetricsSnapshot(dict.fromkeys(COUNTERS, 0.0), dict.fromkeys(FINISH_REASONS, 0.0),
                          dict.fromkeys(GAUGES, 0.0),
                          {n: Histogram(b) for n, b in HISTOGRAM_BUCKETS.items()})
    kv: list[float] = []
    for s in snaps:
        for n, v in s.counters.items():
            out.counters[n] = out.counters.get(n, 0.0) + v
        for r, v in s.success.items():
            out.success[r] += v
        for n, h in s.histograms.items():
            out.histograms[n].merge(h)
        out.gauges[m.VLLM_RUNNING] += s.gauges.get(m.VLLM_RUNNING, 0.0)
        out.gauges[m.VLLM_WAITING] += s.gauges.get(m.VLLM_WAITING, 0.0)
        kv.append(s.gauges.get(m.VLLM_KV_USAGE, 0.0))
    if kv:
        out.gauges[m.VLLM_KV_USAGE] = sum(kv) / len(kv) if kv_mean else sum(kv)
    return out
