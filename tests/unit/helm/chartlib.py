"""Helpers for the chart tests: run the real helm binary, split and check rendered manifests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "poolpilot"
K8S_VERSION = "1.33.0"  # kubectl/helm in .cache/bin are 1.33 / 3.18


def tool(name: str) -> str:
    """A binary from PATH or ./dev setup's .cache/bin; skip (locally) or fail (CI) without it."""
    found = shutil.which(name) or shutil.which(name, path=str(ROOT / ".cache" / "bin"))
    if found:
        return found
    message = f"{name} is not installed; run ./dev setup"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([tool("helm"), *args], capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def load_all(text: str) -> list[dict[str, Any]]:
    """The documents of a multi-document YAML stream (empty ones dropped), parsed by libyaml:
    a chart's render with its CRDs and dashboards is 400 kB, which PyYAML's pure-Python
    parser takes over a second to read and libyaml a tenth of that, with the same result."""
    return [d for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d]


def render(values: dict[str, Any] | None = None, *, namespace: str = "poolpilot-system",
           release: str = "pp", tmp: Path | None = None,
           chart: Path = CHART) -> list[dict[str, Any]]:
    """`helm template` (with CRDs) of the chart (a directory or a packaged .tgz) -> the list
    of objects."""
    args = ["template", release, str(chart), "--namespace", namespace, "--include-crds",
            "--kube-version", K8S_VERSION]
    if values:
        assert tmp is not None
        path = tmp / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        args += ["--values", str(path)]
    return load_all(helm(*args).stdout)


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str, name_suffix: str) -> dict[str, Any]:
    found = [o for o in by_kind(objs, kind) if o["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {len(found)}"
    return found[0]


def restricted_violations(pod_spec: dict[str, Any]) -> list[str]:
    """What the restricted Pod Security Standard (v1.33) would reject in a pod spec."""
    problems = []
    psc = pod_spec.get("securityContext", {})
    if pod_spec.get("hostNetwork") or pod_spec.get("hostPID") or pod_spec.get("hostIPC"):
        problems.append("host namespaces")
    for v in pod_spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= {"configMap", "emptyDir", "projected", "secret", "downwardAPI",
                         "persistentVolumeClaim", "ephemeral", "csi"}:
            problems.append(f"volume {v['name']}: {kinds}")
    for c in pod_spec.get("containers", []) + pod_spec.get("initContainers", []):
        sc = c.get("securityContext", {})
        name = c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation must be false")
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        if sc.get("capabilities", {}).get("drop") != ["ALL"]:
            problems.append(f"{name}: capabilities must drop ALL")
        if set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds capabilities")
        if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            problems.append(f"{name}: runs as uid 0")
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile {seccomp}")
        for port in c.get("ports", []):
            if "hostPort" in port:
                problems.append(f"{name}: hostPort")
    return problems


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    if obj["kind"] == "Pod":
        spec: dict[str, Any] = obj["spec"]
        return spec
    if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        spec = obj["spec"]["template"]["spec"]
        return spec
    return None


def manifest_errors(objs: list[dict[str, Any]]) -> list[str]:
    """What the API server would refuse: built-in kinds against the Kubernetes schemas
    (strict), monitoring.coreos.com objects against their structural schemas, Kopf's peering
    objects against the CRD rendered with them."""
    import jsonschema
    import kubernetes_validate
    from monitoring_schemas import SCHEMAS
    from poolpilot.emulator import crd_validation

    crds = {o["metadata"]["name"]: o for o in by_kind(objs, "CustomResourceDefinition")}
    errors = []
    for obj in objs:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        group = obj["apiVersion"].split("/")[0]
        if group == "monitoring.coreos.com":
            try:
                jsonschema.validate(obj, SCHEMAS[obj["kind"]])
            except jsonschema.ValidationError as exc:
                errors.append(f"{name}: {exc.message}")
        elif group == "kopf.dev":
            crd = crds[f"{obj['kind'].lower()}s.kopf.dev"]
            body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
            _, problems = crd_validation.validate(crd, body)
            errors += [f"{name}: {p}" for p in problems]
        else:
            try:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{name}: {exc.message} at {list(exc.path)}")
    return errors
