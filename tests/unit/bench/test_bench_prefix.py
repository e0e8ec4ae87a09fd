"""The bench on prefix-sharing traffic: `--routing`, the JSON's prefix_hit_rate,
gpu_hours_by_role, load_imbalance and ideal_prefix_hit_rate, and a trace without hash ids
(Azure) replayed exactly as before whatever the routing."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from poolpilot.bench.replay import BenchConfig, replay
from poolpilot.bench.workload import scale_load
from poolpilot.engine_sim.traces import TraceRequest, write_csv, write_mooncake
from poolpilot.engine_sim.workloads import defaults, generate_sessions

from poolpilot.cli import main as cli_main

CFG = BenchConfig(model="llama-3.1-8b", gpu="h200", cold_start=20.0, max_replicas=4)


@pytest.fixture(scope="module")
def chat() -> list[TraceRequest]:
    """Two minutes of chat sessions: later turns extend earlier ones, system prompts shared."""
    params = replace(defaults("chat"), rate=2.0, duration=120.0, seed=3, sessions=400)
    return generate_sessions(params)


@pytest.fixture(scope="module")
def doc(chat: list[TraceRequest], tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    d = tmp_path_factory.mktemp("prefix")
    path = d / "chat.jsonl"
    write_mooncake(chat, path)
    out = d / "r.json"
    assert cli_main(["bench", "--trace", str(path), "--cold-start", "30", "--max-replicas", "4",
                     "--policies", "poolpilot,static-peak", "--json", str(out)]) == 0
    return dict(json.loads(out.read_text()))


def test_the_json_reports_the_cache_the_cost_by_role_and_the_spread(
        doc: dict[str, object]) -> None:
    ideal = doc["ideal_prefix_hit_rate"]
    assert isinstance(ideal, float) and 0.3 < ideal < 1
    assert doc["config"]["routing"] == "prefix-aware"  # type: ignore[index]
    for name, res in doc["policies"].items():  # type: ignore[attr-defined]
        assert 0 < res["prefix_hit_rate"] <= ideal + 1e-9, name
        by_role = res["gpu_hours_by_role"]
        assert set(by_role) == {"prefill", "decode"}
        assert sum(by_role.values()) == pytest.approx(res["gpu_hours"])
        assert set(res["load_imbalance"]) == {"prefill", "decode"}
        for v in res["load_imbalance"].values():
            assert v is None or v >= 1.0  # the busiest never holds less than an even spread
        assert res["prefix_hit_rate_by_role"]["prefill"] is not None


@pytest.mark.parametrize(("loads", "imbalance"), [
    ((1, 0, 0, 0, 0, 0), 1.0),  # one request: nothing queues behind it
    ((0.5, 0.1, 0, 0), 1.0),  # a light load, mostly on one engine: no hot spot
    ((2, 1, 1, 1), 1.6),  # time-averaged, so no whole-request rounding
    ((3, 1, 0, 0), 3.0),  # the mean is one request: the busiest holds three
    ((4, 4), 1.0), ((6, 2), 1.5), ((0, 0), None),
])
def test_load_imbalance_is_the_busiest_over_the_mean_of_at_least_one_request(
        loads: tuple[float, ...], imbalance: float | None) -> None:
    from poolpilot.bench.replay import load_imbalance
    got = load_imbalance(loads)
    if imbalance is None:
        assert got is None
    else:
        assert got == (pytest.approx(imbalance), pytest.approx(sum(loads)))


def test_the_imbalance_percentile_is_weighted_by_the_load() -> None:
    """A hot spot in a busy interval outweighs many light, lopsided ones."""
    from poolpilot.bench.replay import weighted_percentile
    light = [(4.0, 0.1)] * 50  # 50 intervals of almost nothing in flight
    busy = [(1.2, 100.0)] * 10
    assert weighted_percentile(light + busy, 99) == 1.2
    assert weighted_percentile([*busy, (2.0, 100.0)], 99) == 2.0
    assert weighted_percentile([], 99) is None


def test_prefix_aware_routing_hits_more_than_least_loaded(chat: list[TraceRequest]) -> None:
    """On a fixed 3+1 pool: prefix-aware keeps each conversation where its history is."""
    from poolpilot.bench.policies.static_peak import StaticPool

    hit = {}
    for routing in ("least-loaded", "prefix-aware"):
        cfg = replace(CFG, routing=routing)
        res = replay(chat, StaticPool({"prefill": 3, "decode": 1}), cfg).as_json()
        assert res["routing"] == routing
        hit[routing] = res["prefix_hit_rate"]
    assert hit["prefix-aware"] > hit["least-loaded"] > 0


def test_a_trace_without_hash_ids_replays_the_same_under_either_routing(tmp_path: Path) -> None:
    """Azure traces share nothing: prefix-aware picks exactly the least-loaded engine, so every
    number but the routing's name is the same."""
    reqs = [TraceRequest(i * 0.5, 800 + 37 * (i % 9), 30) for i in range(120)]
    reqs += [TraceRequest(60 + i * 0.04, 2500, 40) for i in range(300)]
    reqs = scale_load(reqs, 1.5, seed=1)
    docs = []
    for routing in ("least-loaded", "prefix-aware"):
        path = tmp_path / "t.csv"
        write_csv(reqs, path)
        out = tmp_path / f"{routing}.json"
        assert cli_main(["bench", "--trace", str(path), "--cold-start", "30",
                         "--max-replicas", "6", "--policies", "poolpilot,oracle,static-min",
                         "--routing", routing, "--json", str(out)]) == 0
        d = json.loads(out.read_text())
        d.pop("wall_seconds")
        d["config"].pop("routing")
        for res in d["policies"].values():
            assert res.pop("routing") == routing
            assert res["prefix_hit_rate"] == 0.0
        docs.append(d)
    assert docs[0] == docs[1]
    assert docs[0]["ideal_prefix_hit_rate"] == 0.0


def test_rate_scale_copies_share_prefixes_only_among_themselves(
        chat: list[TraceRequest]) -> None:
    span = 1 + max(h for r in chat for h in r.hash_ids)
    doubled = scale_load(chat, 2.0, seed=0)
    assert len(doubled) == 2 * len(chat)
    kinds = [{h // span for h in r.hash_ids} for r in doubled if r.hash_ids]
    assert all(len(k) == 1 for k in kinds)  # each request's blocks are all of one copy
    assert sum(k == {1} for k in kinds) == sum(k == {0} for k in kinds)


def test_a_cpu_offload_tier_serves_what_a_small_gpu_cache_evicts(
        chat: list[TraceRequest]) -> None:
    """GPUs whose KV cache holds a few prompts (8B at 14% of an H200: ~40k tokens) evict each
    conversation's history before its next turn; a host tier of 8 GiB (64k tokens) per prefill
    engine keeps it, so more of each prompt is served from a cache, the JSON says how much
    came from the tier, and the engines' counters (the autoscaler's input) count it too."""
    from poolpilot.bench.policies.static_peak import StaticPool
    from poolpilot.engine_sim.engine import EngineConfig

    small = replace(CFG, engine=EngineConfig(gpu_memory_utilization=0.14))
    res = {}
    for gib in (0.0, 8.0):
        cfg = replace(small, kv_offloading_gib=gib)
        res[gib] = replay(chat, StaticPool({"prefill": 2, "decode": 1}), cfg).as_json()
    assert "host_hit_rate" not in res[0.0]
    assert res[8.0]["host_hit_rate"] > 0.05
    assert res[8.0]["prefix_hit_rate"] > res[0.0]["prefix_hit_rate"] + 0.05
    # the tier's hits are in the prefill engines' own hit rate (GPU + external hits)
    assert res[8.0]["prefix_hit_rate_by_role"]["prefill"] == pytest.approx(
        res[8.0]["prefix_hit_rate"], abs=0.02)


def test_bench_refuses_a_negative_offload_tier(tmp_path: Path, capsys) -> None:
    path = tmp_path / "t.csv"
    write_csv([TraceRequest(0.0, 100, 10)], path)
    assert cli_main(["bench", "--trace", str(path), "--kv-offload-gib", "-1"]) == 2
    assert "--kv-offload-gib must be a number >= 0" in capsys.readouterr().err


def test_the_simulated_routers_record_is_sized_as_the_operator_sizes_the_routers() -> None:
    """Without --prefix-max-entries the bench's router remembers what the operator's would
    for a pool of --max-replicas prefill engines with that offload tier."""
    from poolpilot.operator.router_objects import prefix_index_entries
    from poolpilot.router import prefix_index as pi

    from poolpilot import api

    for gib, replicas in ((0.0, 4), (64.0, 4), (256.0, 8), (1024.0, 32)):
        cfg = replace(CFG, kv_offloading_gib=gib, max_replicas=replicas)
        spec = api.InferencePoolSpec.model_validate({
            "model": {"name": "m"}, "prefill": {
                "maxReplicas": replicas, **({"kvOffload": f"{gib:g}Gi"} if gib else {})}})
        assert cfg.record_entries() == (prefix_index_entries(spec) or pi.DEFAULT_MAX_ENTRIES)
    assert replace(CFG, kv_offloading_gib=256.0, prefix_max_entries=7).record_entries() == 7
