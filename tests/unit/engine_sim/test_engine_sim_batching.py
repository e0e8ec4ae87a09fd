"""`poolpilot sim batching`: DESIGN.md's worked example, measured on the scheduler."""

from __future__ import annotations

import json

import pytest
from poolpilot.engine_sim.batching import measure, output_lengths

from poolpilot.cli import main


def test_seed_3_reproduces_the_worked_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "batching", "--seed", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["static_utilization"] == pytest.approx(0.5898, abs=5e-4)
    assert 0.95 < out["continuous_utilization"] <= 1.0
    assert out["throughput_ratio"] == pytest.approx(
        out["static_steps"] / out["continuous_steps"])
    assert out["tokens"] == int(output_lengths(3).sum())


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_static_steps_are_the_sum_of_batch_maxima_continuous_near_ideal(seed: int) -> None:
    lengths = output_lengths(seed)
    r = measure(seed)
    # measured on the scheduler, not computed: it must agree with the closed forms
    assert r.static_steps == int(lengths.max(axis=1).sum())
    assert r.continuous_steps >= -(-int(lengths.sum()) // 8)  # no better than perfect packing
    assert r.continuous_utilization > r.static_utilization_time_weighted + 0.3


def test_human_output_names_both_schedules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "batching"]) == 0
    text = capsys.readouterr().out
    assert "static batching" in text and "continuous batching" in text and "0.5898" in text
