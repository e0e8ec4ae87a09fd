"""`poolpilot perf NAME [ARGS]`: one command for the performance harnesses.

Each harness is a module here with `main(argv, prog) -> int`; only the one asked for is imported,
and everything after its name is its own arguments (`poolpilot perf router --help`).
"""

from __future__ import annotations

import argparse
import importlib

HARNESSES: dict[str, tuple[str, str]] = {
    "router": ("poolpilot.perf.router", "router overhead against direct engine access"),
    "autoscaler": ("poolpilot.perf.autoscaler", "one autoscaler cycle for 1 to N pools"),
    "operator": ("poolpilot.perf.operator", "reconcile latency and throughput for N pools"),
    "engine-sim": ("poolpilot.perf.engine_sim", "the engine simulator's speed and fidelity"),
    "emulator": ("poolpilot.perf.emulator", "the Kubernetes API emulator's request rates"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "harnesses:\n" + "\n".join(
        f"  {name:<12} {help_text}" for name, (_, help_text) in HARNESSES.items())
    parser.add_argument("harness", choices=list(HARNESSES), metavar="NAME",
                        help="which harness to run (listed below)")
    parser.add_argument("args", nargs=argparse.REMAINDER,
                        help="the harness's own arguments (`poolpilot perf NAME --help`)")


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(HARNESSES[args.harness][0])
    code: int = module.main(args.args, prog=f"poolpilot perf {args.harness}")
    return code
