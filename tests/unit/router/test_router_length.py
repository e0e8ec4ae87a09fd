"""The context-length check the router makes before any engine work (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.router import pd
from poolpilot.router.validate import check_length, max_model_len_of


@dataclass(frozen=True)
class LengthCase:
    id: str
    body: dict[str, Any]
    max_model_len: int | None
    refused: bool


CASES = [
    LengthCase("unknown-limit-never-refuses", {"prompt": "x", "max_tokens": 10**12}, None,
               False),
    LengthCase("absurd-max-tokens", {"prompt": "hello", "max_tokens": 10**12}, 4096, True),
    LengthCase("no-max-tokens-is-the-engine-default", {"prompt": "x" * 100_000}, 4096, False),
    LengthCase("token-ids-count-exactly-over", {"prompt": [1] * 4000, "max_tokens": 97}, 4096,
               True),
    LengthCase("token-ids-count-exactly-fits", {"prompt": [1] * 4000, "max_tokens": 96}, 4096,
               False),
    # 4,000 characters estimate 1,000 tokens; a tokenizer may see as few as 500.
    LengthCase("text-near-the-limit-is-left-to-the-engine",
               {"prompt": "abcd" * 1000, "max_tokens": 3500}, 4096, False),
    LengthCase("text-clearly-over", {"prompt": "abcd" * 30_000, "max_tokens": 100}, 4096, True),
    LengthCase("chat-max-completion-tokens",
               {"messages": [{"role": "user", "content": "hi"}],
                "max_completion_tokens": 5000}, 4096, True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_check_length(case: LengthCase) -> None:
    bad = check_length(case.body, pd.estimate_prompt_tokens(case.body), case.max_model_len)
    assert (bad is not None) == case.refused
    if bad is not None:
        assert str(case.max_model_len) in bad.message  # both numbers named
        assert "in the completion" in bad.message
        assert bad.param in ("max_tokens", "max_completion_tokens")


@given(st.integers(1, 10**6), st.integers(1, 10**6), st.integers(1, 10**6))
def test_exact_prompts_are_refused_exactly_when_they_do_not_fit(
        prompt: int, max_tokens: int, limit: int) -> None:
    body = {"prompt": [7] * min(prompt, 2000), "max_tokens": max_tokens}
    n = len(body["prompt"])
    assert (check_length(body, n, limit) is not None) == (n + max_tokens > limit)


@pytest.mark.parametrize(("models", "expected"), [
    ({"data": [{"id": "m", "max_model_len": 8192}]}, 8192),
    ({"data": [{"id": "a", "max_model_len": 8192}, {"id": "b", "max_model_len": 4096}]}, 4096),
    ({"data": [{"id": "m"}]}, None),
    ({"data": [{"id": "m", "max_model_len": "8192"}]}, None),
    ({"data": [{"id": "m", "max_model_len": True}]}, None),
    ({"data": "nope"}, None),
    ([], None),
], ids=["one", "smallest", "absent", "string", "bool", "bad-data", "not-object"])
def test_max_model_len_of(models: Any, expected: int | None) -> None:
    assert max_model_len_of(models) == expected
