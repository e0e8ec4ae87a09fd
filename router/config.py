"""The router's configuration (what `poolpilot router`'s flags become).

Its durations are of two kinds. Deadlines, leases and the deadline budget's grace are in
simulated seconds, the seconds of the SLO targets, and the Router compares them on its
`poolpilot.clock.Clock`; the transport's limits (timeouts of connections, requests and
releases, health checks, draining) and the balancer's and the approximate prefix index's
durations are in real seconds. In a cluster the two are the same (the clock's rate is 1)."""

from __future__ import annotations

from dataclasses import dataclass, field

from poolpilot.router import local_prefill as lp
from poolpilot.router.auth import ApiKeys
from poolpilot.router.balancer import BalancerConfig
from poolpilot.router.prefill_hold import DEFAULT_PREFILL_HOLD_S
from poolpilot.router.prefix_index import DEFAULT_BALANCE, DEFAULT_MAX_ENTRIES, DEFAULT_TTL_S

from poolpilot import handoff
from poolpilot.clock import Clock
from poolpilot.roles import DISAGGREGATED_ROLES, Mode, Role

PREFIX_ROUTING = ("off", "approximate", "precise")
# The router's own spelling of the modes (--mode, its config file, its listening line): lower
# case, as it always was; the API's Mode is the value.
MODES = {str(m).lower(): m for m in Mode}

# No deadline is shorter than this many *real* seconds. Under time compression (--speed) the
# targets shrink but the machine's scheduling pauses do not: at --speed 8 a 1.25 s decode
# deadline took a busy 2-core machine for hung engines (streams cut, healthy engines ejected).
# At --speed 1 the default deadlines (5 s, 10 s) are above it.
MIN_DEADLINE_S = 3.0


def floored(deadline_s: float | None, clock: Clock) -> float | None:
    """A deadline in simulated seconds, raised to MIN_DEADLINE_S of real time."""
    if deadline_s is None:
        return None
    return max(deadline_s, clock.simulated(MIN_DEADLINE_S))


@dataclass
class RouterConfig:
    mode: Mode = Mode.DISAGGREGATED
    pool: str = "default"
    max_request_bytes: int = 8 * 1024 * 1024
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 600.0  # whole request, prefill included
    idle_timeout_s: float = 120.0  # longest silence from an engine mid-response
    # A client's whole request body, from its headers on: one that stalls or trickles is
    # answered 408 and closed (http_guard.py's header deadline ends with the headers).
    body_timeout_s: float = 30.0
    max_attempts: int = 3  # per phase, on different endpoints
    health_interval_s: float = 2.0
    health_timeout_s: float = 2.0
    drain_timeout_s: float = 30.0
    balancer: BalancerConfig = field(default_factory=BalancerConfig)
    # Local prefill (disaggregated mode): serve a request on a decode engine alone when the
    # prefill role would break the TTFT target (router/local_prefill.py). None: off (no
    # mixed-step profile known for the model); a failed KV handoff is retried locally anyway.
    local_prefill: lp.LocalPrefillPolicy | None = None
    prefill_tokens_per_s: float = 0.0  # seed of the learned prefill rate (0: none measured)
    # Late binding (router/prefill_hold.py): a prompt waits at the router while every prefill
    # engine has more than this much queued work (simulated seconds at the learned prefill
    # rate). None: off, each prompt joins an engine's queue at once.
    prefill_hold_s: float | None = DEFAULT_PREFILL_HOLD_S
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
    # A prefill engine silent this long (simulated seconds: --prefill-deadline-ttfts x the
    # TTFT target; the Router raises it to MIN_DEADLINE_S of real time, `floored`) is hung:
    # the request moves on and the engine counts a failure. None: only idle_timeout_s bounds
    # it.
    prefill_deadline_s: float | None = None
    # A stream that has started but sends no token for this long (simulated seconds:
    # --decode-stall-itls x the ITL target, `floored` like the prefill deadline) is hung: the
    # client gets an in-band error and the engine counts a failure. Before its first token, a
    # decode after a handoff has this long too; an engine that prefills itself, this plus the
    # prefill deadline. None: off.
    decode_stall_s: float | None = None
    # Once one of a request's attempts missed its deadline, what all its later attempts share
    # (the TTFT target, simulated seconds; router/deadline_budget.py). None: each its own.
    deadline_grace_s: float | None = None
    # Every prefill engine ejected: a decode engine prefills the request (False, with
    # --local-prefill off: a 503 with Retry-After).
    local_when_no_prefill: bool = True
    # Simulated seconds the prefill engines hold a prompt's KV for its decode engine (their
    # kv_lease_duration, which the launcher sets from poolpilot.handoff): past the pickup
    # margin, a handoff becomes a local prefill (router/kv_lease.py). None: not checked.
    kv_lease_s: float | None = field(default_factory=lambda: float(handoff.kv_lease_seconds()))

    def roles(self) -> tuple[Role, ...]:
        return DISAGGREGATED_ROLES if self.mode == Mode.DISAGGREGATED else (Role.ENGINE,)
