"""The Helm commands the docs give work as written: every documented `helm install|upgrade`
of the chart passes `helm lint --strict` and the values schema with exactly its flags, and the
kube-prometheus-stack and secured-Prometheus recipes render what they promise."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartlib import CHART, K8S_VERSION, ROOT, by_kind, helm, load_all, one

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


def _commands(text: str) -> list[str]:
    """Shell commands of the fenced blocks, continuation lines joined, comments dropped."""
    joined = (re.sub(r"\\\n\s*", " ", block) for block in FENCE.findall(text))
    return [re.sub(r"\s+#.*$", "", line).strip() for block in joined
            for line in block.splitlines()]


def _section(path: Path, heading: str) -> str:
    text = path.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def chart_commands() -> list[tuple[str, str]]:
    """(doc, command) for every documented `helm install|upgrade|template` of this chart."""
    found = []
    for doc in DOCS:
        for cmd in _commands(doc.read_text()):
            words = cmd.split()
            if words[:1] == ["helm"] and len(words) > 3 and words[1] in (
                    "install", "upgrade", "template") and "charts/poolpilot" in words:
                found.append((str(doc.relative_to(ROOT)), cmd))
    return found


def value_flags(cmd: str) -> list[str]:
    """The command's value flags (--set, --set-string, -f/--values), env vars left as text."""
    words = shlex.split(cmd.replace("$", "X"))
    flags = []
    for i, w in enumerate(words):
        if w in ("--set", "--set-string", "--set-json", "-f", "--values"):
            value = words[i + 1]
            if w in ("-f", "--values"):
                value = str(ROOT / value)
            flags += [w, value]
    return flags


def render_cmd(cmd: str) -> list[dict[str, Any]]:
    out = helm("template", "poolpilot", str(CHART), "--namespace", "poolpilot-system",
               "--kube-version", K8S_VERSION, *value_flags(cmd)).stdout
    return load_all(out)


COMMANDS = chart_commands()


def test_the_docs_document_chart_commands() -> None:
    assert len(COMMANDS) >= 4, COMMANDS


@pytest.mark.parametrize("doc,cmd", COMMANDS, ids=[f"{d}:{i}" for i, (d, _) in
                                                 enumerate(COMMANDS)])
def test_every_documented_set_passes_lint_and_the_schema(doc: str, cmd: str) -> None:
    proc = helm("lint", "--strict", str(CHART), *value_flags(cmd), check=False)
    assert proc.returncode == 0, f"{doc}: {cmd}\n{proc.stdout}{proc.stderr}"


def test_kube_prometheus_stack_recipe_labels_every_monitor_and_rule() -> None:
    section = _section(ROOT / "docs" / "helm.md", "With kube-prometheus-stack")
    cmds = _commands(section)
    install = next(c for c in cmds if c.startswith("helm install"))
    objs = render_cmd(install)
    monitors = [o for o in objs if o["kind"] in ("ServiceMonitor", "PodMonitor",
                                                 "PrometheusRule")]
    assert {o["kind"] for o in monitors} == {"ServiceMonitor", "PrometheusRule"}
    for obj in monitors:
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack", obj["kind"]
    # ... and the operator labels the monitors it makes per pool the same way.
    args = one(objs, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0][
        "args"]
    assert args[args.index("--monitor-label") + 1] == "release=kube-prometheus-stack"
    render = next(c for c in cmds if c.startswith("poolpilot render"))
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "poolpilot"), *shlex.split(render)[1:]],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    per_pool = [d for d in yaml.safe_load_all(out) if d and d["kind"] in ("ServiceMonitor",
                                                                          "PodMonitor")]
    assert len(per_pool) == 2
    for obj in per_pool:
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert obj["metadata"]["labels"]["poolpilot.dev/pool"] == "llama-8b"


def test_secured_prometheus_recipe_mounts_what_its_flags_read() -> None:
    section = _section(ROOT / "docs" / "helm.md", "A secured Prometheus")
    install = next(c for c in _commands(section) if c.startswith("helm install"))
    dep = one(render_cmd(install), "Deployment", "-autoscaler")
    pod = dep["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}

    def source_of(path: str) -> dict[str, Any]:
        folder = str(Path(path).parent)
        return volumes[mounts[folder]]

    ca = args[args.index("--prometheus-ca-file") + 1]
    assert source_of(ca)["secret"]["secretName"] == "prometheus-ca"
    token = args[args.index("--prometheus-bearer-token-file") + 1]
    assert source_of(token)["secret"]["secretName"] == "prometheus-token"
    assert Path(token).name == "token" and Path(ca).name == "ca.crt"
    assert args[args.index("--prometheus-header") + 1] == "X-Scope-OrgID: team-a"
    assert args[args.index("--prometheus") + 1].startswith("https://")
    assert "--prometheus-insecure-skip-verify" not in args


def test_each_alert_links_to_its_runbook_section() -> None:
    objs = render_cmd("helm install x charts/poolpilot --set prometheusRule.enabled=true "
                      "--set monitoring.serviceMonitor.enabled=true")
    rule = one(objs, "PrometheusRule", "poolpilot")
    headings = {line[3:].strip().lower() for line in
                (ROOT / "docs" / "alerts.md").read_text().splitlines() if line.startswith("## ")}
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 10
    for alert in alerts:
        url = alert["annotations"]["runbook_url"]
        base, _, anchor = url.partition("#")
        assert base.endswith("/docs/alerts.md") and anchor == alert["alert"].lower()
        assert anchor in headings, f"docs/alerts.md has no section {alert['alert']}"


@pytest.mark.parametrize("values,present", [
    (["--set", "monitoring.serviceMonitor.enabled=true"], True),
    ([], False),
    (["--set", "monitoring.serviceMonitor.enabled=true", "--set", "autoscaler.enabled=false"],
     False),
], ids=["servicemonitor-on", "servicemonitor-off", "no-autoscaler"])
def test_autoscaler_down_only_when_prometheus_scrapes_the_autoscaler(values: list[str],
                                                                     present: bool) -> None:
    out = helm("template", "x", str(CHART), "--set", "prometheusRule.enabled=true", *values,
               "--show-only", "templates/prometheusrule.yaml").stdout
    names = {r.get("alert") for g in yaml.safe_load(out)["spec"]["groups"] for r in g["rules"]}
    assert ("PoolpilotAutoscalerDown" in names) is present
    assert ("PoolpilotAutoscalerNoLeader" in names) is present
    assert "PoolpilotPoolNotReady" in names


def test_crds_install_and_keep() -> None:
    default = render_cmd("helm install x charts/poolpilot")
    crd = one(default, "CustomResourceDefinition", "inferencepools.poolpilot.dev")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # libyaml: the CRD is 300 kB, a quarter of a second for PyYAML's pure-Python parser
    committed = yaml.load((ROOT / "crds" / "inferencepool.yaml").read_text(),
                          Loader=yaml.CSafeLoader)
    assert crd["spec"] == committed["spec"]
    not_kept = render_cmd("helm install x charts/poolpilot --set crds.keep=false")
    assert "annotations" not in one(not_kept, "CustomResourceDefinition",
                                    "inferencepools.poolpilot.dev")["metadata"]
    none = render_cmd("helm install x charts/poolpilot --set crds.install=false")
    assert by_kind(none, "CustomResourceDefinition") == []
    # The generated file has no annotations of its own for the template to collide with.
    generated = yaml.load((CHART / "files" / "crds" / "inferencepool.yaml").read_text(),
                          Loader=yaml.CSafeLoader)
    assert "annotations" not in generated["metadata"]
