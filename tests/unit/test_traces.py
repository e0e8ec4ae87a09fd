"""Trace parsers: every format, auto-detection, and errors that name FILE:LINE."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.engine_sim.traces import (
    TraceError,
    TraceRequest,
    busy_periods,
    clamp_tokens,
    ideal_prefix_hit_rate,
    ideal_prefix_hit_tokens,
    load_trace,
    longest_busy_period,
    prefix_hit_tokens,
    rate_per_bin,
    scale_rate,
    truncate_hash_ids,
    window,
    write_csv,
    write_mooncake,
)

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


@dataclass(frozen=True)
class Good:
    name: str
    filename: str
    content: str
    expected: list[TraceRequest]
    format: str | None = None


GOOD = [
    Good(
        "azure",
        "t.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,3180,8\n",
        [TraceRequest(0.0, 4808, 10), TraceRequest(0.052, 3180, 8)],
    ),
    Good(
        "azure-unsorted-across-midnight",
        "t.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-17 00:00:01.5,7,2\n"
        "2023-11-16 23:59:59.5,5,1\n",
        [TraceRequest(0.0, 5, 1), TraceRequest(2.0, 7, 2)],
    ),
    Good(
        "azure-2024-utc-offsets-some-without-a-fraction",
        "t.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,4808,10\n"
        "2024-05-10 00:00:01+00:00,3180,8\n"
        "2024-05-09 17:00:02.5-07:00,7,2\n"  # 00:00:02.5 UTC
        "2024-05-10T00:00:03Z,9,3\n",
        [TraceRequest(0.0, 4808, 10), TraceRequest(0.99007, 3180, 8),
         TraceRequest(2.49007, 7, 2), TraceRequest(2.99007, 9, 3)],
    ),
    Good(
        "burstgpt-with-the-newer-columns",
        "BurstGPT_1.csv",
        "Timestamp,Session ID,Model,Request tokens,Response tokens,Total tokens,Log Type,"
        "Elapsed time\n"
        "5,s1,ChatGPT,472,18,490,Conversation log,1.5\n"
        "45,s1,GPT-4,1087,230,1317,API log,9.0\n",
        [TraceRequest(0.0, 472, 18), TraceRequest(40.0, 1087, 230)],
    ),
    Good(
        "mooncake",
        "t.jsonl",
        '{"timestamp": 1000, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}\n'
        "\n"
        '{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}\n',
        [TraceRequest(0.0, 100, 5, (1,)), TraceRequest(1.0, 600, 20, (1, 2))],
    ),
    Good(
        "mooncake-without-hash-ids",
        "t.jsonl",
        '{"timestamp": 0, "input_length": 100, "output_length": 5}\n',
        [TraceRequest(0.0, 100, 5)],
    ),
    Good(
        "plain-csv-with-header",
        "t.csv",
        "arrival_s,input_tokens,output_tokens\n0.5,10,3\n2.5,20,4\n",
        [TraceRequest(0.0, 10, 3), TraceRequest(2.0, 20, 4)],
    ),
    Good(
        "plain-csv-no-header-forced-format",
        "t.txt",
        "1,10,3\n3,20,4\n",
        [TraceRequest(0.0, 10, 3), TraceRequest(2.0, 20, 4)],
        format="csv",
    ),
]


@pytest.mark.parametrize("case", GOOD, ids=[c.name for c in GOOD])
def test_parses_each_format(tmp_path: Path, case: Good) -> None:
    path = tmp_path / case.filename
    path.write_text(case.content)
    assert load_trace(path, case.format) == case.expected


@dataclass(frozen=True)
class Bad:
    name: str
    filename: str
    content: str
    error: str  # expected text after "FILE"


BAD = [
    Bad("azure-bad-timestamp", "t.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,5,1\nyesterday,5,1\n",
        ":3: TIMESTAMP must look like"),
    Bad("azure-bad-tokens", "t.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,five,1\n",
        ":2: ContextTokens must be an integer"),
    Bad("azure-negative-output", "t.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,5,-1\n",
        ":2: GeneratedTokens must be >= 0"),
    Bad("azure-bad-utc-offset", "t.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.5+0x:00,5,1\n",
        ":2: TIMESTAMP must look like 2023-11-16 18:17:03.9799600 or 2024-05-10 00:00:00"),
    Bad("burstgpt-bad-tokens", "b.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "0,ChatGPT,many,1,1,API log\n", ":2: Request tokens must be an integer"),
    Bad("azure-short-row", "t.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,5\n",
        ":2: expected 3 columns"),
    Bad("mooncake-not-json", "t.jsonl",
        '{"timestamp": 0, "input_length": 1, "output_length": 1}\n{oops\n',
        ":2: not valid JSON"),
    Bad("mooncake-missing-key", "t.jsonl",
        '{"timestamp": 0, "input_length": 1}\n', ":1: missing 'output_length'"),
    Bad("mooncake-negative-time", "t.jsonl",
        '{"timestamp": -5, "input_length": 1, "output_length": 1}\n', ":1: timestamp must be"),
    Bad("mooncake-hash-ids-not-a-list", "t.jsonl",
        '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": 7}\n',
        ":1: hash_ids must be a list of integers, got 7"),
    Bad("mooncake-hash-ids-with-a-string", "t.jsonl",
        '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": []}\n'
        '{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1, "2"]}\n',
        ":2: hash_ids must be a list of integers, got [1, '2']"),
    Bad("mooncake-hash-ids-with-a-bool", "t.jsonl",
        '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [true]}\n',
        ":1: hash_ids must be a list of integers"),
    Bad("csv-nan-arrival", "t.csv", "arrival_s,input_tokens,output_tokens\nnan,1,1\n",
        ":2: arrival_s must be a finite number"),
    Bad("csv-four-columns", "t.csv", "0,1,1,1\n", ":1: expected 3 columns"),
    Bad("empty", "t.csv", "arrival_s,input_tokens,output_tokens\n", ": the trace has no requests"),
]


@pytest.mark.parametrize("case", BAD, ids=[c.name for c in BAD])
def test_errors_name_file_and_line(tmp_path: Path, case: Bad) -> None:
    path = tmp_path / case.filename
    path.write_text(case.content)
    with pytest.raises(TraceError) as exc:
        load_trace(path)
    assert str(exc.value).startswith(str(path) + case.error)


def test_requests_with_nothing_generated_replay_one_token_and_say_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # BurstGPT's failed requests have 0 response tokens; an engine returns at least the first.
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "0,ChatGPT,472,0,472,Conversation log\n"
                    "1,ChatGPT,0,5,5,API log\n"
                    "2,GPT-4,90,7,97,API log\n")
    with caplog.at_level("WARNING"):
        trace = load_trace(path)
    assert trace == [TraceRequest(0.0, 472, 1), TraceRequest(1.0, 1, 5), TraceRequest(2.0, 90, 7)]
    assert (f"{path}: of 3 requests, 1 had a 0-token prompt and 1 generated 0 tokens; "
            "replayed with 1") in caplog.text


def test_missing_file_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "nope.csv")
    (tmp_path / "t.csv").write_text("0,1,1\n")
    with pytest.raises(TraceError, match="unknown trace format 'parquet'"):
        load_trace(tmp_path / "t.csv", "parquet")


@pytest.mark.skipif(not SHARED.exists(), reason="shared traces not present")
@pytest.mark.parametrize("name,rows", [("code", 8819), ("conv", 19366)], ids=["code", "conv"])
def test_real_azure_traces(name: str, rows: int) -> None:
    trace = load_trace(SHARED / f"AzureLLMInferenceTrace_{name}.csv")
    assert len(trace) == rows
    assert trace[0].arrival_s == 0.0
    assert 50 * 60 < trace[-1].arrival_s < 60 * 60  # rows and span as the traces' README says


def test_shipped_excerpt_loads() -> None:
    from poolpilot.sandbox.data import DEFAULT_TRACE

    trace = load_trace(DEFAULT_TRACE)
    assert len(trace) > 100
    assert all(r.input_tokens >= 1 and r.output_tokens >= 1 for r in trace)


requests = st.lists(
    st.builds(
        TraceRequest,
        st.floats(0, 1e5, allow_nan=False).map(lambda x: round(x, 3)),
        st.integers(1, 10_000),
        st.integers(1, 2_000),
    ),
    min_size=1,
    max_size=50,
)


@given(requests)
def test_csv_round_trip_sorts_and_rebases(tmp_path_factory: pytest.TempPathFactory,
                                          reqs: list[TraceRequest]) -> None:
    path = tmp_path_factory.mktemp("rt") / "t.csv"
    write_csv(reqs, path)
    back = load_trace(path)
    assert len(back) == len(reqs)
    assert back[0].arrival_s == 0.0
    assert [r.arrival_s for r in back] == sorted(r.arrival_s for r in back)
    t0 = min(r.arrival_s for r in reqs)
    assert sorted((round(r.arrival_s - t0, 3), r.input_tokens, r.output_tokens) for r in reqs) == \
        sorted((round(r.arrival_s, 3), r.input_tokens, r.output_tokens) for r in back)


@given(requests, st.floats(0.1, 10))
def test_scale_rate_keeps_requests_and_divides_span(reqs: list[TraceRequest], f: float) -> None:
    out = scale_rate(sorted(reqs), f)
    assert len(out) == len(reqs)
    assert out[-1].arrival_s == pytest.approx(sorted(reqs)[-1].arrival_s / f, abs=1e-5)


def test_window_clamp_and_bins() -> None:
    trace = [TraceRequest(t, 100 * (t + 1), 10) for t in (0.0, 1.0, 2.5, 7.0)]
    assert window(trace, 1.0, 2.0) == [TraceRequest(0.0, 200, 10), TraceRequest(1.5, 350, 10)]
    assert clamp_tokens(trace, 300, 5)[-1] == TraceRequest(7.0, 300, 5)
    assert rate_per_bin(trace, 2.0) == [2, 1, 0, 1]
    with pytest.raises(ValueError, match="rate scale must be > 0"):
        scale_rate(trace, 0)


def _arrivals(*times: float) -> list[TraceRequest]:
    return [TraceRequest(t, 100, 10) for t in times]


@pytest.mark.parametrize("arrivals,expected", [
    # gaps of 60 s or more split the trace; the period with the most requests wins
    ((0, 70, 100, 102, 104, 106, 110, 130, 200), (1, 7)),
    # ... even when another period holds a denser minute
    ((0, 1, 2, 3, 100, 150, 200, 250, 300), (4, 8)),
    # a trace that is one busy period from end to end
    ((0, 30, 31, 32, 60), (0, 4)),
    # one request
    ((5,), (0, 0)),
    # the earlier of two equal periods
    ((0, 1, 2, 100, 101, 102), (0, 2)),
], ids=["split-at-gaps", "most-requests-not-densest", "all-busy", "single", "tie-earlier"])
def test_longest_busy_period(arrivals: tuple[float, ...], expected: tuple[int, int]) -> None:
    assert longest_busy_period(_arrivals(*arrivals)) == expected


def test_busy_periods_cover_the_trace() -> None:
    assert busy_periods(_arrivals(0, 1, 70, 71, 200)) == [(0, 1), (2, 3), (4, 4)]
    assert busy_periods([]) == []
    with pytest.raises(ValueError, match="empty trace"):
        longest_busy_period([])


# ---- prefixes: hash ids survive every copy; the ideal hit rate -------------------------------

with_ids = st.lists(
    st.builds(
        TraceRequest,
        st.floats(0, 1e5, allow_nan=False).map(lambda x: round(x, 3)),
        st.integers(1, 5_000),
        st.integers(1, 2_000),
        st.lists(st.integers(0, 2**62), max_size=10).map(tuple),
    ),
    min_size=1,
    max_size=30,
)


@given(with_ids)
def test_mooncake_round_trip_keeps_hash_ids(tmp_path_factory: pytest.TempPathFactory,
                                            reqs: list[TraceRequest]) -> None:
    path = tmp_path_factory.mktemp("rt") / "t.jsonl"
    write_mooncake(reqs, path)
    back = load_trace(path)
    t0 = min(r.arrival_s for r in reqs)
    assert sorted((round(r.arrival_s - t0, 3), r.input_tokens, r.output_tokens, r.hash_ids)
                  for r in reqs) == \
        sorted((round(r.arrival_s, 3), r.input_tokens, r.output_tokens, r.hash_ids) for r in back)


def test_shaping_keeps_hash_ids() -> None:
    trace = [TraceRequest(float(t), 1000, 10, (t, t + 1)) for t in range(4)]
    assert [r.hash_ids for r in window(trace, 1.0, 2.0)] == [(1, 2), (2, 3)]
    assert [r.hash_ids for r in scale_rate(trace, 2.0)] == [r.hash_ids for r in trace]
    assert [r.hash_ids for r in clamp_tokens(trace, 5000, 5)] == [r.hash_ids for r in trace]


@dataclass(frozen=True)
class Cut:
    name: str
    ids: tuple[int, ...]
    input_tokens: int
    keep: int
    expected_full: tuple[int, ...]  # the ids kept as they were
    derived: bool  # one more id, derived, for a block cut short


CUTS = [
    Cut("no-cut", (1, 2, 3), 1200, 1200, (1, 2, 3), False),
    Cut("at-a-block-boundary", (1, 2, 3), 1200, 1024, (1, 2), False),
    Cut("inside-a-block", (1, 2, 3), 1200, 700, (1,), True),
    Cut("inside-the-first-block", (1, 2, 3), 1200, 100, (), True),
    Cut("no-ids", (), 1200, 700, (), False),
]


@pytest.mark.parametrize("case", CUTS, ids=[c.name for c in CUTS])
def test_truncate_hash_ids(case: Cut) -> None:
    out = truncate_hash_ids(case.ids, case.input_tokens, case.keep)
    assert out[: len(case.expected_full)] == case.expected_full
    assert len(out) == len(case.expected_full) + case.derived
    if case.derived:
        # the same block cut at the same length matches; cut elsewhere it does not
        assert truncate_hash_ids(case.ids, case.input_tokens + 5, case.keep) == out
        assert truncate_hash_ids(case.ids, case.input_tokens, case.keep + 1)[-1] != out[-1]
        assert out[-1] not in case.ids


@dataclass(frozen=True)
class Ideal:
    name: str
    trace: list[TraceRequest]
    hits: list[int]  # per request


IDEAL = [
    Ideal("no-ids-no-reuse", [TraceRequest(0, 1000, 1), TraceRequest(1, 1000, 1)], [0, 0]),
    Ideal("a-second-turn-hits-the-first-turns-blocks",
          [TraceRequest(0, 1100, 1, (1, 2, 3)), TraceRequest(1, 1600, 1, (1, 2, 4, 5))],
          [0, 1024]),
    Ideal("a-repeat-hits-all-but-the-last-token",
          [TraceRequest(0, 700, 1, (1, 2)), TraceRequest(1, 700, 1, (1, 2))], [0, 699]),
    Ideal("only-a-leading-run-hits",
          [TraceRequest(0, 1536, 1, (1, 2, 3)), TraceRequest(1, 1536, 1, (9, 2, 3))], [0, 0]),
    Ideal("a-shared-system-prompt",
          [TraceRequest(0, 600, 1, (7, 8)), TraceRequest(1, 900, 1, (7, 9)),
           TraceRequest(2, 900, 1, (7, 10))], [0, 512, 512]),
]


@pytest.mark.parametrize("case", IDEAL, ids=[c.name for c in IDEAL])
def test_ideal_prefix_hits(case: Ideal) -> None:
    assert prefix_hit_tokens(case.trace) == case.hits
    assert ideal_prefix_hit_tokens(case.trace) == sum(case.hits)
    total = sum(r.input_tokens for r in case.trace)
    assert ideal_prefix_hit_rate(case.trace) == pytest.approx(sum(case.hits) / total)
