"""Multi-node roles (spec.<role>.nodesPerReplica > 1): what `poolpilot render` gives for the
example pool (a LeaderWorkerSet per role, valid against upstream's v1 schema; leader-only
Services), what the API refuses, and how the reconcile hands over sizes and replaces a
role's Deployment by its LeaderWorkerSet without a gap."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from poolpilot.emulator import crd_validation
from poolpilot.operator import builders, multinode, reconcile
from poolpilot.operator.render import pools_from_file

from poolpilot import crd, names
from poolpilot import leaderworkerset as lws
from poolpilot.validate import InvalidPool, parse_pool, parse_spec

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "multinode" / "llama-405b-two-nodes.yaml"
SCHEMA = json.loads((ROOT / "tests" / "fixtures" / "upstream" / "lws" /
                     "leaderworkerset-v1.schema.json").read_text())


@pytest.fixture(scope="module")
def children() -> dict[tuple[str, str], dict[str, Any]]:
    (pool,) = pools_from_file(EXAMPLE)
    return {(o["kind"], o["metadata"]["name"]): o for o in builders.build_children(pool)}


def test_the_example_is_valid_for_the_models_and_the_crd() -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    parse_pool(doc)
    _, errors = crd_validation.validate(crd.build_crd(), doc)
    assert errors == []


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_each_multi_node_role_is_a_leaderworkerset_valid_against_upstream(
        children: dict[tuple[str, str], dict[str, Any]], role: str) -> None:
    obj = children[(lws.KIND, f"llama-405b-{role}-lws")]
    jsonschema.validate(obj, SCHEMA)
    assert ("Deployment", f"llama-405b-{role}") not in children
    spec = obj["spec"]
    template = spec["leaderWorkerTemplate"]
    assert template["size"] == 2
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert spec["startupPolicy"] == "LeaderCreated"
    assert "replicas" not in spec, "autoscaling applies: the size is the autoscaler's"
    leader, worker = template["leaderTemplate"], template["workerTemplate"]
    lc, wc = leader["spec"]["containers"][0], worker["spec"]["containers"][0]
    # The same launcher command on every pod of the group; the launcher reads its rank.
    assert lc["command"] == wc["command"]
    assert lc["command"][lc["command"].index("--nodes") + 1] == "2"
    assert lc["command"][lc["command"].index("--tensor-parallel") + 1] == "8"
    assert lc["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert wc["resources"] == lc["resources"]
    # Workers run vLLM headless: no API port, probes or scrape annotations.
    assert "readinessProbe" in lc and "readinessProbe" not in wc and "startupProbe" not in wc
    assert "http" in {p["name"] for p in lc["ports"]}
    assert "http" not in {p["name"] for p in wc.get("ports", [])}
    assert worker["metadata"]["labels"] == leader["metadata"]["labels"]


def test_engine_services_select_the_leaders_only(
        children: dict[tuple[str, str], dict[str, Any]]) -> None:
    for role in ("prefill", "decode"):
        svc = children[("Service", f"llama-405b-{role}")]
        assert svc["spec"]["selector"][lws.WORKER_INDEX_LABEL] == "0"
        assert svc["spec"]["selector"][names.ROLE_LABEL] == role


def test_render_prints_the_leaderworkersets(capsys: pytest.CaptureFixture[str]) -> None:
    from poolpilot import cli

    assert cli.main(["render", str(EXAMPLE)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    sets = [d for d in docs if d and d.get("kind") == lws.KIND]
    assert [s["metadata"]["name"] for s in sets] == ["llama-405b-prefill-lws",
                                                      "llama-405b-decode-lws"]
    for s in sets:
        jsonschema.validate(s, SCHEMA)


def test_single_node_roles_keep_their_deployment(
        children: dict[tuple[str, str], dict[str, Any]]) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["prefill"]["nodesPerReplica"] = 1
    pool = builders.Pool("llama-405b", "serving", parse_spec(doc["spec"]))
    kinds = {(o["kind"], o["metadata"]["name"]) for o in builders.build_children(pool)}
    assert ("Deployment", "llama-405b-prefill") in kinds
    assert (lws.KIND, "llama-405b-decode-lws") in kinds
    svc = next(o for o in builders.build_children(pool)
               if o["kind"] == "Service" and o["metadata"]["name"] == "llama-405b-prefill")
    assert lws.WORKER_INDEX_LABEL not in svc["spec"]["selector"]


def test_the_schema_fixture_refuses_what_upstream_refuses(
        children: dict[tuple[str, str], dict[str, Any]]) -> None:
    bad = copy.deepcopy(children[(lws.KIND, "llama-405b-decode-lws")])
    bad["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "RecreateGroup"
    with pytest.raises(jsonschema.ValidationError, match="RecreateGroup"):
        jsonschema.validate(bad, SCHEMA)
    bad = copy.deepcopy(children[(lws.KIND, "llama-405b-decode-lws")])
    bad["spec"]["leaderWorkerTemplate"]["groupSize"] = 2
    with pytest.raises(jsonschema.ValidationError, match="groupSize"):
        jsonschema.validate(bad, SCHEMA)


@pytest.mark.parametrize("value,says", [(0, "greater than or equal to 1"),
                                        (65, "less than or equal to 64")], ids=["0", "65"])
def test_nodes_per_replica_bounds_name_the_field(value: int, says: str) -> None:
    with pytest.raises(InvalidPool) as err:
        parse_spec({"model": {"name": "m"}, "decode": {"nodesPerReplica": value}})
    assert any("decode.nodesPerReplica" in e and says in e for e in err.value.errors), \
        err.value.errors


def test_the_group_flags_are_refused_as_engine_args() -> None:
    with pytest.raises(InvalidPool) as err:
        parse_spec({"model": {"name": "m"}, "decode": {"engineArgs": {"nnodes": 2}}})
    assert any("nnodes" in e and "nodesPerReplica" in e for e in err.value.errors)


# --- the reconcile ------------------------------------------------------------------------


class MemoryCluster:
    """Objects by (apiVersion, kind, name); applies merge, sizes are recorded."""

    def __init__(self, pool: builders.Pool) -> None:
        self.objs: dict[tuple[str, str, str], dict[str, Any]] = {
            (api_version(), "InferencePool", pool.name): {
                "metadata": {"name": pool.name, "uid": pool.uid}}}
        self.sizes: list[tuple[str, str, int]] = []
        self.deleted: list[str] = []

    async def get(self, api: str, kind: str, namespace: str, name: str) -> Any:
        return copy.deepcopy(self.objs.get((api, kind, name)))

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        key = (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
        live = copy.deepcopy(obj)
        live["metadata"]["ownerReferences"] = obj["metadata"].get("ownerReferences", [])
        old = self.objs.get(key)
        if old and "replicas" in old.get("spec", {}):
            live["spec"].setdefault("replicas", old["spec"]["replicas"])
        self.objs[key] = live
        return copy.deepcopy(live)

    async def delete(self, obj: dict[str, Any]) -> None:
        self.objs.pop((obj["apiVersion"], obj["kind"], obj["metadata"]["name"]))
        self.deleted.append(f"{obj['kind']}/{obj['metadata']['name']}")

    async def apply_size(self, namespace: str, name: str, replicas: int,
                         api_version: str = "apps/v1", kind: str = "Deployment") -> None:
        self.sizes.append((kind, name, replicas))
        self.objs[(api_version, kind, name)]["spec"]["replicas"] = replicas


def api_version() -> str:
    from poolpilot import api

    return api.API_VERSION


def _pool(nodes: int) -> builders.Pool:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["decode"]["nodesPerReplica"] = nodes
    doc["spec"]["decode"]["replicas"] = 2
    return builders.Pool("llama-405b", "serving", parse_spec(doc["spec"]), uid="u-1")


def test_reconcile_sets_the_starting_size_of_a_leaderworkerset_and_swaps_workloads() -> None:
    caps = builders.Capabilities(leader_worker_set=True)
    cluster = MemoryCluster(_pool(1))
    asyncio.run(reconcile.reconcile(cluster, _pool(1), caps))
    assert ("Deployment", "llama-405b-decode", 2) in cluster.sizes

    # nodesPerReplica 1 -> 2: the LeaderWorkerSet comes, sized by the size manager; the
    # Deployment stays until the set has a ready group.
    out = asyncio.run(reconcile.reconcile(cluster, _pool(2), caps))
    assert (lws.KIND, "llama-405b-decode-lws", 2) in cluster.sizes
    assert "Deployment/llama-405b-decode" not in cluster.deleted
    assert out.waiting is not None and "to have a ready pod" in out.waiting
    assert out.deployments["decode"]["kind"] == lws.KIND

    for role in ("prefill", "decode"):
        cluster.objs[(lws.API_VERSION, lws.KIND, f"llama-405b-{role}-lws")]["status"] = {
            "replicas": 1, "readyReplicas": 1}
    out = asyncio.run(reconcile.reconcile(cluster, _pool(2), caps))
    assert "Deployment/llama-405b-decode" in cluster.deleted and out.waiting is None


def test_possible_children_look_up_leaderworkersets_only_where_they_can_exist() -> None:
    plain = builders.Pool("p", "ns", parse_spec({"model": {"name": "m"}}), uid="u")
    keys = {k for k, _ in ((builders.object_key(o), o) for o in
                           reconcile.possible_children(plain, builders.Capabilities()))}
    assert not any(kind == lws.KIND for _, kind, _ in keys)
    served = reconcile.possible_children(plain, builders.Capabilities(leader_worker_set=True))
    assert {o["metadata"]["name"] for o in served if o["kind"] == lws.KIND} == {
        multinode.set_name("p", r) for r in names.ENGINE_ROLES}
