"""The router's configuration (what `poolpilot router`'s flags become) and its modes."""

from __future__ import annotations

from dataclasses import dataclass, field

from poolpilot.router import local_prefill as lp
from poolpilot.router.auth import ApiKeys
from poolpilot.router.balancer import BalancerConfig
from poolpilot.router.prefix_index import DEFAULT_BALANCE, DEFAULT_MAX_ENTRIES, DEFAULT_TTL_S

from poolpilot import handoff

DISAGGREGATED = "disaggregated"
AGGREGATED = "aggregated"
PREFIX_ROUTING = ("off", "approximate", "precise")


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
    # Local prefill (disaggregated mode): serve a request on a decode engine alone when the
    # prefill role would break the TTFT target (router/local_prefill.py). None: off (no
    # mixed-step profile known for the model); a failed KV handoff is retried locally anyway.
    local_prefill: lp.LocalPrefillPolicy | None = None
    prefill_tokens_per_s: float = 0.0  # seed of the learned prefill rate (0: none measured)
    api_keys: ApiKeys | None = None  # None: no authentication
    max_concurrent_per_client: int = 0  # 0: no limit; a client is its API key, else its IP
    release_timeout_s: float = 60.0  # a KV release (a one-token decode) may take this long
    workers: int = 1  # processes sharing the port (router/workers.py); > 1: shared metrics
    # Prefix-aware selection of prefill, aggregated and local-prefill engines
    # (router/prefix_index.py): off, approximate (the router's own record of what it sent
    # where) or precise (the engines' KV events: a PrefixSource handed to Router).
    prefix_routing: str = "approximate"
    prefix_balance: float = DEFAULT_BALANCE  # the load bound's c
    prefix_max_entries: int = DEFAULT_MAX_ENTRIES  # approximate: keys remembered (LRU)
    prefix_ttl_s: float = DEFAULT_TTL_S  # approximate: how long a sent prefix counts as cached
    # A prefill engine silent this long (seconds, the router's clock) is hung: the request
    # moves on and the engine counts a failure. None: only idle_timeout_s bounds it.
    prefill_deadline_s: float | None = None
    # A stream that has started but sends no token for this long (seconds, the router's
    # clock: --decode-stall-itls x the ITL target) is hung: the client gets an in-band error
    # and the engine counts a failure. Before its first token, a decode after a handoff has
    # this long too; an engine that prefills itself, this plus prefill_deadline_s. None: off.
    decode_stall_s: float | None = None
    # Once one of a request's attempts missed its deadline, what all its later attempts share
    # (the TTFT target, router's clock; router/deadline_budget.py). None: each its own.
    deadline_grace_s: float | None = None
    # Every prefill engine ejected: a decode engine prefills the request (False, with
    # --local-prefill off: a 503 with Retry-After).
    local_when_no_prefill: bool = True
    # Seconds the prefill engines hold a prompt's KV for its decode engine (their
    # kv_lease_duration, which the launcher sets from poolpilot.handoff): past the pickup
    # margin, a handoff becomes a local prefill (router/kv_lease.py). None: not checked.
    kv_lease_s: float | None = field(default_factory=lambda: float(handoff.kv_lease_seconds()))

    def roles(self) -> tuple[str, ...]:
        return ("prefill", "decode") if self.mode == DISAGGREGATED else ("engine",)
