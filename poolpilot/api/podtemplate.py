"""Pod-template overlays: what a platform adds to the pods the operator renders.

Part of the InferencePool API (poolpilot.api); no I/O.
"""

from __future__ import annotations

import posixpath
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    model_validator,
)
from pydantic_core import PydanticCustomError

from poolpilot.api.common import (
    LocalObjectReference,
    ResourceRequirements,
    Toleration,
    refuse_owned_env,
)
from poolpilot.apitypes import (
    DNS1123_LABEL,
    ApiModel,
    EnvVarName,
    JsonValue,
    LabelValue,
    Matching,
    ObjectName,
    Rule,
    cel_string,
    qualified_keys_rule,
    qualified_name,
)

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
        value comes from instead. A null is unset (the API server prunes it), not a value."""
        if isinstance(data, dict):
            found = {k: f"set by the operator {cls.owned[k]}; remove it"
                     for k, v in data.items() if k in cls.owned and v is not None}
            if found:
                raise PydanticCustomError(
                    "reserved", "{problems}",
                    {"problems": "; ".join(f"{k}: {why}" for k, why in found.items()),
                     "keys": found},
                )
            return {k: v for k, v in data.items() if k not in cls.owned}
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
           "remove it" if qualified_name(k)
        else "is not a qualified name such as example.com/team or team"
        for k in labels if not (_label_key_ok(k) and qualified_name(k))})
    return labels


def _refuse_owned_annotations(annotations: dict[str, str]) -> dict[str, str]:
    _refuse_keys("owned_annotation", {
        k: "is the operator's; remove it" if qualified_name(k)
        else "is not a qualified name such as example.com/team or team"
        for k in annotations
        if k.startswith(OWNED_LABEL_PREFIX) or not qualified_name(k)})
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
        qualified_keys_rule("labels"),
        qualified_keys_rule("annotations"),
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
        # as the kernel resolves it: //tmp, /tmp/. and /x/../tmp are /tmp
        where = posixpath.normpath("/" + m.mount_path.lstrip("/"))
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
    env: Annotated[list[EnvVarOverlay], AfterValidator(refuse_owned_env)] = Field(
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
    rules = (qualified_keys_rule("nodeSelector"),)

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


