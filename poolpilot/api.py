"""The InferencePool API (group poolpilot.dev, version v1alpha1).

These pydantic models are the single source of truth: the CRD in crds/ is generated from them
(`poolpilot crd`), including the cross-field rules below, which become CEL
`x-kubernetes-validations` so the API server rejects the same specs the models reject.
This module does no I/O (enforced by import-linter).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from poolpilot import handoff, re2
from poolpilot.apitypes import (
    DNS1035_LABEL,
    DNS1123_LABEL,
    QUALIFIED_NAME,
    ApiModel,
    EnvVarName,
    Int32,
    Int64,
    JsonValue,
    LabelValue,
    Matching,
    ObjectName,
    QualifiedName,
    Quantity,
    ReservedKeys,
    Rule,
    RuleFailure,
    SecretKey,
    TrimmedString,
    cel_string,
    collecting_rule_failures,
    quantity_value,
    spellings,
)

__all__ = ["ApiModel", "JsonValue", "Rule", "RuleFailure", "collecting_rule_failures"]

GROUP = "poolpilot.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferencePool"
PLURAL = "inferencepools"
SINGULAR = "inferencepool"
SHORT_NAMES = ["ipool"]
CATEGORIES = ["poolpilot"]
DEFAULT_RUNTIME_IMAGE = "ghcr.io/poolpilot/runtime:0.1.0"

# ---------------------------------------------------------------------------------------------
# Building blocks shared with core Kubernetes types

GPU_RESOURCE = "nvidia.com/gpu"


def _resource_rules(field: str) -> Rule:
    return Rule(
        field=field,
        cel=f"!has(self.{field}) || !('{GPU_RESOURCE}' in self.{field})",
        message=f"{GPU_RESOURCE} is set from the role's `gpus`; set gpus instead",
        check=lambda s: GPU_RESOURCE not in getattr(s, field),
    )


# A container resource: a standard one, or a name qualified by a domain (example.com/foo), as the
# API server's validation of a Pod's container resources requires.
RESOURCE_NAME = (
    r"^(cpu|memory|ephemeral-storage|hugepages-[0-9]+([KMGTPE]i|[kMGTPE])?"
    r"|[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$"
)


def _resource_name_rule(field: str) -> Rule:
    return Rule(
        field=field,
        cel=f"!has(self.{field}) || self.{field}.all(k, k.matches({cel_string(RESOURCE_NAME)}))",
        message="resource names must be cpu, memory, ephemeral-storage, hugepages-<size> or "
                "qualified by a domain (example.com/name)",
        check=lambda s: all(re2.search(RESOURCE_NAME, k) for k in getattr(s, field)),
    )


def _requests_within_limits(s: Any) -> bool:
    for name, request in s.requests.items():
        if name in s.limits:
            want, cap = quantity_value(request), quantity_value(s.limits[name])
            if want is not None and cap is not None and want > cap:
                return False
    return True


class ResourceRequirements(ApiModel):
    """CPU, memory and accelerator requests and limits, as in a container spec."""

    rules = (
        _resource_rules("requests"), _resource_rules("limits"),
        _resource_name_rule("requests"), _resource_name_rule("limits"),
        # Kubernetes' CEL quantity library (API servers 1.29 and later).
        Rule(
            field="requests",
            cel="!has(self.requests) || !has(self.limits) || self.requests.all(k, "
                "!(k in self.limits) || !quantity(string(self.requests[k]))"
                ".isGreaterThan(quantity(string(self.limits[k]))))",
            message="each request must be at most its limit; lower the request or raise the "
                    "limit",
            check=_requests_within_limits,
        ),
    )

    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=32,
        description="Minimum resources, e.g. {cpu: '4', memory: 32Gi}.",
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=32,
        description="Maximum resources. nvidia.com/gpu is set from `gpus`; do not set it here.",
    )


class EnvVar(ApiModel):
    """An environment variable for the engine containers."""

    name: EnvVarName = Field(description="Variable name, e.g. VLLM_LOGGING_LEVEL.")
    value: str = Field(default="", description="Variable value.")


class Toleration(ApiModel):
    """A toleration, as in a pod spec (e.g. for tainted GPU nodes)."""

    rules = (
        Rule(
            field="value",
            cel="!has(self.operator) || self.operator != 'Exists' || !has(self.value) "
            "|| self.value == ''",
            message="must be empty with operator Exists (it matches every value); drop value "
            "or use operator Equal",
            check=lambda s: s.operator != "Exists" or not s.value,
        ),
        Rule(
            field="operator",
            cel="(has(self.key) && self.key != '') || "
            "(has(self.operator) && self.operator == 'Exists')",
            message="must be Exists when key is empty (to tolerate every taint); set key or "
            "operator Exists",
            check=lambda s: bool(s.key) or s.operator == "Exists",
        ),
        Rule(
            field="tolerationSeconds",
            cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            message="only applies to effect NoExecute; set effect NoExecute or drop "
            "tolerationSeconds",
            check=lambda s: s.toleration_seconds is None or s.effect == "NoExecute",
        ),
    )

    key: QualifiedName | None = Field(
        default=None, description="Taint key to tolerate; empty (with Exists) matches all."
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal (the default)."
    )
    value: LabelValue | None = Field(default=None, description="Taint value, with operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate; empty matches all."
    )
    toleration_seconds: Int64 | None = Field(
        default=None, description="How long a NoExecute taint is tolerated."
    )


class LocalObjectReference(ApiModel):
    """A reference to an object in the pool's namespace."""

    name: ObjectName = Field(description="Name of the object.")


class SecretKeyRef(ApiModel):
    """A key in a Secret in the pool's namespace."""

    name: ObjectName = Field(description="Secret name.")
    key: SecretKey = Field(default="token", description="Key within the Secret.")


# ---------------------------------------------------------------------------------------------
# Free-form maps with keys poolpilot owns

# vLLM flags the engine launcher sets itself (it refuses them again as --engine-arg), and where
# each one comes from instead. The launcher reads keys in camelCase, snake_case or kebab-case.
RESERVED_ENGINE_ARGS: dict[str, str] = {
    "model": "from spec.model (name, or source.pvc)",
    "port": "(engines listen on port 8000)",
    "host": "(engines listen on every address of the pod)",
    "servedModelName": "from spec.model.servedName",
    "tensorParallelSize": "from the role's tensorParallelSize",
    "kvTransferConfig": "from spec.kvTransfer (connector and extraConfig)",
}
# kvTransfer.extraConfig keys the launcher sets from the connector and the role.
RESERVED_CONNECTOR_KEYS: dict[str, str] = {
    "kvConnector": "from spec.kvTransfer.connector",
    "kvRole": "from the role (prefill produces KV, decode consumes it)",
}
CONNECTOR_EXTRA_CONFIG_KEY = "kvConnectorExtraConfig"  # must be an object


def _connector_extra_config(value: dict[str, Any]) -> dict[str, Any]:
    for key in spellings(CONNECTOR_EXTRA_CONFIG_KEY):
        if key in value and not isinstance(value[key], dict):
            raise PydanticCustomError(
                "dict_type", "{key}: must be an object (it becomes kv_connector_extra_config)",
                {"key": key},
            )
    return value


EngineArgs = Annotated[dict[str, JsonValue], ReservedKeys(RESERVED_ENGINE_ARGS)]
ConnectorConfig = Annotated[
    dict[str, JsonValue],
    ReservedKeys(
        RESERVED_CONNECTOR_KEYS,
        properties={
            key: {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                  "description": "Passed to vLLM as kv_connector_extra_config."}
            for key in spellings(CONNECTOR_EXTRA_CONFIG_KEY)
        },
    ),
    AfterValidator(_connector_extra_config),
]


# ---------------------------------------------------------------------------------------------
# Model and runtime


class HuggingFaceSource(ApiModel):
    """Download the weights from the Hugging Face Hub at start-up."""

    token_secret: SecretKeyRef | None = Field(
        default=None, description="Secret holding an HF token, for gated models such as Llama."
    )


class PvcSource(ApiModel):
    """Load the weights from a PersistentVolumeClaim that already holds them."""

    claim_name: ObjectName = Field(description="Name of the PVC holding the weights.")
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


class StorageSpec(ApiModel):
    """Sizes of the engine pods' scratch volumes: each emptyDir gets a sizeLimit (the kubelet
    evicts a pod that writes past it) and the disk ones an ephemeral-storage request, so the
    scheduler places the pod where the space is."""

    model_cache: Quantity = Field(
        default="100Gi",
        description="The model-cache emptyDir the weights download into (Hugging Face source; "
        "a PVC source has none): at least the model's size on disk (8B in bf16: 16 GB; 70B: "
        "140 GB).",
    )
    compile_cache: Quantity = Field(
        default="10Gi", description="vLLM's, Triton's and torch.compile's caches.")
    tmp: Quantity = Field(default="4Gi", description="/tmp (HOME and TMPDIR).")
    shm: Quantity = Field(
        default="2Gi",
        description="/dev/shm (in memory, counted against the container's memory): tensor-"
        "parallel ranks and NCCL exchange tensors there; raise it for large tensorParallelSize.",
    )


class RuntimeSpec(ApiModel):
    """The engine container, shared by all engine roles."""

    image: TrimmedString = Field(
        default=DEFAULT_RUNTIME_IMAGE,
        description="Engine image: vLLM's OpenAI server with poolpilot's launcher.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Always, IfNotPresent or Never."
    )
    engine_args: EngineArgs = Field(
        default_factory=dict,
        description="vLLM server arguments in camelCase, e.g. {maxModelLen: 8192}; "
        "per-role engineArgs override these. Flags poolpilot sets itself (model, port, host, "
        "servedModelName, tensorParallelSize, kvTransferConfig) are refused.",
    )
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment variables.")
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="CPU and memory for each engine container (GPUs come from `gpus`).",
    )
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict, description="Node labels the engine pods must run on."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=64, description="Tolerations for the engine pods."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, description="Secrets for pulling the engine image (and the "
        "router's); podTemplate.spec.imagePullSecrets adds to them."
    )
    storage: StorageSpec = Field(
        default_factory=StorageSpec, description="Sizes of the engine pods' scratch volumes."
    )


class Mode(StrEnum):
    DISAGGREGATED = "Disaggregated"
    AGGREGATED = "Aggregated"


class Connector(StrEnum):
    NIXL = "NixlConnector"
    EXAMPLE = "ExampleConnector"
    LMCACHE = "LMCacheConnectorV1"


class RdmaSpec(ApiModel):
    """NIXL over RDMA (InfiniBand, RoCE or EFA): the device resource, IPC_LOCK (to pin the
    buffers it registers), UCX's transports and devices, and the secondary networks."""

    resource: QualifiedName = Field(
        description="The RDMA device plugin's resource, e.g. rdma/ib, rdma/hca_shared_devices_a "
        "or vpc.amazonaws.com/efa.",
    )
    count: Int32 = Field(default=1, ge=1, description="Devices per engine pod.")
    ucx_tls: str | None = Field(
        default="rc,ud,sm,self,cuda_copy,cuda_ipc",
        min_length=1,
        description="UCX_TLS: the transports UCX may use (NIXL's UCX backend).",
    )
    ucx_net_devices: str | None = Field(
        default=None, min_length=1,
        description="UCX_NET_DEVICES, e.g. mlx5_0:1,mlx5_1:1; unset: UCX picks.",
    )
    networks: list[Annotated[str, Matching(
        r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(@[a-z0-9]+)?$",
        "must be a NetworkAttachmentDefinition: NAME, NAMESPACE/NAME or NAME@INTERFACE",
        max_length=253)]] = Field(
        default_factory=list, max_length=16,
        description="Multus NetworkAttachmentDefinitions attached to the engine pods "
        "(k8s.v1.cni.cncf.io/networks), e.g. [rdma-net].",
    )


class KvTransferSpec(ApiModel):
    """How the KV cache moves from prefill to decode (Disaggregated mode)."""

    connector: Connector = Field(
        default=Connector.NIXL,
        strict=False,
        description="vLLM KV connector: NixlConnector, ExampleConnector or LMCacheConnectorV1.",
    )
    extra_config: ConnectorConfig = Field(
        default_factory=dict,
        description="Extra kv_connector_extra_config, passed to vLLM as is (KVTransferConfig "
        "fields such as kv_buffer_device go to the top level); kv_connector and kv_role are "
        "set by poolpilot.",
    )
    side_channel_port: Int32 = Field(
        default=5600, ge=1024, le=65535,
        description="NixlConnector: the port of NIXL's side channel (VLLM_NIXL_SIDE_CHANNEL_PORT),"
        " where decode engines fetch a prefill engine's KV layout; declared on the engine "
        "container.",
    )
    rdma: RdmaSpec | None = Field(
        default=None, description="NIXL over RDMA; unset: UCX over TCP on the pod network.")


# ---------------------------------------------------------------------------------------------
# Pod templates: what a platform adds to the pods the operator renders

# Labels the operator sets on its pods (its Services, budgets, policies and monitors select
# pods by them); a template may add others, never these.
OWNED_POD_LABELS = (
    "app.kubernetes.io/managed-by", "app.kubernetes.io/name", "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
)
OWNED_LABEL_PREFIX = "poolpilot.dev/"
# The volumes the operator mounts (the root filesystem is read-only), by name and path.
OWNED_VOLUMES: dict[str, str] = {
    "tmp": "/tmp",
    "compile-cache": "/var/cache/vllm",
    "model": "/models",
    "model-cache": "/model-cache",
    "dshm": "/dev/shm",
    "config": "/etc/poolpilot/router",
    "api-keys": "/etc/poolpilot/router-keys",
}
# Environment the operator sets that nothing may replace (the launcher and the router read it).
OWNED_ENV: dict[str, str] = {
    "POOLPILOT_POOL": "(the pool's name)",
    "POOLPILOT_ROLE": "(the pod's role)",
    "POOLPILOT_ROUTER_CONFIG": "(the router's mounted config)",
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "(the pod IP, for the decode engines to reach)",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": "from spec.kvTransfer.sideChannelPort",
}


def _owned_schema(owned: dict[str, str]) -> dict[str, Any]:
    """CRD properties for owned keys that always fail, so the API server names them too."""
    return {
        key: {
            "x-kubernetes-preserve-unknown-fields": True,
            "description": f"Set by the operator {why}; not allowed here.",
            "x-kubernetes-validations": [
                {"rule": "false", "message": f"set by the operator {why}; remove it"}],
        }
        for key, why in owned.items()
    }


class _Overlay(ApiModel):
    """A part of a pod template: the fields in `owned` are the operator's (refused, named)."""

    owned: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _refuse_owned(cls, data: Any) -> Any:
        """Each owned key named at its own path (validate's 'reserved' errors), with where its
        value comes from instead."""
        if isinstance(data, dict):
            found = {k: f"set by the operator {cls.owned[k]}; remove it"
                     for k in data if k in cls.owned}
            if found:
                raise PydanticCustomError(
                    "reserved", "{problems}",
                    {"problems": "; ".join(f"{k}: {why}" for k, why in found.items()),
                     "keys": found},
                )
        return data

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> Any:
        schema = super().__get_pydantic_json_schema__(core_schema, handler)
        if cls.owned:
            target = handler.resolve_ref_schema(schema)
            target.setdefault("properties", {}).update(_owned_schema(cls.owned))
        return schema


def _label_key_ok(key: str) -> bool:
    return key not in OWNED_POD_LABELS and not key.startswith(OWNED_LABEL_PREFIX)


def _refuse_keys(kind: str, found: dict[str, str]) -> None:
    """One error at the map's path naming each bad key (as the CRD's rule is on the map)."""
    if found:
        raise PydanticCustomError(
            kind, "{problems}", {"problems": "; ".join(f"{k} {why}" for k, why in found.items())})


def _refuse_owned_labels(labels: dict[str, str]) -> dict[str, str]:
    _refuse_keys("owned_label", {
        k: "is set by the operator (its Services, budgets and policies select pods by it); "
           "remove it" if re2.search(QUALIFIED_NAME, k)
        else "is not a qualified name such as example.com/team or team"
        for k in labels if not (_label_key_ok(k) and re2.search(QUALIFIED_NAME, k))})
    return labels


def _refuse_owned_annotations(annotations: dict[str, str]) -> dict[str, str]:
    _refuse_keys("owned_annotation", {
        k: "is the operator's; remove it" if re2.search(QUALIFIED_NAME, k)
        else "is not a qualified name such as example.com/team or team"
        for k in annotations
        if k.startswith(OWNED_LABEL_PREFIX) or not re2.search(QUALIFIED_NAME, k)})
    return annotations


_OWNED_LABELS_CEL = (
    "!has(self.labels) || self.labels.all(k, !k.startsWith('poolpilot.dev/') && !(k in ["
    + ", ".join(cel_string(k) for k in OWNED_POD_LABELS) + "]))"
)


class PodTemplateMetadata(_Overlay):
    """Labels and annotations added to the pods (a Kueue queue, Multus networks, cost
    allocation); the operator's own labels (poolpilot.dev/*, app.kubernetes.io/*) are kept."""

    rules = (
        Rule(field="labels", cel=_OWNED_LABELS_CEL,
             message="the operator sets poolpilot.dev/* and app.kubernetes.io/managed-by, "
                     "name, instance and component (its Services and policies select pods by "
                     "them); remove them",
             check=lambda s: all(_label_key_ok(k) for k in s.labels)),
        Rule(field="labels",
             cel="!has(self.labels) || self.labels.all(k, "
                 f"k.matches({cel_string(QUALIFIED_NAME)}))",
             message="keys must be qualified names such as example.com/team or team",
             check=lambda s: all(re2.search(QUALIFIED_NAME, k) for k in s.labels)),
        Rule(field="annotations",
             cel="!has(self.annotations) || self.annotations.all(k, "
                 f"k.matches({cel_string(QUALIFIED_NAME)}))",
             message="keys must be qualified names such as example.com/team or team",
             check=lambda s: all(re2.search(QUALIFIED_NAME, k) for k in s.annotations)),
        Rule(field="annotations",
             cel="!has(self.annotations) || self.annotations.all(k, "
                 "!k.startsWith('poolpilot.dev/'))",
             message="poolpilot.dev/* annotations are the operator's; remove them",
             check=lambda s: not any(k.startswith(OWNED_LABEL_PREFIX) for k in s.annotations)),
    )
    owned = {"name": "(from the role's Deployment)", "namespace": "(the pool's namespace)"}

    labels: Annotated[dict[str, LabelValue], AfterValidator(_refuse_owned_labels)] = Field(
        default_factory=dict, max_length=64,
        description="Pod labels, e.g. {kueue.x-k8s.io/queue-name: gpu-queue}.",
    )
    annotations: Annotated[dict[str, str], AfterValidator(_refuse_owned_annotations)] = Field(
        default_factory=dict, max_length=64,
        description="Pod annotations, e.g. {k8s.v1.cni.cncf.io/networks: rdma-net}.",
    )


class EnvVarOverlay(ApiModel):
    """An environment variable, as in a container spec (value or valueFrom)."""

    rules = (
        Rule(field="valueFrom", cel="!(has(self.value) && has(self.valueFrom))",
             message="set either value or valueFrom, not both",
             check=lambda s: s.value is None or s.value_from is None),
    )

    name: EnvVarName = Field(description="Variable name.")
    value: str | None = Field(default=None, description="Variable value.")
    value_from: dict[str, JsonValue] | None = Field(
        default=None, description="A source, as in a container's env (secretKeyRef, "
        "configMapKeyRef, fieldRef, resourceFieldRef).")


def _refuse_owned_env(env: list[EnvVarOverlay]) -> list[EnvVarOverlay]:
    for e in env:
        if e.name in OWNED_ENV:
            raise PydanticCustomError(
                "owned_env", "{name}: set by the operator {why}; remove it",
                {"name": e.name, "why": OWNED_ENV[e.name]})
    return env


class VolumeMount(ApiModel):
    """A volume mounted into the container, as in a container spec."""

    name: str = Field(min_length=1, max_length=63,
                      description="A volume of podTemplate.spec.volumes (or the operator's).")
    mount_path: str = Field(min_length=1, description="Where, e.g. /mnt/data.")
    read_only: bool | None = Field(default=None, description="Mount read-only.")
    sub_path: str | None = Field(default=None, description="A path inside the volume.")


def _refuse_owned_mounts(mounts: list[VolumeMount]) -> list[VolumeMount]:
    paths = {path: name for name, path in OWNED_VOLUMES.items()}
    for m in mounts:
        where = m.mount_path.rstrip("/") or "/"
        if where in paths:
            raise PydanticCustomError(
                "owned_mount", "{path}: the operator mounts {name} there; choose another path",
                {"path": m.mount_path, "name": paths[where]})
    return mounts


class Capabilities(ApiModel):
    """Linux capabilities added to the container (it drops ALL; add puts some back)."""

    add: list[Annotated[str, Matching(r"^[A-Z_]+$", "must be a capability name such as "
                                      "IPC_LOCK or NET_RAW", max_length=64)]] = Field(
        default_factory=list, max_length=32, description="Capabilities to add, e.g. [IPC_LOCK].")


class ContainerSecurityOverlay(_Overlay):
    """What a template may change in the container's securityContext: capabilities to add."""

    owned = {key: "(non-root, no privilege escalation, read-only root filesystem, "
                  "RuntimeDefault seccomp)"
             for key in ("privileged", "runAsUser", "runAsGroup", "runAsNonRoot",
                         "allowPrivilegeEscalation", "readOnlyRootFilesystem",
                         "seccompProfile")}
    capabilities: Capabilities = Field(default_factory=Capabilities,
                                       description="Capabilities to add.")


CONTAINER_OWNED: dict[str, str] = {
    "image": "from spec.runtime.image (spec.router.image for the router)",
    "imagePullPolicy": "from spec.runtime.imagePullPolicy",
    "command": "(the launcher's command line, from the pool's spec)",
    "args": "(the launcher's command line, from the pool's spec)",
    "ports": "(8000, and the KV events and NIXL ports the spec turns on)",
    "readinessProbe": "(GET /health)",
    "livenessProbe": "(GET /health)",
    "startupProbe": "(GET /health, while the weights load)",
    "lifecycle": "(the preStop that lets endpoints update before SIGTERM)",
}


class ContainerOverlay(_Overlay):
    """Additions to the operator's container, matched by name (engine, or router): merged as
    `kubectl patch --type strategic` would (env by name, volumeMounts by mountPath)."""

    owned = CONTAINER_OWNED

    name: Literal["engine", "router"] = Field(
        description="The container to overlay: engine (engine pods) or router (router pods).")
    env: Annotated[list[EnvVarOverlay], AfterValidator(_refuse_owned_env)] = Field(
        default_factory=list, max_length=128,
        description="Variables added, or replacing the operator's of the same name.")
    env_from: list[dict[str, JsonValue]] = Field(
        default_factory=list, max_length=32,
        description="Sources of variables, as in a container spec (configMapRef, secretRef).")
    volume_mounts: Annotated[list[VolumeMount], AfterValidator(_refuse_owned_mounts)] = Field(
        default_factory=list, max_length=64, description="Mounts added (by mountPath).")
    security_context: ContainerSecurityOverlay = Field(
        default_factory=ContainerSecurityOverlay,
        description="Capabilities to add (e.g. IPC_LOCK for RDMA).")
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Requests and limits merged over the role's (e.g. {limits: {rdma/ib: 1}}); "
        "GPUs come from `gpus`.")


class PodVolume(ApiModel):
    """A volume, as in a pod spec: a name and one source (free-form, checked by the API
    server as a Pod's volume)."""

    model_config = ConfigDict(extra="allow")

    name: Annotated[str, Matching(DNS1123_LABEL, "must be a DNS-1123 label (e.g. data)",
                                  max_length=63)] = Field(description="Volume name.")


def _refuse_owned_volumes(volumes: list[PodVolume]) -> list[PodVolume]:
    for v in volumes:
        if v.name in OWNED_VOLUMES:
            raise PydanticCustomError(
                "owned_volume", "{name}: a volume of the operator's ({path}); choose another name",
                {"name": v.name, "path": OWNED_VOLUMES[v.name]})
    return volumes


POD_SPEC_OWNED: dict[str, str] = {
    "initContainers": "(none: the launcher does the set-up)",
    "securityContext": "(non-root uid 1000, RuntimeDefault seccomp); add capabilities with "
                       "containers[].securityContext.capabilities",
    "terminationGracePeriodSeconds": "from the role's terminationGracePeriodSeconds (the "
                                     "engine's drain is derived from it)",
    "automountServiceAccountToken": "(engines get no token, the router its own)",
    "hostNetwork": "(pods use the pod network; RDMA goes through kvTransfer.rdma)",
}


class PodSpecOverlay(_Overlay):
    """Pod spec fields a template sets; lists and maps are merged with the operator's."""

    owned = POD_SPEC_OWNED

    affinity: dict[str, JsonValue] | None = Field(
        default=None, description="Affinity, as in a pod spec; the role's replaces the pool's "
        "for each of nodeAffinity, podAffinity and podAntiAffinity.")
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=64,
        description="Tolerations added to runtime.tolerations (e.g. for spot nodes).")
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict, description="Node labels merged over runtime.nodeSelector.")
    priority_class_name: ObjectName | None = Field(
        default=None, description="PriorityClass of the pods.")
    service_account_name: ObjectName | None = Field(
        default=None, description="ServiceAccount for engine pods (e.g. for workload "
        "identity); the router keeps its own, which discovery needs.")
    runtime_class_name: ObjectName | None = Field(
        default=None, description="RuntimeClass, e.g. nvidia.")
    scheduler_name: ObjectName | None = Field(default=None, description="Scheduler name.")
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=16,
        description="Added to runtime.imagePullSecrets (by name).")
    volumes: Annotated[list[PodVolume], AfterValidator(_refuse_owned_volumes)] = Field(
        default_factory=list, max_length=64, description="Volumes added (by name).")
    containers: list[ContainerOverlay] = Field(
        default_factory=list, max_length=1,
        description="Additions to the operator's container (its name: engine or router).")


class PodTemplate(_Overlay):
    """Labels, annotations and pod spec fields laid over the pods the operator renders: the
    pool's (spec.podTemplate) on every engine pod, a role's (spec.<role>.podTemplate) over that;
    fields the operator must own are refused, each named."""

    metadata: PodTemplateMetadata = Field(
        default_factory=PodTemplateMetadata, description="Pod labels and annotations.")
    spec: PodSpecOverlay = Field(default_factory=PodSpecOverlay, description="Pod spec fields.")


def _containers_named(name: str) -> Rule:
    """A role's template overlays its own container only (engine pods: engine)."""
    return Rule(
        field="podTemplate.spec.containers",
        cel="!has(self.podTemplate) || !has(self.podTemplate.spec) || "
            "!has(self.podTemplate.spec.containers) || "
            f"self.podTemplate.spec.containers.all(c, c.name == '{name}')",
        message=f"these pods' container is {name}; only it can be overlaid",
        check=lambda s: all(c.name == name for c in s.pod_template.spec.containers),
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


# The preStop sleep and vLLM's teardown come out of the grace period (launcher
# --grace-seconds); what is left is vLLM's --shutdown-timeout, at least 1 s.
MIN_ENGINE_GRACE_SECONDS = 16
# A prefill engine (NIXL) holds each prompt's KV for the lease; its drain should cover it.
MIN_PREFILL_NIXL_GRACE_SECONDS = 10 + handoff.kv_lease_seconds() + 5


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
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Overrides runtime.resources for this role.",
    )
    engine_args: EngineArgs = Field(
        default_factory=dict,
        description="Overrides runtime.engineArgs for this role, e.g. {maxNumBatchedTokens: 8192}.",
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
        "512Mi; limit memory 2Gi).",
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
    EXTERNAL = "External"  # KEDA or an HPA sizes the roles; poolpilot's autoscaler stays out


class ScalingBehavior(ApiModel):
    """How fast one direction may move."""

    stabilization_window_seconds: Int32 = Field(
        ge=0,
        description="Recommendations are remembered this long; scale-up takes the window's "
        "minimum, scale-down its maximum (as in the HPA).",
    )
    max_step: Int32 = Field(ge=1, description="Most replicas added or removed in one decision.")
    cooldown_seconds: Int32 = Field(
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
        description="Prefill capacity kept free: the capacity model sizes prefill for "
        "demand / (1 - headroom). The starting value: the autoscaler raises it when TTFT "
        "breaches with requests queued below that utilization, and lowers it when prefill "
        "served more within the TTFT target.",
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
        description="Prompt tokens/s one prefill replica sustains (from a profile of the "
        "engine): where the capacity model starts; refined online from saturated minutes and "
        "from what replicas served. Unset: measured at the first saturated minute.",
    )
    decode_tokens_per_second_per_replica: float | None = Field(
        default=None,
        gt=0,
        description="Generated tokens/s one decode replica sustains within the ITL target "
        "(from a profile of the engine): where the capacity model starts; refined online. "
        "Unset: measured while decode runs at its KV-cache or ITL target.",
    )
    ratio_band: float = Field(
        default=0.5,
        ge=0,
        description="Tolerance of the prefill:decode ratio around the ratio the measured "
        "throughputs imply (0.5 = down to 1/1.5 of it); neither role may fall below it.",
    )
    backlog_drain_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a queued backlog should drain in: the capacity model orders "
        "replicas for what the replicas asked for will not have drained one cold start ahead.",
    )


class AutoscalingSpec(ApiModel):
    """Autoscaling of the prefill and decode roles from Prometheus signals."""

    enabled: bool = Field(default=True, description="Scale the engine roles automatically.")
    mode: AutoscalingMode = Field(
        default=AutoscalingMode.APPLY,
        strict=False,
        description="Apply: scale the Deployments. Advisory: only report decisions in status. "
        "External: another autoscaler (a KEDA ScaledObject, an HPA) owns the engine roles' "
        "replicas; the operator sets the starting size once and never resets it, and "
        "poolpilot's autoscaler leaves the pool alone.",
    )
    interval_seconds: Int32 = Field(default=15, ge=1, description="Seconds between decisions.")
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
    metrics_max_age_seconds: Int32 = Field(
        default=60,
        ge=1,
        description="Samples older than this count as missing: the autoscaler holds the "
        "current size and sets MetricsAvailable=False.",
    )
    cold_start_seconds: Int32 = Field(
        default=120,
        ge=1,
        description="Seconds from a scale-up until the new replica serves, until the "
        "autoscaler has seen one (then it learns it from the pods): how far ahead it looks.",
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
        description="Namespaces whose pods may scrape the engines' metrics on port 8000 "
        "(where Prometheus runs).",
    )
    router_from: list[dict[str, JsonValue]] = Field(
        default_factory=list, max_length=32,
        description="Who may reach the router's port: NetworkPolicy peers (podSelector, "
        "namespaceSelector, ipBlock), e.g. [{namespaceSelector: {matchLabels: "
        "{kubernetes.io/metadata.name: ingress-nginx}}}]; empty: anyone.",
    )


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
    pod_template: PodTemplate = Field(
        default_factory=PodTemplate,
        description="Laid over every engine pod the operator renders (labels, annotations, "
        "affinity, tolerations, volumes, the engine container's env and mounts, ...); "
        "spec.<role>.podTemplate goes over it.",
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


# metav1.Condition's schema (k8s.io/apimachinery), as the API server checks it for built-in
# types: every field but observedGeneration is required.
CONDITION_TYPE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class Condition(ApiModel):
    """A condition in the Kubernetes style (metav1.Condition)."""

    type: Annotated[str, Matching(CONDITION_TYPE, "must be a condition type such as Ready",
                                  max_length=316)] = Field(
        description="Ready, Progressing, Degraded, MetricsAvailable, ScalingLimited.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: Annotated[str, Matching(CONDITION_REASON, "must be CamelCase, e.g. AllReplicasReady",
                                    max_length=1024)] = Field(
        description="CamelCase reason for the last transition.")
    message: str = Field(max_length=32768, description="Human-readable detail.")
    last_transition_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})] = Field(
        description="When status last changed (RFC 3339).")
    observed_generation: Int64 | None = Field(
        default=None, ge=0, description="The spec generation this condition describes."
    )


class RoleStatus(ApiModel):
    """Observed and desired size of one role."""

    replicas: Int32 = Field(default=0, description="Pods that exist.")
    ready_replicas: Int32 = Field(default=0, description="Pods that pass readiness.")
    desired_replicas: Int32 | None = Field(
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

    observed_generation: Int64 | None = Field(
        default=None, description="The spec generation the operator last acted on."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Pool conditions, at most one of each type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    prefill: RoleStatus | None = Field(default=None, description="Prefill role.")
    decode: RoleStatus | None = Field(default=None, description="Decode role.")
    engine: RoleStatus | None = Field(default=None, description="Engine role (Aggregated).")
    router: RoleStatus | None = Field(default=None, description="Router.")
    metrics: ObservedMetrics | None = Field(default=None, description="Latest SLO signals.")
    endpoint: str | None = Field(
        default=None, description="OpenAI base URL of the pool, e.g. http://P-router.NS.svc:8000/v1."
    )

    @field_validator("conditions")
    @classmethod
    def _one_condition_per_type(cls, conditions: list[Condition]) -> list[Condition]:
        types = [c.type for c in conditions]
        duplicates = sorted({t for t in types if types.count(t) > 1})
        if duplicates:
            raise PydanticCustomError(
                "duplicate", "conditions are keyed by type; {types} given more than once",
                {"types": ", ".join(duplicates)},
            )
        return conditions


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

    api_version: Literal["poolpilot.dev/v1alpha1"] = "poolpilot.dev/v1alpha1"
    kind: Literal["InferencePool"] = "InferencePool"
    metadata: ObjectMeta
    spec: InferencePoolSpec
    status: InferencePoolStatus | None = None
