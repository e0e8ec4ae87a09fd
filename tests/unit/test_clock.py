"""The control plane's clock: simulated seconds at `rate`, converted only at the edges."""

from __future__ import annotations

import pytest

from poolpilot.clock import REAL_TIME, Clock


@pytest.mark.parametrize("rate", [1.0, 4.0, 8.0], ids=["cluster", "sandbox-default", "x8"])
def test_simulated_time_runs_rate_times_faster_and_converts_back(rate: float) -> None:
    real = [100.0]
    clock = Clock(rate, monotonic=lambda: real[0])
    start = clock.now()
    real[0] += 2.5  # 2.5 real seconds pass
    assert clock.now() - start == pytest.approx(2.5 * rate)
    assert clock.simulated(2.5) == pytest.approx(2.5 * rate)
    assert clock.real(clock.simulated(2.5)) == pytest.approx(2.5)
    # 1,000 tokens per real second are 1,000 / rate per simulated second
    assert clock.per_simulated_second(1000.0) == pytest.approx(1000.0 / rate)


def test_the_cluster_clock_is_the_identity() -> None:
    assert REAL_TIME.rate == 1.0
    assert REAL_TIME.real(7.0) == 7.0 and REAL_TIME.simulated(7.0) == 7.0


@pytest.mark.parametrize("rate", [0.0, -1.0, float("nan")], ids=["zero", "negative", "nan"])
def test_a_rate_that_is_not_positive_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="rate must be > 0"):
        Clock(rate)
