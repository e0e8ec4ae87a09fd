"""Why the autoscaler sized a role as it did: one vocabulary for every place that shows it.

A `Reason` is what `status.<role>.reason` says, what the `reason` label of
`poolpilot_autoscaler_decisions_total` and `poolpilot_autoscaler_scaling_limited` carries,
what the autoscaler's Events and conditions name, and what the dashboards list. The decision
core (`poolpilot.autoscaler.decide`) returns only these; `STEP_OF` says which step of the
decision gives each one, `DESCRIPTION` what it means (docs/autoscaler.md has the same table).
A `SignalName` is what a decision measured against a target (`SIGNAL_UNIT`: in what unit).
"""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    # data: before any signal is read
    SCALED_TO_ZERO = "ScaledToZero"
    WAKE_UP = "WakeUp"
    NO_READY_REPLICAS = "NoReadyReplicas"
    METRICS_UNAVAILABLE = "MetricsUnavailable"
    METRICS_STALE = "MetricsStale"
    # signals: the winning proposal
    NO_TRAFFIC = "NoTraffic"
    WITHIN_DEAD_BAND = "WithinDeadBand"
    SIGNALS_ABSTAIN = "SignalsAbstain"
    AT_RECOMMENDED_SIZE = "AtRecommendedSize"
    TTFT_ABOVE_TARGET = "TTFTAboveTarget"
    ITL_ABOVE_TARGET = "ITLAboveTarget"
    QUEUE_ABOVE_TARGET = "QueueAboveTarget"
    QUEUE_BELOW_TARGET = "QueueBelowTarget"
    PROMPT_THROUGHPUT_ABOVE_TARGET = "PromptThroughputAboveTarget"
    PROMPT_THROUGHPUT_BELOW_TARGET = "PromptThroughputBelowTarget"
    SEQUENCES_ABOVE_TARGET = "SequencesAboveTarget"
    SEQUENCES_BELOW_TARGET = "SequencesBelowTarget"
    KV_CACHE_ABOVE_TARGET = "KVCacheAboveTarget"
    KV_CACHE_BELOW_TARGET = "KVCacheBelowTarget"
    # capacity: the capacity model, now
    CAPACITY_NEEDED = "CapacityNeeded"
    CAPACITY_IDLE = "CapacityIdle"
    # forecast: the capacity model, one cold start ahead
    DEMAND_ABOVE_CAPACITY = "DemandAboveCapacity"
    DEMAND_RISING = "DemandRising"
    # ratio
    RATIO_FLOOR = "RatioFloor"
    # stabilization
    SCALE_UP_STABILIZED = "ScaleUpStabilized"
    SCALE_DOWN_STABILIZED = "ScaleDownStabilized"
    STABILIZATION_WINDOW_FILLING = "StabilizationWindowFilling"
    # rate
    SCALE_UP_RATE_LIMITED = "ScaleUpRateLimited"
    SCALE_DOWN_RATE_LIMITED = "ScaleDownRateLimited"
    # cooldown
    SCALE_UP_COOLDOWN = "ScaleUpCooldown"
    SCALE_DOWN_COOLDOWN = "ScaleDownCooldown"
    # pending: pods asked for and not serving yet
    WAITING_FOR_STARTING_REPLICAS = "WaitingForStartingReplicas"
    UNSCHEDULABLE = "Unschedulable"
    # bounds
    CLAMPED_TO_MIN = "ClampedToMin"
    CLAMPED_TO_MAX = "ClampedToMax"
    MAX_REPLICAS_REACHED = "MaxReplicasReached"
    KV_TRANSFER_FAILING = "KVTransferFailing"
    # conditions only
    METRICS_FOUND = "MetricsFound"
    SCALING_ALLOWED = "ScalingAllowed"
    # Events: what was done with a decision
    SCALED_UP = "ScaledUp"
    SCALED_DOWN = "ScaledDown"
    SCALE_FAILED = "ScaleFailed"


class SignalName(StrEnum):
    """What a decision compared with a target: the `signal` label of
    `poolpilot_autoscaler_signal` and `poolpilot_autoscaler_signal_target`, the names in a
    decision's message, and what the dashboards' signal panels select (one panel per unit)."""

    TTFT = "TTFT"
    ITL = "ITL"
    QUEUE = "Queue"
    SEQUENCES = "Sequences"
    PROMPT_THROUGHPUT = "PromptThroughput"
    KV_CACHE = "KVCache"
    # the capacity model's demand (rate plus backlog to drain), now and one cold start ahead,
    # against the replicas' capacity less headroom: shown, it sizes in its own steps
    PROMPT_TOKENS_DEMAND = "PromptTokensDemand"
    PROMPT_TOKENS_AHEAD = "PromptTokensAhead"
    GENERATION_TOKENS_DEMAND = "GenerationTokensDemand"
    GENERATION_TOKENS_AHEAD = "GenerationTokensAhead"


# Each signal's unit (its value's and its target's) and meaning.
SIGNAL_UNIT: dict[SignalName, str] = {
    SignalName.TTFT: "seconds", SignalName.ITL: "seconds",
    SignalName.QUEUE: "requests", SignalName.SEQUENCES: "requests",
    SignalName.PROMPT_THROUGHPUT: "tokens/s",
    SignalName.PROMPT_TOKENS_DEMAND: "tokens/s", SignalName.PROMPT_TOKENS_AHEAD: "tokens/s",
    SignalName.GENERATION_TOKENS_DEMAND: "tokens/s",
    SignalName.GENERATION_TOKENS_AHEAD: "tokens/s",
    SignalName.KV_CACHE: "fraction",
}
SIGNAL_DESCRIPTION: dict[SignalName, str] = {
    SignalName.TTFT: "time to first token (at the router, else the engines) against the SLO",
    SignalName.ITL: "inter-token latency at the decode engines against the SLO",
    SignalName.QUEUE: "requests waiting at prefill against prefillQueuePerReplica x ready",
    SignalName.SEQUENCES: "decode sequences against decodeSequencesPerReplica x ready",
    SignalName.PROMPT_THROUGHPUT: "prompt tokens/s against the ready replicas' capacity less "
                                  "headroom (while the capacity model does not know prefill)",
    SignalName.KV_CACHE: "decode's KV-cache usage against kvCacheUsage",
    SignalName.PROMPT_TOKENS_DEMAND: "prefill's demand (prompt tokens/s plus the backlog to "
                                     "drain) against its replicas' capacity less headroom",
    SignalName.PROMPT_TOKENS_AHEAD: "the same one cold start ahead (the forecast)",
    SignalName.GENERATION_TOKENS_DEMAND: "decode's demand (generated tokens/s) against its "
                                         "replicas' capacity less headroom",
    SignalName.GENERATION_TOKENS_AHEAD: "the same one cold start ahead (the forecast)",
}


DESCRIPTION: dict[Reason, str] = {
    Reason.SCALED_TO_ZERO: "at 0 replicas and no request waits at the router",
    Reason.WAKE_UP: "at 0 replicas and requests wait at the router: back to max(1, min)",
    Reason.NO_READY_REPLICAS: "no ready replica to measure: holding",
    Reason.METRICS_UNAVAILABLE: "a signal is missing, NaN, infinite or negative, or Prometheus "
                                "failed: holding (no data is never zero load)",
    Reason.METRICS_STALE: "the newest sample is older than metricsMaxAgeSeconds: holding",
    Reason.NO_TRAFFIC: "no request at all: every load signal proposes 0",
    Reason.WITHIN_DEAD_BAND: "every signal within deadBand of its target",
    Reason.SIGNALS_ABSTAIN: "no signal proposes a size (latencies below target; the capacity "
                            "model sizes the load)",
    Reason.AT_RECOMMENDED_SIZE: "the winning proposal is the current size",
    Reason.TTFT_ABOVE_TARGET: "time to first token above the SLO",
    Reason.ITL_ABOVE_TARGET: "inter-token latency above the SLO",
    Reason.QUEUE_ABOVE_TARGET: "prefill queue above prefillQueuePerReplica",
    Reason.QUEUE_BELOW_TARGET: "prefill queue below prefillQueuePerReplica",
    Reason.PROMPT_THROUGHPUT_ABOVE_TARGET: "prompt tokens/s above what the replicas sustain",
    Reason.PROMPT_THROUGHPUT_BELOW_TARGET: "prompt tokens/s below what the replicas sustain",
    Reason.SEQUENCES_ABOVE_TARGET: "decode sequences above decodeSequencesPerReplica",
    Reason.SEQUENCES_BELOW_TARGET: "decode sequences below decodeSequencesPerReplica",
    Reason.KV_CACHE_ABOVE_TARGET: "decode KV-cache usage above kvCacheUsage",
    Reason.KV_CACHE_BELOW_TARGET: "decode KV-cache usage below kvCacheUsage",
    Reason.CAPACITY_NEEDED: "the demand and the backlog need the replicas the role has",
    Reason.CAPACITY_IDLE: "the capacity model says some replicas are idle: scale down",
    Reason.DEMAND_ABOVE_CAPACITY: "one cold start from now the demand and the backlog left "
                                  "need more replicas than asked for (starting ones counted)",
    Reason.DEMAND_RISING: "as DemandAboveCapacity, with the forecast (the rising trend, or "
                          "the rises seen within a cold start) adding replicas",
    Reason.RATIO_FLOOR: "held up by the prefill:decode ratio to the other role's scale-up",
    Reason.SCALE_UP_STABILIZED: "scale-up to the minimum over scaleUp's window",
    Reason.SCALE_DOWN_STABILIZED: "scale-down to the maximum over scaleDown's window",
    Reason.STABILIZATION_WINDOW_FILLING: "restarted, measurements (this role's or another's) "
                                         "missing or resumed after a gap, or the request path "
                                         "whole again after a pod's restart: no scale-down "
                                         "until the window has filled",
    Reason.SCALE_UP_RATE_LIMITED: "at most scaleUp.maxStep replicas added per decision",
    Reason.SCALE_DOWN_RATE_LIMITED: "at most scaleDown.maxStep replicas removed per decision",
    Reason.SCALE_UP_COOLDOWN: "scaleUp.cooldownSeconds since the role's last scale",
    Reason.SCALE_DOWN_COOLDOWN: "scaleDown.cooldownSeconds since the role's last scale",
    Reason.WAITING_FOR_STARTING_REPLICAS: "replicas still starting are capacity on the way",
    Reason.UNSCHEDULABLE: "pods the scheduler cannot place: no scale-up, ScalingLimited",
    Reason.CLAMPED_TO_MIN: "brought up to minReplicas",
    Reason.CLAMPED_TO_MAX: "brought down to maxReplicas",
    Reason.MAX_REPLICAS_REACHED: "wants more than maxReplicas (ScalingLimited)",
    Reason.KV_TRANSFER_FAILING: "KV handoffs between the roles keep failing: scaling cannot "
                                "help (ScalingLimited)",
    Reason.METRICS_FOUND: "every role has fresh samples (MetricsAvailable)",
    Reason.SCALING_ALLOWED: "no limit reached (ScalingLimited=False)",
    Reason.SCALED_UP: "the Deployment's scale was raised (Normal Event)",
    Reason.SCALED_DOWN: "the Deployment's scale was lowered (Normal Event)",
    Reason.SCALE_FAILED: "writing the scale failed: no cooldown starts, retried next interval "
                         "(Warning Event)",
}

class StepName(StrEnum):
    """The decision step that gives each reason (the order the core runs them in): a role's
    `Step.name`, and the headings of the reasons' table."""

    DATA = "data"
    SIGNALS = "signals"
    CAPACITY = "capacity"
    FORECAST = "forecast"
    RATIO = "ratio"
    STABILIZATION = "stabilization"
    RATE = "rate"
    COOLDOWN = "cooldown"
    PENDING = "pending"
    BOUNDS = "bounds"
    CONDITION = "condition"
    EVENT = "event"


STEPS = tuple(StepName)
_STEP_MEMBERS: dict[StepName, tuple[Reason, ...]] = {
    StepName.DATA: (Reason.SCALED_TO_ZERO, Reason.WAKE_UP, Reason.NO_READY_REPLICAS,
        Reason.METRICS_UNAVAILABLE, Reason.METRICS_STALE),
    StepName.SIGNALS: (Reason.NO_TRAFFIC, Reason.WITHIN_DEAD_BAND, Reason.SIGNALS_ABSTAIN,
        Reason.AT_RECOMMENDED_SIZE,
        Reason.TTFT_ABOVE_TARGET, Reason.ITL_ABOVE_TARGET, Reason.QUEUE_ABOVE_TARGET,
        Reason.QUEUE_BELOW_TARGET, Reason.PROMPT_THROUGHPUT_ABOVE_TARGET,
        Reason.PROMPT_THROUGHPUT_BELOW_TARGET, Reason.SEQUENCES_ABOVE_TARGET,
        Reason.SEQUENCES_BELOW_TARGET, Reason.KV_CACHE_ABOVE_TARGET,
        Reason.KV_CACHE_BELOW_TARGET),
    StepName.CAPACITY: (Reason.CAPACITY_NEEDED, Reason.CAPACITY_IDLE),
    StepName.FORECAST: (Reason.DEMAND_ABOVE_CAPACITY, Reason.DEMAND_RISING),
    StepName.RATIO: (Reason.RATIO_FLOOR,),
    StepName.STABILIZATION: (Reason.SCALE_UP_STABILIZED, Reason.SCALE_DOWN_STABILIZED,
        Reason.STABILIZATION_WINDOW_FILLING),
    StepName.RATE: (Reason.SCALE_UP_RATE_LIMITED, Reason.SCALE_DOWN_RATE_LIMITED),
    StepName.COOLDOWN: (Reason.SCALE_UP_COOLDOWN, Reason.SCALE_DOWN_COOLDOWN),
    StepName.PENDING: (Reason.WAITING_FOR_STARTING_REPLICAS, Reason.UNSCHEDULABLE),
    StepName.BOUNDS: (Reason.CLAMPED_TO_MIN, Reason.CLAMPED_TO_MAX, Reason.MAX_REPLICAS_REACHED,
        Reason.KV_TRANSFER_FAILING),
    StepName.CONDITION: (Reason.METRICS_FOUND, Reason.SCALING_ALLOWED),
    StepName.EVENT: (Reason.SCALED_UP, Reason.SCALED_DOWN, Reason.SCALE_FAILED),
}
STEP_OF: dict[Reason, StepName] = {r: step for step, rs in _STEP_MEMBERS.items() for r in rs}


def reasons_text() -> str:
    """Every reason by step, one line each (the dashboards' panel descriptions)."""
    return "\n".join(
        f"- **{step}**: " + ", ".join(f"`{r}` ({DESCRIPTION[r]})" for r in _STEP_MEMBERS[step])
        for step in STEPS
    )
