"""The sandbox report: latency percentiles, SLO attainment, replica-seconds, scale events,
plots, and the shipped pool and trace."""

from __future__ import annotations

import csv
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.emulator.cluster.timeline import RoleSample, ScaleChange
from poolpilot.engine_sim.traces import load_trace, longest_busy_period, rate_per_bin
from poolpilot.sandbox import report as R
from poolpilot.sandbox.data import BURST_TRACE, DEFAULT_POOL, DEFAULT_TRACE, VLLM_POOL
from poolpilot.sandbox.loadgen import RequestResult, prompt_tokens

from poolpilot.validate import validate_file

REPO = Path(__file__).resolve().parents[3]
# The shared traces live next to the checkout (../shared), or above a worktree.
SHARED_CODE = next((p / "shared" / "traces" / "AzureLLMInferenceTrace_code.csv"
                    for p in REPO.parents
                    if (p / "shared" / "traces" / "AzureLLMInferenceTrace_code.csv").exists()),
                   Path("/nonexistent"))
SLO = R.Slo(ttft_s=1.0, ttft_quantile=0.9, itl_s=0.05, itl_quantile=0.9)


def result(i: int, ttft: float | None, gaps: list[float], ok: bool = True,
           arrival: float = 0.0) -> RequestResult:
    """A request sent at t=100 (real seconds) with the given TTFT and inter-token gaps."""
    r = RequestResult(i, arrival, 10, len(gaps) + 1, sent_at=100.0, ok=ok)
    if ttft is not None:
        t = 100.0 + ttft
        r.first_token_at = t
        r.token_times = [t]
        for g in gaps:
            t += g
            r.token_times.append(t)
        r.finished_at = t
        r.output_tokens = len(r.token_times)
    if not ok:
        r.error = "APIConnectionError: boom"
    return r


@dataclass(frozen=True)
class SloCase:
    name: str
    ttft: float | None
    gaps: list[float]
    ok: bool
    speed: float
    meets: bool


SLO_CASES = [
    SloCase("fast", 0.2, [0.01, 0.02], True, 1, True),
    SloCase("ttft-over", 1.5, [0.01], True, 1, False),
    SloCase("ttft-over-after-speed", 0.3, [0.001], True, 4, False),  # 0.3 real = 1.2 simulated
    SloCase("itl-mean-over", 0.2, [0.01, 0.2], True, 1, False),
    SloCase("itl-mean-within-despite-one-spike", 0.2, [0.01, 0.01, 0.01, 0.12], True, 1, True),
    SloCase("single-token", 0.2, [], True, 1, True),
    SloCase("failed", None, [], False, 1, False),
]


@pytest.mark.parametrize("case", SLO_CASES, ids=[c.name for c in SLO_CASES])
def test_meets_slo(case: SloCase) -> None:
    r = result(0, case.ttft, case.gaps, case.ok)
    assert R.meets_slo(r, SLO, case.speed) is case.meets


def test_ttft_and_itl_scale_with_speed() -> None:
    r = result(0, 0.25, [0.01, 0.03])
    assert r.ttft(4) == pytest.approx(1.0)
    assert r.itls(2) == pytest.approx([0.02, 0.06])
    assert r.mean_itl(2) == pytest.approx(0.04)
    r.output_tokens = 5  # two chunks carried 5 tokens: the mean counts tokens
    assert r.mean_itl(2) == pytest.approx(0.02)


def test_step_integral_and_replica_seconds() -> None:
    assert R.step_integral([(0, 1), (10, 3), (20, 2)], 25) == 1 * 10 + 3 * 10 + 2 * 5
    assert R.step_integral([(0, 1), (10, 3)], 5) == 5
    samples = [
        RoleSample(90.0, "ns", "p", "prefill", 1, 0, 1),  # before the replay: counts from t0
        RoleSample(110.0, "ns", "p", "prefill", 3, 1, 3),
        RoleSample(100.0, "ns", "p", "decode", 1, 1, 1),
    ]
    # t0=100, end=120 real seconds, speed 2: prefill 1 pod x 20 + 3 pods x 20 simulated seconds
    assert R.replica_seconds(samples, 100.0, 120.0, 2.0) == {"decode": 40.0, "prefill": 80.0}


def test_the_pool_coming_up_before_the_replay_plots_as_its_state_at_the_start() -> None:
    samples = [RoleSample(t, "ns", "p", "prefill", 1, ready, 1)
               for t, ready in ((80.0, 0), (90.0, 1), (100.0, 1), (110.0, 1))]
    assert R.role_series(samples, 100.0, 2.0, "ready") == {"prefill": [(0.0, 1.0), (20.0, 1.0)]}


@given(st.lists(st.tuples(st.floats(0, 100), st.integers(0, 8)), min_size=1, max_size=20),
       st.floats(0, 200))
def test_step_integral_is_bounded_by_max_value(points: list[tuple[float, int]],
                                               end: float) -> None:
    pts = sorted(points)
    total = R.step_integral([(t, float(v)) for t, v in pts], end)
    assert 0 <= total <= max(v for _, v in pts) * end + 1e-6


def test_direction_changes_count_flips_only() -> None:
    events = [{"role": "prefill", "from": a, "to": b} for a, b in
              [(1, 3), (3, 4), (4, 3), (3, 1)]] + [{"role": "decode", "from": 1, "to": 2}]
    assert R.direction_changes(events, "prefill") == 1
    assert R.direction_changes(events, "decode") == 0
    flappy = [{"role": "prefill", "from": a, "to": b} for a, b in [(1, 2), (2, 1), (1, 2)]]
    assert R.direction_changes(flappy, "prefill") == 2


def test_build_report_has_the_documented_fields(tmp_path: Path) -> None:
    results = [result(i, 0.1 * (i + 1), [0.01] * 3, arrival=i) for i in range(10)]
    results.append(result(10, None, [], ok=False, arrival=5))
    changes = [ScaleChange(105.0, "ns", "p", "prefill", 1, 3, "TTFTAboveTarget", "ttft 2s > 1s")]
    samples = [RoleSample(100.0, "ns", "p", "prefill", 1, 1, 1)]
    local = {"prefill_behind": [(0.0, 0.0), (10.0, 4.0)], "kv_transfer_failed": [(0.0, 0.0)]}
    rep = R.build_report(results=results, slo=SLO, speed=2.0, samples=samples, changes=changes,
                         t0=100.0, t_end=130.0, meta={"engine": "sim"}, local_prefill=local)
    assert rep["requests"]["sent"] == 11
    assert rep["requests"]["ok"] == 10 and rep["requests"]["failed"] == 1
    assert rep["requests"]["errors"] == {"APIConnectionError: boom": 1}
    assert set(rep["ttft_seconds"]) >= {"p50", "p90", "p99", "target"}
    assert rep["ttft_seconds"]["p50"] == pytest.approx(1.1)  # 0.55 real x speed 2
    assert rep["itl_seconds"]["p90"] == pytest.approx(0.02)  # per request: 0.01 real x 2
    # TTFT <= 1s simulated: requests with 0.1..0.5 real (x2 = 0.2..1.0) -> 5 of 11
    assert rep["slo_attainment"] == pytest.approx(5 / 11, abs=1e-4)
    assert rep["scale_events"] == [{"t": 10.0, "role": "prefill", "from": 1, "to": 3,
                                    "reason": "TTFTAboveTarget", "message": "ttft 2s > 1s"}]
    assert rep["replica_seconds"] == {"prefill": 60.0}
    assert rep["local_prefill"] == {"total": 4, "by_reason": {"kv_transfer_failed": 0,
                                                              "prefill_behind": 4}}
    path = R.write_report(rep, tmp_path)
    assert json.loads(path.read_text())["requests"]["sent"] == 11
    paths = R.write_plots(out_dir=tmp_path, results=results, slo=SLO, speed=2.0,
                          samples=samples, t0=100.0, t_end=130.0,
                          queue={"prefill": [(0.0, 0.0), (10.0, 5.0)]},
                          scale_events_=rep["scale_events"], local_prefill=local)
    assert sorted(p.name for p in paths) == ["local_prefill.png", "prefix_cache.png",
                                             "queue.png", "replicas.png", "request_rate.png",
                                             "ttft.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
    assert len(R.summary_tables(rep)) == 2


def test_requests_csv_says_which_requests_missed(tmp_path: Path) -> None:
    results = [result(1, 0.6, [0.01] * 3, arrival=2.5),  # TTFT 1.2 s simulated: missed
               result(0, 0.1, [0.01] * 3, arrival=1.0),  # 0.2 s: met
               result(2, None, [], ok=False, arrival=3.0)]
    path = R.write_requests(results, SLO, 2.0, tmp_path)
    rows = list(csv.DictReader(path.open()))
    assert [r["index"] for r in rows] == ["0", "1", "2"]  # in trace order
    assert [r["met_slo"] for r in rows] == ["1", "0", "0"]
    assert float(rows[1]["ttft_s"]) == pytest.approx(1.2) and rows[1]["arrival_s"] == "2.500"
    assert rows[2]["ttft_s"] == "" and rows[2]["error"] == "APIConnectionError: boom"


def test_binned_rate_and_ttft() -> None:
    results = [result(i, 0.5, [], arrival=float(i)) for i in range(20)]
    starts, rate, p90 = R.binned(results, 1.0, 10.0, 20.0)
    assert starts == [0.0, 10.0] and rate == [1.0, 1.0]
    assert p90 == [pytest.approx(0.5), pytest.approx(0.5)]


def test_prompts_have_exact_token_counts_within_every_vocab() -> None:
    p = prompt_tokens(1234, seed=7)
    assert len(p) == 1234 and min(p) >= 10 and max(p) < 500
    assert p == prompt_tokens(1234, seed=7)


def test_shipped_pool_is_valid_and_matches_the_example() -> None:
    assert validate_file(DEFAULT_POOL) == []
    assert validate_file(VLLM_POOL) == []
    assert (REPO / "examples" / "sandbox-pool.yaml").read_text() == DEFAULT_POOL.read_text()


def test_shipped_burst_trace_is_a_burst_then_quiet() -> None:
    trace = load_trace(BURST_TRACE)
    first_20s = sum(1 for r in trace if r.arrival_s < 20)
    assert first_20s > 0.4 * len(trace)  # the burst
    assert trace[-1].arrival_s < 100


def test_default_trace_rises_bursts_and_falls() -> None:
    rate = rate_per_bin(load_trace(DEFAULT_TRACE), 10)
    assert rate[0] > 0 and rate[-1] > 0  # the rule's ends: first and last request of a period
    bursts = sum(1 for a, b in itertools.pairwise([0, *rate]) if a == 0 and b > 0)
    assert bursts >= 5  # from idle to load, again and again: not one spike
    assert max(rate) > 2 * sum(rate) / len(rate)  # bursts well above the mean


@pytest.mark.skipif(not SHARED_CODE.exists(), reason="shared traces not present")
def test_default_trace_is_the_longest_busy_period_verbatim() -> None:
    full = load_trace(SHARED_CODE)
    first, last = longest_busy_period(full)
    rows = SHARED_CODE.read_text().splitlines()
    assert DEFAULT_TRACE.read_text().splitlines() == [rows[0], *rows[1 + first:2 + last]]


def test_local_prefill_counts_are_the_counters_last_values() -> None:
    assert R.local_prefill_counts({}) is None
    assert R.local_prefill_counts({"prefill_behind": [(0, 0), (5, 7), (10, 12)],
                                   "kv_transfer_failed": [(0, 0), (10, 1)],
                                   "prefill_failed": []}) == {
        "total": 13, "by_reason": {"kv_transfer_failed": 1, "prefill_behind": 12,
                                   "prefill_failed": 0}}


def test_reasons_come_from_the_autoscalers_events_in_order() -> None:
    changes = [ScaleChange(1.0, "ns", "p", "prefill", 1, 3),
               ScaleChange(2.0, "ns", "p", "decode", 1, 2),
               ScaleChange(3.0, "ns", "p", "prefill", 3, 2, reason="Manual"),
               ScaleChange(4.0, "ns", "p", "prefill", 1, 3)]
    R.attach_reasons(changes, [
        "prefill 1 -> 3: QueueAboveTarget (Queue 9 vs 2 -> 3)",
        "decode 1 -> 2: SequencesAboveTarget (Sequences 9 vs 4 -> 2)",
        "not a scale message",
        "prefill 1 -> 3: TTFTAboveTarget (TTFT 2 vs 1 -> 3)",
    ])
    assert [c.reason for c in changes] == ["QueueAboveTarget", "SequencesAboveTarget", "Manual",
                                           "TTFTAboveTarget"]
    assert changes[0].message == "prefill 1 -> 3: QueueAboveTarget (Queue 9 vs 2 -> 3)"


def test_the_reason_is_the_decisions_own_not_its_first_steps() -> None:
    # The capacity model sizes while the signals abstain: the Event's message lists every
    # step, and the report must show why the size changed (found: every reason read
    # "SignalsAbstain").
    from poolpilot.autoscaler.decide import History, Observation, Policy, RoleObservation, decide

    pol = Policy(bounds={"prefill": (1, 16), "decode": (1, 16)},
                 prefill_tokens_per_replica=8000.0, decode_tokens_per_replica=2000.0)
    busy = Observation(roles={
        "prefill": RoleObservation(replicas=2, waiting=40.0, running=2.0, ttft=0.3,
                                   prompt_tokens_rate=30_000.0, request_rate=30.0),
        "decode": RoleObservation(replicas=1, waiting=0.0, running=4.0, itl=0.02,
                                  generation_tokens_rate=500.0, kv_usage=0.1)})
    d = decide(busy, pol, History(), 10_000.0).roles["prefill"]
    assert d.replicas > 2 and d.steps[0].reason != d.reason
    changes = [ScaleChange(1.0, "ns", "p", "prefill", 2, d.replicas)]
    R.attach_reasons(changes, [d.message])
    assert changes[0].reason == d.reason
