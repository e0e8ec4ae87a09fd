"""Local prefill through the router process, against fake engine processes: a request goes
to a decode engine alone while the prefill role is behind (and back to P/D when it catches
up), and a failed KV handoff or a prefill that failed on every prefill engine is served by a
local prefill instead of an error.

Real vLLM (same greedy output, the decode engine's own prompt counter) is in
test_vllm_router.py."""

from __future__ import annotations

import threading

import httpx
import pytest
from router_support import (
    FAST,
    metric_value,
    running,
    sse_events,
    start_fake_engine,
    start_router,
    wait_until,
)

pytestmark = pytest.mark.adapter

LOCAL = ("--local-prefill-profile", "llama-3.1-8b/h200", "--ttft-target", "1",
         "--itl-target", "0.05")


def completion(url: str, stream: bool = False, max_tokens: int = 3) -> httpx.Response:
    body = {"model": "fake", "prompt": "hello " * 50, "max_tokens": max_tokens,
            "stream": stream}
    return httpx.post(url + "/v1/completions", json=body, timeout=30)


def text_of(resp: httpx.Response, stream: bool) -> str:
    assert resp.status_code == 200, resp.text
    if not stream:
        return str(resp.json()["choices"][0]["text"])
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]"
    return "".join(e["choices"][0]["text"] for e in events if isinstance(e, dict))


def requests_at(url: str) -> list[dict]:
    return list(httpx.get(url + "/debug/requests", timeout=5).json())


def local_count(router: str, reason: str) -> float:
    page = httpx.get(router + "/metrics", timeout=5).text
    return metric_value(page, "poolpilot_router_local_prefill_total", {"reason": reason})


def test_prefill_behind_serves_on_the_decode_engine_then_returns_to_pd() -> None:
    with (
        running(start_fake_engine("P"), start_fake_engine("D")) as (p, d),
        running(start_router("--prefill", p.url, "--decode", d.url, *FAST, *LOCAL)) as (r,),
    ):
        assert text_of(completion(r.url), False) == "D0 D1 D2 "
        assert len(requests_at(p.url)) == 1  # P/D while prefill keeps up
        assert local_count(r.url, "prefill_behind") == 0

        # The prefill engine's own queue says it is minutes behind (other routers' work).
        httpx.post(p.url + "/debug/waiting", json={"waiting": 5000}, timeout=5)
        wait_until(lambda: completion(r.url).status_code == 200
                   and local_count(r.url, "prefill_behind") > 0, 10, "a local prefill")
        prefilled = len(requests_at(p.url))
        for stream in (False, True):
            assert text_of(completion(r.url, stream), stream) == "D0 D1 D2 "
        assert len(requests_at(p.url)) == prefilled  # the prefill engine saw none of them
        local = requests_at(d.url)[-1]
        assert "kv_transfer_params" not in local and local["max_tokens"] == 3

        # Prefill caught up: back to the P/D path.
        httpx.post(p.url + "/debug/waiting", json={"waiting": 0}, timeout=5)
        wait_until(lambda: completion(r.url).status_code == 200
                   and len(requests_at(p.url)) > prefilled, 10, "the P/D path again")
        count = local_count(r.url, "prefill_behind")
        assert text_of(completion(r.url), False) == "D0 D1 D2 "
        assert local_count(r.url, "prefill_behind") == count
        assert r.output is not None
        assert r.output.shows("local prefill on") and r.output.shows("local prefill off")


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
def test_failed_kv_handoff_is_served_by_a_local_prefill(stream: bool) -> None:
    """The decode engine cannot load the prefill's KV (vLLM: a 500, or an error as the
    stream's first event): the client still gets its answer, prefilled on the decode engine,
    and the failure is counted."""
    with (
        running(start_fake_engine("P"), start_fake_engine("D", 0.0, 0, "--fail-kv-loads"))
        as (p, d),
        running(start_router("--prefill", p.url, "--decode", d.url, *FAST)) as (r,),
    ):
        assert text_of(completion(r.url, stream), stream) == "D0 D1 D2 "
        # The router also tries to free the prefill's KV hold with a one-token read (which
        # this decode engine fails too, like every KV load).
        wait_until(lambda: len(requests_at(d.url)) == 3, 10, "the release attempt")
        with_kv = [b for b in requests_at(d.url) if "kv_transfer_params" in b]
        [local] = [b for b in requests_at(d.url) if "kv_transfer_params" not in b]
        assert sorted((b["max_tokens"], b["stream"]) for b in with_kv) == [(1, False),
                                                                           (3, stream)]
        assert {b["kv_transfer_params"]["remote_engine_id"] for b in with_kv} == {"P"}
        assert local["max_tokens"] == 3
        wait_until(lambda: metric_value(httpx.get(r.url + "/metrics").text,
                                        "poolpilot_router_kv_releases_total",
                                        {"outcome": "failed"}) == 1, 10, "the release counted")
        page = httpx.get(r.url + "/metrics").text
        assert metric_value(page, "poolpilot_router_kv_transfer_failures_total") == 1
        assert metric_value(page, "poolpilot_router_local_prefill_total",
                            {"reason": "kv_transfer_failed"}) == 1
        assert metric_value(page, "poolpilot_router_requests_total", {"code": "200"}) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
def test_a_prefill_failing_on_every_prefill_engine_is_served_by_a_local_prefill(
        stream: bool) -> None:
    """Found by the sandbox's chaos run: the only prefill engine killed while it prefilled a
    request left that request's client with a 502. The router prefills it on a decode engine
    instead, and the next request too while no prefill engine is left."""
    with (
        running(start_fake_engine("P", 60.0), start_fake_engine("D")) as (p, d),
        running(start_router("--prefill", p.url, "--decode", d.url, *FAST)) as (r,),
    ):
        answers: list[httpx.Response] = []
        client = threading.Thread(target=lambda: answers.append(completion(r.url, stream)))
        client.start()
        wait_until(lambda: len(requests_at(p.url)) == 1, 10, "the prefill to start")
        p.kill()  # mid-prefill: the engine answers nothing
        client.join(30)
        assert text_of(answers[0], stream) == "D0 D1 D2 "
        assert text_of(completion(r.url, stream), stream) == "D0 D1 D2 "  # no prefill engine
        served = requests_at(d.url)
        assert len(served) == 2 and all("kv_transfer_params" not in b for b in served)
        page = httpx.get(r.url + "/metrics", timeout=5).text
        assert metric_value(page, "poolpilot_router_local_prefill_total",
                            {"reason": "prefill_failed"}) == 2
        assert metric_value(page, "poolpilot_router_requests_total", {"code": "200"}) == 2
        assert metric_value(page, "poolpilot_router_kv_transfer_failures_total") == 0


def test_a_failed_prefill_with_no_decode_engine_left_names_both_failures() -> None:
    with (
        running(start_fake_engine("P", 60.0), start_fake_engine("D")) as (p, d),
        running(start_router("--prefill", p.url, "--decode", d.url, *FAST)) as (r,),
    ):
        d.kill()
        answers: list[httpx.Response] = []
        client = threading.Thread(target=lambda: answers.append(completion(r.url)))
        client.start()
        wait_until(lambda: len(requests_at(p.url)) == 1, 10, "the prefill to start")
        p.kill()
        client.join(30)
        [resp] = answers
        assert resp.status_code in (502, 503), resp.text
        message = resp.json()["error"]["message"]
        assert "decode engine" in message and "after the prefill step failed" in message
        assert "prefill engine failed" in message
