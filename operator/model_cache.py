"""The model and compile caches (spec.model.cache): the prefetch Job and its PVCs, the
node-local prefetcher DaemonSet, the engine pods' cache volumes, flags and startup budget, and
whether the weights are ready.

Part of the pure builders (poolpilot.operator.builders): no I/O and no clock.

- EmptyDir: each engine pod fetches the weights into its own emptyDir (vLLM downloads from the
  Hub itself; from a bucket an init container copies them first).
- SharedVolume: NAME-model-cache, a ReadWriteMany PVC, is filled once by the Job NAME-prefetch;
  the operator creates (or updates) the engine Deployments only once that Job has succeeded,
  so no engine holds a GPU while the weights download, and a model change keeps the old
  engines serving until the new weights are there. Engines mount it read-only.
- NodeLocal: the DaemonSet NAME-prefetch fills a hostPath folder on every node the engines may
  run on (runtime.nodeSelector and tolerations); an engine pod's init container waits until
  its own node's copy is complete, so a pod that lands before the prefetcher holds its GPU only
  for what is left of that node's download.
- Streaming: vLLM streams the safetensors from the bucket to the GPU (--load-format
  runai_streamer); nothing is kept.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from poolpilot.operator.building_blocks import (
    COMPILE_CACHE_DIR,
    MODEL_CACHE_DIR,
    RUN_AS_USER,
    STARTUP_PROBE_PERIOD,
    Pool,
    _container_security,
    _meta,
    _pod_security,
    pod_labels,
)

from poolpilot import api, names
from poolpilot.apitypes import INT32_MAX, Obj, quantity_value
from poolpilot.roles import Role

CACHE_ROLE = "model-cache"  # the role label of the cache's objects and pods
PREFETCH_DIR = "/etc/poolpilot/prefetch"
PREFETCH_VOLUME = "poolpilot-prefetch"
PREFETCH_KEY = "prefetch.py"
MARKER = ".poolpilot-complete"
SOURCE_ANNOTATION = "poolpilot.dev/model-source"
PREFETCH_SCRIPT = (Path(__file__).with_name("prefetch_script.py")).read_text()

# --- the startup budget -----------------------------------------------------------------------
# Measured on an H200 (../shared/calibration/README.md, "Cold start"): torch import 5.5 s and
# CUDA init 0.4 s, 35 decode CUDA graphs of an 8B model 5.7 s (up to 51 with vLLM's default
# ceiling: 10 s allowed), 16 GB of safetensors from a cold local disk at 1.4 GB/s. Not measured
# here, and set on the slow side: vLLM's own start (engine core, memory profiling, API server)
# 30 s, a cold torch.compile of the model 90 s, the Hub and a bucket at 100 MB/s, a network
# volume (NFS-like) and the streaming loader at 250 MB/s.
IMPORT_AND_INIT_S = 5.5 + 0.4
VLLM_START_S = 30.0
COMPILE_COLD_S = 90.0
GRAPHS_S = 10.0
GBPS_LOCAL_DISK = 1.4
GBPS_HUB = 0.1
GBPS_NETWORK_VOLUME = 0.25
GBPS_STREAMING = 0.25
STARTUP_MARGIN = 1.5
STARTUP_MIN_S = 120
BYTES_PER_PARAMETER = 2  # bf16; a quantized model is smaller, so the budget errs long

_PARAMS_IN_NAME = re.compile(r"(?i)(?:^|[-_/.])(?:(\d+)x)?(\d+(?:\.\d+)?)b(?=$|[-_.])")


def cache_type(spec: api.InferencePoolSpec) -> api.CacheType:
    return spec.model.cache.type


def prefetched(spec: api.InferencePoolSpec) -> bool:
    """The weights are fetched into a folder before vLLM starts (not by vLLM itself)."""
    kind = cache_type(spec)
    return kind in (api.CacheType.SHARED_VOLUME, api.CacheType.NODE_LOCAL) or (
        kind == api.CacheType.EMPTY_DIR and spec.model.source.object_store is not None)


def compile_shared(spec: api.InferencePoolSpec) -> bool:
    return (spec.model.cache.compile == api.CompileCache.SHARED
            and cache_type(spec) in (api.CacheType.SHARED_VOLUME, api.CacheType.NODE_LOCAL))


def model_slug(spec: api.InferencePoolSpec) -> str:
    """The model's folder name in a cache: the Hub id with '/' as '--' (the Hub's own cache
    spelling), or the bucket prefix's path."""
    store = spec.model.source.object_store
    raw = store.uri[len("s3://"):].strip("/") if store is not None else spec.model.name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw.replace("/", "--")).strip("-.") or "model"


def model_dir(spec: api.InferencePoolSpec) -> str:
    """Where a prefetched model's files are, inside the engine container."""
    return f"{MODEL_CACHE_DIR}/{model_slug(spec)}"


def source_id(spec: api.InferencePoolSpec) -> str:
    """What the prefetch fetches, as its marker records it."""
    store = spec.model.source.object_store
    return store.uri if store is not None else f"hf:{spec.model.name}@main"


def model_cache_pvc_name(pool: Pool) -> str:
    return names.child_name(pool.name, "model-cache")


def compile_cache_pvc_name(pool: Pool) -> str:
    return names.child_name(pool.name, "compile-cache")


def prefetch_name(pool: Pool) -> str:
    return names.child_name(pool.name, "prefetch")


# --- sizes and the startup probe --------------------------------------------------------------


def weights_bytes(spec: api.InferencePoolSpec) -> Decimal:
    """spec.model.size; else two bytes a parameter of the size in the name (Llama-3.1-8B,
    Mixtral-8x7B, Qwen2.5-0.5B); else the model cache's size (an upper bound)."""
    if spec.model.size is not None:
        return quantity_value(spec.model.size) or Decimal(0)
    match = _PARAMS_IN_NAME.search(spec.model.name)
    if match:
        experts = Decimal(match.group(1) or 1)
        return experts * Decimal(match.group(2)) * Decimal(10) ** 9 * BYTES_PER_PARAMETER
    return quantity_value(spec.runtime.storage.model_cache) or Decimal(0)


def _eager(spec: api.InferencePoolSpec, role: str) -> bool:
    args = {**spec.runtime.engine_args, **spec.role(role).engine_args}
    return any(args.get(k) is True for k in ("enforceEager", "enforce_eager", "enforce-eager"))


def load_seconds(spec: api.InferencePoolSpec) -> float:
    """Seconds to get the weights from where the cache keeps them into the engine (a
    prefetch that runs before the container starts is not counted: the probe starts after)."""
    gb = float(weights_bytes(spec)) / 1e9
    kind = cache_type(spec)
    if kind == api.CacheType.STREAMING:
        return gb / GBPS_STREAMING
    if kind == api.CacheType.SHARED_VOLUME or spec.model.source.pvc is not None:
        return gb / GBPS_NETWORK_VOLUME
    if kind == api.CacheType.NODE_LOCAL or prefetched(spec):
        return gb / GBPS_LOCAL_DISK
    return gb / GBPS_HUB + gb / GBPS_LOCAL_DISK  # vLLM downloads, then loads from the emptyDir


def startup_seconds(spec: api.InferencePoolSpec, role: str) -> int:
    """The startup probe's budget: spec.model.startupSeconds, else the worst case of a first
    start (cold compile) on this cache, with margin."""
    if spec.model.startup_seconds is not None:
        return spec.model.startup_seconds
    fixed = IMPORT_AND_INIT_S + VLLM_START_S
    if not _eager(spec, role):
        fixed += COMPILE_COLD_S + GRAPHS_S
    budget = max(STARTUP_MIN_S, math.ceil((fixed + load_seconds(spec)) * STARTUP_MARGIN))
    # A model.size near 8Ei would need more: the probe's fields are int32, as startupSeconds.
    return min(budget, INT32_MAX)


def startup_failure_threshold(spec: api.InferencePoolSpec, role: str) -> int:
    # (int32 too: the budget is, and the period is at least 1 s)
    return math.ceil(startup_seconds(spec, role) / STARTUP_PROBE_PERIOD)


# --- engine flags -----------------------------------------------------------------------------

# vLLM's default capture ceiling on H100/H200-class GPUs (min(2 x maxNumSeqs, 512)).
VLLM_DEFAULT_MAX_CAPTURE = 512
_USER_GRAPH_KEYS = ("maxCudagraphCaptureSize", "cudaGraphSizes", "compilationConfig",
                    "speculativeConfig", "enforceEager")


def _kebab(key: str) -> str:
    """The flag a key names, as the launcher reads it (runtime_image/launcher.py `kebab`, which
    the operator cannot import): maxModelLen, max_model_len, MAX_MODEL_LEN, --max-model-len
    and maxMODELLen are all max-model-len."""
    key = key.strip().lstrip("-")
    key = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", key)
    return key.replace("_", "-").lower()


def _has(args: dict[str, object], camel: str) -> bool:
    """The user sets this flag, in any spelling the launcher takes for it (adding ours too, the
    launcher would refuse the flag given twice)."""
    flag = _kebab(camel)
    return any(_kebab(k) == flag for k in args)


def engine_args(spec: api.InferencePoolSpec, role: str) -> dict[str, str]:
    """Engine arguments the cache and the role imply, unless the user set them:
    - Streaming: loadFormat runai_streamer;
    - decode (disaggregated): CUDA graphs captured up to maxNumSeqs, the largest batch a decode
      engine runs (one token a sequence), instead of vLLM's 2 x maxNumSeqs (up to 512):
      graphs above it are never replayed there, so capturing them only costs start-up time."""
    args = {**spec.runtime.engine_args, **spec.role(role).engine_args}
    out: dict[str, str] = {}
    if cache_type(spec) == api.CacheType.STREAMING and not _has(args, "loadFormat"):
        out["loadFormat"] = "runai_streamer"
    seqs = next((args[k] for k in ("maxNumSeqs", "max_num_seqs", "max-num-seqs") if k in args),
                None)
    if (role == Role.DECODE and isinstance(seqs, int) and not isinstance(seqs, bool)
            and seqs >= 1 and not any(_has(args, k) for k in _USER_GRAPH_KEYS)):
        out["maxCudagraphCaptureSize"] = str(min(seqs, VLLM_DEFAULT_MAX_CAPTURE))
    return out


def engine_model(spec: api.InferencePoolSpec) -> str | None:
    """The launcher's --model when the cache decides it (None: the Hub id or the PVC)."""
    if cache_type(spec) == api.CacheType.STREAMING:
        store = spec.model.source.object_store
        assert store is not None  # the API's rule
        return store.uri
    return model_dir(spec) if prefetched(spec) else None


# --- the fetch, as a container ---------------------------------------------------------------


def _store_env(spec: api.InferencePoolSpec) -> tuple[list[Obj], list[Obj]]:
    """(env, envFrom) for whatever reads the bucket, or the Hub's token."""
    env: list[Obj] = []
    env_from: list[Obj] = []
    store = spec.model.source.object_store
    if store is not None:
        if store.endpoint:
            env.append({"name": "AWS_ENDPOINT_URL", "value": store.endpoint})
        if store.credentials_secret:
            env_from.append({"secretRef": {"name": store.credentials_secret}})
    hf = spec.model.source.hugging_face
    if hf is not None and hf.token_secret is not None:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": hf.token_secret.name, "key": hf.token_secret.key}}})
    return env, env_from


def store_env(spec: api.InferencePoolSpec) -> tuple[list[Obj], list[Obj]]:
    """The engine container's share of it: the bucket's credentials when vLLM streams."""
    if cache_type(spec) != api.CacheType.STREAMING:
        return [], []
    return _store_env(spec)


def _fetch_command(spec: api.InferencePoolSpec, dest: str, *, then_sleep: bool = False,
                   wait: bool = False) -> list[str]:
    cmd = ["python3", f"{PREFETCH_DIR}/{PREFETCH_KEY}", "--dest", dest]
    if wait:
        return [*cmd, "--wait"]
    if then_sleep:
        cmd.append("--then-sleep")
    store = spec.model.source.object_store
    if store is not None:
        return [*cmd, "s3", "--uri", store.uri]
    return [*cmd, "hf", "--repo", spec.model.name]


def _fetch_container(spec: api.InferencePoolSpec, name: str, command: list[str],
                     mount: Obj, *, with_source: bool = True) -> Obj:
    env: list[Obj] = [{"name": "HOME", "value": "/tmp"},
                      {"name": "HF_HOME", "value": "/tmp/huggingface"}]
    env_from: list[Obj] = []
    if with_source:
        more, env_from = _store_env(spec)
        env += more
    container: Obj = {
        "name": name,
        "image": spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": command,
        "env": env,
        # A fetch is network and disk bound: a little CPU, no GPU.
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                      "limits": {"memory": "4Gi"}},
        "securityContext": {**_container_security(), "readOnlyRootFilesystem": True},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [mount,
                         {"name": PREFETCH_VOLUME, "mountPath": PREFETCH_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }
    if env_from:
        container["envFrom"] = env_from
    return container


def _fetch_volumes(pool: Pool) -> list[Obj]:
    return [{"name": PREFETCH_VOLUME,
             "configMap": {"name": prefetch_name(pool), "defaultMode": 0o444}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}}]


def _fetch_pod_spec(pool: Pool, containers: list[Obj], volumes: list[Obj]) -> Obj:
    spec = pool.spec
    pod: Obj = {"automountServiceAccountToken": False,
                "securityContext": _pod_security(),
                "containers": containers,
                "volumes": [*volumes, *_fetch_volumes(pool)]}
    if spec.runtime.node_selector:
        pod["nodeSelector"] = dict(sorted(spec.runtime.node_selector.items()))
    if spec.runtime.tolerations:
        pod["tolerations"] = [t.to_wire() for t in spec.runtime.tolerations]
    if spec.runtime.image_pull_secrets:
        pod["imagePullSecrets"] = [s.to_wire() for s in spec.runtime.image_pull_secrets]
    return pod


# --- the cache's own objects ------------------------------------------------------------------


def _annotated(obj: Obj, spec: api.InferencePoolSpec) -> Obj:
    obj["metadata"]["annotations"] = {SOURCE_ANNOTATION: source_id(spec)}
    return obj


def build_prefetch_configmap(pool: Pool) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(pool, prefetch_name(pool), CACHE_ROLE),
            "data": {PREFETCH_KEY: PREFETCH_SCRIPT}}


def _pvc(pool: Pool, name: str, size: int | str) -> Obj:
    shared = pool.spec.model.cache.shared_volume
    # ReadWriteMany: one writer (the Job), readers on any node.
    spec: Obj = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": size}}}
    if shared.storage_class_name:
        spec["storageClassName"] = shared.storage_class_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _meta(pool, name, CACHE_ROLE), "spec": spec}


def build_model_cache_pvc(pool: Pool) -> Obj:
    return _pvc(pool, model_cache_pvc_name(pool), pool.spec.runtime.storage.model_cache)


def build_compile_cache_pvc(pool: Pool) -> Obj:
    return _pvc(pool, compile_cache_pvc_name(pool), pool.spec.runtime.storage.compile_cache)


def build_prefetch_job(pool: Pool) -> Obj:
    """NAME-prefetch: fills the shared volume once. Its pod template is immutable, so the
    reconcile replaces the Job when the source changes (the annotation says which)."""
    spec = pool.spec
    mount = {"name": "model-cache", "mountPath": MODEL_CACHE_DIR}
    container = _fetch_container(spec, "prefetch", _fetch_command(spec, model_dir(spec)), mount)
    pvc = {"claimName": model_cache_pvc_name(pool)}
    pod = _fetch_pod_spec(pool, [container], [{"name": "model-cache",
                                               "persistentVolumeClaim": pvc}])
    pod["restartPolicy"] = "Never"
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": _meta(pool, prefetch_name(pool), CACHE_ROLE),
        "spec": {
            "backoffLimit": spec.model.cache.prefetch_backoff_limit,
            "template": {"metadata": {"labels": pod_labels(pool, CACHE_ROLE)}, "spec": pod},
        },
    }
    return _annotated(job, spec)


def _node_dir(spec: api.InferencePoolSpec, sub: str) -> str:
    return f"{spec.model.cache.node_local.path.rstrip('/')}/{sub}"


def build_prefetcher_daemonset(pool: Pool) -> Obj:
    """NAME-prefetch: one pod per node the engines may use; ready once its node's copy is."""
    spec = pool.spec
    models = _node_dir(spec, "models")
    # hostPath folders are created root-owned; the engines run as RUN_AS_USER. This container
    # alone runs as root, with CHOWN only, to hand them over.
    prepare: Obj = {
        "name": "prepare",
        "image": spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": ["sh", "-c", f"mkdir -p /node/models /node/compile && chown "
                    f"{RUN_AS_USER}:{RUN_AS_USER} /node/models /node/compile"],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                      "limits": {"memory": "64Mi"}},
        "securityContext": {"runAsUser": 0, "runAsNonRoot": False,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "node-cache", "mountPath": "/node"}],
    }
    mount = {"name": "node-models", "mountPath": MODEL_CACHE_DIR}
    fetch = _fetch_container(spec, "prefetch",
                             _fetch_command(spec, model_dir(spec), then_sleep=True), mount)
    fetch["readinessProbe"] = {"exec": {"command": ["test", "-f", f"{model_dir(spec)}/{MARKER}"]},
                               "periodSeconds": 10}
    fetch["resources"]["requests"]["cpu"] = "250m"
    pod = _fetch_pod_spec(pool, [fetch], [
        {"name": "node-cache", "hostPath": {
            "path": spec.model.cache.node_local.path, "type": "DirectoryOrCreate"}},
        {"name": "node-models", "hostPath": {"path": models, "type": "DirectoryOrCreate"}}])
    pod["initContainers"] = [prepare]
    pod["terminationGracePeriodSeconds"] = 5
    ds = {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": _meta(pool, prefetch_name(pool), CACHE_ROLE),
        "spec": {
            "selector": {"matchLabels": names.selector(pool.name, CACHE_ROLE)},
            "updateStrategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": {"metadata": {"labels": pod_labels(pool, CACHE_ROLE)}, "spec": pod},
        },
    }
    return _annotated(ds, spec)


def cache_children(pool: Pool) -> list[Obj]:
    """The cache's objects, in apply order (before the engines)."""
    spec = pool.spec
    kind = cache_type(spec)
    if not prefetched(spec):
        return []
    objs = [build_prefetch_configmap(pool)]
    if kind == api.CacheType.SHARED_VOLUME:
        objs.append(build_model_cache_pvc(pool))
        if compile_shared(spec):
            objs.append(build_compile_cache_pvc(pool))
        objs.append(build_prefetch_job(pool))
    elif kind == api.CacheType.NODE_LOCAL:
        objs.append(build_prefetcher_daemonset(pool))
    return objs


def possible_cache_children(pool: Pool) -> list[Obj]:
    """Every object any cache option could make (what the reconcile looks up to delete)."""
    return [build_prefetch_configmap(pool), build_model_cache_pvc(pool),
            build_compile_cache_pvc(pool), build_prefetch_job(pool),
            build_prefetcher_daemonset(pool)]


# --- the engine pod's side --------------------------------------------------------------------


@dataclass(frozen=True)
class EngineCache:
    """What the cache adds to an engine pod."""

    volumes: list[Obj]
    mounts: list[Obj]
    init_containers: list[Obj]
    emptydir_parts: list[int | str]  # sizes of the disk-backed emptyDirs it adds


def engine_cache(pool: Pool) -> EngineCache:
    """The engine pod's model and compile cache volumes (and the init container that fills or
    waits for the weights). A source.pvc pool mounts its PVC elsewhere (engine_pods)."""
    spec = pool.spec
    size = spec.runtime.storage
    kind = cache_type(spec)
    volumes: list[Obj] = []
    mounts: list[Obj] = []
    init: list[Obj] = []
    parts: list[int | str] = []
    if compile_shared(spec) and kind == api.CacheType.SHARED_VOLUME:
        volumes.append({"name": "compile-cache", "persistentVolumeClaim": {
            "claimName": compile_cache_pvc_name(pool)}})
    elif compile_shared(spec):
        volumes.append({"name": "compile-cache", "hostPath": {
            "path": _node_dir(spec, "compile"), "type": "Directory"}})
    else:
        volumes.append({"name": "compile-cache", "emptyDir": {"sizeLimit": size.compile_cache}})
        parts.append(size.compile_cache)
    mounts.append({"name": "compile-cache", "mountPath": COMPILE_CACHE_DIR})
    if spec.model.source.pvc is not None or kind == api.CacheType.STREAMING:
        return EngineCache(volumes, mounts, init, parts)
    model_mount: Obj = {"name": "model-cache", "mountPath": MODEL_CACHE_DIR}
    if kind == api.CacheType.SHARED_VOLUME:
        volumes.append({"name": "model-cache", "persistentVolumeClaim": {
            "claimName": model_cache_pvc_name(pool), "readOnly": True}})
        model_mount["readOnly"] = True
    elif kind == api.CacheType.NODE_LOCAL:
        volumes.append({"name": "model-cache", "hostPath": {
            "path": _node_dir(spec, "models"), "type": "Directory"}})
        model_mount["readOnly"] = True
        init.append(_fetch_container(spec, "wait-for-model", _fetch_command(
            spec, model_dir(spec), wait=True), model_mount, with_source=False))
    else:
        volumes.append({"name": "model-cache", "emptyDir": {"sizeLimit": size.model_cache}})
        parts.append(size.model_cache)
        if prefetched(spec):  # a bucket: copied in before vLLM starts
            init.append(_fetch_container(spec, "fetch-model", _fetch_command(
                spec, model_dir(spec)), {"name": "model-cache", "mountPath": MODEL_CACHE_DIR}))
    mounts.append(model_mount)
    if init:
        volumes.append({"name": PREFETCH_VOLUME,
                        "configMap": {"name": prefetch_name(pool), "defaultMode": 0o444}})
    return EngineCache(volumes, mounts, init, parts)


# --- readiness --------------------------------------------------------------------------------


def gates_engines(spec: api.InferencePoolSpec) -> bool:
    """The engine Deployments wait for the prefetch Job (SharedVolume)."""
    return cache_type(spec) == api.CacheType.SHARED_VOLUME


def job_succeeded(job: Obj | None, spec: api.InferencePoolSpec) -> bool:
    """The live Job fetched this spec's source and completed."""
    if job is None:
        return False
    annotations = job.get("metadata", {}).get("annotations") or {}
    if annotations.get(SOURCE_ANNOTATION) != source_id(spec):
        return False
    return any(c.get("type") in ("Complete", "SuccessCriteriaMet") and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


# --- the pool's ModelCached condition ---------------------------------------------------------

CACHED = "Cached"
PREFETCHING = "Prefetching"
PREFETCH_FAILED = "PrefetchFailed"
NO_NODES = "NoNodes"


@dataclass(frozen=True)
class CacheState:
    """ModelCached: True once the weights are where the engines read them."""

    ok: bool
    reason: str
    message: str


def _failure_detail(pods: list[Obj]) -> str:
    """The last line a failed prefetch pod wrote (its termination message)."""
    for pod in sorted(pods, key=lambda p: str(p.get("metadata", {}).get("creationTimestamp", "")),
                      reverse=True):
        if (pod.get("metadata", {}).get("labels") or {}).get(names.ROLE_LABEL) != CACHE_ROLE:
            continue
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        for cs in statuses:
            state = cs.get("state") or {}
            last = cs.get("lastState") or {}
            for terminated in (state.get("terminated"), last.get("terminated")):
                message = ((terminated or {}).get("message") or "").strip()
                if message and (terminated or {}).get("exitCode", 0) != 0:
                    return message.splitlines()[-1]
    return ""


def _crash_looping(pods: list[Obj]) -> bool:
    for pod in pods:
        if (pod.get("metadata", {}).get("labels") or {}).get(names.ROLE_LABEL) != CACHE_ROLE:
            continue
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if ((cs.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff":
                return True
    return False


def cache_state(pool: Pool, live: Obj | None, pods: list[Obj]) -> CacheState | None:
    """The ModelCached condition from the live Job (SharedVolume) or DaemonSet (NodeLocal)
    and the prefetch pods; None where nothing is prefetched for the pool to wait on."""
    spec = pool.spec
    kind = cache_type(spec)
    source, name = source_id(spec), prefetch_name(pool)
    if kind == api.CacheType.SHARED_VOLUME:
        where = f"PVC {model_cache_pvc_name(pool)}"
        status = (live or {}).get("status") or {}
        annotations = (live or {}).get("metadata", {}).get("annotations") or {}
        if annotations.get(SOURCE_ANNOTATION) != source:
            return CacheState(False, PREFETCHING, f"Job {name} is being created for {source}")
        if job_succeeded(live, spec):
            return CacheState(True, CACHED, f"Job {name} fetched {source} into {where}")
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        failed = conditions.get("Failed") or {}
        attempts = int(status.get("failed", 0))
        limit = spec.model.cache.prefetch_backoff_limit
        if failed.get("status") == "True":
            detail = _failure_detail(pods)
            message = (f"Job {name} failed to fetch {source} after {attempts} attempts: "
                       f"{failed.get('reason', 'Failed')}: {failed.get('message', '')}".rstrip())
            if detail:
                message += f"; last error: {detail}"
            return CacheState(False, PREFETCH_FAILED, message + "; engines are not started "
                              "(fix the source or its credentials; the Job is re-created when "
                              "the spec changes)")
        retry = f", {attempts} failed attempts of {limit + 1}" if attempts else ""
        detail = _failure_detail(pods) if attempts else ""
        return CacheState(False, PREFETCHING,
                          f"Job {name} is fetching {source} into {where}{retry}"
                          + (f" (last error: {detail})" if detail else "")
                          + "; engines start once it succeeds")
    if kind == api.CacheType.NODE_LOCAL:
        status = (live or {}).get("status") or {}
        desired, ready = int(status.get("desiredNumberScheduled", 0)), int(
            status.get("numberReady", 0))
        path = spec.model.cache.node_local.path
        if live is None or not status:
            return CacheState(False, PREFETCHING, f"DaemonSet {name} is being created")
        if desired == 0:
            return CacheState(False, NO_NODES, f"DaemonSet {name} runs on no node: none "
                              "matches runtime.nodeSelector and tolerations")
        if _crash_looping(pods):
            detail = _failure_detail(pods)
            return CacheState(False, PREFETCH_FAILED, f"DaemonSet {name} fails to fetch "
                              f"{source} into {path} ({ready}/{desired} nodes hold it)"
                              + (f": {detail}" if detail else ""))
        if ready >= desired:
            return CacheState(True, CACHED, f"{ready}/{desired} nodes hold {source} in {path}")
        return CacheState(False, PREFETCHING, f"DaemonSet {name}: {ready}/{desired} nodes hold "
                          f"{source} in {path}; an engine starts once its node does")
    return None
