"""The Qwen-Bailian trace format (Alibaba, ATC 2025): seconds where Mooncake's are
milliseconds, 16-token hash blocks where Mooncake's are 512, each id a block's own content
(chained on its prefix when read). Read, replayed by the simulator, the bench and the sandbox's
load generator at its own block size; written by `poolpilot workload sessions --format
bailian`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.engine_sim.des import PoolSim, SimRequest
from poolpilot.engine_sim.traces import (
    BAILIAN_BLOCK_TOKENS,
    MOONCAKE_BLOCK_TOKENS,
    TraceRequest,
    chain_ids,
    ideal_prefix_hit_rate,
    load_trace,
    prefix_hit_tokens,
    write_bailian,
    write_mooncake,
)
from poolpilot.engine_sim.workloads import defaults, generate_sessions
from poolpilot.sandbox.loadgen import request_prompt, results_for

from poolpilot.cli import main as cli_main


def bailian_line(chat: int, t: float, n: int, out: int, ids: list[int], parent: int = -1,
                 turn: int = 1) -> str:
    return json.dumps({"chat_id": chat, "parent_chat_id": parent, "timestamp": t,
                       "input_length": n, "output_length": out, "type": "text", "turn": turn,
                       "hash_ids": ids}) + "\n"


def test_a_bailian_file_is_told_from_mooncake_and_read_in_seconds_and_16_token_blocks(
        tmp_path: Path) -> None:
    path = tmp_path / "qwen_traceA_blksz_16.jsonl"
    path.write_text(bailian_line(159, 1.5, 40, 5, [1089, 1090, 1091])
                    + bailian_line(160, 61.114, 50, 7, [1089, 1090, 1091, 6326], parent=159,
                                   turn=2))
    trace = load_trace(path)
    assert [r.arrival_s for r in trace] == [0.0, pytest.approx(59.614)]  # not 59.6 ms
    assert {r.block_tokens for r in trace} == {BAILIAN_BLOCK_TOKENS}
    # the second turn holds the first's three blocks: 48 tokens an infinite cache serves
    assert prefix_hit_tokens(trace) == [0, 48]
    assert load_trace(path, "bailian") == trace


def test_a_block_equal_to_another_at_a_different_prefix_is_no_prefix_hit() -> None:
    # Bailian's ids hash each block's own content: C's second and third blocks are A's, but
    # after a different first block, so vLLM's chained block hashes would not match them
    a, b, c = chain_ids([[1, 2, 3], [1, 2, 4], [5, 2, 3]])
    assert b[:2] == a[:2] and b[2] != a[2]
    assert not set(c) & set(a)
    trace = [TraceRequest(float(i), 48, 1, ids, BAILIAN_BLOCK_TOKENS)
             for i, ids in enumerate((a, b, c))]
    assert prefix_hit_tokens(trace) == [0, 32, 0]


@given(st.lists(st.lists(st.integers(0, 6), max_size=6), min_size=1, max_size=12))
def test_chaining_keeps_exactly_the_shared_leading_runs(prompts: list[list[int]]) -> None:
    chained = chain_ids(prompts)
    for p, cp in zip(prompts, chained, strict=True):
        for q, cq in zip(prompts, chained, strict=True):
            shared = next((k for k, (x, y) in enumerate(zip(p, q, strict=False)) if x != y),
                          min(len(p), len(q)))
            assert [x == y for x, y in zip(cp, cq, strict=False)] == \
                [k < shared for k in range(min(len(p), len(q)))]
    assert chain_ids(chained) == chained  # chained ids chain to themselves (numbering aside)


def test_generated_sessions_in_bailian_blocks_round_trip_and_count_finer_hits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "chat-b16.jsonl"
    assert cli_main(["workload", "sessions", "--kind", "chat", "--rate", "2", "--sessions",
                     "60", "--duration", "120", "--seed", "5", "--format", "bailian",
                     "--out", str(path)]) == 0
    first = json.loads(path.read_text().splitlines()[0])
    assert {"chat_id", "parent_chat_id", "turn"} <= set(first)
    back = load_trace(path)
    params = replace(defaults("chat"), rate=2.0, sessions=60, duration=120.0, seed=5)
    fine = generate_sessions(params, BAILIAN_BLOCK_TOKENS)
    coarse = generate_sessions(params)
    # the same requests; only the resolution of what they share differs
    assert [(r.input_tokens, r.output_tokens) for r in back] == \
        [(r.input_tokens, r.output_tokens) for r in coarse]
    assert [r.arrival_s for r in back] == pytest.approx(
        [r.arrival_s - coarse[0].arrival_s for r in coarse], abs=1e-6)
    assert prefix_hit_tokens(back) == prefix_hit_tokens(fine)
    # a turn shares its history up to its last token, not its last whole 512-token block
    assert ideal_prefix_hit_rate(fine) > ideal_prefix_hit_rate(coarse) + 0.05


def test_each_writer_refuses_the_other_formats_blocks(tmp_path: Path) -> None:
    fine = [TraceRequest(0.0, 40, 1, (1, 2, 3), BAILIAN_BLOCK_TOKENS)]
    coarse = [TraceRequest(0.0, 1100, 1, (1, 2, 3), MOONCAKE_BLOCK_TOKENS)]
    with pytest.raises(ValueError, match="write_bailian"):
        write_mooncake(fine, tmp_path / "m.jsonl")
    with pytest.raises(ValueError, match="write_mooncake"):
        write_bailian(coarse, tmp_path / "b.jsonl")
    write_bailian(fine, tmp_path / "b.jsonl")
    assert load_trace(tmp_path / "b.jsonl")[0].block_tokens == BAILIAN_BLOCK_TOKENS


def test_the_simulator_caches_a_16_token_block_trace_at_16_tokens() -> None:
    sim = PoolSim(mode="disaggregated", prefill_replicas=1, decode_replicas=1,
                  hash_block_tokens=BAILIAN_BLOCK_TOKENS)
    shared = tuple(range(100))  # 1,600 tokens
    sim.submit(SimRequest("a", 0.0, 1610, 5, (*shared, 500), BAILIAN_BLOCK_TOKENS))
    sim.submit(SimRequest("b", 5.0, 1650, 5, (*shared, 600, 601, 602, 603),
                          BAILIAN_BLOCK_TOKENS))
    sim.run()
    a, b = sorted(sim.records(), key=lambda r: r.id)
    # b finds all 100 shared blocks (at 512 tokens a block it would find 1,536)
    assert (a.prefix_hit_tokens, b.prefix_hit_tokens) == (0, 1600)


def test_the_bench_replays_a_bailian_trace_at_its_clock_and_block_size(tmp_path: Path) -> None:
    params = replace(defaults("chat"), rate=2.0, sessions=200, duration=150.0, seed=7)
    fine = generate_sessions(params, BAILIAN_BLOCK_TOKENS)
    path = tmp_path / "chat-b16.jsonl"
    write_bailian(fine, path)
    out = tmp_path / "r.json"
    assert cli_main(["bench", "--trace", str(path), "--cold-start", "30", "--max-replicas",
                     "4", "--policies", "static-peak", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["ideal_prefix_hit_rate"] == pytest.approx(ideal_prefix_hit_rate(fine), abs=1e-6)
    res = doc["policies"]["static-peak"]
    assert res["finished"] == len(fine)
    assert 0.5 * doc["ideal_prefix_hit_rate"] < res["prefix_hit_rate"] <= \
        doc["ideal_prefix_hit_rate"] + 1e-9
    # seconds, not milliseconds: the replay spans the trace's two and a half minutes
    assert res["duration_s"] > 120


def test_the_load_generator_sends_shared_16_token_blocks_as_shared_text() -> None:
    trace = [TraceRequest(0.0, 50, 1, (1, 2, 3), BAILIAN_BLOCK_TOKENS),
             TraceRequest(1.0, 50, 1, (1, 2, 9), BAILIAN_BLOCK_TOKENS)]
    a, b = (str(request_prompt(r)).split() for r in results_for(trace))
    assert len(a) == len(b) == 49  # a BOS and a word a token
    assert a[:31] == b[:31]  # the BOS and two shared blocks: 1 + 15 + 16 words
    assert a[31:] != b[31:]


def test_the_file_name_states_the_block_size_when_the_records_have_no_session_keys(
        tmp_path: Path) -> None:
    path = tmp_path / "qwen_traceX_blksz_32.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": 64, "output_length": 2,
                                        "hash_ids": [1, 2]}) + "\n" for t in (0.0, 30.0)))
    trace = load_trace(path)
    assert [r.arrival_s for r in trace] == [0.0, 30.0]
    assert [r.block_tokens for r in trace] == [32, 32]
    assert prefix_hit_tokens(trace) == [0, 63]


def test_seconds_read_as_milliseconds_are_warned_of(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "trace.jsonl"  # no session keys, no telling name: read as Mooncake's
    path.write_text("".join(json.dumps({"timestamp": i * 0.5, "input_length": 64,
                                        "output_length": 2}) + "\n" for i in range(2000)))
    trace = load_trace(path)
    assert trace[-1].arrival_s == pytest.approx(0.9995)
    assert "--format bailian" in caplog.text
    caplog.clear()
    assert load_trace(path, "bailian")[-1].arrival_s == pytest.approx(999.5)
    assert "--format bailian" not in caplog.text
