"""The router's Prometheus metrics (names from poolpilot.metrics; `pool` on every series) and
the one engine metric it reads back (`vllm:num_requests_waiting`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from poolpilot import metrics as names

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
        # Children bound to this pool once: labels() costs a lock and a dict lookup, and
        # these are hit for every streamed chunk.
        self.ttft_pool = self.ttft.labels(pool)
        self.itl_pool = self.itl.labels(pool)
        self.e2e_pool = self.e2e.labels(pool)
        self.kv_failures_pool = self.kv_failures.labels(pool)  # exported as 0 from the start
        self.inflight_role = {
            role: self.inflight.labels(pool, role) for role in ("prefill", "decode", "engine")
        }
        self.local_prefill_reason = {  # exported as 0 from the start
            reason: self.local_prefill.labels(pool, reason)
            for reason in names.LOCAL_PREFILL_REASONS
        }
        self._codes: dict[int, Counter] = {}

    def observe_request(self, code: int) -> None:
        child = self._codes.get(code)
        if child is None:
            child = self._codes[code] = self.requests.labels(self.pool, str(code))
        child.inc()


WAITING = "vllm:num_requests_waiting"


def parse_waiting(text: str) -> float | None:
    """Sum of vllm:num_requests_waiting samples in a /metrics page; None when absent.

    A line scan instead of a full parse: vLLM's page is large and this runs every few
    seconds per engine."""
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(WAITING) and line[len(WAITING) : len(WAITING) + 1] in ("{", " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            found = True
    return total if found else None
