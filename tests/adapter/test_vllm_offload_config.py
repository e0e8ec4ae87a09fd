"""The CPU offload tier's engine configuration is one the pinned vLLM itself accepts.

vLLM's OffloadingConnector runs on GPUs only (its copies use CUDA streams), so no engine here
can serve with it; what can be checked on CPU is that vLLM's own argument parser and engine
arguments take the `--kv-transfer-config` the launcher renders for each role, and that each
connector named resolves to one of vLLM's connector classes with the size given."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from poolpilot.runtime.launcher import LaunchSpec, build_command
from router_support import VLLM_PYTHON, vllm_available

pytestmark = [
    pytest.mark.adapter,
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="no vLLM venv: run ./dev setup-vllm"),
]

# Runs in the vLLM venv: parse a server command line as `vllm serve` does, build its engine
# arguments, and resolve every KV connector in them to vLLM's class.
PARSE = """
import json, sys
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
k = AsyncEngineArgs.from_cli_args(args).kv_transfer_config
kids = [KVTransferConfig(**c) for c in k.kv_connector_extra_config.get("connectors", [])] or [k]
print("RESULT " + json.dumps({"connector": k.kv_connector, "role": k.kv_role, "children": [
    [c.kv_connector, c.kv_role, KVConnectorFactory.get_connector_class(c).__name__,
     c.kv_connector_extra_config] for c in kids]}))
"""

GIB = 2**30
CASES = {
    # a P/D prefill engine: NIXL hands the prompt over, the offloading connector keeps blocks
    "prefill": ("MultiConnector", [
        ["NixlConnector", "kv_producer", {"kv_lease_duration": 25}],
        ["OffloadingConnector", "kv_both", {"cpu_bytes_to_use": 256 * GIB}]]),
    # an aggregated engine: the offloading connector alone, as --kv-offloading-size renders it
    "engine": ("OffloadingConnector", [
        ["OffloadingConnector", "kv_both", {"cpu_bytes_to_use": 256 * GIB}]]),
}


@pytest.mark.parametrize("role", sorted(CASES))
def test_vllm_takes_the_offload_tier_the_launcher_renders(role: str) -> None:
    cmd = build_command(LaunchSpec(role=role, model="m", python=str(VLLM_PYTHON),
                                   kv_offload_bytes=256 * GIB))
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    # (PYTHONSAFEPATH: the repository's operator/ folder would shadow the stdlib's operator)
    out = subprocess.run([str(VLLM_PYTHON), "-c", PARSE, *cmd[3:]], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONSAFEPATH": "1"})
    lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-4000:]
    got = json.loads(lines[-1].removeprefix("RESULT "))
    connector, children = CASES[role]
    assert got["connector"] == connector
    assert [[name, kv_role, extra] for name, kv_role, _cls, extra in got["children"]] == children
    # each resolves to vLLM's class of that connector (NixlConnector is vLLM's pull variant)
    assert [cls for *_, cls, _extra in got["children"]] == (
        ["NixlPullConnector", "OffloadingConnector"] if role == "prefill"
        else ["OffloadingConnector"])
