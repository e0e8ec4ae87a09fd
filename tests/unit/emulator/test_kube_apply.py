"""Server-side apply: ownership in managedFields, releasing omitted fields, conflicts, force."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.emulator.errors import ApiError
from poolpilot.emulator.managed import decode, encode, flatten
from poolpilot.emulator.patch import builtin_list_type
from poolpilot.emulator.store import Store


def deployment(replicas: int | None = 2, image: str = "vllm:1", labels: dict[str, str] | None =
               None, containers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "p"}},
        "template": {
            "metadata": {"labels": {"app": "p"}},
            "spec": {"containers": containers or [{"name": "engine", "image": image}]},
        },
    }
    if replicas is not None:
        spec["replicas"] = replicas
    meta: dict[str, Any] = {"name": "p", "namespace": "default"}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}


@pytest.fixture
def store() -> Store:
    return Store()


def apply(store: Store, obj: dict[str, Any], manager: str, force: bool = False) -> dict[str, Any]:
    rt = store.registry.resolve("deployments")
    return store.patch(rt, "default", "p", "apply", obj, manager=manager, force=force)


def managers(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{m['manager']}/{m['operation']}": m for m in obj["metadata"]["managedFields"]}


def test_apply_creates_and_records_the_manager(store: Store) -> None:
    out = apply(store, deployment(), "operator")
    assert out["spec"]["replicas"] == 2
    entry = managers(out)["operator/Apply"]
    assert entry["fieldsV1"]["f:spec"]["f:replicas"] == {}
    containers = entry["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]
    assert containers == {'k:{"name":"engine"}': {".": {}, "f:name": {}, "f:image": {}}}
    # Defaults the server adds are nobody's (so a later apply never fights over them).
    assert "f:revisionHistoryLimit" not in entry["fieldsV1"]["f:spec"]


def test_reapplying_the_same_configuration_is_a_no_op(store: Store) -> None:
    first = apply(store, deployment(), "operator")
    again = apply(store, deployment(), "operator")
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


def test_omitted_fields_are_released_and_removed(store: Store) -> None:
    apply(store, deployment(labels={"a": "1", "b": "2"}), "operator")
    out = apply(store, deployment(labels={"a": "1"}), "operator")
    assert out["metadata"]["labels"] == {"a": "1"}


def test_omitted_replicas_fall_back_to_the_default_when_nobody_else_owns_them(
        store: Store) -> None:
    apply(store, deployment(replicas=5), "operator")
    out = apply(store, deployment(replicas=None), "operator")
    assert out["spec"]["replicas"] == 1  # removed, then defaulted, as on a real cluster


def test_replicas_set_through_scale_survive_an_apply_that_omits_them(store: Store) -> None:
    rt = store.registry.resolve("deployments")
    apply(store, deployment(replicas=2), "operator")
    store.patch(rt, "default", "p", "merge", {"spec": {"replicas": 7}}, sub="scale",
                manager="autoscaler")
    out = apply(store, deployment(replicas=None, image="vllm:2"), "operator")
    assert out["spec"]["replicas"] == 7
    assert out["spec"]["template"]["spec"]["containers"][0]["image"] == "vllm:2"
    owners = managers(out)
    assert "f:replicas" in owners["autoscaler/Update"]["fieldsV1"]["f:spec"]
    assert "f:replicas" not in owners["operator/Apply"]["fieldsV1"]["f:spec"]


def test_conflicting_value_of_another_manager_is_409_naming_the_field(store: Store) -> None:
    rt = store.registry.resolve("deployments")
    apply(store, deployment(replicas=2), "operator")
    store.patch(rt, "default", "p", "merge", {"spec": {"replicas": 7}}, sub="scale",
                manager="autoscaler")
    with pytest.raises(ApiError) as err:
        apply(store, deployment(replicas=3), "operator")
    status = err.value.status()
    assert status["code"] == 409 and status["reason"] == "Conflict"
    assert status["details"]["causes"] == [{
        "reason": "FieldManagerConflict",
        "message": 'conflict with "autoscaler" using apps/v1',
        "field": ".spec.replicas",
    }]
    assert store.get(rt, "default", "p")["spec"]["replicas"] == 7


def test_force_takes_ownership(store: Store) -> None:
    rt = store.registry.resolve("deployments")
    apply(store, deployment(replicas=2), "operator")
    store.patch(rt, "default", "p", "merge", {"spec": {"replicas": 7}}, sub="scale",
                manager="autoscaler")
    out = apply(store, deployment(replicas=3), "operator", force=True)
    assert out["spec"]["replicas"] == 3
    owners = managers(out)
    assert "f:replicas" in owners["operator/Apply"]["fieldsV1"]["f:spec"]
    assert "autoscaler/Update" not in owners  # nothing left to own


def test_same_value_from_two_appliers_is_shared_not_a_conflict(store: Store) -> None:
    apply(store, deployment(replicas=2), "a")
    apply(store, deployment(replicas=2), "b")
    out = apply(store, deployment(replicas=None), "a")
    assert out["spec"]["replicas"] == 2  # still owned by b
    assert "f:replicas" in managers(out)["b/Apply"]["fieldsV1"]["f:spec"]


def test_containers_merge_by_name_across_managers(store: Store) -> None:
    apply(store, deployment(), "operator")
    sidecar = deployment(containers=[{"name": "sidecar", "image": "s:1"}])
    del sidecar["spec"]["replicas"]
    apply(store, sidecar, "injector")
    out = apply(store, deployment(image="vllm:3"), "operator")
    names = {c["name"]: c["image"] for c in out["spec"]["template"]["spec"]["containers"]}
    assert names == {"engine": "vllm:3", "sidecar": "s:1"}
    # The injector drops its container: only that one goes.
    out = apply(store, {**sidecar, "spec": {"selector": sidecar["spec"]["selector"]}},
                "injector")
    assert [c["name"] for c in out["spec"]["template"]["spec"]["containers"]] == ["engine"]


def test_update_takes_ownership_of_what_it_changed(store: Store) -> None:
    rt = store.registry.resolve("deployments")
    apply(store, deployment(labels={"a": "1"}), "operator")
    out = store.patch(rt, "default", "p", "merge", {"metadata": {"labels": {"a": "2"}}},
                      manager="kubectl-edit")
    owners = managers(out)
    assert "f:a" in owners["kubectl-edit/Update"]["fieldsV1"]["f:metadata"]["f:labels"]
    assert "f:labels" not in owners["operator/Apply"]["fieldsV1"].get("f:metadata", {})
    # The operator's next apply conflicts on that label (it drifted), and force restores it.
    with pytest.raises(ApiError):
        apply(store, deployment(labels={"a": "1"}), "operator")
    out = apply(store, deployment(labels={"a": "1"}), "operator", force=True)
    assert out["metadata"]["labels"] == {"a": "1"}


def test_apply_needs_a_field_manager_and_matching_kind(store: Store) -> None:
    rt = store.registry.resolve("deployments")
    with pytest.raises(ApiError) as err:
        store.patch(rt, "default", "p", "apply", deployment(), manager="")
    assert err.value.code == 400 and "fieldManager" in err.value.message
    wrong = {**deployment(), "kind": "StatefulSet"}
    with pytest.raises(ApiError):
        store.patch(rt, "default", "p", "apply", wrong, manager="m")


def test_apply_to_status_subresource_leaves_spec_alone(store: Store) -> None:
    rt = store.registry.resolve("deployments")
    apply(store, deployment(), "operator")
    status = {**deployment(replicas=9), "status": {"readyReplicas": 2}}
    out = store.patch(rt, "default", "p", "apply", status, sub="status", manager="ctl")
    assert out["status"] == {"readyReplicas": 2} and out["spec"]["replicas"] == 2
    assert managers(out)["ctl/Apply"]["subresource"] == "status"


@dataclass(frozen=True)
class RoundTrip:
    id: str
    obj: dict[str, Any] = field(default_factory=dict)


ROUND_TRIPS = [
    RoundTrip("flat", {"a": 1, "b": "x"}),
    RoundTrip("nested", {"spec": {"x": {"y": 1}, "z": [1, 2]}}),
    RoundTrip("keyed", {"spec": {"containers": [{"name": "a", "env": [{"name": "E",
                                                                        "value": "1"}]}]}}),
    RoundTrip("set", {"metadata": {"finalizers": ["a", "b"]}}),
    RoundTrip("dotted-keys", {"metadata": {"labels": {"poolpilot.dev/pool": "p"}}}),
]


@pytest.mark.parametrize("case", ROUND_TRIPS, ids=lambda c: c.id)
def test_fieldsv1_round_trips(case: RoundTrip) -> None:
    paths = set(flatten(copy.deepcopy(case.obj), builtin_list_type))
    assert decode(encode(paths)) == paths


label_maps = st.dictionaries(st.sampled_from(["a", "b", "c", "d", "poolpilot.dev/role"]),
                             st.sampled_from(["x", "y", "z"]), max_size=4)


@settings(deadline=None, max_examples=50)  # no timing: CI is shared
@given(label_maps, label_maps)
def test_an_appliers_labels_are_exactly_what_it_applied_last(first: dict[str, str],
                                                             second: dict[str, str]) -> None:
    store = Store()
    apply(store, deployment(labels=first), "op", force=True)
    out = apply(store, deployment(labels=second), "op", force=True)
    assert out["metadata"].get("labels", {}) == second
    again = apply(store, deployment(labels=second), "op", force=True)
    assert again["metadata"]["resourceVersion"] == out["metadata"]["resourceVersion"]


@settings(deadline=None, max_examples=50)  # no timing: CI is shared
@given(label_maps, label_maps, label_maps)
def test_labels_of_another_manager_survive(mine: dict[str, str], later: dict[str, str],
                                           theirs: dict[str, str]) -> None:
    theirs = {f"other-{k}": v for k, v in theirs.items()}  # disjoint keys: no conflicts
    store = Store()
    apply(store, deployment(labels=mine), "op")
    other = deployment(labels=theirs)
    del other["spec"]
    apply(store, other, "other")
    out = apply(store, deployment(labels=later), "op")
    assert out["metadata"].get("labels", {}) == {**theirs, **later}
