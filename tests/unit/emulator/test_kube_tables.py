"""Table output pieces: printer-column JSONPath, ages, fault rules."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from poolpilot.emulator.faults import Faults
from poolpilot.emulator.resources import Registry
from poolpilot.emulator.tables import human_duration, jsonpath, table

OBJ: dict[str, Any] = {
    "metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
    "spec": {"mode": "Disaggregated", "roles": [{"name": "a", "n": 1}, {"name": "b", "n": 2}]},
    "status": {"conditions": [{"type": "Progressing", "status": "False"},
                              {"type": "Ready", "status": "True"}],
               "metrics": {"ttftSeconds": 0.25}},
}


@dataclass(frozen=True)
class PathCase:
    id: str
    path: str
    want: list[Any]


PATHS = [
    PathCase("field", ".spec.mode", ["Disaggregated"]),
    PathCase("braces", "{.spec.mode}", ["Disaggregated"]),
    PathCase("number", ".status.metrics.ttftSeconds", [0.25]),
    PathCase("index", ".spec.roles[1].name", ["b"]),
    PathCase("negative-index", ".spec.roles[-1].n", [2]),
    PathCase("wildcard", ".spec.roles[*].name", ["a", "b"]),
    PathCase("filter", '.status.conditions[?(@.type=="Ready")].status', ["True"]),
    PathCase("filter-single-quotes", ".status.conditions[?(@.type=='Progressing')].status",
             ["False"]),
    PathCase("missing", ".status.nope", []),
    PathCase("index-out-of-range", ".spec.roles[5].name", []),
]


@pytest.mark.parametrize("case", PATHS, ids=lambda c: c.id)
def test_jsonpath(case: PathCase) -> None:
    assert jsonpath(OBJ, case.path) == case.want


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-5, "<invalid>"), (0, "0s"), (59, "59s"), (119, "119s"), (125, "2m5s"), (600, "10m"),
     (3 * 3600 + 60, "3h1m"), (10 * 3600, "10h"), (50 * 3600, "2d2h"), (30 * 86400, "30d"),
     (3 * 365 * 86400, "3y")],
    ids=str,
)
def test_human_duration(seconds: int, text: str) -> None:
    assert human_duration(seconds) == text


def test_crd_table_has_name_then_printer_columns() -> None:
    import yaml
    from poolpilot.emulator.resources import from_crd
    crd = yaml.load((Path(__file__).resolve().parents[3] / "crds/inferencepool.yaml")
                    .read_text(), Loader=yaml.CSafeLoader)  # libyaml: the CRD is 300 kB
    rt = from_crd(crd)[0]
    t = table(rt, [OBJ], "7")
    assert [c["name"] for c in t["columnDefinitions"]][:3] == ["Name", "Mode", "Prefill"]
    assert t["rows"][0]["cells"][:2] == ["p", "Disaggregated"]
    assert t["rows"][0]["object"]["kind"] == "PartialObjectMetadata"


def test_builtin_table_columns() -> None:
    rt = Registry().resolve("deployments")
    obj = {"metadata": {"name": "d", "creationTimestamp": "2026-01-01T00:00:00Z"},
           "spec": {"replicas": 3}, "status": {"readyReplicas": 2, "updatedReplicas": 3}}
    t = table(rt, [obj], "1", include="Object")
    assert [c["name"] for c in t["columnDefinitions"]] == [
        "Name", "Ready", "Up-to-date", "Available", "Age"]
    assert t["rows"][0]["cells"][:4] == ["d", "2/3", 3, 0]
    assert t["rows"][0]["object"] is obj


def test_fault_rules_match_count_and_expire() -> None:
    faults = Faults()
    faults.add("PATCH", r"/deployments/x$", 409, times=2)
    faults.add(None, r"/pods", 500, times=None, watch=True)
    assert faults.take("GET", "/apis/apps/v1/namespaces/n/deployments/x", False) is None
    assert faults.take("PATCH", "/apis/apps/v1/namespaces/n/deployments/xy", False) is None
    assert faults.take("patch", "/apis/apps/v1/namespaces/n/deployments/x", False) is not None
    assert faults.take("PATCH", "/apis/apps/v1/namespaces/n/deployments/x", False) is not None
    assert faults.take("PATCH", "/apis/apps/v1/namespaces/n/deployments/x", False) is None
    assert faults.take("GET", "/api/v1/pods", False) is None  # not a watch
    for _ in range(3):
        rule = faults.take("GET", "/api/v1/pods", True)
        assert rule is not None
    assert rule.hits == 3 and len(faults.rules) == 1
    faults.clear()
    assert faults.rules == []


@pytest.mark.parametrize(("status", "when"), [("boom", "before"), (500, "later")],
                         ids=["bad-status", "bad-when"])
def test_bad_fault_rules_are_refused(status: Any, when: str) -> None:
    with pytest.raises(ValueError):
        Faults().add("GET", "", status, when=when)
