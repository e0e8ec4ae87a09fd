"""Scheduler invariants (Hypothesis): nothing lost or duplicated, KV never over capacity,
every admitted request finishes, FIFO admission, budgets respected."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.engine_sim.engine import EngineConfig, EngineCore
from poolpilot.engine_sim.hardware import make_step_model
from poolpilot.engine_sim.scheduler import Scheduler, Seq, SeqState

SM = make_step_model("llama-3.2-1b", "l40s")


@dataclass(frozen=True)
class Req:
    at_step: int
    prompt: int
    output: int
    remote: bool


reqs_st = st.lists(
    st.builds(Req, st.integers(0, 30), st.integers(1, 300), st.integers(1, 60), st.booleans()),
    min_size=1, max_size=25,
)


def drive(reqs: list[Req], num_blocks: int, budget: int, max_seqs: int, chunk: int):
    eng = EngineCore(SM, "decode", EngineConfig(max_num_batched_tokens=budget,
                                                max_num_seqs=max_seqs, max_chunk_steps=chunk))
    eng.sched = Scheduler(num_blocks, 16, budget, max_seqs)
    seqs = [Seq(i, r.prompt, r.output, 0.0, remote_prefill=r.remote) for i, r in enumerate(reqs)]
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i].at_step, i))
    added: list[Seq] = []
    admitted: list[Seq] = []
    now, step = 0.0, 0
    while step < 5000:
        for i in order:
            if reqs[i].at_step == step and seqs[i] not in added:
                eng.add(seqs[i])
                added.append(seqs[i])
        check_invariants(eng.sched, added, num_blocks)
        before = {id(s) for s in added if s.first_scheduled_at is not None}
        ch = eng.plan(now)
        admitted += [s for s in added if s.first_scheduled_at is not None
                     and id(s) not in before]
        if ch is None:
            nxt = eng.next_load_at()
            if nxt is not None:
                now = nxt
            elif len(added) == len(seqs):
                break
            step += 1
            continue
        assert sum(n for _, n in ch.items) <= budget
        assert len(eng.sched.running) <= max_seqs
        out = eng.commit()
        now = out.end
        step += 1
        check_invariants(eng.sched, added, num_blocks)
    return eng, seqs, added, admitted


def check_invariants(sched: Scheduler, added: list[Seq], num_blocks: int) -> None:
    places = [list(sched.waiting), sched.running, sched.loading, list(sched.ready)]
    ids = [id(s) for p in places for s in p]
    assert len(ids) == len(set(ids)), "a request is in two queues"
    unfinished = {id(s) for s in added if s.state is not SeqState.FINISHED}
    assert set(ids) == unfinished, "a request was lost"
    used = sum(s.blocks for s in added)
    assert used == num_blocks - sched.free_blocks
    assert 0 <= sched.free_blocks <= num_blocks
    for s in sched.running:
        assert s.blocks * 16 >= s.computed


@settings(max_examples=60, deadline=None)
@given(reqs=reqs_st, num_blocks=st.integers(25, 80), budget=st.sampled_from([64, 256, 2048]),
       max_seqs=st.integers(1, 8), chunk=st.sampled_from([1, 64]))
def test_scheduler_invariants(reqs, num_blocks, budget, max_seqs, chunk) -> None:
    eng, seqs, added, admitted = drive(reqs, num_blocks, budget, max_seqs, chunk)
    # every request that fits the cache at all finishes, with exactly its tokens
    for s in seqs:
        assert s.state is SeqState.FINISHED, f"{s.rid} did not finish ({s.state})"
        assert s.generated == s.max_output
        assert s.first_token_at is not None and s.finished_at >= s.first_token_at
    assert eng.sched.free_blocks == num_blocks  # every block came back
    # FIFO: requests are first scheduled in the order they arrived
    assert [s.rid for s in admitted] == [s.rid for s in added]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 12), prompt=st.integers(200, 400))
def test_kv_pressure_preempts_newest_and_still_finishes_everyone(n: int, prompt: int) -> None:
    reqs = [Req(0, prompt, 200, False) for _ in range(n)]
    blocks = (prompt + 200) // 16 + 2  # room for little more than one request at its longest
    eng, seqs, _, _ = drive(reqs, blocks, 2048, 16, 64)
    assert all(s.state is SeqState.FINISHED for s in seqs)
    # the oldest is never the victim while younger ones run
    assert seqs[0].preemptions == 0
    assert eng.sched.num_preemptions == sum(s.preemptions for s in seqs)
