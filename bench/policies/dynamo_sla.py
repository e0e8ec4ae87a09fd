"""NVIDIA Dynamo's SLA planner (throughput-based scaling), reimplemented from its docs and code.

Sources: Dynamo's "Planner Design" and "Planner Guide" docs, and the planner in
ai-dynamo/dynamo components/planner (utils/planner_core.py `_compute_replica_requirements`
and `make_adjustments`, utils/load_predictor.py, defaults.py `SLAPlannerDefaults`).

Every `adjustment_interval` (180 s) it queries Prometheus over the last interval for the
average TTFT and ITL, the request count, the mean request duration and the mean input and
output sequence lengths (ISL, OSL). If any of TTFT, ITL, ISL, OSL is missing or NaN (no
request finished in the interval) it skips the adjustment and keeps the size; this is why
Dynamo cannot scale down at zero traffic. Otherwise:

1. correction factors against the offline profile:
   `p_corr = observed_ttft / profiled_ttft(isl)` and
   `d_corr = observed_itl / profiled_itl(concurrency, isl + osl/2)` with
   `concurrency = num_req / num_decode * request_duration / interval`;
2. the load predictor forecasts the next interval's num_req, ISL and OSL from the last 50
   observations (`constant`: the last value; Dynamo's default `arima` refits auto-ARIMA and
   falls back to the last value with fewer than 5 points; see `--dynamo-predictor`);
3. prefill replicas = ceil(num_req * isl / interval * min(1, p_corr)
   / prefill_throughput_per_gpu(isl) / gpus_per_engine);
4. decode replicas = ceil(num_req * osl / interval
   / best_decode_throughput_per_gpu(itl_target / d_corr, isl + osl/2) / gpus_per_engine);
5. both at least `min_endpoint` (1), scaled down proportionally to fit `max_gpu_budget`.

The throughputs come from the profile (here measured on the simulator, as Dynamo's profiler
measures the real engine before deployment); it is per replica (an engine of
`gpus_per_engine` GPUs), so Dynamo's division by `gpus_per_engine` is already in it. The
planner sets replica counts directly: no stabilization window, no rate limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from poolpilot.bench.policies.base import Bounds, Decision, PoolView
from poolpilot.bench.profile import Capacity

from poolpilot import metrics as m

ADJUSTMENT_INTERVAL_S = 180.0
PREDICTION_WINDOW = 50


@dataclass
class ConstantPredictor:
    """Dynamo's `constant` load predictor: the next value is the last one."""

    data: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.data.append(0.0 if math.isnan(value) else value)
        del self.data[:-PREDICTION_WINDOW]

    def predict(self) -> float:
        return self.data[-1] if self.data else 0.0


@dataclass
class ArimaPredictor(ConstantPredictor):
    """Dynamo's default `arima` predictor: pmdarima.auto_arima over the window, one step
    ahead; the last value until 5 points exist. Needs the optional `pmdarima` package."""

    def predict(self) -> float:
        if len(self.data) < 5:
            return super().predict()
        import pmdarima  # optional dependency, imported only when asked for

        model = pmdarima.auto_arima(self.data, suppress_warnings=True, error_action="ignore")
        return float(model.predict(n_periods=1)[0])


PREDICTORS = {"constant": ConstantPredictor, "arima": ArimaPredictor}


class DynamoSLA:
    name = "dynamo-sla"

    def __init__(
        self,
        capacity: Capacity,
        bounds: Bounds,
        initial: dict[str, int],
        slo_itl: float,
        gpus_per_engine: int = 1,
        interval: float = ADJUSTMENT_INTERVAL_S,
        predictor: str = "constant",
        max_gpu_budget: int | None = None,
        correction: bool = True,
    ) -> None:
        if predictor not in PREDICTORS:
            raise ValueError(f"unknown Dynamo predictor {predictor!r}: use {', '.join(PREDICTORS)}")
        self.capacity = capacity
        self.bounds = bounds
        self._initial = dict(initial)
        self.slo_itl = slo_itl
        self.gpus = gpus_per_engine
        self.interval = interval
        self.correction = correction
        self.max_gpu_budget = max_gpu_budget or 2 * bounds.max_replicas * gpus_per_engine
        self.num_req = PREDICTORS[predictor]()
        self.isl = PREDICTORS[predictor]()
        self.osl = PREDICTORS[predictor]()
        self.p_corr = 1.0
        self.d_corr = 1.0

    def initial(self) -> dict[str, int]:
        return dict(self._initial)

    def observe(self, view: PoolView) -> dict[str, float]:
        """The planner's Prometheus queries over the last interval (frontend = router side)."""
        w, prom = self.interval, view.prom
        pre, dec = {"role": "prefill"}, {"role": "decode"}

        def one(d: dict[tuple[str, ...], float]) -> float:
            return next(iter(d.values()), math.nan)

        ttft = one(prom.mean_from_histogram(m.VLLM_TTFT, w, pre))
        itl = one(prom.mean_from_histogram(m.VLLM_ITL, w, dec))
        # Requests finished in the interval (decode completes them) and their mean duration.
        num_req = one(prom.increase(m.VLLM_REQUEST_SUCCESS, w, dec))
        duration = one(prom.mean_from_histogram(m.VLLM_E2E, w, dec))
        prompts = one(prom.increase(f"{m.VLLM_TTFT}_count", w, pre))
        isl = one(prom.increase(m.VLLM_PROMPT_TOKENS, w, pre))
        osl = one(prom.increase(m.VLLM_GENERATION_TOKENS, w, dec))
        isl = isl / prompts if prompts and prompts > 0 else math.nan
        osl = osl / num_req if num_req and num_req > 0 else math.nan
        return {"ttft": ttft, "itl": itl, "num_req": num_req, "duration": duration,
                "isl": isl, "osl": osl}

    def decide(self, view: PoolView) -> Decision:
        cur = {r: view.roles[r].target for r in ("prefill", "decode")}
        o = self.observe(view)
        self.num_req.add(o["num_req"])
        self.isl.add(o["isl"])
        self.osl.add(o["osl"])
        if any(math.isnan(o[k]) for k in ("ttft", "itl", "isl", "osl")):
            why = "MetricsNaN"  # Dynamo skips the adjustment when nothing finished
            return Decision(cur, {"prefill": why, "decode": why})
        if self.correction:
            self.p_corr = o["ttft"] / self.capacity.prefill_ttft(o["isl"])
            ready_d = max(1, view.roles["decode"].ready)
            conc = o["num_req"] / ready_d * o["duration"] / self.interval
            expect_itl = self.capacity.decode_itl(max(conc, 1.0), o["isl"] + o["osl"] / 2)
            self.d_corr = o["itl"] / expect_itl
        n, isl, osl = self.num_req.predict(), self.isl.predict(), self.osl.predict()
        p, d = self.replicas_for(n, isl, osl)
        return Decision({"prefill": p, "decode": d},
                        {"prefill": "SLAPlanner", "decode": "SLAPlanner"})

    def replicas_for(self, num_req: float, isl: float, osl: float) -> tuple[int, int]:
        """`_compute_replica_requirements` with the planner's own formula."""
        w = self.interval
        p_thpt = num_req * isl / w * min(1.0, self.p_corr)
        num_p = math.ceil(p_thpt / self.capacity.prefill_tokens_per_s(isl))
        itl = self.slo_itl if self.d_corr <= 0 else self.slo_itl / self.d_corr
        d_cap = self.capacity.decode_tokens_per_s(isl + osl / 2, itl=itl)
        d_thpt = num_req * osl / w
        num_d = math.ceil(d_thpt / d_cap) if d_cap > 0 else self.bounds.max_replicas
        lo = self.bounds.min_replicas
        num_p, num_d = max(num_p, lo), max(num_d, lo)
        total = (num_p + num_d) * self.gpus
        if total > self.max_gpu_budget:
            scale = self.max_gpu_budget / total
            num_p = max(lo, round(num_p * scale))
            num_d = max(lo, round((self.max_gpu_budget - num_p * self.gpus) / self.gpus))
        hi = self.bounds.max_replicas
        return min(num_p, hi), min(num_d, hi)
