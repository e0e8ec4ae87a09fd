"""The containers the operator renders, not only each block of the spec, hold the API server's
resource rules: a request above the limit another layer lays over it is refused naming both
fields; the router's default limit rises to a larger request instead of being crossed."""

from __future__ import annotations

from typing import Any

import pytest
from poolpilot.operator import builders

from poolpilot import api
from poolpilot.apitypes import quantity_value
from poolpilot.validate import InvalidPool, parse_pool


def pool(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, **spec}}


def _containers(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = parse_pool(doc).spec
    objs = builders.build_children(builders.Pool(name="p", namespace="ns", spec=spec),
                                   builders.Capabilities())
    return {o["metadata"]["name"]: c for o in objs if o["kind"] == "Deployment"
            for c in o["spec"]["template"]["spec"]["containers"]}


@pytest.mark.parametrize(("doc", "names"), [
    (pool(mode="Aggregated", runtime={"resources": {"requests": {"memory": "64Gi"}}},
          engine={"resources": {"limits": {"memory": "32Gi"}}}),
     ["runtime.resources.requests.memory (64Gi)", "engine.resources.limits.memory (32Gi)"]),
    (pool(runtime={"resources": {"requests": {"memory": "64Gi"}}},
          podTemplate={"spec": {"containers": [
              {"name": "engine", "resources": {"limits": {"memory": "32Gi"}}}]}}),
     ["runtime.resources.requests.memory (64Gi)",
      "podTemplate.spec.containers[0].resources.limits.memory (32Gi)"]),
    (pool(runtime={"resources": {"requests": {"example.com/fpga": 1},
                                 "limits": {"example.com/fpga": 1}}},
          prefill={"podTemplate": {"spec": {"containers": [
              {"name": "engine", "resources": {"limits": {"example.com/fpga": 2}}}]}}}),
     ["runtime.resources.requests.example.com/fpga (1)",
      "prefill.podTemplate.spec.containers[0].resources.limits.example.com/fpga (2)",
      "must equal"]),
], ids=["role-limit", "template-limit", "extended-resource"])
def test_a_request_crossing_another_layers_limit_names_both(doc: dict[str, Any],
                                                            names: list[str]) -> None:
    with pytest.raises(InvalidPool) as exc:
        parse_pool(doc)
    [error] = exc.value.errors
    assert error.startswith("spec: "), error
    for name in names:
        assert name in error, error


def test_the_roles_a_mode_does_not_run_are_not_checked() -> None:
    parse_pool(pool(mode="Aggregated", runtime={"resources": {"requests": {"memory": "64Gi"}}},
                    prefill={"resources": {"limits": {"memory": "32Gi"}}}))


def test_rendered_requests_never_exceed_their_limits() -> None:
    containers = _containers(pool(
        runtime={"resources": {"requests": {"memory": "16Gi", "cpu": "4"}}},
        prefill={"resources": {"limits": {"memory": "32Gi"}}},
        router={"resources": {"requests": {"memory": "4Gi"}}}))
    for name, c in containers.items():
        limits = c["resources"].get("limits", {})
        for key, want in c["resources"].get("requests", {}).items():
            if key in limits:
                low, high = quantity_value(want), quantity_value(limits[key])
                assert low is not None and high is not None and low <= high, (name, key)


def test_the_routers_default_limit_rises_to_a_larger_request() -> None:
    router = _containers(pool(router={"resources": {"requests": {"memory": "4Gi"}}}))["p-router"]
    assert router["resources"] == {"requests": {"cpu": "500m", "memory": "4Gi"},
                                   "limits": {"memory": "4Gi"}}
    # a smaller request keeps the default limit, and the defaults stand without one
    router = _containers(pool(router={"resources": {"requests": {"memory": "1Gi"}}}))["p-router"]
    assert router["resources"]["limits"] == {"memory": "2Gi"}
    router = _containers(pool())["p-router"]
    assert router["resources"] == {"requests": {"cpu": "500m", "memory": "512Mi"},
                                   "limits": {"memory": "2Gi"}}
