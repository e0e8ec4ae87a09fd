"""Prometheus as the policies see it: periodic scrapes of cumulative metrics, then PromQL math.

Every policy in the benchmark reads the simulated pool through this module, never through the
simulator's exact state, so each one sees what it would see in production: values only at
scrape times (default every 15 s), counters turned into rates over a window with Prometheus's
own extrapolation (`extrapolatedRate` in promql/functions.go), quantiles estimated from
histogram buckets by linear interpolation (`bucketQuantile` in promql/quantile.go), gauges as
the last scraped value within the 5-minute lookback, and series that vanish marked stale.

Only the handful of PromQL shapes the policies need are implemented, as functions:
`sum by (L) (rate(m[w]))`, `histogram_quantile(q, sum by (le, L) (rate(m_bucket[w])))`,
`sum by (L) (m)` for gauges, and `increase`. Label matching is equality only.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]
SeriesKey = tuple[str, Labels]

LOOKBACK_S = 300.0  # Prometheus's default query.lookback-delta


def labels_of(d: Mapping[str, str]) -> Labels:
    return tuple(sorted((str(k), str(v)) for k, v in d.items()))


@dataclass
class _Series:
    points: deque[tuple[float, float]] = field(default_factory=deque)
    stale_at: float | None = None  # time of the first scrape that no longer had the series


class PromView:
    """An in-memory TSDB filled by `scrape(t, samples)`, queried like Prometheus at time t.

    Queries evaluate at the time of the latest scrape unless `at` is given. Range selectors
    are closed `[t - w, t]` as in Prometheus 2.x (the version installed here and tested
    against); `left_open=True` gives Prometheus 3's `(t - w, t]`.
    """

    def __init__(
        self, scrape_interval: float = 15.0, retention: float = 900.0, left_open: bool = False
    ) -> None:
        if scrape_interval <= 0:
            raise ValueError("scrape_interval must be > 0 seconds")
        self.scrape_interval = scrape_interval
        self.left_open = left_open
        self.retention = max(retention, LOOKBACK_S + scrape_interval)
        self._series: dict[SeriesKey, _Series] = {}
        self.now = 0.0
        self.scrapes = 0

    # ---- ingestion -------------------------------------------------------------------------
    def scrape(self, t: float, samples: Iterable[tuple[str, Labels, float]]) -> None:
        """Record one scrape: every sample gets timestamp t; absent series become stale."""
        seen: set[SeriesKey] = set()
        for name, labels, value in samples:
            key = (name, labels)
            seen.add(key)
            s = self._series.get(key)
            if s is None:
                s = self._series[key] = _Series()
            if s.stale_at is not None:
                # A series that comes back starts afresh (a new pod, or a restart).
                s.points.clear()
                s.stale_at = None
            s.points.append((t, float(value)))
            horizon = t - self.retention
            while s.points and s.points[0][0] < horizon:
                s.points.popleft()
        for key, s in self._series.items():
            if key not in seen and s.stale_at is None:
                s.stale_at = t
        self.now = t
        self.scrapes += 1

    # ---- selection -------------------------------------------------------------------------
    def _select(self, name: str, match: Mapping[str, str]) -> list[tuple[Labels, _Series]]:
        want = tuple(match.items())
        out = []
        for (n, labels), s in self._series.items():
            if n != name:
                continue
            ld = dict(labels)
            if all(ld.get(k) == v for k, v in want):
                out.append((labels, s))
        return out

    def _window(self, s: _Series, start: float, end: float) -> list[tuple[float, float]]:
        if self.left_open:
            return [(t, v) for t, v in s.points if start < t <= end]
        return [(t, v) for t, v in s.points if start <= t <= end]

    @staticmethod
    def _group(labels: Labels, by: tuple[str, ...]) -> tuple[str, ...]:
        ld = dict(labels)
        return tuple(ld.get(k, "") for k in by)

    # ---- PromQL functions ------------------------------------------------------------------
    def rate(
        self,
        name: str,
        window: float,
        match: Mapping[str, str] | None = None,
        by: tuple[str, ...] = (),
        at: float | None = None,
    ) -> dict[tuple[str, ...], float]:
        """`sum by (by) (rate(name{match}[window]))`; groups with no computable rate are absent."""
        t = self.now if at is None else at
        out: dict[tuple[str, ...], float] = {}
        for labels, s in self._select(name, match or {}):
            pts = self._window(s, t - window, t)
            r = extrapolated_rate(pts, t - window, t, is_rate=True)
            if r is None:
                continue
            g = self._group(labels, by)
            out[g] = out.get(g, 0.0) + r
        return out

    def increase(
        self,
        name: str,
        window: float,
        match: Mapping[str, str] | None = None,
        by: tuple[str, ...] = (),
        at: float | None = None,
    ) -> dict[tuple[str, ...], float]:
        """`sum by (by) (increase(name{match}[window]))`."""
        return {g: r * window for g, r in self.rate(name, window, match, by, at).items()}

    def gauge(
        self,
        name: str,
        match: Mapping[str, str] | None = None,
        by: tuple[str, ...] = (),
        at: float | None = None,
        agg: str = "sum",
    ) -> dict[tuple[str, ...], float]:
        """`sum|avg|max by (by) (name{match})`: last sample within the lookback, not stale."""
        t = self.now if at is None else at
        groups: dict[tuple[str, ...], list[float]] = {}
        for labels, s in self._select(name, match or {}):
            if s.stale_at is not None and s.stale_at <= t:
                continue
            last = None
            for pt, v in reversed(s.points):
                if pt <= t:
                    last = (pt, v)
                    break
            if last is None or last[0] <= t - LOOKBACK_S:
                continue
            groups.setdefault(self._group(labels, by), []).append(last[1])
        if agg == "sum":
            return {g: math.fsum(v) for g, v in groups.items()}
        if agg == "avg":
            return {g: math.fsum(v) / len(v) for g, v in groups.items()}
        if agg == "max":
            return {g: max(v) for g, v in groups.items()}
        raise ValueError(f"unknown aggregation {agg!r}: use sum, avg or max")

    def histogram_quantile(
        self,
        q: float,
        name: str,
        window: float,
        match: Mapping[str, str] | None = None,
        by: tuple[str, ...] = (),
        at: float | None = None,
    ) -> dict[tuple[str, ...], float]:
        """`histogram_quantile(q, sum by (le, by) (rate(name_bucket{match}[window])))`.

        `name` is the histogram's base name; NaN where the window saw no observations.
        """
        rates = self.rate(f"{name}_bucket", window, match, by=(*by, "le"), at=at)
        per_group: dict[tuple[str, ...], list[tuple[float, float]]] = {}
        for g, r in rates.items():
            *rest, le = g
            per_group.setdefault(tuple(rest), []).append((_parse_le(le), r))
        return {g: bucket_quantile(q, b) for g, b in per_group.items()}

    def mean_from_histogram(
        self,
        name: str,
        window: float,
        match: Mapping[str, str] | None = None,
        by: tuple[str, ...] = (),
        at: float | None = None,
    ) -> dict[tuple[str, ...], float]:
        """`sum(rate(name_sum[w])) / sum(rate(name_count[w]))`: NaN when nothing was observed."""
        sums = self.rate(f"{name}_sum", window, match, by, at)
        counts = self.rate(f"{name}_count", window, match, by, at)
        return {g: (sums[g] / c if c > 0 else math.nan) for g, c in counts.items() if g in sums}


def _parse_le(le: str) -> float:
    return math.inf if le in ("+Inf", "Inf", "inf") else float(le)


def extrapolated_rate(
    points: list[tuple[float, float]], range_start: float, range_end: float, is_rate: bool
) -> float | None:
    """Prometheus's `extrapolatedRate` for a counter: None with fewer than two samples.

    Counter resets add the value before the reset; the result is extrapolated to the window's
    edges when the first/last sample is within 1.1 average intervals of them (else by half an
    interval), and never extrapolated below zero at the start.
    """
    if len(points) < 2:
        return None
    first_t, first_v = points[0]
    last_t, last_v = points[-1]
    result = last_v - first_v
    prev = first_v
    for _, v in points[1:]:
        if v < prev:
            result += prev
        prev = v
    sampled = last_t - first_t
    if sampled <= 0:
        return None
    avg_between = sampled / (len(points) - 1)
    to_start = first_t - range_start
    to_end = range_end - last_t
    if result > 0 and first_v >= 0:
        to_zero = sampled * (first_v / result)
        to_start = min(to_start, to_zero)
    threshold = avg_between * 1.1
    extrapolate_to = sampled
    extrapolate_to += to_start if to_start < threshold else avg_between / 2
    extrapolate_to += to_end if to_end < threshold else avg_between / 2
    result *= extrapolate_to / sampled
    if is_rate:
        result /= range_end - range_start
    return result


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's `bucketQuantile`: linear interpolation inside the bucket holding rank q*N.

    `buckets` are (upper bound, cumulative count) pairs and must include +Inf. Counts are
    forced monotonic first (rates of separate series can wobble), as Prometheus does.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    b = sorted(buckets)
    if len(b) < 2 or not math.isinf(b[-1][0]):
        return math.nan
    fixed: list[tuple[float, float]] = []
    running = 0.0
    for le, c in b:
        running = max(running, c)
        fixed.append((le, running))
    total = fixed[-1][1]
    if total <= 0:
        return math.nan
    rank = q * total
    idx = next(i for i, (_, c) in enumerate(fixed) if c >= rank)
    if idx == len(fixed) - 1:
        return fixed[-2][0]
    if idx == 0 and fixed[0][0] <= 0:
        return fixed[0][0]
    start = 0.0 if idx == 0 else fixed[idx - 1][0]
    end = fixed[idx][0]
    below = 0.0 if idx == 0 else fixed[idx - 1][1]
    in_bucket = fixed[idx][1] - below
    if in_bucket <= 0:
        return end
    return start + (end - start) * ((rank - below) / in_bucket)
