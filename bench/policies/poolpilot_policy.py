"""poolpilot's own autoscaler: the real decision core, `poolpilot.autoscaler.decide.decide`.

Nothing here decides anything: it builds the `Observation` the autoscaler's Prometheus adapter
would build (the same signals, from the same scraped series, by the same PromQL shapes) and a
`Policy` from an InferencePool spec with the API's defaults (`Policy.from_spec`), then applies
whatever `decide()` returns. The `History` it gets back is passed to the next call, as the
autoscaler loop does. Cadence: the spec's `autoscaling.intervalSeconds`.
"""

from __future__ import annotations

import math
from typing import Any

from poolpilot.autoscaler.decide import (
    History,
    Observation,
    RoleObservation,
    decide,
)
from poolpilot.autoscaler.decide import Policy as ScalerPolicy
from poolpilot.bench.policies.base import ROLES, Bounds, Decision, PoolView

from poolpilot import metrics as m
from poolpilot.validate import parse_spec

RATE_WINDOW_S = 60.0  # rate() and histogram_quantile() window of the autoscaler's queries


def pool_spec(
    bounds: Bounds, slo_ttft: float, slo_itl: float, quantile: float, overrides: dict[str, Any]
) -> dict[str, Any]:
    """An InferencePool spec as a user would write it for this benchmark."""
    role = {"replicas": 1, "minReplicas": bounds.min_replicas, "maxReplicas": bounds.max_replicas}
    return {
        "model": {"name": "bench-model"},
        "runtime": {"image": "vllm/vllm-openai:latest"},
        "mode": "Disaggregated",
        "prefill": dict(role),
        "decode": dict(role),
        "slo": {
            "ttft": {"quantile": quantile, "seconds": slo_ttft},
            "itl": {"quantile": quantile, "seconds": slo_itl},
        },
        "autoscaling": {"enabled": True, **overrides},
    }


class PoolpilotPolicy:
    name = "poolpilot"

    def __init__(
        self,
        bounds: Bounds,
        initial: dict[str, int],
        slo_ttft: float,
        slo_itl: float,
        quantile: float = 0.9,
        autoscaling: dict[str, Any] | None = None,
        rate_window: float = RATE_WINDOW_S,
    ) -> None:
        spec = parse_spec(pool_spec(bounds, slo_ttft, slo_itl, quantile, autoscaling or {}))
        self.policy = ScalerPolicy.from_spec(spec)
        self.quantile = quantile
        self.interval = float(spec.autoscaling.interval_seconds)
        self.rate_window = rate_window
        # The autoscaler process starts with the pool: no scale-down before its window fills.
        self.history = History.fresh(0.0)
        self._initial = dict(initial)
        self.last_signals: dict[str, str] = {}

    def initial(self) -> dict[str, int]:
        return dict(self._initial)

    def observe(self, view: PoolView) -> Observation:
        prom, w, q = view.prom, self.rate_window, self.quantile
        roles: dict[str, RoleObservation] = {}
        for role in ROLES:
            sel = {"role": role}
            st = view.roles[role]

            def one(d: dict[tuple[str, ...], float]) -> float | None:
                v = next(iter(d.values()), None)
                return None if v is None or math.isnan(v) else v

            roles[role] = RoleObservation(
                replicas=st.target,
                ready=st.ready,
                starting=st.starting,
                waiting=one(prom.gauge(m.VLLM_WAITING, sel)),
                running=one(prom.gauge(m.VLLM_RUNNING, sel)),
                kv_usage=one(prom.gauge(m.VLLM_KV_USAGE, sel, agg="avg")),
                ttft=one(prom.histogram_quantile(q, m.VLLM_TTFT, w, sel)),
                itl=one(prom.histogram_quantile(q, m.VLLM_ITL, w, sel)),
                prompt_tokens_rate=one(prom.rate(m.VLLM_PROMPT_TOKENS, w, sel)),
                generation_tokens_rate=one(prom.rate(m.VLLM_GENERATION_TOKENS, w, sel)),
                sample_age=view.now - prom.now if prom.scrapes else None,
            )
        router_ttft = next(iter(prom.histogram_quantile(q, m.ROUTER_TTFT, w).values()), None)
        if router_ttft is not None and math.isnan(router_ttft):
            router_ttft = None
        return Observation(roles=roles, router_ttft=router_ttft)

    def decide(self, view: PoolView) -> Decision:
        d = decide(self.observe(view), self.policy, self.history, view.now)
        self.history = d.history
        return Decision(
            {r: d.roles[r].replicas for r in ROLES},
            {r: d.roles[r].reason for r in ROLES},
        )
