"""The operator's verbs on the shared Kubernetes client (`poolpilot.kubeclient`).

Server-side apply as `poolpilot-operator`, the size hand-over manager, deletes bound to the
child's uid and merge patches of the pool's status. Credentials, timeouts, discovery and the
error type (`ApiError`, transient or permanent) are the shared client's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from poolpilot.kubeclient import ApiError, KubeClient, Obj

from poolpilot import api, names

__all__ = ["SIZE_MANAGER", "ApiError", "Discovered", "KubeApi", "Obj"]

SIZE_MANAGER = f"{names.FIELD_MANAGER}-size"


@dataclass(frozen=True)
class Discovered:
    """API groups the cluster serves (what decides ServiceMonitor vs annotations)."""

    groups: frozenset[str]

    @property
    def monitoring(self) -> bool:
        return "monitoring.coreos.com" in self.groups

    @property
    def rbac(self) -> bool:
        return "rbac.authorization.k8s.io" in self.groups

    @property
    def network_policies(self) -> bool:
        return "networking.k8s.io" in self.groups

    @property
    def gateway_api(self) -> bool:
        return "gateway.networking.k8s.io" in self.groups

    @property
    def inference_pools(self) -> bool:
        return "inference.networking.k8s.io" in self.groups

    @property
    def leader_worker_set(self) -> bool:
        return "leaderworkerset.x-k8s.io" in self.groups


class KubeApi:
    """One per operator process (kept in Kopf's memo)."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube

    @classmethod
    async def connect(cls, kubeconfig: str | Path | None = None, timeout: float = 10.0,
                      user_agent: str | None = None) -> KubeApi:
        return cls(await KubeClient.connect(kubeconfig, timeout=timeout, user_agent=user_agent))

    @property
    def writes(self) -> int:
        return self.kube.writes

    async def close(self) -> None:
        await self.kube.close()

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        return await self.kube.get(api_version, kind, namespace, name)

    async def list(self, api_version: str, kind: str, namespace: str,
                   selector: dict[str, str]) -> list[Obj]:
        label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        return await self.kube.list(api_version, kind, namespace, label_selector=label_selector)

    async def apply(self, obj: Obj) -> Obj:
        """Server-side apply as `poolpilot-operator`, forcing ownership of what we set."""
        return await self.kube.apply(obj, manager=names.FIELD_MANAGER)

    async def create_absent(self, obj: Obj) -> bool:
        """Create `obj` unless an object of its name exists (True: created). Never reads or
        changes an existing one (the router's key Secret: operator/router_auth.py)."""
        try:
            await self.kube.create(obj, manager=names.FIELD_MANAGER)
        except ApiError as exc:
            if exc.status == 409:  # AlreadyExists
                return False
            raise
        return True

    async def delete(self, obj: Obj) -> None:
        meta = obj["metadata"]
        await self.kube.delete(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"],
                               uid=meta.get("uid"))

    async def apply_size(self, namespace: str, name: str, replicas: int,
                         api_version: str = "apps/v1", kind: str = "Deployment") -> None:
        """Set a Deployment's size as a separate apply manager, SIZE_MANAGER.

        With autoscaling on, the operator's own apply leaves `replicas` out; had it owned the
        field alone, the API server would drop it (back to 1). Owning the size under another
        manager (the Kubernetes docs' HPA hand-over pattern) keeps it until the autoscaler
        takes it over through the scale subresource.
        """
        body = {"apiVersion": api_version, "kind": kind,
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"replicas": replicas}}
        await self.kube.apply(body, manager=SIZE_MANAGER)

    async def patch_status(self, namespace: str, name: str, patch: Obj) -> Obj:
        return await self.kube.merge_patch(api.API_VERSION, api.KIND, namespace, name, patch,
                                           subresource="status", manager=names.FIELD_MANAGER)

    async def event(self, event: Obj) -> Obj:
        return await self.kube.create(event)

    async def discover(self) -> Discovered:
        return Discovered(await self.kube.api_groups())
