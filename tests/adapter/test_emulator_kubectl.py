"""Real kubectl 1.33 against the Kubernetes API emulator: apply (client- and server-side),
get with the CRD's printer columns, scale, delete, and validation errors naming the field."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from poolpilot.emulator.server import KubeEmulator

pytestmark = pytest.mark.adapter

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".cache/bin/kubectl"
if not KUBECTL.exists() and shutil.which("kubectl"):
    KUBECTL = Path(shutil.which("kubectl") or "kubectl")
if not KUBECTL.exists():
    pytest.skip("kubectl is not installed: run ./dev setup (it puts kubectl 1.33 in .cache/bin)",
                allow_module_level=True)


@dataclass
class Kubectl:
    emu: KubeEmulator
    kubeconfig: Path
    cache: Path

    def run(self, *args: str, ok: bool = True, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(self.kubeconfig), "--cache-dir",
             str(self.cache), *args],
            capture_output=True, text=True, timeout=60, input=stdin,
        )
        if ok and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr}")
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    tmp = tmp_path_factory.mktemp("kubectl")
    emu = KubeEmulator()
    with emu.running():
        k = Kubectl(emu, emu.write_kubeconfig(tmp / "kubeconfig"), tmp / "cache")
        k.run("apply", "-f", str(ROOT / "crds/inferencepool.yaml"))
        yield k


def deployment_yaml(name: str, ns: str, replicas: int = 2, image: str = "vllm:1") -> str:
    return yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "engine", "image": image}]}}},
    })


def test_apply_example_and_get_printer_columns(kubectl: Kubectl) -> None:
    out = kubectl.run("apply", "-f", str(ROOT / "examples/llama-8b-disaggregated.yaml")).stdout
    assert out.strip() == "inferencepool.poolpilot.dev/llama-8b created"
    again = kubectl.run("apply", "-f", str(ROOT / "examples/llama-8b-disaggregated.yaml"))
    assert again.stdout.strip() == "inferencepool.poolpilot.dev/llama-8b unchanged"
    kubectl.emu.patch("ipool", "llama-8b", {"status": {
        "prefill": {"summary": "1/1"}, "decode": {"summary": "1/2"},
        "conditions": [{"type": "Ready", "status": "False", "reason": "PodsPending",
                        "message": "decode 1/2 ready", "lastTransitionTime":
                        "2026-01-01T00:00:00Z"}]}}, namespace="serving", subresource="status")
    table = kubectl.run("get", "ipool", "-A").stdout.splitlines()
    assert table[0].split() == ["NAMESPACE", "NAME", "MODE", "PREFILL", "DECODE", "TTFT",
                                "READY", "REASON", "AGE"]
    row = table[1].split()
    assert row[:5] == ["serving", "llama-8b", "Disaggregated", "1/1", "1/2"]
    assert row[5:7] == ["False", "PodsPending"]  # TTFT is empty until the autoscaler measures it
    listed = kubectl.json("get", "inferencepools.poolpilot.dev", "-n", "serving")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["llama-8b"]
    by_category = kubectl.run("get", "poolpilot", "-n", "serving").stdout
    assert "llama-8b" in by_category


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("decode", "minReplicas"), 20, "spec.decode.maxReplicas"),
        (("mode",), "Sideways", "spec.mode"),
    ],
    ids=["decode-min-above-max", "unknown-mode"],
)
def test_invalid_pool_is_rejected_naming_the_field(kubectl: Kubectl, tmp_path: Path,
                                                   path: tuple[str, ...], value: object,
                                                   field: str) -> None:
    pool = yaml.safe_load((ROOT / "examples/llama-8b-disaggregated.yaml").read_text())
    pool["metadata"] = {"name": "bad", "namespace": "serving"}
    node = pool["spec"]
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump(pool))
    proc = kubectl.run("apply", "-f", str(manifest), ok=False)
    assert proc.returncode != 0
    assert 'The InferencePool "bad" is invalid' in proc.stderr
    assert field in proc.stderr
    assert kubectl.emu.get("ipool", "bad", "serving") is None


def test_unknown_field_is_rejected_by_strict_validation(kubectl: Kubectl, tmp_path: Path) -> None:
    pool = yaml.safe_load((ROOT / "examples/small-aggregated.yaml").read_text())
    pool["metadata"]["name"] = "typo"
    pool["spec"]["replicaz"] = 3
    manifest = tmp_path / "typo.yaml"
    manifest.write_text(yaml.safe_dump(pool))
    proc = kubectl.run("apply", "-f", str(manifest), ok=False)
    assert proc.returncode != 0 and "spec.replicaz" in proc.stderr


def test_server_side_apply_conflicts_and_force(kubectl: Kubectl, tmp_path: Path) -> None:
    manifest = tmp_path / "d.yaml"
    manifest.write_text(deployment_yaml("ssa", "apps-ns"))
    assert "serverside-applied" in kubectl.run("apply", "--server-side", "-f",
                                               str(manifest)).stdout
    kubectl.run("scale", "deployment/ssa", "-n", "apps-ns", "--replicas=4")
    proc = kubectl.run("apply", "--server-side", "-f", str(manifest), ok=False)
    assert proc.returncode != 0
    assert "conflict" in proc.stderr.lower() and ".spec.replicas" in proc.stderr
    kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(manifest))
    dep = kubectl.json("get", "deployment", "ssa", "-n", "apps-ns", "--show-managed-fields")
    assert dep["spec"]["replicas"] == 2
    managers = {m["manager"] for m in dep["metadata"]["managedFields"]}
    assert "kubectl" in managers


def test_scale_get_and_delete_deployment(kubectl: Kubectl, tmp_path: Path) -> None:
    manifest = tmp_path / "d.yaml"
    manifest.write_text(deployment_yaml("web", "web-ns"))
    kubectl.run("apply", "-f", str(manifest))
    assert kubectl.run("scale", "deployment", "web", "-n", "web-ns",
                       "--replicas=5").stdout.strip() == "deployment.apps/web scaled"
    dep = kubectl.json("get", "deployment", "web", "-n", "web-ns")
    assert (dep["spec"]["replicas"], dep["metadata"]["generation"]) == (5, 2)
    header = kubectl.run("get", "deploy", "-n", "web-ns").stdout.splitlines()[0].split()
    assert header == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]
    # Client-side apply with a new image: a strategic merge patch on the container by name.
    manifest.write_text(deployment_yaml("web", "web-ns", replicas=5, image="vllm:2"))
    assert "configured" in kubectl.run("apply", "-f", str(manifest)).stdout
    dep = kubectl.json("get", "deployment", "web", "-n", "web-ns")
    assert dep["spec"]["template"]["spec"]["containers"] == [{"name": "engine",
                                                             "image": "vllm:2"}]
    kubectl.run("delete", "-f", str(manifest))
    assert "No resources found" in kubectl.run("get", "deploy", "-n", "web-ns").stderr


def test_delete_pool_and_namespace(kubectl: Kubectl) -> None:
    kubectl.run("apply", "-f", str(ROOT / "examples/small-aggregated.yaml"))
    meta = yaml.safe_load((ROOT / "examples/small-aggregated.yaml").read_text())["metadata"]
    ns, name = meta.get("namespace", "default"), meta["name"]
    # Generator commands send protobuf bodies (decoded for these kinds).
    kubectl.run("create", "namespace", "doomed")
    kubectl.run("create", "configmap", "c", "-n", "doomed", "--from-literal=a=b")
    kubectl.run("create", "secret", "generic", "s", "-n", "doomed", "--from-literal=k=v")
    kubectl.run("create", "serviceaccount", "robot", "-n", "doomed")
    assert kubectl.json("get", "secret", "s", "-n", "doomed")["data"] == {"k": "dg=="}
    assert kubectl.json("get", "serviceaccount", "robot", "-n", "doomed")["kind"] == \
        "ServiceAccount"
    assert kubectl.json("get", "configmap", "c", "-n", "doomed")["data"] == {"a": "b"}
    kubectl.run("delete", "namespace", "doomed")
    assert kubectl.run("get", "namespace", "doomed", ok=False).returncode != 0
    kubectl.run("delete", "-f", str(ROOT / "examples/small-aggregated.yaml"))
    names = kubectl.run("get", "ipool", "-n", ns, "-o", "name").stdout.split()
    assert f"inferencepool.poolpilot.dev/{name}" not in names


def test_generator_for_an_undecoded_kind_says_what_to_do(kubectl: Kubectl) -> None:
    proc = kubectl.run("create", "deployment", "d", "--image=x", ok=False)
    assert proc.returncode != 0
    assert "send Deployment as application/json" in proc.stderr


HELM = ROOT / ".cache/bin/helm"


@pytest.mark.skipif(not HELM.exists(), reason="helm is not installed: run ./dev setup")
def test_helm_install_upgrade_uninstall(kubectl: Kubectl) -> None:
    def helm(*args: str) -> str:
        proc = subprocess.run([str(HELM), "--kubeconfig", str(kubectl.kubeconfig), *args],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    chart = str(ROOT / "charts/poolpilot")
    # The module's cluster has the CRD from `kubectl apply -f crds/`: the chart, which templates
    # the CRD, stops before changing anything and names both ways out (docs/helm.md, Install).
    refused = subprocess.run([str(HELM), "--kubeconfig", str(kubectl.kubeconfig), "install", "pp",
                              chart, "-n", "pp-system", "--create-namespace"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0
    assert "--set crds.install=false" in refused.stderr, refused.stderr
    assert "kubectl annotate crd inferencepools.poolpilot.dev meta.helm.sh/release-name=pp " \
           "meta.helm.sh/release-namespace=pp-system" in refused.stderr, refused.stderr
    assert helm("list", "-n", "pp-system", "-q").strip() == ""
    helm("install", "pp", chart, "-n", "pp-system", "--create-namespace",
         "--set", "crds.install=false")
    helm("upgrade", "pp", chart, "-n", "pp-system", "--reuse-values",
         "--set", "operator.replicas=3")
    history = helm("history", "pp", "-n", "pp-system").splitlines()
    assert [line.split()[0] for line in history[1:]] == ["1", "2"]
    deploys = kubectl.json("get", "deployments", "-n", "pp-system")["items"]
    assert 3 in [d["spec"]["replicas"] for d in deploys]
    helm("uninstall", "pp", "-n", "pp-system")
    assert kubectl.json("get", "deployments,secrets", "-n", "pp-system")["items"] == []
    # The CRD was never the release's: it and its pools outlive it.
    assert kubectl.run("get", "crd", "inferencepools.poolpilot.dev", "-o", "name").stdout.strip()
