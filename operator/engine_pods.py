"""The engines' Deployments and Services, and the vLLM launch command they run.

Part of the pure builders (poolpilot.operator.builders): no I/O and no clock.
"""

from __future__ import annotations

from decimal import Decimal

from poolpilot.operator import model_cache
from poolpilot.operator.building_blocks import (
    COMPILE_CACHE_DIR,
    ENGINE_CONTAINER,
    KV_EVENTS_PORT,
    KV_REPLAY_PORT,
    MODEL_CACHE_DIR,
    MODEL_PVC_DIR,
    MULTUS_NETWORKS,
    PRESTOP_SLEEP_SECONDS,
    STARTUP_PROBE_PERIOD,
    Capabilities,
    Pool,
    _container_security,
    _engine_args_value,
    _http_probe,
    _merged_resources,
    _meta,
    _pod_security,
    _replicas_enforced,
    _scrape_annotations,
    _spread,
    pod_labels,
    pod_selector,
)
from poolpilot.operator.pod_overlays import (
    _merge_env,
    _overlay_pod,
    _template_resources,
)

from poolpilot import api, handoff, names
from poolpilot.apitypes import Obj, quantity_value
from poolpilot.roles import Role

# ---------------------------------------------------------------------------------------------
# Engines


def model_location(spec: api.InferencePoolSpec) -> str:
    """What the launcher's --model gets: a Hub id, the folder inside the mounted PVC or the
    model cache, or the bucket the streaming loader reads."""
    cached = model_cache.engine_model(spec)
    if cached is not None:
        return cached
    pvc = spec.model.source.pvc
    if pvc is None:
        return spec.model.name
    sub = pvc.path.strip("/")
    return f"{MODEL_PVC_DIR}/{sub}" if sub else MODEL_PVC_DIR


def kv_offload_bytes(role_spec: api.EngineRoleSpec) -> int | None:
    """Bytes of host memory for the role's CPU offload tier (None: none; 0 counts as none)."""
    if role_spec.kv_offload is None:
        return None
    value = quantity_value(role_spec.kv_offload)
    return int(value) if value is not None and value >= 1 else None


def _precise(spec: api.InferencePoolSpec) -> bool:
    return spec.router.prefix_routing == api.PrefixRouting.PRECISE


def _nixl(spec: api.InferencePoolSpec) -> bool:
    return spec.mode == api.Mode.DISAGGREGATED and spec.kv_transfer.connector == api.Connector.NIXL


def _engine_ports(spec: api.InferencePoolSpec) -> list[Obj]:
    ports: list[Obj] = [{"name": "http", "containerPort": names.ENGINE_PORT, "protocol": "TCP"},
                        {"name": "metrics", "containerPort": names.METRICS_PORT,
                         "protocol": "TCP"}]
    if _nixl(spec):
        # NIXL's side channel: decode engines fetch a prefill engine's KV layout there.
        ports.append({"name": "nixl", "containerPort": spec.kv_transfer.side_channel_port,
                      "protocol": "TCP"})
    if _precise(spec):
        ports += [{"name": "kv-events", "containerPort": KV_EVENTS_PORT, "protocol": "TCP"},
                  {"name": "kv-replay", "containerPort": KV_REPLAY_PORT, "protocol": "TCP"}]
    return ports


def _option(flag: str, value: str) -> list[str]:
    """`flag value`, or `flag=value` for a value that starts with '-': argparse would take
    that one for an option and the launcher stop with 'expected one argument'."""
    return [f"{flag}={value}"] if value.startswith("-") else [flag, value]


def launch_command(spec: api.InferencePoolSpec, role: str) -> list[str]:
    """The engine container's command (the launcher contract of the runtime image)."""
    role_spec = spec.role(role)
    connector = "none" if spec.mode == api.Mode.AGGREGATED else str(spec.kv_transfer.connector)
    cmd = [
        "poolpilot", "launch",
        "--role", str(role),
        *_option("--model", model_location(spec)),
        "--port", str(names.ENGINE_PORT),
        "--metrics-port", str(names.METRICS_PORT),  # Prometheus' port (NetworkPolicies)
        *_option("--served-name", spec.served_name()),
        "--kv-connector", connector,
    ]  # fmt: skip
    if connector != "none" and spec.kv_transfer.extra_config:
        cmd += ["--kv-config", _engine_args_value(spec.kv_transfer.extra_config)]
    if connector == str(api.Connector.NIXL):
        # The prefill's KV hold covers the router's handoff (its connect timeout x attempts).
        cmd += ["--kv-lease-seconds", str(handoff.kv_lease_seconds())]
    cmd += ["--tensor-parallel", str(role_spec.tensor_parallel_size)]
    offload = kv_offload_bytes(role_spec)
    if offload is not None and role != Role.DECODE:  # (validation refuses it on decode)
        cmd += ["--kv-offload-bytes", str(offload)]
    if role_spec.nodes_per_replica > 1:  # a LeaderWorkerSet group (operator/multinode.py)
        cmd += ["--nodes", str(role_spec.nodes_per_replica)]
    if _precise(spec):
        cmd += ["--kv-events-port", str(KV_EVENTS_PORT), "--kv-replay-port", str(KV_REPLAY_PORT)]
    # vLLM drains on SIGTERM for what the grace period leaves after the preStop.
    cmd += ["--grace-seconds", str(role_spec.termination_grace_period_seconds),
            "--prestop-seconds", str(PRESTOP_SLEEP_SECONDS)]
    # What the cache and the role imply (model_cache.engine_args), under the user's own.
    args = {**model_cache.engine_args(spec, role), **spec.runtime.engine_args,
            **role_spec.engine_args}
    for key in sorted(args):  # (a key may start with '-': the launcher names it)
        cmd += _option("--engine-arg", f"{key}={_engine_args_value(args[key])}")
    return cmd


def _engine_env(pool: Pool, role: str) -> list[Obj]:
    spec = pool.spec
    env: list[Obj] = [
        {"name": "POOLPILOT_POOL", "value": pool.name},
        {"name": "POOLPILOT_ROLE", "value": str(role)},
        {"name": "HOME", "value": "/tmp"},
        {"name": "TMPDIR", "value": "/tmp"},
        # A read-only cache (or none) keeps the Hub's own files in /tmp.
        {"name": "HF_HOME", "value": MODEL_CACHE_DIR if _hub_cache_writable(spec)
         else "/tmp/huggingface"},
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
    if spec.model.source.pvc is not None or model_cache.prefetched(spec):
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})  # the files are all there
    env += model_cache.store_env(spec)[0]
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


def _hub_cache_writable(spec: api.InferencePoolSpec) -> bool:
    return (model_cache.cache_type(spec) == api.CacheType.EMPTY_DIR
            and spec.model.source.pvc is None)


def _engine_volumes(pool: Pool, role: str) -> tuple[list[Obj], list[Obj]]:
    """Every path the engine writes (its root filesystem is read-only), each bounded; the
    model and compile caches as spec.model.cache says (model_cache.engine_cache)."""
    spec = pool.spec
    size = spec.runtime.storage
    cache = model_cache.engine_cache(pool)
    volumes: list[Obj] = [{"name": "tmp", "emptyDir": {"sizeLimit": size.tmp}}, *cache.volumes]
    mounts: list[Obj] = [{"name": "tmp", "mountPath": "/tmp"}, *cache.mounts]
    pvc = spec.model.source.pvc
    if pvc is not None:
        volumes.append(
            {
                "name": "model",
                "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True},
            }
        )
        mounts.append({"name": "model", "mountPath": MODEL_PVC_DIR, "readOnly": True})
    # Tensor-parallel ranks, NCCL and torch's data loaders use shared memory; a container's
    # default /dev/shm is 64 MiB. In memory, so it counts against the container's memory.
    volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size.shm}})
    mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, mounts


def _ephemeral_request(pool: Pool) -> str:
    """What the disk-backed emptyDirs may hold: the scheduler places the pod where it fits."""
    parts = [pool.spec.runtime.storage.tmp, *model_cache.engine_cache(pool).emptydir_parts]
    total = sum(((quantity_value(q) or Decimal(0)) for q in parts), Decimal(0))
    return _quantity(total)


def _quantity(value: Decimal) -> str:
    """Bytes as a Kubernetes quantity, in the largest binary unit that divides them."""
    n = int(value)
    for unit, power in (("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if n and n % (1 << power) == 0:
            return f"{n >> power}{unit}"
    return str(n)


def _engine_templates(spec: api.InferencePoolSpec, role: str) -> list[api.PodTemplate]:
    return [spec.pod_template, spec.role(role).pod_template]


def build_engine_deployment(pool: Pool, role: str, caps: Capabilities | None = None) -> Obj:
    """Deployment `P-<role>` running vLLM through the launcher for prefill/decode/engine."""
    caps = caps or Capabilities()
    spec = pool.spec
    role_spec = spec.role(role)
    name = names.child_name(pool.name, role)
    volumes, mounts = _engine_volumes(pool, role)
    templates = _engine_templates(spec, role)
    rdma = spec.kv_transfer.rdma if _nixl(spec) else None
    resources = _merged_resources(
        spec.runtime.resources, role_spec.resources, *_template_resources(templates),
        gpus=role_spec.gpus, extra={rdma.resource: str(rdma.count)} if rdma else None,
        defaults=api.ResourceRequirements(
            requests={"ephemeral-storage": _ephemeral_request(pool)}))
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
        # Long enough for the worst first start on this cache, not longer (model_cache).
        "startupProbe": _http_probe(period=STARTUP_PROBE_PERIOD,
                                    failures=model_cache.startup_failure_threshold(spec, role)),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_SECONDS)]}}},
        # IPC_LOCK: RDMA pins (registers) the KV buffers it transfers from.
        "securityContext": {**_container_security(["IPC_LOCK"] if rdma else None),
                            "readOnlyRootFilesystem": True},
        "volumeMounts": mounts,
    }
    env_from = model_cache.store_env(spec)[1]
    if env_from:
        container["envFrom"] = env_from
    pod_spec: Obj = {
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": role_spec.termination_grace_period_seconds,
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": volumes,
        "topologySpreadConstraints": _spread(pool, role),
    }
    init = model_cache.engine_cache(pool).init_containers
    if init:  # fills the emptyDir from the bucket, or waits for the node's copy
        pod_spec["initContainers"] = init
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


