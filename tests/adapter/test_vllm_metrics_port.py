"""Real vLLM on CPU started by `poolpilot launch --metrics-port`: its metrics on a port of their
own (vLLM's middleware hook loads runtime_image/engine_metrics_port.py), the same registry as
vLLM's own /metrics on the serving port, and nothing else served there. One aggregated engine:
the adapter tier's shared one (started here, about a minute; later modules use it too)."""

from __future__ import annotations

import httpx
import pytest
from router_support import Proc, SharedEngines, metric_value, vllm_available

pytestmark = [
    pytest.mark.adapter,
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="no vLLM venv: run ./dev setup-vllm"),
]

SERVED = "tiny-llama"


@pytest.fixture(scope="module")
def engine(shared_vllm: SharedEngines) -> tuple[Proc, int]:
    """The adapter tier's shared engine on core 0 (tests/adapter/conftest.py), started with
    --metrics-port."""
    (proc,) = shared_vllm.get(0)
    return proc, proc.metrics_port


def test_the_engine_serves_its_metrics_on_a_port_of_its_own(engine: tuple[Proc, int]) -> None:
    proc, port = engine
    resp = httpx.post(proc.url + "/v1/completions", timeout=120, json={
        "model": SERVED, "prompt": "metrics on a port of their own", "max_tokens": 4,
        "temperature": 0, "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    own = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert own.status_code == 200
    serving = httpx.get(proc.url + "/metrics", timeout=10).text
    # The same registry on both ports (the router reads the serving one inside the pool).
    for name in ("vllm:num_requests_waiting", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total"):
        assert name in own.text and name in serving, name
    assert metric_value(own.text, "vllm:generation_tokens_total") == \
        metric_value(serving, "vllm:generation_tokens_total") >= 4
    # No prompt goes through the metrics port.
    refused = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=10,
                         json={"model": SERVED, "prompt": "x", "max_tokens": 1})
    assert refused.status_code != 200
