"""A scale-down removes the replicas whose loss costs least, and the router stops sending to
them first: the choice (pure), its annotations, the ReplicaSet order the sandbox's controller
follows, and the endpoints the router's discovery keeps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from poolpilot.autoscaler.victims import PodLoad, annotation_patches, victims
from poolpilot.emulator.cluster.pods import plan_replicas
from poolpilot.router.discovery import draining_pods, endpoints_from_slices

from poolpilot import names


@dataclass(frozen=True)
class Case:
    id: str
    pods: tuple[PodLoad, ...]
    remove: int
    want: list[str]


CASES = [
    Case("fewest-requests-in-flight-goes",
         (PodLoad("a", in_flight=9), PodLoad("b", in_flight=2), PodLoad("c", in_flight=5)),
         1, ["b"]),
    Case("the-pod-whose-cache-serves-least-goes",
         # equal load; b's cache serves most of the role's prefix hits, c's the fewest
         (PodLoad("a", in_flight=4, prefix_hits=3000), PodLoad("b", in_flight=4,
                                                                prefix_hits=9000),
          PodLoad("c", in_flight=4, prefix_hits=500)),
         2, ["c", "a"]),
    Case("a-busy-cache-outweighs-one-request-more",
         # a: 40 % of the requests, 5 % of the hits; b: 30 % and 90 %: losing b costs more
         (PodLoad("a", in_flight=4, prefix_hits=500), PodLoad("b", in_flight=3,
                                                               prefix_hits=9000),
          PodLoad("c", in_flight=3, prefix_hits=500)),
         1, ["c"]),
    Case("not-ready-pods-go-first",
         (PodLoad("a", in_flight=0), PodLoad("b", ready=False, in_flight=7)), 1, ["b"]),
    Case("no-samples-ties-by-name",
         (PodLoad("b"), PodLoad("a"), PodLoad("c")), 2, ["a", "b"]),
    Case("nothing-to-remove", (PodLoad("a", in_flight=1),), 0, []),
]


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_the_cheapest_pods_are_the_victims(c: Case) -> None:
    assert victims(c.pods, c.remove) == c.want


def test_victims_are_annotated_and_old_marks_cleared() -> None:
    pods = (PodLoad("a", in_flight=9), PodLoad("b", in_flight=1), PodLoad("c", in_flight=2),
            PodLoad("d", in_flight=8))
    got = annotation_patches(pods, 2, marked={"a": True, "b": False})
    assert got == {
        "b": {names.DELETION_COST: "-2", names.DRAINING: "true"},  # the cheapest: lowest
        "c": {names.DELETION_COST: "-1", names.DRAINING: "true"},
        "a": {names.DELETION_COST: None, names.DRAINING: None},  # a mark from before
    }


def _pod(name: str, created: str, cost: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created,
                               "labels": {"pod-template-hash": "h"}}
    if cost is not None:
        meta["annotations"] = {names.DELETION_COST: cost}
    return {"metadata": meta}


def test_the_sandbox_replicaset_deletes_the_lowest_deletion_cost_first() -> None:
    from poolpilot.emulator.cluster import pods as P

    dep: dict[str, Any] = {"metadata": {"name": "p-prefill"},
           "spec": {"replicas": 2, "template": {"metadata": {}, "spec": {}}}}
    h = P.template_hash(dep["spec"]["template"])
    live = [_pod("old-busy", "2026-01-01T00:00:00Z"), _pod("newest", "2026-01-03T00:00:00Z"),
            _pod("chosen", "2026-01-02T00:00:00Z", cost="-1")]
    for p in live:
        p["metadata"]["labels"] = {"pod-template-hash": h}
    ready = {"old-busy": True, "newest": True, "chosen": True}
    assert plan_replicas(dep, live, ready).delete == ["chosen"]
    del live[2]["metadata"]["annotations"]
    assert plan_replicas(dep, live, ready).delete == ["newest"]  # without it: the newest


def _slice(role: str, eps: list[tuple[str, str]]) -> dict[str, object]:
    return {"metadata": {"name": f"p-{role}-x",
                         "labels": {"kubernetes.io/service-name": f"p-{role}"}},
            "ports": [{"name": "http", "port": 8000}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True},
                           "targetRef": {"kind": "Pod", "name": pod}} for pod, ip in eps]}


def test_the_router_sends_nothing_new_to_a_pod_marked_draining() -> None:
    slices = [_slice("prefill", [("p0", "10.0.0.1"), ("p1", "10.0.0.2")]),
              _slice("decode", [("d0", "10.0.1.1")])]
    pods = [{"metadata": {"name": "p1", "annotations": {names.DRAINING: "true"}}},
            {"metadata": {"name": "d0", "annotations": {names.DRAINING: "true"}}},
            {"metadata": {"name": "p0"}}]
    marked = draining_pods(pods)
    assert marked == {"p1", "d0"}
    got = endpoints_from_slices("p", slices, marked)
    assert got["prefill"] == ["http://10.0.0.1:8000"]
    # every decode endpoint is marked: the role keeps them rather than have none
    assert got["decode"] == ["http://10.0.1.1:8000"]
    assert endpoints_from_slices("p", slices)["prefill"] == ["http://10.0.0.1:8000",
                                                             "http://10.0.0.2:8000"]
