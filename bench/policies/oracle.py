"""The hindsight oracle as a policy: it replays a plan made from the whole trace in advance.

The plan (`poolpilot.bench.oracle`) holds, per role and per 30 s window, the fewest ready
replicas that meet the SLO, found by search through the simulated pool. This policy orders
each of them one cold start ahead and releases it as soon as no window within the next cold
start needs it, inside the same replica bounds, paying the same cold start and billing as
every other policy. It reads no metric. It is a yardstick, not something one can deploy: it
knows every future arrival.
"""

from __future__ import annotations

from typing import Any

from poolpilot.bench.oracle import OraclePlan
from poolpilot.bench.policies.base import Bounds, PoolView, ScalingDecision, clamp

from poolpilot.roles import DISAGGREGATED_ROLES

DECISION_INTERVAL_S = 5.0


class Oracle:
    name = "oracle"

    def __init__(self, plan: OraclePlan, bounds: Bounds, cold_start: float,
                 interval: float = DECISION_INTERVAL_S) -> None:
        self.plan = plan
        self.bounds = bounds
        self.interval = interval
        # What is ordered at t must carry every window that starts before the pods ordered
        # at the next decision could be ready.
        self.ahead = cold_start + interval
        self.info: dict[str, Any] = plan.summary()

    def _pods(self, t: float) -> dict[str, int]:
        want = self.plan.pods_at(t, self.ahead, self.bounds.min_replicas)
        return {r: clamp(n, self.bounds) for r, n in want.items()}

    def initial(self) -> dict[str, int]:
        return self._pods(0.0)

    def decide(self, view: PoolView) -> ScalingDecision:
        return ScalingDecision(self._pods(view.now), {r: "Plan" for r in DISAGGREGATED_ROLES})
