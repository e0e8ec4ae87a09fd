"""PATCH semantics: JSON merge patch, strategic merge patch and JSON patch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.emulator.errors import ApiError
from poolpilot.emulator.patch import json_patch, merge_patch, strategic_merge


@dataclass(frozen=True)
class Case:
    id: str
    target: Any
    patch: Any
    want: Any


MERGE = [
    Case("add", {"a": 1}, {"b": 2}, {"a": 1, "b": 2}),
    Case("replace", {"a": 1}, {"a": 2}, {"a": 2}),
    Case("null-deletes", {"a": 1, "b": 2}, {"a": None}, {"b": 2}),
    Case("nested", {"s": {"x": 1, "y": 2}}, {"s": {"y": 3}}, {"s": {"x": 1, "y": 3}}),
    Case("lists-replace", {"l": [1, 2]}, {"l": [3]}, {"l": [3]}),
    Case("containers-replaced-whole", {"c": [{"name": "a", "image": "x"}]},
         {"c": [{"name": "a"}]}, {"c": [{"name": "a"}]}),
    Case("scalar-over-object", {"a": {"b": 1}}, {"a": 5}, {"a": 5}),
]


@pytest.mark.parametrize("case", MERGE, ids=lambda c: c.id)
def test_merge_patch(case: Case) -> None:
    assert merge_patch(case.target, case.patch) == case.want


def _pod(*containers: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"template": {"spec": {"containers": list(containers)}}}}


SMP = [
    Case("containers-merge-by-name",
         _pod({"name": "a", "image": "x"}, {"name": "b", "image": "y"}),
         _pod({"name": "b", "image": "z"}),
         _pod({"name": "a", "image": "x"}, {"name": "b", "image": "z"})),
    Case("containers-append-new",
         _pod({"name": "a", "image": "x"}),
         _pod({"name": "c", "image": "w"}),
         _pod({"name": "a", "image": "x"}, {"name": "c", "image": "w"})),
    Case("containers-delete-directive",
         _pod({"name": "a", "image": "x"}, {"name": "b", "image": "y"}),
         _pod({"name": "a", "$patch": "delete"}),
         _pod({"name": "b", "image": "y"})),
    Case("env-merge-by-name",
         _pod({"name": "a", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}),
         _pod({"name": "a", "env": [{"name": "B", "value": "3"}]}),
         _pod({"name": "a", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}]})),
    Case("container-ports-by-containerPort",
         _pod({"name": "a", "ports": [{"containerPort": 80, "name": "http"}]}),
         _pod({"name": "a", "ports": [{"containerPort": 90}]}),
         _pod({"name": "a", "ports": [{"containerPort": 80, "name": "http"},
                                      {"containerPort": 90}]})),
    Case("service-ports-by-port",
         {"spec": {"ports": [{"port": 80, "targetPort": 8080}]}},
         {"spec": {"ports": [{"port": 80, "targetPort": 9090}]}},
         {"spec": {"ports": [{"port": 80, "targetPort": 9090}]}}),
    Case("args-atomic",
         _pod({"name": "a", "args": ["--x", "1"]}),
         _pod({"name": "a", "args": ["--y"]}),
         _pod({"name": "a", "args": ["--y"]})),
    Case("finalizers-union",
         {"metadata": {"finalizers": ["a"]}}, {"metadata": {"finalizers": ["b", "a"]}},
         {"metadata": {"finalizers": ["a", "b"]}}),
    Case("delete-from-primitive-list",
         {"metadata": {"finalizers": ["a", "b"]}},
         {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}},
         {"metadata": {"finalizers": ["b"]}}),
    Case("set-element-order-ignored",
         _pod({"name": "a", "image": "x"}),
         {"spec": {"template": {"spec": {"$setElementOrder/containers": [{"name": "a"}],
                                         "containers": [{"name": "a", "image": "y"}]}}}},
         _pod({"name": "a", "image": "y"})),
    Case("map-replace-directive",
         {"spec": {"selector": {"a": "1", "b": "2"}}},
         {"spec": {"selector": {"$patch": "replace", "c": "3"}}},
         {"spec": {"selector": {"c": "3"}}}),
    Case("retain-keys",
         {"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}},
         {"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}},
         {"spec": {"strategy": {"type": "Recreate"}}}),
    Case("null-deletes", {"a": {"b": 1, "c": 2}}, {"a": {"b": None}}, {"a": {"c": 2}}),
]


@pytest.mark.parametrize("case", SMP, ids=lambda c: c.id)
def test_strategic_merge_patch(case: Case) -> None:
    assert strategic_merge(case.target, case.patch) == case.want


JSONPATCH = [
    Case("add", {"a": 1}, [{"op": "add", "path": "/b", "value": 2}], {"a": 1, "b": 2}),
    Case("add-append", {"l": [1]}, [{"op": "add", "path": "/l/-", "value": 2}], {"l": [1, 2]}),
    Case("add-insert", {"l": [1, 3]}, [{"op": "add", "path": "/l/1", "value": 2}],
         {"l": [1, 2, 3]}),
    Case("remove", {"a": 1, "b": 2}, [{"op": "remove", "path": "/a"}], {"b": 2}),
    Case("replace", {"a": {"b": 1}}, [{"op": "replace", "path": "/a/b", "value": 5}],
         {"a": {"b": 5}}),
    Case("escaped", {"metadata": {"labels": {"poolpilot.dev/pool": "x"}}},
         [{"op": "replace", "path": "/metadata/labels/poolpilot.dev~1pool", "value": "y"}],
         {"metadata": {"labels": {"poolpilot.dev/pool": "y"}}}),
    Case("move", {"a": 1}, [{"op": "move", "from": "/a", "path": "/b"}], {"b": 1}),
    Case("copy", {"a": 1}, [{"op": "copy", "from": "/a", "path": "/b"}], {"a": 1, "b": 1}),
    Case("test-passes", {"a": 1}, [{"op": "test", "path": "/a", "value": 1}], {"a": 1}),
]


@pytest.mark.parametrize("case", JSONPATCH, ids=lambda c: c.id)
def test_json_patch(case: Case) -> None:
    assert json_patch(case.target, case.patch) == case.want


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "test", "path": "/a", "value": 2}],
        [{"op": "remove", "path": "/missing"}],
        [{"op": "replace", "path": "/missing", "value": 1}],
        [{"op": "add", "path": "/l/9", "value": 1}],
    ],
    ids=["test-fails", "remove-missing", "replace-missing", "index-out-of-range"],
)
def test_json_patch_failures_are_422(ops: list[dict[str, Any]]) -> None:
    with pytest.raises(ApiError) as err:
        json_patch({"a": 1, "l": []}, ops)
    assert err.value.code == 422


def test_json_patch_does_not_mutate_its_input() -> None:
    doc = {"a": {"b": 1}}
    json_patch(doc, [{"op": "replace", "path": "/a/b", "value": 2}])
    assert doc == {"a": {"b": 1}}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner,
                                                                  max_size=3),
    max_leaves=10,
)
json_objects = st.dictionaries(st.text(max_size=2), json_values, max_size=4)


def _no_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    return value


@settings(deadline=None, max_examples=50)  # no timing: CI is shared
@given(json_objects, json_objects)
def test_merge_patch_is_idempotent(target: dict[str, Any], patch: dict[str, Any]) -> None:
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once


@settings(deadline=None, max_examples=50)  # no timing: CI is shared
@given(json_objects)
def test_merge_patch_with_itself_changes_nothing(obj: dict[str, Any]) -> None:
    obj = _no_nulls(obj)
    assert merge_patch(obj, obj) == obj
