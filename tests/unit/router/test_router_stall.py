"""The decode deadline: how long a stream may wait for its first token and between tokens,
from --decode-stall-itls x --itl-target (simulated seconds, at least MIN_DEADLINE_S real
ones)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest
from poolpilot.router.main import UsageError, add_arguments, clock_from_args, config_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--prefill", "http://p:1", "--decode", "http://d:1", *argv])


@dataclass(frozen=True)
class StallCase:
    id: str
    argv: tuple[str, ...]
    handoff: bool
    first: float | None  # real seconds to the first token; None: only --idle-timeout
    between: float | None  # real seconds between tokens


CASES = [
    StallCase("default-200-itls-after-a-handoff", (), True, 10.0, 10.0),
    # An engine that prefills itself also has the prefill deadline (5 TTFT targets).
    StallCase("local-prefill-adds-the-prefill-deadline", (), False, 15.0, 10.0),
    # 20 x 0.1 s and 200 x 0.05 s / 10 are 2 s and 1 s: both raised to the 3 s floor (a
    # compressed clock's deadline must stay above the machine's scheduling pauses).
    StallCase("from-flags", ("--itl-target", "0.1", "--decode-stall-itls", "20"), True, 3.0,
              3.0),
    StallCase("sandbox-clock", ("--speed", "10"), True, 3.0, 3.0),
    StallCase("no-prefill-deadline-no-first-token-deadline",
              ("--prefill-deadline-ttfts", "0"), False, None, 10.0),
    StallCase("off", ("--decode-stall-itls", "0"), True, None, None),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_token_deadlines(case: StallCase) -> None:
    from poolpilot.router.app import Router

    args = parse(*case.argv)
    clock = clock_from_args(args)
    router = Router(config_from_args(args), clock=clock)
    first, between = (None if s is None else clock.real(s)
                      for s in router._token_deadlines(case.handoff))
    assert (first, between) == (pytest.approx(case.first), pytest.approx(case.between))


@pytest.mark.parametrize("value", ["-1", "nan", "inf"], ids=["negative", "nan", "inf"])
def test_a_bad_decode_stall_flag_is_refused_naming_it(value: str) -> None:
    with pytest.raises(UsageError, match=r"^--decode-stall-itls "):
        config_from_args(parse("--decode-stall-itls", value))
