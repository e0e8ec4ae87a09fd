"""The foundation's commands as a user runs them: `poolpilot crd`, `poolpilot validate`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from poolpilot import crd

ROOT = Path(__file__).parents[2]


def poolpilot(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "poolpilot.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )


def test_committed_crd_matches_the_models() -> None:
    result = poolpilot("crd", "--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_crd_check_fails_with_a_diff_when_the_file_drifts(tmp_path: Path) -> None:
    drifted = tmp_path / "inferencepool.yaml"
    text = (ROOT / "crds/inferencepool.yaml").read_text()
    drifted.write_text(text.replace("shortNames:\n    - ipool", "shortNames:\n    - ip"))
    result = poolpilot("crd", "--check", "--file", str(drifted))
    assert result.returncode == 1
    assert "-    - ip\n" in result.stdout and "+    - ipool\n" in result.stdout
    assert "poolpilot crd --write" in result.stderr


def test_crd_has_what_kubectl_users_rely_on() -> None:
    crd = yaml.load(poolpilot("crd").stdout, Loader=yaml.CSafeLoader)  # libyaml: 300 kB
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["ipool"] and names["categories"] == ["poolpilot"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = version["additionalPrinterColumns"]
    assert [c["name"] for c in columns if not c.get("priority")] == [
        "Mode", "Prefill", "Decode", "TTFT", "Ready", "Reason", "Age"]
    # `kubectl get -o wide` adds the aggregated engine role, where to send requests, what the
    # pool serves and its targets.
    assert {c["name"]: c["jsonPath"] for c in columns if c.get("priority") == 1} == {
        "Engine": ".status.engine.summary", "Endpoint": ".status.endpoint",
        "Model": ".spec.model.name", "Connector": ".spec.kvTransfer.connector",
        "TTFT-SLO": ".spec.slo.ttft.seconds", "ITL-SLO": ".spec.slo.itl.seconds"}
    root = version["schema"]["openAPIV3Schema"]
    slo = root["properties"]["spec"]["properties"]["slo"]
    assert "description" in slo and "description" in slo["properties"]["ttft"]
    conditions = root["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert conditions["items"]["required"][0] == "type"
    assert "self.metadata.name" in root["x-kubernetes-validations"][0]["rule"]


def test_generated_files_have_no_yaml_anchors() -> None:
    for path in (crd.CRD_PATH, crd.CHART_CRD_PATH):
        text = (ROOT / path).read_text()
        assert "&id0" not in text and "*id0" not in text, path


def test_validate_accepts_the_examples() -> None:
    examples = sorted(str(p) for p in (ROOT / "examples").glob("*.yaml"))
    assert len(examples) >= 4
    result = poolpilot("validate", *examples)
    assert result.returncode == 0, result.stderr


def test_validate_names_every_bad_field_and_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: poolpilot.dev/v1alpha1\nkind: InferencePool\nmetadata: {name: bad}\n"
        "spec:\n  model: {name: m}\n  decode: {minReplicas: 3, maxReplicas: 2, replicas: 2}\n"
        "  modee: Aggregated\n"
    )
    result = poolpilot("validate", str(bad))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert f"{bad}: spec.decode.maxReplicas: must be >= minReplicas (3); raise maxReplicas or " \
           "lower minReplicas" in lines
    assert f"{bad}: spec.modee: unknown field; did you mean mode?" in lines


def test_validate_reports_unreadable_files(tmp_path: Path) -> None:
    result = poolpilot("validate", str(tmp_path / "missing.yaml"))
    assert result.returncode == 1 and "missing.yaml" in result.stderr
