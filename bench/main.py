"""`poolpilot bench`: replay a trace under each scaling policy and compare cost and SLO.

    poolpilot bench --trace AzureLLMInferenceTrace_conv.csv --rate-scale 4 \
        --model llama-3.1-70b --tensor-parallel 2 --json out.json --plot out.png

Every policy sees the same arrivals on the same simulated pool; see docs/bench.md.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import queue
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from poolpilot.bench import report
from poolpilot.bench.policies.base import Bounds, Policy
from poolpilot.bench.replay import BenchConfig, RunResult, replay
from poolpilot.bench.workload import first_seconds, scale_load
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from poolpilot.traces import FORMATS, TraceError, TraceRequest, load_trace
from poolpilot.validate import InvalidPool, parse_spec

POLICIES = ("poolpilot", "static-peak", "hpa", "keda-queue", "dynamo-sla")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="trace file (Azure CSV, Mooncake JSONL, CSV)")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="trace format (default: detected from the file)")
    p.add_argument("--model", default="llama-3.1-8b", help="model shape (engine simulator)")
    p.add_argument("--gpu", default="h200", help="GPU kind (engine simulator)")
    p.add_argument("--tensor-parallel", type=int, default=1,
                   help="GPUs per engine replica (default 1)")
    p.add_argument("--slo-ttft", type=float, default=1.0, help="TTFT target, seconds (1.0)")
    p.add_argument("--slo-itl", type=float, default=0.05, help="ITL target, seconds (0.05)")
    p.add_argument("--rate-scale", type=float, default=1.0,
                   help="multiply the request rate, keeping the trace's clock (1.0)")
    p.add_argument("--cold-start", type=float, default=120.0,
                   help="seconds from a scale-up until the new pod serves (120)")
    p.add_argument("--duration", type=float, default=None,
                   help="replay only the first SECONDS of the trace")
    p.add_argument("--policies", default=",".join(POLICIES),
                   help=f"comma-separated, from: {', '.join(POLICIES)}")
    p.add_argument("--min-replicas", type=int, default=1, help="per role (1)")
    p.add_argument("--max-replicas", type=int, default=32, help="per role (32)")
    p.add_argument("--scrape-interval", type=float, default=15.0,
                   help="Prometheus scrape interval, seconds (15)")
    p.add_argument("--dynamo-predictor", choices=("constant", "arima"), default="constant",
                   help="Dynamo planner's load predictor (arima needs pmdarima installed)")
    p.add_argument("--poolpilot-autoscaling", default=None, metavar="JSON",
                   help="spec.autoscaling fields for the poolpilot policy, as in an "
                        "InferencePool (camelCase JSON), e.g. "
                        "'{\"scaleDown\": {\"stabilizationWindowSeconds\": 300, "
                        "\"maxStep\": 4, \"cooldownSeconds\": 30}}'")
    p.add_argument("--local-prefill", choices=("on", "off"), default="off",
                   help="the router's local-prefill fallback: decode engines prefill requests "
                        "themselves while the prefill role is behind (off)")
    p.add_argument("--seed", type=int, default=0, help="seed for --rate-scale copies (0)")
    p.add_argument("--jobs", type=int, default=1,
                   help="policies replayed in parallel processes (1)")
    p.add_argument("--json", dest="json_out", default=None, help="write results as JSON here")
    p.add_argument("--plot", default=None, help="write a PNG of replicas and TTFT over time")
    p.add_argument("--markdown", default=None, help="write the table as markdown here")


def parse_policies(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in POLICIES]
    if bad or not names:
        raise ValueError(f"--policies: unknown {', '.join(bad) or '(none given)'}; "
                         f"choose from {', '.join(POLICIES)}")
    return names


def build_policy(name: str, trace: Sequence[TraceRequest], cfg: BenchConfig,
                 predictor: str = "constant",
                 autoscaling: dict[str, Any] | None = None) -> Policy:
    """Policies are built where they run (each worker process builds its own)."""
    from poolpilot.bench.policies.dynamo_sla import DynamoSLA
    from poolpilot.bench.policies.hpa import HPAGpuUtil
    from poolpilot.bench.policies.keda import KedaQueue
    from poolpilot.bench.policies.poolpilot_policy import PoolpilotPolicy
    from poolpilot.bench.policies.static_peak import StaticPeak, size_for, warmup_load
    from poolpilot.bench.profile import SimCapacity

    bounds = Bounds(cfg.min_replicas, cfg.max_replicas)
    cap = SimCapacity(cfg.model, cfg.gpu, cfg.slo_itl, cfg.tensor_parallel, cfg.engine)
    # Autoscaled pools start warm, the same for all: sized for the first five minutes' mean.
    initial = size_for(warmup_load(trace), cap, bounds)
    if name == "static-peak":
        return StaticPeak(trace, cap, bounds)
    if name == "poolpilot":
        return PoolpilotPolicy(bounds, initial, cfg.slo_ttft, cfg.slo_itl, cfg.quantile,
                               autoscaling=autoscaling)
    if name == "hpa":
        return HPAGpuUtil(bounds, initial)
    if name == "keda-queue":
        return KedaQueue(bounds, initial)
    if name == "dynamo-sla":
        return DynamoSLA(cap, bounds, initial, cfg.slo_itl, cfg.tensor_parallel,
                         predictor=predictor)
    raise ValueError(f"unknown policy {name!r}")


def _worker(name: str, trace: list[TraceRequest], cfg: BenchConfig, predictor: str,
            autoscaling: dict[str, Any] | None, q: Any) -> RunResult:
    last = [0.0]

    def progress(t: float) -> None:
        if q is not None and (t - last[0] >= 30 or t >= (trace[-1].arrival_s if trace else 0)):
            last[0] = t
            q.put((name, t))

    return replay(trace, build_policy(name, trace, cfg, predictor, autoscaling), cfg, progress)


def run_all(names: Sequence[str], trace: list[TraceRequest], cfg: BenchConfig,
            predictor: str = "constant", jobs: int = 1,
            on_progress: Callable[[str, float], None] | None = None,
            autoscaling: dict[str, Any] | None = None) -> list[RunResult]:
    if jobs <= 1:
        out = []
        for n in names:
            def cb(t: float, n: str = n) -> None:
                if on_progress is not None:
                    on_progress(n, t)
            out.append(replay(trace, build_policy(n, trace, cfg, predictor, autoscaling), cfg, cb))
        return out
    ctx = mp.get_context("spawn")
    with ctx.Manager() as mgr:
        q = mgr.Queue()
        with ctx.Pool(min(jobs, len(names))) as pool:
            futs = [pool.apply_async(_worker, (n, trace, cfg, predictor, autoscaling, q))
                    for n in names]
            while not all(f.ready() for f in futs):
                try:
                    n, t = q.get(timeout=0.2)
                    if on_progress is not None:
                        on_progress(n, t)
                except queue.Empty:
                    pass
            results = [f.get() for f in futs]
        while not q.empty() and on_progress is not None:
            n, t = q.get()
            on_progress(n, t)
    return results


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    try:
        names = parse_policies(args.policies)
        raw = load_trace(args.trace, args.format)
        trace = scale_load(first_seconds(raw, args.duration), args.rate_scale, args.seed)
        for flag, v in (("--slo-ttft", args.slo_ttft), ("--slo-itl", args.slo_itl)):
            if not v > 0:
                raise ValueError(f"{flag} must be > 0 seconds, got {v}")
        if args.cold_start < 0:
            raise ValueError(f"--cold-start must be >= 0 seconds, got {args.cold_start}")
        if not 0 <= args.min_replicas <= args.max_replicas or args.max_replicas < 1:
            raise ValueError("--min-replicas/--max-replicas: need 0 <= min <= max and max >= 1")
        cfg = BenchConfig(model=args.model, gpu=args.gpu, tensor_parallel=args.tensor_parallel,
                          slo_ttft=args.slo_ttft, slo_itl=args.slo_itl,
                          cold_start=args.cold_start, scrape_interval=args.scrape_interval,
                          min_replicas=max(1, args.min_replicas),
                          max_replicas=args.max_replicas,
                          local_prefill=args.local_prefill == "on")
        from poolpilot.engine_sim.des import PoolSim

        PoolSim(cfg.model, cfg.gpu, cfg.tensor_parallel, prefill_replicas=0, decode_replicas=0)
        autoscaling = parse_autoscaling(args.poolpilot_autoscaling, cfg)
    except (TraceError, InvalidPool) as exc:
        console.print(f"[red]poolpilot bench: {exc}[/red]")
        return 2
    except ValueError as exc:
        console.print(f"[red]poolpilot bench: {exc}[/red]")
        return 2
    if not trace:
        console.print("[red]poolpilot bench: no request left after --duration[/red]")
        return 2
    span = trace[-1].arrival_s
    console.print(f"{len(trace):,} requests over {span / 60:.1f} min "
                  f"({len(trace) / max(span, 1):.2f} req/s) from {args.trace}, "
                  f"rate scale {args.rate_scale:g}; {cfg.model} on {cfg.gpu} "
                  f"(TP {cfg.tensor_parallel}); SLO TTFT {cfg.slo_ttft:g}s ITL {cfg.slo_itl:g}s")
    started = time.perf_counter()
    with Progress(TextColumn("{task.description:<12}"), BarColumn(),
                  TextColumn("{task.percentage:>5.1f}%"), TimeElapsedColumn(),
                  console=console, transient=False) as prog:
        tasks = {n: prog.add_task(n, total=max(span, 1.0)) for n in names}

        def on_progress(n: str, t: float) -> None:
            prog.update(tasks[n], completed=t)

        results = run_all(names, trace, cfg, args.dynamo_predictor, args.jobs, on_progress,
                          autoscaling)
        for n in names:
            prog.update(tasks[n], completed=max(span, 1.0))
    wall = time.perf_counter() - started
    title = (f"{Path(args.trace).name} x{args.rate_scale:g}: {len(trace):,} requests, "
             f"{cfg.model} TP{cfg.tensor_parallel} on {cfg.gpu}, cold start {cfg.cold_start:g}s"
             + (", local prefill on" if cfg.local_prefill else ""))
    report.print_table(results, title, Console(width=max(140, Console().width)))
    console.print(f"replayed {len(names)} policies in {wall:.1f} s wall")
    meta = {
        "trace": {"file": str(args.trace), "requests": len(trace), "span_s": span,
                  "rate_scale": args.rate_scale, "duration": args.duration},
        "config": {k: v for k, v in asdict(replace(cfg)).items() if k != "engine"},
        "poolpilot_autoscaling": autoscaling,
        "wall_seconds": round(wall, 2),
    }
    doc = report.as_json(results, meta)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2, default=_json_default) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(report.markdown_table(results) + "\n")
    if args.plot:
        report.plot(results, args.plot, title, cfg.slo_ttft)
    return 0


def parse_autoscaling(text: str | None, cfg: BenchConfig) -> dict[str, Any] | None:
    """`--poolpilot-autoscaling` JSON, checked by the InferencePool API's own validation."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--poolpilot-autoscaling: not valid JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise ValueError("--poolpilot-autoscaling: expected a JSON object of spec.autoscaling")
    from poolpilot.bench.policies.poolpilot_policy import pool_spec

    parse_spec(pool_spec(Bounds(cfg.min_replicas, cfg.max_replicas), cfg.slo_ttft, cfg.slo_itl,
                         cfg.quantile, value))
    return value


def _json_default(o: object) -> object:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    raise TypeError(f"cannot serialize {type(o).__name__}")


if __name__ == "__main__":
    from poolpilot.cli import main as cli_main

    sys.exit(cli_main(["bench", *sys.argv[1:]]))
