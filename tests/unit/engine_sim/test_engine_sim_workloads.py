"""The session-workload generator: prompts that extend each other, consistent hash ids, the
documented ideal hit rates, the Mooncake file it writes, and prompt text that shares blocks."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.engine_sim.protocol import prompt_tokens
from poolpilot.engine_sim.traces import MOONCAKE_BLOCK_TOKENS, ideal_prefix_hit_rate, load_trace
from poolpilot.engine_sim.workloads import SessionParams, generate_sessions, prompt_text

from poolpilot.cli import main as cli_main

B = MOONCAKE_BLOCK_TOKENS


def test_the_same_seed_gives_the_same_trace_and_another_seed_another() -> None:
    a = generate_sessions(SessionParams(kind="mixed", sessions=50, seed=1))
    assert a == generate_sessions(SessionParams(kind="mixed", sessions=50, seed=1))
    assert a != generate_sessions(SessionParams(kind="mixed", sessions=50, seed=2))


@pytest.mark.parametrize("kind", ["chat", "agent"])
def test_each_turn_extends_the_previous_prompt(kind: str) -> None:
    trace = generate_sessions(SessionParams(kind=kind, sessions=1, rate=10.0, seed=4,
                                            chat_turns=8, agent_steps=8))
    assert len(trace) >= 3
    for prev, cur in itertools.pairwise(trace):
        # the next prompt holds this prompt and its answer: longer by more than the output
        assert cur.input_tokens > prev.input_tokens + prev.output_tokens
        full = prev.input_tokens // B
        assert cur.hash_ids[:full] == prev.hash_ids[:full]  # the full blocks carry over
        if prev.input_tokens % B:  # a partial last block grew: another block, another id
            assert cur.hash_ids[full] != prev.hash_ids[full]


def test_one_system_prompt_is_shared_by_every_session() -> None:
    p = SessionParams(kind="chat", sessions=40, chat_system_prompts=1, chat_system_tokens=3000,
                      sigma=0.01)
    trace = generate_sessions(p)
    firsts = {r.hash_ids[:5] for r in trace}  # ~3000 tokens: 5 full blocks
    assert len(firsts) == 1


@settings(max_examples=15, deadline=None)
@given(kind=st.sampled_from(["chat", "agent", "mixed"]), seed=st.integers(0, 10**6))
def test_an_id_stands_for_its_whole_prefix(kind: str, seed: int) -> None:
    trace = generate_sessions(SessionParams(kind=kind, sessions=30, rate=0.5, seed=seed))
    prefix_of: dict[int, tuple[int, ...]] = {}
    for r in trace:
        assert len(r.hash_ids) == -(-r.input_tokens // B)
        assert r.input_tokens + r.output_tokens <= 32768
        for i, h in enumerate(r.hash_ids):
            assert prefix_of.setdefault(h, r.hash_ids[:i]) == r.hash_ids[:i]


@dataclass(frozen=True)
class Ideal:
    kind: str
    low: float
    high: float


IDEALS = [Ideal("chat", 0.5, 0.7), Ideal("agent", 0.65, 0.85), Ideal("mixed", 0.6, 0.85)]


@pytest.mark.parametrize("case", IDEALS, ids=[c.kind for c in IDEALS])
def test_ideal_hit_rate_at_the_defaults(case: Ideal) -> None:
    """docs/engine-simulator.md quotes these (seed 0: chat 0.61, agent 0.78, mixed 0.75)."""
    for seed in (0, 1):
        rate = ideal_prefix_hit_rate(generate_sessions(SessionParams(kind=case.kind, seed=seed)))
        assert case.low <= rate <= case.high


def test_a_warmup_opens_the_trace_in_its_steady_state(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    """Without a warm-up the first minute ramps up from no sessions; with one, it carries
    as many requests as the minutes after it, and nothing arrives before the trace begins."""
    def per_minute(warmup: float) -> list[int]:
        trace = generate_sessions(SessionParams(kind="chat", sessions=100_000, rate=2.0,
                                                duration=300.0, seed=5, warmup=warmup))
        assert min(r.arrival_s for r in trace) >= 0
        counts = [0] * 5
        for r in trace:
            counts[int(r.arrival_s // 60)] += 1
        return counts

    cold, warm = per_minute(0.0), per_minute(600.0)
    assert cold[0] < 0.8 * sum(cold[2:]) / 3  # the ramp
    assert warm[0] > 0.8 * sum(warm[2:]) / 3
    assert cli_main(["workload", "sessions", "--warmup", "-1", "--out",
                     str(tmp_path / "w.jsonl")]) == 2
    assert "warmup must be >= 0" in capsys.readouterr().err


def test_sessions_arrive_as_the_rate_profile_rises_and_falls() -> None:
    """A profile of a quiet, a busy and a silent minute: the sessions' first turns arrive in
    proportion (their later turns spill over, so the first turns are counted); the mean stays
    `rate`."""
    params = SessionParams(kind="agent", sessions=100_000, rate=2.0, duration=180.0, seed=7,
                           agent_steps=1.0, agent_max_steps=1, rate_profile=(1.0, 2.0, 0.0),
                           profile_bin_s=60.0)
    # the warm-up takes the first value; the profile repeats past its end
    assert [params.rate_at(t) for t in (-5.0, 30.0, 90.0, 150.0, 200.0)] == [2.0, 2.0, 4.0,
                                                                               0.0, 2.0]
    trace = generate_sessions(params)
    counts = [0, 0, 0]
    for r in trace:
        counts[int(r.arrival_s // 60)] += 1
    assert counts[2] == 0  # silent
    assert 1.6 < counts[1] / counts[0] < 2.5  # 120 and 240 expected
    assert 0.8 < len(trace) / (2.0 * 180.0) < 1.2
    assert generate_sessions(params) == trace  # still seeded
    with pytest.raises(ValueError, match="rate_profile"):
        SessionParams(rate_profile=(0.0, 0.0))
    for bad in ((1.0, -1.0), (1.0, float("nan")), (1.0, float("inf"))):
        with pytest.raises(ValueError, match="rate_profile"):
            SessionParams(rate_profile=bad)


def test_cli_takes_the_rate_profile_from_a_trace(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`--arrivals-from`: the profile is the trace's requests per bin (its last, partial bin
    left out), whatever its format."""
    arrivals = tmp_path / "arrivals.csv"
    stamps = [0.5, 1.0, 1.5, 2.0, 12.0, 24.0, 25.0]  # bins of 10 s: 4, 1, 2 (partial: 5 s)
    arrivals.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:00:{t:09.6f},100,10\n" for t in stamps))
    out = tmp_path / "s.jsonl"
    assert cli_main(["workload", "sessions", "--arrivals-from", str(arrivals),
                     "--arrivals-bin", "10", "--sessions", "50", "--json",
                     "--out", str(out)]) == 0
    assert '"rate_profile": [4.0, 1.0]' in capsys.readouterr().out
    assert cli_main(["workload", "sessions", "--arrivals-from", str(tmp_path / "none.csv"),
                     "--out", str(out)]) == 2
    assert "no such trace file" in capsys.readouterr().err
    assert cli_main(["workload", "sessions", "--arrivals-from", str(arrivals),
                     "--arrivals-bin", "0", "--out", str(out)]) == 2
    assert "--arrivals-bin must be > 0" in capsys.readouterr().err


def test_cli_writes_mooncake_that_loads_back(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.jsonl"
    assert cli_main(["workload", "sessions", "--kind", "agent", "--sessions", "20", "--seed",
                     "3", "--set", "tool_s=1", "--out", str(out)]) == 0
    assert "ideal prefix hit rate" in capsys.readouterr().out
    want = generate_sessions(SessionParams(kind="agent", sessions=20, seed=3, tool_s=1.0))
    back = load_trace(out)
    t0 = want[0].arrival_s
    assert [(r.input_tokens, r.output_tokens, r.hash_ids) for r in back] == \
        [(r.input_tokens, r.output_tokens, r.hash_ids) for r in want]
    assert [r.arrival_s for r in back] == pytest.approx([r.arrival_s - t0 for r in want],
                                                        abs=1e-5)
    assert cli_main(["workload", "sessions", "--set", "nope=1", "--out", str(out)]) == 2
    assert "nope=1" in capsys.readouterr().err


# ---- prompt text ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    name: str
    a: tuple[tuple[int, ...], int, int]  # hash ids, input length, salt
    b: tuple[tuple[int, ...], int, int]
    shared_words: int  # leading words equal


TEXTS = [
    Text("shared-system-prompt", ((1, 2, 3), 1400, 0), ((1, 2, 9), 1400, 1), 2 * B - 1),
    Text("a-turn-extends-the-last", ((1, 2), 1024, 0), ((1, 2, 3, 4), 1800, 1), 2 * B - 1),
    Text("nothing-shared", ((1, 2), 1000, 0), ((5, 2), 1000, 0), 0),
    Text("no-ids-own-salts", ((), 700, 0), ((), 700, 1), 0),
    Text("no-ids-one-salt", ((), 700, 3), ((), 700, 3), 699),
    Text("beyond-the-ids-own-salts", ((1,), 1400, 0), ((1,), 1400, 1), B),
]


@pytest.mark.parametrize("case", TEXTS, ids=[c.name for c in TEXTS])
def test_prompt_text_shares_the_text_of_shared_blocks(case: Text) -> None:
    ta = prompt_text(case.a[0], case.a[1], salt=case.a[2])
    tb = prompt_text(case.b[0], case.b[1], salt=case.b[2])
    for (_, n, _), t in ((case.a, ta), (case.b, tb)):
        assert prompt_tokens(t)[0] == n  # the simulator counts exactly input_length tokens
    wa, wb = ta.split(), tb.split()
    same = next((i for i, (x, y) in enumerate(zip(wa, wb, strict=False)) if x != y),
                min(len(wa), len(wb)))
    # words are drawn from a small vocabulary: a chance match may extend the run a little
    assert case.shared_words <= same <= case.shared_words + 8


# ---- the generator, the trace's ideal and the simulated caches agree ---------------------------


@dataclass(frozen=True)
class Replay:
    name: str
    args: list[str]
    at_ideal: bool  # the engines' hit rate equals the trace's ideal one


REPLAYS = [
    # one H200 holds every session's KV: its cache serves everything an earlier request had
    Replay("one-engine-reaches-the-ideal", ["--mode", "aggregated", "--engines", "1"], True),
    Replay("pd-prefill-engine-reaches-the-ideal", ["--prefill", "1", "--decode", "1"], True),
    # least-loaded routing spreads a session's turns: each engine recomputes what it lacks
    Replay("four-engines-least-loaded-fall-short", ["--mode", "aggregated", "--engines", "4"],
           False),
]


@pytest.mark.parametrize("case", REPLAYS, ids=[c.name for c in REPLAYS])
def test_simulated_hit_rate_against_the_ideal(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              case: Replay) -> None:
    import json

    out = tmp_path / "chat.jsonl"
    assert cli_main(["workload", "sessions", "--kind", "chat", "--sessions", "150",
                     "--rate", "0.5", "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli_main(["sim", "trace", "--trace", str(out), "--json", *case.args]) == 0
    doc = json.loads(capsys.readouterr().out)
    ideal = doc["ideal_prefix_hit_rate"]
    assert 0.4 < ideal < 0.8
    assert doc["prefix_cache_hits_over_queries"] == pytest.approx(doc["prefix_hit_rate"])
    if case.at_ideal:
        assert doc["prefix_hit_rate"] == pytest.approx(ideal, abs=0.005)
    else:
        assert doc["prefix_hit_rate"] < 0.9 * ideal
    assert cli_main(["sim", "trace", "--trace", str(out), "--json",
                     "--no-enable-prefix-caching", *case.args]) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["prefix_hit_rate"] == 0.0
    assert off["ttft_p90"] > doc["ttft_p90"]
