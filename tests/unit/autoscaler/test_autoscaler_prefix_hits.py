"""Prefill sized from the prompt tokens the engines compute: those their prefix cache does not
serve. A warm pool is not over-sized; a missing hit-rate series is today's decision exactly.

Pools as in test_autoscaler_capacity: 1,000-token prompts, prefill replicas of 8,000 computed
prompt tokens/s (the spec's seed), headroom 0.2 (6,400/s usable), a 60 s backlog drain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.autoscaler.decide import (
    MAX_HIT_RATE,
    Behavior,
    History,
    Observation,
    Policy,
    RoleObservation,
    decide,
)

NOW = 10_000.0
FREE = Behavior(window=0, max_step=16, cooldown=0)


def pre(n: int, rate: float, hit: float | None = None, **kw: Any) -> RoleObservation:
    """n prefill replicas fed `rate` prompt tokens/s (1,000-token prompts, one running each)."""
    base: dict[str, Any] = dict(waiting=0.0, running=1.0 * n, prompt_tokens_rate=rate,
                                request_rate=rate / 1000, ttft=0.3, prefix_hit_rate=hit)
    base.update(kw)
    return RoleObservation(replicas=n, **base)


def dec(n: int = 2) -> RoleObservation:
    return RoleObservation(replicas=n, waiting=0.0, running=32.0 * n, kv_usage=0.3,
                           generation_tokens_rate=1000.0 * n, itl=0.02)


def policy(**kw: Any) -> Policy:
    base: dict[str, Any] = dict(bounds={"prefill": (1, 32), "decode": (1, 16)},
                                prefill_tokens_per_replica=8000.0,
                                decode_tokens_per_replica=2000.0,
                                scale_up=FREE, scale_down=FREE)
    base.update(kw)
    return Policy(**base)


@dataclass(frozen=True)
class Case:
    id: str
    prefill: RoleObservation
    want: tuple[int, str]


CASES = [
    # 6 replicas, 24k prompt tokens/s: without a cache 3.8 replicas' work -> 4
    Case("no-cache-information-sizes-every-prompt-token", pre(6, 24_000.0), (4, "CapacityIdle")),
    # the same traffic, 75 % of it served from the cache: 6k computed + 1.5k backlog -> 1
    Case("a-warm-pool-is-sized-for-what-it-computes", pre(6, 24_000.0, hit=0.75),
         (1, "CapacityIdle")),
    # a hit rate of 1 is believed only up to 0.95: 4,800 computed tokens/s -> 0.8 -> 1
    Case("a-perfect-hit-rate-is-capped", pre(8, 96_000.0, hit=1.0), (1, "CapacityIdle")),
    # a scale-up too: 2 saturated replicas, 64k/s at 50 %, 20 waiting: 32k computed/s plus
    # the backlog a cold start builds -> 10; without the cache's help twice the work (the
    # rate limit stops it at +16)
    Case("a-scale-up-orders-for-the-uncached-tokens", pre(2, 64_000.0, hit=0.5, waiting=20.0),
         (10, "DemandAboveCapacity")),
    Case("a-scale-up-without-cache-information", pre(2, 64_000.0, waiting=20.0),
         (18, "ScaleUpRateLimited")),
]


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_prefill_is_sized_for_the_tokens_the_cache_does_not_serve(c: Case) -> None:
    d = decide(Observation(roles={"prefill": c.prefill, "decode": dec()}), policy(),
               History(), NOW)
    rd = d.roles["prefill"]
    assert (rd.replicas, rd.reason) == c.want, rd.message


def arriving(t0: float, whole: list[float], hits: list[float]) -> tuple[Any, ...]:
    """Demand samples 15 s apart ending 15 s before NOW: prompt tokens/s arriving, each with
    the share its engines computed at that sample's hit rate."""
    from poolpilot.autoscaler import capacity as model

    return tuple(model.Sample(t0 + 15.0 * i, w, 0.0, w * (1 - h))
                 for i, (w, h) in enumerate(zip(whole, hits, strict=True)))


def with_samples(samples: tuple[Any, ...]) -> History:
    from poolpilot.autoscaler import capacity as model

    return History(memory={"prefill": model.Memory(first_seen=0.0, samples=samples)})


def test_a_rising_demand_is_forecast_in_computed_tokens() -> None:
    """Prompt tokens arriving rise by 1,000/s every 15 s, half of them computed: the trend
    (66.7 tokens/s per second) at the history's 50 % is 4,000/s more within the cold start on
    8,000 computed now -> 12,000 / 6,400 -> 2 replicas (without the cache: 24,000 -> 4)."""
    samples = arriving(NOW - 150.0, [6_000.0 + 1_000.0 * i for i in range(10)], [0.5] * 10)
    obs = Observation(roles={"prefill": pre(3, 16_000.0, hit=0.5, running=0.0),
                             "decode": dec()})
    rd = decide(obs, policy(), with_samples(samples), NOW).roles["prefill"]
    assert rd.replicas == 2, rd.message
    assert "in 120s 1.2e+04/s" in rd.message


def test_a_cache_warming_up_does_not_hide_a_rising_demand() -> None:
    """A pool's opening: the prompt tokens arriving double over 150 s while the hit rate warms
    from 50 % to 75 %, so the tokens computed stay at 5,000/s. One replica serves that now
    (0.78 of its 6,400), but the arrivals' trend, at the 33 % of them the pool computed, is
    2,700/s more computed within the cold start: a second replica is ordered now, not once
    the cache has stopped warming and the computed tokens start to rise."""
    whole = [10_000.0 + 1_000.0 * i for i in range(10)]
    hits = [1 - 5_000.0 / w for w in whole]
    obs = Observation(roles={"prefill": pre(1, 20_000.0, hit=0.75, running=0.0),
                             "decode": dec()})
    rd = decide(obs, policy(), with_samples(arriving(NOW - 150.0, whole, hits)),
                NOW).roles["prefill"]
    assert (rd.replicas, rd.reason.value) == (2, "DemandRising"), rd.message


def test_cold_replicas_joining_are_no_rise_to_keep_room_for() -> None:
    """Half an hour of 16,000 prompt tokens/s arriving at a 70 % hit rate, then new replicas
    join with cold caches and the hit rate falls to 40 % for the last 4 minutes: 9,600
    computed/s now, 1.5 replicas' work -> 2. The arrivals did not rise, so the margin for
    rises stays 0; kept in computed tokens, the cache's fall read as a rise of 4,800/s that
    held a third replica for as long as it stayed in the history."""
    n = 120
    hits = [0.7] * (n - 16) + [0.4] * 16
    samples = arriving(NOW - 15.0 * n, [16_000.0] * n, hits)
    obs = Observation(roles={"prefill": pre(3, 16_000.0, hit=0.4, running=0.0),
                             "decode": dec()})
    rd = decide(obs, policy(), with_samples(samples), NOW).roles["prefill"]
    assert "(may rise 0/s)" in rd.message
    assert (rd.replicas, rd.reason.value) == (2, "CapacityIdle"), rd.message


@pytest.mark.parametrize("hit", [None, math.nan, -0.1, math.inf, 0.0],
                         ids=["no-series", "nothing-looked-up", "negative", "infinite", "zero"])
def test_no_usable_hit_rate_is_todays_decision_exactly(hit: float | None) -> None:
    """No cache information is no hit: the same decision, message and memory as without the
    field; never a hold, never MetricsUnavailable."""
    for obs in (pre(6, 24_000.0), pre(2, 64_000.0, waiting=30.0), pre(3, 0.0, running=0.0)):
        today = decide(Observation(roles={"prefill": obs, "decode": dec()}), policy(),
                       History(), NOW)
        with_hit = decide(Observation(roles={"prefill": replace(obs, prefix_hit_rate=hit),
                                             "decode": dec()}), policy(), History(), NOW)
        assert with_hit.roles == today.roles
        assert with_hit.history == today.history
        assert with_hit.metrics_available == today.metrics_available


def test_capacity_is_learned_in_computed_tokens() -> None:
    """A saturated pool serving 12k prompt tokens/s on 2 replicas at a 50 % hit rate computes
    3,000 tokens/s per replica: that is what is learned (6,000 would be divided by the hit
    rate a second time when the demand is)."""
    p = policy(prefill_tokens_per_replica=None)
    busy = Observation(roles={"prefill": pre(2, 12_000.0, hit=0.5, waiting=20.0),
                              "decode": dec()})
    h = History()
    for t in (0.0, 15.0, 30.0, 45.0, 60.0):
        h = decide(busy, p, h, NOW + t).history
    assert h.capacity["prefill"] == pytest.approx(3000.0)


def test_the_ratio_rule_couples_computed_prompt_tokens() -> None:
    """Decode's floor from prefill's rising demand counts generated tokens per computed prompt
    token: the cache does not change what decode has to generate."""
    obs = Observation(roles={"prefill": pre(3, 32_000.0, hit=0.5, running=0.0),
                             "decode": dec(1)})
    cold = Observation(roles={"prefill": pre(3, 16_000.0, running=0.0), "decode": dec(1)})
    a = decide(obs, policy(), History(), NOW)
    b = decide(cold, policy(), History(), NOW)
    assert a.roles["decode"].replicas == b.roles["decode"].replicas
    assert a.roles["prefill"].replicas == b.roles["prefill"].replicas


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 16), rate=st.floats(0, 200_000), waiting=st.floats(0, 200),
       lo=st.floats(0, 1), hi=st.floats(0, 1))
def test_more_hits_never_need_more_prefill(n: int, rate: float, waiting: float, lo: float,
                                           hi: float) -> None:
    lo, hi = min(lo, hi), max(lo, hi)
    sizes = []
    for hit in (lo, hi):
        obs = Observation(roles={"prefill": pre(n, rate, hit=hit, waiting=waiting),
                                 "decode": dec()})
        sizes.append(decide(obs, policy(), History(), NOW).roles["prefill"].replicas)
    assert sizes[1] <= sizes[0]
    assert MAX_HIT_RATE < 1
