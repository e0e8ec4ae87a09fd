"""API semantics of the emulator's store: versions, generation, subresources, conflicts,
deletion, garbage collection, CRDs and watch translation (no HTTP here)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from poolpilot.emulator.errors import ApiError
from poolpilot.emulator.resources import ResourceType
from poolpilot.emulator.selectors import parse_label_selector
from poolpilot.emulator.store import Event, Store, Watcher

ROOT = Path(__file__).resolve().parents[3]
# libyaml: the 300 kB CRD takes PyYAML's pure-Python parser a quarter of a second, at import
CRD = yaml.load((ROOT / "crds/inferencepool.yaml").read_text(), Loader=yaml.CSafeLoader)
POOL = yaml.safe_load((ROOT / "examples/llama-8b-disaggregated.yaml").read_text())


@pytest.fixture
def store() -> Store:
    return Store()


def rt(store: Store, name: str) -> ResourceType:
    return store.registry.resolve(name)


def deployment(name: str = "web", replicas: int | None = 2, image: str = "nginx",
               **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
                     "spec": {"containers": [{"name": "main", "image": image}]}},
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "default", **meta}, "spec": spec}


def with_crd(store: Store) -> ResourceType:
    store.create(rt(store, "customresourcedefinitions"), "", CRD, manager="test")
    return rt(store, "inferencepools.poolpilot.dev")


def test_create_assigns_identity_and_a_global_resource_version(store: Store) -> None:
    deploy = rt(store, "deployments")
    a = store.create(deploy, "default", deployment("a"), manager="t")
    b = store.create(rt(store, "configmaps"), "default", {"metadata": {"name": "c"}})
    assert a["metadata"]["uid"] and a["metadata"]["uid"] != b["metadata"]["uid"]
    assert a["metadata"]["generation"] == 1
    assert a["metadata"]["creationTimestamp"].endswith("Z")
    assert int(b["metadata"]["resourceVersion"]) > int(a["metadata"]["resourceVersion"])
    assert a["kind"] == "Deployment" and a["apiVersion"] == "apps/v1"
    assert a["spec"]["replicas"] == 2


def test_create_twice_is_409_already_exists(store: Store) -> None:
    store.create(rt(store, "deployments"), "default", deployment())
    with pytest.raises(ApiError) as err:
        store.create(rt(store, "deployments"), "default", deployment())
    assert (err.value.code, err.value.reason) == (409, "AlreadyExists")
    assert err.value.message == 'deployments.apps "web" already exists'


def test_missing_object_is_404_not_found(store: Store) -> None:
    with pytest.raises(ApiError) as err:
        store.get(rt(store, "deployments"), "default", "nope")
    assert (err.value.code, err.value.reason) == (404, "NotFound")
    assert err.value.status()["details"]["name"] == "nope"


@dataclass(frozen=True)
class GenCase:
    id: str
    patch: dict[str, Any]
    sub: str
    bumps: bool


GEN_CASES = [
    GenCase("spec-change", {"spec": {"replicas": 3}}, "", True),
    GenCase("label-change", {"metadata": {"labels": {"x": "y"}}}, "", False),
    GenCase("annotation-change", {"metadata": {"annotations": {"x": "y"}}}, "", False),
    GenCase("status-subresource", {"status": {"readyReplicas": 1}}, "status", False),
    GenCase("scale-subresource", {"spec": {"replicas": 7}}, "scale", True),
]


@pytest.mark.parametrize("case", GEN_CASES, ids=lambda c: c.id)
def test_generation_bumps_on_spec_changes_only(store: Store, case: GenCase) -> None:
    deploy = rt(store, "deployments")
    before = store.create(deploy, "default", deployment())
    after = store.patch(deploy, "default", "web", "merge", case.patch, sub=case.sub)
    after = store.get(deploy, "default", "web")
    assert after["metadata"]["generation"] == (2 if case.bumps else 1)
    assert int(after["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])


def test_status_written_through_the_main_resource_is_ignored(store: Store) -> None:
    deploy = rt(store, "deployments")
    store.create(deploy, "default", deployment())
    store.patch(deploy, "default", "web", "merge", {"status": {"readyReplicas": 1}}, sub="status")
    out = store.patch(deploy, "default", "web", "merge",
                      {"spec": {"replicas": 4}, "status": {"readyReplicas": 9}})
    assert out["status"] == {"readyReplicas": 1}
    assert out["spec"]["replicas"] == 4


def test_status_subresource_changes_only_status(store: Store) -> None:
    deploy = rt(store, "deployments")
    store.create(deploy, "default", deployment())
    out = store.patch(deploy, "default", "web", "merge",
                      {"spec": {"replicas": 9}, "status": {"replicas": 2}}, sub="status")
    assert out["spec"]["replicas"] == 2 and out["status"] == {"replicas": 2}


@pytest.mark.parametrize("how", ["put", "merge-patch", "apply"], ids=str)
def test_stale_resource_version_is_409_conflict(store: Store, how: str) -> None:
    deploy = rt(store, "deployments")
    old = store.create(deploy, "default", deployment())
    store.patch(deploy, "default", "web", "merge", {"spec": {"replicas": 3}})
    stale = copy.deepcopy(old)
    stale["spec"]["replicas"] = 5
    with pytest.raises(ApiError) as err:
        if how == "put":
            store.replace(deploy, "default", "web", stale)
        elif how == "merge-patch":
            store.patch(deploy, "default", "web", "merge",
                        {"metadata": {"resourceVersion": old["metadata"]["resourceVersion"]},
                         "spec": {"replicas": 5}})
        else:
            store.patch(deploy, "default", "web", "apply", stale, manager="m")
    assert (err.value.code, err.value.reason) == (409, "Conflict")
    assert "the object has been modified" in err.value.message
    assert store.get(deploy, "default", "web")["spec"]["replicas"] == 3


def test_put_with_current_version_succeeds(store: Store) -> None:
    deploy = rt(store, "deployments")
    cur = store.create(deploy, "default", deployment())
    cur = copy.deepcopy(cur)
    cur["spec"]["replicas"] = 5
    assert store.replace(deploy, "default", "web", cur)["spec"]["replicas"] == 5


def test_no_op_write_keeps_the_version_and_emits_nothing(store: Store) -> None:
    deploy = rt(store, "deployments")
    cur = store.create(deploy, "default", deployment())
    events = len(store.history)
    same = store.patch(deploy, "default", "web", "merge", {"spec": {"replicas": 2}})
    assert same["metadata"]["resourceVersion"] == cur["metadata"]["resourceVersion"]
    assert len(store.history) == events


def test_dry_run_validates_but_stores_nothing(store: Store) -> None:
    deploy = rt(store, "deployments")
    out = store.create(deploy, "default", deployment(), dry_run=True)
    assert out["metadata"]["uid"]
    assert store.find(deploy, "default", "web") is None
    bad = deployment()
    bad["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    with pytest.raises(ApiError) as err:
        store.create(deploy, "default", bad, dry_run=True)
    assert err.value.code == 422
    assert "spec.template.metadata.labels" in err.value.message


def test_namespaces_are_created_on_demand(store: Store) -> None:
    store.create(rt(store, "configmaps"), "serving", {"metadata": {"name": "c"}})
    ns = store.get(rt(store, "namespaces"), "", "serving")
    assert ns["status"]["phase"] == "Active"


def test_invalid_names_are_422_naming_metadata_name(store: Store) -> None:
    with pytest.raises(ApiError) as err:
        store.create(rt(store, "configmaps"), "default", {"metadata": {"name": "Bad_Name"}})
    assert err.value.code == 422
    assert err.value.status()["details"]["causes"][0]["field"] == "metadata.name"


def test_generate_name(store: Store) -> None:
    out = store.create(rt(store, "events"), "default", {"metadata": {"generateName": "ev-"}})
    assert out["metadata"]["name"].startswith("ev-") and len(out["metadata"]["name"]) == 8


# --- deletion -------------------------------------------------------------------------------


def test_finalizers_hold_deletion_until_removed(store: Store) -> None:
    cm = rt(store, "configmaps")
    store.create(cm, "default", {"metadata": {"name": "c", "finalizers": ["x/y"]}})
    held = store.delete(cm, "default", "c")
    assert held["metadata"]["deletionTimestamp"]
    assert store.find(cm, "default", "c") is not None
    # Writes other than finalizer removal keep it; removing the last finalizer deletes it.
    store.patch(cm, "default", "c", "merge", {"data": {"a": "b"}})
    assert store.find(cm, "default", "c") is not None
    store.patch(cm, "default", "c", "merge", {"metadata": {"finalizers": None}})
    assert store.find(cm, "default", "c") is None
    assert store.history[-1].type == "DELETED"


def _owned(name: str, *owners: dict[str, Any]) -> dict[str, Any]:
    refs = [{"apiVersion": o["apiVersion"], "kind": o["kind"], "name": o["metadata"]["name"],
             "uid": o["metadata"]["uid"], "controller": i == 0}
            for i, o in enumerate(owners)]
    return {"metadata": {"name": name, "ownerReferences": refs}}


@pytest.mark.parametrize("propagation", ["Background", "Foreground"], ids=str)
def test_deleting_an_owner_collects_its_dependents(store: Store, propagation: str) -> None:
    pools = with_crd(store)
    pool = store.create(pools, "serving", POOL)
    deploy = rt(store, "deployments")
    d = deployment("llama-8b-decode")
    d["metadata"].update(namespace="serving", ownerReferences=_owned("x", pool)["metadata"][
        "ownerReferences"])
    dep = store.create(deploy, "serving", d)
    # A grandchild is collected too (the cascade follows owner references).
    store.create(rt(store, "pods"), "serving", _owned("pod-1", dep))
    store.create(rt(store, "configmaps"), "serving", {"metadata": {"name": "unrelated"}})
    store.delete(pools, "serving", "llama-8b", propagation=propagation)
    assert store.find(deploy, "serving", "llama-8b-decode") is None
    assert store.find(rt(store, "pods"), "serving", "pod-1") is None
    assert store.find(rt(store, "configmaps"), "serving", "unrelated") is not None


def test_orphan_propagation_keeps_dependents_without_the_reference(store: Store) -> None:
    cm = rt(store, "configmaps")
    owner = store.create(cm, "default", {"metadata": {"name": "owner"}})
    store.create(cm, "default", _owned("child", owner))
    store.delete(cm, "default", "owner", propagation="Orphan")
    child = store.get(cm, "default", "child")
    assert "ownerReferences" not in child["metadata"]


def test_dependent_with_a_live_owner_survives(store: Store) -> None:
    cm = rt(store, "configmaps")
    a = store.create(cm, "default", {"metadata": {"name": "a"}})
    b = store.create(cm, "default", {"metadata": {"name": "b"}})
    store.create(cm, "default", _owned("child", a, b))
    store.delete(cm, "default", "a")
    refs = store.get(cm, "default", "child")["metadata"]["ownerReferences"]
    assert [r["name"] for r in refs] == ["b"]
    store.delete(cm, "default", "b")
    assert store.find(cm, "default", "child") is None


def test_deleting_a_namespace_deletes_its_contents(store: Store) -> None:
    cm = rt(store, "configmaps")
    store.create(cm, "team", {"metadata": {"name": "c"}})
    store.create(cm, "other", {"metadata": {"name": "c"}})
    store.delete(rt(store, "namespaces"), "", "team")
    assert store.find(cm, "team", "c") is None
    assert store.find(rt(store, "namespaces"), "", "team") is None
    assert store.find(cm, "other", "c") is not None


def test_delete_preconditions(store: Store) -> None:
    cm = rt(store, "configmaps")
    store.create(cm, "default", {"metadata": {"name": "c"}})
    with pytest.raises(ApiError) as err:
        store.delete(cm, "default", "c", preconditions={"uid": "not-it"})
    assert err.value.code == 409


# --- scale ----------------------------------------------------------------------------------


def test_scale_subresource_reads_and_writes_replicas(store: Store) -> None:
    deploy = rt(store, "deployments")
    store.create(deploy, "default", deployment())
    scale = store.get_scale(deploy, "default", "web")
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 2
    assert scale["status"]["selector"] == "app=web"
    out = store.patch(deploy, "default", "web", "merge", {"spec": {"replicas": 6}}, sub="scale",
                      manager="autoscaler")
    assert out["spec"]["replicas"] == 6
    obj = store.get(deploy, "default", "web")
    assert obj["spec"]["replicas"] == 6
    owners = {m["manager"]: m for m in obj["metadata"]["managedFields"]}
    assert owners["autoscaler"]["subresource"] == "scale"
    assert "f:replicas" in owners["autoscaler"]["fieldsV1"]["f:spec"]


def test_negative_scale_is_422(store: Store) -> None:
    deploy = rt(store, "deployments")
    store.create(deploy, "default", deployment())
    with pytest.raises(ApiError) as err:
        store.replace(deploy, "default", "web", {"spec": {"replicas": -1}}, sub="scale")
    assert err.value.code == 422 and "spec.replicas" in err.value.message


# --- CRDs -----------------------------------------------------------------------------------


def test_crd_serves_its_resource_with_defaults(store: Store) -> None:
    pools = with_crd(store)
    assert pools.status and pools.short_names == ("ipool",)
    out = store.create(pools, "serving", POOL)
    assert out["spec"]["autoscaling"]["scaleUp"]["maxStep"] == 4  # a schema default


@dataclass(frozen=True)
class InvalidCase:
    id: str
    patch: dict[str, Any]
    field: str


INVALID = [
    InvalidCase("decode-min-above-max", {"spec": {"decode": {"minReplicas": 20}}},
                "spec.decode.maxReplicas"),
    InvalidCase("wrong-type", {"spec": {"decode": {"replicas": "two"}}}, "spec.decode.replicas"),
    InvalidCase("bad-enum", {"spec": {"mode": "Sideways"}}, "spec.mode"),
]


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_invalid_custom_resource_is_422_naming_the_field(store: Store, case: InvalidCase) -> None:
    pools = with_crd(store)
    from poolpilot.emulator.patch import merge_patch

    with pytest.raises(ApiError) as err:
        store.create(pools, "serving", merge_patch(POOL, case.patch))
    assert err.value.code == 422
    assert case.field in [c["field"] for c in err.value.status()["details"]["causes"]]
    assert err.value.message.startswith('InferencePool.poolpilot.dev "llama-8b" is invalid: ')


def test_crd_validation_can_be_turned_off_to_let_bad_input_in(store: Store) -> None:
    pools = with_crd(store)
    store.validate_crds = False
    bad = copy.deepcopy(POOL)
    bad["spec"]["decode"]["minReplicas"] = 20
    assert store.create(pools, "serving", bad)["spec"]["decode"]["minReplicas"] == 20


def test_unknown_fields_are_pruned_with_a_warning_or_rejected_when_strict(store: Store) -> None:
    pools = with_crd(store)
    extra = copy.deepcopy(POOL)
    extra["spec"]["typo"] = 1
    with pytest.raises(ApiError) as err:
        store.create(pools, "serving", extra, strict=True)
    assert err.value.code == 400
    assert 'strict decoding error: unknown field "spec.typo"' in err.value.message
    out = store.create(pools, "serving", extra)
    assert "typo" not in out["spec"]
    assert store.warnings == ['unknown field "spec.typo"']


def test_deleting_a_crd_removes_its_objects_and_resource(store: Store) -> None:
    pools = with_crd(store)
    store.create(pools, "serving", POOL)
    store.delete(rt(store, "customresourcedefinitions"), "", CRD["metadata"]["name"])
    assert store.registry.get("poolpilot.dev", "v1alpha1", "inferencepools") is None
    assert "inferencepools.poolpilot.dev" not in store.objects


def test_strategic_merge_patch_on_a_custom_resource_is_415(store: Store) -> None:
    pools = with_crd(store)
    store.create(pools, "serving", POOL)
    with pytest.raises(ApiError) as err:
        store.patch(pools, "serving", "llama-8b", "strategic", {"spec": {}})
    assert err.value.code == 415


# --- watch translation and history ----------------------------------------------------------


def test_objects_entering_and_leaving_a_selector_are_added_and_deleted(store: Store) -> None:
    cm = rt(store, "configmaps")
    w = Watcher(cm, "default", parse_label_selector("team=a"), [])
    store.watchers.add(w)
    store.create(cm, "default", {"metadata": {"name": "c", "labels": {"team": "b"}}})
    store.patch(cm, "default", "c", "merge", {"metadata": {"labels": {"team": "a"}}})
    store.patch(cm, "default", "c", "merge", {"data": {"k": "v"}})
    store.patch(cm, "default", "c", "merge", {"metadata": {"labels": {"team": "b"}}})
    store.create(cm, "other", {"metadata": {"name": "c", "labels": {"team": "a"}}})
    seen = []
    while not w.queue.empty():
        t, obj = w.queue.get_nowait()
        seen.append((t, obj["metadata"]["labels"]["team"]))
    assert seen == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "b")]


def test_history_replays_from_a_version_and_compaction_means_410(store: Store) -> None:
    cm = rt(store, "configmaps")
    first = store.create(cm, "default", {"metadata": {"name": "a"}})
    store.create(cm, "default", {"metadata": {"name": "b"}})
    since = int(first["metadata"]["resourceVersion"])
    names = [e.obj["metadata"]["name"] for e in store.events_since(since)]
    assert names == ["b"]
    store.compact()
    with pytest.raises(ApiError) as err:
        list(store.events_since(since))
    assert (err.value.code, err.value.reason) == (410, "Expired")


def test_bounded_history_expires_old_versions() -> None:
    store = Store(history_limit=3)
    cm = store.registry.resolve("configmaps")
    for i in range(6):
        store.create(cm, "default", {"metadata": {"name": f"c{i}"}})
    with pytest.raises(ApiError):
        list(store.events_since(1))
    assert len(list(store.events_since(store.rv - 2))) == 2


def test_listeners_see_every_event(store: Store) -> None:
    seen: list[Event] = []
    store.listeners.append(seen.append)
    store.create(rt(store, "configmaps"), "default", {"metadata": {"name": "a"}})
    assert [(e.type, e.obj["metadata"]["name"]) for e in seen] == [("ADDED", "a")]


def test_rewriting_a_crd_keeps_its_status(store: Store) -> None:
    crds = rt(store, "customresourcedefinitions")
    name = CRD["metadata"]["name"]
    store.create(crds, "", CRD)
    status = store.get(crds, "", name)["status"]
    for cond in status["conditions"]:
        cond["lastTransitionTime"] = "2000-01-01T00:00:00Z"
    written = store.patch(crds, "", name, "merge", {"status": status}, sub="status")
    same = store.patch(crds, "", name, "merge", {"spec": {"group": "poolpilot.dev"}})
    assert same["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]
    assert same["status"]["conditions"][0]["lastTransitionTime"] == "2000-01-01T00:00:00Z"


@dataclass(frozen=True)
class Immutable:
    id: str
    resource: str
    obj: dict[str, Any]
    patch: dict[str, Any]
    field: str


_BINDING = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "b", "namespace": "default"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "default"}]}
_SERVICE = {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "s", "namespace": "default"},
            "spec": {"ports": [{"port": 80}], "clusterIP": "10.96.9.9"}}
_CLAIM = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
          "metadata": {"name": "c", "namespace": "default"},
          "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
IMMUTABLE = [
    Immutable("deployment-selector", "deployments", deployment(),
              {"spec": {"selector": {"matchLabels": {"app": "web", "x": "y"}},
                        "template": {"metadata": {"labels": {"app": "web", "x": "y"}}}}},
              "spec.selector"),
    Immutable("rolebinding-roleref", "rolebindings", _BINDING,
              {"roleRef": {"name": "other"}}, "roleRef"),
    Immutable("service-clusterip", "services", _SERVICE, {"spec": {"clusterIP": "10.96.1.1"}},
              "spec.clusterIP"),
    Immutable("claim-access-modes", "persistentvolumeclaims", _CLAIM,
              {"spec": {"accessModes": ["ReadWriteMany"]}}, "spec.accessModes"),
]


@pytest.mark.parametrize("case", IMMUTABLE, ids=lambda c: c.id)
def test_immutable_fields_are_422_and_the_object_is_kept(store: Store, case: Immutable) -> None:
    """What a real API server refuses to change, refused here too (and the object unchanged)."""
    kind = rt(store, case.resource)
    cur = store.create(kind, "default", copy.deepcopy(case.obj))
    name = case.obj["metadata"]["name"]
    with pytest.raises(ApiError) as err:
        store.patch(kind, "default", name, "merge", case.patch)
    assert err.value.code == 422
    assert case.field in str(err.value) and "field is immutable" in str(err.value)
    assert store.get(kind, "default", name) == cur


def test_mutable_fields_of_those_objects_still_change(store: Store) -> None:
    kind = rt(store, "services")
    store.create(kind, "default", copy.deepcopy(_SERVICE))
    out = store.patch(kind, "default", "s", "merge", {"spec": {"ports": [{"port": 81}]}})
    assert out["spec"]["clusterIP"] == "10.96.9.9" and out["spec"]["ports"][0]["port"] == 81
