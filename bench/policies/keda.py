"""KEDA's Prometheus scaler driving an HPA on a queue-length target (what vLLM users deploy).

Sources: KEDA docs ("Scaling Deployments": pollingInterval default 30 s, cooldownPeriod default
300 s, minReplicaCount, advanced.horizontalPodAutoscalerConfig; "Prometheus" scaler: `query`,
`threshold`, metricType default AverageValue) and the vLLM production-stack tutorial
"Autoscaling with KEDA" (ScaledObject on `vllm:num_requests_waiting`, threshold 5).

How the pieces act, and how they are replayed here:
- KEDA creates an HPA whose External metric is the scaler's query with an AverageValue target
  of `threshold` per pod. The HPA controller asks KEDA's metrics server on every sync (15 s),
  which runs the PromQL instant query then (`sum(vllm:num_requests_waiting{role="R"})` here,
  one ScaledObject per role; prefill's adds `sum(poolpilot_router_held_requests)`, the prompts
  poolpilot's router holds while every prefill engine is saturated, which a user of that
  router would count as queue too), so `desired = ceil(total / threshold)` outside the 10%
  tolerance, with the HPA's default behavior (scale-up: +100% or +4 pods per 15 s, no window;
  scale-down: 300 s stabilization).
- KEDA's own loop (every pollingInterval, 30 s) only activates and deactivates: it scales
  0 -> minReplicaCount when the query exceeds activationThreshold and back to 0 after
  cooldownPeriod (300 s) without activity. Like most LLM deployments (a cold start of minutes
  would miss every SLO) this replay keeps minReplicaCount = 1, so cooldownPeriod never fires;
  `min_replicas=0` turns scale-to-zero on, with activation checked at pollingInterval.
"""

from __future__ import annotations

import math

from poolpilot.bench.policies.base import Bounds, PoolView, ScalingDecision
from poolpilot.bench.policies.hpa_core import SYNC_PERIOD_S, HPAController, external_metric_replicas

from poolpilot import metrics as m
from poolpilot.roles import DISAGGREGATED_ROLES, Role

POLLING_INTERVAL_S = 30.0
COOLDOWN_PERIOD_S = 300.0
QUEUE_THRESHOLD = 5.0


class KedaQueue:
    name = "keda-queue"
    interval = SYNC_PERIOD_S

    def __init__(
        self,
        bounds: Bounds,
        initial: dict[str, int],
        threshold: float = QUEUE_THRESHOLD,
        polling_interval: float = POLLING_INTERVAL_S,
        cooldown_period: float = COOLDOWN_PERIOD_S,
    ) -> None:
        self.bounds = bounds
        self.threshold = threshold
        self.polling_interval = polling_interval
        self.cooldown_period = cooldown_period
        self._initial = dict(initial)
        # KEDA sets the HPA's minReplicas to max(minReplicaCount, 1).
        self.hpa = {
            r: HPAController(max(1, bounds.min_replicas), bounds.max_replicas)
            for r in DISAGGREGATED_ROLES
        }
        self._last_active: dict[str, float] = {r: 0.0 for r in DISAGGREGATED_ROLES}
        self._last_poll = -math.inf

    def initial(self) -> dict[str, int]:
        return dict(self._initial)

    def decide(self, view: PoolView) -> ScalingDecision:
        out: dict[str, int] = {}
        reasons: dict[str, str] = {}
        poll = view.now - self._last_poll >= self.polling_interval - 1e-9
        if poll:
            self._last_poll = view.now
        for role in DISAGGREGATED_ROLES:
            st = view.roles[role]
            q = view.prom.gauge(m.VLLM_WAITING, {"role": role}).get((), math.nan)
            if role == Role.PREFILL and not math.isnan(q):  # and the router's held prompts
                q += view.prom.gauge(m.ROUTER_HELD).get((), 0.0)
            if poll and not math.isnan(q) and q > 0:
                self._last_active[role] = view.now
            if st.target == 0:
                # Scaled to zero: only KEDA's polling loop can activate (engines export nothing,
                # so the query sees requests only through whatever still reports them).
                active = poll and not math.isnan(q) and q > 0
                out[role] = max(1, self.bounds.min_replicas) if active else 0
                reasons[role] = "KEDAActivated" if active else "KEDAInactive"
                continue
            if (
                self.bounds.min_replicas == 0
                and poll
                and view.now - self._last_active[role] >= self.cooldown_period
            ):
                out[role], reasons[role] = 0, "KEDACooldownToZero"
                continue
            if math.isnan(q):
                # An empty query result reads as 0 (the scaler's ignoreNullValues defaults to
                # true), which is how KEDA scales pools down when Prometheus loses them.
                q = 0.0
            rec = external_metric_replicas(q, st.exists, self.threshold)
            out[role], reasons[role] = self.hpa[role].step(view.now, st.target, rec)
        return ScalingDecision(out, reasons)
