"""The HPA algorithm as Kubernetes documents it: ratio, tolerance, missing pods, behavior."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.bench.policies.hpa_core import (
    HPAController,
    external_metric_replicas,
    pods_metric_replicas,
)


@dataclass(frozen=True)
class PodsCase:
    name: str
    total: float  # summed over ready pods
    ready: int
    missing: int
    current: int
    target: float
    want: int


PODS = [
    PodsCase("doubles at 2x target", 20, 2, 0, 2, 5, 4),
    PodsCase("within 10% tolerance holds", 10.9, 2, 0, 2, 5, 2),
    PodsCase("just outside tolerance", 11.1, 2, 0, 2, 5, 3),
    PodsCase("scale down", 2, 4, 0, 4, 5, 1),
    # 2 ready at 2x target, 2 starting (missing) count as 0: ratio (20+0)/(4*5)=1 -> hold
    PodsCase("starting pods damp scale-up", 20, 2, 2, 4, 5, 4),
    # 2 ready at 0.2x, 2 missing count as at target: (2+10)/(4*5)=0.6 -> ceil(2.4)=3
    PodsCase("missing pods at target on scale-down", 2, 2, 2, 4, 5, 3),
    PodsCase("no ready pods keeps size", 0, 0, 3, 3, 5, 3),
]


@pytest.mark.parametrize("case", PODS, ids=[c.name for c in PODS])
def test_pods_metric_replicas(case: PodsCase) -> None:
    got = pods_metric_replicas(case.total, case.ready, case.missing, case.current, case.target)
    assert got == case.want


@pytest.mark.parametrize(
    "total,status,target,want",
    [(50, 2, 5, 10), (10.4, 2, 5, 2), (0, 3, 5, 0), (12, 0, 5, 3)],
    ids=["ceil total/target", "tolerance", "zero queue", "from zero"],
)
def test_external_metric_replicas(total: float, status: int, target: float, want: int) -> None:
    assert external_metric_replicas(total, status, target) == want


def test_scale_up_limited_to_double_or_plus_four_per_15s() -> None:
    hpa = HPAController(1, 100)
    n, reason = hpa.step(0, 1, 50)
    assert (n, reason) == (5, "ScaleUpLimit")  # max(1*2, 1+4)
    n, _ = hpa.step(15, 5, 50)
    assert n == 10  # max(5*2, 5+4)
    n, _ = hpa.step(20, 10, 50)  # same 15 s period as the last step: start was 5 -> limit 10
    assert n == 10


def test_scale_down_waits_for_the_300s_window() -> None:
    hpa = HPAController(1, 100)
    assert hpa.step(0, 10, 10)[0] == 10
    for t in range(15, 300, 15):
        n, reason = hpa.step(t, 10, 2)
        assert (n, reason) == (10, "ScaleDownStabilized"), t
    assert hpa.step(315, 10, 2)[0] == 2  # the 10 recommended at t=0 left the window


def test_min_max_clamp() -> None:
    assert HPAController(2, 6).step(0, 3, 1)[0] == 3  # stabilization holds first...
    hpa = HPAController(2, 6)
    hpa.behavior = type(hpa.behavior)(down_window_s=0)
    assert hpa.step(0, 3, 1) == (2, "TooFewReplicas")
    assert HPAController(1, 6).step(0, 5, 9) == (6, "TooManyReplicas")


@given(
    recs=st.lists(st.integers(0, 40), min_size=1, max_size=40),
    lo=st.integers(1, 5),
    span=st.integers(0, 20),
)
def test_controller_stays_within_bounds_and_limits(recs: list[int], lo: int, span: int) -> None:
    hi = lo + span
    hpa = HPAController(lo, hi)
    cur = lo
    for i, r in enumerate(recs):
        new, _ = hpa.step(15.0 * i, cur, r)
        assert lo <= new <= hi
        if new > cur:
            assert new <= max(2 * cur, cur + 4)
        cur = new
