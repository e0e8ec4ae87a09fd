"""`poolpilot bench --cold-start-sweep 120,60,30,20`: every policy at several cold starts.

What a second of cold start buys each policy, on one trace: the same replays as a plain run,
once per cold start, sharing what does not depend on it:

- the fixed pools (`static-min`'s search and `static-peak`) never start a replica after
  t = 0, so they are replayed once and reported at every cold start;
- the oracle's needs (window by window, through the simulator) are planned once; only its
  orders (one cold start ahead) and its replay depend on the cold start;
- every other policy (and each pool's warm start, which covers the first cold start) is
  replayed per cold start.

The document has one bench JSON document per cold start under `runs` (keyed by the cold
start's seconds as text) and `summary`: per policy and cold start, attainment, GPU-hours and
the ratios to the oracle and static-min of the same cold start.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from poolpilot.bench import report
from poolpilot.bench.oracle import OraclePlan, plan_oracle
from poolpilot.bench.policies.base import Bounds
from poolpilot.bench.policies.oracle import Oracle
from poolpilot.bench.replay import BenchConfig, RunResult, replay
from poolpilot.bench.static_min import PASS_GOAL
from poolpilot.engine_sim.traces import TraceRequest

# Policies whose replay does not depend on the cold start (they never scale).
FIXED = ("static-min", "static-peak")


def parse_cold_starts(text: str) -> list[float]:
    """`120,60,30,20` -> [120.0, 60.0, 30.0, 20.0] (order kept, duplicates dropped)."""
    out: list[float] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            v = float(part)
        except ValueError:
            raise ValueError(f"--cold-start-sweep: {part!r} is not a number of seconds") from None
        if not 0 <= v < float("inf"):
            raise ValueError(f"--cold-start-sweep: cold starts must be >= 0 seconds, got {v}")
        if v not in out:
            out.append(v)
    if not out:
        raise ValueError("--cold-start-sweep: give cold starts in seconds, e.g. 120,60,30,20")
    return out


def _plan_job(trace: list[TraceRequest], cfg: BenchConfig, opts: Any, emit: Any) -> OraclePlan:
    bounds = Bounds(cfg.min_replicas, cfg.max_replicas)
    from poolpilot.bench.main import _capacity

    return plan_oracle(trace, cfg, bounds, _capacity(cfg), opts.oracle_window,
                       opts.oracle_target or opts.goal, progress=lambda t: emit("oracle", t))


def _oracle_job(plan: OraclePlan, trace: list[TraceRequest], cfg: BenchConfig,
                emit: Any) -> RunResult:
    policy = Oracle(plan, Bounds(cfg.min_replicas, cfg.max_replicas), cfg.cold_start)
    return replay(trace, policy, cfg, lambda t: emit("oracle", t))


def run_sweep(names: Sequence[str], trace: list[TraceRequest], cfg: BenchConfig,
              cold_starts: Sequence[float], opts: Any, workers: Any,
              ) -> dict[float, list[RunResult]]:
    """Results per cold start, each in the order of `names` (`workers`: bench.main.Workers)."""
    from poolpilot.bench.main import _policy_job, static_min

    cfgs = {cs: replace(cfg, cold_start=cs) for cs in cold_starts}
    first = cfgs[cold_starts[0]]
    plan_fut = workers.submit(_plan_job, trace, first, opts) if "oracle" in names else None
    jobs = {(cs, n): workers.submit(_policy_job, n, trace, cfgs[cs], opts)
            for cs in cold_starts for n in names
            if n not in FIXED and n != "oracle" and n != "static-peak"}
    if "static-peak" in names:
        jobs[(cold_starts[0], "static-peak")] = workers.submit(
            _policy_job, "static-peak", trace, first, opts)
    fixed: dict[str, RunResult] = {}
    if "static-min" in names:
        fixed["static-min"] = static_min(trace, first, opts, workers)
    if plan_fut is not None:
        plan = workers.wait([plan_fut])[0]
        for cs in cold_starts:
            jobs[(cs, "oracle")] = workers.submit(_oracle_job, plan, trace, cfgs[cs])
    keys = list(jobs)
    done = dict(zip(keys, workers.wait([jobs[k] for k in keys]), strict=True))
    if "static-peak" in names:
        fixed["static-peak"] = done.pop((cold_starts[0], "static-peak"))
    out: dict[float, list[RunResult]] = {}
    for cs in cold_starts:
        out[cs] = [fixed[n] if n in fixed else done[(cs, n)] for n in names]
    return out


def sweep_document(results: Mapping[float, Sequence[RunResult]], meta: Mapping[str, Any],
                   goal: float = PASS_GOAL) -> dict[str, Any]:
    """One bench document per cold start, and the summary across them."""
    runs = {}
    for cs, rs in results.items():
        m = {**meta, "title": f"{meta.get('title', '')}, cold start {cs:g}s",
             "config": {**dict(meta.get("config", {})), "cold_start": cs}}
        runs[f"{cs:g}"] = report.as_json(list(rs), m, goal)
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for cs_key, doc in runs.items():
        for name, row in doc["policies"].items():
            summary.setdefault(name, {})[cs_key] = {
                k: row.get(k) for k in ("slo_attainment", "gpu_hours", "gpu_hours_vs_oracle",
                                        "gpu_hours_vs_static_min")}
    return {**meta, "cold_starts": [float(k) for k in runs], "runs": runs, "summary": summary,
            "fixed_policies": [n for n in FIXED if n in summary]}


def markdown(doc: Mapping[str, Any], goal: float = PASS_GOAL) -> str:
    """Per policy and cold start: attainment / GPU-hours (ratio to the oracle), a goal mark
    where it meets the yardstick (>= goal, <= 1.25x the oracle, cheaper than static-min)."""
    keys = [f"{cs:g}" for cs in doc["cold_starts"]]
    head = "| policy | " + " | ".join(f"{k} s" for k in keys) + " |"
    rows = [head, "|---|" + "---|" * len(keys)]
    for name, per in doc["summary"].items():
        cells = []
        for k in keys:
            r = per.get(k)
            if not r or r.get("slo_attainment") is None:
                cells.append("-")
                continue
            vs = r.get("gpu_hours_vs_oracle")
            sm = r.get("gpu_hours_vs_static_min")
            mark = " **goal**" if (r["slo_attainment"] >= goal - 1e-12 and vs is not None
                                   and vs <= 1.25 and sm is not None and sm < 1) else ""
            ratio = f" ({vs:.2f}x)" if vs is not None else ""
            cells.append(f"{100 * r['slo_attainment']:.1f}% / {r['gpu_hours']:.2f}{ratio}{mark}")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def monotone_drops(doc: Mapping[str, Any], policy: str = "poolpilot") -> list[tuple[str, str,
                                                                                  float]]:
    """(longer, shorter, points lost) for each step of the sweep where `policy`'s attainment
    fell as the cold start shrank (cold starts sorted longest first)."""
    per = doc["summary"].get(policy, {})
    keys = sorted(per, key=float, reverse=True)
    out = []
    for a, b in itertools.pairwise(keys):
        lost = 100 * (per[a]["slo_attainment"] - per[b]["slo_attainment"])
        if lost > 0:
            out.append((a, b, round(lost, 3)))
    return out
