"""The Kubernetes HorizontalPodAutoscaler's algorithm (autoscaling/v2), for one scale target.

Written from the Kubernetes documentation ("Horizontal Pod Autoscaling", algorithm details and
configurable scaling behavior) and the controller (pkg/controller/podautoscaler:
replica_calculator.go, horizontal.go) as of Kubernetes 1.33:

- Per sync (controller flag `--horizontal-pod-autoscaler-sync-period`, default 15 s):
  `desired = ceil(currentReplicas * currentMetric / targetMetric)`, skipped while the ratio is
  within the tolerance (0.1, `--horizontal-pod-autoscaler-tolerance`).
- Pods metrics with an AverageValue target (`calcPlainMetricReplicas`): the average is taken
  over pods that report the metric; pods still starting report nothing ("missing"). When the
  ratio says scale up, missing pods count as 0 (so pods on the way damp the next scale-up);
  when it says scale down, they count as exactly at target. If that flips the direction or
  lands within tolerance, the replica count stays.
- External metrics with an AverageValue target (`GetExternalPerPodMetricReplicas`, what KEDA
  uses): `desired = ceil(total / targetPerPod)` unless `total / (target * statusReplicas)` is
  within tolerance.
- Default behavior: scale-up stabilization 0 s and at most max(+100%, +4 pods) per 15 s;
  scale-down stabilization 300 s (the highest recommendation of the last 5 minutes wins) and
  at most -100% per 15 s. minReplicas/maxReplicas clamp last.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

TOLERANCE = 0.1
SYNC_PERIOD_S = 15.0


@dataclass(frozen=True)
class RatePolicy:
    kind: str  # "Pods" or "Percent"
    value: int
    period_s: float


@dataclass(frozen=True)
class Behavior:
    up_window_s: float = 0.0
    up_policies: tuple[RatePolicy, ...] = (
        RatePolicy("Percent", 100, 15.0),
        RatePolicy("Pods", 4, 15.0),
    )
    down_window_s: float = 300.0
    down_policies: tuple[RatePolicy, ...] = (RatePolicy("Percent", 100, 15.0),)


def pods_metric_replicas(
    ready_values_sum: float,
    ready_pods: int,
    missing_pods: int,
    current_replicas: int,
    target_per_pod: float,
    tolerance: float = TOLERANCE,
) -> int:
    """`calcPlainMetricReplicas` for an AverageValue pods metric (summed over ready pods)."""
    if ready_pods <= 0:
        return current_replicas  # no metrics at all: the HPA errors out and keeps the size
    ratio = ready_values_sum / (ready_pods * target_per_pod)
    if missing_pods == 0:
        if abs(1.0 - ratio) <= tolerance:
            return current_replicas
        return math.ceil(ratio * ready_pods)
    fill = target_per_pod if ratio < 1.0 else 0.0
    n = ready_pods + missing_pods
    new_ratio = (ready_values_sum + fill * missing_pods) / (n * target_per_pod)
    if (
        abs(1.0 - new_ratio) <= tolerance
        or (ratio < 1.0 < new_ratio)
        or (ratio > 1.0 > new_ratio)
    ):
        return current_replicas
    new = math.ceil(new_ratio * n)
    if (new_ratio < 1.0 and new > current_replicas) or (new_ratio > 1.0 and new < current_replicas):
        return current_replicas
    return new


def external_metric_replicas(
    total: float, status_replicas: int, target_per_pod: float, tolerance: float = TOLERANCE
) -> int:
    """`GetExternalPerPodMetricReplicas`: desired from a summed external metric."""
    if status_replicas > 0 and abs(1.0 - total / (target_per_pod * status_replicas)) <= tolerance:
        return status_replicas
    return math.ceil(total / target_per_pod)


@dataclass
class HPAController:
    """Stabilization and rate limits around a per-sync metric recommendation."""

    min_replicas: int
    max_replicas: int
    behavior: Behavior = field(default_factory=Behavior)
    _recs: deque[tuple[float, int]] = field(default_factory=deque)
    _events: deque[tuple[float, int]] = field(default_factory=deque)  # (t, +added / -removed)

    def step(self, now: float, current: int, recommendation: int) -> tuple[int, str]:
        """One sync: returns (new spec.replicas, reason)."""
        b = self.behavior
        if not self._recs and b.down_window_s > 0:
            # maybeInitScaleDownStabilizationWindow: a fresh controller remembers the current
            # size, so it never scales down before its window has seen the load.
            self._recs.append((now, current))
        up_cut, down_cut = now - b.up_window_s, now - b.down_window_s
        up_rec = down_rec = recommendation
        for t, r in self._recs:
            if t > up_cut:
                up_rec = min(up_rec, r)
            if t > down_cut:
                down_rec = max(down_rec, r)
        self._recs.append((now, recommendation))
        keep = now - max(b.up_window_s, b.down_window_s, 0.0)
        while self._recs and self._recs[0][0] <= keep - 1e-9 and len(self._recs) > 1:
            self._recs.popleft()
        stabilized = current
        if stabilized < up_rec:
            stabilized = up_rec
        if stabilized > down_rec:
            stabilized = down_rec
        if stabilized == recommendation:
            reason = "MetricRecommendation"
        else:
            reason = "ScaleUpStabilized" if recommendation > stabilized else "ScaleDownStabilized"
        desired = stabilized
        if desired > current:
            limit = self._limit(now, current, b.up_policies, up=True)
            if desired > limit:
                desired, reason = limit, "ScaleUpLimit"
        elif desired < current:
            limit = self._limit(now, current, b.down_policies, up=False)
            if desired < limit:
                desired, reason = limit, "ScaleDownLimit"
        clamped = max(self.min_replicas, min(self.max_replicas, desired))
        if clamped != desired:
            reason = "TooFewReplicas" if clamped > desired else "TooManyReplicas"
        if clamped != current:
            self._events.append((now, clamped - current))
        return clamped, reason

    def _limit(self, now: float, current: int, policies: tuple[RatePolicy, ...], up: bool) -> int:
        limits = []
        for p in policies:
            changed = sum(d for t, d in self._events if t > now - p.period_s and (d > 0) == up)
            start = current - changed  # replicas at the start of the period
            if up:
                limits.append(
                    start + p.value
                    if p.kind == "Pods"
                    else math.ceil(start * (1 + p.value / 100))
                )
            else:
                limits.append(
                    start - p.value
                    if p.kind == "Pods"
                    else math.floor(start * (1 - p.value / 100))
                )
        # selectPolicy: Max (the default) picks the policy allowing the largest change.
        return max(limits) if up else min(limits)
