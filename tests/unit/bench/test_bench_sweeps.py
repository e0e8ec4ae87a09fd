"""Baseline variants: names, knob checks, the sweep grid, and which point is best."""

from __future__ import annotations

import pytest
from poolpilot.bench.main import POLICIES, build_policy, parse_policies
from poolpilot.bench.policies.dynamo_sla import DynamoSLA
from poolpilot.bench.policies.hpa import HPAGpuUtil
from poolpilot.bench.policies.keda import KedaQueue
from poolpilot.bench.replay import BenchConfig
from poolpilot.bench.sweeps import best_points, parse_policy_spec, split_specs
from poolpilot.engine_sim.traces import TraceRequest


@pytest.mark.parametrize(
    "text,want",
    [("hpa,oracle", ["hpa", "oracle"]),
     ("hpa(target=65), dynamo-sla(interval=60, margin=0.5)",
      ["hpa(target=65)", "dynamo-sla(interval=60,margin=0.5)"]),
     ("keda-queue(threshold=2.0),keda-queue", ["keda-queue(threshold=2)", "keda-queue"]),
     ("hpa,hpa", ["hpa"])],
    ids=["plain", "variants with commas", "normalized number", "duplicates"],
)
def test_policy_names_are_parsed_and_normalized(text: str, want: list[str]) -> None:
    assert parse_policies(text) == want


def test_sweep_adds_each_baselines_grid_after_it() -> None:
    names = parse_policies("oracle,hpa,dynamo-sla", sweep=True)
    assert names[:2] == ["oracle", "hpa"]
    assert [n for n in names if n.startswith("hpa")] == [
        "hpa", "hpa(target=50)", "hpa(target=65)", "hpa(target=95)"]
    assert "dynamo-sla(interval=60,margin=1)" in names
    assert not any(n.startswith("keda") for n in names)


@pytest.mark.parametrize(
    "spec,says",
    [("hpa(target=0)", "target must be > 0 and <= 100"),
     ("hpa(target=120)", "target must be > 0 and <= 100"),
     ("hpa(util=60)", "hpa knobs are target"),
     ("keda-queue(threshold=x)", "threshold needs a number"),
     ("dynamo-sla(margin=-1)", "margin must be >= 0"),
     ("oracle(window=10)", "oracle has no settings to vary"),
     ("magic(x=1)", "unknown magic(x=1)")],
    ids=["zero target", "target over 100", "unknown knob", "not a number", "negative margin",
         "reference has no knobs", "unknown policy"],
)
def test_bad_variants_name_the_knob(spec: str, says: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_policy_spec(spec, POLICIES)
    assert says in str(err.value)


def test_split_keeps_commas_inside_parentheses() -> None:
    assert split_specs("a(x=1,y=2), b ,c(z=3)") == ["a(x=1,y=2)", "b", "c(z=3)"]


def test_variants_reach_the_policies() -> None:
    trace = [TraceRequest(i * 1.0, 300, 10) for i in range(20)]
    cfg = BenchConfig(max_replicas=4)
    hpa = build_policy("hpa(target=65)", trace, cfg)
    keda = build_policy("keda-queue(threshold=2)", trace, cfg)
    dyn = build_policy("dynamo-sla(interval=60,margin=0.5)", trace, cfg)
    assert isinstance(hpa, HPAGpuUtil) and hpa.target == 65.0 and hpa.name == "hpa(target=65)"
    assert isinstance(keda, KedaQueue) and keda.threshold == 2.0
    assert isinstance(dyn, DynamoSLA) and (dyn.interval, dyn.margin) == (60.0, 0.5)


def run(name: str, attainment: float, gpu_hours: float) -> tuple[str, float, float]:
    return (name, attainment, gpu_hours)


@pytest.mark.parametrize(
    "runs,want",
    [([run("hpa", 0.96, 10.0), run("hpa(target=50)", 0.99, 14.0),
       run("hpa(target=95)", 0.90, 6.0)], "hpa"),
     ([run("hpa", 0.90, 10.0), run("hpa(target=50)", 0.97, 14.0),
       run("hpa(target=65)", 0.95, 12.0)], "hpa(target=65)"),
     ([run("hpa", 0.50, 10.0), run("hpa(target=50)", 0.70, 14.0),
       run("hpa(target=65)", 0.70, 12.0)], "hpa(target=65)")],
    ids=["cheapest that meets the goal", "the goal itself counts", "else highest, then cheaper"],
)
def test_best_point(runs: list[tuple[str, float, float]], want: str) -> None:
    others = [run("oracle", 0.99, 5.0), run("keda-queue", 0.5, 3.0)]  # single runs: no best
    assert best_points([*others, *runs], goal=0.95) == {"hpa": want}
