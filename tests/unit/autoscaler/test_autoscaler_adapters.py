"""Pure parts of the adapters: status patches, role counts, time compression, own metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from poolpilot.autoscaler.decide import Behavior, Policy, RoleDecision, Signal
from poolpilot.autoscaler.kube import RoleState, Workloads, parse_time, rfc3339, status_patch
from poolpilot.autoscaler.loop import scaled_policy
from poolpilot.autoscaler.metrics import AutoscalerMetrics
from poolpilot.autoscaler.queries import QuerySet, name_variants

from poolpilot import metrics as m
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


def test_speed_divides_durations_and_multiplies_token_rates() -> None:
    p = Policy(bounds={"prefill": (1, 8)}, scale_up=Behavior(60, 4, 30),
               scale_down=Behavior(300, 1, 60), max_metric_age=60,
               prefill_tokens_per_replica=1000)
    s = scaled_policy(p, 10)
    assert s.scale_up == Behavior(6, 4, 3) and s.scale_down == Behavior(30, 1, 6)
    assert (s.max_metric_age, s.prefill_tokens_per_replica, s.decode_tokens_per_replica) == (
        6, 10000, None)
    assert (s.cold_start, s.backlog_drain, s.forecast_window, s.history_window) == (
        p.cold_start / 10, p.backlog_drain / 10, p.forecast_window / 10, p.history_window / 10)
    assert s.ttft_target == p.ttft_target  # engines report latencies in simulated seconds
    assert scaled_policy(p, 1) is p


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
    assert len(qs) == 17  # 12 signals + 2 TTFT quantiles x (engines, router) + 1 ITL
    for key, promql in qs.items():
        assert "by (namespace, pool" in promql, key
        assert "[30s]" in promql or "rate(" not in promql, key
    assert name_variants(m.VLLM_KV_USAGE) == [
        "vllm:kv_cache_usage_perc", "vllm_kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc", "vllm_gpu_cache_usage_perc"]
    assert "vllm:time_per_output_token_seconds_bucket" in qs["itl@0.9"]
    # hits over queries, each name form divided by its own (never escaped by unescaped)
    hit = qs["prefix_hit_rate"]
    assert hit.count(" or ") == 1
    assert ("rate(vllm:prefix_cache_hits_total{" in hit.split(" or ")[0]
            and "rate(vllm:prefix_cache_queries_total{" in hit.split(" or ")[0])
    assert "vllm_prefix_cache_hits_total" in hit.split(" or ")[1]


@pytest.mark.parametrize(("router", "ready"), [
    (None, None), (RoleState(replicas=1, ready=0), 0), (RoleState(replicas=2, ready=1), 1),
    (RoleState(replicas=0, ready=0), None),
], ids=["no-router-deployment", "router-down", "router-up", "router-scaled-to-zero"])
def test_observation_carries_the_routers_ready_pods(router: RoleState | None,
                                                     ready: int | None) -> None:
    from poolpilot.autoscaler.observe import Snapshot, observation

    obs = observation("ns", "p", {"decode": RoleState(replicas=1, ready=1)}, Snapshot(time=0.0),
                      0.9, 0.9, router=router)
    assert obs.router_ready == ready
