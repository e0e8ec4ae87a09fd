"""Since when the request path has been whole, from the pods' Ready conditions: a router pod
that was killed and restarted between two decisions hid the demand without any decision
seeing it down, and the engines' quiet while it was out is no fall in demand."""

from __future__ import annotations

from typing import Any

from poolpilot.autoscaler.kube import RoleState, Workloads, parse_time, ready_since
from poolpilot.autoscaler.observe import path_whole_since

from poolpilot.clock import Clock

T0 = "2026-12-06T12:00:00Z"
T0_S = parse_time(T0)
assert T0_S is not None


def at(seconds: int) -> str:
    """T0 + seconds, RFC 3339 at seconds precision (as a kubelet writes it)."""
    return f"2026-12-06T12:{seconds // 60:02d}:{seconds % 60:02d}Z"


def pod(ready: bool, since: str | None, deleting: bool = False) -> dict[str, Any]:
    cond: dict[str, Any] = {"type": "Ready", "status": "True" if ready else "False"}
    if since is not None:
        cond["lastTransitionTime"] = since
    meta: dict[str, Any] = {"name": "p"} | ({"deletionTimestamp": at(59)} if deleting else {})
    return {"metadata": meta, "status": {"conditions": [cond]}}


def test_the_longest_ready_pod_tells_since_when_the_role_has_served() -> None:
    # One pod ready since 0:10, one restarted and ready since 0:40: the role has had a ready
    # pod since 0:10 (+1 s: the condition's time is truncated to the second).
    assert ready_since([pod(True, at(40)), pod(True, at(10))]) == T0_S + 11
    # A restarted sole pod: the role is whole since it came back.
    assert ready_since([pod(True, at(40))]) == T0_S + 41


def test_pods_that_are_not_serving_or_carry_no_time_tell_nothing() -> None:
    assert ready_since([pod(False, at(5)), pod(True, at(40))]) == T0_S + 41
    assert ready_since([pod(True, at(5), deleting=True), pod(True, at(40))]) == T0_S + 41
    assert ready_since([pod(False, at(5))]) is None
    assert ready_since([pod(True, None)]) is None
    assert ready_since([pod(True, "not a time")]) is None
    assert ready_since([]) is None


def test_role_state_carries_the_roles_ready_since() -> None:
    dep = {"metadata": {"name": "p-router", "namespace": "ns"}, "spec": {"replicas": 1},
           "status": {"readyReplicas": 1}}
    wl = Workloads(deployments={("ns", "p-router"): dep},
                   pods={("ns", "p", "router"): [pod(True, at(40))]})
    state = wl.role_state("ns", "p", "router")
    assert state is not None and state.ready_since == T0_S + 41


def state(since: float | None, replicas: int = 1) -> RoleState:
    return RoleState(replicas=replicas, ready=replicas, ready_since=since)


def test_the_path_is_whole_since_its_last_part_came_back() -> None:
    parts = [state(100.0), state(160.0), state(130.0)]  # prefill, decode, router
    assert path_whole_since(parts, Clock()) == 160.0
    # in the sandbox's compressed time, in the clock's simulated seconds
    assert path_whole_since(parts, Clock(rate=8.0)) == 160.0 * 8
    # a role asked for nothing, or one without a time, does not count
    assert path_whole_since([state(100.0), state(500.0, replicas=0), state(None)],
                            Clock()) == 100.0
    assert path_whole_since([state(None)], Clock()) is None
