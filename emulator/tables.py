"""`Accept: application/json;as=Table` output, as kubectl asks for: CRD printer columns
(a JSONPath subset) and the columns of the built-in kinds kubectl users expect."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from poolpilot.emulator.resources import ResourceType

_FILTER = re.compile(r"""^\?\(@\.([\w.-]+)\s*==\s*(?:"([^"]*)"|'([^']*)'|([\w.-]+))\)$""")


def jsonpath(obj: Any, path: str) -> list[Any]:
    """Evaluate a printer-column JSONPath: .a.b, [0], [*], [?(@.k=="v")], optionally in {}."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    tokens = re.findall(r"\[[^\]]*\]|\.[^.\[]+", path)
    values = [obj]
    for tok in tokens:
        nxt: list[Any] = []
        if tok.startswith("."):
            key = tok[1:]
            nxt = [v[key] for v in values if isinstance(v, dict) and key in v]
        else:
            inner = tok[1:-1].strip()
            for v in values:
                if not isinstance(v, list):
                    continue
                if inner == "*":
                    nxt += v
                elif inner.lstrip("-").isdigit():
                    i = int(inner)
                    if -len(v) <= i < len(v):
                        nxt.append(v[i])
                elif m := _FILTER.match(inner):
                    want = next(g for g in m.groups()[1:] if g is not None)
                    for item in v:
                        got = jsonpath(item, "." + m.group(1))
                        if got and str(got[0]) == want:
                            nxt.append(item)
        values = nxt
    return values


def human_duration(seconds: float) -> str:
    """Like k8s.io/apimachinery's duration.HumanDuration (what `kubectl get` shows as AGE)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    y = d // 365
    return f"{y}y{d % 365}d" if y < 8 and d % 365 else f"{y}y"


def age(timestamp: str | None) -> str:
    if not timestamp:
        return "<unknown>"
    try:
        t = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return timestamp
    return human_duration((datetime.now(UTC) - t).total_seconds())


Column = tuple[dict[str, Any], Callable[[dict[str, Any]], Any]]


def _col(name: str, type_: str = "string", fmt: str = "", desc: str = "",
         priority: int = 0) -> dict[str, Any]:
    return {"name": name, "type": type_, "format": fmt, "description": desc or name,
            "priority": priority}


def _name(o: dict[str, Any]) -> Any:
    return o["metadata"]["name"]


def _age(o: dict[str, Any]) -> Any:
    return age(o["metadata"].get("creationTimestamp"))


NAME: Column = (_col("Name", fmt="name", desc="Name must be unique within a namespace."), _name)
AGE: Column = (_col("Age", desc="CreationTimestamp is a timestamp representing the server "
                    "time when this object was created."), _age)


def _get(o: dict[str, Any], *path: str, default: Any = None) -> Any:
    for p in path:
        o = o.get(p) if isinstance(o, dict) else None  # type: ignore[assignment]
    return default if o is None else o


def _pod_ready(o: dict[str, Any]) -> str:
    statuses = _get(o, "status", "containerStatuses", default=[])
    total = len(_get(o, "spec", "containers", default=[]))
    return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"


def _ports(o: dict[str, Any]) -> str:
    ports = _get(o, "spec", "ports", default=[])
    return ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in ports) or "<none>"


def _event_object(o: dict[str, Any]) -> str:
    ref = o.get("involvedObject") or o.get("regarding") or {}
    return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"


def _event_last_seen(o: dict[str, Any]) -> str:
    when = (o.get("lastTimestamp") or o.get("eventTime") or
            (o.get("series") or {}).get("lastObservedTime") or
            o["metadata"].get("creationTimestamp"))
    return age(str(when)[:19] + "Z") if when else "<unknown>"


EVENT_COLUMNS: list[Column] = [
    (_col("Last Seen"), _event_last_seen),
    (_col("Type"), lambda o: o.get("type", "")),
    (_col("Reason"), lambda o: o.get("reason", "")),
    (_col("Object"), _event_object),
    (_col("Message"), lambda o: o.get("message") or o.get("note") or ""),
]

BUILTIN_COLUMNS: dict[str, list[Column]] = {
    "events": EVENT_COLUMNS,
    "events.events.k8s.io": EVENT_COLUMNS,
    "deployments.apps": [
        NAME,
        (_col("Ready"), lambda o: f"{_get(o, 'status', 'readyReplicas', default=0)}/"
                                  f"{_get(o, 'spec', 'replicas', default=0)}"),
        (_col("Up-to-date", "integer"), lambda o: _get(o, "status", "updatedReplicas", default=0)),
        (_col("Available", "integer"),
         lambda o: _get(o, "status", "availableReplicas", default=0)),
        AGE,
    ],
    "pods": [
        NAME,
        (_col("Ready"), _pod_ready),
        (_col("Status"), lambda o: _get(o, "status", "phase", default="Pending")),
        (_col("Restarts", "integer"), lambda o: sum(
            s.get("restartCount", 0) for s in _get(o, "status", "containerStatuses", default=[])
        )),
        AGE,
    ],
    "services": [
        NAME,
        (_col("Type"), lambda o: _get(o, "spec", "type", default="ClusterIP")),
        (_col("Cluster-IP"), lambda o: _get(o, "spec", "clusterIP", default="<none>")),
        (_col("External-IP"), lambda o: "<none>"),
        (_col("Port(s)"), _ports),
        AGE,
    ],
    "namespaces": [NAME, (_col("Status"), lambda o: _get(o, "status", "phase", default="")), AGE],
    "customresourcedefinitions.apiextensions.k8s.io": [
        NAME,
        (_col("Created At", "date"), lambda o: o["metadata"].get("creationTimestamp")),
    ],
    "configmaps": [NAME, (_col("Data", "integer"), lambda o: len(o.get("data") or {})), AGE],
    "poddisruptionbudgets.policy": [
        NAME,
        (_col("Min Available"), lambda o: _get(o, "spec", "minAvailable", default="N/A")),
        (_col("Max Unavailable"), lambda o: _get(o, "spec", "maxUnavailable", default="N/A")),
        (_col("Allowed Disruptions", "integer"),
         lambda o: _get(o, "status", "disruptionsAllowed", default=0)),
        AGE,
    ],
}


def _printer_cell(col: dict[str, Any], obj: dict[str, Any]) -> Any:
    values = jsonpath(obj, col.get("jsonPath", ""))
    if not values:
        return None
    value = values[0]
    if col.get("type") == "date" and isinstance(value, str):
        return age(value)
    if isinstance(value, dict | list):
        return json.dumps(value)
    return value


def columns(rt: ResourceType) -> list[Column]:
    if rt.crd is not None:
        cols: list[Column] = [NAME]
        has_age = False
        for pc in rt.printer_columns:
            cols.append((
                _col(pc["name"], pc.get("type", "string"), pc.get("format", ""),
                     pc.get("description", ""), pc.get("priority", 0)),
                functools.partial(_printer_cell, pc),
            ))
            has_age |= pc.get("jsonPath") == ".metadata.creationTimestamp"
        return cols if has_age else [*cols, AGE]
    return BUILTIN_COLUMNS.get(rt.key, [NAME, AGE])


def table(rt: ResourceType, objs: list[dict[str, Any]], resource_version: str,
          include: str = "Metadata") -> dict[str, Any]:
    cols = columns(rt)
    rows = []
    for obj in objs:
        row: dict[str, Any] = {"cells": [fn(obj) for _, fn in cols]}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [c for c, _ in cols],
        "rows": rows,
    }
