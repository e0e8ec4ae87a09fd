"""Discovery drops a terminating endpoint at once (router/discovery.py): by its EndpointSlice
conditions (`terminating`, `serving`, `ready`) or by its pod's deletionTimestamp, which the
pod watch often sees before the slice changes. The router then starts nothing new there."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from poolpilot.router.discovery import (
    KubernetesDiscovery,
    endpoints_from_slices,
    terminating_pods,
)

PORTS = [{"name": "http", "port": 8000}]


def decode_slice(*endpoints: tuple[str, str, dict[str, bool]]) -> dict[str, Any]:
    """(address, pod, conditions) per endpoint, in the `p-decode` Service's slice."""
    return {
        "metadata": {"name": "p-decode-x", "labels": {"kubernetes.io/service-name": "p-decode"}},
        "addressType": "IPv4",
        "ports": PORTS,
        "endpoints": [{"addresses": [a], "conditions": c,
                       "targetRef": {"kind": "Pod", "name": pod}} for a, pod, c in endpoints],
    }


@dataclass(frozen=True)
class Case:
    id: str
    conditions: dict[str, bool]
    counts: bool


# What Kubernetes writes for a pod that is being deleted: ready false, serving as its probe
# says, terminating true; with publishNotReadyAddresses ready stays true, terminating says it.
CASES = [
    Case("serving", {"ready": True, "serving": True, "terminating": False}, True),
    Case("no-conditions-means-ready", {}, True),
    Case("terminating-still-serving", {"ready": False, "serving": True, "terminating": True},
         False),
    Case("terminating-with-ready-true", {"ready": True, "serving": True, "terminating": True},
         False),
    Case("terminating-only", {"terminating": True}, False),
    Case("not-serving", {"serving": False}, False),
    Case("not-ready", {"ready": False}, False),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_an_endpoints_conditions(case: Case) -> None:
    s = decode_slice(("10.0.0.1", "d-keep", {"ready": True}), ("10.0.0.2", "d-x", case.conditions))
    want = ["http://10.0.0.1:8000", *(["http://10.0.0.2:8000"] if case.counts else [])]
    assert endpoints_from_slices("p", [s])["decode"] == want


def pod(name: str, deleting: bool = False, draining: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"poolpilot.dev/pool": "p"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    if draining:
        meta["annotations"] = {"poolpilot.dev/draining": "true"}
    return {"metadata": meta}


def test_a_pod_being_deleted_leaves_even_when_it_is_the_last_of_its_role() -> None:
    """Unlike the autoscaler's draining mark (which never empties a role), a deletion does:
    the engine is going, whatever else is left."""
    s = decode_slice(("10.0.0.1", "d-0", {}), ("10.0.0.2", "d-1", {}))
    pods = [pod("d-0", deleting=True), pod("d-1", draining=True)]
    assert terminating_pods(pods) == {"d-0"}
    got = endpoints_from_slices("p", [s], draining={"d-1"}, terminating=terminating_pods(pods))
    assert got["decode"] == ["http://10.0.0.2:8000"]  # d-1 is held: it is the role's last
    assert endpoints_from_slices("p", [s], terminating={"d-0", "d-1"})["decode"] == []


def test_the_pod_watch_drops_an_endpoint_as_soon_as_its_deletion_shows() -> None:
    seen: list[tuple[str, list[str]]] = []
    d = KubernetesDiscovery("ns", "p", lambda role, urls, initial: seen.append((role, urls)))
    d._apply("ADDED", decode_slice(("10.0.0.1", "d-0", {}), ("10.0.0.2", "d-1", {})))
    d._apply_pod("ADDED", pod("d-0"))
    assert ("decode", ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]) in seen
    # The slice has not changed yet; the pod's deletion alone takes it out.
    d._apply_pod("MODIFIED", pod("d-0", deleting=True))
    assert seen[-1] == ("decode", ["http://10.0.0.2:8000"])
    # The slice catching up (ready false, terminating) changes nothing more.
    before = len(seen)
    d._apply("MODIFIED", decode_slice(("10.0.0.1", "d-0", {"ready": False, "terminating": True}),
                                      ("10.0.0.2", "d-1", {})))
    assert len(seen) == before
