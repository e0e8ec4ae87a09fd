"""The shared Kubernetes client against the API emulator over real HTTP: per-request
timeouts, the error mapping (403/422 permanent with the API's message), discovery of a CRD
installed after start, kinds named without their group, and a watch ended by 410 Gone."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from poolpilot.emulator.server import KubeEmulator
from poolpilot.kubeclient import ApiError, KubeClient
from poolpilot.testkit.operator import monitoring_crds

pytestmark = [pytest.mark.adapter]

NS = "kc"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KubeEmulator, Path]]:
    with KubeEmulator().running() as emu:
        path = emu.write_kubeconfig(tmp_path_factory.mktemp("kc") / "kubeconfig")
        emu.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        yield emu, path


def _cm(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS},
            "data": {"k": "v"}}


async def test_a_request_that_gets_no_answer_times_out_as_transient(emulator) -> None:
    emu, path = emulator
    kube = await KubeClient.connect(path, timeout=0.5)
    try:
        emu.faults.add("GET", r"/configmaps/slow$", "timeout", delay_s=20)
        with pytest.raises(ApiError) as err:
            await kube.get("v1", "ConfigMap", NS, "slow")
        assert err.value.status == 0 and err.value.transient
        assert "GET /api/v1/namespaces/kc/configmaps/slow" in str(err.value)
    finally:
        emu.faults.clear()
        await kube.close()


@pytest.mark.parametrize("status,message", [
    (403, 'configmaps "q" is forbidden: exceeded quota: cms, requested: count/configmaps=1'),
    (422, 'ConfigMap "q" is invalid: data: Too long'),
], ids=["403-quota", "422-invalid"])
async def test_refusals_are_permanent_and_carry_the_api_message(emulator, status: int,
                                                                message: str) -> None:
    emu, path = emulator
    kube = await KubeClient.connect(path)
    try:
        emu.faults.add("PATCH", r"/configmaps/q$", status, message=message)
        with pytest.raises(ApiError) as err:
            await kube.apply(_cm("q"), manager="t")
        assert (err.value.status, err.value.permanent, err.value.message) == (
            status, True, message)
    finally:
        emu.faults.clear()
        await kube.close()


async def test_a_crd_installed_after_start_is_discovered(emulator) -> None:
    emu, path = emulator
    kube = await KubeClient.connect(path)
    try:
        assert not await kube.serves("monitoring.coreos.com/v1", "PodMonitor")
        for crd in monitoring_crds():
            emu.apply(crd)
        assert await kube.serves("monitoring.coreos.com/v1", "PodMonitor")
        assert await kube.path("monitoring.coreos.com/v1", "PodMonitor", NS, "m") == (
            f"/apis/monitoring.coreos.com/v1/namespaces/{NS}/podmonitors/m")
        assert "monitoring.coreos.com" in await kube.api_groups()
    finally:
        await kube.close()


async def test_kinds_without_a_group_prefer_the_core_group(emulator) -> None:
    _, path = emulator
    kube = await KubeClient.connect(path)
    try:
        assert await kube.path(None, "Event", NS) == f"/api/v1/namespaces/{NS}/events"
        assert await kube.path(None, "EndpointSlice", NS) == (
            f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices")
        # Cluster-scoped kinds ignore a namespace.
        assert await kube.path("v1", "Namespace", NS, "x") == "/api/v1/namespaces/x"
        with pytest.raises(ApiError) as err:
            await kube.path(None, "NoSuchKind")
        assert err.value.status == 404
    finally:
        await kube.close()


async def test_crud_and_a_watch_from_the_lists_version(emulator) -> None:
    emu, path = emulator
    kube = await KubeClient.connect(path, user_agent="kubeclient-test/1")
    try:
        await kube.create(_cm("w1"))
        items, rv = await kube.list_with_version("v1", "ConfigMap", NS)
        assert any(i["metadata"]["name"] == "w1" and i["kind"] == "ConfigMap" for i in items)
        events: list[tuple[str, str]] = []

        async def follow() -> None:
            async for kind, obj in kube.watch("v1", "ConfigMap", NS, resource_version=rv,
                                              timeout_seconds=5):
                events.append((kind, obj["metadata"]["name"]))
                if kind == "DELETED":
                    return

        task = asyncio.create_task(follow())
        await kube.merge_patch("v1", "ConfigMap", NS, "w1", {"data": {"k": "2"}})
        assert await kube.delete("v1", "ConfigMap", NS, "w1") is True
        assert await kube.delete("v1", "ConfigMap", NS, "w1") is False
        await asyncio.wait_for(task, 10)
        assert events == [("MODIFIED", "w1"), ("DELETED", "w1")]
        assert await kube.get("v1", "ConfigMap", NS, "w1") is None
        assert any(r.user_agent == "kubeclient-test/1" for r in emu.requests)
    finally:
        await kube.close()


async def test_a_watch_from_a_compacted_version_raises_gone(emulator) -> None:
    emu, path = emulator
    kube = await KubeClient.connect(path)
    try:
        _, rv = await kube.list_with_version("v1", "ConfigMap", NS)
        await kube.create(_cm("g1"))
        emu.compact()  # as etcd compaction: the list's version is history now
        with pytest.raises(ApiError) as err:
            async for _ in kube.watch("v1", "ConfigMap", NS, resource_version=rv,
                                      timeout_seconds=5):
                pass
        assert err.value.status == 410 and "too old resource version" in err.value.message
    finally:
        await kube.close()
