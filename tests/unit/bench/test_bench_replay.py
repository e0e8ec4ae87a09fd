"""The replay's invariants, and a trace small enough that the right answer is known by hand."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from poolpilot.bench.main import build_policy
from poolpilot.bench.policies.base import PoolView, ScalingDecision
from poolpilot.bench.replay import FRONTEND_STARTED, BenchConfig, replay
from poolpilot.engine_sim.traces import TraceRequest

CFG = BenchConfig(model="llama-3.1-8b", gpu="h200", cold_start=20.0, max_replicas=4)


def spaced(n: int, every: float, prompt: int = 100, out: int = 10) -> list[TraceRequest]:
    return [TraceRequest(i * every, prompt, out) for i in range(n)]


@dataclass
class Scripted:
    """A policy that sets given sizes at given times (to test the replay, not a policy)."""

    plan: dict[float, dict[str, int]]
    start: dict[str, int] = field(default_factory=lambda: {"prefill": 1, "decode": 1})
    name: str = "scripted"
    interval: float = 10.0
    seen: list[PoolView] = field(default_factory=list)
    scrapes: dict[float, int] = field(default_factory=dict)
    waiting: dict[float, dict[tuple[str, ...], float]] = field(default_factory=dict)

    def initial(self) -> dict[str, int]:
        return dict(self.start)

    def decide(self, view: PoolView) -> ScalingDecision:
        self.seen.append(view)
        self.scrapes[view.now] = view.prom.scrapes
        self.waiting[view.now] = view.prom.gauge("vllm:num_requests_waiting", by=("role",))
        cur = {r: s.target for r, s in view.roles.items()}
        return ScalingDecision(self.plan.get(view.now, cur))


def test_small_trace_known_by_hand() -> None:
    """10 short requests 10 s apart on a static 1+1 pool: no queueing, all within SLO; the
    bill is 2 GPUs x 90 s (the trace's span); goodput per GPU = (10 / 90 s) / 2 GPUs."""
    trace = spaced(10, 10.0)
    r = replay(trace, build_policy("static-peak", trace, CFG), CFG)
    s = r.summary
    assert (s.requests, s.finished) == (10, 10)
    assert s.slo_attainment == 1.0
    assert s.gpu_hours == pytest.approx(2 * 90 / 3600)
    assert s.avg_gpus == pytest.approx(2.0)
    assert s.goodput_per_gpu == pytest.approx((10 / 90) / 2)
    assert s.scale_events == 0
    assert 0 < s.ttft_p50 <= s.ttft_p90 <= s.ttft_p99 < 0.1  # a 100-token prompt on an H200


def test_impossible_slo_gives_zero_attainment_and_zero_goodput() -> None:
    trace = spaced(10, 10.0)
    cfg = BenchConfig(slo_ttft=1e-4, cold_start=20.0, max_replicas=4)
    s = replay(trace, build_policy("static-peak", trace, cfg), cfg).summary
    assert s.slo_attainment == 0.0 and s.goodput_per_gpu == 0.0


def test_pod_is_billed_from_request_through_cold_start_until_it_leaves() -> None:
    """+1 decode pod asked at t=30 (ready at 50), removed at t=90 while idle: bills 60 s."""
    trace = spaced(10, 10.0)
    pol = Scripted({30.0: {"prefill": 1, "decode": 2}, 90.0: {"prefill": 1, "decode": 1}})
    r = replay(trace, pol, CFG)
    base = 2 * 90 / 3600
    assert r.summary.gpu_hours == pytest.approx(base + 60 / 3600)
    extra = [sp for sp in r.ledger.spans if sp.requested_at == 30.0]
    assert len(extra) == 1 and extra[0].ready_at == 50.0 and extra[0].gone_at == 90.0
    # what the policy saw: starting at t=40, ready at t=50 (cold start 20 s)
    by_t = {v.now: v.roles["decode"] for v in pol.seen}
    assert (by_t[40.0].ready, by_t[40.0].starting) == (1, 1)
    assert (by_t[50.0].ready, by_t[50.0].starting) == (2, 0)
    assert [(e.t, e.old, e.new) for e in r.ledger.events] == [(30.0, 1, 2), (90.0, 2, 1)]
    assert r.summary.direction_changes == 1


def test_removing_a_starting_pod_stops_its_bill_at_once() -> None:
    trace = spaced(5, 10.0)
    pol = Scripted({10.0: {"prefill": 2, "decode": 1}, 20.0: {"prefill": 1, "decode": 1}})
    r = replay(trace, pol, CFG)
    assert r.summary.gpu_hours == pytest.approx((2 * 40 + 10) / 3600)


def test_policies_see_only_scraped_metrics() -> None:
    """Before the first scrape a policy sees nothing; afterwards the queue gauges exist."""
    trace = spaced(20, 2.0)
    pol = Scripted({})
    replay(trace, pol, CFG)
    assert pol.scrapes[10.0] == 0 and pol.waiting[10.0] == {}
    assert pol.scrapes[30.0] == 2
    assert set(pol.waiting[30.0]) == {("prefill",), ("decode",)}
    # the front door's started-request counter: every arrival up to the scrape (t = 0..30)
    started = pol.seen[-1].prom.gauge(FRONTEND_STARTED, at=30.0)
    assert started == {(): 16.0}


ALL = ("poolpilot", "oracle", "static-min", "static-peak", "hpa", "keda-queue", "dynamo-sla")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gaps=st.lists(st.floats(0.0, 5.0), min_size=1, max_size=40),
    prompts=st.integers(1, 4000),
    outs=st.integers(1, 300),
)
def test_every_policy_gets_the_same_arrivals_and_accounts_for_every_request(
    gaps: list[float], prompts: int, outs: int
) -> None:
    t, trace = 0.0, []
    for i, g in enumerate(gaps):
        t += g
        trace.append(TraceRequest(round(t, 3), max(1, (prompts * (i + 1)) % 4000), outs))
    arrivals = None
    for name in ALL:
        r = replay(trace, build_policy(name, trace, CFG), CFG)
        got = [(o.id, o.arrival) for o in r.outcomes]
        assert [i for i, _ in got] == list(range(len(trace)))
        if arrivals is None:
            arrivals = got
        assert got == arrivals, name
        assert r.summary.requests == len(trace)
        assert r.summary.finished == len(trace)  # light load: everything completes
        assert r.summary.gpu_hours >= 0
