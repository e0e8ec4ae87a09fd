"""The quick start of docs/helm.md, as written, against the Kubernetes API emulator: its shell
commands are read from the document and run with real helm and kubectl (`helm install`, the
namespace, the Secret, the pool piped through sed), and the ones that need a real cluster,
Docker or the network (building and pushing images, kube-prometheus-stack, port-forward,
curl) are checked against what the others created: one image name scheme, the namespace and
Secret the example names, the router Service and model the curl reaches, the dashboards where
Grafana's sidecar looks. NOTES.txt (printed by the real `helm install`) must give the same
commands. A command this test does not know fails it: extend the table when the quick start
grows."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from poolpilot.emulator.server import KubeEmulator

from poolpilot import names

pytestmark = pytest.mark.adapter

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".cache" / "bin"
HF_TOKEN = "hf_quickstart_test"
EXAMPLE = yaml.safe_load((ROOT / "examples/llama-8b-disaggregated.yaml").read_text())
APP_VERSION = yaml.safe_load((ROOT / "charts/poolpilot/Chart.yaml").read_text())["appVersion"]

if not (BIN / "helm").exists() or not (BIN / "kubectl").exists():
    pytest.skip("helm and kubectl are not installed: run ./dev setup", allow_module_level=True)


def quickstart_commands() -> list[str]:
    """The shell commands of docs/helm.md's quick start, in order (continuation lines joined,
    a `for ... done` loop as one command, comments dropped)."""
    doc = (ROOT / "docs/helm.md").read_text()
    section = re.search(r"^## Quick start on a real cluster\n(.*?)^## ", doc, re.S | re.M)
    assert section, "docs/helm.md lost its '## Quick start on a real cluster' section"
    commands: list[str] = []
    for block in re.findall(r"^```bash\n(.*?)^```", section[1], re.S | re.M):
        text = re.sub(r"\\\n\s*", "", block)
        lines = [line for line in text.splitlines() if line.strip()]
        while lines:
            line = lines.pop(0)
            if line.startswith("for "):
                loop = [line]
                while not loop[-1].strip().startswith("done"):
                    loop.append(lines.pop(0))
                commands.append("\n".join(loop))
            else:
                commands.append(_without_comment(line).strip())
    return commands


def _without_comment(line: str) -> str:
    """The command without its trailing `  # comment` (the quick start's commands hold no
    other '#')."""
    return re.sub(r"\s+#\s.*$", "", line)


@dataclass
class Cluster:
    """The emulator and an environment like the reader's shell."""

    kubeconfig: Path
    env: dict[str, str]
    outputs: dict[str, str] = field(default_factory=dict)

    def sh(self, command: str) -> str:
        r = subprocess.run(["bash", "-c", f"set -eo pipefail\n{command}"], cwd=ROOT,
                           env=self.env, capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, f"{command}\n{r.stdout}\n{r.stderr}"
        self.outputs[command] = r.stdout
        return r.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.sh(f"kubectl get {shlex.join(args)} -o json"))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    emu = KubeEmulator()
    with emu.running():
        kubeconfig = emu.write_kubeconfig(tmp_path / "kubeconfig")
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
               "KUBECONFIG": str(kubeconfig), "HF_TOKEN": HF_TOKEN,
               "HELM_CACHE_HOME": str(tmp_path / "helm-cache"),
               "HELM_CONFIG_HOME": str(tmp_path / "helm-config")}
        yield Cluster(kubeconfig, env)


def kube_prometheus_stack(cluster: Cluster, tmp_path: Path) -> None:
    """What `helm install kube-prometheus-stack ... -n monitoring --create-namespace` leaves
    that poolpilot's chart relies on: the namespace and the monitoring.coreos.com CRDs."""
    crds = []
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        plural = kind.lower() + "s"
        crds.append({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                         "openAPIV3Schema": {"type": "object",
                                             "x-kubernetes-preserve-unknown-fields": True}}}]},
        })
    path = tmp_path / "monitoring-crds.yaml"
    path.write_text(yaml.safe_dump_all(crds))
    cluster.sh(f"kubectl apply -f {path} && kubectl create namespace monitoring")


def test_quickstart_commands_line_up(cluster: Cluster, tmp_path: Path) -> None:
    commands = quickstart_commands()
    pool_ns, pool_name = EXAMPLE["metadata"]["namespace"], EXAMPLE["metadata"]["name"]
    built: dict[str, str] = {}  # image tag -> Dockerfile
    pushed: list[str] = []
    checks: list[tuple[str, str]] = []  # (kind, command) checked once everything ran
    for command in commands:
        argv = command.split()
        if argv[:1] == ["export"]:
            key, _, value = argv[1].partition("=")
            cluster.env[key] = value
        elif argv[:3] == ["helm", "repo", "add"]:
            pass  # the network; the chart it adds is emulated below
        elif argv[:3] == ["helm", "install", "kube-prometheus-stack"]:
            assert "-n monitoring" in command and "--create-namespace" in command
            for selector in ("podMonitor", "serviceMonitor", "rule"):
                assert f"prometheus.prometheusSpec.{selector}SelectorNilUsesHelmValues=false" \
                    in command, f"kube-prometheus-stack would not select poolpilot's {selector}s"
            kube_prometheus_stack(cluster, tmp_path)
        elif argv[:2] == ["docker", "build"]:
            tag = argv[argv.index("-t") + 1]
            dockerfile = argv[argv.index("-f") + 1] if "-f" in argv else "Dockerfile"
            assert argv[-1] == "." and (ROOT / dockerfile).is_file()
            built[tag.replace("$REGISTRY", cluster.env["REGISTRY"])] = dockerfile
        elif argv[:2] == ["docker", "push"]:
            pushed.append(argv[2].replace("$REGISTRY", cluster.env["REGISTRY"]))
        elif (argv[:3] == ["helm", "install", "poolpilot"] or argv[:2] == ["kubectl", "create"]
              or argv[3:5] == ["create", "secret"]
              or (argv[0] == "sed" and command.endswith("| kubectl apply -f -"))):
            cluster.sh(command)  # what a cluster can take from this machine: run as written
        elif argv[:1] == ["kubectl"] and argv[3] == "get":
            # A watch never ends: the same get without -w.
            cluster.sh(" ".join(a for a in argv if a != "-w"))
        elif argv[:1] == ["kubectl"] and argv[3] == "port-forward":
            checks.append(("port-forward", command))
        elif argv[:2] == ["curl", "-N"]:
            checks.append(("curl", command))
        elif argv[0] == "for" and "charts/poolpilot/files/dashboards/*.json" in command:
            checks.append(("import", command))
        else:
            raise AssertionError(f"the quick start has a command this test does not know: "
                                 f"{command!r}; teach test_quickstart.py what to run or check")

    registry = cluster.env["REGISTRY"]
    # One image name scheme: what is built is pushed, and is what the cluster runs.
    control_plane, engine = f"{registry}/poolpilot:{APP_VERSION}", f"{registry}/runtime:0.1.0"
    assert built == {control_plane: "Dockerfile", engine: "runtime_image/Dockerfile"}
    assert sorted(pushed) == sorted(built)
    deploys = cluster.get("deployments", "-n", "poolpilot-system")["items"]
    assert {d["metadata"]["name"] for d in deploys} == {"poolpilot-operator",
                                                        "poolpilot-autoscaler"}
    for d in deploys:
        assert d["spec"]["template"]["spec"]["containers"][0]["image"] == control_plane
    listed = next(v for k, v in cluster.outputs.items() if k.endswith("get deploy"))
    assert "poolpilot-operator" in listed and "poolpilot-autoscaler" in listed

    # The pool landed in the example's namespace with the engine image, and its token exists.
    pool = cluster.get("inferencepools.poolpilot.dev", "-n", pool_ns, pool_name)
    assert pool["spec"]["runtime"]["image"] == engine
    ref = pool["spec"]["model"]["source"]["huggingFace"]["tokenSecret"]
    secret = cluster.get("secret", "-n", pool_ns, ref["name"])
    assert base64.b64decode(secret["data"][ref["key"]]).decode() == HF_TOKEN
    assert any(k.startswith(f"kubectl -n {pool_ns} get ipool {pool_name}")
               and pool_name in v for k, v in cluster.outputs.items())

    # What the operator makes of it: the router Service the port-forward and curl reach, the
    # engine and router pods on the pushed engine image.
    manifest = tmp_path / "applied.yaml"
    manifest.write_text(yaml.safe_dump(pool))
    rendered = list(yaml.safe_load_all(subprocess.run(
        [sys.executable, "-m", "poolpilot.cli", "render", str(manifest)], capture_output=True,
        text=True, check=True).stdout))
    router = names.child_name(pool_name, "router")
    service = next(o for o in rendered if o["kind"] == "Service"
                   and o["metadata"]["name"] == router)
    port = service["spec"]["ports"][0]["port"]
    images = {c["image"] for o in rendered if o["kind"] == "Deployment"
              for c in o["spec"]["template"]["spec"]["containers"]}
    assert images == {engine}
    served = pool["spec"]["model"].get("servedName") or pool["spec"]["model"]["name"]
    for kind, command in checks:
        if kind == "port-forward":
            assert command == f"kubectl -n {pool_ns} port-forward svc/{router} {port}:{port} &"
        elif kind == "curl":
            body = json.loads(re.search(r"-d '(\{.*\})'", command)[1])  # type: ignore[index]
            assert body["model"] == served and body["stream"] is True
            assert f"http://localhost:{port}/v1/completions" in command
        elif kind == "import":
            files = sorted((ROOT / "charts/poolpilot/files/dashboards").glob("*.json"))
            assert [json.loads(f.read_text())["uid"] for f in files] == [
                "poolpilot-autoscaler", "poolpilot-fleet", "poolpilot-pool"]
            assert "/api/dashboards/db" in command

    # The dashboards are where Grafana's sidecar looks: its namespace, its label.
    maps = cluster.get("configmaps", "-n", "monitoring", "-l", "grafana_dashboard=1")["items"]
    assert sorted(m["metadata"]["name"] for m in maps) == [
        "poolpilot-autoscaler-dashboard", "poolpilot-fleet-dashboard",
        "poolpilot-pool-dashboard"]

    # NOTES.txt, as `helm install` printed it, tells the same commands.
    notes = next(v for k, v in cluster.outputs.items() if k.startswith("helm install poolpilot"))
    told = [line.strip().removesuffix(" \\") for line in notes.splitlines()
            if line.strip().startswith((f"kubectl -n {pool_ns}", "kubectl create namespace",
                                        "curl -N", "-d '"))]
    assert len(told) == 6, notes
    flat = [c.replace("\\\n", " ") for c in commands]
    for line in told:
        assert any(line in c for c in flat), f"NOTES.txt says {line!r}; the quick start does not"
