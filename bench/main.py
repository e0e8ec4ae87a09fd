"""`poolpilot bench`: replay a trace under each scaling policy and compare cost and SLO.

    poolpilot bench --trace AzureLLMInferenceTrace_conv.csv --rate-scale 4 \
        --model llama-3.1-70b --tensor-parallel 2 --json out.json --plot out.png

Every policy sees the same arrivals on the same simulated pool; see docs/bench.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import queue
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from poolpilot.bench import report
from poolpilot.bench.ceiling import slo_ceiling
from poolpilot.bench.cold_start import PHASES, PROFILES, ColdStart, parse_phases, profile
from poolpilot.bench.cold_start_sweep import markdown as sweep_markdown
from poolpilot.bench.cold_start_sweep import (
    monotone_drops,
    parse_cold_starts,
    run_sweep,
    sweep_document,
)
from poolpilot.bench.oracle import DEFAULT_WINDOW_S, plan_oracle, warm_start
from poolpilot.bench.policies.base import Bounds, ScalingPolicy
from poolpilot.bench.policies.oracle import Oracle
from poolpilot.bench.policies.static_peak import StaticPool, peak_sizes
from poolpilot.bench.profile import SimCapacity
from poolpilot.bench.replay import DEFAULT_ROUTING, BenchConfig, RunResult, replay
from poolpilot.bench.static_min import PASS_GOAL, Probe, search_static_min
from poolpilot.bench.sweeps import parse_policy_spec, split_specs, variant_name, with_sweeps
from poolpilot.bench.workload import block_tokens, first_seconds, scale_load
from poolpilot.engine_sim.des import ROUTING
from poolpilot.engine_sim.hardware import GPUS
from poolpilot.engine_sim.traces import (
    FORMATS,
    TraceError,
    TraceRequest,
    ideal_prefix_hit_rate,
    load_trace,
)
from poolpilot.router import prefix_index as pi
from poolpilot.router.prefill_hold import DEFAULT_PREFILL_HOLD_S
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from poolpilot import cli
from poolpilot.roles import Role
from poolpilot.validate import InvalidPool, parse_spec

POLICIES = ("poolpilot", "oracle", "static-min", "static-peak", "hpa", "keda-queue",
            "dynamo-sla")


@dataclass(frozen=True)
class Options:
    """What a policy is built from besides the trace and the BenchConfig."""

    predictor: str = "constant"
    autoscaling: dict[str, Any] | None = None
    oracle_window: float = DEFAULT_WINDOW_S
    oracle_target: float | None = None  # None: the goal
    goal: float = PASS_GOAL
    decisions: bool = False  # poolpilot's policies record every decision (--decisions)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", help="trace file (Azure CSV, Mooncake or Qwen-Bailian JSONL, "
                   "BurstGPT CSV, CSV)")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="trace format (default: detected from the file)")
    p.add_argument("--model", default="llama-3.1-8b", help="model shape (engine simulator)")
    cli.add_gpu(p, GPUS)
    p.add_argument("--tensor-parallel", type=int, default=1,
                   help="GPUs per engine replica (default 1)")
    p.add_argument("--slo-ttft", type=float, default=1.0, help="TTFT target, seconds (1.0)")
    p.add_argument("--slo-itl", type=float, default=0.05, help="ITL target, seconds (0.05)")
    p.add_argument("--rate-scale", type=float, default=1.0,
                   help="multiply the request rate, keeping the trace's clock (1.0)")
    p.add_argument("--cold-start", type=float, default=None,
                   help="seconds from a scale-up until the new pod serves (120)")
    p.add_argument("--cold-start-phases", default=None, metavar="PHASES",
                   help="the cold start as phases, e.g. pull=1,load=17,compile=5,graphs=6 "
                        f"(phases: {', '.join(PHASES)}; the cold start is their sum)")
    p.add_argument("--cold-start-profile", choices=PROFILES, default=None,
                   help="the cold start's phases from where the image and weights are, scaled "
                        "to --model and --tensor-parallel (docs/bench.md)")
    p.add_argument("--cold-start-sweep", default=None, metavar="SECONDS",
                   help="replay every policy at each of these cold starts, e.g. 120,60,30,20 "
                        "(the fixed pools and the oracle's needs once); --json gets the sweep "
                        "document, --markdown its summary table")
    p.add_argument("--warm-placeholders", type=int, default=0, metavar="K",
                   help="K GPU nodes kept warm by a placeholder pod (no GPU request): a "
                        "scale-up that finds one free starts with --warm-cold-start (0)")
    p.add_argument("--warm-cold-start", type=float, default=None, metavar="S",
                   help="cold start of a replica placed on a warm node (default: the "
                        "warm-node profile's)")
    p.add_argument("--duration", type=float, default=None,
                   help="replay only the first SECONDS of the trace")
    p.add_argument("--policies", default=",".join(POLICIES),
                   help=f"comma-separated, from: {', '.join(POLICIES)}; a baseline with other "
                        "settings as e.g. hpa(target=65), keda-queue(threshold=2), "
                        "dynamo-sla(interval=60,margin=0.5)")
    p.add_argument("--sweep", action="store_true",
                   help="also run each baseline (hpa, keda-queue, dynamo-sla) with a few "
                        "values of its main knob, and report its best point")
    p.add_argument("--min-replicas", type=int, default=1, help="per role (1)")
    p.add_argument("--max-replicas", type=int, default=32, help="per role (32)")
    p.add_argument("--goal", type=float, default=PASS_GOAL,
                   help="SLO attainment a pool must reach to count as meeting the SLO: "
                        "static-min's target (0.95)")
    p.add_argument("--oracle-window", type=float, default=DEFAULT_WINDOW_S,
                   help="seconds per window the oracle sizes on its own (30)")
    p.add_argument("--oracle-target", type=float, default=None,
                   help="share of each window's requests the oracle serves within the SLO, "
                        "of those that can meet it at all (default: --goal)")
    p.add_argument("--scrape-interval", type=float, default=15.0,
                   help="Prometheus scrape interval, seconds (15)")
    p.add_argument("--dynamo-predictor", choices=("constant", "arima"), default="constant",
                   help="Dynamo planner's load predictor (arima needs pmdarima installed)")
    p.add_argument("--poolpilot-autoscaling", default=None, metavar="JSON",
                   help="spec.autoscaling fields for the poolpilot policy, as in an "
                        "InferencePool (camelCase JSON), e.g. "
                        "'{\"scaleDown\": {\"stabilizationWindowSeconds\": 300, "
                        "\"maxStep\": 4, \"cooldownSeconds\": 30}}'")
    p.add_argument("--local-prefill", choices=("on", "off"), default="on",
                   help="the router's local-prefill fallback: decode engines prefill requests "
                        "themselves while the prefill role is behind (on, as in the router)")
    p.add_argument("--routing", choices=ROUTING, default=DEFAULT_ROUTING,
                   help="how the simulated router picks prefill engines: prefix-aware (the "
                        "router's default: its approximate prefix index, bounded load) or "
                        "least-loaded; the same for every policy")
    p.add_argument("--prefill-hold", type=float, default=DEFAULT_PREFILL_HOLD_S,
                   metavar="SECONDS",
                   help="the simulated router's late binding (its --prefill-hold): a prompt "
                        "waits at the router while every prefill engine has more than this "
                        f"many seconds of queued work (default {DEFAULT_PREFILL_HOLD_S:g}; 0: "
                        "off), the same for every policy")
    p.add_argument("--kv-offload-gib", type=float, default=0.0, metavar="GIB",
                   help="host memory per prefill engine for the CPU offload tier of its prefix "
                        "cache (vLLM's --kv-offloading-size; an InferencePool's "
                        "prefill.kvOffloadGiB), the same for every policy; 0: none (0)")
    p.add_argument("--prefix-max-entries", type=int, default=None, metavar="N",
                   help="keys the simulated router's approximate prefix index remembers (the "
                        f"router's --prefix-max-entries; default {pi.DEFAULT_MAX_ENTRIES}, "
                        "grown with --kv-offload-gib as the operator grows the router's)")
    p.add_argument("--seed", type=int, default=0, help="seed for --rate-scale copies (0)")
    p.add_argument("--jobs", type=int, default=1,
                   help="replays run in parallel processes (1)")
    p.add_argument("--json", dest="json_out", default=None, help="write results as JSON here")
    p.add_argument("--decisions", default=None, metavar="JSONL",
                   help="write every decision of each poolpilot policy here, one JSON object "
                        "per role and decision: policy, t, role, from, to, reason and the "
                        "autoscaler's own message (why it scaled, or held)")
    p.add_argument("--plot", default=None, help="write a PNG of replicas and TTFT over time")
    p.add_argument("--markdown", default=None, help="write the table as markdown here")
    p.add_argument("--replot", default=None, metavar="JSON",
                   help="draw --plot, --markdown and the table again from a saved --json "
                        "document, without replaying")


def parse_policies(text: str, sweep: bool = False) -> list[str]:
    """Policy names, variants like `hpa(target=65)` normalized; with `sweep`, each baseline's
    sweep variants added after it."""
    specs = split_specs(text)
    if not specs:
        raise ValueError(f"--policies: none given; choose from {', '.join(POLICIES)}")
    names = [variant_name(*parse_policy_spec(s, POLICIES)) for s in specs]
    return with_sweeps(names) if sweep else list(dict.fromkeys(names))


Emit = Callable[[str, float], None]


def _capacity(cfg: BenchConfig) -> SimCapacity:
    return SimCapacity(cfg.model, cfg.gpu, cfg.slo_itl, cfg.tensor_parallel, cfg.engine)


def build_policy(name: str, trace: Sequence[TraceRequest], cfg: BenchConfig,
                 opts: Options | None = None,
                 progress: Callable[[float], None] | None = None) -> ScalingPolicy:
    """Policies are built where they run (each worker process builds its own). The oracle
    plans here (`progress` follows its plan); static-min searches here, one replay at a time
    (`run_all` runs that search with its replays in parallel instead)."""
    opts = opts or Options()
    base, params = parse_policy_spec(name, POLICIES)
    policy = _build(base, params, trace, cfg, opts, progress)
    policy.name = name
    return policy


def _build(name: str, params: dict[str, float], trace: Sequence[TraceRequest],
           cfg: BenchConfig, opts: Options,
           progress: Callable[[float], None] | None) -> ScalingPolicy:
    from poolpilot.bench.policies.dynamo_sla import ADJUSTMENT_INTERVAL_S, DynamoSLA
    from poolpilot.bench.policies.hpa import TARGET_UTIL, HPAGpuUtil
    from poolpilot.bench.policies.keda import QUEUE_THRESHOLD, KedaQueue
    from poolpilot.bench.policies.poolpilot_policy import PoolpilotPolicy, profile_targets
    from poolpilot.bench.policies.static_peak import StaticPeak, warmup_load

    bounds = Bounds(cfg.min_replicas, cfg.max_replicas)
    cap = _capacity(cfg)
    if name == "static-peak":
        return StaticPeak(trace, cap, bounds)
    if name == "oracle":
        plan = plan_oracle(trace, cfg, bounds, cap, opts.oracle_window,
                           opts.oracle_target or opts.goal, progress=progress)
        return Oracle(plan, bounds, cfg.cold_start)
    if name == "static-min":
        return _static_min_inline(trace, cfg, opts)
    # Autoscaled pools start warm, the same for all: right-sized for the trace's first window.
    initial = _warm_start(trace, cfg, bounds, opts)
    if name == "poolpilot":
        return PoolpilotPolicy(bounds, initial, cfg.slo_ttft, cfg.slo_itl, cfg.quantile,
                               autoscaling=opts.autoscaling,
                               forecast=params.get("forecast", 1.0) > 0,
                               hits=params.get("hits", 1.0) > 0,
                               room=params.get("room", 1.0) > 0,
                               record=opts.decisions,
                               profile=profile_targets(warmup_load(trace), cap))
    if name == "hpa":
        return HPAGpuUtil(bounds, initial, target_util=params.get("target", TARGET_UTIL))
    if name == "keda-queue":
        return KedaQueue(bounds, initial, threshold=params.get("threshold", QUEUE_THRESHOLD))
    if name == "dynamo-sla":
        return DynamoSLA(cap, bounds, initial, cfg.slo_ttft, cfg.slo_itl, cfg.tensor_parallel,
                         predictor=opts.predictor,
                         interval=params.get("interval", ADJUSTMENT_INTERVAL_S),
                         margin=params.get("margin", 0.0))
    raise ValueError(f"unknown policy {name!r}")


_WARM: dict[tuple[int, str, Bounds], dict[str, int]] = {}


def _warm_start(trace: Sequence[TraceRequest], cfg: BenchConfig, bounds: Bounds,
                opts: Options) -> dict[str, int]:
    key = (len(trace), repr(cfg), bounds)  # one trace per bench run: once per process
    if key not in _WARM:
        _WARM[key] = warm_start(trace, cfg, bounds, _capacity(cfg), opts.oracle_window,
                                opts.oracle_target or opts.goal)
    return dict(_WARM[key])


# ---- jobs: what the worker processes run (module level, so that they pickle) ----
def _policy_job(name: str, trace: list[TraceRequest], cfg: BenchConfig, opts: Options,
                emit: Emit) -> RunResult:
    span = trace[-1].arrival_s if trace else 0.0
    offset = span if name == "oracle" else 0.0  # its bar: the plan, then the replay
    policy = build_policy(name, trace, cfg, opts, progress=lambda t: emit(name, t))
    result = replay(trace, policy, cfg, lambda t: emit(name, offset + t))
    result.decisions = list(getattr(policy, "decisions", []))
    return result


def _pool_job(sizes: tuple[int, int], trace: list[TraceRequest], cfg: BenchConfig,
              budget: int | None, emit: Emit) -> RunResult:
    pool = StaticPool({Role.PREFILL: sizes[0], Role.DECODE: sizes[1]}, "static-min")
    return replay(trace, pool, cfg, lambda t: emit("static-min", t), miss_budget=budget)


class _QueueEmit:
    """Progress from a worker process: (name, simulated seconds) onto a Manager queue."""

    def __init__(self, q: Any) -> None:
        self.q = q

    def __call__(self, name: str, t: float) -> None:
        self.q.put((name, t))


class Workers:
    """`jobs` worker processes (spawned), or the calling process itself when jobs <= 1."""

    def __init__(self, jobs: int, on_progress: Emit | None = None) -> None:
        self.jobs = jobs
        self.on_progress = on_progress or (lambda n, t: None)
        self._stack = contextlib.ExitStack()
        self.emit: Emit = self.on_progress
        if jobs > 1:
            ctx = mp.get_context("spawn")
            mgr = self._stack.enter_context(ctx.Manager())
            self.q = mgr.Queue()
            self.ex = self._stack.enter_context(
                ProcessPoolExecutor(max_workers=jobs, mp_context=ctx))
            self.emit = _QueueEmit(self.q)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def submit(self, fn: Callable[..., RunResult], *args: Any) -> Future[RunResult]:
        if self.jobs <= 1:
            fut: Future[RunResult] = Future()
            try:
                fut.set_result(fn(*args, self.emit))
            except Exception as exc:
                fut.set_exception(exc)
            return fut
        return self.ex.submit(fn, *args, self.emit)

    def wait(self, futs: Sequence[Future[RunResult]]) -> list[RunResult]:
        while self.jobs > 1 and not all(f.done() for f in futs):
            self._pump(0.2)
        if self.jobs > 1:
            while self._pump(0.0):
                pass
        return [f.result() for f in futs]

    def _pump(self, timeout: float) -> bool:
        try:
            n, t = self.q.get(timeout=timeout) if timeout else self.q.get_nowait()
        except queue.Empty:
            return False
        self.on_progress(n, t)
        return True


def static_min(trace: list[TraceRequest], cfg: BenchConfig, opts: Options,
               workers: Workers) -> RunResult:
    """The static-min search (`poolpilot.bench.static_min`), its replays on `workers`."""
    n = len(trace)
    budget = math.floor((1.0 - opts.goal) * n + 1e-9)  # misses allowed at the goal
    found: dict[tuple[int, int], RunResult] = {}

    def replay_pools(pools: list[tuple[int, int]]) -> list[Probe]:
        futs = [workers.submit(_pool_job, pd, trace, cfg, budget) for pd in pools]
        out = []
        for pd, r in zip(pools, workers.wait(futs), strict=True):
            ok = r.aborted_at is None and r.summary.slo_attainment >= opts.goal - 1e-12
            if ok:
                found[pd] = r
            out.append(Probe(pd[0], pd[1], None if r.aborted_at is not None
                             else round(r.summary.slo_attainment, 6), ok))
        return out

    bounds = Bounds(cfg.min_replicas, cfg.max_replicas)
    guess = peak_sizes(trace, _capacity(cfg), bounds)
    best, probes = search_static_min(replay_pools, cfg.min_replicas, cfg.max_replicas, guess,
                                     workers.jobs)
    if best is None:  # nothing within the bounds meets the goal: report the largest pool
        hi = cfg.max_replicas
        result = workers.wait([workers.submit(_pool_job, (hi, hi), trace, cfg, None)])[0]
    else:
        result = found[best]
    result.info = {
        "found": best is not None, "goal": opts.goal,
        Role.PREFILL: best[0] if best else None, Role.DECODE: best[1] if best else None,
        "replays": len(probes),
        "probes": [asdict(pr) for pr in probes],
    }
    if best is None:
        result.info["largest_pool"] = {Role.PREFILL: cfg.max_replicas,
                                       Role.DECODE: cfg.max_replicas}
    return result


def _static_min_inline(trace: Sequence[TraceRequest], cfg: BenchConfig,
                       opts: Options) -> ScalingPolicy:
    with Workers(1) as w:
        r = static_min(list(trace), cfg, opts, w)
    sizes = r.info.get("largest_pool") or {Role.PREFILL: r.info[Role.PREFILL],
                                           Role.DECODE: r.info[Role.DECODE]}
    pool = StaticPool(sizes, "static-min")
    pool.info = r.info
    return pool


def run_all(names: Sequence[str], trace: list[TraceRequest], cfg: BenchConfig,
            opts: Options | None = None, jobs: int = 1,
            on_progress: Emit | None = None) -> list[RunResult]:
    """Every policy replayed on the same trace, `jobs` replays at a time; results in the
    order of `names`."""
    opts = opts or Options()
    with Workers(jobs, on_progress) as w:
        # The oracle's plan is the longest job: start it first.
        order = sorted((n for n in names if n != "static-min"), key=lambda n: n != "oracle")
        futs = {n: w.submit(_policy_job, n, trace, cfg, opts) for n in order}
        done: dict[str, RunResult] = {}
        if "static-min" in names:
            done["static-min"] = static_min(trace, cfg, opts, w)
        for n, r in zip(futs, w.wait(list(futs.values())), strict=True):
            done[n] = r
    return [done[n] for n in names]


def _fail(msg: object) -> int:
    """A bad option or input: one line on stderr, exit code 2."""
    text = " ".join(str(msg).split())
    print(f"poolpilot bench: {text}", file=sys.stderr)
    return 2


def _check(args: argparse.Namespace) -> None:
    for flag, v in (("--slo-ttft", args.slo_ttft), ("--slo-itl", args.slo_itl),
                    ("--oracle-window", args.oracle_window),
                    ("--scrape-interval", args.scrape_interval)):
        if not v > 0:
            raise ValueError(f"{flag} must be > 0 seconds, got {v}")
    if args.cold_start is not None and not 0 <= args.cold_start < math.inf:
        raise ValueError(f"--cold-start must be >= 0 seconds, got {args.cold_start}")
    given = [f for f, v in (("--cold-start", args.cold_start),
                            ("--cold-start-phases", args.cold_start_phases),
                            ("--cold-start-profile", args.cold_start_profile)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)}: give the cold start one way only")
    if args.warm_placeholders < 0:
        raise ValueError(f"--warm-placeholders must be >= 0, got {args.warm_placeholders}")
    if args.warm_cold_start is not None and not 0 <= args.warm_cold_start < math.inf:
        raise ValueError(f"--warm-cold-start must be >= 0 seconds, got {args.warm_cold_start}")
    for flag, v in (("--goal", args.goal), ("--oracle-target", args.oracle_target)):
        if v is not None and not 0 < v <= 1:
            raise ValueError(f"{flag} must be a share in (0, 1], got {v}")
    if args.tensor_parallel < 1:
        raise ValueError(f"--tensor-parallel must be >= 1, got {args.tensor_parallel}")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    if args.max_replicas < 1 or not 0 <= args.min_replicas <= args.max_replicas:
        raise ValueError(f"--min-replicas {args.min_replicas} / --max-replicas "
                         f"{args.max_replicas}: need 0 <= min <= max and max >= 1")


def run(args: argparse.Namespace) -> int:
    if args.replot:
        return replot(args)
    console = Console(stderr=True)
    try:
        if not args.trace:
            raise ValueError("--trace is required (or --replot a saved JSON)")
        _check(args)
        names = parse_policies(args.policies, args.sweep)
        sweep = parse_cold_starts(args.cold_start_sweep) if args.cold_start_sweep else None
        if args.decisions and sweep is not None:
            raise ValueError("--decisions records one replay's decisions: leave out "
                             "--cold-start-sweep, or run one --cold-start at a time")
        if args.decisions and not any(parse_policy_spec(n, POLICIES)[0] == "poolpilot"
                                      for n in names):
            raise ValueError("--decisions records poolpilot's decisions: add poolpilot to "
                             "--policies")
        if sweep is not None and (args.cold_start_phases or args.cold_start_profile):
            raise ValueError("--cold-start-sweep takes totals: leave out --cold-start-phases "
                             "and --cold-start-profile")
        phases = cold_start_of(args)
        raw = load_trace(args.trace, args.format)
        trace = scale_load(first_seconds(raw, args.duration), args.rate_scale, args.seed)
        warm_cold = (args.warm_cold_start if args.warm_cold_start is not None
                     else profile("warm-node", args.model, args.tensor_parallel).total)
        cfg = BenchConfig(model=args.model, gpu=args.gpu, tensor_parallel=args.tensor_parallel,
                          slo_ttft=args.slo_ttft, slo_itl=args.slo_itl,
                          cold_start=phases.total, scrape_interval=args.scrape_interval,
                          warm_placeholders=args.warm_placeholders,
                          warm_cold_start=warm_cold,
                          # a role with no replica cannot serve: every policy keeps one
                          min_replicas=max(1, args.min_replicas),
                          max_replicas=args.max_replicas,
                          local_prefill=args.local_prefill == "on",
                          routing=args.routing,
                          prefill_hold_s=args.prefill_hold or None,
                          kv_offloading_gib=args.kv_offload_gib,
                          prefix_max_entries=args.prefix_max_entries,
                          hash_block_tokens=block_tokens(trace),
                          # the SLO the autoscaler is given is the one the bench scores:
                          # --goal of the requests within the targets
                          quantile=args.goal)
        from poolpilot.engine_sim.des import PoolSim

        PoolSim(cfg.model, cfg.gpu, cfg.tensor_parallel, prefill_replicas=0, decode_replicas=0)
        opts = Options(predictor=args.dynamo_predictor,
                       autoscaling=parse_autoscaling(args.poolpilot_autoscaling, cfg),
                       oracle_window=args.oracle_window, oracle_target=args.oracle_target,
                       goal=args.goal, decisions=bool(args.decisions))
    except (TraceError, InvalidPool, ValueError) as exc:
        return _fail(exc)
    if not trace:
        return _fail("no request left after --duration")
    span = trace[-1].arrival_s
    ceiling = slo_ceiling(trace, cfg)
    console.print(f"{len(trace):,} requests over {span / 60:.1f} min "
                  f"({len(trace) / max(span, 1):.2f} req/s) from {args.trace}, "
                  f"rate scale {args.rate_scale:g}; {cfg.model} on {cfg.gpu} "
                  f"(TP {cfg.tensor_parallel}); SLO TTFT {cfg.slo_ttft:g}s ITL {cfg.slo_itl:g}s; "
                  f"{100 * ceiling.share:.1f}% of requests can meet it on an idle pool "
                  f"(prompts up to {ceiling.longest_prompt:,} tokens)")
    if sweep is not None:
        return _run_sweep(args, names, trace, cfg, opts, sweep, ceiling, console)
    started = time.perf_counter()
    with Progress(TextColumn("{task.description:<34}"), BarColumn(),
                  TextColumn("{task.percentage:>5.1f}%"), TimeElapsedColumn(),
                  console=console, transient=False) as prog:
        total = {n: max(span, 1.0) * (2 if n == "oracle" else 1) for n in names}
        tasks = {n: prog.add_task(n, total=total[n]) for n in names}

        def on_progress(n: str, t: float) -> None:
            prog.update(tasks[n], completed=t)

        try:
            results = run_all(names, trace, cfg, opts, args.jobs, on_progress)
        except (InvalidPool, ValueError) as exc:
            return _fail(exc)
        for n in names:
            prog.update(tasks[n], completed=total[n])
    wall = time.perf_counter() - started
    title = (f"{Path(args.trace).name} x{args.rate_scale:g}: {len(trace):,} requests, "
             f"{cfg.model} TP{cfg.tensor_parallel} on {cfg.gpu}, cold start {cfg.cold_start:g}s"
             + (", local prefill on" if cfg.local_prefill else ""))
    meta = {
        "title": title,
        "trace": {"file": str(args.trace), "requests": len(trace), "span_s": span,
                  "rate_scale": args.rate_scale, "duration": args.duration},
        "config": {k: v for k, v in asdict(replace(cfg)).items() if k != "engine"},
        "slo_ceiling": {"share": round(ceiling.share, 6),
                        "longest_prompt": ceiling.longest_prompt},
        "oracle": {"window_s": opts.oracle_window,
                   "target": opts.oracle_target or opts.goal},
        "poolpilot_autoscaling": opts.autoscaling,
        "cold_start_phases": phases.as_json(),
        "wall_seconds": round(wall, 2),
        # every request hits every block an earlier request had (an infinite cache reachable
        # from anywhere): the most any routing could reach
        "ideal_prefix_hit_rate": round(ideal_prefix_hit_rate(trace), 6),
    }
    doc = report.as_json(results, meta, opts.goal)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2, default=_json_default) + "\n")
    if args.decisions:
        Path(args.decisions).write_text("".join(
            json.dumps({"policy": n, **d}, default=_json_default) + "\n"
            for n, r in zip(names, results, strict=True) for d in r.decisions))
    render(doc, args, console)
    console.print(f"replayed {len(names)} policies in {wall:.1f} s wall")
    return 0


def cold_start_of(args: argparse.Namespace) -> ColdStart:
    """The cold start the options give: phases, a profile's phases, or a total (120 s)."""
    if args.cold_start_phases is not None:
        return parse_phases(args.cold_start_phases)
    if args.cold_start_profile is not None:
        return profile(args.cold_start_profile, args.model, args.tensor_parallel)
    total = 120.0 if args.cold_start is None else args.cold_start
    return ColdStart((("total", total),))


def _run_sweep(args: argparse.Namespace, names: list[str], trace: list[TraceRequest],
               cfg: BenchConfig, opts: Options, sweep: list[float], ceiling: Any,
               console: Console) -> int:
    """`--cold-start-sweep`: every policy at each cold start (bench/cold_start_sweep.py)."""
    started = time.perf_counter()
    console.print(f"cold-start sweep {', '.join(f'{c:g}s' for c in sweep)}: "
                  f"{len(names)} policies each (the fixed pools and the oracle's needs once)")
    try:
        with Workers(args.jobs) as w:
            results = run_sweep(names, trace, cfg, sweep, opts, w)
    except (InvalidPool, ValueError) as exc:
        return _fail(exc)
    wall = time.perf_counter() - started
    span = trace[-1].arrival_s
    meta = {
        "title": (f"{Path(args.trace).name} x{args.rate_scale:g}: {len(trace):,} requests, "
                  f"{cfg.model} TP{cfg.tensor_parallel} on {cfg.gpu}"),
        "trace": {"file": str(args.trace), "requests": len(trace), "span_s": span,
                  "rate_scale": args.rate_scale, "duration": args.duration},
        "config": {k: v for k, v in asdict(cfg).items() if k != "engine"},
        "slo_ceiling": {"share": round(ceiling.share, 6),
                        "longest_prompt": ceiling.longest_prompt},
        "oracle": {"window_s": opts.oracle_window, "target": opts.oracle_target or opts.goal},
        "poolpilot_autoscaling": opts.autoscaling,
        "wall_seconds": round(wall, 2),
    }
    doc = sweep_document(results, meta, opts.goal)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2, default=_json_default) + "\n")
    table = sweep_markdown(doc, opts.goal)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    print(table)
    for longer, shorter, lost in monotone_drops(doc):
        console.print(f"poolpilot lost {lost:.2f} points going from {longer}s to {shorter}s")
    console.print(f"replayed {len(names)} policies at {len(sweep)} cold starts in {wall:.1f} s "
                  "wall")
    return 0


def render(doc: dict[str, Any], args: argparse.Namespace, console: Console) -> None:
    """The table on stdout, the references' notes, and --markdown / --plot, from the JSON."""
    title = str(doc.get("title", ""))
    report.print_table(doc, title, Console(width=max(160, Console().width)))
    for line in report.reference_notes(doc):
        console.print(line, soft_wrap=True, markup=False)
    if args.markdown:
        Path(args.markdown).write_text(report.markdown_table(doc) + "\n")
    if args.plot:
        report.plot(doc, args.plot, title)


def replot(args: argparse.Namespace) -> int:
    """`--replot FILE`: draw a saved run's outputs again, without replaying."""
    try:
        doc = json.loads(Path(args.replot).read_text())
        if not isinstance(doc, dict) or not isinstance(doc.get("policies"), dict):
            raise ValueError(f"--replot {args.replot}: not a poolpilot bench JSON document")
    except FileNotFoundError:
        return _fail(f"--replot {args.replot}: no such file")
    except json.JSONDecodeError as exc:
        return _fail(f"--replot {args.replot}: not valid JSON: {exc.msg}")
    except ValueError as exc:
        return _fail(exc)
    render(doc, args, Console(stderr=True))
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
