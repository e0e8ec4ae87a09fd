"""Router overhead against direct engine access.

    poolpilot perf router [--duration 5] [--concurrency 1,64,256]

Starts zero-time upstreams: `poolpilot engine-sim --speed inf` (vLLM's API and P/D protocol,
every step instantaneous; `--upstream minimal` uses a bare aiohttp server in this file
instead), the router in front of them (aggregated: router -> engine; disaggregated:
router -> prefill engine, then router -> decode engine, which pulls the KV from the prefill
engine as with NIXL), and a closed-loop load generator with C concurrent streams. For each C it
reports the p50/p99 latency of a whole streamed completion (8 tokens) directly against an
aggregated engine and through the router, the difference, and completed requests per second.
All processes share the machine's cores, so the numbers are upper bounds on overhead; the
ratios against the direct run in the same session are what carry over.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np
from aiohttp import web

TOKENS = 8


# -- the zero-time upstream ------------------------------------------------------------------


async def _upstream_generate(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
        return web.json_response({"choices": [{"index": 0, "text": "x"}],
                                  "kv_transfer_params": {"remote_engine_id": "u"}})
    if not body.get("stream"):
        return web.json_response({"choices": [{"index": 0, "text": "x" * TOKENS}]})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    n = int(body.get("max_tokens") or TOKENS)
    for i in range(n):
        chunk = {"id": "b", "object": "text_completion", "model": "bench",
                 "choices": [{"index": 0, "text": "x", "finish_reason": None if i < n - 1
                              else "length"}]}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _upstream_health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def _upstream_metrics(request: web.Request) -> web.Response:
    return web.Response(text="vllm:num_requests_waiting 0\n")


async def _serve_upstream(port: int) -> None:
    app = web.Application()
    app.router.add_post("/v1/completions", _upstream_generate)
    app.router.add_get("/health", _upstream_health)
    app.router.add_get("/metrics", _upstream_metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"listening on {runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


# -- processes -------------------------------------------------------------------------------


def _start(cmd: list[str], pattern: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError(f"{cmd[:3]} exited with {proc.returncode}")
        m = re.search(pattern, line)
        if m:
            # Keep draining its output so a full pipe never blocks it.
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, int(m.group(1))
    raise TimeoutError(f"{cmd[:3]} did not start")


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


# -- load ------------------------------------------------------------------------------------


@dataclass
class Result:
    latencies: list[float]
    elapsed: float
    errors: int

    def pct(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if self.latencies else float("nan")

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed


async def _load(url: str, concurrency: int, duration: float, warmup: float) -> Result:
    body = {"model": "bench", "prompt": "hello " * 64, "max_tokens": TOKENS, "stream": True,
            "ignore_eos": True}
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.monotonic()
        measure_from = start + warmup
        stop_at = measure_from + duration

        async def worker() -> None:
            nonlocal errors
            while (now := time.monotonic()) < stop_at:
                try:
                    async with session.post(url + "/v1/completions", json=body) as resp:
                        data = await resp.read()
                        ok = resp.status == 200 and data.endswith(b"data: [DONE]\n\n")
                except aiohttp.ClientError:
                    ok = False
                end = time.monotonic()
                if now >= measure_from and end <= stop_at:
                    if ok:
                        latencies.append(end - now)
                    else:
                        errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Result(latencies, duration, errors)


def _row(mode: str, c: int, direct: Result, routed: Result) -> str:
    ms = 1000.0
    return (
        f"| {mode} | {c} | {direct.pct(50) * ms:.2f} | {routed.pct(50) * ms:.2f} | "
        f"{(routed.pct(50) - direct.pct(50)) * ms:+.2f} | {direct.pct(99) * ms:.2f} | "
        f"{routed.pct(99) * ms:.2f} | {(routed.pct(99) - direct.pct(99)) * ms:+.2f} | "
        f"{direct.rps:.0f} | {routed.rps:.0f} | {routed.rps / direct.rps:.2f} | "
        f"{direct.errors + routed.errors} |"
    )


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured per run")
    p.add_argument("--warmup", type=float, default=1.0,
                   help="seconds of load before each measured run (default 1)")
    p.add_argument("--concurrency", default="1,64,256",
                   help="comma-separated requests in flight, one run each (default 1,64,256)")
    p.add_argument("--upstream", choices=("engine-sim", "minimal"), default="engine-sim",
                   help="zero-time upstream: the engine simulator or a bare aiohttp server")
    p.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_upstream is not None:
        asyncio.run(_serve_upstream(args.serve_upstream))
        return 0
    levels = [int(c) for c in args.concurrency.split(",")]
    poolpilot = str(Path(sys.executable).parent / "poolpilot")
    procs: list[subprocess.Popen[str]] = []

    def upstream(role: str) -> str:
        if args.upstream == "minimal":
            cmd = [sys.executable, "-P", "-m", "poolpilot.perf.router", "--serve-upstream", "0"]
        else:
            cmd = [poolpilot, "engine-sim", "--role", role, "--speed", "inf",
                   "--served-name", "bench", "--port", "0"]
        proc, port = _start(cmd, r"listening on (?:http://[\d.]+:)?(\d+)")
        procs.append(proc)
        return f"http://127.0.0.1:{port}"

    try:
        engine = upstream("aggregated")
        prefill, decode = upstream("prefill"), upstream("decode")
        routers = {}
        for mode, extra in (("aggregated", ["--engine", engine]),
                            ("disaggregated", ["--prefill", prefill, "--decode", decode])):
            proc, port = _start([poolpilot, "router", "--host", "127.0.0.1", "--port", "0",
                                 "--log-level", "WARNING", *extra],
                                r"listening on http://[\d.]+:(\d+)")
            procs.append(proc)
            routers[mode] = f"http://127.0.0.1:{port}"
        print(f"router overhead, {os.cpu_count()} cores, {args.duration:.0f} s per run, "
              f"streamed completions of {TOKENS} tokens, upstream: {args.upstream}\n")
        print("| mode | streams | direct p50 ms | routed p50 ms | added p50 ms | direct p99 ms "
              "| routed p99 ms | added p99 ms | direct req/s | routed req/s | ratio | errors |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for c in levels:
            direct = asyncio.run(_load(engine, c, args.duration, args.warmup))
            for mode, url in routers.items():
                routed = asyncio.run(_load(url, c, args.duration, args.warmup))
                print(_row(mode, c, direct, routed), flush=True)
    finally:
        for proc in procs:
            _stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
