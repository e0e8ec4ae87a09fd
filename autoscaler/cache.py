"""A watch-fed view of what the autoscaler reads every cycle: pools, their Deployments, and
their pods' readiness and placement.

Listing every pool and Deployment each cycle costs the API server and the autoscaler time that
grows with the fleet (1,000 pools: one LIST of 1,000 pools and one of 2,000 Deployments per
cycle). `WatchedKube` lists each kind once, then follows a watch from the list's
resourceVersion (the shared client's `watch`, over kubernetes_asyncio), so a cycle reads
memory. It is the autoscaler's Kubernetes adapter (`kube.KubeScaler`) with its reads
replaced; writes are the same.

- Each informer lists, then watches; when the server ends a watch (its timeout) it watches on
  from the last version seen (bookmarks keep it fresh); on 410 Gone it lists again; on any
  other failure it lists again after `retry_delay`, and until a list succeeds the view is
  refused (`list_pools` raises `KubeError`), as a failed LIST would fail the cycle: a cycle
  never decides on a view it knows may be stale.
- Only what the autoscaler reads is kept: pools without managedFields, Deployments' sizes and
  counts, and of each pod its name, labels, deletion mark and two conditions: Ready (with its
  transition time: since when each role of the request path has been serving, for the hold
  after a restart) and PodScheduled (whether the scheduler cannot place it). A pod slimmed so
  is a few hundred bytes; its other changes (container statuses, IPs) replace it in place.
- The pool status the autoscaler writes is computed against the cached pool and written with
  its resourceVersion: no read per pool and cycle, nothing sent when nothing changed; a 409
  (the cache was behind) reads the pool and retries as before. The written object replaces
  the cached one at once, so the next cycle sees its own write even before the watch does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from poolpilot.autoscaler.kube import (
    LWS_RECHECK_S,
    MANAGER,
    KubeError,
    KubeScaler,
    Obj,
    Workloads,
    status_patch,
)
from poolpilot.kubeclient import KubeClient as SharedClient

from poolpilot import api, names
from poolpilot import leaderworkerset as lws

log = logging.getLogger("poolpilot.autoscaler.cache")

Key = tuple[str, str]  # (namespace, name)


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def slim_pool(obj: Obj) -> Obj:
    """The pool without managedFields (often larger than the rest of it)."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "metadata": meta}


def slim_deployment(obj: Obj) -> Obj:
    """What `workloads.counts` reads: size, generation and the status counts."""
    meta = obj.get("metadata") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "generation", "labels",
                                          "resourceVersion") if k in meta},
        "spec": {k: v for k, v in (obj.get("spec") or {}).items() if k == "replicas"},
        "status": obj.get("status") or {},
    }


# The pod conditions the cycle reads: `kube.ready_since` and `kube.unschedulable`.
POD_CONDITIONS = ("Ready", "PodScheduled")


def slim_pod(obj: Obj) -> Obj:
    """What `Workloads.role_state` reads of a pod: its identity, labels, deletion mark, and
    its Ready and PodScheduled conditions."""
    meta = obj.get("metadata") or {}
    conds = [c for c in (obj.get("status") or {}).get("conditions") or []
             if c.get("type") in POD_CONDITIONS]
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "labels",
                                              "deletionTimestamp") if k in meta},
            "status": {"conditions": conds}}


class Informer:
    """One kind in one namespace (or all): the objects by (namespace, name), kept current by
    a list and then a watch. `keep` slims an object, or returns None to drop it."""

    def __init__(self, kube: SharedClient, api_version: str, kind: str,
                 namespace: str | None = None, *, label_selector: str | None = None,
                 field_selector: str | None = None,
                 keep: Callable[[Obj], Obj | None] = lambda o: o,
                 watch_timeout: int = 300, retry_delay: float = 1.0) -> None:
        self.kube = kube
        self.api_version, self.kind, self.namespace = api_version, kind, namespace
        self.label_selector, self.field_selector = label_selector, field_selector
        self.keep = keep
        self.watch_timeout = watch_timeout
        self.retry_delay = retry_delay
        self.objects: dict[Key, Obj] = {}
        self.synced = asyncio.Event()
        self.error: str | None = None  # set from a failure until the next successful list
        self.events = 0  # watch events taken in (the benchmark reports them)

    @property
    def what(self) -> str:
        return f"{self.kind} in {self.namespace or 'all namespaces'}"

    def put(self, obj: Obj) -> None:
        slim = self.keep(obj)
        if slim is None:
            self.objects.pop(_key(obj), None)
        else:
            self.objects[_key(obj)] = slim

    def apply(self, event: str, obj: Obj) -> None:
        if event == "DELETED":
            self.objects.pop(_key(obj), None)
        elif event in ("ADDED", "MODIFIED"):
            self.put(obj)

    async def run(self) -> None:
        rv: str | None = None
        while True:
            try:
                if rv is None:
                    items, rv = await self.kube.list_with_version(
                        self.api_version, self.kind, self.namespace,
                        label_selector=self.label_selector, field_selector=self.field_selector)
                    fresh: dict[Key, Obj] = {}
                    for item in items:
                        slim = self.keep(item)
                        if slim is not None:
                            fresh[_key(item)] = slim
                    self.objects = fresh
                    if self.error is not None:
                        log.info("watch of %s: listed again, current", self.what)
                    self.error = None
                    self.synced.set()
                async for event, obj in self.kube.watch(
                        self.api_version, self.kind, self.namespace, resource_version=rv,
                        label_selector=self.label_selector, field_selector=self.field_selector,
                        timeout_seconds=self.watch_timeout, bookmarks=True):
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    self.events += 1
                    self.apply(event, obj)
                # The server closed the watch (its timeout): watch on from the last version.
            except Exception as exc:  # API errors, and anything unexpected in a stream
                rv = None
                if isinstance(exc, KubeError) and exc.status == 410:  # too old: list now
                    continue
                self.error = f"{type(exc).__name__}: {exc}" if not isinstance(
                    exc, KubeError) else str(exc)
                log.warning("watch of %s: %s; listing again in %gs", self.what, self.error,
                            self.retry_delay)
                await asyncio.sleep(self.retry_delay)


class WatchedKube(KubeScaler):
    """The autoscaler's adapter with pools, Deployments and pods read from watches.
    `start()` begins watching; reads wait up to `sync_timeout` for the first list."""

    def __init__(self, kube: SharedClient, namespaces: Iterable[str] = (), *,
                 watch_timeout: int = 300, retry_delay: float = 1.0,
                 sync_timeout: float | None = None) -> None:
        super().__init__(kube, namespaces)
        managed = f"{names.MANAGED_BY}={names.MANAGER}"
        scopes: tuple[str | None, ...] = self.namespaces or (None,)
        opts: dict[str, Any] = {"watch_timeout": watch_timeout, "retry_delay": retry_delay}
        self.pool_informers = [Informer(kube, api.API_VERSION, api.KIND, ns, keep=slim_pool,
                                        **opts) for ns in scopes]
        self.deployment_informers = [
            Informer(kube, "apps/v1", "Deployment", ns, label_selector=managed,
                     keep=slim_deployment, **opts) for ns in scopes]
        self.pod_informers = [
            Informer(kube, "v1", "Pod", ns, label_selector=managed, keep=slim_pod, **opts)
            for ns in scopes]
        self.sync_timeout = sync_timeout if sync_timeout is not None else 3 * kube.timeout
        self._informer_options = opts
        self.lws_informers: list[Informer] = []  # started once the kind is served
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def informers(self) -> list[Informer]:
        return [*self.pool_informers, *self.deployment_informers, *self.pod_informers]

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.create_task(i.run(), name=f"watch {i.what}")
                           for i in self.informers]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        await super().close()

    async def _current(self, informers: list[Informer]) -> None:
        """Raise KubeError unless every informer has listed and is not failing."""
        self.start()
        for inf in informers:
            if not inf.synced.is_set():
                try:
                    await asyncio.wait_for(inf.synced.wait(), self.sync_timeout)
                except TimeoutError:
                    raise KubeError(0, f"no list of {inf.what} within {self.sync_timeout:g}s"
                                    + (f": {inf.error}" if inf.error else "")) from None
            if inf.error is not None:
                raise KubeError(0, f"the view of {inf.what} may be stale: {inf.error}")

    async def list_pools(self) -> list[Obj]:
        await self._current(self.pool_informers)
        return [o for inf in self.pool_informers for o in inf.objects.values()]

    async def workloads(self) -> Workloads:
        await self._current([*self.deployment_informers, *self.pod_informers])
        deployments: dict[Key, Obj] = {}
        for inf in self.deployment_informers:
            deployments.update(inf.objects)
        pods: dict[tuple[str, str, str], list[Obj]] = {}
        for inf in self.pod_informers:
            for pod in inf.objects.values():
                meta = pod.get("metadata") or {}
                labels = meta.get("labels") or {}
                key = (meta.get("namespace", ""), labels.get(names.POOL_LABEL, ""),
                       labels.get(names.ROLE_LABEL, ""))
                pods.setdefault(key, []).append(pod)
        return Workloads(deployments={**deployments, **await self.leader_worker_sets()},
                         pods=pods)

    async def leader_worker_sets(self) -> dict[tuple[str, str], Obj]:
        """Multi-node roles' LeaderWorkerSets, from watches started once the cluster serves
        the kind (asked again every LWS_RECHECK_S until it does: most clusters never will)."""
        if not self.lws_informers:
            if time.monotonic() < self._no_sets_until:
                return {}
            if not await self.kube.serves(lws.API_VERSION, lws.KIND):
                self._no_sets_until = time.monotonic() + LWS_RECHECK_S
                return {}
            managed = f"{names.MANAGED_BY}={names.MANAGER}"
            self.lws_informers = [
                Informer(self.kube, lws.API_VERSION, lws.KIND, ns, label_selector=managed,
                         keep=slim_deployment, **self._informer_options)
                for ns in self.namespaces or (None,)]
            self._tasks += [asyncio.create_task(i.run(), name=f"watch {i.what}")
                            for i in self.lws_informers]
        await self._current(self.lws_informers)
        return self._index_sets(o for inf in self.lws_informers for o in inf.objects.values())

    def _cached_pool(self, namespace: str, name: str) -> tuple[Informer, Obj] | None:
        for inf in self.pool_informers:
            if inf.namespace in (None, namespace):
                obj = inf.objects.get((namespace, name))
                if obj is not None:
                    return inf, obj
        return None

    async def patch_status(self, namespace: str, name: str, role_fields: Mapping[str, Obj],
                           metrics: Obj | None, conditions: Iterable[Obj]) -> bool:
        wanted = list(conditions)
        cached = self._cached_pool(namespace, name)
        rv = cached and (cached[1].get("metadata") or {}).get("resourceVersion")
        if cached is None or not rv:
            return await super().patch_status(namespace, name, role_fields, metrics, wanted)
        inf, live = cached
        patch = status_patch(live.get("status") or {}, role_fields, metrics, wanted)
        if patch is None:
            return False
        body = {"metadata": {"resourceVersion": rv}, "status": patch}
        try:
            written = await self.kube.merge_patch(api.API_VERSION, api.KIND, namespace, name,
                                                  body, subresource="status", manager=MANAGER)
        except KubeError as exc:
            if exc.status not in (404, 409):
                raise
            # The cache was behind (or the pool is gone): read it and merge again.
            return await super().patch_status(namespace, name, role_fields, metrics, wanted)
        if isinstance(written, dict) and written.get("metadata"):
            inf.put(written)
        return True
