"""The router over real HTTP against fake engine processes (fast, killable): the P/D request
shapes, retries, mid-stream failures, disconnects, limits, load-aware selection, draining.

The happy path against real vLLM is in test_vllm_*.py; these cover what vLLM on 2 CPU cores
would make too slow or too flaky to provoke.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from router_support import (
    FAST,
    Proc,
    metric_value,
    running,
    sse_events,
    start_fake_engine,
    start_router,
    wait_until,
)

pytestmark = pytest.mark.adapter



def completion(
    url: str, stream: bool = False, max_tokens: int = 4, **extra: object
) -> httpx.Response:
    body = {"model": "fake", "prompt": "hello " * 50, "max_tokens": max_tokens, "stream": stream}
    return httpx.post(url + "/v1/completions", json=body | extra, timeout=30)


def stats(engine: Proc) -> dict:
    return httpx.get(engine.url + "/debug/stats", timeout=5).json()


def test_disaggregated_request_shapes_and_relay() -> None:
    """Prefill gets max_tokens 1, stream false and do_remote_decode; decode gets the client's
    request with the prefill's kv_transfer_params; the client gets the decode's tokens."""
    with (
        running(start_fake_engine("P"), start_fake_engine("D")) as (p, d),
        running(start_router("--prefill", p.url, "--decode", d.url, *FAST)) as (r,),
    ):
        resp = completion(r.url, stream=True, max_tokens=3, stream_options={
            "include_usage": True})
        assert resp.status_code == 200
        events = sse_events(resp.text)
        assert "".join(e["choices"][0]["text"] for e in events if isinstance(e, dict)) \
            == "D0 D1 D2 "
        assert events[-1] == "[DONE]"
        [pre] = httpx.get(p.url + "/debug/requests").json()
        assert (pre["max_tokens"], pre["stream"]) == (1, False)
        assert pre["kv_transfer_params"]["do_remote_decode"] is True
        assert "stream_options" not in pre
        [dec] = httpx.get(d.url + "/debug/requests").json()
        assert dec["kv_transfer_params"]["remote_engine_id"] == "P"
        assert (dec["max_tokens"], dec["stream"]) == (3, True)
        assert dec["stream_options"] == {"include_usage": True}

        chat = httpx.post(r.url + "/v1/chat/completions", timeout=10, json={
            "model": "fake", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2})
        assert chat.json()["choices"][0]["message"]["content"] == "D0 D1 "
        assert httpx.get(r.url + "/v1/models").json()["data"][0]["id"] == "fake"

        page = httpx.get(r.url + "/metrics").text
        assert metric_value(page, "poolpilot_router_requests_total",
                            {"pool": "default", "code": "200"}) == 2
        assert metric_value(page, "poolpilot_router_time_to_first_token_seconds_count") == 1
        assert metric_value(page, "poolpilot_router_inter_token_latency_seconds_count") >= 1
        assert metric_value(page, "poolpilot_router_kv_transfer_failures_total") == 0

        # The decode engine fails after the prefill handed over: 502 with its message.
        boom = completion(r.url, model="boom")
        assert boom.status_code == 502
        assert "engine exploded" in boom.json()["error"]["message"]
        page = httpx.get(r.url + "/metrics").text
        assert metric_value(page, "poolpilot_router_kv_transfer_failures_total") == 1
        assert metric_value(page, "poolpilot_router_requests_total", {"code": "502"}) == 1


def test_aggregated_forwards_and_passes_client_errors_back() -> None:
    with (
        running(start_fake_engine("E")) as (e,),
        running(start_router("--engine", e.url, *FAST)) as (r,),
    ):
        assert completion(r.url, max_tokens=2).json()["choices"][0]["text"] == "E0 E1 "
        bad = completion(r.url, model="bad")
        assert bad.status_code == 404
        assert "does not exist" in bad.json()["error"]["message"]
        [first, _] = httpx.get(e.url + "/debug/requests").json()
        assert "kv_transfer_params" not in first


def test_prefill_killed_under_load_requests_succeed_on_the_other() -> None:
    engines = [start_fake_engine("P1", 0.02), start_fake_engine("P2", 0.02),
               start_fake_engine("D", 0.002)]
    with (
        running(*engines) as (p1, p2, d),
        running(start_router("--prefill", f"{p1.url},{p2.url}", "--decode", d.url, *FAST)) as (r,),
    ):
        results: list[int] = []

        def one(i: int) -> int:
            if i == 20:
                p1.kill()  # mid-load: some requests are in flight on P1 now
            return completion(r.url, stream=bool(i % 2), max_tokens=3).status_code

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(one, range(60)))
        assert results == [200] * 60
        assert httpx.get(r.url + "/health").status_code == 200
        assert stats(p2)["completed"] > 0
        # Not vacuous: the router did see P1 fail and moved on.
        assert r.output is not None and r.output.shows(f"{p1.url}: prefill engine failed")


def test_decode_killed_mid_stream_client_gets_error_router_stays_healthy() -> None:
    engines = [start_fake_engine("P"), start_fake_engine("D1", 0.05),
               start_fake_engine("D2", 0.05)]
    with (
        running(*engines) as (p, d1, d2),
        running(start_router("--prefill", p.url, "--decode", f"{d1.url},{d2.url}", *FAST)) as (r,),
    ):
        client = openai.OpenAI(base_url=r.url + "/v1", api_key="x", timeout=20,
                               max_retries=0)
        victims = {"D1": d1, "D2": d2}
        stream = client.completions.create(model="fake", prompt="hi", max_tokens=200,
                                           stream=True)
        first = next(iter(stream))
        victim = victims[first.choices[0].text[:2]]
        victim.kill()
        started = time.monotonic()
        with pytest.raises(openai.APIError, match="mid-stream"):
            for _ in stream:
                pass
        assert time.monotonic() - started < 10  # nothing hangs
        assert httpx.get(r.url + "/health").status_code == 200
        # The next requests go to the surviving decode engine.
        for _ in range(3):
            out = client.completions.create(model="fake", prompt="hi", max_tokens=2)
            assert out.choices[0].text.startswith(next(n for n in victims
                                                       if victims[n] is not victim))
        page = httpx.get(r.url + "/metrics").text
        assert metric_value(page, "poolpilot_router_requests_total", {"code": "502"}) == 1
        assert metric_value(page, "poolpilot_router_kv_transfer_failures_total") == 1


def test_client_disconnect_cancels_upstream_work() -> None:
    with (
        running(start_fake_engine("E", 0.05)) as (e,),
        running(start_router("--engine", e.url, *FAST)) as (r,),
    ):
        body = {"model": "fake", "prompt": "x", "max_tokens": 500, "stream": True}
        with httpx.stream("POST", r.url + "/v1/completions", json=body, timeout=10) as s:
            next(s.iter_lines())
        wait_until(lambda: stats(e)["cancelled"] == 1, 10, "the engine's request cancelled")
        assert stats(e)["completed"] == 0
        page = httpx.get(r.url + "/metrics").text
        wait_until(lambda: metric_value(httpx.get(r.url + "/metrics").text,
                                        "poolpilot_router_requests_total",
                                        {"code": "499"}) == 1, 10, "499 counted")
        assert "poolpilot_router_inflight" in page


@pytest.mark.parametrize(
    "stream", [False, True], ids=["non-streaming-504", "streaming-before-first-token-504"]
)
def test_engine_silence_beyond_idle_timeout_ends_the_request(stream: bool) -> None:
    """An engine silent past --idle-timeout before anything reached the client: a 504 in
    OpenAI's error shape (a stream's status line waits for its first event)."""
    with (
        running(start_fake_engine("E", 3.0)) as (e,),
        running(start_router("--engine", e.url, "--idle-timeout", "0.5", "--max-attempts", "1",
                             *FAST)) as (r,),
    ):
        started = time.monotonic()
        resp = completion(r.url, stream=stream, max_tokens=5)
        assert time.monotonic() - started < 3
        assert resp.status_code in ((504,) if stream else (502, 504))
        assert "message" in resp.json()["error"]


def test_request_size_limit() -> None:
    with (
        running(start_fake_engine("E")) as (e,),
        running(start_router("--engine", e.url, "--max-request-bytes", "1000", *FAST)) as (r,),
    ):
        resp = completion(r.url, prompt="x" * 5000)
        assert resp.status_code == 413
        assert "larger than 1000 bytes" in resp.json()["error"]["message"]
        assert stats(e)["requests"] == 0
        assert completion(r.url).status_code == 200


def test_scraped_queue_depth_steers_new_requests_away() -> None:
    """An engine whose vllm:num_requests_waiting is high (other routers' work) gets none."""
    with (
        running(start_fake_engine("A"), start_fake_engine("B")) as (a, b),
        # Prefix routing off: every request here is the same prompt, which B holds once it
        # took them all, so prefix-aware selection would rightly keep it on B.
        running(start_router("--engine", f"{a.url},{b.url}", "--prefix-routing", "off",
                             *FAST)) as (r,),
    ):
        httpx.post(a.url + "/debug/waiting", json={"waiting": 50})

        def b_gets_all() -> bool:
            before = stats(a)["requests"]
            for _ in range(6):
                completion(r.url, max_tokens=1)
            return stats(a)["requests"] == before

        wait_until(b_gets_all, 10, "requests to avoid the queued engine")
        httpx.post(a.url + "/debug/waiting", json={"waiting": 0})
        wait_until(lambda: [completion(r.url, max_tokens=1) for _ in range(4)] and
                   stats(a)["requests"] > 0, 10, "A to get requests again")


def test_dead_endpoint_is_ejected_and_readmitted_when_back() -> None:
    a = start_fake_engine("A")
    with running(start_fake_engine("B")) as (b,):
        port = a.port
        try:
            # Prefix routing off: every request here is the same prompt, which B holds once
            # A is down, so prefix-aware selection would rightly keep it on B.
            with running(start_router("--engine", f"{a.url},{b.url}", "--prefix-routing", "off",
                                      *FAST)) as (r,):
                a.kill()
                wait_until(lambda: httpx.get(r.url + "/ready").status_code == 200, 5, "ready")
                # All requests succeed on B while A is down (ejected: not even tried).
                for _ in range(6):
                    assert completion(r.url, max_tokens=1).status_code == 200
                assert r.output is not None
                url = a.url
                wait_until(lambda: f"ejected engine endpoint {url}" in r.output.text(), 5,
                           "A ejected")
                a = start_fake_engine("A", port=port)  # back on the same address
                # Re-admitted either by a passing health check or, once its back-off is over,
                # on probation by the request path: either way it serves again.
                wait_until(lambda: [completion(r.url, max_tokens=1) for _ in range(4)] and
                           stats(a)["requests"] > 0, 20, "A re-admitted")
        finally:
            a.stop()


def test_sigterm_drains_inflight_stream_then_exits() -> None:
    with running(start_fake_engine("E", 0.05)) as (e,):
        r = start_router("--engine", e.url, *FAST)
        with running(r):
            result: dict[str, object] = {}

            def stream() -> None:
                result["resp"] = completion(r.url, stream=True, max_tokens=40)

            t = threading.Thread(target=stream)
            t.start()
            wait_until(lambda: stats(e)["requests"] == 1, 5, "the stream to start")
            r.popen.send_signal(signal.SIGTERM)
            wait_until(lambda: httpx.get(r.url + "/health").status_code == 503, 5, "draining")
            refused = completion(r.url)
            assert refused.status_code == 503
            t.join(20)
            resp = result["resp"]
            assert isinstance(resp, httpx.Response)
            events = sse_events(resp.text)
            assert events[-1] == "[DONE]"
            assert len([ev for ev in events if isinstance(ev, dict)]) == 40
            assert r.popen.wait(20) == 0


def test_openai_async_client_concurrent_streams() -> None:
    with (
        running(start_fake_engine("P"), start_fake_engine("D", 0.001)) as (p, d),
        running(start_router("--prefill", p.url, "--decode", d.url, *FAST)) as (r,),
    ):

        async def main() -> list[str]:
            client = openai.AsyncOpenAI(base_url=r.url + "/v1", api_key="x")

            async def one() -> str:
                s = await client.chat.completions.create(
                    model="fake", messages=[{"role": "user", "content": "hi"}],
                    max_tokens=5, stream=True)
                return "".join([c.choices[0].delta.content or "" async for c in s])

            return await asyncio.gather(*(one() for _ in range(32)))

        assert asyncio.run(main()) == ["D0 D1 D2 D3 D4 "] * 32


def test_speed_reports_latencies_in_simulated_seconds() -> None:
    """In the sandbox engines run X times faster than real time; the router, started with
    --speed X, records its latencies times X so they share the engines' (simulated) clock."""
    speed = 1e6
    with (
        running(start_fake_engine("E")) as (e,),
        running(start_router("--engine", e.url, *FAST, "--speed", f"{speed:g}")) as (r,),
    ):
        started = time.monotonic()
        assert completion(r.url, max_tokens=2).status_code == 200
        wall = time.monotonic() - started
        page = httpx.get(r.url + "/metrics").text
        recorded = metric_value(page, "poolpilot_router_e2e_latency_seconds_sum")
        # Any HTTP round trip takes more than 10 microseconds of real time, and the router
        # cannot have seen more time than the client did.
        assert 1e-5 * speed <= recorded <= wall * speed


# A prefill deadline of 2 TTFT targets of 0.5 s (1 s) against an idle timeout of 60 s: a
# request held past the deadline would outlive the client's 30 s timeout.
DEADLINE = ("--ttft-target", "0.5", "--prefill-deadline-ttfts", "2", "--idle-timeout", "60",
            "--eject-after", "1", "--health-interval", "30", "--ramp-seconds", "0")


def test_a_hung_prefill_engine_is_left_on_the_deadline_for_the_other() -> None:
    engines = [start_fake_engine("P1"), start_fake_engine("P2"), start_fake_engine("D")]
    with (
        running(*engines) as (p1, p2, d),
        running(start_router("--prefill", f"{p1.url},{p2.url}", "--decode", d.url,
                             *DEADLINE)) as (r,),
    ):
        p1.popen.send_signal(signal.SIGSTOP)  # alive, accepting connections, not answering
        try:
            for stream in (False, True, False, True):
                resp = completion(r.url, stream=stream, max_tokens=3)
                assert resp.status_code == 200, resp.text
            assert r.output is not None
            assert r.output.shows(
                f"{p1.url}: prefill engine failed: no answer within the prefill deadline")
            assert stats(p2)["completed"] >= 4  # every request's prefill, none lost
            ready = httpx.get(r.url + "/ready")
            assert ready.status_code == 200  # P2 is left: the role is still served
        finally:
            p1.popen.send_signal(signal.SIGCONT)


def test_every_prefill_engine_hung_goes_local_then_503_with_retry_after_when_local_is_off() \
        -> None:
    with (
        running(start_fake_engine("P"), start_fake_engine("D")) as (p, d),
        running(start_router("--prefill", p.url, "--decode", d.url, "--local-prefill", "off",
                             *DEADLINE)) as (r,),
    ):
        p.popen.send_signal(signal.SIGSTOP)
        try:
            # The deadline fails the prefill step: the decode engine prefills it itself.
            first = completion(r.url, max_tokens=3)
            assert first.status_code == 200, first.text
            page = httpx.get(r.url + "/metrics").text
            assert metric_value(page, "poolpilot_router_local_prefill_total",
                                {"reason": "prefill_failed"}) == 1
            # Now ejected, and local prefill is off: no waiting on it, a retryable 503.
            assert httpx.get(r.url + "/ready").status_code == 503
            second = completion(r.url, max_tokens=3)
            assert second.status_code == 503, second.text
            assert second.headers["Retry-After"] == "30"
            assert "no prefill engine available" in second.json()["error"]["message"]
        finally:
            p.popen.send_signal(signal.SIGCONT)


def test_every_decode_engine_ejected_is_a_503_not_a_wait() -> None:
    with (
        running(start_fake_engine("P"), start_fake_engine("D")) as (p, d),
        running(start_router("--prefill", p.url, "--decode", d.url, *DEADLINE,
                             "--health-interval", "0.5")) as (r,),
    ):
        d.popen.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: httpx.get(r.url + "/ready", timeout=5).status_code == 503, 60,
                       "the health check to eject the hung decode engine")
            resp = completion(r.url, max_tokens=3)
            assert resp.status_code == 503 and "Retry-After" in resp.headers, resp.text
        finally:
            d.popen.send_signal(signal.SIGCONT)
