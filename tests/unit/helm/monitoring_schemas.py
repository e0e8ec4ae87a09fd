"""Structural schemas for the monitoring.coreos.com/v1 objects the chart renders.

kubernetes-validate knows only built-in kinds. These schemas follow the Prometheus Operator's
CRDs (v0.7x) for the fields the chart uses, and reject unknown fields at every level so a
misspelt key (e.g. `honorLabel`) fails here instead of being dropped by the API server.
"""

from __future__ import annotations

from typing import Any

_STR = {"type": "string"}
_STR_LIST = {"type": "array", "items": _STR}
_LABELS = {"type": "object", "additionalProperties": _STR}
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
             r"(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}

_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": _STR, "namespace": _STR, "labels": _LABELS, "annotations": _LABELS},
    "additionalProperties": False,
}
_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": _LABELS,
        "matchExpressions": {"type": "array", "items": {
            "type": "object", "required": ["key", "operator"], "additionalProperties": False,
            "properties": {"key": _STR, "operator": {"enum": ["In", "NotIn", "Exists",
                                                                "DoesNotExist"]},
                           "values": _STR_LIST}}},
    },
}
_NAMESPACE_SELECTOR = {
    "type": "object", "additionalProperties": False,
    "properties": {"any": {"type": "boolean"}, "matchNames": _STR_LIST},
}
_RELABEL = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": {"type": "string",
                                                    "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
        "separator": _STR, "targetLabel": _STR, "regex": _STR, "modulus": {"type": "integer"},
        "replacement": _STR,
        "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod",
                            "HashMod", "labelmap", "LabelMap", "labeldrop", "LabelDrop",
                            "labelkeep", "LabelKeep", "lowercase", "uppercase", "keepequal",
                            "dropequal"]},
    },
}
_ENDPOINT_PROPS: dict[str, Any] = {
    "port": _STR, "path": _STR, "interval": _DURATION, "scrapeTimeout": _DURATION,
    "honorLabels": {"type": "boolean"}, "scheme": {"enum": ["http", "https"]},
    "relabelings": {"type": "array", "items": _RELABEL},
    "metricRelabelings": {"type": "array", "items": _RELABEL},
}


def _object(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": spec,
        },
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": _object("ServiceMonitor", {
        "type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
        "properties": {
            "selector": _SELECTOR, "namespaceSelector": _NAMESPACE_SELECTOR, "jobLabel": _STR,
            "endpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False,
                "properties": {**_ENDPOINT_PROPS, "targetPort": {}}}},
        },
    }),
    "PodMonitor": _object("PodMonitor", {
        "type": "object", "required": ["selector", "podMetricsEndpoints"],
        "additionalProperties": False,
        "properties": {
            "selector": _SELECTOR, "namespaceSelector": _NAMESPACE_SELECTOR, "jobLabel": _STR,
            "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False,
                "properties": {**_ENDPOINT_PROPS, "portNumber": {"type": "integer"}}}},
        },
    }),
    "PrometheusRule": _object("PrometheusRule", {
        "type": "object", "required": ["groups"], "additionalProperties": False,
        "properties": {"groups": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["name", "rules"], "additionalProperties": False,
            "properties": {
                "name": _STR, "interval": _DURATION,
                "rules": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["expr"], "additionalProperties": False,
                    "properties": {
                        "record": _STR, "alert": _STR, "expr": _STR, "for": _DURATION,
                        "labels": _LABELS, "annotations": _LABELS,
                    },
                    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
                }},
            },
        }}},
    }),
}
