"""The "slow engine" fault: a step-time multiplier on the engine core (POST /sim/fault sets
it; the sandbox's chaos run uses it). The same requests finish that many times later, token
for token, and the work done is unchanged."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from poolpilot.engine_sim.engine import EngineConfig, EngineCore
from poolpilot.engine_sim.hardware import make_step_model
from poolpilot.engine_sim.scheduler import Seq

from poolpilot.roles import Role


def serve(slowdown: float, prompts: tuple[int, ...], output: int) -> tuple[dict[str, float],
                                                                              int]:
    """Run the requests (all arriving at 0) to completion: finish time per request, steps."""
    core = EngineCore(make_step_model("llama-3.1-8b", "h200"), Role.ENGINE, EngineConfig())
    core.slowdown = slowdown
    for i, p in enumerate(prompts):
        core.add(Seq(f"r{i}", p, output, 0.0))
    done: dict[str, float] = {}
    t = 0.0
    while len(done) < len(prompts):
        ch = core.plan(t)
        assert ch is not None
        out = core.commit()
        t = ch.end
        for s in out.finished:
            done[str(s.rid)] = float(s.finished_at or 0.0)
    return done, core.steps_run


@dataclass(frozen=True)
class SlowCase:
    name: str
    slowdown: float
    prompts: tuple[int, ...]
    output: int


CASES = [
    SlowCase("10x-one-request", 10.0, (1000,), 50),
    SlowCase("10x-batch-of-prefill-and-decode", 10.0, (4000, 300, 2000), 200),
    SlowCase("2.5x-batch", 2.5, (512, 512), 100),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_step_takes_slowdown_times_as_long(case: SlowCase) -> None:
    normal, steps = serve(1.0, case.prompts, case.output)
    slow, slow_steps = serve(case.slowdown, case.prompts, case.output)
    assert slow_steps == steps  # the same schedule, only slower
    for rid, t in normal.items():
        assert slow[rid] == pytest.approx(case.slowdown * t, rel=1e-9)


def test_slowdown_applies_from_the_next_chunk_and_ends_when_reset() -> None:
    # one step per chunk, so each chunk is one priced step
    core = EngineCore(make_step_model("llama-3.1-8b", "h200"), Role.ENGINE,
                      EngineConfig(max_chunk_steps=1))
    core.add(Seq("a", 100, 50, 0.0))
    core.plan(0.0)  # the prefill step
    t = core.commit().end
    durations = []
    for factor in (1.0, 10.0, 1.0):
        core.slowdown = factor
        ch = core.plan(t)
        assert ch is not None
        out = core.commit()
        durations.append((ch.ends[-1] - ch.start) / len(ch.ends))
        t = ch.end
        assert not out.finished
    # decode steps of one sequence: the slow one 10x, the next back to normal
    assert durations[1] == pytest.approx(10 * durations[0], rel=0.01)
    assert durations[2] == pytest.approx(durations[0], rel=0.01)
