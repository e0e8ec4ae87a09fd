"""Prefix-aware selection: the approximate prefix source and the bounded-load choice. Pure.

**The approximate source** (`ApproximateIndex`, a `PrefixSource`): the router's own record of
which prompts it sent where. A prompt's text is cut into chunks of `CHUNK_CHARS` (128) UTF-8
bytes and hashed in a chain (key i = blake2b-64 of chunk i keyed by key i - 1; the first is
keyed by the request kind, the model and any tools), so key i stands for the prompt's first
i + 1 chunks. At about 4 characters a token (the router's estimate, `pd.CHARS_PER_TOKEN`) a
chunk is `BLOCK_TOKENS` (32) prompt tokens: fine enough that a prompt loses under 32 tokens of
its shared prefix, coarse enough that a 30k-character prompt costs ~240 hash calls.
- completions: the prompt string; a prompt of token ids is chunked by 32 ids; a batch of
  prompts by its JSON.
- chat: the messages in order, each as its role, then its content (a part's text, or the JSON
  of a non-text part), then its name, tool calls and tool call id; so a conversation's next
  turn (the same messages plus the answer and a new question) starts with the previous turn's
  keys.
Only full chunks have keys. The index maps key -> {url: (last sent, the url's epoch)}, bounded
by an LRU over keys (`max_entries`) and a time to live (`ttl_s`: older entries count as gone,
the engine has likely evicted them). A prompt's keys are touched last to first, so an earlier
key is never evicted before a later one of the same chain, and an endpoint's held keys of a
prompt are always a leading run: `matched_blocks` binary-searches it. `forget(url)` bumps the
url's epoch (O(1)); entries of older epochs count as gone and are dropped as they are met.

**The selection** (`choose`, plain numbers, used by the router and the discrete-event
simulator alike): consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam,
2018), applied to the router's load measure. Given each candidate's load (outstanding work in
the balancer's units: requests in flight + engine queue + tokens in flight / 512) and the
prompt tokens it is expected to hold:
1. No candidate holds any of the prompt: least loaded, (load + 1) / ramp weight, ties rotating
   (exactly `Balancer.pick`).
2. Otherwise only candidates within the bound may take it, on the candidates' `requests`
   where given (the balancer's requests in flight + engine queue; else on the load):
   `requests + 1 <= max(balance x mean, mean + 1)`, mean = the role's mean of requests + 1
   (balance `c`, 1.25 by default). Requests, not tokens: one long prompt in flight makes an
   engine no hot spot, and bounded on tokens a conversation's engine busy with another's 4k
   prompt (1 + 8) would be refused by three idle ones and its history recomputed elsewhere;
   the work it would wait behind is step 3's to weigh. This is the paper's bound (no endpoint
   above c times the mean once the request is placed), with two adaptations to a continuous
   count: it is taken on requests + 1
   (each endpoint's next request counted), so the least-loaded endpoint always qualifies and
   there is always a choice; and it never allows less than one request above the mean, the
   role the paper's ceiling plays for whole requests. Without that an almost idle pool would
   refuse a conversation's engine for having one request in flight while the others have
   none (with 4 endpoints, c x mean = 1.56 < 2), throwing the cache away where no hot spot can
   form. Under load, c x mean is the bound.
3. Among those, the least expected work: `(load + 1 + uncached tokens / tokens_per_load) /
   weight`, where uncached = prompt tokens - held tokens. A prefix is worth as much as the
   prefill it saves, counted in the same units as the queue it would wait behind.
The `Choice` says why: `prefix` (an endpoint holding part of the prompt), `load` (holders were
busier than their prefix saves), `bound` (a holder that would have been cheaper was over the
bound: the hot-spot guard acted), `no_match`.
"""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

import orjson
from poolpilot.router.pd import CHARS_PER_TOKEN
from poolpilot.router.prefix_source import PromptKeys

CHUNK_CHARS = 128
BLOCK_TOKENS = CHUNK_CHARS // CHARS_PER_TOKEN
DEFAULT_MAX_ENTRIES = 131072  # keys: ~4M prompt tokens of prefixes, ~45 MB (measured)
DEFAULT_TTL_S = 300.0
DEFAULT_BALANCE = 1.25

# Engines with a CPU offload tier hold more than GPU caches: the record grows by their offload
# at an 8B model's KV size (128 KiB a token), within a bound that keeps it (~300 bytes a key)
# well inside the router's default memory limit. The operator and the bench size it alike.
OFFLOAD_KV_BYTES_PER_TOKEN = 128 * 1024
MAX_OFFLOAD_ENTRIES = 2**21


def entries_for_offload(offload_bytes: float) -> int:
    """The record's keys for engines whose offload tiers hold `offload_bytes` in all."""
    keys = math.ceil(offload_bytes / OFFLOAD_KV_BYTES_PER_TOKEN / BLOCK_TOKENS)
    return min(MAX_OFFLOAD_ENTRIES, DEFAULT_MAX_ENTRIES + keys)

PREFIX = "prefix"
LOAD = "load"
BOUND = "bound"
NO_MATCH = "no_match"

# Prompt tokens that weigh as one request in the balancer's load (BalancerConfig
# .tokens_per_request's default): an 8k-token prompt weighs as 16 short requests.
TOKENS_PER_LOAD = 512.0


# -- prompt keys -------------------------------------------------------------------------------


def _seed(kind: bytes, body: dict[str, Any]) -> bytes:
    """The first chunk's key: requests for another model (a LoRA adapter is one) or with other
    tools (the chat template renders them first) share no prefix."""
    extra = orjson.dumps([body.get("model"), body.get("tools")]) if "tools" in body \
        else str(body.get("model")).encode()
    return blake2b(kind + b"\0" + extra, digest_size=16).digest()


def chain(data: bytes, seed: bytes, step: int) -> tuple[int, ...]:
    """Keys of `data`'s full `step`-byte chunks, each hashed keyed by the one before."""
    keys = []
    prev = seed
    view = memoryview(data)
    from_bytes = int.from_bytes
    for end in range(step, len(data) + 1, step):
        prev = blake2b(view[end - step : end], digest_size=8, key=prev).digest()
        keys.append(from_bytes(prev, "little"))
    return tuple(keys)


def chat_text(messages: list[Any]) -> str | None:
    """The canonical serialization of chat messages (None: not a list of message objects)."""
    parts: list[str] = []
    for m in messages:
        if not isinstance(m, dict):
            return None
        parts.append(f"\x1e{m.get('role')}\x1f")
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for p in content:
                if isinstance(p, dict) and p.get("type") == "text":
                    parts.append(str(p.get("text", "")))
                else:
                    parts.append(orjson.dumps(p).decode())
        elif content is not None:
            parts.append(orjson.dumps(content).decode())
        for extra in ("name", "tool_calls", "tool_call_id"):
            if extra in m:
                parts.append(f"\x1f{extra}\x1f" + orjson.dumps(m[extra]).decode())
    return "".join(parts)


def prompt_keys(path: str, body: dict[str, Any],
                chunk_chars: int = CHUNK_CHARS) -> PromptKeys | None:
    """A request's prompt as chained chunk keys; None when it has no prompt to key."""
    block_tokens = max(1, chunk_chars // CHARS_PER_TOKEN)
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        text = chat_text(messages) if isinstance(messages, list) else None
        if text is None:
            return None
        return PromptKeys(chain(text.encode(), _seed(b"chat", body), chunk_chars), block_tokens)
    prompt = body.get("prompt")
    seed = _seed(b"completions", body)
    if isinstance(prompt, str):
        return PromptKeys(chain(prompt.encode(), seed, chunk_chars), block_tokens)
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        try:
            ids = array("I", prompt).tobytes()
        except OverflowError:
            return None
        return PromptKeys(chain(ids, seed, block_tokens * 4), block_tokens)
    if isinstance(prompt, list) and prompt:
        return PromptKeys(chain(orjson.dumps(prompt), seed, chunk_chars), block_tokens)
    return None


# -- the index ---------------------------------------------------------------------------------


class ApproximateIndex:
    """Where the router sent which prompt blocks (a `PrefixSource`); see the module doc."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, ttl_s: float = DEFAULT_TTL_S,
                 chunk_chars: int = CHUNK_CHARS) -> None:
        if max_entries < 1 or not ttl_s > 0 or chunk_chars < CHARS_PER_TOKEN:
            raise ValueError(f"max_entries {max_entries} must be >= 1, ttl_s {ttl_s} > 0, "
                             f"chunk_chars {chunk_chars} >= {CHARS_PER_TOKEN}")
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.chunk_chars = chunk_chars
        # key -> url -> (last sent, the url's epoch then); ordered least recently used first
        self._keys: OrderedDict[int, dict[str, tuple[float, int]]] = OrderedDict()
        self._epochs: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._keys)

    async def prompt_keys(self, path: str, body: dict[str, Any]) -> PromptKeys | None:
        return prompt_keys(path, body, self.chunk_chars)

    def _holds(self, key: int, url: str, epoch: int, oldest: float) -> bool:
        holders = self._keys.get(key)
        if holders is None:
            return False
        entry = holders.get(url)
        return entry is not None and entry[1] == epoch and entry[0] >= oldest

    def matched_blocks(self, prompt: PromptKeys, urls: Sequence[str], now: float) -> list[int]:
        keys = prompt.keys
        oldest = now - self.ttl_s
        out = []
        for url in urls:
            epoch = self._epochs.get(url, 0)
            lo, hi = 0, len(keys)  # held: a leading run; find its length
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._holds(keys[mid - 1], url, epoch, oldest):
                    lo = mid
                else:
                    hi = mid - 1
            out.append(lo)
        return out

    def record(self, prompt: PromptKeys, url: str, now: float) -> None:
        entry = (now, self._epochs.get(url, 0))
        table = self._keys
        for key in reversed(prompt.keys):  # last to first: earlier keys stay more recent
            holders = table.get(key)
            if holders is None:
                table[key] = {url: entry}
            else:
                holders[url] = entry
                table.move_to_end(key)
        while len(table) > self.max_entries:
            table.popitem(last=False)
        self._expire(now)

    def _expire(self, now: float, budget: int = 8) -> None:
        """Drop a few of the least recently used keys whose every entry is past its TTL or
        forgotten (amortized: each record call does a little)."""
        oldest = now - self.ttl_s
        table = self._keys
        for _ in range(budget):
            if not table:
                return
            key, holders = next(iter(table.items()))
            if any(seen >= oldest and epoch == self._epochs.get(url, 0)
                   for url, (seen, epoch) in holders.items()):
                return
            del table[key]

    def forget(self, url: str) -> None:
        self._epochs[url] = self._epochs.get(url, 0) + 1


# -- the bounded-load choice -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Choice:
    index: int  # into the candidates
    reason: str  # PREFIX, LOAD, BOUND or NO_MATCH
    matched_tokens: int  # prompt tokens the chosen endpoint is expected to hold


def least_loaded(loads: Sequence[float], weights: Sequence[float] | None = None,
                 turn: int = 0) -> int:
    """`Balancer.pick`'s rule: the lowest (load + 1) / weight; ties rotate by `turn`."""
    scores = [(load + 1) / (1.0 if weights is None else weights[i])
              for i, load in enumerate(loads)]
    best = min(scores)
    ties = [i for i, s in enumerate(scores) if s <= best + 1e-9]
    return ties[turn % len(ties)]


def load_cap(loads: Sequence[float], balance: float = DEFAULT_BALANCE) -> float:
    """The most load + 1 a candidate may have to take one more request for its prefix
    (`loads`: what the bound is taken on, the requests where `choose` has them)."""
    mean = (math.fsum(loads) + len(loads)) / len(loads)  # of load + 1
    return max(balance * mean, mean + 1)


def within_bound(loads: Sequence[float], balance: float = DEFAULT_BALANCE) -> list[bool]:
    """Per candidate: may it take one more request for its prefix?"""
    cap = load_cap(loads, balance)
    return [load + 1 <= cap + 1e-9 for load in loads]


def choose(
    loads: Sequence[float],
    matched_tokens: Sequence[int],
    prompt_tokens: int,
    *,
    weights: Sequence[float] | None = None,
    tokens_per_load: float = TOKENS_PER_LOAD,
    balance: float = DEFAULT_BALANCE,
    turn: int = 0,
    requests: Sequence[float] | None = None,
) -> Choice:
    """Pick one of the candidates (see the module doc); `loads`, `matched_tokens` and
    `weights` (ramp-in, default 1) are per candidate, at least one."""
    n = len(loads)
    if n == 0 or len(matched_tokens) != n or any(
            v is not None and len(v) != n for v in (weights, requests)):
        raise ValueError("choose needs one load, matched count (and weight, request count) "
                         "per candidate")
    if max(matched_tokens) <= 0:
        return Choice(least_loaded(loads, weights, turn), NO_MATCH, 0)
    ok = within_bound(loads if requests is None else requests, balance)

    def work(i: int) -> float:
        uncached = max(0, prompt_tokens - matched_tokens[i])
        w = 1.0 if weights is None else weights[i]
        return (loads[i] + 1 + uncached / tokens_per_load) / w

    scores = [work(i) for i in range(n)]
    allowed = [i for i in range(n) if ok[i]]
    best = min(scores[i] for i in allowed)
    ties = [i for i in allowed if scores[i] <= best + 1e-9]
    pick = ties[turn % len(ties)]
    held = max(0, min(matched_tokens[pick], prompt_tokens))
    unbounded = min(range(n), key=lambda i: (scores[i], -matched_tokens[i]))
    if not ok[unbounded] and scores[unbounded] < best - 1e-9 \
            and matched_tokens[unbounded] > matched_tokens[pick]:
        reason = BOUND
    elif held > 0:
        reason = PREFIX
    else:
        reason = LOAD
    return Choice(pick, reason, held)
