"""Kubernetes adapter (kubernetes_asyncio): pools, role sizes, scale, status and Events.

Each cycle lists InferencePools, Deployments and pods once (cluster-wide, or once per watched
namespace), never per pool. Writes: the Deployment's scale subresource, the pool's status
subresource (only the autoscaler's own fields and conditions) and Events.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from poolpilot.autoscaler.observe import RoleState

from poolpilot import api, names, workloads

Obj = dict[str, Any]
MANAGER = "poolpilot-autoscaler"
AUTOSCALER_CONDITIONS = (api.ConditionType.METRICS_AVAILABLE, api.ConditionType.SCALING_LIMITED)
CONFLICT_RETRIES = 5


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass
class Workloads:
    """Deployments and pods of every pool in scope, indexed for one cycle."""

    deployments: dict[tuple[str, str], Obj]  # (namespace, name) -> Deployment
    pods: dict[tuple[str, str, str], list[Obj]]  # (namespace, pool, role) -> pods

    def role_state(self, namespace: str, pool: str, role: str) -> RoleState | None:
        """None when the role's Deployment does not exist (yet)."""
        dep = self.deployments.get((namespace, names.child_name(pool, role)))
        if dep is None:
            return None
        c = workloads.counts(dep)
        replicas, ready = c.desired, c.ready
        pods = self.pods.get((namespace, pool, role), [])
        stuck = [p for p in pods if unschedulable(p) is not None]
        message = unschedulable(stuck[0]) or "" if stuck else ""
        ready = min(ready, replicas) if replicas else 0
        return RoleState(
            replicas=replicas,
            ready=ready,
            # Asked for but not ready and not stuck: Pending or loading weights, on the way.
            starting=max(0, replicas - ready - len(stuck)),
            unschedulable=len(stuck),
            unschedulable_message=message,
        )


def unschedulable(pod: Obj) -> str | None:
    """The scheduler's message when the pod cannot be placed, else None."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (cond.get("type") == "PodScheduled" and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"):
            return str(cond.get("message") or "Unschedulable")
    return None


class Kube(Protocol):
    async def list_pools(self) -> list[Obj]: ...
    async def workloads(self) -> Workloads: ...
    async def scale(self, namespace: str, name: str, replicas: int) -> None: ...
    async def patch_status(self, namespace: str, name: str, role_fields: Mapping[str, Obj],
                           metrics: Obj | None, conditions: Iterable[Obj]) -> bool: ...
    async def event(self, pool: Obj, reason: str, message: str, type_: str = "Normal"
                    ) -> None: ...


class KubeClient:
    """The real adapter. `namespaces` empty: cluster-wide lists."""

    def __init__(self, api_client: Any, namespaces: Iterable[str] = ()) -> None:
        self.api = api_client
        self.namespaces = tuple(namespaces)
        self.requests = 0  # API calls made (the benchmark reports them)

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, namespaces: Iterable[str] = ()
                      ) -> KubeClient:
        """From a kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) or in-cluster."""
        from kubernetes_asyncio import client, config

        cfg = client.Configuration()
        path = kubeconfig or os.environ.get("KUBECONFIG")
        default = Path.home() / ".kube" / "config"
        try:
            if path or default.exists():
                await config.load_kube_config(config_file=path, client_configuration=cfg)
            else:
                config.load_incluster_config(client_configuration=cfg)
        except (config.ConfigException, OSError) as exc:
            raise KubeError(0, f"no usable cluster configuration ({exc}); pass --kubeconfig, "
                            "set KUBECONFIG, or run inside a cluster") from exc
        return cls(client.ApiClient(cfg), namespaces)

    async def close(self) -> None:
        await self.api.close()

    async def request(self, method: str, path: str, query: list[tuple[str, str]] | None = None,
                      body: Any = None, content_type: str = "application/json") -> Obj:
        from kubernetes_asyncio.client.rest import ApiException

        self.requests += 1
        try:
            data = await self.api.call_api(
                path, method, query_params=query or [],
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body, response_types_map={200: "object", 201: "object"},
                auth_settings=["BearerToken"], _return_http_data_only=True,
            )
        except ApiException as exc:
            raise KubeError(int(exc.status or 0), str(exc.body or exc.reason)[:500]) from exc
        return data if isinstance(data, dict) else {}

    def _paths(self, cluster: str, namespaced: str) -> list[str]:
        if not self.namespaces:
            return [cluster]
        return [namespaced.format(ns=ns) for ns in self.namespaces]

    async def _list(self, cluster: str, namespaced: str, selector: str | None = None
                    ) -> list[Obj]:
        items: list[Obj] = []
        query = [("labelSelector", selector)] if selector else []
        for path in self._paths(cluster, namespaced):
            items += (await self.request("GET", path, query)).get("items") or []
        return items

    async def list_pools(self) -> list[Obj]:
        g = f"/apis/{api.GROUP}/{api.VERSION}"
        return await self._list(f"{g}/{api.PLURAL}", g + "/namespaces/{ns}/" + api.PLURAL)

    async def workloads(self) -> Workloads:
        managed = f"{names.MANAGED_BY}={names.MANAGER}"
        deps = await self._list("/apis/apps/v1/deployments",
                                "/apis/apps/v1/namespaces/{ns}/deployments", managed)
        pods = await self._list("/api/v1/pods", "/api/v1/namespaces/{ns}/pods", managed)
        by_pool: dict[tuple[str, str, str], list[Obj]] = {}
        for pod in pods:
            meta = pod.get("metadata") or {}
            labels = meta.get("labels") or {}
            key = (meta.get("namespace", ""), labels.get(names.POOL_LABEL, ""),
                   labels.get(names.ROLE_LABEL, ""))
            by_pool.setdefault(key, []).append(pod)
        return Workloads(
            deployments={(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in deps},
            pods=by_pool,
        )

    async def scale(self, namespace: str, name: str, replicas: int) -> None:
        await self.request(
            "PATCH", f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale",
            [("fieldManager", MANAGER)], {"spec": {"replicas": replicas}},
            "application/merge-patch+json",
        )

    async def patch_status(self, namespace: str, name: str, role_fields: Mapping[str, Obj],
                           metrics: Obj | None, conditions: Iterable[Obj]) -> bool:
        """Merge the autoscaler's fields into the pool's status. Per-role fields are merged
        key by key; conditions are a list, so they are read, merged by type and written with
        the resourceVersion read (409 -> read again). Returns False when nothing changed."""
        path = (f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{namespace}/{api.PLURAL}/{name}")
        wanted = list(conditions)
        for attempt in range(CONFLICT_RETRIES):
            live = await self.request("GET", path)
            patch = status_patch(live.get("status") or {}, role_fields, metrics, wanted)
            if patch is None:
                return False
            body = {"metadata": {"resourceVersion": live["metadata"]["resourceVersion"]},
                    "status": patch}
            try:
                await self.request("PATCH", path + "/status", [("fieldManager", MANAGER)], body,
                                   "application/merge-patch+json")
                return True
            except KubeError as exc:
                if exc.status != 409 or attempt == CONFLICT_RETRIES - 1:
                    raise
        return False

    async def event(self, pool: Obj, reason: str, message: str, type_: str = "Normal") -> None:
        meta = pool["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": api.API_VERSION, "kind": api.KIND, "name": meta["name"],
                "namespace": meta["namespace"], "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": MANAGER},
            "reportingComponent": MANAGER,
            "reportingInstance": socket.gethostname(),
            # Legacy-style timestamps (no eventTime), which every API server accepts.
            "firstTimestamp": now[:19] + "Z",
            "lastTimestamp": now[:19] + "Z",
            "count": 1,
        }
        await self.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body=body)


def status_patch(live: Obj, role_fields: Mapping[str, Obj], metrics: Obj | None,
                 conditions: list[Obj]) -> Obj | None:
    """The merge patch for the autoscaler's part of a pool's status, or None if it is all
    there already. Conditions keep their lastTransitionTime unless their status changes, and
    the operator's conditions are carried over untouched."""
    patch: Obj = {}
    for role, fields in role_fields.items():
        current = live.get(role) or {}
        changed = {k: v for k, v in fields.items() if current.get(k) != v}
        if changed:
            patch[role] = changed
    if metrics is not None:
        cur = live.get("metrics") or {}
        changed = {k: v for k, v in metrics.items() if cur.get(k) != v}
        if changed:
            patch["metrics"] = changed
    live_conds = list(live.get("conditions") or [])
    by_type = {c.get("type"): c for c in live_conds}
    merged = list(live_conds)
    cond_changed = False
    for want in conditions:
        old = by_type.get(want["type"])
        new = dict(want)
        if old is not None and old.get("status") == want["status"]:
            new["lastTransitionTime"] = old.get("lastTransitionTime", want["lastTransitionTime"])
        if old is None:
            merged.append(new)
            cond_changed = True
        elif any(old.get(k) != new.get(k) for k in ("status", "reason", "message")):
            merged[merged.index(old)] = new
            cond_changed = True
    if cond_changed:
        patch["conditions"] = merged
    return patch or None
