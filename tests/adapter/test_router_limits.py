"""The router's limits over real HTTP against fake engine processes: requests that cannot fit
the engines' context refused before any engine work, hung decodes, the HTTP server's own
timeouts and connection cap."""

from __future__ import annotations

import socket
import subprocess

import httpx
import pytest
from router_support import (
    FAST,
    POOLPILOT,
    Proc,
    metric_value,
    running,
    sse_events,
    start_fake_engine,
    start_router,
    wait_until,
)

pytestmark = pytest.mark.adapter


def received(engine: Proc) -> int:
    return len(httpx.get(engine.url + "/debug/requests", timeout=5).json())


@pytest.mark.parametrize("mode", ["disaggregated", "aggregated"])
def test_prompt_plus_max_tokens_over_max_model_len_is_a_400_before_any_engine_work(
        mode: str) -> None:
    engines = [start_fake_engine(n, 0.0, 0, "--max-model-len", "1000") for n in ("P", "D")]
    with running(*engines) as (p, d):
        flags = (["--prefill", p.url, "--decode", d.url] if mode == "disaggregated"
                 else ["--engine", d.url])
        with running(start_router(*flags, *FAST)) as (r,):
            too_long = {"model": "fake", "prompt": [1] * 600, "max_tokens": 500}

            def refused() -> bool:
                return httpx.post(r.url + "/v1/completions", json=too_long,
                                  timeout=10).status_code == 400

            # The limit is learned from the engines' /v1/models on a health check.
            wait_until(refused, 30, "the router to learn max_model_len")
            before = received(p) + received(d)
            resp = httpx.post(r.url + "/v1/completions", json=too_long, timeout=10)
            assert resp.status_code == 400
            error = resp.json()["error"]
            assert "1000" in error["message"] and "1100" in error["message"]
            assert error["param"] == "max_tokens"
            assert received(p) + received(d) == before  # no prefill, no decode
            fits = httpx.post(r.url + "/v1/completions", timeout=10,
                              json=too_long | {"max_tokens": 400})
            assert fits.status_code == 200, fits.text


STALL = ("--itl-target", "0.05", "--decode-stall-itls", "10", "--ttft-target", "0.5",
         "--prefill-deadline-ttfts", "2", "--idle-timeout", "60", "--eject-after", "1",
         "--health-interval", "30", "--ramp-seconds", "0")


def stream(url: str, max_tokens: int) -> httpx.Response:
    body = {"model": "fake", "prompt": "hello " * 50, "max_tokens": max_tokens, "stream": True}
    return httpx.post(url + "/v1/completions", json=body, timeout=30)


def test_a_stream_that_stops_sending_tokens_ends_with_an_error_event_and_the_engine_is_ejected(
) -> None:
    with (
        running(start_fake_engine("P"), start_fake_engine("D", 0.0, 0, "--stall-after", "2"))
        as (p, d),
        running(start_router("--prefill", p.url, "--decode", d.url, *STALL)) as (r,),
    ):
        resp = stream(r.url, 5)  # would wait for --idle-timeout (60 s) without the deadline
        assert resp.status_code == 200
        events = sse_events(resp.text)
        texts = [e["choices"][0]["text"] for e in events if isinstance(e, dict) and "choices" in e]
        assert texts == ["D0 ", "D1 "]
        [error] = [e["error"] for e in events if isinstance(e, dict) and "error" in e]
        assert "no token within the decode deadline" in error["message"]
        assert events[-1] == "[DONE]"
        # One stall and --eject-after 1: the only decode engine is out, the pool not ready.
        assert httpx.get(r.url + "/ready", timeout=5).status_code == 503


def test_a_decode_engine_that_never_sends_its_first_token_is_left_for_another() -> None:
    engines = [start_fake_engine("P"), start_fake_engine("H", 0.0, 0, "--stall-after", "0"),
               start_fake_engine("D")]
    with (
        running(*engines) as (p, h, d),
        running(start_router("--prefill", p.url, "--decode", f"{h.url},{d.url}", *STALL))
        as (r,),
    ):
        for _ in range(3):  # decode picks take turns: one of them goes to H first
            resp = stream(r.url, 3)
            assert resp.status_code == 200, resp.text
            texts = [e["choices"][0]["text"] for e in sse_events(resp.text)
                     if isinstance(e, dict) and "choices" in e]
            assert texts == ["D0 ", "D1 ", "D2 "]
        assert r.output is not None
        assert r.output.shows("no token within the decode deadline")
        page = httpx.get(r.url + "/metrics", timeout=5).text
        assert metric_value(page, "poolpilot_router_local_prefill_total",
                            {"reason": "kv_transfer_failed"}) == 1
        assert received(h) == 1  # never the same engine twice


def held_open(port: int, sent: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    if sent:
        sock.sendall(sent)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server closed it (recv sees EOF or a reset); waits up to the socket's
    timeout, which is far past the limits under test."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_connection_slow_to_send_its_headers_is_closed_on_the_header_timeout() -> None:
    with (
        running(start_fake_engine("E")) as (e,),
        running(start_router("--engine", e.url, "--header-timeout", "0.5",
                             "--keepalive-timeout", "300", *FAST)) as (r,),
    ):
        slow = held_open(r.port, b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
        silent = held_open(r.port, b"")
        assert closed_by_server(slow) and closed_by_server(silent)
        # A request whose headers came in time is answered as ever.
        assert httpx.get(r.url + "/health", timeout=10).status_code == 200


def test_connections_over_the_cap_are_closed_and_room_comes_back_when_one_closes() -> None:
    with (
        running(start_fake_engine("E")) as (e,),
        running(start_router("--engine", e.url, "--max-connections", "3",
                             "--header-timeout", "300", *FAST)) as (r,),
    ):
        held = [held_open(r.port, b"") for _ in range(3)]
        extra = held_open(r.port, b"")
        assert closed_by_server(extra)
        with pytest.raises(httpx.TransportError):
            httpx.get(r.url + "/health", timeout=10)
        held.pop().close()
        wait_until(lambda: _health(r.url), 30, "a slot to free up")
        for sock in held:
            sock.close()


def _health(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=10).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.parametrize(("flag", "value"), [
    ("--header-timeout", "0"), ("--header-timeout", "-1"), ("--max-connections", "0"),
], ids=["zero-header-timeout", "negative-header-timeout", "zero-connections"])
def test_bad_server_limits_are_refused_naming_the_flag(flag: str, value: str) -> None:
    done = subprocess.run([POOLPILOT, "router", "--engine", "http://127.0.0.1:1", flag, value],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith(f"poolpilot router: error: {flag} "), done.stderr
