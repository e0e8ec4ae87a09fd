"""Desired-vs-live comparison: what counts as drift (a write) and what does not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from poolpilot.operator import builders, reconcile

from poolpilot.validate import parse_spec


@dataclass(frozen=True)
class Case:
    id: str
    want: Any
    have: Any
    contained: bool


CASES = [
    Case("server-defaults-ignored", {"spec": {"a": 1}}, {"spec": {"a": 1, "b": 2}, "status": {}},
         True),
    Case("changed-scalar", {"image": "x:1"}, {"image": "evil:1"}, False),
    Case("removed-label", {"labels": {"a": "1"}}, {"labels": {}}, False),
    Case("list-item-defaults", [{"name": "http", "port": 8000}],
         [{"name": "http", "port": 8000, "protocol": "TCP"}], True),
    Case("list-extra-item", [{"name": "a"}], [{"name": "a"}, {"name": "b"}], False),
    Case("cpu-canonicalized", {"cpu": "0.5"}, {"cpu": "500m"}, True),
    Case("memory-same-bytes", {"memory": "1Gi"}, {"memory": "1024Mi"}, True),
    Case("memory-different", {"memory": "1Gi"}, {"memory": "1G"}, False),
    Case("gpu-count", {"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "2"}, False),
    Case("non-quantity-strings", {"image": "a"}, {"image": "b"}, False),
    # A digest of hex digits that reads as a number past what a Decimal holds: a change, not
    # an exception that stops the reconcile (once one in ~50 reconciles of a spec change).
    Case("digest-like-a-huge-number", {"digest": "4e36912345678901"},
         {"digest": "4e36912345678902"}, False),
    Case("missing-object", {"a": {"b": 1}}, None, False),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_contained(case: Case) -> None:
    assert reconcile.contained(case.want, case.have) is case.contained


def test_stamped_digest_changes_with_the_spec_only() -> None:
    def dep(spec: dict[str, Any]) -> dict[str, Any]:
        pool = builders.Pool("p", "ns", parse_spec({"model": {"name": "m"}, **spec}), "uid")
        return reconcile.stamped(builders.build_engine_deployment(pool, "decode"))

    key = reconcile.DIGEST_ANNOTATION
    a, b = dep({}), dep({})
    c = dep({"runtime": {"engineArgs": {"maxModelLen": 1024}}})
    assert a["metadata"]["annotations"][key] == b["metadata"]["annotations"][key]
    assert a["metadata"]["annotations"][key] != c["metadata"]["annotations"][key]
    # What we apply is contained in itself (as the server returns it): a no-op.
    assert reconcile.contained(a, a)
