"""Limits of the router's own HTTP server that aiohttp does not set: a deadline for a new
connection's first request headers, and a cap on open client connections.

aiohttp closes a connection that sends nothing, or stays idle between requests, after its
keep-alive timeout (--keepalive-timeout), and refuses over-long request lines and header
fields (8 KiB each) and more than 32 KiB of headers; it has no separate deadline for headers
sent a byte at a time, nor a connection cap, so a few hundred slow clients could hold the
router's sockets and memory. The guard wraps aiohttp's protocol factory (its web.Server):
a connection over the cap is closed as soon as it is accepted, one whose first request's
headers are not complete within the deadline is closed then. Later requests on a kept-alive
connection are bounded by the keep-alive timeout, which aiohttp applies while it waits for a
whole request. The body after the headers has its own deadline (--body-timeout), kept by the
request handler (router/app.py), which reads it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

log = logging.getLogger("poolpilot.router")

HEADERS_END = b"\r\n\r\n"


@dataclass(frozen=True)
class ServerLimits:
    header_timeout_s: float | None = 10.0  # None: only the keep-alive timeout
    max_connections: int = 4096  # per router process


class Guard:
    """Counts open connections and makes one guarded protocol per accepted connection."""

    def __init__(self, server: web.Server, limits: ServerLimits) -> None:
        self.server = server
        self.limits = limits
        self.open = 0
        self.refused = 0
        self.timed_out = 0
        self._warned_at = -1e9

    def __call__(self) -> asyncio.Protocol:
        return _Guarded(self)

    def __getattr__(self, name: str) -> Any:  # the runner's shutdown, connections, ...
        return getattr(self.server, name)

    def refuse(self, transport: asyncio.BaseTransport) -> None:
        self.refused += 1
        now = asyncio.get_running_loop().time()
        if now - self._warned_at > 10:  # at most one line per 10 s under a flood
            self._warned_at = now
            log.warning("refusing client connections: %d open (--max-connections); %d refused "
                        "so far", self.open, self.refused)
        cast(asyncio.Transport, transport).abort()


class _Guarded(asyncio.Protocol):
    """aiohttp's RequestHandler behind the cap and the header deadline."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.BaseTransport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.tail = b""  # the last bytes seen, for a header end split across reads

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        g = self.guard
        if g.open >= g.limits.max_connections:
            g.refuse(transport)
            return
        g.open += 1
        self.transport = transport
        self.inner = cast(asyncio.Protocol, g.server())
        self.inner.connection_made(transport)
        if g.limits.header_timeout_s is not None:
            self.timer = asyncio.get_running_loop().call_later(g.limits.header_timeout_s,
                                                               self._too_slow)

    def _too_slow(self) -> None:
        self.timer = None
        self.guard.timed_out += 1
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.timer is not None:
            seen = self.tail + data
            if HEADERS_END in seen:
                self.timer.cancel()
                self.timer = None
            else:
                self.tail = seen[-(len(HEADERS_END) - 1):]
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.inner is not None:
            self.guard.open -= 1
            self.inner.connection_lost(exc)
            self.inner = None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()


class GuardedRunner(web.AppRunner):
    """An AppRunner whose sites accept connections through a Guard."""

    def __init__(self, app: web.Application, limits: ServerLimits, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.limits = limits
        self.guard: Guard | None = None

    async def _make_server(self) -> web.Server:
        self.guard = Guard(await super()._make_server(), self.limits)
        return cast(web.Server, self.guard)
