"""The autoscaler learns a role's cold start from the starts its engines measured (the
launcher's phases on /metrics plus the pods' own timestamps) and writes each on its pod."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest
from poolpilot.autoscaler import capacity as model
from poolpilot.autoscaler.decide import History
from poolpilot.autoscaler.loop import Autoscaler, Options, PoolState
from poolpilot.autoscaler.observe import cold_start_annotation, pod_phases, pod_start_times
from poolpilot.autoscaler.queries import COMPILE_CACHE_PHASE, QuerySet

from poolpilot import names

NS, POOL, ROLE = "serving", "chat", "decode"


def pod(name: str, created: str = "2026-12-01T10:00:00Z", scheduled: str | None = None,
        started: str | None = None, note: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True"}]}
    if scheduled:
        status["conditions"].append({"type": "PodScheduled", "status": "True",
                                     "lastTransitionTime": scheduled})
    if started:
        status["containerStatuses"] = [{"name": "engine",
                                        "state": {"running": {"startedAt": started}}}]
    meta: dict[str, Any] = {"name": name, "namespace": NS, "creationTimestamp": created}
    if note:
        meta["annotations"] = {names.COLD_START_ANNOTATION: note}
    return {"metadata": meta, "status": status}


# --- pure parts ------------------------------------------------------------------------------

def test_learn_measured_replaces_what_the_ready_transitions_taught() -> None:
    mem = model.Memory(cold_start=80.0)  # from order -> ready transitions
    mem = model.learn_measured(mem, [30.0])
    assert (mem.cold_start, mem.measured) == (30.0, True)
    mem = model.learn_measured(mem, [40.0, math.nan, -1.0])
    assert mem.cold_start == 30.0 + model.COLD_START_ALPHA * 10.0


def test_no_valid_sample_changes_nothing() -> None:
    mem = model.Memory(cold_start=80.0)
    assert model.learn_measured(mem, [math.nan, 0.0]) == mem


def test_measured_starts_stop_the_ready_transitions_from_teaching() -> None:
    """The same starts, seen up to an interval late and matched to the oldest order: once
    measured, a ready rise completes orders but leaves the learned value."""
    mem = model.track_starts(model.Memory(), 1, 1, 0.0)
    mem = model.track_starts(mem, 2, 1, 10.0)  # an order at 0
    measured = model.learn_measured(mem, [25.0])
    after = model.track_starts(measured, 2, 2, 60.0)
    assert after.cold_start == 25.0 and after.orders == ()
    unmeasured = model.track_starts(mem, 2, 2, 60.0)
    assert unmeasured.cold_start == 60.0  # order at 0, ready seen at 60


def test_annotation_from_the_phases_and_the_pods_timestamps() -> None:
    phases = {"import": 5.0, "weights": 3.123, "compile": 2.0, "ready": 0.5, "total": 10.623}
    created, scheduled, started = pod_start_times(pod(
        "p", "2026-12-01T10:00:00Z", "2026-12-01T10:00:02Z", "2026-12-01T10:00:09Z"))
    note = cold_start_annotation(phases, 1.0, created, scheduled, started)
    assert note == {"scheduled": 2.0, "container": 7.0,
                    "engine": {"import": 5.0, "weights": 3.12, "compile": 2.0, "ready": 0.5},
                    "total": 19.62, "compileCache": "hit"}


def test_annotation_without_the_pods_timestamps_is_the_engines_part() -> None:
    note = cold_start_annotation({"weights": 1.0, "total": 4.0}, None, None, None, None)
    assert note == {"engine": {"weights": 1.0}, "total": 4.0}


def test_pod_phases_leaves_out_what_is_no_duration() -> None:
    result = [
        {"metric": {"pod": "a", "phase": "total"}, "value": [1, "12.5"]},
        {"metric": {"pod": "a", "phase": COMPILE_CACHE_PHASE}, "value": [1, "0"]},
        {"metric": {"pod": "b", "phase": "total"}, "value": [1, "NaN"]},
        {"metric": {"pod": "c", "phase": "total"}, "value": [1, "-3"]},
        {"metric": {"phase": "total"}, "value": [1, "3"]},
        {"metric": {"pod": "d", "phase": "total"}, "value": "garbage"},
    ]
    assert pod_phases(result) == {"a": {"total": 12.5, COMPILE_CACHE_PHASE: 0.0}}


def test_the_query_asks_one_role_by_pod_and_phase() -> None:
    promql = QuerySet().cold_start_query(NS, POOL, ROLE)
    sel = f'{{namespace="{NS}", pool="{POOL}", role="{ROLE}"}}'
    assert promql == (
        f"max by (pod, phase) (poolpilot_engine_cold_start_seconds{sel}) or label_replace("
        f"max by (pod) (poolpilot_engine_compile_cache_hit{sel}), \"phase\", "
        f"\"{COMPILE_CACHE_PHASE}\", \"\", \"\")")


# --- the loop --------------------------------------------------------------------------------

class Kube:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.lists = 0

    async def role_pods(self, namespace: str, pool: str, role: str, pool_uid: str = ""
                        ) -> list[dict[str, Any]]:
        self.lists += 1
        return self.pods

    async def annotate_pod(self, namespace: str, name: str, annotations: Any) -> None:
        self.patches.append((name, dict(annotations)))


class Source:
    def __init__(self, measured: dict[str, dict[str, float]]) -> None:
        self.measured = measured
        self.asked = 0

    def fetch(self, *args: Any, **kw: Any) -> Any:
        raise AssertionError("not used here")

    def cold_starts(self, namespace: str, pool: str, role: str) -> dict[str, dict[str, float]]:
        self.asked += 1
        return self.measured


def learn(scaler: Autoscaler, st: PoolState, ready: int, now: float) -> None:
    asyncio.run(scaler._measured_cold_starts(NS, POOL, ROLE, ready, "", st, now))


def test_new_pods_teach_the_cold_start_and_get_their_annotation() -> None:
    kube = Kube([pod("old", "2026-12-01T09:00:00Z", started="2026-12-01T09:00:05Z"),
                 pod("new", "2026-12-01T10:00:00Z", started="2026-12-01T10:00:04Z")])
    source = Source({"old": {"total": 45.0, COMPILE_CACHE_PHASE: 0.0},
                     "new": {"total": 20.0, "compile": 3.0, COMPILE_CACHE_PHASE: 1.0}})
    scaler = Autoscaler(kube, source)  # type: ignore[arg-type]
    st = PoolState(History.fresh(0.0))
    learn(scaler, st, 2, 100.0)
    mem = st.history.memory[ROLE]
    # oldest first: 50 s, then the newer 24 s moves it half-way
    assert mem.measured and mem.cold_start == 50.0 + model.COLD_START_ALPHA * (24.0 - 50.0)
    notes = {name: json.loads(a[names.COLD_START_ANNOTATION]) for name, a in kube.patches}
    assert notes["new"] == {"engine": {"compile": 3.0}, "total": 24.0, "compileCache": "hit"}
    assert notes["old"]["total"] == 50.0
    # Every ready pod is known: no more questions until the ready count rises again.
    learn(scaler, st, 2, 200.0)
    assert source.asked == 1 and len(kube.patches) == 2


def test_a_pod_not_scraped_yet_is_asked_for_again_for_a_while() -> None:
    kube = Kube([pod("a", started="2026-12-01T10:00:01Z")])
    source = Source({})
    scaler = Autoscaler(kube, source)  # type: ignore[arg-type]
    st = PoolState(History.fresh(0.0))
    learn(scaler, st, 1, 0.0)
    learn(scaler, st, 1, 5.0)  # within COLD_START_ASK_EVERY: not asked
    assert source.asked == 1 and ROLE not in st.history.memory
    source.measured = {"a": {"total": 30.0}}
    learn(scaler, st, 1, 20.0)
    assert source.asked == 2 and st.history.memory[ROLE].cold_start == 31.0
    # A pool whose engines export nothing stops being asked after the look-out window.
    source.measured = {}
    kube.pods.append(pod("b"))
    learn(scaler, st, 2, 30.0)  # the ready count rose: look for the new pod (not yet due)
    learn(scaler, st, 2, 40.0)
    learn(scaler, st, 2, 30.0 + 121.0)
    assert source.asked == 3


def test_an_annotation_already_there_is_not_written_again_and_dry_run_writes_none() -> None:
    note = json.dumps({"engine": {}, "total": 30.0}, separators=(",", ":"))
    kube = Kube([pod("a", created="2026-12-01T10:00:00Z", started="2026-12-01T10:00:00Z",
                     note=note)])
    scaler = Autoscaler(kube, Source({"a": {"total": 30.0}}))  # type: ignore[arg-type]
    st = PoolState(History.fresh(0.0))
    learn(scaler, st, 1, 0.0)  # e.g. a restarted autoscaler: learns, writes nothing
    assert kube.patches == [] and st.history.memory[ROLE].cold_start == 30.0
    dry = Autoscaler(Kube([pod("b")]), Source({"b": {"total": 9.0}}),  # type: ignore[arg-type]
                     Options(dry_run=True))
    st = PoolState(History.fresh(0.0))
    learn(dry, st, 1, 0.0)
    assert dry.kube.patches == [] and st.history.memory[ROLE].cold_start == 9.0  # type: ignore[attr-defined]


@pytest.mark.parametrize("broken", ["source", "kube"])
def test_a_failure_learns_nothing_and_raises_nothing(broken: str) -> None:
    class Boom(Exception):
        pass

    kube = Kube([pod("a")])
    source = Source({"a": {"total": 9.0}})
    if broken == "source":
        source.cold_starts = lambda *a: (_ for _ in ()).throw(Boom("down"))  # type: ignore[method-assign]
    else:
        async def fail(*a: Any, **k: Any) -> list[dict[str, Any]]:
            raise Boom("403")
        kube.role_pods = fail  # type: ignore[method-assign]
    st = PoolState(History.fresh(0.0))
    learn(Autoscaler(kube, source), st, 1, 0.0)  # type: ignore[arg-type]
    assert ROLE not in st.history.memory and kube.patches == []


def test_a_cycle_asks_a_bounded_number_of_roles() -> None:
    """A restarted autoscaler with many pools asks for each role's starts once, a few per
    cycle, the others on the next cycles."""
    from poolpilot.autoscaler import loop

    source = Source({"a": {"total": 9.0}})
    scaler = Autoscaler(Kube([pod("a")]), source)  # type: ignore[arg-type]
    states = [PoolState(History.fresh(0.0)) for _ in range(loop.COLD_START_QUERIES_PER_CYCLE + 5)]
    for st in states:
        learn(scaler, st, 1, 0.0)
    assert source.asked == loop.COLD_START_QUERIES_PER_CYCLE
    scaler._cold_start_budget = loop.COLD_START_QUERIES_PER_CYCLE  # the next cycle
    for st in states:
        learn(scaler, st, 1, 500.0)  # long past the window: the ones not asked yet still are
    assert source.asked == len(states)
    assert all(st.history.memory[ROLE].cold_start == 9.0 for st in states)
