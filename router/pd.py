"""The disaggregated request flow, as pure transformations of OpenAI request bodies.

1. Prefill: the client's request with `max_tokens: 1`, `stream: false` and
   `kv_transfer_params: {"do_remote_decode": true}`; the prefill engine computes the prompt's
   KV, keeps it for pickup and answers with `kv_transfer_params` describing where it is.
2. Decode: the client's original request plus those `kv_transfer_params`; the decode engine
   pulls the KV (NIXL) or loads it (shared-storage connectors) instead of recomputing it,
   then generates, streaming if the client asked to.
"""

from __future__ import annotations

from typing import Any

import orjson

# Options that would make the prefill engine generate more than the one token it must.
_PREFILL_DROP = ("stream_options", "n", "best_of", "logprobs", "top_logprobs", "min_tokens")


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill request for a client request (the client's body is not modified)."""
    # A new top level; nested values are shared, never modified, and serialized at once.
    out = {k: v for k, v in body.items() if k not in _PREFILL_DROP}
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in body:
        out["max_completion_tokens"] = 1
    out["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    return out


def decode_body(body: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
    """The decode request: the client's request with the prefill's transfer parameters."""
    out = dict(body)
    if kv_transfer_params is not None:
        out["kv_transfer_params"] = kv_transfer_params
    else:
        # Shared-storage connectors find the KV by prompt, without parameters.
        out.pop("kv_transfer_params", None)
    return out


def release_body(body: dict[str, Any], kv_transfer_params: dict[str, Any]) -> dict[str, Any]:
    """A one-token decode that reads a prefill's KV only so the prefill engine frees it."""
    out = prefill_body(body)
    out["kv_transfer_params"] = kv_transfer_params
    return out


def local_body(body: dict[str, Any]) -> dict[str, Any]:
    """The request for a decode engine that prefills it itself: the client's request without
    KV transfer parameters."""
    return {k: v for k, v in body.items() if k != "kv_transfer_params"}


def kv_params_from_prefill(response: dict[str, Any]) -> dict[str, Any] | None:
    params = response.get("kv_transfer_params")
    return params if isinstance(params, dict) else None


CHARS_PER_TOKEN = 4  # English text through a Llama-3-class tokenizer, roughly


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """A cheap token estimate (about 4 characters a token) for load balancing only."""
    text: str | bytes
    if "messages" in body:
        text = orjson.dumps(body.get("messages"))
    else:
        prompt = body.get("prompt", "")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            return len(prompt)  # already token ids
        text = prompt if isinstance(prompt, str) else orjson.dumps(prompt)
    return max(1, len(text) // CHARS_PER_TOKEN)


def requested_output_tokens(body: dict[str, Any], default: int = 256) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return default
