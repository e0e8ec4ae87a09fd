"""Each Prometheus answer parsed on its own: a malformed one is no data for the pools it
covers and the rest of the cycle goes on; absurd values count as missing; sample ages on
Prometheus's clock. The JSON shapes are the HTTP API's (/api/v1/query)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from poolpilot.autoscaler import queries as q
from poolpilot.autoscaler.decide import History, Policy, decide
from poolpilot.autoscaler.kube import RoleState
from poolpilot.autoscaler.observe import (
    MalformedAnswer,
    Snapshot,
    observation,
    parse_answer,
    vector_data,
)

T = 1_800_000_000.0  # Prometheus's evaluation time


def series(pool: str, value: Any, role: str = "decode", at: Any = T) -> dict[str, Any]:
    return {"metric": {"namespace": "ns", "pool": pool, "role": role}, "value": [at, value]}


def body(result_type: str, result: Any) -> bytes:
    return orjson.dumps({"status": "success", "data": {"resultType": result_type,
                                                         "result": result}})


@dataclass
class ShapeCase:
    id: str
    body: bytes
    error: str | None = None  # MalformedAnswer's message contains this


SHAPES = [
    ShapeCase("vector", body("vector", [series("a", "1")])),
    ShapeCase("empty-vector", body("vector", [])),
    ShapeCase("matrix", body("matrix", [{"metric": {}, "values": [[T, "1"]]}]), "a matrix"),
    ShapeCase("scalar", body("scalar", [T, "1"]), "a scalar"),
    ShapeCase("string", body("string", [T, "x"]), "a string"),
    ShapeCase("no-data", orjson.dumps({"status": "success"}), "no data"),
    ShapeCase("not-json", b"<html>502 Bad Gateway</html>", "not JSON"),
    ShapeCase("json-list", b"[1, 2]", "no data"),
]


@pytest.mark.parametrize("c", SHAPES, ids=[c.id for c in SHAPES])
def test_only_an_instant_vector_is_an_answer(c: ShapeCase) -> None:
    if c.error is None:
        assert vector_data(c.body)["resultType"] == "vector"
    else:
        with pytest.raises(MalformedAnswer, match=c.error):
            vector_data(c.body)


@dataclass
class SeriesCase:
    id: str
    result: list[Any]
    values: dict[str, float] = field(default_factory=dict)  # pool -> value kept
    bad: tuple[str, ...] = ()  # pools with no data this cycle


SERIES = [
    SeriesCase("numbers", [series("a", "3"), series("b", "0.5")], {"a": 3.0, "b": 0.5}),
    SeriesCase("nan-and-inf-are-values", [series("a", "NaN"), series("b", "+Inf")],
               {"a": float("nan"), "b": float("inf")}),
    SeriesCase("non-numeric-value", [series("a", "lots"), series("b", "2")], {"b": 2.0}, ("a",)),
    SeriesCase("missing-value", [{"metric": {"namespace": "ns", "pool": "a"}},
                                 series("b", "2")], {"b": 2.0}, ("a",)),
    SeriesCase("value-not-a-pair", [{"metric": {"namespace": "ns", "pool": "a"},
                                     "value": ["1"]}], {}, ("a",)),
    SeriesCase("null-value", [series("a", None)], {}, ("a",)),
    SeriesCase("boolean-value", [series("a", True)], {}, ("a",)),
    SeriesCase("time-not-a-number", [series("a", "1", at="soon")], {}, ("a",)),
    SeriesCase("series-not-an-object", ["a", series("b", "2")], {"b": 2.0}, ("",)),
]


@pytest.mark.parametrize("c", SERIES, ids=[c.id for c in SERIES])
def test_a_malformed_series_is_no_data_for_its_pool_alone(c: SeriesCase) -> None:
    ans = parse_answer(c.result, q.WAITING)
    got = {g[1]: v for g, v in ans.values.get(q.WAITING, {}).items()}
    assert got.keys() == c.values.keys()
    for pool, want in c.values.items():
        assert repr(got[pool]) == repr(want)  # NaN equals NaN here
    assert sorted(p for _, p in ans.bad) == sorted(c.bad)
    assert all(q.WAITING in why for why in ans.bad.values())  # the reason names the query


def decode_snapshot(**overrides: dict[tuple[str, str, str], float]) -> Snapshot:
    g = ("ns", "a", "decode")
    values = {q.WAITING: {g: 0.0}, q.RUNNING: {g: 4.0}, q.KV_USAGE: {g: 0.3},
              q.GENERATION_RATE: {g: 500.0}, q.SAMPLE_TIME: {g: T - 5}}
    values |= overrides
    return Snapshot(time=T, values=values, evaluated={k: T for k in values})


def test_a_pool_with_a_malformed_series_holds_and_another_pool_goes_on() -> None:
    snap = decode_snapshot()
    snap.pool_errors[("ns", "b")] = "query waiting: value 'lots' at 1 is not a number"
    pol = Policy(bounds={"decode": (1, 8)})
    good = observation("ns", "a", {"decode": RoleState(2, 2)}, snap, 0.9, 0.9)
    bad = observation("ns", "b", {"decode": RoleState(2, 2)}, snap, 0.9, 0.9)
    assert good.prometheus_error is None
    d = decide(bad, pol, History.warm(), T)
    assert d.metrics_available.status is False
    assert "query waiting" in d.metrics_available.message
    assert decide(good, pol, History.warm(), T).metrics_available.status is True


G = ("ns", "a", "decode")


@dataclass
class AbsurdCase:
    id: str
    key: str
    value: float
    kept: bool
    replicas: int = 2


ABSURD = [
    AbsurdCase("queue-1e308", q.WAITING, 1e308, False),
    AbsurdCase("queue-long-but-real", q.WAITING, 50_000.0, True),
    AbsurdCase("queue-ceiling-scales-with-replicas", q.WAITING, 150_000.0, True, replicas=2),
    AbsurdCase("queue-above-ceiling-at-one-replica", q.WAITING, 150_000.0, False, replicas=1),
    AbsurdCase("tokens-per-second-1e12", q.GENERATION_RATE, 1e12, False),
    AbsurdCase("tokens-per-second-real", q.GENERATION_RATE, 9e4, True),
    AbsurdCase("kv-usage-above-one", q.KV_USAGE, 37.0, False),
    AbsurdCase("kv-usage-full", q.KV_USAGE, 1.0, True),
    AbsurdCase("itl-a-year", q.itl_key(0.9), 3e7, False),
]


@pytest.mark.parametrize("c", ABSURD, ids=[c.id for c in ABSURD])
def test_absurd_values_count_as_missing(c: AbsurdCase) -> None:
    snap = decode_snapshot(**{c.key: {G: c.value}})
    obs = observation("ns", "a", {"decode": RoleState(c.replicas, c.replicas)}, snap, 0.9, 0.9)
    field_name = {q.itl_key(0.9): "itl", q.GENERATION_RATE: "generation_tokens_rate"}.get(
        c.key, c.key)
    got = getattr(obs.roles["decode"], field_name)
    assert (got == c.value) if c.kept else got is None


def test_an_absurd_required_signal_holds_the_pool() -> None:
    snap = decode_snapshot(**{q.WAITING: {G: 1e308}})
    obs = observation("ns", "a", {"decode": RoleState(2, 2)}, snap, 0.9, 0.9)
    d = decide(obs, Policy(bounds={"decode": (1, 8)}), History.warm(), T)
    assert d.replicas["decode"] == 2 and d.metrics_available.reason == "MetricsUnavailable"


@dataclass
class AgeCase:
    id: str
    evaluated: float  # Prometheus's evaluation time of the sample-time query
    local: float  # the autoscaler's clock (Snapshot.time when nothing answered)
    age: float


AGES = [
    AgeCase("clocks-agree", T, T, 21.0),
    AgeCase("local-clock-20s-behind", T, T - 20, 21.0),
    AgeCase("local-clock-20s-ahead", T, T + 20, 21.0),
]


@pytest.mark.parametrize("c", AGES, ids=[c.id for c in AGES])
def test_sample_age_is_taken_on_prometheus_clock(c: AgeCase) -> None:
    snap = decode_snapshot(**{q.SAMPLE_TIME: {G: T - 21}})
    snap.time, snap.evaluated[q.SAMPLE_TIME] = c.local, c.evaluated
    obs = observation("ns", "a", {"decode": RoleState(2, 2)}, snap, 0.9, 0.9)
    assert obs.roles["decode"].sample_age == pytest.approx(c.age)
    d = decide(obs, Policy(bounds={"decode": (1, 8)}, max_metric_age=15), History.warm(), T)
    assert d.roles["decode"].reason == "MetricsStale"
