"""In-process aiohttp apps on loopback for tests: real HTTP, no subprocess."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.test_utils import TestServer


async def serve(app: web.Application) -> AsyncIterator[TestServer]:
    """`async for server in serve(app)`: the app listens on 127.0.0.1 for the loop's body,
    and is closed after it."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


def url_of(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")
