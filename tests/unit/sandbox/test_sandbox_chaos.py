"""The chaos run's pure part: the plan a seed gives, the bounds, and the verdicts (the three
of every run, and the hung engine's)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.sandbox import chaos as C

KINDS = C.default_kinds(["prefill", "decode"])


def test_plan_is_the_seeds_and_covers_every_fault_once_in_its_slot() -> None:
    a = C.plan(7, KINDS, 10.0, 310.0)
    assert a == C.plan(7, KINDS, 10.0, 310.0)
    assert a != C.plan(8, KINDS, 10.0, 310.0)
    assert sorted(f.kind for f in a) == sorted(KINDS)
    slot = 300.0 / len(KINDS)
    for i, f in enumerate(a):
        assert 10 + i * slot <= f.at_s <= 10 + i * slot + slot * 2 / 3 + 0.1
        lo, hi = C.DOWNTIME_S.get(f.kind, (0.0, 0.0))
        assert lo <= f.down_s <= hi
        assert 0 <= f.pick < 1


@pytest.mark.parametrize(("text", "expected"), [
    ("router", ["router"]),
    ("decode, prometheus,decode", ["decode", "prometheus"]),
], ids=["one", "spaces-and-duplicates"])
def test_parse_kinds(text: str, expected: list[str]) -> None:
    assert C.parse_kinds(text, ["prefill", "decode"]) == expected


@pytest.mark.parametrize("text", ["engine", "dns", ""], ids=["not-this-pool", "unknown", "none"])
def test_parse_kinds_names_the_choices(text: str) -> None:
    with pytest.raises(ValueError, match="choose from operator,autoscaler,prometheus,prefill"):
        C.parse_kinds(text, ["prefill", "decode"])


def test_choose_picks_by_name_order() -> None:
    f = C.Fault(0, "decode", 1.0, pick=0.6)
    assert f.choose(["d-b", "d-a"]) == "d-b"
    assert f.choose([]) is None


B = C.BoundInputs(speed=8, cold_start_s=20, interval_s=10, scrape_s=5)


@pytest.mark.parametrize(("fault", "restarts", "bound"), [
    (C.Fault(0, "prometheus", 0, down_s=40), 0, 40 + 20 + 10 + 30 + 120),
    (C.Fault(0, "operator", 0, down_s=15), 0, 15 + 20 + 30 + 120),
    (C.Fault(0, "decode", 0), 0, 2 + 20 + 30 + 120),
    (C.Fault(0, "decode", 0), 2, 8 + 20 + 30 + 120),
], ids=["prometheus-rates-again", "infra-downtime", "pod-backoff", "kubelet-backoff-grows"])
def test_recovery_bound(fault: C.Fault, restarts: int, bound: float) -> None:
    assert C.recovery_bound_s(fault, B, restarts) == bound


def outcome(kind: str, t: float = 50.0, error: str | None = None) -> C.ChaosRequest:
    return {
        "answered": C.ChaosRequest(t, t + 1, True, 10, 10, None),
        "error": C.ChaosRequest(t, t + 1, False, 0, 10, error or "APIConnectionError: refused"),
        "truncated": C.ChaosRequest(t, t + 1, True, 4, 10, None),
        "hung": C.ChaosRequest(t, None, False, 0, 10, "no outcome"),
    }[kind]


@dataclass
class RequestsCase:
    trace: int
    kinds: list[str]
    ok: bool


@pytest.mark.parametrize("case", [
    RequestsCase(3, ["answered", "answered", "error"], True),
    RequestsCase(3, ["answered", "error"], False),
    RequestsCase(2, ["answered", "truncated"], False),
    RequestsCase(2, ["answered", "hung"], False),
], ids=["errors-are-outcomes", "one-never-sent", "truncated-success", "hung"])
def test_judge_requests(case: RequestsCase) -> None:
    v = C.judge_requests(case.trace, [outcome(k) for k in case.kinds])
    assert v.ok is case.ok
    assert v.data["sent"] == len(case.kinds)


def prom_record(seen: bool = True) -> C.FaultRecord:
    r = C.FaultRecord(C.Fault(0, "prometheus", 100, down_s=40), target="prometheus",
                      injected_s=100.0, restored_s=140.0, recovered_s=190.0, bound_s=150.0)
    r.metrics_unavailable_seen = seen
    r.serving_s = 160.0  # MetricsAvailable=True again; the window (60 s) fills at 220
    return r


def ev(t: float, frm: int, to: int, reason: str = "QueueBelowTarget") -> dict[str, object]:
    return {"t": t, "role": "prefill", "from": frm, "to": to, "reason": reason}


@pytest.mark.parametrize(("events", "seen", "ok"), [
    ([ev(20, 1, 2, "QueueAboveTarget"), ev(150, 2, 3, "QueueAboveTarget"), ev(215, 2, 1)],
     True, True),
    ([ev(120, 2, 3, "QueueAboveTarget")], True, False),
    ([ev(170, 2, 1)], True, False),
    ([ev(145, 2, 1)], True, False),
    ([], False, False),
    ([ev(20, 2, 1, "Unknown")], True, False),
], ids=["scale-up-once-back-and-down-after-the-window", "any-scale-during-outage",
        "scale-down-before-the-window-refilled", "scale-down-before-metrics-usable",
        "condition-never-false", "unannounced-change"])
def test_judge_metrics_holds(events: list[dict[str, object]], seen: bool, ok: bool) -> None:
    v = C.judge_metrics_holds([prom_record(seen)], events, down_window_s=60, interval_s=10,
                              lag_s=8)
    assert v.ok is ok, v.detail


@pytest.mark.parametrize(("recovered", "injected", "ok"), [
    (140.0, 100.0, True), (None, 100.0, False), (300.0, 100.0, False), (None, None, False),
], ids=["within-bound", "never", "late", "not-injected"])
def test_judge_recovery(recovered: float | None, injected: float | None, ok: bool) -> None:
    r = C.FaultRecord(C.Fault(0, "decode", 100), target="p-decode-x", injected_s=injected,
                      recovered_s=recovered, bound_s=100.0,
                      problem=None if injected else "no running decode pod")
    assert C.judge_recovery([r]).ok is ok


def test_errors_are_attributed_to_the_fault_they_fall_in() -> None:
    r = C.FaultRecord(C.Fault(0, "router", 100), target="p-router-x", injected_s=100.0,
                      recovered_s=120.0, bound_s=100.0)
    outs = [outcome("error", 110, "APIConnectionError: Connection error."),
            outcome("error", 90, "InternalServerError: Error code: 502 - {...}"),
            outcome("answered", 110), outcome("error", 10)]
    outs[1] = C.ChaosRequest(90, 105, False, 0, 10, outs[1].error)  # sent before, failed during
    # in flight across the whole fault: sent before it, failed after it ended
    outs.append(C.ChaosRequest(95, 130, False, 0, 10, "InternalServerError: Error code: 503 - x"))
    per, outside = C.errors_by_fault([r], outs)
    assert per == {0: {"APIConnectionError: Connection error.": 1,
                       "InternalServerError 502": 1, "InternalServerError 503": 1}}
    assert [o.sent_s for o in outside] == [10]


def test_section_counts_and_verdicts() -> None:
    rec = prom_record()
    s = C.section(3, [rec], [outcome("answered"), outcome("error", 120)], 2,
                  [ev(20, 1, 2, "QueueAboveTarget")], 60, 10, 8)
    assert s["faults_injected"] == 1 and s["ok"]
    assert s["requests"]["answered"] == 1 and s["requests"]["error"] == 1
    assert s["faults"][0]["errors"] == {"APIConnectionError: refused": 1}
    assert s["scale_events_during_faults"] == 0


def router_record(sole: bool) -> C.FaultRecord:
    return C.FaultRecord(C.Fault(0, "router", 100), target="p-router-x", injected_s=100.0,
                         restored_s=105.0, serving_s=140.0, recovered_s=145.0, bound_s=150.0,
                         sole=sole)


@pytest.mark.parametrize(("sole", "events", "ok"), [
    (True, [ev(104, 2, 1)], True),
    (True, [ev(120, 2, 1)], False),
    (True, [ev(180, 2, 1)], False),
    (True, [ev(195, 2, 1)], True),
    (False, [ev(120, 2, 1)], True),
], ids=["decided-before-the-kill", "while-the-only-router-was-down",
        "before-the-window-refilled", "after-the-window", "another-router-served"])
def test_a_sole_pod_down_hides_the_demand(sole: bool, events: list[dict[str, object]],
                                          ok: bool) -> None:
    v = C.judge_metrics_holds([router_record(sole)], events, down_window_s=60, interval_s=10,
                              lag_s=8)
    assert v.ok is ok, v.detail


def prefill_record(kind: str) -> C.FaultRecord:
    r = C.FaultRecord(C.Fault(0, kind, 100), target="p-prefill-x", injected_s=100.0,
                      restored_s=130.0, recovered_s=140.0, bound_s=100.0, sole=True)
    r.serving_s = 135.0
    return r


def role_ev(t: float, role: str, frm: int, to: int) -> dict[str, object]:
    return {"t": t, "role": role, "from": frm, "to": to, "reason": "QueueAboveTarget"}


@pytest.mark.parametrize("kind", ["prefill", "hung-prefill"])
@pytest.mark.parametrize(("event", "ok"), [
    (role_ev(120, "decode", 1, 2), True),
    (role_ev(120, "prefill", 1, 2), False),
    (role_ev(120, "decode", 2, 1), False),
], ids=["decode-up-for-its-local-prefills", "the-hidden-role-moved", "a-scale-down"])
def test_the_only_engine_of_a_role_down_holds_that_role_and_every_scale_down(
        kind: str, event: dict[str, object], ok: bool) -> None:
    v = C.judge_metrics_holds([prefill_record(kind)], [event], down_window_s=60,
                              interval_s=10, lag_s=8)
    assert v.ok is ok, v.detail


@pytest.mark.parametrize(("kind", "ok"), [("hung-prefill", True), ("prefill", False)])
def test_a_scale_down_before_a_hung_engine_could_be_seen_is_not_held_against_the_pool(
        kind: str, ok: bool) -> None:
    """A CI chaos run: decode 2 -> 1 11.6 s after the only prefill engine was stopped, before
    Prometheus had dropped its series (a scrape timing out, then the rules: 3 scrapes of 5 s);
    until then its last samples read as an idle engine's. A killed pod shows at once."""
    v = C.judge_metrics_holds([prefill_record(kind)], [role_ev(111.6, "decode", 2, 1)],
                              down_window_s=60, interval_s=10, lag_s=8, seen_hung_s=15)
    assert v.ok is ok, v.detail
    late = C.judge_metrics_holds([prefill_record(kind)], [role_ev(124, "decode", 2, 1)],
                                 down_window_s=60, interval_s=10, lag_s=8, seen_hung_s=15)
    assert not late.ok, late.detail


@pytest.mark.parametrize(("sizes", "desired", "autoscaled", "ok"), [
    ({"prefill": (3, 1), "router": (1, 0)}, {"prefill": 3}, True, True),
    ({"prefill": (2, 2)}, {"prefill": 3}, True, False),
    ({"prefill": (2, 2)}, {"prefill": 3}, False, True),
    ({"prefill": (2, 2)}, {"prefill": None}, True, True),
    ({}, {}, True, False),
], ids=["asked-for-even-while-starting", "autoscaler-wants-more", "advisory-mode",
        "no-status-yet", "nothing-read"])
def test_sample_asked_as_desired(sizes: dict[str, tuple[int, int]],
                                 desired: dict[str, int | None], autoscaled: bool,
                                 ok: bool) -> None:
    from poolpilot.sandbox.chaos_run import Sample

    assert Sample(0.0, sizes, desired, None).asked_as_desired(autoscaled) is ok


# -- hung and slow engines ---------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("hung-prefill,slow-decode", ["hung-prefill", "slow-decode"]),
    ("decode,hung-decode", ["decode", "hung-decode"]),
], ids=["hung-and-slow", "kill-and-hang-the-same-role"])
def test_parse_kinds_takes_hung_and_slow_engines_of_the_pools_roles(
        text: str, expected: list[str]) -> None:
    assert C.parse_kinds(text, ["prefill", "decode"]) == expected


@pytest.mark.parametrize("text", ["hung-engine", "slow-router", "hung-", "frozen-decode"],
                         ids=["not-this-pool", "router-is-no-engine", "no-role", "unknown"])
def test_parse_kinds_refuses_other_alive_faults(text: str) -> None:
    with pytest.raises(ValueError, match="hung-prefill,hung-decode,slow-prefill,slow-decode"):
        C.parse_kinds(text, ["prefill", "decode"])


def test_hung_and_slow_are_not_in_the_default_run_and_hold_for_their_range() -> None:
    assert not any(C.alive_fault(k) for k in KINDS)
    kinds = ["hung-decode", "slow-prefill"]
    for f in C.plan(3, kinds, 0.0, 100.0):
        lo, hi = C.DOWNTIME_S[f.kind.split("-")[0]]
        assert lo <= f.down_s <= hi
        assert C.recovery_bound_s(f, B) == round(f.down_s + 2 + 20 + 30 + 120, 1)


T = C.Targets(ttft_s=1.0, itl_s=0.05)


def test_wait_bound_is_the_ttft_target_plus_the_roles_router_deadline() -> None:
    assert T.wait_bound_s("prefill") == 1.0 + 5 * 1.0
    assert T.wait_bound_s("decode") == 1.0 + 200 * 0.05
    assert T.wait_bound_s("engine") == T.wait_bound_s("decode")
    assert C.Targets(1.0, 0.05, allowance_s=2.0).wait_bound_s("prefill") == 8.0


def streamed(sent: float, tokens: tuple[float, ...], finished: float | None = None,
             ok: bool = True) -> C.ChaosRequest:
    return C.ChaosRequest(sent, finished if finished is not None or not tokens else tokens[-1], ok,
                     len(tokens) if ok else 0, len(tokens) if ok else 10,
                     None if ok else "APIError: engine stalled", token_s=tokens)


@dataclass(frozen=True)
class WaitCase:
    name: str
    outcome: C.ChaosRequest
    wait: float | None  # from max(sent, stop=100) to its next token or end; stop 100..130


WAITS = [
    WaitCase("ended-before-the-stop", streamed(90, (91, 95)), None),
    WaitCase("sent-after-it-resumed", streamed(131, (132,)), None),
    WaitCase("sent-during-moved-on-after-the-deadline", streamed(110, (115.5, 116)), 5.5),
    WaitCase("in-flight-its-next-token-after-the-stop", streamed(95, (96, 99, 104, 105)), 4),
    WaitCase("error-seen-is-an-answer", streamed(101, (), finished=111, ok=False), 10),
    WaitCase("never-heard-again", C.ChaosRequest(105, None, False, 0, 10, None), float("inf")),
]


@pytest.mark.parametrize("case", WAITS, ids=lambda c: c.name)
def test_wait_on_a_hung_engine(case: WaitCase) -> None:
    assert C.wait_on(case.outcome, 100.0, 130.0) == case.wait


def hung_record(kind: str = "hung-prefill") -> C.FaultRecord:
    return C.FaultRecord(C.Fault(0, kind, 100, down_s=30), target="p-prefill-a",
                         injected_s=100.0, restored_s=130.0, recovered_s=135.0, bound_s=200.0)


@pytest.mark.parametrize(("kind", "outcomes", "ok"), [
    ("hung-prefill", [streamed(101, (106.5, 107)), streamed(120, (121,))], True),
    ("hung-prefill", [streamed(101, (107.5,))], False),
    ("hung-prefill", [streamed(101, (), finished=221, ok=False)], False),
    ("hung-decode", [streamed(95, (96, 108, 109))], True),
    ("hung-decode", [C.ChaosRequest(105, None, False, 0, 10, None)], False),
    ("slow-prefill", [streamed(101, (200,))], True),
], ids=["moved-on-within-the-prefill-deadline", "past-the-prefill-deadline",
        "idle-timeout-504", "decode-deadline-is-itl-based", "hung-forever",
        "slow-engine-is-not-judged-on-it"])
def test_judge_hung(kind: str, outcomes: list[C.ChaosRequest], ok: bool) -> None:
    v = C.judge_hung([hung_record(kind)], outcomes, T)
    assert v.ok is ok, v.detail


def test_section_has_the_hung_verdict_and_each_stops_waits() -> None:
    s = C.section(3, [hung_record()], [streamed(101, (106, 107)), outcome("answered", 20)], 2,
                  [], 60, 10, 8, T)
    assert s["verdicts"]["hung_engine_costs_a_deadline"]["ok"] and s["ok"]
    (w,) = s["hung_waits"]
    assert (w["requests_waiting"], w["longest_wait_s"], w["bound_s"]) == (1, 5.0, 6.0)
    assert s["faults"][0]["hold_s"] == 30
    late = C.section(3, [hung_record()], [streamed(101, (130.5,)), outcome("answered", 20)],
                     2, [], 60, 10, 8, T)
    assert not late["ok"] and not late["verdicts"]["hung_engine_costs_a_deadline"]["ok"]


def test_router_defaults_are_the_deadlines_the_verdict_assumes() -> None:
    import argparse

    from poolpilot.router.main import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    assert args.prefill_deadline_ttfts == C.PREFILL_DEADLINE_TTFTS
    assert args.decode_stall_itls == C.DECODE_STALL_ITLS


times = st.floats(0, 300, allow_nan=False)


@given(sent=times, gaps=st.lists(st.floats(0, 50, allow_nan=False), max_size=6),
       stop=times, hold=st.floats(0, 60, allow_nan=False), ends=st.booleans())
def test_wait_on_is_never_negative_and_bounded_by_the_next_event(
        sent: float, gaps: list[float], stop: float, hold: float, ends: bool) -> None:
    tokens, t = [], sent
    for g in gaps:
        t += g
        tokens.append(t)
    o = C.ChaosRequest(sent, (t + 1) if ends else None, ends, len(tokens), len(tokens),
                  None, token_s=tuple(tokens))
    w = C.wait_on(o, stop, stop + hold)
    if w is None:  # not waiting during the stop: sent after, or done before
        assert sent > stop + hold or (ends and t + 1 < stop)
    elif w != float("inf"):
        start = max(sent, stop)
        assert 0 <= w <= (t + 1) - start + 5e-4  # wait_on rounds to milliseconds
    else:
        assert not ends and all(x < max(sent, stop) for x in tokens)
