"""`poolpilot operator`: run the Kopf operator for InferencePools.

HA: run two replicas. They peer through a KopfPeering object (the kopf.dev CRDs from the
chart); each process picks a random priority unless given one, the highest acts and the other
waits, taking over once the active one's heartbeat is older than --peering-lifetime.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys

import kopf
from poolpilot.kubeclient import NoCredentials, credentials
from poolpilot.operator import labels, peering
from poolpilot.operator.handlers import OperatorConfig, register
from poolpilot.operator.metrics import OperatorMetrics
from prometheus_client import start_http_server

from poolpilot import cli, gcpolicy


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], metavar="NS",
                       help="watch this namespace (repeatable; globs like 'team-*' work)")
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="watch every namespace (the default when no --namespace is given)")
    cli.add_kubeconfig(parser)
    parser.add_argument("--liveness", default="http://0.0.0.0:8080/healthz",
                        help="liveness endpoint URL (empty to disable)")
    parser.add_argument("--peering", default=peering.DEFAULT_NAME,
                        help="peering object name shared by the operator's replicas")
    parser.add_argument("--require-peering", action="store_true",
                        help="fail instead of running standalone when peering CRDs are absent")
    parser.add_argument("--standalone", action="store_true", help="do not peer (one replica)")
    parser.add_argument("--priority", type=int, default=None,
                        help="peering priority (highest acts; default: random per process)")
    parser.add_argument("--peering-lifetime", type=int, default=60,
                        help="seconds before a silent active replica is replaced")
    parser.add_argument("--drift-interval", type=float, default=30.0,
                        help="seconds between drift checks of each pool")
    parser.add_argument("--request-timeout", type=float, default=10.0,
                        help="seconds before a Kubernetes API request or watch connection "
                        "times out (default 10)")
    parser.add_argument("--monitor-label", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra label on every pool's ServiceMonitor and PodMonitor, so "
                        "your Prometheus selects them (kube-prometheus-stack: "
                        "release=<its release>); repeatable")
    parser.add_argument("--network-policies", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="make NetworkPolicies (only the pool's router and engines reach "
                        "the engines) for pools whose spec.networkPolicy.enabled is not set "
                        "(default: on; --no-network-policies turns the default off)")
    parser.add_argument("--router-auth", action=argparse.BooleanOptionalAction, default=False,
                        help="give the router of each pool without spec.router.apiKeySecret "
                        "an API key: a Secret POOL-router-api-keys with a random key, created "
                        "once (never read or changed; the chart turns this on)")
    parser.add_argument("--max-concurrent-reconciles", type=int, default=16,
                        help="pools reconciled at once (bounds the load on the API server)")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve the operator's own metrics (reconciles, their results and "
                        "durations, writes, API errors, the queue) on this port (0: a free port)")
    parser.add_argument("--metrics-host", default="0.0.0.0", metavar="HOST",
                        help="address for --metrics-port (default 0.0.0.0)")


def run(args: argparse.Namespace) -> int:
    try:
        monitor_labels = labels.parse_all(args.monitor_label)
    except ValueError as exc:
        print(f"poolpilot operator: --monitor-label {exc}", file=sys.stderr)
        return 2
    try:
        source = credentials.resolve(args.kubeconfig)
    except NoCredentials as exc:
        print(f"poolpilot operator: {exc}", file=sys.stderr)
        return 2
    logging.getLogger("poolpilot.operator").info("credentials: %s (%s)", source.describe(),
                                                 source.why)
    config = OperatorConfig(
        kubeconfig=args.kubeconfig,
        drift_interval=args.drift_interval,
        request_timeout=args.request_timeout,
        peering_lifetime=args.peering_lifetime,
        peering_name=args.peering,
        peering_mandatory=args.require_peering,
        max_concurrent_reconciles=args.max_concurrent_reconciles,
        monitor_labels=monitor_labels,
        network_policies=args.network_policies,
        router_auth=args.router_auth,
    )
    gcpolicy.tune()  # Kopf keeps every pool's state alive (see poolpilot.gcpolicy)
    metrics = OperatorMetrics()
    if args.metrics_port is not None:
        server, _ = start_http_server(args.metrics_port, addr=args.metrics_host,
                                      registry=metrics.registry)
        print(f"operator metrics on http://{args.metrics_host}:{server.server_address[1]}"
              "/metrics", flush=True)
    registry = kopf.OperatorRegistry()
    register(registry, config, metrics)
    priority = args.priority if args.priority is not None else random.randint(1, 1_000_000)
    kopf.run(
        registry=registry,
        clusterwide=args.all_namespaces or not args.namespace,
        namespaces=args.namespace,
        standalone=args.standalone or None,
        priority=priority,
        liveness_endpoint=args.liveness or None,
        memo=kopf.Memo(),
    )
    return 0
