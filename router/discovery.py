"""Where the engines are: static URL lists, or the EndpointSlices of the pool's Services.

The operator gives each role a headless Service named `<pool>-prefill`, `<pool>-decode` or
`<pool>-engine`; Kubernetes keeps EndpointSlices labelled `kubernetes.io/service-name=<that>`
with one address per ready pod. Watching them (list, then watch from the list's
resourceVersion; relist on 410 Gone or a dropped stream) shows scaling within seconds. The API
client is the shared one (`poolpilot.kubeclient`): same credentials order and timeouts as the
operator and autoscaler.

The pool's pods are watched too, for one annotation: before a scale-down the autoscaler marks
the pods it is about to remove `poolpilot.dev/draining: "true"` (with the pod-deletion-cost
that makes the ReplicaSet controller take them). An endpoint whose pod is marked gets no new
request (those in flight finish), unless every endpoint of its role is marked: a role is never
left with nothing to send to on a mark alone.

A terminating endpoint gets no new request at once, whatever else is left: one whose slice
conditions say `terminating: true` or `serving: false` (as well as `ready: false`), or whose
pod has a `deletionTimestamp` (the pod watch often sees the deletion before the slice
changes). Requests in flight there finish: the engine drains on SIGTERM within its grace.

A multi-node role (a LeaderWorkerSet group per replica) is served by each group's leader: its
Service selects leaders only, and an endpoint whose pod is a group's worker (worker index not
0) is dropped here too, should a Service select more.

Only the operator sets `poolpilot.dev/pool-uid` on the pods it creates, and the Services
select by it (docs/operator.md), so the EndpointSlices hold only the pool's own pods; with
`--pool-uid` the pod watch selects by it too, so a stray pod labelled {pool, role} is not
even read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from poolpilot.leaderworkerset import WORKER_INDEX_LABEL, is_worker
from poolpilot.names import (
    DRAINING,
    ENGINE_PORT,
    ENGINE_ROLES,
    POOL_LABEL,
    POOL_UID_LABEL,
    child_name,
)

log = logging.getLogger("poolpilot.router.discovery")
SERVICE_LABEL = "kubernetes.io/service-name"
SLICE_API = "discovery.k8s.io/v1"

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


def endpoints_from_slices(pool: str, slices: Iterable[Mapping[str, Any]],
                          draining: Collection[str] = frozenset(),
                          workers: Collection[str] = frozenset(),
                          terminating: Collection[str] = frozenset()) -> dict[str, list[str]]:
    """URLs per role from EndpointSlice objects (camelCase dicts as the API serves them).

    An address counts unless its `conditions.ready` is false (absent means ready, as in
    Kubernetes), or its pod (`targetRef`) is in `draining` while another endpoint of the role
    is not; the port is the one named `http`, else the first, else the engine port. Pods in
    `workers` (multi-node groups' non-leaders, which serve nothing) never count, nor do
    terminating endpoints (`conditions.terminating` true, `serving` false, or the pod in
    `terminating`)."""
    out: dict[str, list[str]] = {role: [] for role in ENGINE_ROLES}
    held: dict[str, list[str]] = {role: [] for role in ENGINE_ROLES}  # draining pods' URLs
    for s in slices:
        labels = (s.get("metadata") or {}).get("labels") or {}
        role = role_of_service(pool, labels.get(SERVICE_LABEL, ""))
        if role is None:
            continue
        ports = s.get("ports") or []
        named = [p for p in ports if p.get("name") == "http" and p.get("port")]
        port = (named or [p for p in ports if p.get("port")] or [{"port": ENGINE_PORT}])[0]["port"]
        for ep in s.get("endpoints") or []:
            conditions = ep.get("conditions") or {}
            if (conditions.get("ready") is False or conditions.get("serving") is False
                    or conditions.get("terminating") is True):
                continue
            pod = (ep.get("targetRef") or {}).get("name")
            if pod in workers or pod in terminating:
                continue
            for address in (ep.get("addresses") or [])[:1]:
                host = f"[{address}]" if ":" in address else address
                (held if pod in draining else out)[role].append(f"http://{host}:{port}")
    return {role: sorted(set(urls or held[role])) for role, urls in out.items()}


def draining_pods(pods: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """Names of the pods the autoscaler marked as the next to go."""
    return frozenset(str(meta.get("name")) for p in pods
                     if ((meta := p.get("metadata") or {}).get("annotations") or {}).get(
                         DRAINING) == "true")


def terminating_pods(pods: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """Names of the pods being deleted (a `deletionTimestamp`: SIGTERM is on its way)."""
    return frozenset(str(meta.get("name")) for p in pods
                     if (meta := p.get("metadata") or {}).get("deletionTimestamp"))


def worker_pods(pods: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """Names of the pods that are workers of a LeaderWorkerSet group (not its leader)."""
    return frozenset(str(meta.get("name")) for p in pods
                     if is_worker((meta := p.get("metadata") or {}).get("labels") or {}))


def pod_selector(pool: str, pool_uid: str | None = None) -> str:
    """The pool's pods: by the operator's uid label as well as the pool's name when known."""
    selector = f"{POOL_LABEL}={pool}"
    return f"{selector},{POOL_UID_LABEL}={pool_uid}" if pool_uid else selector


def label_selector(pool: str) -> str:
    services = ",".join(child_name(pool, role) for role in ENGINE_ROLES)
    return f"{SERVICE_LABEL} in ({services})"


class KubernetesDiscovery:
    """Watches the pool's EndpointSlices and calls `on_change(role, urls, initial)` when a
    role's set of ready endpoints changes."""

    def __init__(
        self, namespace: str, pool: str, on_change: OnChange, kubeconfig: str | None = None,
        relist_delay_s: float = 1.0, request_timeout_s: float = 10.0,
        watch_timeout_s: int = 300, pool_uid: str | None = None,
    ) -> None:
        self.pool_uid = pool_uid
        self.namespace = namespace
        self.pool = pool
        self.on_change = on_change
        self.kubeconfig = kubeconfig
        self.relist_delay_s = relist_delay_s
        self.request_timeout_s = request_timeout_s
        self.watch_timeout_s = watch_timeout_s
        self.synced = asyncio.Event()
        self._slices: dict[str, dict[str, Any]] = {}
        self._pods: dict[str, dict[str, Any]] = {}  # name -> metadata (annotations) only
        self._last: dict[str, list[str]] = {}

    def _emit(self) -> None:
        current = endpoints_from_slices(self.pool, self._slices.values(),
                                        draining_pods(self._pods.values()),
                                        worker_pods(self._pods.values()),
                                        terminating_pods(self._pods.values()))
        initial = not self.synced.is_set()
        for role, urls in current.items():
            if self._last.get(role) != urls:
                self.on_change(role, urls, initial)
        self._last = current
        self.synced.set()

    async def run(self) -> None:
        """List, then watch from the list's resourceVersion; on 410 Gone, a dropped stream
        or the server's watch timeout, list again. The last view is kept meanwhile."""
        from poolpilot.kubeclient import ApiError, KubeClient, NoCredentials

        try:
            kube = await KubeClient.connect(self.kubeconfig, timeout=self.request_timeout_s,
                                            user_agent=f"poolpilot-router/{self.pool}")
        except NoCredentials as exc:  # the router stays not ready (/ready answers 503)
            log.error("cannot discover engines: %s", exc)
            return
        try:
            await asyncio.gather(self._follow(kube, ApiError, "slices"),
                                 self._follow(kube, ApiError, "pods"))
        finally:
            await kube.close()

    async def _follow(self, kube: Any, api_error: type[Exception], what: str) -> None:
        """List, then watch one kind (EndpointSlices, or the pool's pods for their draining
        mark); on 410 Gone, a dropped stream or the server's watch timeout, list again."""
        if what == "slices":
            api_version, kind, selector = SLICE_API, "EndpointSlice", label_selector(self.pool)
        else:
            api_version, kind, selector = "v1", "Pod", pod_selector(self.pool, self.pool_uid)
        while True:
            try:
                items, rv = await kube.list_with_version(
                    api_version, kind, self.namespace, label_selector=selector)
                if what == "slices":
                    self._slices = {item["metadata"]["name"]: item for item in items}
                else:
                    self._pods = {item["metadata"]["name"]: _slim(item) for item in items}
                if what == "slices" or self.synced.is_set():
                    self._emit()
                async for event, obj in kube.watch(
                    api_version, kind, self.namespace, resource_version=rv,
                    label_selector=selector, timeout_seconds=self.watch_timeout_s,
                ):
                    (self._apply if what == "slices" else self._apply_pod)(event, obj)
            except api_error as exc:
                # 410 Gone (too old a resourceVersion), no answer, a refused request.
                status = getattr(exc, "status", None)
                level = (logging.INFO if getattr(exc, "transient", False) or status == 410
                         else logging.ERROR)
                log.log(level, "%s watch: %s; relisting", kind.lower(), exc)
            await asyncio.sleep(self.relist_delay_s)

    def _apply_pod(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return
        name = obj["metadata"]["name"]
        before = self._pods.get(name)
        if kind == "DELETED":
            self._pods.pop(name, None)
        else:
            self._pods[name] = _slim(obj)
        after = self._pods.get(name)
        changed = (draining_pods([before or {}]) != draining_pods([after or {}])
                   or worker_pods([before or {}]) != worker_pods([after or {}])
                   or terminating_pods([before or {}]) != terminating_pods([after or {}]))
        if changed and self.synced.is_set():
            self._emit()

    def _apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self._slices.pop(name, None)
        else:
            self._slices[name] = dict(obj)
        self._emit()


def _slim(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What discovery keeps of a pod: its name, annotations, LWS worker index and
    deletionTimestamp."""
    meta = pod.get("metadata") or {}
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k == WORKER_INDEX_LABEL}
    return {"metadata": {"name": meta.get("name"), "annotations": meta.get("annotations") or {},
                         "labels": labels, "deletionTimestamp": meta.get("deletionTimestamp")}}
