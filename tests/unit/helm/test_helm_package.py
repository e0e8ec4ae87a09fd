"""The chart as users get it: packaged (`helm package`), and as a subchart of an umbrella chart
(Helm passes it `global`; `condition: poolpilot.enabled` sets `enabled`). The packaged chart
renders valid manifests, and every command its NOTES print works from the package alone: run
by bash against a kubectl that answers from the rendered manifests."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartlib import CHART, K8S_VERSION, ROOT, by_kind, manifest_errors, one, render, tool

APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
CHART_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]


def offline_env(tmp: Path) -> dict[str, str]:
    """Helm with its own empty homes: no repositories, no cache, no cluster."""
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp / "cache"),
        "HELM_CONFIG_HOME": str(tmp / "config"),
        "HELM_DATA_HOME": str(tmp / "data"),
        "KUBECONFIG": str(tmp / "no-kubeconfig"),
    }


def helm_offline(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [tool("helm"), *args], capture_output=True, text=True, timeout=120, env=offline_env(tmp)
    )
    assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("package")
    helm_offline(out, "package", str(CHART), "--destination", str(out))
    tgz = out / f"poolpilot-{CHART_VERSION}.tgz"
    assert tgz.exists()
    return tgz


def test_the_shipped_examples_are_the_repositorys(package: Path) -> None:
    shipped = sorted((CHART / "files" / "examples").iterdir())
    assert shipped, "charts/poolpilot/files/examples/ is empty"
    for path in shipped:
        assert path.read_text() == (ROOT / "examples" / path.name).read_text(), (
            f"charts/poolpilot/files/examples/{path.name} drifted from examples/{path.name}; "
            f"copy it: cp examples/{path.name} charts/poolpilot/files/examples/"
        )
    with tarfile.open(package) as tar:
        names = set(tar.getnames())
    assert {f"poolpilot/files/examples/{p.name}" for p in shipped} <= names


def test_the_package_renders_valid_manifests(package: Path, tmp_path: Path) -> None:
    objs = render(chart=package)
    assert manifest_errors(objs) == []
    assert by_kind(objs, "Deployment")


def _notes(chart_dir: Path, tmp: Path, *set_args: str) -> str:
    """NOTES.txt as Helm renders it, through a probe template added to a copy of the chart
    (`helm template` does not print NOTES, and `helm install --dry-run` needs a cluster)."""
    (chart_dir / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ include "poolpilot/templates/NOTES.txt" . | quote }}}\n'
    )
    out = helm_offline(
        tmp,
        "template",
        "pp",
        str(chart_dir),
        "--namespace",
        "poolpilot-system",
        "--kube-version",
        K8S_VERSION,
        *set_args,
        "--show-only",
        "templates/zz-notes.yaml",
    ).stdout
    notes: str = yaml.safe_load(out)["data"]["notes"]
    return notes


def notes_commands(notes: str) -> list[str]:
    """The shell commands NOTES print: indented lines that start with a command, their
    backslash continuations and heredoc bodies."""
    lines = notes.splitlines()
    out, i = [], 0
    starts = ("kubectl ", "sed ", "curl ", "for ", "helm ")
    while i < len(lines):
        line = lines[i]
        if line.startswith("   ") and line.strip().startswith(starts):
            command = [line.strip()]
            while command[-1].endswith("\\"):
                i += 1
                command.append(lines[i].strip())
            heredoc = re.search(r"<<'(\w+)'", line)
            if heredoc:
                while lines[i + 1] != heredoc[1]:
                    i += 1
                    command.append(lines[i])
                i += 1
                command.append(lines[i])
            out.append("\n".join(command))
        i += 1
    return out


FAKE_KUBECTL = textwrap.dedent('''\
    #!{python}
    """kubectl stand-in: logs each call and its stdin, answers `get configmap NAME -o
    jsonpath={{.data.*}}` from the rendered manifests, and refuses what kubectl would."""
    import json, os, sys
    import yaml
    args = sys.argv[1:]
    stdin = sys.stdin.read() if "-" in args and "-f" in args else ""
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps({{"args": args, "stdin": stdin}}) + "\\n")
    if args[:1] == ["-n"]:
        ns, args = args[1], args[2:]
    else:
        ns = "default"
    if args[:2] == ["get", "configmap"]:
        # libyaml: the rendered chart is 400 kB, over a second a call for the pure-Python parser
        objs = [o for o in yaml.load_all(open(os.environ["FAKE_MANIFESTS"]),
                                         Loader=yaml.CSafeLoader) if o]
        name = args[2]
        assert args[3:] == ["-o", "jsonpath={{.data.*}}"], args
        found = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name
                 and o["metadata"]["namespace"] == ns]
        if not found:
            sys.exit(f"Error from server (NotFound): configmaps {{name!r}} not found in {{ns}}")
        print(" ".join(found[0]["data"].values()), end="")
    elif args[:2] == ["apply", "-f"]:
        assert args[2] == "-", args
        assert list(yaml.safe_load_all(stdin)), "nothing to apply"
    elif args[:1] not in (["get"], ["create"], ["port-forward"]):
        sys.exit(f"fake kubectl does not know {{args}}")
''')


@dataclass(frozen=True)
class NotesCase:
    id: str
    set_args: tuple[str, ...] = ()
    dashboards_namespace: str = "poolpilot-system"


NOTES_CASES = [
    NotesCase("defaults"),
    NotesCase(
        "dashboards-in-grafanas-namespace",
        ("--set", "grafana.dashboards.namespace=monitoring"),
        "monitoring",
    ),
    NotesCase("namespace-override", ("--set", "namespaceOverride=platform"), "platform"),
]


@pytest.mark.parametrize("case", NOTES_CASES, ids=[c.id for c in NOTES_CASES])
def test_every_command_the_packaged_notes_print_works(
    case: NotesCase, package: Path, tmp_path: Path
) -> None:
    with tarfile.open(package) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    chart_dir = tmp_path / "unpacked" / "poolpilot"
    notes = _notes(chart_dir, tmp_path, *case.set_args)
    commands = notes_commands(notes)
    assert "examples/" not in "\n".join(c for c in commands if "<<" not in c), commands

    manifests = tmp_path / "manifests.yaml"
    manifests.write_text(
        helm_offline(
            tmp_path,
            "template",
            "pp",
            str(package),
            "--namespace",
            "poolpilot-system",
            "--kube-version",
            K8S_VERSION,
            *case.set_args,
        ).stdout
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(FAKE_KUBECTL.format(python=sys.executable))
    kubectl.chmod(0o755)
    curl = bin_dir / "curl"
    curl.write_text('#!/bin/sh\necho "$@" >> "$FAKE_LOG.curl"\n')
    curl.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    work = tmp_path / "work"
    work.mkdir()
    script = "set -euo pipefail\n" + "\n".join(c for c in commands if not c.startswith("helm "))
    script += "\nwait\n"
    proc = subprocess.run(
        ["bash", "-c", script],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "FAKE_LOG": str(log),
            "FAKE_MANIFESTS": str(manifests),
            "REGISTRY": "registry.example.com/ml",
            "HF_TOKEN": "hf_test",
        },
    )
    assert proc.returncode == 0, f"{script}\n{proc.stdout}\n{proc.stderr}"
    calls = [json.loads(line) for line in log.read_text().splitlines()]

    # The pool applied is the repository's example with the engine image the user built.
    applied = [c["stdin"] for c in calls if c["args"][:3] == ["apply", "-f", "-"]]
    assert len(applied) == 1
    example = yaml.safe_load((ROOT / "examples" / "llama-8b-disaggregated.yaml").read_text())
    example["spec"]["runtime"]["image"] = "registry.example.com/ml/runtime:0.1.0"
    assert yaml.safe_load(applied[0]) == example
    # Its namespace and token Secret are the ones the example names.
    ref = example["spec"]["model"]["source"]["huggingFace"]["tokenSecret"]
    ns = example["metadata"]["namespace"]
    assert ["create", "namespace", ns] in [c["args"] for c in calls]
    assert [
        "-n",
        ns,
        "create",
        "secret",
        "generic",
        ref["name"],
        f"--from-literal={ref['key']}=hf_test",
    ] in [c["args"] for c in calls]
    # The dashboards come out of their ConfigMaps as the JSON the chart ships.
    for name in ("pool", "autoscaler", "fleet"):
        saved = json.loads((work / f"poolpilot-{name}.json").read_text())
        shipped = json.loads(
            (CHART / "files" / "dashboards" / f"poolpilot-{name}.json").read_text()
        )
        assert saved == shipped
    assert any(
        c["args"][:2] == ["-n", case.dashboards_namespace] and "configmap" in c["args"]
        for c in calls
    )
    # The control-plane check names the namespace the Deployments are in.
    deploy_ns = {
        d["metadata"]["namespace"]
        for d in yaml.load_all(manifests.read_text(), Loader=yaml.CSafeLoader)
        if d and d["kind"] == "Deployment"
    }
    assert [c["args"][:3] for c in calls if "deploy" in c["args"]] == [
        ["-n", deploy_ns.pop(), "get"]
    ]


def test_notes_commands_keep_heredocs_whole() -> None:
    notes = (
        "intro\n\n   kubectl a \\\n     --b\n   sed x <<'EOF' | kubectl apply -f -\n"
        "kind: X\n\nspec: {}\nEOF\n   kubectl c\nVerify: helm test"
    )
    assert notes_commands(notes) == [
        "kubectl a \\\n--b",
        "sed x <<'EOF' | kubectl apply -f -\nkind: X\n\nspec: {}\nEOF",
        "kubectl c",
    ]


@dataclass(frozen=True)
class UmbrellaCase:
    id: str
    values: dict[str, Any]
    poolpilot_objects: bool = True


UMBRELLA_VALUES = {
    "global": {
        "imageRegistry": "mirror.internal:5000",
        "imagePullSecrets": [{"name": "mirror"}],
        "storageClass": "fast-ssd",
    },  # the last is another subchart's
    "poolpilot": {
        "enabled": True,
        "commonLabels": {"platform": "inference"},
        "operator": {"replicaCount": 3},
        "autoscaler": {"extraEnv": [{"name": "TZ", "value": "UTC"}]},
        "prometheus": {"url": "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"},
        "monitoring": {
            "labels": {"release": "kube-prometheus-stack"},
            "serviceMonitor": {"enabled": True},
        },
        "prometheusRule": {"enabled": True},
    },
}
UMBRELLA_CASES = [
    UmbrellaCase("enabled-with-globals", UMBRELLA_VALUES),
    UmbrellaCase("defaults-only", {}),
    UmbrellaCase("disabled-by-condition", {"poolpilot": {"enabled": False}}, False),
]


@pytest.fixture(scope="module")
def umbrella(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An umbrella chart depending on this one by file:// path, dependencies built offline."""
    root = tmp_path_factory.mktemp("umbrella")
    chart = root / "platform"
    chart.mkdir()
    (chart / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "platform",
                "version": "1.0.0",
                "type": "application",
                "description": "An umbrella chart with poolpilot as a subchart.",
                "dependencies": [
                    {
                        "name": "poolpilot",
                        "version": CHART_VERSION,
                        "repository": f"file://{CHART}",
                        "condition": "poolpilot.enabled",
                    }
                ],
            }
        )
    )
    (chart / "values.yaml").write_text(yaml.safe_dump({"poolpilot": {"enabled": True}}))
    helm_offline(root, "dependency", "build", str(chart), "--skip-refresh")
    assert (chart / "charts" / f"poolpilot-{CHART_VERSION}.tgz").exists()
    return chart


@pytest.mark.parametrize("case", UMBRELLA_CASES, ids=[c.id for c in UMBRELLA_CASES])
def test_the_chart_works_as_a_subchart(case: UmbrellaCase, umbrella: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(case.values))
    lint = subprocess.run(
        [tool("helm"), "lint", "--strict", str(umbrella), "--values", str(values)],
        capture_output=True,
        text=True,
        timeout=120,
        env=offline_env(tmp_path),
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    objs = render(case.values, release="stack", namespace="platform", tmp=tmp_path, chart=umbrella)
    assert manifest_errors(objs) == []
    deployments = by_kind(objs, "Deployment")
    if not case.poolpilot_objects:
        assert deployments == []
        return
    assert {d["metadata"]["name"] for d in deployments} == {
        "stack-poolpilot-operator",
        "stack-poolpilot-autoscaler",
    }
    assert one(objs, "CustomResourceDefinition", "inferencepools.poolpilot.dev")
    if case.values is not UMBRELLA_VALUES:
        return
    op = one(objs, "Deployment", "-operator")
    assert op["spec"]["replicas"] == 3
    pod = op["spec"]["template"]["spec"]
    assert (
        pod["containers"][0]["image"] == f"mirror.internal:5000/poolpilot/poolpilot:{APP_VERSION}"
    )
    assert pod["imagePullSecrets"] == [{"name": "mirror"}]
    assert all(o["metadata"]["labels"]["platform"] == "inference" for o in deployments)
    sm = one(objs, "ServiceMonitor", "-autoscaler")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    scaler = one(objs, "Deployment", "-autoscaler")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "TZ", "value": "UTC"} in scaler["env"]
