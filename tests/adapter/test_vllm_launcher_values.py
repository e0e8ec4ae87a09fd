"""What the launcher sends, through the pinned vLLM's own argument parser: values that start
with '-' arrive intact, and every --kv-config key the launcher moves to the top level of
--kv-transfer-config is a KVTransferConfig field there (the others stay in the connector's
extra config, which vLLM takes as it is)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest
from poolpilot.runtime.launcher import KV_TOP_LEVEL, LaunchSpec, build_command
from router_support import VLLM_PYTHON, vllm_available

pytestmark = [
    pytest.mark.adapter,
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="no vLLM venv: run ./dev setup-vllm"),
]

# Runs in the vLLM venv: parse a server command line as vLLM's server does, build its engine
# arguments (KVTransferConfig refuses unknown fields there), and list KVTransferConfig's fields.
PARSE = """
import dataclasses, json, sys
from vllm.config import KVTransferConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
k = AsyncEngineArgs.from_cli_args(args).kv_transfer_config
print("RESULT " + json.dumps({
    "model": args.model, "served": args.served_model_name, "template": args.chat_template,
    "kv": dataclasses.asdict(k) if k else None,
    "fields": [f.name for f in dataclasses.fields(KVTransferConfig)]}))
"""


def _vllm(cmd: list[str]) -> dict[str, Any]:
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    # (PYTHONSAFEPATH: the repository's operator/ folder would shadow the stdlib's operator)
    out = subprocess.run([str(VLLM_PYTHON), "-c", PARSE, *cmd[3:]], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONSAFEPATH": "1"})
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-4000:]
    got: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return got


def test_vllm_reads_dash_values_and_the_kv_config_the_launcher_renders() -> None:
    kv = {"kvBufferDevice": "cpu", "kvPort": 14600, "kvBufferSize": 10**9, "kvIp": "10.0.0.1",
          "kvRank": 0, "kvParallelSize": 2}
    got = _vllm(build_command(LaunchSpec(
        role="prefill", model="-x", served_name="--x", kv_config=kv, python=str(VLLM_PYTHON),
        engine_args=["chatTemplate=--port=1"])))
    assert (got["model"], got["served"], got["template"]) == ("-x", ["--x"], "--port=1")
    assert set(got["fields"]) >= KV_TOP_LEVEL
    assert (got["kv"]["kv_buffer_device"], got["kv"]["kv_port"]) == ("cpu", 14600)
    assert {k: got["kv"]["kv_connector_extra_config"].get(k) for k in (
        "kvBufferSize", "kvIp", "kvRank", "kvParallelSize")} == {
        "kvBufferSize": 10**9, "kvIp": "10.0.0.1", "kvRank": 0, "kvParallelSize": 2}
