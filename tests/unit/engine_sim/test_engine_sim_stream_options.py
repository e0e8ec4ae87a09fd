"""engine-sim's `stream_options`: a value that is not an object is a 400 naming it, as vLLM's
request model answers (the simulator used to start the stream, fail on it and drop the
connection, which a router counted as an engine failure); an object is honoured."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from poolpilot.engine_sim.server import SimServer, SimServerConfig
from poolpilot.testkit.aiohttp_apps import serve, url_of

MODEL = "m"


async def post(path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    sim = SimServer(SimServerConfig(speed=float("inf"), served_name=MODEL))
    served = serve(sim.app())
    try:
        async with aiohttp.ClientSession() as session, session.post(
                url_of(await anext(served)) + path, json=body) as resp:
            return resp.status, await resp.read()
    finally:
        await served.aclose()  # the engine stops and closes its session


@pytest.mark.parametrize("path,prompt", [
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
], ids=["completions", "chat"])
@pytest.mark.parametrize("options", ["yes", [1], 1])
async def test_stream_options_that_is_not_an_object_is_a_400(path: str, prompt: dict[str, Any],
                                                             options: Any) -> None:
    status, raw = await post(path, {"model": MODEL, "max_tokens": 3, "stream": True,
                                    "stream_options": options, **prompt})
    assert status == 400, raw
    error = orjson.loads(raw)["error"]
    assert (error["param"], error["type"]) == ("stream_options", "BadRequestError")
    assert "must be an object" in error["message"]


async def test_stream_options_include_usage_still_ends_with_a_usage_chunk() -> None:
    status, raw = await post("/v1/completions", {
        "model": MODEL, "prompt": "hi", "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True}})
    assert status == 200
    events = [line.removeprefix(b"data: ") for line in raw.split(b"\n\n") if line]
    assert events[-1] == b"[DONE]"
    usage = orjson.loads(events[-2])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
