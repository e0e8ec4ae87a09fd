"""`poolpilot render FILE`: every object the operator would create, like `helm template`.

Uses the same pure builders as the operator; needs no cluster. Owner references are left out
(the pool's uid exists only in a cluster).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from poolpilot.operator import builders, gateway_objects, labels, peering

from poolpilot import api, fileerrors
from poolpilot.validate import (
    InvalidFile,
    InvalidPool,
    duplicate_pools,
    located_pools,
    parse_pool,
)


def pools_from_file(path: Path, default_namespace: str = "default") -> list[builders.Pool]:
    """Parse every InferencePool in a manifest file; raises InvalidFile (unreadable file) or
    InvalidPool (naming every bad field, or two pools of one namespace and name)."""
    pools = []
    labels = []
    for label, where, doc in located_pools(path):
        try:
            parsed = parse_pool(doc)
        except InvalidPool as exc:
            raise InvalidPool([where + e for e in exc.errors]) from None
        pools.append(
            builders.Pool(
                name=parsed.metadata.name,
                namespace=parsed.metadata.namespace or default_namespace,
                spec=parsed.spec,
            )
        )
        labels.append(label)
    if not pools:
        raise InvalidPool([f"no {api.KIND} document found"])
    # (after the default namespace: a pool that names none is in it)
    twice = duplicate_pools([(label, p.namespace, p.name)
                             for label, p in zip(labels, pools, strict=True)])
    if twice:
        raise InvalidPool(twice)
    return pools


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the router's config) as literal blocks, readable like a manifest;
    values used twice written out again, never as &id001 anchors; strings that any reader of
    the manifest would take for something else quoted (below)."""

    def ignore_aliases(self, data: object) -> bool:
        return True


# PyYAML quotes the strings that YAML 1.1 reads as other types; these are the ones it does not,
# which YAML 1.2, kubectl's go-yaml (sigs.k8s.io/yaml) or poolpilot's own loader read as
# numbers (1e3, 1.5e3, .5e3, 089, 0o17, 0X1F), booleans (y, n) or timestamps (2024-1-2): left
# plain, `render | kubectl apply` would send them as such and the API server refuse them.
_NOT_STRINGS = [
    ("tag:yaml.org,2002:float",
     r"[-+]?(?:\.[0-9_]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9_]+)?", "-+.0123456789"),
    ("tag:yaml.org,2002:int", r"[-+]?0(?:[oO][0-7_]+|[xX][0-9a-fA-F_]+|[bB][01_]+)", "-+0"),
    ("tag:yaml.org,2002:bool", r"[yYnN]", "yYnN"),
    ("tag:yaml.org,2002:timestamp", r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt ].*)?", "0123456789"),
]
for _tag, _pattern, _first in _NOT_STRINGS:
    _Dumper.add_implicit_resolver(_tag, re.compile(f"^(?:{_pattern})$"), list(_first))


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(objs: list[dict[str, Any]]) -> str:
    return yaml.dump_all(objs, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


def render(pools: list[builders.Pool], caps: builders.Capabilities, output: str) -> str:
    objs: list[dict[str, Any]] = [o for p in pools for o in builders.build_children(p, caps)]
    if output == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}, indent=2) + "\n"
    return to_yaml(objs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, nargs="?",
                        help="manifest with one or more InferencePools")
    parser.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml",
                        help="output format (default yaml)")
    parser.add_argument(
        "--prometheus-operator",
        action="store_true",
        help="render ServiceMonitor/PodMonitor (as when monitoring.coreos.com is installed) "
        "instead of prometheus.io scrape annotations",
    )
    parser.add_argument(
        "--monitor-label", action="append", default=[], metavar="KEY=VALUE",
        help="with --prometheus-operator: an extra label on the monitors, as the operator's "
        "--monitor-label (e.g. release=kube-prometheus-stack); repeatable",
    )
    parser.add_argument(
        "--no-rbac", action="store_true", help="leave out the router's Role and RoleBinding"
    )
    parser.add_argument(
        "--network-policies", action=argparse.BooleanOptionalAction, default=True,
        help="as the operator's: NetworkPolicies for pools whose spec.networkPolicy.enabled "
        "is not set (default: on; --no-network-policies as the operator's)",
    )
    parser.add_argument(
        "-n", "--namespace", default="default", help="namespace for pools that name none"
    )
    parser.add_argument(
        "--peering-crds", action="store_true",
        help="also print Kopf's peering CRDs and the peering object (for two-replica HA)",
    )


def run(args: argparse.Namespace) -> int:
    if args.file is None:
        if not args.peering_crds:
            print("poolpilot render: give a FILE (or --peering-crds)", file=sys.stderr)
            return 2
        sys.stdout.write(_peering(args.output))
        return 0
    try:
        pools = pools_from_file(args.file, args.namespace)
    except OSError as exc:
        print(f"poolpilot render: {args.file}: {fileerrors.describe(exc)}", file=sys.stderr)
        return 2
    except (InvalidFile, InvalidPool) as exc:
        errors = exc.errors if isinstance(exc, InvalidPool) else [str(exc)]
        for err in errors:
            print(f"{args.file}: {err}", file=sys.stderr)
        return 1
    try:
        monitor_labels = labels.parse_all(args.monitor_label)
    except ValueError as exc:
        print(f"poolpilot render: --monitor-label {exc}", file=sys.stderr)
        return 2
    caps = builders.Capabilities(monitoring=args.prometheus_operator, rbac=not args.no_rbac,
                                 monitor_labels=monitor_labels,
                                 network_policies=args.network_policies)
    sys.stdout.write(render(pools, caps, args.output))
    if any(p.spec.gateway is not None and p.spec.gateway.inference_pool for p in pools):
        # On stderr: stdout stays a manifest to pipe into kubectl.
        print(f"poolpilot render: note: {gateway_objects.KIND_CLASH_WARNING}", file=sys.stderr)
    if args.peering_crds:
        sys.stdout.write(("---\n" if args.output == "yaml" else "") + _peering(args.output))
    return 0


def _peering(output: str) -> str:
    objs = [*peering.peering_crds(), peering.peering_object()]
    if output == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}, indent=2) + "\n"
    return to_yaml(objs)
