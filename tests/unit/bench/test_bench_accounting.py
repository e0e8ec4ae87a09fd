"""Accounting by hand: attainment, percentiles, GPU-hours from request time, goodput, flapping."""

from __future__ import annotations

import math

import pytest
from poolpilot.bench.accounting import (
    Ledger,
    ReplayedRequest,
    ScaleEvent,
    direction_changes,
    percentile,
    summarize,
)


def out(i: int, ttft: float | None, itl: float | None = 0.01, done: bool = True) -> ReplayedRequest:
    return ReplayedRequest(
        id=i,
        arrival=float(i),
        first_token_at=None if ttft is None else i + ttft,
        finished_at=(i + 10.0) if done else None,
        output_tokens=10,
        itl_p90=itl,
    )


def test_attainment_needs_both_ttft_and_itl_and_a_finish() -> None:
    outcomes = [
        out(0, 0.5),  # meets
        out(1, 1.5),  # TTFT miss
        out(2, 0.5, itl=0.2),  # ITL miss
        out(3, 0.5, done=False),  # never finished
        out(4, None, done=False),  # never started
        out(5, 0.5, itl=None),  # one output token: no ITL to miss
    ]
    led = Ledger()
    led.request("prefill", 0.0, 0.0, 1)
    s = summarize(outcomes, led, 3600.0, slo_ttft=1.0, slo_itl=0.05)
    assert s.requests == 6 and s.finished == 4
    assert s.slo_attainment == pytest.approx(2 / 6)
    assert s.ttft_p99 == math.inf  # the starved request is not hidden
    assert s.goodput_per_gpu == 0.0  # below the 90% goal


def test_gpu_hours_count_cold_start_and_drain() -> None:
    """A pod requested at t=600 (ready at 900) and gone at 1800 bills 1200 s on 2 GPUs."""
    led = Ledger()
    led.request("decode", 0.0, 0.0, 2)  # the whole hour
    span = led.request("decode", 600.0, 900.0, 2)
    led.mark_removal(span, 1500.0)
    led.close(span, 1800.0)
    assert led.gpu_hours(3600.0) == pytest.approx((3600 * 2 + 1200 * 2) / 3600)
    assert led.replicas_at("decode", 700.0) == 2
    assert led.replicas_at("decode", 1800.0) == 1


def test_goodput_per_gpu_at_goal() -> None:
    outcomes = [out(i, 0.1) for i in range(100)]
    led = Ledger()
    led.request("prefill", 0.0, 0.0, 1)
    led.request("decode", 0.0, 0.0, 1)
    s = summarize(outcomes, led, 100.0, slo_ttft=1.0, slo_itl=0.05)
    assert s.slo_attainment == 1.0
    assert s.avg_gpus == pytest.approx(2.0)
    assert s.goodput_per_gpu == pytest.approx(1.0 / 2.0)  # 1 req/s on 2 GPUs


@pytest.mark.parametrize(
    "moves,want",
    [([(1, 2), (2, 3), (3, 4)], 0), ([(1, 2), (2, 1), (1, 2)], 2), ([(2, 1), (1, 1), (1, 3)], 1)],
    ids=["monotone", "flapping", "no-op events ignored"],
)
def test_direction_changes(moves: list[tuple[int, int]], want: int) -> None:
    events = [ScaleEvent(float(i), "decode", a, b) for i, (a, b) in enumerate(moves)]
    assert direction_changes(events, "decode") == want
    assert direction_changes(events, "prefill") == 0


def test_nearest_rank_percentile() -> None:
    vals = list(range(1, 101))
    assert percentile(vals, 50) == 50
    assert percentile(vals, 90) == 90
    assert percentile(vals, 99) == 99
    assert math.isnan(percentile([], 90))
