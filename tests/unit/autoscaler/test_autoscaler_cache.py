"""The autoscaler's watch-fed view (autoscaler/cache.py) over an in-memory API: events update
it without listing again, a closed watch resumes from the last version, 410 Gone lists again,
a failing API refuses the view instead of serving a stale one, and status is written against
the cached pool."""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from poolpilot.autoscaler.cache import WatchedKube
from poolpilot.autoscaler.kube import KubeError

from poolpilot import api, names

Obj = dict[str, Any]
NS = "team"
KINDS = {"InferencePool", "Deployment", "Pod"}


def selected(obj: Obj, field_selector: str | None) -> bool:
    """The one field selector a pod watch could use: `status.phase=PHASE`."""
    if not field_selector:
        return True
    field, _, value = field_selector.partition("=")
    assert field == "status.phase", field_selector
    return bool((obj.get("status") or {}).get("phase") == value)


class FakeApi:
    """What WatchedKube uses of the shared client, over dicts: `emit()` changes an object and
    streams the event to open watches; `end_watches()` closes them as the server's timeout
    does; `break_watches(exc)` fails them."""

    timeout = 1.0

    def __init__(self) -> None:
        self.rv = 100
        self.objects: dict[str, dict[str, Obj]] = {k: {} for k in KINDS}
        self.watches: dict[str, list[tuple[asyncio.Queue[Any], str | None]]] = {
            k: [] for k in KINDS}
        self.lists: Counter[str] = Counter()
        self.watched_from: list[tuple[str, str]] = []
        self.calls: list[tuple[str, str]] = []  # (verb, kind) of reads and writes by name
        self.list_error: Exception | None = None
        self.patch_error: Exception | None = None
        self.requests = 0

    def emit(self, event: str, obj: Obj) -> Obj:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        kind, name = obj["kind"], obj["metadata"]["name"]
        if event == "DELETED":
            self.objects[kind].pop(name, None)
        else:
            self.objects[kind][name] = obj
        for q, selector in self.watches[kind]:
            # An object that left a watch's field selector reaches it as DELETED.
            seen = event if selected(obj, selector) else "DELETED"
            q.put_nowait((seen, copy.deepcopy(obj)))
        return obj

    def end_watches(self, error: Exception | None = None) -> None:
        for qs in self.watches.values():
            for q, _ in qs:
                q.put_nowait(error)

    async def list_with_version(self, api_version: str | None, kind: str,
                                namespace: str | None = None, *, label_selector: str | None = None,
                                field_selector: str | None = None) -> tuple[list[Obj], str]:
        self.lists[kind] += 1
        if self.list_error is not None:
            raise self.list_error
        items = [copy.deepcopy(o) for o in self.objects[kind].values()
                 if selected(o, field_selector)]
        return items, str(self.rv)

    async def watch(self, api_version: str, kind: str, namespace: str | None = None, *,
                    resource_version: str, label_selector: str | None = None,
                    field_selector: str | None = None, timeout_seconds: int = 300,
                    bookmarks: bool = False) -> AsyncIterator[tuple[str, Obj]]:
        assert bookmarks
        self.watched_from.append((kind, resource_version))
        q: asyncio.Queue[Any] = asyncio.Queue()
        entry = (q, field_selector)
        self.watches[kind].append(entry)
        try:
            while True:
                item = await q.get()
                if item is None:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self.watches[kind].remove(entry)

    async def serves(self, api_version: str, kind: str) -> bool:
        return kind in KINDS

    async def get(self, api_version: str | None, kind: str, namespace: str | None, name: str,
                  subresource: str | None = None) -> Obj | None:
        self.calls.append(("GET", kind))
        obj = self.objects[kind].get(name)
        return copy.deepcopy(obj) if obj is not None else None

    async def merge_patch(self, api_version: str | None, kind: str, namespace: str | None,
                          name: str, patch: Obj, *, subresource: str | None = None,
                          manager: str | None = None) -> Obj:
        self.calls.append(("PATCH", kind))
        if self.patch_error is not None:
            exc, self.patch_error = self.patch_error, None
            raise exc
        live = self.objects[kind][name]
        want = patch["metadata"].get("resourceVersion")
        if want and want != live["metadata"]["resourceVersion"]:
            raise KubeError(409, "the object has been modified", "Conflict")
        merged = copy.deepcopy(live)
        for key, value in patch["status"].items():
            if isinstance(value, dict):
                merged.setdefault("status", {}).setdefault(key, {}).update(value)
            else:
                merged.setdefault("status", {})[key] = value
        return self.emit("MODIFIED", merged)

    async def close(self) -> None:
        pass


def pool(name: str, **status: Any) -> Obj:
    role = {"replicas": 2, "minReplicas": 1, "maxReplicas": 8}
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1,
                         "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"model": {"name": "m"}, "prefill": role, "decode": role},
            "status": status}


def deployment(pool_name: str, role: str, replicas: int, ready: int) -> Obj:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": names.child_name(pool_name, role), "namespace": NS,
                         "labels": names.labels(pool_name, role), "generation": 1},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [{}]}}},
            "status": {"replicas": replicas, "readyReplicas": ready, "observedGeneration": 1}}


def pod(name: str, pool_name: str, role: str, phase: str, stuck: bool,
        ready_at: str | None = None) -> Obj:
    """A pod; `ready_at`: Ready since this RFC 3339 time (a Running pod's conditions)."""
    conds = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
              "message": "0/4 nodes: insufficient nvidia.com/gpu"}] if stuck else []
    if ready_at is not None:
        conds = [{"type": "PodScheduled", "status": "True"},
                 {"type": "Initialized", "status": "True", "lastTransitionTime": ready_at},
                 {"type": "Ready", "status": "True", "lastTransitionTime": ready_at}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": names.labels(pool_name, role),
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"containers": [{"name": "engine"}]},
            "status": {"phase": phase, "conditions": conds,
                       "containerStatuses": [{"name": "engine", "ready": True}]}}


@dataclass
class Env:
    api: FakeApi
    kube: WatchedKube


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    fake = FakeApi()
    fake.emit("ADDED", pool("alpha"))
    for role in ("prefill", "decode"):
        fake.emit("ADDED", deployment("alpha", role, 2, 2))
    kube = WatchedKube(fake, retry_delay=0.05, sync_timeout=2)  # type: ignore[arg-type]
    try:
        yield Env(fake, kube)
    finally:
        await kube.close()


async def settle() -> None:
    for _ in range(5):  # let the watch tasks take what was emitted
        await asyncio.sleep(0)


async def until(cond: Any, timeout: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met"
        await asyncio.sleep(0.01)


async def test_events_update_the_view_without_listing_again(env: Env) -> None:
    pools = await env.kube.list_pools()
    assert [p["metadata"]["name"] for p in pools] == ["alpha"]
    assert "managedFields" not in pools[0]["metadata"]  # slimmed on arrival
    env.api.emit("ADDED", pool("beta"))
    env.api.emit("MODIFIED", deployment("alpha", "prefill", 4, 1))
    env.api.emit("DELETED", deployment("alpha", "decode", 2, 2))
    await settle()
    assert sorted(p["metadata"]["name"] for p in await env.kube.list_pools()) == ["alpha", "beta"]
    wl = await env.kube.workloads()
    st = wl.role_state(NS, "alpha", "prefill")
    assert st is not None and (st.replicas, st.ready, st.starting) == (4, 1, 3)
    assert wl.role_state(NS, "alpha", "decode") is None
    assert env.api.lists == Counter({"InferencePool": 1, "Deployment": 1, "Pod": 1})


async def test_pods_the_scheduler_cannot_place_are_counted(env: Env) -> None:
    await env.kube.list_pools()
    env.api.emit("ADDED", pod("p1", "alpha", "decode", "Pending", stuck=True))
    env.api.emit("ADDED", pod("p2", "alpha", "decode", "Pending", stuck=False))
    await settle()
    st = (await env.kube.workloads()).role_state(NS, "alpha", "decode")
    assert st is not None and st.unschedulable == 1
    assert "insufficient nvidia.com/gpu" in st.unschedulable_message
    env.api.emit("MODIFIED", pod("p1", "alpha", "decode", "Running", stuck=False,
                                 ready_at="2026-12-07T10:00:00Z"))
    await settle()
    st = (await env.kube.workloads()).role_state(NS, "alpha", "decode")
    assert st is not None and st.unschedulable == 0


async def test_ready_pods_tell_since_when_a_role_has_served(env: Env) -> None:
    """The hold after a restart reads the Ready transitions of running pods: the watch keeps
    them (slimmed), and a restarted role's new pod moves the time on."""
    env.api.emit("ADDED", pod("r1", "alpha", "router", "Running", False,
                              ready_at="2026-12-07T10:00:00Z"))
    env.api.emit("ADDED", deployment("alpha", "router", 1, 1))
    st = (await env.kube.workloads()).role_state(NS, "alpha", "router")
    first = 1796637600.0  # 2026-12-07T10:00:00Z
    assert st is not None and st.ready_since == first + 1.0
    kept = next(o for inf in env.kube.pod_informers for o in inf.objects.values())
    assert "managedFields" not in kept["metadata"] and "containerStatuses" not in kept["status"]
    assert [c["type"] for c in kept["status"]["conditions"]] == ["PodScheduled", "Ready"]
    # The router pod is killed and its replacement is ready 40 s later.
    env.api.emit("DELETED", pod("r1", "alpha", "router", "Running", False))
    env.api.emit("ADDED", pod("r2", "alpha", "router", "Running", False,
                              ready_at="2026-12-07T10:00:40Z"))
    await settle()
    st = (await env.kube.workloads()).role_state(NS, "alpha", "router")
    assert st is not None and st.ready_since == first + 41.0
    # A pod being deleted no longer serves, though its condition still says Ready.
    leaving = pod("r2", "alpha", "router", "Running", False, ready_at="2026-12-07T10:00:40Z")
    leaving["metadata"]["deletionTimestamp"] = "2026-12-07T10:01:00Z"
    env.api.emit("MODIFIED", leaving)
    await settle()
    st = (await env.kube.workloads()).role_state(NS, "alpha", "router")
    assert st is not None and st.ready_since is None


async def test_a_closed_watch_resumes_from_the_last_version(env: Env) -> None:
    await env.kube.list_pools()
    last = env.api.emit("ADDED", pool("beta"))["metadata"]["resourceVersion"]
    await settle()
    env.api.end_watches()
    await until(lambda: len(env.api.watched_from) == 6)
    assert ("InferencePool", last) in env.api.watched_from
    assert env.api.lists["InferencePool"] == 1


async def test_gone_lists_again(env: Env) -> None:
    await env.kube.list_pools()
    env.api.objects["InferencePool"].pop("alpha")  # deleted while the watch could not see it
    env.api.end_watches(KubeError(410, "too old resource version", "Gone"))
    await until(lambda: env.api.lists["InferencePool"] == 2)
    await settle()
    assert await env.kube.list_pools() == []


async def test_a_failing_api_refuses_the_view_until_it_lists_again(env: Env) -> None:
    await env.kube.list_pools()
    env.api.list_error = KubeError(503, "etcd is down", "ServiceUnavailable")
    env.api.end_watches(KubeError(0, "connection reset", "NoAnswer"))
    await until(lambda: env.api.lists["InferencePool"] >= 2)
    with pytest.raises(KubeError, match="may be stale"):
        await env.kube.list_pools()
    env.api.list_error = None
    await until(lambda: all(i.error is None for i in env.kube.informers))
    assert len(await env.kube.list_pools()) == 1


@dataclass(frozen=True)
class StatusCase:
    id: str
    desired: int  # what the cycle wants in status.prefill.desiredReplicas
    conflict: bool  # the cached pool is behind the API's
    wrote: bool
    calls: list[tuple[str, str]]


STATUS_CASES = [
    StatusCase("unchanged-sends-nothing", 2, False, False, []),
    StatusCase("changed-one-patch-no-read", 3, False, True, [("PATCH", "InferencePool")]),
    StatusCase("behind-reads-and-retries", 3, True, True,
               [("PATCH", "InferencePool"), ("GET", "InferencePool"), ("PATCH", "InferencePool")]),
]


@pytest.mark.parametrize("case", STATUS_CASES, ids=[c.id for c in STATUS_CASES])
async def test_status_is_written_against_the_cached_pool(env: Env, case: StatusCase) -> None:
    env.api.emit("MODIFIED", pool("alpha", prefill={"desiredReplicas": 2, "reason": "Steady"}))
    await env.kube.list_pools()
    await settle()
    if case.conflict:
        env.api.patch_error = KubeError(409, "the object has been modified", "Conflict")
    wrote = await env.kube.patch_status(NS, "alpha", {"prefill": {"desiredReplicas": case.desired,
                                                                  "reason": "Steady"}}, None, [])
    assert (wrote, env.api.calls) == (case.wrote, case.calls)
    if case.conflict:
        await settle()  # the retried write reaches the view through the watch
    # Else the written pool is in the view at once, before its watch event.
    cached = next(iter(env.kube.pool_informers[0].objects.values()))
    assert cached["status"]["prefill"]["desiredReplicas"] == case.desired
