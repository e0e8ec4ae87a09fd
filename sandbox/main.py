"""`poolpilot sandbox`: the whole system on this machine, replaying a real trace.

    poolpilot sandbox [--pool FILE] [--trace FILE | --workload sessions|chat|agent]
                      [--engine sim|vllm-cpu] [--speed X] [--rate-scale X]
                      [--duration SECONDS] [--report DIR] [--keep]

The bare command applies the shipped sandbox pool and replays the longest busy period of the
Azure code trace, then idles so the scale-down shows: a few minutes in all. `--workload`
replays a generated session workload instead, whose prompts share prefixes as text (the
engines' prefix caches and the router's prefix keys see the reuse); the report then shows the
prefix-cache hit rate beside TTFT. Every time-like setting is in simulated seconds; the whole
world runs --speed times faster (one clock). Links into Prometheus's graph page, one per key
dashboard panel and one for the prefix-cache hit rate, are printed once the pool is applied;
with --keep everything stays up after the report until Ctrl-C.

POOLPILOT_SANDBOX_DURATION (simulated seconds), when set, is the default of --duration: the
README's bare command on a shorter run (the verbatim-README test uses it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

from poolpilot.engine_sim.hardware import GPUS
from poolpilot.engine_sim.traces import (
    FORMATS,
    TraceError,
    TraceRequest,
    clamp_tokens,
    ideal_prefix_hit_rate,
    load_trace,
    scale_rate,
    window,
    write_mooncake,
)
from poolpilot.engine_sim.workloads import SessionParams, generate_sessions
from rich.console import Console
from rich.markup import escape

from poolpilot import cli

from . import chaos_run, live
from . import report as R
from .data import DEFAULT_POOL, DEFAULT_TRACE, VLLM_POOL
from .supervisor import (
    AppliedPool,
    Sandbox,
    SandboxConfig,
    SandboxError,
    load_pool,
    sigterm_as_keyboard_interrupt,
)

console = Console(stderr=True, soft_wrap=True)  # error lines stay whole (FILE:LINE: ...)

# `--workload NAME`: the session generator's kind for each name, and the size of the run: a
# few minutes at speed 4 like the default trace (sessions: 2,117 requests, 3,026 prompt tokens
# each on average, 66% of them in blocks an earlier request had), contexts within the pool's
# maxModelLen.
WORKLOADS = {"sessions": "mixed", "chat": "chat", "agent": "agent"}
WORKLOAD_SECONDS, WORKLOAD_RATE, WORKLOAD_SEED = 300.0, 3.0, 0

DEFAULT_SPEED = 4.0
DURATION_ENV = "POOLPILOT_SANDBOX_DURATION"
DEFAULT_TAIL_S = 240.0  # idle after the last request: the stabilization window and scale-down
VLLM_MAX_INPUT, VLLM_MAX_OUTPUT = 300, 48  # the tiny model runs with max-model-len 512


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pool", type=Path, default=None,
                   help="InferencePool manifest (default: the shipped sandbox pool, "
                   "examples/sandbox-pool.yaml; with --engine vllm-cpu one prefill and one "
                   "decode engine, autoscaling off)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--trace", type=Path, default=DEFAULT_TRACE,
                      help="trace file: Azure CSV, Mooncake or Qwen-Bailian JSONL (their "
                      "hash_ids replayed as "
                      "prompts that share text) or arrival_s,input_tokens,output_tokens CSV "
                      "(default: the Azure code trace's longest busy period)")
    load.add_argument("--workload", choices=tuple(WORKLOADS), default=None,
                      help="replay a generated prefix-heavy workload instead of a trace: "
                      "sessions (chats and agent loops), chat or agent; "
                      f"{WORKLOAD_SECONDS:g}s of arrivals (seed {WORKLOAD_SEED}), written to "
                      "the report folder as Mooncake JSONL")
    p.add_argument("--trace-format", choices=FORMATS, default=None,
                   help="trace format (default: detected)")
    p.add_argument("--engine", choices=("sim", "vllm-cpu"), default="sim",
                   help="engines: the simulator (default) or real vLLM on CPU with a tiny model")
    cli.add_speed(p, None, f"{DEFAULT_SPEED:g} with sim, 1 with vllm-cpu")
    p.add_argument("--rate-scale", type=float, default=1.0,
                   help="multiply the trace's request rate (2 = arrivals twice as dense)")
    p.add_argument("--start", type=float, default=0.0,
                   help="skip this many seconds of the trace")
    p.add_argument("--duration", type=float, default=_env_duration(),
                   help="simulated seconds to run: requests arriving later are not sent "
                   f"(default: ${DURATION_ENV} if set, else the last arrival + "
                   f"{DEFAULT_TAIL_S:g}s so scale-down shows)")
    p.add_argument("--report", type=Path, default=Path("sandbox-report"),
                   help="folder for report.json, plots and logs (default ./sandbox-report)")
    p.add_argument("--namespace", default=None, help="namespace (default: the pool's)")
    p.add_argument("--cold-start", type=float, default=20.0,
                   help="simulated seconds a new simulator pod takes to load weights")
    p.add_argument("--scrape-interval", type=float, default=5.0,
                   help="Prometheus scrape interval in simulated seconds")
    cli.add_gpu(p, GPUS)
    p.add_argument("--api-port", type=int, default=0,
                   help="port of the Kubernetes API emulator (default: a free one)")
    p.add_argument("--prometheus-port", type=int, default=0,
                   help="port of Prometheus (default: a free one)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    chaos_run.add_arguments(p)
    p.add_argument("--keep", action="store_true",
                   help="after the report, leave the cluster, Prometheus and the pool running "
                   "and print how to use them; Ctrl-C stops everything")


def _env_duration() -> float | None:
    raw = os.environ.get(DURATION_ENV)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise SystemExit(f"poolpilot sandbox: {DURATION_ENV}={raw}: must be a number of "
                         "simulated seconds > 0 (or unset)")
    return value


def workload_params(name: str, max_model_len: int) -> SessionParams:
    """The generator's parameters for `--workload NAME` (fixed seed: the same run each time)."""
    return SessionParams(kind=WORKLOADS[name], sessions=100_000, rate=WORKLOAD_RATE,
                         duration=WORKLOAD_SECONDS, seed=WORKLOAD_SEED,
                         max_context=max_model_len)


def write_workload(name: str, max_model_len: int, out_dir: Path) -> Path:
    """Generate `--workload NAME` into the report folder as Mooncake JSONL (what is replayed,
    and what `--trace FILE` replays again) and say what it is."""
    params = workload_params(name, max_model_len)
    trace = generate_sessions(params)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"workload-{name}.jsonl"
    write_mooncake(trace, path)
    mean = sum(r.input_tokens for r in trace) / len(trace)
    console.print(f"  workload {name}: {len(trace)} requests over {trace[-1].arrival_s:.0f}s, "
                  f"mean prompt {mean:.0f} tokens, {ideal_prefix_hit_rate(trace) * 100:.0f}% of "
                  f"the prompt tokens a prefix an earlier request had; written to {path}",
                  highlight=False)
    return path


def prepare_trace(args: argparse.Namespace, max_model_len: int) -> list[TraceRequest]:
    trace = load_trace(args.trace, args.trace_format)
    if args.rate_scale <= 0:
        raise SandboxError(f"--rate-scale {args.rate_scale}: must be > 0")
    trace = window(trace, args.start, math.inf)
    trace = scale_rate(trace, args.rate_scale)
    if args.duration is not None:
        trace = [r for r in trace if r.arrival_s < args.duration]
    if args.engine == "vllm-cpu":
        # The tiny model's tokenizer would count a text prompt's words in unknown tokens:
        # token ids keep the counts exact (and the prompts' prefixes unshared).
        trace = [replace(r, hash_ids=()) for r in
                 clamp_tokens(trace, VLLM_MAX_INPUT, VLLM_MAX_OUTPUT)]
    else:
        trace = [
            clamp_tokens([r], max_model_len - r.output_tokens - 1, r.output_tokens)[0]
            if r.input_tokens + r.output_tokens >= max_model_len else r
            for r in trace
        ]
    if not trace:
        raise SandboxError(f"no requests in {args.trace} after --start {args.start:g} within "
                           "--duration; widen the window")
    return trace


def run(args: argparse.Namespace) -> int:
    speed = args.speed if args.speed is not None else (
        DEFAULT_SPEED if args.engine == "sim" else 1.0)
    if speed <= 0:
        console.print(f"[red]poolpilot sandbox: --speed {speed}: must be > 0")
        return 2
    if args.pool is None:
        args.pool = VLLM_POOL if args.engine == "vllm-cpu" else DEFAULT_POOL
    # Child processes run in folders of their own: hand them absolute paths only.
    args.pool, args.trace, args.report = (
        Path(args.pool).resolve(), Path(args.trace).resolve(), Path(args.report).resolve())
    try:
        _, spec = load_pool(args.pool)
        max_len = int(spec.runtime.engine_args.get("maxModelLen", 8192))
        if args.workload is not None:
            if args.engine == "vllm-cpu":
                raise SandboxError("--workload needs --engine sim: the tiny model's context "
                                   "(512 tokens) holds no more than one 512-token block")
            args.trace = write_workload(args.workload, max_len, args.report)
        trace = prepare_trace(args, max_len)
        chaos_run.check_args(args, spec.engine_roles())
    except (SandboxError, TraceError, ValueError) as exc:
        console.print(f"[red]poolpilot sandbox: {exc}")
        return 2
    cfg = SandboxConfig(
        out_dir=args.report, engine=args.engine, speed=speed, api_port=args.api_port,
        prometheus_port=args.prometheus_port, scrape_interval_s=args.scrape_interval,
        cold_start_s=args.cold_start, sim_gpu=args.gpu,
    )
    duration = args.duration if args.duration is not None else (
        trace[-1].arrival_s + DEFAULT_TAIL_S)
    sandbox = Sandbox(cfg)
    try:
        with sigterm_as_keyboard_interrupt():
            return asyncio.run(_main(sandbox, args, trace, duration))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping every process the sandbox started")
        sandbox.stop_sync()
        return 130
    except SandboxError as exc:
        console.print(f"[red]poolpilot sandbox: {exc}")
        sandbox.stop_sync()
        return 1


async def _main(sandbox: Sandbox, args: argparse.Namespace, trace: list[TraceRequest],
                duration: float) -> int:
    from .loadgen import Replayer

    cfg = sandbox.cfg
    try:
        console.print(f"[bold]poolpilot sandbox[/]: {len(trace)} requests over "
                      f"{trace[-1].arrival_s:.0f}s of trace, run {duration:.0f}s at speed "
                      f"{cfg.speed:g} (~{duration / cfg.speed:.0f}s real), engine {cfg.engine}; "
                      f"logs in {sandbox.logs}")
        with console.status("starting the emulated cluster, Prometheus, operator, autoscaler"):
            await sandbox.start()
        prom = sandbox.prometheus.url if sandbox.prometheus else "-"
        console.print(f"  Kubernetes API {sandbox.api_url} (kubectl --kubeconfig "
                      f"{sandbox.kubeconfig}), Prometheus {prom}")
        pool = await sandbox.apply(args.pool, args.namespace)
        print_graph_links(sandbox, pool, duration, "watch it live in Prometheus (reload a "
                          "page to update it)")
        with console.status(f"kubectl apply -f {args.pool}; waiting for the pool to be ready"):
            await sandbox.wait_ready(pool, timeout=300 if cfg.engine == "vllm-cpu" else 120)
        warm = sandbox.warmup_seconds(pool)
        if warm:
            with console.status(f"pool ready; letting it run {warm:.0f}s (simulated) before "
                                 "the trace, as a pool in service would have"):
                await sandbox.warm_up(pool)
        console.print(f"  pool {pool.namespace}/{pool.name} ready; replaying the trace")
        replayer = Replayer(lambda: sandbox.router_urls(pool), pool.spec.served_name(),
                            cfg.speed)
        chaos = chaos_run.prepare(sandbox, pool, args, trace[-1].arrival_s)
        t0 = time.monotonic()
        wall0 = time.time()
        try:
            results = await (
                chaos.replay(replayer, trace, t0, progress=not args.no_progress) if chaos
                else replayer.replay(trace, progress=not args.no_progress))
        finally:
            await replayer.close()
        remaining = t0 + duration / cfg.speed - time.monotonic()
        if remaining > 0:
            with console.status(f"load done; idling {remaining:.0f}s for the scale-down"):
                await asyncio.sleep(remaining)
        t_end = time.monotonic()
        wall_end = time.time()
        out = await write_outputs(sandbox, pool, results, t0, t_end, wall0, wall_end, args)
        for table in R.summary_tables(out):
            console.print(table)
        console.print(f"report: {cfg.out_dir / 'report.json'} and plots in {cfg.out_dir}")
        failed = out["requests"]["failed"]
        code = 0 if failed == 0 else 3
        if chaos is not None:
            section = chaos_run.conclude(chaos, out, results, len(trace))
            for table in chaos_run.tables(section):
                console.print(table)
            code = 0 if section["ok"] else 4
        if args.keep:
            print_keep_help(sandbox, pool, duration)
            await wait_for_stop(sandbox)
            console.print("stopping every process the sandbox started")
        return code
    finally:
        await sandbox.stop()


def graph_links(sandbox: Sandbox, pool: AppliedPool, duration: float) -> list[live.Link]:
    """Prometheus graph links for the key dashboard panels, over about the run's length."""
    cfg = sandbox.cfg
    assert sandbox.prometheus is not None
    real_s = (sandbox.warmup_seconds(pool) + duration) / cfg.speed + 60  # + start-up
    args = (sandbox.prometheus.url, pool.namespace, pool.name, cfg.rate_window_s / cfg.speed,
            real_s)
    return [*live.panel_links(*args), live.prefix_hit_rate_link(*args)]


def print_graph_links(sandbox: Sandbox, pool: AppliedPool, duration: float,
                      heading: str) -> None:
    console.print(escape(graph_links_text(sandbox, pool, duration, heading)), highlight=False)


def graph_links_text(sandbox: Sandbox, pool: AppliedPool, duration: float, heading: str) -> str:
    lines = [f"  {heading}:"]
    lines += [f"    {link.label}: {link.url}" for link in graph_links(sandbox, pool, duration)]
    return "\n".join(lines)


def print_keep_help(sandbox: Sandbox, pool: AppliedPool, duration: float) -> None:
    """How to use the sandbox that --keep leaves running."""
    urls = sandbox.router_urls(pool)
    router = urls[0] if urls else "(no router ready)"
    body = json.dumps({"model": pool.spec.served_name(), "prompt": "Once upon a time",
                       "max_tokens": 32, "stream": True})
    console.print(
        "[bold]The sandbox keeps running (--keep); Ctrl-C stops it.[/]\n"
        f"  watch the pool:   {sandbox.kubectl_bin} --kubeconfig {sandbox.kubeconfig} "
        f"get ipool -n {pool.namespace} -w\n"
        f"  OpenAI API:       {router}\n"
        f"  stream a completion: curl -N {router}/completions -H 'Content-Type: "
        f"application/json' -d '{body}'\n"
        f"  Prometheus:       {sandbox.prometheus.url if sandbox.prometheus else '-'}\n"
        # (one print: a reader of the output sees the links with the rest, or none of it)
        + escape(graph_links_text(sandbox, pool, duration, "graphs (the dashboards' panels)")),
        highlight=False, markup=True,
    )


async def wait_for_stop(sandbox: Sandbox) -> None:
    """Until Ctrl-C or SIGTERM; a component that exits meanwhile ends the wait with its error."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            sandbox.check_alive()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
            if previous[sig] is not None:  # None: a handler not set from Python; keep asyncio's
                signal.signal(sig, previous[sig])


async def series_by(sandbox: Sandbox, pool: AppliedPool, wall0: float, wall_end: float,
                    speed: float, metric: str, label: str,
                    ) -> dict[str, list[tuple[float, float]]]:
    """`sum by (label) (metric)` of the pool over the run from Prometheus, per label value, as
    (trace seconds, value); empty (and a warning) when the query fails: the report is still
    written without it."""
    step = sandbox.cfg.scrape_interval_s / speed
    sel = f'namespace="{pool.namespace}",pool="{pool.name}"'
    try:
        result = await sandbox.query_range(
            f"sum by ({label}) ({metric}{{{sel}}})", wall0, wall_end, step)
    except Exception as exc:
        console.print(f"[yellow]{metric} query failed: {exc}")
        return {}
    return {
        s["metric"].get(label, "?"): [((float(t) - wall0) * speed, float(v))
                                     for t, v in s["values"]]
        for s in result
    }


async def write_outputs(sandbox: Sandbox, pool: AppliedPool, results: list, t0: float,
                        t_end: float, wall0: float, wall_end: float,
                        args: argparse.Namespace) -> dict:
    from poolpilot import metrics

    cfg = sandbox.cfg
    assert sandbox.controller is not None
    ctl = sandbox.controller
    slo = R.Slo(pool.spec.slo.ttft.seconds, pool.spec.slo.ttft.quantile,
                pool.spec.slo.itl.seconds, pool.spec.slo.itl.quantile)
    samples = [s for s in ctl.timeline.samples
               if s.namespace == pool.namespace and s.pool == pool.name]
    changes = [c for c in ctl.timeline.scale_changes
               if c.namespace == pool.namespace and c.pool == pool.name and c.t >= t0]
    R.attach_reasons(changes, await sandbox.scale_event_messages(pool))
    # The router's local-prefill fallbacks (cumulative counters, per reason).
    local = await series_by(sandbox, pool, wall0, wall_end, cfg.speed,
                            metrics.ROUTER_LOCAL_PREFILL, "reason")
    prefix = await prefix_series(sandbox, pool, wall0, wall_end)
    out = R.build_report(
        results=results, slo=slo, speed=cfg.speed, samples=samples, changes=changes, t0=t0,
        t_end=t_end, local_prefill=local, prefix=prefix,
        meta={"pool": f"{pool.namespace}/{pool.name}", "trace": str(args.trace),
              "workload": getattr(args, "workload", None),
              "engine": cfg.engine, "speed": cfg.speed, "rate_scale": args.rate_scale},
    )
    R.write_report(out, cfg.out_dir)
    R.write_requests(results, slo, cfg.speed, cfg.out_dir)
    queue = await series_by(sandbox, pool, wall0, wall_end, cfg.speed, metrics.VLLM_WAITING,
                            "role")
    R.write_plots(out_dir=cfg.out_dir, results=results, slo=slo, speed=cfg.speed,
                  samples=samples, t0=t0, t_end=t_end, queue=queue,
                  scale_events_=out["scale_events"], local_prefill=local,
                  prefix_cache=out["prefix_cache"])
    return out


async def prefix_series(sandbox: Sandbox, pool: AppliedPool, wall0: float,
                        wall_end: float) -> R.PrefixSeries:
    """The engines' prefix-cache counters (and the router's expectation) over the run, from
    Prometheus. A query that fails or finds no series leaves its part empty: the report is
    still written."""
    from poolpilot import metrics

    speed = sandbox.cfg.speed
    sel = f'namespace="{pool.namespace}",pool="{pool.name}"'
    window = live.duration(sandbox.cfg.rate_window_s / speed)
    run = live.duration(wall_end - wall0)  # increase() over the whole run, per series
    # The router's own `role` label (the engine role it routed to) is scraped from a pod whose
    # target label role="router" wins: Prometheus keeps the router's as `exported_role`.
    router_by = "role, exported_role"

    def role_of(labels: dict[str, str]) -> str:
        return labels.get("exported_role") or labels.get("role") or R.ALL_ROLES

    async def over_time(expr: str) -> dict[str, list[tuple[float, float]]]:
        try:
            result = await sandbox.query_range(expr, wall0, wall_end,
                                               sandbox.cfg.scrape_interval_s / speed)
        except Exception as exc:
            console.print(f"[yellow]prefix-cache query failed: {exc}")
            return {}
        return {role_of(s["metric"]): [
            ((float(t) - wall0) * speed, float(v)) for t, v in s["values"]
            if math.isfinite(float(v))] for s in result}

    async def totals(metric: str, by: str = "role") -> dict[str, float]:
        try:
            result = await sandbox.query_range(
                f"sum by ({by}) (increase({metric}{{{sel}}}[{run}]))", wall_end, wall_end, 1.0)
        except Exception as exc:
            console.print(f"[yellow]{metric} query failed: {exc}")
            return {}
        return {role_of(s["metric"]): float(s["values"][-1][1]) for s in result if s["values"]}

    def ratio_expr(num: str, den: str, by: str) -> str:
        return (f"sum by ({by}) (rate({num}{{{sel}}}[{window}])) / "
                f"sum by ({by}) (rate({den}{{{sel}}}[{window}]))")

    hits, queries = metrics.VLLM_PREFIX_CACHE_HITS, metrics.VLLM_PREFIX_CACHE_QUERIES
    expected, routed = metrics.ROUTER_PREFIX_EXPECTED_HITS, metrics.ROUTER_PREFIX_ROUTED
    return R.PrefixSeries(
        hit_rate=(await over_time(ratio_expr(hits, queries, "role"))
                  | await over_time(ratio_expr(hits, queries, ""))),
        hit_tokens=await totals(hits),
        query_tokens=await totals(queries),
        router_expected=await over_time(ratio_expr(expected, routed, router_by)),
        router_expected_tokens=await totals(expected, router_by),
        router_routed_tokens=await totals(routed, router_by),
    )


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
