"""A plain Kubernetes HPA on GPU utilization (DCGM exporter + prometheus-adapter).

The recipe GPU clusters commonly start from: NVIDIA's DCGM exporter reports
`DCGM_FI_DEV_GPU_UTIL` per GPU (percent of the sample period a kernel ran), prometheus-adapter
turns it into a Pods metric, and an autoscaling/v2 HPA per Deployment targets an average
value of it (here 80 %, `TARGET_UTIL`). GKE's guidance for LLM inference recommends queue or
batch size over GPU utilization; this policy shows why.

The algorithm is the HPA's own (`hpa_core`): `ceil(current * avg / target)` outside the 10%
tolerance, starting pods (no metric yet) counted as 0 on scale-up and as at-target on
scale-down, default behavior (scale-up +100% or +4 pods per 15 s; scale-down after a 300 s
stabilization window), a 15 s sync period. The adapter reads the last scraped value of each
ready pod's GPU (Prometheus's instant query).

Why it is in the benchmark: it is what users try first, and its signal is known to mislead
for LLM engines (a decode engine with one sequence in flight keeps the GPU "100 %" busy),
which the results show as GPU-hours, not as missed SLOs.
"""

from __future__ import annotations

from poolpilot.bench.policies.base import Bounds, PoolView, ScalingDecision
from poolpilot.bench.policies.hpa_core import SYNC_PERIOD_S, HPAController, pods_metric_replicas

from poolpilot import metrics as m
from poolpilot.roles import DISAGGREGATED_ROLES

TARGET_UTIL = 80.0


class HPAGpuUtil:
    name = "hpa"
    interval = SYNC_PERIOD_S

    def __init__(self, bounds: Bounds, initial: dict[str, int],
                 target_util: float = TARGET_UTIL) -> None:
        self.target = target_util
        self._initial = dict(initial)
        self.hpa = {r: HPAController(bounds.min_replicas, bounds.max_replicas)
                    for r in DISAGGREGATED_ROLES}

    def initial(self) -> dict[str, int]:
        return dict(self._initial)

    def decide(self, view: PoolView) -> ScalingDecision:
        out: dict[str, int] = {}
        reasons: dict[str, str] = {}
        for role in DISAGGREGATED_ROLES:
            st = view.roles[role]
            per_pod = view.prom.gauge(m.DCGM_GPU_UTIL, {"role": role}, by=("pod",))
            # Pods reporting: the ready ones (a draining pod is being deleted: ignored).
            values = [v for (pod,), v in per_pod.items() if pod in st.ready_pods]
            reporting = len(values)
            missing = max(0, st.exists - reporting)
            if reporting == 0:
                out[role], reasons[role] = st.target, "FailedGetPodsMetric"
                continue
            rec = pods_metric_replicas(sum(values), reporting, missing, st.target, self.target)
            out[role], reasons[role] = self.hpa[role].step(view.now, st.target, rec)
        return ScalingDecision(out, reasons)
