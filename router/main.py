"""`poolpilot router`: the OpenAI-compatible prefill/decode router.

    poolpilot router --port 8000 --prefill URL,... --decode URL,...      # disaggregated
    poolpilot router --port 8000 --engine URL,...                        # aggregated
    poolpilot router --port 8000 --discover kubernetes --namespace NS --pool NAME

SIGTERM/SIGINT: stop taking requests (/health and /ready answer 503, so the Service drops the
pod), let in-flight streams finish (up to --drain-timeout), then exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from urllib.parse import urlsplit

import uvloop
from aiohttp import web
from poolpilot.router import kv_lease
from poolpilot.router import local_prefill as lp
from poolpilot.router.app import Router
from poolpilot.router.auth import ApiKeys, KeyFileError
from poolpilot.router.balancer import BalancerConfig
from poolpilot.router.config import MIN_DEADLINE_S, MODES, PREFIX_ROUTING, RouterConfig
from poolpilot.router.discovery import KubernetesDiscovery, parse_urls
from poolpilot.router.http_guard import GuardedRunner, ServerLimits
from poolpilot.router.prefill_hold import DEFAULT_PREFILL_HOLD_S
from poolpilot.router.prefix_index import DEFAULT_BALANCE, DEFAULT_MAX_ENTRIES, DEFAULT_TTL_S
from poolpilot.router.prefix_source import PrefixSource
from poolpilot.router.workers import run_workers

from poolpilot import fileerrors, handoff
from poolpilot.cli import add_kubeconfig, add_speed
from poolpilot.clock import Clock
from poolpilot.roles import ENGINE_ROLES, Mode, Role

log = logging.getLogger("poolpilot.router")


class UsageError(ValueError):
    pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="bind address (default 127.0.0.1; the operator's pods pass 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve /metrics on this port (same address) instead of the "
                        "serving port, so a NetworkPolicy can let Prometheus reach metrics "
                        "only (the operator's pods pass 8090; default: on --port)")
    src = parser.add_argument_group("engines (static lists or Kubernetes discovery)")
    src.add_argument("--prefill", default="", help="prefill engine URLs, comma-separated")
    src.add_argument("--decode", default="", help="decode engine URLs, comma-separated")
    src.add_argument("--engine", default="", help="aggregated engine URLs, comma-separated")
    src.add_argument("--discover", choices=("kubernetes",), help="watch EndpointSlices")
    src.add_argument("--namespace", help="namespace of the pool (with --discover)")
    add_kubeconfig(src)
    src.add_argument(
        "--mode", choices=tuple(MODES),
        help="with --discover: which Services to use (default: the config file's, else "
        "disaggregated)",
    )
    src.add_argument(
        "--config", default=os.environ.get("POOLPILOT_ROUTER_CONFIG"),
        help="JSON file the operator mounts (pool, namespace, mode); flags override it "
        "(default $POOLPILOT_ROUTER_CONFIG)",
    )
    parser.add_argument("--pool", help="pool name: the metrics label; required with --discover")
    parser.add_argument("--pool-uid", help="the InferencePool's uid (with --discover): only "
                        "pods carrying poolpilot.dev/pool-uid=UID count as the pool's")
    lim = parser.add_argument_group("limits")
    lim.add_argument("--max-request-bytes", type=int, default=8 * 1024 * 1024,
                     help="largest request body accepted; larger ones get 413 (default 8 MiB)")
    lim.add_argument("--request-timeout", type=float, default=600.0, help="seconds, whole request")
    lim.add_argument("--keepalive-timeout", type=float, default=75.0,
                     help="seconds an idle client connection stays open between requests")
    lim.add_argument("--header-timeout", type=float, default=10.0,
                     help="seconds a new client connection may take to send its first "
                     "request's headers before it is closed (default 10)")
    lim.add_argument("--body-timeout", type=float, default=30.0,
                     help="seconds a client may take to send a whole request body once its "
                     "headers are in; a slower one gets 408 and is closed (default 30)")
    lim.add_argument("--max-connections", type=int, default=4096,
                     help="open client connections per router process; more are closed as "
                     "soon as accepted (default 4096)")
    lim.add_argument("--idle-timeout", type=float, default=120.0,
                     help="seconds an engine may stay silent mid-response")
    lim.add_argument("--connect-timeout", type=float, default=handoff.ROUTER_CONNECT_TIMEOUT_S,
                     help="seconds to connect to an engine; a failed connect counts as a "
                     "failed attempt (see --max-attempts); the engines' KV lease is sized "
                     "from both")
    lim.add_argument("--max-attempts", type=int, default=handoff.ROUTER_MAX_ATTEMPTS,
                     help="tries per phase (prefill, decode)")
    lim.add_argument("--kv-lease-seconds", type=float, default=handoff.kv_lease_seconds(),
                     help="seconds the prefill engines hold a prompt's KV for its decode "
                     "engine (their kv_lease_duration: the launcher's --kv-lease-seconds); a "
                     "handoff the router cannot get to a decode engine within it, less a "
                     "pickup margin, becomes a local prefill, and no release reads it late "
                     f"(default {handoff.kv_lease_seconds()}; 0: not checked)")
    lim.add_argument("--workers", type=int, default=1,
                     help="router processes sharing the port (SO_REUSEPORT), one core each "
                     "(default 1)")
    lim.add_argument("--max-concurrent-per-client", type=int, default=0,
                     help="requests one client may have in flight (a client is its API key, "
                     "else its address); more get 429 (default 0: no limit)")
    sec = parser.add_argument_group("authentication")
    sec.add_argument("--api-key", action="append", default=[],
                     help="a key clients must send as 'Authorization: Bearer KEY' on /v1/* "
                     "(repeatable; default $POOLPILOT_ROUTER_API_KEY)")
    sec.add_argument("--api-key-file",
                     help="a file of keys, one per line (a mounted Secret), re-read when it "
                     "changes")
    lim.add_argument("--drain-timeout", type=float, default=30.0,
                     help="seconds to let streams finish on SIGTERM")
    bal = parser.add_argument_group("balancing and health")
    bal.add_argument("--health-interval", type=float, default=2.0,
                     help="seconds between health checks and queue scrapes (0: off)")
    bal.add_argument("--eject-after", type=int, default=2, help="consecutive failures to eject")
    bal.add_argument("--ramp-seconds", type=float, default=10.0,
                     help="how long a new endpoint takes to reach full weight")
    bal.add_argument("--prefill-hold", type=float, default=DEFAULT_PREFILL_HOLD_S,
                     metavar="SECONDS",
                     help="late binding (disaggregated): a prompt waits at the router, in "
                     "arrival order, while every prefill engine has more than this many seconds "
                     "of queued work at the learned prefill rate, and goes to the first engine "
                     "that can start on it, a newly joined one included (default "
                     f"{DEFAULT_PREFILL_HOLD_S:g}; 0: off, each prompt joins an engine's queue "
                     "at once)")
    pre = parser.add_argument_group(
        "prefix-aware routing: prefill, aggregated and local-prefill engines are chosen by the "
        "prompt prefix they are expected to hold, against their load"
    )
    pre.add_argument("--prefix-routing", choices=PREFIX_ROUTING, default="approximate",
                     help="approximate (default): the router's own record of the prompts it "
                     "sent where, works with any engine; precise: the engines' KV events; off: "
                     "least outstanding work only")
    pre.add_argument("--prefix-balance", type=float, default=DEFAULT_BALANCE,
                     help="the load bound: an endpoint may take a request for its prefix only "
                     "while its load + 1 stays within this times the role's mean (default "
                     f"{DEFAULT_BALANCE}; >= 1)")
    pre.add_argument("--prefix-max-entries", type=int, default=DEFAULT_MAX_ENTRIES,
                     help="approximate: prompt chunks (~32 tokens each) remembered, least "
                     f"recently used dropped first (default {DEFAULT_MAX_ENTRIES})")
    pre.add_argument("--prefix-ttl", type=float, default=DEFAULT_TTL_S,
                     help="approximate: seconds a sent prefix counts as cached at its engine "
                     f"(default {DEFAULT_TTL_S:g})")
    pre.add_argument("--kv-events-port", type=_port, default=5557,
                     help="precise: the port each engine publishes its KV events on, at its "
                     "own address (the launcher's --kv-events-port; default 5557)")
    pre.add_argument("--kv-replay-port", type=_port, default=5558,
                     help="precise: the port each engine replays missed KV events on "
                     "(default 5558)")
    pre.add_argument("--kv-events-ports", action="append", default=[],
                     metavar="URL=PORT[:REPLAY_PORT]",
                     help="precise: an engine that publishes on ports of its own (engines "
                     "sharing one host); repeatable")
    loc = parser.add_argument_group(
        "local prefill (disaggregated): a decode engine prefills a request itself while the "
        "prefill role would break the TTFT target"
    )
    loc.add_argument("--local-prefill", choices=("on", "off"), default="on",
                     help="default on (needs a mixed-step profile; a failed KV handoff is "
                     "retried locally either way)")
    loc.add_argument("--local-prefill-profile", choices=sorted(lp.PRESETS),
                     help="measured mixed-step costs of the decode engines (default: the one "
                     "for the config file's model, if any)")
    loc.add_argument("--ttft-target", type=float,
                     help="seconds (default: the config file's slo.ttft, else 1.0)")
    loc.add_argument("--prefill-deadline-ttfts", type=float, default=5.0,
                     help="a prefill engine that has not answered within this many TTFT "
                     "targets is hung: the request moves to another prefill engine, else "
                     "to a local prefill, and the engine counts a failure (at least "
                     f"{MIN_DEADLINE_S:g} s of real time; 0: no deadline, only --idle-timeout)")
    loc.add_argument("--decode-stall-itls", type=float, default=200.0,
                     help="a streaming engine that sends no token for this many ITL targets "
                     "(--itl-target, simulated seconds under --speed) is hung: a started "
                     "stream ends with an error event, one not started moves to another "
                     "engine or a local prefill, and the engine counts a failure (at least "
                     f"{MIN_DEADLINE_S:g} s of real time; default 200; 0: only --idle-timeout)")
    loc.add_argument("--itl-target", type=float,
                     help="decode ITL budget in seconds (default: the config file's slo.itl, "
                     "else 0.05)")
    loc.add_argument("--prefill-tokens-per-s", type=float,
                     help="a prefill engine's throughput to start from (default: the "
                     "profile's); learned from prefills of 512+ queued tokens")
    add_speed(parser)


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{port}: must be 1..65535")
    return port


def apply_config_file(args: argparse.Namespace) -> None:
    """Fill --pool, --namespace and --mode from the operator's router config file when the
    flags do not set them."""
    if not args.config:
        return
    try:
        data = json.loads(Path(args.config).read_text())
    except OSError as exc:
        raise UsageError(f"--config {args.config}: {fileerrors.describe(exc)}") from exc
    except ValueError as exc:
        raise UsageError(f"--config {args.config}: cannot read it as JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise UsageError(f"--config {args.config}: must hold a JSON object")
    args.pool = args.pool or data.get("pool")
    args.namespace = args.namespace or data.get("namespace")
    slo = data.get("slo")
    slo = slo if isinstance(slo, dict) else {}
    for flag, key in (("ttft_target", "ttft"), ("itl_target", "itl")):
        target = slo.get(key)
        if getattr(args, flag) is None and isinstance(target, dict):
            setattr(args, flag, target.get("seconds"))
    if args.local_prefill_profile is None:
        args.local_prefill_profile = lp.preset_for_model(data.get("model"))
    if args.discover and not args.mode and data.get("mode"):
        mode = str(data["mode"]).lower()
        if mode not in MODES:
            raise UsageError(f"--config {args.config}: mode {data['mode']!r} is not "
                             "Disaggregated or Aggregated")
        args.mode = mode


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    apply_config_file(args)
    static = {role: parse_urls(getattr(args, role)) for role in ENGINE_ROLES}
    if args.discover:
        if any(static.values()):
            raise UsageError("--discover and --prefill/--decode/--engine: choose one source")
        if not args.namespace:
            raise UsageError("--discover kubernetes needs --namespace (the pool's namespace)")
        if not args.pool:
            raise UsageError("--discover kubernetes needs --pool (the InferencePool's name)")
        mode = MODES[args.mode] if args.mode else Mode.DISAGGREGATED
    else:
        if args.mode:
            raise UsageError("--mode is only for --discover; static lists imply it")
        if static[Role.ENGINE] and (static[Role.PREFILL] or static[Role.DECODE]):
            raise UsageError("--engine (aggregated) cannot be combined with --prefill/--decode")
        if static[Role.ENGINE]:
            mode = Mode.AGGREGATED
        elif static[Role.PREFILL] and static[Role.DECODE]:
            mode = Mode.DISAGGREGATED
        elif static[Role.PREFILL] or static[Role.DECODE]:
            missing = "--decode" if static[Role.PREFILL] else "--prefill"
            raise UsageError(f"disaggregated mode needs both --prefill and --decode; add {missing}")
        else:
            raise UsageError(
                "no engines: give --prefill and --decode, or --engine, or --discover kubernetes"
            )
    if not 0 <= args.port < 65536:
        raise UsageError(f"--port {args.port}: must be 0..65535")
    if args.metrics_port is not None and not (
            0 <= args.metrics_port < 65536 and (args.metrics_port != args.port
                                                or args.port == 0)):
        raise UsageError(f"--metrics-port {args.metrics_port}: must be 0..65535 and not --port")
    if args.metrics_port == 0 and args.workers > 1:
        raise UsageError("--metrics-port 0 with --workers: give the port (each worker listens)")
    if args.max_attempts < 1:
        raise UsageError("--max-attempts: must be >= 1")
    if not args.speed > 0:
        raise UsageError(f"--speed {args.speed}: must be > 0")
    if not 1 <= args.workers <= 64:
        raise UsageError(f"--workers {args.workers}: must be 1..64")
    if not (args.prefix_balance >= 1 and args.prefix_balance < float("inf")):
        raise UsageError(f"--prefix-balance {args.prefix_balance}: must be >= 1 (1: strictly "
                         "balanced; larger lets a prefix pull more work onto its engine)")
    if not 0 <= args.prefill_hold < float("inf"):
        raise UsageError(f"--prefill-hold {args.prefill_hold}: must be >= 0 seconds (0: off)")
    if args.prefix_max_entries < 1:
        raise UsageError(f"--prefix-max-entries {args.prefix_max_entries}: must be >= 1")
    if not args.prefix_ttl > 0:
        raise UsageError(f"--prefix-ttl {args.prefix_ttl}: must be > 0 seconds")
    try:  # the precise source's per-engine ports (router/kv_events.py)
        importlib.import_module("poolpilot.router.kv_events").parse_engine_ports(
            args.kv_events_ports)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if args.max_concurrent_per_client < 0:
        raise UsageError("--max-concurrent-per-client: must be >= 0 (0: no limit)")
    check_numbers(args)  # (--ttft-target and --itl-target: local_prefill_policy)
    for role, urls in static.items():
        for url in urls:
            if not url_ok(url):
                raise UsageError(f"--{role} {url}: not an http(s)://host[:port] URL")
    keys = [*args.api_key]
    if not keys and os.environ.get("POOLPILOT_ROUTER_API_KEY"):
        keys = [os.environ["POOLPILOT_ROUTER_API_KEY"]]
    try:
        api_keys = ApiKeys(keys, args.api_key_file)
    except KeyFileError as exc:
        raise UsageError(str(exc)) from exc
    return RouterConfig(
        api_keys=api_keys if api_keys.enabled else None,
        max_concurrent_per_client=args.max_concurrent_per_client,
        workers=args.workers,
        local_prefill=local_prefill_policy(args),
        prefill_tokens_per_s=prefill_seed(args),
        prefill_hold_s=args.prefill_hold or None,
        mode=mode,
        pool=args.pool or "default",
        max_request_bytes=args.max_request_bytes,
        connect_timeout_s=args.connect_timeout,
        request_timeout_s=args.request_timeout,
        idle_timeout_s=args.idle_timeout,
        body_timeout_s=args.body_timeout,
        max_attempts=args.max_attempts,
        health_interval_s=args.health_interval,
        drain_timeout_s=args.drain_timeout,
        balancer=BalancerConfig(eject_after=args.eject_after, ramp_s=args.ramp_seconds),
        prefix_routing=args.prefix_routing,
        prefix_balance=args.prefix_balance,
        prefix_max_entries=args.prefix_max_entries,
        prefix_ttl_s=args.prefix_ttl,
        prefill_deadline_s=prefill_deadline(args),
        decode_stall_s=decode_stall(args),
        deadline_grace_s=deadline_grace(args),
        local_when_no_prefill=args.local_prefill != "off",
        kv_lease_s=float(args.kv_lease_seconds) or None,
    )


# (flag, attribute, lowest allowed, whether the lowest is allowed): a zero or negative limit
# would turn the limit off or make every request fail, so each is refused at start-up.
NUMBER_FLAGS: tuple[tuple[str, str, float, bool], ...] = (
    ("--max-request-bytes", "max_request_bytes", 1, True),
    ("--request-timeout", "request_timeout", 0, False),
    ("--idle-timeout", "idle_timeout", 0, False),
    ("--connect-timeout", "connect_timeout", 0, False),
    ("--drain-timeout", "drain_timeout", 0, True),
    ("--health-interval", "health_interval", 0, False),
    ("--eject-after", "eject_after", 1, True),
    ("--ramp-seconds", "ramp_seconds", 0, True),
    ("--keepalive-timeout", "keepalive_timeout", 0, False),
    ("--header-timeout", "header_timeout", 0, False),
    ("--body-timeout", "body_timeout", 0, False),
    ("--max-connections", "max_connections", 1, True),
    ("--prefill-deadline-ttfts", "prefill_deadline_ttfts", 0, True),
    ("--decode-stall-itls", "decode_stall_itls", 0, True),
    ("--prefill-tokens-per-s", "prefill_tokens_per_s", 0, False),
    ("--kv-lease-seconds", "kv_lease_seconds", 0, True),
)


def check_numbers(args: argparse.Namespace) -> None:
    """One line naming the flag for a number out of range (NaN and infinity included)."""
    for flag, attr, low, inclusive in NUMBER_FLAGS:
        value = getattr(args, attr, None)
        if value is None:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise UsageError(f"{flag} {value!r}: must be a number") from None
        ok = (number >= low if inclusive else number > low) and number < float("inf")
        if not ok:
            bound = f">= {low:g}" if inclusive else f"> {low:g}"
            raise UsageError(f"{flag} {value}: must be {bound}")


def url_ok(url: str) -> bool:
    """An engine URL the router can call: http(s), a host, a port in range, nothing after."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return False
    return (parts.scheme in ("http", "https") and bool(parts.hostname)
            and (port is None or 0 < port < 65536) and parts.path in ("", "/")
            and not parts.query and not parts.fragment and " " not in url)


def local_prefill_policy(args: argparse.Namespace) -> lp.LocalPrefillPolicy | None:
    ttft = 1.0 if args.ttft_target is None else args.ttft_target
    itl = 0.05 if args.itl_target is None else args.itl_target
    for flag, value in (("--ttft-target", ttft), ("--itl-target", itl)):
        if not (isinstance(value, int | float) and 0 < value < float("inf")):
            raise UsageError(f"{flag} {value}: must be a positive number of seconds")
    if args.prefill_tokens_per_s is not None and not args.prefill_tokens_per_s > 0:
        raise UsageError(f"--prefill-tokens-per-s {args.prefill_tokens_per_s}: must be > 0")
    if args.local_prefill == "off" or args.local_prefill_profile is None:
        return None
    return lp.LocalPrefillPolicy(ttft_s=float(ttft), itl_s=float(itl),
                                 cost=lp.PRESETS[args.local_prefill_profile])


def prefill_deadline(args: argparse.Namespace) -> float | None:
    """Simulated seconds a prefill may take to answer (the Router raises it to MIN_DEADLINE_S
    of real time: config.floored)."""
    if not args.prefill_deadline_ttfts:
        return None
    ttft = 1.0 if args.ttft_target is None else float(args.ttft_target)
    return float(args.prefill_deadline_ttfts) * ttft


def decode_stall(args: argparse.Namespace) -> float | None:
    """Simulated seconds a stream may go without a token (floored like the prefill's)."""
    if not args.decode_stall_itls:
        return None
    itl = 0.05 if args.itl_target is None else float(args.itl_target)
    return float(args.decode_stall_itls) * itl


def deadline_grace(args: argparse.Namespace) -> float | None:
    """Simulated seconds every attempt after a request's first missed deadline shares: the
    TTFT target, so a request waits on a hung engine one deadline plus the TTFT target at
    most. None while no deadline is on."""
    if not args.prefill_deadline_ttfts and not args.decode_stall_itls:
        return None
    return 1.0 if args.ttft_target is None else float(args.ttft_target)


def prefill_seed(args: argparse.Namespace) -> float:
    if args.prefill_tokens_per_s is not None:
        return float(args.prefill_tokens_per_s)
    if args.local_prefill_profile is not None:
        return lp.PRESETS[args.local_prefill_profile].prefill_tokens_per_s
    return 0.0


def precise_source(args: argparse.Namespace, config: RouterConfig) -> PrefixSource | None:
    """The KV-events source for --prefix-routing precise (router/kv_events.py), else None."""
    if config.prefix_routing != "precise":
        return None
    try:  # by name: the precise source is its own module, with its own dependencies
        kv_events = importlib.import_module("poolpilot.router.kv_events")
        factory = kv_events.source_from_args
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"--prefix-routing precise: the KV events source is not available "
                         f"({exc})") from exc
    source: PrefixSource = factory(args, config)
    return source


async def _healthy_once_synced(router: Router, discovery: KubernetesDiscovery) -> None:
    await discovery.synced.wait()
    router.discovering = False


async def serve(args: argparse.Namespace, config: RouterConfig, clock: Clock,
                port: int | None = None, ready_fd: int | None = None) -> int:
    """Run one router process; with `ready_fd` (a worker of --workers), listen on the shared
    `port` with SO_REUSEPORT and report readiness on the fd instead of printing."""
    source = precise_source(args, config)
    router = Router(config, clock=clock, prefix_source=source)
    attach = getattr(source, "attach", None)
    if attach is not None:  # the KV events source subscribes to the router's engines
        attach(lambda: router.session, router.balancer.urls,
               registry=router.metrics.registry, pool=config.pool)
    if not args.discover:
        for role in config.roles():
            router.set_endpoints(role, parse_urls(getattr(args, role)), initial=True)
    if config.api_keys is None and ready_fd is None:
        log.warning("WARNING: no API key (--api-key / --api-key-file / $POOLPILOT_ROUTER_API_"
                    "KEY): anyone who reaches this port can send prompts")
    limits = ServerLimits(header_timeout_s=args.header_timeout,
                          max_connections=args.max_connections)
    separate = args.metrics_port is not None
    runner = GuardedRunner(router.build_app(metrics=not separate), limits,
                           handler_cancellation=True, access_log=None,
                           keepalive_timeout=args.keepalive_timeout)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port if port is None else port,
                       shutdown_timeout=config.drain_timeout_s, reuse_port=ready_fd is not None)
    await site.start()
    metrics_runner = None
    if separate:  # every worker listens too (SO_REUSEPORT): each serves the workers' sum
        metrics_runner = GuardedRunner(router.build_metrics_app(), limits, access_log=None)
        await metrics_runner.setup()
        await web.TCPSite(metrics_runner, args.host, args.metrics_port,
                          reuse_port=ready_fd is not None).start()
        args.metrics_port = metrics_runner.addresses[0][1]  # the one picked for 0
    discovery_task = None
    if args.discover:
        discovery = KubernetesDiscovery(
            args.namespace, args.pool, router.set_endpoints, kubeconfig=args.kubeconfig,
            pool_uid=args.pool_uid,
        )
        router.discovering = True  # /health answers 503 until the engines are known
        discovery_task = asyncio.gather(discovery.run(), _healthy_once_synced(router, discovery))
    lease = config.kv_lease_s
    if (config.mode == Mode.DISAGGREGATED and lease is not None and ready_fd is None
            and not kv_lease.lease_covers(clock.real(lease), config.connect_timeout_s,
                                          config.max_attempts)):
        log.warning("the engines' %g s KV lease does not cover this router's decode attempts "
                    "(--connect-timeout %g x --max-attempts %d, plus %.1f s for the pickup): "
                    "handoffs that need them all become local prefills; raise the launcher's "
                    "--kv-lease-seconds and this router's with it", lease,
                    config.connect_timeout_s, config.max_attempts,
                    kv_lease.pickup_margin(lease))
    if config.mode == Mode.DISAGGREGATED and config.local_prefill is None and ready_fd is None:
        log.info("local prefill when prefill is behind: off (%s); a failed KV handoff is still "
                 "retried locally", "--local-prefill off" if args.local_prefill == "off" else
                 "no mixed-step profile for this model: set --local-prefill-profile")
    if ready_fd is None:
        listening(args, config, runner.addresses[0][1])
    else:
        os.write(ready_fd, b"x")
        os.close(ready_fd)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: draining %d in-flight requests", router.active)
    drained = await router.drain()
    if discovery_task is not None:
        discovery_task.cancel()
    await runner.cleanup()
    if metrics_runner is not None:
        await metrics_runner.cleanup()
    return 0 if drained else 1


def listening(args: argparse.Namespace, config: RouterConfig, port: int) -> None:
    # One machine-readable line: tests and the sandbox read the port from it.
    workers = f" workers={config.workers}" if config.workers > 1 else ""
    metrics = f" metrics_port={args.metrics_port}" if args.metrics_port is not None else ""
    print(f"poolpilot router listening on http://{args.host}:{port} "
          f"mode={config.mode.lower()}{workers}{metrics}", flush=True)


def clock_from_args(args: argparse.Namespace) -> Clock:
    """The router's clock: --speed, the sandbox's time compression (one clock: the router
    measures in the simulated seconds its engines report)."""
    return Clock(rate=args.speed)


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except UsageError as exc:
        print(f"poolpilot router: error: {exc}", file=sys.stderr)
        return 2
    clock = clock_from_args(args)
    if config.workers > 1:
        return run_workers(
            config.workers, args.host, args.port,
            lambda port, fd: uvloop.run(serve(args, config, clock, port=port, ready_fd=fd)),
            lambda port: listening(args, config, port),
        )
    # uvloop (libuv) roughly halves the router's per-request CPU cost on the proxy path.
    return uvloop.run(serve(args, config, clock))
