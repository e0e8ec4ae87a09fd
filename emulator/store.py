"""The emulator's state and API semantics, free of HTTP: objects, resourceVersion, uid,
generation, subresources, patches, server-side apply, deletion with finalizers, owner-reference
garbage collection, CRDs and the event history that watches replay.

Everything here runs on the emulator's event loop thread; operations are synchronous, so each
request is atomic (as if the API server serialised writes through etcd).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
import string
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from poolpilot.emulator import crd_validation, errors, immutable, managed
from poolpilot.emulator import patch as patching
from poolpilot.emulator.errors import ApiError
from poolpilot.emulator.patch import clone
from poolpilot.emulator.resources import Registry, ResourceType, from_crd
from poolpilot.emulator.selectors import (
    FieldRequirement,
    Requirement,
    fields_match,
    labels_match,
    selector_string,
)

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_LABEL_KINDS = {"namespaces", "services"}

PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/json-patch+json": "json",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+json": "apply",
}


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Event:
    rv: int
    type: str  # ADDED | MODIFIED | DELETED
    key: str  # ResourceType.key
    namespace: str
    obj: dict[str, Any]
    old: dict[str, Any] | None = None


@dataclass(eq=False)
class Watcher:
    """One open watch: events matching its filters are queued for the HTTP stream."""

    rt: ResourceType
    namespace: str | None
    labels: list[Requirement]
    fields: list[FieldRequirement]
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)

    def match(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        return labels_match(self.labels, obj["metadata"].get("labels")) and fields_match(
            self.fields, obj
        )

    def translate(self, ev: Event) -> tuple[str, dict[str, Any]] | None:
        """The event this watcher sees: objects entering/leaving the selector are ADDED/DELETED
        (as the real API server does)."""
        if ev.key != self.rt.key or (self.namespace and ev.namespace != self.namespace):
            return None
        new = self.match(ev.obj)
        if ev.type == "MODIFIED":
            old = self.match(ev.old)
            if new and old:
                return "MODIFIED", ev.obj
            if new:
                return "ADDED", ev.obj
            if old:
                return "DELETED", ev.obj
            return None
        return (ev.type, ev.obj) if new else None


def _strip_for_compare(obj: dict[str, Any]) -> dict[str, Any]:
    """What makes a write a real change: anything but the version and ownership timestamps."""
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    meta.pop("resourceVersion", None)
    meta["managedFields"] = [
        {k: v for k, v in m.items() if k != "time"} for m in meta.get("managedFields") or []
    ]
    out["metadata"] = meta
    return out


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _get_path(obj: Any, path: str) -> Any:
    for part in path.strip(".").split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = path.strip(".").split(".")
    for part in parts[:-1]:
        obj = obj.setdefault(part, {})
    obj[parts[-1]] = value


def prune(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Drop fields a structural schema does not declare (in place); returns their paths."""
    dropped: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") or isinstance(
            schema.get("additionalProperties"), dict | bool
        )
        for key in list(value):
            sub_path = f"{path}.{key}" if path else key
            if props is not None and key in props:
                if not (path == "" and key == "metadata"):
                    dropped += prune(props[key], value[key], sub_path)
            elif path == "" and key in ("apiVersion", "kind", "metadata"):
                continue
            elif isinstance(schema.get("additionalProperties"), dict):
                dropped += prune(schema["additionalProperties"], value[key], sub_path)
            elif not keep_unknown and props is not None:
                del value[key]
                dropped.append(sub_path)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            dropped += prune(schema["items"], item, f"{path}[{i}]")
    return dropped


class Store:
    def __init__(self, history_limit: int = 20_000, auto_namespaces: bool = True) -> None:
        self.registry = Registry()
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        self.rv = 0
        self.history: deque[Event] = deque()
        self.history_limit = history_limit
        self.floor = 0  # watches from a resourceVersion below this get 410 Gone
        self.watchers: set[Watcher] = set()
        self.crds: dict[str, dict[str, Any]] = {}
        self.uids: dict[str, tuple[str, str, str]] = {}
        # (key, namespace, name) -> (resourceVersion, apply signature, warnings) of the last
        # apply, to answer repeated identical applies without recomputing them
        self._last_apply: dict[tuple[str, str, str], tuple[str, str, list[str]]] = {}
        # owner uid -> dependents (storage key, namespace, name), for garbage collection
        self.dependents: dict[str, set[tuple[str, str, str]]] = {}
        self.validate_crds = True  # False: accept invalid custom resources (tests of bad input)
        self.auto_namespaces = auto_namespaces
        self.warnings: list[str] = []  # of the current request (Warning headers)
        self.listeners: list[Callable[[Event], None]] = []
        self._ips = itertools.count(10)
        ns_type = self.registry.get("", "v1", "namespaces")
        assert ns_type is not None
        self.ns_type = ns_type
        for ns in DEFAULT_NAMESPACES:
            self.create(ns_type, "", {"metadata": {"name": ns}}, manager="emulator")

    # --- reading ----------------------------------------------------------------------------

    def _bucket(self, rt: ResourceType) -> dict[tuple[str, str], dict[str, Any]]:
        return self.objects.setdefault(rt.key, {})

    def view(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """An object as served at `rt`'s version (CRD versions share one storage)."""
        if obj.get("apiVersion") == rt.api_version:
            return obj
        return {**obj, "apiVersion": rt.api_version}

    def find(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any] | None:
        return self._bucket(rt).get((namespace if rt.namespaced else "", name))

    def get(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        obj = self.find(rt, namespace, name)
        if obj is None:
            raise errors.not_found(rt.plural, name, rt.group)
        return self.view(rt, obj)

    def select(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: list[Requirement] | None = None,
        fields: list[FieldRequirement] | None = None,
    ) -> list[dict[str, Any]]:
        out = []
        for (ns, _), obj in sorted(self._bucket(rt).items()):
            if namespace and ns != namespace:
                continue
            if labels and not labels_match(labels, obj["metadata"].get("labels")):
                continue
            if fields and not fields_match(fields, obj):
                continue
            out.append(self.view(rt, obj))
        return out

    def events_since(self, rv: int) -> Iterator[Event]:
        if rv < self.floor:
            raise errors.gone(f"too old resource version: {rv} ({self.floor})")
        for ev in self.history:
            if ev.rv > rv:
                yield ev

    def compact(self) -> None:
        """Forget the event history (as etcd compaction does): older watches get 410 Gone."""
        self.history.clear()
        self.floor = self.rv

    # --- events -----------------------------------------------------------------------------

    def _emit(self, type_: str, rt: ResourceType, obj: dict[str, Any],
              old: dict[str, Any] | None = None) -> None:
        ev = Event(int(obj["metadata"]["resourceVersion"]), type_, rt.key,
                   obj["metadata"].get("namespace", ""), obj, old)
        self.history.append(ev)
        while len(self.history) > self.history_limit:
            self.floor = self.history.popleft().rv
        for w in list(self.watchers):
            seen = w.translate(ev)
            if seen is not None:
                w.queue.put_nowait((seen[0], self.view(w.rt, seen[1])))
        for listener in self.listeners:
            listener(ev)

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    # --- writing ----------------------------------------------------------------------------

    def create(self, rt: ResourceType, namespace: str, body: dict[str, Any], *,
               manager: str = "", dry_run: bool = False, strict: bool = False) -> dict[str, Any]:
        obj = clone(body)
        if not isinstance(obj, dict):
            raise errors.bad_request("the body must be a JSON object")
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            meta["name"] = meta["generateName"] + suffix
        name = meta.get("name")
        if not name:
            raise errors.invalid(rt.kind, rt.group, "", [("metadata.name", "Required value: "
                                 "name or generateName is required")])
        if self.find(rt, namespace, name) is not None:
            raise errors.already_exists(rt.plural, name, rt.group)
        return self._commit(rt, namespace, name, None, obj, sub="", manager=manager,
                            operation="Update", dry_run=dry_run, strict=strict)

    def replace(self, rt: ResourceType, namespace: str, name: str, body: dict[str, Any], *,
                sub: str = "", manager: str = "", dry_run: bool = False,
                strict: bool = False) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise errors.bad_request("the body must be a JSON object")
        if sub == "scale":
            return self._write_scale(rt, namespace, name, body, manager, dry_run)
        old = self.find(rt, namespace, name)
        if old is None:
            raise errors.not_found(rt.plural, name, rt.group)
        body_name = (body.get("metadata") or {}).get("name")
        if body_name and body_name != name:
            raise errors.bad_request(
                f"the name of the object ({body_name}) does not match the name on the URL ({name})"
            )
        return self._commit(rt, namespace, name, old, clone(body), sub=sub,
                            manager=manager, operation="Update", dry_run=dry_run, strict=strict)

    def patch(self, rt: ResourceType, namespace: str, name: str, ptype: str, body: Any, *,
              sub: str = "", manager: str = "", dry_run: bool = False, force: bool = False,
              strict: bool = False) -> dict[str, Any]:
        old = self.find(rt, namespace, name)
        if sub == "scale":
            if old is None:
                raise errors.not_found(rt.plural, name, rt.group)
            current = self.scale_of(rt, old)
            kind = "merge" if ptype == "apply" else ptype
            new_scale = self._patched(rt, current, kind, body)
            return self._write_scale(rt, namespace, name, new_scale, manager, dry_run)
        if ptype == "apply":
            return self._apply_cached(rt, namespace, name, old, body, sub=sub, manager=manager,
                                      dry_run=dry_run, force=force, strict=strict)
        if old is None:
            raise errors.not_found(rt.plural, name, rt.group)
        new = self._patched(rt, old, ptype, body)
        if not isinstance(new, dict):
            raise errors.bad_request("the patch must leave an object")
        return self._commit(rt, namespace, name, old, new, sub=sub, manager=manager,
                            operation="Update", dry_run=dry_run, strict=strict,
                            patched=True)

    def _patched(self, rt: ResourceType, current: dict[str, Any], ptype: str, body: Any) -> Any:
        if ptype == "json":
            return patching.json_patch(current, body)
        if not isinstance(body, dict):
            raise errors.bad_request(f"a {ptype} patch must be a JSON object")
        if ptype == "strategic":
            if rt.crd is not None:
                raise ApiError(
                    415,
                    "the body of the request was in an unknown format - accepted media types "
                    "include: application/json-patch+json, application/merge-patch+json, "
                    "application/apply-patch+yaml",
                    "UnsupportedMediaType",
                )
            return patching.strategic_merge(current, body)
        return patching.merge_patch(current, body)

    def list_types(self, rt: ResourceType) -> patching.ListTypes:
        if rt.crd is not None and rt.crd in self.crds:
            return patching.schema_list_types(crd_validation.version_schema(self.crds[rt.crd]))
        return patching.builtin_list_type

    def _apply_cached(self, rt: ResourceType, namespace: str, name: str,
                      old: dict[str, Any] | None, body: Any, *, sub: str, manager: str,
                      dry_run: bool, force: bool, strict: bool) -> dict[str, Any]:
        """Apply, short-cutting the common no-op: the same manager applying the same
        configuration to an object unchanged since its last apply (apply is idempotent), so an
        operator's periodic re-apply of 1,000s of objects stays cheap."""
        key = (rt.key, namespace if rt.namespaced else "", name)
        crd_rv = (self.crds.get(rt.crd or "") or {}).get("metadata", {}).get("resourceVersion")
        sig = json.dumps([manager, sub, force, strict, crd_rv, body], sort_keys=True,
                         default=str)
        hit = self._last_apply.get(key)
        if old is not None and not dry_run and hit is not None and hit[:2] == (
                old["metadata"]["resourceVersion"], sig):
            self.warnings += hit[2]
            return self.view(rt, old)
        out = self._apply(rt, namespace, name, old, body, sub=sub, manager=manager,
                          dry_run=dry_run, force=force, strict=strict)
        if not dry_run and self.find(rt, namespace, name) is not None:
            self._last_apply[key] = (out["metadata"]["resourceVersion"], sig,
                                     list(self.warnings))
        return out

    def _apply(self, rt: ResourceType, namespace: str, name: str, old: dict[str, Any] | None,
               body: Any, *, sub: str, manager: str, dry_run: bool, force: bool,
               strict: bool) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise errors.bad_request("an apply patch must be an object")
        if not manager:
            raise errors.bad_request(
                "PATCH with application/apply-patch+yaml requires the fieldManager parameter"
            )
        config = clone(body)
        for k in ("apiVersion", "kind"):
            if not config.get(k):
                raise errors.bad_request(f"{k} must be set in an applied configuration")
        if config["kind"] != rt.kind:
            raise errors.bad_request(f"kind {config['kind']!r} does not match {rt.kind!r}")
        meta = config.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL "
                f"({name})"
            )
        rv = meta.pop("resourceVersion", None)
        if rv and old is not None and rv != old["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.plural, name, rt.group)
        if sub == "status":
            config = {"apiVersion": config["apiVersion"], "kind": config["kind"],
                      "metadata": {}, "status": config.get("status")}
        elif rt.status:
            config.pop("status", None)
        config["apiVersion"] = rt.api_version
        stamp = now_iso()
        ident = (manager, "Apply", sub)
        new, conflicts = managed.apply(old, config, self.list_types(rt), ident,
                                       rt.api_version, stamp, force)
        if conflicts and not force:
            raise ApiError(
                409,
                f"Apply failed with {len(conflicts)} conflict"
                f"{'s' if len(conflicts) > 1 else ''}: "
                + "\n".join(f'conflict with "{c.manager}" using {c.api_version}: {c.field()}'
                            for c in conflicts),
                "Conflict",
                {
                    "name": name, "group": rt.group, "kind": rt.plural,
                    "causes": [
                        {"reason": "FieldManagerConflict",
                         "message": f'conflict with "{c.manager}" using {c.api_version}',
                         "field": c.field()}
                        for c in conflicts
                    ],
                },
            )
        new.setdefault("metadata", {})["name"] = name
        if old is None:
            if sub:
                raise errors.not_found(rt.plural, name, rt.group)
            return self._commit(rt, namespace, name, None, new, sub="", manager=manager,
                                operation="Apply", dry_run=dry_run, strict=strict,
                                tracked=True)
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        return self._commit(rt, namespace, name, old, new, sub=sub, manager=manager,
                            operation="Apply", dry_run=dry_run, strict=strict, tracked=True)

    def _commit(self, rt: ResourceType, namespace: str, name: str,
                old: dict[str, Any] | None, new: dict[str, Any], *, sub: str, manager: str,
                operation: str, dry_run: bool, strict: bool, tracked: bool = False,
                patched: bool = False) -> dict[str, Any]:
        new = clone(new)  # patches share subtrees with `old`, a stored snapshot
        meta = new.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        ns = namespace if rt.namespaced else ""
        body_ns = meta.get("namespace")
        if rt.namespaced and body_ns and body_ns != ns:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        if old is None:
            self._check_name(rt, name)
            if rt.namespaced:
                self._ensure_namespace(ns, dry_run)
            meta.update(name=name, uid=_uid(), creationTimestamp=now_iso(), generation=1)
            if rt.namespaced:
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
            for k in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
                meta.pop(k, None)
        else:
            sent_rv = meta.get("resourceVersion")
            if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
                raise errors.conflict(rt.plural, name, rt.group)
            if sub == "status":
                status, owners = new.get("status"), meta.get("managedFields")
                new = clone(old)
                if status is None:
                    new.pop("status", None)
                else:
                    new["status"] = status
                meta = new["metadata"]
                if tracked:
                    meta["managedFields"] = owners
            elif rt.status:
                if "status" in old:
                    new["status"] = clone(old["status"])
                else:
                    new.pop("status", None)
            for k in ("uid", "creationTimestamp", "generation", "deletionTimestamp",
                      "deletionGracePeriodSeconds", "name", "namespace"):
                if k in old["metadata"]:
                    meta[k] = old["metadata"][k]
                else:
                    meta.pop(k, None)
            if "managedFields" not in meta and not patched and not tracked:
                meta["managedFields"] = old["metadata"].get("managedFields")
        new["apiVersion"] = rt.api_version if rt.crd is None else f"{rt.group}/{rt.storage_version}"
        new["kind"] = rt.kind
        if sub != "status":
            self._default(rt, new, old)
            self._validate(rt, new, strict)
            meta = new["metadata"]  # validation may have replaced it (defaults applied)
            if old is not None and (causes := immutable.changes(rt.key, old, new)):
                raise errors.invalid(rt.kind, rt.group, name, causes)
        if old is not None and _strip_for_compare(new) == _strip_for_compare(old):
            return self.view(rt, old)  # a no-op write changes nothing, not even the version
        if not tracked and manager:
            managed.track_update(old, new, self.list_types(rt), (manager, operation, sub),
                                 rt.api_version, now_iso())
        if meta.get("managedFields") is None:
            meta.pop("managedFields", None)
        if old is not None and _spec_part(new) != _spec_part(old):
            meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        if dry_run:
            meta["resourceVersion"] = old["metadata"]["resourceVersion"] if old else ""
            return self.view(rt, new)
        if old is not None and meta.get("deletionTimestamp") and not meta.get("finalizers"):
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            self._store(rt, ns, name, new, old, "MODIFIED", quiet=True)
            return self.view(rt, self._remove(rt, ns, name))
        meta["resourceVersion"] = self._next_rv()
        self._store(rt, ns, name, new, old, "ADDED" if old is None else "MODIFIED")
        return self.view(rt, new)

    def _index_owners(self, rt: ResourceType, ns: str, name: str,
                      obj: dict[str, Any] | None, add: bool) -> None:
        for ref in (obj or {}).get("metadata", {}).get("ownerReferences") or []:
            uid = ref.get("uid") if isinstance(ref, dict) else None
            if not uid:
                continue
            deps = self.dependents.setdefault(uid, set())
            if add:
                deps.add((rt.key, ns, name))
            else:
                deps.discard((rt.key, ns, name))
                if not deps:
                    del self.dependents[uid]

    def _store(self, rt: ResourceType, ns: str, name: str, obj: dict[str, Any],
               old: dict[str, Any] | None, type_: str, quiet: bool = False) -> None:
        self._index_owners(rt, ns, name, old, add=False)
        self._index_owners(rt, ns, name, obj, add=True)
        self._bucket(rt)[(ns, name)] = obj
        self.uids[obj["metadata"]["uid"]] = (rt.key, ns, name)
        if rt.key == "customresourcedefinitions.apiextensions.k8s.io":
            self._register_crd(obj)
        if not quiet:
            self._emit(type_, rt, obj, old)

    def _check_name(self, rt: ResourceType, name: str) -> None:
        rule, what = (
            (_LABEL, "RFC 1123 label") if rt.plural in _DNS_LABEL_KINDS else
            (_SUBDOMAIN, "RFC 1123 subdomain")
        )
        limit = 63 if rt.plural in _DNS_LABEL_KINDS else 253
        if not rule.match(name) or len(name) > limit:
            raise errors.invalid(rt.kind, rt.group, name, [(
                "metadata.name",
                f'Invalid value: "{name}": a lowercase {what} must consist of lower case '
                "alphanumeric characters, '-' or '.', and must start and end with an "
                "alphanumeric character",
            )])

    def _ensure_namespace(self, ns: str, dry_run: bool) -> None:
        existing = self.find(self.ns_type, "", ns)
        if existing is not None:
            if existing["metadata"].get("deletionTimestamp"):
                raise ApiError(
                    403,
                    f"unable to create new content in namespace {ns} because it is being "
                    "terminated",
                    "Forbidden",
                )
            return
        if not self.auto_namespaces:
            raise errors.not_found("namespaces", ns)
        if not dry_run:
            self.create(self.ns_type, "", {"metadata": {"name": ns}}, manager="emulator")

    # --- defaulting and validation ----------------------------------------------------------

    def _default(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        spec = obj.get("spec")
        if rt.key == "namespaces":
            if not (old and old.get("status")):
                obj["status"] = {"phase": "Active"}
        elif rt.key == "deployments.apps" and isinstance(spec, dict):
            spec.setdefault("replicas", 1)
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("progressDeadlineSeconds", 600)
            spec.setdefault("strategy", {"type": "RollingUpdate", "rollingUpdate": {
                "maxSurge": "25%", "maxUnavailable": "25%"}})
            pod = (spec.get("template") or {}).get("spec")
            if isinstance(pod, dict):
                for c in (pod.get("containers") or []) + (pod.get("initContainers") or []):
                    for port in (c.get("ports") or []) if isinstance(c, dict) else []:
                        if isinstance(port, dict):
                            port.setdefault("protocol", "TCP")
        elif rt.key == "services" and isinstance(spec, dict):
            spec.setdefault("type", "ClusterIP")
            spec.setdefault("sessionAffinity", "None")
            if "clusterIP" not in spec:
                prev = ((old or {}).get("spec") or {}).get("clusterIP")
                n = next(self._ips)
                spec["clusterIP"] = prev or f"10.96.{n // 250 % 250}.{n % 250 + 1}"
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
            for port in spec.get("ports") or []:
                if isinstance(port, dict):
                    port.setdefault("protocol", "TCP")
                    port.setdefault("targetPort", port.get("port"))
        elif rt.key == "pods" and old is None:
            obj.setdefault("status", {"phase": "Pending"})
        elif rt.key == "customresourcedefinitions.apiextensions.k8s.io":
            names = (spec or {}).get("names") or {}
            names.setdefault("singular", str(names.get("kind", "")).lower())
            names.setdefault("listKind", f"{names.get('kind', '')}List")
            previous = (old or {}).get("status") or {}
            if previous.get("acceptedNames") == names:
                obj["status"] = previous  # unchanged names: keep the conditions' times
                return
            obj["status"] = {
                "acceptedNames": names,
                "storedVersions": [v["name"] for v in (spec or {}).get("versions", [])
                                   if v.get("storage")],
                "conditions": [
                    {"type": t, "status": "True", "reason": r, "message": m,
                     "lastTransitionTime": now_iso()}
                    for t, r, m in (
                        ("NamesAccepted", "NoConflicts", "no conflicts found"),
                        ("Established", "InitialNamesAccepted", "the initial names have been "
                         "accepted"),
                    )
                ],
            }

    def _validate(self, rt: ResourceType, obj: dict[str, Any], strict: bool) -> None:
        name = obj["metadata"].get("name", "")
        if rt.crd is not None and rt.crd in self.crds:
            schema = crd_validation.version_schema(self.crds[rt.crd], rt.storage_version)
            dropped = prune(schema, obj)
            if dropped and strict:  # the real server's wording (400, kubectl prints it)
                unknown = ", ".join(f'unknown field "{p}"' for p in dropped)
                raise errors.bad_request(
                    f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                    f"strict decoding error: {unknown}")
            self.warnings += [f'unknown field "{p}"' for p in dropped]
            if not self.validate_crds:
                return
            defaulted, problems = crd_validation.validate(self.crds[rt.crd], obj)
            if problems:
                raise errors.invalid(rt.kind, rt.group, name, [_cause(p) for p in problems])
            obj.clear()
            obj.update(defaulted)
        elif rt.key == "deployments.apps":
            spec = obj.get("spec") or {}
            sel = (spec.get("selector") or {}).get("matchLabels")
            tmpl = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
            if not spec.get("selector"):
                raise errors.invalid(rt.kind, rt.group, name,
                                     [("spec.selector", "Required value")])
            if sel and any(tmpl.get(k) != v for k, v in sel.items()):
                raise errors.invalid(rt.kind, rt.group, name, [(
                    "spec.template.metadata.labels",
                    f"Invalid value: {tmpl!r}: `selector` does not match template `labels`",
                )])
        elif rt.key == "customresourcedefinitions.apiextensions.k8s.io":
            spec = obj.get("spec") or {}
            names = spec.get("names") or {}
            causes: list[tuple[str, str]] = []
            for f in ("group", "names", "versions"):
                if not spec.get(f):
                    causes.append((f"spec.{f}", "Required value"))
            if not causes and name != f"{names.get('plural')}.{spec['group']}":
                causes.append(("metadata.name", f'Invalid value: "{name}": must be '
                                 "spec.names.plural+\".\"+spec.group"))
            if causes:
                raise errors.invalid(rt.kind, rt.group, name, causes)

    # --- CRDs -------------------------------------------------------------------------------

    def _register_crd(self, crd: dict[str, Any]) -> None:
        name = crd["metadata"]["name"]
        self.registry.remove_crd(name)
        self.crds[name] = crd
        for rt in from_crd(crd):
            self.registry.add(rt)

    # --- scale subresource ------------------------------------------------------------------

    def scale_of(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        if not rt.scale:
            raise errors.not_found(f"{rt.plural}/scale", obj["metadata"]["name"], rt.group)
        meta = obj["metadata"]
        if rt.crd is None:
            selector = selector_string((obj.get("spec") or {}).get("selector"))
        else:
            selector = _get_path(obj, rt.label_selector_path or "") or ""
        status: dict[str, Any] = {"replicas": _get_path(obj, rt.status_replicas_path) or 0}
        if selector:
            status["selector"] = selector
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                               "creationTimestamp") if k in meta},
            "spec": {"replicas": _get_path(obj, rt.spec_replicas_path) or 0},
            "status": status,
        }

    def get_scale(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        return self.scale_of(rt, self.get(rt, namespace, name))

    def _write_scale(self, rt: ResourceType, namespace: str, name: str, scale: dict[str, Any],
                     manager: str, dry_run: bool) -> dict[str, Any]:
        old = self.find(rt, namespace, name)
        if old is None:
            raise errors.not_found(rt.plural, name, rt.group)
        if not rt.scale:
            raise errors.not_found(f"{rt.plural}/scale", name, rt.group)
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise errors.invalid("Scale", "autoscaling", name, [(
                "spec.replicas", f"Invalid value: {replicas!r}: must be a non-negative integer",
            )])
        new = clone(old)
        rv = (scale.get("metadata") or {}).get("resourceVersion")
        new["metadata"]["resourceVersion"] = rv or old["metadata"]["resourceVersion"]
        _set_path(new, rt.spec_replicas_path, replicas)
        result = self._commit(rt, namespace, name, old, new, sub="scale", manager=manager,
                              operation="Update", dry_run=dry_run, strict=False, patched=True)
        return self.scale_of(rt, result)

    # --- deletion and garbage collection ----------------------------------------------------

    def delete(self, rt: ResourceType, namespace: str, name: str, *,
               propagation: str = "Background", dry_run: bool = False,
               preconditions: dict[str, Any] | None = None) -> dict[str, Any]:
        ns = namespace if rt.namespaced else ""
        obj = self.find(rt, ns, name)
        if obj is None:
            raise errors.not_found(rt.plural, name, rt.group)
        pre = preconditions or {}
        if pre.get("uid") and pre["uid"] != obj["metadata"]["uid"]:
            raise errors.conflict(rt.plural, name, rt.group, "Precondition failed: UID in "
                                  "precondition does not match the UID in record")
        if pre.get("resourceVersion") and pre["resourceVersion"] != obj["metadata"][
                "resourceVersion"]:
            raise errors.conflict(rt.plural, name, rt.group)
        if dry_run:
            return self.view(rt, obj)
        if obj["metadata"].get("finalizers") or rt.key == "namespaces":
            if not obj["metadata"].get("deletionTimestamp"):
                new = clone(obj)
                new["metadata"]["deletionTimestamp"] = now_iso()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                if rt.key == "namespaces":
                    new["status"] = {"phase": "Terminating"}
                new["metadata"]["resourceVersion"] = self._next_rv()
                self._store(rt, ns, name, new, obj, "MODIFIED")
                obj = new
            if rt.key == "namespaces":
                self._drain_namespace(name)
                obj = self.find(rt, "", name) or obj
            if obj["metadata"].get("finalizers") or self.find(rt, ns, name) is None:
                return self.view(rt, obj)
        return self.view(rt, self._remove(rt, ns, name, propagation))

    def _remove(self, rt: ResourceType, ns: str, name: str,
                propagation: str = "Background") -> dict[str, Any]:
        obj = self._bucket(rt).pop((ns, name))
        self.uids.pop(obj["metadata"]["uid"], None)
        self._last_apply.pop((rt.key, ns, name), None)
        self._index_owners(rt, ns, name, obj, add=False)
        final = clone(obj)
        final["metadata"]["resourceVersion"] = self._next_rv()
        self._emit("DELETED", rt, final, obj)
        if rt.key == "customresourcedefinitions.apiextensions.k8s.io":
            self._unregister_crd(final)
        self._collect(final["metadata"]["uid"], orphan=propagation == "Orphan")
        if ns:
            self._maybe_finish_namespace(ns)
        return final

    def _unregister_crd(self, crd: dict[str, Any]) -> None:
        name = crd["metadata"]["name"]
        types = [rt for rt in self.registry.types.values() if rt.crd == name]
        if types:
            for (ns, obj_name) in list(self._bucket(types[0])):
                self._remove(types[0], ns, obj_name)
            self.objects.pop(types[0].key, None)
        self.registry.remove_crd(name)
        self.crds.pop(name, None)

    def _type_of_key(self, key: str) -> ResourceType | None:
        return next((rt for rt in self.registry.types.values() if rt.key == key), None)

    def _collect(self, uid: str, orphan: bool) -> None:
        """Owner-reference garbage collection after `uid` is gone (background cascade)."""
        for key, ns, name in sorted(self.dependents.get(uid, ())):
            rt = self._type_of_key(key)
            obj = self.objects.get(key, {}).get((ns, name))
            if rt is None or obj is None:
                continue
            refs = obj["metadata"].get("ownerReferences") or []
            live = [r for r in refs if r.get("uid") != uid and r.get("uid") in self.uids]
            if live or orphan:
                new = clone(obj)
                new["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid]
                if not new["metadata"]["ownerReferences"]:
                    del new["metadata"]["ownerReferences"]
                new["metadata"]["resourceVersion"] = self._next_rv()
                self._store(rt, ns, name, new, obj, "MODIFIED")
            else:
                self.delete(rt, ns, name)

    def _drain_namespace(self, ns: str) -> None:
        for key, bucket in list(self.objects.items()):
            rt = self._type_of_key(key)
            if rt is None or not rt.namespaced:
                continue
            for (obj_ns, name) in list(bucket):
                if obj_ns == ns and (obj_ns, name) in bucket:
                    self.delete(rt, ns, name)
        self._maybe_finish_namespace(ns)

    def _maybe_finish_namespace(self, ns: str) -> None:
        obj = self.find(self.ns_type, "", ns)
        if obj is None or not obj["metadata"].get("deletionTimestamp"):
            return
        if obj["metadata"].get("finalizers"):
            return
        if any(k[0] == ns for key, b in self.objects.items() for k in b
               if key != "namespaces"):
            return
        self._remove(self.ns_type, "", ns)

    def delete_collection(self, rt: ResourceType, namespace: str | None,
                          labels: list[Requirement], fields: list[FieldRequirement], *,
                          dry_run: bool = False) -> list[dict[str, Any]]:
        out = []
        for obj in self.select(rt, namespace, labels, fields):
            meta = obj["metadata"]
            out.append(self.delete(rt, meta.get("namespace", ""), meta["name"], dry_run=dry_run))
        return out


def _uid() -> str:
    return str(uuid.uuid4())


def _cause(problem: str) -> tuple[str, str]:
    """'spec.decode.maxReplicas: must be ...' -> (field, message)."""
    field_name, sep, message = problem.partition(": ")
    return (field_name, message) if sep else ("", problem)
