"""The burst room (autoscaler/decide/burst.py): capacity kept for clumps no scale-up can
follow, sized from the queues the pool has seen, not from the look-ahead horizon.

The pools below: 1,000-token prompts, prefill replicas of 8,000 prompt tokens/s, a TTFT
target of 1 s, decisions every 15 s, no stabilization window or cooldown (so what a test
sees is the model's size, not the clock's)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.autoscaler import capacity as model
from poolpilot.autoscaler.decide import (
    Behavior,
    Clumps,
    History,
    Observation,
    Policy,
    RoleObservation,
    decide,
)
from poolpilot.autoscaler.decide import burst as b
from poolpilot.autoscaler.loop import Autoscaler
from poolpilot.autoscaler.queries import QuerySet

from poolpilot.clock import Clock
from poolpilot.validate import parse_spec

FREE = Behavior(window=0, max_step=16, cooldown=0)
STEP = 15.0


def policy(**kw: Any) -> Policy:
    base: dict[str, Any] = dict(bounds={"prefill": (1, 16), "decode": (1, 16)},
                                prefill_tokens_per_replica=8000.0,
                                decode_tokens_per_replica=2000.0,
                                scale_up=FREE, scale_down=FREE, cold_start=60.0,
                                slo_quantile=0.95)
    base.update(kw)
    return Policy(**base)


def obs(replicas: int, rate: float, waiting: float = 0.0, starting: int = 0) -> Observation:
    """Prefill serving `rate` prompt tokens/s of 1,000-token prompts, `waiting` queued."""
    pre = RoleObservation(replicas=replicas, ready=replicas - starting, starting=starting,
                          waiting=waiting, running=0.0, prompt_tokens_rate=rate,
                          request_rate=rate / 1000.0, ttft=0.3)
    dec = RoleObservation(replicas=1, waiting=0.0, running=8.0, kv_usage=0.2,
                          generation_tokens_rate=500.0, itl=0.02)
    return Observation(roles={"prefill": pre, "decode": dec})


def run(p: Policy, samples: list[tuple[float, float]], start: int = 2,
        ) -> tuple[list[int], History]:
    """Decide once per (rate, waiting), every STEP seconds, applying every decision; the
    prefill sizes decided, and the history after the last."""
    h, n, sizes = History.warm(), start, []
    for i, (rate, waiting) in enumerate(samples):
        d = decide(obs(n, rate, waiting), p, h, now=1000.0 + i * STEP)
        n = d.replicas["prefill"]
        h = d.history.scaled([r for r, x in d.roles.items() if x.replicas != x.current],
                             1000.0 + i * STEP)
        sizes.append(n)
    return sizes, h


def room_of(h: History, p: Policy) -> float:
    clumps = h.clumps.get("prefill", Clumps())
    return b.room(clumps.peaks, p.slo_quantile, 8000.0)


# --- the arithmetic ---------------------------------------------------------------------------


def test_a_new_queue_needs_what_serves_it_within_the_target() -> None:
    # 40,000 tokens queued against a 1 s target: 40,000 tokens/s, above the 10,000/s demand
    assert b.seconds_demand(10_000.0, 40_000.0, 1.0) == 40_000.0
    # no queue, or one that the demand's own rate already drains in time: the demand
    assert b.seconds_demand(10_000.0, 0.0, 1.0) == 10_000.0
    assert b.seconds_demand(10_000.0, 5_000.0, 1.0) == 10_000.0


def test_each_minute_keeps_its_peak_and_old_minutes_go() -> None:
    peaks: tuple[b.Peak, ...] = ()
    for t, x in ((0.0, 5.0), (15.0, 9.0), (30.0, 7.0), (60.0, 3.0)):
        peaks = b.remember(peaks, t, x)
    assert [(p.start, p.demand) for p in peaks] == [(0.0, 9.0), (60.0, 3.0)]
    later = b.remember(peaks, b.WINDOW + 61.0, 1.0)
    assert [p.start for p in later] == [60.0, b.WINDOW + 60.0]


def test_the_room_is_the_quantile_of_the_minutes_peaks() -> None:
    peaks = tuple(b.Peak(60.0 * i, 8000.0 * (i + 1)) for i in range(20))  # 1..20 replicas
    assert b.room(peaks, 0.95, 8000.0) == 19.0  # 19 of 20 minutes stay within 19 replicas
    assert b.room(peaks, 1.0, 8000.0) == 20.0
    assert b.room((), 0.95, 8000.0) == 0.0
    assert b.room(peaks, 0.95, 0.0) == 0.0


def test_a_queue_that_was_already_there_is_no_new_clump() -> None:
    idle = b.observe(Clumps(), 0.0, 8000.0, 0.0, 1.0, settled=True)
    first = b.observe(idle, 15.0, 8000.0, 40_000.0, 1.0, settled=True)
    again = b.observe(first, 30.0, 8000.0, 40_000.0, 1.0, settled=True)
    assert [p.demand for p in again.peaks] == [40_000.0]  # the minute's peak from the first
    next_minute = b.observe(again, 60.0, 8000.0, 40_000.0, 1.0, settled=True)
    assert next_minute.peaks[-1].demand == 8000.0


def test_the_queue_a_new_autoscaler_finds_is_its_backlog_not_a_clump() -> None:
    # A restart (or the first decision) sees a queue of unknown age: one sample must not set
    # the room; the next queue that forms under its eyes does.
    found = b.observe(Clumps(), 0.0, 8000.0, 40_000.0, 1.0, settled=True)
    assert [p.demand for p in found.peaks] == [8000.0] and found.waiting == 40_000.0
    grew = b.observe(found, 15.0, 8000.0, 80_000.0, 1.0, settled=True)
    assert grew.peaks[-1].demand == 40_000.0


def test_a_queue_while_replicas_start_is_their_shortage_not_a_clump() -> None:
    c = b.observe(Clumps(), 0.0, 8000.0, 40_000.0, 1.0, settled=False)
    assert c.peaks[-1].demand == 8000.0


def test_a_queue_grown_while_replicas_arrived_is_no_clump_either() -> None:
    # Replicas were starting at the previous decision and are ready at this one: how much of
    # the queue they drained depends on when they arrived, so the growth measures nothing.
    starting = b.observe(Clumps(), 0.0, 8000.0, 10_000.0, 1.0, settled=False)
    arrived = b.observe(starting, 15.0, 8000.0, 50_000.0, 1.0, settled=True)
    assert arrived.peaks[-1].demand == 8000.0
    # settled at both ends: the growth is a clump
    later = b.observe(arrived, 30.0, 8000.0, 90_000.0, 1.0, settled=True)
    assert later.peaks[-1].demand == 40_000.0


# --- what decide makes of it ------------------------------------------------------------------


def test_a_pool_that_saw_clumps_queue_keeps_room_for_them() -> None:
    # 8,000 tokens/s on 2 replicas (50 %), and once a clump of 40 prompts queued: after it,
    # the demand alone needs 2, the room keeps 5 (40,000 tokens within 1 s on 8,000/s each)
    clump = [(8000.0, 0.0)] * 4 + [(8000.0, 40.0)] + [(8000.0, 0.0)] * 12
    with_room, h = run(policy(), clump)
    without, _ = run(policy(burst_room=False), clump)
    assert with_room[-1] == 5 and room_of(h, policy()) == pytest.approx(5.0)
    assert without[-1] == 2
    decision = decide(obs(5, 8000.0), policy(), h, now=2000.0).roles["prefill"]
    assert "burst room 5.00" in decision.message


@settings(max_examples=60, deadline=None)
@given(rate=st.floats(1000.0, 100_000.0), n=st.integers(1, 40))
def test_the_room_is_zero_on_a_perfectly_steady_demand(rate: float, n: int) -> None:
    # no queue at any decision: the room adds nothing to what the demand needs
    samples = [(rate, 0.0)] * n
    assert run(policy(), samples)[0] == run(policy(burst_room=False), samples)[0]


@settings(max_examples=60, deadline=None)
@given(samples=st.lists(st.tuples(st.floats(0.0, 50_000.0), st.floats(0.0, 200.0)),
                        min_size=1, max_size=30),
       longer=st.floats(20.0, 600.0), shorter_share=st.floats(0.05, 1.0))
def test_the_room_never_shrinks_when_the_cold_start_shrinks(
        samples: list[tuple[float, float]], longer: float, shorter_share: float) -> None:
    # the same observations (pools of the same size) under a longer and a shorter cold start
    slow, fast = policy(cold_start=longer), policy(cold_start=longer * shorter_share)
    h_slow = h_fast = History.warm()
    for i, (rate, waiting) in enumerate(samples):
        o, now = obs(4, rate, waiting), 1000.0 + i * STEP
        h_slow = decide(o, slow, h_slow, now).history
        h_fast = decide(o, fast, h_fast, now).history
        assert room_of(h_fast, fast) >= room_of(h_slow, slow) - 1e-9


def test_the_room_orders_a_scale_up_too() -> None:
    # a pool of 1 that saw a clump of 24 prompts queue orders the 3 that serve it in time
    sizes, _ = run(policy(), [(4000.0, 0.0), (4000.0, 24.0)], start=1)
    assert sizes == [1, 3]


def test_bench_ablation_is_the_old_core() -> None:
    # room off: History.clumps stays empty, whatever queues
    _, h = run(replace(policy(), burst_room=False), [(8000.0, 40.0)] * 3)
    assert h.clumps == {}


# --- the rises the forecast keeps: seen through the rate window, acted on a decision later ----


def test_a_short_cold_start_still_rides_out_a_rise_the_rate_window_spreads() -> None:
    # a clump seen through a 60 s rate rises over four 15 s samples (16k -> 22k), again and
    # again; with a 15 s cold start a replica ordered at the rise's start lands when the
    # signals have shown a quarter of it, so the pool keeps the whole rise: 22k / 6.4k -> 4
    wave = [16_000.0, 17_500.0, 19_000.0, 20_500.0, 22_000.0] + [16_000.0] * 7
    samples = tuple(model.Sample(1000.0 - (72 - i) * STEP, v, 0.0)
                    for i, v in enumerate(wave * 6))
    h = History(memory={"prefill": model.Memory(first_seen=0.0, samples=samples)})
    p = policy(cold_start=15.0, slo_quantile=0.9, burst_room=False)
    d = decide(obs(3, 16_000.0), p, h, now=1000.0)
    assert d.replicas["prefill"] == 4, d.roles["prefill"].message


def slow_rises(period: int = 16) -> History:
    """A demand that climbs 16k -> 26.4k tokens/s over two minutes, again and again."""
    wave = [16_000.0 + 1_300.0 * i for i in range(9)] + [16_000.0] * (period - 9)
    samples = tuple(model.Sample(1000.0 - (len(wave) * 6 - i) * STEP, v, 0.0)
                    for i, v in enumerate(wave * 6))
    return History(memory={"prefill": model.Memory(first_seen=0.0, samples=samples)})


@pytest.mark.parametrize("cold_start", [45.0, 30.0, 20.0, 5.0])
def test_a_start_faster_than_the_rate_window_keeps_the_margin_of_one_that_long(
        cold_start: float) -> None:
    """Found by the bench's cold-start sweep (code x4 on 8B lost a point from 60 to 30 s): the
    margin for rises over a shorter reaction kept a replica fewer through rises that then
    queued. A start faster than the rate window brings ordered replicas sooner and keeps the
    margin it would keep at one rate window."""
    def size(c: float) -> int:
        p = policy(cold_start=c, slo_quantile=0.9, burst_room=False)
        return decide(obs(3, 16_000.0), p, slow_rises(), now=1000.0).replicas["prefill"]

    assert size(cold_start) == size(60.0) == 5


def test_the_reaction_time_follows_the_pool_and_the_sandbox_clock() -> None:
    """The rate window (a PromQL range, real seconds) is the policy's in simulated seconds;
    the pool's interval is simulated seconds already, whatever the sandbox's --speed."""
    obj: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": "p", "uid": "u", "generation": 1},
        "spec": {"model": {"name": "m"}, "runtime": {"image": "i"},
                 "mode": "Disaggregated", "prefill": {"replicas": 1}, "decode": {"replicas": 1},
                 "autoscaling": {"enabled": True, "intervalSeconds": 30}},
    }
    p = Policy.from_spec(parse_spec(obj["spec"]))
    assert (p.interval, p.rate_window) == (30.0, 60.0)
    for rate in (1.0, 8.0):
        kube: Any = None  # (not asked)
        source: Any = SimpleNamespace(query_set=QuerySet(window_seconds=60.0 / rate))
        scaler = Autoscaler(kube, source, clock=Clock(rate))
        policy = scaler._spec(obj).policy
        assert (policy.interval, policy.rate_window) == (30.0, 60.0)
