"""The router's aiohttp server: OpenAI-compatible endpoints in front of the engines.

Disaggregated: prefill on one engine, KV handed over, decode (and stream) on another.
Aggregated: forward to one engine. Selection and health live in balancer.py (pure);
this module does the I/O: proxying, streaming, retries, health checks, metrics, draining.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from poolpilot.router import pd
from poolpilot.router.balancer import Balancer, BalancerConfig, Endpoint
from poolpilot.router.metrics import RouterMetrics, parse_waiting
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("poolpilot.router")

DISAGGREGATED = "disaggregated"
AGGREGATED = "aggregated"
# Upstream answers that mean "this engine cannot take it now": try another one.
RETRYABLE_STATUS = {502, 503, 504}


@dataclass
class RouterConfig:
    mode: str = DISAGGREGATED
    pool: str = "default"
    max_request_bytes: int = 8 * 1024 * 1024
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 600.0  # whole request, prefill included
    idle_timeout_s: float = 120.0  # longest silence from an engine mid-response
    max_attempts: int = 3  # per phase, on different endpoints
    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    drain_timeout_s: float = 30.0
    # Latencies are recorded times this factor: the sandbox runs engines `speed` times faster
    # than real time and every component reports simulated seconds (one clock).
    speed: float = 1.0
    balancer: BalancerConfig = field(default_factory=BalancerConfig)

    def roles(self) -> tuple[str, ...]:
        return ("prefill", "decode") if self.mode == DISAGGREGATED else ("engine",)


class UpstreamError(Exception):
    """An engine failed before its response started (safe to retry elsewhere)."""

    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url
        self.status = status
        self.message = message


class ClientError(Exception):
    """The request is wrong; the engine's 4xx answer is passed back as is."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.content_type = content_type


def error_body(status: int, message: str, kind: str) -> dict[str, Any]:
    # The shape OpenAI clients parse (and vLLM sends).
    return {"error": {"message": message, "type": kind, "code": status}}


def json_error(status: int, message: str, kind: str = "router_error") -> web.Response:
    return web.json_response(error_body(status, message, kind), status=status)


class Router:
    def __init__(self, config: RouterConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.balancer = Balancer(config.balancer)
        self.metrics = RouterMetrics(config.pool)
        self.session: aiohttp.ClientSession | None = None
        self.draining = False
        self.active = 0  # client requests being served
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task[None]] = []

    # -- membership (called by discovery) ----------------------------------------------------

    def set_endpoints(self, role: str, urls: list[str], initial: bool = False) -> None:
        added, removed = self.balancer.set_endpoints(role, urls, self.clock(), initial=initial)
        if added or removed:
            log.info("endpoints role=%s added=%s removed=%s", role, added, removed)

    # -- lifecycle ---------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_request_bytes)
        app.router.add_post("/v1/completions", self.handle_generate)
        app.router.add_post("/v1/chat/completions", self.handle_generate)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/ready", self.handle_ready)
        app.router.add_get("/metrics", self.handle_metrics)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        c = self.config
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(
                total=c.request_timeout_s, sock_connect=c.connect_timeout_s,
                sock_read=c.idle_timeout_s,
            ),
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=10),
            auto_decompress=False,
        )
        if c.health_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._health_loop()))

    async def _on_cleanup(self, app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with suppress(asyncio.CancelledError):
                await task
        if self.session is not None:
            await self.session.close()

    async def drain(self) -> bool:
        """Stop taking requests and wait for the in-flight ones; True if all finished."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), self.config.drain_timeout_s)
            return True
        except TimeoutError:
            log.warning("drain timeout: %d requests still in flight", self.active)
            return False

    # -- health checks and load scraping -----------------------------------------------------

    async def _health_loop(self) -> None:
        while True:
            urls = self.balancer.urls()
            await asyncio.gather(*(self._check(url) for url in urls), return_exceptions=True)
            await asyncio.sleep(self.config.health_interval_s)

    async def _check(self, url: str) -> None:
        assert self.session is not None
        timeout = aiohttp.ClientTimeout(total=self.config.health_timeout_s)
        ok = False
        try:
            async with self.session.get(url + "/health", timeout=timeout) as resp:
                ok = resp.status == 200
            if ok:
                async with self.session.get(url + "/metrics", timeout=timeout) as resp:
                    if resp.status == 200:
                        waiting = parse_waiting(await resp.text())
                        if waiting is not None:
                            self.balancer.update_waiting(url, waiting)
        except (aiohttp.ClientError, TimeoutError):
            pass
        ejected, readmitted = self.balancer.report_health(url, ok, self.clock())
        self._log_ejections(ejected)
        for e in readmitted:
            log.info("re-admitted %s endpoint %s (health check passed)", e.role, e.url)

    def _failed(self, url: str) -> None:
        self._log_ejections(self.balancer.report_failure(url, self.clock()))

    def _log_ejections(self, ejected: list[Endpoint]) -> None:
        for e in ejected:
            assert e.ejected_until is not None
            log.warning("ejected %s endpoint %s for %.1f s after %d consecutive failures",
                        e.role, e.url, e.ejected_until - self.clock(), e.failures)

    # -- small endpoints ---------------------------------------------------------------------

    async def handle_health(self, request: web.Request) -> web.Response:
        if self.draining:
            return json_error(503, "draining", "unavailable")
        return web.json_response({"status": "ok"})

    async def handle_ready(self, request: web.Request) -> web.Response:
        """Ready when not draining and every role has an admitted endpoint."""
        missing = [
            role for role in self.config.roles()
            if not any(not e.ejected() for e in self.balancer.role_endpoints(role))
        ]
        if self.draining or missing:
            reason = "draining" if self.draining else f"no healthy {', '.join(missing)} engine"
            return json_error(503, reason, "unavailable")
        return web.json_response({"status": "ready"})

    async def handle_metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_models(self, request: web.Request) -> web.Response:
        assert self.session is not None
        role = "decode" if self.config.mode == DISAGGREGATED else "engine"
        tried: list[str] = []
        for _ in range(self.config.max_attempts):
            endpoint = self.balancer.pick(role, self.clock(), exclude=tried)
            if endpoint is None:
                break
            tried.append(endpoint.url)
            try:
                async with self.session.get(endpoint.url + "/v1/models") as resp:
                    body = await resp.read()
                    if resp.status == 200:
                        return web.Response(body=body, content_type="application/json")
            except (aiohttp.ClientError, TimeoutError):
                self._failed(endpoint.url)
        return json_error(503, f"no {role} engine answered /v1/models", "unavailable")

    # -- generation --------------------------------------------------------------------------

    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        start = self.clock()
        if self.draining:
            self.metrics.observe_request(503)
            return json_error(503, "router is shutting down; retry", "unavailable")
        try:
            body = await request.json()
        except web.HTTPRequestEntityTooLarge:
            self.metrics.observe_request(413)
            return json_error(
                413, f"request body larger than {self.config.max_request_bytes} bytes",
                "invalid_request_error",
            )
        except ValueError:
            self.metrics.observe_request(400)
            return json_error(400, "request body is not valid JSON", "invalid_request_error")
        if not isinstance(body, dict):
            self.metrics.observe_request(400)
            return json_error(400, "request body must be a JSON object", "invalid_request_error")
        self.active += 1
        self._idle.clear()
        code = 500
        try:
            response, code = await self._generate(request, body, start)
            return response
        except asyncio.CancelledError:
            code = 499  # the client went away; upstream connections closed on the way out
            raise
        finally:
            self.metrics.observe_request(code)
            self.metrics.e2e_pool.observe((self.clock() - start) * self.config.speed)
            self.active -= 1
            if self.active == 0:
                self._idle.set()

    async def _generate(
        self, request: web.Request, body: dict[str, Any], start: float
    ) -> tuple[web.StreamResponse, int]:
        path = request.path
        prompt_tokens = pd.estimate_prompt_tokens(body)
        try:
            if self.config.mode == DISAGGREGATED:
                prefill = await self._prefill(path, body, prompt_tokens)
                forward = pd.decode_body(body, pd.kv_params_from_prefill(prefill))
                role = "decode"
            else:
                forward, role = body, "engine"
            tokens = prompt_tokens + pd.requested_output_tokens(body)
            async with self._open(role, path, forward, tokens) as (endpoint, upstream):
                return await self._relay(request, upstream, endpoint, bool(body.get("stream")),
                                         start)
        except ClientError as exc:
            return web.Response(
                status=exc.status, body=exc.body, content_type=exc.content_type
            ), exc.status
        except UpstreamError as exc:
            # 503: no engine could take it (retry later); 504: timeout; else a bad gateway.
            status = exc.status if exc.status in (503, 504) else 502
            return json_error(status, exc.message, "upstream_error"), status

    async def _prefill(self, path: str, body: dict[str, Any], tokens: int) -> dict[str, Any]:
        """Run the prefill step; a failure (before or while reading the answer) is retried on
        another prefill engine. Returns the prefill's JSON answer."""
        failed: list[str] = []
        last: UpstreamError | None = None
        for _ in range(self.config.max_attempts):
            try:
                async with self._open("prefill", path, pd.prefill_body(body), tokens,
                                      exclude=failed) as (endpoint, resp):
                    try:
                        data = await resp.json(content_type=None)
                    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                        self._failed(endpoint.url)
                        failed.append(endpoint.url)
                        last = UpstreamError(endpoint.url, 502,
                                             f"prefill answer unreadable: {exc!r}")
                        continue
                if not isinstance(data, dict):
                    raise UpstreamError(str(resp.url), 502, "prefill answer is not an object")
                return data
            except UpstreamError as exc:
                # _open already tried every endpoint it could: give up.
                if last is None:
                    raise
                raise last from exc
        assert last is not None
        raise last

    @asynccontextmanager
    async def _open(
        self, role: str, path: str, body: dict[str, Any], tokens: int,
        exclude: list[str] | None = None,
    ) -> AsyncIterator[tuple[Endpoint, aiohttp.ClientResponse]]:
        """Send `body` to an endpoint of `role` and yield the open response once its status
        is 2xx. Connection failures and 502/503/504 are retried on other endpoints (nothing
        has reached the client yet); 4xx is the client's fault and is passed back."""
        assert self.session is not None
        tried: list[str] = list(exclude or [])
        last: UpstreamError | None = None
        gauge = self.metrics.inflight_role[role]
        for _ in range(self.config.max_attempts):
            endpoint = self.balancer.pick(role, self.clock(), exclude=tried)
            if endpoint is None:
                break
            tried.append(endpoint.url)
            self.balancer.acquire(endpoint.url, tokens)
            gauge.inc()
            try:
                try:
                    resp = await self.session.post(endpoint.url + path, json=body)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    self._failed(endpoint.url)
                    status = 504 if isinstance(exc, TimeoutError) else 502
                    last = UpstreamError(endpoint.url, status, f"{role} engine failed: {exc!r}")
                    log.warning("%s", last)
                    continue
                async with resp:
                    if resp.status in RETRYABLE_STATUS or resp.status >= 500:
                        text = (await resp.read())[:500].decode(errors="replace")
                        if resp.status in RETRYABLE_STATUS:
                            self._failed(endpoint.url)
                        if role == "decode" and resp.status not in RETRYABLE_STATUS:
                            self.metrics.kv_failures_pool.inc()
                        last = UpstreamError(
                            endpoint.url, resp.status, f"{role} engine answered "
                            f"{resp.status}: {text}"
                        )
                        log.warning("%s", last)
                        if resp.status not in RETRYABLE_STATUS:
                            raise last
                        continue
                    if resp.status >= 400:
                        raise ClientError(resp.status, await resp.read(),
                                          resp.content_type or "application/json")
                    self.balancer.report_success(endpoint.url)
                    yield endpoint, resp
                    return
            finally:
                gauge.dec()
                self.balancer.release(endpoint.url, tokens)
        if last is None:
            last = UpstreamError("-", 503, f"no {role} engine available")
        raise last

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse, endpoint: Endpoint,
        stream: bool, start: float,
    ) -> tuple[web.StreamResponse, int]:
        if not stream:
            try:
                body = await upstream.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                self._failed(endpoint.url)
                if self.config.mode == DISAGGREGATED:
                    self.metrics.kv_failures_pool.inc()
                return json_error(502, f"engine failed mid-response: {exc!r}",
                                  "upstream_error"), 502
            return web.Response(status=upstream.status, body=body,
                                content_type=upstream.content_type), upstream.status

        response = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        )
        await response.prepare(request)
        last_event: float | None = None
        buffer = b""
        chunks = upstream.content.iter_any().__aiter__()
        while True:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except (aiohttp.ClientError, TimeoutError) as exc:
                return await self._stream_broke(response, endpoint, exc), 502
            buffer += chunk
            cut = buffer.rfind(b"\n\n")
            if cut < 0:
                continue
            complete, buffer = buffer[: cut + 2], buffer[cut + 2 :]
            now = self.clock()
            events = complete.count(b"data: ") - complete.count(b"data: [DONE]")
            if events > 0:
                # Events that arrive together reach the client together: gaps of 0.
                if last_event is None:
                    self.metrics.ttft_pool.observe((now - start) * self.config.speed)
                    events -= 1
                else:
                    self.metrics.itl_pool.observe((now - last_event) * self.config.speed)
                    events -= 1
                for _ in range(events):
                    self.metrics.itl_pool.observe(0.0)
                last_event = now
            try:
                await response.write(complete)
            except ConnectionError:
                return response, 499  # client gone; leaving closes the upstream request
        try:
            if buffer:
                await response.write(buffer)
            await response.write_eof()
        except ConnectionError:
            return response, 499
        return response, 200

    async def _stream_broke(
        self, response: web.StreamResponse, endpoint: Endpoint, exc: BaseException
    ) -> web.StreamResponse:
        """The engine died or stalled mid-stream: tell the client in-band (the status line is
        gone already), in the shape OpenAI clients raise on, then end the stream."""
        self._failed(endpoint.url)
        if self.config.mode == DISAGGREGATED:
            self.metrics.kv_failures_pool.inc()
        log.warning("stream from %s broke: %r", endpoint.url, exc)
        err = error_body(502, f"engine failed mid-stream: {exc!r}", "upstream_error")
        with suppress(ConnectionError):
            await response.write(b"data: " + json.dumps(err).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        return response
