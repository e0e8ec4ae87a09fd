"""Invalid InferencePool specs are rejected by the models AND by the generated CRD (OpenAPI
schema + CEL), each with a message naming the field."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from poolpilot.emulator import crd_validation
from poolpilot.operator import builders
from poolpilot.runtime import launcher

from poolpilot import api, crd, re2
from poolpilot.roles import Role
from poolpilot.validate import InvalidPool, parse_pool, parse_spec

EXAMPLES = sorted([*Path(__file__).parents[2].joinpath("examples").glob("*.yaml"),
                   *Path(__file__).parents[2].joinpath("examples", "model-cache").glob("*.yaml")])
CRD = crd.build_crd()


def pool(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}}
    base.update(spec)
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": base,
    }


@dataclass(frozen=True)
class Bad:
    id: str
    doc: dict[str, Any]
    field: str  # the path both the models and the CRD must name
    in_crd: bool = True  # expressible in the CRD schema/CEL
    extra: dict[str, Any] = field(default_factory=dict)


def _condition(type_: str, status: str, reason: str = "AsExpected") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}


BAD = [
    Bad("min-greater-than-max", pool(decode={"minReplicas": 3, "maxReplicas": 2, "replicas": 2}),
        "spec.decode.maxReplicas"),
    Bad("replicas-above-max", pool(prefill={"replicas": 9, "maxReplicas": 8}),
        "spec.prefill.replicas"),
    Bad("replicas-below-min", pool(prefill={"replicas": 1, "minReplicas": 2}),
        "spec.prefill.replicas"),
    Bad("unknown-mode", pool(mode="Split"), "spec.mode"),
    Bad("unknown-connector", pool(kvTransfer={"connector": "MooncakeConnector"}),
        "spec.kvTransfer.connector"),
    Bad("ttft-quantile-one", pool(slo={"ttft": {"quantile": 1.0, "seconds": 1}}),
        "spec.slo.ttft.quantile"),
    Bad("ttft-quantile-zero", pool(slo={"ttft": {"quantile": 0, "seconds": 1}}),
        "spec.slo.ttft.quantile"),
    Bad("itl-quantile-above-one", pool(slo={"itl": {"quantile": 1.5, "seconds": 0.05}}),
        "spec.slo.itl.quantile"),
    Bad("negative-ttft-seconds", pool(slo={"ttft": {"quantile": 0.9, "seconds": -1}}),
        "spec.slo.ttft.seconds"),
    Bad("zero-itl-seconds", pool(slo={"itl": {"quantile": 0.9, "seconds": 0}}),
        "spec.slo.itl.seconds"),
    Bad("gpus-below-tp", pool(decode={"gpus": 2, "tensorParallelSize": 4}), "spec.decode.gpus"),
    Bad("cpu-with-tp", pool(prefill={"gpus": 0, "tensorParallelSize": 2}), "spec.prefill.gpus"),
    Bad("empty-model-name", pool(model={"name": ""}), "spec.model.name"),
    Bad("missing-model", {**pool(), "spec": {"mode": "Aggregated"}}, "spec.model"),
    Bad("unknown-spec-field", pool(replicas=3), "spec.replicas"),
    Bad("unknown-nested-field", pool(prefill={"replica": 2}), "spec.prefill.replica"),
    Bad("negative-replicas", pool(decode={"replicas": -1, "minReplicas": 0}),
        "spec.decode.replicas"),
    Bad("max-replicas-zero", pool(engine={"maxReplicas": 0, "minReplicas": 0, "replicas": 0}),
        "spec.engine.maxReplicas"),
    Bad("zero-tp", pool(prefill={"tensorParallelSize": 0}), "spec.prefill.tensorParallelSize"),
    Bad("min-zero-without-scale-to-zero", pool(decode={"minReplicas": 0}),
        "spec.autoscaling.scaleToZero"),
    Bad("unknown-autoscaling-mode", pool(autoscaling={"mode": "Auto"}),
        "spec.autoscaling.mode"),
    Bad("interval-zero", pool(autoscaling={"intervalSeconds": 0}),
        "spec.autoscaling.intervalSeconds"),
    Bad("negative-window",
        pool(autoscaling={"scaleDown": {"stabilizationWindowSeconds": -5, "maxStep": 1,
                                        "cooldownSeconds": 0}}),
        "spec.autoscaling.scaleDown.stabilizationWindowSeconds"),
    Bad("max-step-zero",
        pool(autoscaling={"scaleUp": {"stabilizationWindowSeconds": 0, "maxStep": 0,
                                      "cooldownSeconds": 0}}),
        "spec.autoscaling.scaleUp.maxStep"),
    Bad("kv-usage-above-one", pool(autoscaling={"targets": {"kvCacheUsage": 1.5}}),
        "spec.autoscaling.targets.kvCacheUsage"),
    Bad("both-sources", pool(model={"name": "m", "source": {"huggingFace": {},
                                                           "pvc": {"claimName": "w"}}}),
        "spec.model.source.pvc"),
    Bad("pvc-without-claim", pool(model={"name": "m", "source": {"pvc": {"path": "/m"}}}),
        "spec.model.source.pvc.claimName"),
    Bad("bad-pull-policy", pool(runtime={"imagePullPolicy": "Sometimes"}),
        "spec.runtime.imagePullPolicy"),
    Bad("string-replicas", pool(decode={"replicas": "two"}), "spec.decode.replicas"),
    Bad("router-zero-replicas", pool(router={"replicas": 0}), "spec.router.replicas"),
    Bad("other-projects-group",
        {**pool(), "apiVersion": "inference.networking.k8s.io/v1"}, "apiVersion", in_crd=False),
    Bad("uppercase-name", {**pool(), "metadata": {"name": "Llama"}}, "metadata.name"),
    Bad("resource-name-unqualified", pool(prefill={"resources": {"requests": {"x": 1}}}),
        "spec.prefill.resources.requests"),
    Bad("resource-name-with-spaces",
        pool(runtime={"resources": {"limits": {"Bad Name!": "1"}}}),
        "spec.runtime.resources.limits"),
    Bad("request-above-limit",
        pool(decode={"resources": {"requests": {"memory": "1025Mi"}, "limits": {"memory": "1Gi"}}}),
        "spec.decode.resources.requests"),
    Bad("request-above-integer-limit",
        pool(runtime={"resources": {"requests": {"cpu": "2500m"}, "limits": {"cpu": 2}}}),
        "spec.runtime.resources.requests"),
    # Once accepted by `validate` while the cluster, the CRD or the launcher refused.
    Bad("replicas-beyond-int32",
        pool(prefill={"replicas": 3_000_000_000, "maxReplicas": 3_000_000_000}),
        "spec.prefill.replicas"),
    Bad("gpus-beyond-int32", pool(decode={"gpus": 3_000_000_000}), "spec.decode.gpus"),
    Bad("replicas-past-int64", pool(decode={"replicas": 2**64}), "spec.decode.replicas"),
    Bad("cpu-lots", pool(runtime={"resources": {"requests": {"cpu": "lots"}}}),
        "spec.runtime.resources.requests.cpu"),
    Bad("negative-memory", pool(engine={"resources": {"limits": {"memory": "-1Gi"}}}),
        "spec.engine.resources.limits.memory"),
    # Kubernetes caps a quantity at 2^63-1 (a request no node meets): refused here with the
    # field named; the CRD's pattern cannot bound the number.
    Bad("quantity-past-int64", pool(decode={"resources": {"limits": {"memory": "9Ei"}}}),
        "spec.decode.resources.limits.memory", in_crd=False),
    Bad("quantity-exponent-overflow",
        pool(prefill={"resources": {"requests": {"memory": "1e9999999"}}}),
        "spec.prefill.resources.requests.memory", in_crd=False),
    # The CPU offload tier: the decode engines receive their prompts' KV; a size is a quantity
    Bad("offload-on-decode", pool(decode={"kvOffload": "64Gi"}), "spec.decode.kvOffload"),
    Bad("offload-negative", pool(prefill={"kvOffload": "-1Gi"}), "spec.prefill.kvOffload"),
    Bad("offload-not-a-size", pool(engine={"kvOffload": "lots"}), "spec.engine.kvOffload"),
    # pinned host memory inside the engine container: a limit at or below it crash-loops
    Bad("offload-above-the-roles-memory-limit",
        pool(prefill={"kvOffload": "256Gi", "resources": {"limits": {"memory": "64Gi"}}}),
        "spec.prefill.kvOffload"),
    Bad("offload-equal-to-the-runtimes-memory-limit",
        pool(prefill={"kvOffload": "256Gi"},
             runtime={"resources": {"limits": {"memory": "262144Mi"}}}),
        "spec.prefill.kvOffload"),
    Bad("offload-in-bytes-above-an-aggregated-engines-limit",
        pool(mode="Aggregated",
             engine={"kvOffload": 68719476736, "resources": {"limits": {"memory": "32Gi"}}}),
        "spec.engine.kvOffload"),
    Bad("prefix-index-of-nothing", pool(router={"prefixIndexEntries": 0}),
        "spec.router.prefixIndexEntries"),
    Bad("negative-prefill-hold", pool(router={"prefillHoldSeconds": -1}),
        "spec.router.prefillHoldSeconds"),
    Bad("prefill-hold-of-an-hour-and-more", pool(router={"prefillHoldSeconds": 3601}),
        "spec.router.prefillHoldSeconds"),
    Bad("prefill-hold-in-words", pool(router={"prefillHoldSeconds": "a bit"}),
        "spec.router.prefillHoldSeconds"),
    Bad("float-quantity", pool(router={"resources": {"requests": {"cpu": 0.5}}}),
        "spec.router.resources.requests.cpu"),
    Bad("gpu-in-limits", pool(prefill={"resources": {"limits": {"nvidia.com/gpu": 2}}}),
        "spec.prefill.resources.limits"),
    Bad("env-name", pool(runtime={"env": [{"name": "1 BAD=NAME", "value": "x"}]}),
        "spec.runtime.env[0].name"),
    Bad("toleration-exists-with-value",
        pool(runtime={"tolerations": [{"key": "gpu", "operator": "Exists", "value": "a100"}]}),
        "spec.runtime.tolerations[0].value"),
    Bad("toleration-no-key-equal", pool(runtime={"tolerations": [{"value": "a100"}]}),
        "spec.runtime.tolerations[0].operator"),
    Bad("toleration-seconds-without-noexecute",
        pool(runtime={"tolerations": [{"key": "k", "effect": "NoSchedule",
                                       "tolerationSeconds": 5}]}),
        "spec.runtime.tolerations[0].tolerationSeconds"),
    Bad("toleration-bad-key", pool(runtime={"tolerations": [{"key": "a b", "operator": "Exists"}]}),
        "spec.runtime.tolerations[0].key"),
    Bad("engine-args-tensor-parallel", pool(runtime={"engineArgs": {"tensorParallelSize": 4}}),
        "spec.runtime.engineArgs.tensorParallelSize"),
    Bad("role-engine-args-port", pool(decode={"engineArgs": {"port": 9000}}),
        "spec.decode.engineArgs.port"),
    Bad("engine-args-kebab-served-name",
        pool(engine={"engineArgs": {"served-model-name": "x"}}),
        "spec.engine.engineArgs.served-model-name"),
    Bad("connector-config-kv-role", pool(kvTransfer={"extraConfig": {"kv_role": "kv_both"}}),
        "spec.kvTransfer.extraConfig.kv_role"),
    Bad("connector-extra-config-not-object",
        pool(kvTransfer={"extraConfig": {"kv_connector_extra_config": "x"}}),
        "spec.kvTransfer.extraConfig"),
    Bad("replicas-quoted", pool(decode={"replicas": "3"}), "spec.decode.replicas"),
    Bad("replicas-true", pool(decode={"replicas": True}), "spec.decode.replicas"),
    Bad("replicas-float", pool(decode={"replicas": 15.0, "maxReplicas": 16}),
        "spec.decode.replicas"),
    Bad("enabled-quoted", pool(autoscaling={"enabled": "true"}), "spec.autoscaling.enabled"),
    Bad("quantile-quoted", pool(slo={"ttft": {"quantile": "0.9", "seconds": 1}}),
        "spec.slo.ttft.quantile"),
    Bad("seconds-infinite", pool(slo={"ttft": {"quantile": 0.9, "seconds": float("inf")}}),
        "spec.slo.ttft.seconds"),
    Bad("seconds-nan", pool(slo={"itl": {"quantile": 0.9, "seconds": float("nan")}}),
        "spec.slo.itl.seconds"),
    Bad("engine-arg-infinite", pool(runtime={"engineArgs": {"x": float("inf")}}),
        "spec.runtime.engineArgs.x"),
    Bad("null-required-model", pool(model=None), "spec.model"),
    Bad("null-list-item", pool(runtime={"tolerations": [None]}), "spec.runtime.tolerations[0]"),
    Bad("name-with-dot", {**pool(), "metadata": {"name": "team.chat"}}, "metadata.name"),
    Bad("name-60-characters", {**pool(), "metadata": {"name": "a" * 60}}, "metadata.name"),
    Bad("name-41-characters", {**pool(), "metadata": {"name": "a" * 41}}, "metadata.name"),
    Bad("name-starts-with-digit", {**pool(), "metadata": {"name": "8b-llama"}}, "metadata.name"),
    Bad("name-trailing-newline", {**pool(), "metadata": {"name": "llama\n"}}, "metadata.name"),
    Bad("unknown-top-level-field", {**pool(), "spce": {}}, "spce"),
    Bad("unknown-null-field", pool(modee=None), "spec.modee"),
    Bad("duplicate-condition-types",
        {**pool(), "status": {"conditions": [_condition("Ready", "True"),
                                             _condition("Ready", "False")]}},
        "status.conditions"),
    # metav1.Condition: reason, message and lastTransitionTime are required, reason CamelCase.
    Bad("condition-without-reason",
        {**pool(), "status": {"conditions": [{"type": "Ready", "status": "True", "message": "",
                                              "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
        "status.conditions[0].reason"),
    Bad("condition-reason-not-camel-case",
        {**pool(), "status": {"conditions": [_condition("Ready", "True", reason="all ready")]}},
        "status.conditions[0].reason"),
    Bad("condition-without-transition-time",
        {**pool(), "status": {"conditions": [{"type": "Ready", "status": "True",
                                              "reason": "AllReady", "message": ""}]}},
        "status.conditions[0].lastTransitionTime"),
    Bad("pod-template-owned-label",
        pool(podTemplate={"metadata": {"labels": {"poolpilot.dev/pool-uid": "x"}}}),
        "spec.podTemplate.metadata.labels"),
    Bad("pod-template-container-image",
        pool(podTemplate={"spec": {"containers": [{"name": "engine", "image": "x"}]}}),
        "spec.podTemplate.spec.containers[0].image"),
    Bad("prefill-grace-below-the-kv-lease",
        pool(prefill={"terminationGracePeriodSeconds": 30}),
        "spec.prefill.terminationGracePeriodSeconds"),
    # The API server knows the wire's camelCase names only (a snake_case one it would refuse,
    # or prune with --validate=false, running another pool than the one validated).
    Bad("snake-case-field", pool(decode={"max_replicas": 3}), "spec.decode.max_replicas"),
    Bad("snake-case-null-field", pool(decode={"max_replicas": None}),
        "spec.decode.max_replicas"),
    # A field's own bound, not Int32's (it used to override them: 70000 passed, and the
    # Deployments were refused).
    Bad("side-channel-port-above-65535", pool(kvTransfer={"sideChannelPort": 70000}),
        "spec.kvTransfer.sideChannelPort"),
    Bad("prefetch-backoff-limit-above-20",
        pool(model={"name": "x/y", "cache": {"prefetchBackoffLimit": 21}}),
        "spec.model.cache.prefetchBackoffLimit"),
    *(Bad(f"side-channel-port-{port}", pool(kvTransfer={"sideChannelPort": port}),
          "spec.kvTransfer.sideChannelPort") for port in (8000, 8090, 5557, 5558)),
    Bad("runtime-env-owned-variable",
        pool(runtime={"env": [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "1.2.3.4"}]}),
        "spec.runtime.env", in_crd=False),
    Bad("engine-arg-shutdown-timeout", pool(runtime={"engineArgs": {"shutdownTimeout": 30}}),
        "spec.runtime.engineArgs.shutdownTimeout"),
    Bad("storage-beyond-one-quantity",
        pool(runtime={"storage": {"modelCache": "7Ei", "compileCache": "7Ei"}}),
        "spec.runtime.storage", in_crd=False),
    Bad("pod-template-mount-owned-path-unnormalised",
        pool(podTemplate={"spec": {"volumes": [{"name": "v", "emptyDir": {}}], "containers": [
            {"name": "engine", "volumeMounts": [{"name": "v", "mountPath": "//tmp"}]}]}}),
        "spec.podTemplate.spec.containers[0].volumeMounts", in_crd=False),
    Bad("precise-routing-with-own-kv-events-config",
        pool(router={"prefixRouting": "Precise"},
             prefill={"engineArgs": {"kvEventsConfig": {"publisher": "zmq"}}}),
        "spec", in_crd=False),
    # engine args whose ranks the pod's GPUs cannot hold (models only: free-form maps)
    Bad("pipeline-stages-beyond-the-pods-gpus",
        pool(prefill={"gpus": 1, "engineArgs": {"pipelineParallelSize": 2}}), "spec",
        in_crd=False),
    Bad("data-parallel-ranks-beyond-the-pods-gpus",
        pool(runtime={"engineArgs": {"data_parallel_size": 4}}, decode={"gpus": 2}), "spec",
        in_crd=False),
    Bad("pipeline-that-does-not-divide-a-groups-ranks",
        pool(prefill={"nodesPerReplica": 2, "gpus": 2, "tensorParallelSize": 2,
                      "engineArgs": {"pipeline-parallel-size": 3}}), "spec", in_crd=False),
    Bad("pipeline-size-not-a-number",
        pool(decode={"engineArgs": {"pipelineParallelSize": "two"}}), "spec", in_crd=False),
    Bad("precise-routing-without-prefix-caching",
        pool(router={"prefixRouting": "Precise"},
             runtime={"engineArgs": {"enable-prefix-caching": False}}), "spec", in_crd=False),
    # B7: the memory limit a pod template gives the engine container is the one it runs with
    Bad("offload-above-the-pool-templates-memory-limit",
        pool(mode="Aggregated", engine={"kvOffload": "256Gi"},
             podTemplate={"spec": {"containers": [
                 {"name": "engine", "resources": {"limits": {"memory": "16Gi"}}}]}}),
        "spec.engine.kvOffload"),
    Bad("offload-above-the-roles-template-memory-limit-over-a-larger-role-limit",
        pool(prefill={"kvOffload": "256Gi", "resources": {"limits": {"memory": "512Gi"}},
                      "podTemplate": {"spec": {"containers": [
                          {"name": "engine", "resources": {"limits": {"memory": "16Gi"}}}]}}}),
        "spec.prefill.kvOffload"),
    # B5: a request above the limit another layer lays over it (models only: merged layers)
    Bad("request-above-the-roles-limit",
        pool(mode="Aggregated", runtime={"resources": {"requests": {"memory": "64Gi"}}},
             engine={"resources": {"limits": {"memory": "32Gi"}}}), "spec", in_crd=False),
    Bad("roles-request-above-the-runtimes-limit",
        pool(mode="Aggregated", runtime={"resources": {"limits": {"cpu": "2"}}},
             engine={"resources": {"requests": {"cpu": "4"}}}), "spec", in_crd=False),
    Bad("request-above-the-templates-limit",
        pool(runtime={"resources": {"requests": {"ephemeral-storage": "200Gi"}}},
             decode={"podTemplate": {"spec": {"containers": [
                 {"name": "engine", "resources": {"limits": {"ephemeral-storage": "150Gi"}}}]}}}),
        "spec", in_crd=False),
    Bad("router-request-above-its-templates-limit",
        pool(router={"resources": {"requests": {"memory": "4Gi"}}, "podTemplate": {"spec": {
            "containers": [{"name": "router", "resources": {"limits": {"memory": "1Gi"}}}]}}}),
        "spec", in_crd=False),
    # B6: resources Kubernetes never overcommits
    Bad("extended-resource-without-a-limit",
        pool(runtime={"resources": {"requests": {"amd.com/gpu": 1}}}),
        "spec.runtime.resources.limits"),
    Bad("hugepages-without-a-limit",
        pool(runtime={"resources": {"requests": {"hugepages-2Mi": "1Gi", "memory": "1Gi"}}}),
        "spec.runtime.resources.limits"),
    Bad("extended-resource-request-below-its-limit",
        pool(prefill={"resources": {"requests": {"example.com/fpga": 1},
                                    "limits": {"example.com/fpga": 2}}}),
        "spec.prefill.resources.requests"),
    Bad("extended-resource-in-millis", pool(runtime={"resources": {"limits": {
        "example.com/fpga": "500m"}}}), "spec.runtime.resources.limits"),
    Bad("extended-resource-request-and-limit-of-two-layers",
        pool(runtime={"resources": {"requests": {"example.com/fpga": 1},
                                    "limits": {"example.com/fpga": 1}}},
             decode={"resources": {"limits": {"example.com/fpga": 2}}}), "spec", in_crd=False),
    Bad("hugepages-not-a-whole-number-of-pages",
        pool(runtime={"resources": {"limits": {"hugepages-2Mi": "3Mi", "memory": "1Gi"}}}),
        "spec.runtime.resources.limits"),
    Bad("hugepages-request-in-millis-of-a-page",
        pool(decode={"resources": {"requests": {"hugepages-1Gi": "1500Mi"},
                                   "limits": {"hugepages-1Gi": "1500Mi", "memory": "4Gi"}}}),
        "spec.decode.resources.requests"),
    Bad("template-hugepages-not-a-whole-number-of-pages",
        pool(runtime={"resources": {"requests": {"memory": "8Gi"}}},
             podTemplate={"spec": {"containers": [
                 {"name": "engine", "resources": {"limits": {"hugepages-2Mi": "5Mi"}}}]}}),
        "spec.podTemplate.spec.containers[0].resources.limits"),
    Bad("hugepages-of-a-page-size-0",
        pool(runtime={"resources": {"limits": {"hugepages-0": "1Gi", "memory": "1Gi"}}}),
        "spec.runtime.resources.limits"),
    Bad("hugepages-without-cpu-or-memory",
        pool(runtime={"resources": {"limits": {"hugepages-2Mi": "1Gi"}}}), "spec", in_crd=False),
    # B15: what the API server refuses in the rendered objects
    Bad("node-selector-key-not-a-qualified-name", pool(runtime={"nodeSelector": {"a b": "c"}}),
        "spec.runtime.nodeSelector"),
    Bad("template-node-selector-key-not-a-qualified-name",
        pool(podTemplate={"spec": {"nodeSelector": {"a b": "c"}}}),
        "spec.podTemplate.spec.nodeSelector"),
    Bad("label-key-prefix-of-254", pool(podTemplate={"metadata": {"labels": {
        "a" * 254 + "/x": "v"}}}), "spec.podTemplate.metadata.labels"),
    Bad("mount-of-no-volume",
        pool(podTemplate={"spec": {"containers": [
            {"name": "engine", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}]}}),
        "spec", in_crd=False),
    Bad("annotations-past-256-kib",
        pool(podTemplate={"metadata": {"annotations": {"a": "x" * 300_000}}}),
        "spec", in_crd=False),
    Bad("node-local-path-with-dot-dot",
        pool(model={"name": "m", "cache": {"type": "NodeLocal",
                                          "nodeLocal": {"path": "/var/../etc"}}}),
        "spec.model.cache.nodeLocal.path"),
    *(Bad(f"node-local-path-{name}",
          pool(model={"name": "m", "cache": {"type": "NodeLocal", "nodeLocal": {"path": path}}}),
          "spec.model.cache.nodeLocal.path")
      for name, path in [("the-nodes-root", "/"), ("the-root-spelt-with-dots", "/./"),
                         ("a-system-folder", "/etc"), ("below-the-kubelets", "/var/lib/kubelet/x"),
                         ("with-a-dot", "/data/./cache")]),
    Bad("gateway-parent-twice", pool(gateway={"parentRefs": [{"name": "gw"}, {"name": "gw"}]}),
        "spec.gateway.parentRefs"),
    Bad("gateway-parent-with-and-without-a-section",
        pool(gateway={"parentRefs": [{"name": "gw"}, {"name": "gw", "sectionName": "https"}]}),
        "spec.gateway.parentRefs"),
    Bad("kv-offload-on-a-cpu-engine", pool(prefill={"gpus": 0, "kvOffload": "64Gi"}),
        "spec.prefill.kvOffload"),
    # LeaderWorkerSet's worker pods carry NAME-prefill-lws-GROUP-<hash> as a label value (63).
    Bad("multinode-name-too-long-for-its-groups",
        {**pool(prefill={"nodesPerReplica": 2}), "metadata": {"name": "a" * 39}},
        "spec.prefill.nodesPerReplica"),
    Bad("multinode-name-too-long-for-100-groups",
        {**pool(decode={"nodesPerReplica": 2, "maxReplicas": 101}),
         "metadata": {"name": "a" * 38}}, "spec.decode.nodesPerReplica"),
]


def test_a_fields_own_bounds_are_the_ones_enforced() -> None:
    """Int32's int32 maximum comes with the type; a field that declares a tighter one must end
    up with that one (pydantic keeps the last of several)."""
    import annotated_types as at
    from pydantic import BaseModel

    seen: set[type[BaseModel]] = set()

    def walk(cls: type[BaseModel]) -> None:
        if cls in seen:
            return
        seen.add(cls)
        for name, info in cls.model_fields.items():
            uppers = [m.le for m in info.metadata if isinstance(m, at.Le)]
            lowers = [m.ge for m in info.metadata if isinstance(m, at.Ge)]
            assert not uppers or uppers[-1] == min(uppers), (cls.__name__, name, uppers)
            assert not lowers or lowers[-1] == max(lowers), (cls.__name__, name, lowers)
            for t in (info.annotation, *_args(info.annotation)):
                if isinstance(t, type) and issubclass(t, BaseModel):
                    walk(t)

    walk(api.InferencePool)
    assert len(seen) > 20


def _args(t: Any) -> list[Any]:
    import typing

    out = []
    for a in typing.get_args(t):
        out += [a, *_args(a)]
    return out


def test_multinode_names_that_fit_and_unused_roles_are_accepted() -> None:
    parse_pool({**pool(prefill={"nodesPerReplica": 2}), "metadata": {"name": "a" * 38}})
    # an Aggregated pool does not run the prefill role it has a section for
    parse_pool({**pool(mode="Aggregated", prefill={"nodesPerReplica": 2}),
                "metadata": {"name": "a" * 40}})
    _, errors = crd_validation.validate(
        CRD, {**pool(mode="Aggregated", prefill={"nodesPerReplica": 2}),
              "metadata": {"name": "a" * 40}})
    assert not errors, errors


def test_precise_routing_conflicts_name_the_engine_arg() -> None:
    with pytest.raises(InvalidPool) as exc:
        parse_pool(pool(router={"prefixRouting": "Precise"},
                        decode={"engineArgs": {"enable_prefix_caching": False}}))
    assert "decode.engineArgs.enable_prefix_caching" in exc.value.errors[0], exc.value.errors
    # the same engine args without Precise routing are the user's to set
    parse_pool(pool(decode={"engineArgs": {"enable_prefix_caching": False,
                                           "kvEventsConfig": {"publisher": "zmq"}}}))


@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_models_reject_and_name_the_field(case: Bad) -> None:
    with pytest.raises(InvalidPool) as exc:
        parse_pool(case.doc)
    assert any(e.startswith(f"{case.field}:") for e in exc.value.errors), exc.value.errors


@pytest.mark.parametrize("case", [c for c in BAD if c.in_crd], ids=[c.id for c in BAD if c.in_crd])
def test_crd_rejects_and_names_the_field(case: Bad) -> None:
    _, errors = crd_validation.validate(CRD, case.doc)
    assert errors, "the CRD accepted a spec the models reject"
    assert any(case.field in e for e in errors), errors


def test_at_least_twenty_bad_specs() -> None:
    assert len([c for c in BAD if c.in_crd]) >= 20


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_are_valid_for_models_and_crd(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    parsed = parse_pool(doc)
    defaulted, errors = crd_validation.validate(CRD, doc)
    assert errors == []
    # The API server's defaulting fills the same values the models do.
    assert _prune(defaulted["spec"]) == _prune(parsed.spec.to_wire())


def _prune(value: Any) -> Any:
    """Drop empty maps and lists: for Kubernetes, empty and unset mean the same."""
    if isinstance(value, dict):
        pruned = {k: _prune(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in ({}, [])}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def test_defaults_a_user_expects() -> None:
    spec = parse_pool(pool()).spec
    assert spec.mode == "Disaggregated"
    assert spec.kv_transfer.connector == "NixlConnector"
    assert (spec.slo.ttft.quantile, spec.slo.ttft.seconds) == (0.9, 1.0)
    assert spec.autoscaling.scale_to_zero is False
    assert spec.decode.max_replicas == 16
    assert spec.served_name() == "meta-llama/Llama-3.1-8B-Instruct"


# --- accepted by both, the same way (each refused, coerced or crashing in earlier versions) ---


@dataclass(frozen=True)
class Good:
    id: str
    doc: dict[str, Any]


GOOD = [
    Good("nulls-mean-unset", pool(prefill=None, runtime={"image": None, "env": None,
                                                         "nodeSelector": {"a": None},
                                                         "engineArgs": {"maxModelLen": None}})),
    Good("integer-quantities", pool(runtime={"resources": {"requests": {"cpu": 4, "memory": "32Gi"},
                                                          "limits": {"cpu": "4500m"}}})),
    Good("requests-equal-to-limits-in-other-units",
         pool(runtime={"resources": {"requests": {"cpu": "2000m", "memory": "1024Mi",
                                                  "example.com/fpga": 1},
                                     "limits": {"cpu": 2, "memory": "1Gi",
                                                "example.com/fpga": "1",
                                                "hugepages-2Mi": "1Gi"}}})),
    Good("engine-arg-past-int64", pool(runtime={"engineArgs": {"seed": 2**70}})),
    Good("offload-on-prefill-and-aggregated", pool(prefill={"kvOffload": "256Gi"},
                                                   engine={"kvOffload": 68719476736})),
    Good("offload-within-the-roles-limit-over-a-smaller-runtime-limit",
         pool(prefill={"kvOffload": "256Gi", "resources": {"limits": {"memory": "320Gi"}}},
              runtime={"resources": {"limits": {"memory": "64Gi"}}})),
    Good("offload-of-a-role-the-mode-does-not-run",
         pool(mode="Aggregated",
              prefill={"kvOffload": "256Gi", "resources": {"limits": {"memory": "64Gi"}}})),
    Good("offload-on-decode-of-an-aggregated-pool",
         pool(mode="Aggregated", decode={"kvOffload": "64Gi"})),
    Good("request-and-limit-of-two-layers-in-order",
         pool(runtime={"resources": {"requests": {"memory": "16Gi"}}},
              prefill={"resources": {"limits": {"memory": "32Gi"}}},
              podTemplate={"spec": {"containers": [
                  {"name": "engine", "resources": {"limits": {"example.com/fpga": 1}}}]}})),
    Good("router-request-above-the-default-limit",
         pool(router={"resources": {"requests": {"memory": "4Gi"}}})),
    Good("hugepages-with-memory-from-another-layer",
         pool(runtime={"resources": {"requests": {"memory": "8Gi"}}},
              podTemplate={"spec": {"containers": [
                  {"name": "engine", "resources": {"limits": {"hugepages-2Mi": "1Gi"}}}]}})),
    Good("hugepages-in-whole-pages",
         pool(runtime={"resources": {"limits": {"hugepages-2Mi": 4194304, "hugepages-1Gi": "2Gi",
                                                "hugepages-64Ki": "1Mi", "memory": "1Gi"}}})),
    Good("extended-resources-of-kubernetes-io-are-overcommitted",
         pool(runtime={"resources": {"requests": {"example.kubernetes.io/x": "500m"}}})),
    Good("mount-of-a-roles-volume-from-the-roles-template",
         pool(prefill={"podTemplate": {"spec": {
             "volumes": [{"name": "data", "emptyDir": {}}],
             "containers": [{"name": "engine",
                             "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}}})),
    Good("gateway-parent-by-two-sections",
         pool(gateway={"parentRefs": [{"name": "gw", "sectionName": "http"},
                                      {"name": "gw", "sectionName": "https"},
                                      {"name": "gw", "namespace": "other"}]})),
    Good("label-key-prefix-of-253",
         pool(podTemplate={"metadata": {"labels": {"a" * 253 + "/x": "v"}}})),
    Good("name-40-characters", {**pool(), "metadata": {"name": "a" * 40}}),
    Good("toleration-exists-without-key", pool(runtime={"tolerations": [{"operator": "Exists"}]})),
    Good("toleration-noexecute-seconds",
         pool(runtime={"tolerations": [{"key": "k", "value": "v", "effect": "NoExecute",
                                        "tolerationSeconds": 30}]})),
    Good("env-with-dots-and-dashes", pool(runtime={"env": [{"name": "my.var-1", "value": ""}]})),
    Good("connector-extra-config-object",
         pool(kvTransfer={"extraConfig": {"kv_connector_extra_config": {"a": 1},
                                          "kv_buffer_device": "cpu"}})),
]


@pytest.mark.parametrize("case", GOOD, ids=[c.id for c in GOOD])
def test_models_and_crd_accept_and_default_alike(case: Good) -> None:
    parsed = parse_pool(case.doc)
    defaulted, errors = crd_validation.validate(CRD, case.doc)
    assert errors == []
    assert _prune(_no_nulls(defaulted["spec"])) == _prune(parsed.spec.to_wire())


def _no_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    return value


def test_null_fields_take_their_defaults() -> None:
    spec = parse_pool(pool(prefill=None, decode={"replicas": None, "maxReplicas": 4})).spec
    assert (spec.prefill.replicas, spec.decode.replicas, spec.decode.max_replicas) == (1, 1, 4)
    defaulted, _ = crd_validation.validate(CRD, pool(decode={"replicas": None}))
    assert defaulted["spec"]["decode"]["replicas"] == 1


# --- every failed rule, with the real values -------------------------------------------------


def test_every_failed_rule_is_reported_by_models_and_crd() -> None:
    doc = pool(prefill={"minReplicas": 3, "maxReplicas": 2, "replicas": 5},
               decode={"minReplicas": 0},
               runtime={"tolerations": [{"operator": "Exists", "value": "v",
                                         "tolerationSeconds": 5}]})
    fields = {
        "spec.prefill.maxReplicas", "spec.prefill.replicas", "spec.autoscaling.scaleToZero",
        "spec.runtime.tolerations[0].value", "spec.runtime.tolerations[0].tolerationSeconds",
    }
    with pytest.raises(InvalidPool) as exc:
        parse_pool(doc)
    _, crd_errors = crd_validation.validate(CRD, doc)
    assert {e.split(": ")[0] for e in exc.value.errors} == fields
    assert {e.split(": ")[0] for e in crd_errors} == fields
    # The same words from both, with the numbers filled in.
    assert sorted(exc.value.errors) == sorted(crd_errors)
    assert "spec.prefill.replicas: must be within [minReplicas, maxReplicas] (3..2); set " \
           "replicas inside the bounds" in crd_errors


def test_rules_report_together_with_field_errors() -> None:
    with pytest.raises(InvalidPool) as exc:
        parse_spec({"model": {"name": "m"}, "modee": "x",
                    "decode": {"minReplicas": 3, "maxReplicas": 2, "replicas": 2}})
    assert [e.split(":")[0] for e in exc.value.errors] == [
        "spec.modee", "spec.decode.maxReplicas", "spec.decode.replicas"]


def test_crd_messages_have_no_placeholders() -> None:
    text = json.dumps(CRD)
    for rule in _rules(crd_validation.version_schema(CRD)):
        assert "{" not in rule["message"], rule
        if "{" in rule.get("messageExpression", ""):
            pytest.fail(f"placeholder left in {rule}")
    assert "({minReplicas}" not in text


def test_message_expressions_say_what_the_models_say() -> None:
    for rule in api.EngineRoleSpec.rules:
        if rule.placeholders():
            assert rule.to_crd()["messageExpression"].startswith(f"'{rule.field}: ")
    role = api.EngineRoleSpec.model_construct(min_replicas=3, max_replicas=2, replicas=5)
    doc = pool(engine={"minReplicas": 3, "maxReplicas": 2, "replicas": 5}, mode="Aggregated")
    _, errors = crd_validation.validate(CRD, doc)
    for rule in api.EngineRoleSpec.rules[:2]:
        assert f"spec.engine.{rule.field}: {rule.render(role)}" in errors


def _rules(schema: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(schema, dict):
        found += schema.get("x-kubernetes-validations", [])
        for value in schema.values():
            found += _rules(value)
    elif isinstance(schema, list):
        for value in schema:
            found += _rules(value)
    return found


# --- the emulator's validator takes any JSON without raising ----------------------------------


@pytest.mark.parametrize(
    "doc",
    [
        pool(decode={"replicas": 2**63}),
        pool(decode={"replicas": -(2**64)}),
        pool(runtime={"engineArgs": {"seed": 2**64, "nested": {"big": [2**100]}}}),
        {**pool(), "metadata": {"name": "p", "generation": 2**70}},
    ],
    ids=["replicas-2^63", "replicas-minus-2^64", "engine-args-2^64", "metadata-2^70"],
)
def test_crd_validation_takes_huge_integers(doc: dict[str, Any]) -> None:
    crd_validation.validate(CRD, doc)  # raised ValueError('overflow') in earlier versions


def test_crd_validation_takes_deep_free_form_values() -> None:
    deep: Any = 1
    for _ in range(5000):
        deep = {"a": deep}
    _, errors = crd_validation.validate(CRD, pool(runtime={"engineArgs": {"deep": deep}}))
    assert errors == []


# --- reserved keys: exactly what the engine launcher owns -------------------------------------


def test_reserved_engine_args_are_the_launchers_own_flags() -> None:
    """Every spelling the API refuses, the launcher refuses too (it would exit 2), and every
    flag the launcher owns is refused by the API, so no pool that validates crashes its pods."""
    # (the operator always passes --grace-seconds, which owns --shutdown-timeout too)
    owned = {**launcher.OWN_FLAGS, launcher.SHUTDOWN_FLAG: "--grace-seconds"}
    assert {launcher.kebab(k) for k in api.RESERVED_ENGINE_ARGS} == set(owned)
    for camel in api.RESERVED_ENGINE_ARGS:
        for key in api.spellings(camel):
            with pytest.raises(launcher.LaunchError):
                launcher.engine_arg_flags([f"{key}=1"], owned)
    for camel in api.RESERVED_CONNECTOR_KEYS:
        for key in api.spellings(camel):
            with pytest.raises(launcher.LaunchError):
                launcher.kv_transfer_config(Role.PREFILL, "NixlConnector", {key: "x"})


def test_longest_pool_name_gives_valid_child_names() -> None:
    """The 40-character limit leaves room for every object named after the pool."""
    name = "a" * api.POOL_NAME_MAX
    spec = parse_pool({**pool(), "metadata": {"name": name}}).spec
    for mode in ("Disaggregated", "Aggregated"):
        caps = builders.Capabilities(monitoring=True, rbac=True)
        children = builders.build_children(
            builders.Pool(name=name, namespace="ns", spec=spec.model_copy(update={"mode": mode})),
            caps)
        for child in children:
            child_name = child["metadata"]["name"]
            assert len(child_name) <= 63 and re2.search(api.DNS1035_LABEL, child_name), child_name


def test_parallel_sizes_name_the_engine_arg_and_the_gpus() -> None:
    with pytest.raises(InvalidPool) as exc:
        parse_pool(pool(runtime={"engineArgs": {"pipelineParallelSize": 2}}))
    # the runtime's engine args reach every role: the first it does not fit is named
    assert exc.value.errors == [
        "spec: runtime.engineArgs: tensorParallelSize 1 x pipelineParallelSize 2 x "
        "dataParallelSize 1 is 2 ranks, one GPU each, but prefill.gpus is 1 (the engine "
        "would not start); raise prefill.gpus or lower the parallel sizes"], exc.value.errors
    # a role's own value wins over the runtime's, in any spelling the launcher reads
    parse_pool(pool(runtime={"engineArgs": {"pipelineParallelSize": 2}},
                    prefill={"gpus": 2}, decode={"engineArgs": {"pipeline_parallel_size": 1}}))
    # ranks that fit: 2 x 2 x 2 on 8 GPUs, a string the launcher passes on, CPU engines
    parse_pool(pool(prefill={"gpus": 8, "tensorParallelSize": 2, "engineArgs": {
        "pipelineParallelSize": 2, "dataParallelSize": "2"}}))
    parse_pool(pool(mode="Aggregated", engine={"gpus": 0},
                    runtime={"engineArgs": {"pipelineParallelSize": 2}}))
    # a group of pods: the pipeline divides tensorParallelSize x nodesPerReplica
    parse_pool(pool(prefill={"nodesPerReplica": 2, "gpus": 2, "tensorParallelSize": 2,
                             "engineArgs": {"pipelineParallelSize": 4}}))


@pytest.mark.parametrize("path", ["/var/lib/poolpilot", "/mnt/nvme/models", "/data", "/var/cache"])
def test_node_local_folders_of_their_own_are_accepted(path: str) -> None:
    doc = pool(model={"name": "m", "cache": {"type": "NodeLocal", "nodeLocal": {"path": path}}})
    parse_pool(doc)
    assert not crd_validation.validate(CRD, doc)[1]
