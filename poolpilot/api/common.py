"""Building blocks shared with core Kubernetes types: resources, env, tolerations, references.

Part of the InferencePool API (poolpilot.api); no I/O.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, TypeVar

from pydantic import (
    Field,
)
from pydantic_core import PydanticCustomError

from poolpilot import re2
from poolpilot.apitypes import (
    ApiModel,
    EnvVarName,
    Int64,
    LabelValue,
    ObjectName,
    QualifiedName,
    Quantity,
    Rule,
    SecretKey,
    cel_string,
    quantity_value,
)

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


class _HasName(Protocol):
    name: str


_Named = TypeVar("_Named", bound=_HasName)

# Environment the operator sets that nothing may replace (the launcher and the router read it).
OWNED_ENV: dict[str, str] = {
    "POOLPILOT_POOL": "(the pool's name)",
    "POOLPILOT_ROLE": "(the pod's role)",
    "POOLPILOT_ROUTER_CONFIG": "(the router's mounted config)",
    "VLLM_NIXL_SIDE_CHANNEL_HOST": "(the pod IP, for the decode engines to reach)",
    "VLLM_NIXL_SIDE_CHANNEL_PORT": "from spec.kvTransfer.sideChannelPort",
}


def refuse_owned_env(env: list[_Named]) -> list[_Named]:
    """Refuse variables the operator sets (runtime.env and pod templates alike: either would
    replace the operator's value on the container)."""
    for e in env:
        if e.name in OWNED_ENV:
            raise PydanticCustomError(
                "owned_env", "{name}: set by the operator {why}; remove it",
                {"name": e.name, "why": OWNED_ENV[e.name]})
    return env


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


