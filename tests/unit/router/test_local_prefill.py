"""The local-prefill rule: P/D path or prefill on a decode engine, sized from the ITL budget."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.router import local_prefill as lp
from poolpilot.router.local_prefill import DecodeLoad, LocalPrefillPolicy, PrefillLoad

H8 = lp.PRESETS["llama-3.1-8b/h200"]
H70 = lp.PRESETS["llama-3.1-70b-tp2/h200"]
# The shared calibration lives next to the checkout (../shared), or above a worktree.
CALIBRATION = next(
    (p / "shared" / "calibration" / "h200-mixedstep.json"
     for p in Path(__file__).resolve().parents
     if (p / "shared" / "calibration" / "h200-mixedstep.json").exists()),
    Path("/nonexistent"),
)


@dataclass(frozen=True)
class ChunkCase:
    id: str
    table: lp.MixedStepTable
    batch: int
    itl_s: float
    low: int
    high: int


CHUNK_CASES = [
    # The calibration's reading: an 8B decode engine keeps 50 ms with a 1,024-token chunk per
    # step (41.6 ms at batch 128; 2,048 would take 73.7 ms) ...
    ChunkCase("8b batch 128 at 50 ms", H8, 128, 0.050, 1024, 2047),
    ChunkCase("8b batch 16 at 50 ms", H8, 16, 0.050, 1500, 2047),
    # ... a 70B TP2 one only ~200 tokens (256 already takes 52.6 ms at batch 64).
    ChunkCase("70b batch 64 at 50 ms", H70, 64, 0.050, 150, 255),
    ChunkCase("70b batch 16 at 50 ms", H70, 16, 0.050, 256, 511),
    # A tighter budget leaves less; a budget the batch alone uses leaves nothing.
    ChunkCase("8b batch 128 at 25 ms", H8, 128, 0.025, 256, 511),
    ChunkCase("70b batch 64 at 25 ms", H70, 64, 0.025, 0, 0),
    ChunkCase("8b beyond the largest batch measured", H8, 600, 0.050, 0, 0),
]


@pytest.mark.parametrize("case", CHUNK_CASES, ids=[c.id for c in CHUNK_CASES])
def test_chunk_size_comes_from_the_itl_budget(case: ChunkCase) -> None:
    chunk = lp.max_chunk(case.table, case.batch, case.itl_s)
    assert case.low <= chunk <= case.high
    if chunk:
        assert case.table.step_s(case.batch, chunk) <= case.itl_s
        assert case.table.step_s(case.batch, chunk + 1) > case.itl_s


def test_table_reproduces_the_measured_points_and_interpolates_between_them() -> None:
    assert H8.step_s(128, 1024) == pytest.approx(0.04158)
    assert H8.step_s(64, 0) == pytest.approx(0.01042)
    assert H8.step_s(96, 1024) == pytest.approx((0.03605 + 0.04158) / 2)
    assert H8.step_s(8, 0) == H8.step_s(16, 0)  # below the smallest batch: never optimistic
    assert H8.step_s(16, 6144) > H8.step_s(16, 4096)  # linear past the largest chunk


@pytest.mark.skipif(not CALIBRATION.exists(), reason="shared calibration not checked out here")
def test_presets_match_the_calibration_file() -> None:
    data = json.loads(CALIBRATION.read_text())["models"]
    for preset, model in (("llama-3.1-8b/h200", "llama-3.1-8b"),
                          ("llama-3.1-70b-tp2/h200", "llama-3.1-70b-tp2-per-gpu")):
        for row in data[model]["rows"]:
            got = lp.PRESETS[preset].step_s(row["decode_batch"], row["prefill_chunk"])
            assert got == pytest.approx(row["step_s_graph"], rel=0.01), (preset, row)


# A prefill engine of the 8B preset prefills ~36k tokens/s; the TTFT target is 1 s.
POLICY = LocalPrefillPolicy(ttft_s=1.0, itl_s=0.050, cost=H8)
FAST = H8.prefill_tokens_per_s


@dataclass(frozen=True)
class DecideCase:
    id: str
    prompt: int
    prefill: list[PrefillLoad]
    decode: list[DecodeLoad]
    active: bool
    local: bool
    engine: int | None
    reason: str
    active_after: bool
    policy: LocalPrefillPolicy = POLICY


DECIDE_CASES = [
    DecideCase("prefill keeps up: P/D", 2000, [PrefillLoad(10_000, FAST)],
               [DecodeLoad(64)], False, False, None, lp.PREFILL_OK, False),
    DecideCase("prefill 2 s behind: local on the decode engine", 2000,
               [PrefillLoad(70_000, FAST)], [DecodeLoad(64)], False, True, 0,
               lp.PREFILL_BEHIND, True),
    DecideCase("the least loaded prefill engine decides", 2000,
               [PrefillLoad(200_000, FAST), PrefillLoad(1_000, FAST)], [DecodeLoad(64)],
               False, False, None, lp.PREFILL_OK, False),
    DecideCase("no prefill engine at all: local", 500, [], [DecodeLoad(16)], False, True, 0,
               lp.PREFILL_BEHIND, True),
    DecideCase("a prefill engine with no measured rate counts as none", 500,
               [PrefillLoad(0, 0.0)], [DecodeLoad(16)], False, True, 0, lp.PREFILL_BEHIND,
               True),
    DecideCase("the decode engine with the earliest local first token wins", 2000,
               [PrefillLoad(70_000, FAST)],
               [DecodeLoad(16, local_tokens=40_000), DecodeLoad(128), DecodeLoad(16)],
               False, True, 2, lp.PREFILL_BEHIND, True),
    DecideCase("prefix-aware: the decode engine holding the prompt's prefix wins", 8000,
               [PrefillLoad(70_000, FAST)],
               [DecodeLoad(16), DecodeLoad(16, cached_tokens=6000), DecodeLoad(16)],
               False, True, 1, lp.PREFILL_BEHIND, True),
    DecideCase("prefix-aware: ... unless its local backlog outweighs the prefix", 8000,
               [PrefillLoad(70_000, FAST)],
               [DecodeLoad(16), DecodeLoad(16, local_tokens=20_000, cached_tokens=6000)],
               False, True, 0, lp.PREFILL_BEHIND, True),
    DecideCase("prefix-aware: a prefill engine holding the prompt keeps it on P/D", 8000,
               [PrefillLoad(30_000, FAST, cached_tokens=8000)], [DecodeLoad(16)], False,
               False, None, lp.PREFILL_OK, False),
    DecideCase("... which without the prefix would be behind", 8000,
               [PrefillLoad(30_000, FAST)], [DecodeLoad(16)], False, True, 0,
               lp.PREFILL_BEHIND, True),
    DecideCase("decode batches use the whole ITL budget: P/D", 2000,
               [PrefillLoad(70_000, FAST)], [DecodeLoad(600), DecodeLoad(800)], False, False,
               None, lp.NO_DECODE_HEADROOM, True),
    DecideCase("local backlog would be slower than prefill: P/D", 2000,
               [PrefillLoad(70_000, FAST)], [DecodeLoad(64, local_tokens=100_000)], False,
               False, None, lp.NO_DECODE_HEADROOM, True),
    # The same 1.3 s prefill wait and local backlog: an 8B decode engine (~1,500-token
    # chunks at batch 64) absorbs it, a 70B TP2 one (~230-token chunks) would be slower.
    DecideCase("8B decode absorbs a 1.3 s prefill wait", 4000,
               [PrefillLoad(10_000 * FAST / H70.prefill_tokens_per_s - 4000, FAST)],
               [DecodeLoad(64, local_tokens=4000)], False, True, 0, lp.PREFILL_BEHIND, True),
    DecideCase("70B decode cannot absorb a 1.3 s prefill wait", 4000,
               [PrefillLoad(6_000, H70.prefill_tokens_per_s)],
               [DecodeLoad(64, local_tokens=4000)], False, False, None,
               lp.NO_DECODE_HEADROOM, True,
               LocalPrefillPolicy(ttft_s=1.0, itl_s=0.050, cost=H70)),
    DecideCase("hysteresis: stays on above exit x target", 2000, [PrefillLoad(20_000, FAST)],
               [DecodeLoad(64)], True, True, 0, lp.PREFILL_BEHIND, True),
    DecideCase("hysteresis: off once below exit x target", 2000, [PrefillLoad(10_000, FAST)],
               [DecodeLoad(64)], True, False, None, lp.PREFILL_OK, False),
    DecideCase("disabled", 2000, [], [DecodeLoad(0)], True, False, None, lp.DISABLED, False,
               LocalPrefillPolicy(ttft_s=1.0, itl_s=0.050, cost=H8, enabled=False)),
]


@pytest.mark.parametrize("case", DECIDE_CASES, ids=[c.id for c in DECIDE_CASES])
def test_decide(case: DecideCase) -> None:
    d = lp.decide(case.prompt, case.prefill, case.decode, case.policy, case.active)
    assert (d.local, d.engine, d.reason, d.active) == \
        (case.local, case.engine, case.reason, case.active_after)
    if d.local:
        assert d.local_ttft_s < d.prefill_wait_s


def test_hysteresis_does_not_flap_as_the_queue_moves_inside_the_band() -> None:
    # The prefill queue rises past the target, then drains; the path switches once each way.
    queue = [10_000, 30_000, 40_000, 20_000, 30_000, 18_000, 20_000, 10_000, 5_000]
    active, path = False, []
    for q in queue:
        d = lp.decide(1000, [PrefillLoad(q, FAST)], [DecodeLoad(64)], POLICY, active)
        active = d.active
        path.append(d.local)
    assert path == [False, False, True, True, True, True, True, False, False]


@given(
    prompt=st.integers(1, 32_000),
    queued=st.floats(0, 1e6),
    running=st.lists(st.integers(0, 300), min_size=0, max_size=6),
    local_tokens=st.floats(0, 1e5),
    active=st.booleans(),
)
def test_local_only_when_it_beats_the_prefill_wait_and_keeps_itl(
    prompt: int, queued: float, running: list[int], local_tokens: float, active: bool
) -> None:
    decode = [DecodeLoad(r, local_tokens) for r in running]
    d = lp.decide(prompt, [PrefillLoad(queued, FAST)], decode, POLICY, active)
    if d.local:
        assert d.engine is not None
        assert d.local_ttft_s < d.prefill_wait_s
        assert d.prefill_wait_s > POLICY.exit * POLICY.ttft_s
        chunk = lp.max_chunk(H8, decode[d.engine].running, POLICY.itl_s)
        assert chunk > 0 and H8.step_s(decode[d.engine].running, chunk) <= POLICY.itl_s
    else:
        assert d.engine is None


@pytest.mark.parametrize(("samples", "low", "high"), [
    ([(8000, 0.5)] * 20, 15_000, 17_000),  # converges to 16k tokens/s
    ([(200, 0.05)] * 20, 35_900, 36_000),  # short prompts measure overhead: dropped
    ([(1000, 0.0), (1000, math.inf)], 35_900, 36_000),  # nonsense ignored
], ids=["busy samples converge", "short prompts dropped", "bad samples ignored"])
def test_rate_estimate(samples: list[tuple[float, float]], low: float, high: float) -> None:
    est = lp.RateEstimate(FAST)
    for tokens, seconds in samples:
        est.observe(tokens, seconds)
    assert low <= est.tokens_per_s <= high


def test_presets_by_model_name() -> None:
    assert lp.preset_for_model("meta-llama/Llama-3.1-8B-Instruct") == "llama-3.1-8b/h200"
    assert lp.preset_for_model("meta-llama/Llama-3.1-70B-Instruct") == "llama-3.1-70b-tp2/h200"
    assert lp.preset_for_model("tiny-llama") is None
    assert lp.preset_for_model(None) is None


@pytest.mark.parametrize(("measured", "factor"), [
    (H8.prefill_tokens_per_s, None),  # the preset's own hardware: unchanged
    (H8.prefill_tokens_per_s / 3, 3.0),  # 3x slower prefill engines: 3x slower mixed steps
    (H8.prefill_tokens_per_s * 2, 0.5),
    (0.0, None),  # nothing measured yet: the preset as it is
    (math.inf, None),
    (1.0, 10.0),  # clamped: one absurd measurement cannot switch the fallback off for good
], ids=["same hardware", "slower", "faster", "zero", "infinite", "clamped"])
def test_calibration_scales_the_step_costs(measured: float, factor: float | None) -> None:
    policy = LocalPrefillPolicy(ttft_s=1.0, itl_s=0.05, cost=H8)
    got = lp.calibrated(policy, measured)
    if factor is None:
        assert got is policy
        return
    assert got.cost.step_s(16, 512) == pytest.approx(H8.step_s(16, 512) * factor)
    assert (got.ttft_s, got.itl_s) == (policy.ttft_s, policy.itl_s)
    assert lp.calibrated(policy, measured) is got  # reused: local_rate's cache keys on it


def test_calibrated_preset_is_close_to_other_hardware() -> None:
    """The H200 preset on a pool of simulated A100s (as `poolpilot sandbox` runs by default):
    uncalibrated it promises ~3x the local prefill rate a decode engine delivers, so the
    router piles local work on it; scaled by the prefill engines' measured throughput it is
    within 25%, and never above what the engine does (the fallback errs towards P/D)."""
    from poolpilot.engine_sim.des import _MixedStepCost
    from poolpilot.engine_sim.hardware import make_step_model

    a100 = make_step_model("llama-3.1-8b", "a100")
    truth = _MixedStepCost(a100, 2048)
    measured = 2048 / a100.mixed_step_time(0, 0, 2048)  # what a prefill engine does
    policy = lp.calibrated(LocalPrefillPolicy(ttft_s=1.0, itl_s=0.05, cost=H8), measured)
    for batch in (1, 8, 32):
        actual = lp.local_rate(truth, batch, 0.05)
        assert lp.local_rate(H8, batch, 0.05) > 2.5 * actual
        assert 0.75 * actual <= lp.local_rate(policy.cost, batch, 0.05) <= actual


def test_calibration_waits_for_measured_prefills() -> None:
    """The router calibrates on what its prefill engines did, not on the number it was seeded
    with (a profile's, or one set on purpose to force the fallback)."""
    est = lp.RateEstimate(10.0)
    assert not est.measured
    est.observe(200, 0.05)  # a short prompt measures overhead: not a sample
    for _ in range(lp.MEASURED_SAMPLES - 1):
        est.observe(8000, 0.5)
    assert not est.measured
    est.observe(8000, 0.5)
    assert est.measured and est.samples == lp.MEASURED_SAMPLES
