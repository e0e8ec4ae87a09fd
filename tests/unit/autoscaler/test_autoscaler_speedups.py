"""The decision core's speed-ups give the answers of the definitions they replace.

`frozen.replace` must build what `dataclasses.replace` builds; the capacity model's windows,
found by bisection when the samples are in time order, must match a scan of every sample (the
functions' definitions, written out below) in order and out of order (a clock that stepped
back), with repeated times and NaNs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.autoscaler import capacity as model
from poolpilot.autoscaler import frozen
from poolpilot.autoscaler.decide import Behavior, History, Policy, Recommendation

S = model.Sample

REPLACE_CASES: list[tuple[str, Any, dict[str, Any]]] = [
    ("memory", model.Memory(seen=(1.0, 2, 2), orders=(0.5,)), {"orders": (), "cold_start": 3.0}),
    ("history", History.fresh(5.0, {"prefill": 1.0}),
     {"recommendations": (Recommendation(6.0, "prefill", 3),), "last_scale": {}}),
    ("policy", Policy(bounds={"prefill": (1, 4)}), {"bounds": {}, "scale_up": Behavior(0, 1, 2)}),
    ("no change", model.Memory(), {}),
]


@pytest.mark.parametrize(("obj", "changes"), [c[1:] for c in REPLACE_CASES],
                         ids=[c[0] for c in REPLACE_CASES])
def test_replace_builds_what_dataclasses_replace_builds(obj: Any, changes: dict[str, Any]
                                                        ) -> None:
    new = frozen.replace(obj, **changes)
    assert new == dataclasses.replace(obj, **changes)
    assert type(new) is type(obj) and new is not obj
    assert obj == dataclasses.replace(obj)  # the original is untouched
    with pytest.raises(dataclasses.FrozenInstanceError):
        new.__setattr__(next(iter(dataclasses.asdict(new))), None)


def test_replace_refuses_what_dataclasses_replace_refuses() -> None:
    with pytest.raises(TypeError, match="no field typo"):
        frozen.replace(model.Memory(), typo=1)

    @dataclasses.dataclass(frozen=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            assert self.x >= 0

    with pytest.raises(TypeError, match="not a plain dataclass"):
        frozen.replace(Checked(1), x=2)


# --- the capacity model's windows: the definitions, as scans ---------------------------------


def after_by_scan(samples: Sequence[model.Sample], t: float) -> tuple[model.Sample, ...]:
    return tuple(s for s in samples if s.time > t)


def growth_by_scan(samples: Sequence[model.Sample], now: float, backlog: float) -> float:
    old = [s for s in samples if s.time >= now - model.GROWTH_WINDOW - 1e-9 and s.time < now]
    if not old:
        return 0.0
    return max(0.0, (backlog - old[0].backlog) / max(now - old[0].time, 1e-9))


def upside_by_scan(samples: Sequence[model.Sample], now: float, horizon: float,
                   quantile: float) -> float:
    rises = []
    for i, s in enumerate(samples):
        if s.time > now - horizon + 1e-9:
            break
        peak = s.rate
        for j in range(i + 1, len(samples)):
            if samples[j].time > s.time + horizon + 1e-9:
                break
            peak = max(peak, samples[j].rate)
        rises.append(peak - s.rate)
    if not rises:
        return 0.0
    rises.sort()
    return rises[min(len(rises) - 1, int(quantile * len(rises)))]


def trend_samples_by_scan(mem: model.Memory, rate_window: float) -> tuple[model.Sample, ...]:
    start = (mem.first_seen or 0.0) + rate_window - 1e-9
    return tuple(s for s in mem.samples if s.time >= start)


times = st.one_of(st.integers(0, 40).map(lambda i: i * 15.0),  # the loop's grid: ties, gaps
                  st.floats(0, 600), st.just(math.nan))
samples_st = st.lists(st.builds(S, times, st.floats(0, 1e4), st.floats(0, 1e5)), max_size=40)
ordered_st = samples_st.map(lambda xs: sorted(xs, key=lambda s: (math.isnan(s.time), s.time)))


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@settings(max_examples=300, deadline=None)
@given(st.one_of(samples_st, ordered_st), st.floats(0, 700), st.floats(1, 300),
       st.floats(0, 1), st.floats(0, 1e5), st.one_of(st.none(), st.floats(0, 300)))
def test_windows_by_bisection_match_the_scans(samples: list[model.Sample], now: float,
                                              horizon: float, quantile: float, backlog: float,
                                              first_seen: float | None) -> None:
    xs = tuple(samples)
    assert model.after(xs, now - 300) == after_by_scan(xs, now - 300)
    assert same(model.backlog_growth(xs, now, backlog), growth_by_scan(xs, now, backlog))
    assert same(model.upside(xs, now, horizon, quantile),
                upside_by_scan(xs, now, horizon, quantile))
    mem = model.Memory(samples=xs, first_seen=first_seen)
    assert model.trend_samples(mem, 60) == trend_samples_by_scan(mem, 60)
    kept = model.remember(mem, now, 1.0, 2.0, 300).samples
    assert kept == (*after_by_scan(xs, now - 300), S(now, 1.0, 2.0))
