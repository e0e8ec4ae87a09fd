"""vLLM's OpenAI-compatible wire format, for the simulator: parsing, token counts, responses.

Token counts: a text is split into words and punctuation marks (regex `\\w+|[^\\w\\s]`), one
token each, plus one BOS token for a completion prompt; a token-id list counts its ids. A chat
adds Llama-3-like template tokens: 1 BOS + per message (4 header tokens + its content) + 3 for
the assistant header. Generated text is made of words that count as one token each under the
same rule, so re-counting an output gives its completion_tokens.

Token ids (for the prefix cache's block hashes): a word's id is a CRC-32 of it; BOS and the
chat template's header and end-of-turn tokens have ids of their own, so the ids a chat hashes
are the sequence the template gives (order of messages and roles included).
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
WORDS = (
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with",
    "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but",
    "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her",
    "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no",
)


class BadRequest(ValueError):
    """Maps to an HTTP error with vLLM's JSON body."""

    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(str(self), self.status, self.err_type, self.param)


def error_body(message: str, status: int, err_type: str = "BadRequestError",
               param: str | None = None) -> dict[str, Any]:
    """vLLM's ErrorResponse: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def count_text_tokens(text: str) -> int:
    return len(_TOKEN_RE.findall(text))


# Special tokens (ids no word gets: word ids are CRC-32s, >= 0).
BOS_ID, HEADER_START_ID, HEADER_END_ID, EOT_ID = -1, -2, -3, -4


@functools.lru_cache(maxsize=65536)
def _word_id(word: str) -> int:
    return zlib.crc32(word.encode())


def text_token_ids(text: str) -> list[int]:
    return [_word_id(w) for w in _TOKEN_RE.findall(text)]


def prompt_token_ids(prompt: Any) -> list[int]:
    """The token ids of a completion prompt (as many as prompt_tokens counts)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return [BOS_ID, *text_token_ids(prompt)]
    return [int(t) for t in prompt]


def _content(msg: dict[str, Any]) -> str:
    content = msg.get("content") or ""
    if isinstance(content, list):  # content parts: the text ones
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def chat_token_ids(messages: list[dict[str, Any]]) -> list[int]:
    """The token ids the chat template gives (as many as chat_tokens counts): BOS, then per
    message a header (start, role, end), its content and end-of-turn, then the assistant's
    header."""
    ids = [BOS_ID]
    for msg in messages:
        ids += [HEADER_START_ID, _word_id(str(msg.get("role"))), HEADER_END_ID]
        ids += text_token_ids(_content(msg))
        ids.append(EOT_ID)
    ids += [HEADER_START_ID, _word_id("assistant"), HEADER_END_ID]
    return ids


def prompt_tokens(prompt: Any) -> tuple[int, str]:
    """(token count, a key for deterministic output) of a completion prompt."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return 1 + count_text_tokens(prompt), prompt[:256]
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                        for t in prompt):
        if not prompt:
            raise BadRequest("prompt must not be empty", param="prompt")
        return len(prompt), ",".join(map(str, prompt[:64]))
    if isinstance(prompt, list):
        raise BadRequest("the simulator serves one prompt per request: send a string or a list "
                         "of token ids", param="prompt")
    raise BadRequest("prompt must be a string or a list of token ids", param="prompt")


def chat_tokens(messages: Any) -> tuple[int, str]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    n = 1 + 3
    key = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or "role" not in msg:
            raise BadRequest(f"messages[{i}] must be an object with a role", param="messages")
        content = _content(msg)
        n += 4 + count_text_tokens(content)
        key.append(content[:64])
    return n, "|".join(key)


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    output_tokens: int  # what will be generated
    finish_reason: str  # "length" or "stop"


def plan_output(body: dict[str, Any], prompt_n: int, max_model_len: int, chat: bool,
                key: str, mean_output: float, seed: int) -> Sampling:
    """How many tokens to generate: max_tokens, or a deterministic 'EOS' before it unless
    ignore_eos (a geometric-like length with the given mean, seeded by the prompt)."""
    raw = body.get("max_completion_tokens") if chat else None
    if raw is None:
        raw = body.get("max_tokens")
    if raw is None:
        raw = max(1, max_model_len - prompt_n) if chat else 16
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise BadRequest("max_tokens must be an integer >= 1", param="max_tokens")
    n = body.get("n", 1)
    if n != 1:
        raise BadRequest("the simulator supports n=1 only", param="n")
    min_tokens = body.get("min_tokens", 0) or 0
    if body.get("ignore_eos", False):
        return Sampling(raw, raw, "length")
    digest = hashlib.sha256(f"{seed}:{prompt_n}:{key}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    natural = max(1, int(rng.expovariate(1.0 / mean_output)) + 1, int(min_tokens))
    if natural >= raw:
        return Sampling(raw, raw, "length")
    return Sampling(raw, natural, "stop")


def token_text(key: str, start: int, count: int) -> str:
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big")
    return "".join(" " + WORDS[(h + i * 7) % len(WORDS)] for i in range(start, start + count))


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def usage(prompt_n: int, completion_n: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_n, "total_tokens": prompt_n + completion_n,
            "completion_tokens": completion_n, "prompt_tokens_details": None}


def completion_response(rid: str, model: str, text: str, finish: str, prompt_n: int,
                        completion_n: int, kv: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                     "stop_reason": None, "prompt_logprobs": None}],
        "usage": usage(prompt_n, completion_n), "service_tier": None,
        "system_fingerprint": None, "kv_transfer_params": kv,
    }


def chat_response(rid: str, model: str, text: str, finish: str, prompt_n: int,
                  completion_n: int, kv: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0,
                     "message": {"role": "assistant", "content": text, "refusal": None,
                                 "annotations": None, "audio": None, "function_call": None,
                                 "tool_calls": [], "reasoning_content": None},
                     "logprobs": None, "finish_reason": finish, "stop_reason": None}],
        "service_tier": None, "system_fingerprint": None,
        "usage": usage(prompt_n, completion_n), "prompt_logprobs": None,
        "kv_transfer_params": kv,
    }


def completion_chunk(rid: str, model: str, created: int, text: str,
                     finish: str | None) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                         "stop_reason": None}]}


def chat_chunk(rid: str, model: str, created: int, delta: dict[str, Any],
               finish: str | None) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": finish}]}
