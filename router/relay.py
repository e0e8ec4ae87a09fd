"""Passing an engine's answer to the client: a whole body, or a stream relayed event by event
(TTFT and ITL measured on the way), and the in-band error when a stream breaks after its
status line went out. Also the state of one request's attempts (Progress, Attempt)."""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from poolpilot.router.balancer import Endpoint
from poolpilot.router.config import RouterConfig, floored
from poolpilot.router.deadline_budget import DeadlineBudget
from poolpilot.router.errors import (
    DECODE_FAILED,
    KV_LOAD_FAILED,
    KV_PULL_SLOW,
    HandoffFailed,
    UpstreamError,
    error_body,
    json_error,
)
from poolpilot.router.kv_lease import KvLease
from poolpilot.router.metrics import RouterMetrics

from poolpilot.clock import Clock

log = logging.getLogger("poolpilot.router")


@dataclass
class Progress:
    """How far one client request got (for the status it is recorded with, and for whether
    the prefill's KV still waits for a decode engine)."""

    stream: bool = False
    kv: dict[str, Any] | None = None  # the prefill's transfer parameters, once it answered
    lease: KvLease | None = None  # ... and how long the prefill engine holds them
    decode_sent: bool = False  # the decode request left for an engine
    decode_url: str | None = None  # ... this one
    decode_answered: bool = False  # ... and the engine answered (status line)
    done_sent: bool = False  # the stream's [DONE] reached the client
    # What the request may still wait on engines for its first token, shared by its attempts.
    budget: DeadlineBudget = field(default_factory=lambda: DeadlineBudget(None))

    def kv_unclaimed(self) -> bool:
        """No decode engine has taken the prefill's KV over. An engine that has the request
        aborts it when the router closes the connection (vLLM then frees the prefill's
        blocks itself); a streaming engine answers its status line once it has queued the
        request, a non-streaming one only when done."""
        if self.kv is None:
            return False
        return not self.decode_sent or (self.stream and not self.decode_answered)


@dataclass
class Attempt:
    """One upstream request in flight: where it went and what was queued there before it."""

    endpoint: Endpoint
    resp: aiohttp.ClientResponse
    sent_at: float  # simulated seconds (the router's clock.now())
    queued_tokens: int  # tokens in flight at that endpoint when sent, this request's included
    local_tokens: int = 0  # prompt tokens it prefills itself, until its first token
    matched_tokens: int = 0  # prompt tokens it was expected to hold in its prefix cache
    # A stream's first token is due by this clock reading (counted from the send, so the wait
    # for the status line and the one for the first event share one deadline); None: no
    # deadline (not a stream, or deadlines off).
    first_token_by: float | None = None


class FirstTokenStalled(UpstreamError):
    """A stream sent no first token within its deadline and nothing reached the client: the
    request may still go to another engine."""


class StreamRelay:
    """The relay half of the Router (router/app.py), which provides what is declared here."""

    clock: Clock
    config: RouterConfig
    metrics: RouterMetrics
    # Per engine URL: when a stream from it last brought bytes (the router's clock.now()).
    heard_from: dict[str, float]

    def _failed(self, url: str) -> None:
        raise NotImplementedError

    def _speaks_until(self, url: str, stall_s: float | None) -> float | None:
        """When the engine at `url` will have been silent for a whole decode deadline, if
        that is still ahead: it is slow (busy, preempting), not hung, while its other streams
        move; None once it has been silent that long (hung) or without a deadline."""
        heard = self.heard_from.get(url)
        if heard is None or stall_s is None:
            return None
        until = heard + stall_s
        return until if until > self.clock.now() else None

    def _settle_local(self, att: Attempt) -> None:
        raise NotImplementedError

    async def _relay(
        self, request: web.Request, att: Attempt, stream: bool, start: float,
        progress: Progress, handoff: bool = False,
    ) -> tuple[web.StreamResponse, int]:
        """Pass the engine's answer to the client. With `handoff` (a decode after a prefill),
        a failure before anything reached the client raises HandoffFailed so the request can
        be served another way; the client's status line waits for the first event for that."""
        upstream, endpoint = att.resp, att.endpoint
        if not stream:
            try:
                body = await upstream.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                self._failed(endpoint.url)
                error = UpstreamError(endpoint.url, 502, f"engine failed mid-response: {exc!r}")
                if handoff:
                    raise HandoffFailed(error) from exc
                return json_error(502, error.message, "upstream_error"), 502
            self._settle_local(att)
            return web.Response(status=upstream.status, body=body,
                                content_type=upstream.content_type), upstream.status

        response: web.StreamResponse | None = None
        last_event: float | None = None
        buffer = b""
        chunks = upstream.content.iter_any().__aiter__()
        stall_s = self._token_deadlines(handoff)[1]
        alive_until: float | None = None  # re-armed while the engine speaks on other streams
        while True:
            # What is left of `window`, the wait's whole deadline (simulated seconds).
            deadline: float | None
            if alive_until is not None:
                deadline, window = max(0.0, alive_until - self.clock.now()), stall_s
            elif last_event is not None:
                deadline = window = stall_s
            elif att.first_token_by is not None:
                deadline = max(0.0, att.first_token_by - self.clock.now())
                window = att.first_token_by - att.sent_at
            else:
                deadline = window = None
            timer = asyncio.timeout(None if deadline is None else self.clock.real(deadline))
            try:
                async with timer:
                    chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except (aiohttp.ClientError, TimeoutError) as exc:
                stalled = timer.expired()
                if stalled and (until := self._speaks_until(endpoint.url, stall_s)) is not None:
                    # A slow engine, not a hung one: this stream waits (or the sole decode
                    # engine of a pool at 10x its step time is ejected and every request
                    # answered 503) until the engine has been silent a whole deadline.
                    alive_until = until
                    continue
                failure: BaseException = exc
                if stalled:
                    failure = TimeoutError(f"no token within the decode deadline "
                                           f"({window or 0:.3g} s)")
                    if response is None:  # hung before its first token: the grace starts
                        progress.budget.missed(self.clock.now())
                if response is None:  # nothing sent yet: a proper status line
                    status = 504 if isinstance(exc, TimeoutError) else 502
                    message = f"engine failed before its first token: {failure!r}"
                    slow_pull = handoff and stalled
                    if not slow_pull:  # a slow pull is charged by the caller (router/app.py)
                        self._failed(endpoint.url)
                    if handoff:
                        raise HandoffFailed(UpstreamError(endpoint.url, status, message),
                                            KV_PULL_SLOW if slow_pull else DECODE_FAILED) \
                            from exc
                    if stalled:  # another engine may take it (the caller retries)
                        raise FirstTokenStalled(endpoint.url, status, message) from exc
                    return json_error(status, message, "upstream_error"), status
                return await self._stream_broke(response, endpoint, failure, handoff), 502
            alive_until = None
            self.heard_from[endpoint.url] = self.clock.now()
            if not buffer and chunk.endswith(b"\n\n"):
                complete = chunk  # the usual case: whole events, passed on as they are
            else:
                buffer += chunk
                cut = buffer.rfind(b"\n\n")
                if cut < 0:
                    continue
                complete, buffer = buffer[: cut + 2], buffer[cut + 2 :]
            now = self.clock.now()
            if response is None:
                if handoff and complete.startswith(b'data: {"error"'):
                    # vLLM reports a failed KV load in the stream's first event.
                    error = UpstreamError(endpoint.url, 502, "decode engine failed before its "
                                          f"first token: {complete[:300].decode(errors='replace')}")
                    raise HandoffFailed(error, KV_LOAD_FAILED)
                response = web.StreamResponse(
                    status=200,
                    headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
                )
                try:
                    await response.prepare(request)
                except ConnectionError:
                    return response, 499
            done = complete.count(b"data: [DONE]")
            events = complete.count(b"data: ") - done
            if events > 0:
                # Events that arrive together reach the client together: gaps of 0.
                if last_event is None:
                    self._settle_local(att)
                    self.metrics.ttft_pool.observe(now - start)
                    events -= 1
                else:
                    self.metrics.itl_pool.observe(now - last_event)
                    events -= 1
                for _ in range(events):
                    self.metrics.itl_pool.observe(0.0)
                last_event = now
            try:
                await response.write(complete)
            except ConnectionError:
                return response, 499  # client gone; leaving closes the upstream request
            if done:
                progress.done_sent = True
        if response is None:  # the engine ended the stream without a single event
            error = UpstreamError(endpoint.url, 502, "engine ended the stream without events")
            if handoff:
                raise HandoffFailed(error)
            return json_error(502, error.message, "upstream_error"), 502
        try:
            if buffer:
                await response.write(buffer)
            await response.write_eof()
        except ConnectionError:
            # A client may close the connection as soon as it has read [DONE] (guidellm does).
            return response, 200 if progress.done_sent else 499
        return response, 200

    def _token_deadlines(self, handoff: bool) -> tuple[float | None, float | None]:
        """Simulated seconds a stream may wait for its first token, then between tokens (None:
        only the session's idle timeout). A decode after a handoff starts from the prefill's
        KV; an engine that prefills the prompt itself also has the prefill deadline for it."""
        stall = floored(self.config.decode_stall_s, self.clock)
        if stall is None or handoff:
            return stall, stall
        prefill = floored(self.config.prefill_deadline_s, self.clock)
        return None if prefill is None else prefill + stall, stall

    async def _stream_broke(
        self, response: web.StreamResponse, endpoint: Endpoint, exc: BaseException,
        handoff: bool,
    ) -> web.StreamResponse:
        """The engine died or stalled mid-stream: tell the client in-band (the status line is
        gone already), in the shape OpenAI clients raise on, then end the stream."""
        self._failed(endpoint.url)
        if handoff:
            self.metrics.kv_failures_pool.inc()
        log.warning("stream from %s broke: %r", endpoint.url, exc)
        err = error_body(502, f"engine failed mid-stream: {exc!r}", "upstream_error")
        with suppress(ConnectionError):
            await response.write(b"data: " + json.dumps(err).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        return response
