"""Precise prefix routing on real vLLM-CPU: two aggregated engines publish their KV events
(`poolpilot launch --kv-events-port`), the router (`--prefix-routing precise`) subscribes to
both; a request sharing a long prefix with an earlier one goes to the engine that holds it
(whose own prefix-cache hit counter rises), and its greedy output is what a cold engine gives.

The earlier requests go to an engine directly, never through the router, so only the
engine's events can tell the router where the prefix is: the first before the router starts
(the router learns it from the replay on connect), the second while it runs (live events).
Pods publish on the same ports at their own IPs; these two engines share a host, so each has
ports of its own and the router is told them (`--kv-events-ports URL=PORT:REPLAY_PORT`).
Budget (2 cores): the adapter tier's two shared engines (tests/adapter/conftest.py: started
with --kv-events-port and --kv-replay-port, each pinned to a core), used by other modules too;
none of them sends these prompts (their words are this module's own).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from router_support import (
    FAST,
    Proc,
    SharedEngine,
    SharedEngines,
    metric_value,
    running,
    start_router,
    vllm_available,
    wait_until,
)

pytestmark = [
    pytest.mark.adapter,
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="no vLLM venv: run ./dev setup-vllm"),
]

SERVED = "tiny-llama"
BLOCK = 128  # vLLM's block size on CPU
SHARED_BLOCKS = 3  # the shared prefix covers at least this many full blocks
MAX_TOKENS = 8
HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
BLOCKS = "poolpilot_router_kv_events_blocks"
EXPECTED_HITS = "poolpilot_router_prefix_expected_hit_tokens_total"
CHOICES = "poolpilot_router_prefix_choices_total"


# The adapter tier's shared engines (tests/adapter/conftest.py) publish their KV events.
Engine = SharedEngine


def words(seed: str, n: int) -> str:
    vocab = ["prefill", "decode", "cache", "token", "engine", "router", "pool", "request",
             "stream", "batch", "queue", "block"]
    return " ".join(f"{vocab[(i * 5 + len(seed)) % len(vocab)]}{i % 7}" for i in range(n))


@dataclass(frozen=True)
class Request:
    chat: bool
    shared: str  # the long prefix (a system prompt for chat)
    tail: str

    def body(self) -> dict[str, object]:
        body: dict[str, object] = {"model": SERVED, "max_tokens": MAX_TOKENS,
                                   "temperature": 0, "ignore_eos": True}
        if self.chat:
            body["messages"] = [{"role": "system", "content": self.shared},
                                {"role": "user", "content": self.tail}]
        else:
            body["prompt"] = f"{self.shared} {self.tail}"
        return body

    def send(self, base: str) -> str:
        path = "/v1/chat/completions" if self.chat else "/v1/completions"
        resp = httpx.post(base + path, json=self.body(), timeout=120)
        assert resp.status_code == 200, resp.text
        choice = resp.json()["choices"][0]
        usage = resp.json()["usage"]
        assert SHARED_BLOCKS * BLOCK < usage["prompt_tokens"] <= 512 - MAX_TOKENS, usage
        return str(choice["message"]["content"] if self.chat else choice["text"])


@dataclass
class Pool:
    a: Engine
    b: Engine
    router: Proc

    def router_metric(self, name: str, engine: Engine) -> float:
        page = httpx.get(self.router.url + "/metrics", timeout=10).text
        return metric_value(page, name, {"endpoint": engine.url})

    def indexed_blocks(self, engine: Engine) -> float:
        return self.router_metric(BLOCKS, engine)

    def expected_hits(self, engine: Engine) -> float:
        return self.router_metric(EXPECTED_HITS, engine)

    def prefix_choices(self) -> float:
        page = httpx.get(self.router.url + "/metrics", timeout=10).text
        return metric_value(page, CHOICES, {"reason": "prefix"})


@pytest.fixture(scope="module")
def pool(shared_vllm: SharedEngines) -> Iterator[Pool]:
    a, b = shared_vllm.get(0, 1)
    # Held by b before the router exists: it must learn this from b's replay.
    FIRST_B.send(b.url)
    args = ["--engine", f"{a.url},{b.url}", "--pool", "tiny", "--prefix-routing",
            "precise", *FAST]
    for e in (a, b):
        args += ["--kv-events-ports", f"{e.url}={e.events_port}:{e.replay_port}"]
    with running(start_router(*args)) as (router,):
        yield Pool(a, b, router)


PREFIX_B, PREFIX_A = words("bravo", 205), words("alpha-chat", 205)
FIRST_B = Request(chat=False, shared=PREFIX_B, tail=words("one", 12))
FIRST_A = Request(chat=True, shared=PREFIX_A, tail=words("two", 12))


@dataclass(frozen=True)
class Case:
    id: str
    holder: str  # "a" or "b": the engine the earlier request went to
    earlier: Request | None  # sent to the holder directly during the test (None: before)
    request: Request  # through the router: shares the earlier one's prefix


CASES = [
    Case("completion-prefix-learnt-from-the-replay", "b", None,
         Request(chat=False, shared=PREFIX_B, tail=words("three", 15))),
    Case("chat-prefix-learnt-from-live-events", "a", FIRST_A,
         Request(chat=True, shared=PREFIX_A, tail=words("four", 15))),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_shared_prefix_goes_to_the_engine_holding_it(pool: Pool, case: Case) -> None:
    holder, other = (pool.a, pool.b) if case.holder == "a" else (pool.b, pool.a)
    held = pool.indexed_blocks(holder)
    if case.earlier is not None:
        case.earlier.send(holder.url)
    # The router has the holder's blocks from its events (replayed, or live).
    wait_until(lambda: pool.indexed_blocks(holder) >= held + SHARED_BLOCKS, 30,
               f"the router to index {holder.url}'s blocks")
    hits, other_queries = holder.metric(HITS), other.metric(QUERIES)
    expected, by_prefix = pool.expected_hits(holder), pool.prefix_choices()

    out = case.request.send(pool.router.url)

    assert holder.metric(HITS) - hits >= SHARED_BLOCKS * BLOCK  # served from its cache
    # ... as the router expected: it chose the engine for its prefix, not by load.
    assert pool.expected_hits(holder) - expected >= SHARED_BLOCKS * BLOCK
    assert pool.prefix_choices() == by_prefix + 1
    assert other.metric(QUERIES) == other_queries  # the other engine never saw it
    # Greedy output as a cold engine computes it: the other one has none of this prefix.
    other_hits = other.metric(HITS)
    assert case.request.send(other.url) == out
    assert other.metric(HITS) == other_hits
    assert len(out) > 0

