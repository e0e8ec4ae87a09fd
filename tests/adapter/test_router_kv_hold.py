"""The KV-pinning scenario (long prompts pinning prefill KV), on engine-sim (which models the
prefill engine's KV hold and its lease like vLLM 0.32's NixlConnector).

The prefill engine has a small KV cache (8B on an H200 at 15% memory: 33,600 tokens), so
each held 4,000-token prompt shows as ~0.12 of `vllm:kv_cache_usage_perc`. Its lease is
600 s: whatever frees the blocks in these tests is not the lease running out."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from router_support import (
    FAST,
    Proc,
    metric_value,
    running,
    start_engine_sim,
    start_fake_engine,
    start_router,
    wait_until,
)

pytestmark = pytest.mark.adapter

PREFILL_ARGS = ("--gpu-memory-utilization", "0.15", "--kv-lease-seconds", "600")
PROMPT = "hold " * 4000


def kv_usage(engine: Proc) -> float:
    return metric_value(httpx.get(engine.url + "/metrics", timeout=5).text,
                        "vllm:kv_cache_usage_perc")


def counter(engine: Proc, name: str) -> float:
    return metric_value(httpx.get(engine.url + "/metrics", timeout=5).text, name)


@pytest.fixture(scope="module")
def prefill() -> Iterator[Proc]:
    with running(start_engine_sim("prefill", *PREFILL_ARGS)) as (p,):
        yield p


def test_the_simulated_prefill_engine_holds_kv_for_its_decode_engine(prefill: Proc) -> None:
    """The control: a prefill nobody picks up stays pinned (the lease is 600 s)."""
    before = kv_usage(prefill)
    resp = httpx.post(prefill.url + "/v1/completions", timeout=30, json={
        "model": "sim", "prompt": PROMPT, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True}})
    kv = resp.json()["kv_transfer_params"]
    assert kv_usage(prefill) - before > 0.1
    # Free it again (a decode engine's read), so the next tests start from an empty cache.
    httpx.post(prefill.url + "/sim/kv/pull", json={
        "remote_request_id": kv["remote_request_id"], "remote_engine_id": kv["remote_engine_id"]})
    wait_until(lambda: kv_usage(prefill) == before, 5, "the hold released")


def test_requests_the_decode_engine_would_reject_pin_nothing(prefill: Proc) -> None:
    """The audit's attack (max_tokens -5, n 3 with long prompts): rejected before prefill."""
    with (
        running(start_engine_sim("decode")) as (d,),
        running(start_router("--prefill", prefill.url, "--decode", d.url, *FAST)) as (r,),
    ):
        prompts = counter(prefill, "vllm:prompt_tokens_total")
        for extra in ({"max_tokens": -5}, {"n": 3}) * 5:
            resp = httpx.post(r.url + "/v1/completions", timeout=30,
                              json={"model": "sim", "prompt": PROMPT} | extra)
            assert resp.status_code == 400
        assert kv_usage(prefill) == 0
        assert counter(prefill, "vllm:prompt_tokens_total") == prompts


def test_a_handoff_the_decode_engine_rejects_frees_the_prefills_kv(prefill: Proc) -> None:
    """A decode engine with a shorter context than the prefill engine rejects the handoff
    (a check the router leaves to the engine when only its estimate of a text prompt's length,
    counted low, would exceed it: 4,001 tokens against 3,000); it tells the prefill engine to
    free the blocks, as vLLM 0.32 does, and the client gets the decode engine's 400."""
    with (
        running(start_engine_sim("decode", "--max-model-len", "3000")) as (d,),
        running(start_router("--prefill", prefill.url, "--decode", d.url, *FAST)) as (r,),
    ):
        prompts = counter(prefill, "vllm:prompt_tokens_total")
        resp = httpx.post(r.url + "/v1/completions", timeout=30,
                          json={"model": "sim", "prompt": PROMPT, "max_tokens": 16})
        assert resp.status_code == 400 and "context length" in resp.json()["error"]["message"]
        assert counter(prefill, "vllm:prompt_tokens_total") > prompts  # it was prefilled
        wait_until(lambda: kv_usage(prefill) == 0, 5, "the prefill's KV freed")
        assert counter(prefill, "vllm:nixl_num_kv_expired_reqs_total") == 0


def test_a_client_that_leaves_before_decode_frees_the_prefills_kv(prefill: Proc) -> None:
    """D1 takes 30 s to take the request; the client leaves after 1 s. The router has a
    simulated decode engine read the KV (a one-token decode), which frees the hold."""
    with (
        running(start_fake_engine("D1", 0.0, 0, "--header-delay", "30"),
                start_engine_sim("decode")) as (d1, d2),
        running(start_router("--prefill", prefill.url, "--decode", f"{d1.url},{d2.url}",
                             *FAST)) as (r,),
    ):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(r.url + "/v1/completions", timeout=1.0, json={
                "model": "sim", "prompt": PROMPT, "max_tokens": 16, "stream": True})
        wait_until(lambda: counter(d2, "vllm:nixl_xfer_time_seconds_count") == 1, 10,
                   "the release read at the simulated decode engine")
        wait_until(lambda: kv_usage(prefill) == 0, 5, "the prefill's KV freed")
        assert counter(prefill, "vllm:nixl_num_kv_expired_reqs_total") == 0
        page = httpx.get(r.url + "/metrics").text
        assert metric_value(page, "poolpilot_router_kv_releases_total",
                            {"outcome": "released"}) == 1
        assert metric_value(page, "poolpilot_router_requests_total", {"code": "499"}) == 1
        assert httpx.get(d1.url + "/debug/stats").json()["requests"] == 1  # only the handoff
