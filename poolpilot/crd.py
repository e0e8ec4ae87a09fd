"""Generate the InferencePool CustomResourceDefinition from the pydantic models.

Pydantic emits JSON Schema; Kubernetes wants a *structural* OpenAPI v3 schema: no $ref, no
anyOf for optional fields, no titles, `exclusiveMinimum` as a boolean beside `minimum`, and
free-form maps marked `x-kubernetes-preserve-unknown-fields`. This module does that translation
and adds the CRD's envelope (names, printer columns, status subresource).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue

from poolpilot import api

CRD_PATH = Path("crds/inferencepool.yaml")
CHART_CRD_PATH = Path("charts/poolpilot/files/crds/inferencepool.yaml")  # the chart templates it
CRD_NAME = f"{api.PLURAL}.{api.GROUP}"

_DROP = {"title", "default_factory"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline $refs and rewrite JSON Schema into a structural OpenAPI v3 schema."""
    if isinstance(node, list):
        return [_resolve(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].split("/")[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    if node.get("x-kubernetes-int-or-string"):
        # Kubernetes' own form: anyOf integer/string, no type (quantities, reserved keys).
        return {k: v for k, v in node.items() if k not in _DROP}
    if "anyOf" in node:
        # Optional[X] -> X (absence, not null, means unset in Kubernetes).
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        # A null default is no default (an optional int-or-string keeps its anyOf).
        rest = {k: v for k, v in node.items()
                if k != "anyOf" and not (k == "default" and v is None)}
        if len(options) == 1:
            return _resolve({**options[0], **rest}, defs)
        return {**{k: _resolve(v, defs) for k, v in rest.items()},
                "x-kubernetes-preserve-unknown-fields": True}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or key == "$defs":
            continue
        if key in ("x-kubernetes-validations", "enum", "x-kubernetes-list-map-keys"):
            out[key] = value
        elif key == "properties":
            out[key] = {k: _resolve(v, defs) for k, v in value.items()}
        elif key == "additionalProperties":
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif value is not False:
                out[key] = _resolve(value, defs)
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "default":
            if value is not None:
                out[key] = value
        else:
            out[key] = _resolve(value, defs)
    free_form = "properties" not in out and "additionalProperties" not in out
    if out.get("type") == "object" and free_form:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "type" not in out and "properties" not in out and not out.get(
        "x-kubernetes-preserve-unknown-fields"
    ) and not out.get("x-kubernetes-int-or-string"):
        # A free-form value (engine args): any JSON.
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


class _WithFactoryDefaults(GenerateJsonSchema):
    """Emit defaults for nested objects too, so the API server fills them in like the models.

    The API server only defaults fields of objects that exist; `default: {}` (or the factory's
    non-default fields) on each nested object makes `spec: {model: ...}` default all the way
    down, exactly as pydantic does.
    """

    def default_schema(self, schema: Any) -> JsonSchemaValue:
        factory = schema.get("default_factory")
        if factory is None:
            return super().default_schema(schema)
        inner = self.generate_inner(schema["schema"])
        value = factory()
        if isinstance(value, BaseModel):
            inner["default"] = value.model_dump(by_alias=True, exclude_defaults=True, mode="json")
        elif value not in ({}, []):
            inner["default"] = value
        return inner


def _schema_of(model: type[api.ApiModel]) -> dict[str, Any]:
    raw = model.model_json_schema(
        by_alias=True, mode="validation", schema_generator=_WithFactoryDefaults
    )
    schema: dict[str, Any] = _resolve(raw, raw.get("$defs", {}))
    return schema


def _strip_defaults_from_status(schema: dict[str, Any]) -> dict[str, Any]:
    """Status is written by controllers; defaults there only add noise."""
    if isinstance(schema, dict):
        return {k: _strip_defaults_from_status(v) for k, v in schema.items() if k != "default"}
    return schema


def _printer_columns() -> list[dict[str, Any]]:
    """`kubectl get ipool` columns; priority 1 ones only show with `-o wide`."""
    return [
        {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
        {"name": "Prefill", "type": "string", "jsonPath": ".status.prefill.summary",
         "description": "Prefill replicas ready/desired (Disaggregated)"},
        {"name": "Decode", "type": "string", "jsonPath": ".status.decode.summary",
         "description": "Decode replicas ready/desired (Disaggregated)"},
        {"name": "TTFT", "type": "number", "jsonPath": ".status.metrics.ttftSeconds",
         "description": "TTFT at the SLO quantile (p90 by default), seconds"},
        {"name": "Ready", "type": "string",
         "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Reason", "type": "string",
         "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
         "description": "Why the pool is (not) Ready"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        # Printer columns cannot depend on the mode: the aggregated engine's column would be
        # blank on every disaggregated pool, so it shows with -o wide only.
        {"name": "Engine", "type": "string", "jsonPath": ".status.engine.summary", "priority": 1,
         "description": "Engine replicas ready/desired (Aggregated)"},
        {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint", "priority": 1,
         "description": "OpenAI base URL of the pool"},
        {"name": "Model", "type": "string", "jsonPath": ".spec.model.name", "priority": 1,
         "description": "Model served"},
        {"name": "Connector", "type": "string", "jsonPath": ".spec.kvTransfer.connector",
         "priority": 1, "description": "KV connector (Disaggregated)"},
        {"name": "TTFT-SLO", "type": "number", "jsonPath": ".spec.slo.ttft.seconds",
         "priority": 1, "description": "TTFT target, seconds"},
        {"name": "ITL-SLO", "type": "number", "jsonPath": ".spec.slo.itl.seconds",
         "priority": 1, "description": "Inter-token latency target, seconds"},
    ]


def build_crd() -> dict[str, Any]:
    spec_schema = _schema_of(api.InferencePoolSpec)
    status_schema = _strip_defaults_from_status(_schema_of(api.InferencePoolStatus))
    root = {
        "type": "object",
        "description": api.InferencePool.__doc__,
        "required": ["spec"],
        "x-kubernetes-validations": [api.POOL_NAME_RULE,
                                     *(r.to_crd() for r in api.InferencePool.rules)],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {
                "app.kubernetes.io/name": "poolpilot",
                "app.kubernetes.io/part-of": "poolpilot",
            },
        },
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": api.SHORT_NAMES,
                "categories": api.CATEGORIES,
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


class _NoAliasDumper(yaml.SafeDumper):
    """Shared values (a default used twice) are written out, never as &id001 anchors: some
    tools (and readers) do not follow YAML aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render_crd() -> str:
    header = "# Generated by `poolpilot crd` from poolpilot/api.py. Do not edit by hand.\n"
    return header + yaml.dump(build_crd(), Dumper=_NoAliasDumper, sort_keys=False, width=100)


def drift(path: Path = CRD_PATH) -> str:
    """A unified diff between the committed CRD and the models; empty when in sync."""
    current = path.read_text() if path.exists() else ""
    wanted = render_crd()
    if current == wanted:
        return ""
    return "".join(
        difflib.unified_diff(
            current.splitlines(keepends=True),
            wanted.splitlines(keepends=True),
            fromfile=str(path),
            tofile="generated from poolpilot/api.py",
        )
    )
