"""Each policy's formula on numbers worked out by hand, fed through the scrape emulation."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from poolpilot.autoscaler import decide as real_decide
from poolpilot.bench.policies.base import Bounds, PoolView, RolePods
from poolpilot.bench.policies.dynamo_sla import DynamoSLA
from poolpilot.bench.policies.hpa import HPAGpuUtil
from poolpilot.bench.policies.keda import KedaQueue
from poolpilot.bench.policies.poolpilot_policy import PoolpilotPolicy
from poolpilot.bench.policies.static_peak import StaticPeak
from poolpilot.bench.replay import FRONTEND_STARTED
from poolpilot.bench.scrape import PromView, labels_of
from poolpilot.engine_sim.traces import TraceRequest

from poolpilot import metrics as m


@dataclass
class FlatCapacity:
    """1,000 prompt tokens/s and 500 generated tokens/s per replica; TTFT 0.1 s; ITL 20 ms."""

    def prefill_ttft(self, isl: float) -> float:
        return 0.1

    def prefill_tokens_per_s(self, isl: float) -> float:
        return 1000.0

    def decode_tokens_per_s(self, context: float, itl: float | None = None) -> float:
        return 500.0


BOUNDS = Bounds(1, 50)


def roles(prefill: int = 1, decode: int = 1, starting: int = 0) -> dict[str, RolePods]:
    return {
        "prefill": RolePods(prefill, starting, 0, prefill + starting,
                             frozenset(f"p{i}" for i in range(prefill))),
        "decode": RolePods(decode, 0, 0, decode, frozenset(f"d{i}" for i in range(decode))),
    }


def gauges(view: PromView, t: float, values: dict[tuple[str, str], dict[str, float]]) -> None:
    view.scrape(t, [(name, labels_of({"role": role, "pod": pod}), v)
                    for (name, role), per_pod in values.items() for pod, v in per_pod.items()])


def test_static_peak_sizes_each_role_for_its_busiest_minute() -> None:
    # minute 0: 30 req x 2,000 prompt tokens = 1,000 tok/s -> 1 prefill;
    # minute 1: 90 req x 2,000 = 3,000 tok/s -> 3 prefill; outputs 90 x 1,000 / 60 = 1,500 -> 3
    trace = [TraceRequest(i * 2.0, 2000, 10) for i in range(30)]
    trace += [TraceRequest(60 + i * (60 / 90), 2000, 1000) for i in range(90)]
    p = StaticPeak(trace, FlatCapacity(), BOUNDS)
    assert p.initial() == {"prefill": 3, "decode": 3}


def test_keda_scales_to_queue_over_threshold() -> None:
    view = PromView()
    gauges(view, 15, {(m.VLLM_WAITING, "prefill"): {"p0": 23.0},
                      (m.VLLM_WAITING, "decode"): {"d0": 0.0}})
    k = KedaQueue(BOUNDS, {"prefill": 1, "decode": 1})
    d = k.decide(PoolView(15, view, roles()))
    # ceil(23 / 5) = 5, within the HPA's scale-up limit max(2x, +4) = 5
    assert d.replicas == {"prefill": 5, "decode": 1}


def test_keda_counts_the_prompts_the_router_holds_as_prefill_queue() -> None:
    # With late binding a saturated prefill role's queue is at the router: 3 at the engine
    # and 20 held are 23 waiting, as above (the decode ScaledObject reads its engines alone)
    view = PromView()
    view.scrape(15, [(m.VLLM_WAITING, labels_of({"role": "prefill", "pod": "p0"}), 3.0),
                     (m.VLLM_WAITING, labels_of({"role": "decode", "pod": "d0"}), 0.0),
                     (m.ROUTER_HELD, labels_of({"role": "prefill", "pod": "router"}), 20.0)])
    k = KedaQueue(BOUNDS, {"prefill": 1, "decode": 1})
    assert k.decide(PoolView(15, view, roles())).replicas == {"prefill": 5, "decode": 1}


def test_hpa_uses_ready_pods_gpu_utilization() -> None:
    view = PromView()
    gauges(view, 15, {(m.DCGM_GPU_UTIL, "prefill"): {"p0": 100.0, "p1": 100.0, "old": 0.0},
                      (m.DCGM_GPU_UTIL, "decode"): {"d0": 40.0}})
    h = HPAGpuUtil(BOUNDS, {"prefill": 2, "decode": 1})
    d = h.decide(PoolView(15, view, roles(prefill=2)))
    # prefill: ceil(2 * 100/80) = 3 (the draining pod "old" is not ready: ignored);
    # decode: 40/80 = 0.5 -> 1, but the 300 s window remembers 1 -> 1
    assert d.replicas == {"prefill": 3, "decode": 1}


def _dynamo_view(t: float, n: float, isl: float, osl: float, ttft: float, itl: float,
                 duration: float, finished: float | None = None) -> PromView:
    """Counters growing linearly so that increase() over 180 s gives exactly these numbers:
    n requests started at the front door, `finished` (default n) of them finished."""
    done = n if finished is None else finished
    view = PromView()
    for k in range(0, 13):
        s = t - 180 + 15 * k
        f = (s - (t - 180)) / 180 + 1.0  # from 1x to 2x of the interval's totals
        pre, dec = {"role": "prefill", "pod": "p0"}, {"role": "decode", "pod": "d0"}
        samples = [
            (FRONTEND_STARTED, labels_of({}), n * f),
            (m.VLLM_PROMPT_TOKENS, labels_of(pre), n * isl * f),
            (f"{m.VLLM_TTFT}_count", labels_of(pre), n * f),
            (f"{m.VLLM_TTFT}_sum", labels_of(pre), n * ttft * f),
            (m.VLLM_GENERATION_TOKENS, labels_of(dec), done * osl * f),
            (m.VLLM_REQUEST_SUCCESS, labels_of({**dec, "finished_reason": "length"}), done * f),
            (f"{m.VLLM_ITL}_count", labels_of(dec), done * osl * f),
            (f"{m.VLLM_ITL}_sum", labels_of(dec), done * osl * itl * f),
            (f"{m.VLLM_E2E}_count", labels_of(dec), done * f),
            (f"{m.VLLM_E2E}_sum", labels_of(dec), done * duration * f),
        ]
        view.scrape(s, samples)
    return view


def dynamo(margin: float = 0.0, slo_ttft: float = 1.0, start: int = 1) -> DynamoSLA:
    return DynamoSLA(FlatCapacity(), BOUNDS, {"prefill": start, "decode": start},
                     slo_ttft=slo_ttft, slo_itl=0.05, margin=margin)


@pytest.mark.parametrize(
    "margin,slo_ttft,want",
    [(0.0, 1.0, {"prefill": 3, "decode": 12}),
     (0.5, 1.0, {"prefill": 5, "decode": 18}),
     (0.0, 0.025, {"prefill": 4, "decode": 12})],
    ids=["defaults", "margin 0.5", "TTFT floor"],
)
def test_dynamo_planner_formula(margin: float, slo_ttft: float, want: dict[str, int]) -> None:
    # 5,400 requests started in 180 s (30 req/s), ISL 300, OSL 200; one prefill takes 0.1 s:
    # prefill = ceil(30 x 0.1 x (1 + margin)); with a 25 ms TTFT target the floor is
    # ceil(0.1 / 0.025) = 4; decode = ceil(30 x 200 x (1 + margin) / 500 tok/s per replica).
    view = _dynamo_view(360.0, 5400, 300, 200, ttft=0.2, itl=0.02, duration=4.0)
    d = dynamo(margin, slo_ttft)
    obs = d.observe(PoolView(360.0, view, roles()))
    assert obs["num_req"] == pytest.approx(5400)
    assert obs["isl"] == pytest.approx(300) and obs["osl"] == pytest.approx(200)
    assert d.decide(PoolView(360.0, view, roles())).replicas == want


def test_dynamo_sizes_for_requests_started_not_finished() -> None:
    """A saturated pool finishes 600 of 5,400 started requests: the planner still sizes for
    the 5,400 (older planners counted finished requests and sized for what was served)."""
    view = _dynamo_view(360.0, 5400, 300, 200, ttft=30.0, itl=0.02, duration=40.0,
                        finished=600)
    assert dynamo().decide(PoolView(360.0, view, roles())).replicas == {"prefill": 3,
                                                                       "decode": 12}


def test_dynamo_scales_an_idle_pool_to_the_minimum() -> None:
    view = _dynamo_view(360.0, 0, 300, 200, ttft=0.2, itl=0.02, duration=4.0)
    dec = dynamo(start=4).decide(PoolView(360.0, view, roles(4, 4)))
    assert dec.replicas == {"prefill": 1, "decode": 1}


def test_dynamo_holds_when_requests_started_but_none_finished() -> None:
    view = _dynamo_view(360.0, 900, 300, 200, ttft=0.2, itl=0.02, duration=4.0, finished=0)
    dec = dynamo(start=4).decide(PoolView(360.0, view, roles(4, 4)))
    assert dec.replicas == {"prefill": 4, "decode": 4}
    assert dec.reasons["prefill"] == "MetricsNaN"


def test_dynamo_fits_the_gpu_budget() -> None:
    d = DynamoSLA(FlatCapacity(), BOUNDS, {"prefill": 1, "decode": 1}, slo_ttft=1.0,
                  slo_itl=0.05, max_gpu_budget=10)
    p, dec = d.replicas_for(5400, 300, 200)  # wants 3 + 12 = 15 GPUs
    assert p + dec <= 10 and p >= 1 and dec >= 1


def test_poolpilot_policy_calls_the_real_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = real_decide.decide

    def spy(*a: object, **kw: object) -> object:
        calls.append(a)
        return real(*a, **kw)

    monkeypatch.setattr("poolpilot.bench.policies.poolpilot_policy.decide", spy)
    view = PromView()
    for t in (0.0, 15.0, 30.0, 45.0):  # a full 60 s window: rate() is exact
        view.scrape(t, [(m.VLLM_PROMPT_TOKENS, labels_of({"role": "prefill", "pod": "p0"}),
                         1000.0 * (t + 100)),
                        (m.VLLM_GENERATION_TOKENS, labels_of({"role": "decode", "pod": "d0"}),
                         100.0 * (t + 100)),
                        (m.VLLM_WAITING, labels_of({"role": "prefill", "pod": "p0"}), 40.0),
                        (m.VLLM_RUNNING, labels_of({"role": "prefill", "pod": "p0"}), 4.0),
                        (m.VLLM_WAITING, labels_of({"role": "decode", "pod": "d0"}), 0.0),
                        (m.VLLM_RUNNING, labels_of({"role": "decode", "pod": "d0"}), 10.0),
                        (m.VLLM_KV_USAGE, labels_of({"role": "decode", "pod": "d0"}), 0.1)])
    p = PoolpilotPolicy(BOUNDS, {"prefill": 1, "decode": 1}, slo_ttft=1.0, slo_itl=0.05)
    obs = p.observe(PoolView(45.0, view, roles()))
    pre = obs.roles["prefill"]
    assert (pre.waiting, pre.running, pre.ready, pre.sample_age) == (40.0, 4.0, 1, 0.0)
    assert pre.prompt_tokens_rate == pytest.approx(1000.0)
    d = p.decide(PoolView(45.0, view, roles()))
    assert len(calls) == 1
    # 40 waiting against 2 per replica: the queue signal asks for 20, the core's +4 step caps it
    assert d.replicas["prefill"] == 5 and d.reasons["prefill"] == "ScaleUpRateLimited"
    assert d.replicas["decode"] == 1
    assert not math.isnan(obs.roles["decode"].kv_usage or math.nan)
