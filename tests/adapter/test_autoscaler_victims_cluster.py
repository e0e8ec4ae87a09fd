"""Before a scale-down the autoscaler annotates, through the Kubernetes API (the emulator),
the pods whose loss costs least: the pod-deletion-cost the ReplicaSet controller reads and
the draining mark the router's discovery reads; a mark from before is cleared. The calls are
exactly what the chart's autoscaler rules allow (the HA test, which never scales down,
leaves the pods patch to this one)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from poolpilot.autoscaler.kube import KubeScaler
from poolpilot.autoscaler.loop import Autoscaler
from poolpilot.autoscaler.observe import PodSeries, Snapshot
from poolpilot.emulator.server import KubeEmulator
from poolpilot.kubeclient import KubeClient as SharedClient
from rbac_calls import called, chart_rules, compare

from poolpilot import names

pytestmark = [pytest.mark.adapter, pytest.mark.cluster]

NS, POOL = "victims", "chat"


class Source:
    """Prometheus's per-pod answer: p0 busy, p1 idle, p2 in between with a warm cache."""

    def fetch(self, *args: Any, **kw: Any) -> Snapshot:
        return Snapshot(time=0.0)

    def pod_loads(self, namespace: str, pool: str, role: str) -> PodSeries:
        return PodSeries(pod_in_flight={"p0": 9.0, "p1": 1.0, "p2": 1.0},
                         pod_prefix_hits={"p0": 100.0, "p1": 100.0, "p2": 5000.0})


async def scenario(kubeconfig: Path) -> dict[str, dict[str, str]]:
    shared = await SharedClient.connect(str(kubeconfig), user_agent="test")
    kube = await KubeScaler.connect(str(kubeconfig))
    try:
        await shared.create({"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": NS}})
        for i in range(3):
            meta: dict[str, Any] = {"name": f"p{i}", "namespace": NS,
                                    "labels": names.labels(POOL, "prefill")}
            if i == 0:  # marked by an earlier scale-down that did not happen
                meta["annotations"] = {names.DRAINING: "true", names.DELETION_COST: "-1"}
            await shared.create({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                                 "spec": {"containers": [{"name": "e", "image": "x"}]}})
            await shared.merge_patch("v1", "Pod", NS, f"p{i}", {"status": {
                "podIP": f"10.0.0.{i}", "conditions": [{"type": "Ready", "status": "True"}]}},
                subresource="status")
        scaler = Autoscaler(kube, Source())
        marked = await scaler._mark_victims(NS, POOL, "prefill", 2)
        assert marked == ["p1"]
        out = {}
        for i in range(3):
            pod = await shared.get("v1", "Pod", NS, f"p{i}")
            assert pod is not None
            out[f"p{i}"] = pod["metadata"].get("annotations") or {}
        return out
    finally:
        await kube.close()
        await shared.close()


def test_a_scale_down_marks_the_pod_whose_loss_costs_least(tmp_path: Path) -> None:
    with KubeEmulator().running() as emu:
        kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
        start = len(emu.requests)
        got = asyncio.run(scenario(kubeconfig))
        # p1: as few requests as p2, but p2's cache serves most of the role's hits
        assert got["p1"] == {names.DRAINING: "true", names.DELETION_COST: "-1"}
        assert got["p0"] == {} and got["p2"] == {}  # the old mark is gone
        calls = called(list(emu.requests)[start:], ("poolpilot-autoscaler/",))
        refused, _ = compare(calls, chart_rules("-autoscaler"))
        assert calls == {("", "pods", "list"), ("", "pods", "patch")}
        assert refused == set()
