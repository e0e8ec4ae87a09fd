"""The cluster controller's few verbs, on the shared Kubernetes client (`poolpilot.kubeclient`).

Kinds are named without their group ("Pod", "EndpointSlice"): the shared client finds them
through the API server's discovery, the core group first. Reads and writes of an object that
is gone answer None, as the controller expects of a cluster where pods come and go.
"""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path

from poolpilot.kubeclient import ApiError, KubeClient, Obj

__all__ = ["ApiError", "ControllerApi", "Obj"]


class ControllerApi:
    """What the emulated cluster's controllers (kubelet, Deployments, endpoints,
    LeaderWorkerSets) call, on the shared client; connects on first use, with the emulator's
    kubeconfig."""

    def __init__(self, kubeconfig: str | Path, timeout: float = 10.0) -> None:
        self.kubeconfig = str(kubeconfig)
        self.timeout = timeout
        self._kube: KubeClient | None = None

    async def _client(self) -> KubeClient:
        if self._kube is None:
            self._kube = await KubeClient.connect(self.kubeconfig, timeout=self.timeout,
                                                  user_agent="poolpilot-sandbox")
        return self._kube

    async def close(self) -> None:
        if self._kube is not None:
            await self._kube.close()

    async def list(self, kind: str, namespace: str | None = None,
                   label_selector: str | None = None) -> list[Obj]:
        return await (await self._client()).list(None, kind, namespace,
                                                 label_selector=label_selector)

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        return await (await self._client()).get(None, kind, namespace, name)

    async def create(self, obj: Obj) -> Obj:
        return await (await self._client()).create(obj)

    async def merge_patch(self, kind: str, namespace: str, name: str, patch: Obj,
                          sub: str | None = None) -> Obj | None:
        return await _unless_gone((await self._client()).merge_patch(
            None, kind, namespace, name, patch, subresource=sub))

    async def replace(self, obj: Obj) -> Obj | None:
        return await _unless_gone((await self._client()).replace(obj))

    async def delete(self, kind: str, namespace: str, name: str,
                     grace_seconds: int | None = None) -> bool:
        return await (await self._client()).delete(None, kind, namespace, name,
                                                   propagation=None, grace_seconds=grace_seconds)


async def _unless_gone(call: Awaitable[Obj]) -> Obj | None:
    try:
        result = await call
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    return result
