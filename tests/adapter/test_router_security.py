"""The router process hardened: API keys with OpenAI-format 401s, requests the
decode engine would reject stopped before the prefill step, every router error in OpenAI's
shape, a per-client concurrency limit, and [DONE] counted as success whatever the client
does next.

Against fake engine processes; the prefill's KV hold and its release are tested on engine-sim
(test_router_kv_hold.py) and real vLLM (test_vllm_router.py)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import httpx
import pytest
from router_support import (
    FAST,
    metric_value,
    running,
    start_fake_engine,
    start_router,
    wait_until,
)

pytestmark = pytest.mark.adapter


def body(**extra: object) -> dict:
    return {"model": "fake", "prompt": "hello " * 50, "max_tokens": 3} | extra


def requests_at(url: str) -> list[dict]:
    return list(httpx.get(url + "/debug/requests", timeout=5).json())


def assert_openai_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] == status and "type" in error and "param" in error
    return dict(error)


def test_api_keys_from_a_flag_and_a_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("file-key\n")
    with (
        running(start_fake_engine("E")) as (e,),
        running(start_router("--engine", e.url, "--api-key", "flag-key", "--api-key-file",
                             str(keys), *FAST)) as (r,),
    ):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "flag-key"}):
            resp = httpx.post(r.url + "/v1/completions", json=body(), headers=headers)
            assert_openai_error(resp, 401)
            assert resp.headers["WWW-Authenticate"] == "Bearer"
        assert requests_at(e.url) == []  # nothing reached the engine
        for key in ("flag-key", "file-key"):
            ok = httpx.post(r.url + "/v1/completions", json=body(),
                            headers={"Authorization": f"Bearer {key}"})
            assert ok.status_code == 200
        # Probes and Prometheus need no key.
        assert httpx.get(r.url + "/health").status_code == 200
        page = httpx.get(r.url + "/metrics").text
        assert metric_value(page, "poolpilot_router_requests_total", {"code": "401"}) == 3


REJECTED_BY_DECODE = [({"max_tokens": -5}, "max_tokens"), ({"n": 3}, "n"),
                      ({"stream_options": {"include_usage": True}}, "stream_options")]


def test_requests_the_decode_engine_would_reject_never_reach_the_prefill_engine() -> None:
    with (
        running(start_fake_engine("P"), start_fake_engine("D")) as (p, d),
        running(start_router("--prefill", p.url, "--decode", d.url, *FAST)) as (r,),
    ):
        for extra, param in REJECTED_BY_DECODE:
            resp = httpx.post(r.url + "/v1/completions", json=body(**extra))
            assert assert_openai_error(resp, 400)["param"] == param
        assert requests_at(p.url) == [] and requests_at(d.url) == []


def test_every_router_error_is_in_openai_format() -> None:
    with (
        running(start_fake_engine("E")) as (e,),
        running(start_router("--engine", e.url, "--max-request-bytes", "200000", *FAST)) as (r,),
    ):
        assert "Invalid URL" in assert_openai_error(httpx.post(r.url + "/v1/nope", json={}),
                                                    404)["message"]
        resp = httpx.get(r.url + "/v1/completions")
        assert_openai_error(resp, 405)
        assert "POST" in resp.headers["Allow"]
        too_big = httpx.post(r.url + "/v1/completions", json=body(prompt="x" * 300_000))
        assert_openai_error(too_big, 413)
        deep = "[" * 50_000 + "]" * 50_000  # the audit's body: a plain-text 500 before
        resp = httpx.post(r.url + "/v1/completions", content=deep,
                          headers={"Content-Type": "application/json"})
        assert "nests too deeply" in assert_openai_error(resp, 400)["message"]
        assert_openai_error(httpx.post(r.url + "/v1/completions", content=b"{nope"), 400)
        # An engine's 5xx arrives as the router's 502 in the same shape.
        assert_openai_error(httpx.post(r.url + "/v1/completions", json=body(model="boom")), 502)


def test_per_client_concurrency_limit() -> None:
    with (
        running(start_fake_engine("E", 0.05)) as (e,),
        running(start_router("--engine", e.url, "--max-concurrent-per-client", "2",
                             *FAST)) as (r,),
        httpx.Client(timeout=30) as client,
    ):
        streams = [client.send(client.build_request("POST", r.url + "/v1/completions",
                                                    json=body(max_tokens=40, stream=True)),
                               stream=True) for _ in range(2)]
        lines = [s.iter_lines() for s in streams]  # (a dropped iterator closes its stream)
        try:
            for s, it in zip(streams, lines, strict=True):  # both in flight: first event in
                assert s.status_code == 200
                next(it)
            third = client.post(r.url + "/v1/completions", json=body())
            assert_openai_error(third, 429)
            assert third.headers["Retry-After"] == "1"
        finally:
            for s in streams:
                s.close()
        wait_until(lambda: client.post(r.url + "/v1/completions", json=body()).status_code
                   == 200, 10, "the client's slots freed")


def _stream_and_close_after_done(host: str, port: int) -> bool:
    """A raw HTTP/1.1 client that closes its socket the moment it has read [DONE] (as
    guidellm does). Returns whether [DONE] arrived."""
    payload = httpx.Request("POST", f"http://{host}:{port}/v1/completions",
                            json=body(max_tokens=5, stream=True)).read()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n")
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(head.encode() + payload)
        seen = b""
        while b"data: [DONE]" not in seen:
            chunk = sock.recv(65536)
            if not chunk:
                return False
            seen += chunk
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    return True  # closed with a reset, before reading anything after [DONE]


def test_a_stream_that_delivered_done_is_a_success_when_the_client_closes_at_once() -> None:
    with (
        running(start_fake_engine("P"), start_fake_engine("D")) as (p, d),
        running(start_router("--prefill", p.url, "--decode", d.url, *FAST)) as (r,),
    ):
        results: list[bool] = []

        def one() -> None:
            results.append(_stream_and_close_after_done("127.0.0.1", r.port))

        threads = [threading.Thread(target=one) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [True] * 20
        wait_until(lambda: metric_value(httpx.get(r.url + "/metrics").text,
                                        "poolpilot_router_requests_total") == 20, 10,
                   "every request recorded")
        page = httpx.get(r.url + "/metrics").text
        assert metric_value(page, "poolpilot_router_requests_total", {"code": "200"}) == 20


def raw_status(url: str, path: str, authorization: bytes) -> int:
    """The status for a request whose Authorization header carries raw bytes (httpx would
    refuse to send non-ASCII)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nAuthorization: "
                  + authorization + b"\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        head = s.recv(4096)
    return int(head.split(b" ", 2)[1])


def test_every_v1_route_needs_the_key_and_a_malformed_header_is_a_counted_401() -> None:
    with (
        running(start_fake_engine("E")) as (e,),
        running(start_router("--engine", e.url, "--api-key", "k1", *FAST)) as (r,),
    ):
        assert_openai_error(httpx.get(r.url + "/v1/models"), 401)
        ok = httpx.get(r.url + "/v1/models", headers={"Authorization": "Bearer k1"})
        assert ok.status_code == 200
        for header in (b"Bearer \xff\xfe\x80", b"\xc3\x28", b"k1", b"Bearer"):
            assert raw_status(r.url, "/v1/completions", header) == 401
        page = httpx.get(r.url + "/metrics").text
        assert metric_value(page, "poolpilot_router_requests_total", {"code": "401"}) == 5


def test_a_router_without_keys_warns_at_start() -> None:
    with (
        running(start_fake_engine("E")) as (e,),
        running(start_router("--engine", e.url, *FAST)) as (r,),
    ):
        assert httpx.get(r.url + "/health").status_code == 200
        assert r.output is not None
        wait_until(lambda: "WARNING: no API key" in r.output.text(), 10, "the warning")
