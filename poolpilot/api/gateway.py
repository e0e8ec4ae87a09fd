"""spec.gateway: reach the pool through a Gateway (Gateway API HTTPRoute) and, optionally, a
Gateway API Inference Extension (GIE) InferencePool.

Field names, defaults and checks follow the upstream v1 APIs, so what this model accepts is what
the API server accepts in the HTTPRoute (gateway.networking.k8s.io/v1, Gateway API v1.6) and
the GIE InferencePool (inference.networking.k8s.io/v1, GIE v1.0) the operator makes from it.

Part of the InferencePool API (poolpilot.api); no I/O.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from poolpilot.apitypes import DNS1123_LABEL, DNS1123_SUBDOMAIN, ApiModel, Int32, Matching, Rule

GATEWAY_GROUP = "gateway.networking.k8s.io"

# Gateway API's own patterns (its CRD's `pattern`s), so the HTTPRoute we apply is never refused.
_GROUP = r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_KIND = r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"
_HOSTNAME = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# An absolute path of URL characters (Gateway API's PathPrefix check, with the leading '/').
_PATH = r"^/(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})*$"
_DURATION = r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"
# What Gateway API refuses inside a PathPrefix (dot segments, encoded slashes, fragments).
_PATH_FORBIDDEN = ("//", "/./", "/../", "%2f", "%2F", "#")
_PATH_FORBIDDEN_ENDS = ("/..", "/.")

Group = Annotated[str, Matching(
    _GROUP, "must be an API group: empty (the core group) or a DNS subdomain such as "
    "gateway.networking.k8s.io", max_length=253)]
Kind = Annotated[str, Matching(
    _KIND, "must be a kind: a letter, then letters, digits or '-' (e.g. Gateway)",
    max_length=63)]
RefName = Annotated[str, Field(min_length=1, max_length=253)]
RefNamespace = Annotated[str, Matching(
    DNS1123_LABEL, "must be a namespace name: lowercase letters, digits and '-', starting and "
    "ending with a letter or digit", max_length=63)]
SectionName = Annotated[str, Matching(
    DNS1123_SUBDOMAIN, "must be a listener name: lowercase letters, digits, '-' and '.', "
    "starting and ending with a letter or digit (e.g. https)", max_length=253)]
Hostname = Annotated[str, Matching(
    _HOSTNAME, "must be a DNS name, optionally with a leading '*.' wildcard, lowercase and "
    "without a port or IP address (e.g. llama.example.com or *.example.com)", max_length=253)]
PathPrefix = Annotated[str, Matching(
    _PATH, "must be an absolute path of URL characters, starting with '/' (e.g. /llama)",
    max_length=1024)]
Duration = Annotated[str, Matching(
    _DURATION, "must be a Gateway API duration such as 300s, 10m or 1h30m (0s: no timeout)")]
PortNumber = Annotated[Int32, Field(ge=1, le=65535)]


class ParentReference(ApiModel):
    """A Gateway (or a listener of one) the route attaches to: Gateway API's ParentReference."""

    group: Group = Field(
        default=GATEWAY_GROUP, description="API group of the parent (gateway.networking.k8s.io).")
    kind: Kind = Field(default="Gateway", description="Kind of the parent (Gateway).")
    namespace: RefNamespace | None = Field(
        default=None, description="Namespace of the Gateway; unset: the pool's namespace. The "
        "Gateway's listener must allow routes from the pool's namespace (allowedRoutes).")
    name: RefName = Field(description="Name of the Gateway.")
    section_name: SectionName | None = Field(
        default=None, description="Name of the listener to attach to; unset: every listener "
        "that allows the route.")
    port: PortNumber | None = Field(
        default=None, description="Attach only to the Gateway's listeners on this port.")


class EndpointPickerPort(ApiModel):
    """The endpoint picker's port."""

    number: PortNumber = Field(description="Port of the picker's gRPC (ext-proc) service, "
                               "usually 9002.")


class EndpointPickerRef(ApiModel):
    """The endpoint picker (EPP) the gateway asks, per request, which engine should serve it:
    GIE v1's endpointPickerRef, copied into the GIE InferencePool as is."""

    rules = (
        Rule(
            field="port",
            cel="self.kind != 'Service' || has(self.port)",
            message="is required when kind is Service (GIE v1 requires it); set port.number "
            "to the port your picker's Service serves gRPC on (usually 9002)",
            check=lambda s: s.kind != "Service" or s.port is not None,
        ),
    )

    group: Group = Field(default="", description="API group of the picker; \"\": core (Service).")
    kind: Kind = Field(default="Service", description="Kind of the picker (Service).")
    name: RefName = Field(description="Name of the picker's Service, in the pool's namespace.")
    port: EndpointPickerPort | None = Field(
        default=None, description="The picker's port; required for a Service.")
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailClose",
        description="When the picker does not answer: FailClose drops the request, FailOpen "
        "lets the gateway pick an engine itself (bypassing prefill/decode pairing).",
    )


def _parent(p: ParentReference) -> tuple[str, str, str | None, str]:
    return (p.group, p.kind, p.namespace, p.name)


def _parents_distinct(refs: list[ParentReference]) -> bool:
    keys = [(*_parent(p), p.section_name, p.port) for p in refs]
    return len(set(keys)) == len(keys)


def _parents_alike(refs: list[ParentReference]) -> bool:
    return all((a.section_name is None) == (b.section_name is None)
               and (a.port is None) == (b.port is None)
               for a in refs for b in refs if _parent(a) == _parent(b))


def _same_cel(a: str, b: str, fields: tuple[str, ...]) -> str:
    """CEL: refs a and b agree on `fields` (an unset field agrees with an unset one only)."""
    return " && ".join(
        f"({a}.{f} == {b}.{f})" if f in ("group", "kind", "name") else
        f"(has({a}.{f}) ? (has({b}.{f}) && {a}.{f} == {b}.{f}) : !has({b}.{f}))"
        for f in fields)


_PARENT = ("group", "kind", "namespace", "name")


def _path_clean(path: str) -> bool:
    return not any(bad in path for bad in _PATH_FORBIDDEN) \
        and not path.endswith(_PATH_FORBIDDEN_ENDS)


class GatewaySpec(ApiModel):
    """Reach the pool through a Gateway: the operator makes an HTTPRoute (Gateway API v1) from
    the Gateway's listeners to the pool's router, or, with inferencePool, to a GIE
    InferencePool of the engines and the endpoint picker you run."""

    rules = (
        # Gateway API's HTTPRoute CEL for parentRefs.
        Rule(
            field="parentRefs",
            cel="self.parentRefs.all(a, self.parentRefs.exists_one(b, "
                + _same_cel("a", "b", (*_PARENT, "sectionName", "port")) + "))",
            message="must not name one parent twice with the same sectionName and port "
            "(Gateway API refuses the HTTPRoute); remove the duplicate",
            check=lambda s: _parents_distinct(s.parent_refs),
        ),
        Rule(
            field="parentRefs",
            cel="self.parentRefs.all(a, self.parentRefs.all(b, !(" + _same_cel("a", "b", _PARENT)
                + ") || (has(a.sectionName) == has(b.sectionName) && "
                "has(a.port) == has(b.port))))",
            message="references to one parent (group, kind, namespace, name) must all set "
            "sectionName, or none, and likewise port (Gateway API refuses the HTTPRoute); tell "
            "them apart by sectionName or port",
            check=lambda s: _parents_alike(s.parent_refs),
        ),
        Rule(
            field="path",
            cel="!(" + " || ".join(f"self.path.contains('{b}')" for b in _PATH_FORBIDDEN)
            + " || " + " || ".join(f"self.path.endsWith('{e}')" for e in _PATH_FORBIDDEN_ENDS)
            + ")",
            message="must not contain '//', '/./', '/../', '%2f', '%2F' or '#', nor end with "
            "'/.' or '/..' (Gateway API refuses such a PathPrefix); write the plain path, "
            "e.g. /llama",
            check=lambda s: _path_clean(s.path),
        ),
        Rule(
            field="endpointPickerRef",
            cel="!self.inferencePool || has(self.endpointPickerRef)",
            message="is required with inferencePool: true (a GIE v1 InferencePool names the "
            "endpoint picker the gateway asks for an engine on each request); set it to your "
            "picker's Service (name, and port.number, usually 9002), or set "
            "inferencePool: false to route to the pool's router",
            check=lambda s: not s.inference_pool or s.endpoint_picker_ref is not None,
        ),
        Rule(
            field="endpointPickerRef",
            cel="self.inferencePool || !has(self.endpointPickerRef)",
            message="only applies with inferencePool: true (without it the route goes to the "
            "pool's router, which picks the engines); set inferencePool: true or remove it",
            check=lambda s: s.inference_pool or s.endpoint_picker_ref is None,
        ),
    )

    parent_refs: list[ParentReference] = Field(
        min_length=1, max_length=32,
        description="Gateways (or their listeners) the HTTPRoute attaches to, as in an "
        "HTTPRoute's parentRefs, e.g. [{name: inference-gateway, namespace: gateway-system}].",
    )
    hostnames: list[Hostname] = Field(
        default_factory=list, max_length=16,
        description="Host names the route answers, e.g. [llama.example.com]; empty: every "
        "host name the listener accepts.",
    )
    path: PathPrefix = Field(
        default="/",
        description="Path prefix the route matches (PathPrefix), e.g. /llama. Requests keep "
        "their path unless stripPrefix is set.",
    )
    strip_prefix: bool = Field(
        default=False,
        description="Remove the path prefix before the request reaches the backend (a "
        "URLRewrite filter, ReplacePrefixMatch /): /llama/v1/chat/completions reaches the "
        "router as /v1/chat/completions.",
    )
    request_timeout: Duration | None = Field(
        default=None,
        description="The route's request timeout (HTTPRoute timeouts.request), e.g. 600s; "
        "0s: none. Unset: the gateway's default, which may cut long generations (Envoy's "
        "default route timeout is 15s).",
    )
    inference_pool: bool = Field(
        default=False,
        description="Also make a GIE InferencePool (inference.networking.k8s.io/v1) of the "
        "pool's engine pods and route to it through endpointPickerRef, instead of to the "
        "router. See docs/operator.md (Behind a Gateway) for what each topology gives up.",
    )
    endpoint_picker_ref: EndpointPickerRef | None = Field(
        default=None,
        description="With inferencePool: the endpoint picker you run (e.g. llm-d's inference "
        "scheduler, with prefill/decode filters on the poolpilot.dev/role label).",
    )
