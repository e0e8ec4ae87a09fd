"""Label and field selectors behave like the API server's."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.emulator.errors import ApiError
from poolpilot.emulator.selectors import (
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
    selector_string,
)


@dataclass(frozen=True)
class LabelCase:
    id: str
    selector: str
    labels: dict[str, str]
    match: bool


LABEL_CASES = [
    LabelCase("empty-matches-all", "", {"a": "1"}, True),
    LabelCase("eq", "app=web", {"app": "web"}, True),
    LabelCase("eq-double", "app==web", {"app": "web"}, True),
    LabelCase("eq-other-value", "app=web", {"app": "db"}, False),
    LabelCase("eq-missing", "app=web", {}, False),
    LabelCase("neq", "app!=web", {"app": "db"}, True),
    LabelCase("neq-missing-matches", "app!=web", {}, True),
    LabelCase("neq-same", "app!=web", {"app": "web"}, False),
    LabelCase("in", "role in (prefill,decode)", {"role": "decode"}, True),
    LabelCase("in-no", "role in (prefill,decode)", {"role": "router"}, False),
    LabelCase("in-missing", "role in (prefill)", {}, False),
    LabelCase("notin", "role notin (router)", {"role": "decode"}, True),
    LabelCase("notin-missing-matches", "role notin (router)", {}, True),
    LabelCase("notin-no", "role notin (router, x)", {"role": "router"}, False),
    LabelCase("exists", "poolpilot.dev/pool", {"poolpilot.dev/pool": "p"}, True),
    LabelCase("exists-no", "poolpilot.dev/pool", {"other": "p"}, False),
    LabelCase("not-exists", "!poolpilot.dev/pool", {"other": "p"}, True),
    LabelCase("not-exists-no", "!poolpilot.dev/pool", {"poolpilot.dev/pool": "p"}, False),
    LabelCase("and", "a=1,b in (2,3),!c", {"a": "1", "b": "3"}, True),
    LabelCase("and-one-fails", "a=1,b in (2,3),!c", {"a": "1", "b": "3", "c": ""}, False),
    LabelCase("service-name", "kubernetes.io/service-name=p-decode",
              {"kubernetes.io/service-name": "p-decode"}, True),
]


@pytest.mark.parametrize("case", LABEL_CASES, ids=lambda c: c.id)
def test_label_selector(case: LabelCase) -> None:
    assert labels_match(parse_label_selector(case.selector), case.labels) is case.match


@pytest.mark.parametrize("bad", ["a in b", "=x", "a=(b)", "a in (b"], ids=str)
def test_bad_label_selector_is_a_400_naming_the_term(bad: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_label_selector(bad)
    assert err.value.code == 400


@dataclass(frozen=True)
class FieldCase:
    id: str
    selector: str
    match: bool


OBJ = {"metadata": {"name": "web", "namespace": "serving"}, "status": {"phase": "Running"}}
FIELD_CASES = [
    FieldCase("name", "metadata.name=web", True),
    FieldCase("name-other", "metadata.name=db", False),
    FieldCase("namespace", "metadata.namespace==serving", True),
    FieldCase("namespace-neq", "metadata.namespace!=serving", False),
    FieldCase("both", "metadata.name=web,metadata.namespace=serving", True),
    FieldCase("nested", "status.phase=Running", True),
    FieldCase("absent-is-empty", "spec.nodeName=", True),
]


@pytest.mark.parametrize("case", FIELD_CASES, ids=lambda c: c.id)
def test_field_selector(case: FieldCase) -> None:
    assert fields_match(parse_field_selector(case.selector), OBJ) is case.match


def test_label_selector_object_round_trips_through_the_query_form() -> None:
    selector = {
        "matchLabels": {"app": "web", "tier": "x"},
        "matchExpressions": [
            {"key": "role", "operator": "In", "values": ["a", "b"]},
            {"key": "zone", "operator": "NotIn", "values": ["z"]},
            {"key": "gpu", "operator": "Exists"},
            {"key": "spot", "operator": "DoesNotExist"},
        ],
    }
    text = selector_string(selector)
    reqs = parse_label_selector(text)
    assert labels_match(reqs, {"app": "web", "tier": "x", "role": "a", "gpu": "1"})
    assert not labels_match(reqs, {"app": "web", "tier": "x", "role": "c", "gpu": "1"})
    assert not labels_match(reqs, {"app": "web", "tier": "x", "role": "a", "gpu": "1", "spot": ""})


label_keys = st.sampled_from(["app", "poolpilot.dev/pool", "poolpilot.dev/role", "tier"])
label_values = st.text(alphabet="abcxyz019-.", min_size=1, max_size=6).filter(
    lambda v: v[0].isalnum() and v[-1].isalnum())


@settings(deadline=None, max_examples=50)  # no timing: CI is shared
@given(st.dictionaries(label_keys, label_values, min_size=1), label_values)
def test_match_labels_select_exactly_objects_carrying_them(labels: dict[str, str],
                                                           other: str) -> None:
    reqs = parse_label_selector(selector_string({"matchLabels": labels}))
    assert labels_match(reqs, {**labels, "extra": "1"})
    key = sorted(labels)[0]
    if other != labels[key]:
        assert not labels_match(reqs, {**labels, key: other})
    assert not labels_match(reqs, {k: v for k, v in labels.items() if k != key})
