"""Status table: live Deployments and pods -> conditions, role summaries and Events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.operator import status as s

NOW, LATER = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def _pod(role: str, name: str, *, phase: str = "Running", waiting: str | None = None,
         unschedulable: bool = False) -> dict[str, Any]:  # fmt: skip
    st_: dict[str, Any] = {"phase": phase}
    if waiting:
        st_["containerStatuses"] = [
            {"name": "engine", "restartCount": 5, "state": {"waiting": {"reason": waiting}}}
        ]
    if unschedulable:
        st_["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                              "message": "0/3 nodes: 3 Insufficient nvidia.com/gpu"}]  # fmt: skip
    return {"metadata": {"name": name, "labels": {"poolpilot.dev/role": role}}, "status": st_}


def _role(role: str, desired: int, ready: int, *, exists: bool = True) -> s.RoleRollout:
    return s.RoleRollout(role=role, exists=exists, desired=desired, replicas=desired,
                             ready=ready, updated=desired)  # fmt: skip


ALL_READY = [_role("prefill", 1, 1), _role("decode", 2, 2), _role("router", 2, 2)]


@dataclass(frozen=True)
class Case:
    id: str
    roles: list[s.RoleRollout]
    pods: list[dict[str, Any]] = field(default_factory=list)
    invalid: list[str] | None = None
    ready: tuple[str, str] | None = None  # (status, reason)
    progressing: tuple[str, str] | None = None
    degraded: tuple[str, str] | None = None


CASES = [
    Case("all-ready", ALL_READY, ready=("True", "AllReplicasReady"),
         progressing=("False", "RolloutComplete"), degraded=("False", "AsExpected")),
    Case("pods-pending", [_role("prefill", 1, 0), *ALL_READY[1:]],
         pods=[_pod("prefill", "p-prefill-a", phase="Pending")],
         ready=("False", "PodsPending"), progressing=("True", "PodsPending"),
         degraded=("False", "AsExpected")),
    Case("unschedulable-gpus", [_role("prefill", 1, 0), *ALL_READY[1:]],
         pods=[_pod("prefill", "p-prefill-a", phase="Pending", unschedulable=True)],
         ready=("False", "Unschedulable"), progressing=("True", "Unschedulable"),
         degraded=("True", "Unschedulable")),
    Case("image-pull", [_role("decode", 2, 1), ALL_READY[0], ALL_READY[2]],
         pods=[_pod("decode", "p-decode-b", phase="Pending", waiting="ImagePullBackOff")],
         ready=("False", "ImagePullBackOff"), degraded=("True", "ImagePullBackOff")),
    Case("err-image-pull-counts-as-image-pull", [_role("decode", 2, 1)],
         pods=[_pod("decode", "p-decode-b", phase="Pending", waiting="ErrImagePull")],
         degraded=("True", "ImagePullBackOff")),
    Case("crash-loop-beats-pending", [_role("decode", 2, 0)],
         pods=[_pod("decode", "a", phase="Pending"),
               _pod("decode", "b", waiting="CrashLoopBackOff")],
         ready=("False", "CrashLoop"), degraded=("True", "CrashLoop")),
    Case("deployment-missing", [_role("prefill", 1, 0, exists=False), *ALL_READY[1:]],
         ready=("False", "ReplicasNotReady"), progressing=("True", "ReplicasUpdating")),
    Case("invalid-spec", ALL_READY, invalid=["spec.decode.maxReplicas: must be >= minReplicas"],
         progressing=("False", "InvalidSpec"), degraded=("True", "InvalidSpec")),
    Case("scaled-to-zero-is-ready", [_role("prefill", 0, 0), _role("decode", 0, 0)],
         ready=("True", "AllReplicasReady")),
]  # fmt: skip


def _cond(result: s.StatusResult, ctype: str) -> tuple[str, str]:
    c = next(c for c in result.status["conditions"] if c["type"] == ctype)
    return (c["status"], c["reason"])


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_conditions(case: Case) -> None:
    result = s.compute_status(generation=3, roles=case.roles, pods=case.pods, previous=None,
                              endpoint="http://x/v1", now=NOW, invalid=case.invalid)  # fmt: skip
    for ctype, want in ((s.READY, case.ready), (s.PROGRESSING, case.progressing),
                        (s.DEGRADED, case.degraded)):  # fmt: skip
        if want is not None:
            assert _cond(result, ctype) == want, ctype
    assert result.status["observedGeneration"] == 3


def test_invalid_spec_message_names_the_field_and_keeps_roles() -> None:
    previous = {"decode": {"replicas": 2, "readyReplicas": 2, "summary": "2/2"}}
    errors = ["spec.decode.maxReplicas: must be >= 2"]
    result = s.compute_status(generation=4, roles=[], pods=[], previous=previous, endpoint="e",
                              now=NOW, invalid=errors)  # fmt: skip
    degraded = next(c for c in result.status["conditions"] if c["type"] == s.DEGRADED)
    assert "spec.decode.maxReplicas" in degraded["message"]
    assert "decode" not in result.status  # role entries untouched (not in the patch)
    assert [e.reason for e in result.events] == ["InvalidSpec"]
    assert result.events[0].type == "Warning"


def test_role_summary_and_autoscaler_fields_survive() -> None:
    previous = {"decode": {"desiredReplicas": 5, "reason": "ScaleUp"},
                "conditions": [{"type": "MetricsAvailable", "status": "True", "reason": "Fresh"}]}
    result = s.compute_status(generation=1, roles=[_role("decode", 4, 3)], pods=[],
                              previous=previous, endpoint="e", now=NOW)  # fmt: skip
    assert result.status["decode"] == {"desiredReplicas": 5, "reason": "ScaleUp", "replicas": 4,
                                       "readyReplicas": 3, "summary": "3/4"}  # fmt: skip
    types = [c["type"] for c in result.status["conditions"]]
    assert types == ["Ready", "Progressing", "Degraded", "MetricsAvailable"]


def test_stale_roles_are_removed_after_mode_switch() -> None:
    previous = {"prefill": {"summary": "1/1"}, "decode": {"summary": "1/1"}}
    result = s.compute_status(generation=2, roles=[_role("engine", 1, 1)], pods=[],
                              previous=previous, endpoint="e", now=NOW,
                              stale_roles=("prefill", "decode"))  # fmt: skip
    assert result.status["prefill"] is None and result.status["decode"] is None


def test_events_only_on_transitions() -> None:
    first = s.compute_status(generation=1, roles=ALL_READY, pods=[], previous=None,
                             endpoint="e", now=NOW)  # fmt: skip
    assert [(e.type, e.reason) for e in first.events] == [
        ("Normal", "AllReplicasReady"), ("Normal", "AsExpected")
    ]
    same = s.compute_status(generation=1, roles=ALL_READY, pods=[], previous=first.status,
                            endpoint="e", now=LATER)  # fmt: skip
    assert same.events == []
    assert s.merge_patch(first.status, same.status) is None  # nothing to write, not even times
    broken = [_role("decode", 2, 1), *ALL_READY[::2]]
    crash = s.compute_status(generation=1, roles=broken,
                             pods=[_pod("decode", "d", waiting="CrashLoopBackOff")],
                             previous=same.status, endpoint="e", now=LATER)  # fmt: skip
    assert [(e.type, e.reason) for e in crash.events] == [
        ("Warning", "CrashLoop"), ("Warning", "CrashLoop")
    ]
    ready = next(c for c in crash.status["conditions"] if c["type"] == s.READY)
    assert ready["lastTransitionTime"] == LATER


@dataclass(frozen=True)
class PatchCase:
    id: str
    live: Any
    desired: Any
    expected: Any


PATCH_CASES = [
    PatchCase("equal", {"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 2}}, None),
    PatchCase("foreign-keys-kept", {"a": 1, "x": 9}, {"a": 2}, {"a": 2}),
    PatchCase("nested", {"b": {"c": 2, "d": 3}}, {"b": {"c": 5}}, {"b": {"c": 5}}),
    PatchCase("delete-with-null", {"a": {"x": 1}}, {"a": None}, {"a": None}),
    PatchCase("delete-absent-is-noop", {}, {"a": None}, None),
    PatchCase("list-replaced", {"l": [1, 2]}, {"l": [1]}, {"l": [1]}),
]


@pytest.mark.parametrize("case", PATCH_CASES, ids=[c.id for c in PATCH_CASES])
def test_merge_patch(case: PatchCase) -> None:
    assert s.merge_patch(case.live, case.desired) == case.expected


_json = st.recursive(
    st.none() | st.integers() | st.text(max_size=3),
    lambda c: st.dictionaries(st.text(max_size=2), c, max_size=3),
    max_leaves=8,
)


def _apply(doc: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(doc) if isinstance(doc, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _apply(out.get(k), v)
    return out


@given(live=st.dictionaries(st.text(max_size=2), _json, max_size=4),
       desired=st.dictionaries(st.text(max_size=2), _json, max_size=4))  # fmt: skip
def test_merge_patch_reaches_desired(live: dict[str, Any], desired: dict[str, Any]) -> None:
    patched = _apply(live, s.merge_patch(live, desired) or {})
    assert s.merge_patch(patched, desired) is None


@pytest.mark.parametrize("status,message,reason", [
    (403, 'pods "x" is forbidden: exceeded quota: team-a, requested: requests.nvidia.com/gpu=1',
     s.QUOTA_EXCEEDED),
    (403, 'User "op" cannot patch resource "deployments"', s.FORBIDDEN),
    (422, 'Deployment.apps "x" is invalid: spec.replicas: Invalid value: -1', s.REJECTED),
    (400, "the body of the request was in an unknown format", s.API_ERROR),
], ids=["quota", "rbac", "invalid", "other"])
def test_api_refusal_becomes_degraded_with_the_api_message(status: int, message: str,
                                                          reason: str) -> None:
    blocked = s.api_failure(status, message, "apply Deployment/p-decode")
    assert blocked == s.Blocked(reason, f"apply Deployment/p-decode: HTTP {status}: {message}")
    previous = {"decode": {"replicas": 2, "summary": "2/2"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "AllReplicasReady",
                                "message": "m", "lastTransitionTime": NOW}]}
    result = s.compute_status(generation=2, roles=[], pods=[], previous=previous, endpoint="e",
                              now=LATER, blocked=blocked)  # fmt: skip
    assert _cond(result, s.DEGRADED) == ("True", reason)
    assert _cond(result, s.PROGRESSING) == ("False", reason)
    assert _cond(result, s.READY) == ("True", "AllReplicasReady")  # what still serves, serves
    assert "decode" not in result.status
    assert [(e.type, e.reason) for e in result.events] == [("Warning", reason)]
    assert message in result.events[0].message
