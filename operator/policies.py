"""Disruption budgets, Prometheus monitors and NetworkPolicies for a pool's pods.

Part of the pure builders (poolpilot.operator.builders): no I/O and no clock.
"""

from __future__ import annotations

from poolpilot.operator.building_blocks import (
    Capabilities,
    Pool,
    _meta,
    pod_selector,
)

from poolpilot import names
from poolpilot.apitypes import Obj
from poolpilot.roles import Role

# ---------------------------------------------------------------------------------------------
# Disruption budgets and monitoring


def build_pdb(pool: Pool, role: str) -> Obj:
    """At most one pod of a role is evicted at a time (node drains, upgrades)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(pool, names.child_name(pool.name, role), role),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": pod_selector(pool, role)}},
    }


def _relabelings() -> list[Obj]:
    # Expose the pool labels as `pool` and `role` so every query can sum by them.
    return [
        {
            "sourceLabels": ["__meta_kubernetes_pod_label_poolpilot_dev_pool"],
            "targetLabel": "pool",
            "action": "replace",
        },
        {
            "sourceLabels": ["__meta_kubernetes_pod_label_poolpilot_dev_role"],
            "targetLabel": "role",
            "action": "replace",
        },
    ]


def _monitor_meta(pool: Pool, name: str, role: str, caps: Capabilities) -> Obj:
    meta = _meta(pool, name, role)
    meta["labels"] = {**dict(caps.monitor_labels), **meta["labels"]}  # ours cannot be replaced
    return meta


def build_service_monitor(pool: Pool, caps: Capabilities | None = None) -> Obj:
    """ServiceMonitor for the router's /metrics on its metrics port (Prometheus Operator)."""
    caps = caps or Capabilities()
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _monitor_meta(pool, names.child_name(pool.name, Role.ROUTER), Role.ROUTER,
                                  caps),
        "spec": {
            "selector": {"matchLabels": names.selector(pool.name, Role.ROUTER)},
            "endpoints": [
                {
                    "port": "metrics",
                    "path": "/metrics",
                    "interval": "15s",
                    "relabelings": _relabelings(),
                }
            ],
        },
    }


def build_pod_monitor(pool: Pool, caps: Capabilities | None = None) -> Obj:
    """PodMonitor for every engine pod's vLLM /metrics on its metrics port (headless Services
    have no monitor)."""
    caps = caps or Capabilities()
    roles = pool.spec.engine_roles()
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _monitor_meta(pool, names.child_name(pool.name, "engines"), "engines", caps),
        "spec": {
            "selector": {
                "matchLabels": _in_pool(pool)["matchLabels"],
                "matchExpressions": [
                    {"key": names.ROLE_LABEL, "operator": "In", "values": [str(r) for r in roles]}
                ],
            },
            "podMetricsEndpoints": [
                {
                    "port": "metrics",
                    "path": "/metrics",
                    "interval": "15s",
                    "relabelings": _relabelings(),
                }
            ],
        },
    }


# ---------------------------------------------------------------------------------------------
# NetworkPolicies


def network_policies_on(pool: Pool, caps: Capabilities) -> bool:
    wanted = pool.spec.network_policy.enabled
    return caps.networking and (caps.network_policies if wanted is None else wanted)


def _in_pool(pool: Pool) -> Obj:
    """Every pod the operator created for the pool (the uid label only it sets, in a cluster)."""
    labels = {names.MANAGED_BY: names.MANAGER, names.POOL_LABEL: pool.name}
    if pool.uid:
        labels[names.POOL_UID_LABEL] = pool.uid
    return {"matchLabels": labels}


def _scrapers(pool: Pool) -> list[Obj]:
    """Prometheus (the metricsNamespaces) on the metrics port alone: never the serving port."""
    scrapers = pool.spec.network_policy.metrics_namespaces
    if not scrapers:
        return []
    return [{
        "from": [{"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In",
             "values": list(scrapers)}]}}],
        "ports": [{"port": names.METRICS_PORT, "protocol": "TCP"}],
    }]


def build_engine_network_policy(pool: Pool) -> Obj:
    """Engines take traffic from their pool only: its router (requests) and its other engines
    (the KV-cache handoff: NIXL's side channel and UCX, on ports of their own); and Prometheus
    (the metricsNamespaces) on the metrics port."""
    ingress: list[Obj] = [{"from": [{"podSelector": _in_pool(pool)}]}, *_scrapers(pool)]
    roles = pool.spec.engine_roles()
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(pool, names.child_name(pool.name, "engines"), "engines"),
        "spec": {
            "podSelector": {**_in_pool(pool), "matchExpressions": [
                {"key": names.ROLE_LABEL, "operator": "In", "values": [str(r) for r in roles]}]},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def build_router_network_policy(pool: Pool) -> Obj:
    """The router takes clients on its port only: from spec.networkPolicy.routerFrom, or from
    anywhere when that is empty; and Prometheus (the metricsNamespaces) on its metrics port."""
    rule: Obj = {"ports": [{"port": names.ROUTER_PORT, "protocol": "TCP"}]}
    peers = pool.spec.network_policy.router_from
    if peers:
        rule = {"from": list(peers), **rule}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(pool, names.child_name(pool.name, Role.ROUTER), Role.ROUTER),
        "spec": {
            "podSelector": {"matchLabels": pod_selector(pool, Role.ROUTER)},
            "policyTypes": ["Ingress"],
            "ingress": [rule, *_scrapers(pool)],
        },
    }


