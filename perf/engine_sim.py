"""`poolpilot perf engine-sim`: the engine simulator's speed and fidelity numbers for
docs/benchmarks.md, each against a baseline measured in the same run.

1. DES speed: an hour of a trace (overlaid `copies` times) through PoolSim; simulated seconds
   per wall (and CPU) second. Baseline: the same DES pricing one step at a time
   (max_chunk_steps=1) on the first 10 minutes, whose records must be identical.
2. HTTP server throughput: requests per second that `engine-sim --speed inf` answers, against a
   bare aiohttp server returning a canned completion (the HTTP stack's own ceiling).
3. Time scaling: the same Poisson request sequence through the server at --speed 1 and
   --speed 20 and through the DES: TTFT and ITL should agree (simulated seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import numpy as np
from poolpilot.engine_sim.des import PoolSim, SimRequest
from poolpilot.engine_sim.engine import EngineConfig
from poolpilot.testkit.engine_sim import EngineSimProcess

from poolpilot.roles import Mode, Role

NAME = "bench"


def overlay(trace: list[Any], copies: int) -> list[SimRequest]:
    return sorted(
        (SimRequest(i * len(trace) + j, r.arrival_s + i / copies, r.input_tokens,
                    r.output_tokens)
         for i in range(copies) for j, r in enumerate(trace)),
        key=lambda r: r.arrival,
    )


def des_run(reqs: list[SimRequest], chunk: int, **pool: Any) -> dict[str, Any]:
    sim = PoolSim(config=EngineConfig(max_chunk_steps=chunk), **pool)
    w0, c0 = time.perf_counter(), time.process_time()
    sim.submit_many(reqs)
    t = 0.0
    while t < reqs[-1].arrival:
        t += 15.0  # a scrape every 15 s, as the benchmark's Prometheus emulation would
        sim.run_until(t)
        sim.metrics()
    sim.run()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    recs = sorted(sim.records(), key=lambda r: r.id)
    ttft = np.array([r.ttft for r in recs if r.ttft is not None])
    return {"requests": len(reqs), "simulated_s": sim.now, "wall_s": wall, "cpu_s": cpu,
            "sim_per_wall": sim.now / wall, "sim_per_cpu": sim.now / cpu,
            "events": sim.events_processed, "ttft_p50": float(np.percentile(ttft, 50)),
            "ttft_p90": float(np.percentile(ttft, 90)),
            "itl_p90_median": float(np.median([r.itl_p90 for r in recs if r.itl_p90])),
            "_records": recs}


def bench_des(trace_path: str, copies: int, pool: dict[str, Any]) -> dict[str, Any]:
    from poolpilot.engine_sim.traces import load_trace

    trace = load_trace(trace_path)
    reqs = overlay(trace, copies)
    full = des_run(reqs, 4096, **pool)
    window = [r for r in reqs if r.arrival < 600]
    fast = des_run(window, 4096, **pool)
    slow = des_run(window, 1, **pool)
    same = all(abs(a.finished_at - b.finished_at) < 1e-6 and a.id == b.id
               for a, b in zip(fast["_records"], slow["_records"], strict=True))
    for d in (full, fast, slow):
        d.pop("_records")
    return {"hour": full, "window_batched": fast, "window_step_by_step": slow,
            "identical_records": same,
            "speedup_vs_step_by_step": slow["cpu_s"] / fast["cpu_s"]}


async def _load(url: str, body: dict[str, Any], seconds: float, concurrency: int,
                stream: bool) -> float:
    import aiohttp

    done = 0
    stop = time.perf_counter() + seconds
    payload = {**body, "stream": stream}
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:
        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                async with session.post(url, json=payload) as r:
                    r.raise_for_status()
                    await r.read()  # the whole body (every SSE chunk when streaming)
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - t0)


def _baseline_server(port: int) -> None:
    """A bare aiohttp app answering every completion with the same canned JSON."""
    from aiohttp import web

    canned = {"id": "cmpl-0", "object": "text_completion", "model": NAME,
              "choices": [{"index": 0, "text": " the" * 16, "finish_reason": "length"}],
              "usage": {"prompt_tokens": 128, "completion_tokens": 16, "total_tokens": 144}}

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for _ in range(16):
                await resp.write(b"data: " + json.dumps(canned).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            return resp
        return web.json_response(canned)

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def bench_http(seconds: float, concurrency: int) -> dict[str, Any]:
    import subprocess

    import httpx
    from poolpilot.testkit.prometheus import free_port

    body = {"model": NAME, "prompt": list(range(128)), "max_tokens": 16, "ignore_eos": True}
    port = free_port()
    base = subprocess.Popen([sys.executable, "-m", "poolpilot.perf.engine_sim",
                             "--baseline-server", str(port)])
    out: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("baseline server did not start")
            time.sleep(0.1)
        with EngineSimProcess(role=Role.DECODE, speed=float("inf"), served_name=NAME) as sim:
            for stream in (False, True):
                kind = "stream" if stream else "json"
                b = asyncio.run(_load(f"http://127.0.0.1:{port}/v1/completions", body,
                                      seconds, concurrency, stream))
                s = asyncio.run(_load(sim.url + "/v1/completions", body, seconds,
                                      concurrency, stream))
                out[kind] = {"baseline_rps": b, "engine_sim_rps": s, "ratio": s / b}
    finally:
        base.terminate()
        base.wait(10)
    return out


async def _replay(url: str, reqs: list[SimRequest], speed: float) -> None:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        t0 = time.perf_counter()

        async def one(r: SimRequest) -> None:
            await asyncio.sleep(max(0.0, r.arrival / speed - (time.perf_counter() - t0)))
            body = {"model": NAME, "prompt": list(range(r.prompt_tokens)),
                    "max_tokens": r.output_tokens, "ignore_eos": True}
            async with session.post(url, json=body) as resp:
                await resp.read()

        await asyncio.gather(*(one(r) for r in reqs))


def bench_time_scaling(n: int = 40, rate: float = 4.0) -> dict[str, Any]:
    import httpx

    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    reqs = [SimRequest(i, float(a), int(rng.integers(500, 4000)), int(rng.integers(20, 200)))
            for i, a in enumerate(arrivals)]
    out: dict[str, Any] = {}
    for speed in (1.0, 5.0, 20.0):
        with EngineSimProcess(role=Role.ENGINE, speed=speed, served_name=NAME) as sim:
            asyncio.run(_replay(sim.url + "/v1/completions", reqs, speed))
            recs = httpx.get(sim.url + "/sim/requests").json()["requests"]
        ttft = [r["first_token_at"] - r["arrival"] for r in recs]
        # how faithfully the load generator kept the arrival times (simulated seconds)
        stamps = np.sort([r["arrival"] for r in recs])
        lag = (stamps - stamps[0]) - (arrivals - arrivals[0])
        tpot = [(r["finished_at"] - r["first_token_at"]) / max(1, r["output_tokens"] - 1)
                for r in recs]
        out[f"server_speed_{speed:g}"] = {"ttft_p50": float(np.percentile(ttft, 50)),
                                          "ttft_p90": float(np.percentile(ttft, 90)),
                                          "tpot_mean": float(np.mean(tpot)),
                                          "arrival_lag_p90": float(np.percentile(np.abs(lag),
                                                                                 90))}
    sim2 = PoolSim(mode=Mode.AGGREGATED)
    sim2.submit_many(reqs)
    sim2.run()
    recs2 = [r for r in sim2.records() if r.finished_at is not None
             and r.first_token_at is not None]
    ttft2 = [r.first_token_at - r.arrival for r in recs2 if r.first_token_at is not None]
    out["des"] = {
        "ttft_p50": float(np.percentile(ttft2, 50)),
        "ttft_p90": float(np.percentile(ttft2, 90)),
        "tpot_mean": float(np.mean([(r.finished_at - r.first_token_at)
                                    / max(1, r.output_tokens - 1) for r in recs2
                                    if r.finished_at is not None
                                    and r.first_token_at is not None])),
    }
    return out


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline-server", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--trace", default="../shared/traces/AzureLLMInferenceTrace_conv.csv",
                    help="trace for the DES speed run (default: the Azure conversation trace)")
    ap.add_argument("--copies", type=int, default=3,
                    help="copies of the trace overlaid in the DES run (default 3)")
    ap.add_argument("--seconds", type=float, default=5.0, help="HTTP load duration")
    ap.add_argument("--concurrency", type=int, default=16,
                    help="requests in flight in the HTTP run (default 16)")
    ap.add_argument("--only", choices=["des", "http", "time"], default=None,
                    help="run one part: DES speed, HTTP throughput or time scaling (default all)")
    args = ap.parse_args(argv)
    if args.baseline_server is not None:
        _baseline_server(args.baseline_server)
        return 0
    pool = {"model": "llama-3.1-70b", "gpu": "h100", "tensor_parallel": 4,
            "mode": "disaggregated", "prefill_replicas": 2, "decode_replicas": 2}
    res: dict[str, Any] = {}
    if args.only in (None, "des"):
        res["des"] = {"pool": pool, "copies": args.copies,
                      **bench_des(args.trace, args.copies, pool)}
    if args.only in (None, "http"):
        res["http"] = bench_http(args.seconds, args.concurrency)
    if args.only in (None, "time"):
        res["time_scaling"] = bench_time_scaling()
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
