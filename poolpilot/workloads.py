"""What poolpilot reads from a Deployment: its replica counts, parsed in one place.

Kubernetes omits a status count while it is zero (and some clients write it as null), and a
Deployment without spec.replicas runs 1. The operator (status, cutover), the autoscaler and the
sandbox all read these the same way through `counts()`. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReplicaCounts:
    desired: int  # spec.replicas
    replicas: int  # status.replicas: pods that exist
    ready: int  # status.readyReplicas
    updated: int  # status.updatedReplicas: pods of the current template
    rolled_out: bool  # status.observedGeneration caught up with metadata.generation


def counts(deployment: Mapping[str, Any]) -> ReplicaCounts:
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    generation = (deployment.get("metadata") or {}).get("generation") or 0
    desired = spec.get("replicas")
    return ReplicaCounts(
        desired=1 if desired is None else int(desired),
        replicas=int(status.get("replicas") or 0),
        ready=int(status.get("readyReplicas") or 0),
        updated=int(status.get("updatedReplicas") or 0),
        rolled_out=int(status.get("observedGeneration") or 0) >= int(generation),
    )
