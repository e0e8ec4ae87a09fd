"""One request's deadline budget (router/deadline_budget.py): after its first missed deadline,
every later attempt shares the TTFT target, so a request waits on hung engines one deadline
plus the TTFT target at most, however many attempts it makes."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.router.config import RouterConfig
from poolpilot.router.deadline_budget import DeadlineBudget
from poolpilot.router.main import add_arguments, clock_from_args, config_from_args

from poolpilot.clock import Clock


@dataclass(frozen=True)
class Case:
    id: str
    grace: float | None
    missed_at: float | None  # when an attempt missed its deadline (None: none did)
    deadline: float | None  # the next attempt's own deadline
    now: float
    timeout: float | None  # what that attempt may wait
    spent: bool


CASES = [
    Case("no-miss-keeps-the-attempts-deadline", 1.0, None, 10.0, 50.0, 10.0, False),
    Case("no-miss-no-deadline", 1.0, None, None, 50.0, None, False),
    Case("after-a-miss-the-grace-caps-it", 1.0, 10.0, 15.0, 10.0, 1.0, False),
    Case("the-grace-runs-down", 1.0, 10.0, 15.0, 10.75, 0.25, False),
    Case("a-shorter-own-deadline-stays", 1.0, 10.0, 0.5, 10.0, 0.5, False),
    Case("an-attempt-without-deadline-gets-the-grace", 1.0, 10.0, None, 10.2, 0.8, False),
    Case("spent-at-the-cutoff", 1.0, 10.0, 15.0, 11.0, 0.0, True),
    Case("no-grace-no-budget", None, 10.0, 15.0, 100.0, 15.0, False),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_an_attempts_timeout(case: Case) -> None:
    budget = DeadlineBudget(case.grace)
    if case.missed_at is not None:
        budget.missed(case.missed_at)
    got = budget.timeout(case.deadline, case.now)
    assert got == (None if case.timeout is None else pytest.approx(case.timeout))
    assert budget.spent(case.now) is case.spent


def test_the_grace_starts_at_the_first_miss_only() -> None:
    budget = DeadlineBudget(2.0)
    budget.missed(5.0)
    budget.missed(6.5)  # the retry missed too: no fresh grace
    assert budget.cutoff == 7.0 and budget.missed_deadlines == 2
    assert budget.timeout(10.0, 6.5) == pytest.approx(0.5)


@given(
    grace=st.floats(0.01, 10.0),
    first_deadline=st.floats(0.01, 100.0),
    later=st.lists(st.one_of(st.none(), st.floats(0.01, 100.0)), max_size=8),
    gaps=st.lists(st.floats(0.0, 1.0), min_size=8, max_size=8),
)
def test_hung_engines_cost_one_deadline_plus_the_grace_however_many_attempts(
        grace: float, first_deadline: float, later: list[float | None],
        gaps: list[float]) -> None:
    """Every attempt meets a hung engine and waits its whole timeout; between attempts the
    router spends a little time of its own. The request hears back (its last attempt gives
    up) no later than the first deadline plus the grace (plus the router's own time after
    it)."""
    budget = DeadlineBudget(grace)
    now = 0.0
    for i, deadline in enumerate([first_deadline, *later]):
        if budget.spent(now):
            break  # no attempt starts: the client gets its 504
        timeout = budget.timeout(deadline, now)
        assert timeout is not None  # a hung engine is never waited on without end
        now += max(0.0, timeout)
        budget.missed(now)
        now += gaps[i % len(gaps)]  # the router's own work before the next attempt
    # (the last gap is the router answering the client, not a wait on an engine)
    assert now <= first_deadline + grace + max(gaps) + 1e-9


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--prefill", "p:1", "--decode", "d:1", *argv])


def _config(*argv: str) -> RouterConfig:
    return config_from_args(_args(*argv))


@pytest.mark.parametrize(("argv", "grace"), [
    ((), 1.0),  # the default TTFT target
    (("--ttft-target", "2", "--speed", "8"), 0.25),  # 2 simulated seconds are 0.25 real ones
    (("--prefill-deadline-ttfts", "0", "--decode-stall-itls", "0"), None),  # no deadlines
], ids=["default", "sandbox-clock", "deadlines-off"])
def test_the_grace_is_the_ttft_target_on_the_routers_clock(argv: tuple[str, ...],
                                                           grace: float | None) -> None:
    """`grace`: in real seconds."""
    args = _args(*argv)
    simulated = config_from_args(args).deadline_grace_s
    assert (None if simulated is None else clock_from_args(args).real(simulated)) == grace


def test_a_prefill_after_a_missed_deadline_waits_what_the_budget_has_left() -> None:
    from poolpilot.router.app import Router

    router = Router(_config())
    own = router._prefill_deadline(0)
    capped = router._prefill_deadline(0, 0.4)
    assert own is not None and own.sock_read == pytest.approx(5.0)
    assert capped is not None and capped.sock_read == pytest.approx(0.4)
    off = Router(_config("--prefill-deadline-ttfts", "0"))
    assert off._prefill_deadline(0) is None
    budgeted = off._prefill_deadline(0, 0.4)  # no deadline of its own, but the budget's
    assert budgeted is not None and budgeted.sock_read == pytest.approx(0.4)


@pytest.mark.parametrize(("heard_ago", "until_in"), [
    (None, None),  # never heard from: a deadline missed there is a hung engine
    (1.0, 2.0),  # spoke a second ago on another stream: slow, wait until silent 3 s
    (2.9, 0.1),
    (3.0, None),  # silent a whole deadline: hung
    (10.0, None),
], ids=["never-heard", "spoke-1s-ago", "spoke-just-inside", "silent-a-deadline", "long-silent"])
def test_an_engine_is_hung_once_silent_a_whole_decode_deadline(
        heard_ago: float | None, until_in: float | None) -> None:
    """A first token (or the next) that misses its deadline on an engine whose other streams
    still move is a slow engine's: the stream waits until the engine itself has been silent
    the decode deadline (3 s here), and only then counts it hung."""
    from poolpilot.router.app import Router

    now = [100.0]
    router = Router(_config("--itl-target", "0.015"),
                    clock=Clock(monotonic=lambda: now[0]))  # 3 s floor
    url = "http://d:1"
    if heard_ago is not None:
        router.heard_from[url] = now[0] - heard_ago
    until = router._speaks_until(url, router.config.decode_stall_s)
    assert until == (None if until_in is None else pytest.approx(now[0] + until_in))
    assert router._speaks_until(url, None) is None  # no deadline: nothing to extend
