"""Deterministic names and labels of everything poolpilot makes for a pool."""

from __future__ import annotations

from poolpilot.roles import ENGINE_ROLES as ENGINE_ROLES  # re-exported (defined in roles.py)
from poolpilot.roles import Role

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "poolpilot"
POOL_LABEL = "poolpilot.dev/pool"
ROLE_LABEL = "poolpilot.dev/role"
# On the pods the operator creates, the pool's uid: Services, budgets, NetworkPolicies, the
# PodMonitor and the router's discovery select by it, and a pod template may not set it, so
# a pod someone labels {pool, role} by hand receives no traffic and feeds no autoscaler.
POOL_UID_LABEL = "poolpilot.dev/pool-uid"
FIELD_MANAGER = "poolpilot-operator"
# Set by the autoscaler on the engine pods a scale-down is about to remove: the ReplicaSet
# controller deletes the lowest deletion cost first, and the router sends no new request to a
# pod marked draining.
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
DRAINING = "poolpilot.dev/draining"
# On an engine pod, written once it is ready (by the autoscaler): its cold start's phases as
# JSON, seconds (scheduled, container, engine: {phase: s}, total, compileCache).
COLD_START_ANNOTATION = "poolpilot.dev/cold-start"
ROUTER_PORT = 8000
ENGINE_PORT = 8000
# Engines' and routers' /metrics for Prometheus, on a port of its own, so NetworkPolicies can
# let the monitoring namespace reach metrics and nothing else (the serving ports take prompts).
METRICS_PORT = 8090
# spec.router.prefixRouting Precise: each engine publishes its KV events (vLLM's ZMQ publisher)
# on these ports of its pod IP, and the router subscribes there.
KV_EVENTS_PORT = 5557
KV_REPLAY_PORT = 5558
# The engine container's own ports, which NIXL's side channel must not take.
ENGINE_OWN_PORTS = (ENGINE_PORT, METRICS_PORT, KV_EVENTS_PORT, KV_REPLAY_PORT)

ROLES = tuple(Role)


def child_name(pool: str, role: str) -> str:
    """Name of a role's Deployment and Service, e.g. llama-8b-prefill."""
    return f"{pool}-{role}"


def labels(pool: str, role: str) -> dict[str, str]:
    """Labels on every object and pod the operator makes; Prometheus relabels them to
    namespace, pool and role."""
    role = str(role)  # a Role's plain value: objects hold plain data (YAML's safe dumper)
    return {
        MANAGED_BY: MANAGER,
        POOL_LABEL: pool,
        ROLE_LABEL: role,
        "app.kubernetes.io/name": "poolpilot",
        "app.kubernetes.io/instance": pool,
        "app.kubernetes.io/component": role,
    }


def selector(pool: str, role: str) -> dict[str, str]:
    """The stable subset of labels used in selectors (selectors are immutable)."""
    return {POOL_LABEL: pool, ROLE_LABEL: str(role)}


def router_endpoint(pool: str, namespace: str) -> str:
    return f"http://{child_name(pool, Role.ROUTER)}.{namespace}.svc:{ROUTER_PORT}/v1"
