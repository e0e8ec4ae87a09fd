"""A minimal OpenAPI v3 discovery (/openapi/v3 and one document per group-version).

kubectl validates manifests before sending them: it asks the OpenAPI v3 document of the
object's group-version whether PATCH accepts the `fieldValidation` query parameter and, if so,
leaves validation to the server (which this emulator does, for CRDs through
poolpilot.emulator.crd_validation). The documents declare exactly that, and no strategic-merge-patch
content type, so kubectl computes its client-side apply patches from its compiled-in types
(built-in kinds) or as JSON merge patches (custom resources), as with a real server.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from poolpilot.emulator.resources import Registry, ResourceType

_PARAMS = [
    {"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
    for n in ("dryRun", "fieldManager", "fieldValidation", "force")
]
_CONTENT = ("application/json-patch+json", "application/merge-patch+json",
            "application/apply-patch+yaml")


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def _object_path(rt: ResourceType) -> str:
    base = "/" + _gv_path(rt.group, rt.version)
    ns = "/namespaces/{namespace}" if rt.namespaced else ""
    return f"{base}{ns}/{rt.plural}/{{name}}"


def gv_document(registry: Registry, group: str, version: str,
                crds: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The group-version's document; CRD schemas go in components (for `kubectl explain`)."""
    types = registry.in_version(group, version)
    if not types:
        return None
    paths: dict[str, Any] = {}
    for rt in sorted(types, key=lambda r: r.plural):
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        paths[_object_path(rt)] = {
            "patch": {
                "operationId": f"patch{rt.kind}",
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": _PARAMS,
                "requestBody": {"content": {c: {"schema": {"type": "object"}} for c in _CONTENT}},
                "responses": {"200": {"description": "OK"}},
            }
        }
    schemas: dict[str, Any] = {}
    for rt in types:
        crd = (crds or {}).get(rt.crd or "")
        if crd is None:
            continue
        for v in crd["spec"]["versions"]:
            if v["name"] == rt.version and "schema" in v:
                schema = dict(v["schema"]["openAPIV3Schema"])
                schema["x-kubernetes-group-version-kind"] = [
                    {"group": rt.group, "version": rt.version, "kind": rt.kind}]
                rev = ".".join(reversed(rt.group.split(".")))
                schemas[f"{rev}.{rt.version}.{rt.kind}"] = schema
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def index(registry: Registry, crds: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for group, versions in registry.groups().items():
        for version in versions:
            doc = gv_document(registry, group, version, crds)
            digest = hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()
            path = _gv_path(group, version)
            out[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest.upper()}"}
    return {"paths": out}
