"""Metric names: vLLM's (as of vLLM 0.3x), the router's and the autoscaler's own.

Every component and every query takes names from here. Prometheus relabels the pod labels
`poolpilot.dev/pool` and `poolpilot.dev/role` to `pool` and `role` (and adds `namespace`), so
queries aggregate `by (namespace, pool, role)`.
"""

from __future__ import annotations

# vLLM engine metrics (exported by vLLM and by poolpilot's engine simulator).
VLLM_TTFT = "vllm:time_to_first_token_seconds"  # histogram
VLLM_ITL = "vllm:inter_token_latency_seconds"  # histogram
VLLM_QUEUE_TIME = "vllm:request_queue_time_seconds"  # histogram
VLLM_E2E = "vllm:e2e_request_latency_seconds"  # histogram
VLLM_WAITING = "vllm:num_requests_waiting"  # gauge
VLLM_RUNNING = "vllm:num_requests_running"  # gauge
VLLM_KV_USAGE = "vllm:kv_cache_usage_perc"  # gauge, 0..1
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens_total"  # counter
VLLM_GENERATION_TOKENS = "vllm:generation_tokens_total"  # counter
VLLM_PREEMPTIONS = "vllm:num_preemptions_total"  # counter
# Prefix cache (vLLM V1): prompt tokens looked up in the cache, and those found (counters of
# tokens; hits / queries is the share of prompt tokens the engine did not compute).
VLLM_PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"  # counter
VLLM_PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"  # counter
# Prompt tokens an engine looked up through its KV connector past its own cache, and those it
# loaded instead of computing: the CPU offload tier's hits (and, on a P/D decode engine, the
# prompt received from the prefill engine). Only engines with a connector export them.
VLLM_EXTERNAL_PREFIX_CACHE_QUERIES = "vllm:external_prefix_cache_queries_total"  # counter
VLLM_EXTERNAL_PREFIX_CACHE_HITS = "vllm:external_prefix_cache_hits_total"  # counter
VLLM_NIXL_XFER_TIME = "vllm:nixl_xfer_time_seconds"  # histogram
VLLM_NIXL_FAILED = "vllm:nixl_num_failed_transfers"  # counter
VLLM_REQUEST_SUCCESS = "vllm:request_success_total"  # counter {finished_reason}
VLLM_PREFILL_TIME = "vllm:request_prefill_time_seconds"  # histogram
VLLM_DECODE_TIME = "vllm:request_decode_time_seconds"  # histogram
VLLM_INFERENCE_TIME = "vllm:request_inference_time_seconds"  # histogram
VLLM_NIXL_EXPIRED = "vllm:nixl_num_kv_expired_reqs"  # counter (prefill side)
# Prefill side: a decode engine's read arrived after the KV's lease expired (vLLM 0.32).
VLLM_NIXL_AFTER_EXPIRY = "vllm:nixl_num_notifications_after_expiry"  # counter
VLLM_LABELS = ("model_name", "engine")  # labels on every vLLM engine metric

# The engine launcher's cold-start phases (runtime_image/coldstart.py), served on the engine's
# own /metrics: seconds each phase of the engine's start took {phase} (phase "total": the
# launcher's start to the first /health 200), and whether vLLM found its compile cache (1 hit,
# 0 compiled; no series without torch.compile).
ENGINE_COLD_START = "poolpilot_engine_cold_start_seconds"  # gauge {phase}
ENGINE_COMPILE_CACHE_HIT = "poolpilot_engine_compile_cache_hit"  # gauge
# In the order they happen; a phase that did not happen (compile with --enforce-eager, graphs
# on CPU) has no series.
COLD_START_PHASES = ("import", "engine", "weights", "compile", "graphs", "warmup", "server",
                     "ready")
COLD_START_TOTAL = "total"

# NVIDIA DCGM exporter: GPU utilization (percent of the sample period a kernel ran), per GPU.
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # gauge, 0..100

# Names older vLLM releases used for the same signals (the autoscaler falls back to them).
VLLM_RENAMED = {
    VLLM_KV_USAGE: "vllm:gpu_cache_usage_perc",
    VLLM_ITL: "vllm:time_per_output_token_seconds",
    # (V1 before the `gpu_` infix was dropped; the offload tier's external counters came after)
    VLLM_PREFIX_CACHE_QUERIES: "vllm:gpu_prefix_cache_queries_total",
    VLLM_PREFIX_CACHE_HITS: "vllm:gpu_prefix_cache_hits_total",
}


def vllm_names(metric: str) -> list[str]:
    """Every name a vLLM series may carry, current first: the older vLLM name too where it was
    renamed (suffixes such as `_bucket` kept)."""
    names = [metric]
    for current, old in VLLM_RENAMED.items():
        if metric.startswith(current):
            names.append(old + metric[len(current):])
    return names

# Router metrics (labels: pool, plus those named).
ROUTER_TTFT = "poolpilot_router_time_to_first_token_seconds"  # histogram
ROUTER_ITL = "poolpilot_router_inter_token_latency_seconds"  # histogram
ROUTER_E2E = "poolpilot_router_e2e_latency_seconds"  # histogram
ROUTER_REQUESTS = "poolpilot_router_requests_total"  # counter {code}
ROUTER_INFLIGHT = "poolpilot_router_inflight"  # gauge {role}
# Prompts the router holds while every prefill engine is saturated (router/prefill_hold.py):
# prefill demand the engines' waiting gauges do not show; the autoscaler adds it to theirs.
ROUTER_HELD = "poolpilot_router_held_requests"  # gauge {role}
ROUTER_KV_TRANSFER_FAILURES = "poolpilot_router_kv_transfer_failures_total"  # counter
# Requests served aggregated on a decode engine (local prefill, no KV transfer), by reason:
# "prefill_behind" (the prefill role would break the TTFT target), "kv_transfer_failed"
# (the KV handoff failed and the request was retried locally instead of failing) or
# "prefill_failed" (the prefill failed on every prefill engine, or none was left; likewise).
# The first is the autoscaler's prefill demand (queries.py reads index 0).
ROUTER_LOCAL_PREFILL = "poolpilot_router_local_prefill_total"  # counter {reason}
LOCAL_PREFILL_REASONS = ("prefill_behind", "kv_transfer_failed", "prefill_failed")
# Prefill KV holds the router freed for handoffs that did not happen {outcome}.
ROUTER_KV_RELEASES = "poolpilot_router_kv_releases_total"
# Prefix-aware routing, per engine role and endpoint (url): prompt tokens routed, and those
# the chosen engine was expected to hold (expected hit rate = hits / routed, beside the
# engines' own vllm:prefix_cache_hits_total); choices by reason (router/prefix_index.py:
# prefix, load, bound = the load bound overrode the prefix, no_match).
ROUTER_PREFIX_ROUTED = "poolpilot_router_prefix_routed_prompt_tokens_total"  # {role,endpoint}
ROUTER_PREFIX_EXPECTED_HITS = "poolpilot_router_prefix_expected_hit_tokens_total"  # same
ROUTER_PREFIX_CHOICES = "poolpilot_router_prefix_choices_total"  # counter {role,reason}

# Autoscaler metrics.
AUTOSCALER_DESIRED = "poolpilot_autoscaler_desired_replicas"  # {namespace,pool,role}
AUTOSCALER_DECISIONS = "poolpilot_autoscaler_decisions_total"  # {..,direction,reason}
AUTOSCALER_SIGNAL = "poolpilot_autoscaler_signal"  # {namespace,pool,role,signal}
AUTOSCALER_SIGNAL_TARGET = "poolpilot_autoscaler_signal_target"  # same labels: its target
AUTOSCALER_CYCLE = "poolpilot_autoscaler_cycle_seconds"  # histogram
AUTOSCALER_LIMITED = "poolpilot_autoscaler_scaling_limited"  # gauge {..,reason}: 1 while limited
AUTOSCALER_METRICS_AVAILABLE = "poolpilot_autoscaler_metrics_available"  # gauge {ns,pool,role}
AUTOSCALER_LEADER = "poolpilot_autoscaler_leader"  # gauge: 1 on the replica that holds the lease

# The operator's own metrics (`poolpilot operator --metrics-port`).
OPERATOR_RECONCILES = "poolpilot_operator_reconciles_total"  # counter {trigger,result}
OPERATOR_RECONCILE_DURATION = "poolpilot_operator_reconcile_duration_seconds"  # histogram
OPERATOR_WRITES = "poolpilot_operator_writes_total"  # counter: API writes reconciles made
OPERATOR_API_ERRORS = "poolpilot_operator_api_errors_total"  # counter {kind: transient|permanent}
OPERATOR_ACTIVE = "poolpilot_operator_reconciles_active"  # gauge: reconciles running now
OPERATOR_QUEUED = "poolpilot_operator_reconciles_queued"  # gauge: waiting for a free slot

# Latency histogram buckets (vLLM's own buckets for TTFT and ITL, vLLM 0.3x).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)
# vLLM's buckets for e2e, queue, prefill, decode and inference times.
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)
# vLLM's NixlConnector buckets for vllm:nixl_xfer_time_seconds.
NIXL_XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
