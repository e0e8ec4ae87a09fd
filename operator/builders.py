"""Pure builders: an InferencePool -> the Kubernetes objects the operator applies.

No I/O and no clock: the same pool always renders to the same objects, so `poolpilot render`,
the golden tests and the operator agree. Every object carries the labels from
`poolpilot.names`; owner references are added only when the pool's uid is known (in a cluster).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from poolpilot import api, handoff, names
from poolpilot.apitypes import quantity_value

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
# Grace periods are per role (spec.<role>.terminationGracePeriodSeconds, default 120 s for
# engines, 60 s for routers): the launcher gives vLLM what is left after the preStop as its
# --shutdown-timeout, so in-flight generations finish after the endpoint is removed.
PRESTOP_SLEEP_SECONDS = 10  # endpoint removal reaches the routers before SIGTERM
ROUTER_PRESTOP_SECONDS = 5
STARTUP_PROBE_PERIOD = 10
STARTUP_PROBE_FAILURES = 180  # 30 minutes to download and load weights
RUN_AS_USER = 1000
# spec.router.prefixRouting Precise: each engine publishes its KV events (vLLM's ZMQ publisher)
# on these ports of its pod IP, and the router subscribes there.
KV_EVENTS_PORT = 5557
KV_REPLAY_PORT = 5558
MULTUS_NETWORKS = "k8s.v1.cni.cncf.io/networks"
# Routers get these unless spec.router.resources says otherwise (a request above the user's
# limit is lowered to it).
ROUTER_DEFAULT_RESOURCES = api.ResourceRequirements(
    requests={"cpu": "500m", "memory": "512Mi"}, limits={"memory": "2Gi"})

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
    # NetworkPolicies for pools whose spec.networkPolicy.enabled is unset: on unless the
    # operator runs with --no-network-policies.
    network_policies: bool = True


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
    (both request and limit); `defaults` fill what no layer sets, a default request lowered to
    the user's limit where it would exceed it."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    for layer in layers:
        requests.update(layer.requests)
        limits.update(layer.limits)
    if defaults is not None:
        for key, value in defaults.limits.items():
            limits.setdefault(key, value)
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


def _nixl(spec: api.InferencePoolSpec) -> bool:
    return spec.mode == api.Mode.DISAGGREGATED and spec.kv_transfer.connector == api.Connector.NIXL


def _engine_ports(spec: api.InferencePoolSpec) -> list[Obj]:
    ports: list[Obj] = [{"name": "http", "containerPort": names.ENGINE_PORT, "protocol": "TCP"}]
    if _nixl(spec):
        # NIXL's side channel: decode engines fetch a prefill engine's KV layout there.
        ports.append({"name": "nixl", "containerPort": spec.kv_transfer.side_channel_port,
                      "protocol": "TCP"})
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
    # vLLM drains on SIGTERM for what the grace period leaves after the preStop.
    cmd += ["--grace-seconds", str(role_spec.termination_grace_period_seconds),
            "--prestop-seconds", str(PRESTOP_SLEEP_SECONDS)]
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
    if _nixl(spec):
        env.append({"name": "VLLM_NIXL_SIDE_CHANNEL_PORT",
                    "value": str(spec.kv_transfer.side_channel_port)})
    rdma = spec.kv_transfer.rdma
    if rdma is not None and _nixl(spec):
        if rdma.ucx_tls:
            env.append({"name": "UCX_TLS", "value": rdma.ucx_tls})
        if rdma.ucx_net_devices:
            env.append({"name": "UCX_NET_DEVICES", "value": rdma.ucx_net_devices})
    return _merge_env(env, [{"name": e.name, "value": e.value} for e in spec.runtime.env])


def _engine_volumes(spec: api.InferencePoolSpec, role: str) -> tuple[list[Obj], list[Obj]]:
    """Every path the engine writes (its root filesystem is read-only), each bounded."""
    size = spec.runtime.storage
    volumes: list[Obj] = [{"name": "tmp", "emptyDir": {"sizeLimit": size.tmp}},
                          {"name": "compile-cache", "emptyDir": {"sizeLimit": size.compile_cache}}]
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
        volumes.append({"name": "model-cache", "emptyDir": {"sizeLimit": size.model_cache}})
        mounts.append({"name": "model-cache", "mountPath": MODEL_CACHE_DIR})
    # Tensor-parallel ranks, NCCL and torch's data loaders use shared memory; a container's
    # default /dev/shm is 64 MiB. In memory, so it counts against the container's memory.
    volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size.shm}})
    mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, mounts


def _ephemeral_request(spec: api.InferencePoolSpec) -> str:
    """What the disk-backed emptyDirs may hold: the scheduler places the pod where it fits."""
    size = spec.runtime.storage
    parts = [size.tmp, size.compile_cache]
    if spec.model.source.pvc is None:
        parts.append(size.model_cache)
    total = sum(((quantity_value(q) or Decimal(0)) for q in parts), Decimal(0))
    return _quantity(total)


def _quantity(value: Decimal) -> str:
    """Bytes as a Kubernetes quantity, in the largest binary unit that divides them."""
    n = int(value)
    for unit, power in (("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n and n % (1 << power) == 0:
            return f"{n >> power}{unit}"
    return str(n)


# ---------------------------------------------------------------------------------------------
# Pod templates (spec.podTemplate, spec.<role>.podTemplate): laid over what the operator
# renders, as `kubectl patch --type strategic` would merge them: maps merged, lists of named
# things merged by name (volume mounts by path), other lists appended, scalars replaced.


def _merge_named(base: list[Obj], extra: list[Obj], key: str = "name") -> list[Obj]:
    out = {item[key]: item for item in base}
    for item in extra:
        out[item[key]] = item
    return list(out.values())


def _merge_env(base: list[Obj], extra: list[Obj]) -> list[Obj]:
    return _merge_named(base, extra)


def _overlay_container(container: Obj, overlay: api.ContainerOverlay) -> None:
    if overlay.env:
        container["env"] = _merge_env(container.get("env", []),
                                      [e.to_wire() for e in overlay.env])
    if overlay.env_from:
        container["envFrom"] = [*container.get("envFrom", []), *overlay.env_from]
    if overlay.volume_mounts:
        container["volumeMounts"] = _merge_named(
            container.get("volumeMounts", []), [m.to_wire() for m in overlay.volume_mounts],
            key="mountPath")
    add = overlay.security_context.capabilities.add
    if add:
        caps = container["securityContext"]["capabilities"]
        caps["add"] = sorted({*caps.get("add", []), *add})


def _overlay_pod(template: Obj, overlay: api.PodTemplate) -> None:
    """Lay one pod template over a rendered pod template (in place)."""
    meta, pod, extra = template["metadata"], template["spec"], overlay.spec
    if overlay.metadata.labels:  # never the operator's own (the API refuses them)
        meta["labels"] = {**meta["labels"], **dict(sorted(overlay.metadata.labels.items()))}
    if overlay.metadata.annotations:
        meta["annotations"] = dict(sorted(
            {**meta.get("annotations", {}), **overlay.metadata.annotations}.items()))
    if extra.affinity:
        pod["affinity"] = {**pod.get("affinity", {}), **extra.affinity}
    if extra.tolerations:
        known = pod.get("tolerations", [])
        pod["tolerations"] = known + [t.to_wire() for t in extra.tolerations
                                      if t.to_wire() not in known]
    if extra.node_selector:
        pod["nodeSelector"] = dict(sorted({**pod.get("nodeSelector", {}),
                                           **extra.node_selector}.items()))
    for field in ("priority_class_name", "service_account_name", "runtime_class_name",
                  "scheduler_name"):
        value = getattr(extra, field)
        if value is not None:
            pod[api.PodSpecOverlay.model_fields[field].alias or field] = value
    if extra.image_pull_secrets:
        pod["imagePullSecrets"] = _merge_named(pod.get("imagePullSecrets", []),
                                               [s.to_wire() for s in extra.image_pull_secrets])
    if extra.volumes:
        pod["volumes"] = _merge_named(pod.get("volumes", []), [v.to_wire() for v in extra.volumes])
    for c in extra.containers:
        for container in pod["containers"]:
            if container["name"] == c.name:
                _overlay_container(container, c)


def _template_resources(templates: list[api.PodTemplate]) -> list[api.ResourceRequirements]:
    return [c.resources for t in templates for c in t.spec.containers]


def _engine_templates(spec: api.InferencePoolSpec, role: str) -> list[api.PodTemplate]:
    return [spec.pod_template, spec.role(role).pod_template]


def build_engine_deployment(pool: Pool, role: str, caps: Capabilities | None = None) -> Obj:
    """Deployment `P-<role>` running vLLM through the launcher for prefill/decode/engine."""
    caps = caps or Capabilities()
    spec = pool.spec
    role_spec = spec.role(role)
    name = names.child_name(pool.name, role)
    volumes, mounts = _engine_volumes(spec, role)
    templates = _engine_templates(spec, role)
    rdma = spec.kv_transfer.rdma if _nixl(spec) else None
    resources = _merged_resources(
        spec.runtime.resources, role_spec.resources, *_template_resources(templates),
        gpus=role_spec.gpus, extra={rdma.resource: str(rdma.count)} if rdma else None,
        defaults=api.ResourceRequirements(
            requests={"ephemeral-storage": _ephemeral_request(spec)}))
    container: Obj = {
        "name": ENGINE_CONTAINER,
        "image": spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": launch_command(spec, role),
        "ports": _engine_ports(spec),
        "env": _engine_env(pool, role),
        "resources": resources,
        "readinessProbe": _http_probe(period=5, failures=3),
        "livenessProbe": _http_probe(period=15, failures=4, timeout=5),
        "startupProbe": _http_probe(period=STARTUP_PROBE_PERIOD, failures=STARTUP_PROBE_FAILURES),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_SECONDS)]}}},
        # IPC_LOCK: RDMA pins (registers) the KV buffers it transfers from.
        "securityContext": {**_container_security(["IPC_LOCK"] if rdma else None),
                            "readOnlyRootFilesystem": True},
        "volumeMounts": mounts,
    }
    pod_spec: Obj = {
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": role_spec.termination_grace_period_seconds,
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
    template_meta: Obj = {"labels": pod_labels(pool, role)}
    annotations = {} if caps.monitoring else _scrape_annotations()
    if rdma is not None and rdma.networks:
        annotations[MULTUS_NETWORKS] = ",".join(rdma.networks)
    if annotations:
        template_meta["annotations"] = dict(sorted(annotations.items()))
    template: Obj = {"metadata": template_meta, "spec": pod_spec}
    for overlay in templates:
        _overlay_pod(template, overlay)
    dep_spec: Obj = {
        "selector": {"matchLabels": names.selector(pool.name, role)},
        # Surge, never drop: a replaced engine keeps serving until its successor is ready.
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        },
        "template": template,
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
            "selector": pod_selector(pool, role),
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


# The router's --prefix-routing value for each spec.router.prefixRouting.
_ROUTER_PREFIX_ROUTING = {api.PrefixRouting.APPROXIMATE: "approximate",
                          api.PrefixRouting.PRECISE: "precise", api.PrefixRouting.DISABLED: "off"}


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
            *(("--pool-uid", pool.uid) if pool.uid else ()),  # discovery's pod selector
            *(("--api-key-file", f"{ROUTER_KEYS_DIR}/{ROUTER_KEYS_FILE}")
              if spec.router.api_key_secret else ()),
            "--prefix-routing", _ROUTER_PREFIX_ROUTING[spec.router.prefix_routing],
            *(("--kv-events-port", str(KV_EVENTS_PORT), "--kv-replay-port", str(KV_REPLAY_PORT))
              if _precise(spec) else ()),
        ],
        "env": [
            {"name": "POOLPILOT_ROUTER_CONFIG", "value": f"{ROUTER_CONFIG_DIR}/{ROUTER_CONFIG_KEY}"}
        ],
        "ports": [{"name": "http", "containerPort": names.ROUTER_PORT, "protocol": "TCP"}],
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
        "terminationGracePeriodSeconds": spec.router.termination_grace_period_seconds,
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
    template: Obj = {
        "metadata": {"labels": pod_labels(pool, "router"),
                     "annotations": dict(sorted(annotations.items()))},
        "spec": pod_spec,
    }
    _overlay_pod(template, spec.router.pod_template)
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
            "template": template,
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
            "selector": pod_selector(pool, "router"),
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
                "matchLabels": _in_pool(pool)["matchLabels"],
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
    """Every pod the operator created for the pool (the uid label only it sets, in a cluster)."""
    labels = {names.MANAGED_BY: names.MANAGER, names.POOL_LABEL: pool.name}
    if pool.uid:
        labels[names.POOL_UID_LABEL] = pool.uid
    return {"matchLabels": labels}


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
    """The router takes clients on its port only: from spec.networkPolicy.routerFrom, or from
    anywhere when that is empty."""
    rule: Obj = {"ports": [{"port": names.ROUTER_PORT, "protocol": "TCP"}]}
    peers = pool.spec.network_policy.router_from
    if peers:
        rule = {"from": list(peers), **rule}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(pool, names.child_name(pool.name, "router"), "router"),
        "spec": {
            "podSelector": {"matchLabels": pod_selector(pool, "router")},
            "policyTypes": ["Ingress"],
            "ingress": [rule],
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
