"""What RBAC a component needs, from the calls it made (the emulator's request log), against
what the chart (or the operator, for the router) grants it.

Each request becomes the (apiGroup, resource[/subresource], verb) the API server's authorizer
checks; a server-side apply that creates its object (201) is checked for `create` as well.
Discovery and other non-resource URLs are open to every authenticated user and left out.
`compare` reports calls the rules do not allow (a 403 in a real cluster) and rules no call used
(more privilege than the code needs).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

Attr = tuple[str, str, str]  # (apiGroup, resource, verb)


def attributes(method: str, path: str, query: dict[str, str]) -> Attr | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, rest = "", parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return None  # /version, /api, /apis, /apis/<group>/<version>: discovery
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]  # a namespaced resource
    resource, name, sub = rest[0], (rest[1:2] or [None])[0], (rest[2:3] or [None])[0]
    if sub:
        resource = f"{resource}/{sub}"
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method)
    if method == "GET":
        verb = "get" if name else ("watch" if query.get("watch") in ("1", "true") else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    if verb is None:
        return None
    return group, resource, verb


def called(requests: Iterable[Any], agents: tuple[str, ...]) -> set[Attr]:
    """The attributes of every request whose User-Agent starts with one of `agents`."""
    out = set()
    for r in requests:
        if r.user_agent.startswith(agents):
            attr = attributes(r.method, r.path, r.query)
            if attr is not None:
                out.add(attr)
                if attr[2] == "patch" and r.status == 201:
                    out.add((attr[0], attr[1], "create"))
    return out


def granted(rules: Iterable[dict[str, Any]]) -> set[Attr]:
    return {(g, res, verb) for rule in rules for g in rule["apiGroups"]
            for res in rule["resources"] for verb in rule["verbs"]}


def compare(calls: set[Attr], rules: Iterable[dict[str, Any]],
            needed_without_a_call: set[Attr] = frozenset()) -> tuple[set[Attr], set[Attr]]:
    """(calls the rules refuse, rules nothing needs)."""
    allowed = granted(rules)
    return calls - allowed, allowed - calls - needed_without_a_call


def chart_rules(*suffixes: str) -> list[dict[str, Any]]:
    """The rules of the chart's (Cluster)Roles whose names end with one of `suffixes`, with the
    default values (cluster-wide)."""
    helm = ROOT / ".cache" / "bin" / "helm"
    if not helm.exists():
        pytest.skip("helm is not installed; run ./dev setup")
    out = subprocess.run([str(helm), "template", "pp", str(ROOT / "charts" / "poolpilot"),
                          "-n", "poolpilot-system"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    rules: list[dict[str, Any]] = []
    for obj in yaml.safe_load_all(out):
        if obj and obj["kind"] in ("ClusterRole", "Role") and obj["metadata"][
                "name"].endswith(suffixes):
            rules += obj["rules"]
    return rules
