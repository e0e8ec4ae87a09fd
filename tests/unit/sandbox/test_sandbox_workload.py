"""`poolpilot sandbox --workload`: the generated workload it replays, and the prompts it sends
for a trace with hash ids (shared blocks as shared text, exact token counts)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.engine_sim import protocol
from poolpilot.engine_sim.traces import (
    MOONCAKE_BLOCK_TOKENS,
    TraceRequest,
    ideal_prefix_hit_rate,
    load_trace,
)
from poolpilot.sandbox import main as sandbox_main
from poolpilot.sandbox.loadgen import request_prompt, results_for

B = MOONCAKE_BLOCK_TOKENS


def words(prompt: str | list[int]) -> list[str]:
    assert isinstance(prompt, str)
    return prompt.split(" ")


def prompts(trace: list[TraceRequest]) -> list[list[str]]:
    return [words(request_prompt(r)) for r in results_for(trace)]


def test_requests_without_hash_ids_keep_token_ids_of_their_own() -> None:
    a, b = results_for([TraceRequest(0.0, 700, 5), TraceRequest(1.0, 700, 5)])
    pa, pb = request_prompt(a), request_prompt(b)
    assert isinstance(pa, list) and len(pa) == 700 and pa[:16] != pb[:16]


def test_a_shared_system_prompt_is_shared_text_and_the_rest_is_not() -> None:
    # Two sessions on one system prompt of two blocks (ids 1, 2), then their own messages.
    a, b = prompts([TraceRequest(0.0, 1300, 5, (1, 2, 3)), TraceRequest(1.0, 1100, 5, (1, 2, 4))])
    # The BOS is the prompt's first token, so block 0 holds 511 words.
    assert a[:2 * B - 1] == b[:2 * B - 1]
    assert a[2 * B - 1:2 * B + 15] != b[2 * B - 1:2 * B + 15]


def test_each_turn_extends_the_previous_one_block_by_block() -> None:
    # Turn 2 keeps turn 1's two full blocks; turn 1's partial third block is other content
    # now (the answer and a new message follow it), so it has a new id.
    t1, t2 = prompts([TraceRequest(0.0, 1200, 5, (1, 2, 3)),
                      TraceRequest(9.0, 2100, 5, (1, 2, 5, 6, 7))])
    assert t2[:2 * B - 1] == t1[:2 * B - 1]
    assert len(t2) > len(t1)


@dataclass(frozen=True)
class CountCase:
    name: str
    input_tokens: int
    hash_ids: tuple[int, ...]


COUNT_CASES = [
    CountCase("one-partial-block", 300, (1,)),
    CountCase("exact-blocks", 2 * B, (1, 2)),
    CountCase("more-tokens-than-ids", 3 * B + 7, (1,)),
]


@pytest.mark.parametrize("case", COUNT_CASES, ids=[c.name for c in COUNT_CASES])
def test_the_engine_counts_the_traces_input_tokens(case: CountCase) -> None:
    (r,) = results_for([TraceRequest(0.0, case.input_tokens, 5, case.hash_ids)])
    assert protocol.prompt_tokens(request_prompt(r))[0] == case.input_tokens


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=4),
       st.lists(st.integers(0, 5), min_size=1, max_size=4))
def test_prompts_share_text_exactly_as_far_as_they_share_leading_ids(
        a_ids: list[int], b_ids: list[int]) -> None:
    # Ids stand for their whole prefix, so a trace never gives one id two parents: number
    # each id by its prefix to keep that true of the drawn lists.
    a = tuple(hash(tuple(a_ids[:i + 1])) & 0xFFFF for i in range(len(a_ids)))
    b = tuple(hash(tuple(b_ids[:i + 1])) & 0xFFFF for i in range(len(b_ids)))
    shared = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                  min(len(a), len(b)))
    pa, pb = prompts([TraceRequest(0.0, len(a) * B, 5, a), TraceRequest(1.0, len(b) * B, 5, b)])
    same = shared * B - 1 if shared else 0
    assert pa[:same] == pb[:same]
    if shared < min(len(a), len(b)):
        assert pa[same:same + B] != pb[same:same + B]


def test_the_sandbox_workload_is_fixed_prefix_heavy_and_fits_the_pool(tmp_path: Path) -> None:
    path = sandbox_main.write_workload("sessions", 8192, tmp_path)
    assert path == tmp_path / "workload-sessions.jsonl"
    trace = load_trace(path)
    assert trace == load_trace(sandbox_main.write_workload("sessions", 8192, tmp_path / "b"))
    assert 1000 < len(trace) < 3000  # a few minutes at speed 4, like the default trace
    assert trace[-1].arrival_s <= sandbox_main.WORKLOAD_SECONDS
    assert all(r.hash_ids and r.input_tokens + r.output_tokens <= 8192 for r in trace)
    assert ideal_prefix_hit_rate(trace) > 0.5


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    sandbox_main.add_arguments(p)
    return p.parse_args(argv)


def test_workload_and_trace_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse("--workload", "chat").workload == "chat"
    with pytest.raises(SystemExit):
        parse("--workload", "chat", "--trace", "t.csv")
    assert "not allowed with argument --workload" in capsys.readouterr().err


def test_a_workload_on_the_tiny_vllm_model_is_refused(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("--workload", "sessions", "--engine", "vllm-cpu", "--report", str(tmp_path))
    assert sandbox_main.run(args) == 2
    assert "--workload needs --engine sim" in capsys.readouterr().err


def test_prompts_cut_to_the_context_keep_their_shared_blocks(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1500, "output_length": 100, '
                     '"hash_ids": [1, 2, 3]}\n'
                     '{"timestamp": 10, "input_length": 9000, "output_length": 100, '
                     '"hash_ids": [1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]}\n')
    args = argparse.Namespace(trace=trace, trace_format=None, rate_scale=1.0, start=0.0,
                              duration=None, engine="sim")
    short, cut = sandbox_main.prepare_trace(args, 8192)
    assert short.hash_ids == (1, 2, 3)
    assert cut.input_tokens == 8192 - 100 - 1 and cut.hash_ids[:2] == (1, 2)
    assert len(cut.hash_ids) == -(-cut.input_tokens // B)
