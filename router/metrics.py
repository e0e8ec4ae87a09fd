"""The router's Prometheus metrics (names from poolpilot.metrics; `pool` on every series) and
the one engine metric it reads back (`vllm:num_requests_waiting`)."""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from poolpilot import metrics as names
from poolpilot.roles import ENGINE_ROLES, Role

E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)


def _base(name: str) -> str:
    # prometheus_client appends _total to counters itself.
    return name.removesuffix("_total")


class RouterMetrics:
    """One registry per router (tests run several routers in one process)."""

    def __init__(self, pool: str, registry: CollectorRegistry | None = None) -> None:
        self.pool = pool
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            names.ROUTER_TTFT,
            "Time from request arrival at the router to the first streamed token "
            "(in disaggregated mode: prefill + KV transfer + first decode step).",
            ["pool"],
            buckets=names.TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            names.ROUTER_ITL,
            "Time between streamed chunks, as the client sees it.",
            ["pool"],
            buckets=names.ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            names.ROUTER_E2E,
            "Time from request arrival to the last byte of the response.",
            ["pool"],
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            _base(names.ROUTER_REQUESTS),
            "Requests answered, by HTTP status (499: client went away; 502 also counts "
            "streams that broke after they started).",
            ["pool", "code"],
            registry=r,
        )
        self.inflight = Gauge(
            names.ROUTER_INFLIGHT,
            "Upstream requests in flight, by engine role.",
            ["pool", "role"],
            registry=r,
            multiprocess_mode="livesum",  # with --workers: the live workers' sum
        )
        self.held = Gauge(
            names.ROUTER_HELD,
            "Prompts held at the router, in arrival order, while every engine of the role is "
            "saturated (late binding: each goes to the first engine that can start on it).",
            ["pool", "role"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.kv_failures = Counter(
            _base(names.ROUTER_KV_TRANSFER_FAILURES),
            "Decode attempts that failed after a successful prefill (the KV handoff or the "
            "decode engine failed).",
            ["pool"],
            registry=r,
        )
        self.local_prefill = Counter(
            _base(names.ROUTER_LOCAL_PREFILL),
            "Requests served aggregated on a decode engine (it prefilled the prompt itself, no "
            "KV transfer), by reason: prefill_behind (the prefill role would have broken the "
            "TTFT target) or kv_transfer_failed (the KV handoff failed; retried locally).",
            ["pool", "reason"],
            registry=r,
        )
        self.kv_release = Counter(
            _base(names.ROUTER_KV_RELEASES),
            "Prefill KV holds the router freed for handoffs that did not happen (a decode that "
            "failed, a client that left first), by outcome: released or failed.",
            ["pool", "outcome"],
            registry=r,
        )
        self.prefix_routed = Counter(
            _base(names.ROUTER_PREFIX_ROUTED),
            "Prompt tokens routed with prefix-aware selection (estimated, ~4 characters a "
            "token), by engine role and endpoint.",
            ["pool", "role", "endpoint"],
            registry=r,
        )
        self.prefix_expected_hits = Counter(
            _base(names.ROUTER_PREFIX_EXPECTED_HITS),
            "Of those, the prompt tokens the chosen endpoint was expected to hold in its prefix "
            "cache (what the router expected; the engine's vllm:prefix_cache_hits_total is what "
            "it found).",
            ["pool", "role", "endpoint"],
            registry=r,
        )
        self.prefix_choices = Counter(
            _base(names.ROUTER_PREFIX_CHOICES),
            "Prefix-aware choices by reason: prefix (an endpoint holding part of the prompt), "
            "load (holders were busier than their prefix saves), bound (the load bound "
            "overrode the prefix), no_match (least loaded).",
            ["pool", "role", "reason"],
            registry=r,
        )
        self._prefix_children: dict[tuple[str, str], tuple[Counter, Counter]] = {}
        self._choice_children: dict[tuple[str, str], Counter] = {}
        # Children bound to this pool once: labels() costs a lock and a dict lookup, and
        # these are hit for every streamed chunk.
        self.ttft_pool = self.ttft.labels(pool)
        self.itl_pool = self.itl.labels(pool)
        self.e2e_pool = self.e2e.labels(pool)
        self.kv_failures_pool = self.kv_failures.labels(pool)  # exported as 0 from the start
        self.inflight_role = {
            role: self.inflight.labels(pool, role) for role in ENGINE_ROLES
        }
        self.held_prefill = self.held.labels(pool, Role.PREFILL)  # exported as 0 from the start
        self.local_prefill_reason = {  # exported as 0 from the start
            reason: self.local_prefill.labels(pool, reason)
            for reason in names.LOCAL_PREFILL_REASONS
        }
        self.kv_releases = {o: self.kv_release.labels(pool, o) for o in ("released", "failed")}
        self._codes: dict[int, Counter] = {}

    def observe_prefix(self, role: str, endpoint: str, prompt_tokens: int,
                       expected_hit_tokens: int) -> None:
        """A prefix-aware request the endpoint accepted."""
        children = self._prefix_children.get((role, endpoint))
        if children is None:
            children = self._prefix_children[(role, endpoint)] = (
                self.prefix_routed.labels(self.pool, role, endpoint),
                self.prefix_expected_hits.labels(self.pool, role, endpoint))
        children[0].inc(prompt_tokens)
        children[1].inc(expected_hit_tokens)

    def observe_choice(self, role: str, reason: str) -> None:
        child = self._choice_children.get((role, reason))
        if child is None:
            child = self._choice_children[(role, reason)] = self.prefix_choices.labels(
                self.pool, role, reason)
        child.inc()

    def forget_endpoint(self, endpoint: str) -> None:
        """Drop a removed endpoint's series (the engine is gone; its counters would stay
        exported forever)."""
        for role, url in [k for k in self._prefix_children if k[1] == endpoint]:
            del self._prefix_children[(role, url)]
            for metric in (self.prefix_routed, self.prefix_expected_hits):
                with suppress(KeyError):
                    metric.remove(self.pool, role, url)

    def observe_request(self, code: int) -> None:
        child = self._codes.get(code)
        if child is None:
            child = self._codes[code] = self.requests.labels(self.pool, str(code))
        child.inc()


WAITING = names.VLLM_WAITING
# Prefill-side NIXL counters of handoffs that went wrong without any request failing: a lease
# that expired before a decode engine read the KV, and a read that arrived after that (the
# decode engine may have computed on blocks already reused: "Potentially invalid KV blocks").
KV_EXPIRED = (names.VLLM_NIXL_EXPIRED + "_total", names.VLLM_NIXL_AFTER_EXPIRY + "_total")
FINISHED = names.VLLM_REQUEST_SUCCESS


def _sum(text: str, metric: str) -> float | None:
    """Sum of a metric's samples in a /metrics page (a line scan: vLLM's page is large and
    this runs every few seconds per engine); None when absent."""
    total = 0.0
    found = False
    n = len(metric)
    for line in text.splitlines():
        if line.startswith(metric) and line[n : n + 1] in ("{", " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            found = True
    return total if found else None


def parse_waiting(text: str) -> float | None:
    """Sum of vllm:num_requests_waiting samples in a /metrics page; None when absent."""
    return _sum(text, WAITING)


@dataclass(frozen=True)
class HandoffCounters:
    """A prefill engine's counts of expired or invalid KV handoffs and of finished requests."""

    bad: float
    finished: float


def parse_handoff_counters(text: str) -> HandoffCounters | None:
    bad = [_sum(text, name) for name in KV_EXPIRED]
    if all(b is None for b in bad):
        return None  # not a NIXL prefill engine (or an older vLLM)
    # A late read ("Potentially invalid KV blocks") is of a request whose lease had expired,
    # which the engine counted already: the larger count is the bad handoffs, each once.
    return HandoffCounters(max(b or 0.0 for b in bad), _sum(text, FINISHED) or 0.0)


def attributed_kv_failures(prev: HandoffCounters, now: HandoffCounters, mine: int) -> float:
    """This router's share of the expired or invalid handoffs an engine reported since the
    last scrape: every router replica scrapes every engine, so each counts the fraction of the
    engine's finished requests (prefills) it sent, and the replicas' counters add up to the
    engine's. A counter that went down means the engine restarted: count from zero."""
    bad = now.bad - prev.bad if now.bad >= prev.bad else now.bad
    finished = now.finished - prev.finished if now.finished >= prev.finished else now.finished
    if bad <= 0:
        return 0.0
    share = 1.0 if finished <= 0 else min(1.0, mine / finished)
    return bad * share
