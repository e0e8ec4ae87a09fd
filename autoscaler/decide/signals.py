"""The signals step: one proposal per threshold or latency signal, the largest wins."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from poolpilot.autoscaler import capacity as model
from poolpilot.autoscaler.decide.checks import (
    kv_transfer_failing,
    ttft_owner,
)
from poolpilot.autoscaler.decide.types import (
    Observation,
    Policy,
    Proposal,
    Signal,
    _bad,
    _ceil,
)

from poolpilot.reasons import Reason
from poolpilot.reasons import SignalName as S
from poolpilot.roles import Role

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
    if role in (Role.PREFILL, Role.ENGINE):
        if role == Role.ENGINE or owner == Role.PREFILL:
            ttft = obs.router_ttft if not _bad(obs.router_ttft) else o.ttft
            latency(S.TTFT, ttft, p.ttft_target, sizes=need is None and not failing)
        if need is None:
            load(S.QUEUE, waiting, p.prefill_queue_per_replica * ready)
    if role == Role.PREFILL and need is None:
        cap = capacity.get(Role.PREFILL)
        if cap:  # (capacity counts computed tokens: those the prefix cache did not serve)
            load(S.PROMPT_THROUGHPUT, float(o.prompt_tokens_rate or 0) * o.miss,
                 cap * (1 - p.headroom) * ready)
    if role == Role.DECODE and owner == Role.DECODE:
        # (decode's waiting gauge counts KV handoffs in flight: a late first token with a few
        # of those is no decode shortage; its model and KV cache say when decode is short)
        latency(S.TTFT, obs.router_ttft, p.ttft_target, sizes=need is None and not failing)
    if role in (Role.DECODE, Role.ENGINE):
        latency(S.ITL, o.itl, p.itl_target, sizes=not prefill_fallback_passing(role, obs))
        if need is None:
            load(S.SEQUENCES, running + waiting, p.decode_sequences_per_replica * ready)
        load(S.KV_CACHE, float(o.kv_usage or 0), p.kv_cache_usage)
    if need is not None:
        demand, ahead = ((S.PROMPT_TOKENS_DEMAND, S.PROMPT_TOKENS_AHEAD) if role == Role.PREFILL
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


def prefill_fallback_passing(role: str, obs: Observation) -> bool:
    """Decode's ITL is the router's local-prefill fallback's while prefill is behind, and
    prefill has replicas on their way: those end the fallback, and a decode replica ordered
    now would serve after them (the roles start alike), once the breach is over. Its ITL then
    sizes nothing; the generation demand and the KV cache still size decode."""
    if role != Role.DECODE or Role.PREFILL not in obs.roles:
        return False
    local = obs.local_prefill_rate
    return not _bad(local) and (local or 0) > 0 and obs.roles[Role.PREFILL].starting > 0


def _signals_text(signals: Iterable[Signal]) -> str:
    return ", ".join(
        f"{s.name} {s.value:.4g} vs {s.target:.4g}"
        + (f" -> {s.proposal}" if s.proposal is not None else "" if s.model else " (abstains)")
        for s in signals
    )
