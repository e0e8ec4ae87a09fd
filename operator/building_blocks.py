"""What every child-object builder shares: the pool, the cluster's capabilities, the
container paths and ports, labels, probes, security contexts and hashes.

Part of the pure builders (poolpilot.operator.builders): no I/O and no clock.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from poolpilot import api, names
from poolpilot.apitypes import Obj, quantity_value
from poolpilot.roles import Role

ENGINE_CONTAINER = "engine"
ROUTER_CONTAINER = "router"
MODEL_CACHE_DIR = "/model-cache"
# The engine's root filesystem is read-only: what vLLM, Triton and torch.compile write goes to
# emptyDirs. HOME=/tmp catches the rest (~/.config/vllm, ~/.cache/outlines, ...).
COMPILE_CACHE_DIR = "/var/cache/vllm"
MODEL_PVC_DIR = "/models"
ROUTER_CONFIG_DIR = "/etc/poolpilot/router"
ROUTER_CONFIG_KEY = "router.json"
ROUTER_KEYS_DIR = "/etc/poolpilot/router-keys"  # spec.router.apiKeySecret, mounted
ROUTER_KEYS_FILE = "api-keys"
CONFIG_HASH_ANNOTATION = "poolpilot.dev/config-hash"
# On engine pods of a pool with spec.gateway.inferencePool: what its GIE InferencePool selects
# (routers never carry it; pod templates may not set poolpilot.dev/ labels).
GATEWAY_POOL_LABEL = "poolpilot.dev/gie-endpoint"
# Grace periods are per role (spec.<role>.terminationGracePeriodSeconds, default 120 s for
# engines, 60 s for routers): the launcher gives vLLM what is left after the preStop as its
# --shutdown-timeout, so in-flight generations finish after the endpoint is removed.
PRESTOP_SLEEP_SECONDS = 10  # endpoint removal reaches the routers before SIGTERM
ROUTER_PRESTOP_SECONDS = 5
STARTUP_PROBE_PERIOD = 10  # its failureThreshold is the cache's budget (model_cache.py)
# One uid for every poolpilot container: the images' USER and the chart's podSecurityContext.
RUN_AS_USER = 65532
# spec.router.prefixRouting Precise: the ports the engines publish their KV events on.
KV_EVENTS_PORT = names.KV_EVENTS_PORT
KV_REPLAY_PORT = names.KV_REPLAY_PORT
MULTUS_NETWORKS = "k8s.v1.cni.cncf.io/networks"
# Routers get these unless spec.router.resources says otherwise (a default request above the
# user's limit is lowered to it, a default limit below the user's request raised to it).
ROUTER_DEFAULT_RESOURCES = api.ResourceRequirements(
    requests={"cpu": "500m", "memory": "512Mi"}, limits={"memory": "2Gi"})



@dataclass(frozen=True)
class Pool:
    """A parsed pool and where it lives; `uid` is None outside a cluster (render)."""

    name: str
    namespace: str
    spec: api.InferencePoolSpec
    uid: str | None = None


@dataclass(frozen=True)
class Capabilities:
    """What the cluster serves (from discovery): objects of absent APIs are not built."""

    monitoring: bool = False  # monitoring.coreos.com/v1 ServiceMonitor and PodMonitor
    rbac: bool = True  # rbac.authorization.k8s.io/v1 (the router's Role for discovery)
    # Extra labels on every ServiceMonitor and PodMonitor, for the Prometheus' selector
    # (kube-prometheus-stack selects `release: <its release>`); the operator's --monitor-label.
    monitor_labels: tuple[tuple[str, str], ...] = ()
    networking: bool = True  # networking.k8s.io/v1 NetworkPolicy is served
    # NetworkPolicies for pools whose spec.networkPolicy.enabled is unset: on unless the
    # operator runs with --no-network-policies.
    network_policies: bool = True
    gateway_api: bool = True  # gateway.networking.k8s.io/v1 HTTPRoute (spec.gateway)
    inference_pools: bool = True  # inference.networking.k8s.io/v1 InferencePool (GIE)
    # leaderworkerset.x-k8s.io/v1 is served: multi-node roles (nodesPerReplica > 1) run on it
    # (they are rendered either way; without it their apply fails with a message saying so).
    leader_worker_set: bool = False
    # Routers of pools without spec.router.apiKeySecret read a key from a Secret the operator
    # creates for the pool (operator/router_auth.py; --router-auth, on in the chart).
    router_auth: bool = False


# ---------------------------------------------------------------------------------------------
# Shared pieces


def _meta(pool: Pool, name: str, role: str) -> Obj:
    meta: Obj = {"name": name, "namespace": pool.namespace, "labels": names.labels(pool.name, role)}
    if pool.uid:
        meta["ownerReferences"] = [
            {
                "apiVersion": api.API_VERSION,
                "kind": api.KIND,
                "name": pool.name,
                "uid": pool.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return meta


def pod_labels(pool: Pool, role: str) -> dict[str, str]:
    """Labels of the pods the operator creates: the object labels and, in a cluster, the
    pool's uid, which nothing but the operator sets (a pod template may not)."""
    labels = names.labels(pool.name, role)
    if pool.uid:
        labels[names.POOL_UID_LABEL] = pool.uid
    gateway = pool.spec.gateway
    if role in names.ENGINE_ROLES and gateway is not None and gateway.inference_pool:
        labels[GATEWAY_POOL_LABEL] = "true"
    return labels


def pod_selector(pool: Pool, role: str) -> dict[str, str]:
    """What Services, budgets and policies select a role's pods by: the Deployment's selector
    and the pool's uid, so a stray pod labelled {pool, role} never receives traffic. (The
    Deployment's own selector stays {pool, role}: selectors of Deployments are immutable.)"""
    selector = names.selector(pool.name, role)
    if pool.uid:
        selector[names.POOL_UID_LABEL] = pool.uid
    return selector


def _engine_args_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def _merged_resources(
    *layers: api.ResourceRequirements, gpus: int = 0, extra: dict[str, str] | None = None,
    defaults: api.ResourceRequirements | None = None,
) -> Obj:
    """Requests and limits, later layers over earlier ones, then the GPUs and `extra` devices
    (both request and limit); `defaults` fill what no layer sets, a default limit raised to
    the user's request and a default request lowered to the user's limit where they would
    cross (the API server refuses a request above its limit)."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    for layer in layers:
        requests.update(layer.requests)
        limits.update(layer.limits)
    if defaults is not None:
        for key, value in defaults.limits.items():
            if key in limits:
                continue
            asked = requests.get(key)
            want = quantity_value(asked) if asked is not None else None
            most = quantity_value(value)
            limits[key] = asked if want is not None and most is not None and want > most \
                else value
        for key, value in defaults.requests.items():
            if key in requests:
                continue
            cap = limits.get(key)
            want, most = quantity_value(value), quantity_value(cap) if cap else None
            requests[key] = cap if want is not None and most is not None and want > most \
                else value
    if gpus > 0:
        requests["nvidia.com/gpu"] = str(gpus)
        limits["nvidia.com/gpu"] = str(gpus)
    for key, value in (extra or {}).items():
        requests[key] = value
        limits[key] = value
    out: Obj = {}
    if requests:
        out["requests"] = dict(sorted(requests.items()))
    if limits:
        out["limits"] = dict(sorted(limits.items()))
    return out


def _container_security(add: list[str] | None = None) -> Obj:
    capabilities: Obj = {"drop": ["ALL"]}
    if add:
        capabilities["add"] = sorted(set(add))
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": capabilities,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pod_security() -> Obj:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _http_probe(period: int, failures: int, timeout: int = 3) -> Obj:
    return {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _spread(pool: Pool, role: str) -> list[Obj]:
    # ScheduleAnyway: spreading is a preference; a GPU shortage must not block scheduling.
    return [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": pod_selector(pool, role)},
        }
    ]


def _scrape_annotations() -> dict[str, str]:
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(names.METRICS_PORT),
        "prometheus.io/path": "/metrics",
    }


def _replicas_enforced(spec: api.InferencePoolSpec, role: str) -> bool:
    """The operator owns an engine role's size unless an autoscaler applies decisions: ours
    (mode Apply) or another one (mode External)."""
    if role == Role.ROUTER:
        return True
    auto = spec.autoscaling
    return not (auto.enabled and auto.mode in (api.AutoscalingMode.APPLY,
                                               api.AutoscalingMode.EXTERNAL))



def _digest(value: Any) -> str:
    blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def digest(obj: Obj) -> str:
    """Stable short hash of an object (used to notice that what we apply changed)."""
    return _digest(obj)
