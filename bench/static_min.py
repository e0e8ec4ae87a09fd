"""`static-min`: the smallest fixed (prefill, decode) pool that meets the attainment goal.

What a team that sized its pool by load-testing the trace would run: no autoscaling, the
fewest replicas per role whose replay reaches the goal (95 % of requests within the SLO).
It is found by replaying candidate pools, not from a formula:

1. decode: the fewest decode replicas that reach the goal with prefill at the upper bound
   (so prefill cannot be what fails);
2. prefill: the fewest prefill replicas that reach it with that decode count;
3. decode again, with that prefill count (a slower prefill smooths what decode receives,
   so decode may need fewer).

Each step is a search over [min, max] replicas that assumes attainment grows with replicas:
the first round tries the capacity profile's peak sizing (static-peak's) and the count
below it; later rounds split the remaining interval into `jobs + 1` parts and replay the
split points in parallel. A candidate's replay stops as soon as more requests than the
goal allows have missed (`replay(..., miss_budget=...)`), so failing candidates are cheap.
If the largest pool within the bounds misses the goal, there is no static-min and the
result says so (it reports that largest pool instead).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from poolpilot.roles import Role

PASS_GOAL = 0.95


@dataclass(frozen=True)
class Probe:
    prefill: int
    decode: int
    slo_attainment: float | None  # None: stopped early (failed)
    passed: bool


def split_points(lo: int, hi: int, k: int) -> list[int]:
    """Up to k distinct integers strictly inside (lo, hi), evenly spread."""
    width = hi - lo
    pts = sorted({lo + max(1, min(width - 1, round(j * width / (k + 1))))
                  for j in range(1, k + 1)})
    return [p for p in pts if lo < p < hi]


def smallest_passing(evaluate: Callable[[list[int]], list[bool]], lo: int, hi: int,
                     guess: int, jobs: int) -> int | None:
    """The smallest x in [lo, hi] with passes(x), evaluating up to `jobs` points per round;
    None if hi fails. Assumes passes() is monotone (more replicas never hurt)."""
    bad, good = lo - 1, hi + 1  # good == hi + 1: nothing passed yet
    guess = min(hi, max(lo, guess))
    first = [guess] if jobs < 2 or guess == lo else [guess - 1, guess]
    points = first
    while points:
        for x, ok in zip(points, evaluate(points), strict=True):
            if ok:
                good = min(good, x)
            else:
                bad = max(bad, x)
        bad = min(bad, good - 1)
        points = split_points(bad, good, max(1, jobs))
    return good if good <= hi else None


def search_static_min(replay_pool: Callable[[list[tuple[int, int]]], list[Probe]],
                      lo: int, hi: int, guess: dict[str, int], jobs: int
                      ) -> tuple[tuple[int, int] | None, list[Probe]]:
    """Steps 1-3 of the module doc. `replay_pool` replays candidate (prefill, decode) pools
    (in parallel) and says whether each met the goal."""
    probes: list[Probe] = []
    seen: dict[tuple[int, int], bool] = {}

    def run(pools: Sequence[tuple[int, int]]) -> list[bool]:
        todo = [pd for pd in pools if pd not in seen]
        if todo:
            for probe in replay_pool(todo):
                probes.append(probe)
                seen[(probe.prefill, probe.decode)] = probe.passed
        return [seen[pd] for pd in pools]

    d = smallest_passing(lambda xs: run([(hi, x) for x in xs]), lo, hi, guess[Role.DECODE], jobs)
    if d is None:
        return None, probes
    dec: int = d
    p = smallest_passing(lambda xs: run([(x, dec) for x in xs]), lo, hi, guess[Role.PREFILL],
                         jobs)
    if p is None:  # cannot happen if passing is monotone: (hi, d) passed
        return None, probes
    pre: int = p
    if dec > lo:
        d2 = smallest_passing(lambda xs: run([(pre, x) for x in xs]), lo, dec, dec - 1, jobs)
        dec = dec if d2 is None else d2
    return (pre, dec), probes
