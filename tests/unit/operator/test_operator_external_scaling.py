"""autoscaling.mode External, as docs/autoscaler.md shows it with KEDA: the example ScaledObjects
are valid KEDA objects, each targets a Deployment the operator renders for the example pool
without a `replicas` field (so KEDA's HPA owns it), with the role's bounds, on the role's own
queue metric."""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from keda_schema import SCALED_OBJECT
from poolpilot.operator import builders
from poolpilot.operator.render import pools_from_file

from poolpilot import metrics as m
from poolpilot import names

ROOT = Path(__file__).resolve().parents[3]
POOL = ROOT / "examples" / "keda" / "llama-8b-external.yaml"
SCALED_OBJECTS = list(yaml.safe_load_all(
    (ROOT / "examples" / "keda" / "llama-8b-scaledobjects.yaml").read_text()))


@pytest.mark.parametrize("obj", SCALED_OBJECTS, ids=lambda o: o["metadata"]["name"])
def test_each_scaled_object_is_valid_and_scales_a_role_the_operator_leaves_alone(obj: dict) -> None:
    jsonschema.validate(obj, SCALED_OBJECT)
    (pool,) = pools_from_file(POOL)
    children = {(o["kind"], o["metadata"]["name"]): o for o in builders.build_children(pool)}
    ref = obj["spec"]["scaleTargetRef"]
    dep = children[(ref["kind"], ref["name"])]
    assert ref["apiVersion"] == dep["apiVersion"] and obj["metadata"]["namespace"] == pool.namespace
    assert "replicas" not in dep["spec"], "the operator must leave the size to KEDA"
    role = dep["metadata"]["labels"][names.ROLE_LABEL]
    spec = pool.spec.role(role)
    assert (obj["spec"]["minReplicaCount"], obj["spec"]["maxReplicaCount"]) == (
        spec.min_replicas, spec.max_replicas)
    (trigger,) = obj["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    assert query.startswith(f"sum({m.VLLM_WAITING}{{")
    labels = dict(re.findall(r'(\w+)="([^"]*)"', query))
    assert labels == {"namespace": pool.namespace, "pool": pool.name, "role": role}
    assert float(trigger["metadata"]["threshold"]) > 0


def test_a_misspelt_key_is_refused() -> None:
    bad = {**SCALED_OBJECTS[0], "spec": {**SCALED_OBJECTS[0]["spec"], "maxReplicas": 4}}
    with pytest.raises(jsonschema.ValidationError, match="maxReplicas"):
        jsonschema.validate(bad, SCALED_OBJECT)
