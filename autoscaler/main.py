"""`poolpilot autoscaler`: the command line of the autoscaler loop."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from poolpilot.autoscaler import queries


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="Prometheus base URL, e.g. http://prometheus-operated.monitoring:9090")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], metavar="NS",
                       help="watch InferencePools in this namespace (repeatable)")
    scope.add_argument("--all-namespaces", "-A", action="store_true",
                       help="watch every namespace (the default when no --namespace is given)")
    p.add_argument("--interval", type=float, default=10.0, metavar="SECONDS",
                   help="seconds between cycles; each pool is decided at its own "
                   "spec.autoscaling.intervalSeconds (default 10)")
    p.add_argument("--once", action="store_true", help="run one cycle and exit")
    p.add_argument("--dry-run", action="store_true",
                   help="decide and log only: no scale, no status, no Events (every pool "
                   "behaves as Advisory, without even writing status)")
    p.add_argument("--kubeconfig", metavar="FILE",
                   help="kubeconfig (default: $KUBECONFIG, ~/.kube/config, else in-cluster)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve the autoscaler's own metrics on this port (0: a free port)")
    p.add_argument("--metrics-host", default="0.0.0.0", metavar="HOST",
                   help="address for --metrics-port (default 0.0.0.0)")
    p.add_argument("--rate-window", type=float, default=60.0, metavar="SECONDS",
                   help="window of rate() and latency quantiles in the queries (default 60)")
    p.add_argument("--speed", type=float, default=1.0,
                   help="time compression of the local sandbox: intervals, windows, "
                   "cooldowns and the rate window are divided by it, token rates and the "
                   "router's wall-clock TTFT multiplied (engines report simulated seconds) "
                   "(default 1)")


def run(args: argparse.Namespace) -> int:
    if args.speed <= 0 or args.interval <= 0 or args.rate_window <= 0:
        print("poolpilot autoscaler: --speed, --interval and --rate-window must be > 0",
              file=sys.stderr)
        return 2
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 0


async def _main(args: argparse.Namespace) -> int:
    from poolpilot.autoscaler.kube import KubeClient, KubeError
    from poolpilot.autoscaler.loop import Autoscaler, Options
    from poolpilot.autoscaler.metrics import AutoscalerMetrics
    from poolpilot.autoscaler.observe import PrometheusSource
    from prometheus_client import start_http_server

    namespaces = tuple(args.namespace)
    metrics = AutoscalerMetrics()
    server = None
    if args.metrics_port is not None:
        server, _ = start_http_server(args.metrics_port, addr=args.metrics_host,
                                      registry=metrics.registry)
        print(f"autoscaler metrics on http://{args.metrics_host}:"
              f"{server.server_address[1]}/metrics", flush=True)
    try:
        kube = await KubeClient.connect(args.kubeconfig, namespaces)
    except KubeError as exc:
        print(f"poolpilot autoscaler: {exc}", file=sys.stderr)
        return 2
    source = PrometheusSource(
        args.prometheus,
        queries.QuerySet(window_seconds=args.rate_window / args.speed, namespaces=namespaces),
    )
    scaler = Autoscaler(kube, source, Options(interval=args.interval, dry_run=args.dry_run,
                                              speed=args.speed), metrics)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        if args.once:
            result = await scaler.cycle()
            print(f"pools={result.pools} decided={result.decided} scaled={result.scaled} "
                  f"status_writes={result.status_writes} queries={result.queries}", flush=True)
            return 1 if result.errors else 0
        await scaler.run(stop)
        return 0
    finally:
        await kube.close()
        if server is not None:
            server.shutdown()
