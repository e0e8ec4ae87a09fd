"""`poolpilot render | kubectl apply -f -`: kubectl's own YAML reader (go-yaml, through
sigs.k8s.io/yaml) gets the strings render was given, numeric-looking ones included. Offline:
`kubectl annotate --local` reads the file and prints it as JSON without a cluster."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from poolpilot.operator import builders, render
from poolpilot.testkit.operator import kubectl_binary

from poolpilot.validate import parse_pool

pytestmark = pytest.mark.adapter

TRICKY = ["1e3", "1.5e3", "3e4", "-1e3", ".5e3", "089", "0o17", "0X1F", "1_000", "y", "N",
          "2024-1-2", "1:30", "on", "0b11"]


def test_kubectl_reads_the_rendered_strings_as_strings(tmp_path: Path) -> None:
    try:
        kubectl = kubectl_binary()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    pool = parse_pool({
        "apiVersion": "poolpilot.dev/v1alpha1", "kind": "InferencePool",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"model": {"name": "1e3", "servedName": "2e5"}, "mode": "Aggregated",
                 "runtime": {"env": [{"name": f"V{i}", "value": v}
                                     for i, v in enumerate(TRICKY)]},
                 "podTemplate": {"metadata": {"labels": {"b": "3e4"}, "annotations": {
                     f"t{i}": v for i, v in enumerate(TRICKY)}}}}})
    objs = builders.build_children(builders.Pool("p", "ns", pool.spec),
                                   builders.Capabilities())
    path = tmp_path / "rendered.yaml"
    path.write_text(render.to_yaml(objs))
    proc = subprocess.run([kubectl, "annotate", "--local", "-f", str(path),
                           "poolpilot.dev/probe=1", "-o", "json"], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "KUBECONFIG": str(tmp_path / "no-cluster")})
    assert proc.returncode == 0, proc.stderr
    got: list[dict[str, Any]] = []
    text = proc.stdout.strip()
    while text:  # one JSON document an object, one after another
        obj, end = json.JSONDecoder().raw_decode(text)
        got.append(obj)
        text = text[end:].strip()
    for obj in got:
        obj["metadata"]["annotations"].pop("poolpilot.dev/probe")
        if not obj["metadata"]["annotations"]:
            del obj["metadata"]["annotations"]
    assert got == json.loads(json.dumps(objs))
