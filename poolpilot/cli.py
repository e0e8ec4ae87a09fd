"""`poolpilot` command line: one subcommand per component, each loaded only when used.

Each component module exposes `add_arguments(parser)` and `run(args) -> int`; the table below
maps subcommand names to those modules so that `poolpilot crd` never imports kopf or vLLM.
Options every subcommand shares are added here, once: `--log-level` (with `-v` for DEBUG),
`--log-format text|json`, and logging is configured here before the component runs. Options
several commands share are defined here too, each with one meaning, and the commands add them
by calling these functions: `--kubeconfig` (the cluster to talk to), `--speed` (the sandbox's
time compression) and `--gpu` (the GPU the engine simulator models).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterable

from poolpilot import __version__, logformat

COMMANDS: dict[str, tuple[str, str]] = {
    "crd": ("poolpilot.commands.crd", "print the InferencePool CRD generated from the models"),
    "validate": ("poolpilot.commands.validate", "check InferencePool manifests"),
    "render": ("poolpilot.operator.render", "print every object the operator makes for a pool"),
    "operator": ("poolpilot.operator.main", "run the Kopf operator"),
    "autoscaler": ("poolpilot.autoscaler.main", "run the autoscaler loop"),
    "router": ("poolpilot.router.main", "run the OpenAI-compatible prefill/decode router"),
    "launch": ("poolpilot.runtime.launcher",
               "start vLLM for one role (the engine image's entry point)"),
    "engine-sim": ("poolpilot.engine_sim.server", "run the vLLM-compatible engine simulator"),
    "sim": ("poolpilot.engine_sim.cli", "offline simulator experiments (e.g. `sim batching`)"),
    "workload": ("poolpilot.engine_sim.workloads",
                 "write a synthetic trace (`workload sessions`: chat and agent sessions whose "
                 "prompts share prefixes, Mooncake JSONL)"),
    "emulator": ("poolpilot.emulator.main", "run the Kubernetes API emulator (developer tool)"),
    "perf": ("poolpilot.perf.main", "run a performance harness (developer tool)"),
    "sandbox": ("poolpilot.sandbox.main", "run the whole system locally, replaying a trace"),
    "bench": ("poolpilot.bench.main", "compare scaling policies on a trace"),
    "dashboards": ("poolpilot.dashboards.generate", "write the chart's dashboards and alert rules"),
}

# The commands of the tool rooms (pyproject's [tool.poolpilot] dev-only; tests/unit/test_cli.py
# keeps the two lists together): not in the images, their dependencies are the `tools` extra.
TOOLS = frozenset({"engine-sim", "sim", "workload", "emulator", "perf", "sandbox", "bench",
                   "dashboards"})
INSTALL_TOOLS = "pip install -e '.[tools]' in a poolpilot source checkout (or ./dev setup)"

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Long-running servers log their actions by default; commands that print a result (and the
# sandbox, which draws its own progress) log only warnings.
SERVERS = frozenset({"operator", "autoscaler", "router", "launch", "engine-sim", "emulator"})


def add_log_level(p: argparse.ArgumentParser, default: str) -> None:
    group = p.add_argument_group("logging")
    group.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=default,
                       metavar="LEVEL",
                       help=f"{', '.join(LOG_LEVELS)} (case-insensitive; default {default})")
    group.add_argument("-v", "--verbose", dest="log_level", action="store_const",
                       const="DEBUG", help="the same as --log-level DEBUG")
    group.add_argument("--log-format", choices=logformat.FORMATS, default="text",
                       help="text (default) or json: one JSON object per line, for log "
                       "pipelines")


def add_kubeconfig(p: argparse._ActionsContainer) -> None:
    """`--kubeconfig FILE`: the cluster a command talks to."""
    p.add_argument("--kubeconfig", metavar="FILE",
                   help="kubeconfig file (default: in-cluster when running in a pod, then "
                   "$KUBECONFIG, then ~/.kube/config)")


def add_speed(p: argparse._ActionsContainer, default: float | None = 1.0,
              default_text: str | None = None) -> None:
    """`--speed X`, the one clock of the local sandbox: X simulated seconds pass per real second
    and every latency is reported in simulated seconds, so SLO targets keep their meaning."""
    shown = default_text if default_text is not None else f"{default:g}"
    p.add_argument("--speed", type=float, default=default, metavar="X",
                   help="time compression: the simulated world runs X times faster than real "
                   "time and reports latencies in simulated seconds (inf: engine steps take "
                   f"no time; default {shown})")


def add_gpu(p: argparse._ActionsContainer, gpus: Iterable[str]) -> None:
    """`--gpu NAME`, one of the engine simulator's GPUs (engine_sim.hardware.GPUS: the core
    imports no room, so the simulator's commands pass them in)."""
    names = sorted(gpus)
    p.add_argument("--gpu", type=str.lower, choices=names, default="h200",
                   help=f"the GPU the engine simulator models: {', '.join(names)} (default "
                   "h200, whose step times are calibrated against measured ones)")


def missing_tool(command: str, exc: ModuleNotFoundError) -> str:
    """One line for a tool command whose room or dependency is absent (as in the images)."""
    missing = exc.name or ""
    what = (f"{missing} is not installed (the images ship the control plane only)"
            if missing.startswith("poolpilot") else
            f"needs {missing.split('.')[0]!r}, which is not installed")
    return f"poolpilot {command}: {what}; install the developer tools: {INSTALL_TOOLS}\n"


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="poolpilot",
        description="Operator and autoscaler for disaggregated LLM inference pools.",
    )
    parser.add_argument("--version", action="version", version=f"poolpilot {__version__}",
                        help="print poolpilot's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            try:
                mod = importlib.import_module(module)
            except ModuleNotFoundError as exc:
                missing = exc.name or ""
                if name in TOOLS:
                    parser.exit(2, missing_tool(name, exc))
                if not missing or not module.startswith(missing):
                    raise
                parser.exit(2, f"poolpilot {name}: not available in this build ({module})\n")
            mod.add_arguments(p)
            add_log_level(p, "INFO" if name in SERVERS else "WARNING")
            p.set_defaults(run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logformat.configure(args.log_level, args.log_format, sys.stderr)
    try:
        code: int = args.run(args)
    except ModuleNotFoundError as exc:  # a tool importing a plotting library when it draws
        if args.command not in TOOLS:
            raise
        parser.exit(2, missing_tool(args.command, exc))
    return code


if __name__ == "__main__":
    sys.exit(main())
