"""One pool with both: behind a Gateway (an HTTPRoute to a GIE InferencePool) and a decode
role of two-node replicas. `poolpilot render` gives the HTTPRoute, the GIE InferencePool and
the LeaderWorkerSet, each valid against the upstream v1 schema written as a fixture, and the
GIE pool selects the decode set's leaders (the pods that serve) and never a worker."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from poolpilot.emulator import crd_validation

from poolpilot import cli
from poolpilot import leaderworkerset as lws

ROOT = Path(__file__).resolve().parents[3]
UPSTREAM = ROOT / "tests" / "fixtures" / "upstream"
LWS_SCHEMA = json.loads((UPSTREAM / "lws" / "leaderworkerset-v1.schema.json").read_text())
CRDS = {kind: yaml.safe_load((UPSTREAM / "gateway" / f"{name}.yaml").read_text())
        for kind, name in [("HTTPRoute", "httproutes.gateway.networking.k8s.io"),
                           ("InferencePool", "inferencepools.inference.networking.k8s.io")]}

POOL = {
    "apiVersion": "poolpilot.dev/v1alpha1", "kind": "InferencePool",
    "metadata": {"name": "big", "namespace": "serving"},
    "spec": {
        "model": {"name": "meta-llama/Llama-3.1-405B-Instruct"},
        "mode": "Aggregated",
        "engine": {"gpus": 8, "tensorParallelSize": 8, "nodesPerReplica": 2},
        "gateway": {"parentRefs": [{"name": "gw", "namespace": "gateway-system"}],
                    "hostnames": ["llm.example.com"], "inferencePool": True,
                    "endpointPickerRef": {"name": "big-epp", "port": {"number": 9002}}},
    },
}


def rendered(tmp_path: Path) -> list[dict[str, Any]]:
    f = tmp_path / "pool.yaml"
    f.write_text(yaml.safe_dump(POOL))
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert cli.main(["render", str(f)]) in (0, None), err.getvalue()
    return [d for d in yaml.safe_load_all(out.getvalue()) if d]


def test_route_gie_pool_and_leaderworkerset_validate_upstream(tmp_path: Path) -> None:
    objs = rendered(tmp_path)
    kinds = {(o["apiVersion"], o["kind"]): o for o in objs}
    route = kinds[("gateway.networking.k8s.io/v1", "HTTPRoute")]
    gie = kinds[("inference.networking.k8s.io/v1", "InferencePool")]
    sets = [o for o in objs if o["kind"] == lws.KIND]
    assert len(sets) == 1 and not [o for o in objs if o["kind"] == "Deployment"
                                   and o["metadata"]["name"] == "big-engine"]
    assert crd_validation.validate(CRDS["HTTPRoute"], route)[1] == []
    assert crd_validation.validate(CRDS["InferencePool"], gie)[1] == []
    jsonschema.validate(sets[0], LWS_SCHEMA)
    # The route goes to the GIE pool; the GIE pool selects what the set's leaders carry...
    assert route["spec"]["rules"][0]["backendRefs"][0]["kind"] == "InferencePool"
    selector = gie["spec"]["selector"]["matchLabels"]
    template = sets[0]["spec"]["leaderWorkerTemplate"]
    leader = template["leaderTemplate"]["metadata"]["labels"]
    assert all(leader.get(k) == v for k, v in selector.items() if k != "poolpilot.dev/pool-uid")
    # ...and never a worker, which runs vLLM headless and serves nothing.
    worker = template["workerTemplate"]["metadata"]["labels"]
    assert not all(worker.get(k) == v for k, v in selector.items()), (selector, worker)
