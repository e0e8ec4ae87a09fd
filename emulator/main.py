"""`poolpilot emulator`: run the Kubernetes API emulator as its own process."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from poolpilot.emulator.server import KubeEmulator


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    parser.add_argument("--port", type=int, default=0, help="port (0: a free one, printed)")
    parser.add_argument("--write-kubeconfig", type=Path, metavar="FILE",
                        help="write a kubeconfig for it here (for kubectl and the components' "
                        "--kubeconfig)")
    parser.add_argument("--namespace", default="default",
                        help="the kubeconfig's default namespace")
    parser.add_argument("--crd", type=Path, action="append", default=[],
                        help="YAML file of CRDs (or any objects) to create at start; repeatable")
    parser.add_argument("--bookmark-interval", type=float, default=5.0,
                        help="seconds between BOOKMARK events on idle watches")
    parser.add_argument("--history-limit", type=int, default=20_000,
                        help="events kept for watches to resume from (older: 410 Gone)")
    parser.add_argument("--request-log-limit", type=int, default=100_000,
                        help="keep this many request records (memory stays bounded)")


async def _serve(args: argparse.Namespace) -> int:
    import yaml

    emu = KubeEmulator(args.host, args.port, bookmark_interval=args.bookmark_interval,
                       request_log_limit=args.request_log_limit,
                       history_limit=args.history_limit)
    await emu.start()
    try:
        for path in args.crd:
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    emu.apply(doc, manager="poolpilot-emulator")
        if args.write_kubeconfig:
            emu.write_kubeconfig(args.write_kubeconfig, namespace=args.namespace)
        print(emu.url, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await emu.stop()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_serve(args))
    except OSError as exc:
        print(f"poolpilot emulator: cannot serve on {args.host}:{args.port}: {exc}",
              file=sys.stderr)
        return 1
