"""Router overhead against direct engine access, with engines paced like real ones.

    poolpilot perf router [--streams 1,64,256] [--modes aggregated,disaggregated]
        [--engine-speed 1] [--model llama-3.1-8b --gpu h200] [--duration 10] [--warmup 3]
        [--prompt-tokens 512] [--output-tokens 64] [--router-arg=--workers=2 ...]
        [--workers 1,2] [--router-cpus 1] [--json FILE]

Engines: `poolpilot engine-sim` at `--engine-speed 1` (an 8B model on an H200: a prefill takes
tens of milliseconds, a decode step 5-20 ms depending on the batch), so tokens arrive as they
would from vLLM; `--engine-speed inf` makes every step instantaneous (only HTTP and Python are
timed; `--upstream minimal` then swaps the simulator for a bare aiohttp server). For each mode
and each N, N closed-loop streaming clients run twice against the same engines: directly (an
aggregated engine; for disaggregated, the client itself does the P/D flow: the prefill request,
then the decode request with the prefill's kv_transfer_params) and through the router.

Per run: TTFT (request sent to the first streamed token), ITL (gaps between streamed chunks;
tokens that arrive together count as gaps of 0, as the router's own histogram does), latency of
the whole stream, completed requests and streamed tokens per second; and the router's CPU
seconds (its process group, from /proc) during the measured window. The JSON (`--json`) holds,
per mode and N, `added_ttft_p99_ms`, `added_itl_p99_ms` (routed - direct at p99),
`throughput_ratio` (routed / direct streamed tokens per second), `router_cpu_seconds`,
`added_outside_engine_ttft_p99_ms` (aggregated, engine-sim: per request the client's TTFT minus
the engine's own from `/sim/requests`, routed - direct at p99: the router's share of TTFT
whatever the engine's queue did; at saturation a closed loop's TTFT moves with how the engine's
queue settles, which the router's hop can tip either way), the p50s, the old latency/request
fields (`added_p50_ms`, `added_p99_ms`, `rps_ratio`, ...), and the machine's load average
before and after. Without `--router-cpus` everything shares the machine's cores, so the router
competes with the clients and engines it is measured against; with it, the router gets cores of
its own, as its pod would with a CPU request of its own on a node. Run it on a quiet machine if
you can, and compare ratios measured in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web
from poolpilot.engine_sim.hardware import GPUS

from poolpilot import cli
from poolpilot.roles import Role

# -- the zero-time upstream (--upstream minimal) ---------------------------------------------


async def _upstream_generate(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
        return web.json_response({"choices": [{"index": 0, "text": "x"}],
                                  "kv_transfer_params": {"remote_engine_id": "u"}})
    n = int(body.get("max_tokens") or 8)
    if not body.get("stream"):
        return web.json_response({"choices": [{"index": 0, "text": "x" * n}]})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
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


def _start(cmd: list[str], pattern: str, cpus: set[int] | None = None,
           ) -> tuple[subprocess.Popen[str], int]:
    """Start `cmd` in a session of its own (`cpus`: pinned to those CPUs, and so are the
    processes it forks) and wait for the line that names its port."""
    pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=pin)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        if not line and proc.poll() is not None:
            raise RuntimeError(f"{cmd[:3]} exited with {proc.returncode}:\n{''.join(seen)}")
        m = re.search(pattern, line)
        if m:
            # Keep draining its output so a full pipe never blocks it.
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, int(m.group(1))
    raise TimeoutError(f"{cmd[:3]} did not start:\n{''.join(seen)}")


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


_TICK = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in a process group (the router and
    any worker processes it forked), from /proc."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after "(comm)": state, ppid, pgrp, ...
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


# -- load ------------------------------------------------------------------------------------


@dataclass
class Result:
    """What the clients saw inside the measured window [start, stop): TTFTs of requests sent
    in it, gaps between chunks that arrived in it, tokens that arrived in it, whole
    latencies of requests sent and finished in it. Requests still streaming when the window
    closes are cut off, so long streams at saturation do not bias the sample towards the
    few that fit in the window."""

    start: float = 0.0
    stop: float = 1.0
    ttfts: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: int = 0
    router_cpu_s: float | None = None
    engine_cpu_s: float | None = None  # the engines' processes, same window
    client_cpu_s: float | None = None  # this process (the clients), same window
    first_ids: dict[str, float] = field(default_factory=dict)  # engine's request id -> TTFT
    # per request, the client's TTFT minus the engine's own (engine-sim's record of it): the
    # time spent outside the engine, i.e. in the HTTP hops (and the router, when routed)
    hops: list[float] = field(default_factory=list)
    engine_ttft_s: float | None = None  # the engines' own mean TTFT over the run (vLLM metric)
    # the upper bound of the engine's ITL histogram bucket that holds the 99th percentile of
    # the gaps it measured over the run (the engine that streams: aggregated or decode):
    # what of the clients' ITL the engine's own steps account for
    engine_itl_p99_le_s: float | None = None

    @property
    def elapsed(self) -> float:
        return self.stop - self.start

    def inside(self, t: float) -> bool:
        return self.start <= t < self.stop

    @staticmethod
    def _pct(values: list[float], q: float) -> float:
        return float(np.percentile(values, q)) if values else float("nan")

    def ttft(self, q: float) -> float:
        return self._pct(self.ttfts, q)

    def itl(self, q: float) -> float:
        return self._pct(self.gaps, q)

    def latency(self, q: float) -> float:
        return self._pct(self.latencies, q)

    def hop(self, q: float) -> float | None:
        return self._pct(self.hops, q) if self.hops else None

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed

    def summary(self) -> dict[str, float | int | None]:
        ms = 1000.0
        return {
            "ttft_p50_ms": self.ttft(50) * ms, "ttft_p99_ms": self.ttft(99) * ms,
            "itl_p50_ms": self.itl(50) * ms, "itl_p99_ms": self.itl(99) * ms,
            "latency_p50_ms": self.latency(50) * ms, "latency_p99_ms": self.latency(99) * ms,
            "requests": len(self.latencies), "ttft_samples": len(self.ttfts),
            "rps": self.rps, "tokens_per_s": self.tokens_per_s, "errors": self.errors,
            "router_cpu_seconds": self.router_cpu_s, "engine_cpu_seconds": self.engine_cpu_s,
            "client_cpu_seconds": self.client_cpu_s,
            "outside_engine_ttft_p50_ms": _times(self.hop(50), ms),
            "outside_engine_ttft_p99_ms": _times(self.hop(99), ms),
            "outside_engine_samples": len(self.hops),
            "engine_ttft_mean_ms": None if self.engine_ttft_s is None
            else self.engine_ttft_s * ms,
            "engine_itl_p99_le_ms": _times(self.engine_itl_p99_le_s, ms),
        }


@dataclass(frozen=True)
class Target:
    """Where a client sends its requests: a router or engine (`url`), or the P/D flow done
    by the client itself (`prefill` then `url` as the decode engine)."""

    url: str
    prefill: str | None = None


async def _read_stream(resp: aiohttp.ClientResponse, sent: float, out: Result) -> bool:
    """Time a streamed completion's chunks into `out`; False if it did not end with [DONE]."""
    first = True
    last = sent
    tail = b""
    async for chunk in resp.content.iter_any():
        now = time.monotonic()
        events = chunk.count(b"data: ") - chunk.count(b"data: [DONE]")
        tail = (tail + chunk)[-16:]
        if events <= 0:
            continue
        if out.inside(now):
            out.tokens += events
            if first:
                if out.inside(sent):
                    out.ttfts.append(now - sent)
                    m = _ID.search(chunk)
                    if m:
                        out.first_ids[m.group(1).decode()] = now - sent
            else:
                out.gaps.append(now - last)
            # Tokens that arrive together reach the client together: gaps of 0.
            out.gaps.extend([0.0] * (events - 1))
        first = False
        last = now
    done = tail.endswith(b"data: [DONE]\n\n") and not first
    if done and out.inside(sent) and out.inside(last):
        out.latencies.append(last - sent)
    return done


_ID = re.compile(rb'"id": ?"([^"]+)"')


def _times(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


async def _engine_ttfts(session: aiohttp.ClientSession, urls: list[str]) -> dict[str, float]:
    """Request id -> the engine's own TTFT (first token - arrival), from engine-sim's record of
    its finished requests (`/sim/requests`; other engines have none)."""
    out: dict[str, float] = {}
    for url in urls:
        try:
            async with session.get(url + "/sim/requests") as resp:
                if resp.status != 200:
                    continue
                records = (await resp.json()).get("requests", [])
        except (aiohttp.ClientError, ValueError):
            continue
        for r in records:
            if r.get("first_token_at") is not None and r.get("arrival") is not None:
                out[str(r["id"])] = float(r["first_token_at"]) - float(r["arrival"])
    return out


async def _one(session: aiohttp.ClientSession, target: Target, body: dict[str, Any],
               out: Result) -> bool:
    sent = time.monotonic()
    decode = body
    if target.prefill is not None:
        pre = body | {"max_tokens": 1, "stream": False,
                      "kv_transfer_params": {"do_remote_decode": True}}
        async with session.post(target.prefill + "/v1/completions", json=pre) as resp:
            if resp.status != 200:
                return False
            kv = (await resp.json()).get("kv_transfer_params")
        decode = body | {"kv_transfer_params": kv} if kv else body
    async with session.post(target.url + "/v1/completions", json=decode) as resp:
        if resp.status != 200:
            await resp.read()
            return False
        return await _read_stream(resp, sent, out)


async def _load(target: Target, streams: int, duration: float, warmup: float,
                prompt_tokens: int, output_tokens: int, router_pgid: int | None,
                engine_pgids: list[int], engine_urls: list[str],
                streamer: str | None = None) -> Result:
    start = time.monotonic() + warmup
    result = Result(start=start, stop=start + duration)
    run_id = next(_RUNS)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=duration + warmup + 120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker(w: int) -> None:
            i = 0
            while time.monotonic() < result.stop:
                i += 1
                # A distinct prompt per request, in this run and every other one against the
                # same engines: no prefix-cache hits between requests (engines cache prefixes).
                body = {"model": "bench",
                        "prompt": f"{run_id}-{w}-{i} " + "hello " * prompt_tokens,
                        "max_tokens": output_tokens, "stream": True, "ignore_eos": True}
                sent = time.monotonic()
                try:
                    ok = await _one(session, target, body, result)
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    ok = False
                if not ok and result.inside(sent):
                    result.errors += 1

        def engines_cpu() -> float:
            return sum(group_cpu_seconds(pgid) for pgid in engine_pgids)

        async def cpu_window() -> None:
            await asyncio.sleep(max(0.0, result.start - time.monotonic()))
            before = group_cpu_seconds(router_pgid) if router_pgid is not None else 0.0
            engines_before = engines_cpu()
            client_before = time.process_time()
            await asyncio.sleep(max(0.0, result.stop - time.monotonic()))
            result.client_cpu_s = time.process_time() - client_before
            result.engine_cpu_s = engines_cpu() - engines_before
            if router_pgid is not None:
                result.router_cpu_s = group_cpu_seconds(router_pgid) - before

        ttft_before = await _engine_ttft(session, engine_urls)
        itl_before = await _itl_buckets(session, streamer) if streamer else {}
        tasks = [asyncio.create_task(worker(w)) for w in range(streams)]
        await cpu_window()
        await asyncio.sleep(max(0.0, result.stop - time.monotonic()))
        for task in tasks:  # the window is over: cut off the streams still running
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        ttft_after = await _engine_ttft(session, engine_urls)
        if streamer:
            result.engine_itl_p99_le_s = bucket_quantile(
                itl_before, await _itl_buckets(session, streamer), 0.99)
        own = await _engine_ttfts(session, engine_urls)
        result.hops = [ttft - own[rid] for rid, ttft in result.first_ids.items() if rid in own]
        count = ttft_after[1] - ttft_before[1]
        result.engine_ttft_s = (ttft_after[0] - ttft_before[0]) / count if count > 0 else None
    return result


_RUNS = itertools.count()  # numbers each load run, so no two runs send the same prompt

TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
TTFT_COUNT = "vllm:time_to_first_token_seconds_count"


ITL_BUCKET = "vllm:inter_token_latency_seconds_bucket"


async def _itl_buckets(session: aiohttp.ClientSession, url: str) -> dict[float, float]:
    """The engine's ITL histogram: bucket upper bound (s) -> cumulative count; {} when it
    has none or does not answer."""
    try:
        async with session.get(url + "/metrics") as resp:
            text = await resp.text()
    except aiohttp.ClientError:
        return {}
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(ITL_BUCKET):
            m = re.search(r'le="([^"]+)"', line)
            if m:
                le = float(m.group(1))
                out[le] = out.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def bucket_quantile(before: dict[float, float], after: dict[float, float],
                    q: float) -> float | None:
    """The upper bound of the first bucket whose count, between two scrapes of a cumulative
    histogram, reaches the `q` quantile (inf: beyond the last bound); None without counts."""
    delta = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = delta[-1][1] if delta else 0.0
    if total <= 0:
        return None
    return next(le for le, count in delta if count >= q * total)


async def _engine_ttft(session: aiohttp.ClientSession, urls: list[str]) -> tuple[float, float]:
    """(sum, count) of the engines' own TTFT histograms: the engine that prefills decides
    TTFT, so a routed run whose engines report a different TTFT than the direct run's saw
    different queueing at the engines, not only the router's hop."""
    total = count = 0.0
    for url in urls:
        try:
            async with session.get(url + "/metrics") as resp:
                text = await resp.text()
        except aiohttp.ClientError:
            continue
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in (TTFT_SUM, TTFT_COUNT):
                value = float(line.rsplit(" ", 1)[1])
                if name == TTFT_SUM:
                    total += value
                else:
                    count += value
    return total, count


def compare(mode: str, streams: int, direct: Result, routed: Result) -> dict[str, Any]:
    """One JSON row: routed against direct, same mode and streams, same run."""
    d, r = direct.summary(), routed.summary()

    def added(key: str) -> float:
        return float(r[key] or 0.0) - float(d[key] or 0.0)

    return {
        "mode": mode, "streams": streams,
        "added_ttft_p99_ms": added("ttft_p99_ms"), "added_ttft_p50_ms": added("ttft_p50_ms"),
        "added_itl_p99_ms": added("itl_p99_ms"), "added_itl_p50_ms": added("itl_p50_ms"),
        "throughput_ratio": routed.tokens_per_s / direct.tokens_per_s
        if direct.tokens_per_s else float("nan"),
        "router_cpu_seconds": routed.router_cpu_s,
        # The router's own share of TTFT, whatever the engine's queue did: per request, the
        # client's TTFT minus the engine's own, routed against direct (aggregated: the engine
        # that streams records both; P/D: None, the prefill step is not split out).
        "added_outside_engine_ttft_p99_ms": None
        if d["outside_engine_ttft_p99_ms"] is None or r["outside_engine_ttft_p99_ms"] is None
        else added("outside_engine_ttft_p99_ms"),
        # The fields of the zero-time benchmark this replaces (whole-stream latency, req/s).
        "added_p50_ms": added("latency_p50_ms"), "added_p99_ms": added("latency_p99_ms"),
        "rps_ratio": routed.rps / direct.rps if direct.rps else float("nan"),
        "errors": direct.errors + routed.errors,
        "direct": d, "routed": r,
    }


HEADER = ("| mode | streams | workers | TTFT p99 direct / routed ms | added TTFT p99 ms | "
          "ITL p99 direct / routed ms | added ITL p99 ms | tokens/s direct / routed | ratio | "
          "router CPU s | engine's own TTFT mean direct / routed ms | errors | "
          "TTFT outside the engine p99 direct / routed ms |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def row(c: dict[str, Any]) -> str:
    d, r = c["direct"], c["routed"]
    cpu = c["router_cpu_seconds"]
    return (f"| {c['mode']} | {c['streams']} | {c.get('workers', 1)} "
            f"| {d['ttft_p99_ms']:.1f} / {r['ttft_p99_ms']:.1f} "
            f"| {c['added_ttft_p99_ms']:+.1f} | {d['itl_p99_ms']:.1f} / {r['itl_p99_ms']:.1f} "
            f"| {c['added_itl_p99_ms']:+.2f} | {d['tokens_per_s']:.0f} / "
            f"{r['tokens_per_s']:.0f} | {c['throughput_ratio']:.3f} | "
            f"{'-' if cpu is None else f'{cpu:.2f}'} | {_ms(d['engine_ttft_mean_ms'])} / "
            f"{_ms(r['engine_ttft_mean_ms'])} | {c['errors']} | "
            f"{_ms(d['outside_engine_ttft_p99_ms'], 1)} / "
            f"{_ms(r['outside_engine_ttft_p99_ms'], 1)} |")


def _ms(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _csv(text: str) -> list[str]:
    return [p for p in re.split(r"[,\s]+", text) if p]


def cpu_list(text: str) -> set[int]:
    """`1`, `2-5`, `0,3`: the CPU numbers of a list as taskset and cgroups write them."""
    cpus: set[int] = set()
    for part in _csv(text):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"{part!r} is not a CPU number or range (e.g. 1 or 2-5)")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def split_cpus(router: str | None, available: set[int]) -> tuple[set[int] | None, set[int] | None]:
    """(the router's CPUs, everyone else's) for --router-cpus; (None, None) without it."""
    mine = pinned_to(router, available, "--router-cpus")
    if mine is None:
        return None, None
    rest = available - mine
    if not rest:
        raise ValueError(f"--router-cpus {router}: leaves no CPU for the engines and clients")
    return mine, rest


def pinned_to(cpus: str | None, available: set[int], flag: str) -> set[int] | None:
    """The CPUs a flag names, all among `available`; None without the flag."""
    if cpus is None:
        return None
    mine = cpu_list(cpus)
    if not mine or not mine <= available:
        raise ValueError(f"{flag} {cpus}: must name CPUs among {sorted(available)}")
    return mine


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", "--concurrency", default="1,64,256",
                   help="comma-separated concurrent streaming clients, one run each "
                   "(default 1,64,256)")
    p.add_argument("--modes", default="aggregated,disaggregated",
                   help="comma-separated: aggregated, disaggregated (default both)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds measured per run")
    p.add_argument("--warmup", type=float, default=3.0,
                   help="seconds of load before each measured run (default 3)")
    p.add_argument("--engine-speed", type=float, default=1.0, metavar="X",
                   help="the engines' --speed (the router is not told: its latencies are wall "
                   "time): 1 paces engines like real ones (default), inf "
                   "makes every step instantaneous")
    p.add_argument("--model", default="llama-3.1-8b", help="engine-sim model (default 8B)")
    cli.add_gpu(p, GPUS)
    p.add_argument("--prompt-tokens", type=int, default=512, help="prompt length (default 512)")
    p.add_argument("--output-tokens", type=int, default=64,
                   help="tokens streamed per request (default 64)")
    p.add_argument("--router-arg", action="append", default=[], metavar="ARG",
                   help="extra router flag, repeatable, e.g. --router-arg=--idle-timeout=30")
    p.add_argument("--workers", default="1",
                   help="comma-separated router --workers values: one router per value and "
                   "mode, each measured against the same direct run (default 1)")
    p.add_argument("--upstream", choices=("engine-sim", "minimal"), default="engine-sim",
                   help="engine-sim, or a bare aiohttp server (instantaneous; implies no "
                   "pacing)")
    p.add_argument("--router-cpus", metavar="LIST",
                   help="pin the router (and its workers) to these CPUs, e.g. 1 or 2-5, and the "
                   "engines and clients to the others: the router on cores of its own, as on a "
                   "node where its pod has its own CPU request (default: no pinning)")
    p.add_argument("--prefill-cpus", metavar="LIST",
                   help="pin the P/D prefill engine to these CPUs (they may be the router's): "
                   "its request intake then shares no core with the clients and the decode "
                   "engine that streams to them, as on a cluster where each engine has a node "
                   "of its own (default: with the other engines)")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    p.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_upstream is not None:
        asyncio.run(_serve_upstream(args.serve_upstream))
        return 0
    levels = [int(c) for c in _csv(args.streams)]
    workers = [int(w) for w in _csv(args.workers)]
    modes = _csv(args.modes)
    if bad := set(modes) - {"aggregated", "disaggregated"}:
        p.error(f"--modes: unknown {sorted(bad)}; use aggregated, disaggregated")
    try:
        router_cpus, other_cpus = split_cpus(args.router_cpus, os.sched_getaffinity(0))
        prefill_cpus = pinned_to(args.prefill_cpus, os.sched_getaffinity(0), "--prefill-cpus")
    except ValueError as exc:
        p.error(str(exc))
    if other_cpus is not None:  # the clients run in this process, the engines are its children
        os.sched_setaffinity(0, other_cpus)
    poolpilot = str(Path(sys.executable).parent / "poolpilot")
    procs: list[subprocess.Popen[str]] = []

    engine_pgids: dict[str, int] = {}

    def upstream(role: str) -> str:
        if args.upstream == "minimal":
            cmd = [sys.executable, "-P", "-m", "poolpilot.perf.router", "--serve-upstream", "0"]
        else:
            cmd = [poolpilot, "engine-sim", "--role", role, "--speed", str(args.engine_speed),
                   "--model", args.model, "--gpu", args.gpu, "--served-name", "bench",
                   "--port", "0", "--log-level", "WARNING"]
        proc, port = _start(cmd, r"listening on (?:http://[\d.]+:)?(\d+)",
                            prefill_cpus if role == Role.PREFILL else None)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        engine_pgids[url] = proc.pid
        return url

    load_before = os.getloadavg()
    results: list[dict[str, Any]] = []
    try:
        engines = {"aggregated": {Role.ENGINE: upstream(Role.ENGINE)}} if "aggregated" in modes \
            else {}
        if "disaggregated" in modes:
            engines["disaggregated"] = {Role.PREFILL: upstream(Role.PREFILL),
                                        Role.DECODE: upstream(Role.DECODE)}
        routers: dict[tuple[str, int], tuple[str, int]] = {}
        for mode, urls in engines.items():
            extra = [arg for role, url in urls.items() for arg in (f"--{role}", url)]
            for w in workers:
                proc, port = _start([poolpilot, "router", "--host", "127.0.0.1", "--port", "0",
                                     "--log-level", "WARNING", "--local-prefill", "off",
                                     "--workers", str(w), *extra, *args.router_arg],
                                    r"listening on http://[\d.]+:(\d+)", router_cpus)
                procs.append(proc)
                routers[(mode, w)] = (f"http://127.0.0.1:{port}", proc.pid)
        pinned = ("" if router_cpus is None else f" (router on CPUs {sorted(router_cpus)}, "
                  f"engines and clients on {sorted(other_cpus or ())})")
        if prefill_cpus is not None:
            pinned += f" (the P/D prefill engine on CPUs {sorted(prefill_cpus)})"
        print(f"router overhead: {os.cpu_count()} cores{pinned}, load {load_before[0]:.1f}, "
              f"engine-sim {args.model}/{args.gpu} speed {args.engine_speed:g} ({args.upstream}), "
              f"{args.prompt_tokens}-token prompts, {args.output_tokens} tokens streamed, "
              f"{args.duration:g} s per run\n\n{HEADER}", flush=True)
        for c in levels:
            for mode in modes:
                urls = engines[mode]
                direct_target = (Target(urls[Role.ENGINE]) if mode == "aggregated"
                                 else Target(urls[Role.DECODE], prefill=urls[Role.PREFILL]))
                run = (args.duration, args.warmup, args.prompt_tokens, args.output_tokens)
                pgids = [engine_pgids[u] for u in urls.values()]
                # The engine that prefills: the aggregated one, or the prefill engine.
                first = [urls.get(Role.ENGINE) or urls[Role.PREFILL]]
                # The engine that streams the tokens: the aggregated one, or the decode engine.
                streamer = urls.get(Role.ENGINE) or urls[Role.DECODE]
                direct = asyncio.run(_load(direct_target, c, *run, None, pgids, first, streamer))
                for w in workers:
                    url, pgid = routers[(mode, w)]
                    routed = asyncio.run(_load(Target(url), c, *run, pgid, pgids, first,
                                               streamer))
                    results.append(compare(mode, c, direct, routed) | {
                        "workers": w, "router_cpus": sorted(os.sched_getaffinity(pgid))}
                        | ({"prefill_cpus": sorted(os.sched_getaffinity(
                            engine_pgids[urls[Role.PREFILL]]))} if Role.PREFILL in urls else {}))
                    print(row(results[-1]), flush=True)
    finally:
        for proc in procs:
            _stop(proc)
    load_after = os.getloadavg()
    print(f"\nload average before {load_before[0]:.1f}, after {load_after[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": {"cores": os.cpu_count(), "load_before": load_before,
                        "load_after": load_after},
            "config": {k: v for k, v in vars(args).items() if k != "serve_upstream"},
            "runs": results,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
