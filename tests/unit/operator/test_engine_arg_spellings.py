"""The engine args the operator adds (Streaming's loadFormat, a decode engine's CUDA-graph
ceiling) give way to the user's in every spelling the launcher takes for the same flag: the
rendered command passes the launcher with the user's value, never the flag twice."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from poolpilot.operator import builders, model_cache
from poolpilot.runtime import launcher

from poolpilot import api, names
from poolpilot.validate import parse_pool

S3 = {"objectStore": {"uri": "s3://models/llama-8b"}}

SPELLINGS = ["loadFormat", "load_format", "load-format", "LOAD_FORMAT", "LoadFormat",
             "--load-format", " loadFormat", "maxCUDAGraphCaptureSize",
             "max_cudagraph_capture_size", "MAX_CUDAGRAPH_CAPTURE_SIZE", "maxCudagraphCaptureSize",
             "enforceEager", "ENFORCE_EAGER", "maxNumSeqs"]


@pytest.mark.parametrize("key", SPELLINGS)
def test_the_operator_reads_a_key_as_the_launcher_does(key: str) -> None:
    assert model_cache._kebab(key) == launcher.kebab(key)


def _pool(**spec: Any) -> api.InferencePool:
    return parse_pool({"apiVersion": api.API_VERSION, "kind": api.KIND,
                       "metadata": {"name": "p", "namespace": "ns"},
                       "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, **spec}})


def _launched(pool: api.InferencePool, role: str) -> list[str]:
    """The vLLM command the launcher builds from the role's rendered engine command."""
    objs = builders.build_children(
        builders.Pool(name="p", namespace="ns", spec=pool.spec), builders.Capabilities())
    [deployment] = [o for o in objs if o["kind"] == "Deployment"
                    and o["metadata"]["labels"][names.ROLE_LABEL] == role]
    [engine] = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                if c["name"] == "engine"]
    command = engine["command"]
    assert command[:2] == ["poolpilot", "launch"], command
    parser = argparse.ArgumentParser()
    launcher.add_arguments(parser)
    args = parser.parse_args([*command[2:], "--python", "/usr/bin/python3"])
    return launcher.build_command(launcher.spec_from_args(args))


@pytest.mark.parametrize("key", ["LOAD_FORMAT", "LoadFormat", "--load-format", "loadFormat"])
def test_streaming_keeps_the_users_load_format_in_any_spelling(key: str) -> None:
    pool = _pool(mode="Aggregated",
                 model={"name": "x/y", "source": S3, "cache": {"type": "Streaming"}},
                 runtime={"engineArgs": {key: "auto"}})
    assert "loadFormat" not in model_cache.engine_args(pool.spec, "engine")
    cmd = _launched(pool, "engine")
    assert cmd.count("--load-format") == 1
    assert cmd[cmd.index("--load-format") + 1] == "auto"


@pytest.mark.parametrize("key", ["maxCUDAGraphCaptureSize", "MAX_CUDAGRAPH_CAPTURE_SIZE",
                                 "max-cudagraph-capture-size"])
def test_decode_keeps_the_users_graph_ceiling_in_any_spelling(key: str) -> None:
    pool = _pool(decode={"engineArgs": {"maxNumSeqs": 128, key: 64}})
    assert model_cache.engine_args(pool.spec, "decode") == {}
    cmd = _launched(pool, "decode")
    assert cmd.count("--max-cudagraph-capture-size") == 1
    assert cmd[cmd.index("--max-cudagraph-capture-size") + 1] == "64"


def test_without_the_users_flag_the_operators_default_still_applies() -> None:
    pool = _pool(decode={"engineArgs": {"maxNumSeqs": 128}})
    cmd = _launched(pool, "decode")
    assert cmd[cmd.index("--max-cudagraph-capture-size") + 1] == "128"
