"""Pure builders: an InferencePool -> the Kubernetes objects the operator applies.

No I/O and no clock: the same pool always renders to the same objects, so `poolpilot render`,
the golden tests and the operator agree. Every object carries the labels from
`poolpilot.names`; owner references are added only when the pool's uid is known (in a cluster).

The pieces live in modules named for their job: building_blocks.py (the pool, capabilities and
what every builder shares), pod_overlays.py, engine_pods.py, router_objects.py and policies.py.
This module puts them together (`build_children`) and re-exports their names as builders.X.
"""

from __future__ import annotations

from poolpilot.operator import model_cache, multinode
from poolpilot.operator.building_blocks import (
    COMPILE_CACHE_DIR,
    CONFIG_HASH_ANNOTATION,
    ENGINE_CONTAINER,
    KV_EVENTS_PORT,
    KV_REPLAY_PORT,
    MODEL_CACHE_DIR,
    MODEL_PVC_DIR,
    MULTUS_NETWORKS,
    PRESTOP_SLEEP_SECONDS,
    ROUTER_CONFIG_DIR,
    ROUTER_CONFIG_KEY,
    ROUTER_CONTAINER,
    ROUTER_DEFAULT_RESOURCES,
    ROUTER_KEYS_DIR,
    ROUTER_KEYS_FILE,
    ROUTER_PRESTOP_SECONDS,
    RUN_AS_USER,
    STARTUP_PROBE_PERIOD,
    Capabilities,
    Pool,
    digest,
    pod_labels,
    pod_selector,
)
from poolpilot.operator.engine_pods import (
    build_engine_deployment,
    build_engine_service,
    launch_command,
    model_location,
)
from poolpilot.operator.gateway_objects import build_gateway_objects
from poolpilot.operator.policies import (
    build_engine_network_policy,
    build_pdb,
    build_pod_monitor,
    build_router_network_policy,
    build_service_monitor,
    network_policies_on,
)
from poolpilot.operator.router_objects import (
    ROUTER_RULES,
    build_router_configmap,
    build_router_deployment,
    build_router_role,
    build_router_role_binding,
    build_router_service,
    build_router_service_account,
    router_config,
)

from poolpilot.apitypes import Obj
from poolpilot.roles import Role

# The builders' names, wherever they are defined, stay reachable as builders.X.
__all__ = [
    "COMPILE_CACHE_DIR",
    "CONFIG_HASH_ANNOTATION",
    "ENGINE_CONTAINER",
    "KV_EVENTS_PORT",
    "KV_REPLAY_PORT",
    "MODEL_CACHE_DIR",
    "MODEL_PVC_DIR",
    "MULTUS_NETWORKS",
    "PRESTOP_SLEEP_SECONDS",
    "ROUTER_CONFIG_DIR",
    "ROUTER_CONFIG_KEY",
    "ROUTER_CONTAINER",
    "ROUTER_DEFAULT_RESOURCES",
    "ROUTER_KEYS_DIR",
    "ROUTER_KEYS_FILE",
    "ROUTER_PRESTOP_SECONDS",
    "ROUTER_RULES",
    "RUN_AS_USER",
    "STARTUP_PROBE_PERIOD",
    "Capabilities",
    "Obj",
    "Pool",
    "build_children",
    "build_engine_deployment",
    "build_engine_network_policy",
    "build_engine_service",
    "build_pdb",
    "build_pod_monitor",
    "build_router_configmap",
    "build_router_deployment",
    "build_router_network_policy",
    "build_router_role",
    "build_router_role_binding",
    "build_router_service",
    "build_router_service_account",
    "build_service_monitor",
    "digest",
    "launch_command",
    "model_location",
    "network_policies_on",
    "object_key",
    "pod_labels",
    "pod_selector",
    "router_config",
]

# ---------------------------------------------------------------------------------------------
# Everything


def build_children(pool: Pool, caps: Capabilities | None = None) -> list[Obj]:
    """Every child, in apply order: config and identity first, engines before the router
    (so a mode switch creates the new engines before anything else changes)."""
    caps = caps or Capabilities()
    spec = pool.spec
    roles = spec.engine_roles()
    objs: list[Obj] = [build_router_configmap(pool), build_router_service_account(pool)]
    if caps.rbac:
        objs += [build_router_role(pool), build_router_role_binding(pool)]
    if network_policies_on(pool, caps):  # before the pods they protect
        objs += [build_engine_network_policy(pool), build_router_network_policy(pool)]
    objs += model_cache.cache_children(pool)  # the weights' prefetch, before the engines
    objs += [multinode.leader_only_service(build_engine_service(pool, r))
             if multinode.multi_node(spec, r) else build_engine_service(pool, r) for r in roles]
    objs += [multinode.build_engine_leaderworkerset(pool, build_engine_deployment(pool, r, caps))
             if multinode.multi_node(spec, r) else build_engine_deployment(pool, r, caps)
             for r in roles]
    objs += [build_router_service(pool), build_router_deployment(pool, caps)]
    objs += [build_pdb(pool, r) for r in (*roles, Role.ROUTER)]
    if caps.monitoring:
        if spec.monitoring.pod_monitor:
            objs.append(build_pod_monitor(pool, caps))
        if spec.monitoring.service_monitor:
            objs.append(build_service_monitor(pool, caps))
    objs += build_gateway_objects(pool, caps)  # last: the route once its backend exists
    return objs


def object_key(obj: Obj) -> tuple[str, str, str]:
    """(apiVersion, kind, name): identifies a child within the pool's namespace."""
    return (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


