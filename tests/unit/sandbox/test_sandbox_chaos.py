"""The chaos run's pure part: the plan a seed gives, the bounds, and the three verdicts."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
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


def outcome(kind: str, t: float = 50.0, error: str | None = None) -> C.Outcome:
    return {
        "answered": C.Outcome(t, t + 1, True, 10, 10, None),
        "error": C.Outcome(t, t + 1, False, 0, 10, error or "APIConnectionError: refused"),
        "truncated": C.Outcome(t, t + 1, True, 4, 10, None),
        "hung": C.Outcome(t, None, False, 0, 10, "no outcome"),
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
    outs[1] = C.Outcome(90, 105, False, 0, 10, outs[1].error)  # sent before, failed during
    per, outside = C.errors_by_fault([r], outs)
    assert per == {0: {"APIConnectionError: Connection error.": 1,
                       "InternalServerError 502": 1}}
    assert outside == 1


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
