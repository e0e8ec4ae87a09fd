"""`poolpilot autoscaler`: the command line of the autoscaler loop."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import socket
import sys
import time

from poolpilot.autoscaler import queries
from poolpilot.autoscaler.promaccess import AccessError, PrometheusAccess, parse_header
from poolpilot.autoscaler.shard import Shard

from poolpilot import cli, gcpolicy
from poolpilot.clock import Clock


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="Prometheus base URL, e.g. http://prometheus-operated.monitoring:9090")
    prom = p.add_argument_group("Prometheus access (TLS is verified unless switched off)")
    prom.add_argument("--prometheus-ca-file", metavar="FILE",
                      help="PEM CA bundle that signs Prometheus' certificate (default: the "
                      "system's CAs)")
    prom.add_argument("--prometheus-insecure-skip-verify", action="store_true",
                      help="do not verify Prometheus' TLS certificate (not for production)")
    prom.add_argument("--prometheus-cert-file", metavar="FILE",
                      help="client certificate for mutual TLS (with --prometheus-key-file)")
    prom.add_argument("--prometheus-key-file", metavar="FILE",
                      help="the client certificate's private key")
    prom.add_argument("--prometheus-bearer-token-file", metavar="FILE",
                      help="send 'Authorization: Bearer <file contents>'; the file is read "
                      "again whenever it changes (rotated tokens)")
    prom.add_argument("--prometheus-username", metavar="USER",
                      help="basic auth user (with --prometheus-password-file)")
    prom.add_argument("--prometheus-password-file", metavar="FILE",
                      help="basic auth password, read again whenever the file changes")
    prom.add_argument("--prometheus-header", action="append", default=[], metavar="'NAME: VALUE'",
                      help="an extra header on every query, e.g. 'X-Scope-OrgID: team-a' "
                      "(Mimir, Cortex); repeatable")
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
    cli.add_kubeconfig(p)
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve the autoscaler's own metrics on this port (0: a free port)")
    p.add_argument("--metrics-host", default="0.0.0.0", metavar="HOST",
                   help="address for --metrics-port (default 0.0.0.0)")
    p.add_argument("--rate-window", type=float, default=60.0, metavar="SECONDS",
                   help="window of rate() and latency quantiles in the queries (default 60)")
    cli.add_speed(p)  # every duration here and in the pool's spec is in simulated seconds
    sh = p.add_argument_group("sharding (several autoscalers, each deciding its share of the "
                              "pools)")
    sh.add_argument("--total-shards", type=int, default=1, metavar="N",
                    help="how many autoscalers split the pools, by a hash of namespace/name "
                    "(default 1: this one decides every pool)")
    sh.add_argument("--shard", type=int, default=0, metavar="I",
                    help="which of them this is, 0 .. N-1; with --leader-elect each shard "
                    "campaigns for its own Lease (NAME-I-of-N) (default 0)")
    ha = p.add_argument_group("high availability (several replicas, one acting)")
    ha.add_argument("--leader-elect", action="store_true",
                    help="campaign for a Lease and act only while holding it; run two "
                    "replicas with this (default: act alone)")
    ha.add_argument("--leader-election-namespace", default=os.environ.get("POD_NAMESPACE"),
                    metavar="NS", help="namespace of the Lease (default: $POD_NAMESPACE, else "
                    "default)")
    ha.add_argument("--leader-election-name", default="poolpilot-autoscaler", metavar="NAME",
                    help="name of the Lease (default poolpilot-autoscaler; a shard of several "
                    "appends -I-of-N)")
    ha.add_argument("--leader-election-identity", default=None, metavar="ID",
                    help="this replica's name in the Lease (default: $POD_NAME, else "
                    "host-pid)")
    ha.add_argument("--lease-duration", type=int, default=15, metavar="SECONDS",
                    help="a follower takes over after seeing no renewal for this long "
                    "(default 15)")
    ha.add_argument("--renew-deadline", type=float, default=10.0, metavar="SECONDS",
                    help="a leader that cannot renew for this long stops acting; must be "
                    "below --lease-duration (default 10)")
    ha.add_argument("--retry-period", type=float, default=2.0, metavar="SECONDS",
                    help="how often the leader renews and followers try (default 2)")


def access(args: argparse.Namespace) -> PrometheusAccess:
    """The Prometheus access options; AccessError for a malformed header."""
    return PrometheusAccess(
        ca_file=args.prometheus_ca_file, insecure_skip_verify=args.prometheus_insecure_skip_verify,
        cert_file=args.prometheus_cert_file, key_file=args.prometheus_key_file,
        bearer_token_file=args.prometheus_bearer_token_file, username=args.prometheus_username,
        password_file=args.prometheus_password_file,
        headers=dict(parse_header(h) for h in args.prometheus_header),
    )


def identity() -> str:
    """This replica's name in the Lease: the pod's name in a cluster."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def run(args: argparse.Namespace) -> int:
    if not (args.speed > 0 and args.interval > 0 and args.rate_window > 0):
        print("poolpilot autoscaler: --speed, --interval and --rate-window must be > 0",
              file=sys.stderr)
        return 2
    if not math.isfinite(args.speed):  # (the engines' "no time at all" has no clock to decide on)
        print("poolpilot autoscaler: --speed must be finite", file=sys.stderr)
        return 2
    try:
        access(args).check()
    except AccessError as exc:
        print(f"poolpilot autoscaler: {exc}", file=sys.stderr)
        return 2
    try:
        Shard(args.shard, args.total_shards)
    except ValueError:
        print(f"poolpilot autoscaler: --shard {args.shard} --total-shards {args.total_shards}: "
              "--total-shards must be at least 1 and --shard between 0 and --total-shards - 1",
              file=sys.stderr)
        return 2
    if args.leader_elect and not (args.retry_period >= 1
                                  and args.renew_deadline > 1.2 * args.retry_period
                                  and args.lease_duration > args.renew_deadline):
        print("poolpilot autoscaler: leader election needs --retry-period >= 1, "
              "--renew-deadline > 1.2 x --retry-period and --lease-duration > "
              "--renew-deadline", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 0


async def _main(args: argparse.Namespace) -> int:
    from poolpilot.autoscaler.cache import WatchedKube
    from poolpilot.autoscaler.kube import KubeError, KubeScaler
    from poolpilot.autoscaler.loop import Autoscaler, Options
    from poolpilot.autoscaler.metrics import AutoscalerMetrics
    from poolpilot.autoscaler.observe import PrometheusSource
    from poolpilot.kubeclient import leader
    from prometheus_client import start_http_server

    gcpolicy.tune()  # the watch-fed view keeps every pool alive (see poolpilot.gcpolicy)
    namespaces = tuple(args.namespace)
    metrics = AutoscalerMetrics(shard=args.shard)
    server = None
    if args.metrics_port is not None:
        server, _ = start_http_server(args.metrics_port, addr=args.metrics_host,
                                      registry=metrics.registry)
        print(f"autoscaler metrics on http://{args.metrics_host}:"
              f"{server.server_address[1]}/metrics", flush=True)
    try:
        me = args.leader_election_identity or identity()
        # One cycle lists; a running loop reads pools and Deployments from watches.
        adapter = KubeScaler if args.once else WatchedKube
        kube = await adapter.connect(args.kubeconfig, namespaces, identity=me)
    except KubeError as exc:
        print(f"poolpilot autoscaler: {exc}", file=sys.stderr)
        return 2
    # On the Unix epoch, as the loop's status timestamps are (see loop.UNIX_TIME).
    clock = Clock(rate=args.speed, monotonic=time.time)
    source = PrometheusSource(
        args.prometheus,
        # (a PromQL range is real seconds)
        queries.QuerySet(window_seconds=clock.real(args.rate_window), namespaces=namespaces),
        access=access(args),
    )
    shard = Shard(args.shard, args.total_shards)
    if shard.split:
        print(f"autoscaler {shard}: deciding the pools whose namespace/name hash to it",
              flush=True)
    options = Options(interval=args.interval, dry_run=args.dry_run, shard=shard)
    scaler = Autoscaler(kube, source, options, metrics, clock)
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
        if not args.leader_elect:
            metrics.leader.set(1)
            await scaler.run(stop)
            return 0

        async def work() -> None:
            # A fresh loop per term: the history starts over as after a restart (cooldowns
            # come back from status.lastScaleTime, scale-downs wait for a full window).
            await Autoscaler(kube, source, options, metrics, clock).run(stop)

        def on_change(leading: bool) -> None:
            metrics.leader.set(1 if leading else 0)
            if not leading:
                metrics.forget_all()  # the new leader reports the pools now

        await leader.lead(
            kube.kube, name=shard.lease_name(args.leader_election_name),
            namespace=args.leader_election_namespace or "default",
            identity=me, work=work, stop=stop,
            lease_s=args.lease_duration, renew_s=args.renew_deadline,
            retry_s=args.retry_period, on_change=on_change)
        return 0
    finally:
        await kube.close()
        if server is not None:
            server.shutdown()
