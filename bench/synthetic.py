"""Synthetic traces with named shapes, to check a scaling policy on traffic no one tuned it on.

    python -m poolpilot.bench.synthetic --shape bursts --rate 4 --minutes 40 --out bursts.csv
    poolpilot bench --trace bursts.csv ...

Arrivals are a Poisson process whose rate follows the shape (mean `rate` requests/s over the
trace); prompt and output lengths are lognormal around the means given. Shapes:

- `steady`: a constant rate;
- `ramp`: up from a third of the peak to the peak over the first half, down again in the
  second (a slow rise and fall, minutes long);
- `bursts`: a base rate with bursts of `burst_x` times it, `burst_s` seconds long, every
  `period_s` seconds with jitter (shorter than a cold start: only capacity already running
  serves them);
- `steps`: the rate jumps between levels every `period_s` seconds (x1, x2.5, x1.5, x0.5 of
  the base, repeating);
- `waves`: a sinusoid with a period of `period_s` and an amplitude of 60 % of the mean.

Every shape is a function of time only; the seed fixes the draws, so a trace is reproducible.
Written in the plain CSV format (`arrival_s,input_tokens,output_tokens`) that `load_trace`
reads.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from poolpilot.engine_sim.traces import TraceRequest, write_csv

SHAPES = ("steady", "ramp", "bursts", "steps", "waves")


@dataclass(frozen=True)
class Shape:
    name: str
    rate: float  # mean requests/s
    minutes: float
    prompt_mean: float = 1500.0
    output_mean: float = 200.0
    burst_x: float = 5.0
    burst_s: float = 45.0
    period_s: float = 300.0
    sigma: float = 0.8  # lognormal shape of the lengths


def rate_fn(s: Shape, rng: np.random.Generator) -> Callable[[float], float]:
    """Requests/s at time t (seconds), before normalising to the mean rate."""
    span = s.minutes * 60
    if s.name == "steady":
        return lambda t: 1.0
    if s.name == "ramp":
        return lambda t: 1 / 3 + (2 / 3) * (1 - abs(2 * t / span - 1))
    if s.name == "bursts":
        starts = []
        t = float(rng.uniform(0.3, 0.7)) * s.period_s
        while t < span:
            starts.append(t)
            t += s.period_s * float(rng.uniform(0.6, 1.4))
        return lambda t: s.burst_x if any(b <= t < b + s.burst_s for b in starts) else 1.0
    if s.name == "steps":
        levels = (1.0, 2.5, 1.5, 0.5)
        return lambda t: levels[int(t // s.period_s) % len(levels)]
    if s.name == "waves":
        return lambda t: 1 + 0.6 * math.sin(2 * math.pi * t / s.period_s)
    raise ValueError(f"unknown shape {s.name!r}; choose from {', '.join(SHAPES)}")


def generate(s: Shape, seed: int = 0) -> list[TraceRequest]:
    rng = np.random.default_rng(seed)
    f = rate_fn(s, rng)
    span = s.minutes * 60
    grid = np.arange(0.0, span, 1.0)
    weights = np.array([f(float(t)) for t in grid])
    per_second = weights * (s.rate * len(grid) / weights.sum())
    out: list[TraceRequest] = []
    for t0, lam in zip(grid, per_second, strict=True):
        n = int(rng.poisson(lam))
        for t in np.sort(rng.uniform(t0, t0 + 1.0, n)):
            out.append(TraceRequest(round(float(t), 6), _length(rng, s.prompt_mean, s.sigma),
                                    _length(rng, s.output_mean, s.sigma)))
    return out


def _length(rng: np.random.Generator, mean: float, sigma: float) -> int:
    # lognormal with the given mean: mu = ln(mean) - sigma^2 / 2
    return max(1, int(rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m poolpilot.bench.synthetic",
                                description="Write a synthetic trace of a named shape.")
    p.add_argument("--shape", choices=SHAPES, required=True, help="the rate's shape over time")
    p.add_argument("--rate", type=float, required=True, help="mean requests/s")
    p.add_argument("--minutes", type=float, default=40.0, help="length (40)")
    p.add_argument("--prompt-mean", type=float, default=1500.0, help="mean prompt tokens (1500)")
    p.add_argument("--output-mean", type=float, default=200.0, help="mean output tokens (200)")
    p.add_argument("--burst-x", type=float, default=5.0, help="bursts: rate multiple (5)")
    p.add_argument("--burst-s", type=float, default=45.0, help="bursts: seconds long (45)")
    p.add_argument("--period-s", type=float, default=300.0,
                   help="bursts/steps/waves: seconds between changes (300)")
    p.add_argument("--seed", type=int, default=0, help="random seed (0)")
    p.add_argument("--out", required=True, help="CSV file to write")
    a = p.parse_args(argv)
    if a.rate <= 0 or a.minutes <= 0:
        p.error("--rate and --minutes must be > 0")
    shape = Shape(a.shape, a.rate, a.minutes, a.prompt_mean, a.output_mean, a.burst_x,
                  a.burst_s, a.period_s)
    trace = generate(shape, a.seed)
    write_csv(trace, a.out)
    print(f"{a.out}: {len(trace):,} requests over {a.minutes:g} min ({a.shape}, "
          f"mean {len(trace) / (a.minutes * 60):.2f} req/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
