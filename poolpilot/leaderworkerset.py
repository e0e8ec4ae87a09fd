"""LeaderWorkerSet (leaderworkerset.x-k8s.io/v1): the names poolpilot reads and writes.

A replica of a role with `nodesPerReplica` > 1 is one LWS group: a leader pod (worker index 0,
named NAME-G) and workers (NAME-G-W, W = 1..size-1). The LWS controller labels every pod with
the set's name, the group's index and the pod's worker index, and gives every container the
group's leader address, size and the pod's index in the environment (upstream's API types:
github.com/kubernetes-sigs/lws, api/leaderworkerset/v1/leaderworkerset_types.go).

The operator renders the set, the launcher reads the environment, the router and the Services
select leaders only, the autoscaler scales the set's /scale subresource, and the emulator runs
a minimal controller of it. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GROUP = "leaderworkerset.x-k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LeaderWorkerSet"
PLURAL = "leaderworkersets"

NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
LEADER_NAME_ANNOTATION = "leaderworkerset.sigs.k8s.io/leader-name"

LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
GROUP_SIZE_ENV = "LWS_GROUP_SIZE"
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"

RECREATE_GROUP_ON_POD_RESTART = "RecreateGroupOnPodRestart"
# Workers start with their leader, not after it is ready: a multi-node vLLM leader becomes ready
# only once every worker has joined its process group (LeaderReady would never start them).
LEADER_CREATED = "LeaderCreated"

# What a leader-only selector adds (Services, budgets, the router's discovery).
LEADER_SELECTOR = {WORKER_INDEX_LABEL: "0"}


def is_worker(labels: Mapping[str, Any]) -> bool:
    """A non-leader pod of an LWS group (worker index set and not 0)."""
    index = labels.get(WORKER_INDEX_LABEL)
    return index is not None and str(index) != "0"


def leader_address(name: str, group: int, namespace: str) -> str:
    """The leader's DNS name, as upstream sets LWS_LEADER_ADDRESS: the leader pod's hostname
    under the set's headless Service (subdomain policy Shared)."""
    return f"{name}-{group}.{name}.{namespace}"


def gpus_per_replica(gpus: int, nodes_per_replica: int) -> int:
    """GPUs one replica holds: every pod of its group has `gpus`."""
    return gpus * max(1, nodes_per_replica)
