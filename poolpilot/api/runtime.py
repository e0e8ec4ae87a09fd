"""The InferencePool API: the model, the engine container every role shares, and the KV handoff
between prefill and decode (spec.model, spec.runtime, spec.kvTransfer), with the free-form maps
whose keys poolpilot owns (engine args, the connector's extra config).
This module does no I/O (enforced by import-linter).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    model_validator,
)
from pydantic_core import PydanticCustomError

from poolpilot.api.common import (
    EnvVar,
    LocalObjectReference,
    ResourceRequirements,
    SecretKeyRef,
    Toleration,
    refuse_owned_env,
)
from poolpilot.api.model_cache import (
    CacheType,
    ModelCacheSpec,
    ObjectStoreSource,
)
from poolpilot.apitypes import (
    INT64_MAX,
    ApiModel,
    Int32,
    JsonValue,
    LabelValue,
    Matching,
    ObjectName,
    QualifiedName,
    Quantity,
    ReservedKeys,
    Rule,
    TrimmedString,
    qualified_keys_rule,
    quantity_value,
    spellings,
)
from poolpilot.names import ENGINE_OWN_PORTS
from poolpilot.roles import Mode  # noqa: F401  (defined in the core, free of pydantic)

DEFAULT_RUNTIME_IMAGE = "ghcr.io/poolpilot/runtime:0.1.0"


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
    # (vLLM's own would replace the P/D connector with the offloading one)
    "kvOffloadingSize": "from the role's kvOffload",
    "kvOffloadingBackend": "from the role's kvOffload (vLLM's native CPU offloading)",
    # A multi-node replica's place in its LeaderWorkerSet group (the launcher's --nodes).
    "nnodes": "from the role's nodesPerReplica",
    "nodeRank": "from the pod's index in its LeaderWorkerSet group",
    "masterAddr": "from the group's leader (LWS_LEADER_ADDRESS)",
    "headless": "(every pod of a multi-node group but the leader runs headless)",
    # vLLM drains within the pod's grace period (the launcher's --grace-seconds).
    "shutdownTimeout": "from the engine pods' termination grace period",
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
    """Where the weights come from: the Hugging Face Hub (default), a PVC or an object store."""

    rules = (
        Rule(
            field="pvc",
            cel="!(has(self.huggingFace) && has(self.pvc))",
            message="set either huggingFace or pvc, not both",
            check=lambda s: not (s.hugging_face is not None and s.pvc is not None),
        ),
        Rule(
            field="objectStore",
            cel="!has(self.objectStore) || !(has(self.huggingFace) || has(self.pvc))",
            message="set one of huggingFace, pvc or objectStore, not several",
            check=lambda s: s.object_store is None
            or (s.hugging_face is None and s.pvc is None),
        ),
    )

    hugging_face: HuggingFaceSource | None = Field(
        default=None, description="Download from the Hugging Face Hub (the default)."
    )
    pvc: PvcSource | None = Field(default=None, description="Load from a PVC.")
    object_store: ObjectStoreSource | None = Field(
        default=None, description="Fetch or stream from an S3-compatible bucket.")


class ModelSpec(ApiModel):
    """The model to serve."""

    rules = (
        Rule(
            field="cache.type",
            cel="!has(self.cache) || !has(self.cache.type) || self.cache.type != 'Streaming' "
            "|| (has(self.source) && has(self.source.objectStore))",
            message="Streaming reads from an object store: set source.objectStore, or choose "
            "EmptyDir, SharedVolume or NodeLocal",
            check=lambda s: s.cache.type != CacheType.STREAMING
            or s.source.object_store is not None,
        ),
        Rule(
            field="cache.type",
            cel="!has(self.cache) || !has(self.cache.type) || self.cache.type == 'EmptyDir' "
            "|| !has(self.source) || !has(self.source.pvc)",
            message="a source.pvc volume is already shared: keep cache.type EmptyDir (the "
            "default) with it, or drop source.pvc",
            check=lambda s: s.cache.type == CacheType.EMPTY_DIR or s.source.pvc is None,
        ),
    )

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
    cache: ModelCacheSpec = Field(
        default_factory=ModelCacheSpec,
        description="Where the weights and compile caches are kept: per pod (EmptyDir), a "
        "shared volume or a node-local folder filled once, or streamed from the bucket.",
    )
    size: Quantity | None = Field(
        default=None,
        description="The weights' size on disk (e.g. 16Gi for 8B in bf16), for the startup "
        "probe's budget; unset: two bytes per parameter of the size in the name (8B, 70B, "
        "8x7B), else runtime.storage.modelCache.",
    )
    startup_seconds: Int32 | None = Field(
        default=None, ge=30,
        description="Seconds an engine may take to start before its startup probe restarts "
        "it; unset: derived from the size, the cache and the load rates in docs/operator.md.",
    )


class StorageSpec(ApiModel):
    """Sizes of the engine pods' scratch volumes: each emptyDir gets a sizeLimit (the kubelet
    evicts a pod that writes past it) and the disk ones an ephemeral-storage request, so the
    scheduler places the pod where the space is."""

    model_cache: Quantity = Field(
        default="100Gi",
        description="The model cache: the emptyDir the weights download into (a PVC source "
        "has none), or the SharedVolume PVC's request: at least the model's size on disk (8B "
        "in bf16: 16 GB; 70B: 140 GB).",
    )
    compile_cache: Quantity = Field(
        default="10Gi", description="vLLM's, Triton's and torch.compile's caches (the "
        "emptyDir, or the SharedVolume compile PVC's request).")
    tmp: Quantity = Field(default="4Gi", description="/tmp (HOME and TMPDIR).")
    shm: Quantity = Field(
        default="2Gi",
        description="/dev/shm (in memory, counted against the container's memory): tensor-"
        "parallel ranks and NCCL exchange tensors there; raise it for large tensorParallelSize.",
    )

    @model_validator(mode="after")
    def _disk_fits_one_quantity(self) -> StorageSpec:
        # The disk-backed ones add up to the pod's ephemeral-storage request, itself a
        # quantity (at most 2^63-1 bytes). No CEL twin: the CRD's quantities cannot be summed.
        disk = (self.model_cache, self.compile_cache, self.tmp)
        if sum(quantity_value(q) or 0 for q in disk) > INT64_MAX:
            raise PydanticCustomError(
                "storage_total", "modelCache, compileCache and tmp add up to more than a "
                "Kubernetes quantity holds (8Ei, the pod's ephemeral-storage request is their "
                "sum); lower them")
        return self


class RuntimeSpec(ApiModel):
    """The engine container, shared by all engine roles."""

    rules = (qualified_keys_rule("nodeSelector"),)

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
    env: Annotated[list[EnvVar], AfterValidator(refuse_owned_env)] = Field(
        default_factory=list, description="Extra environment variables (not those the operator "
        "sets: POOLPILOT_POOL, POOLPILOT_ROLE, POOLPILOT_ROUTER_CONFIG, "
        "VLLM_NIXL_SIDE_CHANNEL_HOST, VLLM_NIXL_SIDE_CHANNEL_PORT).")
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

    rules = (
        Rule(
            field="sideChannelPort",
            cel="!has(self.sideChannelPort) || !(self.sideChannelPort in "
            f"[{', '.join(map(str, ENGINE_OWN_PORTS))}])",
            message="is one of the engine's own ports (8000 HTTP, 8090 metrics, 5557 and 5558 "
            "KV events), where NIXL could not listen; choose another, e.g. 5600",
            check=lambda s: s.side_channel_port not in ENGINE_OWN_PORTS,
        ),
    )

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
    # Not Int32: its own le (the int32 maximum) would override this one.
    side_channel_port: int = Field(
        default=5600, ge=1024, le=65535, json_schema_extra={"format": "int32"},
        description="NixlConnector: the port of NIXL's side channel (VLLM_NIXL_SIDE_CHANNEL_PORT),"
        " where decode engines fetch a prefill engine's KV layout; declared on the engine "
        "container.",
    )
    rdma: RdmaSpec | None = Field(
        default=None, description="NIXL over RDMA; unset: UCX over TCP on the pod network.")
