"""The autoscaler's pure decision core: `decide(observation, policy, history, now)`.

No I/O and no clock (enforced by import-linter): everything the decision needs comes in as
plain numbers, so the loop, the tests and the benchmark call the same function.

One decision covers a whole pool (all its engine roles at once), because the prefill:decode
ratio rule couples the roles. For each role the steps are, in order, each naming a reason:

1. guards on the data: scaled to zero (hold, or `WakeUp` when requests wait at the router),
   no ready replica (`NoReadyReplicas`), missing/NaN (`MetricsUnavailable`) or old
   (`MetricsStale`) samples -> hold the current size; never treat no data as zero load;
2. one proposal per signal (latency signals only ever propose scale-ups: a latency below its
   target does not say how many replicas fewer would still meet it); a signal within the dead
   band of its target proposes the current size; with zero traffic every load signal proposes
   0 (`NoTraffic`); the router's TTFT goes to prefill, or to decode when the prefill engines
   meet the target themselves while requests wait at decode (`ttft_owner`);
3. the ratio floor (`RatioFloor`, see `ratio_floors`); then the maximum of the proposals,
   brought within [minReplicas, maxReplicas] (`ClampedToMin`, `ClampedToMax`);
4. stabilization (HPA): scale up to the minimum of the up-window's recommendations, down to
   the maximum of the down-window's; after a restart no scale-down until the down-window has
   filled (`StabilizationWindowFilling`);
5. rate limits per direction (`ScaleUpRateLimited`, `ScaleDownRateLimited`);
6. cooldown per direction since the role's last scale (`ScaleUpCooldown`, `ScaleDownCooldown`);
7. capacity guards: replicas still starting (Pending or loading weights) are capacity on the
   way, so no scale-up stacks on top of them (`WaitingForStartingReplicas`); unschedulable
   pods stop scale-ups and set ScalingLimited (`Unschedulable`);
8. clamp to [minReplicas, maxReplicas] (`ClampedToMin`, `ClampedToMax`; at the maximum with
   more wanted, ScalingLimited=`MaxReplicasReached`).

The resulting reason is the last step that changed or held the size, else the winning
proposal's reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for type hints; the core does not depend on the API at runtime
    from poolpilot.api import InferencePoolSpec

PREFILL, DECODE, ENGINE = "prefill", "decode", "engine"
UP, DOWN, NONE = "up", "down", "none"
_EPS = 1e-9
# How much a new saturated throughput sample moves the learned capacity (EWMA weight).
CAPACITY_ALPHA = 0.3


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
    `sample_age` (seconds since the newest sample of this role).
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

    @property
    def ready_replicas(self) -> int:
        return self.replicas if self.ready is None else self.ready


@dataclass(frozen=True)
class Observation:
    """One pool at one instant: its engine roles plus what the router sees.

    `router_ttft` is the user-visible TTFT quantile (at the router; in disaggregated mode it
    covers prefill, KV transfer and the first decode step) and wins over the prefill engines'
    own TTFT. `router_inflight` (requests inside the router) and `router_request_rate`
    (requests/s) wake a pool scaled to zero. `prometheus_error` set means the queries failed.
    """

    roles: Mapping[str, RoleObservation]
    router_ttft: float | None = None
    router_itl: float | None = None
    router_inflight: float | None = None
    router_request_rate: float | None = None
    prometheus_error: str | None = None


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
    (`prefill_tokens_per_replica`, `decode_tokens_per_replica`) are measured when None.
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

    @classmethod
    def from_spec(cls, spec: InferencePoolSpec) -> Policy:
        a, t = spec.autoscaling, spec.autoscaling.targets
        return cls(
            bounds={
                r: (spec.role(r).min_replicas, spec.role(r).max_replicas)
                for r in spec.engine_roles()
            },
            ttft_target=spec.slo.ttft.seconds,
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
    measure of per-replica capacity.
    """

    started_at: float | None = None
    recommendations: tuple[Recommendation, ...] = ()
    last_scale: Mapping[str, float] = field(default_factory=dict)
    capacity: Mapping[str, float] = field(default_factory=dict)
    ready_seen: Mapping[str, tuple[int, float]] = field(default_factory=dict)

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


@dataclass(frozen=True)
class Step:
    """One step of a role's decision: its name, the size after it, and why."""

    name: str
    replicas: int
    reason: str
    detail: str = ""


@dataclass(frozen=True)
class Signal:
    """A signal's value next to its target (for logs, status and the autoscaler's metrics)."""

    name: str
    value: float
    target: float
    proposal: int | None  # None: the signal abstained
    in_band: bool = False  # within the dead band of its target


@dataclass(frozen=True)
class RoleDecision:
    role: str
    current: int
    replicas: int
    reason: str
    message: str
    steps: tuple[Step, ...] = ()
    signals: tuple[Signal, ...] = ()
    metrics_ok: bool = True
    limited: str | None = None  # ScalingLimited reason, if any
    limited_message: str = ""

    @property
    def direction(self) -> str:
        if self.replicas > self.current:
            return UP
        return DOWN if self.replicas < self.current else NONE


@dataclass(frozen=True)
class ConditionDecision:
    status: bool
    reason: str
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
    seen = {r: history.ready_change(r, observation.roles[r].ready_replicas, now) for r in roles}
    raw: dict[str, _Raw] = {}
    for role in roles:
        settled = now - seen[role][1] >= settle_seconds(policy)
        raw[role] = _propose(role, observation, policy, capacity, settled)
    floors = ratio_floors(observation, policy, capacity, raw)

    recs = list(history.recommendations)
    last_scale = dict(history.last_scale)
    decisions: dict[str, RoleDecision] = {}
    for role in roles:
        d, rec = _finish(role, raw[role], floors.get(role), observation, policy, history, now)
        decisions[role] = d
        if rec is not None:
            recs.append(Recommendation(now, role, rec))
        if d.replicas != d.current:
            last_scale[role] = now

    keep = max(policy.scale_up.window, policy.scale_down.window)
    pruned = tuple(r for r in recs if r.time > now - keep - _EPS) if keep > 0 else ()
    new_history = replace(
        history, recommendations=pruned, last_scale=last_scale, capacity=capacity,
        ready_seen={**history.ready_seen, **seen},
    )
    return Decision(
        roles=decisions,
        metrics_available=_metrics_condition(decisions, observation),
        scaling_limited=_limited_condition(decisions),
        history=new_history,
    )


@dataclass
class _Raw:
    """A role's proposals before the cross-role and time-based steps."""

    current: int
    hold: Step | None = None  # set when a guard holds the size before any proposal
    metrics_ok: bool = True
    signals: list[Signal] = field(default_factory=list)
    proposal: int | None = None  # max of the signals' proposals
    reason: str = ""
    in_band: bool = False
    no_traffic: bool = False
    wake: bool = False


def _bad(v: float | None) -> bool:
    return v is None or math.isnan(v) or math.isinf(v)


def _ceil(x: float) -> int:
    return max(0, math.ceil(x - _EPS))


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


def _propose(role: str, obs: Observation, p: Policy, capacity: dict[str, float],
             settled: bool = True) -> _Raw:
    o = obs.roles[role]
    raw = _Raw(current=o.replicas)
    ready = o.ready_replicas

    # Guard: scaled to zero. Engines export nothing, the router tells whether anyone waits.
    if o.replicas == 0:
        waiting_at_router = (not _bad(obs.router_inflight) and (obs.router_inflight or 0) > 0) or (
            not _bad(obs.router_request_rate) and (obs.router_request_rate or 0) > 0
        )
        if waiting_at_router:
            raw.wake = True
            target = max(1, p.min_replicas(role))
            raw.hold = Step("wake", target, "WakeUp",
                            f"requests at the router (inflight {obs.router_inflight}, "
                            f"rate {obs.router_request_rate}/s)")
        else:
            raw.hold = Step("zero", 0, "ScaledToZero", "no requests at the router")
        return raw

    if obs.prometheus_error is not None:
        raw.metrics_ok = False
        raw.hold = Step("metrics", o.replicas, "MetricsUnavailable",
                        f"Prometheus query failed: {obs.prometheus_error}")
        return raw
    if ready == 0:
        raw.hold = Step("ready", o.replicas, "NoReadyReplicas",
                        "no ready replica to measure; holding")
        return raw
    missing = [name for name in _REQUIRED[role] if _bad(getattr(o, name))]
    if missing:
        raw.metrics_ok = False
        raw.hold = Step("metrics", o.replicas, "MetricsUnavailable",
                        f"no value for {', '.join(missing)}; holding the current size")
        return raw
    if o.sample_age is None or _bad(o.sample_age) or o.sample_age > p.max_metric_age:
        raw.metrics_ok = False
        raw.hold = Step("metrics", o.replicas, "MetricsStale",
                        f"newest sample is {o.sample_age}s old (max {p.max_metric_age:g}s)")
        return raw

    if settled:  # a rate over a window in which the ready count changed is no capacity
        _learn_capacity(role, o, p, capacity, _latency_breach(role, obs, p))
    sig = raw.signals
    waiting, running = float(o.waiting or 0), float(o.running or 0)

    def load(name: str, value: float, target: float) -> None:
        # Load signals: utilization u = value / target (the target for the ready replicas
        # together); propose ceil(ready * u), or the current size within the dead band.
        u = value / target
        band = abs(u - 1) <= p.dead_band
        sig.append(Signal(name, value, target, o.replicas if band else _ceil(ready * u), band))

    def latency(name: str, value: float | None, target: float) -> None:
        if _bad(value):
            return  # no request finished in the window: no opinion (not "no data")
        assert value is not None
        u = value / target
        if u > 1 + p.dead_band:
            prop: int | None = _ceil(ready * u)
        elif u >= 1 - p.dead_band:
            prop = o.replicas
        else:
            prop = None  # below target: latency cannot say how many fewer would do
        sig.append(Signal(name, value, target, prop, abs(u - 1) <= p.dead_band or prop is None))

    owner = ttft_owner(obs, p)
    if role in (PREFILL, ENGINE):
        if role == ENGINE or owner == PREFILL:
            ttft = obs.router_ttft if not _bad(obs.router_ttft) else o.ttft
            latency("TTFT", ttft, p.ttft_target)
        load("Queue", waiting, p.prefill_queue_per_replica * ready)
    if role == PREFILL:
        cap = p.prefill_tokens_per_replica or capacity.get(PREFILL)
        if cap:
            load("PromptThroughput", float(o.prompt_tokens_rate or 0),
                 cap * (1 - p.headroom) * ready)
    if role == DECODE and owner == DECODE:
        latency("TTFT", obs.router_ttft, p.ttft_target)
    if role in (DECODE, ENGINE):
        latency("ITL", o.itl, p.itl_target)
        load("Sequences", running + waiting, p.decode_sequences_per_replica * ready)
        load("KVCache", float(o.kv_usage or 0), p.kv_cache_usage)

    rates = [o.prompt_tokens_rate, o.generation_tokens_rate]
    raw.no_traffic = waiting == 0 and running == 0 and all(_bad(r) or r == 0 for r in rates)
    proposals = [s for s in sig if s.proposal is not None]
    best = max(proposals, key=lambda s: s.proposal or 0)
    raw.proposal = best.proposal
    raw.in_band = all(s.in_band for s in sig)
    if raw.no_traffic and raw.proposal == 0:
        raw.reason = "NoTraffic"
    elif raw.in_band:
        raw.reason = "WithinDeadBand"
    elif best.proposal == o.replicas:
        # e.g. replicas still starting already cover what the ready ones cannot
        raw.reason = "AtRecommendedSize"
    else:
        above = (best.proposal or 0) > o.replicas
        raw.reason = f"{best.name}{'Above' if above else 'Below'}Target"
    return raw


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


def _learn_capacity(role: str, o: RoleObservation, p: Policy, capacity: dict[str, float],
                    latency_breach: bool = False) -> None:
    """Learn per-replica throughput from saturated moments: a prefill queue above its target,
    or a TTFT above it, means prefill runs at what it can do within the SLO; decode above its
    sequence or KV target, or its ITL above target, likewise (beyond the dead band, so a pool
    sitting at its targets does not count).

    Between saturated moments the estimate only rises: replicas that served more per replica
    than the estimate (within their latency target, over a window with a steady ready count)
    can do at least that. A saturated sample is a 60 s mean that may hold idle seconds around
    a burst, so it moves the estimate by CAPACITY_ALPHA only; an estimate that only fell would
    size every later decision for a pool slower than it is."""
    ready = o.ready_replicas
    waiting, running = float(o.waiting or 0), float(o.running or 0)
    busy = 1 + p.dead_band
    if role == PREFILL:
        saturated = latency_breach or waiting > p.prefill_queue_per_replica * ready * busy
        rate = o.prompt_tokens_rate
    elif role == DECODE:
        saturated = latency_breach or (
            running + waiting > p.decode_sequences_per_replica * ready * busy) or (
            float(o.kv_usage or 0) > min(1.0, p.kv_cache_usage * busy)
        )
        rate = o.generation_tokens_rate
    else:
        return
    if _bad(rate) or not rate:
        return
    sample = float(rate) / ready
    old = capacity.get(role)
    if old is not None and sample > old and not latency_breach:
        capacity[role] = sample  # served that much: a lower bound on what it can serve
    elif saturated:
        capacity[role] = sample if old is None else old + CAPACITY_ALPHA * (sample - old)


def ratio_floors(
    obs: Observation, p: Policy, capacity: Mapping[str, float], raw: Mapping[str, _Raw]
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
    """
    if PREFILL not in raw or DECODE not in raw:
        return {}
    pre, dec = obs.roles[PREFILL], obs.roles[DECODE]
    cp = p.prefill_tokens_per_replica or capacity.get(PREFILL)
    cd = p.decode_tokens_per_replica or capacity.get(DECODE)
    prompt, gen = pre.prompt_tokens_rate, dec.generation_tokens_rate
    if not cp or not cd or _bad(prompt) or _bad(gen) or not prompt or not gen:
        return {}
    assert prompt is not None and gen is not None
    ratio = (prompt * cd) / (gen * cp) if gen * cp > 0 else math.inf  # (P/Cp) / (G/Cd)
    if not 1e-6 < ratio < 1e6:  # degenerate (tiny rates): no meaningful ratio
        return {}
    band = 1 + p.ratio_band

    def growth(r: _Raw) -> int | None:
        # Only a scale-up of the other role carries news (more work is coming); its size at
        # rest holds slack (minReplicas, rounding, a proxy target) that is no demand.
        if r.hold is not None or r.proposal is None or r.proposal <= r.current:
            return None
        return r.proposal

    out = {}
    if (d := growth(raw[DECODE])) is not None:
        out[PREFILL] = _ceil(d * ratio / band)
    if (pr := growth(raw[PREFILL])) is not None:
        out[DECODE] = _ceil(pr / (ratio * band))
    return out


def _finish(
    role: str,
    raw: _Raw,
    floor: int | None,
    obs: Observation,
    p: Policy,
    history: History,
    now: float,
) -> tuple[RoleDecision, int | None]:
    """Apply the time-based steps, guards and clamp; returns the decision and the
    recommendation to remember (None when there was nothing to recommend)."""
    o = obs.roles[role]
    cur = raw.current
    lo, hi = p.min_replicas(role), p.max_replicas(role)
    steps: list[Step] = []
    limited: str | None = None
    limited_msg = ""

    if raw.hold is not None:
        steps.append(raw.hold)
        desired, reason = raw.hold.replicas, raw.hold.reason
        if raw.wake:
            desired = min(max(desired, lo), hi)
        else:
            desired, reason = _clamp(desired, lo, hi, reason, steps)
        return _decision(role, cur, desired, reason, steps, raw, None), None

    desired = raw.proposal if raw.proposal is not None else cur
    reason = raw.reason
    steps.append(Step("proposal", desired, reason, _signals_text(raw.signals)))
    if floor is not None and floor > desired:
        desired, reason = floor, "RatioFloor"
        steps.append(Step("ratio", desired, reason, "prefill:decode ratio floor"))
    # Recommendations live within the bounds (a pool idling at its minimum is "clamped", not
    # "stabilized"); the final clamp below still guards every path.
    wanted = desired
    if not lo <= desired <= hi:
        desired, reason = _clamp(desired, lo, hi, reason, steps)
    rec = desired

    # Stabilization (HPA): up to the min of the up-window, down to the max of the down-window.
    if desired > cur:
        up = min([desired, *history.window(role, now - p.scale_up.window)])
        if up < desired:
            desired, reason = max(up, cur), "ScaleUpStabilized"
            steps.append(Step("stabilization", desired, reason,
                              f"min over {p.scale_up.window:g}s window"))
    elif desired < cur:
        filling = history.started_at is not None and now - history.started_at < p.scale_down.window
        if filling:
            desired, reason = cur, "StabilizationWindowFilling"
            steps.append(Step("stabilization", desired, reason,
                              f"restarted {now - (history.started_at or now):.0f}s ago; no "
                              f"scale-down before the {p.scale_down.window:g}s window fills"))
        else:
            down = max([desired, *history.window(role, now - p.scale_down.window)])
            if down > desired:
                desired, reason = min(down, cur), "ScaleDownStabilized"
                steps.append(Step("stabilization", desired, reason,
                                  f"max over {p.scale_down.window:g}s window"))

    # Rate limits.
    if desired > cur + p.scale_up.max_step:
        desired, reason = cur + p.scale_up.max_step, "ScaleUpRateLimited"
        steps.append(Step("rate", desired, reason, f"at most +{p.scale_up.max_step}"))
    elif desired < cur - p.scale_down.max_step:
        desired, reason = cur - p.scale_down.max_step, "ScaleDownRateLimited"
        steps.append(Step("rate", desired, reason, f"at most -{p.scale_down.max_step}"))

    # Cooldown since this role's last scale.
    last = history.last_scale.get(role)
    if last is not None and desired != cur:
        cool = p.scale_up.cooldown if desired > cur else p.scale_down.cooldown
        if now - last < cool:
            name = "ScaleUpCooldown" if desired > cur else "ScaleDownCooldown"
            desired, reason = cur, name
            steps.append(Step("cooldown", desired, reason,
                              f"last scale {now - last:.0f}s ago (cooldown {cool:g}s)"))

    # Capacity guards: replicas on the way, and pods that cannot be placed.
    if o.unschedulable > 0:
        limited = "Unschedulable"
        limited_msg = (f"{o.unschedulable} {role} pod(s) cannot be scheduled"
                       + (f": {o.unschedulable_message}" if o.unschedulable_message else ""))
        if desired > cur:
            desired, reason = cur, "Unschedulable"
            steps.append(Step("guard", desired, reason, limited_msg))
    elif desired > cur and o.starting > 0:
        desired, reason = cur, "WaitingForStartingReplicas"
        steps.append(Step("guard", desired, reason,
                          f"{o.starting} replica(s) still starting count as capacity"))

    desired, reason = _clamp(desired, lo, hi, reason, steps)
    if wanted > hi and limited is None:
        limited, limited_msg = "MaxReplicasReached", f"{role} wants {wanted}, maxReplicas is {hi}"
    d = _decision(role, cur, desired, reason, steps, raw, limited, limited_msg)
    return d, rec


def _clamp(desired: int, lo: int, hi: int, reason: str, steps: list[Step]) -> tuple[int, str]:
    if desired > hi:
        steps.append(Step("clamp", hi, "ClampedToMax", f"maxReplicas {hi}"))
        return hi, "ClampedToMax"
    if desired < lo:
        steps.append(Step("clamp", lo, "ClampedToMin", f"minReplicas {lo}"))
        return lo, "ClampedToMin"
    return desired, reason


def _signals_text(signals: Iterable[Signal]) -> str:
    return ", ".join(
        f"{s.name} {s.value:.4g} vs {s.target:.4g}"
        + (f" -> {s.proposal}" if s.proposal is not None else " (abstains)")
        for s in signals
    )


def _decision(
    role: str,
    cur: int,
    desired: int,
    reason: str,
    steps: list[Step],
    raw: _Raw,
    limited: str | None,
    limited_msg: str = "",
) -> RoleDecision:
    chain = "; ".join(f"{s.reason}" + (f" ({s.detail})" if s.detail else "") for s in steps)
    msg = f"{role} {cur} -> {desired}: {chain}"
    if limited_msg:
        msg += f"; ScalingLimited: {limited_msg}"
    return RoleDecision(
        role=role,
        current=cur,
        replicas=desired,
        reason=reason,
        message=msg,
        steps=tuple(steps),
        signals=tuple(raw.signals),
        metrics_ok=raw.metrics_ok,
        limited=limited,
        limited_message=limited_msg,
    )


def _metrics_condition(ds: Mapping[str, RoleDecision], obs: Observation) -> ConditionDecision:
    bad = [d for d in ds.values() if not d.metrics_ok]
    if not bad:
        return ConditionDecision(True, "MetricsFound", "every role has fresh samples")
    reason = bad[0].steps[0].reason if bad[0].steps else "MetricsUnavailable"
    return ConditionDecision(
        False, reason, "; ".join(f"{d.role}: {d.steps[0].detail}" for d in bad if d.steps)
    )


def _limited_condition(ds: Mapping[str, RoleDecision]) -> ConditionDecision:
    lim = [d for d in ds.values() if d.limited]
    if not lim:
        return ConditionDecision(False, "ScalingAllowed", "no limit reached")
    return ConditionDecision(
        True, lim[0].limited or "", "; ".join(d.limited_message for d in lim)
    )
