"""Multi-node replicas: a role with `nodesPerReplica` > 1 runs on a LeaderWorkerSet.

Each replica is one LWS group of `nodesPerReplica` pods: a leader (worker index 0), which runs
vLLM's OpenAI server, and workers, which run vLLM headless and join the leader's
torch.distributed group (the launcher's --nodes; runtime_image/multinode.py). Both templates
are the role's Deployment pod template, the same launcher command; the workers' differs only
where a headless engine does: no HTTP port, probes or scrape annotations (it serves nothing).

- The set is named `POOL-ROLE-lws`: the LWS controller makes a headless Service named after
  the set for its pods' DNS names (LWS_LEADER_ADDRESS is `POOL-ROLE-lws-G.POOL-ROLE-lws.NS`),
  so the set cannot share its name with the role's engine Service.
- The engine Service `POOL-ROLE` selects leaders only (worker index 0): the router's discovery
  and the clients behind it see one endpoint per replica.
- `RecreateGroupOnPodRestart`: a multi-node engine cannot survive a lost rank, so any pod's
  restart recreates its whole group. `LeaderCreated`: workers start with the leader (the
  leader is ready only once they have joined). Rolling updates surge a group before removing
  one, as the Deployments do with pods.
- With autoscaling applying, `replicas` is left out, as for Deployments; the autoscaler scales
  the set through its /scale subresource (groups, not pods).

Part of the pure builders (poolpilot.operator.builders): no I/O and no clock.
"""

from __future__ import annotations

import copy

from poolpilot.operator.building_blocks import (
    GATEWAY_POOL_LABEL,
    Capabilities,
    Pool,
    _meta,
    _replicas_enforced,
)

from poolpilot import api, names
from poolpilot import leaderworkerset as lws
from poolpilot.apitypes import Obj

# The engine's ports a headless worker does not serve (vLLM's API server, its metrics and its
# KV events run on the leader).
_LEADER_ONLY_PORTS = ("http", "metrics", "kv-events", "kv-replay")
_LEADER_ONLY_FIELDS = ("readinessProbe", "livenessProbe", "startupProbe")
_SCRAPE_ANNOTATIONS = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")


def multi_node(spec: api.InferencePoolSpec, role: str) -> bool:
    """Whether the role's replicas are groups of pods (a LeaderWorkerSet) rather than pods."""
    return role in names.ENGINE_ROLES and spec.role(role).nodes_per_replica > 1


def set_name(pool: str, role: str) -> str:
    """The role's LeaderWorkerSet, e.g. llama-405b-decode-lws."""
    return f"{names.child_name(pool, role)}-lws"


def _worker_template(leader: Obj) -> Obj:
    worker = copy.deepcopy(leader)
    container = worker["spec"]["containers"][0]
    for key in _LEADER_ONLY_FIELDS:
        container.pop(key, None)
    container["ports"] = [p for p in container.get("ports", [])
                          if p.get("name") not in _LEADER_ONLY_PORTS]
    if not container["ports"]:
        del container["ports"]
    annotations = worker["metadata"].get("annotations") or {}
    for key in _SCRAPE_ANNOTATIONS:
        annotations.pop(key, None)
    if not annotations:
        worker["metadata"].pop("annotations", None)
    # A GIE InferencePool selects by labels alone (matchLabels): a worker, which serves
    # nothing, must not carry the label its endpoints are picked by.
    (worker["metadata"].get("labels") or {}).pop(GATEWAY_POOL_LABEL, None)
    return worker


def build_engine_leaderworkerset(pool: Pool, deployment: Obj,
                                 caps: Capabilities | None = None) -> Obj:
    """LeaderWorkerSet `POOL-ROLE-lws` for a multi-node role, from the role's Deployment (its
    pod template becomes the leader's; the workers' is the headless variant of it)."""
    del caps  # the same capabilities shaped the Deployment
    role = deployment["metadata"]["labels"][names.ROLE_LABEL]
    role_spec = pool.spec.role(role)
    leader = copy.deepcopy(deployment["spec"]["template"])
    template: Obj = {
        "size": role_spec.nodes_per_replica,
        "restartPolicy": lws.RECREATE_GROUP_ON_POD_RESTART,
        "leaderTemplate": leader,
        "workerTemplate": _worker_template(leader),
    }
    spec: Obj = {
        "leaderWorkerTemplate": template,
        "startupPolicy": lws.LEADER_CREATED,
        # Surge, never drop: a replaced group keeps serving until its successor is ready.
        "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {
            "maxSurge": 1, "maxUnavailable": 0}},
    }
    if _replicas_enforced(pool.spec, role):
        spec = {"replicas": role_spec.replicas, **spec}
    return {
        "apiVersion": lws.API_VERSION,
        "kind": lws.KIND,
        "metadata": _meta(pool, set_name(pool.name, role), role),
        "spec": spec,
    }


def leader_only_service(service: Obj) -> Obj:
    """The role's engine Service, selecting the groups' leaders only."""
    out = copy.deepcopy(service)
    out["spec"]["selector"] = {**out["spec"]["selector"], **lws.LEADER_SELECTOR}
    return out
