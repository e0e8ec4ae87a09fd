"""The model and compile caches: `poolpilot render` of each cache option gives objects the
Kubernetes schemas accept, with the prefetch, the volumes, the flags and the startup probe
consistent; the reconcile holds the engines back until the prefetch Job succeeded; the
ModelCached condition says where the prefetch is."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from poolpilot.emulator import crd_validation
from poolpilot.operator import builders, model_cache, prefetch_script, reconcile, render, status

from poolpilot import api, crd, names
from poolpilot.validate import InvalidPool, parse_pool, parse_spec

ROOT = Path(__file__).resolve().parents[3]
K8S_VERSION = kubernetes_validate.latest_version()
UID = "6a1c1d4e-0000-4000-8000-00000000ca5e"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
HF = {"huggingFace": {"tokenSecret": {"name": "hf"}}}
S3 = {"objectStore": {"uri": "s3://models/llama-8b", "credentialsSecret": "s3-reader",
                      "endpoint": "http://minio:9000"}}
GPU_NODES = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
             "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                              "effect": "NoSchedule"}]}


def _doc(model: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"model": {"name": LLAMA, **model}, **spec}}


@dataclass(frozen=True)
class Option:
    id: str
    model: dict[str, Any]
    runtime: dict[str, Any] = field(default_factory=dict)
    kinds: tuple[str, ...] = ()  # the cache's own objects


OPTIONS = [
    Option("emptydir-hub", {"source": HF}),
    Option("emptydir-bucket", {"source": S3}, kinds=("ConfigMap",)),
    Option("shared-volume-hub", {"source": HF, "cache": {"type": "SharedVolume", "sharedVolume": {
        "storageClassName": "nfs"}}}, {"storage": {"modelCache": "40Gi"}},
        kinds=("ConfigMap", "PersistentVolumeClaim", "PersistentVolumeClaim", "Job")),
    Option("shared-volume-bucket-per-pod-compile", {"source": S3, "cache": {
        "type": "SharedVolume", "compile": "PerPod"}},
        kinds=("ConfigMap", "PersistentVolumeClaim", "Job")),
    Option("node-local", {"source": HF, "cache": {"type": "NodeLocal"}}, GPU_NODES,
           kinds=("ConfigMap", "DaemonSet")),
    Option("streaming", {"source": S3, "cache": {"type": "Streaming"}, "size": "16Gi"}),
]


def _rendered(option: Option, tmp_path: Path) -> list[dict[str, Any]]:
    """Through `poolpilot render`'s own path: a file, parsed, rendered to YAML, read back."""
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(_doc(option.model, runtime=option.runtime,
                                        decode={"engineArgs": {"maxNumSeqs": 128}})))
    pools = [builders.Pool(p.name, p.namespace, p.spec, uid=UID)
             for p in render.pools_from_file(path)]
    return list(yaml.safe_load_all(render.render(pools, builders.Capabilities(), "yaml")))


def _engines(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == "Deployment"
            and o["metadata"]["labels"][names.ROLE_LABEL] in names.ENGINE_ROLES]


def _engine(dep: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = dep["spec"]["template"]["spec"]["containers"][0]
    return c


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def _volume(pod: dict[str, Any], name: str) -> dict[str, Any]:
    v: dict[str, Any] = next(v for v in pod["volumes"] if v["name"] == name)
    return v


def _mount(container: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((m for m in container["volumeMounts"] if m["name"] == name), None)


@pytest.mark.parametrize("option", OPTIONS, ids=[o.id for o in OPTIONS])
def test_each_cache_option_renders_valid_consistent_manifests(option: Option,
                                                              tmp_path: Path) -> None:
    objs = _rendered(option, tmp_path)
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    cache_objs = [o["kind"] for o in objs
                  if o["metadata"]["labels"][names.ROLE_LABEL] == model_cache.CACHE_ROLE]
    assert sorted(cache_objs) == sorted(option.kinds)
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    spec = parse_spec(_doc(option.model, runtime=option.runtime)["spec"])
    for dep in _engines(objs):
        pod = dep["spec"]["template"]["spec"]
        c = _engine(dep)
        model = _flag(c["command"], "--model")
        claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                  if "persistentVolumeClaim" in v}
        # Every PVC and ConfigMap an engine pod mounts is one the pool renders.
        assert {("PersistentVolumeClaim", n) for n in claims} <= set(by_kind)
        for v in pod["volumes"]:
            if "configMap" in v:
                assert ("ConfigMap", v["configMap"]["name"]) in by_kind
        # The startup probe covers the derived budget and is far from the old 30 minutes.
        probe = c["startupProbe"]
        budget = probe["periodSeconds"] * probe["failureThreshold"]
        assert model_cache.startup_seconds(spec, "decode") <= budget < 15 * 60
        kind = spec.model.cache.type
        if kind == api.CacheType.STREAMING:
            assert model == "s3://models/llama-8b"
            assert "--engine-arg" in c["command"] and "loadFormat=runai_streamer" in c["command"]
            assert c["envFrom"] == [{"secretRef": {"name": "s3-reader"}}]
            assert _mount(c, "model-cache") is None
            continue
        cache = _volume(pod, "model-cache")
        if kind == api.CacheType.EMPTY_DIR:
            assert cache["emptyDir"]["sizeLimit"] == spec.runtime.storage.model_cache
            # /tmp 4Gi + compile 10Gi + model 100Gi: the scheduler finds the disk.
            assert c["resources"]["requests"]["ephemeral-storage"] == "114Gi"
        else:
            assert "ephemeral-storage" not in c["resources"]["requests"] or \
                c["resources"]["requests"]["ephemeral-storage"] in ("4Gi", "14Gi")
            assert _mount(c, "model-cache") == {"name": "model-cache",
                                                "mountPath": "/model-cache", "readOnly": True}
            assert {"name": "HF_HUB_OFFLINE", "value": "1"} in c["env"]
        if kind == api.CacheType.EMPTY_DIR and spec.model.source.object_store is None:
            assert model == LLAMA  # vLLM downloads it itself
            continue
        # Prefetched: the engine's --model is the folder the prefetch fills.
        fetchers = [*pod.get("initContainers", [])]
        if kind == api.CacheType.SHARED_VOLUME:
            job = by_kind[("Job", "p-prefetch")]
            fetchers = job["spec"]["template"]["spec"]["containers"]
            assert _volume(job["spec"]["template"]["spec"], "model-cache")[
                "persistentVolumeClaim"]["claimName"] == cache["persistentVolumeClaim"][
                "claimName"] == "p-model-cache"
            assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
            compile_cache = _volume(pod, "compile-cache")
            if spec.model.cache.compile == api.CompileCache.SHARED:
                assert compile_cache["persistentVolumeClaim"]["claimName"] == "p-compile-cache"
                pvc = by_kind[("PersistentVolumeClaim", "p-compile-cache")]
                assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
            else:
                assert "emptyDir" in compile_cache
        if kind == api.CacheType.NODE_LOCAL:
            ds = by_kind[("DaemonSet", "p-prefetch")]
            ds_pod = ds["spec"]["template"]["spec"]
            # The prefetcher runs on exactly the nodes the engines may run on.
            assert ds_pod["nodeSelector"] == pod["nodeSelector"]
            assert ds_pod["tolerations"] == pod["tolerations"]
            assert "nvidia.com/gpu" not in str(ds_pod["containers"][0]["resources"])
            assert _volume(ds_pod, "node-models")["hostPath"]["path"] == \
                cache["hostPath"]["path"] == "/var/lib/poolpilot/models"
            assert _volume(pod, "compile-cache")["hostPath"]["path"] == \
                "/var/lib/poolpilot/compile"
            marker = f"{model}/{model_cache.MARKER}"
            assert ds_pod["containers"][0]["readinessProbe"]["exec"]["command"] == \
                ["test", "-f", marker]
            (wait,) = pod["initContainers"]
            assert wait["command"][-1] == "--wait" and _flag(wait["command"], "--dest") == model
        for fetcher in fetchers:
            if "--wait" in fetcher["command"]:
                continue
            assert _flag(fetcher["command"], "--dest") == model
            mount = next(m for m in fetcher["volumeMounts"] if model.startswith(m["mountPath"]))
            assert not mount.get("readOnly")
            if spec.model.source.object_store is not None:
                assert _flag(fetcher["command"], "--uri") == "s3://models/llama-8b"
                assert fetcher["envFrom"] == [{"secretRef": {"name": "s3-reader"}}]
            else:
                assert _flag(fetcher["command"], "--repo") == LLAMA
                assert any(e["name"] == "HF_TOKEN" for e in fetcher["env"])
        script = by_kind[("ConfigMap", "p-prefetch")]["data"][model_cache.PREFETCH_KEY]
        assert script == Path(prefetch_script.__file__).read_text()


def test_the_decode_role_captures_graphs_up_to_its_batch_only(tmp_path: Path) -> None:
    objs = _rendered(OPTIONS[0], tmp_path)
    commands = {d["metadata"]["labels"][names.ROLE_LABEL]: _engine(d)["command"]
                for d in _engines(objs)}
    assert "maxCudagraphCaptureSize=128" in commands["decode"]
    assert not any("Cudagraph" in a for a in commands["prefill"])


@dataclass(frozen=True)
class ArgsCase:
    id: str
    role_args: dict[str, Any]
    role: str
    expected: dict[str, str]


ARGS = [
    ArgsCase("decode-bounded", {"maxNumSeqs": 64}, "decode", {"maxCudagraphCaptureSize": "64"}),
    ArgsCase("decode-above-vllm-ceiling", {"maxNumSeqs": 1024}, "decode",
             {"maxCudagraphCaptureSize": "512"}),
    ArgsCase("decode-snake-case", {"max_num_seqs": 32}, "decode",
             {"maxCudagraphCaptureSize": "32"}),
    ArgsCase("user-sizes-win", {"maxNumSeqs": 64, "compilationConfig": {"level": 3}}, "decode", {}),
    ArgsCase("speculative-decoding-left-alone", {"maxNumSeqs": 64,
                                                 "speculativeConfig": {"num_speculative_tokens":
                                                                       3}}, "decode", {}),
    ArgsCase("eager-left-alone", {"maxNumSeqs": 64, "enforceEager": True}, "decode", {}),
    ArgsCase("no-max-num-seqs", {}, "decode", {}),
    ArgsCase("prefill-left-alone", {"maxNumSeqs": 64}, "prefill", {}),
]


@pytest.mark.parametrize("case", ARGS, ids=[c.id for c in ARGS])
def test_engine_args_the_cache_and_role_imply(case: ArgsCase) -> None:
    spec = parse_spec({"model": {"name": LLAMA}, case.role: {"engineArgs": case.role_args}})
    assert model_cache.engine_args(spec, case.role) == case.expected


def test_streaming_keeps_a_load_format_the_user_chose() -> None:
    spec = parse_spec({"model": {"name": LLAMA, "source": S3, "cache": {"type": "Streaming"}},
                       "runtime": {"engineArgs": {"load_format": "runai_streamer_sharded"}}})
    assert "loadFormat" not in model_cache.engine_args(spec, "prefill")


@pytest.mark.parametrize(("name", "gb"), [
    ("meta-llama/Llama-3.1-8B-Instruct", 16), ("meta-llama/Llama-3.1-70B-Instruct", 140),
    ("Qwen/Qwen2.5-0.5B-Instruct", 1), ("mistralai/Mixtral-8x7B-v0.1", 112),
    ("Qwen/Qwen3-30B-A3B", 60), ("openai/gpt-oss-120b", 240),
], ids=["8b", "70b", "0.5b", "8x7b", "moe-total", "lowercase"])
def test_weights_size_from_the_name(name: str, gb: int) -> None:
    spec = parse_spec({"model": {"name": name}})
    assert round(float(model_cache.weights_bytes(spec)) / 1e9) == gb


def test_weights_size_falls_back_to_the_spec_then_the_cache_size() -> None:
    assert model_cache.weights_bytes(parse_spec({"model": {"name": "org/model", "size": "8Gi"}})) \
        == 8 * 2**30
    assert model_cache.weights_bytes(parse_spec({"model": {"name": "org/model"}})) == 100 * 2**30


def _budget(model: dict[str, Any], **spec: Any) -> int:
    return model_cache.startup_seconds(parse_spec({"model": {"name": LLAMA, **model}, **spec}),
                                       "decode")


def test_startup_budget_follows_the_cache_and_the_size() -> None:
    hub = _budget({})
    node = _budget({"cache": {"type": "NodeLocal"}})
    shared = _budget({"cache": {"type": "SharedVolume"}})
    stream = _budget({"source": S3, "cache": {"type": "Streaming"}})
    assert node < shared < hub and node < stream < hub
    # The measured parts (import, graphs, 16 GB from a cold disk) with margin, at the least.
    measured = (5.5 + 0.4 + 5.7 + 16.06 / 1.4) * model_cache.STARTUP_MARGIN
    assert node > measured
    assert hub < 30 * 60  # the old fixed 30 minutes
    assert _budget({"name": "meta-llama/Llama-3.1-70B-Instruct"}) > hub
    eager = _budget({}, decode={"engineArgs": {"enforceEager": True}})
    assert eager < hub  # no compile, no graphs
    assert _budget({"startupSeconds": 600}) == 600


@dataclass(frozen=True)
class Bad:
    id: str
    model: dict[str, Any]
    field: str


BAD = [
    Bad("streaming-needs-a-bucket", {"cache": {"type": "Streaming"}}, "spec.model.cache.type"),
    Bad("pvc-is-already-shared", {"source": {"pvc": {"claimName": "w"}},
                                  "cache": {"type": "SharedVolume"}}, "spec.model.cache.type"),
    Bad("one-source", {"source": {**HF, **S3}}, "spec.model.source.objectStore"),
    Bad("s3-only", {"source": {"objectStore": {"uri": "gs://bucket/m"}}},
        "spec.model.source.objectStore.uri"),
    Bad("unknown-cache", {"cache": {"type": "Tmpfs"}}, "spec.model.cache.type"),
    Bad("relative-node-path", {"cache": {"type": "NodeLocal", "nodeLocal": {"path": "cache"}}},
        "spec.model.cache.nodeLocal.path"),
    Bad("startup-too-short", {"startupSeconds": 5}, "spec.model.startupSeconds"),
]


@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_bad_cache_specs_are_refused_by_the_models_and_the_crd(case: Bad) -> None:
    doc = _doc(case.model)
    with pytest.raises(InvalidPool) as exc:
        parse_pool(doc)
    assert any(case.field in e for e in exc.value.errors), exc.value.errors
    _, errors = crd_validation.validate(crd.build_crd(), doc)
    assert any(case.field in e for e in errors), errors


# --- the reconcile holds the engines back until the Job succeeded ---------------------------


class MemoryCluster:
    """Objects by (apiVersion, kind, name); applies replace, deletes are recorded."""

    def __init__(self, pool: builders.Pool) -> None:
        self.objs: dict[tuple[str, str, str], dict[str, Any]] = {
            (api.API_VERSION, api.KIND, pool.name): {"metadata": {"name": pool.name,
                                                                  "uid": pool.uid}}}
        self.deleted: list[str] = []

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        return copy.deepcopy(self.objs.get((api_version, kind, name)))

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        key = (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
        live = copy.deepcopy(obj)
        if key in self.objs and "status" in self.objs[key]:
            live["status"] = self.objs[key]["status"]
        self.objs[key] = live
        return copy.deepcopy(live)

    async def delete(self, obj: dict[str, Any]) -> None:
        self.objs.pop((obj["apiVersion"], obj["kind"], obj["metadata"]["name"]))
        self.deleted.append(f"{obj['kind']}/{obj['metadata']['name']}")

    async def apply_size(self, namespace: str, name: str, replicas: int,
                         api_version: str = "apps/v1", kind: str = "Deployment") -> None:
        self.objs[(api_version, kind, name)]["spec"]["replicas"] = replicas

    def job_finished(self, condition: str, **counts: int) -> None:
        """What the Job controller writes when the pod ends."""
        job = self.objs[("batch/v1", "Job", "p-prefetch")]
        job["status"] = {**counts, "conditions": [
            {"type": condition, "status": "True", "reason": "BackoffLimitExceeded"
             if condition == "Failed" else "Completed", "message": "Job has reached the "
             "specified backoff limit" if condition == "Failed" else ""}]}

    def has(self, kind: str, name: str) -> bool:
        return any(k[1:] == (kind, name) for k in self.objs)


def _shared(model: str = LLAMA, cache: str = "SharedVolume") -> builders.Pool:
    spec = parse_spec({"model": {"name": model, "cache": {"type": cache}}})
    return builders.Pool("p", "ns", spec, uid=UID)


def _reconcile(cluster: MemoryCluster, pool: builders.Pool) -> reconcile.ReconcileResult:
    return asyncio.run(reconcile.reconcile(cluster, pool, builders.Capabilities()))


def test_engines_start_only_after_the_prefetch_job_succeeded() -> None:
    pool = _shared()
    cluster = MemoryCluster(pool)
    out = _reconcile(cluster, pool)
    assert cluster.has("Job", "p-prefetch") and cluster.has("PersistentVolumeClaim",
                                                             "p-model-cache")
    assert not cluster.has("Deployment", "p-prefill") and not cluster.has("Deployment",
                                                                          "p-decode")
    assert cluster.has("Deployment", "p-router")  # the rest of the pool is there
    assert out.waiting is not None and "p-prefetch" in out.waiting
    state = model_cache.cache_state(pool, out.model_cache, [])
    assert state is not None and (state.ok, state.reason) == (False, "Prefetching")

    cluster.job_finished("Complete", succeeded=1)
    out = _reconcile(cluster, pool)
    assert cluster.has("Deployment", "p-prefill") and cluster.has("Deployment", "p-decode")
    assert out.waiting is None
    state = model_cache.cache_state(pool, out.model_cache, [])
    assert state is not None and (state.ok, state.reason) == (True, "Cached")
    assert _reconcile(cluster, pool).writes == 0  # converged: no more writes


def test_a_new_model_replaces_the_job_and_keeps_the_old_engines_until_it_is_fetched() -> None:
    pool = _shared()
    cluster = MemoryCluster(pool)
    _reconcile(cluster, pool)
    cluster.job_finished("Complete", succeeded=1)
    _reconcile(cluster, pool)
    old_command = cluster.objs[("apps/v1", "Deployment", "p-decode")]["spec"]["template"]
    qwen = _shared("Qwen/Qwen2.5-7B-Instruct")
    out = _reconcile(cluster, qwen)
    assert "Job/p-prefetch" in cluster.deleted  # its pod template is immutable
    job = cluster.objs[("batch/v1", "Job", "p-prefetch")]
    assert "status" not in job and "Qwen/Qwen2.5-7B-Instruct" in job["spec"]["template"]["spec"][
        "containers"][0]["command"]
    # The old engines keep serving the old model meanwhile.
    assert cluster.objs[("apps/v1", "Deployment", "p-decode")]["spec"]["template"] == old_command
    assert out.deployments["decode"] is not None
    cluster.job_finished("Complete", succeeded=1)
    _reconcile(cluster, qwen)
    decode = cluster.objs[("apps/v1", "Deployment", "p-decode")]
    assert "/model-cache/Qwen--Qwen2.5-7B-Instruct" in decode["spec"]["template"]["spec"][
        "containers"][0]["command"]


def test_turning_the_cache_off_deletes_its_objects() -> None:
    pool = _shared()
    cluster = MemoryCluster(pool)
    _reconcile(cluster, pool)
    _reconcile(cluster, _shared(cache="NodeLocal"))
    assert {"Job/p-prefetch", "PersistentVolumeClaim/p-model-cache",
            "PersistentVolumeClaim/p-compile-cache"} <= set(cluster.deleted)
    assert cluster.has("DaemonSet", "p-prefetch")
    assert cluster.has("Deployment", "p-decode")  # NodeLocal engines wait in their pods
    _reconcile(cluster, _shared(cache="EmptyDir"))
    assert {"DaemonSet/p-prefetch", "ConfigMap/p-prefetch"} <= set(cluster.deleted)


# --- the ModelCached condition -----------------------------------------------------------------


def _job(pool: builders.Pool, **status_: Any) -> dict[str, Any]:
    job = model_cache.build_prefetch_job(pool)
    job["status"] = status_
    return job


def _failed_pod(message: str) -> dict[str, Any]:
    return {"metadata": {"name": "p-prefetch-x", "labels": names.labels("p", "model-cache")},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "prefetch", "state": {
                "terminated": {"exitCode": 1, "message": f"Traceback...\n{message}"}}}]}}


def _crashing_pod() -> dict[str, Any]:
    return {"metadata": {"name": "p-prefetch-y", "labels": names.labels("p", "model-cache")},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": "prefetch", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "message": "401 Unauthorized"}}}]}}


@dataclass(frozen=True)
class StateCase:
    id: str
    cache: str
    live: Any  # pool -> the live Job or DaemonSet
    pods: list[dict[str, Any]]
    ok: bool | None  # None: no condition
    reason: str = ""
    says: str = ""


STATES = [
    StateCase("no-prefetch", "EmptyDir", lambda p: None, [], None),
    StateCase("job-created", "SharedVolume", lambda p: None, [], False, "Prefetching"),
    StateCase("job-running", "SharedVolume", lambda p: _job(p, active=1), [], False,
              "Prefetching", "engines start once it succeeds"),
    StateCase("job-retrying", "SharedVolume", lambda p: _job(p, active=1, failed=1),
              [_failed_pod("prefetch of hf:x failed: HTTPError: 503")], False, "Prefetching",
              "1 failed attempts of 4 (last error: prefetch of hf:x failed: HTTPError: 503)"),
    StateCase("job-failed", "SharedVolume", lambda p: _job(p, failed=4, conditions=[
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"}]),
        [_failed_pod("prefetch of hf:x failed: GatedRepoError: 403")], False, "PrefetchFailed",
        "BackoffLimitExceeded: Job has reached the specified backoff limit; last error: "
        "prefetch of hf:x failed: GatedRepoError: 403"),
    StateCase("job-complete", "SharedVolume", lambda p: _job(p, succeeded=1, conditions=[
        {"type": "Complete", "status": "True"}]), [], True, "Cached", "into PVC p-model-cache"),
    StateCase("job-of-another-model", "SharedVolume", lambda p: {
        **_job(p, succeeded=1, conditions=[{"type": "Complete", "status": "True"}]),
        "metadata": {"annotations": {model_cache.SOURCE_ANNOTATION: "hf:other@main"}}},
        [], False, "Prefetching"),
    StateCase("nodes-filling", "NodeLocal", lambda p: {"status": {
        "desiredNumberScheduled": 3, "numberReady": 1}}, [], False, "Prefetching",
        "1/3 nodes hold"),
    StateCase("nodes-full", "NodeLocal", lambda p: {"status": {
        "desiredNumberScheduled": 3, "numberReady": 3}}, [], True, "Cached", "3/3 nodes"),
    StateCase("no-node", "NodeLocal", lambda p: {"status": {
        "desiredNumberScheduled": 0, "numberReady": 0}}, [], False, "NoNodes", "nodeSelector"),
    StateCase("prefetcher-crashing", "NodeLocal", lambda p: {"status": {
        "desiredNumberScheduled": 2, "numberReady": 1}}, [_crashing_pod()], False,
        "PrefetchFailed", "401 Unauthorized"),
]


@pytest.mark.parametrize("case", STATES, ids=[c.id for c in STATES])
def test_model_cached_condition(case: StateCase) -> None:
    pool = _shared(cache=case.cache)
    state = model_cache.cache_state(pool, case.live(pool), case.pods)
    if case.ok is None:
        assert state is None
        return
    assert state is not None and (state.ok, state.reason) == (case.ok, case.reason), state
    assert case.says in state.message


def test_the_condition_comes_goes_and_warns_once_on_failure() -> None:
    common = {"generation": 1, "roles": [], "pods": [], "endpoint": "e",
              "now": "2026-01-01T00:00:00Z"}
    fetching = status.compute_status(previous=None, model_cached=model_cache.CacheState(
        False, "Prefetching", "Job p-prefetch is fetching"), **common)
    conds = {c["type"]: c for c in fetching.status["conditions"]}
    assert conds["ModelCached"]["status"] == "False"
    failed = status.compute_status(previous=fetching.status, model_cached=model_cache.CacheState(
        False, "PrefetchFailed", "Job p-prefetch failed"), **common)
    assert [(e.type, e.reason) for e in failed.events
            if e.reason == "PrefetchFailed"] == [("Warning", "PrefetchFailed")]
    again = status.compute_status(previous=failed.status, model_cached=model_cache.CacheState(
        False, "PrefetchFailed", "Job p-prefetch failed"), **common)
    assert not [e for e in again.events if e.reason == "PrefetchFailed"]
    off = status.compute_status(previous=failed.status, model_cached=None, **common)
    assert "ModelCached" not in {c["type"] for c in off.status["conditions"]}
    # The pool's status with it is one the CRD's status schema accepts.
    api.InferencePoolStatus.model_validate(failed.status)


# --- the prefetch program ----------------------------------------------------------------------


class FakeS3:
    """list_objects_v2 pages and download_file, as boto3's client has them."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.downloads: list[str] = []

    def get_paginator(self, name: str) -> Any:
        assert name == "list_objects_v2"
        objects = self.objects

        class Pages:
            def paginate(self, Bucket: str, Prefix: str) -> list[dict[str, Any]]:
                keys = sorted(k for k in objects if k.startswith(Prefix))
                return [{"Contents": [{"Key": k, "Size": len(objects[k])} for k in keys[:2]]},
                        {"Contents": [{"Key": k, "Size": len(objects[k])} for k in keys[2:]]}]

        return Pages()

    def download_file(self, bucket: str, key: str, path: str) -> None:
        self.downloads.append(key)
        Path(path).write_bytes(self.objects[key])


def test_the_bucket_fetch_copies_the_prefix_and_resumes(tmp_path: Path) -> None:
    store = FakeS3({"llama/config.json": b"{}", "llama/model-1.safetensors": b"x" * 10,
                    "llama/model-2.safetensors": b"y" * 20, "llama/sub/tok.json": b"t",
                    "other/file": b"no"})
    dest = tmp_path / "m"
    dest.mkdir()
    assert prefetch_script.fetch_s3("s3://bucket/llama/", dest, store) == (4, 33)
    assert (dest / "sub" / "tok.json").read_bytes() == b"t"
    assert not (dest / "file").exists()
    (dest / "model-2.safetensors").write_bytes(b"y")  # a crash mid-file
    store.downloads.clear()
    prefetch_script.fetch_s3("s3://bucket/llama", dest, store)
    assert store.downloads == ["llama/model-2.safetensors"]  # only the incomplete one
    with pytest.raises(RuntimeError, match="no objects under this prefix"):
        prefetch_script.fetch_s3("s3://bucket/missing", dest, store)


def test_the_marker_says_which_source_is_complete(tmp_path: Path) -> None:
    assert not prefetch_script.complete(tmp_path, "hf:a@main")
    prefetch_script.mark_complete(tmp_path, "hf:a@main", 3, 100)
    assert prefetch_script.complete(tmp_path, "hf:a@main")
    assert not prefetch_script.complete(tmp_path, "hf:b@main")
    assert prefetch_script.split_s3("s3://b") == ("b", "")


def test_the_engines_wait_ends_when_the_marker_appears(tmp_path: Path) -> None:
    said: list[str] = []
    ticks = iter(range(100))

    def sleep(_: float) -> None:
        if len(said) == 3:
            prefetch_script.mark_complete(tmp_path, "s", 1, 1)

    prefetch_script.wait(tmp_path, 5.0, said.append, clock=lambda: float(next(ticks)),
                         sleep=sleep)
    assert len(said) == 3 and "waiting for" in said[0]


def test_a_failed_fetch_exits_1_with_one_line_saying_why(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> Any:
        raise PermissionError("AccessDenied: s3:ListBucket")

    monkeypatch.setattr(prefetch_script, "fetch_s3", refuse)
    rc = prefetch_script.main(["--dest", str(tmp_path / "m"), "s3", "--uri", "s3://b/m"])
    assert rc == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "prefetch of s3://b/m failed: PermissionError: AccessDenied: s3:ListBucket")
    assert not (tmp_path / "m" / prefetch_script.MARKER).exists()
