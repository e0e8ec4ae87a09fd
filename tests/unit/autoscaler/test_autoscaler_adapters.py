"""Pure parts of the adapters: status patches, role counts, the clock's conversions, own
metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from poolpilot.autoscaler import queries as q
from poolpilot.autoscaler.decide import RoleDecision, Signal
from poolpilot.autoscaler.kube import RoleState, Workloads, parse_time, rfc3339, status_patch
from poolpilot.autoscaler.metrics import AutoscalerMetrics
from poolpilot.autoscaler.observe import Snapshot, observation
from poolpilot.autoscaler.queries import QuerySet, name_variants

from poolpilot import metrics as m
from poolpilot.clock import Clock
from poolpilot.reasons import SignalName as S

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:05:00Z"


def cond(type_: str, status: str, reason: str = "R", when: str = T0, msg: str = "") -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": msg,
            "lastTransitionTime": when}


@dataclass
class PatchCase:
    id: str
    live: dict[str, Any]
    roles: dict[str, Any] = field(default_factory=dict)
    conditions: list[dict[str, Any]] = field(default_factory=list)
    want: dict[str, Any] | None = None


READY = cond("Ready", "True", "AllReplicasReady")
PATCHES = [
    PatchCase("nothing-changed-no-patch",
              {"prefill": {"desiredReplicas": 2, "reason": "X"},
               "conditions": [READY, cond("MetricsAvailable", "True", "MetricsFound")]},
              {"prefill": {"desiredReplicas": 2, "reason": "X"}},
              [cond("MetricsAvailable", "True", "MetricsFound", when=T1)], None),
    PatchCase("role-fields-merged-key-by-key",
              {"prefill": {"replicas": 1, "desiredReplicas": 1, "reason": "X"}},
              {"prefill": {"desiredReplicas": 3, "reason": "X"}}, [],
              {"prefill": {"desiredReplicas": 3}}),
    PatchCase("operator-conditions-kept-and-ours-added",
              {"conditions": [READY]}, {},
              [cond("MetricsAvailable", "False", "MetricsUnavailable", when=T1)],
              {"conditions": [READY, cond("MetricsAvailable", "False", "MetricsUnavailable",
                                          when=T1)]}),
    PatchCase("transition-time-kept-when-status-unchanged",
              {"conditions": [READY, cond("ScalingLimited", "True", "Unschedulable")]}, {},
              [cond("ScalingLimited", "True", "MaxReplicasReached", when=T1)],
              {"conditions": [READY, cond("ScalingLimited", "True", "MaxReplicasReached",
                                          when=T0)]}),
    PatchCase("transition-time-moves-when-status-flips",
              {"conditions": [cond("ScalingLimited", "True", "Unschedulable"), READY]}, {},
              [cond("ScalingLimited", "False", "ScalingAllowed", when=T1)],
              {"conditions": [cond("ScalingLimited", "False", "ScalingAllowed", when=T1),
                              READY]}),
]


@pytest.mark.parametrize("c", PATCHES, ids=[c.id for c in PATCHES])
def test_status_patch(c: PatchCase) -> None:
    assert status_patch(c.live, c.roles, None, c.conditions) == c.want


def dep(name: str, replicas: int, ready: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {"replicas": replicas},
            "status": {"readyReplicas": ready}}


def pod(unschedulable: bool = False, deleting: bool = False) -> dict[str, Any]:
    conds = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
              "message": "0/4 nodes: insufficient nvidia.com/gpu"}] if unschedulable else []
    meta: dict[str, Any] = {"deletionTimestamp": T0} if deleting else {}
    return {"metadata": meta, "status": {"phase": "Pending", "conditions": conds}}


@dataclass
class RoleCase:
    id: str
    deployment: dict[str, Any] | None
    pods: list[dict[str, Any]]
    want: RoleState | None


ROLE_CASES = [
    RoleCase("all-ready", dep("p-decode", 3, 3), [], RoleState(3, 3, 0, 0)),
    RoleCase("scaled-up-pods-on-the-way", dep("p-decode", 5, 2), [pod()], RoleState(5, 2, 3, 0)),
    RoleCase("unschedulable-pod-counted-with-message", dep("p-decode", 4, 2),
             [pod(unschedulable=True), pod()],
             RoleState(4, 2, 1, 1, "0/4 nodes: insufficient nvidia.com/gpu")),
    RoleCase("terminating-pod-is-not-stuck", dep("p-decode", 2, 2),
             [pod(unschedulable=True, deleting=True)], RoleState(2, 2, 0, 0)),
    RoleCase("scaling-down-more-ready-than-asked", dep("p-decode", 1, 3), [],
             RoleState(1, 1, 0, 0)),
    RoleCase("no-deployment-yet", None, [], None),
]


@pytest.mark.parametrize("c", ROLE_CASES, ids=[c.id for c in ROLE_CASES])
def test_role_state(c: RoleCase) -> None:
    deps = {("ns", "p-decode"): c.deployment} if c.deployment else {}
    wl = Workloads(deployments=deps, pods={("ns", "p", "decode"): c.pods})
    assert wl.role_state("ns", "p", "decode") == c.want


def world(rate: float) -> Snapshot:
    """One disaggregated pool as Prometheus sees it when the world runs `rate` times faster:
    every per-second rate is `rate` times higher and the newest samples are as many times
    younger; latencies (the engines' and the router's simulated seconds) and counts are not
    touched."""
    pre, dec, pool = ("ns", "p", "prefill"), ("ns", "p", "decode"), ("ns", "p", "")
    values = {
        q.WAITING: {pre: 3.0, dec: 1.0}, q.RUNNING: {pre: 2.0, dec: 40.0},
        q.KV_USAGE: {pre: 0.25, dec: 0.5}, q.ttft_key(0.9): {pre: 0.5}, q.itl_key(0.9): {dec: 0.03},
        q.PROMPT_RATE: {pre: 4096.0 * rate}, q.GENERATION_RATE: {dec: 1024.0 * rate},
        q.REQUEST_RATE: {pre: 4.0 * rate}, q.SAMPLE_TIME: {pre: 1000.0 - 8 / rate,
                                                           dec: 1000.0 - 4 / rate},
        q.router_ttft_key(0.9): {pool: 0.75}, q.ROUTER_INFLIGHT: {pool: 6.0},
        q.ROUTER_REQUEST_RATE: {pool: 4.0 * rate}, q.LOCAL_PREFILL_RATE: {pool: 0.5 * rate},
        q.KV_FAILURE_RATE: {pool: 0.125 * rate},
    }
    return Snapshot(time=1000.0, values=values, evaluated={q.SAMPLE_TIME: 1000.0})


ROLES = {"prefill": RoleState(2, 2), "decode": RoleState(2, 2)}


@pytest.mark.parametrize("rate", [2.0, 8.0, 64.0], ids=lambda r: f"rate-{r:g}")
def test_the_observation_is_in_simulated_seconds(rate: float) -> None:
    """Prometheus's rates (per real second) and sample ages (real seconds) become simulated
    ones, so the same world compressed by the sandbox's --speed is the same Observation, and
    the core decides the same (the rates are powers of two: the conversions are exact)."""
    fast = observation("ns", "p", ROLES, world(rate), 0.9, 0.9, clock=Clock(rate))
    assert fast == observation("ns", "p", ROLES, world(1.0), 0.9, 0.9)
    assert fast.roles["prefill"].prompt_tokens_rate == 4096.0
    assert fast.roles["decode"].sample_age == 4.0


def test_a_real_time_clock_leaves_prometheus_numbers_as_they_are() -> None:
    obs = observation("ns", "p", ROLES, world(1.0), 0.9, 0.9, clock=Clock(1.0))
    assert obs == observation("ns", "p", ROLES, world(1.0), 0.9, 0.9)
    assert (obs.roles["prefill"].request_rate, obs.kv_transfer_failure_rate) == (4.0, 0.125)


def test_time_round_trip() -> None:
    assert parse_time(rfc3339(1_800_000_000)) == 1_800_000_000
    assert parse_time("garbage") is None and parse_time(None) is None


def test_own_metrics_follow_decisions() -> None:
    met = AutoscalerMetrics()
    d = RoleDecision("decode", 2, 4, "SequencesAboveTarget", "msg",
                     signals=(Signal(S.SEQUENCES, 256, 128, 4), Signal(S.KV_CACHE, 0.5, 0.85, 2)),
                     limited="MaxReplicasReached")
    met.record("ns", "p", d, True)
    labels = {"namespace": "ns", "pool": "p", "role": "decode"}
    get = met.registry.get_sample_value
    assert get(m.AUTOSCALER_DESIRED, labels) == 4
    assert get(m.AUTOSCALER_DECISIONS, {**labels, "direction": "up",
                                        "reason": "SequencesAboveTarget"}) == 1
    assert get(m.AUTOSCALER_SIGNAL, {**labels, "signal": "Sequences"}) == 256
    assert get(m.AUTOSCALER_SIGNAL_TARGET, {**labels, "signal": "Sequences"}) == 128
    assert get(m.AUTOSCALER_LIMITED, {**labels, "reason": "MaxReplicasReached"}) == 1
    assert get(m.AUTOSCALER_METRICS_AVAILABLE, labels) == 1
    # Next decision: metrics missing -> no signals, not limited; stale series are removed.
    met.record("ns", "p", RoleDecision("decode", 4, 4, "MetricsUnavailable", "m",
                                       metrics_ok=False), False)
    assert get(m.AUTOSCALER_SIGNAL, {**labels, "signal": "Sequences"}) is None
    assert get(m.AUTOSCALER_LIMITED, {**labels, "reason": "MaxReplicasReached"}) is None
    assert get(m.AUTOSCALER_METRICS_AVAILABLE, labels) == 0
    met.forget("ns", "p")
    assert get(m.AUTOSCALER_DESIRED, labels) is None


def test_own_metrics_follow_a_changing_limit_and_leadership() -> None:
    met = AutoscalerMetrics()
    get = met.registry.get_sample_value
    labels = {"namespace": "ns", "pool": "p", "role": "prefill"}

    def limited(reason: str | None) -> RoleDecision:
        return RoleDecision("prefill", 8, 8, "ClampedToMax", "m", limited=reason)

    met.record("ns", "p", limited("MaxReplicasReached"), True)
    met.record("ns", "p", limited("Unschedulable"), True)  # the reason series is replaced
    assert get(m.AUTOSCALER_LIMITED, {**labels, "reason": "MaxReplicasReached"}) is None
    assert get(m.AUTOSCALER_LIMITED, {**labels, "reason": "Unschedulable"}) == 1
    met.record("ns", "p", limited("Unschedulable"), True)
    assert get(m.AUTOSCALER_DECISIONS, {**labels, "direction": "none",
                                        "reason": "ClampedToMax"}) == 3
    met.record("ns", "q", limited(None), True)
    met.forget_all()  # leadership lost: every pool's gauges go, the counters stay
    assert get(m.AUTOSCALER_LIMITED, {**labels, "reason": "Unschedulable"}) is None
    assert get(m.AUTOSCALER_DESIRED, labels) is None
    assert get(m.AUTOSCALER_DESIRED, {**labels, "pool": "q"}) is None
    assert get(m.AUTOSCALER_DECISIONS, {**labels, "direction": "none",
                                        "reason": "ClampedToMax"}) == 3
    met.record("ns", "p", limited(None), True)  # leader again: reported afresh
    assert get(m.AUTOSCALER_DESIRED, labels) == 8


def test_queries_are_grouped_and_tolerate_renames() -> None:
    qs = QuerySet(window_seconds=30).build(ttft_quantiles=(0.9, 0.99), itl_quantiles=(0.9,))
    assert len(qs) == 18  # 13 signals + 2 TTFT quantiles x (engines, router) + 1 ITL
    for key, promql in qs.items():
        assert "by (namespace, pool" in promql, key
        assert "[30s]" in promql or "rate(" not in promql, key
    assert name_variants(m.VLLM_KV_USAGE) == [
        "vllm:kv_cache_usage_perc", "vllm_kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc", "vllm_gpu_cache_usage_perc"]
    assert "vllm:time_per_output_token_seconds_bucket" in qs["itl@0.9"]
    # hits over queries, each name form divided by its own (never escaped by unescaped)
    # (the offload tier's external hits added where exported, never at decode)
    hit = qs["prefix_hit_rate"]
    colon, escaped, old_colon, old_escaped = hit.split(") or (")
    for name in ("hits", "queries"):
        assert f"rate(vllm:prefix_cache_{name}_total{{" in colon
        assert f"rate(vllm_prefix_cache_{name}_total{{" in escaped
        # (older vLLM V1 releases: `gpu_` infix, no offload tier)
        assert f"rate(vllm:gpu_prefix_cache_{name}_total{{" in old_colon
        assert f"rate(vllm_gpu_prefix_cache_{name}_total{{" in old_escaped
    assert 'rate(vllm:external_prefix_cache_hits_total{pool!="", role!="decode"}' in colon
    assert 'rate(vllm_external_prefix_cache_hits_total{pool!="", role!="decode"}' in escaped
    assert "external" not in old_colon + old_escaped
    assert "vllm_" not in colon + old_colon and "vllm:" not in escaped + old_escaped


@pytest.mark.parametrize(("router", "ready"), [
    (None, None), (RoleState(replicas=1, ready=0), 0), (RoleState(replicas=2, ready=1), 1),
    (RoleState(replicas=0, ready=0), None),
], ids=["no-router-deployment", "router-down", "router-up", "router-scaled-to-zero"])
def test_observation_carries_the_routers_ready_pods(router: RoleState | None,
                                                     ready: int | None) -> None:
    obs = observation("ns", "p", {"decode": RoleState(replicas=1, ready=1)}, Snapshot(time=0.0),
                      0.9, 0.9, router=router)
    assert obs.router_ready == ready
