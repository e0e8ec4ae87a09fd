"""The InferencePool API (group poolpilot.dev, version v1alpha1).

These pydantic models are the single source of truth: the CRD in crds/ is generated from them
(`poolpilot crd`), including the cross-field rules below, which become CEL
`x-kubernetes-validations` so the API server rejects the same specs the models reject.
This module does no I/O (enforced by import-linter).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

GROUP = "poolpilot.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferencePool"
PLURAL = "inferencepools"
SINGULAR = "inferencepool"
SHORT_NAMES = ["ipool"]
CATEGORIES = ["poolpilot"]
DEFAULT_RUNTIME_IMAGE = "ghcr.io/poolpilot/runtime:0.1.0"

# Free-form values (engine args, connector config) are kept as JSON scalars or objects.
JsonValue = Any


@dataclass(frozen=True)
class Rule:
    """A cross-field rule, checked by the model and emitted as a CEL validation in the CRD.

    `message` may name other fields in braces, e.g. "must be >= minReplicas ({minReplicas})";
    the model fills them from the object, the CRD (static message) drops the parentheses.
    """

    field: str
    cel: str
    message: str
    check: Callable[[Any], bool]

    def cel_message(self) -> str:
        return f"{self.field}: " + re.sub(r"\s*\(\{\w+\}\)", "", self.message)

    def to_crd(self) -> dict[str, str]:
        return {"rule": self.cel, "message": self.cel_message(), "fieldPath": f".{self.field}"}


class ApiModel(BaseModel):
    """Base: camelCase on the wire, unknown fields rejected, rules checked after parsing."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
    )
    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> ApiModel:
        for rule in self.rules:
            if not rule.check(self):
                values = {
                    name: getattr(self, _snake(name), None)
                    for name in re.findall(r"\{(\w+)\}", rule.message)
                }
                raise PydanticCustomError(
                    "rule",
                    "{field}: {message}",
                    {"field": rule.field, "message": rule.message.format(**values)},
                )
        return self

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> Any:
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        if cls.rules:
            target["x-kubernetes-validations"] = [r.to_crd() for r in cls.rules]
        return schema

    def to_wire(self) -> dict[str, Any]:
        """The object as it appears in YAML: camelCase, without unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# ---------------------------------------------------------------------------------------------
# Building blocks shared with core Kubernetes types


class ResourceRequirements(ApiModel):
    """CPU, memory and accelerator requests and limits, as in a container spec."""

    requests: dict[str, str] = Field(
        default_factory=dict, description="Minimum resources, e.g. {cpu: '4', memory: 32Gi}."
    )
    limits: dict[str, str] = Field(
        default_factory=dict,
        description="Maximum resources. nvidia.com/gpu is set from `gpus`; do not set it here.",
    )


class EnvVar(ApiModel):
    """An environment variable for the engine containers."""

    name: str = Field(min_length=1, description="Variable name.")
    value: str = Field(default="", description="Variable value.")


class Toleration(ApiModel):
    """A toleration, as in a pod spec (e.g. for tainted GPU nodes)."""

    key: str | None = Field(default=None, description="Taint key to tolerate.")
    operator: str | None = Field(
        default=None, pattern="^(Exists|Equal)$", description="Exists or Equal."
    )
    value: str | None = Field(default=None, description="Taint value, with operator Equal.")
    effect: str | None = Field(
        default=None,
        pattern="^(NoSchedule|PreferNoSchedule|NoExecute)$",
        description="Taint effect to tolerate; empty matches all.",
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated."
    )


class LocalObjectReference(ApiModel):
    """A reference to an object in the pool's namespace."""

    name: str = Field(min_length=1, description="Name of the object.")


class SecretKeyRef(ApiModel):
    """A key in a Secret in the pool's namespace."""

    name: str = Field(min_length=1, description="Secret name.")
    key: str = Field(default="token", min_length=1, description="Key within the Secret.")


# ---------------------------------------------------------------------------------------------
# Model and runtime


class HuggingFaceSource(ApiModel):
    """Download the weights from the Hugging Face Hub at start-up."""

    token_secret: SecretKeyRef | None = Field(
        default=None, description="Secret holding an HF token, for gated models such as Llama."
    )


class PvcSource(ApiModel):
    """Load the weights from a PersistentVolumeClaim that already holds them."""

    claim_name: str = Field(min_length=1, description="Name of the PVC holding the weights.")
    path: str = Field(
        default="/", description="Folder of the model inside the volume, e.g. /llama-3.1-8b."
    )


class ModelSource(ApiModel):
    """Where the weights come from: the Hugging Face Hub (default) or a PVC."""

    rules = (
        Rule(
            field="pvc",
            cel="!(has(self.huggingFace) && has(self.pvc))",
            message="set either huggingFace or pvc, not both",
            check=lambda s: not (s.hugging_face is not None and s.pvc is not None),
        ),
    )

    hugging_face: HuggingFaceSource | None = Field(
        default=None, description="Download from the Hugging Face Hub (the default)."
    )
    pvc: PvcSource | None = Field(default=None, description="Load from a PVC.")


class ModelSpec(ApiModel):
    """The model to serve."""

    name: str = Field(
        min_length=1,
        description="Model id on the Hugging Face Hub (e.g. meta-llama/Llama-3.1-8B-Instruct).",
    )
    served_name: str | None = Field(
        default=None,
        min_length=1,
        description="Name clients put in the `model` field; defaults to `name`.",
    )
    source: ModelSource = Field(
        default_factory=ModelSource, description="Where the weights come from."
    )


class RuntimeSpec(ApiModel):
    """The engine container, shared by all engine roles."""

    image: str = Field(
        default=DEFAULT_RUNTIME_IMAGE,
        min_length=1,
        description="Engine image: vLLM's OpenAI server with poolpilot's launcher.",
    )
    image_pull_policy: str = Field(
        default="IfNotPresent",
        pattern="^(Always|IfNotPresent|Never)$",
        description="Always, IfNotPresent or Never.",
    )
    engine_args: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="vLLM server arguments in camelCase, e.g. {maxModelLen: 8192}; "
        "per-role engineArgs override these.",
    )
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment variables.")
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="CPU and memory for each engine container (GPUs come from `gpus`).",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the engine pods must run on."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Tolerations for the engine pods."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, description="Secrets for pulling the engine image."
    )


class Mode(StrEnum):
    DISAGGREGATED = "Disaggregated"
    AGGREGATED = "Aggregated"


class Connector(StrEnum):
    NIXL = "NixlConnector"
    EXAMPLE = "ExampleConnector"
    LMCACHE = "LMCacheConnectorV1"


class KvTransferSpec(ApiModel):
    """How the KV cache moves from prefill to decode (Disaggregated mode)."""

    connector: Connector = Field(
        default=Connector.NIXL,
        description="vLLM KV connector: NixlConnector, ExampleConnector or LMCacheConnectorV1.",
    )
    extra_config: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="Extra kv_connector_extra_config, passed to vLLM as is.",
    )


# ---------------------------------------------------------------------------------------------
# Roles


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


class EngineRoleSpec(ApiModel):
    """Size and bounds of one engine role (prefill, decode, or the aggregated engine)."""

    rules = (
        *_replica_rules(),
        Rule(
            field="gpus",
            cel="self.gpus >= self.tensorParallelSize || "
            "(self.gpus == 0 && self.tensorParallelSize == 1)",
            message="must be >= tensorParallelSize ({tensorParallelSize}); each tensor-parallel "
            "rank needs its own GPU",
            check=lambda s: s.gpus >= s.tensor_parallel_size
            or (s.gpus == 0 and s.tensor_parallel_size == 1),
        ),
    )

    replicas: int = Field(
        default=1,
        ge=0,
        description="Replicas when autoscaling is off; the starting size when it is on.",
    )
    min_replicas: int = Field(default=1, ge=0, description="Autoscaling lower bound.")
    max_replicas: int = Field(default=8, ge=1, description="Autoscaling upper bound.")
    gpus: int = Field(
        default=1, ge=0, description="GPUs per pod (nvidia.com/gpu); 0 runs on CPU."
    )
    tensor_parallel_size: int = Field(
        default=1, ge=1, description="Tensor-parallel ranks per pod; needs gpus >= this."
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Overrides runtime.resources for this role.",
    )
    engine_args: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="Overrides runtime.engineArgs for this role, e.g. {maxNumBatchedTokens: 8192}.",
    )


class RouterSpec(ApiModel):
    """The OpenAI-compatible router in front of the engines."""

    replicas: int = Field(default=2, ge=1, description="Router replicas.")
    image: str | None = Field(
        default=None, description="Router image; defaults to runtime.image (it holds the router)."
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="Router container resources."
    )
    api_key_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the API keys clients must send (Authorization: Bearer "
        "KEY), one per line; unset: no authentication. Rotating the Secret takes effect "
        "without a restart.",
    )


# ---------------------------------------------------------------------------------------------
# SLO and autoscaling


class LatencyTarget(ApiModel):
    """A latency target: the given quantile must stay at or below `seconds`."""

    quantile: float = Field(
        gt=0, lt=1, description="Quantile of the latency distribution, in (0, 1), e.g. 0.9."
    )
    seconds: float = Field(gt=0, description="Target for that quantile, in seconds.")


class SloSpec(ApiModel):
    """Latency objectives the autoscaler holds the pool to."""

    ttft: LatencyTarget = Field(
        default_factory=lambda: LatencyTarget(quantile=0.9, seconds=1.0),
        description="Time to first token, measured at the router.",
    )
    itl: LatencyTarget = Field(
        default_factory=lambda: LatencyTarget(quantile=0.9, seconds=0.05),
        description="Inter-token latency, measured at the decode engines.",
    )


class AutoscalingMode(StrEnum):
    APPLY = "Apply"
    ADVISORY = "Advisory"


class ScalingBehavior(ApiModel):
    """How fast one direction may move."""

    stabilization_window_seconds: int = Field(
        ge=0,
        description="Recommendations are remembered this long; scale-up takes the window's "
        "minimum, scale-down its maximum (as in the HPA).",
    )
    max_step: int = Field(ge=1, description="Most replicas added or removed in one decision.")
    cooldown_seconds: int = Field(
        ge=0, description="Least time after any scale of this role before the next one."
    )


class AutoscalingTargets(ApiModel):
    """Per-replica targets for the queue and capacity signals."""

    prefill_queue_per_replica: float = Field(
        default=2.0, gt=0, description="Waiting requests per prefill replica before scaling up."
    )
    decode_sequences_per_replica: float = Field(
        default=64.0,
        gt=0,
        description="Running plus waiting sequences per decode replica before scaling up.",
    )
    kv_cache_usage: float = Field(
        default=0.85, gt=0, le=1, description="Decode KV-cache usage (0..1) before scaling up."
    )
    headroom: float = Field(
        default=0.2,
        ge=0,
        lt=1,
        description="Capacity kept free: the capacity signal sizes for load / (1 - headroom).",
    )
    dead_band: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="Relative change below which the current size is kept (0.1 = 10%).",
    )
    prefill_tokens_per_second_per_replica: float | None = Field(
        default=None,
        gt=0,
        description="Prompt tokens/s one prefill replica sustains. Unset: measured from the "
        "prompt-token rate while the prefill queue is at or above its target.",
    )
    decode_tokens_per_second_per_replica: float | None = Field(
        default=None,
        gt=0,
        description="Generated tokens/s one decode replica sustains. Unset: measured from the "
        "generation-token rate while decode runs at its sequence or KV-cache target.",
    )
    ratio_band: float = Field(
        default=0.5,
        ge=0,
        description="Tolerance of the prefill:decode ratio around the ratio the measured "
        "throughputs imply (0.5 = down to 1/1.5 of it); neither role may fall below it.",
    )


class AutoscalingSpec(ApiModel):
    """Autoscaling of the prefill and decode roles from Prometheus signals."""

    enabled: bool = Field(default=True, description="Scale the engine roles automatically.")
    mode: AutoscalingMode = Field(
        default=AutoscalingMode.APPLY,
        description="Apply: scale the Deployments. Advisory: only report decisions in status.",
    )
    interval_seconds: int = Field(default=15, ge=1, description="Seconds between decisions.")
    scale_up: ScalingBehavior = Field(
        default_factory=lambda: ScalingBehavior(
            stabilization_window_seconds=0, max_step=4, cooldown_seconds=30
        ),
        description="Scale-up behaviour.",
    )
    scale_down: ScalingBehavior = Field(
        default_factory=lambda: ScalingBehavior(
            stabilization_window_seconds=300, max_step=2, cooldown_seconds=60
        ),
        description="Scale-down behaviour.",
    )
    targets: AutoscalingTargets = Field(
        default_factory=AutoscalingTargets, description="Per-replica targets."
    )
    scale_to_zero: bool = Field(
        default=False,
        description="Allow minReplicas 0; the pool wakes when requests queue at the router.",
    )
    metrics_max_age_seconds: int = Field(
        default=60,
        ge=1,
        description="Samples older than this count as missing: the autoscaler holds the "
        "current size and sets MetricsAvailable=False.",
    )


class MonitoringSpec(ApiModel):
    """Prometheus Operator objects made for the pool, when its CRDs are installed."""

    service_monitor: bool = Field(default=True, description="Make a ServiceMonitor for the router.")
    pod_monitor: bool = Field(default=True, description="Make a PodMonitor for the engines.")


# ---------------------------------------------------------------------------------------------
# The pool


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
    )

    model: ModelSpec = Field(description="The model to serve.")
    runtime: RuntimeSpec = Field(
        default_factory=RuntimeSpec, description="The engine container, shared by all roles."
    )
    mode: Mode = Field(
        default=Mode.DISAGGREGATED,
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

    def engine_roles(self) -> list[str]:
        """The engine roles this pool runs, in the order they are created."""
        return ["prefill", "decode"] if self.mode == Mode.DISAGGREGATED else ["engine"]

    def role(self, name: str) -> EngineRoleSpec:
        spec: EngineRoleSpec = getattr(self, name)
        return spec

    def served_name(self) -> str:
        return self.model.served_name or self.model.name


# ---------------------------------------------------------------------------------------------
# Status


class ConditionType(StrEnum):
    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    METRICS_AVAILABLE = "MetricsAvailable"
    SCALING_LIMITED = "ScalingLimited"


class Condition(ApiModel):
    """A condition in the Kubernetes style."""

    type: str = Field(description="Ready, Progressing, Degraded, MetricsAvailable, ScalingLimited.")
    status: str = Field(pattern="^(True|False|Unknown)$", description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase reason for the last transition.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str | None = Field(
        default=None, description="When status last changed (RFC 3339)."
    )
    observed_generation: int | None = Field(
        default=None, description="The spec generation this condition describes."
    )


class RoleStatus(ApiModel):
    """Observed and desired size of one role."""

    replicas: int = Field(default=0, description="Pods that exist.")
    ready_replicas: int = Field(default=0, description="Pods that pass readiness.")
    desired_replicas: int | None = Field(
        default=None, description="Replicas the autoscaler last decided on."
    )
    summary: str | None = Field(default=None, description="ready/desired, for kubectl get.")
    last_scale_time: str | None = Field(default=None, description="When the role was last scaled.")
    reason: str | None = Field(default=None, description="CamelCase reason of the last decision.")
    message: str | None = Field(default=None, description="The last decision, in words.")


class ObservedMetrics(ApiModel):
    """Latest SLO signals, as the autoscaler saw them."""

    ttft_seconds: float | None = Field(
        default=None, description="TTFT at the SLO quantile, at the router."
    )
    itl_seconds: float | None = Field(
        default=None, description="ITL at the SLO quantile, at decode."
    )


class InferencePoolStatus(ApiModel):
    """What the operator and the autoscaler observed."""

    observed_generation: int | None = Field(
        default=None, description="The spec generation the operator last acted on."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Pool conditions.")
    prefill: RoleStatus | None = Field(default=None, description="Prefill role.")
    decode: RoleStatus | None = Field(default=None, description="Decode role.")
    engine: RoleStatus | None = Field(default=None, description="Engine role (Aggregated).")
    router: RoleStatus | None = Field(default=None, description="Router.")
    metrics: ObservedMetrics | None = Field(default=None, description="Latest SLO signals.")
    endpoint: str | None = Field(
        default=None, description="OpenAI base URL of the pool, e.g. http://P-router.NS.svc:8000/v1."
    )


class ObjectMeta(BaseModel):
    """The subset of metadata the API needs; everything else passes through."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    namespace: str | None = None


class InferencePool(ApiModel):
    """An InferencePool: one model served by prefill and decode engines behind a router."""

    api_version: str = Field(default=API_VERSION, pattern=f"^{re.escape(API_VERSION)}$")
    kind: str = Field(default=KIND, pattern=f"^{KIND}$")
    metadata: ObjectMeta
    spec: InferencePoolSpec
    status: InferencePoolStatus | None = None
