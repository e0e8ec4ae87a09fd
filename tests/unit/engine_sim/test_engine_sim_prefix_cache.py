"""The engines' prefix cache (vLLM V1's automatic prefix caching): chained block hashes,
reference counts, LRU eviction inside the KV memory the sequences use, hits that skip prefill
compute (but not the attention over the cached context), vLLM's counters, P/D semantics."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.engine_sim.des import HASH_BLOCK_TOKENS, PoolSim, SimRequest
from poolpilot.engine_sim.engine import EngineConfig, EngineCore
from poolpilot.engine_sim.hardware import make_step_model
from poolpilot.engine_sim.prefix_cache import HostTier, PrefixCache, chain_hashes
from poolpilot.engine_sim.scheduler import Scheduler, Seq, SeqState

from poolpilot import metrics as m

SM = make_step_model("llama-3.1-8b", "h200")

# ---- chained hashes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Chain:
    name: str
    a: list[int]
    b: list[int]
    shared: int  # leading hashes equal
    lengths: tuple[int, int]


TOKENS = list(range(100, 164))  # 4 blocks of 16
CHAINS = [
    Chain("same-prompt", TOKENS, TOKENS, 4, (4, 4)),
    Chain("same-prefix-other-tail", TOKENS, TOKENS[:40] + [7] * 24, 2, (4, 4)),
    Chain("first-token-changed-changes-every-hash", TOKENS, [0, *TOKENS[1:]], 0, (4, 4)),
    Chain("partial-last-block-has-no-hash", TOKENS, TOKENS[:63], 3, (4, 3)),
    Chain("shorter-than-a-block", TOKENS, TOKENS[:15], 0, (4, 0)),
]


@pytest.mark.parametrize("case", CHAINS, ids=[c.name for c in CHAINS])
def test_chained_hashes(case: Chain) -> None:
    ha, hb = chain_hashes(case.a, 16), chain_hashes(case.b, 16)
    assert (len(ha), len(hb)) == case.lengths
    same = next((i for i, (x, y) in enumerate(zip(ha, hb, strict=False)) if x != y),
                min(len(ha), len(hb)))
    assert same == case.shared
    # after the first difference, no later hash matches either (each chains on its parent)
    assert not set(ha[same:]) & set(hb[same:])


@given(st.lists(st.integers(0, 2**31), min_size=32, max_size=200), st.integers(0, 31))
def test_a_changed_token_changes_its_block_and_all_later(tokens: list[int], at: int) -> None:
    changed = list(tokens)
    changed[at] += 1
    ha, hb = chain_hashes(tokens, 16), chain_hashes(changed, 16)
    first = at // 16
    assert ha[:first] == hb[:first]
    assert all(x != y for x, y in zip(ha[first:], hb[first:], strict=True))


# ---- the cache alone: references and LRU order -----------------------------------------------


def test_refcounts_and_lru_eviction_order() -> None:
    c = PrefixCache()
    for h in (1, 2, 3, 4):
        assert c.insert(h, 2)
    assert not c.insert(1, 2)  # a duplicate stays private to its sequence
    assert (c.pinned_blocks, c.evictable_blocks) == (8, 0)
    assert c.release([2, 1]) == 4  # a request frees its tail first ...
    assert c.release([4, 3]) == 4
    assert c.lru_order() == [2, 1, 4, 3]  # ... so its tail goes before its head
    assert c.acquire([1]) == 2  # a hit takes it off the free list
    assert c.acquire([1]) == 0  # a second user pins nothing new
    assert c.refs(1) == 2
    assert c.evict(3) == 4  # whole units, least recently used first: 2 then 4
    assert sorted(h for h in (1, 2, 3, 4) if h in c) == [1, 3]
    assert c.match([1, 2, 3]) == 1  # the longest cached prefix stops at the first miss
    assert c.release([1, 1]) == 2
    c.clear()
    assert len(c) == 0 and c.total_blocks == 0


# ---- the scheduler: the cache lives inside the KV memory --------------------------------------

PREFIXES = [chain_hashes(list(range(k * 1000, k * 1000 + 160)), 16) for k in range(3)]


@dataclass(frozen=True)
class Req:
    at_step: int
    prefix: int  # which shared prefix (of 10 blocks) it starts with
    shared_blocks: int  # how many of its blocks
    own_tokens: int
    output: int


reqs_st = st.lists(
    st.builds(Req, st.integers(0, 30), st.integers(0, 2), st.integers(0, 10),
              st.integers(1, 120), st.integers(1, 40)),
    min_size=1, max_size=20,
)


def _seq(i: int, r: Req) -> Seq:
    prompt = r.shared_blocks * 16 + r.own_tokens
    own = tuple(10**9 + i * 100 + j for j in range(r.own_tokens // 16))  # never shared
    return Seq(i, prompt, r.output, 0.0, block_hashes=PREFIXES[r.prefix][:r.shared_blocks] + own)


def check_memory(sched: Scheduler, live: list[Seq]) -> None:
    private = sum(s.blocks - s.shared_blocks for s in live)
    cache = sched.cache
    assert private + cache.total_blocks <= sched.num_blocks, "the cache outgrew the KV memory"
    assert sched.free_blocks == sched.num_blocks - private - cache.pinned_blocks
    assert 0 <= cache.evictable_blocks <= sched.free_blocks
    for s in live:
        assert s.shared_blocks <= s.blocks
        assert all(cache.refs(h) >= 1 for h in s.cached)


@settings(max_examples=60, deadline=None)
@given(reqs=reqs_st, num_blocks=st.integers(20, 60), budget=st.sampled_from([32, 256, 2048]))
def test_cache_stays_inside_kv_memory_and_everyone_finishes(reqs, num_blocks, budget) -> None:
    eng = EngineCore(SM, "engine", EngineConfig(max_num_batched_tokens=budget, max_num_seqs=4,
                                                max_chunk_steps=16))
    eng.sched = Scheduler(num_blocks, 16, budget, 4)
    seqs = [_seq(i, r) for i, r in enumerate(reqs)]
    seqs = [s for i, s in enumerate(seqs) if eng.sched.fits_ever(s)]
    now, step, added = 0.0, 0, []
    while step < 5000 and not (len(added) == len(seqs) and not eng.has_work()):
        for i, s in enumerate(seqs):
            if reqs[i].at_step == step and s not in added:
                eng.add(s)
                added.append(s)
        ch = eng.plan(now)
        live = [s for s in added if s.state is not SeqState.FINISHED]
        check_memory(eng.sched, live)
        if ch is not None:
            now = eng.commit().end
            check_memory(eng.sched, [s for s in added if s.state is not SeqState.FINISHED])
        step += 1
    assert all(s.state is SeqState.FINISHED and s.generated == s.max_output for s in seqs)
    # every block is free again; what stays cached is free too (evictable)
    assert eng.sched.free_blocks == num_blocks
    assert eng.sched.cache.pinned_blocks == 0
    # a hit never includes the prompt's last token, and counts whole KV blocks
    assert all(s.prefix_hit <= s.prompt - 1 and s.prefix_hit % 16 == 0 for s in seqs)


def test_preemption_drops_references_and_the_blocks_stay_cached() -> None:
    sched = Scheduler(30, 16, 4096, 8)
    hashes = chain_hashes(list(range(320)), 16)  # 20 blocks
    a = Seq("a", 320, 100, 0.0, block_hashes=hashes)
    sched.add(a)
    plan = sched.schedule()
    a.computed = 320
    sched.cache_computed(a)
    assert plan.items == [(a, 320)] and a.shared_blocks == 20
    sched._preempt(sched.running.pop())
    assert a.cached == [] and sched.cache.pinned_blocks == 0
    assert sched.cache.evictable_blocks == 20 and sched.free_blocks == 30
    plan = sched.schedule()  # re-admitted: its own blocks hit (all but the last block)
    assert plan.items == [(a, 16)] and a.prefix_hit == 304
    # a preempted request's second lookup is not a new query (vLLM counts it apart)
    assert (sched.prefix_queries, sched.prefix_hits) == (320, 0)


def test_eviction_takes_the_least_recently_used_free_units() -> None:
    sched = Scheduler(24, 16, 4096, 8)
    old, new = chain_hashes([1] * 160, 16), chain_hashes([2] * 160, 16)  # 10 blocks each
    for rid, h in (("old", old), ("new", new)):
        s = Seq(rid, 161, 1, 0.0, block_hashes=h)
        sched.add(s)
        sched.schedule()
        s.computed = 161
        sched.cache_computed(s)
        sched.finish(s)
    assert sched.free_blocks == 24 and sched.cache.evictable_blocks == 20
    big = Seq("big", 200, 1, 0.0)  # 13 blocks: 4 empty + 9 evicted, all from "old" ...
    sched.add(big)
    sched.schedule()
    assert sched.cache.match(new) == 10
    assert sched.cache.match(old) == 1  # ... its tail first: its first block is still there
    assert sched.free_blocks == 24 - 13


# ---- the engine: a hit shortens the prefill, not the context it attends to -------------------


def _prefill(eng: EngineCore, seq: Seq) -> tuple[int, float]:
    eng.add(seq)
    ch = eng.plan(eng.busy_until)
    assert ch is not None
    (_s, n), = ch.items
    dur = ch.end - ch.start
    eng.commit()
    while eng.has_work():
        if eng.plan(eng.busy_until) is not None:
            eng.commit()
    return n, dur


def test_a_hit_prices_only_new_tokens_against_the_whole_context() -> None:
    eng = EngineCore(SM, "engine")
    ids = chain_hashes(list(range(4096)), 16)
    cold_n, cold = _prefill(eng, Seq(0, 4100, 2, 0.0, block_hashes=ids))
    warm_n, warm = _prefill(eng, Seq(1, 4100, 2, 0.0, block_hashes=ids))
    assert (cold_n, warm_n) == (4100, 4)  # 4096 cached tokens skipped
    assert warm < cold
    # the 4 new tokens attend to the 4096 cached ones: priced as such, not as a fresh prompt
    assert warm == pytest.approx(SM.step_time([(4, 4096)]))
    assert warm > SM.step_time([(4, 0)])
    snap = eng.snapshot()
    assert snap.counters[m.VLLM_PREFIX_CACHE_QUERIES] == 8200
    assert snap.counters[m.VLLM_PREFIX_CACHE_HITS] == 4096
    assert snap.counters[m.VLLM_PROMPT_TOKENS] == 8200  # vLLM counts every prompt token


def test_caching_off_or_no_hashes_changes_nothing() -> None:
    def run(enable: bool, with_ids: bool) -> list[float]:
        sim = PoolSim(mode="aggregated", engine_replicas=1,
                      config=EngineConfig(enable_prefix_caching=enable))
        for i in range(20):
            ids = tuple(range(4)) if with_ids else ()
            sim.submit(SimRequest(i, i * 0.05, 2000, 50, ids))
        sim.run()
        return [r.ttft or 0.0 for r in sim.records()]

    assert run(True, False) == run(False, False) == run(False, True)
    assert sum(run(True, True)) < sum(run(False, True))


# ---- the pool: P/D and local prefill ----------------------------------------------------------


def _ids(tag: int, blocks: int) -> tuple[int, ...]:
    return tuple(tag * 1000 + i for i in range(blocks))


def test_pd_prefill_cache_serves_and_decode_caches_what_it_receives() -> None:
    sim = PoolSim(mode="disaggregated", prefill_replicas=1, decode_replicas=1)
    ids = _ids(1, 8)  # 4096 tokens
    sim.submit(SimRequest("a", 0.0, 4000, 5, ids))
    sim.submit(SimRequest("b", 5.0, 4000, 5, ids))
    sim.run()
    a, b = sorted(sim.records(), key=lambda r: r.id)
    assert (a.prefix_hit_tokens, b.prefix_hit_tokens) == (0, 3984)
    assert b.ttft < a.ttft
    # the decode engine cached a's KV on arrival: b's transfer moves only the rest
    assert b.kv_transfer_time < a.kv_transfer_time
    snaps = sim.metrics()
    for role in ("prefill", "decode"):
        assert snaps[role].counters[m.VLLM_PREFIX_CACHE_QUERIES] == 8000
        assert snaps[role].counters[m.VLLM_PREFIX_CACHE_HITS] == 3984


def test_local_prefill_on_a_decode_engine_uses_that_engines_cache() -> None:
    eng = EngineCore(SM, "decode")
    ids = _ids(2, 4)  # 2048 tokens
    remote = Seq("pd", 2000, 3, 0.0, remote_prefill=True, block_hashes=ids,
                 hash_block_tokens=HASH_BLOCK_TOKENS)
    eng.add(remote)
    eng.plan(0.0)
    assert remote.state is SeqState.LOADING
    while eng.has_work() or eng.sched.loading:
        t = eng.next_load_at() if not eng.has_work() else eng.busy_until
        if eng.plan(t or eng.busy_until) is not None:
            eng.commit()
    assert eng.sched.cache.match(ids) == 4  # the received KV is cached, the last unit too
    local = Seq("local", 2000, 3, eng.busy_until, block_hashes=ids,
                hash_block_tokens=HASH_BLOCK_TOKENS)
    n, _ = _prefill(eng, local)
    assert local.prefix_hit == 1984 and n == 16


pool_reqs = st.lists(
    st.tuples(st.floats(0, 5), st.integers(0, 3), st.integers(0, 12), st.integers(1, 1500),
              st.integers(1, 300)),
    min_size=1, max_size=40,
)


@settings(max_examples=30, deadline=None)
@given(reqs=pool_reqs, mode=st.sampled_from(["aggregated", "disaggregated"]))
def test_a_pool_under_kv_pressure_serves_everyone_and_gives_every_block_back(reqs, mode) -> None:
    """Shared prefixes, a KV cache of ~23k tokens per engine (preemption and eviction), P/D
    or aggregated: every request finishes and every engine ends with all blocks free."""
    small = EngineConfig(gpu_memory_utilization=0.15)
    sim = PoolSim(mode=mode, prefill_replicas=1, decode_replicas=2, engine_replicas=2,
                  config=small)
    for i, (t, tag, blocks, own, out) in enumerate(sorted(reqs)):
        ids = _ids(tag, blocks) + (10**6 + i,) * (own > 0)
        sim.submit(SimRequest(i, t, blocks * HASH_BLOCK_TOKENS + own, out, ids))
    sim.run()
    recs = sim.records()
    assert len(recs) == len(reqs) and all(r.ok for r in recs)
    for rep in sim.replicas.values():
        sched = rep.engine.sched
        assert sched.free_blocks == sched.num_blocks and sched.cache.pinned_blocks == 0
        assert sched.cache.evictable_blocks <= sched.num_blocks
        assert sched.prefix_hits <= sched.prefix_queries


# ---- the CPU offload tier (vLLM's --kv-offloading-size) --------------------------------------


def test_host_tier_is_an_lru_bounded_by_its_blocks() -> None:
    tier = HostTier(10)
    for h in (1, 2, 3):
        tier.store(h, 4)  # 12 blocks > 10: the least recent (1) goes
    assert (1 in tier, tier.used_blocks, tier.evicted) == (False, 8, 1)
    tier.touch([2])  # loaded back: now the most recent
    tier.store(4, 4)
    assert (2 in tier, 3 in tier, 4 in tier) == (True, False, True)
    tier.store(5, 11)  # larger than the tier: not kept, nothing evicted for it
    assert 5 not in tier and tier.used_blocks == 8
    assert tier.match([2, 4, 9, 4]) == 2
    with pytest.raises(ValueError, match="capacity_blocks"):
        HostTier(0)


def _run_one(eng: EngineCore, seq: Seq) -> Seq:
    eng.add(seq)
    now = eng.busy_until
    while eng.has_work() or eng.sched.loading:
        # (no chunk: only a load in flight, and the clock goes to its end)
        now = eng.commit().end if eng.plan(now) is not None else eng.next_load_at() or now
    return seq


def test_a_prefix_evicted_from_the_gpu_is_loaded_back_from_the_host_tier() -> None:
    """A prompt whose blocks the GPU cache evicted but host memory kept is loaded back over
    PCIe, not recomputed: vLLM's external prefix-cache counters say so, its first token comes
    sooner than a recompute's, and without the tier the same prompt is computed again."""
    def engine(offload_gib: float) -> EngineCore:
        eng = EngineCore(SM, "engine", EngineConfig(kv_offloading_gib=offload_gib))
        eng.sched = Scheduler(300, 16, 8192, 8, True,
                              SM.host_tier_blocks(offload_gib * 2**30))
        return eng

    ids = chain_hashes(list(range(4096)), 16)  # 256 blocks
    other = chain_hashes(list(range(10**6, 10**6 + 4096)), 16)
    seen = {}
    for gib in (0.0, 1.0):  # 1 GiB: 8192 tokens of an 8B model's KV
        eng = engine(gib)
        _run_one(eng, Seq("a", 4100, 2, 0.0, block_hashes=ids))
        _run_one(eng, Seq("b", 4100, 2, 0.0, block_hashes=other))  # evicts a's blocks
        assert eng.sched.cache.match(ids) < 256
        again = _run_one(eng, Seq("c", 4100, 2, 0.0, block_hashes=ids))
        assert again.first_token_at is not None and again.first_scheduled_at is not None
        seen[gib] = (again, again.first_token_at - again.first_scheduled_at, eng.snapshot())
    cold, cold_ttft, cold_snap = seen[0.0]
    warm, warm_ttft, warm_snap = seen[1.0]
    assert cold.prefix_hit + cold.host_hit < 4096 and cold.host_hit == 0
    assert warm.prefix_hit + warm.host_hit == 4096  # all but the last (partial) block
    assert warm.host_hit > 0
    assert warm_ttft < cold_ttft / 3  # a 4k-token copy is far cheaper than its prefill
    assert m.VLLM_EXTERNAL_PREFIX_CACHE_HITS not in cold_snap.counters  # no connector, no series
    assert warm_snap.counters[m.VLLM_EXTERNAL_PREFIX_CACHE_HITS] == warm.host_hit
    # the loaded blocks are cached on the GPU again: a fourth request hits them there
    fourth = _run_one(eng, Seq("d", 4100, 2, 0.0, block_hashes=ids))
    assert (fourth.prefix_hit, fourth.host_hit) == (4096, 0)
    assert eng.sched.free_blocks == 300  # every block given back


@settings(max_examples=40, deadline=None)
@given(reqs=reqs_st, num_blocks=st.integers(20, 60), host=st.integers(1, 80))
def test_with_a_host_tier_the_cache_stays_inside_kv_memory_and_everyone_finishes(
        reqs, num_blocks, host) -> None:
    eng = EngineCore(SM, "engine", EngineConfig(max_num_seqs=4, max_chunk_steps=16))
    eng.sched = Scheduler(num_blocks, 16, 256, 4, True, host)
    seqs = [s for i, r in enumerate(reqs) if eng.sched.fits_ever(s := _seq(i, r))]
    now, step, added = 0.0, 0, []
    while step < 5000 and not (len(added) == len(seqs) and not eng.has_work()
                               and not eng.sched.loading):
        for s in seqs:
            if reqs[s.rid].at_step == step and s not in added:
                eng.add(s)
                added.append(s)
        ch = eng.plan(now)
        check_memory(eng.sched, [s for s in added if s.state is not SeqState.FINISHED])
        if ch is not None:
            now = eng.commit().end
        elif eng.next_load_at() is not None:
            now = max(now, eng.next_load_at() or now)
        step += 1
    assert all(s.state is SeqState.FINISHED and s.generated == s.max_output for s in seqs)
    assert eng.sched.free_blocks == num_blocks and eng.sched.cache.pinned_blocks == 0
    assert eng.sched.host is not None and eng.sched.host.used_blocks <= host
    assert all((s.prefix_hit + s.host_hit) <= s.prompt - 1 for s in seqs)
