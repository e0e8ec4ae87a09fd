"""The cluster's deployment controller: Deployments -> Pods as the ReplicaSet controller does
(the plan is pods.plan_replicas: scale up, scale down not-ready pods first then the newest,
template changes replaced surge-first), and the Deployment's status from its pods' readiness."""

from __future__ import annotations

from collections.abc import Mapping

from poolpilot.apitypes import Obj

from . import pods as P
from .kubeapi import ControllerApi
from .status_cache import StatusCache


class DeploymentController:
    def __init__(self, kube: ControllerApi) -> None:
        self.kube = kube
        self._status = StatusCache(kube)

    async def scale(self, deployments: list[Obj], pods: list[Obj],
                    ready: Mapping[str, bool]) -> None:
        """Create and delete pods until each Deployment has its replicas."""
        for d in deployments:
            if d["metadata"].get("deletionTimestamp"):
                continue
            mine = [p for p in pods if P.owned_by(p, d)]
            plan = P.plan_replicas(d, mine, ready)
            for _ in range(plan.create):
                await self.kube.create(P.build_pod(d))
            for name in plan.delete:
                await self.kube.delete("Pod", d["metadata"]["namespace"], name)

    async def write_status(self, deployments: list[Obj], pods: list[Obj],
                           ready: Mapping[str, bool]) -> None:
        """replicas, readyReplicas, updatedReplicas and Available, as `kubectl get deploy`
        shows them."""
        for d in deployments:
            mine = [p for p in pods if P.owned_by(p, d)]
            status = P.deployment_status(d, mine, ready)
            stored = d.get("status") or {}
            changed = any(stored.get(k) != v for k, v in status.items() if k != "conditions")
            await self._status.write("Deployment", d, status, force=changed)
