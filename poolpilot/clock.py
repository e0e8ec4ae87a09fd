"""The control plane's clock: the one place the local sandbox's time compression enters.

The autoscaler and the router measure and decide in *simulated* seconds, the seconds of the
SLO targets and of the engines' latency histograms. In a cluster the two are the same (rate 1).
The sandbox runs its world `rate` times faster (`--speed`): its engines step faster and report
latencies in simulated seconds, so the control plane's clock runs `rate` times faster too, and
only the edges convert: sleeping and network timeouts (real seconds), Prometheus's range
windows (real seconds) and rates Prometheus computes per real second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Clock:
    """Simulated time running `rate` times faster than `monotonic` (real seconds)."""

    rate: float = 1.0
    monotonic: Callable[[], float] = field(default=time.monotonic, compare=False)

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f"a clock's rate must be > 0, not {self.rate}")

    def now(self) -> float:
        """Simulated seconds since an arbitrary origin (monotonic)."""
        return self.monotonic() * self.rate

    def real(self, simulated_seconds: float) -> float:
        """How many real seconds `simulated_seconds` take (for sleeps and network timeouts)."""
        return simulated_seconds / self.rate

    def simulated(self, real_seconds: float) -> float:
        """How many simulated seconds pass in `real_seconds`."""
        return real_seconds * self.rate

    def per_simulated_second(self, per_real_second: float) -> float:
        """A rate measured per real second (e.g. Prometheus's rate()) per simulated second."""
        return per_real_second / self.rate


REAL_TIME = Clock()
