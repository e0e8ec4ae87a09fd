"""The SLO and autoscaling parts of the InferencePool spec.

Part of the InferencePool API (poolpilot.api); no I/O.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import (
    Field,
)

from poolpilot.apitypes import (
    ApiModel,
    Int32,
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

