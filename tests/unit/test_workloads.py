"""One parser of a Deployment's replica counts for the operator, the autoscaler and the sandbox."""

from __future__ import annotations

from typing import Any

import pytest

from poolpilot.workloads import ReplicaCounts, counts


@pytest.mark.parametrize(
    ("deployment", "expected"),
    [
        ({"metadata": {"generation": 3},
          "spec": {"replicas": 4},
          "status": {"replicas": 4, "readyReplicas": 3, "updatedReplicas": 2,
                     "observedGeneration": 3}},
         ReplicaCounts(desired=4, replicas=4, ready=3, updated=2, rolled_out=True)),
        # Kubernetes omits a zero count; some clients write null.
        ({"spec": {"replicas": 2}, "status": {"readyReplicas": None}},
         ReplicaCounts(desired=2, replicas=0, ready=0, updated=0, rolled_out=True)),
        # No spec.replicas: Kubernetes runs one.
        ({"spec": {}}, ReplicaCounts(desired=1, replicas=0, ready=0, updated=0, rolled_out=True)),
        ({"spec": {"replicas": 0}},
         ReplicaCounts(desired=0, replicas=0, ready=0, updated=0, rolled_out=True)),
        # The controller has not seen the latest template yet.
        ({"metadata": {"generation": 5}, "spec": {"replicas": 1},
          "status": {"observedGeneration": 4, "readyReplicas": 1}},
         ReplicaCounts(desired=1, replicas=0, ready=1, updated=0, rolled_out=False)),
        ({}, ReplicaCounts(desired=1, replicas=0, ready=0, updated=0, rolled_out=True)),
    ],
    ids=["full", "zero-counts-omitted-or-null", "replicas-unset", "scaled-to-zero",
         "rollout-pending", "empty"],
)
def test_counts(deployment: dict[str, Any], expected: ReplicaCounts) -> None:
    assert counts(deployment) == expected
