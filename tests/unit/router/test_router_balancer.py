"""Endpoint selection: least outstanding work, queue depth, ejection, re-admission, ramp-in."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.router.balancer import Balancer, BalancerConfig


def make(urls: list[str], role: str = "decode", **cfg: float) -> Balancer:
    b = Balancer(BalancerConfig(**cfg))  # type: ignore[arg-type]
    b.set_endpoints(role, urls, now=0.0, initial=True)
    return b


@dataclass(frozen=True)
class LoadCase:
    id: str
    inflight: dict[str, int] = field(default_factory=dict)  # url -> requests
    tokens: dict[str, int] = field(default_factory=dict)  # url -> tokens
    waiting: dict[str, float] = field(default_factory=dict)
    expect: str = ""


LOAD_CASES = [
    LoadCase("fewest requests", inflight={"a": 3, "b": 1, "c": 2}, expect="b"),
    LoadCase("tokens weigh in", inflight={"a": 1, "b": 1}, tokens={"a": 4000, "b": 100},
             expect="b"),
    LoadCase("engine queue counts", inflight={"a": 1, "b": 0}, waiting={"b": 5}, expect="a"),
    LoadCase("queue from other routers", waiting={"a": 2, "b": 0.5, "c": 1}, expect="b"),
]


@pytest.mark.parametrize("case", LOAD_CASES, ids=[c.id for c in LOAD_CASES])
def test_picks_least_loaded(case: LoadCase) -> None:
    b = make(["a", "b", "c"] if "c" in {**case.inflight, **case.waiting} else ["a", "b"])
    for url, n in case.inflight.items():
        for _ in range(n):
            b.acquire(url, 0)
    for url, t in case.tokens.items():
        b.acquire(url, t)
        b.get(url).inflight -= 1  # tokens only
    for url, w in case.waiting.items():
        b.update_waiting(url, w)
    picked = b.pick("decode", now=1.0)
    assert picked is not None and picked.url == case.expect


def test_ties_rotate_over_all_endpoints() -> None:
    b = make(["a", "b", "c"])
    picks = Counter(b.pick("decode", 1.0).url for _ in range(30))  # type: ignore[union-attr]
    assert picks == {"a": 10, "b": 10, "c": 10}


def test_roles_are_separate_and_exclude_is_honoured() -> None:
    b = make(["p1", "p2"], role="prefill")
    b.set_endpoints("decode", ["d1"], 0.0, initial=True)
    assert b.pick("decode", 1.0).url == "d1"  # type: ignore[union-attr]
    assert b.pick("prefill", 1.0, exclude=["p1"]).url == "p2"  # type: ignore[union-attr]
    assert b.pick("prefill", 1.0, exclude=["p1", "p2"]) is None
    assert b.pick("engine", 1.0) is None


def test_ejected_after_consecutive_failures_then_readmitted_by_health_check() -> None:
    b = make(["a", "b"], eject_after=2, base_eject_s=5.0, ramp_s=0)
    b.report_failure("a", now=10.0)
    assert not b.get("a").ejected()  # one failure is not enough
    b.report_success("a")
    b.report_failure("a", now=10.0)
    assert not b.get("a").ejected()  # success reset the count
    b.report_failure("a", now=10.0)
    assert b.get("a").ejected()
    assert {b.pick("decode", 11.0).url for _ in range(10)} == {"b"}  # type: ignore[union-attr]
    b.report_health("a", ok=True, now=12.0)  # too early: still backing off
    assert b.get("a").ejected()
    b.report_health("a", ok=True, now=15.0)
    assert not b.get("a").ejected()
    assert "a" in {b.pick("decode", 15.0).url for _ in range(10)}  # type: ignore[union-attr]


def test_backoff_doubles_per_ejection_and_is_capped() -> None:
    b = make(["a"], eject_after=1, base_eject_s=2.0, max_eject_s=5.0)
    backoffs = []
    now = 0.0
    for _ in range(4):
        b.report_failure("a", now)
        until = b.get("a").ejected_until
        assert until is not None
        backoffs.append(until - now)
        now = until
        b.report_health("a", ok=True, now=now)  # re-admitted, but not yet proven
    assert backoffs == [2.0, 4.0, 5.0, 5.0]


def test_all_ejected_still_picks_one_rather_than_failing() -> None:
    b = make(["a", "b"], eject_after=1)
    b.report_failure("a", 0.0)
    b.report_failure("b", 0.0)
    assert b.pick("decode", 0.5) is not None


def test_a_strict_role_with_every_endpoint_ejected_has_no_candidate() -> None:
    # The P/D router's prefill and decode roles: local prefill or a 503, never a hung engine.
    b = make(["a", "b"], eject_after=1)
    b.strict_roles = frozenset({"decode"})
    b.report_failure("a", 0.0)
    assert b.pick("decode", 0.5).url == "b"  # type: ignore[union-attr]
    b.report_failure("b", 0.0)
    assert b.pick("decode", 0.5) is None
    assert b.pick_by_prefix("decode", 0.5, lambda urls: [0] * len(urls), 10, 1.5) is None
    b.report_health("a", ok=True, now=1.0)  # too early: still ejected
    assert b.pick("decode", 1.0) is None
    assert b.pick("decode", 10.0) is not None  # back-offs over: re-admitted on probation


def test_a_failure_that_spares_the_last_counts_but_ejects_only_with_others_left() -> None:
    # A decode engine still pulling KV at the first-token deadline (maybe from a prefill
    # engine that is gone): counted, but the role's last admitted endpoint stays.
    b = make(["a", "b"], eject_after=1)
    b.report_failure("a", 0.0, spare_last=True)
    assert b.get("a").ejected()  # b is left
    b.report_failure("b", 0.0, spare_last=True)
    assert not b.get("b").ejected() and b.get("b").failures == 1
    b.report_failure("b", 0.0)  # a failure of its own
    assert b.get("b").ejected()


def test_forgive_drops_the_failures_and_undoes_the_ejection_with_its_backoff() -> None:
    # A decode engine that answered a failed KV pull: its health checks timed out meanwhile.
    b = make(["a"], eject_after=2, base_eject_s=1.0)
    b.report_failure("a", 0.0)
    assert [e.url for e in b.forgive("a")] == []
    assert b.get("a").failures == 0
    b.report_failure("a", 0.0)
    b.report_failure("a", 0.0)
    assert b.get("a").ejected()
    assert [e.url for e in b.forgive("a")] == ["a"]
    a = b.get("a")
    assert not a.ejected() and a.failures == 0 and a.ejections == 0
    b.report_failure("a", 5.0)
    b.report_failure("a", 5.0)
    assert a.ejected_until == 6.0  # the first back-off again, not the doubled one


def test_backoff_expiry_readmits_on_probation_without_health_checks() -> None:
    b = make(["a", "b"], eject_after=2, base_eject_s=1.0, ramp_s=0)
    b.report_failure("a", 0.0)
    b.report_failure("a", 0.0)
    assert b.pick("decode", 0.5, exclude=["b"]).url == "a"  # type: ignore[union-attr] # panic
    b.pick("decode", 2.0)  # back-off over: re-admitted
    assert not b.get("a").ejected()
    b.report_failure("a", 2.0)  # one more failure ejects again
    assert b.get("a").ejected()


def test_new_endpoint_ramps_in() -> None:
    b = make(["old"], ramp_s=10.0, min_weight=0.1)
    for _ in range(3):
        b.acquire("old", 0)
    b.set_endpoints("decode", ["old", "new"], now=100.0)
    # Just joined (weight 0.1): even idle it scores (0+1)/0.1 = 10 against old's 3+1.
    assert b.pick("decode", 100.0).url == "old"  # type: ignore[union-attr]
    # Half way (weight 0.5): idle scores 2 < 4, so it starts taking work.
    assert b.pick("decode", 105.0).url == "new"  # type: ignore[union-attr]
    b.acquire("new", 0)
    b.acquire("new", 0)
    assert b.pick("decode", 105.0).url == "old"  # type: ignore[union-attr] # 6 > 4
    assert b.pick("decode", 110.0).url == "new"  # type: ignore[union-attr] # 3 < 4
    assert b.get("new").weight(b.config, 105.0) == pytest.approx(0.5)


def test_membership_changes_keep_state_of_remaining_endpoints() -> None:
    b = make(["a", "b"])
    b.acquire("a", 10)
    added, removed = b.set_endpoints("decode", ["a", "c"], now=5.0)
    assert (added, removed) == (["c"], ["b"])
    assert b.get("a").inflight == 1
    b.release("b", 10)  # a request finishing on a removed endpoint is harmless
    assert b.urls() == ["a", "c"]


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["pick", "done", "fail", "health", "waiting", "scale"]),
            st.integers(0, 3),
            st.integers(0, 2000),
        ),
        max_size=80,
    )
)
def test_invariants_under_any_sequence(ops: list[tuple[str, int, int]]) -> None:
    """Counters never go negative, picks are members of the role, and an admitted endpoint
    is always preferred over an ejected one."""
    urls = ["u0", "u1", "u2", "u3"]
    b = make(urls[:2], eject_after=2)
    held: list[tuple[str, int]] = []
    now = 0.0
    for op, i, n in ops:
        now += 0.5
        url = urls[i]
        if op == "pick":
            e = b.pick("decode", now)
            members = {x.url for x in b.role_endpoints("decode")}
            assert e is not None and e.url in members
            admitted = [x for x in b.role_endpoints("decode") if not x.ejected()]
            if admitted:
                assert not e.ejected()
            b.acquire(e.url, n)
            held.append((e.url, n))
        elif op == "done" and held:
            u, t = held.pop(0)
            b.release(u, t)
        elif op == "fail":
            b.report_failure(url, now)
        elif op == "health":
            b.report_health(url, n % 2 == 0, now)
        elif op == "waiting":
            b.update_waiting(url, n - 1000)
        elif op == "scale":
            b.set_endpoints("decode", urls[: 1 + i], now)
        for e in b.endpoints.values():
            assert e.inflight >= 0 and e.inflight_tokens >= 0 and e.waiting >= 0


def test_rotation_is_per_role() -> None:
    """Alternating prefill and decode picks (the P/D flow) must still spread decode picks."""
    b = make(["p"], role="prefill")
    b.set_endpoints("decode", ["d1", "d2"], 0.0, initial=True)
    decodes = []
    for _ in range(4):
        b.pick("prefill", 1.0)
        decodes.append(b.pick("decode", 1.0).url)  # type: ignore[union-attr]
    assert sorted(decodes) == ["d1", "d1", "d2", "d2"]


def test_one_server_in_two_roles_is_one_load_and_one_health() -> None:
    b = make(["s"], role="prefill")
    b.set_endpoints("decode", ["s", "d"], 0.0, initial=True)
    assert len(b.role_endpoints("decode")) == 2  # not swallowed by the prefill entry
    b.acquire("s", 0)
    assert b.get("s", "prefill").inflight == b.get("s", "decode").inflight == 1
    assert b.pick("decode", 1.0).url == "d"  # type: ignore[union-attr]
    b.set_endpoints("prefill", [], 2.0)
    assert [e.role for e in b.by_url("s")] == ["decode"]
