"""The Kubernetes API emulator over real HTTP, through kubernetes_asyncio and raw aiohttp:
discovery, CRUD, watches (bookmarks, 410 Gone, selectors), subresources, server-side apply,
garbage collection, Table output and fault injection."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client, config
from poolpilot.emulator.server import KubeEmulator

pytestmark = pytest.mark.adapter

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds/inferencepool.yaml").read_text())
POOL = yaml.safe_load((ROOT / "examples/llama-8b-disaggregated.yaml").read_text())


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeEmulator]:
    emulator = KubeEmulator(bookmark_interval=0.2)
    with emulator.running():
        emulator.apply(CRD)
        emulator.write_kubeconfig(tmp_path_factory.mktemp("kube") / "kubeconfig")
        yield emulator


@pytest.fixture
async def api(emu: KubeEmulator, tmp_path: Path) -> AsyncIterator[client.ApiClient]:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(emu.write_kubeconfig(tmp_path / "kc")),
                                  client_configuration=cfg)
    async with client.ApiClient(cfg) as api_client:
        yield api_client


@pytest.fixture
def ns() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def deployment(name: str, ns: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "x"}]}}},
    }


async def raw(emu: KubeEmulator, method: str, path: str, body: Any = None,
              headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.request(
        method, emu.url + path, data=None if body is None else json.dumps(body),
        headers={"Content-Type": "application/json", **(headers or {})},
    ) as resp:
        return resp.status, await resp.json(content_type=None)


async def watch_lines(emu: KubeEmulator, path: str, n: int,
                      timeout: float = 5.0) -> list[dict[str, Any]]:
    """The first n events of a watch stream."""
    out: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as s, s.get(emu.url + path) as resp:
        assert resp.status == 200
        async with asyncio.timeout(timeout):
            async for line in resp.content:
                out.append(json.loads(line))
                if len(out) == n:
                    break
    return out


# --- discovery ------------------------------------------------------------------------------


async def test_discovery_lists_core_groups_and_crds(emu: KubeEmulator) -> None:
    _, api = await raw(emu, "GET", "/api")
    assert api["versions"] == ["v1"]
    _, core = await raw(emu, "GET", "/api/v1")
    assert core["groupVersion"] == "v1"
    by_name = {r["name"]: r for r in core["resources"]}
    assert by_name["namespaces"]["namespaced"] is False
    assert {"list", "watch", "patch"} <= set(by_name["pods"]["verbs"])
    assert "pods/status" in by_name
    _, groups = await raw(emu, "GET", "/apis")
    names = {g["name"] for g in groups["groups"]}
    assert {"apps", "policy", "discovery.k8s.io", "events.k8s.io", "coordination.k8s.io",
            "apiextensions.k8s.io", "poolpilot.dev"} <= names
    _, pools = await raw(emu, "GET", "/apis/poolpilot.dev/v1alpha1")
    main = next(r for r in pools["resources"] if r["name"] == "inferencepools")
    assert main["shortNames"] == ["ipool"] and main["categories"] == ["poolpilot"]
    assert "inferencepools/status" in {r["name"] for r in pools["resources"]}
    _, apps = await raw(emu, "GET", "/apis/apps/v1")
    scale = next(r for r in apps["resources"] if r["name"] == "deployments/scale")
    assert (scale["group"], scale["kind"]) == ("autoscaling", "Scale")
    status, _ = await raw(emu, "GET", "/apis/nothing.example/v1")
    assert status == 404


async def test_kubernetes_asyncio_discovery_and_version(api: client.ApiClient) -> None:
    version = await client.VersionApi(api).get_code()
    assert version.major == "1"
    groups = await client.ApisApi(api).get_api_versions()
    assert "apps" in {g.name for g in groups.groups}


# --- CRUD and lists -------------------------------------------------------------------------


async def test_list_has_kind_api_version_and_resource_version(emu: KubeEmulator,
                                                              ns: str) -> None:
    await raw(emu, "POST", f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "a"}})
    status, lst = await raw(emu, "GET", f"/api/v1/namespaces/{ns}/configmaps")
    assert status == 200
    assert (lst["kind"], lst["apiVersion"]) == ("ConfigMapList", "v1")
    assert int(lst["metadata"]["resourceVersion"]) >= int(
        lst["items"][0]["metadata"]["resourceVersion"])


async def test_errors_are_status_objects(emu: KubeEmulator, ns: str) -> None:
    status, body = await raw(emu, "GET", f"/apis/apps/v1/namespaces/{ns}/deployments/nope")
    assert status == 404
    assert body["kind"] == "Status" and body["reason"] == "NotFound"
    assert body["message"] == 'deployments.apps "nope" not found'
    await raw(emu, "POST", f"/apis/apps/v1/namespaces/{ns}/deployments", deployment("d", ns))
    status, body = await raw(emu, "POST", f"/apis/apps/v1/namespaces/{ns}/deployments",
                             deployment("d", ns))
    assert (status, body["reason"]) == (409, "AlreadyExists")


def _configmap(name: str, data: str) -> str:
    return ('{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "' + name
            + '"}, "data": ' + data + "}")


@pytest.mark.parametrize(("case", "body", "status", "reason"), [
    ("nested-2000-levels", _configmap("deep", '{"a": ' * 2000 + "{}" + "}" * 2000), 422,
     "Invalid"),
    ("50-MB", _configmap("big", '{"x": "' + "a" * (50 * 1024 * 1024) + '"}'), 413,
     "RequestEntityTooLarge"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 40 else "")
async def test_hostile_bodies_are_refused_as_the_api_server_does(
        emu: KubeEmulator, ns: str, case: str, body: str, status: int, reason: str) -> None:
    async with aiohttp.ClientSession() as s, s.post(
            f"{emu.url}/api/v1/namespaces/{ns}/configmaps", data=body,
            headers={"Content-Type": "application/json"}) as resp:
        got, answer = resp.status, await resp.json(content_type=None)
    assert (got, answer["kind"], answer["reason"]) == (status, "Status", reason), answer
    assert (await raw(emu, "GET", f"/api/v1/namespaces/{ns}/configmaps"))[1]["items"] == []


async def test_label_and_field_selectors(api: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(api)
    for name, role in (("a", "prefill"), ("b", "decode"), ("c", "router")):
        await core.create_namespaced_config_map(
            ns, {"metadata": {"name": name, "labels": {"role": role}}})
    got = await core.list_namespaced_config_map(ns, label_selector="role in (prefill,decode)")
    assert sorted(i.metadata.name for i in got.items) == ["a", "b"]
    got = await core.list_namespaced_config_map(ns, label_selector="role!=router")
    assert sorted(i.metadata.name for i in got.items) == ["a", "b"]
    got = await core.list_config_map_for_all_namespaces(field_selector=f"metadata.namespace={ns}"
                                                        ",metadata.name=c")
    assert [i.metadata.name for i in got.items] == ["c"]


async def test_dry_run_stores_nothing(emu: KubeEmulator, ns: str) -> None:
    status, _ = await raw(emu, "POST", f"/api/v1/namespaces/{ns}/configmaps?dryRun=All",
                          {"metadata": {"name": "dry"}})
    assert status == 201
    status, _ = await raw(emu, "GET", f"/api/v1/namespaces/{ns}/configmaps/dry")
    assert status == 404


# --- watches --------------------------------------------------------------------------------


async def test_watch_from_a_list_version_sees_only_later_changes(emu: KubeEmulator,
                                                                 ns: str) -> None:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    await raw(emu, "POST", base, {"metadata": {"name": "before"}})
    _, lst = await raw(emu, "GET", base)
    rv = lst["metadata"]["resourceVersion"]
    await raw(emu, "POST", base, {"metadata": {"name": "after"}})
    await raw(emu, "PATCH", f"{base}/after", {"data": {"k": "v"}},
              {"Content-Type": "application/merge-patch+json"})
    await raw(emu, "DELETE", f"{base}/after")
    events = await watch_lines(emu, f"{base}?watch=1&resourceVersion={rv}", 3)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "after"), ("MODIFIED", "after"), ("DELETED", "after")]
    assert events[1]["object"]["data"] == {"k": "v"}


async def test_watch_without_version_starts_with_synthetic_added(emu: KubeEmulator,
                                                                 ns: str) -> None:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    await raw(emu, "POST", base, {"metadata": {"name": "a"}})
    events = await watch_lines(emu, f"{base}?watch=true", 1)
    assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "a"


async def test_idle_watch_gets_bookmarks_with_the_current_version(emu: KubeEmulator,
                                                                  ns: str) -> None:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    _, lst = await raw(emu, "GET", base)
    events = await watch_lines(
        emu, f"{base}?watch=1&allowWatchBookmarks=true&resourceVersion="
        f"{lst['metadata']['resourceVersion']}", 1)
    assert events[0]["type"] == "BOOKMARK"
    assert events[0]["object"]["kind"] == "ConfigMap"
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) >= int(
        lst["metadata"]["resourceVersion"])


async def test_watch_timeout_seconds_ends_the_stream(emu: KubeEmulator, ns: str) -> None:
    async with aiohttp.ClientSession() as s, s.get(
        f"{emu.url}/api/v1/namespaces/{ns}/configmaps?watch=1&timeoutSeconds=1"
    ) as resp, asyncio.timeout(5):
        assert await resp.read() is not None  # the server closes the stream by itself


async def test_too_old_version_is_410_gone_in_the_stream(emu: KubeEmulator, ns: str,
                                                         api: client.ApiClient) -> None:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    _, lst = await raw(emu, "GET", base)
    old = lst["metadata"]["resourceVersion"]
    await raw(emu, "POST", base, {"metadata": {"name": "x"}})
    emu.compact()
    events = await watch_lines(emu, f"{base}?watch=1&resourceVersion={old}", 1)
    assert events[0]["type"] == "ERROR"
    assert (events[0]["object"]["code"], events[0]["object"]["reason"]) == (410, "Expired")


async def test_endpointslices_watched_by_service_label(api: client.ApiClient, ns: str) -> None:
    from kubernetes_asyncio import watch

    disc = client.DiscoveryV1Api(api)

    def slice_(name: str, service: str, ip: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4", "ports": [{"name": "http", "port": 8000}],
                "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}]}

    await disc.create_namespaced_endpoint_slice(ns, slice_("p-decode-1", "p-decode", "10.0.0.1"))
    seen: list[tuple[str, str]] = []

    async def changes() -> None:
        await disc.create_namespaced_endpoint_slice(ns, slice_("p-prefill-1", "p-prefill",
                                                               "10.0.0.9"))
        await disc.create_namespaced_endpoint_slice(ns, slice_("p-decode-2", "p-decode",
                                                               "10.0.0.2"))

    w = watch.Watch()
    task = None
    async with asyncio.timeout(10):
        async for ev in w.stream(disc.list_namespaced_endpoint_slice, ns,
                                 label_selector="kubernetes.io/service-name=p-decode"):
            seen.append((ev["type"], ev["object"].metadata.name))
            if task is None:
                task = asyncio.create_task(changes())
            if len(seen) == 2:
                break
    w.stop()
    assert task is not None
    await task
    assert seen == [("ADDED", "p-decode-1"), ("ADDED", "p-decode-2")]


async def test_disconnect_watches_ends_open_streams(emu: KubeEmulator, ns: str) -> None:
    async with aiohttp.ClientSession() as s, s.get(
        f"{emu.url}/api/v1/namespaces/{ns}/configmaps?watch=1&resourceVersion=0"
    ) as resp:
        async with asyncio.timeout(5):
            while emu.open_watches() == 0:
                await asyncio.sleep(0.01)
        assert await asyncio.to_thread(emu.disconnect_watches) >= 1
        async with asyncio.timeout(5):
            await resp.read()  # ends instead of hanging


# --- the calls poolpilot's components make --------------------------------------------------


async def test_scale_subresource_through_kubernetes_asyncio(api: client.ApiClient,
                                                            ns: str) -> None:
    apps = client.AppsV1Api(api)
    await apps.create_namespaced_deployment(ns, deployment("d", ns, replicas=2))
    scale = await apps.read_namespaced_deployment_scale("d", ns)
    assert (scale.spec.replicas, scale.status.selector) == (2, "app=d")
    await apps.patch_namespaced_deployment_scale("d", ns, {"spec": {"replicas": 5}})
    dep = await apps.read_namespaced_deployment("d", ns)
    assert dep.spec.replicas == 5 and dep.metadata.generation == 2


async def test_custom_resource_status_patch_and_events(api: client.ApiClient, ns: str) -> None:
    custom = client.CustomObjectsApi(api)
    pool = {**POOL, "metadata": {"name": "p", "namespace": ns}}
    created = await custom.create_namespaced_custom_object(
        "poolpilot.dev", "v1alpha1", ns, "inferencepools", pool)
    await custom.patch_namespaced_custom_object_status(
        "poolpilot.dev", "v1alpha1", ns, "inferencepools", "p",
        {"status": {"observedGeneration": 1}},
        # kubernetes_asyncio would label a dict body json-patch; a real server rejects that.
        _content_type="application/merge-patch+json")
    got = await custom.get_namespaced_custom_object("poolpilot.dev", "v1alpha1", ns,
                                                    "inferencepools", "p")
    assert got["status"]["observedGeneration"] == 1
    assert got["metadata"]["generation"] == created["metadata"]["generation"] == 1
    ref = {"apiVersion": "poolpilot.dev/v1alpha1", "kind": "InferencePool", "name": "p",
           "namespace": ns, "uid": created["metadata"]["uid"]}
    await client.EventsV1Api(api).create_namespaced_event(ns, {
        "metadata": {"generateName": "p."}, "regarding": ref, "reason": "ScaledUp",
        "note": "decode 1 -> 2", "type": "Normal", "action": "Scale",
        "reportingController": "poolpilot.dev/autoscaler", "reportingInstance": "a-0",
        "eventTime": "2026-01-01T00:00:00.000000Z"})
    await client.CoreV1Api(api).create_namespaced_event(ns, {
        "metadata": {"name": "p.1"}, "involvedObject": ref, "reason": "Reconciled",
        "message": "ok", "type": "Normal"})
    new = await client.EventsV1Api(api).list_namespaced_event(ns)
    old = await client.CoreV1Api(api).list_namespaced_event(ns)
    assert [e.reason for e in new.items] == ["ScaledUp"]
    assert [e.reason for e in old.items] == ["Reconciled"]


async def test_invalid_custom_resource_is_422_with_causes(emu: KubeEmulator, ns: str) -> None:
    bad = json.loads(json.dumps(POOL))
    bad["metadata"] = {"name": "bad", "namespace": ns}
    bad["spec"]["decode"]["minReplicas"] = 20
    status, body = await raw(emu, "POST",
                             f"/apis/poolpilot.dev/v1alpha1/namespaces/{ns}/inferencepools", bad)
    assert (status, body["reason"]) == (422, "Invalid")
    assert "spec.decode.maxReplicas" in [c["field"] for c in body["details"]["causes"]]


async def test_server_side_apply_over_http(emu: KubeEmulator, ns: str) -> None:
    path = f"/apis/apps/v1/namespaces/{ns}/deployments/d"
    yaml_ct = {"Content-Type": "application/apply-patch+yaml"}
    status, obj = await raw(emu, "PATCH", f"{path}?fieldManager=op",
                            deployment("d", ns, 2), yaml_ct)
    assert status == 201 and obj["spec"]["replicas"] == 2
    await raw(emu, "PATCH", f"{path}/scale?fieldManager=scaler", {"spec": {"replicas": 4}},
              {"Content-Type": "application/merge-patch+json"})
    status, body = await raw(emu, "PATCH", f"{path}?fieldManager=op",
                             deployment("d", ns, 2), yaml_ct)
    assert status == 409 and body["details"]["causes"][0]["field"] == ".spec.replicas"
    status, obj = await raw(emu, "PATCH", f"{path}?fieldManager=op&force=true",
                            deployment("d", ns, 2), yaml_ct)
    assert status == 200 and obj["spec"]["replicas"] == 2


async def test_owner_deletion_garbage_collects_children(api: client.ApiClient,
                                                        ns: str) -> None:
    custom = client.CustomObjectsApi(api)
    pool = await custom.create_namespaced_custom_object(
        "poolpilot.dev", "v1alpha1", ns, "inferencepools",
        {**POOL, "metadata": {"name": "p", "namespace": ns}})
    child = deployment("p-decode", ns)
    child["metadata"]["ownerReferences"] = [{
        "apiVersion": "poolpilot.dev/v1alpha1", "kind": "InferencePool", "name": "p",
        "uid": pool["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    apps = client.AppsV1Api(api)
    await apps.create_namespaced_deployment(ns, child)
    await custom.delete_namespaced_custom_object("poolpilot.dev", "v1alpha1", ns,
                                                 "inferencepools", "p")
    assert (await apps.list_namespaced_deployment(ns)).items == []


async def test_table_output_has_crd_printer_columns(emu: KubeEmulator, ns: str) -> None:
    base = f"/apis/poolpilot.dev/v1alpha1/namespaces/{ns}/inferencepools"
    await raw(emu, "POST", base, {**POOL, "metadata": {"name": "p"}})
    await raw(emu, "PATCH", f"{base}/p/status",
              {"status": {"prefill": {"summary": "1/1"}, "conditions": [
                  {"type": "Ready", "status": "True", "reason": "AllReady", "message": "",
                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
              {"Content-Type": "application/merge-patch+json"})
    _, table = await raw(emu, "GET", base,
                         headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    assert table["kind"] == "Table"
    cols = [c["name"] for c in table["columnDefinitions"]]
    assert [c["name"] for c in table["columnDefinitions"] if not c["priority"]] == [
        "Name", "Mode", "Prefill", "Decode", "TTFT", "Ready", "Reason", "Age"]
    cells = dict(zip(cols, table["rows"][0]["cells"], strict=True))
    assert (cells["Name"], cells["Mode"], cells["Prefill"], cells["Ready"], cells["Reason"]) == (
        "p", "Disaggregated", "1/1", "True", "AllReady")


# --- faults ---------------------------------------------------------------------------------


async def test_injected_conflict_then_success(emu: KubeEmulator, api: client.ApiClient,
                                              ns: str) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}})
    emu.faults.add("PATCH", rf"/namespaces/{ns}/configmaps/c$", 409, times=1)
    with pytest.raises(client.ApiException) as err:
        await core.patch_namespaced_config_map("c", ns, {"data": {"a": "1"}})
    assert err.value.status == 409
    await core.patch_namespaced_config_map("c", ns, {"data": {"a": "1"}})
    assert (await core.read_namespaced_config_map("c", ns)).data == {"a": "1"}


async def test_injected_500_after_the_write_happened(emu: KubeEmulator, api: client.ApiClient,
                                                     ns: str) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}})
    emu.faults.add("PATCH", rf"/namespaces/{ns}/configmaps/c$", 500, when="after")
    with pytest.raises(client.ApiException) as err:
        await core.patch_namespaced_config_map("c", ns, {"data": {"a": "1"}})
    assert err.value.status == 500
    assert (await core.read_namespaced_config_map("c", ns)).data == {"a": "1"}


async def test_injected_timeout_and_disconnect(emu: KubeEmulator, api: client.ApiClient,
                                               ns: str) -> None:
    core = client.CoreV1Api(api)
    emu.faults.add("GET", rf"/namespaces/{ns}/configmaps$", "timeout", delay_s=30)
    with pytest.raises(asyncio.TimeoutError):
        await core.list_namespaced_config_map(ns, _request_timeout=0.5)
    # times=2: aiohttp retries a request once when a reused connection drops.
    emu.faults.add("GET", rf"/namespaces/{ns}/configmaps$", "disconnect", times=2)
    with pytest.raises(aiohttp.ClientError):
        await core.list_namespaced_config_map(ns)
    assert (await core.list_namespaced_config_map(ns)).items == []  # faults used up


async def test_requests_are_recorded_and_writes_counted(emu: KubeEmulator, ns: str) -> None:
    prefix = f"/api/v1/namespaces/{ns}/"
    before = emu.count_writes(prefix)
    await raw(emu, "POST", f"{prefix}configmaps", {"metadata": {"name": "c"}})
    await raw(emu, "GET", f"{prefix}configmaps/c")
    await raw(emu, "DELETE", f"{prefix}configmaps/c")
    assert emu.count_writes(prefix) == before + 2
    mine = [(r.method, r.status) for r in emu.requests if r.path.startswith(prefix)]
    assert mine[-3:] == [("POST", 201), ("GET", 200), ("DELETE", 200)]


async def test_async_lifecycle_and_bounded_request_log() -> None:
    async with KubeEmulator(request_log_limit=5) as emu:
        for _ in range(20):
            status, _ = await raw(emu, "GET", "/api/v1/namespaces")
            assert status == 200
        assert 5 <= len(emu.requests) <= 10
        assert emu.requests[-1].path == "/api/v1/namespaces"
    with pytest.raises(aiohttp.ClientConnectionError):
        await raw(emu, "GET", "/version")  # stopped


async def test_apply_body_in_real_yaml_keeps_timestamps_as_strings(emu: KubeEmulator,
                                                                   ns: str) -> None:
    body = (f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y\n  namespace: {ns}\n"
            "data:\n  when: 2026-01-01T00:00:00Z\n")
    async with aiohttp.ClientSession() as s, s.patch(
        f"{emu.url}/api/v1/namespaces/{ns}/configmaps/y?fieldManager=t", data=body,
        headers={"Content-Type": "application/apply-patch+yaml"},
    ) as resp:
        assert resp.status == 201
        assert (await resp.json())["data"] == {"when": "2026-01-01T00:00:00Z"}


async def test_watch_variants_table_legacy_path_and_initial_events(emu: KubeEmulator,
                                                                   ns: str) -> None:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    await raw(emu, "POST", base, {"metadata": {"name": "a"}})
    # kubectl get -w: Table rows as watch objects.
    out: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as s, s.get(
        f"{emu.url}{base}?watch=1", headers={"Accept": "application/json;as=Table;g=meta.k8s.io;"
                                                       "v=v1"}) as resp, asyncio.timeout(5):
        out.append(json.loads(await resp.content.readline()))
    assert out[0]["object"]["kind"] == "Table"
    assert out[0]["object"]["rows"][0]["cells"][0] == "a"
    # The legacy /watch/ path of one object.
    await raw(emu, "POST", base, {"metadata": {"name": "b"}})
    events = await watch_lines(emu, f"/api/v1/watch/namespaces/{ns}/configmaps/b", 1)
    assert events[0]["object"]["metadata"]["name"] == "b"
    # Watch-list: the initial ADDED burst ends with the initial-events-end bookmark.
    events = await watch_lines(
        emu, f"{base}?watch=1&sendInitialEvents=true&allowWatchBookmarks=true"
        "&resourceVersionMatch=NotOlderThan", 3)
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    assert events[2]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
