"""The report's timeline: desired, ready and existing replicas per pool and role over time,
and every change of a Deployment's desired replicas (a scale event). The autoscaler's reasons
are attached later from its Events (report.attach_reasons)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from poolpilot import leaderworkerset as lws
from poolpilot import names
from poolpilot.apitypes import Obj

from . import pods as P


@dataclass
class RoleSample:
    t: float  # time.monotonic()
    namespace: str
    pool: str
    role: str
    desired: int
    ready: int
    pods: int  # pods that exist, starting and draining ones included (they hold a GPU)


@dataclass
class ScaleChange:
    t: float
    namespace: str
    pool: str
    role: str
    from_replicas: int
    to_replicas: int
    reason: str | None = None
    message: str | None = None


class Timeline:
    def __init__(self) -> None:
        self.samples: list[RoleSample] = []
        self.scale_changes: list[ScaleChange] = []
        self._last_sample: dict[tuple[str, str, str], tuple[int, int, int]] = {}
        self._replicas_seen: dict[tuple[str, str], int] = {}

    def record(self, deployments: list[Obj], pods: list[Obj], ready: Mapping[str, bool],
               now: float) -> None:
        """A sample per role whose counts changed since the last one; a ScaleChange per
        engine Deployment (or LeaderWorkerSet) whose desired replicas changed."""
        for d in deployments:
            meta = d["metadata"]
            labels = meta.get("labels") or {}
            pool, role = labels.get(names.POOL_LABEL), labels.get(names.ROLE_LABEL)
            if not pool or not role:
                continue
            desired = int(d["spec"].get("replicas", 1))
            # A LeaderWorkerSet's replicas are groups: its leaders count, not its workers.
            mine = [p for p in pods if P.owned_by(p, d)
                    and not lws.is_worker(p["metadata"].get("labels") or {})]
            n_ready = sum(1 for p in mine if ready.get(p["metadata"]["name"]))
            skey = (meta["namespace"], pool, role)
            if self._last_sample.get(skey) != (desired, n_ready, len(mine)):
                self.samples.append(RoleSample(now, meta["namespace"], pool, role, desired,
                                               n_ready, len(mine)))
                self._last_sample[skey] = (desired, n_ready, len(mine))
            dkey = (meta["namespace"], meta["name"])
            before = self._replicas_seen.get(dkey)
            self._replicas_seen[dkey] = desired
            if before is not None and before != desired and role in names.ENGINE_ROLES:
                self.scale_changes.append(
                    ScaleChange(now, meta["namespace"], pool, role, before, desired)
                )
