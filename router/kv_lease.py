"""The prefill KV lease, seen from the router: may a decode request still carry the prefill's
`kv_transfer_params`, or may a release still read them?

A NIXL prefill engine holds a prompt's KV blocks for `kv_lease_duration` seconds after it
answered (vLLM 0.32; the launcher sets it from poolpilot.handoff). A decode engine that has
the request queued renews the lease by heartbeats every lease/6 seconds; one that gets the
request after the lease ran out reads blocks the prefill engine may already have given to
another request (vLLM logs "Potentially invalid KV blocks ... were retrieved by a decode
worker") and computes on them. So the router sends stale parameters nowhere: past the
point where a decode engine could still pick the KV up in time, it serves the request with a
local prefill (the decode engine computes the prompt itself) and sends no release (the
blocks are freed by the lease; a release would be exactly that late read).

Pure: no I/O, no clock (the caller passes `now`, in the router's clock).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# Real seconds for a decode request to cross to its engine and be queued there, on top of one
# heartbeat interval (the decode engine's first renewal may come that much after it queued
# the request).
PICKUP_S = 1.0


def pickup_margin(lease_s: float, pickup_s: float = PICKUP_S) -> float:
    """How long before the lease runs out the router stops handing the KV over: one heartbeat
    interval (lease / 6, as vLLM derives it) plus the crossing, `pickup_s` (PICKUP_S in the
    lease's unit)."""
    return lease_s / 6 + pickup_s


@dataclass(frozen=True)
class KvLease:
    """The lease of one prefill answer: granted (about) when the router read the answer's
    status line, for `lease_s` seconds of the router's clock, by the engine at
    `prefill_url`; `pickup_s`: PICKUP_S on that clock."""

    granted_at: float
    lease_s: float
    prefill_url: str = ""
    pickup_s: float = PICKUP_S

    @property
    def expires_at(self) -> float:
        return self.granted_at + self.lease_s

    def usable(self, now: float) -> bool:
        """A decode request sent now would be picked up before the lease runs out."""
        return now < self.expires_at - pickup_margin(self.lease_s, self.pickup_s)

    def releasable(self, now: float) -> bool:
        """A release (a one-token read of the KV) sent now would read it while it is held:
        the same bound as a handoff, since a release is a decode request too."""
        return self.usable(now)


class LeaseRanOut(Exception):
    """The prefill's KV lease may run out before a decode engine could pick the KV up: the
    request is not sent with its transfer parameters."""

    def __init__(self, lease: KvLease, now: float) -> None:
        super().__init__(f"the KV lease of the prefill on {lease.prefill_url} runs out "
                         f"{lease.expires_at - now:.1f} s from now, too soon for a decode "
                         "engine to pick it up")
        self.lease = lease


def worst_decode_wait(connect_timeout_s: float, max_attempts: int) -> float:
    """The longest the router's own decode step may take before an engine has the request:
    every attempt's connect timeout."""
    return connect_timeout_s * max_attempts


def lease_covers(lease_s: float, connect_timeout_s: float, max_attempts: int) -> bool:
    """The lease leaves room for the router's worst decode wait and the pickup margin, so a
    handoff only falls back to a local prefill when the router itself was held up (CPU
    starvation, an engine answering 503 slowly), not by its configured limits."""
    return worst_decode_wait(connect_timeout_s, max_attempts) + pickup_margin(lease_s) \
        <= lease_s


# Real seconds an unmatched report of an expired lease waits for the other side's: a scrape
# of the engines comes every --health-interval real seconds.
GIVEN_UP_HORIZON_S = 60.0


@dataclass
class GivenUp:
    """Each lease that ran out is counted once as a failed handoff, whichever side saw it
    first: the router when it gave the lease up (`gave_up`), or its scrape of the prefill
    engine's expiry counter (vllm:nixl_num_kv_expired_reqs; `discount`). The engine may
    report the expiry before the router gives up (the router was still waiting on a decode
    engine when the lease ran out) or after: per prefill engine, each side's unmatched
    reports wait `horizon_s` (seconds of the caller's clock) for the other's."""

    horizon_s: float = GIVEN_UP_HORIZON_S
    _router: dict[str, deque[float]] = field(default_factory=dict)  # leases' expiry times
    _engine: dict[str, deque[float]] = field(default_factory=dict)  # when counted at a scrape

    def gave_up(self, lease: KvLease, now: float) -> bool:
        """The router lets `lease` run out; True when it is to be counted now (no scrape
        counted its expiry already)."""
        url = lease.prefill_url
        seen = _fresh(self._engine, url, now - self.horizon_s)
        # The engine's report of this very lease, counted already: the first since the grant.
        # (Not the oldest report: one of an earlier lease that nobody gave up, a decode engine
        # that picked it up late, would stand in the way until the horizon.)
        mine = next((i for i, t in enumerate(seen) if t >= lease.granted_at), None)
        if mine is not None:
            del seen[mine]
            return False
        self._router.setdefault(url, deque()).append(lease.expires_at)
        return True

    def pending(self, url: str) -> int:
        return len(self._router.get(url, ()))

    def discount(self, url: str, bad: float, now: float) -> float:
        """Of `bad` expired or late handoffs a prefill engine reported since the last scrape
        (this router's share), those to count now: less the leases this router gave up and
        counted already."""
        mine = _fresh(self._router, url, now - self.horizon_s)
        while mine and bad > 0:
            mine.popleft()
            bad -= 1.0
        bad = max(0.0, bad)
        if bad > 0:  # counted now: a give-up that comes later is the same lease
            self._engine.setdefault(url, deque()).extend([now] * max(1, round(bad)))
        return bad


def _fresh(queues: dict[str, deque[float]], url: str, since: float) -> deque[float]:
    """`url`'s queue without entries older than `since` (a report the other side never
    matched: an engine that restarted, a lease another router held)."""
    queue = queues.setdefault(url, deque())
    while queue and queue[0] < since:
        queue.popleft()
    return queue
