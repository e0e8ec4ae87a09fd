"""Values that start with '-' (a model, a served name, an engine-arg value or key) go from the
pool, through the operator's command and the launcher, to vLLM's argv intact: argparse would
take `--flag -x` for two options, so they travel as `--flag=-x`. And the --kv-config keys the
launcher moves to the top of --kv-transfer-config are ones the pinned vLLM has."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
from typing import Any

import pytest
from poolpilot.operator import engine_pods
from poolpilot.runtime import launcher, multinode
from poolpilot.runtime.launcher import LaunchSpec, build_command, kv_transfer_config

from poolpilot import cli
from poolpilot.roles import Role
from poolpilot.validate import parse_spec


def _operator_command(model: dict[str, Any], engine_args: dict[str, Any]) -> list[str]:
    spec = parse_spec({"model": model, "mode": "Aggregated",
                       "runtime": {"engineArgs": engine_args}})
    return engine_pods.launch_command(spec, Role.ENGINE)


def _launch(cmd: list[str]) -> tuple[int, str, str]:
    """The pod's command through `poolpilot launch --dry-run` (the launcher's own parser)."""
    assert cmd[:2] == ["poolpilot", "launch"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([*cmd[1:], "--python", "py", "--dry-run"])
        except SystemExit as exc:  # argparse's own errors
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def _vllm_parse(argv: list[str]) -> argparse.Namespace:
    """argparse with the shapes of vLLM's options used here (the adapter test runs vLLM's
    own parser: test_vllm_launcher_values.py)."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--model")
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--chat-template")
    parser.add_argument("--max-model-len", type=int)
    args, _ = parser.parse_known_args(argv)
    return args


def test_dash_values_reach_vllm_intact() -> None:
    cmd = _operator_command({"name": "-x", "servedName": "--x"},
                            {"chatTemplate": "--port=1", "maxModelLen": -5})
    code, out, err = _launch(cmd)
    assert code == 0, err
    vllm = shlex.split(out)
    assert vllm[1:3] == ["-m", launcher.SERVER_MODULE]
    args = _vllm_parse(vllm[3:])
    assert (args.model, args.served_model_name, args.chat_template, args.max_model_len) == (
        "-x", ["--x"], "--port=1", -5)


def test_ordinary_values_keep_the_two_item_form() -> None:
    """What every existing pod (and the sandbox's emulator) reads: `--model M`."""
    cmd = _operator_command({"name": "org/m", "servedName": "m"}, {"maxModelLen": 512})
    assert cmd[cmd.index("--model") + 1] == "org/m"
    assert cmd[cmd.index("--served-name") + 1] == "m"
    assert cmd[cmd.index("--engine-arg") + 1] == "maxModelLen=512"
    vllm = build_command(LaunchSpec(role="engine", model="org/m", served_name="m", python="py",
                                    engine_args=["maxModelLen=512"]))
    assert vllm[3:5] == ["--model", "org/m"] and vllm[-2:] == ["--max-model-len", "512"]


@pytest.mark.parametrize("key", ["--port", "-port"])
def test_an_engine_arg_key_with_dashes_is_refused_by_name(key: str) -> None:
    code, out, err = _launch(_operator_command({"name": "org/m"}, {key: 9000}))
    assert (code, out) == (2, "")
    assert f"--engine-arg {key}: set by the launcher; use --port instead" in err, err


def test_a_multi_node_group_keeps_a_dash_model_and_puts_its_flags_after_it() -> None:
    group = multinode.GroupMember(nodes=2, rank=0, leader="leader")
    cmd = build_command(LaunchSpec(role="decode", model="-x", tensor_parallel=8,
                                   group=group, python="py"))
    model = cmd.index("--model=-x")
    assert cmd[model + 1:model + 3] == ["--tensor-parallel-size", "8"]
    assert _vllm_parse(cmd[3:]).model == "-x"


def test_kv_config_keys_vllm_dropped_stay_in_the_connectors_extra_config() -> None:
    """vLLM 0.32's KVTransferConfig has no kv_buffer_size, kv_ip, kv_rank or
    kv_parallel_size: at its top level vLLM would stop on an unexpected keyword."""
    extra = {"kvBufferSize": 10**9, "kvParallelSize": 2, "kv_ip": "10.0.0.1", "kvRank": 0}
    config = kv_transfer_config(Role.PREFILL, "NixlConnector",
                                {**extra, "kvBufferDevice": "cpu", "kvPort": 14600})
    assert config == {"kv_connector": "NixlConnector", "kv_role": "kv_producer",
                      "kv_buffer_device": "cpu", "kv_port": 14600,
                      "kv_connector_extra_config": extra}
    cmd = build_command(LaunchSpec(role="decode", model="m", python="py",
                                   kv_config={"kv_buffer_size": 5}))
    sent = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
    assert "kv_buffer_size" not in sent and sent["kv_connector_extra_config"][
        "kv_buffer_size"] == 5
