"""The sandbox report's prefix-cache section: the engines' hit rate per role and in all, the
trace's ideal, the router's expectation, and TTFT by the share of each prompt an earlier
request had sent."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.engine_sim.traces import TraceRequest
from poolpilot.sandbox import report as R
from poolpilot.sandbox.loadgen import RequestResult, results_for
from rich.console import Console

SLO = R.Slo(ttft_s=1.0, ttft_quantile=0.9, itl_s=0.05, itl_quantile=0.9)


def answered(i: int, ttft: float, input_tokens: int = 1000, reusable: int = 0,
             arrival: float = 0.0) -> RequestResult:
    """An answered request sent at t=100 (real seconds), three tokens 10 ms apart."""
    r = RequestResult(i, arrival, input_tokens, 3, sent_at=100.0, ok=True,
                      reusable_tokens=reusable)
    r.first_token_at = 100.0 + ttft
    r.token_times = [r.first_token_at + 0.01 * k for k in range(3)]
    r.finished_at, r.output_tokens = r.token_times[-1], 3
    return r


@dataclass(frozen=True)
class BucketCase:
    name: str
    share: float
    bucket: int


BUCKET_CASES = [
    BucketCase("nothing-reused", 0.0, 0),
    BucketCase("just-under-a-quarter", 0.249, 0),
    BucketCase("a-quarter", 0.25, 1),
    BucketCase("most", 0.8, 3),
    BucketCase("all", 1.0, 3),
]


@pytest.mark.parametrize("case", BUCKET_CASES, ids=[c.name for c in BUCKET_CASES])
def test_reuse_buckets(case: BucketCase) -> None:
    assert R.reuse_bucket(case.share) == case.bucket


@given(st.floats(0.0, 1.0))
def test_every_share_has_a_bucket_that_holds_it(share: float) -> None:
    lo, hi = R.REUSE_BUCKETS[R.reuse_bucket(share)]
    assert lo <= share <= hi


def test_ttft_is_grouped_by_the_reusable_share_of_the_prompt() -> None:
    # Cold prompts slow (0.5 s real), warm ones fast (0.05 s), at speed 2.
    results = [answered(i, 0.5, reusable=0) for i in range(4)]
    results += [answered(4 + i, 0.05, reusable=900) for i in range(6)]
    failed = RequestResult(10, 0.0, 1000, 3, ok=False, reusable_tokens=900)
    groups = R.ttft_by_reuse([*results, failed], speed=2.0)
    assert [g["reusable_share"] for g in groups] == ["0-25%", "25-50%", "50-75%", "75-100%"]
    assert [g["requests"] for g in groups] == [4, 0, 0, 6]  # the failed one has no TTFT
    assert groups[0]["ttft_seconds"]["p50"] == pytest.approx(1.0)
    assert groups[3]["ttft_seconds"]["p90"] == pytest.approx(0.1)
    assert groups[1]["ttft_seconds"]["p50"] is None and groups[1]["prompt_tokens_mean"] is None


@dataclass(frozen=True)
class SectionCase:
    name: str
    prefix: R.PrefixSeries | None
    hit_rate: float | None
    by_role: dict[str, float | None]
    router: float | None


SECTION_CASES = [
    SectionCase("p-d-with-router", R.PrefixSeries(
        hit_rate={"prefill": [(0.0, 0.5)], R.ALL_ROLES: [(0.0, 0.4)]},
        hit_tokens={"prefill": 6000.0, "decode": 0.0},
        query_tokens={"prefill": 10000.0, "decode": 2000.0},
        router_expected={"prefill": [(0.0, 0.7)]}, router_expected_tokens={"prefill": 7000.0},
        router_routed_tokens={"prefill": 10000.0}), 0.5, {"prefill": 0.6, "decode": 0.0}, 0.7),
    SectionCase("engines-without-the-counters", R.PrefixSeries({}, {}, {}), None, {}, None),
    SectionCase("prometheus-had-nothing", None, None, {}, None),
    SectionCase("router-without-its-metric", R.PrefixSeries(
        {}, {"engine": 10.0}, {"engine": 40.0}), 0.25, {"engine": 0.25}, None),
]


@pytest.mark.parametrize("case", SECTION_CASES, ids=[c.name for c in SECTION_CASES])
def test_prefix_cache_section(case: SectionCase) -> None:
    results = [answered(0, 0.2, 1000, 0, arrival=0.0), answered(1, 0.1, 3000, 2000, arrival=6)]
    sec = R.prefix_cache_section(results, 2.0, case.prefix, t_end=20.0)
    assert sec["hit_rate"] == case.hit_rate
    assert {role: d["hit_rate"] for role, d in sec["by_role"].items()} == case.by_role
    assert sec["router_expected_hit_rate"] == case.router
    assert sec["ideal_hit_rate"] == pytest.approx(0.5)  # 2,000 of 4,000 prompt tokens
    ttft = sec["over_time"]["ttft"]
    assert ttft["bin_s"] == 5.0 and ttft["t"] == [0.0, 5.0, 10.0, 15.0]
    assert ttft["p50"] == [pytest.approx(0.4), pytest.approx(0.2), None, None]


def test_the_report_carries_the_section_and_the_plot(tmp_path: Path) -> None:
    trace = [TraceRequest(0.0, 1024, 3, (1, 2)), TraceRequest(1.0, 1500, 3, (1, 2, 3))]
    results = results_for(trace)
    for r, ttft in zip(results, (0.3, 0.1), strict=True):
        r.sent_at, r.ok = 100.0, True
        r.first_token_at = r.finished_at = 100.0 + ttft
        r.token_times, r.output_tokens = [r.first_token_at], 1
    prefix = R.PrefixSeries({"prefill": [(0.0, 0.0), (5.0, 0.68)]}, {"prefill": 1024.0},
                            {"prefill": 2524.0})
    rep = R.build_report(results=results, slo=SLO, speed=1.0, samples=[], changes=[],
                         t0=100.0, t_end=110.0, meta={}, prefix=prefix)
    sec = json.loads(R.write_report(rep, tmp_path).read_text())["prefix_cache"]
    assert set(sec) == {"ideal_hit_rate", "hit_rate", "by_role", "router_expected_hit_rate",
                        "ttft_by_reusable_share", "over_time"}
    assert sec["hit_rate"] == pytest.approx(1024 / 2524, abs=1e-4)
    assert sec["by_role"]["prefill"] == {"hit_rate": pytest.approx(0.4057, abs=1e-4),
                                         "query_tokens": 2524, "hit_tokens": 1024,
                                         "router_expected_hit_rate": None}
    assert sec["ideal_hit_rate"] == pytest.approx(1024 / 2524, abs=1e-4)
    assert sec["over_time"]["hit_rate"] == {"prefill": [[0.0, 0.0], [5.0, 0.68]]}
    paths = R.write_plots(out_dir=tmp_path, results=results, slo=SLO, speed=1.0, samples=[],
                          t0=100.0, t_end=110.0, queue={}, scale_events_=[],
                          prefix_cache=rep["prefix_cache"])
    plot = tmp_path / "prefix_cache.png"
    assert plot in paths and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    console = Console(record=True, width=200)
    console.print(R.summary_tables(rep)[0])
    assert re.search(r"prefix-cache hit rate .* 40\.6% .* prefill 40\.6% .* ideal 40\.6%",
                     console.export_text())


def test_results_carry_the_trace_prefix_and_what_an_ideal_cache_would_serve() -> None:
    # Two sessions on one system prompt (id 1); session A's second turn extends its first.
    trace = [TraceRequest(0.0, 1200, 10, (1, 2, 3)),  # A, turn 1
             TraceRequest(1.0, 700, 10, (1, 9)),  # B, turn 1: shares the system prompt
             TraceRequest(2.0, 1800, 10, (1, 2, 4, 5))]  # A, turn 2: its first two blocks
    results = results_for(trace)
    assert [r.hash_ids for r in results] == [(1, 2, 3), (1, 9), (1, 2, 4, 5)]
    assert [r.reusable_tokens for r in results] == [0, 512, 1024]
    assert results[2].reusable_share() == pytest.approx(1024 / 1800)
