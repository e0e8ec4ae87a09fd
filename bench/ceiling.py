"""Which requests can meet the SLO at all: the ceiling on any policy's attainment.

A request can miss the SLO on an idle pool: a prompt whose prefill alone (plus the KV
transfer and the first decode step) takes longer than the TTFT target, a context so long
that one decode step alone exceeds the ITL target, or a request the engine rejects (longer
than the model's context). No number of replicas helps those, so they bound every policy's
attainment from above; the oracle's target counts only the others.

TTFT on an idle pool grows with the prompt, so the longest prompt that meets the target is
found by bisection over single-request simulations (about 17, a few milliseconds each), not
by simulating every request.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from poolpilot.bench.replay import BenchConfig, new_pool_sim
from poolpilot.engine_sim.des import SimRequest
from poolpilot.engine_sim.traces import TraceRequest

from poolpilot.roles import Role


@dataclass(frozen=True)
class Ceiling:
    longest_prompt: int  # the longest prompt that meets the TTFT target on an idle pool
    max_model_len: int
    unreachable: tuple[bool, ...]  # per request of the trace

    @property
    def share(self) -> float:
        """The share of requests that can meet the SLO: no policy attains more."""
        n = len(self.unreachable)
        return 1.0 - sum(self.unreachable) / n if n else 1.0


def _alone(cfg: BenchConfig, prompt: int) -> float | None:
    """TTFT of one request with this prompt on an idle 1+1 pool; None if it fails."""
    sim = new_pool_sim(cfg)
    sim.add_replica(Role.PREFILL, 0.0)
    sim.add_replica(Role.DECODE, 0.0)
    sim.submit(SimRequest(0, 0.0, prompt, 2))
    sim.run()
    rec = sim.records()[0]
    return rec.ttft if rec.ok else None


def slo_ceiling(trace: Sequence[TraceRequest], cfg: BenchConfig) -> Ceiling:
    probe = new_pool_sim(cfg)
    probe.add_replica(Role.DECODE, 0.0)
    limit = probe.max_model_len or 1
    step = probe.step_model

    def meets(prompt: int) -> bool:
        t = _alone(cfg, prompt)
        return t is not None and t <= cfg.slo_ttft

    # the first prompt length that misses; every shorter one meets the target
    lo = bisect.bisect_left(range(1, limit + 1), True, key=lambda n: not meets(n))
    out = []
    for r in trace:
        bad = r.input_tokens > lo or r.input_tokens + r.output_tokens > limit
        if not bad and r.output_tokens >= 2:
            # the request's own p90 gap, alone: a decode step near the end of its output
            ctx = r.input_tokens + int(0.9 * r.output_tokens)
            bad = step.decode_step_time(1, ctx) > cfg.slo_itl
        out.append(bad)
    return Ceiling(lo, limit, tuple(out))
