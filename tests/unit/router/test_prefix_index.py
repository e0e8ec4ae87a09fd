"""Prefix-aware selection: the approximate source (chunk keys, LRU, TTL, forget) and the
bounded-load choice (table and properties)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.router.balancer import Balancer, BalancerConfig
from poolpilot.router.prefix_index import (
    BLOCK_TOKENS,
    BOUND,
    CHUNK_CHARS,
    LOAD,
    NO_MATCH,
    PREFIX,
    ApproximateIndex,
    choose,
    least_loaded,
    load_cap,
    prompt_keys,
    within_bound,
)
from poolpilot.router.prefix_source import PrefixSource, PromptKeys

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
SYSTEM = "You are a careful assistant. " * 40  # ~1,100 characters: 8 full chunks


def chat(*messages: tuple[str, str], model: str = "m", **extra: object) -> dict[str, object]:
    return {"model": model, "messages": [{"role": r, "content": c} for r, c in messages],
            **extra}


def keys(path: str, body: dict[str, object]) -> tuple[int, ...]:
    got = prompt_keys(path, body)
    assert got is not None
    return got.keys


def shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# -- prompt keys -------------------------------------------------------------------------------


def test_a_conversations_next_turn_starts_with_the_previous_turns_keys() -> None:
    turn1 = chat(("system", SYSTEM), ("user", "What is a KV cache? " * 10))
    turn2 = chat(("system", SYSTEM), ("user", "What is a KV cache? " * 10),
                 ("assistant", "It keeps attention keys and values. " * 10),
                 ("user", "And prefix caching?"))
    k1, k2 = keys(CHAT, turn1), keys(CHAT, turn2)
    assert len(k2) > len(k1) > 8
    assert k2[: len(k1)] == k1


@dataclass(frozen=True)
class KeyCase:
    id: str
    a: dict[str, object]
    b: dict[str, object]
    path: str = CHAT
    shared_chunks: int | None = None  # None: at least one and not all
    none: bool = False


PROMPT = "The quick brown fox jumps over the lazy dog. " * 30  # 1,350 characters
KEY_CASES = [
    KeyCase("same system prompt, other questions share the system prompt",
            chat(("system", SYSTEM), ("user", "a" * 300)),
            chat(("system", SYSTEM), ("user", "b" * 300))),
    KeyCase("another model shares nothing", chat(("user", SYSTEM)),
            chat(("user", SYSTEM), model="other"), shared_chunks=0),
    KeyCase("other tools share nothing", chat(("user", SYSTEM), tools=[{"a": 1}]),
            chat(("user", SYSTEM), tools=[{"b": 1}]), shared_chunks=0),
    KeyCase("role matters", chat(("user", SYSTEM)), chat(("system", SYSTEM)), shared_chunks=0),
    KeyCase("text parts key like a string",
            chat(("user", SYSTEM)),
            {"model": "m", "messages": [{"role": "user", "content": [
                {"type": "text", "text": SYSTEM[:500]}, {"type": "text", "text": SYSTEM[500:]}]}]},
            shared_chunks=len(SYSTEM) // CHUNK_CHARS),
    KeyCase("completions: a shared prefix", {"model": "m", "prompt": PROMPT + "one"},
            {"model": "m", "prompt": PROMPT + "two"}, path=COMPLETIONS,
            shared_chunks=len(PROMPT) // CHUNK_CHARS),
    KeyCase("completions: token ids chunked by block",
            {"model": "m", "prompt": list(range(100))},
            {"model": "m", "prompt": [*range(70), 7, 7, 7]}, path=COMPLETIONS,
            shared_chunks=70 // BLOCK_TOKENS),
    KeyCase("a batch of prompts keys by its JSON", {"model": "m", "prompt": [PROMPT, "x" * 200]},
            {"model": "m", "prompt": [PROMPT, "y" * 200]}, path=COMPLETIONS),
    KeyCase("no messages: nothing to key", {"model": "m", "messages": "hi"}, {}, none=True),
    KeyCase("no prompt: nothing to key", {"model": "m"}, {}, path=COMPLETIONS, none=True),
    KeyCase("negative token ids: nothing to key", {"model": "m", "prompt": [-1] * 64}, {},
            path=COMPLETIONS, none=True),
]


@pytest.mark.parametrize("case", KEY_CASES, ids=[c.id for c in KEY_CASES])
def test_prompt_keys(case: KeyCase) -> None:
    if case.none:
        assert prompt_keys(case.path, case.a) is None
        return
    a, b = keys(case.path, case.a), keys(case.path, case.b)
    n = shared(a, b)
    if case.shared_chunks is None:
        assert 0 < n < max(len(a), len(b))
    else:
        assert n == case.shared_chunks


def test_only_full_chunks_have_keys_and_block_tokens_follow_the_estimate() -> None:
    got = prompt_keys(COMPLETIONS, {"prompt": "x" * (3 * CHUNK_CHARS + 5)})
    assert got is not None and len(got.keys) == 3
    assert got.block_tokens == BLOCK_TOKENS == CHUNK_CHARS // 4  # pd's ~4 characters a token
    assert prompt_keys(COMPLETIONS, {"prompt": "short"}) == PromptKeys((), BLOCK_TOKENS)


# -- the index ---------------------------------------------------------------------------------


def pk(*ks: int) -> PromptKeys:
    return PromptKeys(tuple(ks), 32)


def test_index_is_a_prefix_source() -> None:
    index: PrefixSource = ApproximateIndex()
    body = {"model": "m", "prompt": PROMPT}
    got = asyncio.run(index.prompt_keys(COMPLETIONS, body))
    assert got == prompt_keys(COMPLETIONS, body)


def test_matched_blocks_is_the_longest_leading_run_per_url() -> None:
    index = ApproximateIndex()
    index.record(pk(1, 2, 3, 4), "a", now=0.0)
    index.record(pk(1, 2, 9), "b", now=0.0)
    assert index.matched_blocks(pk(1, 2, 3, 4, 5), ["a", "b", "c"], now=1.0) == [4, 2, 0]
    assert index.matched_blocks(pk(7, 8, 9), ["a", "b"], now=1.0) == [0, 0]
    assert index.matched_blocks(pk(), ["a"], now=1.0) == [0]


def test_ttl_entries_older_count_as_gone_and_a_resend_refreshes() -> None:
    index = ApproximateIndex(ttl_s=10.0)
    index.record(pk(1, 2, 3), "a", now=0.0)
    index.record(pk(1, 2), "a", now=8.0)  # the shorter prefix sent again later
    assert index.matched_blocks(pk(1, 2, 3), ["a"], now=10.0) == [3]
    assert index.matched_blocks(pk(1, 2, 3), ["a"], now=15.0) == [2]
    assert index.matched_blocks(pk(1, 2, 3), ["a"], now=18.5) == [0]


def test_expired_keys_are_dropped_as_new_ones_come() -> None:
    index = ApproximateIndex(ttl_s=1.0)
    for i in range(4):
        index.record(pk(100 + i), "a", now=0.0)
    index.record(pk(1), "a", now=5.0)
    assert len(index) == 1


def test_lru_evicts_the_least_recently_sent_and_never_a_chains_head_first() -> None:
    index = ApproximateIndex(max_entries=5)
    index.record(pk(1, 2, 3), "a", now=0.0)
    index.record(pk(7, 8), "b", now=1.0)
    index.record(pk(1, 2), "a", now=2.0)  # refreshes 1, 2: 3 is now the oldest
    index.record(pk(9), "c", now=3.0)  # one over: 3 goes
    assert len(index) == 5
    assert index.matched_blocks(pk(1, 2, 3), ["a"], now=3.0) == [2]
    index.record(pk(5, 6), "c", now=4.0)  # 8 then 7 go: the tail of a chain before its head
    assert index.matched_blocks(pk(7, 8), ["b"], now=4.0) == [0]
    assert index.matched_blocks(pk(1, 2), ["a"], now=4.0) == [2]


def test_forget_drops_one_endpoint_only_and_later_sends_count_again() -> None:
    index = ApproximateIndex()
    index.record(pk(1, 2, 3), "a", now=0.0)
    index.record(pk(1, 2, 3), "b", now=0.0)
    index.forget("a")
    assert index.matched_blocks(pk(1, 2, 3), ["a", "b"], now=1.0) == [0, 3]
    index.record(pk(1), "a", now=2.0)
    assert index.matched_blocks(pk(1, 2, 3), ["a", "b"], now=2.0) == [1, 3]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=6),
                          st.sampled_from("ab"), st.booleans()), max_size=30),
       st.integers(1, 12))
def test_matches_are_what_was_sent_within_the_bounds(
    ops: list[tuple[list[int], str, bool]], max_entries: int,
) -> None:
    """A prompt's keys are its prefixes (chained): the index never claims more than what was
    sent to a url since it was last forgotten, and with room for every key it claims all of
    it (binary search over the leading run agrees with a scan)."""
    index = ApproximateIndex(max_entries=max_entries, ttl_s=1e9)
    sent: dict[str, set[tuple[int, ...]]] = {"a": set(), "b": set()}
    all_keys: set[tuple[int, ...]] = set()
    for t, (path, url, forget) in enumerate(ops):
        if forget:
            index.forget(url)
            sent[url].clear()
        chain = [tuple(path[: i + 1]) for i in range(len(path))]
        ids = {c: hash(c) for c in chain}
        index.record(PromptKeys(tuple(ids[c] for c in chain), 1), url, now=float(t))
        sent[url].update(chain)
        all_keys.update(chain)
        probe = [tuple(path[: i + 1]) for i in range(len(path))] + [(*path, 9)]
        got = index.matched_blocks(PromptKeys(tuple(hash(c) for c in probe), 1), ["a", "b"],
                                   now=float(t))
        for u, m in zip(("a", "b"), got, strict=True):
            assert all(probe[i] in sent[u] for i in range(m))
            if len(all_keys) <= max_entries:
                full = 0
                while full < len(probe) and probe[full] in sent[u]:
                    full += 1
                assert m == full


# -- the choice --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChoiceCase:
    id: str
    loads: list[float]
    matched: list[int]
    prompt: int = 8192
    expect: int = 0
    reason: str = PREFIX
    weights: list[float] | None = None
    balance: float = 1.25
    extra: dict[str, float] = field(default_factory=dict)


CHOICE_CASES = [
    ChoiceCase("no holder: least loaded", [3, 1, 2], [0, 0, 0], expect=1, reason=NO_MATCH),
    ChoiceCase("the holder of a long prefix, though busier", [3, 2, 2], [8000, 0, 0],
               expect=0),
    ChoiceCase("idle pool: the holder with one request in flight", [1, 0, 0, 0],
               [8192, 0, 0, 0], expect=0),
    ChoiceCase("a short match is not worth a long queue", [6, 0, 6], [512, 0, 0], prompt=1024,
               expect=1, reason=LOAD),
    ChoiceCase("the longer match wins at equal load", [2, 2, 2], [1024, 4096, 0], expect=1),
    ChoiceCase("over the bound: the next best holder", [10, 6, 2, 2], [8192, 4096, 0, 0],
               expect=1, reason=BOUND),
    ChoiceCase("over the bound, no other holder: least loaded", [12, 2, 2, 2],
               [8192, 0, 0, 0], expect=1, reason=BOUND),
    ChoiceCase("a larger balance lets the holder take it", [12, 2, 2, 2], [8192, 0, 0, 0],
               expect=0, balance=3.0),
    ChoiceCase("a ramping endpoint weighs more", [1, 1], [4096, 4096], weights=[0.2, 1.0],
               expect=1),
    ChoiceCase("matched beyond the prompt counts as the whole prompt", [1, 1], [9000, 100],
               prompt=1000, expect=0),
]


@pytest.mark.parametrize("case", CHOICE_CASES, ids=[c.id for c in CHOICE_CASES])
def test_choose(case: ChoiceCase) -> None:
    c = choose(case.loads, case.matched, case.prompt, weights=case.weights,
               balance=case.balance)
    assert (c.index, c.reason) == (case.expect, case.reason)
    assert c.matched_tokens == min(case.prompt, case.matched[case.expect])


def test_choose_needs_candidates_with_one_value_each() -> None:
    with pytest.raises(ValueError):
        choose([], [], 10)
    with pytest.raises(ValueError):
        choose([1.0, 2.0], [0], 10)
    with pytest.raises(ValueError):
        choose([1.0, 2.0], [0, 100], 10, requests=[1.0])


loads_st = st.lists(st.floats(0, 200, allow_nan=False), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(loads_st, st.data(), st.integers(0, 20000), st.floats(1.0, 4.0), st.integers(0, 50))
def test_the_bound_is_never_exceeded_and_no_match_is_least_loaded(
    loads: list[float], data: st.DataObject, prompt: int, balance: float, turn: int,
) -> None:
    matched = data.draw(st.lists(st.integers(0, 20000), min_size=len(loads),
                                 max_size=len(loads)))
    c = choose(loads, matched, prompt, balance=balance, turn=turn)
    assert loads[c.index] + 1 <= load_cap(loads, balance) + 1e-6
    assert any(within_bound(loads, balance))  # there is always a choice
    none = choose(loads, [0] * len(loads), prompt, balance=balance, turn=turn)
    assert none.index == least_loaded(loads, turn=turn) and none.reason == NO_MATCH


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 200, allow_nan=False), st.integers(0, 40)), min_size=1,
                max_size=8), st.data(), st.integers(0, 20000), st.integers(0, 50))
def test_with_request_counts_the_bound_is_on_requests(
    state: list[tuple[float, int]], data: st.DataObject, prompt: int, turn: int,
) -> None:
    """The balancer passes its requests per endpoint: the bound holds on those, while the
    pick weighs the work (load, with tokens) against what each endpoint holds."""
    loads = [load for load, _ in state]
    requests = [float(n) for _, n in state]
    matched = data.draw(st.lists(st.integers(0, 20000), min_size=len(loads),
                                 max_size=len(loads)))
    c = choose(loads, matched, prompt, turn=turn, requests=requests)
    if max(matched) > 0:
        assert requests[c.index] + 1 <= load_cap(requests) + 1e-6
    else:
        assert c.index == least_loaded(loads, turn=turn)


def test_a_holder_busy_with_a_long_prompt_keeps_its_conversation() -> None:
    # One request of 4k uncached tokens in flight at the holder (load 1 + 8), three idle
    # engines. Bounded on that load (9 against a mean of 3.25) the 16k-token turn would go to
    # an idle engine and recompute 15.5k tokens; bounded on requests (1 against 0.25) it
    # stays where its prefix is, the least work.
    loads, matched, requests = [9.0, 0.0, 0.0, 0.0], [15872, 0, 0, 0], [1.0, 0.0, 0.0, 0.0]
    assert choose(loads, matched, 16384).reason == BOUND
    c = choose(loads, matched, 16384, requests=requests)
    assert (c.index, c.reason) == (0, PREFIX)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=10),
       st.integers(0, 30))
def test_without_a_match_the_balancer_picks_as_least_loaded(
    state: list[tuple[int, int]], calls: int,
) -> None:
    """Balancer.pick_by_prefix with no holder is Balancer.pick, tie rotation included."""
    urls = [f"u{i}" for i in range(len(state))]
    a, b = Balancer(BalancerConfig()), Balancer(BalancerConfig())
    for bal in (a, b):
        bal.set_endpoints("prefill", urls, now=0.0, initial=True)
        for url, (inflight, waiting) in zip(urls, state, strict=True):
            for _ in range(inflight):
                bal.acquire(url, 100)
            bal.update_waiting(url, waiting)
    for _ in range(calls + 1):
        plain = a.pick("prefill", 1.0)
        got = b.pick_by_prefix("prefill", 1.0, lambda us: [0] * len(us), 1000, 1.25)
        assert plain is not None and got is not None
        assert got[0].url == plain.url and got[1].reason == NO_MATCH


def test_the_balancer_bounds_on_its_requests_and_weighs_the_tokens() -> None:
    """Endpoint a holds the prompt and has one 4k-token prompt of another in flight (load
    1 + 8); b, c and d are idle. The balancer's bound counts a's one request, so a takes the
    turn whose 15.5k held tokens it would otherwise recompute elsewhere."""
    b = Balancer(BalancerConfig())
    urls = ["a", "b", "c", "d"]
    b.set_endpoints("prefill", urls, now=0.0, initial=True)
    b.acquire("a", 4096)
    assert b.get("a").load(b.config) == 9.0 and b.get("a").requests() == 1
    got = b.pick_by_prefix("prefill", 1.0, lambda us: [15872 if u == "a" else 0 for u in us],
                           16384, 1.25)
    assert got is not None and got[0].url == "a" and got[1].reason == PREFIX


def test_a_hot_prefix_spreads_once_its_engine_is_over_the_bound() -> None:
    """Every request shares one long prefix and none finishes: the holder takes them while
    within the bound, then the rest go elsewhere, so the load stays within c x mean + 1."""
    b = Balancer(BalancerConfig())
    urls = ["a", "b", "c", "d"]
    b.set_endpoints("prefill", urls, now=0.0, initial=True)
    index = ApproximateIndex()
    prompt = pk(*range(100))  # 3,200 tokens
    for _ in range(40):
        got = b.pick_by_prefix(
            "prefill", 1.0,
            lambda us: [prompt.tokens(m) for m in index.matched_blocks(prompt, us, 1.0)],
            3200, 1.25)
        assert got is not None
        b.acquire(got[0].url, 0)
        index.record(prompt, got[0].url, 1.0)
    loads = [b.get(u).inflight for u in urls]
    assert max(loads) <= 1.25 * (sum(loads) / 4 + 1)
