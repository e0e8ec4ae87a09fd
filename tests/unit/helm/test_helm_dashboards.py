"""The chart's Grafana dashboards (built with grafana-foundation-sdk's builders, Grafana 11.6
types) parse back as Grafana dashboard models, hold no key outside them but the few the
generator declares, and follow the conventions Grafana and the chart rely on."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import pytest
from chartlib import CHART
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard
from poolpilot.dashboards import grafana

from poolpilot import metrics

NAMES = sorted(grafana.DASHBOARDS)

# Keys Grafana stores that the SDK's generic models do not declare, which the generator adds to
# what the builders built: a query variable's `definition` (its editor text) and the Prometheus
# datasource's annotation-query fields.
NOT_IN_SDK = {"templating/list/definition"} | {
    f"annotations/list/{key}" for key in grafana.SCALE_EVENTS_FIELDS}


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (CHART / "files" / "dashboards" / f"poolpilot-{name}.json").read_text())
    return data


def _lost(original: Any, parsed: Any, path: str = "") -> list[str]:
    """Keys or values the SDK's model did not keep (unknown, misspelt or mistyped)."""
    problems: list[str] = []
    if isinstance(original, dict):
        if not isinstance(parsed, dict):
            return [f"{path}: became {type(parsed).__name__}"]
        for key, value in original.items():
            where = f"{path}/{key}".lstrip("/")
            if key not in parsed:
                if re.sub(r"\[\d+\]", "", where) not in NOT_IN_SDK:
                    problems.append(f"{where}: unknown to Grafana's dashboard model")
            else:
                problems += _lost(value, parsed[key], where)
    elif isinstance(original, list):
        if not isinstance(parsed, list) or len(parsed) != len(original):
            return [f"{path}: list changed"]
        for i, (a, b) in enumerate(zip(original, parsed, strict=True)):
            problems += _lost(a, b, f"{path}[{i}]")
    elif original != parsed:
        problems.append(f"{path}: {original!r} became {parsed!r}")
    return problems


@pytest.mark.parametrize("name", NAMES)
def test_dashboard_round_trips_through_grafanas_model(name: str) -> None:
    original = _load(name)
    parsed = json.loads(json.dumps(Dashboard.from_json(original), cls=JSONEncoder))
    assert _lost(original, parsed) == []


def test_round_trip_check_catches_a_misspelt_key() -> None:
    broken = _load("pool")
    broken["panels"][1]["fieldConfg"] = broken["panels"][1].pop("fieldConfig")
    parsed = json.loads(json.dumps(Dashboard.from_json(broken), cls=JSONEncoder))
    assert any("fieldConfg" in p for p in _lost(broken, parsed))


def _panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return out


@pytest.mark.parametrize("name", NAMES)
def test_dashboard_conventions(name: str) -> None:
    d = _load(name)
    assert d["schemaVersion"] >= 36 and d["uid"] == f"poolpilot-{name}"
    ids = [p["id"] for p in _panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "namespace" in variables and (name == "fleet" or "pool" in variables)
    for p in _panels(d):
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"


@dataclass(frozen=True)
class Box:
    x: int
    y: int
    w: int
    h: int

    def overlaps(self, o: Box) -> bool:
        return (self.x < o.x + o.w and o.x < self.x + self.w
                and self.y < o.y + o.h and o.y < self.y + self.h)


@pytest.mark.parametrize("name", NAMES)
def test_panels_fit_the_grid_without_overlapping(name: str) -> None:
    boxes = [(p["title"], Box(**p["gridPos"])) for p in _load(name)["panels"]]
    for title, b in boxes:
        assert b.x >= 0 and b.x + b.w <= 24, title
    for i, (t1, b1) in enumerate(boxes):
        for t2, b2 in boxes[i + 1:]:
            assert not b1.overlaps(b2), f"{t1!r} overlaps {t2!r}"


KNOWN = {v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str)}


@pytest.mark.parametrize("name", NAMES)
def test_queries_use_known_metric_names_and_variables(name: str) -> None:
    d = _load(name)
    exprs = [t["expr"] for p in _panels(d) for t in p.get("targets", [])]
    exprs += [a["expr"] for a in d["annotations"]["list"] if "expr" in a]
    for expr in exprs:
        plain = re.sub(r'__name__=~"[^"]*"', "", expr)
        names = re.findall(r"([a-z_:]+)(?:\{|\[)", plain)
        names += re.findall(r"\b(?:sum|max|min|avg|count)\(([a-z_:]+)\)", plain)  # bare
        for group in re.findall(r'__name__=~"vllm\[:_\]\(?([a-z_|]+)\)?"', expr):
            names += [f"vllm:{n}" for n in group.split("|")]
        assert names, expr
        for metric in names:
            base = re.sub(r"_(bucket|count|sum)$", "", metric)
            assert base in KNOWN | set(metrics.VLLM_RENAMED.values()) or base == "up", (
                f"{base} is not in poolpilot.metrics")
        # Every per-pool panel follows the pool picker (the cycle time is the autoscaler's own).
        if name != "fleet" and metrics.AUTOSCALER_CYCLE not in expr:
            assert 'pool=~"$pool"' in expr, expr


def test_pool_dashboard_covers_what_operators_look_at() -> None:
    text = json.dumps(_load("pool")).replace("vllm[:_](", "vllm:").replace("vllm[:_]", "vllm:")
    for metric in (metrics.ROUTER_TTFT, metrics.VLLM_TTFT, metrics.ROUTER_ITL, metrics.VLLM_ITL,
                   metrics.VLLM_WAITING, metrics.VLLM_KV_USAGE, metrics.VLLM_PROMPT_TOKENS,
                   metrics.VLLM_GENERATION_TOKENS, metrics.AUTOSCALER_DESIRED,
                   metrics.AUTOSCALER_SIGNAL_TARGET):
        assert metric in text
    annotations = [a for a in _load("pool")["annotations"]["list"] if a["name"] == "Scale events"]
    assert annotations and metrics.AUTOSCALER_DESIRED in annotations[0]["expr"]
    assert "Prefill:decode ratio" in text


def _grafana_units() -> set[str]:
    """Every unit id Grafana knows, from grafana-foundation-sdk's generated list."""
    import typing

    from grafana_foundation_sdk.models import units

    hints = typing.get_type_hints(units)
    return {value for name, hint in hints.items() if typing.get_origin(hint) is typing.Literal
            for value in typing.get_args(hint)} | {getattr(units, n) for n in hints}


def _units(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["unit"]] if isinstance(node.get("unit"), str) else []
        if node.get("id") == "unit" and isinstance(node.get("value"), str):
            found.append(node["value"])  # an override's unit
        return found + [u for v in node.values() for u in _units(v)]
    if isinstance(node, list):
        return [u for v in node for u in _units(v)]
    return []


@pytest.mark.parametrize("name", NAMES)
def test_every_unit_is_a_grafana_unit_id(name: str) -> None:
    known = _grafana_units()
    assert {"s", "reqps", "percentunit", "short", "cps"} <= known  # the list is the real one
    assert "tps" not in known
    used = _units(_load(name))
    assert used
    assert sorted(set(used) - known) == [], f"not Grafana unit ids: {set(used) - known}"


def test_each_autoscaler_signal_has_one_panel_in_its_unit() -> None:
    """Every name in the autoscaler's signal vocabulary (what `decide.Signal.name` is typed
    as, so mypy holds the decision core to it) is drawn in exactly one panel of its unit."""
    from poolpilot.autoscaler import decide

    from poolpilot.reasons import SignalName

    assert set(decide._ABOVE) | set(decide._BELOW) <= set(SignalName)
    assert set(grafana.SIGNAL_UNITS) == set(SignalName), "a signal without a panel"
    panels = [p for p in _load("autoscaler")["panels"] if p.get("targets")]
    for signal, unit in grafana.SIGNAL_UNITS.items():
        showing = [p for p in panels if any(re.search(rf'signal=~"[^"]*\b{signal}\b', t["expr"])
                                            for t in p["targets"])]
        assert len(showing) == 1, (signal, [p["title"] for p in showing])
        assert showing[0]["fieldConfig"]["defaults"]["unit"] == unit, signal


def test_scale_annotations_name_the_role_the_size_and_the_reason() -> None:
    [scale] = [a for a in _load("pool")["annotations"]["list"] if a["name"] == "Scale events"]
    shown = scale["titleFormat"] + scale["textFormat"]
    for label in ("{{role}}", "{{replicas}}", "{{reason}}", "{{direction}}"):
        assert label in shown, label
    assert "reason" in scale["tagKeys"]


def test_fleet_dashboard_has_a_row_for_every_operator_metric() -> None:
    """The operator's own series (poolpilot.operator.metrics) are drawn in the Fleet
    dashboard's Operator row; a new operator metric without a panel fails here."""
    fleet = _load("fleet")
    titles = [p["title"] for p in fleet["panels"]]
    row = titles.index("Operator")
    below = json.dumps(fleet["panels"][row + 1:])
    exported = {v for k, v in vars(metrics).items() if k.startswith("OPERATOR_")}
    assert len(exported) == 6
    for metric in exported:
        assert metric.removesuffix("_total") in below, f"{metric} has no panel"
