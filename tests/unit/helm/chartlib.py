"""Helpers for the chart tests: run the real helm binary, split and check rendered manifests."""

from __future__ import annotations

import functools
import marshal
import os
import re
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


# A line that is just `---` starts a new document wherever it stands (YAML forbids it inside a
# scalar), so a stream parses the same split there as whole.
_DOCUMENT_START = re.compile(r"^---[ \t]*$", re.MULTILINE)


@functools.cache
def _parsed(chunk: str) -> bytes | None:
    """The documents of one piece of a stream, marshalled (None: a type marshal lacks)."""
    docs = list(yaml.load_all(chunk, Loader=yaml.CSafeLoader))
    try:
        return marshal.dumps(docs)
    except ValueError:
        return None


def load_all(text: str) -> list[dict[str, Any]]:
    """The documents of a multi-document YAML stream (empty ones dropped), parsed by libyaml:
    a chart's render with its CRDs and dashboards is 400 kB, which PyYAML's pure-Python
    parser takes over a second to read and libyaml a tenth of that, with the same result.
    Most of a render (the CRDs, the dashboards) is the same from one set of values to the
    next, so each document's text is parsed once and later calls get a fresh copy of it."""
    docs: list[Any] = []
    for chunk in _DOCUMENT_START.split(text):
        blob = _parsed(chunk)
        docs += (list(yaml.load_all(chunk, Loader=yaml.CSafeLoader)) if blob is None
                 else marshal.loads(blob))
    return [d for d in docs if d]


# `helm template` of the repository's chart by its arguments and values file's text: the same
# give the same output, and many tests render the defaults or the same base values again.
_TEMPLATES: dict[tuple[tuple[str, ...], str | None], str] = {}


def render(values: dict[str, Any] | None = None, *, namespace: str = "poolpilot-system",
           release: str = "pp", tmp: Path | None = None,
           chart: Path = CHART) -> list[dict[str, Any]]:
    """`helm template` (with CRDs) of the chart (a directory or a packaged .tgz) -> the list
    of objects."""
    args = ["template", release, str(chart), "--namespace", namespace, "--include-crds",
            "--kube-version", K8S_VERSION]
    text = None
    if values:
        assert tmp is not None
        path = tmp / "values.yaml"
        text = yaml.safe_dump(values)
        path.write_text(text)
        args += ["--values", str(path)]
    if chart != CHART:  # a chart a test built or packaged can change between two renders
        return load_all(helm(*args).stdout)
    key = (tuple(args[:-2] if text else args), text)
    if key not in _TEMPLATES:
        _TEMPLATES[key] = helm(*args).stdout
    return load_all(_TEMPLATES[key])


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
    from poolpilot.emulator import crd_validation

    crds = {o["metadata"]["name"]: o for o in by_kind(objs, "CustomResourceDefinition")}
    errors = []
    for obj in objs:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["apiVersion"].split("/")[0] == "kopf.dev":
            crd = crds[f"{obj['kind'].lower()}s.kopf.dev"]
            body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
            _, problems = crd_validation.validate(crd, body)
            errors += [f"{name}: {p}" for p in problems]
            continue
        try:
            key = marshal.dumps(obj)
        except ValueError:  # a type marshal lacks: checked afresh
            errors += [f"{name}: {e}" for e in _schema_errors(obj)]
            continue
        errors += [f"{name}: {e}" for e in _cached_schema_errors(key)]
    return errors


@functools.cache
def _cached_schema_errors(obj: bytes) -> tuple[str, ...]:
    """The objects of one render are mostly those of the last (the CRDs above all, whose
    schema check is the slow part): each distinct object is checked once."""
    return _schema_errors(marshal.loads(obj))


def _schema_errors(obj: dict[str, Any]) -> tuple[str, ...]:
    """A built-in or monitoring.coreos.com object's errors against its schema."""
    import jsonschema
    import kubernetes_validate
    from monitoring_schemas import SCHEMAS

    if obj["apiVersion"].split("/")[0] == "monitoring.coreos.com":
        try:
            jsonschema.validate(obj, SCHEMAS[obj["kind"]])
        except jsonschema.ValidationError as exc:
            return (exc.message,)
        return ()
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return (f"{exc.message} at {list(exc.path)}",)
    return ()
