"""The Prometheus emulation: rate extrapolation, histogram_quantile, staleness, lookback."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.bench.scrape import PromView, bucket_quantile, extrapolated_rate, labels_of


@dataclass(frozen=True)
class RateCase:
    name: str
    points: list[tuple[float, float]]
    start: float
    end: float
    want: float | None


RATE_CASES = [
    RateCase("aligned 1/s", [(15, 15), (30, 30), (45, 45), (60, 60)], 0, 60, 1.0),
    # first sample 15 s into a 60 s window: extrapolated to the start (within 1.1 intervals)
    RateCase("extrapolates to start", [(15, 100), (30, 115), (45, 130), (60, 145)], 0, 60, 1.0),
    # a counter that starts at 0 is not extrapolated below zero
    RateCase("no extrapolation below zero", [(30, 0), (45, 15), (60, 30)], 0, 60,
             (30 * (30 + 0) / 30) / 60),
    # a reset: 10 -> 2 counts as +2 after the reset (value before reset is added)
    RateCase("counter reset", [(20, 0), (40, 10), (60, 2)], 0, 60, (12 * (40 + 0) / 40) / 60),
    RateCase("one sample", [(60, 5)], 0, 60, None),
    # a gap longer than 1.1 intervals at the end extrapolates only half an interval
    RateCase("gap at end", [(10, 10), (20, 20), (30, 30)], 0, 60, (20 * (20 + 10 + 5) / 20) / 60),
]


@pytest.mark.parametrize("case", RATE_CASES, ids=[c.name for c in RATE_CASES])
def test_extrapolated_rate(case: RateCase) -> None:
    got = extrapolated_rate(case.points, case.start, case.end, is_rate=True)
    if case.want is None:
        assert got is None
    else:
        assert got == pytest.approx(case.want)


@dataclass(frozen=True)
class QuantileCase:
    name: str
    q: float
    buckets: list[tuple[float, float]]
    want: float


INF = math.inf
B = [(0.1, 0.0), (0.25, 50.0), (0.5, 100.0), (INF, 100.0)]
QUANTILE_CASES = [
    QuantileCase("median at bucket edge", 0.5, B, 0.25),
    QuantileCase("p90 interpolated", 0.9, B, 0.25 + 0.25 * 40 / 50),
    QuantileCase("first bucket starts at 0", 0.1, [(1.0, 10.0), (INF, 10.0)], 0.1),
    QuantileCase("in +Inf bucket -> highest finite bound", 0.99,
                 [(1.0, 10.0), (2.0, 20.0), (INF, 100.0)], 2.0),
    QuantileCase("no observations", 0.9, [(1.0, 0.0), (INF, 0.0)], math.nan),
    QuantileCase("non-monotonic counts fixed up", 0.5, [(1.0, 10.0), (2.0, 8.0), (INF, 20.0)], 1.0),
]


@pytest.mark.parametrize("case", QUANTILE_CASES, ids=[c.name for c in QUANTILE_CASES])
def test_bucket_quantile(case: QuantileCase) -> None:
    got = bucket_quantile(case.q, case.buckets)
    if math.isnan(case.want):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(case.want)


def _hist(view: PromView, t: float, role: str, counts: dict[str, float]) -> list:
    return [("lat_bucket", labels_of({"role": role, "le": le}), c) for le, c in counts.items()]


def test_view_histogram_quantile_sums_series_by_role() -> None:
    """Two pods' buckets are summed per role before the quantile, like `sum by (le, role)`."""
    view = PromView(scrape_interval=15)
    for i, t in enumerate((15.0, 30.0, 45.0, 60.0)):
        samples = []
        for pod in ("a", "b"):
            for le, per_step in (("0.1", 0.0), ("0.5", 2.0), ("+Inf", 2.0)):
                samples.append(("lat_bucket", labels_of({"role": "decode", "pod": pod, "le": le}),
                                per_step * i))
        view.scrape(t, samples)
    got = view.histogram_quantile(0.5, "lat", 60, {"role": "decode"}, by=("role",))
    assert got == {("decode",): pytest.approx(0.1 + 0.4 * 0.5)}


def test_gauge_lookback_and_staleness() -> None:
    view = PromView(scrape_interval=15)
    view.scrape(0, [("q", labels_of({"role": "prefill", "pod": "a"}), 3.0),
                    ("q", labels_of({"role": "prefill", "pod": "b"}), 4.0)])
    assert view.gauge("q", {"role": "prefill"}) == {(): 7.0}
    # pod b disappears: its series goes stale at the next scrape (not 5 minutes later)
    view.scrape(15, [("q", labels_of({"role": "prefill", "pod": "a"}), 5.0)])
    assert view.gauge("q", {"role": "prefill"}) == {(): 5.0}
    assert view.gauge("q", {"role": "prefill"}, agg="avg") == {(): 5.0}
    # evaluated long after the last sample, nothing is returned (lookback 5 min)
    assert view.gauge("q", {"role": "prefill"}, at=15 + 301) == {}


def test_series_that_come_back_start_afresh() -> None:
    """A pod replaced under the same labels must not produce a huge negative/positive rate."""
    view = PromView(scrape_interval=15)
    key = labels_of({"role": "decode"})
    view.scrape(15, [("c_total", key, 1000.0)])
    view.scrape(30, [("c_total", key, 1015.0)])
    view.scrape(45, [])
    view.scrape(60, [("c_total", key, 0.0)])
    view.scrape(75, [("c_total", key, 15.0)])
    # Only the new series' samples count: 15 over 15 s, extrapolated back to its zero start,
    # so 15 per 30 s window (without the gap the 1000 -> 0 drop would read as a reset).
    assert view.rate("c_total", 30, at=75) == {(): pytest.approx(0.5)}


@given(
    step=st.floats(0.1, 100.0),
    interval=st.sampled_from([5.0, 10.0, 15.0, 30.0]),
    n=st.integers(2, 20),
)
def test_rate_of_a_linear_counter_is_its_slope(step: float, interval: float, n: int) -> None:
    """Samples covering the whole window of a line from 0 give exactly its slope."""
    pts = [(interval * i, step * i) for i in range(1, n + 1)]
    window = interval * n
    got = extrapolated_rate(pts, 0.0, window, is_rate=True)
    assert got == pytest.approx(step / interval, rel=1e-9)
