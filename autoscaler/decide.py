"""The autoscaler's pure decision core: `decide(observation, policy, history, now)`.

No I/O and no clock (enforced by import-linter): everything the decision needs comes in as
plain numbers, so the loop, the tests and the benchmark call the same function.

One decision covers a whole pool (all its engine roles at once), because the prefill:decode
ratio rule couples the roles. Per role it runs named steps, in order, as the Kubernetes HPA's
`horizontal.go` does; each step is a function that takes the size so far and returns
`Sized(replicas, reason, detail)`, the same object when it does not act. Every reason is a
`poolpilot.reasons.Reason` (status, Events, metrics and dashboards use the same enum):

- `check_data`: scaled to zero (hold, or `WakeUp` when requests wait at the router), no
  ready replica in this role, or in the router or another role on the request path (then the
  load here measures the outage, not the demand: `NoReadyReplicas`), a missing, NaN,
  infinite or negative sample
  (`MetricsUnavailable`) or an old one (`MetricsStale`) -> hold the current size; never
  treat no data as zero load;
- `propose_from_signals`: one proposal per signal (latency signals only ever propose
  scale-ups: a latency below its target does not say how many replicas fewer would still
  meet it); a signal within the dead band of its target proposes the current size; with zero
  traffic every load signal proposes 0 (`NoTraffic`); the router's TTFT goes to prefill, or to
  decode when the prefill engines meet the target themselves while requests wait at decode
  (`ttft_owner`); the maximum wins;
- `apply_ratio_floor`: the prefill:decode ratio (`RatioFloor`, see `ratio_floors`);
- `clamp_to_bounds`: the recommendation brought within [minReplicas, maxReplicas]
  (`ClampedToMin`, `ClampedToMax`) before it is remembered;
- `stabilize` (HPA): scale up to the minimum of the up-window's recommendations, down to the
  maximum of the down-window's; after a restart, or once a role's measurements resume after
  a gap (a hold without data), no scale-down until the down-window has filled
  (`StabilizationWindowFilling`);
- `limit_rate`: at most maxStep per direction (`ScaleUpRateLimited`, `ScaleDownRateLimited`);
- `cool_down`: per direction since the role's last scale (`ScaleUpCooldown`,
  `ScaleDownCooldown`);
- `hold_for_pending`: replicas still starting (Pending or loading weights) are capacity on
  the way, so no scale-up stacks on top of them (`WaitingForStartingReplicas`); unschedulable
  pods stop scale-ups (`Unschedulable`);
- `clamp_to_bounds` again, and `scaling_limit` (ScalingLimited: `Unschedulable`,
  `MaxReplicasReached`).

The resulting reason is the last step that changed or held the size, else the winning
proposal's reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from poolpilot.autoscaler import capacity as model
from poolpilot.autoscaler.frozen import replace

from poolpilot.reasons import Reason
from poolpilot.reasons import SignalName as S

if TYPE_CHECKING:  # only for type hints; the core does not depend on the API at runtime
    from poolpilot.api import InferencePoolSpec

PREFILL, DECODE, ENGINE = "prefill", "decode", "engine"
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
    (Kubernetes; None: unknown or no router asked for).
    """

    roles: Mapping[str, RoleObservation]
    router_ttft: float | None = None
    router_inflight: float | None = None
    router_request_rate: float | None = None
    prometheus_error: str | None = None
    local_prefill_rate: float | None = None
    kv_transfer_failure_rate: float | None = None
    router_ready: int | None = None


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
    its last scale (recovered from status.<role>.lastScaleTime after a restart).
    `capacity`: learned throughput per replica, role -> tokens/s. `ready_seen`: role ->
    (ready replicas, since when): a rate over a window in which that count changed is no
    measure of per-replica capacity. `resumed`: role -> when its measurements resumed after a
    gap (a hold without data: Prometheus down, missing or stale samples, no ready replica),
    None while the gap lasts: the down-window holds no recommendation from the gap and rates
    cover part of it, so no scale-down until the window has filled again (as after a restart).
    `memory`: role -> what the capacity model follows (orders on the way, the learned cold
    start, demand samples; see `capacity.Memory`).
    """

    started_at: float | None = None
    recommendations: tuple[Recommendation, ...] = ()
    last_scale: Mapping[str, float] = field(default_factory=dict)
    capacity: Mapping[str, float] = field(default_factory=dict)
    ready_seen: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    resumed: Mapping[str, float | None] = field(default_factory=dict)
    memory: Mapping[str, model.Memory] = field(default_factory=dict)

    @classmethod
    def fresh(cls, now: float, last_scale: Mapping[str, float] | None = None) -> History:
        """History of a process started at `now` (optionally with recovered scale times)."""
        return cls(started_at=now, last_scale=dict(last_scale or {}))

    @classmethod
    def warm(cls) -> History:
        """History with a filled window (nothing recorded, no restart warm-up): for tests
        and the benchmark, where the policy should act from the first call."""
        return cls(started_at=None)

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

    name: str
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


def decide(observation: Observation, policy: Policy, history: History, now: float) -> Decision:
    """Decide the size of every engine role of one pool. Pure: same inputs, same output."""
    roles = [r for r in policy.bounds if r in observation.roles]
    capacity = dict(history.capacity)
    for role, seed in ((PREFILL, policy.prefill_tokens_per_replica),
                       (DECODE, policy.decode_tokens_per_replica)):
        if seed and role not in capacity:
            capacity[role] = seed  # a profile's number: where the learning starts
    seen = {r: history.ready_change(r, observation.roles[r].ready_replicas, now) for r in roles}
    memory = dict(history.memory)
    proposals: dict[str, Proposal] = {}
    for role in roles:
        o = observation.roles[role]
        memory[role] = model.track_starts(memory.get(role, model.Memory()), o.replicas,
                                          o.ready_replicas, now)
        held = check_data(role, observation, policy)
        if held is not None:
            proposals[role] = held
            continue
        memory[role] = learn_capacity(role, observation, policy, capacity, memory[role], now,
                                      settled=now - seen[role][1] >= settle_seconds(policy))
        need, memory[role] = measure_need(role, observation, policy, capacity, memory[role], now,
                                          settled=now - seen[role][1] >= settle_seconds(policy))
        proposals[role] = propose_from_signals(role, observation, policy, capacity, need)
    presized = {r: presize(proposals[r]) for r in roles}
    floors = ratio_floors(observation, policy, capacity,
                          {r: (proposals[r], presized[r][0]) for r in roles})
    history = replace(history, resumed=track_gaps(history, proposals, policy, now))

    recs = list(history.recommendations)
    last_scale = dict(history.last_scale)
    decisions: dict[str, RoleDecision] = {}
    for role in roles:
        d, rec = size_role(role, proposals[role], presized[role], floors.get(role), observation,
                           policy, history, now)
        decisions[role] = d
        if rec is not None:
            recs.append(Recommendation(now, role, rec))
        if d.replicas != d.current:
            last_scale[role] = now

    keep = max(policy.scale_up.window, policy.scale_down.window)
    oldest = now - keep - _EPS
    pruned = tuple(r for r in recs if r.time > oldest) if keep > 0 else ()
    new_history = replace(
        history, recommendations=pruned, last_scale=last_scale, capacity=capacity,
        ready_seen={**history.ready_seen, **seen}, memory=memory,
    )
    return Decision(
        roles=decisions,
        metrics_available=metrics_condition(decisions),
        scaling_limited=limited_condition(decisions, observation, policy),
        history=new_history,
    )


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


# Signals each role must have to decide (gauges every engine exports while it runs).
_REQUIRED = {
    PREFILL: ("waiting", "running", "prompt_tokens_rate"),
    DECODE: ("waiting", "running", "kv_usage", "generation_tokens_rate"),
    ENGINE: ("waiting", "running", "kv_usage"),
}


def settle_seconds(p: Policy) -> float:
    """How long after the ready count changes the rates and queues reflect the new pool: the
    rate() window (60 s by default, the same as the metrics age limit, which the loop scales
    with the sandbox's --speed) plus half of it for the new pods' first scrapes."""
    return 1.5 * p.max_metric_age


# --- step: data --------------------------------------------------------------------------------


def check_data(role: str, obs: Observation, p: Policy) -> Proposal | None:
    """Hold the current size when there is nothing trustworthy to decide on (None: go on)."""
    o = obs.roles[role]
    prop = Proposal(current=o.replicas)

    def hold(reason: Reason, detail: str, replicas: int | None = None,
             metrics_ok: bool = True) -> Proposal:
        prop.hold = Step("data", o.replicas if replicas is None else replicas, reason, detail)
        prop.metrics_ok = metrics_ok
        return prop

    if obs.prometheus_error is not None:
        # Before the zero guard: a pool at zero during an outage cannot tell whether anyone
        # waits, and must say so (MetricsAvailable=False) rather than report all is well.
        return hold(Reason.METRICS_UNAVAILABLE,
                    f"Prometheus query failed: {obs.prometheus_error}", metrics_ok=False)
    if o.replicas == 0:
        # Engines export nothing at zero; the router tells whether anyone waits.
        router = (obs.router_inflight, obs.router_request_rate)
        if all(_bad(v) for v in router):
            return hold(Reason.METRICS_UNAVAILABLE,
                        "scaled to zero and no usable router signal (inflight "
                        f"{obs.router_inflight}, rate {obs.router_request_rate}); holding",
                        metrics_ok=False)
        if any(not _bad(v) and (v or 0) > 0 for v in router):
            prop.wake = True
            return hold(Reason.WAKE_UP,
                        f"requests at the router (inflight {obs.router_inflight}, "
                        f"rate {obs.router_request_rate}/s)",
                        replicas=max(1, p.min_replicas(role)))
        return hold(Reason.SCALED_TO_ZERO, "no requests at the router", replicas=0)
    if o.ready_replicas == 0:
        return hold(Reason.NO_READY_REPLICAS, "no ready replica to measure; holding")
    broken = broken_path(obs)
    if broken:
        # Requests fail on their way here: this role's load measures the outage, not the demand.
        return hold(Reason.NO_READY_REPLICAS, f"{broken} has no ready replica, so requests fail "
                    "before they reach this role; holding")
    missing = [name for name in _REQUIRED[role] if _bad(getattr(o, name))]
    if missing:
        values = ", ".join(f"{n}={getattr(o, n)}" for n in missing)
        return hold(Reason.METRICS_UNAVAILABLE,
                    f"no usable value (missing, NaN, infinite or negative): {values}; holding "
                    "the current size", metrics_ok=False)
    if _bad(o.sample_age) or (o.sample_age or 0) > p.max_metric_age:
        return hold(Reason.METRICS_STALE,
                    f"newest sample is {o.sample_age}s old (max {p.max_metric_age:g}s)",
                    metrics_ok=False)
    return None


def broken_path(obs: Observation) -> str | None:
    """The part of the request path (the router, an engine role) with no ready replica while
    some are asked for, if any."""
    if obs.router_ready == 0:
        return "the router"
    return next((r for r, o in obs.roles.items() if o.replicas > 0 and o.ready_replicas == 0),
                None)


# --- the capacity model's inputs ---------------------------------------------------------------


def measure_need(role: str, obs: Observation, p: Policy, capacity: Mapping[str, float],
                 mem: model.Memory, now: float,
                 settled: bool = True) -> tuple[model.Need | None, model.Memory]:
    """The role's demand, backlog and trend, and what the capacity model makes of them (None
    while the role's per-replica capacity or, for prefill, its prompt length is unknown)."""
    o = obs.roles[role]
    per_replica = capacity.get(role)
    local = 0.0
    if role == PREFILL:
        served = _num(o.prompt_tokens_rate)
        requests = _num(o.request_rate)
        tokens = served / requests if served > 0 and requests > 0 else mem.tokens_per_request
        mem = replace(mem, tokens_per_request=tokens)
        if tokens is None:
            return None, mem
        # Prefill is sized in the prompt tokens it computes: those its prefix cache does not
        # serve (the learned capacity is measured in the same unit, see learn_capacity). The
        # prompts prefilled on decode engines would have come here: prefill's hit rate.
        miss = o.miss
        served *= miss
        backlog = (_num(o.waiting) + _num(o.running)) * tokens * miss
        local = _num(obs.local_prefill_rate) * tokens * miss
        served += local
    elif role == DECODE:
        served, backlog = _num(o.generation_tokens_rate), 0.0
    else:
        return None, mem
    # (the samples, and so the trend and the rises, are in computed tokens too: a pool whose
    # hit rate falls as it grows sees that as a rise)
    rate = served + model.backlog_growth(mem.samples, now, backlog)
    mem = model.remember(mem, now, rate, backlog, max(p.forecast_window, p.history_window))
    if not per_replica:
        return None, mem
    headroom = role_headroom(role, p, mem)
    if role == PREFILL and settled and o.starting == 0:
        ttft = obs.router_ttft if not _bad(obs.router_ttft) else o.ttft
        if not _bad(ttft):
            assert ttft is not None
            headroom = model.learn_headroom(
                headroom, rate / (per_replica * o.ready_replicas), ttft, p.ttft_target,
                # queued: the backlog alone took a share of the target to prefill at some
                # sample within the rate window (the queue of a burst is gone by the next
                # scrape more often than not; its TTFT stays in the window's quantile)
                p.dead_band, queued=max_backlog(mem, now, p.max_metric_age)
                / (per_replica * o.ready_replicas) > QUEUED_SHARE * p.ttft_target)
            mem = replace(mem, headroom=headroom)
    horizon = mem.cold_start if mem.cold_start is not None else p.cold_start
    usable = model.trend_samples(mem, p.max_metric_age)
    recent = model.after(usable, now - p.forecast_window)
    quantile = p.rise_quantile if p.rise_quantile is not None else p.slo_quantile
    slope = model.trend(recent, p.forecast_window) if p.forecast else 0.0
    rise = model.upside(usable, now, horizon, quantile) if p.forecast else 0.0
    need = model.need(per_replica, rate, backlog, slope, horizon, p.backlog_drain,
                      headroom, o.ready_replicas, o.starting, mem.orders, now, local, rise,
                      _unit(role, o))
    return need, mem


def _unit(role: str, o: RoleObservation) -> str:
    if role != PREFILL:
        return "generated tokens"
    if o.miss < 1:
        return f"computed prompt tokens ({1 - o.miss:.0%} from the prefix cache)"
    return "prompt tokens"


def max_backlog(mem: model.Memory, now: float, window: float) -> float:
    """The largest backlog sampled within the last `window` seconds."""
    return max((x.backlog for x in model.after(mem.samples, now - window - 1e-9)), default=0.0)


def role_headroom(role: str, p: Policy, mem: model.Memory | None = None) -> float:
    """Capacity kept free. Prefill queues: a prompt waits for those before it, so its TTFT
    grows long before the replicas are fully busy, and `headroom` keeps them below that.
    Decode batches: every running sequence advances each step, its ITL is the step time of
    the batch, and the per-replica capacity (tokens/s at the ITL target) already is the
    throughput at the SLO; only a small margin for the next minute's noise is kept."""
    if role == DECODE:
        return p.decode_headroom
    return mem.headroom if mem is not None and mem.headroom is not None else p.headroom


# A breach is the queue's (more headroom helps) when the backlog alone took this share of the
# TTFT target to prefill; else it is the prompts' own length (it breaches an idle pool too).
QUEUED_SHARE = 0.25


# --- step: signals -----------------------------------------------------------------------------

_ABOVE = {S.TTFT: Reason.TTFT_ABOVE_TARGET, S.ITL: Reason.ITL_ABOVE_TARGET,
          S.QUEUE: Reason.QUEUE_ABOVE_TARGET,
          S.PROMPT_THROUGHPUT: Reason.PROMPT_THROUGHPUT_ABOVE_TARGET,
          S.SEQUENCES: Reason.SEQUENCES_ABOVE_TARGET, S.KV_CACHE: Reason.KV_CACHE_ABOVE_TARGET}
_BELOW = {S.QUEUE: Reason.QUEUE_BELOW_TARGET,
          S.PROMPT_THROUGHPUT: Reason.PROMPT_THROUGHPUT_BELOW_TARGET,
          S.SEQUENCES: Reason.SEQUENCES_BELOW_TARGET, S.KV_CACHE: Reason.KV_CACHE_BELOW_TARGET}


def propose_from_signals(role: str, obs: Observation, p: Policy, capacity: Mapping[str, float],
                         need: model.Need | None = None) -> Proposal:
    """One proposal per threshold or latency signal, sized on the ready replicas; the largest
    wins. Where the capacity model knows the role (`need`), it sizes the load instead of the
    proxies (queue length, sequences per replica) and the TTFT, which only say that a pool is
    behind, not by how much: the model's backlog term says that."""
    o = obs.roles[role]
    prop = Proposal(current=o.replicas, need=need, dead_band=p.dead_band)
    ready = o.ready_replicas
    sig = prop.signals
    waiting, running = float(o.waiting or 0), float(o.running or 0)

    def load(name: S, value: float, target: float) -> None:
        # Load signals: utilization u = value / target (the target for the ready replicas
        # together); propose ceil(ready * u), or the current size within the dead band.
        u = value / target
        band = abs(u - 1) <= p.dead_band
        sig.append(Signal(name, value, target, o.replicas if band else _ceil(ready * u), band))

    def latency(name: S, value: float | None, target: float, sizes: bool = True) -> None:
        if _bad(value):
            return  # no request finished in the window: no opinion (not "no data")
        assert value is not None
        u = value / target
        if not sizes:
            n: int | None = None  # shown, but the capacity model sizes the role
        elif u > 1 + p.dead_band:
            n = _ceil(ready * u)
        elif u >= 1 - p.dead_band and need is None:
            n = o.replicas
        else:
            # below target: latency cannot say how many fewer would do; near it, the
            # capacity model says (a quantile interpolated in a histogram bucket sits near
            # the bucket's top for want of resolution, which is no reason to hold)
            n = None
        sig.append(Signal(name, value, target, n, abs(u - 1) <= p.dead_band or n is None))

    owner = ttft_owner(obs, p)
    # While KV handoffs keep failing, a late first token is the retries' (ScalingLimited says
    # so): more replicas of either role would fail alike.
    failing = kv_transfer_failing(obs, p) is not None
    if role in (PREFILL, ENGINE):
        if role == ENGINE or owner == PREFILL:
            ttft = obs.router_ttft if not _bad(obs.router_ttft) else o.ttft
            latency(S.TTFT, ttft, p.ttft_target, sizes=need is None and not failing)
        if need is None:
            load(S.QUEUE, waiting, p.prefill_queue_per_replica * ready)
    if role == PREFILL and need is None:
        cap = capacity.get(PREFILL)
        if cap:  # (capacity counts computed tokens: those the prefix cache did not serve)
            load(S.PROMPT_THROUGHPUT, float(o.prompt_tokens_rate or 0) * o.miss,
                 cap * (1 - p.headroom) * ready)
    if role == DECODE and owner == DECODE:
        # (decode's waiting gauge counts KV handoffs in flight: a late first token with a few
        # of those is no decode shortage; its model and KV cache say when decode is short)
        latency(S.TTFT, obs.router_ttft, p.ttft_target, sizes=need is None and not failing)
    if role in (DECODE, ENGINE):
        latency(S.ITL, o.itl, p.itl_target)
        if need is None:
            load(S.SEQUENCES, running + waiting, p.decode_sequences_per_replica * ready)
        load(S.KV_CACHE, float(o.kv_usage or 0), p.kv_cache_usage)
    if need is not None:
        demand, ahead = ((S.PROMPT_TOKENS_DEMAND, S.PROMPT_TOKENS_AHEAD) if role == PREFILL
                         else (S.GENERATION_TOKENS_DEMAND, S.GENERATION_TOKENS_AHEAD))
        target = need.per_replica * (1 - need.headroom) * o.replicas
        sig.append(Signal(demand, need.rate + need.backlog / need.drain, target,
                          None, True, model=True))
        sig.append(Signal(ahead, need.rate_ahead + need.backlog_ahead / need.drain,
                          target, None, True, model=True))

    rates = [o.prompt_tokens_rate, o.generation_tokens_rate]
    no_traffic = waiting == 0 and running == 0 and all(_bad(r) or r == 0 for r in rates)
    proposing = [s for s in sig if s.proposal is not None]
    if not proposing:
        prop.reason = Reason.NO_TRAFFIC if no_traffic else Reason.SIGNALS_ABSTAIN
        return prop
    best = max(proposing, key=lambda s: s.proposal or 0)
    prop.replicas = best.proposal
    if no_traffic and prop.replicas == 0:
        prop.reason = Reason.NO_TRAFFIC
    elif all(s.in_band for s in sig):
        prop.reason = Reason.WITHIN_DEAD_BAND
    elif best.proposal == o.replicas:
        # e.g. replicas still starting already cover what the ready ones cannot
        prop.reason = Reason.AT_RECOMMENDED_SIZE
    else:
        # Named for the signal's state (a queue above its target can still propose fewer
        # replicas than asked for when some are starting), not for the direction.
        prop.reason = (_ABOVE if best.value > best.target else _BELOW).get(
            best.name, Reason.AT_RECOMMENDED_SIZE)
    return prop


# --- steps: capacity and forecast --------------------------------------------------------------


def size_from_capacity(s: Sized, prop: Proposal) -> Sized:
    """The replicas the demand and the backlog need now: a floor under the signals' proposal,
    and the size a scale-down goes to. It never asks for more than the role has (the backlog
    that the replicas asked for drain before a new one could arrive needs none; `look_ahead`
    orders what is still missing then), and it keeps the current size while the need is
    within the dead band below it (the hysteresis of a scale-down)."""
    need = prop.need
    if need is None:
        return s
    cur = prop.current
    keep = min(_ceil(need.now), cur)
    if keep < cur and need.now >= cur * (1 - prop.dead_band) - _EPS:
        keep = cur  # within the band: not worth a direction change
    if s.replicas > keep:
        return s  # a signal asks for more
    if keep == 0 and s.reason is Reason.NO_TRAFFIC:
        return s
    if s.replicas == keep == cur and prop.replicas is not None:
        return s  # the signals hold the size the model needs
    reason = Reason.CAPACITY_IDLE if keep < cur else Reason.CAPACITY_NEEDED
    return Sized(keep, reason, need.describe())


def look_ahead(s: Sized, prop: Proposal) -> Sized:
    """Order what the role will lack one cold start from now: the forecast demand plus the
    backlog the ready and starting replicas will not have drained by then."""
    need = prop.need
    if need is None:
        return s
    n = _ceil(need.ahead)
    if n <= max(s.replicas, prop.current):
        return s
    rising = _ceil(need.ahead_of_current) < n
    reason = Reason.DEMAND_RISING if rising else Reason.DEMAND_ABOVE_CAPACITY
    detail = need.describe() if s.reason not in (Reason.CAPACITY_NEEDED, Reason.CAPACITY_IDLE) \
        else f"{need.ahead:.2f} replicas when one ordered now lands in {need.horizon:.0f}s"
    return Sized(n, reason, detail)


def presize(prop: Proposal) -> tuple[Sized, list[Step]]:
    """The role's own size, before the other role and the clock have their say: the signals,
    then the capacity model now, then one cold start ahead."""
    if prop.hold is not None:
        return Sized(prop.hold.replicas, prop.hold.reason), [prop.hold]
    trail = _Trail()
    text = _signals_text(prop.signals)
    if prop.replicas is None:  # every signal abstained: the capacity model alone sizes
        s = Sized(0 if prop.need is not None else prop.current, prop.reason, text)
    else:
        s = Sized(prop.replicas, prop.reason, text)
    trail.steps.append(Step("signals", prop.current if prop.replicas is None else s.replicas,
                            s.reason, text))
    s = trail.run("capacity", s, size_from_capacity(s, prop))
    s = trail.run("forecast", s, look_ahead(s, prop))
    return s, trail.steps


def ttft_owner(obs: Observation, p: Policy) -> str:
    """The role a TTFT breach at the router belongs to. The router's TTFT covers prefill, the
    KV transfer and the first decode step: it is prefill's, unless the prefill engines meet
    the target on their own while requests wait at decode (then decode is the bottleneck)."""
    pre, dec = obs.roles.get(PREFILL), obs.roles.get(DECODE)
    if pre is None or dec is None or _bad(obs.router_ttft) or _bad(pre.ttft):
        return PREFILL
    decode_queue = not _bad(dec.waiting) and (dec.waiting or 0) > 0
    return DECODE if (pre.ttft or 0) <= p.ttft_target and decode_queue else PREFILL


def _latency_breach(role: str, obs: Observation, p: Policy) -> bool:
    """The role's latency signal is above its target band (TTFT for prefill, ITL for decode)."""
    o = obs.roles[role]
    if role == PREFILL and ttft_owner(obs, p) == PREFILL:
        ttft = obs.router_ttft if not _bad(obs.router_ttft) else o.ttft
        return not _bad(ttft) and (ttft or 0) > p.ttft_target * (1 + p.dead_band)
    if role == DECODE:
        return not _bad(o.itl) and (o.itl or 0) > p.itl_target * (1 + p.dead_band)
    return False


def learn_capacity(role: str, obs: Observation, p: Policy, capacity: dict[str, float],
                   mem: model.Memory, now: float, settled: bool = True) -> model.Memory:
    """Learn per-replica throughput from saturated stretches: prefill with a queue above its
    target band runs at what it can do; decode with its KV cache above target, or its ITL
    above target, likewise. (A TTFT above target without a queue is no such moment: a prompt
    too long for the target misses it on an idle pool too.) A sample counts once the role has
    been saturated for a whole rate window (the rate of a burst's first seconds holds the idle
    seconds before it), and only over a window with a steady ready count (`settled`: a rate
    from when fewer replicas served, divided by the replicas now, is no per-replica rate).

    Between saturated stretches the estimate only rises: replicas that served more per
    replica than the estimate (within their latency target) can do at least that. A saturated
    sample moves the estimate by CAPACITY_ALPHA only; an estimate that only fell would size
    every later decision for a pool slower than it is. Returns the memory with the start of
    the current saturated stretch."""
    o = obs.roles[role]
    latency_breach = _latency_breach(role, obs, p)
    ready = o.ready_replicas
    busy = 1 + p.dead_band
    if role == PREFILL:
        saturated = float(o.waiting or 0) > p.prefill_queue_per_replica * ready * busy
        # Computed prompt tokens: a replica that served 3x its compute from the cache did
        # not compute 3x faster, and an estimate that said so would be divided by the hit
        # rate a second time when the demand is.
        rate = o.prompt_tokens_rate if _bad(o.prompt_tokens_rate) else (
            (o.prompt_tokens_rate or 0.0) * o.miss)
    elif role == DECODE:
        # (not the sequences-per-replica proxy: a batch larger than it is no evidence that
        # decode is at its limit, and would teach the capacity model a limit that is not)
        saturated = latency_breach or float(o.kv_usage or 0) > min(1.0, p.kv_cache_usage * busy)
        rate = o.generation_tokens_rate
    else:
        return mem
    since = (mem.busy_since if mem.busy_since is not None else now) if saturated else None
    mem = replace(mem, busy_since=since)
    if not settled or _bad(rate) or not rate:
        return mem
    sample = float(rate) / ready
    old = capacity.get(role)
    if old is not None and sample > old and not latency_breach and not saturated:
        capacity[role] = sample  # served that much: a lower bound on what it can serve
    elif since is not None and now - since >= p.max_metric_age - _EPS:
        capacity[role] = sample if old is None else old + CAPACITY_ALPHA * (sample - old)
    return mem


# --- step: ratio -------------------------------------------------------------------------------


def ratio_floors(
    obs: Observation, p: Policy, capacity: Mapping[str, float],
    props: Mapping[str, tuple[Proposal, Sized]],
) -> dict[str, int]:
    """The coordinated prefill:decode ratio rule.

    With prompt tokens arriving at P tokens/s, generated tokens at G tokens/s, and one
    replica sustaining Cp prompt tokens/s (prefill) or Cd generated tokens/s (decode), the
    pool is balanced at r* = (P / Cp) / (G / Cd) prefill replicas per decode replica. Neither
    role may fall below the other's proposal times that ratio, loosened by `ratio_band`:

        prefill >= ceil(decode_proposal * r* / (1 + band))
        decode  >= ceil(prefill_proposal / (r* * (1 + band)))

    so a decode scale-up pulls prefill along before prompts queue, and a prefill scale-up
    keeps decode from shrinking under the generation work about to arrive. The floor is only
    a floor (it never lowers a role) and is skipped while P, G, Cp or Cd is unknown or zero
    (no traffic: both roles may scale down freely).

    When the capacity model knows both roles, the same rule couples their demands instead of
    their sizes: the prompts prefill will see one cold start ahead bring G/P generated tokens
    per prompt token to decode, so

        decode  >= ceil(P_trend * (G / P) / (Cd (1 - decode headroom)))
        prefill >= ceil(G_trend * (P / G) / (Cp (1 - headroom)))

    with X_trend the role's demand one cold start ahead by its trend (a rising prompt rate
    orders decode before its generated tokens arrive; a replica count that only drains a
    backlog, or the margin a role keeps for its own rises, is no news for the other role).
    """
    if PREFILL not in props or DECODE not in props:
        return {}
    pre, dec = obs.roles[PREFILL], obs.roles[DECODE]
    cp, cd = capacity.get(PREFILL), capacity.get(DECODE)
    prompt, gen = pre.prompt_tokens_rate, dec.generation_tokens_rate
    if not cp or not cd or _bad(prompt) or _bad(gen) or not prompt or not gen:
        return {}
    assert prompt is not None and gen is not None
    prompt *= pre.miss  # computed prompt tokens, the unit of Cp and of prefill's demand
    if not prompt or not 1e-9 < gen / prompt < 1e9:  # degenerate (denormal): no ratio
        return {}
    pn, dn = props[PREFILL][0].need, props[DECODE][0].need
    if pn is not None and dn is not None:
        return {
            DECODE: _ceil(pn.trend_ahead * (gen / prompt) / (cd * (1 - dn.headroom))),
            PREFILL: _ceil(dn.trend_ahead * (prompt / gen) / (cp * (1 - pn.headroom))),
        }
    ratio = (prompt * cd) / (gen * cp) if gen * cp > 0 else math.inf  # (P/Cp) / (G/Cd)
    if not 1e-6 < ratio < 1e6:  # degenerate (tiny rates): no meaningful ratio
        return {}
    band = 1 + p.ratio_band

    def growth(ps: tuple[Proposal, Sized]) -> int | None:
        # Only a scale-up of the other role carries news (more work is coming); its size at
        # rest holds slack (minReplicas, rounding, a proxy target) that is no demand.
        pr, sized = ps
        if pr.hold is not None or sized.replicas <= pr.current:
            return None
        return sized.replicas

    out = {}
    if (d := growth(props[DECODE])) is not None:
        out[PREFILL] = _ceil(d * ratio / band)
    if (pr := growth(props[PREFILL])) is not None:
        out[DECODE] = _ceil(pr / (ratio * band))
    return out


def apply_ratio_floor(s: Sized, floor: int | None) -> Sized:
    if floor is not None and floor > s.replicas:
        return Sized(floor, Reason.RATIO_FLOOR, "prefill:decode ratio floor")
    return s


def track_gaps(history: History, proposals: Mapping[str, Proposal], p: Policy,
               now: float) -> dict[str, float | None]:
    """History.resumed after this decision: a hold opens a gap (None); the first measured
    decision after one closes it (now); a down-window later it is forgotten."""
    out = dict(history.resumed)
    for role, prop in proposals.items():
        if prop.hold is not None:
            out[role] = None
        elif role in out:
            since = out[role]
            if since is None:
                out[role] = now
            elif now - since >= p.scale_down.window:
                del out[role]
    return out


# --- steps: bounds, stabilization, rate, cooldown, pending -------------------------------------


def clamp_to_bounds(s: Sized, lo: int, hi: int) -> Sized:
    if s.replicas > hi:
        return Sized(hi, Reason.CLAMPED_TO_MAX, f"maxReplicas {hi}")
    if s.replicas < lo:
        return Sized(lo, Reason.CLAMPED_TO_MIN, f"minReplicas {lo}")
    return s


def stabilize(s: Sized, cur: int, role: str, p: Policy, history: History, now: float) -> Sized:
    """HPA stabilization: up to the min of the up-window, down to the max of the down-window;
    a freshly started autoscaler, or a role whose measurements just resumed after a gap,
    scales nothing down until its down-window has filled."""
    if s.replicas > cur:
        up = min([s.replicas, *history.window(role, now - p.scale_up.window)])
        if up < s.replicas:
            return Sized(max(up, cur), Reason.SCALE_UP_STABILIZED,
                         f"min over {p.scale_up.window:g}s window")
    elif s.replicas < cur:
        if history.started_at is not None and now - history.started_at < p.scale_down.window:
            return Sized(cur, Reason.STABILIZATION_WINDOW_FILLING,
                         f"restarted {now - history.started_at:.0f}s ago; no scale-down "
                         f"before the {p.scale_down.window:g}s window fills")
        resumed = history.resumed.get(role)
        if resumed is not None and now - resumed < p.scale_down.window:
            return Sized(cur, Reason.STABILIZATION_WINDOW_FILLING,
                         f"measurements resumed {now - resumed:.0f}s ago after a gap; no "
                         f"scale-down before the {p.scale_down.window:g}s window fills")
        down = max([s.replicas, *history.window(role, now - p.scale_down.window)])
        if down > s.replicas:
            return Sized(min(down, cur), Reason.SCALE_DOWN_STABILIZED,
                         f"max over {p.scale_down.window:g}s window")
    return s


def limit_rate(s: Sized, cur: int, p: Policy) -> Sized:
    if s.replicas > cur + p.scale_up.max_step:
        return Sized(cur + p.scale_up.max_step, Reason.SCALE_UP_RATE_LIMITED,
                     f"at most +{p.scale_up.max_step}")
    if s.replicas < cur - p.scale_down.max_step:
        return Sized(cur - p.scale_down.max_step, Reason.SCALE_DOWN_RATE_LIMITED,
                     f"at most -{p.scale_down.max_step}")
    return s


def cool_down(s: Sized, cur: int, role: str, p: Policy, history: History, now: float) -> Sized:
    last = history.last_scale.get(role)
    if last is None or s.replicas == cur:
        return s
    up = s.replicas > cur
    cool = p.scale_up.cooldown if up else p.scale_down.cooldown
    if now - last >= cool:
        return s
    return Sized(cur, Reason.SCALE_UP_COOLDOWN if up else Reason.SCALE_DOWN_COOLDOWN,
                 f"last scale {now - last:.0f}s ago (cooldown {cool:g}s)")


# Sizes that already count replicas still starting as capacity on its way.
COUNTS_STARTING = (Reason.DEMAND_ABOVE_CAPACITY, Reason.DEMAND_RISING)


def hold_for_pending(s: Sized, cur: int, role: str, o: RoleObservation,
                     counts_starting: bool = False) -> Sized:
    """No scale-up while pods of the role cannot be placed, or are still starting (unless the
    size came from the capacity model, which counts starting replicas as capacity on its way
    and orders only what they will not cover)."""
    if s.replicas <= cur:
        return s
    if o.unschedulable > 0:
        return Sized(cur, Reason.UNSCHEDULABLE, _unschedulable_text(role, o))
    if o.starting > 0 and not counts_starting:
        return Sized(cur, Reason.WAITING_FOR_STARTING_REPLICAS,
                     f"{o.starting} replica(s) still starting count as capacity")
    return s


def _unschedulable_text(role: str, o: RoleObservation) -> str:
    return (f"{o.unschedulable} {role} pod(s) cannot be scheduled"
            + (f": {o.unschedulable_message}" if o.unschedulable_message else ""))


def scaling_limit(role: str, o: RoleObservation, wanted: int, hi: int) -> tuple[Reason | None, str]:
    """ScalingLimited for this role: pods that cannot be placed, or more wanted than the max."""
    if o.unschedulable > 0:
        return Reason.UNSCHEDULABLE, _unschedulable_text(role, o)
    if wanted > hi:
        return Reason.MAX_REPLICAS_REACHED, f"{role} wants {wanted}, maxReplicas is {hi}"
    return None, ""


# --- one role, every step ----------------------------------------------------------------------


class _Trail:
    """The steps that acted, in order (a step that returns its input did not act)."""

    def __init__(self) -> None:
        self.steps: list[Step] = []

    def run(self, name: str, before: Sized, after: Sized) -> Sized:
        if after is not before:
            self.steps.append(Step(name, after.replicas, after.reason, after.detail))
        return after


def size_role(role: str, prop: Proposal, presized: tuple[Sized, list[Step]], floor: int | None,
              obs: Observation, p: Policy, history: History,
              now: float) -> tuple[RoleDecision, int | None]:
    """Run the steps after the role's own size; returns the decision and the recommendation to
    remember (None when there was nothing to recommend)."""
    o = obs.roles[role]
    cur = prop.current
    lo, hi = p.min_replicas(role), p.max_replicas(role)
    s, steps = presized
    trail = _Trail()
    trail.steps.extend(steps)

    if prop.hold is not None:
        if prop.wake:  # a wake-up goes straight to a size within the bounds
            s = Sized(min(max(s.replicas, lo), hi), s.reason)
        else:
            s = trail.run("bounds", s, clamp_to_bounds(s, lo, hi))
        return _decision(role, cur, s, trail.steps, prop, None), None

    s = trail.run("ratio", s, apply_ratio_floor(s, floor))
    wanted = s.replicas
    # Recommendations live within the bounds (a pool idling at its minimum is "clamped", not
    # "stabilized"); the final clamp below still guards every path.
    s = trail.run("bounds", s, clamp_to_bounds(s, lo, hi))
    rec = s.replicas
    s = trail.run("stabilization", s, stabilize(s, cur, role, p, history, now))
    s = trail.run("rate", s, limit_rate(s, cur, p))
    s = trail.run("cooldown", s, cool_down(s, cur, role, p, history, now))
    s = trail.run("pending", s, hold_for_pending(s, cur, role, o,
                                                 presized[0].reason in COUNTS_STARTING))
    s = trail.run("bounds", s, clamp_to_bounds(s, lo, hi))
    limited = scaling_limit(role, o, wanted, hi)
    return _decision(role, cur, s, trail.steps, prop, *limited), rec


def _signals_text(signals: Iterable[Signal]) -> str:
    return ", ".join(
        f"{s.name} {s.value:.4g} vs {s.target:.4g}"
        + (f" -> {s.proposal}" if s.proposal is not None else "" if s.model else " (abstains)")
        for s in signals
    )


def _decision(role: str, cur: int, s: Sized, steps: list[Step], prop: Proposal,
              limited: Reason | None, limited_msg: str = "") -> RoleDecision:
    chain = "; ".join(f"{st.reason}" + (f" ({st.detail})" if st.detail else "") for st in steps)
    # The decision's reason first (Events, status and the sandbox's report read it there),
    # then every step that had a say.
    msg = f"{role} {cur} -> {s.replicas}: {s.reason} | {chain}"
    if limited_msg:
        msg += f"; ScalingLimited: {limited_msg}"
    return RoleDecision(
        role=role,
        current=cur,
        replicas=s.replicas,
        reason=s.reason,
        message=msg,
        steps=tuple(steps),
        signals=tuple(prop.signals),
        metrics_ok=prop.metrics_ok,
        limited=limited,
        limited_message=limited_msg,
    )


# --- the pool's conditions ---------------------------------------------------------------------


def metrics_condition(ds: Mapping[str, RoleDecision]) -> ConditionDecision:
    bad = [d for d in ds.values() if not d.metrics_ok]
    if not bad:
        return ConditionDecision(True, Reason.METRICS_FOUND, "every role has fresh samples")
    reason = bad[0].steps[0].reason if bad[0].steps else Reason.METRICS_UNAVAILABLE
    return ConditionDecision(
        False, reason, "; ".join(f"{d.role}: {d.steps[0].detail}" for d in bad if d.steps)
    )


def limited_condition(ds: Mapping[str, RoleDecision], obs: Observation | None = None,
                      p: Policy | None = None) -> ConditionDecision:
    """ScalingLimited: a role cannot scale as it wants, or scaling cannot help (KV handoffs
    between prefill and decode keep failing: more replicas of either role would fail alike)."""
    lim = [d for d in ds.values() if d.limited]
    failing = kv_transfer_failing(obs, p) if obs is not None and p is not None else None
    if not lim and failing is None:
        return ConditionDecision(False, Reason.SCALING_ALLOWED, "no limit reached")
    if failing is not None:
        return ConditionDecision(True, Reason.KV_TRANSFER_FAILING,
                                 "; ".join([failing, *(d.limited_message for d in lim)]))
    return ConditionDecision(
        True, lim[0].limited or Reason.SCALING_ALLOWED, "; ".join(d.limited_message for d in lim)
    )


def kv_transfer_failing(obs: Observation, p: Policy) -> str | None:
    """A message when more than `kv_failure_limit` of the requests' KV handoffs fail."""
    failures = obs.kv_transfer_failure_rate
    if _bad(failures) or not failures:
        return None
    pre = obs.roles.get(PREFILL)
    requests = obs.router_request_rate
    if _bad(requests) or not requests:
        requests = pre.request_rate if pre is not None else None
    if _bad(requests) or not requests:
        return None
    assert failures is not None and requests is not None
    share = failures / requests
    if share <= p.kv_failure_limit:
        return None
    return (f"{share:.0%} of KV handoffs from prefill to decode fail ({failures:.3g}/s of "
            f"{requests:.3g} requests/s); the router prefills them again on decode engines. "
            "More replicas of either role would not help: check the KV connector (NIXL) and "
            "the network between the roles")
