"""Request checks the router makes before the prefill step (pure).

The prefill request is the client's with `max_tokens: 1`, `stream: false` and the
generation-only options left out (pd.prefill_body), so the prefill engine accepts requests
the decode engine then rejects. Each such request used to leave its prompt's KV blocks pinned
on the prefill engine until the KV lease ran out (seen with 40 requests with 30k-token prompts
took a prefill engine's KV usage from 0 to 0.58). The router rejects them up front, with the
message vLLM would give, in OpenAI's error shape.

Checked (disaggregated pools), after lax values were read as vLLM reads them
(lax_params.py): `max_tokens` / `max_completion_tokens` (an integer >= 1),
`n` and `best_of` (1: the decode engine reads the prompt's KV once; several choices would read
blocks the prefill engine has already freed), `min_tokens` (0..max_tokens), `logprobs` and
`top_logprobs` (non-negative or -1; a bool for chat's `logprobs`), `stream` (a bool) and
`stream_options` (only with `stream: true`). Everything else reaches the prefill engine
unchanged, which rejects what it would reject before holding any KV.

Checked in every mode (check_request, too_deep): what the engine would fail on rather than
refuse: a `stream_options` that is not an object (engine-sim broke the stream, counted as
an engine failure: two such requests ejected a healthy engine), and a body nested deeper
than the router can forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True)
class Invalid:
    param: str
    message: str


# vLLM reads -1 as every token of the vocabulary (served where the engine's --max-logprobs is
# -1; refused by the engine otherwise, like any count above its --max-logprobs)
ALL_LOGPROBS = -1


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# orjson reads 1024 levels of arrays and objects but writes only this many (the top-level
# object included): a body between the two was parsed, then failed as it was forwarded
# (a 500).
MAX_DEPTH = 254


def too_deep(raw: bytes, body: Any) -> bool:
    """`body` (parsed from `raw`) nests deeper than the router can forward (MAX_DEPTH)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return False  # too few brackets to nest that deep: no second serialization
    try:
        orjson.dumps(body)  # what the router does to forward it (its "Recursion limit")
    except orjson.JSONEncodeError:
        return True
    return False


def check_request(body: dict[str, Any]) -> Invalid | None:
    """The first parameter an engine would fail on rather than refuse (every mode)."""
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return Invalid("stream_options", 'stream_options must be an object, e.g. '
                       f'{{"include_usage": true}}, got {options!r}')
    return None


def check_disaggregated(body: dict[str, Any], chat: bool) -> Invalid | None:
    """The first parameter the decode engine would reject after the prefill accepted it."""
    max_tokens: int | None = None
    for key in ("max_tokens", "max_completion_tokens", "n", "best_of"):
        value = body.get(key)
        if value is None:
            continue
        if not _int(value) or value < 1:
            return Invalid(key, f"{key} must be an integer of at least 1, got {value!r}")
        if key in ("n", "best_of") and value > 1:
            return Invalid(key, f"{key} > 1 is not supported by a disaggregated pool (the "
                           "decode engine reads the prompt's KV cache once); send "
                           f"{value} requests instead")
        if key.startswith("max"):
            max_tokens = value if max_tokens is None else min(max_tokens, value)
    min_tokens = body.get("min_tokens")
    if min_tokens is not None:
        if not _int(min_tokens) or min_tokens < 0:
            return Invalid("min_tokens", f"min_tokens must be a non-negative integer, got "
                           f"{min_tokens!r}")
        if max_tokens is not None and min_tokens > max_tokens:
            return Invalid("min_tokens", f"min_tokens ({min_tokens}) must be less than or "
                           f"equal to max_tokens ({max_tokens})")
    logprobs = body.get("logprobs")
    if logprobs is not None:
        if chat and not isinstance(logprobs, bool):
            return Invalid("logprobs", f"logprobs must be true or false, got {logprobs!r}")
        if not chat and (not _int(logprobs) or logprobs < ALL_LOGPROBS):
            return Invalid("logprobs", f"logprobs must be a non-negative integer or -1 (every "
                           f"token's), got {logprobs!r}")
    top = body.get("top_logprobs")
    if top is not None and (not _int(top) or top < ALL_LOGPROBS):
        return Invalid("top_logprobs", f"top_logprobs must be a non-negative integer or -1 "
                       f"(every token's), got {top!r}")
    if chat and top and not logprobs:  # (vLLM refuses it at the decode engine, not before)
        return Invalid("top_logprobs", "top_logprobs needs logprobs: true")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        return Invalid("stream", f"stream must be true or false, got {stream!r}")
    if body.get("stream_options") is not None and not stream:
        return Invalid("stream_options", "stream_options can only be given with stream: true")
    if stream and body.get("prompt_logprobs") is not None:
        return Invalid("prompt_logprobs", "prompt_logprobs is not available with stream: true; "
                       "ask without streaming")
    prompts = _batch_size(body.get("prompt"))
    if not chat and prompts > 1:
        # vLLM's prefill answer carries the first prompt's KV only: the others would be lost
        return Invalid("prompt", f"a batch of {prompts} prompts is not supported by a "
                       "disaggregated pool (the prefill engine hands over one prompt's KV "
                       f"cache); send {prompts} requests instead")
    return None


def _batch_size(prompt: Any) -> int:
    """How many prompts `prompt` holds: a list of strings or of token-id lists is a batch."""
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        return len(prompt)
    return 1


# The prompt's token count is an estimate (pd.estimate_prompt_tokens: about 4 characters a
# token); real tokenizers range from about 2 to 8 characters a token on text. So a text
# prompt counts at this fraction of its estimate: the router refuses only what an engine
# would surely refuse, and leaves the close cases to the engine (which counts exactly).
TEXT_ESTIMATE_FLOOR = 0.5


def requested_max_tokens(body: dict[str, Any]) -> int | None:
    """The output tokens the client asked for explicitly (None: the engine's default)."""
    values: list[int] = []
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            values.append(value)
    return min(values) if values else None


def prompt_is_token_ids(body: dict[str, Any]) -> bool:
    prompt = body.get("prompt")
    return ("messages" not in body and isinstance(prompt, list) and bool(prompt)
            and all(_int(t) for t in prompt))


def check_length(body: dict[str, Any], prompt_tokens: int,
                 max_model_len: int | None) -> Invalid | None:
    """`prompt + max_tokens > max_model_len`, refused before any engine work (a prefill
    engine would otherwise compute the whole prompt for a decode that cannot run). Only when
    the pool's max_model_len is known, and only when even the low end of the estimate of
    the prompt exceeds it (token-id prompts count exactly)."""
    max_tokens = requested_max_tokens(body)
    if max_model_len is None or max_tokens is None:
        return None
    exact = prompt_is_token_ids(body)
    floor = prompt_tokens if exact else int(prompt_tokens * TEXT_ESTIMATE_FLOOR)
    if floor + max_tokens <= max_model_len:
        return None
    key = "max_tokens" if "max_tokens" in body else "max_completion_tokens"
    counted = (f"{prompt_tokens} in the prompt" if exact else
               f"at least {floor} in the prompt (estimated)")
    return Invalid(key, f"This model's maximum context length is {max_model_len} tokens. "
                   f"However, you requested {floor + max_tokens} tokens ({counted}, "
                   f"{max_tokens} in the completion). Please reduce the length of the prompt "
                   f"or the completion.")


def max_model_len_of(models: Any) -> int | None:
    """The smallest `data[].max_model_len` in a `GET /v1/models` answer (vLLM's shape)."""
    if not isinstance(models, dict) or not isinstance(models.get("data"), list):
        return None
    lens = [m["max_model_len"] for m in models["data"]
            if isinstance(m, dict) and _int(m.get("max_model_len")) and m["max_model_len"] > 0]
    return min(lens) if lens else None
