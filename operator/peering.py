"""Kopf's peering CRDs (kopf.dev/v1), which HA needs: operators announce themselves in a
KopfPeering (namespaced) or ClusterKopfPeering object; the highest priority acts, the others
wait and take over when its heartbeat stops. Install them with the chart or
`poolpilot render --peering-crds`."""

from __future__ import annotations

from typing import Any

DEFAULT_NAME = "poolpilot"


def _crd(kind: str, plural: str, scope: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kopf.dev"},
        "spec": {
            "scope": scope,
            "group": "kopf.dev",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "status": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


def peering_crds() -> list[dict[str, Any]]:
    return [
        _crd("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
        _crd("KopfPeering", "kopfpeerings", "Namespaced"),
    ]


def peering_object(name: str = DEFAULT_NAME, namespace: str | None = None) -> dict[str, Any]:
    """The peering object itself (Kopf does not create it)."""
    kind = "KopfPeering" if namespace else "ClusterKopfPeering"
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "kopf.dev/v1", "kind": kind, "metadata": meta}
