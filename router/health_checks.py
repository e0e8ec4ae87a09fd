"""The health-check half of the Router (router/app.py): each engine's /health, /metrics and
/v1/models on a timer, ejection and re-admission, and what the scrapes teach the router (queue
lengths, expired handoffs, each engine's max_model_len).
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import orjson
from poolpilot.router import validate
from poolpilot.router.balancer import Balancer, Endpoint
from poolpilot.router.config import RouterConfig
from poolpilot.router.kv_lease import GivenUp
from poolpilot.router.metrics import (
    HandoffCounters,
    RouterMetrics,
    attributed_kv_failures,
    parse_handoff_counters,
    parse_waiting,
)
from poolpilot.router.prefill_hold import PrefillHold
from poolpilot.router.prefix_source import PrefixSource

from poolpilot.clock import Clock

log = logging.getLogger("poolpilot.router")


class HealthChecks:
    """Health checks and load scraping for the Router, which provides what is declared here."""

    clock: Clock
    config: RouterConfig
    balancer: Balancer
    metrics: RouterMetrics
    prefix: PrefixSource | None
    session: aiohttp.ClientSession | None
    max_model_len: dict[str, int]
    _handoff_seen: dict[str, HandoffCounters]
    _prefills_since: dict[str, int]
    given_up: GivenUp
    hold: PrefillHold | None
    prefill_timed_out: dict[str, float]  # see EngineChoice._prefill_silent

    async def _health_loop(self) -> None:
        while True:
            urls = self.balancer.urls()
            await asyncio.gather(*(self._check(url) for url in urls), return_exceptions=True)
            if self.hold is not None:  # ejections and re-admissions change who can take one
                self.hold.release()
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
                        page = await resp.text()
                        waiting = parse_waiting(page)
                        if waiting is not None:
                            self.balancer.update_waiting(url, waiting)
                        self._count_expired_handoffs(url, page)
                async with self.session.get(url + "/v1/models", timeout=timeout) as resp:
                    if resp.status == 200:
                        self._learn_models(url, await resp.read())
        except (aiohttp.ClientError, TimeoutError):
            pass
        if ok:  # answering again: a prefill engine that hung is not silent any more
            self.prefill_timed_out.pop(url, None)
        ejected, readmitted = self.balancer.report_health(url, ok, self.clock.monotonic())
        self._log_ejections(ejected)
        for e in readmitted:
            log.info("re-admitted %s endpoint %s (health check passed)", e.role, e.url)

    def _count_expired_handoffs(self, url: str, page: str) -> None:
        """Handoffs that failed without any request failing: the prefill engine let a KV
        lease expire, or a decode engine read KV after it had (vLLM logs "Potentially invalid
        KV blocks"). Counted as KV-transfer failures, this router's share of them."""
        now = parse_handoff_counters(page)
        if now is None:
            return
        prev = self._handoff_seen.get(url)
        self._handoff_seen[url] = now
        mine = self._prefills_since.pop(url, 0)
        if prev is None:
            return
        # Less the leases this router gave up itself (counted when it did).
        bad = self.given_up.discount(url, attributed_kv_failures(prev, now, mine),
                                     self.clock.now())
        if bad > 0:
            self.metrics.kv_failures_pool.inc(bad)
            log.warning("prefill engine %s reports %.0f expired or invalid KV handoffs "
                        "(%.2f of them this router's)", url, now.bad - prev.bad, bad)

    def _failed(self, url: str, spare_last: bool = False) -> None:
        """Count a failure against the engine at `url` (`spare_last`: Balancer.report_failure)."""
        self._log_ejections(self.balancer.report_failure(url, self.clock.monotonic(),
                                                         spare_last=spare_last))

    def _forgive(self, url: str) -> None:
        """The decode engine at `url` failed a KV pull on the prefill's side: the failures
        counted against it meanwhile (its health checks time out while vLLM gives up on the
        pull) were the pull's (Balancer.forgive)."""
        for e in self.balancer.forgive(url):
            log.info("re-admitted %s endpoint %s: its failures were a failed KV pull's",
                     e.role, e.url)

    def _others_admitted(self, role: str, url: str) -> bool:
        return any(e.url != url and not e.ejected() for e in self.balancer.role_endpoints(role))

    def _log_ejections(self, ejected: list[Endpoint]) -> None:
        for e in ejected:
            if self.prefix is not None:
                self.prefix.forget(e.url)
            assert e.ejected_until is not None
            log.warning("ejected %s endpoint %s for %.1f s after %d consecutive failures",
                        e.role, e.url, e.ejected_until - self.clock.monotonic(), e.failures)

    def _learn_models(self, url: str, body: bytes) -> None:
        try:
            length = validate.max_model_len_of(orjson.loads(body))
        except orjson.JSONDecodeError:
            return
        if length is not None:
            self.max_model_len[url] = length
