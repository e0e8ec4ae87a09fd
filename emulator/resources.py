"""Resource types the emulator serves: the built-in subset and those defined by CRDs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUB_VERBS = ("get", "patch", "update")


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status: bool = False  # has the /status subresource
    scale: bool = False  # has the /scale subresource
    # Scale subresource paths (CRDs name them; Deployments use these defaults).
    spec_replicas_path: str = ".spec.replicas"
    status_replicas_path: str = ".status.replicas"
    label_selector_path: str | None = ".status.selector"
    printer_columns: tuple[dict[str, Any], ...] = ()
    crd: str | None = None  # name of the defining CRD
    storage_version: str = ""  # the version objects are stored in (CRDs: all versions share it)

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """Storage key shared by every version of a resource, e.g. 'deployments.apps'."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def discovery(self) -> list[dict[str, Any]]:
        """APIResource entries (the resource and its subresources) for /api(s)/G/V."""
        main: dict[str, Any] = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(VERBS),
        }
        if self.short_names:
            main["shortNames"] = list(self.short_names)
        if self.categories:
            main["categories"] = list(self.categories)
        out = [main]
        if self.status:
            out.append(
                {
                    "name": f"{self.plural}/status",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": list(SUB_VERBS),
                }
            )
        if self.scale:
            out.append(
                {
                    "name": f"{self.plural}/scale",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": list(SUB_VERBS),
                }
            )
        return out


def _b(group: str, version: str, plural: str, kind: str, **kw: Any) -> ResourceType:
    return ResourceType(group, version, plural, kind, storage_version=version, **kw)


BUILTINS: tuple[ResourceType, ...] = (
    _b("", "v1", "namespaces", "Namespace", namespaced=False, short_names=("ns",), status=True),
    _b("", "v1", "pods", "Pod", short_names=("po",), categories=("all",), status=True),
    _b("", "v1", "services", "Service", short_names=("svc",), categories=("all",), status=True),
    _b("", "v1", "endpoints", "Endpoints", short_names=("ep",)),
    _b("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    _b("", "v1", "secrets", "Secret"),
    _b("", "v1", "events", "Event", short_names=("ev",)),
    _b("", "v1", "serviceaccounts", "ServiceAccount", short_names=("sa",)),
    _b("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", short_names=("pvc",),
       status=True),
    _b("", "v1", "nodes", "Node", namespaced=False, short_names=("no",), status=True),
    _b("apps", "v1", "deployments", "Deployment", short_names=("deploy",), categories=("all",),
       status=True, scale=True),
    _b("apps", "v1", "replicasets", "ReplicaSet", short_names=("rs",), categories=("all",),
       status=True, scale=True),
    _b("apps", "v1", "statefulsets", "StatefulSet", short_names=("sts",), categories=("all",),
       status=True, scale=True),
    # The model cache's prefetcher and prefetch Job (stored; no controller runs them here).
    _b("apps", "v1", "daemonsets", "DaemonSet", short_names=("ds",), categories=("all",),
       status=True),
    _b("batch", "v1", "jobs", "Job", categories=("all",), status=True),
    _b("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", short_names=("pdb",),
       status=True),
    _b("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"),
    _b("events.k8s.io", "v1", "events", "Event", short_names=("ev",)),
    _b("coordination.k8s.io", "v1", "leases", "Lease"),
    _b("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    _b("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    _b("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    _b("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding",
       namespaced=False),
    _b("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short_names=("netpol",)),
    _b("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler",
       short_names=("hpa",), categories=("all",), status=True),
    _b("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
       namespaced=False, short_names=("crd", "crds"), categories=("api-extensions",),
       status=True),
)


def from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """The served versions of a CRD as resource types (printer columns, subresources)."""
    spec = crd["spec"]
    names = spec["names"]
    versions = [v for v in spec["versions"] if v.get("served", True)]
    storage = next((v["name"] for v in spec["versions"] if v.get("storage")), versions[0]["name"])
    out = []
    for v in versions:
        subs = v.get("subresources") or {}
        scale = subs.get("scale")
        out.append(
            ResourceType(
                group=spec["group"],
                version=v["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames", ())),
                categories=tuple(names.get("categories", ())),
                status="status" in subs,
                scale=scale is not None,
                spec_replicas_path=(scale or {}).get("specReplicasPath", ".spec.replicas"),
                status_replicas_path=(scale or {}).get("statusReplicasPath", ".status.replicas"),
                label_selector_path=(scale or {}).get("labelSelectorPath"),
                printer_columns=tuple(v.get("additionalPrinterColumns", ())),
                crd=crd["metadata"]["name"],
                storage_version=storage,
            )
        )
    return out


@dataclass
class Registry:
    """Every served (group, version, plural); CRDs add and remove entries at runtime."""

    types: dict[tuple[str, str, str], ResourceType] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for rt in BUILTINS:
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        self.types[(rt.group, rt.version, rt.plural)] = rt

    def remove_crd(self, crd_name: str) -> None:
        for k in [k for k, rt in self.types.items() if rt.crd == crd_name]:
            del self.types[k]

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self.types.get((group, version, plural))

    def groups(self) -> dict[str, list[str]]:
        """group -> served versions (preferred first: the storage version, else sorted)."""
        out: dict[str, list[str]] = {}
        for rt in self.types.values():
            versions = out.setdefault(rt.group, [])
            if rt.version not in versions:
                versions.append(rt.version)
        for group, versions in out.items():
            pref = next(
                (rt.storage_version for rt in self.types.values() if rt.group == group), None
            )
            versions.sort(key=lambda v: (v != pref, v))
        return out

    def in_version(self, group: str, version: str) -> list[ResourceType]:
        return [rt for rt in self.types.values() if rt.group == group and rt.version == version]

    def resolve(self, name: str) -> ResourceType:
        """Find a type by 'plural', 'plural.group', 'kind', short name or 'group/version/plural'
        (for the Python-side helpers, like kubectl does on the command line)."""
        if name.count("/") == 2:
            group, version, plural = name.split("/")
            rt = self.get(group, version, plural)
            if rt is None:
                raise KeyError(name)
            return rt
        if name.count("/") == 1:  # core: v1/pods
            version, plural = name.split("/")
            rt = self.get("", version, plural)
            if rt is None:
                raise KeyError(name)
            return rt
        head, _, group = name.partition(".")
        low = head.lower()
        # Unqualified names prefer the core group (events -> v1 Event), as kubectl does.
        ordered = sorted(
            self.types.values(), key=lambda r: (r.group != "", r.version != r.storage_version)
        )
        for rt in ordered:
            if group and rt.group != group:
                continue
            if low in (rt.plural, rt.singular, rt.kind.lower(), *rt.short_names):
                return rt
        raise KeyError(name)
