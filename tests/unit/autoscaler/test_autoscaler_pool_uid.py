"""A pool's pods are those labelled with its uid, or with no uid label (an older operator's,
until their Deployment rolls them): a stray pod labelled with the pool's name but another
uid (a deleted pool's of the same name) feeds no decision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from poolpilot.autoscaler.kube import RoleState, Workloads, own_pods

from poolpilot import names

UID = "7c1e-uid-of-p"


def pod(name: str, uid: str | None, unschedulable: bool = True) -> dict[str, Any]:
    labels = {names.POOL_LABEL: "p"} | ({names.POOL_UID_LABEL: uid} if uid is not None else {})
    conds = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
              "message": f"{name} does not fit"}] if unschedulable else []
    return {"metadata": {"name": name, "labels": labels}, "status": {"conditions": conds}}


@dataclass
class UidCase:
    id: str
    uids: list[str | None]  # the pods' uid labels (None: no label)
    pool_uid: str
    kept: list[int]  # indexes of the pods that belong to the pool


CASES = [
    UidCase("labelled-with-the-pools-uid", [UID, UID], UID, [0, 1]),
    UidCase("an-older-operators-pods-without-the-label", [None, UID], UID, [0, 1]),
    UidCase("a-stray-pod-of-another-uid-is-left-out", [UID, "old-pool-uid"], UID, [0]),
    UidCase("uid-unknown-keeps-every-pod", [UID, "old-pool-uid", None], "", [0, 1, 2]),
]


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_own_pods(c: UidCase) -> None:
    pods = [pod(f"p-{i}", uid) for i, uid in enumerate(c.uids)]
    assert own_pods(pods, c.pool_uid) == [pods[i] for i in c.kept]


def test_a_stray_unschedulable_pod_does_not_count_for_the_pool() -> None:
    dep = {"metadata": {"name": "p-decode", "namespace": "ns"}, "spec": {"replicas": 2},
           "status": {"readyReplicas": 1}}
    wl = Workloads(deployments={("ns", "p-decode"): dep},
                   pods={("ns", "p", "decode"): [pod("stray", "old-pool-uid"),
                                                 pod("mine", UID)]})
    assert wl.role_state("ns", "p", "decode", UID) == RoleState(
        replicas=2, ready=1, starting=0, unschedulable=1, unschedulable_message="mine does not fit")
