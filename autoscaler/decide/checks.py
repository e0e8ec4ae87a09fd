"""Data checks: whether a role has anything trustworthy to decide on, whose TTFT a breach
is, and the pool's two conditions (MetricsAvailable, ScalingLimited)."""

from __future__ import annotations

from collections.abc import Mapping

from poolpilot.autoscaler.decide.types import (
    ConditionDecision,
    Observation,
    Policy,
    Proposal,
    RoleDecision,
    Step,
    _bad,
)

from poolpilot.reasons import Reason, StepName
from poolpilot.roles import Role

# Signals each role must have to decide (gauges every engine exports while it runs).
_REQUIRED: dict[str, tuple[str, ...]] = {
    Role.PREFILL: ("waiting", "running", "prompt_tokens_rate"),
    Role.DECODE: ("waiting", "running", "kv_usage", "generation_tokens_rate"),
    Role.ENGINE: ("waiting", "running", "kv_usage"),
}


def settle_seconds(p: Policy) -> float:
    """How long after the ready count changes the rates and queues reflect the new pool: the
    rate() window (60 s by default, the same as the metrics age limit) plus half of it for the
    new pods' first scrapes."""
    return 1.5 * p.max_metric_age


# --- step: data --------------------------------------------------------------------------------


def check_data(role: str, obs: Observation, p: Policy) -> Proposal | None:
    """Hold the current size when there is nothing trustworthy to decide on (None: go on)."""
    o = obs.roles[role]
    prop = Proposal(current=o.replicas)

    def hold(reason: Reason, detail: str, replicas: int | None = None,
             metrics_ok: bool = True) -> Proposal:
        prop.hold = Step(StepName.DATA, o.replicas if replicas is None else replicas, reason,
                         detail)
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


def ttft_owner(obs: Observation, p: Policy) -> str:
    """The role a TTFT breach at the router belongs to. The router's TTFT covers prefill, the
    KV transfer and the first decode step: it is prefill's, unless the prefill engines meet
    the target on their own while requests wait at decode (then decode is the bottleneck)."""
    pre, dec = obs.roles.get(Role.PREFILL), obs.roles.get(Role.DECODE)
    if pre is None or dec is None or _bad(obs.router_ttft) or _bad(pre.ttft):
        return Role.PREFILL
    decode_queue = not _bad(dec.waiting) and (dec.waiting or 0) > 0
    return Role.DECODE if (pre.ttft or 0) <= p.ttft_target and decode_queue else Role.PREFILL


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
    pre = obs.roles.get(Role.PREFILL)
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
