"""spec.gateway -> the HTTPRoute (Gateway API v1) and, with inferencePool, the GIE InferencePool
(inference.networking.k8s.io/v1) of the pool; and the route's status -> the pool's `Routed`
condition.

Two topologies (docs/operator.md, "Behind a Gateway"):
- router (the default): Gateway -> HTTPRoute -> the pool's router Service -> prefill/decode.
- endpoint picker (inferencePool: true): Gateway -> HTTPRoute -> GIE InferencePool of the
  engine pods; the gateway asks the user's endpoint picker which engine serves each request.

Part of the pure builders (poolpilot.operator.builders): no I/O and no clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from poolpilot.operator.building_blocks import (
    GATEWAY_POOL_LABEL,
    Capabilities,
    Pool,
    _meta,
)

from poolpilot import names
from poolpilot.api.gateway import GATEWAY_GROUP, GatewaySpec
from poolpilot.api.status import CONDITION_REASON
from poolpilot.apitypes import Obj
from poolpilot.roles import Role

HTTPROUTE_API_VERSION = "gateway.networking.k8s.io/v1"
GIE_GROUP = "inference.networking.k8s.io"
GIE_API_VERSION = f"{GIE_GROUP}/v1"
GATEWAY_ROLE = "gateway"  # the role label of the HTTPRoute and the GIE InferencePool

# Where to get the CRDs (the condition's message names them).
GATEWAY_API_INSTALL = ("kubectl apply --server-side -f https://github.com/kubernetes-sigs/"
                       "gateway-api/releases/download/v1.6.1/standard-install.yaml")
GIE_INSTALL = ("kubectl apply -f https://github.com/kubernetes-sigs/"
               "gateway-api-inference-extension/releases/download/v1.0.0/manifests.yaml")

# Reasons of the Routed condition (besides those a gateway writes, which are passed through).
ROUTE_ACCEPTED = "Accepted"
ROUTE_PENDING = "Pending"
GATEWAY_API_MISSING = "GatewayApiMissing"
INFERENCE_POOL_API_MISSING = "InferencePoolApiMissing"
ROUTE_NOT_APPLIED = "RouteNotApplied"


def route_name(pool: str) -> str:
    """The HTTPRoute is named after the pool (`kubectl get httproute llama-8b`)."""
    return pool


def gie_pool_name(pool: str) -> str:
    """The GIE InferencePool: not the pool's own name, so that `inferencepool NAME` never
    means two different objects on a cluster with both CRDs."""
    return f"{pool}-engines"


def engine_selector(pool: Pool) -> dict[str, str]:
    """What the GIE InferencePool selects: the pool's engine pods (never its routers), by a
    label only the operator sets (pod templates may not set poolpilot.dev/ labels) and, in a
    cluster, the pool's uid, so a stray pod labelled by hand is not an endpoint."""
    selector = {names.POOL_LABEL: pool.name, GATEWAY_POOL_LABEL: "true"}
    if pool.uid:
        selector[names.POOL_UID_LABEL] = pool.uid
    return selector


def _backend_ref(pool: Pool, gateway: GatewaySpec) -> Obj:
    if gateway.inference_pool:
        # No port: a GIE InferencePool backend's port is its targetPorts.
        return {"group": GIE_GROUP, "kind": "InferencePool", "name": gie_pool_name(pool.name)}
    return {"group": "", "kind": "Service", "name": names.child_name(pool.name, Role.ROUTER),
            "port": names.ROUTER_PORT}


def build_http_route(pool: Pool) -> Obj:
    gateway = pool.spec.gateway
    assert gateway is not None
    rule: Obj = {"matches": [{"path": {"type": "PathPrefix", "value": gateway.path}}]}
    if gateway.strip_prefix and gateway.path != "/":
        rule["filters"] = [{"type": "URLRewrite", "urlRewrite": {
            "path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"}}}]
    rule["backendRefs"] = [_backend_ref(pool, gateway)]
    if gateway.request_timeout is not None:
        rule["timeouts"] = {"request": gateway.request_timeout}
    spec: Obj = {"parentRefs": [ref.to_wire() for ref in gateway.parent_refs]}
    if gateway.hostnames:
        spec["hostnames"] = list(gateway.hostnames)
    spec["rules"] = [rule]
    return {"apiVersion": HTTPROUTE_API_VERSION, "kind": "HTTPRoute",
            "metadata": _meta(pool, route_name(pool.name), GATEWAY_ROLE), "spec": spec}


def build_gie_pool(pool: Pool) -> Obj:
    gateway = pool.spec.gateway
    assert gateway is not None and gateway.endpoint_picker_ref is not None
    return {
        "apiVersion": GIE_API_VERSION, "kind": "InferencePool",
        "metadata": _meta(pool, gie_pool_name(pool.name), GATEWAY_ROLE),
        "spec": {
            "selector": {"matchLabels": engine_selector(pool)},
            "targetPorts": [{"number": names.ENGINE_PORT}],
            "endpointPickerRef": gateway.endpoint_picker_ref.to_wire(),
        },
    }


def build_gateway_objects(pool: Pool, caps: Capabilities) -> list[Obj]:
    """The GIE InferencePool (before the route that points at it) and the HTTPRoute, as far as
    the cluster serves their APIs: a route to a backend kind the cluster lacks is not made."""
    gateway = pool.spec.gateway
    if gateway is None or not caps.gateway_api:
        return []
    if gateway.inference_pool:
        if not caps.inference_pools:
            return []
        return [build_gie_pool(pool), build_http_route(pool)]
    return [build_http_route(pool)]


def gateway_keys(pool: Pool, caps: Capabilities) -> list[Obj]:
    """Every gateway object the pool could have, as far as the cluster serves it (what the
    reconcile looks up by name, so a removed spec.gateway finds what to delete)."""
    out: list[Obj] = []
    if caps.inference_pools:
        out.append({"apiVersion": GIE_API_VERSION, "kind": "InferencePool",
                    "metadata": {"name": gie_pool_name(pool.name)}})
    if caps.gateway_api:
        out.append({"apiVersion": HTTPROUTE_API_VERSION, "kind": "HTTPRoute",
                    "metadata": {"name": route_name(pool.name)}})
    return out


# ---------------------------------------------------------------------------------------------
# The route's status -> the pool's Routed condition


@dataclass(frozen=True)
class Routed:
    """The pool's Routed condition: whether every Gateway the route names accepted it and
    resolved its backend."""

    ok: bool
    reason: str
    message: str
    # Waiting for a gateway (not a fault): no Warning Event.
    pending: bool = False


def _same_parent(ref: Obj, entry_ref: Obj, namespace: str) -> bool:
    def key(r: Obj) -> tuple[Any, ...]:
        return (r.get("group", GATEWAY_GROUP) or GATEWAY_GROUP, r.get("kind", "Gateway"),
                r.get("namespace") or namespace, r.get("name"), r.get("sectionName") or None,
                r.get("port") or None)
    return key(ref) == key(entry_ref)


def _parent_label(ref: Obj, namespace: str) -> str:
    where = f"{ref.get('namespace') or namespace}/{ref['name']}"
    if ref.get("sectionName"):
        where += f" (listener {ref['sectionName']})"
    return where


def _reason(cond: Obj, fallback: str) -> str:
    """The gateway's reason when it is one a condition may carry, else ours."""
    reason = str(cond.get("reason") or "")
    return reason if re.match(CONDITION_REASON, reason) and len(reason) <= 1024 else fallback


def _conditions(entry: Obj) -> dict[str, Obj]:
    return {c.get("type"): c for c in entry.get("conditions") or []}


def route_condition(pool: Pool, route: Obj | None, caps: Capabilities) -> Routed:
    """Routed from what the cluster serves and the HTTPRoute's status.parents, which each
    Gateway's controller writes: Accepted (the listener took the route) and ResolvedRefs (the
    backend exists and is a kind it supports)."""
    gateway = pool.spec.gateway
    assert gateway is not None
    name = route_name(pool.name)
    if not caps.gateway_api:
        return Routed(False, GATEWAY_API_MISSING,
                      "the cluster does not serve the Gateway API (gateway.networking.k8s.io): "
                      f"no HTTPRoute was made; install its CRDs ({GATEWAY_API_INSTALL}) and a "
                      "Gateway controller, and the pool is routed within a drift interval")
    if gateway.inference_pool and not caps.inference_pools:
        return Routed(False, INFERENCE_POOL_API_MISSING,
                      "gateway.inferencePool is set but the cluster does not serve the Gateway "
                      f"API Inference Extension ({GIE_GROUP}): neither the GIE InferencePool nor "
                      f"the HTTPRoute was made; install its CRDs ({GIE_INSTALL}) or set "
                      "inferencePool: false to route to the pool's router")
    if route is None:
        return Routed(False, ROUTE_NOT_APPLIED, f"HTTPRoute {name} was not applied")
    generation = (route.get("metadata") or {}).get("generation")
    entries = ((route.get("status") or {}).get("parents")) or []
    accepted: list[str] = []
    for ref in build_http_route(pool)["spec"]["parentRefs"]:
        where = _parent_label(ref, pool.namespace)
        entry = next((e for e in entries
                      if _same_parent(ref, e.get("parentRef") or {}, pool.namespace)), None)
        conds = _conditions(entry or {})
        acc, res = conds.get("Accepted"), conds.get("ResolvedRefs")
        stale = any(c is not None and generation is not None
                    and c.get("observedGeneration") not in (None, generation)
                    for c in (acc, res))
        if acc is None or stale:
            return Routed(False, ROUTE_PENDING,
                          f"Gateway {where} has not reported on HTTPRoute {name} "
                          f"{'generation ' + str(generation) + ' ' if stale else ''}yet: check "
                          "that the Gateway exists and its controller runs", pending=True)
        if acc.get("status") != "True":
            return Routed(False, _reason(acc, "NotAccepted"),
                          f"Gateway {where} did not accept HTTPRoute {name}: "
                          f"{acc.get('message') or acc.get('reason')}")
        if res is not None and res.get("status") != "True":
            return Routed(False, _reason(res, "RefsNotResolved"),
                          f"Gateway {where} cannot resolve the backend of HTTPRoute {name}: "
                          f"{res.get('message') or res.get('reason')}")
        accepted.append(where)
    return Routed(True, ROUTE_ACCEPTED,
                  f"HTTPRoute {name} is accepted by {', '.join(accepted)}")


# ---------------------------------------------------------------------------------------------
# The kind-name clash

KIND_CLASH_WARNING = (
    "two kinds are named InferencePool: poolpilot's (poolpilot.dev) and the Gateway API "
    f"Inference Extension's ({GIE_GROUP}); on a cluster that serves both, `kubectl get "
    "inferencepool` shows only one of them, so name ours `inferencepools.poolpilot.dev` (or "
    "`ipool`) and GIE's `inferencepools.inference.networking.k8s.io` (or `infpool`)")
