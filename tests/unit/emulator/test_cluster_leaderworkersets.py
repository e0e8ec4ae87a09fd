"""The emulator's LeaderWorkerSet controller, pure part: groups of pods named and labelled as
upstream, the LWS environment, scaling by whole groups, RecreateGroupOnPodRestart, and ready
groups counted by their leader and every worker."""

from __future__ import annotations

import pytest
from poolpilot.emulator.cluster import leaderworkersets as L

from poolpilot import leaderworkerset as lws
from poolpilot.apitypes import Obj


def lws_obj(replicas: int = 2, size: int = 2) -> Obj:
    template = {"metadata": {"labels": {"poolpilot.dev/role": "decode"}},
                "spec": {"containers": [{"name": "engine", "command": ["poolpilot", "launch"],
                                         "env": [{"name": "A", "value": "1"}]}]}}
    worker = {"metadata": {"labels": {"poolpilot.dev/role": "decode"}},
              "spec": {"containers": [{"name": "engine", "command": ["poolpilot", "launch"]}]}}
    return {"apiVersion": lws.API_VERSION, "kind": lws.KIND,
            "metadata": {"name": "p-decode-lws", "namespace": "ns", "uid": "u1",
                         "generation": 3},
            "spec": {"replicas": replicas, "leaderWorkerTemplate": {
                "size": size, "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": template, "workerTemplate": worker}}}


def group_pods(obj: Obj, groups: range) -> list[Obj]:
    size = obj["spec"]["leaderWorkerTemplate"]["size"]
    return [L.build_group_pod(obj, g, w) for g in groups for w in range(size)]


def test_pods_are_named_labelled_and_given_the_lws_environment_as_upstream() -> None:
    obj = lws_obj()
    leader, worker = L.build_group_pod(obj, 1, 0), L.build_group_pod(obj, 1, 1)
    assert (leader["metadata"]["name"], worker["metadata"]["name"]) == (
        "p-decode-lws-1", "p-decode-lws-1-1")
    for pod, index in ((leader, "0"), (worker, "1")):
        labels = pod["metadata"]["labels"]
        assert labels[lws.NAME_LABEL] == "p-decode-lws"
        assert labels[lws.GROUP_INDEX_LABEL] == "1"
        assert labels[lws.WORKER_INDEX_LABEL] == index
        assert labels["poolpilot.dev/role"] == "decode"
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert env["LWS_LEADER_ADDRESS"] == "p-decode-lws-1.p-decode-lws.ns"
        assert (env["LWS_GROUP_SIZE"], env["LWS_WORKER_INDEX"]) == ("2", index)
    assert leader["metadata"]["labels"][lws.GROUP_KEY_LABEL] == \
        worker["metadata"]["labels"][lws.GROUP_KEY_LABEL]
    # The leader is made from the leaderTemplate, the workers from the workerTemplate.
    assert {e["name"] for e in leader["spec"]["containers"][0]["env"]} >= {"A"}
    assert "A" not in {e["name"] for e in worker["spec"]["containers"][0]["env"]}
    assert worker["metadata"]["annotations"][lws.LEADER_NAME_ANNOTATION] == "p-decode-lws-1"


def test_scaling_up_creates_whole_groups_and_down_removes_the_highest() -> None:
    obj = lws_obj(replicas=3)
    plan = L.plan_groups(obj, group_pods(obj, range(1)), {})
    assert plan.create == [(1, 0), (1, 1), (2, 0), (2, 1)] and plan.delete == []
    obj = lws_obj(replicas=1)
    plan = L.plan_groups(obj, group_pods(obj, range(3)), {})
    assert sorted(plan.delete) == ["p-decode-lws-1", "p-decode-lws-1-1", "p-decode-lws-2",
                                   "p-decode-lws-2-1"]


def _restarted(pod: Obj) -> Obj:
    pod["status"] = {"containerStatuses": [{"name": "engine", "restartCount": 1}]}
    return pod


@pytest.mark.parametrize("what", ["worker-restarted", "worker-deleted", "leader-restarted"])
def test_a_lost_or_restarted_pod_recreates_its_whole_group(what: str) -> None:
    obj = lws_obj(replicas=2)
    pods = group_pods(obj, range(2))
    if what == "worker-restarted":
        _restarted(pods[3])
    elif what == "leader-restarted":
        _restarted(pods[2])
    else:
        del pods[3]
    plan = L.plan_groups(obj, pods, {})
    assert plan.recreated == [1]
    assert set(plan.delete) == {p["metadata"]["name"] for p in pods
                                if p["metadata"]["labels"][lws.GROUP_INDEX_LABEL] == "1"}
    assert plan.create == []
    # While its pods terminate nothing happens; once they are gone the group comes back whole.
    for p in pods:
        if p["metadata"]["name"] in plan.delete:
            p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert L.plan_groups(obj, pods, {}) == L.GroupPlan()
    survivors = [p for p in pods if p["metadata"]["name"] not in plan.delete]
    assert L.plan_groups(obj, survivors, {}).create == [(1, 0), (1, 1)]


def test_ready_groups_need_the_leader_and_every_worker() -> None:
    obj = lws_obj(replicas=2)
    pods = group_pods(obj, range(2))
    ready = {"p-decode-lws-0": True, "p-decode-lws-0-1": True,
             "p-decode-lws-1": True, "p-decode-lws-1-1": False}
    status = L.set_status(obj, pods, ready)
    assert (status["replicas"], status["readyReplicas"], status["updatedReplicas"]) == (2, 1, 2)
    assert status["observedGeneration"] == 3
    assert status["hpaPodSelector"] == f"{lws.NAME_LABEL}=p-decode-lws,{lws.WORKER_INDEX_LABEL}=0"
    ready["p-decode-lws-1-1"] = True
    assert L.set_status(obj, pods, ready)["readyReplicas"] == 2


def test_a_template_change_replaces_one_group_at_a_time_once_the_others_serve() -> None:
    old = lws_obj(replicas=2)
    pods = group_pods(old, range(2))
    new = lws_obj(replicas=2)
    new["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["image"] = "v2"
    assert L.plan_groups(new, pods, {}).delete == []  # no group serves: wait
    ready = {p["metadata"]["name"]: True for p in pods}
    assert L.plan_groups(new, pods, ready).delete == ["p-decode-lws-0", "p-decode-lws-0-1"]


def test_the_crd_has_upstreams_names_and_scale_subresource() -> None:
    crd = L.crd()
    assert crd["metadata"]["name"] == "leaderworkersets.leaderworkerset.x-k8s.io"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1"
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.hpaPodSelector"}
