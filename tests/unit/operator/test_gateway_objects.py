"""spec.gateway: the HTTPRoute and the GIE InferencePool the operator makes, validated against
the upstream v1 schemas (tests/fixtures/upstream/gateway/), the spec's own checks (models and
CRD agree), and the Routed condition read from the route's status."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from poolpilot.emulator import crd_validation
from poolpilot.operator import builders, gateway_objects, render, status
from poolpilot.operator.building_blocks import GATEWAY_POOL_LABEL
from poolpilot.operator.gateway_objects import Routed

from poolpilot import cli, crd, names
from poolpilot.validate import InvalidPool, parse_pool, parse_spec

ROOT = Path(__file__).resolve().parents[3]
UPSTREAM = ROOT / "tests" / "fixtures" / "upstream" / "gateway"
HTTPROUTE_CRD = yaml.safe_load((UPSTREAM / "httproutes.gateway.networking.k8s.io.yaml")
                               .read_text())
GIE_CRD = yaml.safe_load((UPSTREAM / "inferencepools.inference.networking.k8s.io.yaml")
                         .read_text())
EXAMPLES = sorted((ROOT / "examples" / "gateway").glob("*.yaml"))
POOL_CRD = crd.build_crd()
UID = "0c5a4c8e-8f7e-4d55-9a43-5d1f0e7c2b11"
PICKER = {"name": "llama-epp", "port": {"number": 9002}}


def spec(**gateway: Any) -> dict[str, Any]:
    return {"model": {"name": "org/model"},
            "gateway": {"parentRefs": [{"name": "gw", "namespace": "gateway-system"}],
                        **gateway}}


def pool(uid: str | None = UID, mode: str = "Disaggregated", **gateway: Any) -> builders.Pool:
    return builders.Pool("llama", "serving", parse_spec({**spec(**gateway), "mode": mode}), uid)


def by_kind(objs: list[dict[str, Any]], api_version: str, kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["apiVersion"] == api_version and o["kind"] == kind]


def _prune(value: Any) -> Any:
    """Empty maps and lists dropped: for Kubernetes, empty and unset mean the same."""
    if isinstance(value, dict):
        pruned = {k: _prune(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in ({}, [])}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def upstream_errors(obj: dict[str, Any]) -> list[str]:
    target = HTTPROUTE_CRD if obj["kind"] == "HTTPRoute" else GIE_CRD
    return crd_validation.validate(target, obj)[1]


# --- what is rendered ------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_is_valid_and_renders_objects_upstream_accepts(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    parsed = parse_pool(doc)
    defaulted, errors = crd_validation.validate(POOL_CRD, doc)
    assert errors == []
    # The API server's defaulting fills spec.gateway as the models do (parentRefs' group and
    # kind, path, failureMode, ...).
    assert _prune(defaulted["spec"]["gateway"]) == _prune(parsed.spec.to_wire()["gateway"])
    p = builders.Pool(parsed.metadata.name, parsed.metadata.namespace or "default",
                      parsed.spec, UID)
    objs = builders.build_children(p)
    gateway = [o for o in objs if o["kind"] == "HTTPRoute"
               or o["apiVersion"] == gateway_objects.GIE_API_VERSION]
    assert gateway, "the example has spec.gateway: it renders an HTTPRoute"
    for obj in gateway:
        assert upstream_errors(obj) == [], obj["kind"]


def test_examples_show_both_topologies() -> None:
    pools = [parse_pool(yaml.safe_load(p.read_text())).spec.gateway for p in EXAMPLES]
    assert {g.inference_pool for g in pools if g is not None} == {False, True}


def test_router_topology_routes_to_the_router_service() -> None:
    objs = builders.build_children(pool(hostnames=["llama.example.com"], path="/llama",
                                        stripPrefix=True, requestTimeout="600s"))
    [route] = by_kind(objs, gateway_objects.HTTPROUTE_API_VERSION, "HTTPRoute")
    assert by_kind(objs, gateway_objects.GIE_API_VERSION, "InferencePool") == []
    assert route["metadata"]["name"] == "llama"
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io",
                                            "kind": "Gateway", "namespace": "gateway-system",
                                            "name": "gw"}]
    assert route["spec"]["hostnames"] == ["llama.example.com"]
    [rule] = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/llama"}}]
    assert rule["filters"][0]["urlRewrite"]["path"] == {"type": "ReplacePrefixMatch",
                                                        "replacePrefixMatch": "/"}
    assert rule["backendRefs"] == [{"group": "", "kind": "Service", "name": "llama-router",
                                    "port": names.ROUTER_PORT}]
    assert rule["timeouts"] == {"request": "600s"}
    assert upstream_errors(route) == []
    # The router's Service that the route names is one the pool has.
    services = {o["metadata"]["name"] for o in objs if o["kind"] == "Service"}
    assert "llama-router" in services
    # No engine pod carries the GIE label without inferencePool.
    for dep in (o for o in objs if o["kind"] == "Deployment"):
        assert GATEWAY_POOL_LABEL not in dep["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("mode,engines", [("Disaggregated", {"prefill", "decode"}),
                                          ("Aggregated", {"engine"})])
def test_gie_pool_selects_the_engine_pods_only(mode: str, engines: set[str]) -> None:
    objs = builders.build_children(pool(mode=mode, inferencePool=True,
                                        endpointPickerRef=PICKER))
    [gie] = by_kind(objs, gateway_objects.GIE_API_VERSION, "InferencePool")
    [route] = by_kind(objs, gateway_objects.HTTPROUTE_API_VERSION, "HTTPRoute")
    assert upstream_errors(gie) == [] and upstream_errors(route) == []
    assert gie["metadata"]["name"] == "llama-engines"
    assert route["spec"]["rules"][0]["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool",
         "name": "llama-engines"}]
    selector = gie["spec"]["selector"]["matchLabels"]
    assert selector[names.POOL_UID_LABEL] == UID  # a stray pod labelled by hand is no endpoint
    selected = set()
    for dep in (o for o in objs if o["kind"] == "Deployment"):
        labels = dep["spec"]["template"]["metadata"]["labels"]
        if selector.items() <= labels.items():
            selected.add(labels[names.ROLE_LABEL])
    assert selected == engines  # never the routers
    assert gie["spec"]["targetPorts"] == [{"number": names.ENGINE_PORT}]
    assert gie["spec"]["endpointPickerRef"] == {"group": "", "kind": "Service",
                                                "name": "llama-epp", "port": {"number": 9002},
                                                "failureMode": "FailClose"}
    # The backend exists before the route that sends to it.
    assert objs.index(gie) < objs.index(route)
    for obj in (gie, route):
        [owner] = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("InferencePool", UID, True)
        assert owner["apiVersion"] == "poolpilot.dev/v1alpha1"


def test_pod_templates_cannot_join_the_gie_pool() -> None:
    """The selector's label is one only the operator sets."""
    doc = spec(inferencePool=True, endpointPickerRef=PICKER)
    doc["podTemplate"] = {"metadata": {"labels": {GATEWAY_POOL_LABEL: "true"}}}
    with pytest.raises(InvalidPool, match=r"poolpilot\.dev"):
        parse_spec(doc)


@pytest.mark.parametrize("caps,kinds", [
    (builders.Capabilities(gateway_api=False), []),
    (builders.Capabilities(inference_pools=False), []),
    (builders.Capabilities(), ["InferencePool", "HTTPRoute"]),
], ids=["no-gateway-api", "no-gie", "both"])
def test_objects_of_apis_the_cluster_lacks_are_not_made(
        caps: builders.Capabilities, kinds: list[str]) -> None:
    objs = builders.build_children(pool(inferencePool=True, endpointPickerRef=PICKER), caps)
    gateway = [o["kind"] for o in objs if o["metadata"]["labels"][names.ROLE_LABEL]
               == gateway_objects.GATEWAY_ROLE]
    assert gateway == kinds


def test_a_pool_without_gateway_renders_no_route() -> None:
    p = builders.Pool("llama", "serving", parse_spec({"model": {"name": "m"}}), UID)
    assert not [o for o in builders.build_children(p) if o["kind"] == "HTTPRoute"]
    # ...but the reconcile still looks for them by name, to delete them when spec.gateway goes.
    keys = {(o["apiVersion"], o["kind"], o["metadata"]["name"])
            for o in gateway_objects.gateway_keys(p, builders.Capabilities())}
    assert keys == {("gateway.networking.k8s.io/v1", "HTTPRoute", "llama"),
                    ("inference.networking.k8s.io/v1", "InferencePool", "llama-engines")}


def test_render_warns_of_the_kind_clash_on_stderr(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(["render", str(ROOT / "examples/gateway/llama-8b-endpoint-picker.yaml")])
    assert code == 0
    assert "inferencepools.poolpilot.dev" in err.getvalue()
    docs = list(yaml.safe_load_all(out.getvalue()))  # stdout stays a manifest
    assert {d["kind"] for d in docs} >= {"HTTPRoute", "InferencePool"}
    assert render.to_yaml(docs)


# --- bad specs: the models and the CRD refuse them, naming the field ------------------------


@dataclass(frozen=True)
class Bad:
    id: str
    gateway: dict[str, Any]
    field: str
    says: str
    drop_parent_refs: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


BAD = [
    Bad("no-parent-refs", {"parentRefs": []}, "spec.gateway.parentRefs", "at least 1"),
    Bad("parent-refs-missing", {}, "spec.gateway.parentRefs", "required",
        drop_parent_refs=True),
    Bad("parent-without-name", {"parentRefs": [{"namespace": "gw"}]},
        "spec.gateway.parentRefs[0].name", "required"),
    Bad("parent-port-0", {"parentRefs": [{"name": "gw", "port": 0}]},
        "spec.gateway.parentRefs[0].port", "1"),
    Bad("parent-namespace", {"parentRefs": [{"name": "gw", "namespace": "Gateway_NS"}]},
        "spec.gateway.parentRefs[0].namespace", "namespace name"),
    Bad("section-name", {"parentRefs": [{"name": "gw", "sectionName": "HTTPS!"}]},
        "spec.gateway.parentRefs[0].sectionName", "listener name"),
    Bad("hostname-upper", {"hostnames": ["Llama.example.com"]}, "spec.gateway.hostnames[0]",
        "DNS name"),
    Bad("hostname-port", {"hostnames": ["llama.example.com:443"]}, "spec.gateway.hostnames[0]",
        "without a port"),
    Bad("path-relative", {"path": "llama"}, "spec.gateway.path", "starting with '/'"),
    Bad("path-double-slash", {"path": "/a//b"}, "spec.gateway.path", "'//'"),
    Bad("path-dot-end", {"path": "/a/.."}, "spec.gateway.path", "'/..'"),
    Bad("path-encoded-slash", {"path": "/a%2Fb"}, "spec.gateway.path", "'%2F'"),
    Bad("timeout", {"requestTimeout": "10"}, "spec.gateway.requestTimeout", "duration"),
    Bad("pool-without-picker", {"inferencePool": True}, "spec.gateway.endpointPickerRef",
        "required with inferencePool: true"),
    Bad("picker-without-pool", {"endpointPickerRef": PICKER}, "spec.gateway.endpointPickerRef",
        "only applies with inferencePool: true"),
    Bad("picker-service-without-port", {"inferencePool": True,
                                        "endpointPickerRef": {"name": "epp"}},
        "spec.gateway.endpointPickerRef.port", "required when kind is Service"),
    Bad("failure-mode", {"inferencePool": True,
                         "endpointPickerRef": {**PICKER, "failureMode": "Open"}},
        "spec.gateway.endpointPickerRef.failureMode", "FailOpen"),
]


@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_bad_gateway_specs_are_refused_by_models_and_crd(case: Bad) -> None:
    body = spec(**case.gateway)
    if case.drop_parent_refs:
        del body["gateway"]["parentRefs"]
    doc = {"apiVersion": "poolpilot.dev/v1alpha1", "kind": "InferencePool",
           "metadata": {"name": "p", "namespace": "ns"}, "spec": body}
    with pytest.raises(InvalidPool) as refused:
        parse_pool(doc)
    model_errors = [e for e in refused.value.errors if e.startswith(case.field)]
    assert model_errors, refused.value.errors
    assert any(case.says in e for e in model_errors), model_errors
    _, crd_errors = crd_validation.validate(POOL_CRD, doc)
    assert any(e.startswith(case.field) for e in crd_errors), crd_errors


# --- the Routed condition --------------------------------------------------------------------


def cond(ctype: str, ok: bool, reason: str, message: str = "", generation: int = 1
         ) -> dict[str, Any]:
    return {"type": ctype, "status": "True" if ok else "False", "reason": reason,
            "message": message, "observedGeneration": generation,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}


def route_with(*parents: tuple[dict[str, Any], list[dict[str, Any]]],
               generation: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": "llama", "generation": generation},
            "status": {"parents": [{"parentRef": ref, "controllerName": "example.com/gw",
                                    "conditions": conds} for ref, conds in parents]}}


GW = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "gateway-system",
      "name": "gw"}
OTHER = {"name": "other"}  # in the pool's namespace, group and kind defaulted


@dataclass(frozen=True)
class RouteCase:
    id: str
    route: dict[str, Any] | None
    ok: bool
    reason: str
    says: str
    caps: builders.Capabilities = field(default_factory=builders.Capabilities)
    inference_pool: bool = False
    parents: tuple[dict[str, Any], ...] = ({"name": "gw", "namespace": "gateway-system"},)


ROUTE_CASES = [
    RouteCase("accepted", route_with((GW, [cond("Accepted", True, "Accepted"),
                                           cond("ResolvedRefs", True, "ResolvedRefs")])),
              True, "Accepted", "accepted by gateway-system/gw"),
    RouteCase("no-status-yet", route_with(), False, "Pending", "has not reported"),
    RouteCase("not-accepted", route_with((GW, [
        cond("Accepted", False, "NotAllowedByListeners", "no listener allows namespace serving"),
        cond("ResolvedRefs", True, "ResolvedRefs")])),
        False, "NotAllowedByListeners", "no listener allows namespace serving"),
    RouteCase("backend-kind-unsupported", route_with((GW, [
        cond("Accepted", True, "Accepted"),
        cond("ResolvedRefs", False, "InvalidKind", "InferencePool is not a supported kind")])),
        False, "InvalidKind", "cannot resolve the backend"),
    RouteCase("status-of-an-older-route", route_with((GW, [
        cond("Accepted", True, "Accepted", generation=1),
        cond("ResolvedRefs", True, "ResolvedRefs", generation=1)]), generation=2),
        False, "Pending", "generation 2"),
    RouteCase("one-of-two-gateways-silent", route_with((GW, [
        cond("Accepted", True, "Accepted"), cond("ResolvedRefs", True, "ResolvedRefs")])),
        False, "Pending", "serving/other", parents=({"name": "gw",
                                                     "namespace": "gateway-system"}, OTHER)),
    RouteCase("both-gateways", route_with(
        (GW, [cond("Accepted", True, "Accepted"), cond("ResolvedRefs", True, "ResolvedRefs")]),
        ({"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "other"},
         [cond("Accepted", True, "Accepted"), cond("ResolvedRefs", True, "ResolvedRefs")])),
        True, "Accepted", "gateway-system/gw, serving/other",
        parents=({"name": "gw", "namespace": "gateway-system"}, OTHER)),
    RouteCase("gateway-reason-not-a-reason", route_with((GW, [
        cond("Accepted", False, "not valid!", "bad")])), False, "NotAccepted", "bad"),
    RouteCase("no-gateway-api", None, False, "GatewayApiMissing", "standard-install.yaml",
              caps=builders.Capabilities(gateway_api=False)),
    RouteCase("no-gie", None, False, "InferencePoolApiMissing", "manifests.yaml",
              caps=builders.Capabilities(inference_pools=False), inference_pool=True),
    RouteCase("route-not-applied", None, False, "RouteNotApplied", "not applied"),
]


@pytest.mark.parametrize("case", ROUTE_CASES, ids=[c.id for c in ROUTE_CASES])
def test_routed_condition_from_route_status(case: RouteCase) -> None:
    extra: dict[str, Any] = {"parentRefs": list(case.parents)}
    if case.inference_pool:
        extra |= {"inferencePool": True, "endpointPickerRef": PICKER}
    routed = gateway_objects.route_condition(pool(**extra), case.route, case.caps)
    assert (routed.ok, routed.reason) == (case.ok, case.reason)
    assert case.says in routed.message


def _status(routed: Routed | None, previous: dict[str, Any] | None = None,
            unrouted: bool = False) -> status.StatusResult:
    return status.compute_status(generation=1, roles=[], pods=[], previous=previous,
                                 endpoint="http://x", now="2026-01-01T00:00:00Z",
                                 routed=routed, unrouted=unrouted)


def test_routed_condition_and_its_events() -> None:
    pending = _status(Routed(False, "Pending", "waiting", pending=True))
    [c] = [c for c in pending.status["conditions"] if c["type"] == "Routed"]
    assert (c["status"], c["reason"]) == ("False", "Pending")
    assert [e.type for e in pending.events if "Routed" in e.message] == ["Normal"]
    refused = _status(Routed(False, "NotAllowedByListeners", "no"), previous=pending.status)
    assert [(e.type, e.reason) for e in refused.events if "Routed" in e.message] == [
        ("Warning", "NotAllowedByListeners")]
    accepted = _status(Routed(True, "Accepted", "ok"), previous=refused.status)
    assert [(e.type, e.reason) for e in accepted.events if "Routed" in e.message] == [
        ("Normal", "Accepted")]
    again = _status(Routed(True, "Accepted", "ok"), previous=accepted.status)
    assert [e for e in again.events if "Routed" in e.message] == []  # no transition, no Event
    # The condition validates against the pool's CRD status schema.
    doc = {"apiVersion": "poolpilot.dev/v1alpha1", "kind": "InferencePool",
           "metadata": {"name": "p"}, "spec": {"model": {"name": "m"}},
           "status": accepted.status}
    assert crd_validation.validate(POOL_CRD, doc)[1] == []
    # spec.gateway removed: the condition goes.
    gone = _status(None, previous=accepted.status, unrouted=True)
    assert "Routed" not in {c["type"] for c in gone.status["conditions"]}
