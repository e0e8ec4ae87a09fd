"""Pure status computation: live Deployments and pods -> the pool's status and its Events.

The operator owns observedGeneration, endpoint, the per-role `replicas`, `readyReplicas` and
`summary`, and the Ready / Progressing / Degraded conditions. The autoscaler owns the rest
(desiredReplicas, MetricsAvailable, ScalingLimited, ...): conditions are merged by type and
role entries key by key, so neither overwrites the other. No I/O, no clock (`now` is passed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from poolpilot.operator.gateway_objects import ROUTE_PENDING, Routed
from poolpilot.operator.model_cache import PREFETCHING, CacheState

from poolpilot import names, workloads

READY, PROGRESSING, DEGRADED = "Ready", "Progressing", "Degraded"
# spec.model.cache SharedVolume or NodeLocal: whether the prefetched weights are there
# (operator/model_cache.py says why not); absent for caches nothing waits on.
MODEL_CACHED = "ModelCached"
# Routed: the pool's HTTPRoute as its Gateways report it (pools with spec.gateway only).
ROUTED = "Routed"
OWNED_CONDITIONS = (READY, PROGRESSING, DEGRADED, ROUTED)

# Reasons (CamelCase, as Kubernetes conditions use).
POD_PENDING = "PodsPending"
UNSCHEDULABLE = "Unschedulable"
IMAGE_PULL = "ImagePullBackOff"
CRASH_LOOP = "CrashLoop"
INVALID_SPEC = "InvalidSpec"
# The API server refused a write (a person must act: RBAC, quota, an admission webhook).
FORBIDDEN = "Forbidden"
QUOTA_EXCEEDED = "QuotaExceeded"
REJECTED = "Rejected"
API_ERROR = "ApiError"
# A child's name is taken by an object the pool does not own (left alone).
NAME_CONFLICT = "NameConflict"
ALL_READY = "AllReplicasReady"
NOT_READY = "ReplicasNotReady"
UPDATING = "ReplicasUpdating"
COMPLETE = "RolloutComplete"
AS_EXPECTED = "AsExpected"

# Worst first: the first problem found names the reason of Ready=False / Degraded=True.
_SEVERITY = (CRASH_LOOP, IMAGE_PULL, UNSCHEDULABLE, POD_PENDING)
_DEGRADING = {CRASH_LOOP, IMAGE_PULL, UNSCHEDULABLE}
_IMAGE_WAITING = {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"}


@dataclass(frozen=True)
class RoleRollout:
    """One role's Deployment and how far its rollout is, as observed (desired = its
    spec.replicas)."""

    role: str
    exists: bool = True
    desired: int = 0
    replicas: int = 0
    ready: int = 0
    updated: int = 0
    rolled_out: bool = True  # status.observedGeneration caught up with metadata.generation

    @classmethod
    def from_deployment(cls, role: str, dep: dict[str, Any] | None) -> RoleRollout:
        if dep is None:
            return cls(role=role, exists=False)
        c = workloads.counts(dep)
        return cls(role=role, desired=c.desired, replicas=c.replicas, ready=c.ready,
                   updated=c.updated, rolled_out=c.rolled_out)

    @property
    def summary(self) -> str:
        return f"{self.ready}/{self.desired}"

    @property
    def settled(self) -> bool:
        return (
            self.exists
            and self.rolled_out
            and self.ready >= self.desired
            and self.updated >= self.desired
            and self.replicas == self.desired
        )


@dataclass(frozen=True)
class PodProblem:
    role: str
    pod: str
    reason: str
    message: str


@dataclass(frozen=True)
class EventSpec:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Blocked:
    """Why the operator could not converge the pool: Degraded=True with this reason and
    message, Progressing=False, the role entries kept (the children were not all written)."""

    reason: str
    message: str


def api_failure(status: int, message: str, what: str = "") -> Blocked:
    """A permanent API refusal as the condition users read (the API's own message kept)."""
    if status == 403 and "exceeded quota" in message:
        reason = QUOTA_EXCEEDED
    elif status == 403:
        reason = FORBIDDEN
    elif status == 422:
        reason = REJECTED
    else:
        reason = API_ERROR
    prefix = f"{what}: " if what else ""
    return Blocked(reason, f"{prefix}HTTP {status}: {message}")


@dataclass
class StatusResult:
    status: dict[str, Any]  # the operator-owned part of status, merged with the previous one
    events: list[EventSpec] = field(default_factory=list)


def pod_problem(pod: dict[str, Any]) -> PodProblem | None:
    """Why a pod is not serving, if it is stuck in a way the user should hear about."""
    meta, st = pod.get("metadata") or {}, pod.get("status") or {}
    role = (meta.get("labels") or {}).get(names.ROLE_LABEL, "?")
    name = meta.get("name", "?")
    if meta.get("deletionTimestamp"):
        return None
    for cs in [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason", "")
        detail = waiting.get("message", "") or reason
        if reason == "CrashLoopBackOff":
            restarts = cs.get("restartCount", 0)
            return PodProblem(role, name, CRASH_LOOP, f"container {cs.get('name')} keeps "
                              f"crashing ({restarts} restarts): {detail}")
        if reason in _IMAGE_WAITING:
            return PodProblem(role, name, IMAGE_PULL, f"cannot pull image: {detail}")
    if st.get("phase") == "Pending":
        for cond in st.get("conditions") or []:
            if (
                cond.get("type") == "PodScheduled"
                and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"
            ):
                return PodProblem(role, name, UNSCHEDULABLE, cond.get("message", "") or
                                  "no node fits the pod")
        return PodProblem(role, name, POD_PENDING, "pod is pending")
    return None


def _condition(
    ctype: str, ok: bool, reason: str, message: str, generation: int, now: str,
    previous: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    status = "True" if ok else "False"
    before = previous.get(ctype)
    changed = before is None or before.get("status") != status
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": (
            now if changed or before is None else before.get("lastTransitionTime", now)
        ),
        "observedGeneration": generation,
    }


def _worst(problems: list[PodProblem]) -> PodProblem | None:
    for reason in _SEVERITY:
        for p in problems:
            if p.reason == reason:
                return p
    return None


def _describe(problem: PodProblem, count: int) -> str:
    more = f" (and {count - 1} more pods)" if count > 1 else ""
    return f"{problem.role} pod {problem.pod}: {problem.message}{more}"


def compute_status(
    *,
    generation: int,
    roles: list[RoleRollout],
    pods: list[dict[str, Any]],
    previous: dict[str, Any] | None,
    endpoint: str,
    now: str,
    invalid: list[str] | None = None,
    blocked: Blocked | None = None,
    stale_roles: tuple[str, ...] = (),
    routed: Routed | None = None,
    unrouted: bool = False,
    model_cached: CacheState | None = None,
) -> StatusResult:
    """The new status and the Events its transitions deserve.

    `invalid` (errors from parsing the spec) sets Degraded/InvalidSpec and keeps the previous
    role entries: the children were left untouched, so what they report is still true.
    `blocked` (a permanent API refusal) does the same with its own reason and message.
    `stale_roles` are roles of the other mode whose entries are removed (set to None).
    `routed` sets the Routed condition; `unrouted` (spec.gateway removed) drops it.
    `model_cached` sets the ModelCached condition; None (nothing prefetched) drops it.
    """
    previous = previous or {}
    prev_conditions = {c.get("type"): c for c in previous.get("conditions") or []}
    conditions: dict[str, dict[str, Any]] = {}
    out: dict[str, Any] = {}

    if invalid:
        blocked = Blocked(INVALID_SPEC, "; ".join(invalid))
    if blocked is not None:
        hint = "fix the spec: " if blocked.reason == INVALID_SPEC else "cannot converge: "
        conditions[DEGRADED] = _condition(
            DEGRADED, True, blocked.reason, blocked.message, generation, now, prev_conditions
        )
        conditions[PROGRESSING] = _condition(
            PROGRESSING, False, blocked.reason, hint + blocked.message, generation, now,
            prev_conditions,
        )
        if READY in prev_conditions:
            conditions[READY] = prev_conditions[READY]
    else:
        problems = [p for p in (pod_problem(pod) for pod in pods) if p is not None]
        worst = _worst(problems)
        degrading = [p for p in problems if p.reason in _DEGRADING]
        worst_degrading = _worst(degrading)
        ready = all(r.exists and r.ready >= r.desired for r in roles)
        settled = all(r.settled for r in roles)
        not_ready = [r for r in roles if not (r.exists and r.ready >= r.desired)]

        if ready:
            conditions[READY] = _condition(
                READY, True, ALL_READY,
                ", ".join(f"{r.role} {r.summary}" for r in roles), generation, now,
                prev_conditions,
            )
        else:
            reason = worst.reason if worst else NOT_READY
            detail = (
                _describe(worst, len(problems))
                if worst
                else ", ".join(f"{r.role} {r.summary}" for r in not_ready) + " ready"
            )
            conditions[READY] = _condition(
                READY, False, reason, detail, generation, now, prev_conditions
            )
        if settled:
            conditions[PROGRESSING] = _condition(
                PROGRESSING, False, COMPLETE, "every role is rolled out", generation, now,
                prev_conditions,
            )
        else:
            reason = worst.reason if worst else UPDATING
            moving = [r for r in roles if not r.settled]
            detail = ", ".join(
                f"{r.role} {'missing' if not r.exists else r.summary + ' ready'}" for r in moving
            )
            conditions[PROGRESSING] = _condition(
                PROGRESSING, True, reason, detail, generation, now, prev_conditions
            )
        if worst_degrading:
            conditions[DEGRADED] = _condition(
                DEGRADED, True, worst_degrading.reason,
                _describe(worst_degrading, len(degrading)), generation, now, prev_conditions,
            )
        else:
            conditions[DEGRADED] = _condition(
                DEGRADED, False, AS_EXPECTED, "no pod is failing", generation, now,
                prev_conditions,
            )
        for r in roles:
            entry = dict(previous.get(r.role) or {})
            entry.update(replicas=r.replicas, readyReplicas=r.ready, summary=r.summary)
            out[r.role] = entry
        for role in stale_roles:
            if previous.get(role) is not None:
                out[role] = None
        out["endpoint"] = endpoint
        if model_cached is not None:
            conditions[MODEL_CACHED] = _condition(
                MODEL_CACHED, model_cached.ok, model_cached.reason, model_cached.message,
                generation, now, prev_conditions)
        if routed is not None:
            conditions[ROUTED] = _condition(ROUTED, routed.ok, routed.reason, routed.message,
                                            generation, now, prev_conditions)

    merged = [conditions.get(t, c) for t, c in prev_conditions.items()]
    merged += [c for t, c in conditions.items() if t not in prev_conditions]
    if unrouted and blocked is None:
        merged = [c for c in merged if c.get("type") != ROUTED]
    if model_cached is None and blocked is None:
        merged = [c for c in merged if c.get("type") != MODEL_CACHED]
    out["conditions"] = sorted(merged, key=_condition_order)
    out["observedGeneration"] = generation
    return StatusResult(status=out, events=_transition_events(prev_conditions, conditions))


def _condition_order(cond: dict[str, Any]) -> tuple[int, str]:
    t = cond.get("type", "")
    return (OWNED_CONDITIONS.index(t) if t in OWNED_CONDITIONS else len(OWNED_CONDITIONS), t)


def _transition_events(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> list[EventSpec]:
    """Events for Ready, Degraded and Routed when their status or reason changed; nothing
    otherwise. Waiting for a Gateway's verdict (Routed=False, Pending) is not a warning."""
    events = []
    for ctype in (READY, DEGRADED, ROUTED, MODEL_CACHED):
        new = after.get(ctype)
        old = before.get(ctype) or {}
        if new is None or (old.get("status"), old.get("reason")) == (new["status"], new["reason"]):
            continue
        bad = (ctype == READY) != (new["status"] == "True")
        if ctype == READY and new["status"] == "False" and not old:
            bad = new["reason"] in _DEGRADING  # a new pool is not ready yet: not a warning
        if ctype == ROUTED:  # like Ready: False is the bad news, unless still pending
            bad = new["status"] == "False" and new["reason"] != ROUTE_PENDING
        if ctype == MODEL_CACHED:  # fetching is expected; a failure or no node is not
            bad = new["status"] == "False" and new["reason"] != PREFETCHING
        events.append(
            EventSpec(
                type="Warning" if bad else "Normal",
                reason=new["reason"],
                message=f"{ctype}={new['status']}: {new['message']}",
            )
        )
    return events


def merge_patch(live: Any, desired: Any) -> Any:
    """The smallest JSON merge patch turning `live` into `desired` for the keys in `desired`
    (keys only in `live` are left alone: they belong to someone else). None if equal."""
    if isinstance(live, dict) and isinstance(desired, dict):
        patch: dict[str, Any] = {}
        for key, value in desired.items():
            if value is None:
                if live.get(key) is not None:
                    patch[key] = None
                continue
            sub = merge_patch(live.get(key), value)
            if sub is not None:
                patch[key] = sub
        return patch or None
    return None if live == desired else desired
