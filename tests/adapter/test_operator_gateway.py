"""spec.gateway against a cluster (the Kubernetes API emulator, or a real one with
KUBECONFIG_E2E): the operator runs first without the Gateway API CRDs (the pool still serves and
says what to install), then the upstream HTTPRoute and GIE InferencePool CRDs are applied
(tests/fixtures/upstream/gateway/, so the server validates what the operator writes against
upstream's schemas), and a gateway's verdict is written into the route's status by hand, as
a Gateway controller would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from poolpilot.operator.handlers import OperatorConfig
from poolpilot.testkit.cluster import cluster_from_env
from poolpilot.testkit.operator import Kubectl, install, running_operator
from poolpilot.testkit.polling import wait_for

from poolpilot import names

pytestmark = [pytest.mark.adapter, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "tests" / "fixtures" / "upstream" / "gateway"
NS = "gw-serving"
POOLS = "inferencepools.poolpilot.dev"  # not `inferencepool`: GIE's kind has the same name
GIE_POOLS = "inferencepools.inference.networking.k8s.io"
CONFIG = OperatorConfig(drift_interval=1.0, cutover_poll=0.3, request_timeout=10.0,
                        permanent_backoff=(0.5, 8.0))
GATEWAY = {"parentRefs": [{"name": "inference-gateway", "namespace": "gateway-system"}],
           "hostnames": ["llama.example.com"]}
PICKER = {"name": "llama-epp", "port": {"number": 9002}}


class Cluster:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubectl = Kubectl(kubeconfig)
        self.kubeconfig = kubeconfig

    def pool(self, name: str, **spec: Any) -> dict[str, Any]:
        body = {"model": {"name": "org/model"}, "prefill": {"gpus": 0}, "decode": {"gpus": 0},
                "engine": {"gpus": 0}, **spec}
        return {"apiVersion": "poolpilot.dev/v1alpha1", "kind": "InferencePool",
                "metadata": {"name": name, "namespace": NS}, "spec": body}

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        return self.kubectl.get(kind, name, NS)

    def condition(self, pool: str, ctype: str) -> dict[str, Any]:
        obj = self.get(POOLS, pool) or {}
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond["type"] == ctype:
                return dict(cond)
        return {}

    def wait_routed(self, pool: str, status: str, reason: str) -> dict[str, Any]:
        def seen() -> bool:
            c = self.condition(pool, "Routed")
            return (c.get("status"), c.get("reason")) == (status, reason)
        wait_for(seen, timeout=60, what=f"{pool}: Routed={status} ({reason})")
        return self.condition(pool, "Routed")

    def events(self, pool: str, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.kubectl.list("events", NS) if e.get("reason") == reason
                and e.get("involvedObject", {}).get("name") == pool]

    def write_route_status(self, route: str, parents: list[dict[str, Any]]) -> None:
        self.kubectl("patch", "httproutes.gateway.networking.k8s.io", route, "-n", NS,
                     "--subresource=status", "--type=merge",
                     "-p", json.dumps({"status": {"parents": parents}}))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster_from_env(tmp_path_factory.mktemp("kube")) as (kubeconfig, emu):
        if emu is None:
            pytest.skip("starts without the Gateway API CRDs and installs them: needs a "
                        "cluster of its own (the emulator)")
        c = Cluster(kubeconfig)
        install(c.kubectl)
        c.kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        with running_operator(kubeconfig, CONFIG, standalone=True):
            yield c


def _verdict(ref: dict[str, Any], generation: int, accepted: tuple[str, str, str],
             resolved: tuple[str, str, str]) -> dict[str, Any]:
    def cond(ctype: str, value: tuple[str, str, str]) -> dict[str, Any]:
        return {"type": ctype, "status": value[0], "reason": value[1], "message": value[2],
                "observedGeneration": generation,
                "lastTransitionTime": "2026-01-01T00:00:00Z"}
    return {"parentRef": ref, "controllerName": "example.com/gateway-controller",
            "conditions": [cond("Accepted", accepted), cond("ResolvedRefs", resolved)]}


def test_gateway_pools_without_and_then_with_the_gateway_api(cluster: Cluster) -> None:
    k = cluster.kubectl
    # 1. No Gateway API CRDs: the pool's children are made, the route is not, and the
    # condition and a Warning Event say what to install.
    k.apply(cluster.pool("routed", gateway=GATEWAY))
    missing = cluster.wait_routed("routed", "False", "GatewayApiMissing")
    assert "standard-install.yaml" in missing["message"]
    assert cluster.get("deployment", "routed-router") is not None
    wait_for(lambda: any(e["type"] == "Warning" for e in cluster.events(
        "routed", "GatewayApiMissing")), what="a GatewayApiMissing Warning event")

    # 2. The upstream CRDs arrive: the operator notices without a restart and makes the route,
    # which the server validated against upstream's schema.
    k.apply(*[yaml.safe_load(p.read_text()) for p in sorted(UPSTREAM.glob("*.yaml"))],
            server_side=True)
    wait_for(lambda: "httproutes" in k("api-resources", "--api-group=gateway.networking.k8s.io")
             and "inferencepools" in k("api-resources",
                                       "--api-group=inference.networking.k8s.io"),
             what="the Gateway API and GIE CRDs to be served")
    pending = cluster.wait_routed("routed", "False", "Pending")
    assert "gateway-system/inference-gateway" in pending["message"]
    route = cluster.get("httproutes.gateway.networking.k8s.io", "routed")
    assert route is not None
    pool = cluster.get(POOLS, "routed")
    assert pool is not None
    [owner] = route["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("InferencePool", pool["metadata"]["uid"])
    assert owner["apiVersion"] == "poolpilot.dev/v1alpha1"
    [rule] = route["spec"]["rules"]
    assert rule["backendRefs"][0]["name"] == "routed-router"
    assert rule["backendRefs"][0]["port"] == names.ROUTER_PORT
    assert route["spec"]["hostnames"] == ["llama.example.com"]

    # 3. A gateway refuses the route, then accepts it: the condition follows, with Events.
    ref = {"group": "gateway.networking.k8s.io", "kind": "Gateway",
           "namespace": "gateway-system", "name": "inference-gateway"}
    generation = route["metadata"]["generation"]
    cluster.write_route_status("routed", [_verdict(
        ref, generation, ("False", "NotAllowedByListeners",
                          "no listener allows routes from namespace gw-serving"),
        ("True", "ResolvedRefs", "resolved"))])
    refused = cluster.wait_routed("routed", "False", "NotAllowedByListeners")
    assert "no listener allows routes from namespace gw-serving" in refused["message"]
    wait_for(lambda: cluster.events("routed", "NotAllowedByListeners"),
             what="a NotAllowedByListeners event")
    cluster.write_route_status("routed", [_verdict(
        ref, generation, ("True", "Accepted", "accepted"), ("True", "ResolvedRefs", "ok"))])
    cluster.wait_routed("routed", "True", "Accepted")
    ready = cluster.condition("routed", "Ready")
    assert ready, "the pool's own conditions are still written"

    # 4. inferencePool: a GIE InferencePool of the engine pods, and the route goes to it.
    k.apply(cluster.pool("picked", mode="Aggregated",
                         gateway={**GATEWAY, "inferencePool": True, "endpointPickerRef": PICKER}))
    wait_for(lambda: cluster.get(GIE_POOLS, "picked-engines") is not None,
             what="the GIE InferencePool")
    gie = cluster.get(GIE_POOLS, "picked-engines")
    picked = cluster.get(POOLS, "picked")
    assert gie is not None and picked is not None
    uid = picked["metadata"]["uid"]
    assert gie["metadata"]["ownerReferences"][0]["uid"] == uid
    selector = gie["spec"]["selector"]["matchLabels"]
    assert selector[names.POOL_UID_LABEL] == uid
    assert gie["spec"]["targetPorts"] == [{"number": names.ENGINE_PORT}]
    assert gie["spec"]["endpointPickerRef"]["name"] == "llama-epp"
    wait_for(lambda: cluster.get("httproutes.gateway.networking.k8s.io", "picked") is not None,
             what="the HTTPRoute to the GIE pool")
    route = cluster.get("httproutes.gateway.networking.k8s.io", "picked")
    assert route is not None
    assert route["spec"]["rules"][0]["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool",
         "name": "picked-engines", "weight": 1}]
    # What the selector matches: the engine Deployment's pods, not the router's.
    deployments = {d["metadata"]["name"]: d for d in k.list(
        "deployments", NS, f"{names.POOL_LABEL}=picked")}
    templates = {name: d["spec"]["template"]["metadata"]["labels"]
                 for name, d in deployments.items()}
    assert selector.items() <= templates["picked-engine"].items()
    assert not selector.items() <= templates["picked-router"].items()
    # The namespace's pods as the gateway would see them through the selector.
    stray = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "stray", "namespace": NS, "labels": {
                 names.POOL_LABEL: "picked", names.ROLE_LABEL: "engine",
                 "poolpilot.dev/gie-endpoint": "true"}},
             "spec": {"containers": [{"name": "x", "image": "x"}]}}
    k.apply(stray)
    chosen = k.list("pods", NS, ",".join(f"{key}={value}" for key, value in selector.items()))
    assert "stray" not in {p["metadata"]["name"] for p in chosen}

    # 5. spec.gateway removed: the route and the GIE pool go, and so does the condition.
    k("patch", POOLS, "picked", "-n", NS, "--type=json",
      "-p", json.dumps([{"op": "remove", "path": "/spec/gateway"}]))
    wait_for(lambda: cluster.get(GIE_POOLS, "picked-engines") is None
             and cluster.get("httproutes.gateway.networking.k8s.io", "picked") is None,
             what="the gateway objects deleted")
    wait_for(lambda: not cluster.condition("picked", "Routed"), what="Routed removed")


def test_operator_warns_at_start_up_of_the_kind_clash(cluster: Cluster,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """With GIE's CRD served, a starting operator says how to name each InferencePool."""
    cluster.kubectl.apply(*[yaml.safe_load(p.read_text()) for p in sorted(UPSTREAM.glob("*.yaml"))],
                          server_side=True)
    caplog.set_level("WARNING", logger="poolpilot.operator")
    with running_operator(cluster.kubeconfig, CONFIG, standalone=True):
        wait_for(lambda: any("inferencepools.poolpilot.dev" in r.getMessage()
                             for r in caplog.records), what="the kind-clash warning")
