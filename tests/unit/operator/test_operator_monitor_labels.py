"""--monitor-label: checked like Kubernetes checks labels, and put on the per-pool monitors
only (never over the pool's own labels)."""

from __future__ import annotations

import pytest
from poolpilot.operator import builders, labels

from poolpilot import names
from poolpilot.validate import parse_spec


@pytest.mark.parametrize("text,want", [
    ("release=kube-prometheus-stack", ("release", "kube-prometheus-stack")),
    ("prometheus.io/team=ml", ("prometheus.io/team", "ml")),
    ("empty=", ("empty", "")),
    ("a=b=c", None),  # '=' is not a value character
    ("no-equals", None),
    ("bad key=1", None),
    ("-lead=x", None),
    ("k=" + "v" * 64, None),
    ("Upper.Case/k=v", None),  # the prefix is a DNS subdomain (lower case)
], ids=["simple", "prefixed", "empty-value", "equals-in-value", "no-equals", "space", "dash",
        "long-value", "upper-prefix"])
def test_parse(text: str, want: tuple[str, str] | None) -> None:
    if want is None:
        with pytest.raises(ValueError, match=r"label|KEY=VALUE"):
            labels.parse(text)
    else:
        assert labels.parse(text) == want


def test_monitors_carry_the_labels_and_nothing_else_does() -> None:
    pool = builders.Pool("p", "ns", parse_spec({"model": {"name": "m"}}), uid="u")
    caps = builders.Capabilities(monitoring=True, monitor_labels=labels.parse_all(
        ["release=kps", f"{names.POOL_LABEL}=hijack"]))
    objs = builders.build_children(pool, caps)
    monitors = [o for o in objs if o["kind"] in ("ServiceMonitor", "PodMonitor")]
    assert len(monitors) == 2
    for obj in objs:
        lab = obj["metadata"]["labels"]
        assert lab[names.POOL_LABEL] == "p"  # the pool's own label wins
        assert ("release" in lab) is (obj in monitors), obj["kind"]
