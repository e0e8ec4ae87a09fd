"""The operator and a multi-node role against the Kubernetes API emulator: without the
LeaderWorkerSet CRD the pool is Degraded naming the missing kind; with it, the role's set is
applied with its starting size under the size manager (the autoscaler's to change) and the
role's Service selects the groups' leaders."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from poolpilot.emulator.cluster import leaderworkersets
from poolpilot.emulator.server import KubeEmulator
from poolpilot.operator import builders
from poolpilot.operator.handlers import OperatorConfig
from poolpilot.testkit.operator import Kubectl, install, running_operator
from poolpilot.testkit.polling import wait_for

from poolpilot import leaderworkerset as lws
from poolpilot.validate import parse_spec

pytestmark = [pytest.mark.adapter, pytest.mark.cluster]

NS = "mn"
POOLS = "inferencepools.poolpilot.dev"
SETS = "leaderworkersets.leaderworkerset.x-k8s.io"
CONFIG = OperatorConfig(drift_interval=1.0, cutover_poll=0.3, permanent_backoff=(0.5, 4.0))


def pool(name: str) -> dict[str, Any]:
    return {"apiVersion": "poolpilot.dev/v1alpha1", "kind": "InferencePool",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"model": {"name": "org/model"}, "prefill": {"gpus": 0},
                     "decode": {"gpus": 0, "nodesPerReplica": 2, "replicas": 2,
                                "minReplicas": 1}}}


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    with KubeEmulator().running() as emulator:
        kubeconfig: Path = emulator.write_kubeconfig(tmp_path_factory.mktemp("mn") / "kubeconfig")
        k = Kubectl(kubeconfig)
        install(k)
        k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        with running_operator(kubeconfig, CONFIG):
            yield k


def degraded(kubectl: Kubectl, name: str) -> dict[str, Any] | None:
    obj = kubectl.get(POOLS, name, NS) or {}
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c["type"] == "Degraded" and c["status"] == "True"), None)


def test_without_leaderworkersets_the_pool_says_what_is_missing(kubectl: Kubectl) -> None:
    kubectl.apply(pool("nolws"))
    cond = wait_for(lambda: degraded(kubectl, "nolws"), timeout=30,
                    what="Degraded=True for the missing kind")
    assert "LeaderWorkerSet" in cond["message"], cond
    kubectl("delete", POOLS, "nolws", "-n", NS)


def test_the_set_gets_its_starting_size_and_the_service_its_leaders(kubectl: Kubectl) -> None:
    kubectl.apply(leaderworkersets.crd(), server_side=True)
    wait_for(lambda: "leaderworkersets" in kubectl("api-resources",
                                                    f"--api-group={lws.GROUP}"),
             what="the LWS CRD served")
    kubectl.apply(pool("big"))
    obj = wait_for(lambda: kubectl.get(SETS, "big-decode-lws", NS), timeout=30,
                   what="the decode LeaderWorkerSet")
    wait_for(lambda: (kubectl.get(SETS, "big-decode-lws", NS) or {}).get(
        "spec", {}).get("replicas") == 2, timeout=30, what="its starting size")
    obj = kubectl.get(SETS, "big-decode-lws", NS) or obj
    # Autoscaling is on: what the operator applies has no size; 2 is the size manager's.
    (rendered,) = [o for o in builders.build_children(
        builders.Pool("big", NS, parse_spec(pool("big")["spec"]))) if o["kind"] == lws.KIND]
    assert "replicas" not in rendered["spec"]
    assert obj["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert kubectl.get("deployment", "big-decode", NS) is None
    assert kubectl.get("deployment", "big-prefill", NS) is not None
    svc = kubectl.get("service", "big-decode", NS) or {}
    assert svc["spec"]["selector"][lws.WORKER_INDEX_LABEL] == "0"
