"""Building blocks shared with core Kubernetes types: resources, env, tolerations, references.

Part of the InferencePool API (poolpilot.api); no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
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


# Kubernetes' rules for the resources it never overcommits (core validation's
# IsOvercommitAllowed): hugepages-<size>, and extended resources (a name with a domain other
# than *kubernetes.io/, e.g. example.com/fpga), which are also counted in whole units.
_EXTENDED_CEL = "(k.contains('/') && !k.contains('kubernetes.io/'))"
_NOT_OVERCOMMITTED_CEL = f"(k.startsWith('hugepages-') || {_EXTENDED_CEL})"
# Whole units: what the models and the CRD take for an extended resource (Kubernetes also
# takes 1000m or 1e3; write 1).
WHOLE_UNITS = r"^\+?[0-9]+([kMGTPE]|[KMGTPE]i)?$"


def extended_resource(name: str) -> bool:
    """An extended resource (example.com/fpga): counted in whole units, never overcommitted."""
    return "/" in name and "kubernetes.io/" not in name


def not_overcommitted(name: str) -> bool:
    """A resource whose request must equal its limit (and needs one): hugepages, extended."""
    return name.startswith("hugepages-") or extended_resource(name)


def _requests_within_limits(s: Any) -> bool:
    for name, request in s.requests.items():
        if name in s.limits and not not_overcommitted(name):
            want, cap = quantity_value(request), quantity_value(s.limits[name])
            if want is not None and cap is not None and want > cap:
                return False
    return True


def _requests_equal_limits(s: Any) -> bool:
    for name, request in s.requests.items():
        if name in s.limits and not_overcommitted(name):
            want, cap = quantity_value(request), quantity_value(s.limits[name])
            if want is not None and cap is not None and want != cap:
                return False
    return True


def _whole_units_rule(field: str) -> Rule:
    return Rule(
        field=field,
        cel=f"!has(self.{field}) || self.{field}.all(k, !{_EXTENDED_CEL} || "
            f"string(self.{field}[k]).matches({cel_string(WHOLE_UNITS)}))",
        message="extended resources (a domain-qualified name such as example.com/fpga) are "
                "counted in whole units: write an integer such as 1 or 2 (not 500m or 1.5)",
        check=lambda s: all(re2.search(WHOLE_UNITS, str(v))
                            for k, v in getattr(s, field).items() if extended_resource(k)),
    )


HUGEPAGES = "hugepages-"


def _whole_pages(name: str, value: Any) -> bool:
    """A hugepages-<size> amount is a whole number of its pages, as the API server requires
    of a container's (it reads the amount rounded up to an integer, as Quantity.Value)."""
    if not name.startswith(HUGEPAGES):
        return True
    page, amount = quantity_value(name[len(HUGEPAGES):]), quantity_value(value)
    if page is None or amount is None:
        return True  # the name's and the quantity's own rules say what is wrong
    return page > 0 and math.ceil(amount) % page == 0


def _whole_pages_rule(field: str) -> Rule:
    size = f"quantity(k.substring({len(HUGEPAGES)}))"
    amount = f"quantity(string(self.{field}[k]))"
    return Rule(
        field=field,
        cel=f"!has(self.{field}) || self.{field}.all(k, !k.startsWith('{HUGEPAGES}') || "
            f"({size}.isInteger() && {size}.asInteger() > 0 && {amount}.isInteger() && "
            f"{amount}.asInteger() % {size}.asInteger() == 0))",
        message="hugepages-<size> is allocated in whole pages of that size: write a multiple "
                "of it (hugepages-2Mi: 2Mi, 4Mi or 1Gi, not 3Mi)",
        check=lambda s: all(_whole_pages(k, v) for k, v in getattr(s, field).items()),
    )


class ResourceRequirements(ApiModel):
    """CPU, memory and accelerator requests and limits, as in a container spec."""

    rules = (
        _resource_rules("requests"), _resource_rules("limits"),
        _resource_name_rule("requests"), _resource_name_rule("limits"),
        # Kubernetes' CEL quantity library (API servers 1.29 and later).
        Rule(
            field="requests",
            cel="!has(self.requests) || !has(self.limits) || self.requests.all(k, "
                f"!(k in self.limits) || {_NOT_OVERCOMMITTED_CEL} || "
                "!quantity(string(self.requests[k]))"
                ".isGreaterThan(quantity(string(self.limits[k]))))",
            message="each request must be at most its limit; lower the request or raise the "
                    "limit",
            check=_requests_within_limits,
        ),
        Rule(
            field="requests",
            cel="!has(self.requests) || !has(self.limits) || self.requests.all(k, "
                f"!(k in self.limits) || !{_NOT_OVERCOMMITTED_CEL} || "
                "(!quantity(string(self.requests[k]))"
                ".isGreaterThan(quantity(string(self.limits[k]))) && "
                "!quantity(string(self.requests[k]))"
                ".isLessThan(quantity(string(self.limits[k])))))",
            message="hugepages-<size> and extended resources (example.com/fpga) are never "
                    "overcommitted: each request must equal its limit; make them equal, or set "
                    "the limit only (the request defaults to it)",
            check=_requests_equal_limits,
        ),
        Rule(
            field="limits",
            cel=f"!has(self.requests) || self.requests.all(k, !{_NOT_OVERCOMMITTED_CEL} || "
                "(has(self.limits) && k in self.limits))",
            message="hugepages-<size> and extended resources (example.com/fpga) requested here "
                    "need their limit here too (Kubernetes never overcommits them); set the "
                    "limit, equal to the request, or the limit only (the request defaults to it)",
            check=lambda s: all(k in s.limits for k in s.requests if not_overcommitted(k)),
        ),
        _whole_units_rule("requests"), _whole_units_rule("limits"),
        _whole_pages_rule("requests"), _whole_pages_rule("limits"),
    )

    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=32,
        description="Minimum resources, e.g. {cpu: '4', memory: 32Gi}.",
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=32,
        description="Maximum resources. nvidia.com/gpu is set from `gpus`; do not set it here. "
        "hugepages-<size> and extended resources (example.com/fpga) need a limit, equal to "
        "any request.",
    )


def merged_resource_problems(
    container: str, layers: Sequence[tuple[str, ResourceRequirements]],
    set_by_operator: Collection[str] = (),
) -> list[str]:
    """What the API server would refuse in a container whose requests and limits are `layers`
    (path, block), later over earlier, as the operator merges them: a request above the limit
    another block sets (or, for a resource never overcommitted, not equal to it), hugepages
    without cpu or memory. A request and limit of one block are its own rules' concern; the
    resources in `set_by_operator` it sets itself (request and limit alike)."""
    requests: dict[str, tuple[str, Any]] = {}
    limits: dict[str, tuple[str, Any]] = {}
    for path, block in layers:
        requests.update({k: (path, v) for k, v in block.requests.items()})
        limits.update({k: (path, v) for k, v in block.limits.items()})
    problems: list[str] = []
    for name, (where, request) in requests.items():
        if name in set_by_operator or name not in limits or limits[name][0] == where:
            continue
        cap_where, cap = limits[name]
        want, most = quantity_value(request), quantity_value(cap)
        if want is None or most is None:
            continue
        req, lim = f"{where}.requests.{name} ({request})", f"{cap_where}.limits.{name} ({cap})"
        if not_overcommitted(name) and want != most:
            problems.append(
                f"{req} must equal the {container} container's limit {lim}, which is laid over "
                f"it (Kubernetes never overcommits {name}); make them equal")
        elif want > most:
            problems.append(
                f"{req} is above the {container} container's limit {lim}, which is laid over "
                "it; lower the request or raise the limit")
    names = {*requests, *limits}
    if any(n.startswith("hugepages-") for n in names) and not {"cpu", "memory"} & names:
        problems.append(
            f"the {container} container's hugepages need a cpu or memory request or limit "
            f"(Kubernetes requires one); set {layers[0][0]}.requests.memory or cpu")
    return problems


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


