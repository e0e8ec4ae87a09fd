"""Prefix-aware routing through the router process, against engine-sim engines: a request
sharing a long prefix with an earlier one goes to the prefill engine that served it, unrelated
ones spread, and a hot prefix does not send everything to one engine (the load bound)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial

import httpx
import pytest
from router_support import (
    FAST,
    Proc,
    metric_value,
    running,
    start_engine_sim,
    start_router,
)

pytestmark = pytest.mark.adapter

# ~1,000 tokens of shared history, then a question of its own
HISTORY = "The engine keeps the attention keys and values of every prompt it has seen. " * 50


def finished(engine: Proc) -> int:
    return len(httpx.get(engine.url + "/sim/requests", timeout=5).json()["requests"])


def served_by(engines: list[Proc], send: Callable[[], None]) -> int:
    """Which engine finished one more request while `send()` ran."""
    before = [finished(e) for e in engines]
    send()
    after = [finished(e) for e in engines]
    moved = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if b > a]
    assert len(moved) == 1, (before, after)
    return moved[0]


def complete(router: str, prompt: str, max_tokens: int = 4) -> None:
    resp = httpx.post(router + "/v1/completions", timeout=30,
                      json={"model": "sim", "prompt": prompt, "max_tokens": max_tokens})
    assert resp.status_code == 200, resp.text


@pytest.fixture(scope="module")
def pd_pool() -> Iterator[tuple[list[Proc], Proc, Proc]]:
    with (
        running(*(start_engine_sim("prefill") for _ in range(3))) as prefills,
        running(start_engine_sim("decode")) as (decode,),
        running(start_router("--prefill", ",".join(p.url for p in prefills),
                             "--decode", decode.url, "--local-prefill", "off", *FAST)) as (r,),
    ):
        yield list(prefills), decode, r


def test_a_shared_prefix_goes_to_the_prefill_engine_that_has_it(
    pd_pool: tuple[list[Proc], Proc, Proc],
) -> None:
    prefills, _, router = pd_pool
    first = served_by(prefills, lambda: complete(router.url, HISTORY + "What is kept?"))
    for question in ("And for how long?", "Who evicts it?", "What does it cost?"):
        again = served_by(prefills, partial(complete, router.url, HISTORY + question))
        assert again == first
    # unrelated prompts (their own first chunk): nobody holds them, they rotate over all
    others = {served_by(prefills, partial(complete, router.url, f"{i} " + HISTORY))
              for i in range(6)}
    assert len(others) == 3
    page = httpx.get(router.url + "/metrics", timeout=5).text
    url = prefills[first].url
    hits = metric_value(page, "poolpilot_router_prefix_expected_hit_tokens_total",
                        {"role": "prefill", "endpoint": url})
    routed = metric_value(page, "poolpilot_router_prefix_routed_prompt_tokens_total",
                          {"role": "prefill", "endpoint": url})
    # three of its four requests were expected to find ~1,000 tokens of the prompt cached
    assert 2500 < hits < routed
    assert metric_value(page, "poolpilot_router_prefix_choices_total",
                        {"role": "prefill", "reason": "prefix"}) >= 3


def test_with_prefix_routing_off_nothing_is_counted(
    pd_pool: tuple[list[Proc], Proc, Proc],
) -> None:
    prefills, decode, _ = pd_pool
    with running(start_router("--prefill", ",".join(p.url for p in prefills), "--decode",
                              decode.url, "--prefix-routing", "off", *FAST)) as (r,):
        engines = {served_by(prefills, partial(complete, r.url, HISTORY + q))
                   for q in ("a?", "b?", "c?")}
        assert len(engines) == 3  # least loaded: ties rotate, the prefix does not matter
        page = httpx.get(r.url + "/metrics", timeout=5).text
        assert "poolpilot_router_prefix_routed_prompt_tokens_total{" not in page


def test_a_hot_prefix_does_not_send_everything_to_one_engine() -> None:
    """40 concurrent streams sharing one long prefix on three aggregated engines: the holder
    takes them while its queue costs less than the prefix saves and its load stays within the
    bound; the others get the rest."""
    with (
        running(*(start_engine_sim("aggregated") for _ in range(3))) as engines,
        running(start_router("--engine", ",".join(e.url for e in engines), *FAST)) as (r,),
    ):
        complete(r.url, HISTORY + "warm up")  # one engine holds the prefix

        async def load() -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                async def one(i: int) -> None:
                    resp = await client.post(r.url + "/v1/completions", json={
                        "model": "sim", "prompt": HISTORY + f"question {i}",
                        "max_tokens": 64, "stream": True, "ignore_eos": True})
                    assert resp.status_code == 200

                await asyncio.gather(*(one(i) for i in range(40)))

        asyncio.run(load())
        per_engine = Counter({i: finished(e) for i, e in enumerate(engines)})
        assert sum(per_engine.values()) == 41
        assert min(per_engine.values()) >= 5 and max(per_engine.values()) <= 30
        page = httpx.get(r.url + "/metrics", timeout=5).text
        # the holder was passed over for load (its queue outweighed the prefix) or the bound
        assert sum(metric_value(page, "poolpilot_router_prefix_choices_total",
                                {"role": "engine", "reason": reason})
                   for reason in ("load", "bound")) > 0
