"""docs/helm.md's table of the operator's verbs says why each is needed: it must name every
(API group, resource, verb) the chart grants the operator, in the cluster-wide and the
namespaced install, and nothing more. Also the values that close the defaults: router auth
and the metrics port the chart's PodMonitor scrapes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from chartlib import ROOT, by_kind, render

DOCS = ROOT / "docs" / "helm.md"
Grant = tuple[str, str, str]  # (API group, resource, verb)


def documented() -> set[Grant]:
    text = DOCS.read_text()
    section = text.split("### The operator's verbs, and why", 1)[1].split("\n- **autoscaler**")[0]
    grants: set[Grant] = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        group_match = re.search(r"\(([a-z0-9.-]+)\)", cells[0])
        group = group_match.group(1) if group_match else ""
        for resource in re.findall(r"`([a-z/]+)`", cells[0]):
            for verb in (v.strip() for v in cells[1].split(",")):
                grants.add((group, resource, verb))
    return grants


def granted(objs: list[dict[str, Any]]) -> set[Grant]:
    out: set[Grant] = set()
    for kind in ("ClusterRole", "Role"):
        for role in by_kind(objs, kind):
            if not role["metadata"]["name"].endswith("-operator"):
                continue
            for rule in role["rules"]:
                out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"]
                        for v in rule["verbs"]}
    return out


def test_the_docs_name_every_verb_the_operator_holds_and_no_other(tmp_path: Path) -> None:
    rules = granted(render()) | granted(render({"watchNamespaces": ["team-a"]}, tmp=tmp_path))
    docs = documented()
    assert rules - docs == set(), "granted but not explained in docs/helm.md"
    assert docs - rules == set(), "explained in docs/helm.md but not granted"


@pytest.mark.parametrize("router_auth", [True, False], ids=["default-on", "off"])
def test_router_auth_is_on_by_default_and_can_be_turned_off(tmp_path: Path,
                                                            router_auth: bool) -> None:
    values = None if router_auth else {"operator": {"routerAuth": False}}
    objs = render(values, tmp=tmp_path)
    [dep] = [d for d in by_kind(objs, "Deployment") if d["metadata"]["name"].endswith(
        "-operator")]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert ("--router-auth" in args) is router_auth
    secrets = {v for g, r, v in granted(objs) if (g, r) == ("", "secrets")}
    assert secrets == {"create"}  # made, never read, whether or not any pool needs one


def test_the_pod_monitor_scrapes_the_metrics_port(tmp_path: Path) -> None:
    objs = render({"monitoring": {"podMonitor": {"enabled": True}}}, tmp=tmp_path)
    [monitor] = by_kind(objs, "PodMonitor")
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
