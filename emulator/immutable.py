"""Fields a real API server refuses to change once an object exists.

Without these checks an update that a cluster would refuse (a Deployment's selector, a
RoleBinding's roleRef) goes through here, and a test would never see the 422 a user gets.
The messages are the API server's own wording ("field is immutable").
"""

from __future__ import annotations

import json
from typing import Any

from poolpilot.apitypes import Obj

# (resource key, dotted path): the path may not change after creation.
_IMMUTABLE: dict[str, tuple[str, ...]] = {
    "deployments.apps": ("spec.selector",),
    "statefulsets.apps": ("spec.selector", "spec.serviceName", "spec.podManagementPolicy"),
    "daemonsets.apps": ("spec.selector",),
    "jobs.batch": ("spec.selector", "spec.template", "spec.completions"),
    "rolebindings.rbac.authorization.k8s.io": ("roleRef",),
    "clusterrolebindings.rbac.authorization.k8s.io": ("roleRef",),
    "services": ("spec.clusterIP",),
    "secrets": ("type",),
    "persistentvolumeclaims": ("spec.accessModes", "spec.selector", "spec.storageClassName",
                               "spec.volumeMode", "spec.volumeName", "spec.dataSource"),
}
_MISSING = object()


def _at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


def changes(key: str, old: Obj, new: Obj) -> list[tuple[str, str]]:
    """(field, message) for every immutable field `new` changes, as a 422's causes."""
    causes = []
    for path in _IMMUTABLE.get(key, ()):
        before, after = _at(old, path), _at(new, path)
        if before != after:
            shown = "null" if after is _MISSING else json.dumps(after, sort_keys=True)
            causes.append((path, f"Invalid value: {shown}: field is immutable"))
    return causes
