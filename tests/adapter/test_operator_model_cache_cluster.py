"""The model cache against the Kubernetes API emulator, with the operator running (Kopf in a
thread): a SharedVolume pool gets its PVCs and prefetch Job, the Job's status drives the pool's
ModelCached condition, and the engine Deployments are created only once the Job succeeded.

The emulator stores Jobs but runs no Job controller, so the test writes the Job's status as the
Job controller would (active, failed and succeeded counts, the Failed or Complete condition).
On a real cluster (KUBECONFIG_E2E) the Job controller would race those writes: skipped there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from poolpilot.operator.handlers import OperatorConfig
from poolpilot.testkit.cluster import cluster_from_env
from poolpilot.testkit.operator import Kubectl, install, running_operator
from poolpilot.testkit.polling import wait_for

pytestmark = [pytest.mark.adapter, pytest.mark.cluster]

NS = "cache"
CONFIG = OperatorConfig(drift_interval=1.0, cutover_poll=0.3, request_timeout=10.0)
LLAMA, QWEN = "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-7B-Instruct"


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    with cluster_from_env(tmp_path_factory.mktemp("kube")) as (kubeconfig, emu):
        if emu is None:
            pytest.skip("writes the Job's status itself: needs a cluster without a Job "
                        "controller (the emulator)")
        k = Kubectl(kubeconfig)
        install(k)
        k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        with running_operator(Path(kubeconfig), CONFIG, standalone=True):
            yield k


def pool(model: str, cache: str = "SharedVolume") -> dict[str, Any]:
    return {"apiVersion": "poolpilot.dev/v1alpha1", "kind": "InferencePool",
            "metadata": {"name": "cached", "namespace": NS},
            "spec": {"model": {"name": model, "cache": {"type": cache}},
                     "prefill": {"gpus": 0}, "decode": {"gpus": 0}}}


def condition(k: Kubectl) -> dict[str, Any] | None:
    obj = k.get("inferencepools.poolpilot.dev", "cached", NS) or {}
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c["type"] == "ModelCached"), None)


def has(reason: str) -> Any:
    return lambda k: (condition(k) or {}).get("reason") == reason


def job_status(k: Kubectl, status: dict[str, Any]) -> None:
    """What the Job controller writes."""
    k("patch", "jobs", "cached-prefetch", "-n", NS, "--subresource=status", "--type=merge",
      "-p", json.dumps({"status": status}))


def engines(k: Kubectl) -> list[str]:
    return [n for n in ("cached-prefill", "cached-decode") if k.get("deployments", n, NS)]


def test_the_prefetch_job_gates_the_engines_and_drives_model_cached(kubectl: Kubectl) -> None:
    k = kubectl
    k.apply(pool(LLAMA))
    wait_for(lambda: k.get("jobs", "cached-prefetch", NS) and has("Prefetching")(k),
             what="the prefetch Job and ModelCached=False Prefetching")
    assert k.get("persistentvolumeclaims", "cached-model-cache", NS) is not None
    assert k.get("deployments", "cached-router", NS) is not None
    assert engines(k) == []  # no engine holds a GPU while the weights download

    # A failed attempt, retried: still fetching, the attempt counted.
    job_status(k, {"active": 1, "failed": 1})
    wait_for(lambda: "1 failed attempts of 4" in (condition(k) or {}).get("message", ""),
             what="the retry in the message")
    # The backoff limit reached: PrefetchFailed with the Job's own reason, a Warning Event.
    job_status(k, {"active": 0, "failed": 4, "conditions": [{
        "type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
        "message": "Job has reached the specified backoff limit",
        "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
    wait_for(lambda: has("PrefetchFailed")(k), what="ModelCached=False PrefetchFailed")
    assert "BackoffLimitExceeded" in (condition(k) or {})["message"]
    wait_for(lambda: [e for e in k.list("events", NS) if e.get("reason") == "PrefetchFailed"
                      and e.get("type") == "Warning"], what="the PrefetchFailed Event")
    assert engines(k) == []

    # A new model: the Job is replaced (its pod template is immutable) and starts over.
    old_uid = (k.get("jobs", "cached-prefetch", NS) or {})["metadata"]["uid"]
    k.apply(pool(QWEN))
    wait_for(lambda: ((k.get("jobs", "cached-prefetch", NS) or {}).get("metadata", {})
                      .get("uid") not in (None, old_uid)) and has("Prefetching")(k),
             what="a new Job for the new model")
    job_status(k, {"succeeded": 1, "conditions": [{
        "type": "Complete", "status": "True", "reason": "CompletionsReached", "message": "",
        "lastTransitionTime": "2026-01-01T00:01:00Z"}]})
    wait_for(lambda: has("Cached")(k) and len(engines(k)) == 2,
             what="ModelCached=True and the engine Deployments")
    assert (condition(k) or {})["status"] == "True"
    decode = k.get("deployments", "cached-decode", NS) or {}
    pod = decode["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    assert command[command.index("--model") + 1] == "/model-cache/Qwen--Qwen2.5-7B-Instruct"
    assert {"name": "model-cache", "persistentVolumeClaim": {
        "claimName": "cached-model-cache", "readOnly": True}} in pod["volumes"]

    # Back to per-pod caches: the cache's objects go, and so does the condition.
    k.apply(pool(QWEN, cache="EmptyDir"))
    wait_for(lambda: k.get("jobs", "cached-prefetch", NS) is None
             and k.get("persistentvolumeclaims", "cached-model-cache", NS) is None
             and k.get("configmaps", "cached-prefetch", NS) is None
             and condition(k) is None, what="the cache removed")
