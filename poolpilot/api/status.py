"""The InferencePool status: conditions, per-role counts, observed metrics.

Part of the InferencePool API (poolpilot.api); no I/O.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    Field,
    field_validator,
)
from pydantic_core import PydanticCustomError

from poolpilot.apitypes import (
    ApiModel,
    Int32,
    Int64,
    Matching,
)

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


