"""The router's aiohttp server: OpenAI-compatible endpoints in front of the engines.

Disaggregated: prefill on one engine, KV handed over, decode (and stream) on another.
Aggregated: forward to one engine. Selection and health live in balancer.py (pure);
this module does the I/O: the HTTP handlers, the P/D flow, retries, KV releases, draining.
The health checks and load scraping are health_checks.py; the choice of engine
engine_choice.py; the relay to the client relay.py;
the configuration config.py; the errors and their OpenAI shape errors.py.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from poolpilot.router import lax_params, pd, validate
from poolpilot.router import local_prefill as lp
from poolpilot.router.balancer import Balancer
from poolpilot.router.config import PREFIX_ROUTING, RouterConfig
from poolpilot.router.deadline_budget import DeadlineBudget
from poolpilot.router.engine_choice import EngineChoice
from poolpilot.router.errors import (
    KV_LOAD_FAILED,
    KV_PULL_SLOW,
    NO_ENDPOINT,
    ClientError,
    HandoffFailed,
    UpstreamError,
    json_error,
    openai_errors,
)
from poolpilot.router.health_checks import HealthChecks
from poolpilot.router.kv_lease import GIVEN_UP_HORIZON_S, PICKUP_S, GivenUp, KvLease, LeaseRanOut
from poolpilot.router.metrics import (
    HandoffCounters,
    RouterMetrics,
)
from poolpilot.router.prefill_hold import PrefillHold
from poolpilot.router.prefix_index import ApproximateIndex
from poolpilot.router.prefix_source import PrefixSource, PromptKeys
from poolpilot.router.relay import Attempt, FirstTokenStalled, Progress, StreamRelay
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

from poolpilot.clock import REAL_TIME, Clock
from poolpilot.roles import DISAGGREGATED_ROLES, Mode, Role

log = logging.getLogger("poolpilot.router")

# Idle pooled connections to engines are closed after this many seconds: before the engine
# closes them (vLLM's uvicorn after VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default). A
# connection the engine closed while idle fails the next request as it is written
# ("Cannot write request body"), with nothing sent: aiohttp's default of 15 s let that
# reach clients as a 502 under steady streaming (the vLLM drain-under-load test met it).
ENGINE_KEEPALIVE_S = 4.0

# A connection refused mid-body is closed at most this long after its answer (Apache's
# lingering close waits as long): see Router._refuse_and_close.
LINGER_S = 2.0

# Upstream answers that mean "this engine cannot take it now": try another one.
RETRYABLE_STATUS = {502, 503, 504}
JSON_HEADERS = {"Content-Type": "application/json"}


class Router(HealthChecks, EngineChoice, StreamRelay):
    def __init__(self, config: RouterConfig, clock: Clock = REAL_TIME,
                 prefix_source: PrefixSource | None = None) -> None:
        """`clock`: latencies, deadlines, KV leases and the deadline budget are measured in its
        simulated seconds (`clock.now()`), the balancer's ramps and ejections and the prefix
        index's TTL in real ones (`clock.monotonic()`: their flags are real seconds);
        `prefix_source`: where prefixes are cached, for `prefix_routing` precise (the KV
        events source) or to replace the approximate index; None with approximate: the
        router's own index."""
        self.config = config
        self.clock = clock
        if config.prefix_routing not in PREFIX_ROUTING:
            raise ValueError(f"prefix_routing {config.prefix_routing!r}: one of {PREFIX_ROUTING}")
        if config.prefix_routing == "precise" and prefix_source is None:
            raise ValueError("prefix_routing precise needs a PrefixSource (the KV events one)")
        self.prefix: PrefixSource | None = None
        if config.prefix_routing != "off":
            self.prefix = prefix_source or ApproximateIndex(config.prefix_max_entries,
                                                            config.prefix_ttl_s)
        # P/D: when every prefill (or decode) engine is ejected, local prefill (or a 503 with
        # Retry-After) instead of waiting on an engine that stopped answering.
        self.balancer = Balancer(config.balancer, strict_roles=frozenset(
            DISAGGREGATED_ROLES if config.mode == Mode.DISAGGREGATED else ()))
        self.metrics = RouterMetrics(config.pool)
        self.session: aiohttp.ClientSession | None = None
        self.draining = False
        # With discovery: True until its first list of the engines arrived. /health answers
        # 503 meanwhile, so a (re)started router takes no traffic it could only refuse.
        self.discovering = False
        self.active = 0  # client requests being served
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task[None]] = []
        self.local_active = False  # the local-prefill rule's hysteresis state
        self.prefill_rate = lp.RateEstimate(config.prefill_tokens_per_s)
        self.mean_prompt_tokens = 512.0  # for turning scraped queue lengths into tokens
        self.per_client: dict[str, int] = {}  # requests in flight per client
        self.heard_from: dict[str, float] = {}  # per engine: its last streamed bytes
        self.prefill_heard: dict[str, float] = {}  # see EngineChoice._prefill_silent
        self.prefill_timed_out: dict[str, float] = {}
        self._releases: set[asyncio.Task[None]] = set()
        # Per prefill engine: its handoff counters at the last scrape, and this router's
        # prefills there since (to attribute expired or invalid handoffs).
        self._handoff_seen: dict[str, HandoffCounters] = {}
        self._prefills_since: dict[str, int] = {}
        # Leases this router let run out (already counted): discounted from the engines'.
        self.given_up = GivenUp(horizon_s=clock.simulated(GIVEN_UP_HORIZON_S))
        # Per engine: the max_model_len its GET /v1/models reported (learned on health
        # checks and on /v1/models calls), for refusing requests that cannot fit.
        self.max_model_len: dict[str, int] = {}
        # Late binding: prompts wait here while every prefill engine is saturated.
        self.hold: PrefillHold | None = None
        if config.mode == Mode.DISAGGREGATED and config.prefill_hold_s:
            self.hold = PrefillHold(self._prefill_saturated, self.metrics.held_prefill.set)

    # -- membership (called by discovery) ----------------------------------------------------

    def set_endpoints(self, role: str, urls: list[str], initial: bool = False) -> None:
        added, removed = self.balancer.set_endpoints(role, urls, self.clock.monotonic(),
                                                     initial=initial)
        if added or removed:
            log.info("endpoints role=%s added=%s removed=%s", role, added, removed)
        for url in removed:
            if not self.balancer.by_url(url):  # gone from every role: its cache is gone
                self._forget(url)
                # and whether it answered: a pod at the same address later is a new engine
                self.prefill_heard.pop(url, None)
                self.prefill_timed_out.pop(url, None)
        if self.hold is not None and role == Role.PREFILL:
            self.hold.release()  # a new engine takes held prompts at once

    def _forget(self, url: str) -> None:
        """Nothing is known to be cached at `url` any more (removed, or ejected: it may be
        restarting with an empty cache)."""
        if self.prefix is not None:
            self.prefix.forget(url)
        self.metrics.forget_endpoint(url)
        self.max_model_len.pop(url, None)

    def pool_max_model_len(self) -> int | None:
        """The smallest max_model_len among the engines known now (None: none reported)."""
        lens = [self.max_model_len[u] for u in self.balancer.urls() if u in self.max_model_len]
        return min(lens) if lens else None

    # -- lifecycle ---------------------------------------------------------------------------

    def build_app(self, metrics: bool = True) -> web.Application:
        """The serving app; `metrics` False: /metrics is served by build_metrics_app on a
        port of its own instead."""
        app = web.Application(client_max_size=self.config.max_request_bytes,
                              middlewares=[openai_errors])
        app.router.add_post("/v1/completions", self.handle_generate)
        app.router.add_post("/v1/chat/completions", self.handle_generate)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/ready", self.handle_ready)
        if metrics:
            app.router.add_get("/metrics", self.handle_metrics)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    def build_metrics_app(self) -> web.Application:
        """/metrics alone (`poolpilot router --metrics-port`)."""
        app = web.Application(middlewares=[openai_errors])
        app.router.add_get("/metrics", self.handle_metrics)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        c = self.config
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(
                total=c.request_timeout_s, sock_connect=c.connect_timeout_s,
                sock_read=c.idle_timeout_s,
            ),
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=10,
                                           keepalive_timeout=ENGINE_KEEPALIVE_S),
            auto_decompress=False,
        )
        if c.health_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._health_loop()))

    async def _on_cleanup(self, app: web.Application) -> None:
        for task in [*self._tasks, *self._releases]:
            task.cancel()
        for task in [*self._tasks, *self._releases]:
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

    # -- small endpoints ---------------------------------------------------------------------

    async def handle_health(self, request: web.Request) -> web.Response:
        if self.draining or self.discovering:
            return json_error(503, "draining" if self.draining else "discovering engines",
                              "unavailable")
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
        if self.config.workers > 1:  # every worker's series, summed (multiprocess mode)
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            body = generate_latest(registry)
        else:
            body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_models(self, request: web.Request) -> web.Response:
        assert self.session is not None
        _, denied = self._client(request)  # every /v1/* route is behind the keys
        if denied is not None:
            self.metrics.observe_request(401)
            return denied
        role = Role.DECODE if self.config.mode == Mode.DISAGGREGATED else Role.ENGINE
        tried: list[str] = []
        for _ in range(self.config.max_attempts):
            endpoint = self.balancer.pick(role, self.clock.monotonic(), exclude=tried)
            if endpoint is None:
                break
            tried.append(endpoint.url)
            try:
                async with self.session.get(endpoint.url + "/v1/models") as resp:
                    body = await resp.read()
                    if resp.status == 200:
                        self._learn_models(endpoint.url, body)
                        return web.Response(body=body, content_type="application/json")
            except (aiohttp.ClientError, TimeoutError):
                self._failed(endpoint.url)
        return json_error(503, f"no {role} engine answered /v1/models", "unavailable")

    # -- generation --------------------------------------------------------------------------

    def _client(self, request: web.Request) -> tuple[str | None, web.Response | None]:
        """The client's identity, or the 401 for a missing or wrong API key."""
        keys = self.config.api_keys
        if keys is None or not keys.enabled:
            return request.remote or "-", None
        client = keys.client(request.headers.get("Authorization"))
        if client is None:
            return None, json_error(
                401, "Incorrect or missing API key: send it as 'Authorization: Bearer KEY'",
                "invalid_request_error", headers={"WWW-Authenticate": "Bearer"},
            )
        return client, None

    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        start = self.clock.now()
        client, denied = self._client(request)
        if denied is not None:
            self.metrics.observe_request(401)
            return denied
        assert client is not None
        if self.draining:
            self.metrics.observe_request(503)
            return json_error(503, "router is shutting down; retry", "unavailable")
        limit = self.config.max_concurrent_per_client
        if limit and self.per_client.get(client, 0) >= limit:
            self.metrics.observe_request(429)
            return json_error(429, f"too many concurrent requests from this client (limit "
                              f"{limit}); retry when one has finished", "rate_limit_error",
                              headers={"Retry-After": "1"})
        self.per_client[client] = self.per_client.get(client, 0) + 1
        try:
            return await self._handle_generate(request, start)
        finally:
            left = self.per_client[client] - 1
            if left:
                self.per_client[client] = left
            else:
                del self.per_client[client]

    async def _handle_generate(self, request: web.Request, start: float) -> web.StreamResponse:
        try:
            # The header deadline (http_guard.py) ends with the headers: without this one a
            # client that stalls or trickles its body held the connection for ever.
            async with asyncio.timeout(self.config.body_timeout_s):
                raw = await request.read()
            body = orjson.loads(raw)  # orjson: a few times faster than json
        except TimeoutError:
            self.metrics.observe_request(408)
            return await self._refuse_and_close(request, json_error(
                408, f"the request body did not arrive within {self.config.body_timeout_s:g} s "
                "of its headers; send the whole body at once", "invalid_request_error"))
        except web.HTTPRequestEntityTooLarge:
            self.metrics.observe_request(413)
            return json_error(
                413, f"request body larger than {self.config.max_request_bytes} bytes",
                "invalid_request_error",
            )
        except web.RequestPayloadError as exc:  # a body that does not decompress, or unframed
            self.metrics.observe_request(400)
            encoding = request.headers.get("Content-Encoding")
            why = (f"could not be decoded (Content-Encoding: {encoding}); send it validly "
                   "compressed or uncompressed" if encoding else f"could not be read ({exc})")
            return await self._refuse_and_close(request, json_error(
                400, f"the request body {why}", "invalid_request_error"))
        except orjson.JSONDecodeError as exc:
            self.metrics.observe_request(400)
            if "depth limit" in str(exc):
                return self._too_deep()
            return json_error(400, "request body is not valid JSON", "invalid_request_error")
        if not isinstance(body, dict):
            self.metrics.observe_request(400)
            return json_error(400, "request body must be a JSON object", "invalid_request_error")
        if validate.too_deep(raw, body):  # refused here: it could not be forwarded
            self.metrics.observe_request(400)
            return self._too_deep()
        # An internal router-engine field (P/D sets its own): forwarded from a client, it
        # pinned KV on an aggregated engine and leaked the engine's address and block ids.
        body.pop("kv_transfer_params", None)
        # Lax values ("stream": "true", "max_tokens": "5") read and forwarded as vLLM reads them
        body = lax_params.read_lax(body, chat=request.path.endswith("/chat/completions"))
        self.active += 1
        self._idle.clear()
        code = 500
        progress = Progress(stream=body.get("stream") is True,
                            budget=DeadlineBudget(self.config.deadline_grace_s))
        try:
            response, code = await self._generate(request, body, start, progress)
            return response
        except asyncio.CancelledError:
            # The client went away (upstream connections close on the way out). A stream
            # that delivered [DONE] was served, whatever the client did next.
            code = 200 if progress.done_sent else 499
            if progress.kv_unclaimed():
                avoid = [progress.decode_url] if progress.decode_url else []
                self._release_kv(request.path, body, progress.kv, avoid=avoid,
                                 lease=progress.lease)
            raise
        finally:
            self.metrics.observe_request(code)
            self.metrics.e2e_pool.observe(self.clock.now() - start)
            self.active -= 1
            if self.active == 0:
                self._idle.set()

    @staticmethod
    def _too_deep() -> web.Response:
        return json_error(400, f"request body nests too deeply (more than "
                          f"{validate.MAX_DEPTH} levels of arrays and objects); flatten it",
                          "invalid_request_error")

    @staticmethod
    async def _refuse_and_close(request: web.Request, response: web.Response) -> web.Response:
        """Send `response` and close the connection: the rest of the body is not coming, or
        cannot be framed (aiohttp would linger 10 s reading it, or parse it as the next
        request). What still arrives is dropped for up to LINGER_S first: closing on unread
        input resets the connection, and a client still sending lost the answer."""
        response.force_close()
        await response.prepare(request)
        await response.write_eof()
        request.protocol.close()  # no further request on it: its input is dropped
        transport = request.transport
        if transport is not None and transport.can_write_eof():
            transport.write_eof()  # the answer is whole: the client may read it and close
        with suppress(Exception):  # the client closing (the payload's error) ends the wait
            async with asyncio.timeout(LINGER_S):
                await request.content.wait_eof()
        request.protocol.force_close()
        return response

    async def _generate(
        self, request: web.Request, body: dict[str, Any], start: float, progress: Progress
    ) -> tuple[web.StreamResponse, int]:
        path = request.path
        bad = validate.check_request(body)
        if bad is not None:  # in every mode: an engine fails on these rather than refuse them
            return json_error(400, bad.message, "BadRequestError", bad.param), 400
        prompt_tokens = pd.estimate_prompt_tokens(body)
        tokens = prompt_tokens + pd.requested_output_tokens(body)
        stream = progress.stream
        too_long = validate.check_length(body, prompt_tokens, self.pool_max_model_len())
        if too_long is not None:  # before any engine work: no prefill for a doomed decode
            return json_error(400, too_long.message, "BadRequestError", too_long.param), 400
        prompt = await self._prompt_keys(path, body)
        try:
            if self.config.mode != Mode.DISAGGREGATED:
                return await self._open_relay(Role.ENGINE, request, body, tokens, start,
                                              progress, prompt=prompt,
                                              prompt_tokens=prompt_tokens)
            bad = validate.check_disaggregated(body, chat=path.endswith("/chat/completions"))
            if bad is not None:  # before the prefill step: nothing gets pinned
                return json_error(400, bad.message, "BadRequestError", bad.param), 400
            self.mean_prompt_tokens += 0.05 * (prompt_tokens - self.mean_prompt_tokens)
            local = self._local_prefill_engine(prompt_tokens, prompt)
            if local is not None:
                return await self._serve_local(request, body, start, lp.PREFILL_BEHIND,
                                               prompt_tokens, progress, first=local.url,
                                               prompt=prompt)
            try:
                prefill = await self._prefill(path, body, prompt_tokens, prompt, progress)
            except UpstreamError as exc:
                if exc.url == NO_ENDPOINT and not self.config.local_when_no_prefill:
                    # Every prefill engine is ejected and local prefill is off: the client
                    # retries later rather than waiting on an engine that stopped answering.
                    return self._unavailable(exc.message), 503
                # Every prefill engine failed (or none is left, e.g. the only one was killed)
                # and nothing reached the client: a decode engine prefills it instead.
                log.warning("prefill failed on every prefill engine (%s); retrying with a "
                            "local prefill", exc)
                return await self._serve_local(request, body, start, lp.PREFILL_FAILED,
                                               prompt_tokens, progress, after=exc,
                                               prompt=prompt)
            progress.kv = pd.kv_params_from_prefill(prefill)
            try:
                async with self._open(Role.DECODE, path, pd.decode_body(body, progress.kv),
                                      tokens, handoff=True, progress=progress,
                                      budget=progress.budget) as att:
                    return await self._relay(request, att, stream, start, progress,
                                             handoff=True)
            except LeaseRanOut as exc:
                # No engine got the parameters: the blocks go with the lease (a release now
                # would be the late read), and a decode engine computes the prompt itself.
                self._count_given_up(exc.lease)
                log.warning("KV handoff given up (%s); retrying with a local prefill", exc)
                progress.kv = progress.lease = None
                return await self._serve_local(request, body, start, lp.KV_TRANSFER_FAILED,
                                               prompt_tokens, progress, prompt=prompt,
                                               exclude=[u for u in [progress.decode_url] if u])
            except HandoffFailed as exc:
                # Nothing reached the client: free the prefill's KV (no decode engine will
                # read it) and serve the request with a local prefill instead of an error.
                if not self._lease_gone(progress.lease):  # else _release_kv counts it
                    self.metrics.kv_failures_pool.inc()
                log.warning("KV handoff failed (%s); retrying with a local prefill", exc.error)
                url = exc.error.url
                others = self._others_admitted(Role.DECODE, url)
                if exc.cause == KV_LOAD_FAILED or (exc.cause == KV_PULL_SLOW and not others):
                    self._forgive(url)
                if exc.cause == KV_PULL_SLOW:
                    self._failed(url, spare_last=True)
                self._release_kv(path, body, progress.kv, avoid=[url], lease=progress.lease)
                progress.kv = progress.lease = None
                # A decode engine that timed out is not asked again; one that answered (a
                # failed KV load) may well prefill the prompt itself, and so may one still
                # pulling at the deadline when no other decode engine is admitted.
                hung = [url] if exc.error.status == 504 and (
                    exc.cause != KV_PULL_SLOW or others) else []
                return await self._serve_local(request, body, start, lp.KV_TRANSFER_FAILED,
                                               prompt_tokens, progress, prompt=prompt,
                                               exclude=hung)
            except UpstreamError:
                if progress.kv_unclaimed():  # e.g. no decode engine at all
                    self._release_kv(path, body, progress.kv, avoid=[],
                                     lease=progress.lease)
                    progress.kv = progress.lease = None
                raise
        except ClientError as exc:
            return web.Response(
                status=exc.status, body=exc.body, content_type=exc.content_type
            ), exc.status
        except UpstreamError as exc:
            # 503: no engine could take it (retry later); 504: timeout; else a bad gateway.
            status = exc.status if exc.status in (503, 504) else 502
            if status == 503:
                return self._unavailable(exc.message), 503
            return json_error(status, exc.message, "upstream_error"), status

    def _unavailable(self, message: str) -> web.Response:
        """503 with Retry-After: about when a health check may have re-admitted an engine."""
        retry = str(max(1, math.ceil(self.config.health_interval_s)))
        return json_error(503, message, "upstream_error", headers={"Retry-After": retry})

    # -- releasing a prefill's KV --------------------------------------------------------------

    def _release_kv(self, path: str, body: dict[str, Any], kv: dict[str, Any] | None,
                    avoid: list[str], lease: KvLease | None = None) -> None:
        """Free the KV a prefill engine holds for a handoff that will not happen, instead of
        leaving it pinned until its lease runs out: a decode engine reads it for a one-token
        decode whose answer is dropped (the read is what makes the prefill engine free it, in
        vLLM and engine-sim alike). Runs in the background; a client that left does not stop
        it."""
        if not kv:
            return  # shared-storage connectors (no parameters) pin nothing on the prefill
        if lease is not None and self._lease_gone(lease):
            # Too late to read: the lease frees the blocks. Counted once, here or by the
            # scrape of the engine's expiry, whichever came first.
            self._count_given_up(lease)
            log.warning("prefill KV of %s not released: its lease on %s runs out too soon "
                        "for a read", kv.get("remote_request_id"), lease.prefill_url)
            return
        task = asyncio.create_task(self._drain(path, pd.release_body(body, kv), avoid))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    def _lease_gone(self, lease: KvLease | None) -> bool:
        """The prefill's KV may be freed before a decode engine could read it."""
        return lease is not None and not lease.releasable(self.clock.now())

    def _count_given_up(self, lease: KvLease) -> None:
        if self.given_up.gave_up(lease, self.clock.now()):
            self.metrics.kv_failures_pool.inc()

    async def _drain(self, path: str, body: dict[str, Any], avoid: list[str]) -> None:
        assert self.session is not None
        now = self.clock.monotonic()
        endpoint = (self.balancer.pick(Role.DECODE, now, exclude=avoid)
                    or self.balancer.pick(Role.DECODE, now))
        outcome = "failed"
        if endpoint is not None:
            timeout = aiohttp.ClientTimeout(total=self.config.release_timeout_s)
            try:
                async with self.session.post(endpoint.url + path, data=orjson.dumps(body),
                                             headers=JSON_HEADERS, timeout=timeout) as resp:
                    await resp.read()
                    outcome = "released" if resp.status == 200 else "failed"
                    if resp.status >= 500 and resp.status not in RETRYABLE_STATUS:
                        self._forgive(endpoint.url)  # it answered: the pull failed, not it
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning("releasing a prefill's KV via %s failed: %r", endpoint.url, exc)
        self.metrics.kv_releases[outcome].inc()
        log.info("prefill KV of %s: %s via %s",
                 (body.get("kv_transfer_params") or {}).get("remote_request_id"), outcome,
                 endpoint.url if endpoint else "no decode engine")

    # -- local prefill -------------------------------------------------------------------------

    async def _serve_local(
        self, request: web.Request, body: dict[str, Any], start: float, reason: str,
        prompt_tokens: int, progress: Progress, first: str | None = None,
        after: UpstreamError | None = None, prompt: PromptKeys | None = None,
        exclude: list[str] | None = None,
    ) -> tuple[web.StreamResponse, int]:
        """Serve the request aggregated on a decode engine: it prefills the prompt itself.
        `after`: the prefill's failure this retries, named in the error if this fails too.
        `exclude`: decode engines not to use (one whose handoff just failed)."""
        if not progress.budget.spent(self.clock.now()):  # else _open answers the 504 at once
            self.metrics.local_prefill_reason[reason].inc()
        tokens = prompt_tokens + pd.requested_output_tokens(body)
        try:
            return await self._open_relay(Role.DECODE, request, pd.local_body(body), tokens,
                                          start, progress, first=first, local_tokens=prompt_tokens,
                                          prompt=prompt, prompt_tokens=prompt_tokens,
                                          exclude=exclude)
        except UpstreamError as exc:
            if after is None:
                raise
            raise UpstreamError(exc.url, exc.status, f"{exc.message} (a local prefill, after "
                                f"the prefill step failed: {after.message})") from exc

    async def _open_relay(
        self, role: Role, request: web.Request, body: dict[str, Any], tokens: int,
        start: float, progress: Progress, first: str | None = None, local_tokens: int = 0,
        prompt: PromptKeys | None = None, prompt_tokens: int = 0,
        exclude: list[str] | None = None,
    ) -> tuple[web.StreamResponse, int]:
        """Send the request to an engine of `role` and relay its answer; a stream whose first
        token misses its deadline (nothing reached the client) moves to another engine, never
        the same one."""
        tried = list(exclude or [])
        last: FirstTokenStalled | None = None
        for _ in range(self.config.max_attempts):
            try:
                async with self._open(role, request.path, body, tokens, exclude=tried,
                                      first=first, local_tokens=local_tokens, prompt=prompt,
                                      prompt_tokens=prompt_tokens,
                                      budget=progress.budget) as att:
                    return await self._relay(request, att, progress.stream, start, progress)
            except FirstTokenStalled as exc:
                log.warning("%s", exc)
                tried.append(exc.url)
                first, last = None, exc
            except UpstreamError:
                if last is not None:  # every other engine failed too: say why the first did
                    raise last from None
                raise
        assert last is not None
        raise last

    async def _prefill(self, path: str, body: dict[str, Any], tokens: int,
                       prompt: PromptKeys | None = None,
                       progress: Progress | None = None) -> dict[str, Any]:
        """Run the prefill step; a failure (before or while reading the answer) is retried on
        another prefill engine. Returns the prefill's JSON answer; `progress.lease`: the KV
        lease it started (from its status line)."""
        waited = self.hold is not None and await self.hold.enter()
        try:
            return await self._prefill_attempts(path, body, tokens, prompt, progress)
        finally:
            if waited and self.hold is not None:  # (if no attempt took an engine)
                self.hold.passed()

    async def _prefill_attempts(self, path: str, body: dict[str, Any], tokens: int,
                                prompt: PromptKeys | None,
                                progress: Progress | None) -> dict[str, Any]:
        failed: list[str] = []
        last: UpstreamError | None = None
        for _ in range(self.config.max_attempts):
            try:
                async with self._open(Role.PREFILL, path, pd.prefill_body(body), tokens,
                                      exclude=failed, prompt=prompt, prompt_tokens=tokens,
                                      budget=progress.budget if progress else None) as att:
                    granted = self.clock.now()
                    try:
                        data = orjson.loads(await att.resp.read())
                    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                        self._failed(att.endpoint.url)
                        failed.append(att.endpoint.url)
                        last = UpstreamError(att.endpoint.url, 502,
                                             f"prefill answer unreadable: {exc!r}")
                        continue
                    self.prefill_rate.observe(att.queued_tokens, self.clock.now() - att.sent_at)
                    url = att.endpoint.url
                    self._prefills_since[url] = self._prefills_since.get(url, 0) + 1
                    lease_s = self.config.kv_lease_s
                    if progress is not None and lease_s is not None:
                        progress.lease = KvLease(granted, lease_s, url,
                                                 self.clock.simulated(PICKUP_S))
                if not isinstance(data, dict):
                    raise UpstreamError(att.endpoint.url, 502, "prefill answer is not an object")
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
        self, role: Role, path: str, body: dict[str, Any], tokens: int,
        exclude: list[str] | None = None, first: str | None = None, handoff: bool = False,
        local_tokens: int = 0, progress: Progress | None = None,
        prompt: PromptKeys | None = None, prompt_tokens: int = 0,
        budget: DeadlineBudget | None = None,
    ) -> AsyncIterator[Attempt]:
        """Send `body` to an endpoint of `role` (`first` if given and present) and yield the
        attempt once its status is 2xx. Connection failures and 502/503/504 are retried on
        other endpoints (nothing has reached the client yet); 4xx is the client's fault and
        is passed back. `handoff`: a decode step after a prefill, whose failure (once an
        engine was tried) raises HandoffFailed. `local_tokens`: prompt tokens the engine
        prefills itself, counted against it until the first token (Balancer.local_tokens).
        `prompt` (its keys; `prompt_tokens` long): choose by prefix (router/prefix_index.py),
        count only the tokens the endpoint is not expected to hold as its work, and record
        the prompt there once it accepted it. `budget`: the request's (DeadlineBudget), which
        caps each attempt's deadline once one was missed; no attempt starts once it is spent."""
        assert self.session is not None
        tried: list[str] = list(exclude or [])
        last: UpstreamError | None = None
        gauge = self.metrics.inflight_role[role]
        budget = budget or DeadlineBudget(None)
        stream = body.get("stream") is True
        for _ in range(self.config.max_attempts):
            if budget.spent(self.clock.now()):
                last = UpstreamError(last.url if last else NO_ENDPOINT, 504, (
                    f"no {role} engine answered within the request's deadline "
                    f"({budget.missed_deadlines} missed, then the TTFT target)"))
                log.warning("%s", last)
                break
            lease = progress.lease if handoff and progress is not None else None
            if lease is not None and not lease.usable(now := self.clock.now()):
                raise LeaseRanOut(lease, now)  # before any engine got them
            endpoint = None
            matched = 0
            if first is not None and first not in tried:
                endpoint = next((e for e in self.balancer.role_endpoints(role)
                                 if e.url == first), None)
                if endpoint is not None:
                    [matched] = self._matched(prompt, prompt_tokens, [first])
            if endpoint is None:
                endpoint, matched = self._pick(role, tried, prompt, prompt_tokens)
            if endpoint is None:
                break
            tried.append(endpoint.url)
            charged = tokens - matched  # the held prefix is not work for it
            # The queues in seconds (the hold, the local-prefill rule, the prefill rate and
            # deadline) count whole prompt tokens, cached or not: at a rate learned in the same
            # unit they measure what the engines' caches really serve, which the router's
            # expectation misses when an engine evicted what it was sent (docs/router.md).
            whole = tokens if role == Role.PREFILL else 0
            local = local_tokens
            if role == Role.PREFILL and endpoint.inflight == 0:
                self.prefill_heard[endpoint.url] = self.clock.now()  # busy from now
            self.balancer.acquire(endpoint.url, charged, whole)
            self.balancer.add_local_tokens(endpoint.url, local)
            if role == Role.PREFILL and self.hold is not None:
                self.hold.passed()  # it has its engine: the next held prompt may go
            queued = endpoint.queued_prompt_tokens
            gauge.inc()
            att: Attempt | None = None
            sent_at = self.clock.now()
            if progress is not None:
                progress.decode_sent, progress.decode_answered = True, False
                progress.decode_url = endpoint.url
            try:
                # The prefill answer is one body after the whole prefill: its first byte is
                # its deadline. A stream's status line and first event share the first-token
                # deadline, counted from here. A non-streaming answer keeps the session's
                # idle timeout (its first byte comes with its last token).
                deadline: aiohttp.ClientTimeout | None = None
                first_s: float | None = None
                if role == Role.PREFILL:
                    deadline = self._prefill_deadline(queued, budget.timeout(None, sent_at))
                elif stream:
                    first_s = budget.timeout(self._token_deadlines(handoff)[0], sent_at)
                try:
                    async with asyncio.timeout(None if first_s is None
                                               else self.clock.real(first_s)):
                        resp = await self.session.post(
                            endpoint.url + path, data=orjson.dumps(body), headers=JSON_HEADERS,
                            timeout=deadline or self.session.timeout)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    self._failed(endpoint.url)
                    timed_out = isinstance(exc, TimeoutError)
                    status = 504 if timed_out else 502
                    why = repr(exc)
                    if timed_out and (deadline is not None or first_s is not None):
                        budget.missed(self.clock.now())  # hung: the request's grace starts
                        if role == Role.PREFILL:
                            self.prefill_timed_out[endpoint.url] = self.clock.now()
                        why = ("no answer within the prefill deadline" if role == Role.PREFILL
                               else "no status line within the first-token deadline")
                    last = UpstreamError(endpoint.url, status, f"{role} engine failed: {why}")
                    log.warning("%s", last)
                    continue
                if progress is not None:
                    progress.decode_answered = True
                async with resp:
                    if resp.status >= 500:
                        text = (await resp.read())[:500].decode(errors="replace")
                        if resp.status in RETRYABLE_STATUS:
                            self._failed(endpoint.url)
                        last = UpstreamError(
                            endpoint.url, resp.status, f"{role} engine answered "
                            f"{resp.status}: {text}"
                        )
                        log.warning("%s", last)
                        if resp.status not in RETRYABLE_STATUS:
                            if handoff:  # vLLM's answer to a failed KV load (a 500)
                                raise HandoffFailed(last, KV_LOAD_FAILED)
                            raise last
                        continue
                    if resp.status >= 400:
                        raise ClientError(resp.status, await resp.read(),
                                          resp.content_type or "application/json")
                    self.balancer.report_success(endpoint.url)
                    if role == Role.PREFILL:
                        self.prefill_heard[endpoint.url] = self.clock.now()
                        self.prefill_timed_out.pop(endpoint.url, None)
                    if prompt is not None and self.prefix is not None:
                        self.prefix.record(prompt, endpoint.url, self.clock.monotonic())
                        self.metrics.observe_prefix(role, endpoint.url, prompt_tokens, matched)
                    att = Attempt(endpoint, resp, sent_at, queued, local, matched,
                                  None if first_s is None else sent_at + first_s)
                    yield att
                    return
            finally:
                gauge.dec()
                self.balancer.release(endpoint.url, charged, whole)
                if role == Role.PREFILL and self.hold is not None:
                    self.hold.release()  # its engine's queue shrank
                if att is not None:
                    self._settle_local(att)
                elif local:
                    self.balancer.add_local_tokens(endpoint.url, -local)
        if last is None:
            engine = "engine" if role == Role.ENGINE else f"{role} engine"
            last = UpstreamError(NO_ENDPOINT, 503, f"no {engine} available")
        elif handoff:
            raise HandoffFailed(last)
        raise last
