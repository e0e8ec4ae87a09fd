"""The generated CRD as kubectl users see it, on the Kubernetes API emulator (its validation is
crd_validation: OpenAPI schema, list types and CEL with messageExpression): the API server's
message carries the real values, `kubectl get` has an Engine column for Aggregated pools and
`-o wide` columns, and pool names that would make invalid child names are refused."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from poolpilot.emulator.server import KubeEmulator
from poolpilot.testkit.operator import Kubectl, install

pytestmark = pytest.mark.adapter
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    emu = KubeEmulator()
    with emu.running():
        k = Kubectl(emu.write_kubeconfig(tmp_path_factory.mktemp("crd") / "kubeconfig"))
        install(k)
        k("create", "namespace", "serving")
        yield k


def example(name: str, **spec: Any) -> dict[str, Any]:
    pool: dict[str, Any] = yaml.safe_load((ROOT / "examples/small-aggregated.yaml").read_text())
    pool["metadata"] = {"name": name, "namespace": "serving"}
    pool["spec"].update(spec)
    return pool


def failing(kubectl: Kubectl, *args: str, stdin: str | None = None) -> str:
    """kubectl's error output for a command that must fail."""
    proc = subprocess.run([kubectl.binary, "--kubeconfig", kubectl.kubeconfig, *args],
                          input=stdin, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0, proc.stdout
    return proc.stderr


def refused(kubectl: Kubectl, pool: dict[str, Any]) -> str:
    err = failing(kubectl, "apply", "-f", "-", stdin=yaml.safe_dump(pool))
    assert kubectl.get("ipool", pool["metadata"]["name"], "serving") is None
    return err


def test_api_server_message_has_the_real_values(kubectl: Kubectl) -> None:
    err = refused(kubectl, example("bounds", engine={"replicas": 1, "minReplicas": 5,
                                                      "maxReplicas": 3}))
    assert "spec.engine.maxReplicas" in err and "must be >= minReplicas (5)" in err
    assert "must be within [minReplicas, maxReplicas] (5..3)" in err
    assert "{minReplicas}" not in err and "{maxReplicas}" not in err


@pytest.mark.parametrize(
    ("name", "says"),
    [("team.chat", "must be a DNS-1035 label"), ("a" * 60, "at most 40 characters")],
    ids=["dotted", "60-characters"],
)
def test_pool_names_that_break_child_names_are_refused(kubectl: Kubectl, name: str,
                                                       says: str) -> None:
    err = refused(kubectl, example(name))
    assert "metadata.name" in err and says in err


def test_reserved_engine_arg_is_refused_naming_the_key(kubectl: Kubectl) -> None:
    err = refused(kubectl, example("tp", runtime={"engineArgs": {"tensorParallelSize": 4}}))
    assert "spec.runtime.engineArgs.tensorParallelSize" in err
    assert "set by poolpilot from the role's tensorParallelSize" in err


def columns(text: str) -> dict[str, str]:
    """kubectl's table (one row) by header, cut at the header's positions: empty cells stay."""
    header, row = text.splitlines()
    names = header.split()
    starts = [header.index(f" {n} ") + 1 if i else 0 for i, n in enumerate(names[:-1])]
    starts.append(header.rindex(names[-1]))
    ends = [*starts[1:], None]
    return {n: row[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)}


def test_engine_and_wide_columns(kubectl: Kubectl) -> None:
    pool = example("agg")
    kubectl.apply(pool)
    endpoint = "http://agg-router.serving.svc:8000/v1"
    status = {"engine": {"summary": "2/3"}, "endpoint": endpoint, "conditions": [
        {"type": "Ready", "status": "False", "reason": "PodsPending", "message": "engine 2/3",
         "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]}
    kubectl("patch", "ipool", "agg", "-n", "serving", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}))
    cells = columns(kubectl("get", "ipool", "agg", "-n", "serving"))
    # The Engine column only with -o wide: it would be blank on every Disaggregated pool.
    assert list(cells) == ["NAME", "MODE", "PREFILL", "DECODE", "TTFT", "READY", "REASON", "AGE"]
    assert (cells["MODE"], cells["PREFILL"], cells["READY"], cells["REASON"]) == (
        "Aggregated", "", "False", "PodsPending")
    wide = columns(kubectl("get", "ipool", "agg", "-n", "serving", "-o", "wide"))
    assert (wide["ENGINE"], wide["ENDPOINT"]) == ("2/3", endpoint)
    slo = pool["spec"].get("slo", {})
    assert (wide["MODEL"], wide["CONNECTOR"], wide["TTFT-SLO"], wide["ITL-SLO"]) == (
        pool["spec"]["model"]["name"], "NixlConnector",
        str(slo.get("ttft", {}).get("seconds", 1)), str(slo.get("itl", {}).get("seconds", 0.05)))
