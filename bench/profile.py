"""Offline capacity profile of one engine, measured on the simulator like Dynamo's profiler.

Dynamo's SLA planner does not guess capacity: before deployment its profiler runs the engine
and records, per input length, the prefill TTFT and throughput per GPU (one prompt at a time:
`throughput = isl / ttft`), and per (context length, concurrency) the decode ITL and
throughput per GPU; the planner interpolates those tables. This module builds the same tables
from the simulator the benchmark replays on: prefill by running one request per ISL point
through a `PoolSim` and reading the prefill engine's TTFT histogram, decode from the engine's
step-time model (`decode_step_time(batch, context)`, what a steady decode batch costs),
bounded by the engine's max-num-seqs and KV-cache capacity.

Static-peak provisioning and Dynamo's planner use it; poolpilot and the HPA/KEDA policies do
not (poolpilot learns throughput online).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Protocol

from poolpilot.engine_sim.des import PoolSim, SimRequest
from poolpilot.engine_sim.engine import EngineConfig

from poolpilot import metrics as m
from poolpilot.roles import Role

ISL_GRID = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class Capacity(Protocol):
    def prefill_ttft(self, isl: float) -> float: ...

    def prefill_tokens_per_s(self, isl: float) -> float: ...

    def decode_tokens_per_s(self, context: float, itl: float | None = None) -> float: ...


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1] * (x / xs[-1]) if ys[-1] and xs[-1] else ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass
class SimCapacity:
    model: str
    gpu: str
    slo_itl: float
    tensor_parallel: int = 1
    config: EngineConfig = field(default_factory=EngineConfig)
    _isl: list[float] = field(default_factory=list)
    _ttft: list[float] = field(default_factory=list)
    _decode_cache: dict[tuple[int, float], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        probe = PoolSim(self.model, self.gpu, self.tensor_parallel, prefill_replicas=1,
                        decode_replicas=1, config=self.config)
        self.step_model = probe.step_model
        self.max_model_len = probe.max_model_len or 131072
        plan = self.step_model.memory_plan(self.config.gpu_memory_utilization,
                                           self.config.block_size)
        self.kv_tokens = plan.kv_tokens
        for isl in ISL_GRID:
            if isl + 2 > self.max_model_len:
                break
            sim = PoolSim(self.model, self.gpu, self.tensor_parallel, prefill_replicas=1,
                          decode_replicas=1, config=self.config)
            sim.submit(SimRequest(0, 0.0, isl, 2))
            sim.run()
            h = sim.metrics()[Role.PREFILL].histograms[m.VLLM_TTFT]
            self._isl.append(float(isl))
            self._ttft.append(h.sum / h.count)

    # ---- prefill ----
    def prefill_ttft(self, isl: float) -> float:
        return _interp(self._isl, self._ttft, max(1.0, isl))

    def prefill_tokens_per_s(self, isl: float) -> float:
        """Prompt tokens/s of one replica (per GPU x tp), Dynamo's `isl / ttft`."""
        isl = max(1.0, isl)
        return isl / self.prefill_ttft(isl)

    # ---- decode ----
    def max_concurrency(self, context: float) -> int:
        by_kv = int(self.kv_tokens // max(1.0, context))
        return max(1, min(self.config.max_num_seqs, by_kv))

    def decode_tokens_per_s(self, context: float, itl: float | None = None) -> float:
        """Best generated tokens/s of one replica whose ITL stays within `itl` (default: SLO)."""
        target = self.slo_itl if itl is None else itl
        ctx_key = (round(context / 64.0) * 64, round(target, 6))
        if ctx_key in self._decode_cache:
            return self._decode_cache[ctx_key]
        ctx = max(1, ctx_key[0])
        lo, hi = 1, self.max_concurrency(ctx)
        if self.step_model.decode_step_time(1, ctx) > target:
            best = 1.0 / self.step_model.decode_step_time(1, ctx)
        else:
            while lo < hi:  # largest batch whose step time meets the target (monotone in c)
                mid = (lo + hi + 1) // 2
                if self.step_model.decode_step_time(mid, ctx) <= target:
                    lo = mid
                else:
                    hi = mid - 1
            best = lo / self.step_model.decode_step_time(lo, ctx)
        self._decode_cache[ctx_key] = best
        return best

    def describe(self) -> str:
        pts = ", ".join(f"{int(i)}: {i / t:,.0f} tok/s" for i, t in zip(self._isl, self._ttft,
                                                                     strict=True)
                        if i in (512, 2048, 8192))
        dec = ", ".join(f"ctx {c}: {self.decode_tokens_per_s(c):,.0f} tok/s"
                        for c in (1024, 4096))
        return f"prefill per replica {pts}; decode per replica at ITL {self.slo_itl}s {dec}"
