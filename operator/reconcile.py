"""The reconcile service: desired children vs live ones -> the fewest writes that converge.

- Each child is server-side applied as `poolpilot-operator` only when it is missing, when what
  we would apply changed (a digest of it is kept in an annotation, so fields we stop setting
  are released), or when the live object no longer contains what we applied (drift: an edited
  image, command or label). A no-op reconcile therefore makes zero writes.
- With autoscaling applying, `replicas` is left out of the Deployment; the starting size is
  set once by a separate size manager, so the autoscaler can take the field over.
- A mode switch applies the new workloads first and deletes the old ones only once every new
  engine role has a ready pod, so the pool keeps serving through the switch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from poolpilot.operator import (
    builders,
    gateway_objects,
    model_cache,
    multinode,
    router_auth,
)
from poolpilot.operator.kubeapi import ApiError, Discovered

from poolpilot import api, names, workloads
from poolpilot import leaderworkerset as lws
from poolpilot.apitypes import Obj, quantity_value
from poolpilot.roles import Role

T = TypeVar("T")
# What runs a role's engines: a Deployment, or a LeaderWorkerSet for multi-node replicas.
WORKLOAD_KINDS = ("Deployment", lws.KIND)
DIGEST_ANNOTATION = "poolpilot.dev/applied-digest"

# Stale children are deleted workloads first, so nothing routes to a half-removed role.
_DELETE_ORDER = ("HTTPRoute", "InferencePool", "LeaderWorkerSet", "Deployment",
                 "PodDisruptionBudget", "Service", "PodMonitor", "ServiceMonitor", "RoleBinding",
                 "Role", "ServiceAccount", "DaemonSet", "Job", "ConfigMap",
                 "PersistentVolumeClaim", "NetworkPolicy")


class Cluster(Protocol):
    """What the service needs from the API (KubeApi implements it)."""

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None: ...
    async def apply(self, obj: Obj) -> Obj: ...
    async def create_absent(self, obj: Obj) -> bool: ...
    async def delete(self, obj: Obj) -> None: ...
    async def apply_size(self, namespace: str, name: str, replicas: int,
                         api_version: str = "apps/v1", kind: str = "Deployment") -> None: ...


@dataclass
class ReconcileResult:
    """What one reconcile of a pool wrote and saw (its Events, status and metrics come from it)."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)  # the spec asked for something new
    repaired: list[str] = field(default_factory=list)  # someone changed it (drift)
    deleted: list[str] = field(default_factory=list)
    waiting: str | None = None  # why stale children were kept
    conflicts: list[str] = field(default_factory=list)  # names taken by objects not ours
    pool_gone: bool = False  # the pool was deleted while we looked: nothing was written
    deployments: dict[str, Obj] = field(default_factory=dict)  # role -> live Deployment
    route: Obj | None = None  # the live HTTPRoute (spec.gateway), with its status
    model_cache: Obj | None = None  # the live prefetch Job or DaemonSet, with its status
    writes: int = 0


def capabilities(discovered: Discovered, monitor_labels: tuple[tuple[str, str], ...] = (),
                 network_policies: bool = True,
                 router_auth: bool = False) -> builders.Capabilities:
    return builders.Capabilities(monitoring=discovered.monitoring, rbac=discovered.rbac,
                                 monitor_labels=monitor_labels,
                                 networking=discovered.network_policies,
                                 network_policies=network_policies,
                                 gateway_api=discovered.gateway_api,
                                 inference_pools=discovered.inference_pools,
                                 leader_worker_set=discovered.leader_worker_set,
                                 router_auth=router_auth)


def needs_leader_worker_set(spec: api.InferencePoolSpec) -> bool:
    """Some role of the pool runs multi-node replicas (on a LeaderWorkerSet)."""
    return any(multinode.multi_node(spec, r) for r in spec.engine_roles())


def label(obj: Obj) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


async def _doing(what: str, call: Awaitable[T]) -> T:
    """Await a write; a failure says which child it was about (for the Degraded message)."""
    try:
        return await call
    except ApiError as exc:
        exc.what = exc.what or what
        raise


def stamped(obj: Obj) -> Obj:
    """The object with the digest of itself in an annotation."""
    meta = dict(obj["metadata"])
    meta["annotations"] = {**meta.get("annotations", {}), DIGEST_ANNOTATION: builders.digest(obj)}
    return {**obj, "metadata": meta}


# --- comparison -------------------------------------------------------------------------------

def _same_scalar(want: Any, have: Any) -> bool:
    if want == have:
        return True
    if isinstance(want, str) and isinstance(have, str):
        # The API server canonicalizes quantities ("0.5" -> "500m", "1000Mi" stays).
        a, b = quantity_value(want), quantity_value(have)
        return a is not None and a == b
    return False


def contained(want: Any, have: Any) -> bool:
    """Whether every field we set is present, with the same value, in the live object.

    Fields the server or others added (defaults, status, annotations) are ignored; lists must
    match item for item (the API server keeps their order and length).
    """
    if isinstance(want, dict):
        return isinstance(have, dict) and all(contained(v, have.get(k)) for k, v in want.items())
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(want) == len(have)
            and all(contained(w, h) for w, h in zip(want, have, strict=True))
        )
    return _same_scalar(want, have)


def _owns_replicas_by_apply(dep: Obj) -> bool:
    """Our apply owns spec.replicas (autoscaling was off): releasing it would reset it to 1."""
    for entry in dep.get("metadata", {}).get("managedFields") or []:
        if entry.get("manager") == names.FIELD_MANAGER and entry.get("operation") == "Apply":
            spec = (entry.get("fieldsV1") or {}).get("f:spec") or {}
            if "f:replicas" in spec:
                return True
    return False


def _owned_by(obj: Obj, uid: str | None) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return uid is not None and any(r.get("uid") == uid for r in refs)


def _ours(obj: Obj, pool: builders.Pool) -> bool:
    """Whether the operator may write `obj`: this pool owns it, or an earlier pool of the same
    name did (deleted and created again before the garbage collector got to its children).
    Anything else (a user's object that happens to have the name) is never taken over: its
    fields, owner and lifetime stay its own. Outside a cluster (no uid) nothing can tell."""
    if pool.uid is None or _owned_by(obj, pool.uid):
        return True
    return any(ref.get("kind") == api.KIND and ref.get("name") == pool.name
               and str(ref.get("apiVersion", "")).split("/")[0] == api.GROUP
               for ref in obj.get("metadata", {}).get("ownerReferences") or [])


def conflict_message(conflicts: list[str]) -> str:
    return (f"{', '.join(conflicts)} already exist{'s' if len(conflicts) == 1 else ''} and "
            f"{'is' if len(conflicts) == 1 else 'are'} not this pool's (no owner reference to "
            "it): left untouched; rename or remove them, or give the pool another name")


# --- the service ------------------------------------------------------------------------------


def possible_children(pool: builders.Pool, caps: builders.Capabilities) -> list[Obj]:
    """Every child the pool could have in either mode: what we look up by name. Names are
    deterministic, so GETs by name (cheap at any scale) replace label-selector LISTs, whose
    cost grows with the number of objects in the namespace."""
    seen: dict[tuple[str, str, str], Obj] = {}
    for mode in (api.Mode.DISAGGREGATED, api.Mode.AGGREGATED):
        spec = pool.spec.model_copy(update={"mode": mode})
        variant = builders.Pool(pool.name, pool.namespace, spec, pool.uid)
        for obj in builders.build_children(variant, caps):
            seen.setdefault(builders.object_key(obj), obj)
    if caps.monitoring and not (pool.spec.monitoring.pod_monitor
                                and pool.spec.monitoring.service_monitor):
        monitors = builders.Pool(pool.name, pool.namespace, pool.spec.model_copy(
            update={"monitoring": api.MonitoringSpec()}), pool.uid)
        for obj in (builders.build_pod_monitor(monitors, caps),
                    builders.build_service_monitor(monitors, caps)):
            seen.setdefault(builders.object_key(obj), obj)
    if caps.leader_worker_set:
        # Each role's workload in the other shape (Deployment <-> LeaderWorkerSet), so that a
        # change of nodesPerReplica finds the one to replace. Only where the kind is served:
        # a GET of a kind the cluster lacks makes the client rediscover the API, and several
        # at once break its discovery cache (the handler rediscovers when a pool needs LWS).
        for role in names.ENGINE_ROLES:
            role_spec = pool.spec.role(role)
            nodes = 1 if role_spec.nodes_per_replica > 1 else 2
            other = pool.spec.model_copy(update={role: role_spec.model_copy(
                update={"nodes_per_replica": nodes})})
            variant = builders.Pool(pool.name, pool.namespace, other, pool.uid)
            dep = builders.build_engine_deployment(variant, role, caps)
            obj = multinode.build_engine_leaderworkerset(variant, dep) if nodes > 1 else dep
            seen.setdefault(builders.object_key(obj), obj)
    for obj in gateway_objects.gateway_keys(pool, caps):  # so a removed spec.gateway finds them
        seen.setdefault(builders.object_key(obj), obj)
    # Every cache option makes NAME-prefetch (a ConfigMap): where it exists, live_children
    # looks up the cache's other objects too, so a changed cache finds them.
    prefetch = model_cache.build_prefetch_configmap(pool)
    seen.setdefault(builders.object_key(prefetch), prefetch)
    if caps.networking:  # so that turning them off finds the ones to delete
        for obj in (builders.build_engine_network_policy(pool),
                    builders.build_router_network_policy(pool)):
            seen.setdefault(builders.object_key(obj), obj)
    # Not even the pool's own set where the kind is not served (its apply says so instead).
    return [o for o in seen.values() if caps.leader_worker_set or o["kind"] != lws.KIND]


async def live_children(
    cluster: Cluster, pool: builders.Pool, caps: builders.Capabilities
) -> dict[tuple[str, str, str], Obj]:
    """The pool's existing children, by (apiVersion, kind, name), fetched concurrently."""
    candidates = possible_children(pool, caps)
    live = await _look_up(cluster, pool, candidates)
    if builders.object_key(model_cache.build_prefetch_configmap(pool)) in live:
        keys = {builders.object_key(o) for o in candidates}
        more = [o for o in model_cache.possible_cache_children(pool)
                if builders.object_key(o) not in keys]
        live.update(await _look_up(cluster, pool, more))
    return live


async def _look_up(cluster: Cluster, pool: builders.Pool,
                   candidates: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    found = await asyncio.gather(*(
        cluster.get(o["apiVersion"], o["kind"], pool.namespace, o["metadata"]["name"])
        for o in candidates
    ))
    return {builders.object_key(o): live for o, live in zip(candidates, found, strict=True)
            if live is not None}


def _role_of(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("labels", {}).get(names.ROLE_LABEL, ""))


def _ready_for_cutover(deployments: dict[str, Obj], roles: Sequence[str]) -> str | None:
    """None when every new engine role serves; else what we are waiting for."""
    for role in roles:
        dep = deployments.get(role)
        c = workloads.counts(dep or {})
        if c.ready < min(1, c.desired):
            return f"waiting for {names.child_name(_pool_of(dep), role)} to have a ready pod"
    return None


def _pool_of(dep: Obj | None) -> str:
    return str(((dep or {}).get("metadata") or {}).get("labels", {}).get(names.POOL_LABEL, "?"))


async def reconcile(cluster: Cluster, pool: builders.Pool,
                    caps: builders.Capabilities) -> ReconcileResult:
    """Converge the pool's children; see the module docstring for the rules."""
    out = ReconcileResult()
    desired = [stamped(o) for o in builders.build_children(pool, caps)]
    live = await live_children(cluster, pool, caps)
    missing = [o for o in desired if builders.object_key(o) not in live]
    if missing:
        # Children are missing: make sure the pool itself still exists, or re-creating them
        # would race its garbage collection (a timer tick right after `kubectl delete`).
        owner = await cluster.get(api.API_VERSION, api.KIND, pool.namespace, pool.name)
        if (owner is None or owner["metadata"].get("uid") != pool.uid
                or owner["metadata"].get("deletionTimestamp")):
            out.pool_gone = True
            return out
    for obj in desired:
        key = builders.object_key(obj)
        cur = live.get(key)
        is_dep = obj["kind"] in WORKLOAD_KINDS
        if cur is not None and not _ours(cur, pool):
            out.conflicts.append(label(obj))
            continue
        if is_dep and _role_of(obj) in names.ENGINE_ROLES and _prefetch_pending(pool, out):
            # SharedVolume: no engine holds a GPU before the weights are there; a live one
            # keeps its old spec (and serves) until the new weights are.
            if cur is not None:
                out.deployments[_role_of(obj)] = cur
            out.waiting = ("waiting for the model prefetch (Job "
                           f"{model_cache.prefetch_name(pool)}) before {label(obj)}")
            continue
        if (obj["kind"] == "Job" and cur is not None and _digest_of(cur) != _digest_of(obj)):
            # A Job's pod template is immutable: a new source (or spec) replaces the Job.
            await _doing(f"replace {label(obj)}", cluster.delete(cur))
            out.writes += 1
            cur = None
        if cur is not None and contained(obj, cur):
            if obj["kind"] in _CACHE_KINDS:
                out.model_cache = cur
            if obj["kind"] == "HTTPRoute":
                out.route = cur
            if is_dep:
                out.deployments[_role_of(obj)] = cur
            continue
        if (obj["kind"] == "Deployment" and _role_of(obj) == Role.ROUTER
                and router_auth.wants_default_secret(pool, caps)):
            # The key Secret the router mounts, before the router that needs it: created
            # once, never read or changed (a rotated key stays rotated).
            secret = router_auth.build_default_secret(pool, router_auth.new_key())
            if await _doing(f"create {label(secret)}", cluster.create_absent(secret)):
                out.writes += 1
                out.created.append(label(secret))
        starting_size: int | None = None
        if is_dep and "replicas" not in obj["spec"]:
            role = _role_of(obj)
            if cur is None:
                starting_size = pool.spec.role(role).replicas
            elif _owns_replicas_by_apply(cur):
                # Hand the size over before our apply stops setting it, so the Deployment
                # keeps its size (see KubeApi.apply_size).
                await _doing(f"hand over the size of {label(obj)}", cluster.apply_size(
                    pool.namespace, obj["metadata"]["name"], int(cur["spec"].get("replicas", 1)),
                    **_kind_of(obj)))
                out.writes += 1
        result = await _doing(f"apply {label(obj)}", cluster.apply(obj))
        out.writes += 1
        if starting_size is not None and starting_size != result["spec"].get("replicas"):
            await _doing(f"set the size of {label(obj)}", cluster.apply_size(
                pool.namespace, obj["metadata"]["name"], starting_size, **_kind_of(obj)))
            out.writes += 1
            result["spec"]["replicas"] = starting_size
        if cur is None:
            out.created.append(label(obj))
        elif _digest_of(cur) != _digest_of(obj):
            out.updated.append(label(obj))
        else:
            out.repaired.append(label(obj))
        if is_dep:
            out.deployments[_role_of(obj)] = result
        if obj["kind"] == "HTTPRoute":
            out.route = result
        if obj["kind"] in _CACHE_KINDS:
            out.model_cache = result

    wanted = {builders.object_key(o) for o in desired}
    stale = [o for k, o in live.items() if k not in wanted and _owned_by(o, pool.uid)]
    # The other mode's roles go only once the new engines serve (the pool keeps serving);
    # anything else turned off (NetworkPolicies, monitors) goes at once.
    # So does a role's workload of the other shape (nodesPerReplica changed across 1).
    old_roles = [o for o in stale if _role_of(o) in names.ENGINE_ROLES
                 and (_role_of(o) not in pool.spec.engine_roles()
                      or o["kind"] in WORKLOAD_KINDS)]
    if old_roles:
        cutover = _ready_for_cutover(out.deployments, pool.spec.engine_roles())
        if cutover is not None:
            stale = [o for o in stale if o not in old_roles]
        out.waiting = cutover or out.waiting
    for obj in sorted(stale, key=lambda o: _DELETE_ORDER.index(o["kind"])):
        await _doing(f"delete {label(obj)}", cluster.delete(obj))
        out.writes += 1
        out.deleted.append(label(obj))
    return out


async def remove_orphans(cluster: Cluster, pool: builders.Pool,
                         caps: builders.Capabilities) -> list[str]:
    """Delete the children still owned by `pool.uid` after the pool itself is gone.

    A reconcile that was writing when the pool was deleted may create children after the
    garbage collector has run; a real cluster's collector finds them later (their owner is
    missing), this removes them now and on API servers without that sweep."""
    removed = []
    for key, obj in (await live_children(cluster, pool, caps)).items():
        if _owned_by(obj, pool.uid):
            await cluster.delete(obj)
            removed.append(f"{key[1]}/{key[2]}")
    return removed


_CACHE_KINDS = ("Job", "DaemonSet")  # the prefetch (operator/model_cache.py)


def _prefetch_pending(pool: builders.Pool, out: ReconcileResult) -> bool:
    """The engines wait for the prefetch Job (SharedVolume), which has not succeeded yet."""
    return (model_cache.gates_engines(pool.spec)
            and not model_cache.job_succeeded(out.model_cache, pool.spec))


def _kind_of(obj: Obj) -> dict[str, str]:
    """apply_size's keywords for a workload other than a Deployment (fakes of the Cluster
    protocol written for Deployments keep working)."""
    if obj["kind"] == "Deployment":
        return {}
    return {"api_version": obj["apiVersion"], "kind": obj["kind"]}


def _digest_of(obj: Obj) -> str | None:
    annotations = obj.get("metadata", {}).get("annotations") or {}
    value = annotations.get(DIGEST_ANNOTATION)
    return None if value is None else str(value)
