"""What `helm install` with the chart's defaults leaves reachable, without a cluster.

The chart's operator Deployment is rendered (`helm template`), its arguments parsed by the
operator's own parser into the capabilities it runs with, and the repository's example pool
rendered by the operator's builders under them. A pure evaluator of NetworkPolicy semantics
(policy types, pod and namespace selectors and their combination, named and numbered ports,
port ranges, protocols) then decides, for pods carrying each Deployment's pod-template
labels and container ports, who reaches what: a pod in another namespace reaches no engine
port, Prometheus reaches the metrics port of engines and routers and no serving port, and
the monitors scrape exactly the port the policies open. The router requires a key from the
Secret the operator creates for it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from poolpilot.operator import builders, router_auth
from poolpilot.operator import main as operator_main

from poolpilot import names
from poolpilot.apitypes import Obj
from poolpilot.validate import parse_pool

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "poolpilot"
EXAMPLE = ROOT / "examples" / "llama-8b-disaggregated.yaml"
UID = "0b7c5e2a-0000-4000-8000-00000000a11e"

NAMESPACES = {"serving": {}, "monitoring": {}, "team-b": {"team": "b"},
              "ingress": {"role": "edge"}}


# --- NetworkPolicy semantics (networking.k8s.io/v1) -------------------------------------------


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str]
    ports: dict[str, int]  # container port name -> number (named ports in policies)

    def ns_labels(self) -> dict[str, str]:
        # The API server sets kubernetes.io/metadata.name on every namespace.
        return {**NAMESPACES[self.namespace], "kubernetes.io/metadata.name": self.namespace}


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """A LabelSelector; {} selects everything."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown selector operator {op}")
    return True


def _port_matches(rule_port: Obj, dst: Pod, port: int, protocol: str) -> bool:
    if rule_port.get("protocol", "TCP") != protocol:
        return False
    wanted = rule_port.get("port")
    if wanted is None:
        return True  # every port of the protocol
    if isinstance(wanted, str):  # a named port: the destination pod's container port
        return dst.ports.get(wanted) == port
    end = rule_port.get("endPort", wanted)
    return int(wanted) <= port <= int(end)


def _peer_matches(peer: Obj, policy_ns: str, src: Pod) -> bool:
    if "ipBlock" in peer:
        return False  # CIDRs are for traffic from outside the cluster's pods
    ns_sel, pod_sel = peer.get("namespaceSelector"), peer.get("podSelector")
    if ns_sel is None and src.namespace != policy_ns:
        return False  # a podSelector alone: the policy's own namespace
    if ns_sel is not None and not selects(ns_sel, src.ns_labels()):
        return False
    return pod_sel is None or selects(pod_sel, src.labels)


def allowed(policies: list[Obj], src: Pod, dst: Pod, port: int, protocol: str = "TCP") -> bool:
    """Whether a connection from `src` to `dst`:`port` is admitted, as an enforcing network
    plugin decides (ingress only: the chart's and operator's policies restrict ingress)."""
    isolating = [p for p in policies if p["metadata"]["namespace"] == dst.namespace
                 and "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])
                 and selects(p["spec"]["podSelector"], dst.labels)]
    if not isolating:
        return True
    for policy in isolating:
        for rule in policy["spec"].get("ingress") or []:
            ports = rule.get("ports")
            if ports and not any(_port_matches(p, dst, port, protocol) for p in ports):
                continue
            peers = rule.get("from")
            if not peers or any(_peer_matches(p, dst.namespace, src) for p in peers):
                return True
    return False


# --- the evaluator's own cases (so the verdicts below rest on it) --------------------------


def _policy(spec: Obj) -> Obj:
    return {"kind": "NetworkPolicy", "metadata": {"namespace": "serving"},
            "spec": {"policyTypes": ["Ingress"], **spec}}


WEB = Pod("serving", {"app": "web"}, {"http": 8080, "metrics": 9000})
SAME_NS = Pod("serving", {"app": "client"}, {})
TEAM_B = Pod("team-b", {"app": "client"}, {})


@pytest.mark.parametrize("policy,src,port,ok", [
    ({"podSelector": {"matchLabels": {"app": "other"}}, "ingress": []}, TEAM_B, 8080, True),
    ({"podSelector": {}, "ingress": []}, SAME_NS, 8080, False),
    ({"podSelector": {}, "ingress": [{}]}, TEAM_B, 8080, True),
    ({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}, TEAM_B, 8080, False),
    ({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}, SAME_NS, 8080, True),
    ({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {
        "matchLabels": {"team": "b"}}}]}]}, TEAM_B, 8080, True),
    ({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {
        "matchLabels": {"team": "b"}}, "podSelector": {"matchLabels": {"app": "x"}}}]}]},
     TEAM_B, 8080, False),
    ({"podSelector": {}, "ingress": [{"ports": [{"port": "metrics"}]}]}, TEAM_B, 9000, True),
    ({"podSelector": {}, "ingress": [{"ports": [{"port": "metrics"}]}]}, TEAM_B, 8080, False),
    ({"podSelector": {}, "ingress": [{"ports": [{"port": 8000, "endPort": 8100}]}]},
     TEAM_B, 8080, True),
    ({"podSelector": {}, "ingress": [{"ports": [{"port": 8080, "protocol": "UDP"}]}]},
     TEAM_B, 8080, False),
    ({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]},
     TEAM_B, 8080, False),
], ids=["not-selected", "isolated-no-rules", "empty-rule-anyone", "pod-selector-own-ns",
        "pod-selector-same-ns", "namespace-selector", "namespace-and-pod-selector",
        "named-port", "named-port-other", "port-range", "protocol", "ip-block-not-pods"])
def test_the_evaluator_follows_networkpolicy_semantics(policy: Obj, src: Pod, port: int,
                                                       ok: bool) -> None:
    assert allowed([_policy(policy)], src, WEB, port) is ok


# --- the chart's defaults ---------------------------------------------------------------------


def _helm() -> str:
    found = shutil.which("helm") or shutil.which("helm", path=str(ROOT / ".cache" / "bin"))
    if found is None:
        pytest.skip("helm is not installed; run ./dev setup")
    return found


@dataclass(frozen=True)
class Install:
    caps: builders.Capabilities
    children: list[Obj]
    pods: dict[str, Pod]  # role -> a pod of that role's Deployment

    def of_kind(self, kind: str) -> list[Obj]:
        return [o for o in self.children if o["kind"] == kind]


def _operator_caps(monitoring: bool) -> builders.Capabilities:
    """The capabilities the chart's operator runs with: its container's args, parsed by the
    operator's parser (as on a cluster whose API serves NetworkPolicies and RBAC)."""
    out = subprocess.run([_helm(), "template", "pp", str(CHART), "--namespace", "poolpilot"],
                         capture_output=True, text=True, timeout=120, check=True)
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    [dep] = [d for d in docs if d["kind"] == "Deployment"
             and d["metadata"]["name"].endswith("-operator")]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "operator"
    parser = argparse.ArgumentParser()
    operator_main.add_arguments(parser)
    parsed = parser.parse_args(args[1:])
    return builders.Capabilities(monitoring=monitoring, network_policies=parsed.network_policies,
                                 router_auth=parsed.router_auth)


def _pods(children: list[Obj], namespace: str) -> dict[str, Pod]:
    pods = {}
    for dep in (o for o in children if o["kind"] == "Deployment"):
        template = dep["spec"]["template"]
        ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"]
                 for p in c.get("ports") or []}
        pods[dep["metadata"]["labels"][names.ROLE_LABEL]] = Pod(
            namespace, dict(template["metadata"]["labels"]), ports)
    return pods


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "prometheus-operator"])
def install(request: pytest.FixtureRequest) -> Install:
    caps = _operator_caps(monitoring=request.param)
    pool = builders.Pool("llama-8b", "serving", parse_pool(yaml.safe_load(
        EXAMPLE.read_text())).spec, uid=UID)
    children = builders.build_children(pool, caps)
    return Install(caps, children, _pods(children, "serving"))


PROMETHEUS = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"}, {})
NOTEBOOK = Pod("team-b", {"app": "notebook"}, {})
NEIGHBOUR = Pod("serving", {"app": "chat-frontend"}, {})


def _engine_ports(install: Install, role: str) -> list[int]:
    # Every declared port, and the ephemeral range UCX uses for the KV transfer itself.
    return [*install.pods[role].ports.values(), 40000, 60999]


def test_defaults_make_policies_and_router_auth(install: Install) -> None:
    assert install.caps.network_policies and install.caps.router_auth
    assert {o["metadata"]["name"] for o in install.of_kind("NetworkPolicy")} == {
        "llama-8b-engines", "llama-8b-router"}


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_pod_in_another_namespace_reaches_no_engine_port(install: Install, role: str) -> None:
    policies = install.of_kind("NetworkPolicy")
    engine = install.pods[role]
    for port in _engine_ports(install, role):
        assert not allowed(policies, NOTEBOOK, engine, port), port
        assert not allowed(policies, NEIGHBOUR, engine, port), port  # around the router
    # ... and the pool's own router and engines do.
    assert allowed(policies, install.pods["router"], engine, names.ENGINE_PORT)
    other = install.pods["decode" if role == "prefill" else "prefill"]
    for port in _engine_ports(install, role):
        assert allowed(policies, other, engine, port)  # NIXL side channel and UCX


@pytest.mark.parametrize("role", ["prefill", "decode", "router"])
def test_prometheus_reaches_the_metrics_port_and_no_serving_port(install: Install,
                                                                 role: str) -> None:
    policies = install.of_kind("NetworkPolicy")
    pod = install.pods[role]
    assert pod.ports["metrics"] == names.METRICS_PORT != pod.ports["http"]
    assert allowed(policies, PROMETHEUS, pod, names.METRICS_PORT)
    for name, port in pod.ports.items():
        # The router's serving port takes every client (behind its API key), Prometheus too.
        if name != "metrics" and role != "router":
            assert not allowed(policies, PROMETHEUS, pod, port), name
    assert not allowed(policies, NOTEBOOK, pod, names.METRICS_PORT)


def test_clients_reach_the_router_on_its_serving_port_only(install: Install) -> None:
    policies = install.of_kind("NetworkPolicy")
    router = install.pods["router"]
    for client in (NOTEBOOK, NEIGHBOUR):
        assert allowed(policies, client, router, names.ROUTER_PORT)
        assert not allowed(policies, client, router, names.METRICS_PORT)


def test_the_monitors_scrape_the_port_the_policies_open(install: Install) -> None:
    if not install.caps.monitoring:
        # Without the Prometheus Operator: the scrape annotations say the port.
        for role in ("prefill", "decode", "router"):
            dep = next(d for d in install.of_kind("Deployment")
                       if d["metadata"]["labels"][names.ROLE_LABEL] == role)
            port = int(dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"])
            assert allowed(install.of_kind("NetworkPolicy"), PROMETHEUS, install.pods[role], port)
        return
    policies = install.of_kind("NetworkPolicy")
    [pod_monitor] = install.of_kind("PodMonitor")
    for endpoint in pod_monitor["spec"]["podMetricsEndpoints"]:
        for role in ("prefill", "decode"):
            assert selects(pod_monitor["spec"]["selector"], install.pods[role].labels)
            port = install.pods[role].ports[endpoint["port"]]
            assert allowed(policies, PROMETHEUS, install.pods[role], port)
    [service_monitor] = install.of_kind("ServiceMonitor")
    [service] = [s for s in install.of_kind("Service")
                 if selects(service_monitor["spec"]["selector"], s["metadata"]["labels"])]
    router = install.pods["router"]
    assert selects({"matchLabels": service["spec"]["selector"]}, router.labels)
    for endpoint in service_monitor["spec"]["endpoints"]:
        [sp] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
        target = sp["targetPort"]
        port = router.ports[target] if isinstance(target, str) else int(target)
        assert allowed(policies, PROMETHEUS, router, port)


def test_the_router_requires_the_key_from_the_operators_secret(install: Install) -> None:
    [dep] = [d for d in install.of_kind("Deployment")
             if d["metadata"]["labels"][names.ROLE_LABEL] == "router"]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert "--api-key-file" in container["command"]
    [vol] = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "api-keys"]
    pool = builders.Pool("llama-8b", "serving", parse_pool(yaml.safe_load(
        EXAMPLE.read_text())).spec, uid=UID)
    assert vol["secret"]["secretName"] == router_auth.default_secret_name(pool) \
        == "llama-8b-router-api-keys"
