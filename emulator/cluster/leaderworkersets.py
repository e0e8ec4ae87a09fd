"""The cluster's LeaderWorkerSet controller: what kubernetes-sigs/lws does, for the subset
poolpilot uses (so a multi-node role runs in the sandbox and the tests).

- The CRD (`crd()`): leaderworkerset.x-k8s.io/v1, with the status and /scale subresources
  (spec.replicas, status.replicas, status.hpaPodSelector) as upstream declares them. The
  controller installs it on its first pass, as installing LWS in a cluster does.
- Groups of pods: `spec.replicas` groups of `leaderWorkerTemplate.size` pods; the leader is
  NAME-G (leaderTemplate, else workerTemplate), the workers NAME-G-W (W = 1..size-1), named
  and labelled as upstream (leaderworkerset.sigs.k8s.io/name, group-index, worker-index,
  group-key), with LWS_LEADER_ADDRESS (NAME-G.NAME.NAMESPACE), LWS_GROUP_SIZE and
  LWS_WORKER_INDEX in every container's environment. Upstream runs the leaders as a
  StatefulSet and each group's workers as another; here the set owns its pods directly (the
  same pods, names and labels, one owner fewer).
- Scaling removes the highest-indexed groups; a template change recreates one group at a
  time, once every other group is ready.
- RecreateGroupOnPodRestart: when any pod of a group restarts (a container's restartCount
  rises) or is deleted, every pod of the group is deleted, and the group comes back whole once
  they are all gone.
- Status: replicas (groups with pods), readyReplicas (groups whose leader and every worker are
  ready), updatedReplicas, observedGeneration, hpaPodSelector (the leaders), Available.

With the engine simulator every pod of a group runs the simulator (the kubelet runs
`poolpilot launch` as `engine-sim`); only leaders are reachable through the role's Service,
so the leader serves and the workers run idle. `plan_groups` and `set_status` are pure; the
class does the API calls.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from poolpilot import leaderworkerset as lws
from poolpilot.apitypes import Obj

from . import pods as P
from .kubeapi import ApiError, ControllerApi
from .status_cache import StatusCache

REVISION_LABEL = "leaderworkerset.sigs.k8s.io/template-revision-hash"


def crd() -> Obj:
    """The LeaderWorkerSet CRD as the emulator serves it: upstream's names, subresources and
    printer columns, the schema left open (the operator's objects are checked against
    upstream's schema in the unit tests, tests/fixtures/upstream/lws/)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{lws.PLURAL}.{lws.GROUP}"},
        "spec": {
            "group": lws.GROUP,
            "scope": "Namespaced",
            "names": {"kind": lws.KIND, "listKind": f"{lws.KIND}List", "plural": lws.PLURAL,
                      "singular": lws.KIND.lower(), "shortNames": ["lws"]},
            "versions": [{
                "name": lws.VERSION, "served": True, "storage": True,
                "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                "subresources": {"status": {}, "scale": {
                    "specReplicasPath": ".spec.replicas",
                    "statusReplicasPath": ".status.replicas",
                    "labelSelectorPath": ".status.hpaPodSelector"}},
                "additionalPrinterColumns": [
                    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
                    {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
                    {"name": "Up-to-date", "type": "integer",
                     "jsonPath": ".status.updatedReplicas"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
            }],
        },
    }


# ---------------------------------------------------------------------------------------------
# Pure: pods of a set, the plan, the status


def _replicas(obj: Mapping[str, Any]) -> int:
    value = (obj.get("spec") or {}).get("replicas")
    return 1 if value is None else int(value)


def _size(obj: Mapping[str, Any]) -> int:
    value = obj["spec"]["leaderWorkerTemplate"].get("size")
    return 1 if value is None else int(value)


def revision(obj: Mapping[str, Any]) -> str:
    """The hash of what a group is made from (its templates and size)."""
    return P.template_hash(obj["spec"]["leaderWorkerTemplate"])


def _group_key(obj: Mapping[str, Any], group: int) -> str:
    meta = obj["metadata"]
    text = f"{meta['namespace']}/{meta['name']}/{meta.get('uid', '')}/{group}"
    return hashlib.sha1(text.encode()).hexdigest()


def pod_name(name: str, group: int, worker: int) -> str:
    return f"{name}-{group}" if worker == 0 else f"{name}-{group}-{worker}"


def build_group_pod(obj: Mapping[str, Any], group: int, worker: int) -> Obj:
    """Pod `worker` of group `group` (0 is the leader), as the LWS controller makes it."""
    meta = obj["metadata"]
    lwt = obj["spec"]["leaderWorkerTemplate"]
    template = (lwt.get("leaderTemplate") if worker == 0 else None) or lwt["workerTemplate"]
    tmeta = template.get("metadata") or {}
    name, ns, size = meta["name"], meta["namespace"], _size(obj)
    env = [{"name": lws.LEADER_ADDRESS_ENV, "value": lws.leader_address(name, group, ns)},
           {"name": lws.GROUP_SIZE_ENV, "value": str(size)},
           {"name": lws.WORKER_INDEX_ENV, "value": str(worker)}]
    spec = json.loads(json.dumps(template["spec"]))
    for container in spec.get("containers") or []:
        own = [e for e in container.get("env") or [] if e["name"] not in
               {v["name"] for v in env}]
        container["env"] = [*env, *own]
    annotations = {**(tmeta.get("annotations") or {}), lws.SIZE_ANNOTATION: str(size)}
    if worker:
        annotations[lws.LEADER_NAME_ANNOTATION] = pod_name(name, group, 0)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(name, group, worker),
            "namespace": ns,
            "labels": {**(tmeta.get("labels") or {}), lws.NAME_LABEL: name,
                       lws.GROUP_INDEX_LABEL: str(group), lws.WORKER_INDEX_LABEL: str(worker),
                       lws.GROUP_KEY_LABEL: _group_key(obj, group),
                       REVISION_LABEL: revision(obj)},
            "annotations": annotations,
            "finalizers": [P.FINALIZER],
            "ownerReferences": [{
                "apiVersion": lws.API_VERSION, "kind": lws.KIND, "name": name,
                "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {**spec, "nodeName": "sandbox", "hostname": pod_name(name, group, worker),
                 "subdomain": name},
        "status": {"phase": "Pending"},
    }


def _group_of(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"]["labels"][lws.GROUP_INDEX_LABEL])


def _worker_of(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"]["labels"][lws.WORKER_INDEX_LABEL])


def restarts(pod: Mapping[str, Any]) -> int:
    """Container restarts the kubelet reported for the pod."""
    return sum(int(c.get("restartCount") or 0)
               for c in (pod.get("status") or {}).get("containerStatuses") or [])


def _terminating(pod: Mapping[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


@dataclass(frozen=True)
class GroupPlan:
    create: list[tuple[int, int]] = field(default_factory=list)  # (group, worker)
    delete: list[str] = field(default_factory=list)  # pod names
    recreated: list[int] = field(default_factory=list)  # groups restarted whole


def groups(pods: Sequence[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    out: dict[int, list[Mapping[str, Any]]] = {}
    for pod in pods:
        out.setdefault(_group_of(pod), []).append(pod)
    return out


def group_ready(members: Sequence[Mapping[str, Any]], size: int,
                ready: Mapping[str, bool]) -> bool:
    """A group is ready when its leader and every worker are (and none is going)."""
    live = [p for p in members if not _terminating(p)]
    return (len(live) == size and {_worker_of(p) for p in live} == set(range(size))
            and all(ready.get(p["metadata"]["name"]) for p in live))


def plan_groups(obj: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
                ready: Mapping[str, bool]) -> GroupPlan:
    """Converge a set's pods to spec.replicas whole groups of the current revision."""
    want, size, rev = _replicas(obj), _size(obj), revision(obj)
    by_group = groups(pods)
    plan = GroupPlan()
    outdated: list[int] = []
    for group, members in sorted(by_group.items()):
        live = [p for p in members if not _terminating(p)]
        if group >= want:  # scaled down: the highest groups go
            plan.delete.extend(p["metadata"]["name"] for p in live)
            continue
        if len(live) < len(members):
            continue  # the group is being deleted: it comes back once every pod is gone
        whole = {_worker_of(p) for p in live} == set(range(size))
        if not whole or any(restarts(p) for p in live):
            # RecreateGroupOnPodRestart: a lost or restarted rank takes its group with it.
            plan.delete.extend(p["metadata"]["name"] for p in live)
            plan.recreated.append(group)
            continue
        if any(p["metadata"]["labels"].get(REVISION_LABEL) != rev for p in live):
            outdated.append(group)
    for group in range(want):
        if group not in by_group:
            plan.create.extend((group, w) for w in range(size))
    # One outdated group at a time, once every other group serves.
    others_ready = all(group_ready(m, size, ready) for g, m in by_group.items()
                       if g < want and g not in outdated[:1])
    if outdated and others_ready and not plan.create and not plan.recreated:
        plan.delete.extend(p["metadata"]["name"] for p in by_group[outdated[0]])
    return plan


def set_status(obj: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
               ready: Mapping[str, bool]) -> Obj:
    """The set's status, as upstream counts it: groups, not pods."""
    size, rev, want = _size(obj), revision(obj), _replicas(obj)
    by_group = groups([p for p in pods if not _terminating(p)])
    n_ready = sum(1 for m in by_group.values() if group_ready(m, size, ready))
    updated = sum(1 for m in by_group.values()
                  if all(p["metadata"]["labels"].get(REVISION_LABEL) == rev for p in m))
    available = n_ready >= want
    return {
        "observedGeneration": obj["metadata"].get("generation", 1),
        "replicas": len(by_group),
        "readyReplicas": n_ready,
        "updatedReplicas": updated,
        "hpaPodSelector": f"{lws.NAME_LABEL}={obj['metadata']['name']},"
                          f"{lws.WORKER_INDEX_LABEL}=0",
        "conditions": [{
            "type": "Available", "status": "True" if available else "False",
            "reason": "AllGroupsReady" if available else "GroupsNotReady",
            "message": f"{n_ready} of {want} groups ready",
        }],
    }


# ---------------------------------------------------------------------------------------------
# The controller


class LeaderWorkerSetController:
    def __init__(self, kube: ControllerApi) -> None:
        self.kube = kube
        self._status = StatusCache(kube)
        self._installed = False
        self.recreated: list[tuple[str, str, int]] = []  # (namespace, set, group), in order

    async def install(self) -> None:
        """The CRD, once (already there: fine)."""
        if self._installed:
            return
        try:
            await self.kube.create(crd())
        except ApiError as exc:
            if exc.status != 409:
                raise
        self._installed = True

    async def list_sets(self) -> list[Obj]:
        await self.install()
        try:
            return await self.kube.list(lws.KIND)
        except ApiError as exc:
            if exc.status == 404:  # just installed: discovery has yet to serve it
                return []
            raise

    async def scale(self, sets: list[Obj], pods: list[Obj], ready: Mapping[str, bool]) -> None:
        """Create and delete pods until each set has its groups."""
        for obj in sets:
            if obj["metadata"].get("deletionTimestamp"):
                continue
            mine = [p for p in pods if P.owned_by(p, obj)]
            plan = plan_groups(obj, mine, ready)
            ns = obj["metadata"]["namespace"]
            for group in plan.recreated:
                self.recreated.append((ns, obj["metadata"]["name"], group))
            for name in plan.delete:
                await self.kube.delete("Pod", ns, name)
            for group, worker in plan.create:
                try:
                    await self.kube.create(build_group_pod(obj, group, worker))
                except ApiError as exc:
                    if exc.status != 409:  # a pod of that name is still going away
                        raise

    async def write_status(self, sets: list[Obj], pods: list[Obj],
                           ready: Mapping[str, bool]) -> None:
        for obj in sets:
            mine = [p for p in pods if P.owned_by(p, obj)]
            status = set_status(obj, mine, ready)
            stored = obj.get("status") or {}
            changed = any(stored.get(k) != v for k, v in status.items() if k != "conditions")
            await self._status.write(lws.KIND, obj, status, force=changed)
