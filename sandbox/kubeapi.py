"""A small async client for the Kubernetes API the sandbox's controller needs (httpx, JSON).

The controller talks to the emulator directly over HTTP with the few verbs it uses; the
operator, autoscaler and router use their own real clients (Kopf, kubernetes_asyncio).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx

Obj = dict[str, Any]

# kind -> (api prefix, plural)
RESOURCES: dict[str, tuple[str, str]] = {
    "Pod": ("/api/v1", "pods"),
    "Service": ("/api/v1", "services"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Secret": ("/api/v1", "secrets"),
    "Event": ("/api/v1", "events"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "EndpointSlice": ("/apis/discovery.k8s.io/v1", "endpointslices"),
    "InferencePool": ("/apis/poolpilot.dev/v1alpha1", "inferencepools"),
}


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:300]}")
        self.status = status


def path_for(kind: str, namespace: str | None = None, name: str | None = None,
             sub: str | None = None) -> str:
    prefix, plural = RESOURCES[kind]
    path = prefix + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


class KubeClient:
    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, timeout=timeout)

    async def close(self) -> None:
        await self.http.aclose()

    async def _call(self, method: str, path: str, *, body: Any = None,
                    content_type: str = "application/json",
                    params: Mapping[str, str] | None = None, ok404: bool = False) -> Obj | None:
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        content = json.dumps(body) if body is not None else None
        r = await self.http.request(method, path, content=content, headers=headers,
                                    params=params)
        if r.status_code == 404 and ok404:
            return None
        if r.status_code >= 400:
            raise ApiError(r.status_code, method, path, r.text)
        result: Obj = r.json() if r.content else {}
        return result

    async def list(self, kind: str, namespace: str | None = None,
                   label_selector: str | None = None) -> list[Obj]:
        params = {"labelSelector": label_selector} if label_selector else None
        out = await self._call("GET", path_for(kind, namespace), params=params)
        assert out is not None
        items: list[Obj] = out.get("items") or []
        return items

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        return await self._call("GET", path_for(kind, namespace, name), ok404=True)

    async def create(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        out = await self._call("POST", path_for(obj["kind"], meta["namespace"]), body=obj)
        assert out is not None
        return out

    async def merge_patch(self, kind: str, namespace: str, name: str, patch: Obj,
                          sub: str | None = None) -> Obj | None:
        return await self._call(
            "PATCH", path_for(kind, namespace, name, sub), body=patch,
            content_type="application/merge-patch+json", ok404=True,
        )

    async def replace(self, obj: Obj) -> Obj | None:
        meta = obj["metadata"]
        return await self._call("PUT", path_for(obj["kind"], meta["namespace"], meta["name"]),
                                body=obj, ok404=True)

    async def delete(self, kind: str, namespace: str, name: str,
                     grace_seconds: int | None = None) -> Obj | None:
        body = None
        if grace_seconds is not None:
            body = {"kind": "DeleteOptions", "apiVersion": "v1",
                    "gracePeriodSeconds": grace_seconds}
        return await self._call("DELETE", path_for(kind, namespace, name), body=body, ok404=True)
