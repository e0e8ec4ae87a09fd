"""Learning: the capacity model's inputs (demand, backlog, trend) and the per-replica
capacity learnt from saturated stretches. Pure: each function returns the new state."""

from __future__ import annotations

from collections.abc import Mapping

from poolpilot.autoscaler import capacity as model
from poolpilot.autoscaler.decide.burst import Clumps, observe, room
from poolpilot.autoscaler.decide.checks import settle_seconds, ttft_owner
from poolpilot.autoscaler.decide.types import (
    _EPS,
    CAPACITY_ALPHA,
    Observation,
    Policy,
    RoleObservation,
    _bad,
    _num,
)
from poolpilot.autoscaler.frozen import replace

from poolpilot.roles import Role


def measure_need(role: str, obs: Observation, p: Policy, capacity: Mapping[str, float],
                 mem: model.Memory, now: float,
                 settled: bool = True) -> tuple[model.Need | None, model.Memory]:
    """The role's demand, backlog and trend, and what the capacity model makes of them (None
    while the role's per-replica capacity or, for prefill, its prompt length is unknown)."""
    o = obs.roles[role]
    per_replica = capacity.get(role)
    local = 0.0
    computed = 0.0  # prefill: the prompt tokens one request leaves to compute (after the cache)
    share = 1.0  # of the tokens arriving, those the role computes
    if role == Role.PREFILL:
        served = _num(o.prompt_tokens_rate)
        requests = _num(o.request_rate)
        tokens = served / requests if served > 0 and requests > 0 else mem.tokens_per_request
        mem = replace(mem, tokens_per_request=tokens)
        if tokens is None:
            return None, mem
        # Prefill is sized in the prompt tokens it computes: those its prefix cache does not
        # serve (the learned capacity is measured in the same unit, see learn_capacity). The
        # prompts prefilled on decode engines would have come here: prefill's hit rate.
        share = o.miss
        backlog = (_num(o.waiting) + _num(o.running)) * tokens
        local = _num(obs.local_prefill_rate) * tokens
        served += local
        computed = tokens * share
    elif role == Role.DECODE:
        served, backlog = _num(o.generation_tokens_rate), 0.0
    else:
        return None, mem
    # The samples keep the tokens arriving, whole, beside the share computed of them: the trend
    # and the rises below are the arrivals', computed at the share of the whole history. Kept
    # in computed tokens, they followed the cache too: a hit rate warming while the arrivals
    # rose hid the rise, and one falling while new replicas warmed up read as a rise that the
    # margin then held for its whole history (docs/autoscaler.md, "Prefix caching").
    arriving = served + model.backlog_growth(mem.samples, now, backlog)
    mem = model.remember(mem, now, arriving, backlog,
                         max(p.forecast_window, p.history_window), arriving * share)
    rate, backlog, local = arriving * share, backlog * share, local * share
    if not per_replica:
        return None, mem
    headroom = role_headroom(role, p, mem)
    if role == Role.PREFILL and mem.headroom is None:
        # Until breaches or calm windows teach it, the headroom starts from the prompts' own
        # service time (agent loops' long uncached steps breach an idle-looking pool).
        headroom = max(headroom, model.service_headroom(computed / per_replica, p.ttft_target))
    # Right after the ready count fell (a scale-down), a breach is the smaller pool's: the
    # rate window's earlier part, served by more replicas, can only hide one. So it teaches
    # more headroom before the window settles (a scale-down that breached the target is the
    # clearest sign the target utilization is too high; waiting for a settled window missed
    # it, the scale-up it caused unsettling the window again); less waits for a settled one.
    shrank = mem.shrunk is not None and now - mem.shrunk < settle_seconds(p)
    if role == Role.PREFILL and (settled or shrank) and o.starting == 0:
        ttft = obs.router_ttft if not _bad(obs.router_ttft) else o.ttft
        if not _bad(ttft):
            assert ttft is not None
            learnt = model.learn_headroom(
                headroom, rate / (per_replica * o.ready_replicas), ttft, p.ttft_target,
                # queued: the backlog alone took a share of the target to prefill at some
                # sample within the rate window (the queue of a burst is gone by the next
                # scrape more often than not; its TTFT stays in the window's quantile)
                p.dead_band, queued=share * max_backlog(mem, now, p.max_metric_age)
                / (per_replica * o.ready_replicas) > QUEUED_SHARE * p.ttft_target)
            headroom = learnt if settled else max(headroom, learnt)
            mem = replace(mem, headroom=headroom)
    horizon = mem.cold_start if mem.cold_start is not None else p.cold_start
    usable = model.trend_samples(mem, p.max_metric_age)
    recent = model.after(usable, now - p.forecast_window)
    quantile = p.rise_quantile if p.rise_quantile is not None else p.slo_quantile
    over_history = model.computed_share(mem.samples, share)
    slope = over_history * model.trend(recent, p.forecast_window) if p.forecast else 0.0
    # The rises to ride out: those within the time from a rise's start until a replica
    # ordered for it serves: the rate window the signals see it through, one decision
    # interval, one cold start (not the cold start alone: at a short cold start the signals'
    # own lag is most of it, and a margin of one cold start then left most clumps unserved).
    # The cold start counts for at least one rate window: a start faster than the window
    # that averages the demand only brings ordered replicas sooner, and never shrinks the
    # margin (at 30 s a pool kept a replica fewer than at 60 s through clumps that then
    # queued: a faster start cost attainment; docs/autoscaler.md).
    reaction = rise_horizon(horizon, p)
    rise = over_history * model.upside(usable, now, reaction, quantile) if p.forecast else 0.0
    need = model.need(per_replica, rate, backlog, slope, horizon, p.backlog_drain,
                      headroom, o.ready_replicas, o.starting, mem.orders, now, local, rise,
                      _unit(role, o))
    return need, mem


def rise_horizon(cold_start: float, p: Policy) -> float:
    """Seconds from a rise's start until a replica ordered for it serves, as the margin for
    rises counts them: the rate window, one interval, and the cold start, never less than a
    rate window (so a faster start never keeps a smaller margin)."""
    return max(cold_start, p.rate_window) + p.rate_window + p.interval


def burst_room(obs: Observation, p: Policy, need: model.Need, mem: model.Memory,
               clumps: Clumps, now: float) -> tuple[Clumps, float]:
    """Prefill's clumps with this decision's seconds-scale demand added, and the burst room
    they size, in replicas (`decide/burst.py`). Waiting prompts are counted as the capacity
    model counts tokens: computed (not served by the prefix cache)."""
    o = obs.roles[Role.PREFILL]
    waiting = _num(o.waiting) * (mem.tokens_per_request or 0.0) * o.miss
    clumps = observe(clumps, now, need.rate, waiting, p.ttft_target, settled=o.starting == 0)
    quantile = p.rise_quantile if p.rise_quantile is not None else p.slo_quantile
    return clumps, room(clumps.peaks, quantile, need.per_replica)


def _unit(role: str, o: RoleObservation) -> str:
    if role != Role.PREFILL:
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
    if role == Role.DECODE:
        return p.decode_headroom
    return mem.headroom if mem is not None and mem.headroom is not None else p.headroom


# A breach is the queue's (more headroom helps) when the backlog alone took this share of the
# TTFT target to prefill; else it is the prompts' own length (it breaches an idle pool too).
QUEUED_SHARE = 0.25


def _latency_breach(role: str, obs: Observation, p: Policy) -> bool:
    """The role's latency signal is above its target band (TTFT for prefill, ITL for decode)."""
    o = obs.roles[role]
    if role == Role.PREFILL and ttft_owner(obs, p) == Role.PREFILL:
        ttft = obs.router_ttft if not _bad(obs.router_ttft) else o.ttft
        return not _bad(ttft) and (ttft or 0) > p.ttft_target * (1 + p.dead_band)
    if role == Role.DECODE:
        return not _bad(o.itl) and (o.itl or 0) > p.itl_target * (1 + p.dead_band)
    return False


def learn_capacity(role: str, obs: Observation, p: Policy, capacity: Mapping[str, float],
                   mem: model.Memory, now: float,
                   settled: bool = True) -> tuple[dict[str, float], model.Memory]:
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
    every later decision for a pool slower than it is. Returns the capacities (a new mapping:
    the argument is left alone) and the memory with the start of the current saturated
    stretch."""
    o = obs.roles[role]
    latency_breach = _latency_breach(role, obs, p)
    ready = o.ready_replicas
    busy = 1 + p.dead_band
    if role == Role.PREFILL:
        saturated = float(o.waiting or 0) > p.prefill_queue_per_replica * ready * busy
        # Computed prompt tokens: a replica that served 3x its compute from the cache did
        # not compute 3x faster, and an estimate that said so would be divided by the hit
        # rate a second time when the demand is.
        rate = o.prompt_tokens_rate if _bad(o.prompt_tokens_rate) else (
            (o.prompt_tokens_rate or 0.0) * o.miss)
    elif role == Role.DECODE:
        # (not the sequences-per-replica proxy: a batch larger than it is no evidence that
        # decode is at its limit, and would teach the capacity model a limit that is not)
        saturated = latency_breach or float(o.kv_usage or 0) > min(1.0, p.kv_cache_usage * busy)
        rate = o.generation_tokens_rate
    else:
        return dict(capacity), mem
    since = (mem.busy_since if mem.busy_since is not None else now) if saturated else None
    mem = replace(mem, busy_since=since)
    if not settled or _bad(rate) or not rate:
        return dict(capacity), mem
    sample = float(rate) / ready
    old = capacity.get(role)
    if old is not None and sample > old and not latency_breach and not saturated:
        # served that much: a lower bound on what it can serve
        return {**capacity, role: sample}, mem
    if since is not None and now - since >= p.max_metric_age - _EPS:
        learnt = sample if old is None else old + CAPACITY_ALPHA * (sample - old)
        return {**capacity, role: learnt}, mem
    return dict(capacity), mem


# --- step: ratio -------------------------------------------------------------------------------
