"""Local prefill on decode engines: chunks sized from the ITL budget, and the router's
fallback rule driving the discrete-event pool."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from poolpilot.engine_sim.des import LocalPrefill, PoolSim, SimRequest
from poolpilot.engine_sim.engine import EngineConfig, EngineCore
from poolpilot.engine_sim.hardware import make_step_model
from poolpilot.engine_sim.scheduler import Seq

from poolpilot import metrics as m


def decode_engine_with_batch(itl_budget: float | None, batch: int = 64) -> EngineCore:
    """A decode engine whose `batch` sequences (2,048-token prompts, KV from a remote
    prefill) are decoding at t=1 s, planned step by step."""
    core = EngineCore(make_step_model("llama-3.1-8b", "h200"), "decode",
                      EngineConfig(itl_budget=itl_budget, max_chunk_steps=1))
    for i in range(batch):
        core.add(Seq(i, 2048, 1000, 0.0, remote_prefill=True))
    assert core.plan(0.0) is None  # only the KV loads start
    core.started_loads.clear()
    core.plan(1.0)
    core.commit()
    return core


@dataclass(frozen=True)
class ChunkCase:
    name: str
    itl_budget: float | None
    prompt: int


CHUNK_CASES = [
    ChunkCase("no-budget-whole-prompt-in-one-step", None, 6000),
    ChunkCase("50ms-budget", 0.05, 6000),
    ChunkCase("30ms-budget", 0.03, 6000),
]


@pytest.mark.parametrize("case", CHUNK_CASES, ids=lambda c: c.name)
def test_decode_engine_sizes_prompt_chunks_from_its_itl_budget(case: ChunkCase) -> None:
    core = decode_engine_with_batch(case.itl_budget)
    t = core.busy_until
    core.add(Seq("local", case.prompt, 10, t))
    chunks, steps = [], []
    while True:
        ch = core.plan(t)
        assert ch is not None
        mine = [n for s, n in ch.items if s.rid == "local"]
        out = core.commit()
        steps.append(ch.end - ch.start)
        t = ch.end
        if mine:
            chunks.append(mine[0])
        if any(s.rid == "local" for s in out.first_tokens):
            break
    assert sum(chunks) == case.prompt
    if case.itl_budget is None:  # vLLM's token budget alone: one 6,000-token step
        assert chunks == [case.prompt] and steps[0] > 0.1
    else:
        # every mixed step keeps the decode batch within the budget, and takes the most it can
        assert max(steps) <= case.itl_budget
        sm = core.model
        done = 0
        for i, c in enumerate(chunks[:-1]):  # the batch's context grows a token a step
            assert c == sm.max_chunk_within(case.itl_budget, 64, 64 * (2048 + i), done,
                                            case.prompt - done)
            done += c
        assert len(chunks) >= 3


def burst(seed: int = 1) -> list[SimRequest]:
    """4 req/s for 40 s with a 60 req/s burst between 5 and 8 s (prompts 1-3k tokens)."""
    rng = np.random.default_rng(seed)
    out, t = [], 0.0
    while True:
        t += rng.exponential(1 / (60 if 5 <= t < 8 else 4))
        if t >= 40:
            return out
        out.append(SimRequest(len(out), t, int(rng.integers(1000, 3000)),
                              int(rng.integers(50, 300))))


def run_pool(local: LocalPrefill | None, reqs: list[SimRequest]) -> PoolSim:
    sim = PoolSim("llama-3.1-8b", "h200", prefill_replicas=1, decode_replicas=1,
                  local_prefill=local)
    sim.submit_many(reqs)
    sim.run()
    return sim


def attainment(sim: PoolSim, ttft: float, itl: float) -> float:
    recs = sim.records()
    return sum(1 for r in recs if r.ttft is not None and r.ttft <= ttft
               and (r.itl_p90 or 0.0) <= itl) / len(recs)


def test_fallback_absorbs_a_burst_on_the_decode_engine_and_returns_to_pd() -> None:
    reqs = burst()
    off = run_pool(None, reqs)
    on = run_pool(LocalPrefill(ttft_s=1.0, itl_s=0.05), reqs)
    local = [r for r in on.records() if r.local_prefill]
    assert local and not any(r.local_prefill for r in off.records())
    assert on.local_prefill_total == {"prefill_behind": len(local)}
    assert all(r.ok and r.prefill_replica is None and r.kv_transfer_time is None for r in local)
    # only while prefill was behind: the burst and the queue it left, not the quiet tail
    assert all(5.0 <= r.arrival < 12.0 for r in local)
    # the prefill role did the rest of the prompts; the decode engine prefilled the local ones
    prefill_prompts = on.metrics()["prefill"].counters[m.VLLM_PROMPT_TOKENS]
    assert prefill_prompts == sum(r.prompt_tokens for r in reqs) - sum(
        r.prompt_tokens for r in local)
    # the decode batch kept its ITL target through the mixed steps
    itl = on.metrics()["decode"].histograms[m.VLLM_ITL]
    at_target = dict(itl.cumulative())[0.05]
    assert at_target == itl.count
    assert max(r.itl_p90 or 0.0 for r in on.records()) <= 0.05
    # what it buys: more requests within the SLO, first tokens sooner in the burst
    assert attainment(on, 1.0, 0.05) > attainment(off, 1.0, 0.05) + 0.05
    ttft_on = np.percentile([r.ttft for r in on.records()], 90)
    ttft_off = np.percentile([r.ttft for r in off.records()], 90)
    assert ttft_on < 0.8 * ttft_off


def test_fallback_stays_off_while_prefill_keeps_up() -> None:
    quiet = [r for r in burst() if not 5 <= r.arrival < 12]
    sim = run_pool(LocalPrefill(ttft_s=1.0, itl_s=0.05), quiet)
    assert sim.local_prefill_total == {}
    assert all(r.prefill_replica is not None for r in sim.records())


def test_fallback_needs_positive_targets() -> None:
    with pytest.raises(ValueError, match="ttft_s and itl_s > 0"):
        LocalPrefill(ttft_s=0.0, itl_s=0.05)
