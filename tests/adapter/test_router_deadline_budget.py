"""A hung decode engine costs a request one deadline, not one per attempt (the router's
deadline budget, router/deadline_budget.py), against real router processes.

The router runs with 3 s deadlines (the floor; --ttft-target 0.5 makes the grace 0.5 s) and a
60 s idle timeout, and the client gives up after 30 s: a request left on a hung engine until
the idle timeout fails the client. Health checks are slow and ejection needs many failures,
so the hung engines stay in the rotation and every request meets them.
"""

from __future__ import annotations

import signal

import httpx
from router_support import (
    running,
    sse_events,
    start_engine_sim,
    start_fake_engine,
    start_router,
)

DEADLINES = ("--ttft-target", "0.5", "--prefill-deadline-ttfts", "2", "--itl-target", "0.05",
             "--decode-stall-itls", "20", "--idle-timeout", "60", "--eject-after", "100",
             "--health-interval", "30", "--ramp-seconds", "0")
CLIENT_TIMEOUT_S = 30.0


def stream(url: str, model: str, max_tokens: int = 4) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={
        "model": model, "prompt": "the deadline budget " * 40, "max_tokens": max_tokens,
        "stream": True, "ignore_eos": True}, timeout=CLIENT_TIMEOUT_S)


def test_a_stopped_decode_engine_costs_a_deadline_and_the_other_serves() -> None:
    """SIGSTOP: the stopped engine accepts the connection and answers nothing, not even a
    status line. Each request the router hands to it moves to the other decode engine after
    the first-token deadline; every client gets its whole answer."""
    with (
        running(start_engine_sim("prefill"), start_engine_sim("decode"),
                start_engine_sim("decode")) as (p, d1, d2),
        running(start_router("--prefill", p.url, "--decode", f"{d1.url},{d2.url}",
                             *DEADLINES)) as (r,),
    ):
        assert stream(r.url, "sim").status_code == 200  # warm
        d1.popen.send_signal(signal.SIGSTOP)
        try:
            for _ in range(4):
                resp = stream(r.url, "sim")
                assert resp.status_code == 200, resp.text
                events = sse_events(resp.text)
                assert events[-1] == "[DONE]" and not any(
                    isinstance(e, dict) and "error" in e for e in events), events
                tokens = [e for e in events if isinstance(e, dict) and e.get("choices")]
                assert len(tokens) == 4, events
        finally:
            d1.popen.send_signal(signal.SIGCONT)
        assert r.output is not None
        assert r.output.shows(f"{d1.url}: decode engine failed: no status line within the "
                              "first-token deadline")


def test_every_decode_engine_hung_is_one_deadline_then_a_504_not_a_deadline_per_attempt() \
        -> None:
    """One decode engine takes the request and then sends nothing (its status line, no
    token: vLLM queues the request, then never steps), the other is stopped. The handoff,
    its retry on the other engine and the local prefill that follows a failed handoff share
    one deadline and the TTFT target: the client hears a 504 that says so, long before its
    own timeout, instead of a fresh deadline (or the idle timeout) per attempt."""
    with (
        running(start_fake_engine("P"), start_fake_engine("D1", 0.0, 0, "--stall-after", "0"),
                start_fake_engine("D2")) as (p, d1, d2),
        running(start_router("--prefill", p.url, "--decode", f"{d1.url},{d2.url}",
                             *DEADLINES)) as (r,),
    ):
        d2.popen.send_signal(signal.SIGSTOP)
        try:
            resp = stream(r.url, "fake")
        finally:
            d2.popen.send_signal(signal.SIGCONT)
        assert resp.status_code == 504, resp.text
        message = resp.json()["error"]["message"]
        assert "within the request's deadline" in message, message
        assert r.output is not None
        assert r.output.shows("no decode engine answered within the request's deadline")
        assert "KV handoff failed" in r.output.text()  # the local retry came, gave up at once


def test_a_slow_sole_decode_engine_is_waited_for_not_ejected() -> None:
    """A decode engine at 30x its step time that runs one sequence at a time: a second
    request queues there behind the first for longer than the decode deadline while the first
    keeps streaming. The engine is slow, not hung: the router waits for it instead of ejecting
    the pool's only decode engine and answering 503 `no decode engine available`."""
    with (
        running(start_engine_sim("prefill"),
                start_engine_sim("decode", "--max-num-seqs", "1")) as (p, d),
        running(start_router("--prefill", p.url, "--decode", d.url, *DEADLINES)) as (r,),
    ):
        assert httpx.post(d.url + "/sim/fault", json={"slowdown": 30}).status_code == 200
        with httpx.stream("POST", r.url + "/v1/completions", timeout=CLIENT_TIMEOUT_S, json={
                "model": "sim", "prompt": "the first stream " * 40, "max_tokens": 60,
                "stream": True, "ignore_eos": True}) as first:
            lines = first.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))  # it streams
            second = stream(r.url, "sim")  # queued behind it, past the deadline
            rest = [line for line in lines if line.startswith("data: ")]
        assert second.status_code == 200, second.text
        events = sse_events(second.text)
        assert events[-1] == "[DONE]" and len([e for e in events if isinstance(e, dict)
                                               and e.get("choices")]) == 4, events
        assert rest[-1] == "data: [DONE]" and not any('"error"' in line for line in rest)
        assert httpx.get(r.url + "/ready").status_code == 200
        assert r.output is not None
        log = r.output.text()
        assert "ejected decode endpoint" not in log and "KV handoff failed" not in log, log
