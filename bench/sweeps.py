"""Baselines at their best settings: policy variants, the sweep grids, and the best point.

A baseline is run with its documented defaults (`hpa`, `keda-queue`, `dynamo-sla`) and, with
`--sweep`, with a few values of its main knob around them, each a policy of its own named
like `hpa(target=65)` or `dynamo-sla(interval=60,margin=0.5)` (such names may also be given
in `--policies` directly). A fair comparison takes each baseline at its best point on the
trace:

    best = the cheapest (fewest GPU-hours) variant that reaches the goal (95 % of requests
           within the SLO); if none does, the one with the highest attainment (the cheaper
           of equals).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Knob:
    name: str
    meaning: str
    lo: float  # values must be > lo (or >= lo when `inclusive`)
    hi: float | None = None
    inclusive: bool = False


KNOBS: dict[str, tuple[Knob, ...]] = {
    # an ablation, not a sweep: poolpilot(forecast=0) sizes for the demand of now
    "poolpilot": (Knob("forecast", "1: look one cold start ahead (trend and recent rises); "
                                   "0: size for the demand of now", 0.0, 1.0, inclusive=True),
                  # and poolpilot(hits=0) sizes prefill for every prompt token, as if the
                  # engines kept no prefix-cache counters
                  Knob("hits", "1: size prefill for the prompt tokens the prefix cache does "
                               "not serve; 0: for every prompt token", 0.0, 1.0, inclusive=True),
                  # and poolpilot(room=0) keeps no burst room for the clumps it saw queue
                  Knob("room", "1: keep room for the clumps seen queueing (burst room); 0: "
                               "none", 0.0, 1.0, inclusive=True)),
    "hpa": (Knob("target", "target GPU utilization, percent (80)", 0.0, 100.0),),
    "keda-queue": (Knob("threshold", "waiting requests per replica (5)", 0.0),),
    "dynamo-sla": (
        Knob("interval", "adjustment interval, seconds (180)", 0.0),
        Knob("margin", "profile headroom: a replica is sized for 1/(1 + margin) of its "
                       "profiled throughput (0)", 0.0, inclusive=True),
    ),
}

SWEEPS: dict[str, tuple[dict[str, float], ...]] = {
    "hpa": ({"target": 50}, {"target": 65}, {"target": 95}),
    "keda-queue": ({"threshold": 1}, {"threshold": 2}, {"threshold": 10}),
    "dynamo-sla": ({"interval": 60}, {"margin": 0.5}, {"margin": 1.0},
                   {"interval": 60, "margin": 1.0}),
}

_SPEC = re.compile(r"\s*([a-z-]+)\s*(?:\(([^)]*)\))?\s*$")


def split_specs(text: str) -> list[str]:
    """Comma-separated policy names; commas inside parentheses belong to a variant."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [s.strip() for s in out if s.strip()]


def parse_policy_spec(spec: str, known: Sequence[str]) -> tuple[str, dict[str, float]]:
    """`hpa(target=65)` -> ("hpa", {"target": 65.0}); errors name the knob and its range."""
    m = _SPEC.match(spec)
    if not m or m.group(1) not in known:
        raise ValueError(f"--policies: unknown {spec}; choose from {', '.join(known)}")
    base, body = m.group(1), m.group(2)
    if body is None:
        return base, {}
    knobs = {k.name: k for k in KNOBS.get(base, ())}
    if not knobs:
        raise ValueError(f"--policies: {base} has no settings to vary ({spec})")
    params: dict[str, float] = {}
    for part in (p.strip() for p in body.split(",") if p.strip()):
        key, _, raw = part.partition("=")
        knob = knobs.get(key.strip())
        if knob is None:
            raise ValueError(f"--policies: {spec}: {base} knobs are "
                             f"{', '.join(f'{k.name} ({k.meaning})' for k in knobs.values())}")
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"--policies: {spec}: {knob.name} needs a number, got "
                             f"{raw.strip()!r}") from None
        low_ok = value >= knob.lo if knob.inclusive else value > knob.lo
        if not low_ok or (knob.hi is not None and value > knob.hi):
            bound = f"{'>=' if knob.inclusive else '>'} {knob.lo:g}" + (
                f" and <= {knob.hi:g}" if knob.hi is not None else "")
            raise ValueError(f"--policies: {spec}: {knob.name} must be {bound}")
        params[knob.name] = value
    return base, params


def variant_name(base: str, params: dict[str, float]) -> str:
    if not params:
        return base
    return f"{base}({','.join(f'{k}={v:g}' for k, v in params.items())})"


def with_sweeps(names: Sequence[str]) -> list[str]:
    """`names` with each baseline's sweep variants right after it (no duplicates)."""
    out: list[str] = []
    for n in names:
        out.append(n)
        out += [variant_name(n, p) for p in SWEEPS.get(n, ())]
    return list(dict.fromkeys(out))


def family(name: str) -> str:
    return name.split("(", 1)[0]


def best_points(runs: Sequence[tuple[str, float, float]], goal: float) -> dict[str, str]:
    """Per baseline run with more than one setting, the name of its best point; `runs` are
    (policy name, SLO attainment, GPU-hours)."""
    groups: dict[str, list[tuple[str, float, float]]] = {}
    for run in runs:
        if family(run[0]) in SWEEPS:
            groups.setdefault(family(run[0]), []).append(run)
    out = {}
    for fam, members in groups.items():
        if len(members) < 2:
            continue
        meeting = [r for r in members if r[1] >= goal - 1e-12]
        best = (min(meeting, key=lambda r: r[2]) if meeting
                else max(members, key=lambda r: (r[1], -r[2])))
        out[fam] = best[0]
    return out
