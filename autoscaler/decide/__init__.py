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

from poolpilot.autoscaler import capacity as model
from poolpilot.autoscaler.decide.burst import Clumps
from poolpilot.autoscaler.decide.checks import (
    _REQUIRED,
    broken_path,
    check_data,
    kv_transfer_failing,
    limited_condition,
    metrics_condition,
    settle_seconds,
    ttft_owner,
)
from poolpilot.autoscaler.decide.learning import (
    QUEUED_SHARE,
    _latency_breach,
    _unit,
    burst_room,
    learn_capacity,
    max_backlog,
    measure_need,
    role_headroom,
)
from poolpilot.autoscaler.decide.signals import _ABOVE, _BELOW, _signals_text, propose_from_signals
from poolpilot.autoscaler.decide.steps import (
    COUNTS_STARTING,
    _decision,
    _Trail,
    _unschedulable_text,
    apply_ratio_floor,
    clamp_to_bounds,
    cool_down,
    hold_for_pending,
    limit_rate,
    look_ahead,
    presize,
    ratio_floors,
    scaling_limit,
    size_from_capacity,
    size_role,
    stabilize,
    track_gaps,
)
from poolpilot.autoscaler.decide.types import (
    _EPS,
    CAPACITY_ALPHA,
    DOWN,
    MAX_HIT_RATE,
    NONE,
    UP,
    Behavior,
    ConditionDecision,
    Decision,
    History,
    Observation,
    Policy,
    Proposal,
    Recommendation,
    RoleDecision,
    RoleObservation,
    Signal,
    Sized,
    Step,
    _bad,
    _ceil,
    _num,
)
from poolpilot.autoscaler.frozen import replace

from poolpilot.reasons import Reason, StepName
from poolpilot.reasons import SignalName as S
from poolpilot.roles import Role

# What callers import from `poolpilot.autoscaler.decide` (the loop, the bench, the tests).
__all__ = [
    "CAPACITY_ALPHA",
    "COUNTS_STARTING",
    "DOWN",
    "MAX_HIT_RATE",
    "NONE",
    "QUEUED_SHARE",
    "UP",
    "_ABOVE",
    "_BELOW",
    "_EPS",
    "_REQUIRED",
    "Behavior",
    "Clumps",
    "ConditionDecision",
    "Decision",
    "History",
    "Observation",
    "Policy",
    "Proposal",
    "Reason",
    "Recommendation",
    "RoleDecision",
    "RoleObservation",
    "S",
    "Signal",
    "Sized",
    "Step",
    "StepName",
    "_Trail",
    "_bad",
    "_ceil",
    "_decision",
    "_latency_breach",
    "_num",
    "_signals_text",
    "_unit",
    "_unschedulable_text",
    "apply_ratio_floor",
    "broken_path",
    "burst_room",
    "check_data",
    "clamp_to_bounds",
    "cool_down",
    "decide",
    "hold_for_pending",
    "kv_transfer_failing",
    "learn_capacity",
    "limit_rate",
    "limited_condition",
    "look_ahead",
    "max_backlog",
    "measure_need",
    "metrics_condition",
    "model",
    "presize",
    "propose_from_signals",
    "ratio_floors",
    "replace",
    "role_headroom",
    "scaling_limit",
    "settle_seconds",
    "size_from_capacity",
    "size_role",
    "stabilize",
    "track_gaps",
    "ttft_owner",
]


def decide(observation: Observation, policy: Policy, history: History, now: float) -> Decision:
    """Decide the size of every engine role of one pool. Pure: same inputs, same output."""
    roles = [r for r in policy.bounds if r in observation.roles]
    capacity = dict(history.capacity)
    for seeded, seed in ((Role.PREFILL, policy.prefill_tokens_per_replica),
                         (Role.DECODE, policy.decode_tokens_per_replica)):
        if seed and seeded not in capacity:
            capacity[seeded] = seed  # a profile's number: where the learning starts
    seen = {r: history.ready_change(r, observation.roles[r].ready_replicas, now) for r in roles}
    memory = dict(history.memory)
    clumps = dict(history.clumps)
    proposals: dict[str, Proposal] = {}
    for role in roles:
        o = observation.roles[role]
        memory[role] = model.track_starts(memory.get(role, model.Memory()), o.replicas,
                                          o.ready_replicas, now)
        held = check_data(role, observation, policy)
        if held is not None:
            proposals[role] = held
            continue
        capacity, memory[role] = learn_capacity(
            role, observation, policy, capacity, memory[role], now,
            settled=now - seen[role][1] >= settle_seconds(policy))
        need, memory[role] = measure_need(role, observation, policy, capacity, memory[role], now,
                                          settled=now - seen[role][1] >= settle_seconds(policy))
        proposals[role] = propose_from_signals(role, observation, policy, capacity, need)
        if need is not None and role == Role.PREFILL and policy.burst_room:
            clumps[role], proposals[role].room = burst_room(
                observation, policy, need, memory[role], clumps.get(role, Clumps()), now)
    presized = {r: presize(proposals[r]) for r in roles}
    floors = ratio_floors(observation, policy, capacity,
                          {r: (proposals[r], presized[r][0]) for r in roles})
    history = replace(history, resumed=track_gaps(history, proposals, policy, now))

    recs = list(history.recommendations)
    decisions: dict[str, RoleDecision] = {}
    for role in roles:
        d, rec = size_role(role, proposals[role], presized[role], floors.get(role), observation,
                           policy, history, now)
        decisions[role] = d
        if rec is not None:
            recs.append(Recommendation(now, role, rec))

    keep = max(policy.scale_up.window, policy.scale_down.window)
    oldest = now - keep - _EPS
    pruned = tuple(r for r in recs if r.time > oldest) if keep > 0 else ()
    new_history = replace(
        history, recommendations=pruned, capacity=capacity,
        ready_seen={**history.ready_seen, **seen}, memory=memory, clumps=clumps,
    )
    return Decision(
        roles=decisions,
        metrics_available=metrics_condition(decisions),
        scaling_limited=limited_condition(decisions, observation, policy),
        history=new_history,
    )
