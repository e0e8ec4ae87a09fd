"""The router's view of a prefill's KV lease (router/kv_lease.py): when a handoff or a release
may still read the KV, and how a lease the router gave up is counted once."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from poolpilot.router.kv_lease import (
    PICKUP_S,
    GivenUp,
    KvLease,
    lease_covers,
    pickup_margin,
)

from poolpilot import handoff
from poolpilot.clock import Clock


@dataclass(frozen=True)
class UseCase:
    id: str
    lease_s: float
    elapsed_s: float
    usable: bool
    rate: float = 1.0  # the router's clock (--speed): the lease and times are simulated


USE_CASES = [
    UseCase("just-granted", 25, 0.0, True),
    # 25 s lease: a heartbeat every 25/6 s, plus 1 s to reach the engine: 19.8 s left to send.
    UseCase("within-the-margin", 25, 19.8, True),
    UseCase("inside-the-pickup-margin", 25, 19.9, False),
    UseCase("past-the-lease", 25, 26.0, False),
    UseCase("short-lease-early", 6, 3.9, True),
    UseCase("short-lease-late", 6, 4.1, False),
    # --speed 8: the heartbeat is 24/6 simulated seconds, the crossing 1 real second (8
    # simulated): 12 simulated seconds left to send.
    UseCase("sandbox-clock-within", 24, 11.9, True, rate=8),
    UseCase("sandbox-clock-inside-the-pickup", 24, 12.1, False, rate=8),
]


@pytest.mark.parametrize("case", USE_CASES, ids=[c.id for c in USE_CASES])
def test_a_handoff_is_usable_only_while_a_decode_engine_can_still_pick_it_up(
    case: UseCase,
) -> None:
    lease = KvLease(granted_at=100.0, lease_s=case.lease_s, prefill_url="http://p",
                    pickup_s=Clock(rate=case.rate).simulated(PICKUP_S))
    assert lease.usable(100.0 + case.elapsed_s) is case.usable
    # A release is a one-token decode: it reads the KV too, under the same bound.
    assert lease.releasable(100.0 + case.elapsed_s) is case.usable


def test_the_default_lease_covers_the_default_router_limits() -> None:
    lease = handoff.kv_lease_seconds()
    assert lease_covers(lease, handoff.ROUTER_CONNECT_TIMEOUT_S, handoff.ROUTER_MAX_ATTEMPTS)
    # Three 10 s connect timeouts need more than the default lease.
    assert not lease_covers(lease, 10.0, 3)
    # ... and the lease the launcher computes for those limits covers them.
    assert lease_covers(handoff.kv_lease_seconds(10.0, 3), 10.0, 3)
    assert pickup_margin(24) == pytest.approx(5.0)


def test_a_given_up_lease_is_not_counted_again_when_the_engine_reports_its_expiry() -> None:
    given = GivenUp(horizon_s=30)
    assert given.gave_up(KvLease(granted_at=0.0, lease_s=6.0, prefill_url="http://p"), 5.0)
    assert given.gave_up(KvLease(granted_at=1.0, lease_s=6.0, prefill_url="http://p"), 5.5)
    # Another engine's expiries are its own.
    assert given.discount("http://other", 2.0, 7.0) == 2.0
    # The engine reports one expiry: one of ours (counted when given up).
    assert given.discount("http://p", 1.0, 7.0) == 0.0
    assert given.pending("http://p") == 1
    # Two more: one is ours, the other a handoff that went wrong on its own.
    assert given.discount("http://p", 2.0, 8.0) == 1.0
    assert given.pending("http://p") == 0


def test_an_expiry_the_engine_reported_first_is_not_counted_again_when_the_router_gives_up(
) -> None:
    """The router was still waiting on a decode engine when the lease ran out: the scrape
    counted the engine's expiry first, so giving the lease up counts nothing more."""
    given = GivenUp(horizon_s=30)
    lease = KvLease(granted_at=10.0, lease_s=6.0, prefill_url="http://p")
    assert given.discount("http://p", 1.0, 16.5) == 1.0  # counted at the scrape
    assert not given.gave_up(lease, 18.0)  # the same lease
    assert given.pending("http://p") == 0
    # A later lease is a new failure.
    assert given.gave_up(KvLease(granted_at=20.0, lease_s=6.0, prefill_url="http://p"), 27.0)


def test_an_earlier_leases_expiry_does_not_hide_the_report_of_the_one_given_up() -> None:
    """A fresh-clone CI run: the warm-up's handoff outlasted its lease (counted at a scrape,
    never given up: the decode engine took it late), then the held request's expiry was
    scraped before the router gave it up; that give-up counted it a second time, the older
    report standing first in line."""
    given = GivenUp(horizon_s=60)
    assert given.discount("http://p", 1.0, 20.2) == 1.0  # the warm-up's (granted at 13)
    held = KvLease(granted_at=21.5, lease_s=6.0, prefill_url="http://p")
    assert given.discount("http://p", 1.0, 28.0) == 1.0  # the held one's, scraped first
    assert not given.gave_up(held, 29.4)  # counted already
    # The warm-up's report still waits for its own lease, should that be given up later.
    assert not given.gave_up(KvLease(granted_at=13.0, lease_s=6.0, prefill_url="http://p"),
                             30.0)
    assert given.gave_up(KvLease(granted_at=25.0, lease_s=6.0, prefill_url="http://p"), 32.0)


def test_a_report_the_other_side_never_matches_stops_hiding_failures() -> None:
    given = GivenUp(horizon_s=30)
    assert given.gave_up(KvLease(granted_at=0.0, lease_s=6.0, prefill_url="http://p"), 4.0)
    # The engine restarted and never reported it: a real failure much later still counts.
    assert given.discount("http://p", 1.0, 6.0 + 31.0) == 1.0
    assert given.pending("http://p") == 0
    # ... and an old engine report does not swallow a much later give-up.
    assert given.gave_up(KvLease(granted_at=100.0, lease_s=6.0, prefill_url="http://p"), 104.0)
