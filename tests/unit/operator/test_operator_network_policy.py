"""The pool's NetworkPolicies, evaluated with Kubernetes' NetworkPolicy semantics: only the
pool's router and its other engines reach the engines (Prometheus on the metrics port only),
and the router takes anyone on its serving port, Prometheus on its metrics port."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from poolpilot.operator import builders

from poolpilot import names
from poolpilot.validate import parse_spec

NS = "serving"
NS_LABELS = {NS: {"kubernetes.io/metadata.name": NS},
             "monitoring": {"kubernetes.io/metadata.name": "monitoring"},
             "team-b": {"kubernetes.io/metadata.name": "team-b"}}


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str]


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        value, op = labels.get(expr["key"]), expr["operator"]
        if op == "In" and value not in expr["values"]:
            return False
        if op == "NotIn" and value in expr["values"]:
            return False
        if op == "Exists" and value is None:
            return False
    return True


def allowed(policies: list[dict[str, Any]], src: Pod, dst: Pod, port: int) -> bool:
    """Ingress to `dst` on `port` from `src`, as a NetworkPolicy-enforcing CNI decides."""
    selecting = [p for p in policies if p["metadata"]["namespace"] == dst.namespace
                 and "Ingress" in p["spec"]["policyTypes"]
                 and _matches(p["spec"]["podSelector"], dst.labels)]
    if not selecting:
        return True  # not isolated
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            ports = rule.get("ports")
            if ports and not any(p["port"] == port for p in ports):
                continue
            peers = rule.get("from")
            if not peers:
                return True
            for peer in peers:
                ns_sel, pod_sel = peer.get("namespaceSelector"), peer.get("podSelector")
                if ns_sel is None and src.namespace != dst.namespace:
                    continue
                if ns_sel is not None and not _matches(ns_sel, NS_LABELS[src.namespace]):
                    continue
                if pod_sel is not None and not _matches(pod_sel, src.labels):
                    continue
                return True
    return False


POOL = builders.Pool("llama", NS, parse_spec({"model": {"name": "m"},
                                              "networkPolicy": {"enabled": True}}), uid="u")
CHILDREN = builders.build_children(POOL)
POLICIES = [o for o in CHILDREN if o["kind"] == "NetworkPolicy"]
# Each role's pods carry the labels of their Deployment's pod template (the pool's uid too).
POD_LABELS = {o["metadata"]["name"].removeprefix("llama-"): o["spec"]["template"]["metadata"]
              ["labels"] for o in CHILDREN if o["kind"] == "Deployment"}


def pod(pool: str, role: str, namespace: str = NS) -> Pod:
    """A pod the operator created for `pool` (another pool: a uid of its own)."""
    if pool == "llama" and namespace == NS:
        return Pod(namespace, POD_LABELS[role])
    return Pod(namespace, builders.pod_labels(builders.Pool(pool, namespace, POOL.spec,
                                                            uid=f"uid-of-{pool}"), role))


# Labelled by hand like the pool's pods, without the uid only the operator sets.
STRAY_ROUTER = Pod(NS, names.labels("llama", "router"))
STRAY_DECODE = Pod(NS, names.labels("llama", "decode"))
CLIENT = Pod(NS, {"app": "chat-frontend"})
ELSEWHERE = Pod("team-b", {"app": "notebook"})
PROMETHEUS = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})


@pytest.mark.parametrize("src,dst,port,ok", [
    (pod("llama", "router"), pod("llama", "decode"), 8000, True),
    (pod("llama", "router"), pod("llama", "prefill"), 8000, True),
    (pod("llama", "prefill"), pod("llama", "decode"), 5600, True),  # NIXL side channel
    (pod("llama", "decode"), pod("llama", "prefill"), 40000, True),  # UCX
    (PROMETHEUS, pod("llama", "decode"), 8090, True),  # /metrics
    (PROMETHEUS, pod("llama", "decode"), 8000, False),  # not the serving port
    (PROMETHEUS, pod("llama", "decode"), 5600, False),
    (PROMETHEUS, pod("llama", "router"), 8090, True),
    (ELSEWHERE, pod("llama", "router"), 8090, False),
    (CLIENT, pod("llama", "decode"), 8000, False),  # around the router
    (ELSEWHERE, pod("llama", "prefill"), 8000, False),
    (pod("other", "router"), pod("llama", "decode"), 8000, False),  # another pool's router
    (pod("llama", "router", "team-b"), pod("llama", "decode"), 8000, False),  # same name, not ns
    (CLIENT, pod("llama", "router"), 8000, True),
    (ELSEWHERE, pod("llama", "router"), 8000, True),
    (ELSEWHERE, pod("llama", "router"), 9000, False),
    (CLIENT, pod("other", "decode"), 8000, True),  # another pool without policies
    (STRAY_ROUTER, pod("llama", "decode"), 8000, False),  # no uid: not the pool's router
    (STRAY_ROUTER, pod("llama", "prefill"), 5600, False),
], ids=["router-decode", "router-prefill", "prefill-decode-nixl", "decode-prefill-ucx",
        "prometheus-metrics", "prometheus-serving-port", "prometheus-other-port",
        "prometheus-router-metrics", "other-ns-router-metrics", "client-to-engine",
        "other-ns-to-engine",
        "other-pool-router", "router-of-another-namespace", "client-to-router",
        "other-ns-to-router", "router-other-port", "unprotected-pool", "stray-router-to-decode",
        "stray-router-to-nixl"])
def test_who_reaches_what(src: Pod, dst: Pod, port: int, ok: bool) -> None:
    assert len(POLICIES) == 2
    assert allowed(POLICIES, src, dst, port) is ok


def test_metrics_namespaces_are_the_pools_choice() -> None:
    pool = builders.Pool("llama", NS, parse_spec({
        "model": {"name": "m"},
        "networkPolicy": {"enabled": True, "metricsNamespaces": ["team-b"]}}))
    policies = [o for o in builders.build_children(pool) if o["kind"] == "NetworkPolicy"]
    assert allowed(policies, ELSEWHERE, pod("llama", "decode"), 8090)
    assert not allowed(policies, ELSEWHERE, pod("llama", "decode"), 8000)
    assert not allowed(policies, PROMETHEUS, pod("llama", "decode"), 8090)


@pytest.mark.parametrize("spec_enabled,default,made", [
    (None, False, False), (None, True, True), (True, False, True), (False, True, False),
], ids=["unset-default-off", "unset-default-on", "on", "off-overrides-default"])
def test_the_pool_decides_else_the_operator_default(spec_enabled: bool | None, default: bool,
                                                    made: bool) -> None:
    spec: dict[str, Any] = {"model": {"name": "m"}}
    if spec_enabled is not None:
        spec["networkPolicy"] = {"enabled": spec_enabled}
    pool = builders.Pool("p", NS, parse_spec(spec))
    caps = builders.Capabilities(network_policies=default)
    kinds = [o["kind"] for o in builders.build_children(pool, caps)]
    assert ("NetworkPolicy" in kinds) is made
    if made:  # in place before the pods they protect
        assert kinds.index("NetworkPolicy") < kinds.index("Deployment")


def test_every_selector_picks_the_pools_own_pods_and_no_stray_one() -> None:
    """Services (the router's discovery reads their EndpointSlices), budgets and policies
    select each role's pods by their template's labels, and none a hand-labelled pod."""
    selectors = []
    for obj in CHILDREN:
        role = obj["metadata"]["labels"][names.ROLE_LABEL]
        if obj["kind"] == "Service":
            selectors.append((role, {"matchLabels": obj["spec"]["selector"]}))
        elif obj["kind"] in ("PodDisruptionBudget",):
            selectors.append((role, obj["spec"]["selector"]))
        elif obj["kind"] == "NetworkPolicy":
            selectors.append((role, obj["spec"]["podSelector"]))
    assert len(selectors) == 3 + 3 + 2
    for role, selector in selectors:
        targets = ["prefill", "decode"] if role == "engines" else [role]
        for target in targets:
            assert _matches(selector, POD_LABELS[target]), (role, target)
        assert not _matches(selector, STRAY_DECODE.labels)
        assert not _matches(selector, STRAY_ROUTER.labels)
    for dep in (o for o in CHILDREN if o["kind"] == "Deployment"):
        # The Deployment's own selector (immutable) still matches its template.
        assert _matches(dep["spec"]["selector"], dep["spec"]["template"]["metadata"]["labels"])


def test_the_router_takes_clients_only_from_where_the_pool_says() -> None:
    pool = builders.Pool("llama", NS, parse_spec({
        "model": {"name": "m"},
        "networkPolicy": {"routerFrom": [{"namespaceSelector": {"matchLabels": {
            "kubernetes.io/metadata.name": "team-b"}}}]}}), uid="u")
    policies = [o for o in builders.build_children(pool) if o["kind"] == "NetworkPolicy"]
    router = Pod(NS, builders.pod_labels(pool, "router"))
    assert allowed(policies, ELSEWHERE, router, 8000)
    assert not allowed(policies, CLIENT, router, 8000)
    assert not allowed(policies, ELSEWHERE, router, 9000)


def test_policies_are_on_unless_the_operator_turns_the_default_off() -> None:
    pool = builders.Pool("p", NS, parse_spec({"model": {"name": "m"}}))
    assert any(o["kind"] == "NetworkPolicy" for o in builders.build_children(pool))
