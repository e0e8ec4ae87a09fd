"""`poolpilot sim ...`: offline experiments on the engine simulator.

    poolpilot sim batching --seed 3 [--json]     static vs continuous batching (DESIGN.md)
    poolpilot sim trace --trace FILE [--copies N] [--mode ...] [--prefill N --decode N] [--json]
        replay a trace through a fixed-size pool with the discrete-event simulator and report
        latencies, the prefix cache's hit rate next to the trace's ideal one, and the
        simulator's speed (simulated seconds per wall second)
    poolpilot sim calibration [--json]
        the step-time model next to the step times measured on an H200, row by row
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from poolpilot import cli
from poolpilot.roles import Mode, Role

from .batching import measure
from .hardware import GPUS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="experiment", metavar="EXPERIMENT")
    sub.required = True
    b = sub.add_parser("batching", help="static vs continuous batching slot utilisation",
                       description=measure.__doc__)
    b.add_argument("--seed", type=int, default=3, help="numpy default_rng seed (default 3)")
    b.add_argument("--json", action="store_true", help="print JSON")
    t = sub.add_parser("trace", help="replay a trace through a simulated pool")
    t.add_argument("--trace", required=True,
                   help="trace file (azure CSV, mooncake or bailian JSONL, csv)")
    t.add_argument("--copies", type=int, default=1,
                   help="overlay N copies of the trace (copy i shifted by i/N s): N x the rate")
    t.add_argument("--limit-seconds", type=float, default=None,
                   help="only the first S seconds of the trace")
    t.add_argument("--model", default="llama-3.1-8b",
                   help="model shape the roofline times (default llama-3.1-8b)")
    cli.add_gpu(t, GPUS)
    t.add_argument("--tensor-parallel", type=int, default=1,
                   help="GPUs per engine (default 1)")
    t.add_argument("--mode", choices=[m.lower() for m in Mode], default="disaggregated",
                   help="separate prefill and decode engines, or one engine pool")
    t.add_argument("--prefill", type=int, default=1, help="prefill replicas")
    t.add_argument("--decode", type=int, default=1, help="decode replicas")
    t.add_argument("--engines", type=int, default=1, help="engine replicas (aggregated)")
    t.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=True, help="engines cache prompt prefixes (a trace's hash ids; "
                   "vLLM's flag, default on)")
    t.add_argument("--scrape-interval", type=float, default=15.0,
                   help="read metrics every S simulated seconds, as a scraper would")
    t.add_argument("--json", action="store_true", help="print JSON")
    c = sub.add_parser("calibration", help="step-time model vs step times measured on an H200")
    c.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    if args.experiment == "batching":
        res = measure(args.seed)
        if args.json:
            print(json.dumps(res.as_dict()))
        else:
            print(f"static batching:     slot utilisation {res.static_utilization:.4f} "
                  f"(time-weighted {res.static_utilization_time_weighted:.4f}, "
                  f"{res.static_steps} steps)")
            print(f"continuous batching: slot utilisation {res.continuous_utilization:.4f} "
                  f"({res.continuous_steps} steps)")
            print(f"throughput ratio (continuous / static): {res.throughput_ratio:.3f}")
        return 0
    if args.experiment == "calibration":
        return _calibration(args.json)
    return _trace(args)


def _calibration(as_json: bool) -> int:
    from dataclasses import asdict

    from .calibration import markdown, rows

    table = rows()
    if as_json:
        print(json.dumps([{**asdict(r), "ratio": r.ratio, "inside": r.inside} for r in table]))
    else:
        print(markdown(table))
    return 0 if all(r.inside for r in table) else 1


def _trace(args: argparse.Namespace) -> int:
    from poolpilot.engine_sim.traces import TraceError, ideal_prefix_hit_rate, load_trace

    from poolpilot import metrics as m

    from .des import PoolSim, SimRequest
    from .engine import EngineConfig
    from .hardware import UnknownHardware

    try:
        trace = load_trace(args.trace)
    except TraceError as exc:
        print(f"poolpilot sim trace: {exc}", file=sys.stderr)
        return 2
    if args.limit_seconds is not None:
        trace = [r for r in trace if r.arrival_s < args.limit_seconds]
    if args.copies < 1:
        print("poolpilot sim trace: --copies must be >= 1", file=sys.stderr)
        return 2
    # each copy's prompts share prefixes among themselves, never with another copy's
    span = 1 + max((h for r in trace for h in r.hash_ids), default=-1)
    reqs = sorted(
        (SimRequest(i * len(trace) + j, r.arrival_s + i / args.copies, r.input_tokens,
                    r.output_tokens, tuple(h + i * span for h in r.hash_ids), r.block_tokens)
         for i in range(args.copies) for j, r in enumerate(trace)),
        key=lambda r: r.arrival,
    )
    try:
        sim = PoolSim(args.model, args.gpu, args.tensor_parallel, args.mode, args.prefill,
                      args.decode, args.engines,
                      config=EngineConfig(enable_prefix_caching=args.enable_prefix_caching))
    except (UnknownHardware, ValueError) as exc:
        print(f"poolpilot sim trace: {exc}", file=sys.stderr)
        return 2
    wall0 = time.perf_counter()
    sim.submit_many(reqs)
    t = 0.0
    end = reqs[-1].arrival if reqs else 0.0
    while t < end:
        t += args.scrape_interval
        sim.run_until(t)
        sim.metrics()
    sim.run()
    wall = time.perf_counter() - wall0
    recs = sim.records()
    ok = [r for r in recs if r.ok]
    ttft = np.array([r.ttft for r in ok if r.ttft is not None])
    itl = np.array([r.itl_p90 for r in ok if r.itl_p90 is not None])
    out: dict[str, Any] = {
        "requests": len(reqs), "ok": len(ok), "simulated_s": sim.now, "wall_s": wall,
        "sim_seconds_per_wall_second": sim.now / wall if wall > 0 else float("inf"),
        "events": sim.events_processed,
        "ttft_p50": float(np.percentile(ttft, 50)) if len(ttft) else None,
        "ttft_p90": float(np.percentile(ttft, 90)) if len(ttft) else None,
        "itl_p90_median": float(np.median(itl)) if len(itl) else None,
        "preemptions": sum(r.preemptions for r in ok),
        # prompt tokens the engines that prefilled found cached, of all prompt tokens
        "prefix_hit_rate": sum(r.prefix_hit_tokens for r in ok) / max(
            1, sum(r.prompt_tokens for r in ok)),
        "ideal_prefix_hit_rate": ideal_prefix_hit_rate(trace),
    }
    first = sim.metrics()[Role.PREFILL if sim.mode == Mode.DISAGGREGATED else Role.ENGINE].counters
    if first[m.VLLM_PREFIX_CACHE_QUERIES]:  # the engines' own counters say the same
        out["prefix_cache_hits_over_queries"] = (first[m.VLLM_PREFIX_CACHE_HITS]
                                                 / first[m.VLLM_PREFIX_CACHE_QUERIES])
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    return 0
