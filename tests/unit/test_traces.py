"""Trace parsers: every format, auto-detection, and errors that name FILE:LINE."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from poolpilot.traces import (
    TraceError,
    TraceRequest,
    busy_periods,
    clamp_tokens,
    load_trace,
    longest_busy_period,
    rate_per_bin,
    scale_rate,
    window,
    write_csv,
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
        "mooncake",
        "t.jsonl",
        '{"timestamp": 1000, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}\n'
        "\n"
        '{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}\n',
        [TraceRequest(0.0, 100, 5), TraceRequest(1.0, 600, 20)],
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
    Bad("azure-zero-output", "t.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,5,0\n",
        ":2: GeneratedTokens must be >= 1"),
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
