"""The router's start-up checks: every numeric flag and engine URL out of range is refused
with one line naming the flag (a zero byte limit used to turn the limit off, a zero
--eject-after to eject on nothing), and discovery's pod selector."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.router.auth import ApiKeys
from poolpilot.router.discovery import pod_selector
from poolpilot.router.main import (
    UsageError,
    add_arguments,
    clock_from_args,
    config_from_args,
    url_ok,
)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


@dataclass(frozen=True)
class FlagCase:
    id: str
    argv: tuple[str, ...]
    flag: str  # named at the start of the error line


BAD_FLAGS = [
    FlagCase("zero-body-limit", ("--max-request-bytes", "0"), "--max-request-bytes 0"),
    FlagCase("negative-request-timeout", ("--request-timeout", "-1"), "--request-timeout"),
    FlagCase("zero-idle-timeout", ("--idle-timeout", "0"), "--idle-timeout"),
    FlagCase("nan-connect-timeout", ("--connect-timeout", "nan"), "--connect-timeout"),
    FlagCase("negative-drain", ("--drain-timeout", "-5"), "--drain-timeout"),
    FlagCase("eject-after-zero", ("--eject-after", "0"), "--eject-after 0"),
    FlagCase("infinite-health-interval", ("--health-interval", "inf"), "--health-interval"),
    FlagCase("zero-keepalive", ("--keepalive-timeout", "0"), "--keepalive-timeout"),
    FlagCase("negative-ttft-target", ("--ttft-target", "-0.5"), "--ttft-target"),
    FlagCase("zero-itl-target", ("--itl-target", "0"), "--itl-target"),
    FlagCase("url-port-out-of-range", ("--decode", "http://d:99999"), "--decode"),
    FlagCase("url-with-path", ("--decode", "http://d:8000/v1"), "--decode"),
    FlagCase("url-bad-scheme", ("--decode", "ftp://d:8000"), "--decode"),
    FlagCase("url-no-host", ("--decode", "http://:8000"), "--decode"),
]


@pytest.mark.parametrize("case", BAD_FLAGS, ids=[c.id for c in BAD_FLAGS])
def test_a_bad_flag_is_refused_naming_it(case: FlagCase) -> None:
    argv = ("--prefill", "http://p:8000", "--decode", "http://d:8000", *case.argv)
    with pytest.raises(UsageError) as err:
        config_from_args(parse(*argv))
    message = str(err.value)
    assert message.startswith(case.flag) and "\n" not in message


def test_the_defaults_and_edge_values_pass() -> None:
    config = config_from_args(parse("--prefill", "p:8000", "--decode", "https://[::1]:9",
                                    "--ramp-seconds", "0", "--drain-timeout", "0",
                                    "--eject-after", "1", "--max-request-bytes", "1"))
    assert config.max_request_bytes == 1 and config.balancer.eject_after == 1


@given(st.text(max_size=40))
def test_url_ok_never_raises(text: str) -> None:
    assert url_ok(text) in (True, False)


def test_the_pod_watch_selects_by_the_operators_uid_label_when_known() -> None:
    assert pod_selector("llama") == "poolpilot.dev/pool=llama"
    assert (pod_selector("llama", "0b1c")
            == "poolpilot.dev/pool=llama,poolpilot.dev/pool-uid=0b1c")


@dataclass(frozen=True)
class HeaderCase:
    id: str
    header: str | None


MALFORMED = [
    HeaderCase("missing", None),
    HeaderCase("no-scheme", "k1"),
    HeaderCase("basic-scheme", "Basic k1"),
    HeaderCase("scheme-only", "Bearer"),
    HeaderCase("non-utf8-as-aiohttp-decodes-it", b"Bearer \xff\xfek1".decode("utf-8",
                                                                            "surrogateescape")),
    HeaderCase("lone-surrogate", "Bearer \ud800"),
]


@pytest.mark.parametrize("case", MALFORMED, ids=[c.id for c in MALFORMED])
def test_a_malformed_authorization_header_is_no_client(case: HeaderCase) -> None:
    assert ApiKeys(["k1"]).client(case.header) is None
    assert ApiKeys(["k1"]).client("Bearer k1") is not None


@dataclass(frozen=True)
class DeadlineCase:
    id: str
    argv: tuple[str, ...]
    queued_tokens: int
    rate: float  # learned prefill tokens/s (0: none yet)
    seconds: float | None  # the prefill's read deadline; None: only --idle-timeout


DEADLINES = [
    DeadlineCase("default-5-ttft-targets", (), 0, 0.0, 5.0),
    DeadlineCase("targets-from-flags", ("--ttft-target", "0.5", "--prefill-deadline-ttfts",
                                        "2"), 0, 0.0, 3.0),  # 1 s, raised to the floor
    DeadlineCase("queued-work-extends-it", (), 20_000, 10_000.0, 7.0),
    # 5 TTFT targets at --speed 4 are 1.25 s: the floor (3 s) plus the queue's 0.5 s.
    DeadlineCase("sandbox-clock", ("--speed", "4"), 20_000, 10_000.0, 3.5),
    DeadlineCase("never-past-the-idle-timeout", ("--idle-timeout", "6"), 10**9, 1000.0, 6.0),
    DeadlineCase("off", ("--prefill-deadline-ttfts", "0"), 100, 1000.0, None),
]


@pytest.mark.parametrize("case", DEADLINES, ids=[c.id for c in DEADLINES])
def test_the_prefill_deadline_from_the_ttft_target_and_the_queue(case: DeadlineCase) -> None:
    from poolpilot.router.app import Router

    args = parse("--prefill", "p:1", "--decode", "d:1", *case.argv)
    router = Router(config_from_args(args), clock=clock_from_args(args))
    router.prefill_rate.tokens_per_s = case.rate
    timeout = router._prefill_deadline(case.queued_tokens)
    if case.seconds is None:
        assert timeout is None
    else:
        assert timeout is not None and timeout.sock_read == pytest.approx(case.seconds)
