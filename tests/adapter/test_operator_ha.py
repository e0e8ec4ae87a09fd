"""HA: two operator replicas peer through a ClusterKopfPeering; only the higher priority acts,
and the other takes over when it goes away. Needs the emulator's request log (user agents)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from poolpilot.emulator.server import KubeEmulator
from poolpilot.operator.handlers import OperatorConfig
from poolpilot.testkit.cluster import cluster_from_env
from poolpilot.testkit.operator import Kubectl, install, running_operator
from poolpilot.testkit.polling import wait_for
from poolpilot.testkit.prometheus import free_port

pytestmark = [pytest.mark.adapter, pytest.mark.cluster]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, KubeEmulator]]:
    with cluster_from_env(tmp_path_factory.mktemp("kube-ha")) as (kubeconfig, emu):
        if emu is None:
            pytest.skip("tells the replicas apart through the emulator's request log")
        install(Kubectl(kubeconfig))
        yield kubeconfig, emu


def _pool(name: str) -> dict[str, object]:
    return {"apiVersion": "poolpilot.dev/v1alpha1", "kind": "InferencePool",
            "metadata": {"name": name, "namespace": "ha"},
            "spec": {"model": {"name": "m"}, "prefill": {"gpus": 0}, "decode": {"gpus": 0}}}


def _get_json(url: str) -> dict[str, object] | None:
    try:
        r = httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


def _writers(emu: KubeEmulator, pool: str) -> set[str]:
    """User agents of the writes to a pool's children."""
    return {r.user_agent.split(" ")[0] for r in list(emu.requests)
            if r.is_write and "/namespaces/ha/" in r.path and f"/{pool}-" in r.path}


def _readers(emu: KubeEmulator, pool: str) -> set[str]:
    """User agents that listed the pool's children (every reconcile does)."""
    return {r.user_agent.split(" ")[0] for r in list(emu.requests)
            if r.method == "GET" and f"={pool}" in r.query.get("labelSelector", "")}


def test_only_the_active_replica_acts_and_the_standby_takes_over(
    cluster: tuple[Path, KubeEmulator],
) -> None:
    kubeconfig, emu = cluster
    k = Kubectl(kubeconfig)
    base = OperatorConfig(drift_interval=1.0, request_timeout=3.0, peering_lifetime=5,
                          peering_mandatory=True)
    standby = OperatorConfig(**{**base.__dict__, "identity": "standby"})
    active = OperatorConfig(**{**base.__dict__, "identity": "active"})
    health = f"http://127.0.0.1:{free_port()}/healthz"
    with running_operator(kubeconfig, standby, standalone=False, priority=10):
        with running_operator(kubeconfig, active, standalone=False, priority=20,
                              liveness=health):
            # The liveness endpoint answers once the operator runs (its probe lists API groups).
            probe = wait_for(lambda: _get_json(health), what="the liveness endpoint")
            assert "api" in probe
            # Both replicas announced themselves in the peering object.
            wait_for(lambda: len((k.get("clusterkopfpeering", "poolpilot") or {})
                                 .get("status") or {}) >= 2, what="both peers registered")
            k.apply(_pool("first"))
            wait_for(lambda: k.get("deployment", "first-router", "ha"), what="children")
            # Give the standby time to act if it (wrongly) did: drift timers tick every second.
            start = len(emu.requests)
            wait_for(lambda: sum(1 for r in emu.requests[start:] if "first" in r.query.get(
                "labelSelector", "")) >= 20, timeout=30, what="several reconciles")
            assert _writers(emu, "first") == {"poolpilot-operator/active"}
            assert _readers(emu, "first") == {"poolpilot-operator/active"}  # standby is idle
        # The active replica is gone (it removed itself from the peering): the standby resumes.
        k.apply(_pool("second"))
        wait_for(lambda: k.get("deployment", "second-router", "ha"), timeout=30,
                 what="the standby to take over")
        assert _writers(emu, "second") == {"poolpilot-operator/standby"}
        # It also adopts the first pool: its drift timer now reconciles it.
        wait_for(lambda: "poolpilot-operator/standby" in _readers(emu, "first"), timeout=30,
                 what="the standby to reconcile the first pool")
