"""The part of KEDA's ScaledObject (keda.sh/v1alpha1) that poolpilot's examples use, as a JSON
schema: it follows KEDA 2.x's CRD (config/crd/bases/keda.sh_scaledobjects.yaml in
github.com/kedacore/keda) for scaleTargetRef, the replica bounds, the intervals and triggers,
and refuses unknown fields so that a misspelt key fails here instead of being pruned."""

from __future__ import annotations

from typing import Any

_STR = {"type": "string"}
_INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}

SCALED_OBJECT: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {
            "type": "object", "required": ["name"], "additionalProperties": False,
            "properties": {"name": _STR, "namespace": _STR,
                           "labels": {"type": "object", "additionalProperties": _STR},
                           "annotations": {"type": "object", "additionalProperties": _STR}},
        },
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object", "required": ["name"], "additionalProperties": False,
                    "properties": {"apiVersion": _STR, "kind": _STR, "name": _STR,
                                   "envSourceContainerName": _STR},
                },
                "minReplicaCount": _INT32,
                "maxReplicaCount": _INT32,
                "idleReplicaCount": _INT32,
                "pollingInterval": _INT32,
                "cooldownPeriod": _INT32,
                "initialCooldownPeriod": _INT32,
                "triggers": {
                    "type": "array",
                    "items": {
                        "type": "object", "required": ["metadata", "type"],
                        "additionalProperties": False,
                        "properties": {
                            "type": _STR, "name": _STR, "useCachedMetrics": {"type": "boolean"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "metadata": {"type": "object", "additionalProperties": _STR},
                            "authenticationRef": {
                                "type": "object", "required": ["name"],
                                "properties": {"name": _STR, "kind": _STR},
                            },
                        },
                    },
                },
            },
        },
    },
}
