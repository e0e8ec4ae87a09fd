"""Pod templates (spec.podTemplate, spec.<role>.podTemplate) laid over the pods the operator
renders.

Part of the pure builders (poolpilot.operator.builders): no I/O and no clock.
"""

from __future__ import annotations

from poolpilot import api
from poolpilot.apitypes import Obj

# ---------------------------------------------------------------------------------------------
# Pod templates (spec.podTemplate, spec.<role>.podTemplate): laid over what the operator
# renders, as `kubectl patch --type strategic` would merge them: maps merged, lists of named
# things merged by name (volume mounts by path), other lists appended, scalars replaced.


def _merge_named(base: list[Obj], extra: list[Obj], key: str = "name") -> list[Obj]:
    out = {item[key]: item for item in base}
    for item in extra:
        out[item[key]] = item
    return list(out.values())


def _merge_env(base: list[Obj], extra: list[Obj]) -> list[Obj]:
    return _merge_named(base, extra)


def _overlay_container(container: Obj, overlay: api.ContainerOverlay) -> None:
    if overlay.env:
        container["env"] = _merge_env(container.get("env", []),
                                      [e.to_wire() for e in overlay.env])
    if overlay.env_from:
        container["envFrom"] = [*container.get("envFrom", []), *overlay.env_from]
    if overlay.volume_mounts:
        container["volumeMounts"] = _merge_named(
            container.get("volumeMounts", []), [m.to_wire() for m in overlay.volume_mounts],
            key="mountPath")
    add = overlay.security_context.capabilities.add
    if add:
        caps = container["securityContext"]["capabilities"]
        caps["add"] = sorted({*caps.get("add", []), *add})


def _overlay_pod(template: Obj, overlay: api.PodTemplate) -> None:
    """Lay one pod template over a rendered pod template (in place)."""
    meta, pod, extra = template["metadata"], template["spec"], overlay.spec
    if overlay.metadata.labels:  # never the operator's own (the API refuses them)
        meta["labels"] = {**meta["labels"], **dict(sorted(overlay.metadata.labels.items()))}
    if overlay.metadata.annotations:
        meta["annotations"] = dict(sorted(
            {**meta.get("annotations", {}), **overlay.metadata.annotations}.items()))
    if extra.affinity:
        pod["affinity"] = {**pod.get("affinity", {}), **extra.affinity}
    if extra.tolerations:
        known = pod.get("tolerations", [])
        pod["tolerations"] = known + [t.to_wire() for t in extra.tolerations
                                      if t.to_wire() not in known]
    if extra.node_selector:
        pod["nodeSelector"] = dict(sorted({**pod.get("nodeSelector", {}),
                                           **extra.node_selector}.items()))
    for field in ("priority_class_name", "service_account_name", "runtime_class_name",
                  "scheduler_name"):
        value = getattr(extra, field)
        if value is not None:
            pod[api.PodSpecOverlay.model_fields[field].alias or field] = value
    if extra.image_pull_secrets:
        pod["imagePullSecrets"] = _merge_named(pod.get("imagePullSecrets", []),
                                               [s.to_wire() for s in extra.image_pull_secrets])
    if extra.volumes:
        pod["volumes"] = _merge_named(pod.get("volumes", []), [v.to_wire() for v in extra.volumes])
    for c in extra.containers:
        for container in pod["containers"]:
            if container["name"] == c.name:
                _overlay_container(container, c)


def _template_resources(templates: list[api.PodTemplate]) -> list[api.ResourceRequirements]:
    return [c.resources for t in templates for c in t.spec.containers]


