"""Whose failure a failed KV handoff is. A decode engine told to pull KV that is not there (the
prefill engine is gone or released it) is not at fault: vLLM answers a 500 (or, streaming, an
error as the first event) after giving up on the pull, ~10 s on a CPU, and meanwhile answered
its health checks up to 12 s late. The sole decode engine must stay admitted for the request's
local prefill. A decode engine that fails on its own (connection refused, health checks that
time out with no handoff in sight) is still ejected. In-process fakes, real HTTP."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web
from poolpilot.router import config as router_config
from poolpilot.router.app import Router
from poolpilot.router.balancer import BalancerConfig
from poolpilot.router.config import RouterConfig
from poolpilot.testkit.aiohttp_apps import serve, url_of
from poolpilot.testkit.prometheus import free_port

from poolpilot.roles import Mode, Role

PULL_S = 0.4  # how long the fake decode engine tries to pull before it gives up
HEALTH_TIMEOUT_S = 0.05
KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "gone",
      "remote_block_ids": [1], "remote_host": "127.0.0.1", "remote_port": 1}


class FakeDecode:
    """A decode engine whose KV pulls fail the way vLLM's do; while it pulls, its /health
    answers too late for the router's health check. Requests without KV parameters (the local
    prefill) are served."""

    def __init__(self, shape: str) -> None:
        self.shape = shape  # 500 | error-event | slow-pull
        self.pulling = 0
        self.local: list[dict] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/completions", self.generate)
        return app

    async def health(self, request: web.Request) -> web.Response:
        if self.pulling:
            await asyncio.sleep(HEALTH_TIMEOUT_S * 10)
        return web.Response(text="ok")

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        stream = body.get("stream") is True
        if not body.get("kv_transfer_params"):
            self.local.append(body)
            event = {"choices": [{"index": 0, "text": "local", "finish_reason": "length"}]}
            if not stream:
                return web.json_response(event)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"data: " + json.dumps(event).encode() + b"\n\ndata: [DONE]\n\n")
            return resp
        error = {"error": {"message": "Internal server error", "type": "InternalServerError",
                           "param": None, "code": 500}}
        if body.get("max_tokens") == 1:  # the router's release of the prefill's KV
            return web.json_response(error, status=500)
        self.pulling += 1
        try:
            if not stream:
                await asyncio.sleep(PULL_S)
                return web.json_response(error, status=500)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)  # vLLM sends its status line at once
            await asyncio.sleep(PULL_S * (10 if self.shape == "slow-pull" else 1))
            await resp.write(b"data: " + json.dumps(error).encode() + b"\n\ndata: [DONE]\n\n")
            return resp
        finally:
            self.pulling -= 1


async def prefill(request: web.Request) -> web.Response:
    return web.json_response({"choices": [{"text": "P"}], "kv_transfer_params": KV})


async def healthy(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def prefill_app() -> web.Application:
    app = web.Application()
    app.router.add_get("/health", healthy)
    app.router.add_post("/v1/completions", prefill)
    return app


@pytest.fixture
def fast_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    # Deadlines in tenths of a second (the floor is for busy machines, not these fakes).
    monkeypatch.setattr(router_config, "MIN_DEADLINE_S", 0.05)


def router_for(prefill_url: str, decode_url: str, health_interval_s: float = 0.02) -> Router:
    router = Router(RouterConfig(
        mode=Mode.DISAGGREGATED, health_interval_s=health_interval_s,
        health_timeout_s=HEALTH_TIMEOUT_S,
        decode_stall_s=PULL_S / 2, kv_lease_s=None, prefix_routing="off",
        balancer=BalancerConfig(eject_after=2, ramp_s=0)))
    router.set_endpoints(Role.PREFILL, [prefill_url], initial=True)
    router.set_endpoints(Role.DECODE, [decode_url], initial=True)
    return router


async def ask(router_url: str, stream: bool) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.post(
            router_url + "/v1/completions",
            json={"model": "m", "prompt": "hello", "max_tokens": 4, "stream": stream}) as resp:
        return resp.status, await resp.text()


@dataclass(frozen=True)
class PullCase:
    id: str
    shape: str
    stream: bool


PULL_CASES = [
    PullCase("vllm-answers-500", "500", stream=False),
    PullCase("vllm-streams-an-error-first", "error-event", stream=True),
    PullCase("still-pulling-at-the-first-token-deadline", "slow-pull", stream=True),
]


@pytest.mark.parametrize("case", PULL_CASES, ids=[c.id for c in PULL_CASES])
async def test_a_failed_kv_pull_is_retried_locally_on_the_sole_decode_engine_kept_admitted(
        case: PullCase, fast_deadlines: None) -> None:
    decode = FakeDecode(case.shape)
    async for p in serve(prefill_app()):
        async for d in serve(decode.app()):
            router = router_for(url_of(p), url_of(d))
            async for r in serve(router.build_app()):
                status, text = await ask(url_of(r), case.stream)
                assert status == 200, text
                assert "local" in text
                assert len(decode.local) == 1
                assert not router.balancer.get(url_of(d), Role.DECODE).ejected()
                # And the next request is served too (the engine was not ejected meanwhile).
                status, text = await ask(url_of(r), case.stream)
                assert status == 200, text


async def test_a_decode_engine_that_refuses_connections_twice_is_ejected(
        fast_deadlines: None) -> None:
    gone = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async for p in serve(prefill_app()):
        router = router_for(url_of(p), gone, health_interval_s=0)  # requests alone
        async for r in serve(router.build_app()):
            # The handoff is refused, then its local prefill: two failures of its own.
            status, _ = await ask(url_of(r), stream=False)
            assert status == 502
            assert router.balancer.get(gone, Role.DECODE).ejected()
            status, text = await ask(url_of(r), stream=False)
            assert status == 503 and "no decode engine available" in text


async def test_a_decode_engine_whose_health_checks_time_out_is_still_ejected(
        fast_deadlines: None) -> None:
    decode = FakeDecode("500")
    decode.pulling = 1  # /health answers late, with no handoff in sight
    async for p in serve(prefill_app()):
        async for d in serve(decode.app()):
            router = router_for(url_of(p), url_of(d))
            async for _ in serve(router.build_app()):
                for _ in range(100):
                    if router.balancer.get(url_of(d), Role.DECODE).ejected():
                        break
                    await asyncio.sleep(0.02)
                assert router.balancer.get(url_of(d), Role.DECODE).ejected()
