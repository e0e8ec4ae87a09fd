"""The InferencePool API (group poolpilot.dev, version v1alpha1).

These pydantic models are the single source of truth: the CRD in crds/ is generated from them
(`poolpilot crd`), including the cross-field rules below, which become CEL
`x-kubernetes-validations` so the API server rejects the same specs the models reject.
This module does no I/O (enforced by import-linter).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)
from pydantic_core import PydanticCustomError

from poolpilot import handoff
from poolpilot.api.autoscaling import (
    AutoscalingMode,
    AutoscalingSpec,
    AutoscalingTargets,
    LatencyTarget,
    ScalingBehavior,
    SloSpec,
)
from poolpilot.api.common import (
    GPU_RESOURCE,
    OWNED_ENV,
    RESOURCE_NAME,
    EnvVar,
    LocalObjectReference,
    ResourceRequirements,
    SecretKeyRef,
    Toleration,
    merged_resource_problems,
)
from poolpilot.api.gateway import GatewaySpec
from poolpilot.api.model_cache import (
    CacheType,
    CompileCache,
    ModelCacheSpec,
    NodeLocalCache,
    ObjectStoreSource,
    SharedVolumeCache,
)
from poolpilot.api.podtemplate import (
    CONTAINER_OWNED,
    OWNED_LABEL_PREFIX,
    OWNED_POD_LABELS,
    OWNED_VOLUMES,
    POD_SPEC_OWNED,
    Capabilities,
    ContainerOverlay,
    ContainerSecurityOverlay,
    EnvVarOverlay,
    PodSpecOverlay,
    PodTemplate,
    PodTemplateMetadata,
    PodVolume,
    VolumeMount,
    _containers_named,
)
from poolpilot.api.runtime import (
    CONNECTOR_EXTRA_CONFIG_KEY,
    DEFAULT_RUNTIME_IMAGE,
    RESERVED_CONNECTOR_KEYS,
    RESERVED_ENGINE_ARGS,
    Connector,
    ConnectorConfig,
    EngineArgs,
    HuggingFaceSource,
    KvTransferSpec,
    Mode,
    ModelSource,
    ModelSpec,
    PvcSource,
    RdmaSpec,
    RuntimeSpec,
    StorageSpec,
)
from poolpilot.api.status import (
    CONDITION_REASON,
    CONDITION_TYPE,
    Condition,
    ConditionType,
    InferencePoolStatus,
    ObservedMetrics,
    RoleStatus,
)
from poolpilot.apitypes import (
    DNS1035_LABEL,
    DNS1123_LABEL,
    ApiModel,
    Int32,
    JsonValue,
    Matching,
    Quantity,
    Rule,
    RuleFailure,
    TrimmedString,
    cel_string,
    collecting_rule_failures,
    quantity_value,
    spellings,
)
from poolpilot.roles import DISAGGREGATED_ROLES, Role
from poolpilot.routing_defaults import DEFAULT_PREFILL_HOLD_S

__all__ = [
    "CONDITION_REASON",
    "CONDITION_TYPE",
    "CONNECTOR_EXTRA_CONFIG_KEY",
    "CONTAINER_OWNED",
    "DEFAULT_RUNTIME_IMAGE",
    "GPU_RESOURCE",
    "OWNED_ENV",
    "OWNED_LABEL_PREFIX",
    "OWNED_POD_LABELS",
    "OWNED_VOLUMES",
    "POD_SPEC_OWNED",
    "RESERVED_CONNECTOR_KEYS",
    "RESERVED_ENGINE_ARGS",
    "RESOURCE_NAME",
    # defined in the submodules, used as api.X
    "ApiModel",
    "AutoscalingMode",
    "AutoscalingSpec",
    "AutoscalingTargets",
    "CacheType",
    "Capabilities",
    "CompileCache",
    "Condition",
    "ConditionType",
    "Connector",
    "ConnectorConfig",
    "ContainerOverlay",
    "ContainerSecurityOverlay",
    "EngineArgs",
    "EnvVar",
    "EnvVarOverlay",
    "HuggingFaceSource",
    "InferencePoolStatus",
    "JsonValue",
    "KvTransferSpec",
    "LatencyTarget",
    "LocalObjectReference",
    "Mode",
    "ModelCacheSpec",
    "ModelSource",
    "ModelSpec",
    "NodeLocalCache",
    "ObjectStoreSource",
    "ObservedMetrics",
    "PodSpecOverlay",
    "PodTemplate",
    "PodTemplateMetadata",
    "PodVolume",
    "PvcSource",
    "RdmaSpec",
    "ResourceRequirements",
    "RoleStatus",
    "Rule",
    "RuleFailure",
    "RuntimeSpec",
    "ScalingBehavior",
    "SecretKeyRef",
    "SharedVolumeCache",
    "SloSpec",
    "StorageSpec",
    "Toleration",
    "VolumeMount",
    "collecting_rule_failures",
    "spellings",
]

GROUP = "poolpilot.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferencePool"
PLURAL = "inferencepools"
SINGULAR = "inferencepool"
SHORT_NAMES = ["ipool"]
CATEGORIES = ["poolpilot"]


# ---------------------------------------------------------------------------------------------
# Roles


# The role each mode runs its engines in (the other role's fields are unused).
_ROLE_MODE: dict[str, Mode] = {Role.PREFILL: Mode.DISAGGREGATED, Role.ENGINE: Mode.AGGREGATED}


def _memory_limit(spec: InferencePoolSpec, role: str) -> Quantity | None:
    """The engine container's memory limit, as the renderer merges it (later over earlier):
    runtime.resources, the role's resources, then the engine container of spec.podTemplate
    and of the role's podTemplate."""
    limit: Quantity | None = None
    for layer in _engine_resource_layers(spec, role):
        limit = layer[1].limits.get("memory", limit)
    return limit


def _engine_resource_layers(
    spec: InferencePoolSpec, role: str
) -> list[tuple[str, ResourceRequirements]]:
    """The engine container's resource blocks (path below spec, block), in the order the
    renderer lays them (operator/engine_pods.py: _merged_resources)."""
    layers = [("runtime.resources", spec.runtime.resources),
              (f"{role}.resources", spec.role(role).resources)]
    for where, template in (("", spec.pod_template), (f"{role}.", spec.role(role).pod_template)):
        layers += [(f"{where}podTemplate.spec.containers[{i}].resources", c.resources)
                   for i, c in enumerate(template.spec.containers)]
    return layers


def _offload_fits(spec: InferencePoolSpec, role: str) -> bool:
    offload, limit = spec.role(role).kv_offload, _memory_limit(spec, role)
    if offload is None or limit is None or spec.mode != _ROLE_MODE[role]:
        return True
    want, cap = quantity_value(offload), quantity_value(limit)
    return want is None or cap is None or cap > want


def _template_memory_limit(base: str) -> tuple[str, str]:
    """CEL: (whether the engine container of the podTemplate under `base` sets a memory
    limit, that limit)."""
    containers = f"{base}.podTemplate.spec.containers"
    sets = "has(c.resources) && has(c.resources.limits) && 'memory' in c.resources.limits"
    return (f"has({base}.podTemplate) && has({base}.podTemplate.spec) && has({containers}) && "
            f"{containers}.exists(c, {sets})",
            f"{containers}.filter(c, {sets})[0].resources.limits['memory']")


def _offload_within_memory_limit(role: str) -> Rule:
    """A role's kvOffload is pinned host memory in its engine container: a memory limit at or
    below it would have the engine killed (or its allocation fail) at start, every pod in a
    crash loop; refused instead, for the role the mode runs. Without a limit the node's memory
    bounds it. The limit is the one the renderer gives the container: the last of the role's
    podTemplate, spec.podTemplate, the role's resources and runtime.resources that sets one."""
    r = f"self.{role}"
    offload = f"quantity(string({r}.kvOffload))"
    layers = [
        _template_memory_limit(r),
        _template_memory_limit("self"),
        (f"has({r}.resources) && has({r}.resources.limits) && "
         f"'memory' in {r}.resources.limits", f"{r}.resources.limits['memory']"),
        ("has(self.runtime) && has(self.runtime.resources) && "
         "has(self.runtime.resources.limits) && 'memory' in self.runtime.resources.limits",
         "self.runtime.resources.limits['memory']"),
    ]
    fits = "true"
    for sets, limit in reversed(layers):
        fits = f"({sets} ? quantity(string({limit})).isGreaterThan({offload}) : {fits})"
    return Rule(
        field=f"{role}.kvOffload",
        cel=f"!has({r}.kvOffload) || self.mode != '{_ROLE_MODE[role].value}' || {fits}",
        message="must be below the engine container's memory limit (the first that sets "
        "limits.memory of the role's podTemplate engine container, spec.podTemplate's engine "
        "container, the role's resources and runtime.resources): the offload tier is pinned "
        "host memory inside that limit; raise the limit to kvOffload plus the engine's own "
        "memory, or lower kvOffload",
        check=lambda s: _offload_fits(s, role),
    )


def _replica_rules() -> tuple[Rule, ...]:
    return (
        Rule(
            field="maxReplicas",
            cel="self.minReplicas <= self.maxReplicas",
            message="must be >= minReplicas ({minReplicas}); raise maxReplicas or lower "
            "minReplicas",
            check=lambda s: s.min_replicas <= s.max_replicas,
        ),
        Rule(
            field="replicas",
            cel="self.replicas >= self.minReplicas && self.replicas <= self.maxReplicas",
            message="must be within [minReplicas, maxReplicas] ({minReplicas}..{maxReplicas}); "
            "set replicas inside the bounds",
            check=lambda s: s.min_replicas <= s.replicas <= s.max_replicas,
        ),
    )


# The preStop sleep and vLLM's teardown come out of the grace period (launcher
# --grace-seconds); what is left is vLLM's --shutdown-timeout, at least 1 s.
MIN_ENGINE_GRACE_SECONDS = 16
# A prefill engine (NIXL) holds each prompt's KV for the lease; its drain should cover it.
MIN_PREFILL_NIXL_GRACE_SECONDS = 10 + handoff.kv_lease_seconds() + 5


# A LeaderWorkerSet group's size; beyond this, a replica is more nodes than one failure domain
# should hold (any pod's restart recreates the whole group).
MAX_NODES_PER_REPLICA = 64


class EngineRoleSpec(ApiModel):
    """Size and bounds of one engine role (prefill, decode, or the aggregated engine)."""

    rules = (
        *_replica_rules(),
        _containers_named("engine"),
        Rule(
            field="gpus",
            cel="self.gpus >= self.tensorParallelSize || "
            "(self.gpus == 0 && self.tensorParallelSize == 1)",
            message="must be >= tensorParallelSize ({tensorParallelSize}); each tensor-parallel "
            "rank needs its own GPU",
            check=lambda s: s.gpus >= s.tensor_parallel_size
            or (s.gpus == 0 and s.tensor_parallel_size == 1),
        ),
        Rule(
            field="kvOffload",
            cel="!has(self.kvOffload) || self.gpus >= 1",
            message="vLLM's CPU backend (gpus: 0) has no KV offloading, and its engine would "
            "not start; remove kvOffload or give the role GPUs",
            check=lambda s: s.kv_offload is None or s.gpus >= 1,
        ),
    )

    replicas: Int32 = Field(
        default=1,
        ge=0,
        description="Replicas when autoscaling is off; the starting size when it is on.",
    )
    min_replicas: Int32 = Field(default=1, ge=0, description="Autoscaling lower bound.")
    max_replicas: Int32 = Field(default=8, ge=1, description="Autoscaling upper bound.")
    gpus: Int32 = Field(
        default=1, ge=0, description="GPUs per pod (nvidia.com/gpu); 0 runs on CPU."
    )
    tensor_parallel_size: Int32 = Field(
        default=1, ge=1, description="Tensor-parallel ranks per pod; needs gpus >= this."
    )
    # Not Int32: its own le (the int32 maximum) would override this one.
    nodes_per_replica: int = Field(
        default=1, ge=1, le=MAX_NODES_PER_REPLICA, json_schema_extra={"format": "int32"},
        description="Pods (nodes) per replica, each with `gpus` GPUs and tensorParallelSize "
        "ranks. Above 1 a replica is a group of pods on a LeaderWorkerSet "
        "(leaderworkerset.x-k8s.io, which must be installed): vLLM runs pipeline parallel "
        "across the group (or tensor parallel, with engineArgs {pipelineParallelSize: 1}); "
        "the leader serves, the router sends only to leaders, and scaling adds whole groups.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Overrides runtime.resources for this role.",
    )
    engine_args: EngineArgs = Field(
        default_factory=dict,
        description="Overrides runtime.engineArgs for this role, e.g. {maxNumBatchedTokens: 8192}.",
    )
    kv_offload: Quantity | None = Field(
        default=None,
        description="Host memory each engine keeps as a second tier of its prefix cache "
        "(vLLM's native CPU offloading), e.g. 256Gi: blocks the GPU cache evicts stay there "
        "and are copied back over PCIe instead of recomputed, which lifts the hit rate of "
        "long conversations whose history outgrows the GPUs. Pinned host memory: the pod's "
        "memory request and limit must hold it (a limit at or below it is refused). Prefill "
        "and aggregated engines (GPU engines only; vLLM's CPU backend has no offloading); "
        "unset: none.",
    )
    termination_grace_period_seconds: Int32 = Field(
        default=120, ge=MIN_ENGINE_GRACE_SECONDS,
        description="Seconds a stopping engine pod has: a 10 s preStop (the routers stop "
        "sending to it), then vLLM drains its in-flight requests for what is left less 5 s of "
        "teardown (--shutdown-timeout); a prefill engine also waits for its KV to be pulled.",
    )
    pod_template: PodTemplate = Field(
        default_factory=PodTemplate,
        description="Laid over spec.podTemplate for this role's pods.",
    )


class PrefixRouting(StrEnum):
    APPROXIMATE = "Approximate"
    PRECISE = "Precise"
    # Not "Off": YAML 1.1 (PyYAML, and kubectl's YAML reader) reads an unquoted Off as false.
    DISABLED = "Disabled"


class RouterSpec(ApiModel):
    """The OpenAI-compatible router in front of the engines."""

    rules = (
        _containers_named("router"),
        Rule(
            field="podTemplate.spec.serviceAccountName",
            cel="!has(self.podTemplate) || !has(self.podTemplate.spec) || "
            "!has(self.podTemplate.spec.serviceAccountName)",
            message="the router's discovery needs the ServiceAccount the operator makes for "
            "it (NAME-router); remove it",
            check=lambda s: s.pod_template.spec.service_account_name is None,
        ),
    )

    replicas: Int32 = Field(default=2, ge=1, description="Router replicas.")
    image: TrimmedString | None = Field(
        default=None, description="Router image; defaults to runtime.image (it holds the router)."
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Router container resources, over the defaults (requests cpu 500m, memory "
        "512Mi; limit memory 2Gi, raised to a larger memory request).",
    )
    termination_grace_period_seconds: Int32 = Field(
        default=60, ge=6,
        description="Seconds a stopping router pod has to finish its streams (after a 5 s "
        "preStop).",
    )
    pod_template: PodTemplate = Field(
        default_factory=PodTemplate,
        description="Laid over the router pods (spec.podTemplate is for engine pods only).",
    )
    api_key_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the API keys clients must send (Authorization: Bearer "
        "KEY), one per line; unset: no authentication. Rotating the Secret takes effect "
        "without a restart.",
    )
    prefix_routing: PrefixRouting = Field(
        default=PrefixRouting.APPROXIMATE,
        strict=False,
        description="How the router picks prefill and aggregated engines (and decode engines "
        "for a local prefill) by the prompt prefix they hold in their prefix cache, against "
        "their load. Approximate: from the router's own record of the prompts it sent where "
        "(works with any engine). Precise: from the engines' own KV-cache events (the "
        "engines are started publishing them on ports 5557 and 5558; the router tokenizes "
        "each prompt with an engine's /tokenize). Disabled: by load only.",
    )
    prefill_hold_seconds: float = Field(
        default=DEFAULT_PREFILL_HOLD_S, ge=0, le=3600,
        description="Late binding (disaggregated): a prompt waits at the router, in arrival "
        "order, while every prefill engine has more than this many seconds of queued work, "
        "and goes to the first engine that can start on it, a newly added replica included. "
        "The autoscaler counts held prompts as prefill requests waiting. 0: off, each prompt "
        "joins an engine's queue at once.",
    )
    prefix_index_entries: Int32 | None = Field(
        default=None, ge=1,
        description="Keys (about 32 prompt tokens each) the approximate prefix record "
        "remembers, about 300 bytes of router memory a key. Unset: 131072 (~4M prompt "
        "tokens), raised to cover the engines' kvOffload (maxReplicas x kvOffload at an 8B "
        "model's 128 KiB of KV a token, at most 2097152); set it for another model's size.",
    )



class MonitoringSpec(ApiModel):
    """Prometheus Operator objects made for the pool, when its CRDs are installed."""

    service_monitor: bool = Field(default=True, description="Make a ServiceMonitor for the router.")
    pod_monitor: bool = Field(default=True, description="Make a PodMonitor for the engines.")


MetricsNamespace = Annotated[str, Matching(
    DNS1123_LABEL,
    "must be a namespace name: lowercase letters, digits and '-', starting and ending with a "
    "letter or digit",
    max_length=63,
)]


class NetworkPolicySpec(ApiModel):
    """NetworkPolicies around the pool: only its router, and its other engines (the KV-cache
    handoff), reach the engines; the router takes clients on its port."""

    enabled: bool | None = Field(
        default=None,
        description="Make the NetworkPolicies. Unset: the operator's default "
        "(--network-policies; the chart's operator.networkPolicies).",
    )
    metrics_namespaces: list[MetricsNamespace] = Field(
        default_factory=lambda: ["monitoring"], max_length=16,
        description="Namespaces whose pods may scrape the engines' and the router's metrics, "
        "on their metrics port 8090 only (where Prometheus runs).",
    )
    router_from: list[dict[str, JsonValue]] = Field(
        default_factory=list, max_length=32,
        description="Who may reach the router's port: NetworkPolicy peers (podSelector, "
        "namespaceSelector, ipBlock), e.g. [{namespaceSelector: {matchLabels: "
        "{kubernetes.io/metadata.name: ingress-nginx}}}]; empty: anyone.",
    )


# ---------------------------------------------------------------------------------------------
# The pool

# Kubernetes' limit on a pod's annotations (keys and values together), less room for the
# operator's own (scrape, config hash, Multus networks).
MAX_TEMPLATE_ANNOTATIONS = 256 * 1024 - 4096


def _engine_arg(spec: InferencePoolSpec, role: str, camel: str) -> tuple[str, JsonValue]:
    """Where an engine arg is set for a role, in any spelling the launcher reads, and its
    value: the role's own engineArgs over runtime.engineArgs; (path, None) when unset."""
    for path, args in ((str(role), spec.role(role).engine_args),
                       ("runtime", spec.runtime.engine_args)):
        for key in spellings(camel):
            if key in args:
                return path, args[key]
    return str(role), None


def _positive_int(value: JsonValue) -> bool:
    """An integer >= 1, as JSON or as the string the launcher would pass on."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 1
    return isinstance(value, str) and value.strip().isdigit() and int(value) >= 1


class InferencePoolSpec(ApiModel):
    """A pool of vLLM engines serving one model, prefill and decode on separate Deployments."""

    rules = (
        Rule(
            field="autoscaling.scaleToZero",
            cel="self.autoscaling.scaleToZero || (self.prefill.minReplicas >= 1 && "
            "self.decode.minReplicas >= 1 && self.engine.minReplicas >= 1)",
            message="must be true for minReplicas 0; set minReplicas >= 1 or enable scaleToZero",
            check=lambda s: s.autoscaling.scale_to_zero
            or min(s.prefill.min_replicas, s.decode.min_replicas, s.engine.min_replicas) >= 1,
        ),
        _containers_named("engine"),
        Rule(
            field="prefill.terminationGracePeriodSeconds",
            cel=f"self.mode != 'Disaggregated' || self.kvTransfer.connector != 'NixlConnector' "
            f"|| self.prefill.terminationGracePeriodSeconds >= {MIN_PREFILL_NIXL_GRACE_SECONDS}",
            message=f"must be >= {MIN_PREFILL_NIXL_GRACE_SECONDS} with NixlConnector (the 10 s "
            f"preStop, the {handoff.kv_lease_seconds()} s KV lease its decode engines may still "
            "pull within, 5 s of teardown); raise it",
            check=lambda s: s.mode != Mode.DISAGGREGATED
            or s.kv_transfer.connector != Connector.NIXL
            or s.prefill.termination_grace_period_seconds >= MIN_PREFILL_NIXL_GRACE_SECONDS,
        ),
        *(_offload_within_memory_limit(r) for r in (Role.PREFILL, Role.ENGINE)),
        Rule(
            field="decode.kvOffload",
            cel="self.mode != 'Disaggregated' || !has(self.decode.kvOffload)",
            message="must be unset: a decode engine receives each prompt's KV from a prefill "
            "engine; set prefill.kvOffload instead",
            check=lambda s: s.mode != Mode.DISAGGREGATED or s.decode.kv_offload is None,
        ),
    )

    model: ModelSpec = Field(description="The model to serve.")
    runtime: RuntimeSpec = Field(
        default_factory=RuntimeSpec, description="The engine container, shared by all roles."
    )
    mode: Mode = Field(
        default=Mode.DISAGGREGATED,
        strict=False,
        description="Disaggregated: separate prefill and decode pools with KV handoff. "
        "Aggregated: one engine pool.",
    )
    kv_transfer: KvTransferSpec = Field(
        default_factory=KvTransferSpec, description="KV handoff between prefill and decode."
    )
    prefill: EngineRoleSpec = Field(
        default_factory=EngineRoleSpec, description="Prefill role (Disaggregated mode)."
    )
    decode: EngineRoleSpec = Field(
        default_factory=lambda: EngineRoleSpec(replicas=1, max_replicas=16),
        description="Decode role (Disaggregated mode).",
    )
    engine: EngineRoleSpec = Field(
        default_factory=EngineRoleSpec, description="The single engine role (Aggregated mode)."
    )
    router: RouterSpec = Field(default_factory=RouterSpec, description="The router.")
    slo: SloSpec = Field(default_factory=SloSpec, description="Latency objectives.")
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec, description="Autoscaling."
    )
    monitoring: MonitoringSpec = Field(
        default_factory=MonitoringSpec, description="Prometheus Operator objects."
    )
    network_policy: NetworkPolicySpec = Field(
        default_factory=NetworkPolicySpec, description="NetworkPolicies around the pool."
    )
    gateway: GatewaySpec | None = Field(
        default=None,
        description="Reach the pool through a Gateway: an HTTPRoute to the router, or to a "
        "GIE InferencePool of the engines (Gateway API Inference Extension).",
    )
    pod_template: PodTemplate = Field(
        default_factory=PodTemplate,
        description="Laid over every engine pod the operator renders (labels, annotations, "
        "affinity, tolerations, volumes, the engine container's env and mounts, ...); "
        "spec.<role>.podTemplate goes over it.",
    )

    @model_validator(mode="after")
    def _precise_owns_kv_events(self) -> InferencePoolSpec:
        # Free-form maps: no CEL twin (the API server cannot see their keys).
        if self.router.prefix_routing != PrefixRouting.PRECISE:
            return self
        where = [("runtime", self.runtime.engine_args)]
        where += [(str(r), self.role(r).engine_args) for r in self.engine_roles()]
        for path, args in where:
            for key, value in args.items():
                if key in spellings("kvEventsConfig"):
                    raise PydanticCustomError(
                        "precise_kv_events", "{path}.engineArgs.{key}: set by poolpilot when "
                        "router.prefixRouting is Precise (the engines publish on ports 5557 "
                        "and 5558 for the router); remove it, or choose Approximate",
                        {"path": path, "key": key})
                if key in spellings("enablePrefixCaching") and value is False:
                    raise PydanticCustomError(
                        "precise_prefix_caching", "{path}.engineArgs.{key}: router."
                        "prefixRouting Precise routes on the engines' prefix-cache events; "
                        "keep prefix caching on, or choose Disabled",
                        {"path": path, "key": key})
        return self

    @model_validator(mode="after")
    def _parallel_ranks_fit(self) -> InferencePoolSpec:
        # Free-form maps: no CEL twin. vLLM's world is tensor x pipeline x data parallel
        # ranks, one GPU each: more ranks than the pod's GPUs and the engine never starts
        # (every pod crash-looping); a group's pipeline must divide its ranks (the launcher
        # refuses it at start, runtime_image/multinode.py).
        for role in self.engine_roles():
            spec = self.role(role)
            sizes = {key: _engine_arg(self, role, key)
                     for key in ("pipelineParallelSize", "dataParallelSize")}
            for key, (path, value) in sizes.items():
                if value is not None and not _positive_int(value):
                    raise PydanticCustomError(
                        "parallel_size", "{path}.engineArgs.{key}: {value} is not a whole "
                        "number >= 1", {"path": path, "key": key, "value": repr(value)})
            pp = int(sizes["pipelineParallelSize"][1] or 1)
            dp = int(sizes["dataParallelSize"][1] or 1)
            tp, nodes = spec.tensor_parallel_size, spec.nodes_per_replica
            if nodes > 1:
                world = tp * nodes
                if world % pp:
                    raise PydanticCustomError(
                        "parallel_size", "{path}.engineArgs.pipelineParallelSize: {pp} does not "
                        "divide the group's {world} ranks (tensorParallelSize {tp} x "
                        "nodesPerReplica {nodes}); e.g. {nodes} (the default: a stage per pod) "
                        "or 1", {"path": sizes["pipelineParallelSize"][0], "pp": pp,
                                 "world": world, "tp": tp, "nodes": nodes})
                continue
            world = tp * pp * dp
            if spec.gpus >= 1 and world > spec.gpus:
                where = sizes["pipelineParallelSize" if pp > 1 else "dataParallelSize"][0]
                raise PydanticCustomError(
                    "parallel_size", "{path}.engineArgs: tensorParallelSize {tp} x "
                    "pipelineParallelSize {pp} x dataParallelSize {dp} is {world} ranks, one "
                    "GPU each, but {role}.gpus is {gpus} (the engine would not start); raise "
                    "{role}.gpus or lower the parallel sizes",
                    {"path": where, "role": str(role), "tp": tp, "pp": pp, "dp": dp,
                     "world": world, "gpus": spec.gpus})
        return self

    @model_validator(mode="after")
    def _merged_resources_fit(self) -> InferencePoolSpec:
        # Merged layers: no CEL twin (a block's own requests and limits have their rules).
        problems: list[str] = []
        rdma = self.kv_transfer.rdma
        nixl = self.mode == Mode.DISAGGREGATED and self.kv_transfer.connector == Connector.NIXL
        for role in self.engine_roles():
            problems += merged_resource_problems(
                "engine", _engine_resource_layers(self, role),
                set_by_operator=[rdma.resource] if rdma is not None and nixl else [])
        # (the router's default limits rise to a larger request: operator/building_blocks.py)
        problems += merged_resource_problems("router", [
            ("router.resources", self.router.resources),
            *((f"router.podTemplate.spec.containers[{i}].resources", c.resources)
              for i, c in enumerate(self.router.pod_template.spec.containers))])
        if problems:
            raise PydanticCustomError("merged_resources", "{problems}",
                                      {"problems": "; ".join(dict.fromkeys(problems))})
        return self

    @model_validator(mode="after")
    def _pod_templates_fit(self) -> InferencePoolSpec:
        # Merged templates (the pool's and a role's lay over one pod): no CEL twin.
        missing: dict[tuple[str, str], list[str]] = {}  # (mount path, volume) -> the pods
        too_big: dict[tuple[str, int], list[str]] = {}  # (annotation paths, bytes) -> the pods
        pods = [(str(r), [("", self.pod_template), (f"{r}.", self.role(r).pod_template)])
                for r in self.engine_roles()]
        pods.append(("router", [("router.", self.router.pod_template)]))
        for what, templates in pods:
            volumes = {*OWNED_VOLUMES, *(v.name for _, t in templates for v in t.spec.volumes)}
            for where, t in templates:
                for i, c in enumerate(t.spec.containers):
                    for j, m in enumerate(c.volume_mounts):
                        if m.name not in volumes:
                            path = f"{where}podTemplate.spec.containers[{i}].volumeMounts[{j}]"
                            missing.setdefault((path, m.name), []).append(what)
            size = sum(len(k.encode()) + len(v.encode())
                       for _, t in templates for k, v in t.metadata.annotations.items())
            if size > MAX_TEMPLATE_ANNOTATIONS:
                paths = " and ".join(f"{w}podTemplate.metadata.annotations"
                                     for w, t in templates if t.metadata.annotations)
                too_big.setdefault((paths, size), []).append(what)
        problems = [
            f"{path}.name: {name!r} is no volume of the {' and '.join(roles)} pods (their "
            "podTemplate volumes, or the operator's); add it to podTemplate.spec.volumes, or "
            "mount a volume that is there"
            for (path, name), roles in missing.items()]
        problems += [
            f"{paths}: {size} bytes on the {' and '.join(roles)} pods; at most "
            f"{MAX_TEMPLATE_ANNOTATIONS} (Kubernetes' 256 KiB for a pod's annotations, less "
            "room for the operator's own); make them smaller"
            for (paths, size), roles in too_big.items()]
        if problems:
            raise PydanticCustomError("pod_templates", "{problems}",
                                      {"problems": "; ".join(problems)})
        return self

    def engine_roles(self) -> list[Role]:
        """The engine roles this pool runs, in the order they are created."""
        return list(DISAGGREGATED_ROLES) if self.mode == Mode.DISAGGREGATED else [Role.ENGINE]

    def role(self, name: str) -> EngineRoleSpec:
        spec: EngineRoleSpec = getattr(self, name)
        return spec

    def served_name(self) -> str:
        return self.model.served_name or self.model.name


# Every child object is named POOL-ROLE (the longest, POOL-prefill, is 8 characters more) and
# Services need DNS-1035 labels of at most 63 characters; 40 leaves room for the children.
POOL_NAME_MAX = 40
POOL_NAME_MESSAGE = (
    f"must be a DNS-1035 label of at most {POOL_NAME_MAX} characters: lowercase letters, digits "
    "and '-', starting with a letter and ending with a letter or digit (e.g. llama-8b), so "
    "that every object poolpilot names after the pool (NAME-prefill, NAME-router) is a valid "
    "Service name"
)
# The CRD's root rule: the API server refuses such names too (metadata is not in the schema).
POOL_NAME_RULE = {
    "rule": f"size(self.metadata.name) <= {POOL_NAME_MAX} && "
    f"self.metadata.name.matches({cel_string(DNS1035_LABEL)})",
    "message": f"metadata.name: {POOL_NAME_MESSAGE}",
}

PoolName = Annotated[str, Matching(DNS1035_LABEL, POOL_NAME_MESSAGE, max_length=POOL_NAME_MAX)]


def multinode_name_max(role: str, max_replicas: int) -> int:
    """The longest pool name whose role can span nodes. LeaderWorkerSet runs each group's
    workers as a StatefulSet NAME-ROLE-lws-GROUP, and the StatefulSet controller labels its
    pods with that name and a hash of up to 10 characters (controller-revision-hash, a label
    value of at most 63): longer, the worker pods are never created (lws#410)."""
    group_digits = len(str(max(0, max_replicas - 1)))
    return 63 - len("--lws--") - 10 - len(role) - group_digits


def _multinode_name_rule(role: Role) -> Rule:
    def fits(pool: Any) -> bool:
        spec = pool.spec.role(role)
        return (role not in pool.spec.engine_roles() or spec.nodes_per_replica <= 1
                or len(pool.metadata.name) <= multinode_name_max(role, spec.max_replicas))

    r = f"self.spec.{role}"
    used = ("has(self.spec.mode) && self.spec.mode == 'Aggregated'" if role == Role.ENGINE
            else "!has(self.spec.mode) || self.spec.mode != 'Aggregated'")
    max_replicas = f"(has({r}.maxReplicas) ? {r}.maxReplicas : 8)"
    return Rule(
        field=f"spec.{role}.nodesPerReplica",
        cel=f"!({used}) || !has({r}) || !has({r}.nodesPerReplica) || {r}.nodesPerReplica <= 1 "
        f"|| size(self.metadata.name) + size(string({max_replicas} - 1)) <= "
        f"{multinode_name_max(role, 1) + 1}",
        message=f"above 1, the pool's name must be at most {multinode_name_max(role, 10)} "
        f"characters ({multinode_name_max(role, 100)} with more than 10 {role} replicas, one "
        "fewer per digit more): LeaderWorkerSet names each group's workers NAME-"
        f"{role}-lws-GROUP, and their pods' revision label (that and a 10-character hash) "
        "must fit 63 characters; shorten metadata.name",
        check=fits,
    )
NamespaceName = Annotated[str, Matching(
    DNS1123_LABEL,
    "must be a namespace name: lowercase letters, digits and '-', starting and ending with a "
    "letter or digit",
    max_length=63,
)]


class ObjectMeta(BaseModel):
    """The subset of metadata the API needs; everything else passes through."""

    model_config = ConfigDict(extra="allow", strict=True)

    name: PoolName
    namespace: NamespaceName | None = None


class InferencePool(ApiModel):
    """An InferencePool: one model served by prefill and decode engines behind a router."""

    # (the CRD's root validations: poolpilot/crd.py)
    rules = tuple(_multinode_name_rule(r) for r in (Role.PREFILL, Role.DECODE, Role.ENGINE))

    api_version: Literal["poolpilot.dev/v1alpha1"] = "poolpilot.dev/v1alpha1"
    kind: Literal["InferencePool"] = "InferencePool"
    metadata: ObjectMeta
    spec: InferencePoolSpec
    status: InferencePoolStatus | None = None
