"""The P/D request transformations, and the router's small pure helpers."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.router import local_prefill as lp
from poolpilot.router import pd
from poolpilot.router.discovery import endpoints_from_slices, label_selector, parse_urls
from poolpilot.router.main import UsageError, add_arguments, config_from_args
from poolpilot.router.metrics import parse_waiting

from poolpilot.api.runtime import Mode


@dataclass(frozen=True)
class BodyCase:
    id: str
    body: dict[str, Any]
    prefill_has: dict[str, Any] = field(default_factory=dict)
    prefill_lacks: tuple[str, ...] = ()


BODY_CASES = [
    BodyCase("completion", {"model": "m", "prompt": "hi", "max_tokens": 50},
             {"max_tokens": 1, "stream": False, "prompt": "hi"}),
    BodyCase("streaming chat with usage",
             {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
              "stream_options": {"include_usage": True}, "max_completion_tokens": 9},
             {"stream": False, "max_tokens": 1, "max_completion_tokens": 1},
             ("stream_options",)),
    BodyCase("n and logprobs dropped", {"model": "m", "prompt": "x", "n": 3, "logprobs": 5,
                                        "min_tokens": 4},
             {"max_tokens": 1}, ("n", "logprobs", "min_tokens")),
]


@pytest.mark.parametrize("case", BODY_CASES, ids=[c.id for c in BODY_CASES])
def test_prefill_body(case: BodyCase) -> None:
    original = {k: v for k, v in case.body.items()}
    out = pd.prefill_body(case.body)
    assert case.body == original  # the client's request is untouched
    for k, v in case.prefill_has.items():
        assert out[k] == v
    for k in case.prefill_lacks:
        assert k not in out
    assert out["kv_transfer_params"]["do_remote_decode"] is True
    assert out["kv_transfer_params"]["do_remote_prefill"] is False


def test_decode_body_carries_prefill_params_and_keeps_the_request() -> None:
    body = {"model": "m", "prompt": "hi", "max_tokens": 50, "stream": True}
    params = {"remote_engine_id": "e", "remote_block_ids": [1, 2], "do_remote_prefill": True}
    out = pd.decode_body(body, pd.kv_params_from_prefill({"kv_transfer_params": params}))
    assert out == body | {"kv_transfer_params": params}
    # Shared-storage connectors return no parameters: the decode request carries none.
    assert pd.decode_body(body | {"kv_transfer_params": {"x": 1}}, None) == body
    assert pd.kv_params_from_prefill({"kv_transfer_params": None}) is None


@given(st.text(max_size=2000))
def test_token_estimate_is_positive_and_grows_with_text(text: str) -> None:
    a = pd.estimate_prompt_tokens({"prompt": text})
    b = pd.estimate_prompt_tokens({"prompt": text + "x" * 400})
    assert 1 <= a < b


def test_token_estimate_counts_token_ids_exactly() -> None:
    assert pd.estimate_prompt_tokens({"prompt": [1, 2, 3, 4, 5]}) == 5
    assert pd.requested_output_tokens({"max_completion_tokens": 7, "max_tokens": 3}) == 7
    assert pd.requested_output_tokens({}, default=100) == 100


@dataclass(frozen=True)
class SliceCase:
    id: str
    slices: list[dict[str, Any]]
    expect: dict[str, list[str]]


def _slice(service: str, addrs: list[tuple[str, bool | None]], ports: list[dict[str, Any]])\
        -> dict[str, Any]:
    return {
        "metadata": {"name": f"{service}-x", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": [
            {"addresses": [a], **({"conditions": {"ready": r}} if r is not None else {})}
            for a, r in addrs
        ],
    }


SLICE_CASES = [
    SliceCase("ready and unready", [_slice("p-decode", [("10.0.0.1", True), ("10.0.0.2", False),
                                                        ("10.0.0.3", None)],
                                           [{"name": "http", "port": 8000}])],
              {"decode": ["http://10.0.0.1:8000", "http://10.0.0.3:8000"]}),
    SliceCase("port named http wins", [_slice("p-prefill", [("10.0.0.5", True)],
                                              [{"name": "metrics", "port": 9000},
                                               {"name": "http", "port": 8001}])],
              {"prefill": ["http://10.0.0.5:8001"]}),
    SliceCase("several slices merge, other pools ignored",
              [_slice("p-engine", [("10.0.0.1", True)], [{"port": 8000}]),
               _slice("p-engine", [("10.0.0.2", True)], [{"port": 8000}]),
               _slice("other-engine", [("10.0.0.9", True)], [{"port": 8000}])],
              {"engine": ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]}),
    SliceCase("no ports, IPv6", [_slice("p-decode", [("fd00::1", True)], [])],
              {"decode": ["http://[fd00::1]:8000"]}),
]


@pytest.mark.parametrize("case", SLICE_CASES, ids=[c.id for c in SLICE_CASES])
def test_endpoints_from_slices(case: SliceCase) -> None:
    got = endpoints_from_slices("p", case.slices)
    assert {k: v for k, v in got.items() if v} == case.expect


def test_label_selector_names_the_three_services() -> None:
    assert label_selector("llama") == (
        "kubernetes.io/service-name in (llama-prefill,llama-decode,llama-engine)"
    )
    assert parse_urls(" a:1 , http://b:2/ ,,") == ["http://a:1", "http://b:2"]


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ('vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n', 3.0),
        ('vllm:num_requests_waiting{engine="0"} 2.0\nvllm:num_requests_waiting{engine="1"} 1\n',
         3.0),
        ("# HELP vllm:num_requests_waiting x\nvllm:num_requests_waiting_other 9\n", None),
        ("vllm:num_requests_waiting 4\n", 4.0),
    ],
    ids=["one", "per-engine summed", "absent", "no labels"],
)
def test_parse_waiting(text: str, expect: float | None) -> None:
    assert parse_waiting(text) == expect


@dataclass(frozen=True)
class ArgsCase:
    id: str
    argv: list[str]
    error: str = ""
    mode: Mode | None = None


ARGS_CASES = [
    ArgsCase("pd", ["--prefill", "a:1", "--decode", "b:1"], mode=Mode.DISAGGREGATED),
    ArgsCase("aggregated", ["--engine", "a:1,b:1"], mode=Mode.AGGREGATED),
    ArgsCase("discover", ["--discover", "kubernetes", "--namespace", "n", "--pool", "p"],
             mode=Mode.DISAGGREGATED),
    ArgsCase("nothing", [], error="no engines"),
    ArgsCase("prefill only", ["--prefill", "a:1"], error="add --decode"),
    ArgsCase("engine and pd", ["--engine", "a:1", "--prefill", "b:1", "--decode", "c:1"],
             error="cannot be combined"),
    ArgsCase("discover and static", ["--discover", "kubernetes", "--namespace", "n", "--pool",
                                     "p", "--engine", "a:1"], error="choose one source"),
    ArgsCase("discover without pool", ["--discover", "kubernetes", "--namespace", "n"],
             error="needs --pool"),
    ArgsCase("discover without namespace", ["--discover", "kubernetes", "--pool", "p"],
             error="needs --namespace"),
]


@pytest.mark.parametrize("case", ARGS_CASES, ids=[c.id for c in ARGS_CASES])
def test_router_arguments(case: ArgsCase) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(case.argv)
    if case.error:
        with pytest.raises(UsageError, match=case.error):
            config_from_args(args)
    else:
        assert config_from_args(args).mode == case.mode


@pytest.mark.parametrize("module", ["balancer", "pd", "local_prefill", "validate"])
def test_selection_and_request_shaping_do_no_io(module: str) -> None:
    """import-linter cannot see the mapped router/ folder, so check the imports here."""
    import ast
    from pathlib import Path

    import poolpilot.router as pkg

    source = Path(pkg.__path__[0], f"{module}.py").read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"aiohttp", "httpx", "kubernetes_asyncio", "prometheus_client",
                           "socket", "asyncio", "time"}


@pytest.mark.parametrize(
    ("content", "flags", "expect"),
    [
        ('{"pool": "llama", "namespace": "serving", "mode": "Aggregated"}', [],
         (Mode.AGGREGATED, "llama", "serving")),
        ('{"pool": "llama", "namespace": "serving", "mode": "Disaggregated"}',
         ["--mode", "aggregated", "--pool", "other"], (Mode.AGGREGATED, "other", "serving")),
        ('{"pool": "llama", "namespace": "serving", "mode": "Mixed"}', [],
         "mode 'Mixed' is not Disaggregated or Aggregated"),
        ("{nope", [], "cannot read it as JSON"),
    ],
    ids=["from file", "flags override", "bad mode", "bad json"],
)
def test_router_config_file_from_the_operator(
    tmp_path: Any, content: str, flags: list[str], expect: Any
) -> None:
    path = tmp_path / "router.json"
    path.write_text(content)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--discover", "kubernetes", "--config", str(path), *flags])
    if isinstance(expect, str):
        with pytest.raises(UsageError, match=expect):
            config_from_args(args)
        return
    config = config_from_args(args)
    assert (config.mode, config.pool, args.namespace) == expect


@dataclass(frozen=True)
class LocalCase:
    id: str
    config: dict[str, Any]
    flags: list[str]
    expect: tuple[float, float, float] | str | None  # (ttft, itl, seed rate), None: off


LOCAL_CASES = [
    LocalCase("the pool's model and SLO",
              {"model": "meta-llama/Llama-3.1-8B-Instruct",
               "slo": {"ttft": {"quantile": 0.9, "seconds": 2.0},
                       "itl": {"quantile": 0.9, "seconds": 0.04}}}, [],
              (2.0, 0.04, lp.PRESETS["llama-3.1-8b/h200"].prefill_tokens_per_s)),
    LocalCase("flags override the file",
              {"model": "meta-llama/Llama-3.1-70B-Instruct"},
              ["--ttft-target", "3", "--prefill-tokens-per-s", "5000"], (3.0, 0.05, 5000.0)),
    LocalCase("a model without a profile: off", {"model": "Qwen/Qwen3-8B"}, [], None),
    LocalCase("a profile named for any model", {"model": "tiny"},
              ["--local-prefill-profile", "llama-3.1-70b-tp2/h200"],
              (1.0, 0.05, lp.PRESETS["llama-3.1-70b-tp2/h200"].prefill_tokens_per_s)),
    LocalCase("switched off", {"model": "meta-llama/Llama-3.1-8B-Instruct"},
              ["--local-prefill", "off"], None),
    LocalCase("a zero target", {"model": "meta-llama/Llama-3.1-8B-Instruct"},
              ["--ttft-target", "0"], "--ttft-target 0.0: must be a positive"),
]


@pytest.mark.parametrize("case", LOCAL_CASES, ids=[c.id for c in LOCAL_CASES])
def test_local_prefill_settings(tmp_path: Any, case: LocalCase) -> None:
    path = tmp_path / "router.json"
    path.write_text(json.dumps({"pool": "p", "namespace": "n"} | case.config))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--discover", "kubernetes", "--config", str(path), *case.flags])
    if isinstance(case.expect, str):
        with pytest.raises(UsageError, match=case.expect):
            config_from_args(args)
        return
    config = config_from_args(args)
    if case.expect is None:
        assert config.local_prefill is None
        return
    policy = config.local_prefill
    assert policy is not None
    assert (policy.ttft_s, policy.itl_s, config.prefill_tokens_per_s) == case.expect


_KEYS = st.sampled_from(["model", "prompt", "messages", "max_tokens", "max_completion_tokens",
                         "stream", "stream_options", "n", "logprobs", "temperature", "seed",
                         "kv_transfer_params", "ignore_eos"])
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 5000), st.text(max_size=20),
                    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))


@given(st.dictionaries(_KEYS, _VALUES, max_size=10))
def test_prefill_generates_one_token_and_decode_keeps_the_request(body: dict[str, Any]) -> None:
    pre = pd.prefill_body(body)
    assert pre["max_tokens"] == 1 and pre["stream"] is False
    assert pre["kv_transfer_params"]["do_remote_decode"] is True
    assert not {"stream_options", "n", "logprobs"} & set(pre)
    assert {k: v for k, v in pre.items() if k not in
            {"max_tokens", "max_completion_tokens", "stream", "kv_transfer_params"}} == \
        {k: v for k, v in body.items() if k not in
         {"max_tokens", "max_completion_tokens", "stream", "kv_transfer_params",
          "stream_options", "n", "logprobs"}}
    params = {"remote_engine_id": "e"}
    dec = pd.decode_body(body, params)
    assert dec == {**body, "kv_transfer_params": params}
