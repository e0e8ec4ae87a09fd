"""NVIDIA Dynamo's SLA planner (throughput-based scaling), reimplemented from its code.

Sources (ai-dynamo/dynamo, read for the algorithm, nothing copied):
components/src/dynamo/planner/core/throughput_scaling.py (`_compute_prefill_replicas`,
`_compute_decode_replicas`, `_throughput_disagg`), core/perf_model/prefill.py and decode.py
(`find_best_engine_prefill_rps`, `find_best_engine_decode_rps`), monitoring/traffic_metrics.py
(`get_avg_request_count`, `Metrics.normalize_idle_nans`, `is_valid`), core/state_machine.py
and config/defaults.py (`throughput_adjustment_interval` 180 s, `min_endpoint` 1); the
"Planner Design" and "Planner Guide" docs. This is the planner with
`optimization_target: sla` and throughput scaling on, load scaling off.

Every `interval` (180 s) it reads the frontend's traffic over the last interval: the
requests the frontend *started* (`increase(dynamo_frontend_requests_started_total)`, the
offered load), the mean input and output sequence lengths (ISL, OSL), and the mean TTFT, ITL
and request duration. An interval with no request has its undefined averages set to 0 (so
the planner scales an idle pool down to the minimum); an interval with requests but an
undefined average (no request finished) is skipped. Otherwise the load predictor forecasts
the next interval's request count, ISL and OSL (`constant`: the last value; Dynamo's
default `arima`, see `--dynamo-predictor`), and with `demand = requests / interval`:

    prefill = max(ceil(demand x prefill_time(ISL)), ceil(prefill_time(ISL) / TTFT target), 1)
    decode  = max(ceil(demand x OSL / decode tokens/s per replica at the ITL target
                       and context ISL + OSL/2), 1)

`prefill_time(ISL)` is one prompt's prefill on an idle engine (the regression's
`1 / engine_rps`); the decode capacity is the largest batch whose step time meets the ITL
target within max-num-seqs and the KV cache, divided by that step time (Little's law in
`find_best_engine_decode_rps`). Dynamo fits both on forward-pass metrics; here they come from
the capacity profile measured on the same simulator, which is exact for it. Both counts are
scaled down to fit `max_gpu_budget` (Dynamo's default is 8 GPUs; here the bench's bounds:
2 x max replicas x GPUs per engine), then set directly: no stabilization, no rate limit.

Older planners (`utils/planner_core.py`) differed in two ways that matter on bursty traces:
they counted *completed* requests (`requests_total`, incremented when a request ends), so a
saturated pool saw only what it managed to serve and sized for that, and they multiplied the
prefill demand by `min(1, observed TTFT / profiled TTFT)`, which queueing can never raise;
and they skipped every interval without a finished request, so they never scaled an idle
pool down. docs/benchmarks.md explains the rows measured with that model.

The sweep knobs (`--sweep`): `interval` (Dynamo's `throughput_adjustment_interval`) and
`margin`, a headroom on the profile (each replica sized for 1/(1 + margin) of its profiled
throughput: what a user who sees the planner under-provision does by profiling below peak).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from poolpilot.bench.policies.base import Bounds, PoolView, ScalingDecision
from poolpilot.bench.profile import Capacity
from poolpilot.bench.replay import FRONTEND_STARTED

from poolpilot import metrics as m
from poolpilot.roles import DISAGGREGATED_ROLES, Role

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
        slo_ttft: float,
        slo_itl: float,
        gpus_per_engine: int = 1,
        interval: float = ADJUSTMENT_INTERVAL_S,
        predictor: str = "constant",
        max_gpu_budget: int | None = None,
        margin: float = 0.0,
    ) -> None:
        if predictor not in PREDICTORS:
            raise ValueError(f"unknown Dynamo predictor {predictor!r}: use {', '.join(PREDICTORS)}")
        if not interval > 0:
            raise ValueError(f"dynamo-sla interval must be > 0 seconds, got {interval}")
        if margin < 0:
            raise ValueError(f"dynamo-sla margin must be >= 0, got {margin}")
        self.capacity = capacity
        self.bounds = bounds
        self._initial = dict(initial)
        self.slo_ttft = slo_ttft
        self.slo_itl = slo_itl
        self.gpus = gpus_per_engine
        self.interval = interval
        self.margin = margin
        self.max_gpu_budget = max_gpu_budget or 2 * bounds.max_replicas * gpus_per_engine
        self.num_req = PREDICTORS[predictor]()
        self.isl = PREDICTORS[predictor]()
        self.osl = PREDICTORS[predictor]()

    def initial(self) -> dict[str, int]:
        return dict(self._initial)

    def observe(self, view: PoolView) -> dict[str, float]:
        """The planner's traffic queries over the last interval.

        The frontend's started-request counter is the replay's (the router sees every
        arrival); the latency and length averages come from the engines, as the simulated
        router exports no histograms: TTFT at the prefill engines, ITL and request duration
        at the decode engines, ISL from the prompts prefilled, OSL from the tokens generated
        per finished request."""
        w, prom = self.interval, view.prom
        pre, dec = {"role": Role.PREFILL}, {"role": Role.DECODE}

        def one(d: dict[tuple[str, ...], float]) -> float:
            return next(iter(d.values()), math.nan)

        num_req = one(prom.increase(FRONTEND_STARTED, w))
        finished = one(prom.increase(m.VLLM_REQUEST_SUCCESS, w, dec))
        prompts = one(prom.increase(f"{m.VLLM_TTFT}_count", w, pre))
        isl = one(prom.increase(m.VLLM_PROMPT_TOKENS, w, pre))
        osl = one(prom.increase(m.VLLM_GENERATION_TOKENS, w, dec))
        return {
            "num_req": num_req,
            "ttft": one(prom.mean_from_histogram(m.VLLM_TTFT, w, pre)),
            "itl": one(prom.mean_from_histogram(m.VLLM_ITL, w, dec)),
            "duration": one(prom.mean_from_histogram(m.VLLM_E2E, w, dec)),
            "isl": isl / prompts if prompts and prompts > 0 else math.nan,
            "osl": osl / finished if finished and finished > 0 else math.nan,
        }

    def decide(self, view: PoolView) -> ScalingDecision:
        cur: dict[str, int] = {r: view.roles[r].target for r in DISAGGREGATED_ROLES}
        o = self.observe(view)
        if o["num_req"] == 0:  # an idle interval: undefined averages read as 0
            o = {k: 0.0 if math.isnan(v) else v for k, v in o.items()}
        if any(math.isnan(v) for v in o.values()):
            why = "MetricsNaN"  # requests, but none finished (or no data yet): skip
            return ScalingDecision(cur, {Role.PREFILL: why, Role.DECODE: why})
        self.num_req.add(o["num_req"])
        self.isl.add(o["isl"])
        self.osl.add(o["osl"])
        n, isl, osl = self.num_req.predict(), self.isl.predict(), self.osl.predict()
        p, d = self.replicas_for(n, isl, osl)
        return ScalingDecision({Role.PREFILL: p, Role.DECODE: d},
                        {Role.PREFILL: "SLAPlanner", Role.DECODE: "SLAPlanner"})

    def replicas_for(self, num_req: float, isl: float, osl: float) -> tuple[int, int]:
        """`_compute_prefill_replicas` / `_compute_decode_replicas` and the GPU budget."""
        lo, hi = self.bounds.min_replicas, self.bounds.max_replicas
        demand = num_req / self.interval
        headroom = 1.0 + self.margin
        num_p = num_d = lo
        if demand > 0 and isl > 0:
            wt = self.capacity.prefill_ttft(isl)  # one prefill on an idle engine
            floor = math.ceil(wt / self.slo_ttft) if wt > self.slo_ttft else 1
            num_p = max(math.ceil(demand * wt * headroom - 1e-9), floor, lo)
        if demand > 0 and osl > 0:
            d_cap = self.capacity.decode_tokens_per_s(isl + osl / 2, itl=self.slo_itl)
            num_d = max(math.ceil(demand * osl * headroom / d_cap - 1e-9), lo)
        total = (num_p + num_d) * self.gpus
        if total > self.max_gpu_budget:  # `_apply_global_budget`
            scale = self.max_gpu_budget / total
            max_p = (self.max_gpu_budget - lo * self.gpus) // self.gpus
            num_p = max(lo, min(max_p, math.floor(num_p * scale)))
            num_d = max(lo, (self.max_gpu_budget - num_p * self.gpus) // self.gpus)
        return min(num_p, hi), min(num_d, hi)
