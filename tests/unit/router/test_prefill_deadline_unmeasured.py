"""A fresh router knows no prefill rate (no seed, nothing measured yet): its prefill deadline
still counts the prompt, at a slow engine's pace, so a long prompt is served by the prefill
engine rather than declared hung after N TTFT targets (a 90k-token prompt got a 504 and two
of them ejected both engines)."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web
from poolpilot.router.app import Router
from poolpilot.router.balancer import BalancerConfig
from poolpilot.router.config import MIN_DEADLINE_S, RouterConfig
from poolpilot.router.engine_choice import UNMEASURED_PREFILL_TOKENS_PER_S
from poolpilot.testkit.aiohttp_apps import serve, url_of

from poolpilot.roles import Mode, Role

KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "p",
      "remote_block_ids": [1], "remote_host": "127.0.0.1", "remote_port": 1}
# Past the deadline floor, within it plus this prompt at the unmeasured rate.
PREFILL_S = MIN_DEADLINE_S + 0.5
PROMPT_TOKENS = int(2 * UNMEASURED_PREFILL_TOKENS_PER_S)


async def test_a_long_prompt_on_a_fresh_router_is_not_declared_hung() -> None:
    calls = {"prefill": 0, "decode": 0}

    async def prefill(request: web.Request) -> web.Response:
        await request.read()
        calls["prefill"] += 1
        await asyncio.sleep(PREFILL_S)  # a long prompt's prefill
        return web.json_response({"choices": [{"text": "P"}], "kv_transfer_params": KV})

    async def decode(request: web.Request) -> web.Response:
        body = await request.json()
        calls["decode"] += 1
        # the P/D handoff, not a local prefill after a prefill declared hung
        assert body.get("kv_transfer_params", {}).get("do_remote_prefill") is True, body
        return web.json_response({"choices": [{"text": "D", "finish_reason": "length"}]})

    p_app, d_app = web.Application(), web.Application()
    p_app.router.add_post("/v1/completions", prefill)
    d_app.router.add_post("/v1/completions", decode)
    async for p in serve(p_app):
        async for d in serve(d_app):
            router = Router(RouterConfig(
                mode=Mode.DISAGGREGATED, health_interval_s=0, kv_lease_s=None,
                prefix_routing="off", prefill_tokens_per_s=0.0,  # no seed: nothing known
                prefill_deadline_s=0.1,  # raised to the floor, MIN_DEADLINE_S
                local_prefill=None, balancer=BalancerConfig(ramp_s=0)))
            p_url = url_of(p)
            router.set_endpoints(Role.PREFILL, [p_url], initial=True)
            router.set_endpoints(Role.DECODE, [url_of(d)], initial=True)
            async for r in serve(router.build_app()):
                async with aiohttp.ClientSession() as session, session.post(
                        url_of(r) + "/v1/completions",
                        json={"model": "m", "prompt": list(range(PROMPT_TOKENS)),
                              "max_tokens": 4}) as resp:
                    assert resp.status == 200, await resp.text()
    assert calls == {"prefill": 1, "decode": 1}
    assert router.balancer.by_url(p_url)[0].failures == 0  # not charged a failure
