"""The simulated router's prefix-aware routing (PoolSim(routing="prefix-aware")): the router's
own rule over its record of what it sent where, keyed by the requests' hash_ids."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

import pytest
from poolpilot.engine_sim.des import LocalPrefill, PoolSim, RequestRecord, SimRequest

BLOCK = 512


def sessions(n: int = 16, turns: int = 5, seed: int = 1, system_blocks: int = 0,
             gap: tuple[float, float] = (2.0, 4.0)) -> list[SimRequest]:
    """Multi-turn conversations: each turn's prompt is the previous turn's plus 2-4 blocks;
    with `system_blocks`, every session starts with the same system prompt."""
    rng = random.Random(seed)
    system = list(range(1, system_blocks + 1))
    reqs = []
    next_id = 1000
    for s in range(n):
        ids = list(system)
        t = rng.uniform(0, 5)
        for k in range(turns):
            add = rng.randint(2, 4)
            ids += range(next_id, next_id + add)
            next_id += add
            reqs.append(SimRequest((s, k), t, len(ids) * BLOCK - 100, 50, tuple(ids)))
            t += rng.uniform(*gap)
    return sorted(reqs, key=lambda r: r.arrival)


def ideal_hit_rate(reqs: list[SimRequest]) -> float:
    """Every block an earlier request had is a hit (an infinite cache reachable from
    anywhere)."""
    seen: set[int] = set()
    hit = 0
    for r in reqs:
        for i, h in enumerate(r.hash_ids):
            if h in seen:
                hit += min(BLOCK, r.prompt_tokens - i * BLOCK)
        seen.update(r.hash_ids)
    return hit / sum(r.prompt_tokens for r in reqs)


def run(reqs: list[SimRequest], routing: str, mode: str = "disaggregated",
        **kw: object) -> tuple[PoolSim, list[RequestRecord]]:
    sim = PoolSim(mode=mode, prefill_replicas=4, decode_replicas=2, engine_replicas=4,
                  routing=routing, **kw)
    sim.submit_many(reqs)
    sim.run()
    recs = sim.records()
    assert len(recs) == len(reqs) and all(r.ok for r in recs)
    return sim, recs


def hit_rate(recs: list[RequestRecord]) -> float:
    return sum(r.prefix_hit_tokens for r in recs) / sum(r.prompt_tokens for r in recs)


def engine_of(r: RequestRecord, mode: str) -> int | None:
    return r.prefill_replica if mode == "disaggregated" else r.decode_replica


@dataclass(frozen=True)
class Case:
    id: str
    mode: str
    reqs: list[SimRequest]
    engines_per_conversation: float  # at most, on average


CASES = [
    Case("P/D, conversations", "disaggregated", sessions(), 1.0),
    # An aggregated engine holds each request until its last token: more often over the
    # bound, so a turn now and then moves (and its engine holds the history from then on).
    Case("aggregated, conversations", "aggregated", sessions(), 1.25),
    # Every first turn matches the engine that served the system prompt first: the bound
    # spreads them. Each engine holds the system prompt then, and the router charges a
    # request's prompt until its last token: a turn finding its engine still busy with a
    # long turn of another conversation goes to one that holds the system prompt alone.
    Case("aggregated, conversations under a shared system prompt", "aggregated",
         sessions(system_blocks=4, seed=2), 1.75),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_prefix_aware_keeps_a_conversation_on_its_engine_and_hits_more(case: Case) -> None:
    _, least = run(case.reqs, "least-loaded", case.mode)
    sim, aware = run(case.reqs, "prefix-aware", case.mode)
    engines = defaultdict(set)
    for r in aware:
        engines[r.id[0]].add(engine_of(r, case.mode))
    # a conversation stays on its engine: the turns find their history there
    assert sum(len(e) for e in engines.values()) <= len(engines) * case.engines_per_conversation
    assert hit_rate(aware) > hit_rate(least)
    assert hit_rate(aware) >= 0.9 * ideal_hit_rate(case.reqs)
    assert sim.prefix_choices.get("prefix", 0) > 0


def test_least_loaded_is_the_default_and_ignores_prefixes() -> None:
    reqs = sessions(n=8)
    sim_default = PoolSim(prefill_replicas=4, decode_replicas=2)
    sim_default.submit_many(reqs)
    sim_default.run()
    _, least = run(reqs, "least-loaded")
    assert [(r.id, r.prefill_replica) for r in sim_default.records()] == \
        [(r.id, r.prefill_replica) for r in least]
    assert sim_default.prefix_choices == {}


def test_without_hash_ids_prefix_aware_routes_as_least_loaded() -> None:
    reqs = [SimRequest(i, i * 0.01, 2000, 20) for i in range(200)]
    _, least = run(reqs, "least-loaded")
    sim, aware = run(reqs, "prefix-aware")
    assert [(r.id, r.prefill_replica, r.decode_replica) for r in least] == \
        [(r.id, r.prefill_replica, r.decode_replica) for r in aware]
    assert set(sim.prefix_choices) == {"no_match"}


def test_a_hot_prefix_under_load_is_spread_by_the_bound() -> None:
    """Every request shares one 16-block prefix and they arrive faster than one engine can
    prefill them: the excess goes to the other engines (which then hold it too)."""
    hot = tuple(range(1, 17))
    reqs = [SimRequest(i, i * 0.002, 17 * BLOCK, 10, (*hot, 10_000 + i)) for i in range(400)]
    sim, aware = run(reqs, "prefix-aware")
    per_engine: defaultdict[int | None, int] = defaultdict(int)
    for r in aware:
        per_engine[r.prefill_replica] += 1
    assert len(per_engine) == 4
    assert max(per_engine.values()) < 0.5 * len(reqs)
    # the holder's work in flight outweighs what its prefix saves, or the bound refuses it
    assert sim.prefix_choices.get("load", 0) + sim.prefix_choices.get("bound", 0) > 0


def test_local_prefill_goes_to_the_decode_engine_holding_the_prefix() -> None:
    """No prefill engine: every request is prefilled on a decode engine (the fallback), and
    each conversation's turns go to the decode engine that prefilled the earlier ones."""
    reqs = sessions(n=6, turns=4, gap=(1.0, 2.0))
    results = {}
    for routing in ("least-loaded", "prefix-aware"):
        sim = PoolSim(prefill_replicas=0, decode_replicas=3, routing=routing,
                      local_prefill=LocalPrefill(ttft_s=0.5, itl_s=0.05))
        sim.submit_many(reqs)
        sim.run()
        recs = sim.records()
        assert len(recs) == len(reqs) and all(r.local_prefill for r in recs)
        engines = defaultdict(set)
        for r in recs:
            engines[r.id[0]].add(r.decode_replica)
        results[routing] = (hit_rate(recs), sum(len(e) for e in engines.values()))
    assert results["prefix-aware"][1] == 6  # one engine per conversation
    assert results["prefix-aware"][0] > results["least-loaded"][0]


def test_routing_must_be_known() -> None:
    with pytest.raises(ValueError, match="routing"):
        PoolSim(routing="random")


# --- the router's load measure: requests and the prompt tokens they bring -------------------


def prefill_engines(routing: str, reqs: list[SimRequest]) -> dict[object, int | None]:
    sim = PoolSim("llama-3.1-8b", "h200", prefill_replicas=2, decode_replicas=2,
                  routing=routing)
    sim.submit_many(reqs)
    sim.run()
    return {r.id: r.prefill_replica for r in sim.records()}


@pytest.mark.parametrize("routing", ["least-loaded", "prefix-aware"])
def test_a_long_prompt_in_flight_weighs_as_the_work_it_brings(routing: str) -> None:
    # A 16k-token prompt goes to engine 0; two short ones follow at once. Counting requests,
    # the second short one ties 1 to 1 and joins the long prompt's queue; the router's
    # measure (requests + prompt tokens in flight / 512) sends both to engine 1.
    reqs = [SimRequest("long", 0.0, 16384, 10, tuple(range(100, 132))),
            SimRequest("short-1", 0.001, 100, 10, (200,)),
            SimRequest("short-2", 0.002, 100, 10, (300,))]
    got = prefill_engines(routing, reqs)
    assert got == {"long": 0, "short-1": 1, "short-2": 1}


def test_a_held_prefix_is_not_charged_as_work() -> None:
    # Engine 0 served a 16k-token prompt; two turns extending it go back to it (a block each
    # to compute), and a new 16k-token prompt goes to the idle engine 1. A short request
    # then finds engine 0 with two requests but ~2 blocks of work, engine 1 with one request
    # and 32 blocks: it goes to 0. Charging whole prompts (or counting requests) sends it to 1.
    first = tuple(range(1, 33))
    reqs = [SimRequest("first", 0.0, 32 * BLOCK, 10, first),
            SimRequest("turn-1", 5.0, 33 * BLOCK, 10, (*first, 33)),
            SimRequest("turn-2", 5.001, 33 * BLOCK, 10, (*first, 34)),
            SimRequest("other", 5.002, 32 * BLOCK, 10, tuple(range(100, 132))),
            SimRequest("short", 5.003, 100, 10, (200,))]
    got = prefill_engines("prefix-aware", reqs)
    assert got == {"first": 0, "turn-1": 0, "turn-2": 0, "other": 1, "short": 0}
