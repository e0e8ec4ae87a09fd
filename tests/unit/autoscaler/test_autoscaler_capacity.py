"""The capacity model: its arithmetic alone, then what `decide` makes of it, as tables.

Prefill's unit is prompt tokens, decode's generated tokens; the pools below have prompts of
1,000 tokens (prompt rate / request rate), prefill replicas of 8,000 prompt tokens/s and decode
replicas of 2,000 generated tokens/s (the spec's seeds), a 120 s cold start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from poolpilot.autoscaler import capacity as model
from poolpilot.autoscaler.decide import (
    Behavior,
    History,
    Observation,
    Policy,
    RoleObservation,
    decide,
)

NOW = 10_000.0
S = model.Sample


def pre(n: int = 2, **kw: Any) -> RoleObservation:
    """Prefill at half its capacity: 4,000 prompt tokens/s per replica, 1,000-token prompts."""
    base: dict[str, Any] = dict(waiting=0.0, running=1.0 * n, prompt_tokens_rate=4000.0 * n,
                                request_rate=4.0 * n, ttft=0.3)
    base.update(kw)
    return RoleObservation(replicas=n, **base)


def dec(n: int = 1, **kw: Any) -> RoleObservation:
    base: dict[str, Any] = dict(waiting=0.0, running=32.0 * n, kv_usage=0.3,
                                generation_tokens_rate=1000.0 * n, itl=0.02)
    base.update(kw)
    return RoleObservation(replicas=n, **base)


def pool(prefill: RoleObservation | None = None, decode: RoleObservation | None = None,
         **kw: Any) -> Observation:
    return Observation(roles={"prefill": prefill or pre(), "decode": decode or dec()}, **kw)


FREE = Behavior(window=0, max_step=16, cooldown=0)


def policy(**kw: Any) -> Policy:
    base: dict[str, Any] = dict(bounds={"prefill": (1, 16), "decode": (1, 16)},
                                prefill_tokens_per_replica=8000.0,
                                decode_tokens_per_replica=2000.0,
                                scale_up=FREE, scale_down=FREE)
    base.update(kw)
    return Policy(**base)


def history(**memory: model.Memory) -> History:
    return History(memory=memory)


def rates(*values: float, step: float = 15.0, backlog: float = 0.0) -> tuple[model.Sample, ...]:
    """Demand samples ending one step before NOW, one every `step` seconds."""
    n = len(values)
    return tuple(S(NOW - (n - i) * step, v, backlog) for i, v in enumerate(values))


# --- the arithmetic ---------------------------------------------------------------------------


def test_track_starts_learns_the_cold_start_from_pods() -> None:
    m = model.track_starts(model.Memory(), replicas=2, ready=2, now=0.0)
    m = model.track_starts(m, replicas=5, ready=2, now=15.0)  # scaled at the decision at 0
    assert m.orders == (0.0, 0.0, 0.0)
    m = model.track_starts(m, replicas=5, ready=4, now=90.0)  # two became ready
    assert m.orders == (0.0,) and m.cold_start == pytest.approx(90.0)
    m = model.track_starts(m, replicas=4, ready=4, now=105.0)  # the starting one cancelled
    assert m.orders == () and m.cold_start == pytest.approx(90.0)
    m = model.track_starts(m, replicas=5, ready=4, now=120.0)
    m = model.track_starts(m, replicas=5, ready=5, now=255.0)
    assert m.cold_start == pytest.approx(90.0 + model.COLD_START_ALPHA * (150.0 - 90.0))


@dataclass
class Arith:
    id: str
    got: float
    want: float


ARITH = [
    Arith("growth-of-the-backlog-per-second", model.backlog_growth(
        (S(NOW - 30, 0, 10_000), S(NOW - 15, 0, 20_000)), NOW, 40_000), 1000.0),
    Arith("a-shrinking-backlog-adds-no-demand", model.backlog_growth(
        (S(NOW - 30, 0, 40_000),), NOW, 10_000), 0.0),
    Arith("trend-of-a-linear-rise", model.trend(rates(*range(1000, 2100, 100)), 300), 100 / 15),
    Arith("a-trend-from-three-samples-over-30-s", model.trend(rates(1, 2, 3), 300), 1 / 15),
    Arith("no-trend-from-two-samples", model.trend(rates(1, 2), 300), 0.0),
    Arith("no-trend-from-samples-over-less-than-30-s",
          model.trend(rates(1, 2, 3, 4, step=9.0), 300), 0.0),
    # over 300 s, rises within 120 s: a saw tooth 10k -> 16k every 150 s rises by 6k
    Arith("upside-of-a-saw-tooth", model.upside(
        rates(*([10_000, 12_000, 14_000, 16_000, 10_000, 10_000, 10_000, 10_000, 10_000, 10_000]
                * 3)), NOW, 120, 0.9), 6000.0),
    Arith("no-upside-without-a-horizon-of-history", model.upside(
        rates(10_000, 20_000), NOW, 120, 0.9), 0.0),
    # 2 ready for 120 s, one ordered 90 s ago (serves the last 90 s), one whose order this
    # model never saw (assumed half-way: 60 s)
    Arith("served-within-the-horizon", model.served_within(
        1000, ready=2, starting=2, orders=(NOW - 90,), now=NOW, horizon=120),
        1000 * (240 + 90 + 60)),
]


@pytest.mark.parametrize("c", ARITH, ids=[c.id for c in ARITH])
def test_arithmetic(c: Arith) -> None:
    assert c.got == pytest.approx(c.want)


def test_need_orders_only_the_backlog_the_replicas_on_the_way_will_not_drain() -> None:
    # 24k tokens/s arriving, 2 ready + 2 starting (landing in 30 s) of 8k tokens/s, 200k queued.
    # Within the next 120 s they serve 8k x (240 + 2 x 90) = 3.36M, arrivals bring 2.88M: the
    # backlog is gone before a replica ordered now could land, so nothing more is needed for
    # it (3.75 replicas at 80 % for the demand alone), although draining it within 60 s *now*
    # would take 4.4.
    n = model.need(8000, 24_000, 200_000, 0.0, 120, 60, 0.2, ready=2, starting=2,
                   orders=(NOW - 90, NOW - 90), now=NOW)
    assert n.backlog_ahead == 0 and n.ahead == pytest.approx(24_000 / 6400)
    assert n.now == pytest.approx((24_000 + 200_000 / 60) / 6400)
    # The same backlog with both starting replicas ordered just now: 8k x (240 + 0) = 1.92M
    # served, 2.88M arrive + 0.2M queued -> 1.16M left, to drain in 60 s on top of the demand.
    late = model.need(8000, 24_000, 200_000, 0.0, 120, 60, 0.2, ready=2, starting=2,
                      orders=(NOW, NOW), now=NOW)
    assert late.backlog_ahead == pytest.approx(1_160_000)
    assert late.ahead == pytest.approx((24_000 + 1_160_000 / 60) / 6400)


@dataclass
class HeadroomCase:
    id: str
    utilization: float
    latency: float
    queued: bool
    want: float


HEADROOM = [
    HeadroomCase("breach-below-target-utilization-with-a-queue", 0.6, 1.5, True, 0.25),
    HeadroomCase("breach-without-a-queue-long-prompts", 0.6, 1.5, False, 0.2),
    HeadroomCase("breach-above-target-utilization-too-much-load-not-too-little-margin",
                 0.9, 1.5, True, 0.2),
    HeadroomCase("fast-above-target-utilization", 0.9, 0.3, False, 0.18),
    HeadroomCase("fast-below-it-says-nothing", 0.5, 0.3, False, 0.2),
    HeadroomCase("near-target-stays", 0.9, 1.0, True, 0.2),
]


@pytest.mark.parametrize("c", HEADROOM, ids=[c.id for c in HEADROOM])
def test_headroom_is_learned_from_the_slo(c: HeadroomCase) -> None:
    got = model.learn_headroom(0.2, c.utilization, c.latency, 1.0, 0.1, c.queued)
    assert got == pytest.approx(c.want)


# --- what decide makes of it ------------------------------------------------------------------


@dataclass
class Case:
    id: str
    obs: Observation
    want: dict[str, tuple[int, str]]
    policy: Policy = field(default_factory=policy)
    history: History = field(default_factory=History)
    limited: str | None = None


CASES = [
    Case("prefill-sized-by-demand-and-backlog-not-by-its-queue",
         # 2 replicas (16k/s) for 24k/s with 20k queued: in the 120 s before a new replica
         # lands the backlog grows to 980k, to drain in 60 s: (24k + 16.3k) / 6.4k -> 7
         # (the queue proxy, 2 waiting per replica, would ask for 10)
         pool(pre(2, waiting=18.0, running=2.0, prompt_tokens_rate=24_000.0,
                  request_rate=24.0)),
         {"prefill": (7, "DemandAboveCapacity")}),
    Case("replicas-on-the-way-are-not-ordered-twice",
         # 2 ready + 2 starting for 24k/s with 200k queued: the starting ones drain it
         pool(pre(4, ready=2, starting=2, waiting=198.0, running=2.0,
                  prompt_tokens_rate=16_000.0, request_rate=16.0),
              dec(2, ready=2)),
         {"prefill": (4, "CapacityNeeded")},
         history=History(memory={"prefill": model.Memory(seen=(NOW - 15, 4, 2),
                                                         orders=(NOW - 90, NOW - 90))})),
    Case("starting-replicas-do-not-block-what-the-model-still-misses",
         pool(pre(4, ready=2, starting=2, waiting=998.0, running=2.0,
                  prompt_tokens_rate=16_000.0, request_rate=16.0)),
         # 1M queued; the 2 starting (105 s to go) and 2 ready serve 2.16M in 120 s while
         # 1.92M arrive: 0.76M left, (16k + 12.7k) / 6.4k -> 5, one more while they start
         {"prefill": (5, "DemandAboveCapacity")},
         history=History(memory={"prefill": model.Memory(seen=(NOW - 15, 4, 2),
                                                         orders=(NOW - 15, NOW - 15))})),
    Case("idle-capacity-goes-at-once",
         pool(pre(6, prompt_tokens_rate=8000.0, request_rate=8.0)),
         {"prefill": (2, "CapacityIdle")}),
    Case("a-need-within-the-dead-band-keeps-the-size",
         # 3 replicas, 17k/s + 3k queued -> 2.7 replicas: within 10 % of 3, no direction change
         pool(pre(3, prompt_tokens_rate=17_000.0, request_rate=17.0)),
         {"prefill": (3, "CapacityNeeded")}),
    Case("zero-traffic-still-scales-down",
         pool(pre(3, running=0.0, prompt_tokens_rate=0.0, request_rate=0.0, ttft=math.nan),
              dec(2, running=0.0, kv_usage=0.0, generation_tokens_rate=0.0, itl=math.nan)),
         {"prefill": (1, "ClampedToMin"), "decode": (1, "ClampedToMin")},
         history=History(memory={"prefill": model.Memory(tokens_per_request=1000.0)})),
    Case("a-rising-trend-orders-a-cold-start-ahead",
         # +1,000 tokens/s every 15 s: in 120 s 8k more than the 16k now -> 24k / 6.4k = 3.75
         # (16k alone: 2.5 -> 3)
         pool(pre(3, running=0.0, prompt_tokens_rate=16_000.0, request_rate=16.0)),
         {"prefill": (4, "DemandRising")},
         history=History(memory={"prefill": model.Memory(
             first_seen=0.0, samples=rates(*range(6_000, 16_000, 1000)))})),
    Case("rises-seen-within-a-cold-start-are-kept-as-margin",
         # demand has jumped by 6k within 2 minutes again and again: keep 16k + 6k
         pool(pre(3, running=0.0, prompt_tokens_rate=16_000.0, request_rate=16.0)),
         {"prefill": (4, "DemandRising")},  # 22k / 6.4k = 3.4 (16k alone: 2.5)
         history=History(memory={"prefill": model.Memory(first_seen=0.0, samples=rates(
             *([16_000, 22_000, 16_000, 16_000, 16_000, 16_000, 16_000, 16_000] * 6)))})),
    Case("local-prefill-on-decode-counts-as-prompt-demand",
         # prefill serves 8k/s, the router prefilled 8 more requests/s on decode engines
         pool(pre(2, running=0.0, prompt_tokens_rate=8000.0, request_rate=8.0),
              local_prefill_rate=8.0),
         {"prefill": (3, "DemandAboveCapacity")}),
    Case("a-long-prompt-ttft-breach-without-a-queue-orders-nothing",
         pool(pre(2, ttft=4.0), router_ttft=4.0),
         {"prefill": (2, "CapacityNeeded")}),
    Case("decode-sized-by-generated-tokens-not-sequences-per-replica",
         # 300 sequences would be 5 replicas by the 64-per-replica proxy; 3k tokens/s of 2k each
         pool(decode=dec(3, running=300.0, generation_tokens_rate=3000.0)),
         {"decode": (2, "CapacityIdle")}),
    Case("an-itl-near-its-target-does-not-hold-idle-decode",
         pool(decode=dec(3, itl=0.048, generation_tokens_rate=3000.0)),
         {"decode": (2, "CapacityIdle")}),
    Case("an-itl-breach-still-scales-decode-up",
         pool(decode=dec(2, itl=0.08, generation_tokens_rate=2000.0)),
         {"decode": (4, "ITLAboveTarget")}),
    Case("a-late-first-token-with-handoffs-in-flight-is-no-decode-shortage",
         # prefill meets the target, 3 handoffs wait at decode, the router's TTFT is late:
         # decode's model (1,000 of 2,000 tokens/s) and KV cache (0.3) say decode is not short
         pool(pre(2, ttft=0.3), dec(1, waiting=3.0), router_ttft=2.0),
         {"decode": (1, "AtRecommendedSize")}),
    Case("decode-ordered-for-prompts-on-the-rise",
         # prompts rising to 24k in 120 s; 1,500 generated tokens per 16k prompt tokens: 2,250
         # generated tokens/s ahead -> 2 decode replicas before they arrive (1,500 now: 1)
         pool(pre(3, running=0.0, prompt_tokens_rate=16_000.0, request_rate=16.0),
              dec(1, generation_tokens_rate=1500.0)),
         {"prefill": (4, "DemandRising"), "decode": (2, "RatioFloor")},
         history=History(memory={"prefill": model.Memory(
             first_seen=0.0, samples=rates(*range(6_000, 16_000, 1000)))})),
    Case("failing-kv-handoffs-limit-scaling-instead-of-adding-replicas",
         pool(pre(2), router_ttft=5.0, router_request_rate=8.0, kv_transfer_failure_rate=2.0),
         {"prefill": (2, "CapacityNeeded")}, limited="KVTransferFailing"),
    Case("a-few-failed-handoffs-are-no-condition",
         pool(pre(2), router_request_rate=8.0, kv_transfer_failure_rate=0.2),
         {"prefill": (2, "CapacityNeeded")}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decide_with_the_capacity_model(case: Case) -> None:
    d = decide(case.obs, case.policy, case.history, NOW)
    got = {r: (d.roles[r].replicas, d.roles[r].reason) for r in case.want}
    assert got == case.want, {r: d.roles[r].message for r in case.want}
    if case.limited:
        assert (d.scaling_limited.status, d.scaling_limited.reason) == (True, case.limited)
    else:
        assert not d.scaling_limited.status, d.scaling_limited


def test_a_ttft_breach_without_capacity_model_still_scales_on_kv_failures_not() -> None:
    # No throughput known: the TTFT signal sizes prefill, except while handoffs fail.
    p = policy(prefill_tokens_per_replica=None, decode_tokens_per_replica=None)
    ok = decide(pool(pre(2), router_ttft=3.0), p, History(), NOW)
    assert ok.replicas["prefill"] == 6
    failing = decide(pool(pre(2), router_ttft=3.0, router_request_rate=8.0,
                          kv_transfer_failure_rate=4.0), p, History(), NOW)
    assert failing.replicas["prefill"] <= 2 and failing.roles["prefill"].reason != "TTFTAboveTarget"
    assert "KV handoffs" in failing.scaling_limited.message


def test_capacity_is_learned_over_a_saturated_rate_window_only() -> None:
    p = policy(prefill_tokens_per_replica=None)
    # A queue of 10 per replica: saturated, but a rate over a window that began before the
    # queue did holds idle seconds; no sample until it has lasted a rate window (60 s).
    busy = pool(pre(2, waiting=20.0, prompt_tokens_rate=12_000.0, request_rate=12.0))
    h = History()
    for t in (0.0, 15.0, 30.0, 45.0):
        h = decide(busy, p, h, NOW + t).history
        assert "prefill" not in h.capacity
    h = decide(busy, p, h, NOW + 60).history
    assert h.capacity["prefill"] == pytest.approx(6000.0)
    # A saturated sample below the estimate moves it by CAPACITY_ALPHA; one above while the
    # TTFT is met replaces it (the replicas served that much).
    h = decide(pool(pre(2, waiting=20.0, prompt_tokens_rate=10_000.0, request_rate=10.0)), p,
               h, NOW + 75).history
    assert h.capacity["prefill"] == pytest.approx(6000.0 - 0.3 * 1000.0)
    h = decide(pool(pre(2, prompt_tokens_rate=14_000.0, request_rate=14.0)), p, h,
               NOW + 90).history
    assert h.capacity["prefill"] == pytest.approx(7000.0)


def test_capacity_is_not_learned_from_a_window_in_which_replicas_landed() -> None:
    # 6 replicas saturated, 4 of them ready for only 15 s: the 60 s rate still holds the time
    # when 2 served, so rate / 6 would halve the estimate.
    p = policy(prefill_tokens_per_replica=8000.0)
    h = History(ready_seen={"prefill": (2, NOW - 600)})
    landed = pool(pre(6, waiting=60.0, prompt_tokens_rate=18_000.0, request_rate=18.0))
    for t in range(0, 90, 15):
        h = decide(landed, p, h, NOW + t).history
        assert h.capacity["prefill"] == 8000.0
    later = decide(landed, p, h, NOW + 90).history  # steady for 1.5 rate windows
    assert later.capacity["prefill"] == pytest.approx(8000.0 + 0.3 * (3000.0 - 8000.0))


def test_a_ttft_breach_without_a_queue_teaches_no_capacity() -> None:
    p = policy(prefill_tokens_per_replica=8000.0)
    h = History()
    for t in range(0, 180, 15):  # long prompts: TTFT 4 s, nothing queued, half-loaded
        h = decide(pool(pre(2, ttft=4.0)), p, h, NOW + t).history
    assert h.capacity["prefill"] == 8000.0
    assert h.memory["prefill"].headroom in (None, 0.2)


def test_the_cold_start_is_learned_and_sets_the_horizon() -> None:
    p = policy()
    h = History()
    h = decide(pool(pre(2)), p, h, NOW).history
    h = decide(pool(pre(4, ready=2, starting=2)), p, h, NOW + 15).history
    h = decide(pool(pre(4, ready=4)), p, h, NOW + 60).history
    assert h.memory["prefill"].cold_start == pytest.approx(60.0)
    d = decide(pool(pre(4, ready=4)), p, h, NOW + 75)
    assert "in 60s" in d.roles["prefill"].message or d.roles["prefill"].steps[-1].detail == ""


def test_memory_is_pure_and_bounded() -> None:
    p = policy()
    h = History()
    for t in range(0, 4000, 15):
        h = decide(pool(pre(2)), p, h, NOW + t).history
    mem = h.memory["prefill"]
    assert len(mem.samples) <= p.history_window / 15 + 1
    assert replace(mem) == mem


def test_a_bursts_queue_seen_at_an_earlier_scrape_teaches_headroom() -> None:
    # A burst's queue is drained by the next scrape more often than not, but its late first
    # tokens stay in the window's TTFT quantile: the breach is the queue's, not the prompts'.
    p = policy(prefill_tokens_per_replica=8000.0)
    h = History()
    for t in range(0, 120, 15):  # half-loaded, nothing queued, TTFT met
        h = decide(pool(pre(2)), p, h, NOW + t).history
    h = decide(pool(pre(2, waiting=10.0, running=2.0)), p, h, NOW + 120).history  # the burst
    h = decide(pool(pre(2, ttft=2.5)), p, h, NOW + 135).history  # queue gone, TTFT breached
    assert (h.memory["prefill"].headroom or 0) > 0.2
    # the same breach with no queue sampled within the rate window is the prompts' own
    h = History()
    for t in range(0, 135, 15):
        h = decide(pool(pre(2)), p, h, NOW + t).history
    h = decide(pool(pre(2, ttft=2.5)), p, h, NOW + 135).history
    assert h.memory["prefill"].headroom in (None, 0.2)


def test_a_breach_right_after_a_scale_down_teaches_headroom_at_once() -> None:
    # Seven replicas served 24,000 prompt tokens/s within the target; scaled to five (60 % of
    # their capacity, below the 80 % the headroom allows) the TTFT breaches with a queue at the
    # next decision, long before a window settles on the new count: the target utilization
    # was too high, and waiting for a settled window would learn it only after the scale-up
    # the breach brings has unsettled it again.
    p = policy(prefill_tokens_per_replica=8000.0)
    demand = dict(prompt_tokens_rate=24_000.0, request_rate=24.0)
    h = History()
    for t in range(0, 120, 15):
        h = decide(pool(pre(7, **demand)), p, h, NOW + t).history
    assert h.memory["prefill"].headroom in (None, 0.2)
    breach = dict(waiting=12.0, ttft=2.0, **demand)
    h = decide(pool(pre(5, running=5.0, **breach)), p, h, NOW + 135).history
    assert (h.memory["prefill"].headroom or 0.0) > 0.2
    # After a scale-up landed the same breach is the window's older part, when fewer
    # replicas served: no lesson until the window has settled on the new count.
    h = History()
    for t in range(0, 120, 15):
        h = decide(pool(pre(5, **demand)), p, h, NOW + t).history
    h = decide(pool(pre(7, running=7.0, **breach)), p, h, NOW + 135).history
    assert h.memory["prefill"].headroom in (None, 0.2)


def test_without_the_forecast_the_role_is_sized_for_the_demand_of_now() -> None:
    # Demand rose from 4,000 to 12,000 prompt tokens/s over five minutes and keeps rising.
    def run(p: Policy) -> int:
        h, d = History(), None
        for i, t in enumerate(range(0, 315, 15)):
            rate = 4000.0 + 8000.0 * i / 20
            d = decide(pool(pre(2, prompt_tokens_rate=rate, request_rate=rate / 1000)), p, h,
                       NOW + t)
            h = d.history
        assert d is not None
        return d.roles["prefill"].replicas

    ahead, now = run(policy()), run(policy(forecast=False))
    assert now == 2  # 12,000 / (8,000 x 0.8) = 1.9
    assert ahead > now  # ordered for the rise one cold start ahead


@pytest.mark.parametrize(("service_s", "target_s", "want"), [
    (0.3, 1.0, 0.3),  # a prompt takes 30 % of the target: keep 30 % free
    (0.05, 1.0, 0.05),  # short prompts: below the default, which then stands
    (0.9, 1.0, model.HEADROOM_RANGE[1]),  # nine tenths of it: the most the range keeps
    (2.0, 1.0, 0.0),  # longer than the target: it breaches on an idle replica, no help
    (0.3, 0.0, 0.0),
])
def test_service_headroom_is_the_share_of_the_target_one_prompt_computes(
        service_s: float, target_s: float, want: float) -> None:
    assert model.service_headroom(service_s, target_s) == pytest.approx(want)


def test_long_prompts_start_with_the_headroom_their_service_time_needs() -> None:
    # The same 24,000 prompt tokens/s, as 1,000-token prompts or as 3,000-token ones: at
    # 8,000 tokens/s per replica the long ones take 0.375 s of the 1 s target each, and a
    # queue of them costs the target sooner, so the pool keeps 37.5 % free, not 20 %.
    p = policy(prefill_tokens_per_replica=8000.0)

    def first(requests_per_s: float, h: History | None = None) -> tuple[int, str, History]:
        # (a TTFT within the target's band: no lesson either way at this decision)
        d = decide(pool(pre(4, prompt_tokens_rate=24_000.0, request_rate=requests_per_s,
                            ttft=0.95)), p, h or History(), NOW)
        return d.roles["prefill"].replicas, d.roles["prefill"].message, d.history

    short, short_msg, _ = first(24.0)
    long, long_msg, h = first(8.0)
    assert short == 4 and "headroom 0.2," in short_msg  # 24,000 / (8,000 x 0.8) = 3.75
    assert long == 5 and "headroom 0.375," in long_msg  # 24,000 / (8,000 x 0.625) = 4.8
    # A headroom the pool has learned (here: less) is what counts from then on.
    learned = replace(h.memory["prefill"], headroom=0.2)
    h = replace(h, memory={**h.memory, "prefill": learned})
    assert first(8.0, h)[0] == 4
