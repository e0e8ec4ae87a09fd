"""PoolSim: the discrete-event pool simulator's behaviour as the benchmark relies on it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.engine_sim.des import PoolSim, SimRequest
from poolpilot.engine_sim.engine import EngineConfig

from poolpilot import metrics as m


def poisson(rate: float, seconds: float, seed: int = 0, prompt=(100, 3000), out=(20, 400)):
    rng = np.random.default_rng(seed)
    t, i, reqs = 0.0, 0, []
    while True:
        t += rng.exponential(1 / rate)
        if t >= seconds:
            return reqs
        reqs.append(SimRequest(i, t, int(rng.integers(*prompt)), int(rng.integers(*out))))
        i += 1


@dataclass(frozen=True)
class ModeCase:
    mode: str
    kwargs: dict
    roles: tuple[str, ...]


MODES = [
    ModeCase("disaggregated", {"prefill_replicas": 1, "decode_replicas": 2}, ("prefill", "decode")),
    ModeCase("aggregated", {"engine_replicas": 2}, ("engine",)),
]


@pytest.mark.parametrize("case", MODES, ids=lambda c: c.mode)
def test_every_request_finishes_once_with_its_tokens(case: ModeCase) -> None:
    reqs = poisson(8, 60)
    sim = PoolSim("llama-3.1-8b", "h200", mode=case.mode, **case.kwargs)
    sim.submit_many(reqs)
    sim.run()
    recs = sim.records()
    assert sorted(r.id for r in recs) == [r.id for r in reqs]
    by_id = {r.id: r for r in recs}
    for q in reqs:
        r = by_id[q.id]
        assert r.ok and r.output_tokens == q.output_tokens
        assert q.arrival < r.first_token_at <= r.finished_at
        if q.output_tokens > 1:
            assert r.itl_p90 is not None and r.itl_p90 > 0
    snap = sim.metrics()[case.roles[-1]]
    assert snap.counters[m.VLLM_GENERATION_TOKENS] == sum(q.output_tokens for q in reqs)
    assert snap.histograms[m.VLLM_TTFT].count == len(reqs)
    assert snap.success["length"] == len(reqs)
    assert sim.in_flight() == 0


def test_disaggregated_spreads_over_replicas_and_pays_the_kv_handoff() -> None:
    sim = PoolSim("llama-3.1-8b", "h200", prefill_replicas=2, decode_replicas=3)
    sim.submit_many(poisson(10, 30))
    sim.run()
    recs = sim.records()
    assert {r.prefill_replica for r in recs} == {0, 1}
    assert {r.decode_replica for r in recs} == {2, 3, 4}
    for r in recs:
        assert r.kv_transfer_time == pytest.approx(sim.step_model.kv_transfer_time(r.prompt_tokens))
    xfer = sim.metrics()["decode"].histograms[m.VLLM_NIXL_XFER_TIME]
    assert xfer.count == len(recs)


def test_ttft_grows_with_prompt_length_and_with_queueing() -> None:
    lengths = [128, 1024, 4096, 16384]
    ttfts = []
    for i, n in enumerate(lengths):  # one request at a time: prompt length alone
        sim = PoolSim("llama-3.1-8b", "h100", prefill_replicas=1, decode_replicas=1)
        sim.submit(SimRequest(i, 0.0, n, 10))
        sim.run()
        ttfts.append(sim.records()[0].ttft)
    assert ttfts == sorted(ttfts) and ttfts[-1] > 10 * ttfts[0]
    # the same 2k-token prompt, 1 vs 40 at once: the last in line waits for the others
    alone = PoolSim("llama-3.1-8b", "h100", mode="aggregated")
    alone.submit(SimRequest(0, 0.0, 2048, 10))
    alone.run()
    burst = PoolSim("llama-3.1-8b", "h100", mode="aggregated")
    burst.submit_many([SimRequest(i, 0.0, 2048, 10) for i in range(40)])
    burst.run()
    worst = max(r.ttft for r in burst.records())
    assert worst > 10 * alone.records()[0].ttft


def test_cold_start_replica_serves_only_once_ready() -> None:
    sim = PoolSim("llama-3.1-8b", "h200", prefill_replicas=0, decode_replicas=1)
    rid = sim.add_replica("prefill", ready_at=30.0)
    assert sim.replica_counts("prefill") == (0, 1, 0)
    sim.submit_many([SimRequest(i, float(i), 500, 20) for i in range(5)])
    sim.run_until(29.0)
    assert sim.pending("prefill") == 5 and sim.records() == []
    sim.run()
    assert sim.replica_counts("prefill").ready == 1
    assert all(r.first_token_at > 30.0 and r.prefill_replica == rid for r in sim.records())


def test_remove_replica_drains_then_leaves_and_cancels_starting_ones_first() -> None:
    sim = PoolSim("llama-3.1-8b", "h200", mode="aggregated", engine_replicas=2)
    sim.submit_many([SimRequest(i, 0.0, 1000, 2000) for i in range(8)])
    sim.run_until(0.5)
    late = sim.add_replica("engine", ready_at=100.0)
    assert sim.remove_replica("engine") == late  # a starting replica goes at once
    assert sim.replica_counts("engine") == (2, 0, 0)
    drained = sim.remove_replica("aggregated")
    assert sim.replica_counts("engine") == (1, 0, 1)
    sim.submit(SimRequest(99, 1.0, 100, 10))
    sim.run()
    assert sim.replica_counts("engine") == (1, 0, 0)
    recs = {r.id: r for r in sim.records()}
    assert len(recs) == 9 and all(r.ok for r in recs.values())
    assert recs[99].decode_replica != drained  # no new work on a draining replica
    # the drained engine's counts stay in the role's cumulative metrics
    total = sim.metrics()["engine"].counters[m.VLLM_GENERATION_TOKENS]
    assert total == 8 * 2000 + 10


def test_over_long_prompt_fails_with_vllms_message() -> None:
    sim = PoolSim("llama-3.1-8b", "h200", config=EngineConfig(max_model_len=4096))
    sim.submit(SimRequest("big", 0.0, 5000, 10))
    sim.submit(SimRequest("ok", 0.0, 100, 10))
    sim.run()
    recs = {r.id: r for r in sim.records()}
    assert not recs["big"].ok and recs["big"].first_token_at is None
    assert "maximum context length is 4096 tokens" in recs["big"].error
    assert recs["ok"].ok


@dataclass(frozen=True)
class FastPathCase:
    name: str
    mode: str
    gpu: str
    memory: float  # gpu_memory_utilization: 0.45 on an L40S leaves ~20k tokens of KV


FAST_PATH = [
    FastPathCase("disaggregated", "disaggregated", "h100", 0.9),
    FastPathCase("aggregated", "aggregated", "h100", 0.9),
    FastPathCase("kv-pressure-preempts", "aggregated", "l40s", 0.45),
]


@pytest.mark.parametrize("case", FAST_PATH, ids=lambda c: c.name)
def test_batched_decode_runs_match_step_by_step_simulation(case: FastPathCase) -> None:
    """The fast path (many decode steps priced at once) changes nothing a user sees, KV
    usage and preemptions included."""
    reqs = poisson(6, 40, seed=5)
    out, kv, preempt = [], [], []
    for steps in (4096, 1):
        sim = PoolSim("llama-3.1-8b", case.gpu, mode=case.mode, prefill_replicas=1,
                      decode_replicas=2, engine_replicas=2,
                      config=EngineConfig(max_chunk_steps=steps,
                                          gpu_memory_utilization=case.memory))
        sim.submit_many(reqs)
        usage = []
        for t in range(0, 60, 5):
            sim.run_until(float(t))
            usage.append(sorted(s.gauges[m.VLLM_KV_USAGE]
                                for s in sim.metrics(per_replica=True).values()))
        sim.run()
        out.append(sorted(sim.records(), key=lambda r: r.id))
        kv.append(usage)
        preempt.append(sum(s.counters[m.VLLM_PREEMPTIONS] for s in sim.metrics().values()))
    assert kv[0] == kv[1]
    assert preempt[0] == preempt[1]
    if case.name == "kv-pressure-preempts":
        assert preempt[0] > 0
    fast, slow = out
    for a, b in zip(fast, slow, strict=True):
        assert a.first_token_at == pytest.approx(b.first_token_at, rel=1e-9)
        assert a.finished_at == pytest.approx(b.finished_at, rel=1e-9)
        assert a.itl_p90 == pytest.approx(b.itl_p90, rel=1e-6)


def test_metrics_between_events_reflect_work_done_so_far() -> None:
    sim = PoolSim("llama-3.1-8b", "h200", mode="aggregated")
    sim.submit(SimRequest(0, 0.0, 500, 3000))
    sim.run_until(1.0)
    mid = sim.metrics()["engine"]
    assert 0 < mid.counters[m.VLLM_GENERATION_TOKENS] < 3000
    assert mid.gauges[m.VLLM_RUNNING] == 1 and mid.gauges[m.VLLM_KV_USAGE] > 0
    sim.run()
    assert sim.metrics()["engine"].gauges[m.VLLM_RUNNING] == 0


def test_unknown_role_and_mode_are_rejected() -> None:
    with pytest.raises(ValueError, match="disaggregated"):
        PoolSim(mode="split")
    sim = PoolSim(mode="aggregated")
    with pytest.raises(ValueError, match="roles: engine"):
        sim.add_replica("decode")


def test_role_metrics_render_as_prometheus_text_the_parser_reads() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    sim = PoolSim("llama-3.1-8b", "h200", prefill_replicas=1, decode_replicas=2)
    reqs = poisson(5, 20)
    sim.submit_many(reqs)
    sim.run()
    snap = sim.metrics()["decode"]
    text = snap.exposition({"pool": "p", "role": "decode"})
    samples = {(s.name, s.labels.get("le"), s.labels.get("finished_reason")): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[(m.VLLM_GENERATION_TOKENS, None, None)] == sum(r.output_tokens for r in reqs)
    assert samples[(m.VLLM_TTFT + "_count", None, None)] == len(reqs)
    assert samples[(m.VLLM_TTFT + "_bucket", "+Inf", None)] == len(reqs)
    assert samples[("vllm:request_success_total", None, "length")] == len(reqs)
    assert samples[(m.VLLM_NIXL_XFER_TIME + "_count", None, None)] == len(reqs)
    # cumulative buckets never decrease
    ttft = [v for (n, le, _), v in samples.items() if n == m.VLLM_TTFT + "_bucket"]
    assert ttft == sorted(ttft)


@settings(max_examples=15, deadline=None)
@given(
    actions=st.lists(st.tuples(st.sampled_from(["add-prefill", "add-decode", "rm-prefill",
                                                 "rm-decode"]),
                               st.floats(0, 20), st.floats(0, 10)), max_size=12),
    seed=st.integers(0, 1000),
)
def test_scaling_under_load_loses_no_request(actions, seed) -> None:
    """Random scale-ups (with cold starts) and scale-downs (drains) while requests flow:
    every request finishes exactly once, and only on replicas that were ready."""
    sim = PoolSim("llama-3.2-1b", "h100", prefill_replicas=1, decode_replicas=1)
    reqs = poisson(4, 20, seed=seed, prompt=(50, 2000), out=(5, 200))
    sim.submit_many(reqs)
    for kind, at, cold in sorted(actions, key=lambda a: a[1]):
        sim.run_until(at)
        op, role = kind.split("-")
        if op == "add":
            sim.add_replica(role, ready_at=at + cold)
        else:
            sim.remove_replica(role)
    for role in ("prefill", "decode"):  # make sure someone is left to finish the work
        if sim.replica_counts(role).ready + sim.replica_counts(role).starting == 0:
            sim.add_replica(role, ready_at=sim.now + 1.0)
    sim.run()
    recs = sim.records()
    assert sorted(r.id for r in recs) == [r.id for r in reqs]
    assert all(r.ok for r in recs)
    for r in recs:
        assert sim.replicas[r.decode_replica].ready_at <= r.first_token_at
    assert sim.in_flight() == 0
    assert all(rep.removed_at is not None or not rep.draining for rep in sim.replicas.values())


def test_zero_output_request_fails_like_vllms_max_tokens_check() -> None:
    sim = PoolSim("llama-3.1-8b", "h200", mode="aggregated")
    sim.submit(SimRequest("none", 0.0, 100, 0))
    sim.run()
    (rec,) = sim.records()
    assert not rec.ok and "max_tokens must be at least 1" in rec.error
