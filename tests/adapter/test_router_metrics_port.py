"""`poolpilot router --metrics-port` and `poolpilot engine-sim --metrics-port`: /metrics on a
port of its own (what the operator's pods run, so NetworkPolicies can let Prometheus reach
metrics and nothing else), and not on the router's serving port."""

from __future__ import annotations

import re
import subprocess

import httpx
import pytest
from poolpilot.testkit.prometheus import free_port
from router_support import (
    FAST,
    POOLPILOT,
    metric_value,
    running,
    start_engine_sim,
    start_router,
)

pytestmark = [pytest.mark.adapter]


def test_router_and_engine_sim_serve_metrics_apart_from_their_serving_ports() -> None:
    sim_metrics = free_port()
    with running(start_engine_sim("aggregated", "--metrics-port", str(sim_metrics))) as (sim,):
        with running(start_router("--engine", sim.url, "--metrics-port", "0", *FAST)) \
                as (router,):
            assert router.output is not None
            line = next(x for x in router.output.lines if "listening on" in x)
            match = re.search(r"metrics_port=(\d+)", line)
            assert match, line
            metrics = f"http://127.0.0.1:{match.group(1)}"
            resp = httpx.post(router.url + "/v1/completions", timeout=30, json={
                "model": "sim", "prompt": "hello there", "max_tokens": 3})
            assert resp.status_code == 200
            page = httpx.get(metrics + "/metrics", timeout=10).text
            assert metric_value(page, "poolpilot_router_requests_total", {"code": "200"}) == 1
            # The serving port has no /metrics; the metrics port nothing but /metrics.
            assert httpx.get(router.url + "/metrics", timeout=10).status_code == 404
            assert httpx.post(metrics + "/v1/completions", timeout=10, json={
                "model": "sim", "prompt": "x"}).status_code in (404, 405)
        own = httpx.get(f"http://127.0.0.1:{sim_metrics}/metrics", timeout=10).text
        serving = httpx.get(sim.url + "/metrics", timeout=10).text
        assert metric_value(own, "vllm:prompt_tokens_total") == \
            metric_value(serving, "vllm:prompt_tokens_total") > 0


def test_a_bad_metrics_port_is_refused_naming_the_flag() -> None:
    out = subprocess.run([POOLPILOT, "router", "--engine", "http://127.0.0.1:9", "--port",
                          "8123", "--metrics-port", "8123"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert "--metrics-port 8123: must be 0..65535 and not --port" in out.stderr
