"""Least privilege, checked against what the code does: the operator (with Kopf peering, as the
chart runs it) and the router's discovery run against the Kubernetes API emulator through a
scenario that takes every path that writes (create, drift repair, mode switch, features turned
off, status, Events, a pool deleted mid-reconcile, deletion); every call they make is mapped to
the RBAC attribute the API server checks and compared with the chart's ClusterRole (operator)
and the Role the operator gives each router. Every call must be allowed, and every granted
verb must have been used. (The autoscaler's rules are checked the same way in
test_autoscaler_ha.py, whose two replicas take the leader-election paths.)"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from poolpilot.emulator.cluster import leaderworkersets
from poolpilot.emulator.server import KubeEmulator
from poolpilot.operator import builders
from poolpilot.operator.handlers import OperatorConfig
from poolpilot.router.discovery import KubernetesDiscovery
from poolpilot.testkit.operator import Kubectl, install, running_operator
from poolpilot.testkit.polling import wait_for
from rbac_calls import called, chart_rules, compare

from poolpilot import names

pytestmark = [pytest.mark.adapter, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
NS = "rbac"
CONFIG = OperatorConfig(drift_interval=1.0, cutover_poll=0.3, network_policies=True,
                        router_auth=True)  # as the chart runs it
# Not a call, yet needed: with the OwnerReferencesPermissionEnforcement admission plugin
# (OpenShift enables it), setting blockOwnerDeletion on a child's owner reference requires
# `update` on the owner's finalizers subresource.
OPERATOR_ADMISSION = {("poolpilot.dev", "inferencepools/finalizers", "update")}
# Ours in full: the Gateway API Inference Extension's kind is also named InferencePool.
POOLS = "inferencepools.poolpilot.dev"
# A pool behind a Gateway through a GIE InferencePool: its HTTPRoute and its GIE pool.
GATEWAY = {"parentRefs": [{"name": "gw"}], "inferencePool": True,
           "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}


def pool(name: str, **spec: Any) -> dict[str, Any]:
    body = {"model": {"name": "org/model"}, "prefill": {"gpus": 0}, "decode": {"gpus": 0},
            "engine": {"gpus": 0}, **spec}
    return {"apiVersion": "poolpilot.dev/v1alpha1", "kind": "InferencePool",
            "metadata": {"name": name, "namespace": NS}, "spec": body}


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KubeEmulator, Path]]:
    with KubeEmulator().running() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path_factory.mktemp("rbac") / "kubeconfig")
        kubectl = Kubectl(kubeconfig)
        install(kubectl, monitoring=True)
        kubectl.apply(*[yaml.safe_load(p.read_text()) for p in sorted(
            (ROOT / "tests" / "fixtures" / "upstream" / "gateway").glob("*.yaml"))],
            server_side=True)
        kubectl.apply(leaderworkersets.crd(), server_side=True)
        kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        yield emulator, kubeconfig


def _settled(kubectl: Kubectl, name: str) -> bool:
    obj = kubectl.get(POOLS, name, NS) or {}
    gen = obj.get("metadata", {}).get("generation")
    return bool(gen) and (obj.get("status") or {}).get("observedGeneration") == gen


def operator_scenario(emu: KubeEmulator, kubectl: Kubectl) -> None:
    a = "alpha"
    kubectl.apply(pool(a, gateway=GATEWAY))  # create: every child kind, monitors,
    # NetworkPolicies, the HTTPRoute and the GIE InferencePool
    wait_for(lambda: _settled(kubectl, a), what="alpha reconciled")
    kubectl("delete", "service", f"{a}-router", "-n", NS)  # drift: re-created
    wait_for(lambda: kubectl.get("service", f"{a}-router", NS), what="drift repaired")
    # Turned off: monitors and NetworkPolicies deleted at once; a mode switch deletes the old
    # roles once the new engine serves.
    kubectl.apply(pool(a, mode="Aggregated", monitoring={"podMonitor": False},
                       networkPolicy={"enabled": False}))
    wait_for(lambda: kubectl.get("deployment", f"{a}-engine", NS), what="the engine role")
    kubectl("patch", "deployment", f"{a}-engine", "-n", NS, "--subresource=status",
            "--type=merge", "-p", '{"status": {"replicas": 1, "readyReplicas": 1}}')
    wait_for(lambda: kubectl.get("deployment", f"{a}-decode", NS) is None
             and kubectl.get("networkpolicy", f"{a}-engines", NS) is None
             and kubectl.get("podmonitor", f"{a}-engines", NS) is None
             and kubectl.get("httproutes.gateway.networking.k8s.io", a, NS) is None,
             what="removals")
    # A pool deleted (its finalizer removed by hand) while a reconcile writes: the operator
    # deletes what it wrote after the pool was gone, every kind of child (held at the first).
    b = "beta"
    held = emu.faults.add("PATCH", rf"/configmaps/{b}-router$", "delay", delay_s=60)
    try:
        kubectl.apply(pool(b))
        wait_for(lambda: held.hits >= 1, what="beta's reconcile held")
        emu.delete(POOLS, b, NS)
        emu.patch(POOLS, b, {"metadata": {"finalizers": None}}, NS)
    finally:
        held.release()
    wait_for(lambda: not [k for k in ("configmaps", "deployments", "rolebindings")
                          if emu.objects(k, NS, f"{names.POOL_LABEL}={b}")] or None,
             what="beta's children removed")
    # The model cache: a shared volume's PVCs and prefetch Job; a new model replaces the Job
    # (deleted and made again); NodeLocal's DaemonSet instead; back to EmptyDir removes it.
    c = "gamma"

    def cached(kind: str, model: str = "org/model") -> dict[str, Any]:
        return pool(c, model={"name": model, "cache": {"type": kind}})

    kubectl.apply(cached("SharedVolume"))
    wait_for(lambda: kubectl.get("jobs", f"{c}-prefetch", NS), what="the prefetch Job")
    uid = (kubectl.get("jobs", f"{c}-prefetch", NS) or {})["metadata"]["uid"]
    kubectl.apply(cached("SharedVolume", "org/other"))
    wait_for(lambda: (kubectl.get("jobs", f"{c}-prefetch", NS) or {}).get(
        "metadata", {}).get("uid") not in (None, uid), what="the Job replaced")
    kubectl.apply(cached("NodeLocal"))
    wait_for(lambda: kubectl.get("daemonsets", f"{c}-prefetch", NS)
             and kubectl.get("persistentvolumeclaims", f"{c}-model-cache", NS) is None,
             what="the DaemonSet instead of the PVCs")
    kubectl.apply(cached("EmptyDir"))
    wait_for(lambda: kubectl.get("daemonsets", f"{c}-prefetch", NS) is None,
             what="the DaemonSet removed")
    kubectl("delete", POOLS, c, "-n", NS)
    # Multi-node decode: its LeaderWorkerSet made and sized; back to one node per replica,
    # the set goes once the role's Deployment (and the other role's) has a ready pod.
    d, lws_kind = "delta", "leaderworkersets.leaderworkerset.x-k8s.io"
    kubectl.apply(pool(d, decode={"gpus": 0, "nodesPerReplica": 2}))
    wait_for(lambda: kubectl.get(lws_kind, f"{d}-decode-lws", NS), what="the LeaderWorkerSet")
    kubectl.apply(pool(d))
    wait_for(lambda: kubectl.get("deployment", f"{d}-decode", NS), what="decode's Deployment")
    for role in ("prefill", "decode"):
        kubectl("patch", "deployment", f"{d}-{role}", "-n", NS, "--subresource=status",
                "--type=merge", "-p", '{"status": {"replicas": 1, "readyReplicas": 1}}')
    wait_for(lambda: kubectl.get(lws_kind, f"{d}-decode-lws", NS) is None,
             what="the LeaderWorkerSet removed")
    kubectl("delete", POOLS, d, "-n", NS)
    kubectl("delete", POOLS, a, "-n", NS)  # Kopf lets go of its finalizer
    wait_for(lambda: kubectl.get(POOLS, a, NS) is None, what="alpha deleted")


def test_operator_rbac_is_what_the_operator_calls(emu: tuple[KubeEmulator, Path]) -> None:
    emulator, kubeconfig = emu
    kubectl = Kubectl(kubeconfig)
    start = len(emulator.requests)
    with running_operator(kubeconfig, CONFIG, standalone=False, priority=100):
        operator_scenario(emulator, kubectl)
    calls = called(list(emulator.requests)[start:], ("poolpilot-operator", "kopf"))
    # The operator may grant the routers only what it holds itself (RBAC's escalation check).
    grants = {(g, r, v) for rule in builders.ROUTER_RULES for g in rule["apiGroups"]
              for r in rule["resources"] for v in rule["verbs"]}
    refused, unused = compare(calls | grants, chart_rules("-operator"), OPERATOR_ADMISSION)
    assert refused == set(), f"calls the chart's operator rules do not allow: {refused}"
    assert unused == set(), f"operator rules no call needs: {unused}"


def test_router_role_is_what_discovery_calls(emu: tuple[KubeEmulator, Path]) -> None:
    emulator, kubeconfig = emu
    start = len(emulator.requests)
    seen: list[tuple[str, list[str]]] = []
    loop = asyncio.new_event_loop()
    discovery = KubernetesDiscovery(NS, "gamma", lambda role, urls, _: seen.append((role, urls)),
                                    kubeconfig=str(kubeconfig), watch_timeout_s=5)
    task = loop.create_task(discovery.run())

    def serve() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # how the test stops it
            loop.run_until_complete(task)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        wait_for(lambda: discovery.synced.is_set(), what="the first list")
        emulator.apply({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                        "metadata": {"name": "gamma-decode-x", "namespace": NS,
                                     "labels": {"kubernetes.io/service-name": "gamma-decode"}},
                        "addressType": "IPv4", "ports": [{"name": "http", "port": 8000}],
                        "endpoints": [{"addresses": ["10.0.0.7"]}]})
        wait_for(lambda: ("decode", ["http://10.0.0.7:8000"]) in seen, what="the watch event")
    finally:
        loop.call_soon_threadsafe(task.cancel)
        thread.join(10)
        with contextlib.suppress(Exception):
            loop.close()
    calls = called(list(emulator.requests)[start:], ("poolpilot-router",))
    role = builders.build_router_role(builders.Pool("gamma", NS, builders_spec()))
    refused, unused = compare(calls, role["rules"])
    assert refused == set() and unused == set(), (refused, unused)


def builders_spec() -> Any:
    from poolpilot.validate import parse_spec

    return parse_spec({"model": {"name": "m"}})
