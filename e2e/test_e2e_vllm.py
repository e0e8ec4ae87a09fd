"""Scenario 6: `--engine vllm-cpu`: the operator's pool runs real vLLM (the tiny offline
model) as one prefill and one decode pod; requests go through the router with a real KV
transfer (NixlConnector, host buffers). Budget: about two minutes (two vLLM starts on 2 cores).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from e2e_support import write_pool
from poolpilot.engine_sim.traces import TraceRequest
from poolpilot.sandbox import tinymodel
from poolpilot.sandbox.data import VLLM_POOL
from poolpilot.sandbox.loadgen import Replayer
from poolpilot.sandbox.supervisor import SandboxConfig
from poolpilot.testkit.sandbox import SandboxThread

VENV = Path(os.environ.get("POOLPILOT_VLLM_VENV", ".cache/vllm-venv"))

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not (VENV / ".installed").exists(),
                       reason="no vLLM venv: run ./dev setup-vllm"),
]


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "))


@pytest.fixture(scope="module")
def sb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxThread]:
    tinymodel.ensure_tiny_model(Path(".cache") / "tiny-llama")
    cfg = SandboxConfig(out_dir=tmp_path_factory.mktemp("vllm-sandbox"), engine="vllm-cpu",
                        speed=1.0, autoscaler=False)
    with SandboxThread(cfg) as sandbox:
        yield sandbox


def test_disaggregated_pool_on_real_vllm_serves_through_the_router(
        sb: SandboxThread, tmp_path: Path) -> None:
    # The shipped vllm-cpu pool: one engine per role, sizes fixed, one router.
    manifest = yaml.safe_load(VLLM_POOL.read_text())
    manifest["metadata"] = {"name": "tiny", "namespace": "e2e"}
    pool = sb.call(sb.sandbox.apply(write_pool(tmp_path, manifest)))
    sb.call(sb.sandbox.wait_ready(pool, timeout=300), timeout=330)
    assert sb.sandbox.controller is not None
    decode = next(rt for rt in sb.sandbox.controller.kubelet.runtimes.values()
                  if rt.name.startswith("tiny-decode-"))
    before = httpx.get(f"http://{decode.ip}:8000/metrics", timeout=10).text
    # Prompts longer than the CPU block size (128 tokens), so KV blocks are handed over.
    trace = [TraceRequest(0.5 * i, 200 + 10 * i, 8) for i in range(6)]
    replayer = Replayer(lambda: sb.sandbox.router_urls(pool), pool.spec.served_name(), 1.0)
    try:
        results = sb.call(replayer.replay(trace, progress=False), timeout=240)
    finally:
        sb.call(replayer.close())
    assert [r.error for r in results if not r.ok] == []
    assert [r.output_tokens for r in results] == [8] * len(trace)
    after = httpx.get(f"http://{decode.ip}:8000/metrics", timeout=10).text
    # The decode engine pulled prompt KV from the prefill engine instead of computing it: at
    # least whole 128-token blocks arrived over NIXL.
    hits = "vllm:external_prefix_cache_hits_total"
    assert metric(after, hits) - metric(before, hits) >= 128
    assert metric(after, "vllm:nixl_xfer_time_seconds_count") > metric(
        before, "vllm:nixl_xfer_time_seconds_count")
