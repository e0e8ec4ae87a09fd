"""Invalid InferencePool specs are rejected by the models AND by the generated CRD (OpenAPI
schema + CEL), each with a message naming the field."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from poolpilot import api, crd, crd_validation
from poolpilot.validate import InvalidPool, parse_pool

EXAMPLES = sorted(Path(__file__).parents[2].joinpath("examples").glob("*.yaml"))
CRD = crd.build_crd()


def pool(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}}
    base.update(spec)
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": base,
    }


@dataclass(frozen=True)
class Bad:
    id: str
    doc: dict[str, Any]
    field: str  # the path both the models and the CRD must name
    in_crd: bool = True  # expressible in the CRD schema/CEL
    extra: dict[str, Any] = field(default_factory=dict)


BAD = [
    Bad("min-greater-than-max", pool(decode={"minReplicas": 3, "maxReplicas": 2, "replicas": 2}),
        "spec.decode.maxReplicas"),
    Bad("replicas-above-max", pool(prefill={"replicas": 9, "maxReplicas": 8}),
        "spec.prefill.replicas"),
    Bad("replicas-below-min", pool(prefill={"replicas": 1, "minReplicas": 2}),
        "spec.prefill.replicas"),
    Bad("unknown-mode", pool(mode="Split"), "spec.mode"),
    Bad("unknown-connector", pool(kvTransfer={"connector": "MooncakeConnector"}),
        "spec.kvTransfer.connector"),
    Bad("ttft-quantile-one", pool(slo={"ttft": {"quantile": 1.0, "seconds": 1}}),
        "spec.slo.ttft.quantile"),
    Bad("ttft-quantile-zero", pool(slo={"ttft": {"quantile": 0, "seconds": 1}}),
        "spec.slo.ttft.quantile"),
    Bad("itl-quantile-above-one", pool(slo={"itl": {"quantile": 1.5, "seconds": 0.05}}),
        "spec.slo.itl.quantile"),
    Bad("negative-ttft-seconds", pool(slo={"ttft": {"quantile": 0.9, "seconds": -1}}),
        "spec.slo.ttft.seconds"),
    Bad("zero-itl-seconds", pool(slo={"itl": {"quantile": 0.9, "seconds": 0}}),
        "spec.slo.itl.seconds"),
    Bad("gpus-below-tp", pool(decode={"gpus": 2, "tensorParallelSize": 4}), "spec.decode.gpus"),
    Bad("cpu-with-tp", pool(prefill={"gpus": 0, "tensorParallelSize": 2}), "spec.prefill.gpus"),
    Bad("empty-model-name", pool(model={"name": ""}), "spec.model.name"),
    Bad("missing-model", {**pool(), "spec": {"mode": "Aggregated"}}, "spec.model"),
    Bad("unknown-spec-field", pool(replicas=3), "spec.replicas"),
    Bad("unknown-nested-field", pool(prefill={"replica": 2}), "spec.prefill.replica"),
    Bad("negative-replicas", pool(decode={"replicas": -1, "minReplicas": 0}),
        "spec.decode.replicas"),
    Bad("max-replicas-zero", pool(engine={"maxReplicas": 0, "minReplicas": 0, "replicas": 0}),
        "spec.engine.maxReplicas"),
    Bad("zero-tp", pool(prefill={"tensorParallelSize": 0}), "spec.prefill.tensorParallelSize"),
    Bad("min-zero-without-scale-to-zero", pool(decode={"minReplicas": 0}),
        "spec.autoscaling.scaleToZero"),
    Bad("unknown-autoscaling-mode", pool(autoscaling={"mode": "Auto"}),
        "spec.autoscaling.mode"),
    Bad("interval-zero", pool(autoscaling={"intervalSeconds": 0}),
        "spec.autoscaling.intervalSeconds"),
    Bad("negative-window",
        pool(autoscaling={"scaleDown": {"stabilizationWindowSeconds": -5, "maxStep": 1,
                                        "cooldownSeconds": 0}}),
        "spec.autoscaling.scaleDown.stabilizationWindowSeconds"),
    Bad("max-step-zero",
        pool(autoscaling={"scaleUp": {"stabilizationWindowSeconds": 0, "maxStep": 0,
                                      "cooldownSeconds": 0}}),
        "spec.autoscaling.scaleUp.maxStep"),
    Bad("kv-usage-above-one", pool(autoscaling={"targets": {"kvCacheUsage": 1.5}}),
        "spec.autoscaling.targets.kvCacheUsage"),
    Bad("both-sources", pool(model={"name": "m", "source": {"huggingFace": {},
                                                           "pvc": {"claimName": "w"}}}),
        "spec.model.source.pvc"),
    Bad("pvc-without-claim", pool(model={"name": "m", "source": {"pvc": {"path": "/m"}}}),
        "spec.model.source.pvc.claimName"),
    Bad("bad-pull-policy", pool(runtime={"imagePullPolicy": "Sometimes"}),
        "spec.runtime.imagePullPolicy"),
    Bad("string-replicas", pool(decode={"replicas": "two"}), "spec.decode.replicas"),
    Bad("router-zero-replicas", pool(router={"replicas": 0}), "spec.router.replicas"),
    Bad("other-projects-group",
        {**pool(), "apiVersion": "inference.networking.k8s.io/v1"}, "apiVersion", in_crd=False),
    Bad("uppercase-name", {**pool(), "metadata": {"name": "Llama"}}, "metadata.name",
        in_crd=False),
]


@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_models_reject_and_name_the_field(case: Bad) -> None:
    with pytest.raises(InvalidPool) as exc:
        parse_pool(case.doc)
    assert any(e.startswith(f"{case.field}:") for e in exc.value.errors), exc.value.errors


@pytest.mark.parametrize("case", [c for c in BAD if c.in_crd], ids=[c.id for c in BAD if c.in_crd])
def test_crd_rejects_and_names_the_field(case: Bad) -> None:
    _, errors = crd_validation.validate(CRD, case.doc)
    assert errors, "the CRD accepted a spec the models reject"
    assert any(case.field in e for e in errors), errors


def test_at_least_twenty_bad_specs() -> None:
    assert len([c for c in BAD if c.in_crd]) >= 20


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_are_valid_for_models_and_crd(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    parsed = parse_pool(doc)
    defaulted, errors = crd_validation.validate(CRD, doc)
    assert errors == []
    # The API server's defaulting fills the same values the models do.
    assert _prune(defaulted["spec"]) == _prune(parsed.spec.to_wire())


def _prune(value: Any) -> Any:
    """Drop empty maps and lists: for Kubernetes, empty and unset mean the same."""
    if isinstance(value, dict):
        pruned = {k: _prune(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in ({}, [])}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def test_defaults_a_user_expects() -> None:
    spec = parse_pool(pool()).spec
    assert spec.mode == "Disaggregated"
    assert spec.kv_transfer.connector == "NixlConnector"
    assert (spec.slo.ttft.quantile, spec.slo.ttft.seconds) == (0.9, 1.0)
    assert spec.autoscaling.scale_to_zero is False
    assert spec.decode.max_replicas == 16
    assert spec.served_name() == "meta-llama/Llama-3.1-8B-Instruct"


# --- Hypothesis: whatever the models accept, the CRD accepts too -------------------------------

role = st.fixed_dictionaries(
    {},
    optional={
        "replicas": st.integers(0, 20),
        "minReplicas": st.integers(0, 20),
        "maxReplicas": st.integers(0, 20),
        "gpus": st.integers(0, 8),
        "tensorParallelSize": st.integers(0, 8),
        "engineArgs": st.dictionaries(st.sampled_from(["maxModelLen", "enforceEager"]),
                                      st.one_of(st.integers(1, 9999), st.booleans())),
    },
)
latency = st.fixed_dictionaries(
    {"quantile": st.floats(-0.5, 1.5, allow_nan=False), "seconds": st.floats(-1, 10)}
)
specs = st.fixed_dictionaries(
    {"model": st.fixed_dictionaries({"name": st.text(min_size=0, max_size=5)})},
    optional={
        "mode": st.sampled_from(["Disaggregated", "Aggregated", "Other"]),
        "kvTransfer": st.fixed_dictionaries(
            {"connector": st.sampled_from(["NixlConnector", "ExampleConnector", "Nope"])}),
        "prefill": role,
        "decode": role,
        "engine": role,
        "slo": st.fixed_dictionaries({}, optional={"ttft": latency, "itl": latency}),
        "autoscaling": st.fixed_dictionaries(
            {}, optional={"scaleToZero": st.booleans(), "intervalSeconds": st.integers(-1, 60),
                          "mode": st.sampled_from(["Apply", "Advisory", "Off"])}),
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_models_and_crd_agree(spec: dict[str, Any]) -> None:
    doc = pool()
    doc["spec"] = copy.deepcopy(spec)
    try:
        parse_pool(doc)
        accepted = True
    except InvalidPool:
        accepted = False
    _, errors = crd_validation.validate(CRD, doc)
    if accepted:
        assert errors == [], errors
    else:
        # Every rule here is expressible in the CRD, so it must reject as well.
        assert errors, "models rejected a spec the CRD accepts"
