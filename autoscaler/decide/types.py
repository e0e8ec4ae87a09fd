"""The decision core's vocabulary: what goes in (observation, policy, history), what comes
out (the decision, its steps and signals), and the proposal the steps pass along."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from poolpilot.autoscaler import capacity as model
from poolpilot.autoscaler.decide.burst import Clumps
from poolpilot.autoscaler.frozen import replace

from poolpilot.reasons import Reason, StepName
from poolpilot.reasons import SignalName as S

if TYPE_CHECKING:  # only for type hints; the core does not depend on the API at runtime
    from poolpilot.api import InferencePoolSpec

UP, DOWN, NONE = "up", "down", "none"
_EPS = 1e-9
# How much a new saturated throughput sample moves the learned capacity (EWMA weight).
CAPACITY_ALPHA = 0.3
# The prefix-cache hit rate the prefill model believes at most: above it, a pool's demand
# would shrink to nearly nothing on a hit rate that one cold replica or one new session
# pattern undoes.
MAX_HIT_RATE = 0.95


# ---------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class RoleObservation:
    """What one role looks like now. Build it from numbers; None means "no sample".

    Kubernetes (always known): `replicas` is the Deployment's spec.replicas (the size asked
    for), `ready` the pods passing readiness, `starting` pods that exist but are Pending
    (schedulable) or running without being ready (loading weights), `unschedulable` pods the
    scheduler could not place.

    Prometheus (summed over the role's replicas unless noted): `waiting` and `running`
    requests (vllm:num_requests_waiting/running), `kv_usage` (mean KV-cache usage, 0..1),
    `ttft` and `itl` (the SLO quantile at this role's engines, seconds; NaN when no request
    finished in the window), `prompt_tokens_rate` and `generation_tokens_rate` (tokens/s),
    `sample_age` (seconds since the newest sample of this role), `request_rate` (requests/s
    the role's engines finished; at prefill it gives the mean prompt length),
    `prefix_hit_rate` (the share of prompt tokens the role's engines found in their prefix
    cache over the rate window, 0..1; None: the engines keep no such counters).
    """

    replicas: int
    ready: int | None = None  # None: same as replicas
    starting: int = 0
    unschedulable: int = 0
    unschedulable_message: str = ""
    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    ttft: float | None = None
    itl: float | None = None
    prompt_tokens_rate: float | None = None
    generation_tokens_rate: float | None = None
    sample_age: float | None = 0.0
    request_rate: float | None = None
    prefix_hit_rate: float | None = None

    @property
    def ready_replicas(self) -> int:
        return self.replicas if self.ready is None else self.ready

    @property
    def miss(self) -> float:
        """The share of prompt tokens the role's engines compute: 1 - the prefix-cache hit
        rate, clamped to [0, 0.95] (a rate of 1 would make any demand free); 1 without a hit
        rate (no cache information is no hit, never a reason to hold)."""
        hit = self.prefix_hit_rate
        if hit is None or not 0 < hit < math.inf:  # also NaN: nothing looked up
            return 1.0
        return 1.0 - min(hit, MAX_HIT_RATE)


@dataclass(frozen=True)
class Observation:
    """One pool at one instant: its engine roles plus what the router sees.

    `router_ttft` is the user-visible TTFT quantile (at the router; in disaggregated mode it
    covers prefill, KV transfer and the first decode step) and wins over the prefill engines'
    own TTFT. `router_inflight` (requests inside the router) and `router_request_rate`
    (requests/s) wake a pool scaled to zero. `local_prefill_rate`: requests/s the router
    prefilled on decode engines because prefill was behind (prompt demand the prefill role did
    not see); `kv_transfer_failure_rate`: prefill -> decode handoffs that failed, per second.
    `prometheus_error` set means the queries failed. `router_ready`: the router's ready pods
    (Kubernetes; None: unknown or no router asked for). `path_whole_since`: since when every
    part of the request path (the router, each engine role asked for) has had a ready pod
    without a break, as the pods' Ready conditions tell (None: unknown); a restart between two
    decisions shows here when no ready count caught it.
    """

    roles: Mapping[str, RoleObservation]
    router_ttft: float | None = None
    router_inflight: float | None = None
    router_request_rate: float | None = None
    prometheus_error: str | None = None
    local_prefill_rate: float | None = None
    kv_transfer_failure_rate: float | None = None
    router_ready: int | None = None
    path_whole_since: float | None = None


@dataclass(frozen=True)
class Behavior:
    """How fast one direction may move (AutoscalingSpec.scaleUp / scaleDown)."""

    window: float  # stabilization window, seconds
    max_step: int  # most replicas per decision
    cooldown: float  # seconds after the role's last scale


@dataclass(frozen=True)
class Policy:
    """The pool's targets and limits. Build it from numbers, e.g.
    `Policy(bounds={"prefill": (1, 8), "decode": (1, 16)}, ttft_target=1.0)`, or from an
    InferencePool spec with `Policy.from_spec(spec)`.

    `bounds` maps each engine role to (minReplicas, maxReplicas). Throughputs per replica
    (`prefill_tokens_per_replica`, `decode_tokens_per_replica`) seed the capacity model (a
    profile's numbers) and are refined online; None: learned from the first saturated moment.
    `cold_start`: seconds from a scale-up to a serving replica until one has been observed;
    `backlog_drain`: seconds a queued backlog should drain in; `forecast_window`: seconds of
    demand the trend is fitted over.
    """

    bounds: Mapping[str, tuple[int, int]]
    ttft_target: float = 1.0
    itl_target: float = 0.05
    prefill_queue_per_replica: float = 2.0
    decode_sequences_per_replica: float = 64.0
    kv_cache_usage: float = 0.85
    headroom: float = 0.2
    dead_band: float = 0.1
    scale_up: Behavior = Behavior(window=0, max_step=4, cooldown=30)
    scale_down: Behavior = Behavior(window=300, max_step=2, cooldown=60)
    scale_to_zero: bool = False
    max_metric_age: float = 60.0
    prefill_tokens_per_replica: float | None = None
    decode_tokens_per_replica: float | None = None
    ratio_band: float = 0.5
    decode_headroom: float = 0.05
    cold_start: float = 120.0
    backlog_drain: float = 60.0
    forecast_window: float = 300.0
    history_window: float = 1800.0
    slo_quantile: float = 0.9
    rise_quantile: float | None = None  # of the rises seen within a cold start (None: the SLO's)
    forecast: bool = True  # False: size for the demand of now (the bench's ablation)
    # How late the pool sees and acts on a rise: the signals' rate window (the autoscaler's
    # --rate-window) plus one decision interval (spec.autoscaling.intervalSeconds).
    rate_window: float = 60.0
    interval: float = 15.0
    burst_room: bool = True  # False: no room for clumps (the bench's ablation; decide/burst.py)
    kv_failure_limit: float = 0.05

    @classmethod
    def from_spec(cls, spec: InferencePoolSpec) -> Policy:
        a, t = spec.autoscaling, spec.autoscaling.targets
        return cls(
            bounds={
                r: (spec.role(r).min_replicas, spec.role(r).max_replicas)
                for r in spec.engine_roles()
            },
            ttft_target=spec.slo.ttft.seconds,
            slo_quantile=spec.slo.ttft.quantile,
            itl_target=spec.slo.itl.seconds,
            prefill_queue_per_replica=t.prefill_queue_per_replica,
            decode_sequences_per_replica=t.decode_sequences_per_replica,
            kv_cache_usage=t.kv_cache_usage,
            headroom=t.headroom,
            dead_band=t.dead_band,
            scale_up=_behavior(a.scale_up),
            scale_down=_behavior(a.scale_down),
            scale_to_zero=a.scale_to_zero,
            max_metric_age=float(a.metrics_max_age_seconds),
            prefill_tokens_per_replica=t.prefill_tokens_per_second_per_replica,
            decode_tokens_per_replica=t.decode_tokens_per_second_per_replica,
            ratio_band=t.ratio_band,
            backlog_drain=t.backlog_drain_seconds,
            cold_start=float(a.cold_start_seconds),
            interval=float(a.interval_seconds),
        )

    def min_replicas(self, role: str) -> int:
        return self.bounds[role][0]

    def max_replicas(self, role: str) -> int:
        return self.bounds[role][1]


def _behavior(b: object) -> Behavior:
    return Behavior(
        window=float(b.stabilization_window_seconds),  # type: ignore[attr-defined]
        max_step=int(b.max_step),  # type: ignore[attr-defined]
        cooldown=float(b.cooldown_seconds),  # type: ignore[attr-defined]
    )


@dataclass(frozen=True)
class Recommendation:
    time: float
    role: str
    replicas: int


@dataclass(frozen=True)
class History:
    """What decide() remembers between calls; it returns the next one in Decision.history.

    `started_at`: when this autoscaler's memory began (a fresh process has no window, so it
    does not scale down before `started_at + scaleDown.window`). `last_scale`: role -> time of
    its last scale (recovered from status.<role>.lastScaleTime after a restart), the
    cooldown clock: the caller stamps it once a scale has happened (`scaled`), decide() never.
    `capacity`: learned throughput per replica, role -> tokens/s. `ready_seen`: role ->
    (ready replicas, since when): a rate over a window in which that count changed is no
    measure of per-replica capacity. `resumed`: role -> when its measurements resumed after a
    gap (a hold without data: Prometheus down, missing or stale samples, no ready replica),
    None while the gap lasts: the down-window holds no recommendation from the gap and rates
    cover part of it, so no scale-down until the window has filled again (as after a restart).
    `memory`: role -> what the capacity model follows (orders on the way, the learned cold
    start, demand samples; see `capacity.Memory`). `clumps`: role -> the per-minute peaks of
    its seconds-scale demand, which size its burst room (`decide/burst.py`).
    """

    started_at: float | None = None
    recommendations: tuple[Recommendation, ...] = ()
    last_scale: Mapping[str, float] = field(default_factory=dict)
    capacity: Mapping[str, float] = field(default_factory=dict)
    ready_seen: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    resumed: Mapping[str, float | None] = field(default_factory=dict)
    memory: Mapping[str, model.Memory] = field(default_factory=dict)
    clumps: Mapping[str, Clumps] = field(default_factory=dict)

    @classmethod
    def fresh(cls, now: float, last_scale: Mapping[str, float] | None = None) -> History:
        """History of a process started at `now` (optionally with recovered scale times)."""
        return cls(started_at=now, last_scale=dict(last_scale or {}))

    @classmethod
    def warm(cls) -> History:
        """History with a filled window (nothing recorded, no restart warm-up): for tests
        and the benchmark, where the policy should act from the first call."""
        return cls(started_at=None)

    def scaled(self, roles: Iterable[str], now: float) -> History:
        """This history with the roles' cooldown clocks started at `now`. The caller stamps
        them once a scale has happened (decide() cannot know whether a write succeeds)."""
        return replace(self, last_scale={**self.last_scale, **dict.fromkeys(roles, now)})

    def window(self, role: str, since: float) -> list[int]:
        return [r.replicas for r in self.recommendations if r.role == role and r.time > since]

    def ready_change(self, role: str, ready: int, now: float) -> tuple[int, float]:
        """(ready, since): the ready count now and since when it holds. A role seen for the
        first time counts as settled (no change observed)."""
        seen = self.ready_seen.get(role)
        if seen is None:
            return ready, -math.inf
        return seen if seen[0] == ready else (ready, now)


# ---------------------------------------------------------------------------------------------
# Outputs


class Sized(NamedTuple):
    """What one step makes of a role's size: (replicas, reason), plus a detail for messages."""

    replicas: int
    reason: Reason
    detail: str = ""


@dataclass(frozen=True)
class Step:
    """One step of a role's decision: its name, the size after it, and why."""

    name: StepName
    replicas: int
    reason: Reason
    detail: str = ""


@dataclass(frozen=True)
class Signal:
    """A signal's value next to its target (for logs, status and the autoscaler's metrics)."""

    name: S
    value: float
    target: float
    proposal: int | None  # None: the signal abstained
    in_band: bool = False  # within the dead band of its target
    model: bool = False  # the capacity model's demand (it sizes in its own steps)


@dataclass(frozen=True)
class RoleDecision:
    role: str
    current: int
    replicas: int
    reason: Reason
    message: str
    steps: tuple[Step, ...] = ()
    signals: tuple[Signal, ...] = ()
    metrics_ok: bool = True
    limited: Reason | None = None  # ScalingLimited reason, if any
    limited_message: str = ""

    @property
    def direction(self) -> str:
        if self.replicas > self.current:
            return UP
        return DOWN if self.replicas < self.current else NONE


@dataclass(frozen=True)
class ConditionDecision:
    status: bool
    reason: Reason
    message: str


@dataclass(frozen=True)
class Decision:
    """The pool's decision: per role, the two autoscaler conditions and the next history."""

    roles: Mapping[str, RoleDecision]
    metrics_available: ConditionDecision
    scaling_limited: ConditionDecision
    history: History

    @property
    def replicas(self) -> dict[str, int]:
        return {r: d.replicas for r, d in self.roles.items()}


# ---------------------------------------------------------------------------------------------
# The decision


@dataclass
class Proposal:
    """A role's size before the cross-role and time-based steps: either a hold from
    `check_data` (`hold` set), or the signals' proposal and the capacity model's need."""

    current: int
    hold: Step | None = None
    metrics_ok: bool = True
    wake: bool = False
    signals: list[Signal] = field(default_factory=list)
    replicas: int | None = None  # max of the signals' proposals (None: all abstained)
    reason: Reason = Reason.AT_RECOMMENDED_SIZE
    need: model.Need | None = None  # the capacity model, when the role's capacity is known
    dead_band: float = 0.0
    room: float = 0.0  # replicas the burst room keeps (decide/burst.py), a floor under `need`


def _bad(v: float | None) -> bool:
    """No usable value: missing, NaN, infinite, or negative (every signal is a count, a rate,
    a fraction or a duration; a negative one is a broken exporter, not a load)."""
    # (one chained comparison, which NaN, infinities and negatives fail: no function calls
    # for a check made ~30 times per pool and cycle)
    return v is None or not 0 <= v < math.inf


def _ceil(x: float) -> int:
    return max(0, math.ceil(x - _EPS))


def _num(v: float | None) -> float:
    return 0.0 if _bad(v) else float(v or 0.0)
