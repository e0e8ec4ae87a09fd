"""Static peak provisioning: a fixed pool sized in hindsight for the trace's busiest minute.

What most teams run before they autoscale: pick a replica count per role that carries the
peak and never change it. The sizing uses the same offline capacity profile as Dynamo's
planner (per-replica prefill tokens/s at the TTFT SLO, per-replica decode tokens/s at the ITL
SLO, both measured on the simulator), applied to the busiest minute's prompt and generated
token rates:

    prefill = ceil(peak prompt tokens/s  / prefill tokens/s per replica at that minute's ISL)
    decode  = ceil(peak output tokens/s  / decode tokens/s per replica at the ITL SLO)

Each role's busiest minute is its own (prompt-heavy and output-heavy minutes can differ). No
headroom is added: the profile already holds the SLO. It is the only policy that sees the
trace, which is its definition (provisioning for a known peak), not an advantage to remove.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from poolpilot.bench.policies.base import Bounds, PoolView, ScalingDecision, clamp
from poolpilot.bench.profile import Capacity
from poolpilot.engine_sim.traces import TraceRequest

from poolpilot.roles import DISAGGREGATED_ROLES, Role


@dataclass(frozen=True)
class MinuteLoad:
    start_s: float
    requests: int
    prompt_tokens_per_s: float
    output_tokens_per_s: float
    mean_isl: float
    mean_osl: float


def minute_loads(trace: Sequence[TraceRequest], bin_s: float = 60.0) -> list[MinuteLoad]:
    if not trace:
        return []
    n = int(trace[-1].arrival_s // bin_s) + 1
    req = [0] * n
    pt = [0] * n
    ot = [0] * n
    for r in trace:
        i = int(r.arrival_s // bin_s)
        req[i] += 1
        pt[i] += r.input_tokens
        ot[i] += r.output_tokens
    return [
        MinuteLoad(
            i * bin_s,
            req[i],
            pt[i] / bin_s,
            ot[i] / bin_s,
            pt[i] / req[i] if req[i] else 0.0,
            ot[i] / req[i] if req[i] else 0.0,
        )
        for i in range(n)
    ]


def warmup_load(trace: Sequence[TraceRequest], seconds: float = 300.0) -> MinuteLoad:
    """The mean load of the first `seconds` (what a pool already serving would be sized for)."""
    head = [r for r in trace if r.arrival_s < seconds]
    n = len(head)
    return MinuteLoad(
        0.0,
        n,
        sum(r.input_tokens for r in head) / seconds,
        sum(r.output_tokens for r in head) / seconds,
        sum(r.input_tokens for r in head) / n if n else 0.0,
        sum(r.output_tokens for r in head) / n if n else 0.0,
    )


def size_for(load: MinuteLoad, capacity: Capacity, bounds: Bounds) -> dict[str, int]:
    """Replicas per role that carry one minute's load at the SLO, by the capacity profile."""
    if load.requests == 0:
        return {Role.PREFILL: bounds.min_replicas, Role.DECODE: bounds.min_replicas}
    p_cap = capacity.prefill_tokens_per_s(load.mean_isl)
    d_cap = capacity.decode_tokens_per_s(load.mean_isl + load.mean_osl / 2)
    return {
        Role.PREFILL: clamp(math.ceil(load.prompt_tokens_per_s / p_cap), bounds),
        Role.DECODE: clamp(math.ceil(load.output_tokens_per_s / d_cap), bounds),
    }


class StaticPool:
    """A fixed pool: these replicas per role from the start, never changed."""

    interval = 3600.0  # never changes anything

    def __init__(self, sizes: dict[str, int], name: str = "static") -> None:
        self.name = name
        self.sizes = dict(sizes)
        self.info: dict[str, object] = {r: sizes[r] for r in DISAGGREGATED_ROLES}

    def initial(self) -> dict[str, int]:
        return dict(self.sizes)

    def decide(self, view: PoolView) -> ScalingDecision:
        return ScalingDecision(dict(self.sizes), {r: "Static" for r in self.sizes})


def peak_sizes(trace: Sequence[TraceRequest], capacity: Capacity,
               bounds: Bounds) -> dict[str, int]:
    """Each role sized by the profile for its own busiest minute."""
    sizes = [size_for(m, capacity, bounds) for m in minute_loads(trace)] or [
        {Role.PREFILL: bounds.min_replicas, Role.DECODE: bounds.min_replicas}
    ]
    return {r: max(s[r] for s in sizes) for r in DISAGGREGATED_ROLES}


class StaticPeak(StaticPool):
    def __init__(self, trace: Sequence[TraceRequest], capacity: Capacity, bounds: Bounds) -> None:
        super().__init__(peak_sizes(trace, capacity, bounds), "static-peak")
