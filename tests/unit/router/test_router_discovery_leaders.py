"""The router sends to a multi-node role's leaders only: an endpoint whose pod is a worker of a
LeaderWorkerSet group (worker index not 0) is never a target, even if a Service selects it."""

from __future__ import annotations

from typing import Any

from poolpilot.router.discovery import _slim, endpoints_from_slices, worker_pods

from poolpilot import leaderworkerset as lws


def pod(name: str, index: str | None) -> dict[str, Any]:
    labels = {lws.WORKER_INDEX_LABEL: index} if index is not None else {}
    return {"metadata": {"name": name, "labels": {**labels, "other": "x"}}}


def test_workers_are_left_out_and_leaders_kept() -> None:
    pods = [pod("p-decode-lws-0", "0"), pod("p-decode-lws-0-1", "1"), pod("p-prefill-x", None)]
    workers = worker_pods([_slim(p) for p in pods])
    assert workers == {"p-decode-lws-0-1"}
    slices = [{"metadata": {"labels": {"kubernetes.io/service-name": "p-decode"}},
               "ports": [{"name": "http", "port": 8000}],
               "endpoints": [
                   {"addresses": ["10.0.0.1"], "targetRef": {"name": "p-decode-lws-0"}},
                   {"addresses": ["10.0.0.2"], "targetRef": {"name": "p-decode-lws-0-1"}}]}]
    assert endpoints_from_slices("p", slices, workers=workers)["decode"] == [
        "http://10.0.0.1:8000"]
    assert endpoints_from_slices("p", slices)["decode"] == [
        "http://10.0.0.1:8000", "http://10.0.0.2:8000"]
