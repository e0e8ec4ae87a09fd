"""Where the engines are: static URL lists, or the EndpointSlices of the pool's Services.

The operator gives each role a headless Service named `<pool>-prefill`, `<pool>-decode` or
`<pool>-engine`; Kubernetes keeps EndpointSlices labelled `kubernetes.io/service-name=<that>`
with one address per ready pod. Watching them (list, then watch from the list's
resourceVersion; relist on 410 Gone or a dropped stream) shows scaling within seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from poolpilot.names import ENGINE_PORT, ENGINE_ROLES, child_name

log = logging.getLogger("poolpilot.router.discovery")
SERVICE_LABEL = "kubernetes.io/service-name"

OnChange = Callable[[str, list[str], bool], None]  # (role, urls, initial)


def parse_urls(text: str) -> list[str]:
    """'http://a:8000,b:8000/' -> ['http://a:8000', 'http://b:8000']."""
    urls = []
    for part in text.split(","):
        part = part.strip().rstrip("/")
        if not part:
            continue
        if "://" not in part:
            part = "http://" + part
        urls.append(part)
    return urls


def role_of_service(pool: str, service: str) -> str | None:
    for role in ENGINE_ROLES:
        if service == child_name(pool, role):
            return role
    return None


def endpoints_from_slices(pool: str, slices: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """URLs per role from EndpointSlice objects (camelCase dicts as the API serves them).

    An address counts unless its `conditions.ready` is false (absent means ready, as in
    Kubernetes); the port is the one named `http`, else the first, else the engine port."""
    out: dict[str, list[str]] = {role: [] for role in ENGINE_ROLES}
    for s in slices:
        labels = (s.get("metadata") or {}).get("labels") or {}
        role = role_of_service(pool, labels.get(SERVICE_LABEL, ""))
        if role is None:
            continue
        ports = s.get("ports") or []
        named = [p for p in ports if p.get("name") == "http" and p.get("port")]
        port = (named or [p for p in ports if p.get("port")] or [{"port": ENGINE_PORT}])[0]["port"]
        for ep in s.get("endpoints") or []:
            if (ep.get("conditions") or {}).get("ready") is False:
                continue
            for address in (ep.get("addresses") or [])[:1]:
                host = f"[{address}]" if ":" in address else address
                out[role].append(f"http://{host}:{port}")
    return {role: sorted(set(urls)) for role, urls in out.items()}


def label_selector(pool: str) -> str:
    services = ",".join(child_name(pool, role) for role in ENGINE_ROLES)
    return f"{SERVICE_LABEL} in ({services})"


class KubernetesDiscovery:
    """Watches the pool's EndpointSlices and calls `on_change(role, urls, initial)` when a
    role's set of ready endpoints changes."""

    def __init__(
        self, namespace: str, pool: str, on_change: OnChange, kubeconfig: str | None = None,
        relist_delay_s: float = 1.0,
    ) -> None:
        self.namespace = namespace
        self.pool = pool
        self.on_change = on_change
        self.kubeconfig = kubeconfig
        self.relist_delay_s = relist_delay_s
        self.synced = asyncio.Event()
        self._slices: dict[str, dict[str, Any]] = {}
        self._last: dict[str, list[str]] = {}

    async def _client(self) -> Any:
        from kubernetes_asyncio import client, config

        if self.kubeconfig:
            await config.load_kube_config(config_file=self.kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                await config.load_kube_config()
        return client.ApiClient()

    def _emit(self) -> None:
        current = endpoints_from_slices(self.pool, self._slices.values())
        initial = not self.synced.is_set()
        for role, urls in current.items():
            if self._last.get(role) != urls:
                self.on_change(role, urls, initial)
        self._last = current
        self.synced.set()

    async def run(self) -> None:
        from kubernetes_asyncio import client, watch
        from kubernetes_asyncio.client.exceptions import ApiException

        api_client = await self._client()
        api = client.DiscoveryV1Api(api_client)
        selector = label_selector(self.pool)
        try:
            while True:
                try:
                    listed = await api.list_namespaced_endpoint_slice(
                        self.namespace, label_selector=selector
                    )
                    self._slices = {
                        item.metadata.name: api_client.sanitize_for_serialization(item)
                        for item in listed.items
                    }
                    self._emit()
                    w = watch.Watch()
                    async with w.stream(
                        api.list_namespaced_endpoint_slice, self.namespace,
                        label_selector=selector,
                        resource_version=listed.metadata.resource_version,
                        timeout_seconds=300, allow_watch_bookmarks=True,
                    ) as events:
                        async for event in events:
                            self._apply(event, api_client)
                except asyncio.CancelledError:
                    raise
                except ApiException as exc:
                    # 410 Gone (too old a resourceVersion) and friends: list again.
                    log.info("endpointslice watch: %s; relisting", exc.status)
                except Exception as exc:  # network errors: keep the last view, retry
                    log.warning("endpointslice watch failed: %r; relisting", exc)
                await asyncio.sleep(self.relist_delay_s)
        finally:
            await api_client.close()

    def _apply(self, event: Mapping[str, Any], api_client: Any) -> None:
        kind = event.get("type")
        obj = event.get("object")
        if kind not in ("ADDED", "MODIFIED", "DELETED") or obj is None:
            return  # BOOKMARK, ERROR (the stream ends and we relist)
        data = obj if isinstance(obj, dict) else api_client.sanitize_for_serialization(obj)
        name = data["metadata"]["name"]
        if kind == "DELETED":
            self._slices.pop(name, None)
        else:
            self._slices[name] = data
        self._emit()
