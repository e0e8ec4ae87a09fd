"""Pure builders: an InferencePool -> the Kubernetes objects the operator applies.

No I/O and no clock: the same pool always renders to the same objects, so `poolpilot render`,
the golden tests and the operator agree. Every object carries the labels from
`poolpilot.names`; owner references are added only when the pool's uid is known (in a cluster).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from poolpilot import api, handoff, names

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
ENGINE_GRACE_SECONDS = 120  # in-flight generations finish after the endpoint is removed
ROUTER_GRACE_SECONDS = 60
PRESTOP_SLEEP_SECONDS = 10  # endpoint removal reaches the routers before SIGTERM
STARTUP_PROBE_PERIOD = 10
STARTUP_PROBE_FAILURES = 180  # 30 minutes to download and load weights
RUN_AS_USER = 1000
# spec.router.prefixRouting Precise: each engine publishes its KV events (vLLM's ZMQ publisher)
# on these ports of its pod IP, and the router subscribes there.
KV_EVENTS_PORT = 5557
KV_REPLAY_PORT = 5558

Obj = dict[str, Any]


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
    # NetworkPolicies for pools whose spec.networkPolicy.enabled is unset (--network-policies).
    network_policies: bool = False


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


def _engine_args_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def _merged_resources(
    base: api.ResourceRequirements, override: api.ResourceRequirements, gpus: int
) -> Obj:
    requests = {**base.requests, **override.requests}
    limits = {**base.limits, **override.limits}
    if gpus > 0:
        requests["nvidia.com/gpu"] = str(gpus)
        limits["nvidia.com/gpu"] = str(gpus)
    out: Obj = {}
    if requests:
        out["requests"] = dict(sorted(requests.items()))
    if limits:
        out["limits"] = dict(sorted(limits.items()))
    return out


def _container_security() -> Obj:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
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
            "labelSelector": {"matchLabels": names.selector(pool.name, role)},
        }
    ]


def _scrape_annotations() -> dict[str, str]:
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(names.ENGINE_PORT),
        "prometheus.io/path": "/metrics",
    }


def _replicas_enforced(spec: api.InferencePoolSpec, role: str) -> bool:
    """The operator owns an engine role's size unless an autoscaler applies decisions: ours
    (mode Apply) or another one (mode External)."""
    if role == "router":
        return True
    auto = spec.autoscaling
    return not (auto.enabled and auto.mode in (api.AutoscalingMode.APPLY,
                                               api.AutoscalingMode.EXTERNAL))


# ---------------------------------------------------------------------------------------------
# Engines


def model_location(spec: api.InferencePoolSpec) -> str:
    """What the launcher's --model gets: a Hub id, or the folder inside the mounted PVC."""
    pvc = spec.model.source.pvc
    if pvc is None:
        return spec.model.name
    sub = pvc.path.strip("/")
    return f"{MODEL_PVC_DIR}/{sub}" if sub else MODEL_PVC_DIR


def _precise(spec: api.InferencePoolSpec) -> bool:
    return spec.router.prefix_routing == api.PrefixRouting.PRECISE


def _engine_ports(spec: api.InferencePoolSpec) -> list[Obj]:
    ports: list[Obj] = [{"name": "http", "containerPort": names.ENGINE_PORT, "protocol": "TCP"}]
    if _precise(spec):
        ports += [{"name": "kv-events", "containerPort": KV_EVENTS_PORT, "protocol": "TCP"},
                  {"name": "kv-replay", "containerPort": KV_REPLAY_PORT, "protocol": "TCP"}]
    return ports


def launch_command(spec: api.InferencePoolSpec, role: str) -> list[str]:
    """The engine container's command (the launcher contract of the runtime image)."""
    role_spec = spec.role(role)
    launcher_role = "aggregated" if role == "engine" else role
    connector = "none" if spec.mode == api.Mode.AGGREGATED else str(spec.kv_transfer.connector)
    cmd = [
        "poolpilot", "launch",
        "--role", launcher_role,
        "--model", model_location(spec),
        "--port", str(names.ENGINE_PORT),
        "--served-name", spec.served_name(),
        "--kv-connector", connector,
    ]  # fmt: skip
    if connector != "none" and spec.kv_transfer.extra_config:
        cmd += ["--kv-config", _engine_args_value(spec.kv_transfer.extra_config)]
    if connector == str(api.Connector.NIXL):
        # The prefill's KV hold covers the router's handoff (its connect timeout x attempts).
        cmd += ["--kv-lease-seconds", str(handoff.kv_lease_seconds())]
    cmd += ["--tensor-parallel", str(role_spec.tensor_parallel_size)]
    if _precise(spec):
        cmd += ["--kv-events-port", str(KV_EVENTS_PORT), "--kv-replay-port", str(KV_REPLAY_PORT)]
    args = {**spec.runtime.engine_args, **role_spec.engine_args}
    for key in sorted(args):
        cmd += ["--engine-arg", f"{key}={_engine_args_value(args[key])}"]
    return cmd


def _engine_env(pool: Pool, role: str) -> list[Obj]:
    spec = pool.spec
    env: list[Obj] = [
        {"name": "POOLPILOT_POOL", "value": pool.name},
        {"name": "POOLPILOT_ROLE", "value": role},
        {"name": "HOME", "value": "/tmp"},
        {"name": "TMPDIR", "value": "/tmp"},
        {"name": "HF_HOME", "value": MODEL_CACHE_DIR},
        {"name": "XDG_CACHE_HOME", "value": COMPILE_CACHE_DIR},
        {"name": "VLLM_CACHE_ROOT", "value": f"{COMPILE_CACHE_DIR}/vllm"},
        {"name": "TRITON_CACHE_DIR", "value": f"{COMPILE_CACHE_DIR}/triton"},
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": f"{COMPILE_CACHE_DIR}/torchinductor"},
        # NIXL's side channel must advertise the pod's own address to the decode peers.
        {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
         "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]  # fmt: skip
    hf = spec.model.source.hugging_face
    if hf is not None and hf.token_secret is not None:
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {
                    "secretKeyRef": {"name": hf.token_secret.name, "key": hf.token_secret.key}
                },
            }
        )
    if spec.model.source.pvc is not None:
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    env += [{"name": e.name, "value": e.value} for e in spec.runtime.env]
    return env


def _engine_volumes(spec: api.InferencePoolSpec, role: str) -> tuple[list[Obj], list[Obj]]:
    """Every path the engine writes (its root filesystem is read-only)."""
    volumes: list[Obj] = [{"name": "tmp", "emptyDir": {}},
                          {"name": "compile-cache", "emptyDir": {}}]
    mounts: list[Obj] = [{"name": "tmp", "mountPath": "/tmp"},
                         {"name": "compile-cache", "mountPath": COMPILE_CACHE_DIR}]
    pvc = spec.model.source.pvc
    if pvc is not None:
        volumes.append(
            {
                "name": "model",
                "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True},
            }
        )
        mounts.append({"name": "model", "mountPath": MODEL_PVC_DIR, "readOnly": True})
    else:
        volumes.append({"name": "model-cache", "emptyDir": {}})
        mounts.append({"name": "model-cache", "mountPath": MODEL_CACHE_DIR})
    if spec.role(role).tensor_parallel_size > 1:
        # Tensor-parallel ranks exchange tensors through shared memory; the default 64 MiB
        # /dev/shm of a container is far too small.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, mounts


def build_engine_deployment(pool: Pool, role: str, caps: Capabilities | None = None) -> Obj:
    """Deployment `P-<role>` running vLLM through the launcher for prefill/decode/engine."""
    caps = caps or Capabilities()
    spec = pool.spec
    role_spec = spec.role(role)
    name = names.child_name(pool.name, role)
    volumes, mounts = _engine_volumes(spec, role)
    container: Obj = {
        "name": ENGINE_CONTAINER,
        "image": spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": launch_command(spec, role),
        "ports": _engine_ports(spec),
        "env": _engine_env(pool, role),
        "resources": _merged_resources(spec.runtime.resources, role_spec.resources, role_spec.gpus),
        "readinessProbe": _http_probe(period=5, failures=3),
        "livenessProbe": _http_probe(period=15, failures=4, timeout=5),
        "startupProbe": _http_probe(period=STARTUP_PROBE_PERIOD, failures=STARTUP_PROBE_FAILURES),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_SECONDS)]}}},
        "securityContext": {**_container_security(), "readOnlyRootFilesystem": True},
        "volumeMounts": mounts,
    }
    pod_spec: Obj = {
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": ENGINE_GRACE_SECONDS,
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": volumes,
        "topologySpreadConstraints": _spread(pool, role),
    }
    if spec.runtime.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(spec.runtime.node_selector.items()))
    if spec.runtime.tolerations:
        pod_spec["tolerations"] = [t.to_wire() for t in spec.runtime.tolerations]
    if spec.runtime.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [s.to_wire() for s in spec.runtime.image_pull_secrets]
    template_meta: Obj = {"labels": names.labels(pool.name, role)}
    if not caps.monitoring:
        template_meta["annotations"] = _scrape_annotations()
    dep_spec: Obj = {
        "selector": {"matchLabels": names.selector(pool.name, role)},
        # Surge, never drop: a replaced engine keeps serving until its successor is ready.
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        },
        "template": {"metadata": template_meta, "spec": pod_spec},
    }
    if _replicas_enforced(spec, role):
        dep_spec = {"replicas": role_spec.replicas, **dep_spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(pool, name, role),
        "spec": dep_spec,
    }


def build_engine_service(pool: Pool, role: str) -> Obj:
    """Headless Service `P-<role>`: its EndpointSlices are the router's discovery source."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(pool, names.child_name(pool.name, role), role),
        "spec": {
            "clusterIP": "None",
            "selector": names.selector(pool.name, role),
            "ports": [
                {"name": "http", "port": names.ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


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
        "metadata": _meta(pool, names.child_name(pool.name, "router"), "router"),
        "data": {ROUTER_CONFIG_KEY: data},
    }


def build_router_service_account(pool: Pool) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(pool, names.child_name(pool.name, "router"), "router"),
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
        "metadata": _meta(pool, names.child_name(pool.name, "router"), "router"),
        "rules": [dict(r) for r in ROUTER_RULES],
    }


def build_router_role_binding(pool: Pool) -> Obj:
    name = names.child_name(pool.name, "router")
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(pool, name, "router"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": pool.namespace}],
    }


def build_router_deployment(pool: Pool, caps: Capabilities | None = None) -> Obj:
    caps = caps or Capabilities()
    spec = pool.spec
    name = names.child_name(pool.name, "router")
    config_hash = _digest(build_router_configmap(pool)["data"])
    container: Obj = {
        "name": ROUTER_CONTAINER,
        "image": spec.router.image or spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": [
            *("poolpilot", "router", "--host", "0.0.0.0", "--port", str(names.ROUTER_PORT)),
            *("--discover", "kubernetes", "--namespace", pool.namespace, "--pool", pool.name),
            *(("--api-key-file", f"{ROUTER_KEYS_DIR}/{ROUTER_KEYS_FILE}")
              if spec.router.api_key_secret else ()),
            "--prefix-routing", str(spec.router.prefix_routing).lower(),
            *(("--kv-events-port", str(KV_EVENTS_PORT), "--kv-replay-port", str(KV_REPLAY_PORT))
              if _precise(spec) else ()),
        ],
        "env": [
            {"name": "POOLPILOT_ROUTER_CONFIG", "value": f"{ROUTER_CONFIG_DIR}/{ROUTER_CONFIG_KEY}"}
        ],
        "ports": [{"name": "http", "containerPort": names.ROUTER_PORT, "protocol": "TCP"}],
        "resources": _merged_resources(
            api.ResourceRequirements(), spec.router.resources, gpus=0
        ),
        "readinessProbe": _http_probe(period=5, failures=3),
        "livenessProbe": _http_probe(period=10, failures=3),
        "startupProbe": _http_probe(period=2, failures=30),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
        "securityContext": {**_container_security(), "readOnlyRootFilesystem": True},
        "volumeMounts": [{"name": "config", "mountPath": ROUTER_CONFIG_DIR, "readOnly": True}],
    }
    volumes: list[Obj] = [{"name": "config", "configMap": {"name": name}}]
    secret = spec.router.api_key_secret
    if secret is not None:
        # A volume, not an env var: a rotated Secret reaches the file (the router re-reads it).
        container["volumeMounts"].append(
            {"name": "api-keys", "mountPath": ROUTER_KEYS_DIR, "readOnly": True})
        volumes.append({"name": "api-keys", "secret": {
            "secretName": secret.name, "items": [{"key": secret.key, "path": ROUTER_KEYS_FILE}],
            "defaultMode": 0o440}})
    pod_spec: Obj = {
        "serviceAccountName": name,
        "terminationGracePeriodSeconds": ROUTER_GRACE_SECONDS,
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": volumes,
        "topologySpreadConstraints": _spread(pool, "router"),
    }
    if spec.runtime.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [s.to_wire() for s in spec.runtime.image_pull_secrets]
    annotations = {CONFIG_HASH_ANNOTATION: config_hash}
    if not caps.monitoring:
        annotations.update(_scrape_annotations())
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(pool, name, "router"),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": names.selector(pool.name, "router")},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                "metadata": {
                    "labels": names.labels(pool.name, "router"),
                    "annotations": dict(sorted(annotations.items())),
                },
                "spec": pod_spec,
            },
        },
    }


def build_router_service(pool: Pool) -> Obj:
    """ClusterIP Service `P-router`: the pool's OpenAI endpoint on port 8000."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(pool, names.child_name(pool.name, "router"), "router"),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector(pool.name, "router"),
            "ports": [
                {"name": "http", "port": names.ROUTER_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


# ---------------------------------------------------------------------------------------------
# Disruption budgets and monitoring


def build_pdb(pool: Pool, role: str) -> Obj:
    """At most one pod of a role is evicted at a time (node drains, upgrades)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(pool, names.child_name(pool.name, role), role),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector(pool.name, role)}},
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
    """ServiceMonitor for the router's /metrics (Prometheus Operator)."""
    caps = caps or Capabilities()
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _monitor_meta(pool, names.child_name(pool.name, "router"), "router", caps),
        "spec": {
            "selector": {"matchLabels": names.selector(pool.name, "router")},
            "endpoints": [
                {
                    "port": "http",
                    "path": "/metrics",
                    "interval": "15s",
                    "relabelings": _relabelings(),
                }
            ],
        },
    }


def build_pod_monitor(pool: Pool, caps: Capabilities | None = None) -> Obj:
    """PodMonitor for every engine pod's vLLM /metrics (headless Services have no monitor)."""
    caps = caps or Capabilities()
    roles = pool.spec.engine_roles()
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _monitor_meta(pool, names.child_name(pool.name, "engines"), "engines", caps),
        "spec": {
            "selector": {
                "matchLabels": {names.POOL_LABEL: pool.name},
                "matchExpressions": [
                    {"key": names.ROLE_LABEL, "operator": "In", "values": list(roles)}
                ],
            },
            "podMetricsEndpoints": [
                {
                    "port": "http",
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
    return {"matchLabels": {names.MANAGED_BY: names.MANAGER, names.POOL_LABEL: pool.name}}


def build_engine_network_policy(pool: Pool) -> Obj:
    """Engines take traffic from their pool only: its router (requests) and its other engines
    (the KV-cache handoff: NIXL's side channel and UCX, on ports of their own); and Prometheus
    (the metricsNamespaces) on the engine port for /metrics."""
    ingress: list[Obj] = [{"from": [{"podSelector": _in_pool(pool)}]}]
    scrapers = pool.spec.network_policy.metrics_namespaces
    if scrapers:
        ingress.append({
            "from": [{"namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In",
                 "values": list(scrapers)}]}}],
            "ports": [{"port": names.ENGINE_PORT, "protocol": "TCP"}],
        })
    roles = pool.spec.engine_roles()
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(pool, names.child_name(pool.name, "engines"), "engines"),
        "spec": {
            "podSelector": {**_in_pool(pool), "matchExpressions": [
                {"key": names.ROLE_LABEL, "operator": "In", "values": list(roles)}]},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def build_router_network_policy(pool: Pool) -> Obj:
    """The router takes clients from anywhere, on its port only."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(pool, names.child_name(pool.name, "router"), "router"),
        "spec": {
            "podSelector": {"matchLabels": names.selector(pool.name, "router")},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"port": names.ROUTER_PORT, "protocol": "TCP"}]}],
        },
    }


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
    objs += [build_engine_service(pool, r) for r in roles]
    objs += [build_engine_deployment(pool, r, caps) for r in roles]
    objs += [build_router_service(pool), build_router_deployment(pool, caps)]
    objs += [build_pdb(pool, r) for r in (*roles, "router")]
    if caps.monitoring:
        if spec.monitoring.pod_monitor:
            objs.append(build_pod_monitor(pool, caps))
        if spec.monitoring.service_monitor:
            objs.append(build_service_monitor(pool, caps))
    return objs


def object_key(obj: Obj) -> tuple[str, str, str]:
    """(apiVersion, kind, name): identifies a child within the pool's namespace."""
    return (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def _digest(value: Any) -> str:
    blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def digest(obj: Obj) -> str:
    """Stable short hash of an object (used to notice that what we apply changed)."""
    return _digest(obj)
