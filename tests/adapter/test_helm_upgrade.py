"""The chart's CRD upgrade story with real helm and kubectl against the Kubernetes API emulator,
running docs/helm.md's commands as written: a release of the previous layout (the CRD in
crds/, installed once and never upgraded by Helm) is upgraded to the templated CRD after the
documented adoption; the CRD gains the new schema, pools survive, and `helm uninstall` keeps
the CRD and the pools (crds.keep)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from poolpilot.emulator.server import KubeEmulator

pytestmark = [pytest.mark.adapter, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "poolpilot"
BIN = ROOT / ".cache" / "bin"
CRD = "inferencepools.poolpilot.dev"


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed; run ./dev setup")
    return found


def previous_chart(tmp: Path) -> Path:
    """The chart as 0.1.0 laid it out: the CRD in crds/, no CRD template; and an older CRD
    (one printer column fewer) so the upgrade has something to bring."""
    chart = tmp / "poolpilot"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "crds.yaml").unlink()
    crd = yaml.safe_load((chart / "files" / "crds" / "inferencepool.yaml").read_text())
    crd["spec"]["versions"][0]["additionalPrinterColumns"].pop()
    (chart / "crds" / "inferencepool.yaml").write_text(yaml.safe_dump(crd, sort_keys=False))
    return chart


def upgrade_commands() -> list[str]:
    """The adoption block of docs/helm.md's Upgrade section, as written."""
    text = (ROOT / "docs" / "helm.md").read_text()
    section = text[text.index("\n## Upgrade\n"):text.index("\n## Uninstall\n")]
    blocks = re.findall(r"^```bash\n(.*?)^```", section, re.M | re.S)
    block = next(b for b in blocks if "kubectl label crd" in b)
    return [line.strip() for line in block.splitlines() if line.strip()]


class Cli:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = str(kubeconfig)
        self.bins = {"helm": _tool("helm"), "kubectl": _tool("kubectl")}

    def __call__(self, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        words = shlex.split(command)
        argv = [self.bins[words[0]], "--kubeconfig", self.kubeconfig, *words[1:]]
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"{command}: {proc.stdout}{proc.stderr}")
        return proc

    def crd(self) -> dict:
        return dict(yaml.safe_load(self(f"kubectl get crd {CRD} -o yaml").stdout))


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with KubeEmulator().running() as emu:
        yield Cli(emu.write_kubeconfig(tmp_path / "kubeconfig"))


def test_upgrade_from_the_crds_folder_to_the_templated_crd(cli: Cli, tmp_path: Path) -> None:
    old = previous_chart(tmp_path)
    cli(f"helm install poolpilot {old} -n poolpilot-system --create-namespace")
    before = cli.crd()
    assert "meta.helm.sh/release-name" not in (before["metadata"].get("annotations") or {})
    columns = len(before["spec"]["versions"][0]["additionalPrinterColumns"])
    cli("kubectl create namespace serving")
    cli("kubectl apply -f examples/llama-8b-disaggregated.yaml")

    # Helm will not take over an object another installation made ...
    refused = cli("helm upgrade poolpilot charts/poolpilot -n poolpilot-system --reuse-values",
                  check=False)
    assert refused.returncode != 0 and "does not own it" in refused.stderr, refused.stderr
    assert "--set crds.install=false" in refused.stderr
    assert next(c for c in upgrade_commands() if c.startswith("kubectl annotate")) in refused.stderr
    assert cli.crd()["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    # ... until the documented adoption, after which the upgrade goes through.
    commands = upgrade_commands()
    assert commands[-1].startswith("helm upgrade")
    for command in commands:
        cli(command)
    after = cli.crd()
    assert len(after["spec"]["versions"][0]["additionalPrinterColumns"]) == columns + 1
    assert after["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert cli("kubectl get ipool llama-8b -n serving -o name").stdout.strip()

    # Uninstalling keeps the CRD and so the pools (deleting it would delete them).
    out = cli("helm uninstall poolpilot -n poolpilot-system").stdout
    assert "kept due to the resource policy" in out
    assert cli.crd()["metadata"]["name"] == CRD
    assert cli("kubectl get ipool llama-8b -n serving -o name").stdout.strip()


def test_a_templated_crd_is_upgraded_with_the_chart(cli: Cli, tmp_path: Path) -> None:
    older = tmp_path / "poolpilot"
    shutil.copytree(CHART, older)
    path = older / "files" / "crds" / "inferencepool.yaml"
    crd = yaml.safe_load(path.read_text())
    crd["spec"]["versions"][0]["additionalPrinterColumns"].pop()
    path.write_text(yaml.safe_dump(crd, sort_keys=False))
    cli(f"helm install poolpilot {older} -n poolpilot-system --create-namespace")
    columns = len(cli.crd()["spec"]["versions"][0]["additionalPrinterColumns"])
    assert cli.crd()["metadata"]["annotations"]["meta.helm.sh/release-name"] == "poolpilot"
    cli("helm upgrade poolpilot charts/poolpilot -n poolpilot-system --reuse-values")
    assert len(cli.crd()["spec"]["versions"][0]["additionalPrinterColumns"]) == columns + 1
    # With crds.keep=false the CRD goes with the release.
    cli("helm upgrade poolpilot charts/poolpilot -n poolpilot-system --reuse-values "
        "--set crds.keep=false")
    cli("helm uninstall poolpilot -n poolpilot-system")
    assert cli(f"kubectl get crd {CRD} --ignore-not-found -o name").stdout.strip() == ""


def _deployments(cli: Cli) -> list[str]:
    out = cli("kubectl get deployments -n poolpilot-system -o name").stdout
    return sorted(line.removeprefix("deployment.apps/") for line in out.split())


def test_sharding_the_autoscaler_is_a_helm_upgrade_and_back(cli: Cli) -> None:
    """autoscaler.shards 1 -> 3 -> 1 with `helm upgrade --reuse-values`: the one autoscaler
    Deployment is replaced by one per shard, the leader Role names their Leases, and back."""
    cli("helm install poolpilot charts/poolpilot -n poolpilot-system --create-namespace")
    before = _deployments(cli)
    assert "poolpilot-autoscaler" in before
    cli("helm upgrade poolpilot charts/poolpilot -n poolpilot-system --reuse-values "
        "--set autoscaler.shards=3")
    sharded = _deployments(cli)
    assert [d for d in sharded if "autoscaler" in d] == [
        f"poolpilot-autoscaler-{i}" for i in range(3)]
    role = yaml.safe_load(cli("kubectl get role poolpilot-autoscaler-leader -n "
                              "poolpilot-system -o yaml").stdout)
    named = next(r for r in role["rules"] if r.get("resourceNames"))
    assert named["resourceNames"] == [f"poolpilot-autoscaler-{i}-of-3" for i in range(3)]
    pdbs = cli("kubectl get poddisruptionbudgets -n poolpilot-system -o name").stdout.split()
    assert sorted(p.rsplit("/", 1)[1] for p in pdbs if "autoscaler" in p) == [
        f"poolpilot-autoscaler-{i}" for i in range(3)]
    cli("helm upgrade poolpilot charts/poolpilot -n poolpilot-system --reuse-values "
        "--set autoscaler.shards=1")
    assert _deployments(cli) == before
