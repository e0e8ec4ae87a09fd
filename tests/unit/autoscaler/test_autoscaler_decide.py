"""The autoscaler's decision core, as a table: every step and guard, for both roles."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.autoscaler.decide import (
    Behavior,
    Decision,
    History,
    Observation,
    Policy,
    Recommendation,
    RoleObservation,
    Sized,
    clamp_to_bounds,
    cool_down,
    decide,
    hold_for_pending,
    limit_rate,
    stabilize,
)

from poolpilot.reasons import DESCRIPTION, STEP_OF, Reason
from poolpilot.validate import parse_spec

NOW = 10_000.0
NAN = math.nan


def pre(replicas: int = 2, **kw: Any) -> RoleObservation:
    """A healthy, moderately loaded prefill role (every signal near its target)."""
    base: dict[str, Any] = dict(waiting=2.0 * replicas, running=1.0 * replicas,
                                prompt_tokens_rate=500.0 * replicas, ttft=0.5)
    base.update(kw)
    return RoleObservation(replicas=replicas, **base)


def dec(replicas: int = 2, **kw: Any) -> RoleObservation:
    """A healthy decode role at its sequence target."""
    base: dict[str, Any] = dict(waiting=0.0, running=64.0 * replicas, kv_usage=0.8,
                                generation_tokens_rate=100.0 * replicas, itl=0.02)
    base.update(kw)
    return RoleObservation(replicas=replicas, **base)


def idle(replicas: int, role: str = "prefill") -> RoleObservation:
    kv = {"kv_usage": 0.0} if role != "prefill" else {}
    return RoleObservation(replicas=replicas, waiting=0.0, running=0.0, ttft=NAN, itl=NAN,
                           prompt_tokens_rate=0.0, generation_tokens_rate=0.0, **kv)


def pool(prefill: RoleObservation | None = None, decode: RoleObservation | None = None,
         **kw: Any) -> Observation:
    return Observation(roles={"prefill": prefill or pre(), "decode": decode or dec()}, **kw)


def policy(**kw: Any) -> Policy:
    # The cases below were written for a scale-down step of 1 (they test the step, not the
    # default, which is 2): pin it.
    base: dict[str, Any] = dict(bounds={"prefill": (1, 8), "decode": (1, 16)},
                                scale_down=Behavior(window=300, max_step=1, cooldown=60))
    base.update(kw)
    return Policy(**base)


WARM = History.warm()


@dataclass
class Case:
    id: str
    obs: Observation
    want: dict[str, tuple[int, str]]  # role -> (replicas, reason)
    policy: Policy = field(default_factory=policy)
    history: History = WARM
    now: float = NOW
    metrics_available: bool = True
    scaling_limited: str | None = None


def hist(*recs: tuple[float, str, int], **kw: Any) -> History:
    return History(recommendations=tuple(Recommendation(NOW - a, r, n) for a, r, n in recs), **kw)


FAST_DOWN = Behavior(window=0, max_step=100, cooldown=0)
CASES = [
    # --- prefill proposals --------------------------------------------------------------
    Case("prefill-ttft-at-router-above-target-scales-up",
         pool(router_ttft=2.0),
         {"prefill": (4, "TTFTAboveTarget"), "decode": (2, "WithinDeadBand")}),
    Case("prefill-router-ttft-wins-over-engine-ttft",
         pool(pre(ttft=5.0), router_ttft=1.0), {"prefill": (2, "WithinDeadBand")}),
    Case("prefill-engine-ttft-used-without-router",
         pool(pre(ttft=1.5)), {"prefill": (3, "TTFTAboveTarget")}),
    Case("prefill-ttft-below-target-abstains",
         pool(router_ttft=0.1), {"prefill": (2, "WithinDeadBand")}),
    Case("prefill-queue-above-target-scales-up",
         pool(pre(1, waiting=10.0)), {"prefill": (5, "QueueAboveTarget")}),
    Case("prefill-queue-below-target-scales-down",
         pool(pre(4, waiting=2.0)), {"prefill": (3, "ScaleDownRateLimited")}),
    Case("prefill-queue-within-dead-band-holds",
         pool(pre(2, waiting=3.8)), {"prefill": (2, "WithinDeadBand")}),
    Case("prefill-prompt-throughput-above-capacity",
         pool(pre(2, waiting=4.0, prompt_tokens_rate=2400.0)),
         {"prefill": (3, "PromptThroughputAboveTarget")},
         policy=policy(prefill_tokens_per_replica=1000.0)),
    Case("prefill-prompt-throughput-below-capacity-scales-down",
         pool(pre(4, waiting=0.0, prompt_tokens_rate=500.0)),
         {"prefill": (1, "PromptThroughputBelowTarget")},
         policy=policy(prefill_tokens_per_replica=1000.0, scale_down=FAST_DOWN)),
    Case("prefill-ttft-scale-up-rate-limited-wanting-more-than-max",
         pool(router_ttft=10.0), {"prefill": (6, "ScaleUpRateLimited")},
         scaling_limited="MaxReplicasReached"),
    # --- decode proposals ---------------------------------------------------------------
    Case("decode-itl-above-target-scales-up",
         pool(decode=dec(itl=0.1)),
         {"decode": (4, "ITLAboveTarget"), "prefill": (2, "WithinDeadBand")}),
    # the router prefills on decode engines while prefill is behind, and prefill's ordered
    # replicas are on their way: they end the fallback (and its ITL) before a decode
    # replica ordered now would serve
    Case("decode-itl-of-the-local-prefill-fallback-waits-for-prefills-replicas",
         pool(pre(2, starting=1), dec(itl=0.1), local_prefill_rate=3.0),
         {"decode": (2, "WithinDeadBand")}),
    Case("decode-itl-of-the-fallback-with-no-prefill-replica-coming-scales-decode",
         pool(decode=dec(itl=0.1), local_prefill_rate=3.0),
         {"decode": (4, "ITLAboveTarget")}),
    Case("decode-itl-without-the-fallback-scales-decode-while-prefill-starts",
         pool(pre(2, starting=1), dec(itl=0.1)),
         {"decode": (4, "ITLAboveTarget")}),
    Case("decode-kv-cache-still-scales-decode-during-the-fallback",
         pool(pre(2, starting=1), dec(4, itl=0.1, kv_usage=0.95), local_prefill_rate=3.0),
         {"decode": (5, "KVCacheAboveTarget")}),
    Case("router-ttft-breach-goes-to-decode-when-prefill-is-fast-and-decode-queues",
         pool(pre(ttft=0.3), dec(2, waiting=10.0, running=128.0), router_ttft=2.0),
         {"prefill": (2, "WithinDeadBand"), "decode": (4, "TTFTAboveTarget")}),
    Case("router-ttft-breach-stays-with-prefill-when-prefill-is-slow",
         pool(pre(ttft=1.5), dec(2, waiting=10.0, running=128.0), router_ttft=2.0),
         {"prefill": (4, "TTFTAboveTarget"), "decode": (2, "WithinDeadBand")}),
    Case("decode-itl-below-target-abstains",
         pool(decode=dec(itl=0.001)), {"decode": (2, "WithinDeadBand")}),
    Case("decode-sequences-above-target-scales-up",
         pool(decode=dec(2, running=250.0, waiting=6.0)), {"decode": (4, "SequencesAboveTarget")}),
    Case("decode-sequences-below-target-scales-down",
         pool(decode=dec(4, running=64.0, kv_usage=0.1)), {"decode": (1, "SequencesBelowTarget")},
         policy=policy(scale_down=FAST_DOWN)),
    Case("decode-kv-cache-above-target-scales-up",
         pool(decode=dec(4, kv_usage=0.95)), {"decode": (5, "KVCacheAboveTarget")}),
    Case("decode-max-of-proposals-wins",
         pool(decode=dec(2, itl=0.075, running=320.0)), {"decode": (5, "SequencesAboveTarget")}),
    Case("decode-sequences-within-dead-band-holds",
         pool(decode=dec(2, running=135.0)), {"decode": (2, "WithinDeadBand")}),
    Case("decode-scale-down-rate-limited",
         pool(decode=dec(6, running=64.0, kv_usage=0.1)), {"decode": (5, "ScaleDownRateLimited")}),
    # --- zero traffic -----------------------------------------------------------------------
    Case("zero-traffic-scales-both-roles-down-despite-nan-latency",
         pool(idle(3), idle(3, "decode"), router_ttft=NAN),
         {"prefill": (2, "ScaleDownRateLimited"), "decode": (2, "ScaleDownRateLimited")}),
    Case("zero-traffic-stops-at-min",
         pool(idle(3), idle(3, "decode")),
         {"prefill": (1, "ClampedToMin"), "decode": (1, "ClampedToMin")},
         policy=policy(scale_down=FAST_DOWN)),
    Case("zero-traffic-scales-to-zero-when-enabled",
         pool(idle(1), idle(1, "decode")),
         {"prefill": (0, "NoTraffic"), "decode": (0, "NoTraffic")},
         policy=policy(bounds={"prefill": (0, 8), "decode": (0, 8)}, scale_to_zero=True)),
    # --- scale to zero and wake-up ------------------------------------------------------
    Case("scaled-to-zero-stays-without-requests",
         pool(RoleObservation(0), RoleObservation(0), router_inflight=0.0, router_request_rate=0.0),
         {"prefill": (0, "ScaledToZero"), "decode": (0, "ScaledToZero")},
         policy=policy(bounds={"prefill": (0, 8), "decode": (0, 8)}, scale_to_zero=True)),
    Case("wake-up-when-requests-queue-at-router-even-in-cooldown",
         pool(RoleObservation(0), RoleObservation(0), router_inflight=3.0),
         {"prefill": (1, "WakeUp"), "decode": (1, "WakeUp")},
         policy=policy(bounds={"prefill": (0, 8), "decode": (0, 8)}, scale_to_zero=True),
         history=History(last_scale={"prefill": NOW - 1, "decode": NOW - 1})),
    # --- stabilization ----------------------------------------------------------------------
    Case("scale-down-held-by-higher-recommendation-in-window",
         pool(decode=dec(4, running=64.0, kv_usage=0.1)), {"decode": (4, "ScaleDownStabilized")},
         history=hist((100, "decode", 4))),
    Case("scale-down-to-window-maximum",
         pool(decode=dec(4, running=64.0, kv_usage=0.1)), {"decode": (3, "ScaleDownStabilized")},
         policy=policy(scale_down=Behavior(300, 100, 0)),
         history=hist((100, "decode", 3), (50, "decode", 2))),
    Case("scale-down-ignores-recommendations-older-than-window",
         pool(decode=dec(4, running=64.0, kv_usage=0.1)), {"decode": (3, "ScaleDownRateLimited")},
         history=hist((400, "decode", 4))),
    Case("scale-up-stabilized-by-window-minimum",
         pool(decode=dec(2, running=320.0)), {"decode": (3, "ScaleUpStabilized")},
         policy=policy(scale_up=Behavior(window=60, max_step=4, cooldown=0)),
         history=hist((30, "decode", 3))),
    Case("restart-no-scale-down-until-window-filled",
         pool(decode=dec(4, running=64.0, kv_usage=0.1)),
         {"decode": (4, "StabilizationWindowFilling")},
         history=History.fresh(NOW - 10)),
    Case("restart-scale-down-after-window-filled",
         pool(decode=dec(4, running=64.0, kv_usage=0.1)), {"decode": (3, "ScaleDownRateLimited")},
         history=History.fresh(NOW - 301)),
    Case("gap-resumed-no-scale-down-until-window-filled",
         pool(decode=dec(4, running=64.0, kv_usage=0.1)),
         {"decode": (4, "StabilizationWindowFilling")},
         history=History(resumed={"decode": NOW - 10})),
    Case("gap-ending-now-starts-the-window",
         pool(decode=dec(4, running=64.0, kv_usage=0.1)),
         {"decode": (4, "StabilizationWindowFilling")},
         history=History(resumed={"decode": None})),
    Case("gap-resumed-scale-down-after-window-filled",
         pool(decode=dec(4, running=64.0, kv_usage=0.1)), {"decode": (3, "ScaleDownRateLimited")},
         history=History(resumed={"decode": NOW - 301})),
    Case("gap-resumed-scale-up-immediately",
         pool(decode=dec(2, running=256.0)), {"decode": (4, "SequencesAboveTarget")},
         history=History(resumed={"decode": NOW - 1})),
    Case("restart-scale-up-immediately",
         pool(decode=dec(2, running=256.0)), {"decode": (4, "SequencesAboveTarget")},
         history=History.fresh(NOW - 1)),
    # A router (or sole engine) pod that restarted between two decisions: no decision saw
    # the path broken, but the engines' quiet since is the outage's, not a fall in demand.
    Case("path-whole-again-recently-no-scale-down",
         pool(decode=dec(4, running=64.0, kv_usage=0.1), path_whole_since=NOW - 30),
         {"decode": (4, "StabilizationWindowFilling")}),
    Case("path-whole-for-a-window-scales-down",
         pool(decode=dec(4, running=64.0, kv_usage=0.1), path_whole_since=NOW - 301),
         {"decode": (3, "ScaleDownRateLimited")}),
    Case("path-whole-again-recently-scales-up",
         pool(decode=dec(2, running=256.0), path_whole_since=NOW - 1),
         {"decode": (4, "SequencesAboveTarget")}),
    # The chaos run: the sole prefill engine hung (SIGSTOP), answered no scrape, and sent
    # decode nothing; decode scaled 2 -> 1 on its own quiet, 12 s into the stall.
    Case("another-role-unmeasured-holds-scale-down",
         pool(pre(1, waiting=NAN, running=NAN), dec(4, running=64.0, kv_usage=0.1)),
         {"prefill": (1, "MetricsUnavailable"), "decode": (4, "StabilizationWindowFilling")},
         metrics_available=False),
    Case("another-role-measured-again-recently-holds-scale-down",
         pool(decode=dec(4, running=64.0, kv_usage=0.1)),
         {"decode": (4, "StabilizationWindowFilling")},
         history=History(resumed={"prefill": NOW - 30})),
    Case("another-role-measured-for-a-window-scales-down",
         pool(decode=dec(4, running=64.0, kv_usage=0.1)),
         {"decode": (3, "ScaleDownRateLimited")},
         history=History(resumed={"prefill": NOW - 301})),
    Case("another-role-unmeasured-scale-up-not-held",
         pool(pre(1, waiting=NAN, running=NAN), dec(2, running=256.0)),
         {"decode": (4, "SequencesAboveTarget")}, metrics_available=False),
    Case("another-role-at-zero-does-not-hold",
         pool(RoleObservation(0), dec(4, running=64.0, kv_usage=0.1), router_inflight=0.0,
              router_request_rate=0.0),
         {"prefill": (0, "ScaledToZero"), "decode": (3, "ScaleDownRateLimited")},
         policy=policy(bounds={"prefill": (0, 8), "decode": (1, 16)}, scale_to_zero=True),
         history=History(resumed={"prefill": None})),
    # --- cooldown -----------------------------------------------------------------------
    Case("scale-up-cooldown-holds",
         pool(router_ttft=2.0), {"prefill": (2, "ScaleUpCooldown")},
         history=History(last_scale={"prefill": NOW - 10})),
    Case("scale-down-cooldown-holds",
         pool(decode=dec(4, running=64.0, kv_usage=0.1)), {"decode": (4, "ScaleDownCooldown")},
         history=History(last_scale={"decode": NOW - 30})),
    Case("cooldown-over-scales",
         pool(decode=dec(4, running=64.0, kv_usage=0.1)), {"decode": (3, "ScaleDownRateLimited")},
         history=History(last_scale={"decode": NOW - 61})),
    Case("cooldown-is-per-role",
         pool(router_ttft=2.0), {"prefill": (4, "TTFTAboveTarget")},
         history=History(last_scale={"decode": NOW - 1})),
    # --- capacity guards ----------------------------------------------------------------
    Case("starting-replicas-count-as-capacity-no-stacking",
         pool(pre(4, ready=2, starting=2, waiting=4.0), router_ttft=2.0),
         {"prefill": (4, "AtRecommendedSize")}),
    Case("ttft-above-target-sized-on-ready-may-propose-fewer-than-asked",
         pool(pre(4, ready=2, starting=2, waiting=0.0), router_ttft=1.5),
         {"prefill": (3, "TTFTAboveTarget")}),
    Case("starting-replicas-block-further-scale-up",
         pool(decode=dec(4, ready=2, starting=2, running=600.0)),
         {"decode": (4, "WaitingForStartingReplicas")}),
    Case("starting-replicas-do-not-block-scale-down",
         pool(decode=dec(4, ready=3, starting=1, running=64.0, kv_usage=0.1)),
         {"decode": (3, "ScaleDownRateLimited")}),
    Case("unschedulable-pods-stop-scale-up-and-limit",
         pool(pre(3, ready=2, unschedulable=1, waiting=20.0,
                  unschedulable_message="0/3 nodes have nvidia.com/gpu")),
         {"prefill": (3, "Unschedulable")}, scaling_limited="Unschedulable"),
    Case("unschedulable-decode-pods-stop-scale-up",
         pool(decode=dec(2, ready=1, unschedulable=1, kv_usage=1.0, running=200.0)),
         {"decode": (2, "Unschedulable")}, scaling_limited="Unschedulable"),
    Case("no-ready-replicas-holds",
         pool(pre(2, ready=0, starting=2, waiting=NAN, running=NAN)),
         {"prefill": (2, "NoReadyReplicas")}),
    # The chaos run: the router's only pod crashed, the engines went idle, decode scaled down.
    Case("no-ready-router-holds-every-role",
         pool(idle(3), idle(4, "decode"), router_ready=0),
         {"prefill": (3, "NoReadyReplicas"), "decode": (4, "NoReadyReplicas")}),
    Case("no-ready-decode-holds-prefill-too",
         pool(idle(3), dec(1, ready=0, starting=1, waiting=NAN, running=NAN)),
         {"prefill": (3, "NoReadyReplicas"), "decode": (1, "NoReadyReplicas")}),
    Case("ready-router-does-not-hold",
         pool(idle(3), idle(4, "decode"), router_ready=1),
         {"prefill": (2, "ScaleDownRateLimited"), "decode": (3, "ScaleDownRateLimited")},
         policy=policy(scale_down=Behavior(window=0, max_step=1, cooldown=0))),
    # --- missing, NaN and stale metrics ---------------------------------------------------
    Case("prefill-missing-queue-holds",
         pool(pre(3, waiting=None), router_ttft=5.0), {"prefill": (3, "MetricsUnavailable")},
         metrics_available=False),
    Case("decode-nan-kv-usage-holds-even-with-zero-load",
         pool(decode=dec(4, kv_usage=NAN, running=0.0)), {"decode": (4, "MetricsUnavailable")},
         metrics_available=False),
    Case("stale-samples-hold",
         pool(decode=dec(4, sample_age=120.0, running=0.0)), {"decode": (4, "MetricsStale")},
         metrics_available=False),
    Case("negative-queue-gauge-is-missing-data-not-a-scale-down",
         pool(pre(4, waiting=-1e9)), {"prefill": (4, "MetricsUnavailable")},
         metrics_available=False),
    Case("infinite-kv-usage-is-missing-data",
         pool(decode=dec(4, kv_usage=math.inf)), {"decode": (4, "MetricsUnavailable")},
         metrics_available=False),
    Case("negative-token-rate-is-missing-data",
         pool(pre(4, waiting=0.0, prompt_tokens_rate=-5.0)),
         {"prefill": (4, "MetricsUnavailable")}, metrics_available=False,
         policy=policy(prefill_tokens_per_replica=1000.0, scale_down=FAST_DOWN)),
    Case("negative-router-ttft-abstains-instead-of-counting",
         pool(router_ttft=-3.0), {"prefill": (2, "WithinDeadBand")}),
    Case("prometheus-down-at-zero-replicas-says-so-and-holds",
         pool(RoleObservation(0), RoleObservation(0), router_inflight=5.0,
              prometheus_error="connection refused"),
         {"prefill": (0, "MetricsUnavailable"), "decode": (0, "MetricsUnavailable")},
         policy=policy(bounds={"prefill": (0, 8), "decode": (0, 8)}, scale_to_zero=True),
         metrics_available=False),
    Case("zero-replicas-without-router-signals-holds-and-says-so",
         pool(RoleObservation(0), RoleObservation(0)),
         {"prefill": (0, "MetricsUnavailable"), "decode": (0, "MetricsUnavailable")},
         policy=policy(bounds={"prefill": (0, 8), "decode": (0, 8)}, scale_to_zero=True),
         metrics_available=False),
    Case("zero-replicas-negative-router-gauge-does-not-wake",
         pool(RoleObservation(0), RoleObservation(0), router_inflight=-1.0,
              router_request_rate=0.0),
         {"prefill": (0, "ScaledToZero"), "decode": (0, "ScaledToZero")},
         policy=policy(bounds={"prefill": (0, 8), "decode": (0, 8)}, scale_to_zero=True)),
    Case("prometheus-down-holds-both-roles-never-zero",
         pool(idle(3), idle(3, "decode"), prometheus_error="connection refused"),
         {"prefill": (3, "MetricsUnavailable"), "decode": (3, "MetricsUnavailable")},
         policy=policy(bounds={"prefill": (0, 8), "decode": (0, 8)}, scale_to_zero=True),
         metrics_available=False),
    # --- clamp --------------------------------------------------------------------------
    Case("clamp-to-max-sets-scaling-limited",
         pool(decode=dec(4, running=2000.0)), {"decode": (6, "ClampedToMax")},
         policy=policy(bounds={"prefill": (1, 8), "decode": (1, 6)}),
         scaling_limited="MaxReplicasReached"),
    Case("clamp-to-min",
         pool(pre(3, waiting=0.0)), {"prefill": (2, "ClampedToMin")},
         policy=policy(bounds={"prefill": (2, 8), "decode": (1, 16)}, scale_down=FAST_DOWN)),
    Case("lowered-max-is-enforced-even-when-holding",
         pool(pre(10, waiting=None)), {"prefill": (8, "ClampedToMax")},
         metrics_available=False),
    # --- the prefill:decode ratio (in replicas: while the capacity model is off) ----------
    Case("ratio-skipped-while-throughput-unknown",
         pool(pre(4, waiting=40.0), dec(4, running=64.0, kv_usage=0.1)),
         {"prefill": (8, "ClampedToMax"), "decode": (3, "ScaleDownRateLimited")},
         scaling_limited="MaxReplicasReached"),
    # --- aggregated mode ----------------------------------------------------------------
    Case("aggregated-engine-uses-ttft-and-sequences",
         Observation(roles={"engine": dec(2, waiting=4.0)}, router_ttft=3.0),
         {"engine": (6, "TTFTAboveTarget")},
         policy=policy(bounds={"engine": (1, 8)})),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decide(case: Case) -> None:
    d = decide(case.obs, case.policy, case.history, case.now)
    got = {r: (d.roles[r].replicas, d.roles[r].reason) for r in case.want}
    assert got == case.want, {r: d.roles[r].message for r in case.want}
    assert d.metrics_available.status is case.metrics_available, d.metrics_available
    if case.scaling_limited:
        assert d.scaling_limited.status and d.scaling_limited.reason == case.scaling_limited
    else:
        assert not d.scaling_limited.status, d.scaling_limited


def test_case_table_is_large_and_unique() -> None:
    assert len(CASES) >= 30 and len({c.id for c in CASES}) == len(CASES)


def test_message_names_every_step_and_input() -> None:
    d = decide(pool(router_ttft=10.0), policy(), WARM, NOW).roles["prefill"]
    assert [s.name for s in d.steps] == ["signals", "bounds", "rate"]
    assert "TTFT 10 vs 1" in d.message and "ScaleUpRateLimited" in d.message
    assert d.message.startswith("prefill 2 -> 6:")


def test_history_remembers_recommendations_then_prunes() -> None:
    d = decide(pool(decode=dec(4, running=64.0, kv_usage=0.1)), policy(), WARM, NOW)
    # decode scales down, but its cooldown clock is the caller's to start, once the scale
    # has happened (a failed write starts none)
    assert d.roles["decode"].replicas < 4 and d.history.last_scale == {}
    assert d.history.scaled(["decode"], NOW).last_scale == {"decode": NOW}
    assert [(r.role, r.replicas) for r in d.history.recommendations] == [
        ("prefill", 2), ("decode", 1)]
    later = decide(pool(decode=dec(3)), policy(), d.history, NOW + 301)
    assert all(r.time == NOW + 301 for r in later.history.recommendations)


def test_no_scale_down_right_after_a_metrics_outage_longer_than_the_window() -> None:
    """Found by the sandbox's chaos run (docs/sandbox.md): Prometheus was down longer than the
    down-window, so the window held no recommendation when it came back, and rate() over a
    window still covering the gap read low; prefill went 3 -> 2 ten seconds after metrics
    returned, then 2 -> 4 six seconds later. The decisions of a gap hold; the window must fill
    with fresh measurements before a scale-down."""
    p = policy(scale_down=Behavior(window=60, max_step=1, cooldown=0))
    busy, low = dec(4, running=256.0), dec(4, running=64.0, kv_usage=0.1)
    h = decide(pool(decode=busy), p, WARM, NOW).history
    t = NOW
    for _ in range(12):  # two minutes without Prometheus: every decision holds
        t += 10
        d = decide(pool(decode=busy, prometheus_error="connection refused"), p, h, t)
        assert (d.replicas["decode"], d.roles["decode"].reason) == (4, "MetricsUnavailable")
        h = d.history
    back = t + 10
    for t in range(int(back), int(back) + 60, 10):  # the window refills: no scale-down
        d = decide(pool(decode=low), p, h, t)
        assert (d.replicas["decode"], d.roles["decode"].reason) == \
            (4, "StabilizationWindowFilling"), t - back
        h = d.history
    d = decide(pool(decode=low), p, h, back + 60)  # a whole window of fresh measurements
    assert d.replicas["decode"] == 3
    assert "decode" not in decide(pool(decode=low), p, d.history, back + 70).history.resumed


def test_policy_from_spec_reads_every_field() -> None:
    spec = parse_spec({
        "model": {"name": "m"},
        "prefill": {"minReplicas": 2, "maxReplicas": 5, "replicas": 2},
        "decode": {"minReplicas": 1, "maxReplicas": 9},
        "slo": {"ttft": {"quantile": 0.9, "seconds": 0.5}, "itl": {"quantile": 0.5,
                                                                   "seconds": 0.02}},
        "autoscaling": {
            "scaleUp": {"stabilizationWindowSeconds": 5, "maxStep": 2, "cooldownSeconds": 7},
            "scaleDown": {"stabilizationWindowSeconds": 100, "maxStep": 3, "cooldownSeconds": 9},
            "targets": {"prefillQueuePerReplica": 3, "decodeSequencesPerReplica": 32,
                        "kvCacheUsage": 0.7, "headroom": 0.3, "deadBand": 0.05,
                        "prefillTokensPerSecondPerReplica": 9000, "ratioBand": 0.25},
            "metricsMaxAgeSeconds": 45,
        },
    })
    p = Policy.from_spec(spec)
    assert p.bounds == {"prefill": (2, 5), "decode": (1, 9)}
    assert (p.ttft_target, p.itl_target) == (0.5, 0.02)
    assert p.scale_up == Behavior(5, 2, 7) and p.scale_down == Behavior(100, 3, 9)
    assert (p.prefill_queue_per_replica, p.decode_sequences_per_replica, p.kv_cache_usage,
            p.headroom, p.dead_band) == (3, 32, 0.7, 0.3, 0.05)
    assert (p.prefill_tokens_per_replica, p.decode_tokens_per_replica, p.ratio_band,
            p.max_metric_age) == (9000, None, 0.25, 45)
    agg = Policy.from_spec(parse_spec({"model": {"name": "m"}, "mode": "Aggregated"}))
    assert list(agg.bounds) == ["engine"]


# --- invariants ---------------------------------------------------------------------------

maybe = st.one_of(st.none(), st.just(NAN), st.floats(0, 1e4, allow_nan=False))
values = st.floats(0, 1e4, allow_nan=False)


@st.composite
def scenario(draw: st.DrawFn) -> tuple[Observation, Policy, History]:
    bounds = {}
    roles = {}
    for role in ("prefill", "decode"):
        lo = draw(st.integers(0, 4))
        hi = draw(st.integers(max(lo, 1), 20))
        cur = draw(st.integers(lo, hi))
        ready = draw(st.integers(0, cur))
        bounds[role] = (lo, hi)
        roles[role] = RoleObservation(
            replicas=cur, ready=ready,
            starting=draw(st.integers(0, cur - ready)),
            unschedulable=draw(st.integers(0, 2)),
            waiting=draw(maybe), running=draw(maybe), kv_usage=draw(maybe),
            ttft=draw(maybe), itl=draw(maybe), prompt_tokens_rate=draw(maybe),
            generation_tokens_rate=draw(maybe),
            sample_age=draw(st.one_of(st.none(), st.floats(0, 200))),
            request_rate=draw(maybe),
        )
    pol = policy(
        bounds=bounds,
        scale_to_zero=True,
        dead_band=draw(st.floats(0, 0.5)),
        scale_up=Behavior(draw(st.sampled_from([0, 60])), draw(st.integers(1, 5)),
                          draw(st.sampled_from([0, 30]))),
        scale_down=Behavior(draw(st.sampled_from([0, 300])), draw(st.integers(1, 5)),
                            draw(st.sampled_from([0, 60]))),
        prefill_tokens_per_replica=draw(st.one_of(st.none(), st.floats(1, 1e4))),
        decode_tokens_per_replica=draw(st.one_of(st.none(), st.floats(1, 1e4))),
    )
    obs = Observation(roles=roles, router_ttft=draw(maybe), router_inflight=draw(maybe),
                      local_prefill_rate=draw(maybe), kv_transfer_failure_rate=draw(maybe),
                      router_request_rate=draw(maybe))
    recs = tuple(
        Recommendation(NOW - draw(st.floats(1, 400)), draw(st.sampled_from(["prefill", "decode"])),
                       draw(st.integers(0, 20)))
        for _ in range(draw(st.integers(0, 4)))
    )
    h = History(recommendations=recs,
                started_at=draw(st.one_of(st.none(), st.floats(NOW - 600, NOW))))
    return obs, pol, h


@settings(max_examples=120, deadline=None)
@given(scenario())
def test_replicas_always_within_bounds(s: tuple[Observation, Policy, History]) -> None:
    obs, pol, h = s
    d = decide(obs, pol, h, NOW)
    for role, rd in d.roles.items():
        lo, hi = pol.bounds[role]
        assert lo <= rd.replicas <= hi, rd.message
        assert isinstance(rd.reason, Reason) and all(isinstance(st.reason, Reason)
                                                     for st in rd.steps)


@settings(max_examples=120, deadline=None)
@given(scenario())
def test_scale_down_never_exceeds_rate_limit(s: tuple[Observation, Policy, History]) -> None:
    obs, pol, h = s
    d = decide(obs, pol, h, NOW)
    for rd in d.roles.values():
        assert rd.current - rd.replicas <= pol.scale_down.max_step, rd.message


@settings(max_examples=120, deadline=None)
@given(scenario(), st.sampled_from(["waiting", "running", "kv_usage", "sample_age", "prom"]),
       st.sampled_from([None, NAN, 1e9, -1e9, math.inf, -math.inf]))
def test_missing_data_never_changes_replicas(
    s: tuple[Observation, Policy, History], what: str, bad: float | None
) -> None:
    obs, pol, h = s
    # KV-cache usage is a decode signal only; the others every role needs.
    hit = {"decode"} if what == "kv_usage" else {"prefill", "decode"}
    if what == "prom":
        obs = replace(obs, prometheus_error="timeout")
    else:
        value = 1e9 if what == "sample_age" else (NAN if bad == 1e9 else bad)
        if what == "sample_age" and bad is not None and bad < 0:
            value = bad  # an age from a clock in the future is no fresher than none
        obs = replace(obs, roles={r: replace(o, **{what: value}) if r in hit else o
                                  for r, o in obs.roles.items()})
    d = decide(obs, pol, h, NOW)
    for rd in (d.roles[r] for r in hit):
        if rd.current > 0:  # a role at zero only wakes on the router's requests
            assert rd.replicas == rd.current, rd.message
            if rd.reason != "NoReadyReplicas":
                assert d.metrics_available.status is False


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 12), st.floats(0.02, 0.5), st.data())
def test_within_dead_band_nothing_changes(cur: int, band: float,
                                          data: st.DataObject) -> None:
    pol = policy(bounds={"prefill": (1, 30), "decode": (1, 30)}, dead_band=band)
    u = st.floats(1 - band * 0.99, 1 + band * 0.99)
    ready = cur
    obs = pool(
        pre(cur, waiting=pol.prefill_queue_per_replica * ready * data.draw(u),
            ttft=pol.ttft_target * data.draw(st.floats(0, 1 + band * 0.99))),
        dec(cur, running=pol.decode_sequences_per_replica * ready * data.draw(u), waiting=0.0,
            kv_usage=pol.kv_cache_usage * data.draw(u),
            itl=pol.itl_target * data.draw(st.floats(0, 1 + band * 0.99))),
    )
    d: Decision = decide(obs, pol, WARM, NOW)
    for rd in d.roles.values():
        assert (rd.replicas, rd.reason) == (cur, "WithinDeadBand"), rd.message


def test_core_imports_no_io_library() -> None:
    # import-linter cannot see folders mapped into the package (autoscaler/ ->
    # poolpilot.autoscaler), so the no-I/O contract of the core is checked here.
    import ast
    from pathlib import Path

    import poolpilot.autoscaler.decide as core
    from poolpilot.autoscaler import frozen

    allowed = {"__future__", "math", "bisect", "itertools", "functools", "collections.abc",
               "dataclasses", "typing", "poolpilot.api", "poolpilot.reasons", "poolpilot.roles",
               "poolpilot.autoscaler", "poolpilot.autoscaler.frozen"}
    # the core is a package: each of its files, each importing only the others and the above
    files = sorted(Path(core.__file__ or "").parent.glob("*.py"))
    assert len(files) > 1
    allowed |= {f"poolpilot.autoscaler.decide.{f.stem}" for f in files}
    for path in [*files, Path(core.model.__file__ or ""), Path(frozen.__file__ or "")]:
        tree = ast.parse(path.read_text())
        imported = {
            (n.module or "") if isinstance(n, ast.ImportFrom) else a.name
            for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
            for a in n.names
        }
        assert imported <= allowed, (path.name, imported - allowed)


@dataclass
class RatioCase:
    id: str
    obs: Observation
    want: dict[str, tuple[int, str]]


# Throughputs known, but no request rate at prefill (so no prompt length, and no capacity
# model for prefill): the coupling falls back to the replica ratio, r* = (P/Cp) / (G/Cd) =
# (2000/2000) / (100/200) = 2 prefill replicas per decode replica, loosened by 1.5.
RATIO_POLICY = policy(prefill_tokens_per_replica=2000.0, decode_tokens_per_replica=200.0,
                      scale_down=FAST_DOWN, scale_up=Behavior(0, 16, 0))
RATIO_CASES = [
    RatioCase("decode-scale-up-pulls-prefill-up",
              pool(pre(2, waiting=0.0, prompt_tokens_rate=2000.0),
                   dec(4, kv_usage=1.0, generation_tokens_rate=100.0)),
              {"prefill": (7, "RatioFloor"), "decode": (5, "KVCacheAboveTarget")}),
    RatioCase("decode-at-rest-does-not-pull-prefill-up",
              pool(pre(2, waiting=0.0, prompt_tokens_rate=2000.0),
                   dec(4, kv_usage=0.8, generation_tokens_rate=100.0)),
              {"prefill": (2, "AtRecommendedSize"), "decode": (4, "WithinDeadBand")}),
]


@pytest.mark.parametrize("case", RATIO_CASES, ids=[c.id for c in RATIO_CASES])
def test_ratio_floor_follows_the_other_roles_scale_up_only(case: RatioCase) -> None:
    d = decide(case.obs, RATIO_POLICY, WARM, NOW)
    got = {r: (d.roles[r].replicas, d.roles[r].reason) for r in case.want}
    assert got == case.want, {r: d.roles[r].message for r in case.want}


def test_policy_defaults_are_the_apis_defaults() -> None:
    from_api = Policy.from_spec(parse_spec({"model": {"name": "m"}}))
    assert from_api == Policy(bounds=from_api.bounds)
    assert from_api.scale_down == Behavior(window=300, max_step=2, cooldown=60)


# --- the steps one by one -------------------------------------------------------------------

UP5 = Sized(5, Reason.QUEUE_ABOVE_TARGET)
DOWN1 = Sized(1, Reason.QUEUE_BELOW_TARGET)
STEP_POLICY = policy(scale_up=Behavior(60, 2, 30), scale_down=Behavior(300, 1, 60))


@dataclass
class StepCase:
    id: str
    step: Callable[[Sized], Sized]
    given: Sized
    want: tuple[int, Reason] | None  # None: the step does not act (returns its input)


def _stab(cur: int, h: History) -> Callable[[Sized], Sized]:
    return lambda s: stabilize(s, cur, "prefill", STEP_POLICY, h, NOW)


def _cool(cur: int, h: History) -> Callable[[Sized], Sized]:
    return lambda s: cool_down(s, cur, "prefill", STEP_POLICY, h, NOW)


def _pending(o: RoleObservation) -> Callable[[Sized], Sized]:
    return lambda s: hold_for_pending(s, o.replicas, "prefill", o)


STEP_CASES = [
    StepCase("bounds-within", lambda s: clamp_to_bounds(s, 1, 8), UP5, None),
    StepCase("bounds-max", lambda s: clamp_to_bounds(s, 1, 4), UP5, (4, Reason.CLAMPED_TO_MAX)),
    StepCase("bounds-min", lambda s: clamp_to_bounds(s, 2, 4), DOWN1, (2, Reason.CLAMPED_TO_MIN)),
    StepCase("stabilize-up-to-window-min", _stab(2, hist((30, "prefill", 3))), UP5,
             (3, Reason.SCALE_UP_STABILIZED)),
    StepCase("stabilize-down-to-window-max", _stab(4, hist((100, "prefill", 3))), DOWN1,
             (3, Reason.SCALE_DOWN_STABILIZED)),
    StepCase("stabilize-restart-holds-down", _stab(4, History.fresh(NOW - 5)), DOWN1,
             (4, Reason.STABILIZATION_WINDOW_FILLING)),
    StepCase("stabilize-empty-window", _stab(2, WARM), UP5, None),
    StepCase("rate-up", lambda s: limit_rate(s, 2, STEP_POLICY), UP5,
             (4, Reason.SCALE_UP_RATE_LIMITED)),
    StepCase("rate-down", lambda s: limit_rate(s, 4, STEP_POLICY), DOWN1,
             (3, Reason.SCALE_DOWN_RATE_LIMITED)),
    StepCase("rate-within", lambda s: limit_rate(s, 4, STEP_POLICY), UP5, None),
    StepCase("cooldown-up", _cool(4, History(last_scale={"prefill": NOW - 10})), UP5,
             (4, Reason.SCALE_UP_COOLDOWN)),
    StepCase("cooldown-down", _cool(4, History(last_scale={"prefill": NOW - 59})), DOWN1,
             (4, Reason.SCALE_DOWN_COOLDOWN)),
    StepCase("cooldown-over", _cool(4, History(last_scale={"prefill": NOW - 31})), UP5, None),
    StepCase("cooldown-other-role", _cool(4, History(last_scale={"decode": NOW})), UP5, None),
    StepCase("pending-starting", _pending(pre(4, ready=3, starting=1)), UP5,
             (4, Reason.WAITING_FOR_STARTING_REPLICAS)),
    StepCase("pending-unschedulable", _pending(pre(4, ready=3, unschedulable=1)), UP5,
             (4, Reason.UNSCHEDULABLE)),
    StepCase("pending-does-not-stop-scale-down", _pending(pre(4, ready=3, starting=1)), DOWN1,
             None),
]


@pytest.mark.parametrize("case", STEP_CASES, ids=[c.id for c in STEP_CASES])
def test_each_step_alone(case: StepCase) -> None:
    got = case.step(case.given)
    if case.want is None:
        assert got is case.given, got
    else:
        assert (got.replicas, got.reason) == case.want, got.detail


def test_every_reason_has_a_step_and_a_description() -> None:
    assert set(DESCRIPTION) == set(Reason) == set(STEP_OF)
