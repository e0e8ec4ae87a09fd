"""The steps after the signals: capacity, forecast, ratio, bounds, stabilization, rate,
cooldown and pending, and `size_role`, which runs them for one role in order."""

from __future__ import annotations

import math
from collections.abc import Mapping

from poolpilot.autoscaler.decide.signals import _signals_text
from poolpilot.autoscaler.decide.types import (
    _EPS,
    History,
    Observation,
    Policy,
    Proposal,
    RoleDecision,
    RoleObservation,
    Sized,
    Step,
    _bad,
    _ceil,
)

from poolpilot.reasons import Reason, StepName
from poolpilot.roles import Role

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
    now = max(need.now, prop.room)  # the burst room is a floor under the demand's need
    keep = min(_ceil(now), cur)
    if keep < cur and now >= cur * (1 - prop.dead_band) - _EPS:
        keep = cur  # within the band: not worth a direction change
    if s.replicas > keep:
        return s  # a signal asks for more
    if keep == 0 and s.reason is Reason.NO_TRAFFIC:
        return s
    if s.replicas == keep == cur and prop.replicas is not None:
        return s  # the signals hold the size the model needs
    reason = Reason.CAPACITY_IDLE if keep < cur else Reason.CAPACITY_NEEDED
    return Sized(keep, reason, need.describe() + _room_text(prop))


def _room_text(prop: Proposal) -> str:
    """The burst room in a message, where it is what holds or orders the size."""
    need = prop.need
    if need is None or not prop.room > max(need.now, need.ahead):
        return ""
    return f"; burst room {prop.room:.2f} (clumps seen queueing)"


def look_ahead(s: Sized, prop: Proposal) -> Sized:
    """Order what the role will lack one cold start from now: the forecast demand plus the
    backlog the ready and starting replicas will not have drained by then."""
    need = prop.need
    if need is None:
        return s
    ahead = max(need.ahead, prop.room)
    n = _ceil(ahead)
    if n <= max(s.replicas, prop.current):
        return s
    rising = _ceil(max(need.ahead_of_current, prop.room)) < n
    reason = Reason.DEMAND_RISING if rising else Reason.DEMAND_ABOVE_CAPACITY
    detail = need.describe() if s.reason not in (Reason.CAPACITY_NEEDED, Reason.CAPACITY_IDLE) \
        else f"{ahead:.2f} replicas when one ordered now lands in {need.horizon:.0f}s"
    return Sized(n, reason, detail + _room_text(prop))


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
    trail.steps.append(Step(StepName.SIGNALS,
                            prop.current if prop.replicas is None else s.replicas, s.reason, text))
    s = trail.run(StepName.CAPACITY, s, size_from_capacity(s, prop))
    s = trail.run(StepName.FORECAST, s, look_ahead(s, prop))
    return s, trail.steps


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
    if Role.PREFILL not in props or Role.DECODE not in props:
        return {}
    pre, dec = obs.roles[Role.PREFILL], obs.roles[Role.DECODE]
    cp, cd = capacity.get(Role.PREFILL), capacity.get(Role.DECODE)
    prompt, gen = pre.prompt_tokens_rate, dec.generation_tokens_rate
    if not cp or not cd or _bad(prompt) or _bad(gen) or not prompt or not gen:
        return {}
    assert prompt is not None and gen is not None
    prompt *= pre.miss  # computed prompt tokens, the unit of Cp and of prefill's demand
    if not prompt or not 1e-9 < gen / prompt < 1e9:  # degenerate (denormal): no ratio
        return {}
    pn, dn = props[Role.PREFILL][0].need, props[Role.DECODE][0].need
    if pn is not None and dn is not None:
        return {
            Role.DECODE: _ceil(pn.trend_ahead * (gen / prompt) / (cd * (1 - dn.headroom))),
            Role.PREFILL: _ceil(dn.trend_ahead * (prompt / gen) / (cp * (1 - pn.headroom))),
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

    out: dict[str, int] = {}
    if (d := growth(props[Role.DECODE])) is not None:
        out[Role.PREFILL] = _ceil(d * ratio / band)
    if (pr := growth(props[Role.PREFILL])) is not None:
        out[Role.DECODE] = _ceil(pr / (ratio * band))
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


def stabilize(s: Sized, cur: int, role: str, p: Policy, history: History, now: float,
              whole_since: float | None = None, asked: Mapping[str, int] | None = None) -> Sized:
    """HPA stabilization: up to the min of the up-window, down to the max of the down-window;
    a freshly started autoscaler, a role whose measurements just resumed after a gap, or a pool
    whose request path was whole again only at `whole_since` (Observation.path_whole_since: a
    router or sole engine pod that restarted between two decisions hid the demand without any
    decision seeing it down) scales nothing down until its down-window has filled."""
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
        blind = unobserved_elsewhere(role, asked, history, p, now)
        if blind is not None:
            return Sized(cur, Reason.STABILIZATION_WINDOW_FILLING,
                         f"{blind}: its stall may be what keeps this role quiet; no scale-down "
                         f"before the {p.scale_down.window:g}s window fills")
        if whole_since is not None and now - whole_since < p.scale_down.window:
            return Sized(cur, Reason.STABILIZATION_WINDOW_FILLING,
                         f"the request path has been whole again for only "
                         f"{max(0.0, now - whole_since):.0f}s (a pod back in service); no "
                         f"scale-down before the {p.scale_down.window:g}s window fills")
        down = max([s.replicas, *history.window(role, now - p.scale_down.window)])
        if down > s.replicas:
            return Sized(min(down, cur), Reason.SCALE_DOWN_STABILIZED,
                         f"max over {p.scale_down.window:g}s window")
    return s


def unobserved_elsewhere(role: str, asked: Mapping[str, int] | None, history: History,
                         p: Policy, now: float) -> str | None:
    """Why another role of the pool (asked for: replicas > 0) cannot vouch for the demand
    reaching `role`: its measurements are missing now (History.resumed: None, a gap open), or
    resumed less than a down-window ago. None: every other role is measured."""
    for other, replicas in (asked or {}).items():
        if other == role or replicas <= 0 or other not in history.resumed:
            continue
        since = history.resumed[other]
        if since is None:
            return f"{other} is not measured now (its engines answer no scrape or report no load)"
        if now - since < p.scale_down.window:
            return f"{other}'s measurements resumed only {now - since:.0f}s ago"
    return None


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

    def run(self, name: StepName, before: Sized, after: Sized) -> Sized:
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
            s = trail.run(StepName.BOUNDS, s, clamp_to_bounds(s, lo, hi))
        return _decision(role, cur, s, trail.steps, prop, None), None

    s = trail.run(StepName.RATIO, s, apply_ratio_floor(s, floor))
    wanted = s.replicas
    # Recommendations live within the bounds (a pool idling at its minimum is "clamped", not
    # "stabilized"); the final clamp below still guards every path.
    s = trail.run(StepName.BOUNDS, s, clamp_to_bounds(s, lo, hi))
    rec = s.replicas
    asked = {r: ro.replicas for r, ro in obs.roles.items()}
    s = trail.run(StepName.STABILIZATION, s, stabilize(s, cur, role, p, history, now,
                                                         obs.path_whole_since, asked))
    s = trail.run(StepName.RATE, s, limit_rate(s, cur, p))
    s = trail.run(StepName.COOLDOWN, s, cool_down(s, cur, role, p, history, now))
    s = trail.run(StepName.PENDING, s, hold_for_pending(s, cur, role, o,
                                                 presized[0].reason in COUNTS_STARTING))
    s = trail.run(StepName.BOUNDS, s, clamp_to_bounds(s, lo, hi))
    limited = scaling_limit(role, o, wanted, hi)
    return _decision(role, cur, s, trail.steps, prop, *limited), rec


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
