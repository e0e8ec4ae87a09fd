"""Kubernetes adapter (on the shared `poolpilot.kubeclient`): pools, role sizes, scale, status
and Events.

Each cycle lists InferencePools, Deployments and pods once (cluster-wide, or once per watched
namespace), never per pool, and the LeaderWorkerSets of multi-node roles. Writes: the
scale subresource of the Deployment (or LeaderWorkerSet) of a role, the pool's status
subresource (only the autoscaler's own fields and conditions) and Events; before a scale-down,
the role's pods are listed and the victims annotated (`victims.py`: the pod-deletion-cost and
the router's draining mark).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from poolpilot.kubeclient import ApiError, NoCredentials
from poolpilot.kubeclient import KubeClient as SharedClient

from poolpilot import api, names, workloads
from poolpilot import leaderworkerset as lws

Obj = dict[str, Any]
MANAGER = "poolpilot-autoscaler"
CONFLICT_RETRIES = 5
# Where the cluster serves no LeaderWorkerSets, look again this often (it may be installed).
LWS_RECHECK_S = 60.0
log = logging.getLogger("poolpilot.autoscaler.kube")


# The shared client's error (transient or permanent), under the name this adapter used.
KubeError = ApiError


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class RoleState:
    """The Kubernetes view of one role, which `observe.observation` joins with Prometheus's
    (see decide.RoleObservation for the meaning)."""

    replicas: int
    ready: int
    starting: int = 0
    unschedulable: int = 0
    unschedulable_message: str = ""
    # Unix seconds since which the role has had a ready pod without a break, as its pods tell
    # (`ready_since`); None: no ready pod, or none with a time on its Ready condition.
    ready_since: float | None = None


@dataclass
class Workloads:
    """Deployments and pods of every pool in scope, indexed for one cycle."""

    deployments: dict[tuple[str, str], Obj]  # (namespace, name) -> Deployment
    pods: dict[tuple[str, str, str], list[Obj]]  # (namespace, pool, role) -> pods

    def role_state(self, namespace: str, pool: str, role: str, pool_uid: str = ""
                   ) -> RoleState | None:
        """None when the role's Deployment does not exist (yet). `pool_uid`: the pool's
        metadata.uid, so a stray pod labelled with its name counts for nothing."""
        dep = self.deployments.get((namespace, names.child_name(pool, role)))
        if dep is None:
            return None
        c = workloads.counts(dep)
        replicas, ready = c.desired, c.ready
        pods = own_pods(self.pods.get((namespace, pool, role), []), pool_uid)
        stuck = [p for p in pods if unschedulable(p) is not None]
        message = unschedulable(stuck[0]) or "" if stuck else ""
        ready = min(ready, replicas) if replicas else 0
        # Replicas, not pods: the pods of one LeaderWorkerSet group are one replica.
        stuck_replicas = len({_replica_of(p) for p in stuck})
        return RoleState(
            replicas=replicas,
            ready=ready,
            # Asked for but not ready and not stuck: Pending or loading weights, on the way.
            starting=max(0, replicas - ready - stuck_replicas),
            unschedulable=stuck_replicas,
            unschedulable_message=message,
            ready_since=ready_since(pods),
        )


def _replica_of(pod: Obj) -> str:
    """The replica a pod is part of: its LeaderWorkerSet group, or itself."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    group = labels.get(lws.GROUP_INDEX_LABEL)
    return f"{labels.get(lws.NAME_LABEL)}/{group}" if group is not None else str(meta.get("name"))


def own_pods(pods: Iterable[Obj], pool_uid: str) -> list[Obj]:
    """The pods that belong to the pool of this uid: labelled with it, or with no uid label at
    all (pods an operator from before the label made, until their Deployment rolls them).
    A pod labelled with another uid (a deleted pool's of the same name, or one labelled by
    hand) is left out. (Not in the label selector: that would hide the older pods; the list
    by {managed-by, pool} is the same size either way.) `pool_uid` empty: every pod."""
    if not pool_uid:
        return list(pods)
    return [p for p in pods
            if ((p.get("metadata") or {}).get("labels") or {}).get(names.POOL_UID_LABEL,
                                                                   pool_uid) == pool_uid]


def pod_ready(pod: Obj) -> bool:
    """The pod's Ready condition is True (and it is not being deleted)."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def ready_since(pods: Iterable[Obj]) -> float | None:
    """Unix seconds since which at least one of `pods` has been ready without a break, as
    far as their Ready conditions tell: the earliest transition to Ready among the ready pods
    (a pod ready since then has been serving throughout), plus one second for the condition's
    seconds precision. None: no ready pod, or no time on any Ready condition."""
    times = [t for p in pods if pod_ready(p)
             for c in (p.get("status") or {}).get("conditions") or []
             if c.get("type") == "Ready" and (t := parse_time(c.get("lastTransitionTime")))
             is not None]
    return min(times) + 1.0 if times else None


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
    async def role_pods(self, namespace: str, pool: str, role: str, pool_uid: str = ""
                        ) -> list[Obj]: ...
    async def annotate_pod(self, namespace: str, name: str,
                           annotations: Mapping[str, str | None]) -> None: ...


class KubeScaler:
    """The loop's `Kube` on the shared client: it lists pools and their roles, and writes
    scale, status, Events and pod marks. `namespaces` empty: cluster-wide lists."""

    def __init__(self, kube: SharedClient, namespaces: Iterable[str] = ()) -> None:
        self.kube = kube
        self.namespaces = tuple(namespaces)
        # (namespace, POOL-ROLE) -> the role's LeaderWorkerSet, from the last view: what
        # `scale` resizes instead of a Deployment.
        self._sets: dict[tuple[str, str], str] = {}
        self._no_sets_until = 0.0

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, namespaces: Iterable[str] = (),
                      timeout: float = 10.0, identity: str | None = None) -> KubeScaler:
        """Credentials in the shared order: --kubeconfig, in-cluster, $KUBECONFIG,
        ~/.kube/config (see poolpilot.kubeclient.credentials)."""
        agent = f"{MANAGER}/{identity or socket.gethostname()}"
        try:
            kube = await SharedClient.connect(kubeconfig, timeout=timeout, user_agent=agent)
        except NoCredentials as exc:
            raise KubeError(0, str(exc)) from exc
        return cls(kube, namespaces)

    @property
    def requests(self) -> int:
        """API calls made (the benchmark reports them)."""
        return self.kube.requests

    async def close(self) -> None:
        await self.kube.close()

    async def request(self, method: str, path: str, query: list[tuple[str, str]] | None = None,
                      body: Any = None, content_type: str = "application/json") -> Obj:
        data = await self.kube.request(method, path, query=query, body=body,
                                       content_type=content_type)
        return data if isinstance(data, dict) else {}

    async def _list(self, api_version: str, kind: str, selector: str | None = None
                    ) -> list[Obj]:
        """One LIST cluster-wide, or one per watched namespace."""
        items: list[Obj] = []
        for ns in self.namespaces or (None,):
            items += await self.kube.list(api_version, kind, ns, label_selector=selector)
        return items

    async def list_pools(self) -> list[Obj]:
        return await self._list(api.API_VERSION, api.KIND)

    async def workloads(self) -> Workloads:
        managed = f"{names.MANAGED_BY}={names.MANAGER}"
        deps = await self._list("apps/v1", "Deployment", managed)
        pods = await self._list("v1", "Pod", managed)
        by_pool: dict[tuple[str, str, str], list[Obj]] = {}
        for pod in pods:
            meta = pod.get("metadata") or {}
            labels = meta.get("labels") or {}
            key = (meta.get("namespace", ""), labels.get(names.POOL_LABEL, ""),
                   labels.get(names.ROLE_LABEL, ""))
            by_pool.setdefault(key, []).append(pod)
        return Workloads(
            deployments={**{(d["metadata"]["namespace"], d["metadata"]["name"]): d
                            for d in deps}, **await self.leader_worker_sets()},
            pods=by_pool,
        )

    async def leader_worker_sets(self) -> dict[tuple[str, str], Obj]:
        """The LeaderWorkerSets of multi-node roles, keyed as the role's Deployment would be,
        (namespace, POOL-ROLE): their spec.replicas and status counts are groups, read like a
        Deployment's (`workloads.counts`). None where the cluster serves no LeaderWorkerSet
        (looked for again every LWS_RECHECK_S) or RBAC refuses the list (an older chart)."""
        if time.monotonic() < self._no_sets_until:
            return {}
        try:
            sets = await self._list(lws.API_VERSION, lws.KIND,
                                    f"{names.MANAGED_BY}={names.MANAGER}")
        except KubeError as exc:
            if exc.status not in (403, 404):
                raise
            if exc.status == 403:
                log.warning("cannot list LeaderWorkerSets (multi-node roles are not scaled): "
                            "%s", exc)
            self._no_sets_until = time.monotonic() + LWS_RECHECK_S
            self._sets = {}
            return {}
        return self._index_sets(sets)

    def _index_sets(self, sets: Iterable[Obj]) -> dict[tuple[str, str], Obj]:
        """Sets by (namespace, POOL-ROLE), remembered as what `scale` resizes."""
        out: dict[tuple[str, str], Obj] = {}
        for obj in sets:
            meta = obj["metadata"]
            labels = meta.get("labels") or {}
            pool, role = labels.get(names.POOL_LABEL), labels.get(names.ROLE_LABEL)
            if pool and role:
                out[(meta["namespace"], names.child_name(pool, role))] = obj
        self._sets = {key: obj["metadata"]["name"] for key, obj in out.items()}
        return out

    async def scale(self, namespace: str, name: str, replicas: int) -> None:
        """Resize a role (`name` is POOL-ROLE) through the scale subresource of what runs it:
        its LeaderWorkerSet (replicas are groups) when the last view found one, else its
        Deployment."""
        api_version, kind = "apps/v1", "Deployment"
        target = self._sets.get((namespace, name))
        if target is not None:
            api_version, kind, name = lws.API_VERSION, lws.KIND, target
        await self.kube.merge_patch(api_version, kind, namespace, name,
                                    {"spec": {"replicas": replicas}}, subresource="scale",
                                    manager=MANAGER)

    async def role_pods(self, namespace: str, pool: str, role: str, pool_uid: str = ""
                        ) -> list[Obj]:
        """Every pod of one role of the pool with this uid (`own_pods`; the cycle's view
        keeps only unschedulable ones): listed before a scale-down chooses its victims."""
        if (namespace, names.child_name(pool, role)) in self._sets:
            # A LeaderWorkerSet removes its highest-indexed groups, whatever a pod's deletion
            # cost says: no pod can be chosen (and marked draining) ahead of the scale-down.
            # The removed leaders drain through their preStop and vLLM's shutdown timeout.
            return []
        selector = (f"{names.MANAGED_BY}={names.MANAGER},{names.POOL_LABEL}={pool},"
                    f"{names.ROLE_LABEL}={role}")
        pods = await self.kube.list("v1", "Pod", namespace, label_selector=selector)
        return own_pods(pods, pool_uid)

    async def annotate_pod(self, namespace: str, name: str,
                           annotations: Mapping[str, str | None]) -> None:
        """Merge-patch the pod's annotations (None removes one)."""
        await self.kube.merge_patch("v1", "Pod", namespace, name,
                                    {"metadata": {"annotations": dict(annotations)}},
                                    manager=MANAGER)

    async def patch_status(self, namespace: str, name: str, role_fields: Mapping[str, Obj],
                           metrics: Obj | None, conditions: Iterable[Obj]) -> bool:
        """Merge the autoscaler's fields into the pool's status. Per-role fields are merged
        key by key; conditions are a list, so they are read, merged by type and written with
        the resourceVersion read (409 -> read again). Returns False when nothing changed."""
        wanted = list(conditions)
        for attempt in range(CONFLICT_RETRIES):
            live = await self.kube.get(api.API_VERSION, api.KIND, namespace, name)
            if live is None:
                return False  # deleted since it was listed
            patch = status_patch(live.get("status") or {}, role_fields, metrics, wanted)
            if patch is None:
                return False
            body = {"metadata": {"resourceVersion": live["metadata"]["resourceVersion"]},
                    "status": patch}
            try:
                await self.kube.merge_patch(api.API_VERSION, api.KIND, namespace, name, body,
                                            subresource="status", manager=MANAGER)
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
        await self.kube.create(body)


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
