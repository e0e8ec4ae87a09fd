"""Multi-node roles in the autoscaler's adapter: the role's LeaderWorkerSet is read like a
Deployment (its replicas are groups), scaled through its own /scale subresource, its stuck
groups count once however many of their pods are Pending, no pod is marked as a scale-down's
victim ahead of time (the set removes its highest groups), and a cluster without the kind
costs one look per minute."""

from __future__ import annotations

import asyncio
from typing import Any

from poolpilot.autoscaler.kube import KubeError, KubeScaler, RoleState, Workloads

from poolpilot import leaderworkerset as lws
from poolpilot import names

MANAGED = {names.MANAGED_BY: names.MANAGER}


def lws_set(replicas: int, ready: int) -> dict[str, Any]:
    return {"apiVersion": lws.API_VERSION, "kind": lws.KIND,
            "metadata": {"name": "p-decode-lws", "namespace": "ns", "generation": 1,
                         "labels": {**MANAGED, names.POOL_LABEL: "p", names.ROLE_LABEL: "decode"}},
            "spec": {"replicas": replicas},
            "status": {"replicas": replicas, "readyReplicas": ready, "observedGeneration": 1}}


class FakeShared:
    """The shared client's verbs the adapter calls, against a few objects."""

    def __init__(self, serves_lws: bool = True) -> None:
        self.serves_lws = serves_lws
        self.sets = [lws_set(2, 1)]
        self.lists: list[str] = []
        self.patches: list[tuple[str, str, str, dict[str, Any], str | None]] = []

    async def list(self, api_version: str | None, kind: str, namespace: str | None = None, *,
                   label_selector: str | None = None, field_selector: str | None = None
                   ) -> list[dict[str, Any]]:
        self.lists.append(kind)
        if kind == lws.KIND:
            if not self.serves_lws:
                raise KubeError(404, "the server does not serve LeaderWorkerSet")
            return self.sets
        if kind == "Deployment":
            return [{"metadata": {"name": "p-prefill", "namespace": "ns"},
                     "spec": {"replicas": 1}}]
        return []

    async def merge_patch(self, api_version: str, kind: str, namespace: str, name: str,
                          body: dict[str, Any], subresource: str | None = None,
                          manager: str | None = None) -> dict[str, Any]:
        self.patches.append((api_version, kind, name, body, subresource))
        return {}


def test_a_multi_node_role_is_read_and_scaled_through_its_leaderworkerset() -> None:
    shared = FakeShared()
    kube = KubeScaler(shared)  # type: ignore[arg-type]

    async def run() -> Workloads:
        wl = await kube.workloads()
        await kube.scale("ns", "p-decode", 3)
        await kube.scale("ns", "p-prefill", 2)
        return wl

    wl = asyncio.run(run())
    state = wl.role_state("ns", "p", "decode")
    assert state is not None and (state.replicas, state.ready) == (2, 1)
    assert shared.patches == [
        (lws.API_VERSION, lws.KIND, "p-decode-lws", {"spec": {"replicas": 3}}, "scale"),
        ("apps/v1", "Deployment", "p-prefill", {"spec": {"replicas": 2}}, "scale"),
    ]
    # The set takes its highest groups on a scale-down: no pod is chosen and marked first.
    assert asyncio.run(kube.role_pods("ns", "p", "decode")) == []


def test_a_cluster_without_leaderworkersets_is_asked_once_a_minute() -> None:
    shared = FakeShared(serves_lws=False)
    kube = KubeScaler(shared)  # type: ignore[arg-type]

    async def two_cycles() -> None:
        await kube.workloads()
        await kube.workloads()
        await kube.scale("ns", "p-decode", 2)

    asyncio.run(two_cycles())
    assert shared.lists.count(lws.KIND) == 1
    assert shared.patches[0][:3] == ("apps/v1", "Deployment", "p-decode")


def _pending(name: str, group: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {lws.NAME_LABEL: "p-decode-lws",
                                                   lws.GROUP_INDEX_LABEL: group}},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                       "reason": "Unschedulable", "message": "no GPUs"}]}}


def test_a_stuck_group_counts_as_one_replica() -> None:
    wl = Workloads(deployments={("ns", "p-decode"): lws_set(3, 1)},
                   pods={("ns", "p", "decode"): [_pending("p-decode-lws-1", "1"),
                                                 _pending("p-decode-lws-1-1", "1"),
                                                 _pending("p-decode-lws-2-1", "2")]})
    assert wl.role_state("ns", "p", "decode") == RoleState(
        replicas=3, ready=1, starting=0, unschedulable=2, unschedulable_message="no GPUs")
