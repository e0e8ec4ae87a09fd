"""Hostile client input the router answers itself, in both modes, before any engine sees it:
bodies nested deeper than it can forward, a body that stalls after its headers, a body that
does not decompress, a `stream_options` that is not an object; and a client's
`kv_transfer_params`, which never reaches an engine. In-process fake engines over real HTTP
that record what they were sent."""

from __future__ import annotations

import argparse
import asyncio
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from poolpilot.router.app import Router
from poolpilot.router.balancer import BalancerConfig
from poolpilot.router.config import RouterConfig
from poolpilot.router.main import UsageError, add_arguments, config_from_args
from poolpilot.router.validate import MAX_DEPTH
from poolpilot.testkit.aiohttp_apps import serve, url_of

from poolpilot.roles import Mode, Role

KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "p",
      "remote_block_ids": [1], "remote_host": "127.0.0.1", "remote_port": 1}
MODES = [Mode.DISAGGREGATED, Mode.AGGREGATED]


@dataclass
class FakeEngines:
    """Every body each engine was sent, by role."""

    bodies: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def app(self, role: str) -> web.Application:
        async def generate(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            self.bodies.setdefault(role, []).append(body)
            if role == Role.PREFILL:
                return web.json_response({"choices": [{"text": "P"}],
                                          "kv_transfer_params": KV})
            if body.get("stream") is True:  # streams on the canonical value only
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
                for text in ("D", "E"):
                    chunk = {"choices": [{"index": 0, "text": text, "finish_reason": None}]}
                    await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
                return resp
            return web.json_response({"choices": [{"text": "D", "finish_reason": "length"}]})

        app = web.Application()
        app.router.add_post("/v1/completions", generate)
        app.router.add_post("/v1/chat/completions", generate)
        return app

    def sent(self) -> int:
        return sum(len(b) for b in self.bodies.values())


@asynccontextmanager
async def router_for(mode: Mode, engines: FakeEngines,
                     **config: Any) -> AsyncIterator[tuple[Router, str]]:
    """A router (`mode`) in front of fake engines; yields it and its URL."""
    roles = [Role.PREFILL, Role.DECODE] if mode == Mode.DISAGGREGATED else [Role.ENGINE]
    servers = [serve(engines.app(role)) for role in roles]
    started = [await anext(s) for s in servers]
    router = Router(RouterConfig(mode=mode, health_interval_s=0, kv_lease_s=None,
                                 prefix_routing="off", balancer=BalancerConfig(ramp_s=0),
                                 **config))
    for role, server in zip(roles, started, strict=True):
        router.set_endpoints(role, [url_of(server)], initial=True)
    routed = serve(router.build_app())
    try:
        yield router, url_of(await anext(routed))
    finally:
        for s in [routed, *servers]:
            await s.aclose()


def counted(router: Router, code: int) -> float:
    value: float = router.metrics.requests.labels("default", str(code))._value.get()
    return value


async def post(url: str, data: bytes, path: str = "/v1/completions",
               headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(
            url + path, data=data, headers={"Content-Type": "application/json",
                                            **(headers or {})}) as resp:
        return resp.status, orjson.loads(await resp.read())


def nested(levels: int) -> str:
    """A JSON value of `levels` nested arrays."""
    return "[" * levels + "]" * levels


# -- bodies nested deeper than the router can forward ------------------------------------------

@pytest.mark.parametrize("mode", MODES)
async def test_a_body_nested_deeper_than_the_router_forwards_is_a_400_sent_nowhere(
        mode: Mode) -> None:
    """orjson reads 1024 levels but writes only MAX_DEPTH: a body in between was parsed and
    then failed on its way to the engine as a 500 "internal router error"."""
    engines = FakeEngines()
    async with router_for(mode, engines) as (router, url):
        # The top-level object is one level: MAX_DEPTH in all is forwarded.
        ok = f'{{"model": "m", "prompt": "hi", "max_tokens": 3, "x": {nested(MAX_DEPTH - 1)}}}'
        assert (await post(url, ok.encode()))[0] == 200
        sent = engines.sent()
        for levels in (MAX_DEPTH, 600, 1023, 1500):  # 1500: past what orjson reads at all
            deep = f'{{"model": "m", "prompt": "hi", "max_tokens": 3, "x": {nested(levels)}}}'
            status, body = await post(url, deep.encode())
            assert status == 400, (levels, body)
            assert body["error"]["type"] == "invalid_request_error"
            assert f"more than {MAX_DEPTH} levels" in body["error"]["message"]
        chat = (f'{{"model": "m", "max_tokens": 3, "messages": [{{"role": "user", '
                f'"content": "hi", "x": {nested(300)}}}]}}')  # deep inside a message
        status, body = await post(url, chat.encode(), path="/v1/chat/completions")
        assert status == 400, body
        assert engines.sent() == sent  # none of them reached an engine
        assert counted(router, 400) == 5 and counted(router, 500) == 0


# -- a body that stalls or trickles after its headers --------------------------------------------

HEADERS = (b"POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
           b"Content-Length: 100\r\n\r\n")


async def read_all(reader: asyncio.StreamReader, within_s: float) -> bytes:
    """Everything the router sends until it closes the connection (fails past `within_s`)."""
    async with asyncio.timeout(within_s):
        return await reader.read()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("trickle", [False, True], ids=["stalled", "trickled"])
async def test_a_body_that_stalls_after_its_headers_gets_a_408_and_the_connection_closes(
        mode: Mode, trickle: bool) -> None:
    """The header deadline ended with the headers, and nothing bounded the body: such a
    connection stayed open for ever (a few thousand of them took the router offline)."""
    engines = FakeEngines()
    async with router_for(mode, engines, body_timeout_s=0.5) as (router, url):
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(HEADERS + b"{")
        await writer.drain()

        async def trickling() -> None:  # one byte every 0.1 s: never done, never silent
            while trickle:
                await asyncio.sleep(0.1)
                writer.write(b" ")
                await writer.drain()

        feeder = asyncio.create_task(trickling())
        start = asyncio.get_running_loop().time()
        try:
            answer = await read_all(reader, within_s=5)
        finally:
            feeder.cancel()
            with suppress(asyncio.CancelledError, ConnectionError):
                await feeder
            writer.close()
        took = asyncio.get_running_loop().time() - start
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer
        assert b"connection: close" in head.lower()
        error = orjson.loads(payload)["error"]
        assert error["code"] == 408 and "request body" in error["message"], error
        assert took < 2.5, took  # the deadline (0.5 s), not aiohttp's lingering (10 s)
        assert engines.sent() == 0
        assert counted(router, 408) == 1
        # A whole body on a new connection is served as before.
        status, _ = await post(url, b'{"model": "m", "prompt": "hi", "max_tokens": 3}')
        assert status == 200


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--engine", "http://e:1", *argv])


def test_the_body_timeout_flag() -> None:
    assert config_from_args(parse()).body_timeout_s == 30.0
    assert config_from_args(parse("--body-timeout", "2.5")).body_timeout_s == 2.5
    for bad in ("0", "-1", "nan", "inf"):
        with pytest.raises(UsageError, match=r"^--body-timeout "):
            config_from_args(parse("--body-timeout", bad))


# -- a body that does not decompress -------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_body_that_does_not_decompress_is_a_counted_400(mode: Mode,
                                                                encoding: str) -> None:
    """aiohttp's RequestPayloadError reached the error middleware: a 500 "internal router
    error" with a traceback, and not counted in requests_total."""
    engines = FakeEngines()
    async with router_for(mode, engines) as (router, url):
        status, body = await post(url, b"not compressed at all",
                                  headers={"Content-Encoding": encoding})
        assert status == 400, body
        error = body["error"]
        assert error["type"] == "invalid_request_error"
        assert f"could not be decoded (Content-Encoding: {encoding})" in error["message"]
        assert engines.sent() == 0
        assert counted(router, 400) == 1 and counted(router, 500) == 0
        # A body that does decompress is served.
        packer = zlib.compressobj(wbits=31 if encoding == "gzip" else 15)
        good = packer.compress(b'{"model": "m", "prompt": "hi", "max_tokens": 3}')
        status, _ = await post(url, good + packer.flush(),
                               headers={"Content-Encoding": encoding})
        assert status == 200


# -- stream_options that is not an object --------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("options", ["yes", [1], True, 1])
async def test_stream_options_that_is_not_an_object_is_a_400_naming_it(
        mode: Mode, options: Any) -> None:
    """It reached the engine, which broke the stream (engine-sim) or refused it: a 502,
    charged to the engine, and two at once ejected a healthy one."""
    engines = FakeEngines()
    async with router_for(mode, engines) as (router, url):
        status, body = await post(url, orjson.dumps(
            {"model": "m", "prompt": "hi", "max_tokens": 3, "stream": True,
             "stream_options": options}))
        assert status == 400, body
        assert body["error"]["param"] == "stream_options"
        assert '{"include_usage": true}' in body["error"]["message"]
        assert engines.sent() == 0
        assert counted(router, 400) == 1


# -- a client's kv_transfer_params ---------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
async def test_a_clients_kv_transfer_params_never_reach_an_engine(mode: Mode) -> None:
    """Aggregated mode forwarded them: a client pinned KV on the engine and read its address
    and block ids in the answer."""
    engines = FakeEngines()
    client_kv = {"do_remote_decode": True, "remote_host": "client"}
    async with router_for(mode, engines) as (_, url):
        for path, prompt in (("/v1/completions", {"prompt": "hi"}),
                             ("/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "hi"}]})):
            status, _ = await post(url, orjson.dumps(
                {"model": "m", "max_tokens": 3, "kv_transfer_params": client_kv, **prompt}),
                path=path)
            assert status == 200
    bodies = [b for sent in engines.bodies.values() for b in sent]
    assert len(bodies) == (4 if mode == Mode.DISAGGREGATED else 2)
    for body in bodies:
        kv = body.get("kv_transfer_params")
        assert kv is None or kv.get("remote_host") != "client", body
    if mode == Mode.AGGREGATED:
        assert all("kv_transfer_params" not in b for b in bodies)


# -- lax values, read as vLLM reads them ---------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
async def test_lax_values_are_served_as_vllm_serves_them(mode: Mode) -> None:
    """vLLM reads `"stream": "true"` as true and `"max_tokens": "5"` as 5 (pydantic's lax
    mode): a disaggregated pool refused such a request ("stream must be true or false") and
    an aggregated one answered the engine's stream as one JSON body. Now the client gets the
    stream and every engine the canonical values."""
    engines = FakeEngines()
    async with router_for(mode, engines) as (router, url):
        async with aiohttp.ClientSession() as session, session.post(
                url + "/v1/completions", data=orjson.dumps(
                    {"model": "m", "prompt": "hi", "max_tokens": "5", "n": "1",
                     "stream": "true"}),
                headers={"Content-Type": "application/json"}) as resp:
            text = (await resp.read()).decode()
            assert resp.status == 200, text
            assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert text.rstrip().endswith("data: [DONE]") and '"text":"E"' in text
        assert counted(router, 200) == 1
    role = Role.DECODE if mode == Mode.DISAGGREGATED else Role.ENGINE
    [served] = engines.bodies[role]
    assert served["stream"] is True and served["max_tokens"] == 5 and served["n"] == 1
    for body in engines.bodies.get(Role.PREFILL, []):  # the prefill step: one token, no stream
        assert body["stream"] is False and body["max_tokens"] == 1


@pytest.mark.parametrize("mode", MODES)
async def test_a_value_vllm_cannot_read_is_still_a_400_naming_it(mode: Mode) -> None:
    engines = FakeEngines()
    async with router_for(mode, engines) as (_, url):
        status, body = await post(url, orjson.dumps(
            {"model": "m", "prompt": "hi", "max_tokens": 3, "stream": 2,
             "stream_options": {"include_usage": True}}))
    if mode == Mode.DISAGGREGATED:
        assert status == 400 and body["error"]["param"] == "stream", body
        assert engines.sent() == 0
    else:  # an aggregated engine refuses it itself (vLLM: "Input should be a valid boolean")
        assert engines.bodies[Role.ENGINE][0]["stream"] == 2
