"""The hindsight references: the oracle's plan and orders, static-min's search, the SLO ceiling.

Short synthetic traces on the 8B model: each replay takes well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from poolpilot.bench.ceiling import _alone, slo_ceiling
from poolpilot.bench.main import Options, build_policy
from poolpilot.bench.oracle import OraclePlan, WindowNeed, _shrink, plan_oracle, warm_start
from poolpilot.bench.policies.base import Bounds
from poolpilot.bench.policies.oracle import Oracle
from poolpilot.bench.policies.static_peak import StaticPool
from poolpilot.bench.profile import SimCapacity
from poolpilot.bench.replay import BenchConfig, RunResult, replay
from poolpilot.bench.static_min import Probe, search_static_min, smallest_passing
from poolpilot.engine_sim.traces import TraceRequest

CFG = BenchConfig(model="llama-3.1-8b", gpu="h200", cold_start=30.0, max_replicas=8)


def burst_trace() -> list[TraceRequest]:
    """A quiet minute, 20 s of heavy long prompts, two quiet minutes."""
    reqs = [TraceRequest(i * 2.0, 500, 20) for i in range(30)]
    reqs += [TraceRequest(60 + i * 0.05, 3000, 50) for i in range(400)]
    reqs += [TraceRequest(80 + i * 2.0, 500, 20) for i in range(60)]
    return reqs


# ---- pure pieces ----
@pytest.mark.parametrize(
    "need,cur,lo",
    [(1, 5, 1), (5, 5, 1), (3, 9, 1), (2, 2, 2), (4, 17, 2), (9, 64, 1)],
    ids=["down to the floor", "already minimal", "middle", "at the floor", "above floor 2",
         "far below"],
)
def test_shrink_finds_the_smallest_passing_count(need: int, cur: int, lo: int) -> None:
    asked: list[int] = []

    def ok(x: int) -> bool:
        asked.append(x)
        return x >= need

    assert _shrink(ok, lo, cur) == need
    assert len(asked) <= 2 * max(1, (cur - lo)).bit_length() + 1


def needs(*pods: tuple[int, int], window: float = 30.0) -> OraclePlan:
    return OraclePlan(window, [WindowNeed(i * window, p, d, 10, 0, 1)
                               for i, (p, d) in enumerate(pods)])


@dataclass(frozen=True)
class PodsCase:
    name: str
    plan: OraclePlan
    t: float
    ahead: float
    want: dict[str, int]


PODS = [
    PodsCase("ordered one cold start ahead", needs((1, 1), (1, 1), (1, 1), (4, 1)), 0.0, 95.0,
             {"prefill": 4, "decode": 1}),
    PodsCase("not yet: the window starts after the next order", needs((1, 1), (1, 1), (1, 1),
                                                                      (4, 1)),
             0.0, 90.0, {"prefill": 1, "decode": 1}),
    PodsCase("kept through a gap shorter than a cold start",
             needs((5, 2), (1, 1), (1, 1), (5, 2)), 30.0, 65.0, {"prefill": 5, "decode": 2}),
    PodsCase("released when no window within a cold start needs it",
             needs((5, 2), (1, 1), (1, 1), (1, 1), (1, 1), (5, 2)), 30.0, 65.0,
             {"prefill": 1, "decode": 1}),
    PodsCase("a window that ended no longer counts", needs((6, 3), (2, 1)), 30.0, 5.0,
             {"prefill": 2, "decode": 1}),
]


@pytest.mark.parametrize("case", PODS, ids=[c.name for c in PODS])
def test_pods_at_is_the_largest_need_within_a_cold_start(case: PodsCase) -> None:
    assert case.plan.pods_at(case.t, case.ahead, floor=1) == case.want


def test_oracle_policy_stays_inside_the_bounds() -> None:
    pol = Oracle(needs((9, 9), (0, 0)), Bounds(2, 4), cold_start=60.0)
    assert pol.initial() == {"prefill": 4, "decode": 4}


# ---- the oracle on the simulator ----
@dataclass
class BurstRuns:
    trace: list[TraceRequest]
    oracle: Oracle
    oracle_run: RunResult
    static_min: StaticPool
    static_min_run: RunResult


@pytest.fixture(scope="module")
def runs() -> BurstRuns:
    trace = burst_trace()
    oracle = build_policy("oracle", trace, CFG)
    smin = build_policy("static-min", trace, CFG)
    assert isinstance(oracle, Oracle) and isinstance(smin, StaticPool)
    return BurstRuns(trace, oracle, replay(trace, oracle, CFG), smin, replay(trace, smin, CFG))


def test_oracle_meets_its_target_and_pays_less_than_the_smallest_static_pool(
        runs: BurstRuns) -> None:
    o, s = runs.oracle_run.summary, runs.static_min_run.summary
    assert o.slo_attainment >= 0.95
    assert s.slo_attainment >= 0.95
    # the burst needs several prefill replicas for 20 s; a fixed pool holds them for 4 min
    assert o.gpu_hours < s.gpu_hours


def test_oracle_has_the_burst_capacity_ready_when_the_burst_starts(runs: BurstRuns) -> None:
    burst = next(w for w in runs.oracle.plan.needs if w.start == 60.0)
    assert burst.prefill > 1
    ready_at_burst = sum(1 for sp in runs.oracle_run.ledger.spans
                         if sp.role == "prefill" and sp.ready_at <= 60.0
                         and (sp.gone_at is None or sp.gone_at > 60.0))
    assert ready_at_burst >= burst.prefill
    # ordered one cold start (30 s) ahead, not earlier than one decision interval before that
    ups = [e for e in runs.oracle_run.ledger.events if e.role == "prefill" and e.new > e.old]
    assert ups and 25.0 <= ups[0].t <= 30.0


def test_static_min_is_minimal(runs: BurstRuns) -> None:
    p, d = runs.static_min.sizes["prefill"], runs.static_min.sizes["decode"]
    assert runs.static_min.info["found"] is True
    for fewer in ({"prefill": p - 1, "decode": d}, {"prefill": p, "decode": d - 1}):
        if min(fewer.values()) < 1:
            continue
        r = replay(runs.trace, StaticPool(fewer), CFG)
        assert r.summary.slo_attainment < 0.95, fewer


def test_oracle_plan_with_an_unreachable_slo_still_finishes() -> None:
    """TTFT 1 ms: no request can meet it; every window is sized at the floor, none is
    reported as attainable only because the allowance covers the unreachable requests."""
    cfg = BenchConfig(model="llama-3.1-8b", gpu="h200", slo_ttft=1e-3, max_replicas=4)
    trace = [TraceRequest(i * 1.0, 400, 10) for i in range(40)]
    cap = SimCapacity(cfg.model, cfg.gpu, cfg.slo_itl, cfg.tensor_parallel)
    plan = plan_oracle(trace, cfg, Bounds(1, 4), cap)
    assert all((w.prefill, w.decode) == (1, 1) for w in plan.needs)
    assert slo_ceiling(trace, cfg).share == 0.0


# ---- static-min's search, with a fake replay ----
def test_smallest_passing_probes_in_parallel_rounds() -> None:
    rounds: list[list[int]] = []

    def evaluate(xs: list[int]) -> list[bool]:
        rounds.append(xs)
        return [x >= 11 for x in xs]

    assert smallest_passing(evaluate, 1, 32, guess=4, jobs=3) == 11
    assert all(len(r) <= 3 for r in rounds)
    assert len(rounds) <= 5


@pytest.mark.parametrize(
    "need,hi,want",
    [((3, 2), 8, (3, 2)), ((1, 1), 8, (1, 1)), ((8, 8), 8, (8, 8)), ((9, 1), 8, None)],
    ids=["typical", "floor", "at the bound", "beyond the bound"],
)
def test_search_static_min_with_a_fake_replay(need: tuple[int, int], hi: int,
                                               want: tuple[int, int] | None) -> None:
    def replay_pool(pools: list[tuple[int, int]]) -> list[Probe]:
        return [Probe(p, d, None, p >= need[0] and d >= need[1]) for p, d in pools]

    best, probes = search_static_min(replay_pool, 1, hi, {"prefill": 2, "decode": 2}, jobs=2)
    assert best == want
    assert len({(pr.prefill, pr.decode) for pr in probes}) == len(probes)  # nothing twice


# ---- the ceiling ----
def test_ceiling_is_the_longest_prompt_that_meets_ttft_alone() -> None:
    cfg = BenchConfig(model="llama-3.1-70b", gpu="h200", tensor_parallel=2, slo_ttft=0.5)
    c = slo_ceiling([TraceRequest(0.0, 100, 5), TraceRequest(1.0, 20000, 5)], cfg)
    alone = _alone(cfg, c.longest_prompt)
    over = _alone(cfg, c.longest_prompt + 1)
    assert alone is not None and alone <= 0.5
    assert over is None or over > 0.5
    assert c.unreachable == (False, True) and c.share == 0.5


def test_the_starting_pool_does_not_shrink_with_the_cold_start() -> None:
    """The pool is sized for the trace's opening (at least OPENING_S), not for one cold start:
    traffic that grows after the first minute is in the pool a 20 s cold start starts with,
    as in the one a 120 s cold start starts with."""
    from dataclasses import replace as dc_replace
    light = [TraceRequest(i * 0.5, 3000, 30) for i in range(120)]  # 2 req/s for 60 s
    heavy = [TraceRequest(60.0 + i * 0.04, 3000, 30) for i in range(1375)]  # then 25 req/s
    trace = light + heavy
    assert trace[-1].arrival_s < 120.0  # within the opening
    bounds, cap = Bounds(1, 8), SimCapacity(CFG.model, CFG.gpu, CFG.slo_itl)
    short = warm_start(trace, dc_replace(CFG, cold_start=20.0), bounds, cap)
    long = warm_start(trace, dc_replace(CFG, cold_start=120.0), bounds, cap)
    assert short == long
    first = warm_start(light, dc_replace(CFG, cold_start=20.0), bounds, cap)
    assert short["prefill"] > first["prefill"]  # the heavy part is in it


def test_options_reach_the_oracle() -> None:
    trace = burst_trace()[:40]
    pol = build_policy("oracle", trace, CFG, Options(oracle_window=15.0))
    assert isinstance(pol, Oracle) and pol.plan.window == 15.0


def test_autoscaled_pools_start_level_with_the_oracle() -> None:
    # Heavy from the first second: a pool sized for the mean at full utilization would start
    # behind, and the first cold start's requests would miss before any policy could act.
    trace = [TraceRequest(i * 0.04, 3000, 30) for i in range(2250)]  # 25 req/s, 90 s
    bounds = Bounds(1, 8)
    warm = warm_start(trace, CFG, bounds, SimCapacity(CFG.model, CFG.gpu, CFG.slo_itl))
    for name in ("poolpilot", "hpa", "keda-queue", "dynamo-sla"):
        assert build_policy(name, trace, CFG).initial() == warm, name
    head = [r for r in trace if r.arrival_s < CFG.cold_start]
    met = replay(head, StaticPool(warm), CFG).summary.slo_attainment
    assert met >= 0.95
    assert warm["prefill"] > 1
    fewer = replay(head, StaticPool({**warm, "prefill": warm["prefill"] - 1}), CFG)
    assert fewer.summary.slo_attainment < 0.95  # the fewest that serve it
