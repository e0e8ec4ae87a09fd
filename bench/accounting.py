"""What a policy cost and what users got: SLO attainment, latency percentiles, GPU-hours, goodput.

Definitions (the same for every policy, from the replay's exact records, not from Prometheus):
- A request meets its SLO when it finished, its TTFT <= the TTFT target and its ITL statistic
  (the p90 of its own inter-token gaps) <= the ITL target (DistServe's "both met").
  Requests that never finished count as misses; every submitted request is in the denominator.
- TTFT percentiles are over all submitted requests, a request with no first token counting as
  +inf (so a policy cannot look better by starving requests); nearest-rank percentiles.
- ITL p90 is the p90, over requests with at least two tokens, of each request's own p90
  inter-token gap (the statistic the SLO checks).
- GPU-hours: each replica counts from the moment it is requested (cold start included) until
  it has left (drained), times its GPUs: a multi-node replica (a LeaderWorkerSet group of
  `nodes` pods) holds nodes x gpus-per-pod.
- Goodput per GPU (DistServe, OSDI 2024): goodput is the highest request rate served while at
  least `attainment_goal` (90%) of requests meet the SLO; per GPU it is divided by the
  time-averaged number of GPUs. A replay measures one rate, so a run at or above the goal has
  goodput = the replayed rate and a run below it has goodput 0 by definition (not "served
  nothing"): it is a pass/fail number. `met_per_gpu_hour` (requests that met the SLO per
  GPU-hour) is the continuous cost-efficiency the tables show instead.
- Scale events: decisions that changed a role's target; direction changes: consecutive scale
  events of a role in opposite directions (flapping).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from poolpilot.leaderworkerset import gpus_per_replica
from poolpilot.roles import DISAGGREGATED_ROLES

ATTAINMENT_GOAL = 0.9


@dataclass(frozen=True)
class ReplayedRequest:
    """One submitted request as the user saw it."""

    id: int
    arrival: float
    first_token_at: float | None  # None: never got a token
    finished_at: float | None  # None: never finished (failed or still running at the end)
    output_tokens: int
    itl_p90: float | None  # p90 of its own inter-token gaps; None with fewer than 2 tokens

    @property
    def ttft(self) -> float:
        return math.inf if self.first_token_at is None else self.first_token_at - self.arrival

    def meets(self, slo_ttft: float, slo_itl: float) -> bool:
        if self.finished_at is None or self.ttft > slo_ttft:
            return False
        return self.itl_p90 is None or self.itl_p90 <= slo_itl


@dataclass
class Span:
    """One replica's life: requested (billing starts), ready, gone (billing ends)."""

    role: str
    requested_at: float
    ready_at: float
    gpus: int  # per pod
    removal_requested_at: float | None = None
    gone_at: float | None = None
    nodes: int = 1  # pods in the replica (nodesPerReplica), each with `gpus`

    @property
    def replica_gpus(self) -> int:
        return gpus_per_replica(self.gpus, self.nodes)


@dataclass
class ScaleEvent:
    t: float
    role: str
    old: int
    new: int
    reason: str = ""


@dataclass
class Ledger:
    """Pods per role over time: billing spans and the scale events that caused them."""

    spans: list[Span] = field(default_factory=list)
    events: list[ScaleEvent] = field(default_factory=list)

    def request(self, role: str, t: float, ready_at: float, gpus: int, nodes: int = 1) -> Span:
        """A replica asked for at `t`: `gpus` per pod, `nodes` pods (a multi-node group)."""
        span = Span(role, t, ready_at, gpus, nodes=nodes)
        self.spans.append(span)
        return span

    def live(self, role: str) -> list[Span]:
        return [s for s in self.spans if s.role == role and s.gone_at is None]

    def mark_removal(self, span: Span, t: float) -> None:
        span.removal_requested_at = t

    def close(self, span: Span, t: float) -> None:
        span.gone_at = t

    def gpu_hours(self, end: float, role: str | None = None) -> float:
        """GPU-hours billed over [0, end]; `role`: that role's pods only."""
        total = 0.0
        for s in self.spans:
            if role is not None and s.role != role:
                continue
            stop = end if s.gone_at is None else min(s.gone_at, end)
            total += max(0.0, stop - s.requested_at) * s.replica_gpus
        return total / 3600.0

    def replicas_at(self, role: str, t: float) -> int:
        """Pods billed at time t (requested and not yet gone)."""
        return sum(
            1
            for s in self.spans
            if s.role == role and s.requested_at <= t and (s.gone_at is None or s.gone_at > t)
        )


def direction_changes(events: Sequence[ScaleEvent], role: str) -> int:
    signs = [1 if e.new > e.old else -1 for e in events if e.role == role and e.new != e.old]
    return sum(1 for a, b in itertools.pairwise(signs) if a != b)


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values; handles +inf."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return math.nan
    return float(np.percentile(arr, q, method="inverted_cdf"))


@dataclass(frozen=True)
class Summary:
    requests: int
    finished: int
    slo_attainment: float
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    itl_p90: float
    gpu_hours: float
    avg_gpus: float
    goodput_per_gpu: float
    slo_met: int
    met_per_gpu_hour: float
    scale_events: int
    direction_changes: int
    duration_s: float

    def as_json(self) -> dict[str, float | int | None]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) or math.isinf(x) else round(x, 6)

        return {
            "requests": self.requests,
            "finished": self.finished,
            "slo_attainment": num(self.slo_attainment),
            "ttft_p50": num(self.ttft_p50),
            "ttft_p90": num(self.ttft_p90),
            "ttft_p99": num(self.ttft_p99),
            "itl_p90": num(self.itl_p90),
            "gpu_hours": num(self.gpu_hours),
            "avg_gpus": num(self.avg_gpus),
            "goodput_per_gpu": num(self.goodput_per_gpu),
            "slo_met": self.slo_met,
            "met_per_gpu_hour": num(self.met_per_gpu_hour),
            "scale_events": self.scale_events,
            "direction_changes": self.direction_changes,
            "duration_s": num(self.duration_s),
        }


def summarize(
    outcomes: Sequence[ReplayedRequest],
    ledger: Ledger,
    duration_s: float,
    slo_ttft: float,
    slo_itl: float,
    roles: Sequence[str] = DISAGGREGATED_ROLES,
    attainment_goal: float = ATTAINMENT_GOAL,
) -> Summary:
    n = len(outcomes)
    met = sum(1 for o in outcomes if o.meets(slo_ttft, slo_itl))
    attainment = met / n if n else math.nan
    ttfts = [o.ttft for o in outcomes]
    gpu_hours = ledger.gpu_hours(duration_s)
    avg_gpus = gpu_hours * 3600.0 / duration_s if duration_s > 0 else math.nan
    if n and duration_s > 0 and avg_gpus > 0 and attainment >= attainment_goal:
        goodput = (n / duration_s) / avg_gpus
    else:
        goodput = 0.0
    return Summary(
        requests=n,
        finished=sum(1 for o in outcomes if o.finished_at is not None),
        slo_attainment=attainment,
        ttft_p50=percentile(ttfts, 50),
        ttft_p90=percentile(ttfts, 90),
        ttft_p99=percentile(ttfts, 99),
        itl_p90=percentile([o.itl_p90 for o in outcomes if o.itl_p90 is not None], 90),
        gpu_hours=gpu_hours,
        avg_gpus=avg_gpus,
        goodput_per_gpu=goodput,
        slo_met=met,
        met_per_gpu_hour=met / gpu_hours if gpu_hours > 0 else math.nan,
        scale_events=sum(1 for e in ledger.events if e.new != e.old),
        direction_changes=sum(direction_changes(ledger.events, r) for r in roles),
        duration_s=duration_s,
    )
