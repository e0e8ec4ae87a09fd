"""The operator's Kubernetes API adapter (kubernetes_asyncio), for any kind it manages.

A small surface: get, list by label, server-side apply with one field manager, delete, the
scale subresource and status merge patches. Errors become `ApiError` with the HTTP status so
the handlers can tell transient failures (409, 429, 5xx, timeouts) from real ones.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from poolpilot import api, names

Obj = dict[str, Any]

# kind -> (plural, namespaced)
PLURALS: dict[str, str] = {
    "ConfigMap": "configmaps",
    "ServiceAccount": "serviceaccounts",
    "Service": "services",
    "Pod": "pods",
    "Event": "events",
    "Deployment": "deployments",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "ServiceMonitor": "servicemonitors",
    "PodMonitor": "podmonitors",
    api.KIND: api.PLURAL,
}

SIZE_MANAGER = f"{names.FIELD_MANAGER}-size"
TRANSIENT = {408, 409, 425, 429, 500, 502, 503, 504}


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status

    @property
    def transient(self) -> bool:
        return self.status in TRANSIENT or self.status == 0


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


def collection_path(api_version: str, kind: str, namespace: str | None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{ns}/{PLURALS[kind]}"


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    return f"{collection_path(api_version, kind, namespace)}/{quote(name)}"


class KubeApi:
    """Thin async client; one per operator process (kept in Kopf's memo)."""

    def __init__(self, api_client: client.ApiClient, timeout: float = 10.0) -> None:
        self._client = api_client
        self._timeout = timeout
        self.writes = 0  # counted for logs and benchmarks

    @classmethod
    async def from_kubeconfig(cls, path: str | None = None, timeout: float = 10.0) -> KubeApi:
        """In-cluster credentials when running in a pod, else the kubeconfig (or KUBECONFIG)."""
        if path is None:
            try:
                config.load_incluster_config()
                return cls(client.ApiClient(), timeout)
            except config.ConfigException:
                pass
        # KUBECONFIG is read here, not at import (kubernetes_asyncio's default is frozen then).
        path = path or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        return cls(await config.new_client_from_config(config_file=path), timeout)

    def set_user_agent(self, value: str) -> None:
        self._client.user_agent = value

    async def close(self) -> None:
        await self._client.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        if method != "GET":
            self.writes += 1
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            resp = await self._client.call_api(
                path, method, query_params=query or [], header_params=headers, body=body,
                auth_settings=["BearerToken"], _preload_content=False,
                _request_timeout=self._timeout,
            )  # fmt: skip
            data = await resp.read()
            status = resp.status
            resp.release()
        except ApiException as exc:
            raise ApiError(exc.status or 0, _reason(exc)) from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ApiError(0, f"{type(exc).__name__}: {exc}") from None
        if not 200 <= status <= 299:
            raise ApiError(status, _message(data))
        return json.loads(data) if data else None

    # -- objects -------------------------------------------------------------------------------

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            obj: Obj = await self.request("GET", object_path(api_version, kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def list(
        self, api_version: str, kind: str, namespace: str, selector: dict[str, str]
    ) -> list[Obj]:
        label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        data = await self.request(
            "GET", collection_path(api_version, kind, namespace),
            query=[("labelSelector", label_selector)],
        )  # fmt: skip
        items: list[Obj] = data.get("items") or []
        for item in items:  # lists leave kind/apiVersion out of items
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items

    async def apply(self, obj: Obj) -> Obj:
        """Server-side apply as `poolpilot-operator`, forcing ownership of what we set."""
        meta = obj["metadata"]
        result: Obj = await self.request(
            "PATCH",
            object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]),
            query=[("fieldManager", names.FIELD_MANAGER), ("force", "true")],
            body=obj,
            content_type="application/apply-patch+yaml",
        )
        return result

    async def delete(self, obj: Obj) -> None:
        meta = obj["metadata"]
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background",
                "preconditions": {"uid": meta.get("uid")}}  # fmt: skip
        try:
            await self.request(
                "DELETE",
                object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]),
                body=body,
            )
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def apply_size(self, namespace: str, name: str, replicas: int) -> None:
        """Set a Deployment's size as a separate apply manager, SIZE_MANAGER.

        With autoscaling on, the operator's own apply leaves `replicas` out; had it owned the
        field alone, the API server would drop it (back to 1). Owning the size under another
        manager (the Kubernetes docs' HPA hand-over pattern) keeps it until the autoscaler
        takes it over through the scale subresource.
        """
        body = {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"replicas": replicas}}
        await self.request(
            "PATCH", object_path("apps/v1", "Deployment", namespace, name),
            query=[("fieldManager", SIZE_MANAGER), ("force", "true")],
            body=body, content_type="application/apply-patch+yaml",
        )

    async def patch_status(self, namespace: str, name: str, patch: Obj) -> Obj:
        path = object_path(api.API_VERSION, api.KIND, namespace, name) + "/status"
        result: Obj = await self.request(
            "PATCH", path, query=[("fieldManager", names.FIELD_MANAGER)],
            body=patch, content_type="application/merge-patch+json",
        )  # fmt: skip
        return result

    async def discover(self) -> Discovered:
        data = await self.request("GET", "/apis")
        return Discovered(frozenset(g["name"] for g in data.get("groups") or []))


def _message(data: bytes) -> str:
    try:
        return str(json.loads(data or b"{}").get("message") or data[:200].decode())
    except (ValueError, AttributeError):
        return data[:200].decode(errors="replace")


def _reason(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or b"{}")
        return str(body.get("message") or exc.reason)
    except (ValueError, TypeError):
        return str(exc.reason)
