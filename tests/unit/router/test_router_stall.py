"""The decode deadline: how long a stream may wait for its first token and between tokens,
from --decode-stall-itls x --itl-target on the router's clock."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest
from poolpilot.router.main import UsageError, add_arguments, config_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--prefill", "http://p:1", "--decode", "http://d:1", *argv])


@dataclass(frozen=True)
class StallCase:
    id: str
    argv: tuple[str, ...]
    handoff: bool
    first: float | None  # seconds to the first token; None: only --idle-timeout
    between: float | None  # seconds between tokens


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

    router = Router(config_from_args(parse(*case.argv)))
    first, between = router._token_deadlines(case.handoff)
    assert (first, between) == (pytest.approx(case.first), pytest.approx(case.between))


@pytest.mark.parametrize("value", ["-1", "nan", "inf"], ids=["negative", "nan", "inf"])
def test_a_bad_decode_stall_flag_is_refused_naming_it(value: str) -> None:
    with pytest.raises(UsageError, match=r"^--decode-stall-itls "):
        config_from_args(parse("--decode-stall-itls", value))
