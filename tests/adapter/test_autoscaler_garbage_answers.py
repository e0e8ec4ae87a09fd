"""The autoscaler against a fake Prometheus (aiohttp, real HTTP) that answers garbage for some
queries: each answer is parsed on its own, so a bad one is no data (MetricsAvailable=False,
the reason naming the query) only for the pools it covers, and the cycle goes on with the rest.
The fake's clock runs 20 s ahead of the autoscaler's: the ages still count on Prometheus's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from aiohttp import web
from poolpilot.autoscaler import queries as q
from poolpilot.autoscaler.decide import History, Policy, decide
from poolpilot.autoscaler.kube import RoleState
from poolpilot.autoscaler.observe import PrometheusSource, observation

pytestmark = pytest.mark.adapter

SKEW = 20.0  # the fake Prometheus's clock is this far ahead of the local one
POOLS = ("a", "b")
DECODE = {q.WAITING: "0", q.RUNNING: "4", q.KV_USAGE: "0.3", q.GENERATION_RATE: "500"}

Answer = Callable[[str, float], tuple[int, bytes]]  # (key, Prometheus's now) -> status, body


def vector(result: list[Any]) -> bytes:
    return orjson.dumps({"status": "success", "data": {"resultType": "vector",
                                                         "result": result}})


def good(key: str, now: float) -> tuple[int, bytes]:
    """Every pool's decode role, fresh (sampled 2 s before Prometheus's now)."""
    value = str(now - 2) if key == q.SAMPLE_TIME else DECODE.get(key)
    if value is None:  # signals a decode-only pool may lack: no series
        return 200, vector([])
    return 200, vector([{"metric": {"namespace": "ns", "pool": p, "role": "decode"},
                         "value": [now, value]} for p in POOLS])


class FakePrometheus:
    """/api/v1/query: recognises the autoscaler's queries by their text and answers each
    with `answer`; records the `time` parameters it was sent."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.keys = {v: k for k, v in q.QuerySet().build().items()}
        self.times: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    async def _query(self, request: web.Request) -> web.Response:
        form = await request.post()
        if "time" in form:
            self.times.append(str(form["time"]))
        key = self.keys.get(str(form.get("query", "")), "")
        status, body = self.answer(key, time.time() + SKEW)
        return web.Response(status=status, body=body, content_type="application/json")

    def start(self) -> FakePrometheus:
        self._thread.start()

        async def serve() -> int:
            app = web.Application()
            app.router.add_post("/api/v1/query", self._query)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            return int(self._runner.addresses[0][1])

        self.port = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(30)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def prom() -> Iterator[Callable[[Answer], PrometheusSource]]:
    started: list[FakePrometheus] = []

    def make(answer: Answer) -> PrometheusSource:
        fake = FakePrometheus(answer).start()
        started.append(fake)
        return PrometheusSource(f"http://127.0.0.1:{fake.port}", timeout=5, use_rules=False)

    yield make
    for fake in started:
        fake.stop()
        assert fake.times == []  # evaluated at Prometheus's own now


@dataclass
class GarbageCase:
    id: str
    answer: Answer
    held: tuple[str, ...]  # pools with MetricsAvailable=False
    says: str  # in their condition's message


def garbage_for(key: str, status: int, body: bytes) -> Answer:
    return lambda k, now: (status, body) if k == key else good(k, now)


def one_pool_garbled(k: str, now: float) -> tuple[int, bytes]:
    if k != q.WAITING:
        return good(k, now)
    return 200, vector([{"metric": {"namespace": "ns", "pool": "a", "role": "decode"},
                         "value": [now, "lots"]},
                        {"metric": {"namespace": "ns", "pool": "b", "role": "decode"},
                         "value": [now, "0"]}])


CASES = [
    GarbageCase("all-good", good, (), ""),
    GarbageCase("http-500-for-one-query",
                garbage_for(q.KV_USAGE, 500, b'{"status":"error","error":"boom"}'), POOLS,
                "query kv_usage: PrometheusQueryError: HTTP Status Code 500"),
    GarbageCase("matrix-for-one-query",
                garbage_for(q.RUNNING, 200, orjson.dumps(
                    {"status": "success", "data": {"resultType": "matrix", "result": []}})),
                POOLS, "query running: MalformedAnswer: a matrix"),
    GarbageCase("html-for-one-query", garbage_for(q.WAITING, 200, b"<html>oops</html>"), POOLS,
                "query waiting: MalformedAnswer: not JSON"),
    GarbageCase("non-numeric-value-for-one-pool", one_pool_garbled, ("a",),
                "query waiting: value 'lots'"),
]


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_garbage_for_one_query_is_no_data_for_the_pools_it_covers(
        prom: Callable[[Answer], PrometheusSource], c: GarbageCase) -> None:
    snap = prom(c.answer).fetch()
    # The queries that answered are all there, whatever happened to the others.
    assert snap.values[q.GENERATION_RATE][("ns", "b", "decode")] == 500.0
    pol = Policy(bounds={"decode": (1, 8)})
    for pool in POOLS:
        obs = observation("ns", pool, {"decode": RoleState(2, 2)}, snap, 0.9, 0.9)
        d = decide(obs, pol, History.warm(), time.time())
        held = pool in c.held
        assert d.metrics_available.status is not held, d.metrics_available
        if held:  # holds its size
            assert d.replicas["decode"] == 2 and c.says in d.metrics_available.message
        else:  # the sample is 2 s old on Prometheus's clock, 20 s ahead of ours
            assert obs.roles["decode"].sample_age == pytest.approx(2.0, abs=1.0)
