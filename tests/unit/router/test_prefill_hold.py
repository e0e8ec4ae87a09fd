"""Late binding (router/prefill_hold.py): while every prefill engine is saturated, prompts wait
at the router in arrival order and go to the first engine that can start on them, a newly
joined one included. The hold itself, then the router around it with in-process fake engines
over real HTTP."""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter

import aiohttp
import pytest
from aiohttp import web
from poolpilot.router.app import Router
from poolpilot.router.balancer import BalancerConfig
from poolpilot.router.config import RouterConfig
from poolpilot.router.main import UsageError, add_arguments, config_from_args
from poolpilot.router.prefill_hold import DEFAULT_PREFILL_HOLD_S, PrefillHold
from poolpilot.testkit.aiohttp_apps import serve, url_of

from poolpilot.roles import Mode, Role


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--prefill", "http://p:1", "--decode", "http://d:1", *argv])


class Engines:
    """A saturation flag the test sets, as the router's rule would read it."""

    def __init__(self) -> None:
        self.saturated = True
        self.held: list[int] = []

    def hold(self) -> PrefillHold:
        return PrefillHold(lambda: self.saturated, self.held.append)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_prompt_goes_at_once_while_an_engine_is_not_saturated() -> None:
    engines = Engines()
    engines.saturated = False
    hold = engines.hold()
    assert await hold.enter() is False
    assert engines.held == [] and len(hold) == 0


async def test_held_prompts_go_in_arrival_order_one_at_a_time() -> None:
    engines = Engines()
    hold = engines.hold()
    order: list[int] = []

    async def prompt(i: int) -> None:
        assert await hold.enter() is True
        order.append(i)

    tasks = [asyncio.create_task(prompt(i)) for i in range(4)]
    await settle()
    assert (len(hold), engines.held) == (4, [1, 2, 3, 4])
    hold.release()  # still saturated: nobody goes
    await settle()
    assert order == []
    engines.saturated = False
    hold.release()
    await settle()
    # One goes; the next waits until it has taken its engine, or a freed engine would take
    # every held prompt at once.
    assert order == [0]
    hold.passed()
    await settle()
    assert order == [0, 1]
    engines.saturated = True  # the one that went filled the engine again
    hold.passed()
    await settle()
    assert order == [0, 1] and len(hold) == 2
    engines.saturated = False
    for _ in range(2):
        hold.release()
        await settle()
        hold.passed()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3] and engines.held[-1] == 0


async def test_a_new_prompt_waits_behind_those_held_before_it() -> None:
    engines = Engines()
    hold = engines.hold()
    first = asyncio.create_task(hold.enter())
    await settle()
    engines.saturated = False  # an engine freed, but nobody released the held one yet
    second = asyncio.create_task(hold.enter())
    await settle()
    assert not first.done() and not second.done() and len(hold) == 2
    hold.release()
    await settle()
    assert first.done() and not second.done()
    hold.passed()
    await settle()
    assert second.done()


async def test_a_client_that_leaves_while_held_loses_its_place_and_blocks_nobody() -> None:
    engines = Engines()
    hold = engines.hold()
    leaving = asyncio.create_task(hold.enter())
    staying = asyncio.create_task(hold.enter())
    await settle()
    leaving.cancel()
    await settle()
    assert len(hold) == 1 and engines.held[-1] == 1
    engines.saturated = False
    hold.release()
    await settle()
    assert staying.done()


async def test_a_client_that_leaves_just_as_it_was_let_through_hands_its_turn_on() -> None:
    engines = Engines()
    hold = engines.hold()
    leaving = asyncio.create_task(hold.enter())
    staying = asyncio.create_task(hold.enter())
    await settle()
    engines.saturated = False
    hold.release()  # lets `leaving` through; its task has not run yet
    leaving.cancel()
    await settle()
    assert leaving.cancelled() and staying.done()


# -- the router around it --------------------------------------------------------------------

PREFILL_S = 0.05  # one prompt at a time, this long each
PROMPT = "word " * 800  # ~1,000 tokens by the router's estimate
KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "p",
      "remote_block_ids": [1], "remote_host": "127.0.0.1", "remote_port": 1}


class FakePrefill:
    """A prefill engine that computes one prompt at a time, as a saturated vLLM engine works
    through its queue; counts the prompts it was sent."""

    def __init__(self) -> None:
        self.busy = asyncio.Lock()
        self.received = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.prefill)
        return app

    async def prefill(self, request: web.Request) -> web.Response:
        await request.read()
        self.received += 1
        async with self.busy:
            await asyncio.sleep(PREFILL_S)
        return web.json_response({"choices": [{"text": "P"}], "kv_transfer_params": KV})


async def decode(request: web.Request) -> web.Response:
    return web.json_response({"choices": [{"text": "D", "finish_reason": "length"}]})


async def ask(session: aiohttp.ClientSession, router_url: str) -> int:
    async with session.post(router_url + "/v1/completions",
                            json={"model": "m", "prompt": PROMPT, "max_tokens": 4}) as resp:
        await resp.read()
        return resp.status


async def burst_then_join(hold_s: float | None, prefix_routing: str = "off",
                          warm: bool = False) -> tuple[Counter[str], list[int]]:
    """Ten prompts at once onto one prefill engine; a second engine joins while the first
    works through them (`warm`: after one such prompt was prefilled there, so that the router
    expects the first engine to hold them all). Returns the prompts each engine was sent and
    the router's gauge of held prompts as the second joined."""
    first, second = FakePrefill(), FakePrefill()
    dec = web.Application()
    dec.router.add_post("/v1/completions", decode)
    async for p1 in serve(first.app()):
        async for p2 in serve(second.app()):
            async for d in serve(dec):
                # 20,000 prompt tokens/s: an engine with one ~1,000-token prompt queued has
                # 0.05 s of work, the hold's threshold here (as the learned rate moves, one or
                # two prompts).
                router = Router(RouterConfig(
                    mode=Mode.DISAGGREGATED, health_interval_s=0, kv_lease_s=None,
                    prefix_routing=prefix_routing, prefill_tokens_per_s=20_000,
                    prefill_hold_s=hold_s,
                    balancer=BalancerConfig(ramp_s=0)))
                router.set_endpoints(Role.PREFILL, [url_of(p1)], initial=True)
                router.set_endpoints(Role.DECODE, [url_of(d)], initial=True)
                async for r in serve(router.build_app()):
                    async with aiohttp.ClientSession() as session:
                        if warm:
                            assert await ask(session, url_of(r)) == 200
                            first.received = 0
                        asks = [asyncio.create_task(ask(session, url_of(r)))
                                for _ in range(10)]
                        while first.received == 0:  # the first prompt reached the engine
                            await asyncio.sleep(0.005)
                        await asyncio.sleep(0.02)  # the rest reached the router
                        held = router.metrics.held_prefill._value.get()
                        router.set_endpoints(Role.PREFILL, [url_of(p1), url_of(p2)])
                        statuses = await asyncio.gather(*asks)
                    assert statuses == [200] * 10
                    assert len(router.hold or []) == 0
                    assert router.metrics.held_prefill._value.get() == 0
                    return Counter(first=first.received, second=second.received), [int(held)]
    raise AssertionError("unreachable")


async def test_a_burst_held_at_the_router_is_shared_with_an_engine_that_joins() -> None:
    sent, [held] = await burst_then_join(hold_s=0.05)
    assert held >= 7, held  # one or two went to the engine; the rest waited at the router
    assert sent["second"] >= 4, sent  # the new engine took its share of the burst
    # Without late binding every prompt of the burst joined the first engine's queue, and
    # the engine that joined found nothing to take.
    sent, [held] = await burst_then_join(hold_s=None)
    assert (held, sent["first"], sent["second"]) == (0, 10, 0)


async def test_the_hold_counts_whole_prompts_where_the_router_expects_them_cached() -> None:
    """The queue the hold reads is in the unit the prefill rate is learned in: whole prompt
    tokens, cached or not (an engine whose cache serves them answers sooner, and the rate
    says so). Counted in the tokens the router expected the engine to compute, the same
    burst after one prefill of its prompt looked like no queue at all: nothing was held and
    every prompt went to the first engine, cache or not (an engine that evicted it then
    recomputes them one after the other)."""
    sent, [held] = await burst_then_join(hold_s=0.05, prefix_routing="approximate", warm=True)
    assert held >= 7, held
    assert sent["first"] + sent["second"] == 10


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_prefill_hold_is_refused_naming_the_flag(value: str) -> None:
    with pytest.raises(UsageError, match=r"^--prefill-hold "):
        config_from_args(parse("--prefill-hold", value))


def test_prefill_hold_flag() -> None:
    assert config_from_args(parse()).prefill_hold_s == DEFAULT_PREFILL_HOLD_S
    assert config_from_args(parse("--prefill-hold", "2.5")).prefill_hold_s == 2.5
    assert config_from_args(parse("--prefill-hold", "0")).prefill_hold_s is None
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    aggregated = Router(config_from_args(parser.parse_args(["--engine", "http://e:1"])))
    assert aggregated.hold is None  # only prefill engines are held for


class HungPrefill(FakePrefill):
    """A prefill engine that stopped (SIGSTOP): it takes requests and never answers."""

    def __init__(self) -> None:
        super().__init__()
        self.resume = asyncio.Event()

    async def prefill(self, request: web.Request) -> web.Response:
        await request.read()
        self.received += 1
        await self.resume.wait()
        return web.json_response({"choices": [{"text": "P"}], "kv_transfer_params": KV})


async def test_a_prompt_held_while_the_only_prefill_engine_hangs_is_not_sent_to_it() -> None:
    """A prompt saturates the one prefill engine, which then hangs; a second waits at the
    router. Once the engine has been silent for a whole prefill deadline it is hung, not
    saturated: the held prompt is let through and served by a decode engine's local prefill,
    not sent to the hung engine to wait a deadline more (ejection is kept off here, as when
    an ejection lapses while the engine is still stopped)."""
    hung = HungPrefill()
    dec = web.Application()
    dec.router.add_post("/v1/completions", decode)
    async for p in serve(hung.app()):
        async for d in serve(dec):
            router = Router(RouterConfig(
                mode=Mode.DISAGGREGATED, health_interval_s=0, kv_lease_s=None,
                prefix_routing="off", prefill_tokens_per_s=20_000, prefill_hold_s=0.01,
                prefill_deadline_s=0.1,  # raised to the router's floor, MIN_DEADLINE_S (3 s)
                balancer=BalancerConfig(ramp_s=0, eject_after=1000)))
            router.set_endpoints(Role.PREFILL, [url_of(p)], initial=True)
            router.set_endpoints(Role.DECODE, [url_of(d)], initial=True)
            async for r in serve(router.build_app()):
                async with aiohttp.ClientSession() as session:
                    first = [asyncio.create_task(ask(session, url_of(r)))]
                    while hung.received < 1:
                        await asyncio.sleep(0.005)
                    held = asyncio.create_task(ask(session, url_of(r)))
                    while len(router.hold or []) == 0:
                        await asyncio.sleep(0.005)
                    sent = asyncio.get_running_loop().time()
                    assert await held == 200
                    waited = asyncio.get_running_loop().time() - sent
                    assert await asyncio.gather(*first) == [200]  # a local prefill too
                    hung.resume.set()
            assert hung.received == 1, hung.received  # the held prompt never went to it
            assert waited < 3.0 + 1.5, waited  # one deadline, then the decode engine
    assert router.metrics.held_prefill._value.get() == 0


def test_an_engine_that_leaves_the_pool_and_comes_back_is_not_counted_hung() -> None:
    """What marked a prefill engine hung (a prefill past its deadline) is dropped when it
    leaves the pool: a new pod at the same address is picked, and a router whose engines come
    and go keeps no record of those gone."""
    router = Router(RouterConfig(mode=Mode.DISAGGREGATED, health_interval_s=0,
                                 prefix_routing="off", prefill_tokens_per_s=20_000,
                                 prefill_deadline_s=1, balancer=BalancerConfig(ramp_s=0)))
    url = "http://p:1"
    router.set_endpoints(Role.PREFILL, [url], initial=True)
    router.prefill_timed_out[url] = router.clock.now()  # as a prefill past its deadline does
    router.prefill_heard[url] = router.clock.now()
    assert router._pick(Role.PREFILL, [], None, 100)[0] is None  # silent: not picked
    router.set_endpoints(Role.PREFILL, [])
    assert router.prefill_timed_out == {} and router.prefill_heard == {}
    router.set_endpoints(Role.PREFILL, [url])
    picked, _ = router._pick(Role.PREFILL, [], None, 100)
    assert picked is not None and picked.url == url
