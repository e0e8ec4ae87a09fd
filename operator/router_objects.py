"""The router's objects: its config, identity, RBAC, Deployment and Service.

Part of the pure builders (poolpilot.operator.builders): no I/O and no clock.
"""

from __future__ import annotations

import json

from poolpilot.operator import router_auth
from poolpilot.operator.building_blocks import (
    CONFIG_HASH_ANNOTATION,
    KV_EVENTS_PORT,
    KV_REPLAY_PORT,
    ROUTER_CONFIG_DIR,
    ROUTER_CONFIG_KEY,
    ROUTER_CONTAINER,
    ROUTER_DEFAULT_RESOURCES,
    ROUTER_KEYS_DIR,
    ROUTER_KEYS_FILE,
    ROUTER_PRESTOP_SECONDS,
    Capabilities,
    Pool,
    _container_security,
    _digest,
    _http_probe,
    _merged_resources,
    _meta,
    _pod_security,
    _scrape_annotations,
    _spread,
    pod_labels,
    pod_selector,
)
from poolpilot.operator.engine_pods import (
    _precise,
    kv_offload_bytes,
)
from poolpilot.operator.pod_overlays import (
    _overlay_pod,
    _template_resources,
)
from poolpilot.router import prefix_index as pi

from poolpilot import api, names
from poolpilot.apitypes import Obj
from poolpilot.roles import Mode, Role

# ---------------------------------------------------------------------------------------------
# Router


def router_config(pool: Pool) -> Obj:
    """The router's view of the pool, mounted from the ConfigMap `P-router`: only what the
    router reads (router/main.py apply_config_file), because its digest is a pod annotation
    and every change to it restarts the routers. Pool and namespace come as flags."""
    spec = pool.spec
    return {
        "mode": str(spec.mode),  # which engine Services to discover
        "model": spec.model.name,  # the local-prefill profile
        # The SLO targets its local-prefill rule holds to (not the quantiles).
        "slo": {"ttft": {"seconds": spec.slo.ttft.seconds},
                "itl": {"seconds": spec.slo.itl.seconds}},
    }


def build_router_configmap(pool: Pool) -> Obj:
    data = json.dumps(router_config(pool), indent=2, sort_keys=True) + "\n"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(pool, names.child_name(pool.name, Role.ROUTER), Role.ROUTER),
        "data": {ROUTER_CONFIG_KEY: data},
    }


def build_router_service_account(pool: Pool) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(pool, names.child_name(pool.name, Role.ROUTER), Role.ROUTER),
        "automountServiceAccountToken": True,
    }


ROUTER_RULES: list[Obj] = [
    # router/discovery.py lists the pool's EndpointSlices, then watches them; and the pool's
    # pods, for the autoscaler's draining mark on those a scale-down removes: nothing more.
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
     "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
]


def build_router_role(pool: Pool) -> Obj:
    """The calls the router makes to discover engines (EndpointSlices and pods: list, watch)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(pool, names.child_name(pool.name, Role.ROUTER), Role.ROUTER),
        "rules": [dict(r) for r in ROUTER_RULES],
    }


def build_router_role_binding(pool: Pool) -> Obj:
    name = names.child_name(pool.name, Role.ROUTER)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(pool, name, Role.ROUTER),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": pool.namespace}],
    }


# The router's --prefix-routing value for each spec.router.prefixRouting.
def prefix_index_entries(spec: api.InferencePoolSpec) -> int | None:
    """The router's --prefix-max-entries (None: its default): spec.router.prefixIndexEntries,
    else grown by the engines' offload tiers at their largest (pi.entries_for_offload)."""
    if spec.router.prefix_index_entries is not None:
        return spec.router.prefix_index_entries
    offload = sum(spec.role(r).max_replicas * (kv_offload_bytes(spec.role(r)) or 0)
                  for r in spec.engine_roles() if r != Role.DECODE)
    return pi.entries_for_offload(offload) if offload else None


_ROUTER_PREFIX_ROUTING = {api.PrefixRouting.APPROXIMATE: "approximate",
                          api.PrefixRouting.PRECISE: "precise", api.PrefixRouting.DISABLED: "off"}


def build_router_deployment(pool: Pool, caps: Capabilities | None = None) -> Obj:
    caps = caps or Capabilities()
    spec = pool.spec
    name = names.child_name(pool.name, Role.ROUTER)
    keys = router_auth.key_ref(pool, caps)  # (Secret, key), or None: no authentication
    config_hash = _digest(build_router_configmap(pool)["data"])
    container: Obj = {
        "name": ROUTER_CONTAINER,
        "image": spec.router.image or spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": [
            *("poolpilot", "router", "--host", "0.0.0.0", "--port", str(names.ROUTER_PORT)),
            "--metrics-port", str(names.METRICS_PORT),  # Prometheus' port (NetworkPolicies)
            *("--discover", "kubernetes", "--namespace", pool.namespace, "--pool", pool.name),
            *(("--pool-uid", pool.uid) if pool.uid else ()),  # discovery's pod selector
            *(("--api-key-file", f"{ROUTER_KEYS_DIR}/{ROUTER_KEYS_FILE}")
              if keys is not None else ()),
            *(("--prefill-hold", f"{spec.router.prefill_hold_seconds:g}")
              if spec.mode == Mode.DISAGGREGATED else ()),
            "--prefix-routing", _ROUTER_PREFIX_ROUTING[spec.router.prefix_routing],
            *(("--prefix-max-entries", str(entries))
              if (entries := prefix_index_entries(spec)) is not None else ()),
            *(("--kv-events-port", str(KV_EVENTS_PORT), "--kv-replay-port", str(KV_REPLAY_PORT))
              if _precise(spec) else ()),
        ],
        "env": [
            {"name": "POOLPILOT_ROUTER_CONFIG", "value": f"{ROUTER_CONFIG_DIR}/{ROUTER_CONFIG_KEY}"}
        ],
        "ports": [{"name": "http", "containerPort": names.ROUTER_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": names.METRICS_PORT, "protocol": "TCP"}],
        "resources": _merged_resources(
            spec.router.resources, *_template_resources([spec.router.pod_template]),
            defaults=ROUTER_DEFAULT_RESOURCES),
        "readinessProbe": _http_probe(period=5, failures=3),
        "livenessProbe": _http_probe(period=10, failures=3),
        "startupProbe": _http_probe(period=2, failures=30),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(ROUTER_PRESTOP_SECONDS)]}}},
        "securityContext": {**_container_security(), "readOnlyRootFilesystem": True},
        "volumeMounts": [{"name": "config", "mountPath": ROUTER_CONFIG_DIR, "readOnly": True}],
    }
    volumes: list[Obj] = [{"name": "config", "configMap": {"name": name}}]
    if keys is not None:
        # A volume, not an env var: a rotated Secret reaches the file (the router re-reads it).
        container["volumeMounts"].append(
            {"name": "api-keys", "mountPath": ROUTER_KEYS_DIR, "readOnly": True})
        volumes.append({"name": "api-keys", "secret": {
            "secretName": keys[0], "items": [{"key": keys[1], "path": ROUTER_KEYS_FILE}],
            "defaultMode": 0o440}})
    pod_spec: Obj = {
        "serviceAccountName": name,
        "terminationGracePeriodSeconds": spec.router.termination_grace_period_seconds,
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": volumes,
        "topologySpreadConstraints": _spread(pool, Role.ROUTER),
    }
    if spec.runtime.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [s.to_wire() for s in spec.runtime.image_pull_secrets]
    annotations = {CONFIG_HASH_ANNOTATION: config_hash}
    if not caps.monitoring:
        annotations.update(_scrape_annotations())
    template: Obj = {
        "metadata": {"labels": pod_labels(pool, Role.ROUTER),
                     "annotations": dict(sorted(annotations.items()))},
        "spec": pod_spec,
    }
    _overlay_pod(template, spec.router.pod_template)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(pool, name, Role.ROUTER),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": names.selector(pool.name, Role.ROUTER)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": template,
        },
    }


def build_router_service(pool: Pool) -> Obj:
    """ClusterIP Service `P-router`: the pool's OpenAI endpoint on port 8000."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(pool, names.child_name(pool.name, Role.ROUTER), Role.ROUTER),
        "spec": {
            "type": "ClusterIP",
            "selector": pod_selector(pool, Role.ROUTER),
            "ports": [
                {"name": "http", "port": names.ROUTER_PORT, "targetPort": "http",
                 "protocol": "TCP"},
                # For the ServiceMonitor; the NetworkPolicy opens it to the metricsNamespaces.
                {"name": "metrics", "port": names.METRICS_PORT, "targetPort": "metrics",
                 "protocol": "TCP"},
            ],
        },
    }


