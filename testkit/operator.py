"""Helpers to run the operator against a cluster (the emulator or a real one) from tests and
the benchmark: real kubectl, the CRDs, an in-thread operator (Kopf's KopfRunner), polling."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import kopf
import yaml
from kopf.testing import KopfRunner
from poolpilot.operator import peering
from poolpilot.operator.handlers import OperatorConfig, register
from poolpilot.operator.metrics import OperatorMetrics
from poolpilot.testkit.polling import wait_for

from poolpilot import crd

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]


def kubectl_binary() -> str:
    """kubectl from ./dev setup (.cache/bin) or PATH."""
    local = ROOT / ".cache" / "bin" / "kubectl"
    if local.exists():
        return str(local)
    found = shutil.which("kubectl")
    if found is None:
        raise FileNotFoundError("kubectl not found: run ./dev setup (installs .cache/bin/kubectl)")
    return found


class Kubectl:
    """Real kubectl against one kubeconfig."""

    def __init__(self, kubeconfig: Path | str) -> None:
        self.kubeconfig = str(kubeconfig)
        self.binary = kubectl_binary()

    def __call__(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [self.binary, "--kubeconfig", self.kubeconfig, *args],
            input=stdin, capture_output=True, text=True, timeout=60,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def apply(self, *objs: dict[str, Any], server_side: bool = False) -> None:
        extra = ["--server-side", "--force-conflicts"] if server_side else []
        self("apply", *extra, "-f", "-", stdin=yaml.safe_dump_all(list(objs)))

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        ns = ["-n", namespace] if namespace else []
        out = self("get", kind, name, *ns, "-o", "json", "--ignore-not-found")
        return json.loads(out) if out.strip() else None

    def list(self, kind: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        sel = ["-l", selector] if selector else []
        items: list[dict[str, Any]] = json.loads(
            self("get", kind, "-n", namespace, *sel, "-o", "json")
        )["items"]
        return items


def crd_without_validation_rules() -> dict[str, Any]:
    """The InferencePool CRD without its CEL rules: lets tests apply a spec the API server
    would normally reject, as on a cluster where the CRD is older or validation is off."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "x-kubernetes-validations"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    stripped: dict[str, Any] = strip(copy.deepcopy(crd.build_crd()))
    return stripped


def monitoring_crds() -> list[dict[str, Any]]:
    """Minimal ServiceMonitor/PodMonitor CRDs (what discovery needs to see the group)."""
    out = []
    for kind in ("ServiceMonitor", "PodMonitor"):
        plural = kind.lower() + "s"
        out.append({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {
                "group": "monitoring.coreos.com", "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                    "openAPIV3Schema": {"type": "object",
                                        "x-kubernetes-preserve-unknown-fields": True}}}],
            },
        })
    return out


def install(kubectl: Kubectl, *, strict_crd: bool = True, monitoring: bool = False) -> None:
    """The InferencePool CRD, Kopf's peering CRDs and the cluster-wide peering object."""
    pool_crd = crd.build_crd() if strict_crd else crd_without_validation_rules()
    kubectl.apply(pool_crd, *peering.peering_crds(), server_side=True)
    if monitoring:
        kubectl.apply(*monitoring_crds(), server_side=True)
    wait_for(lambda: "inferencepools" in kubectl("api-resources", "--api-group=poolpilot.dev"),
             what="the InferencePool CRD to be served")
    wait_for(lambda: "clusterkopfpeerings" in kubectl("api-resources", "--api-group=kopf.dev"),
             what="the peering CRDs to be served")
    kubectl.apply(peering.peering_object())


@contextlib.contextmanager
def running_operator(
    kubeconfig: Path | str,
    config: OperatorConfig,
    *,
    standalone: bool = True,
    priority: int = 0,
    namespaces: tuple[str, ...] = (),
    liveness: str | None = None,
    metrics: OperatorMetrics | None = None,
) -> Iterator[KopfRunner]:
    """The operator in a thread (kopf.testing.KopfRunner), as `poolpilot operator` runs it."""
    os.environ["KUBECONFIG"] = str(kubeconfig)
    registry = kopf.OperatorRegistry()
    register(registry, config, metrics)
    args = ["run", "--standalone" if standalone else f"--peering={config.peering_name}",
            f"--priority={priority}"]
    args += [f"--namespace={ns}" for ns in namespaces] or ["--all-namespaces"]
    if liveness:
        args.append(f"--liveness={liveness}")
    with KopfRunner(args, registry=registry, settings=kopf.OperatorSettings(),
                    timeout=30) as runner:
        yield runner
