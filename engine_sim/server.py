"""`poolpilot engine-sim`: an HTTP server that looks like vLLM's OpenAI server.

    poolpilot engine-sim --model llama-3.1-8b --gpu h200 --role prefill --port 8000 \\
        [--host 127.0.0.1] [--speed X] [--served-name NAME] [--max-model-len N]

Endpoints: /v1/completions, /v1/chat/completions (streaming SSE in vLLM's chunk format),
/v1/models, /health, /version, /metrics (vLLM's names, types, labels and buckets).

Timing: one engine (engine.py) runs continuous-batching steps priced by the roofline model;
`--speed X` runs X times faster than real time while every latency it reports (metrics,
nothing else carries time) is in simulated seconds. `--speed inf` makes steps instantaneous
(a zero-latency upstream, e.g. for measuring a router's own overhead).

Prefill/decode disaggregation, as with vLLM's NixlConnector:
* a request with `kv_transfer_params: {"do_remote_decode": true}` (and max_tokens 1) is
  prefilled; its response carries `kv_transfer_params: {"do_remote_prefill": true,
  "do_remote_decode": false, "remote_block_ids": [...], "remote_engine_id": ...,
  "remote_request_id": ..., "remote_host": ..., "remote_port": ..., "tp_size": ...}` and the
  engine keeps the prompt's KV blocks until a decode engine reads them or its lease ends
  (`--kv-lease-seconds`, 30 by default: vLLM 0.32's kv_lease_duration; counted in
  vllm:nixl_num_kv_expired_reqs);
* a request carrying those params allocates blocks, "reads" the KV from remote_host:remote_port
  (here: POST /sim/kv/pull on the prefill simulator, which frees its blocks), waits the
  transfer time (bytes / link bandwidth), skips the prompt's compute and decodes. If the read
  fails (unknown request, prefill gone), it counts vllm:nixl_num_failed_transfers and
  recomputes the prompt locally, like vLLM's recompute policy.
* a request carrying those params that is rejected (400/404) tells the prefill engine to free
  the blocks it holds for it, as vLLM 0.32's serving layer does for a rejected handoff;
* a plain request (no kv_transfer_params) is served whole by any role, like a `kv_both`
  vLLM: on a decode engine that is the router's local-prefill fallback; with `--itl-budget`
  its prompt is prefilled in chunks that keep the running batch's steps within the budget.

Fault injection, outside vLLM's API: `POST /sim/fault {"slowdown": 10}` makes every step take
10 times its priced time (a throttled or sick GPU; the sandbox's "slow engine" chaos) from the
next step on, `{"slowdown": 1}` ends it; `GET /sim/fault` says the current factor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from poolpilot import cli
from poolpilot import metrics as m
from poolpilot.roles import Role

from . import protocol as p
from .engine import ChunkResult, EngineConfig, EngineCore, canonical_role
from .hardware import GPUS, StepModel, UnknownHardware, make_step_model
from .prefix_cache import chain_hashes
from .scheduler import Seq
from .stats import GAUGES, HELP

# How long a prefill engine holds a prompt's KV for a decode engine (simulated seconds):
# vLLM 0.32's NixlConnector `kv_lease_duration` default; `--kv-lease-seconds` sets it.
KV_LEASE_DEFAULT = 30.0


class EngineClock:
    """Simulated seconds: wall time x speed; with infinite speed, a virtual clock that only
    moves when the engine runs (what poolpilot.clock.Clock, the control plane's, cannot be)."""

    def __init__(self, speed: float) -> None:
        if not speed > 0:
            raise ValueError(f"--speed must be > 0 (or inf), got {speed}")
        self.speed = speed
        self.instant = math.isinf(speed)
        self.wall0 = time.monotonic()
        self.virtual = 0.0

    def now(self) -> float:
        if self.instant:
            return self.virtual
        return (time.monotonic() - self.wall0) * self.speed

    def wall_delay(self, sim_t: float) -> float:
        if self.instant:
            return 0.0
        return max(0.0, (sim_t - self.now()) / self.speed)

    async def sleep_until(self, sim_t: float) -> None:
        if self.instant:
            self.virtual = max(self.virtual, sim_t)
            await asyncio.sleep(0)
            return
        # a lagging engine still yields, so HTTP handlers are not starved
        await asyncio.sleep(self.wall_delay(sim_t))


@dataclass
class Stream:
    """Per-request state the engine loop fills and the HTTP handler drains."""

    key: str
    queue: asyncio.Queue[int] = field(default_factory=asyncio.Queue)  # new token counts
    emitted: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)


class SimEngine:
    """The engine core driven by asyncio in (scaled) real time."""

    def __init__(self, step_model: StepModel, role: str, config: EngineConfig,
                 clock: EngineClock, kv_lease: float = KV_LEASE_DEFAULT) -> None:
        self.core = EngineCore(step_model, role, config)
        self.clock = clock
        self.kv_lease = kv_lease
        self.finished: deque[dict[str, Any]] = deque(maxlen=10000)
        self.wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # When an idle engine is woken, the simulated time it should have started at (the
        # arrival, or a KV load's end): event-loop latency x speed must not leak into latencies.
        self._wake_at: float | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def arrival_time(self) -> float:
        """Stamp for a new request: now, but never past the engine's step in flight (when the
        engine lags the clock it joins the next step, keeping time causal)."""
        now = self.clock.now()
        ch = self.core.chunk
        if ch is not None:
            return min(now, ch.end)
        if self.core.sched.running:
            return min(now, self.core.busy_until)
        return now

    def add(self, seq: Seq) -> None:
        self.core.add(seq)
        # a decode run in progress stops after the step in flight, so the request joins the
        # next step (as in vLLM, where every step re-schedules)
        self.core.truncate(seq.arrival)
        if self._wake_at is None or seq.arrival < self._wake_at:
            self._wake_at = seq.arrival
        self.wake.set()

    def abort(self, seq: Seq) -> None:
        self.core.abort(seq)
        self.core.truncate(self.clock.now())
        self.wake.set()

    async def _loop(self) -> None:
        core = self.core
        while True:
            # steps run back to back while sequences are running (as on a GPU); an idle
            # engine starts at the clock's now
            if core.sched.running:
                t = core.busy_until
            elif self._wake_at is not None:
                t = self._wake_at
            else:
                t = self.clock.now()
            self._wake_at = None
            core.expire_held(t, self.kv_lease)
            ch = core.plan(t)
            core.started_loads.clear()
            if ch is None:
                self.wake.clear()
                # blocked: wait for a KV load to land, held KV to expire, or a request (a
                # virtual clock does not jump to an expiry: that would expire every hold at
                # once; holds expire when the clock gets there with other work)
                expiry = None if self.clock.instant else core.next_expiry(self.kv_lease)
                nxt = min((x for x in (core.next_load_at(), expiry) if x is not None),
                          default=None)
                if nxt is None:
                    await self.wake.wait()
                    continue
                if self.clock.instant:
                    self.clock.virtual = max(self.clock.virtual, nxt)
                    self._wake_at = nxt
                    await asyncio.sleep(0)
                    continue
                try:
                    await asyncio.wait_for(self.wake.wait(), self.clock.wall_delay(nxt))
                except TimeoutError:
                    self._wake_at = nxt if self._wake_at is None else min(self._wake_at, nxt)
                continue
            if self.clock.instant:
                await self.clock.sleep_until(ch.end)
                self._deliver(core.commit())
                continue
            # a decode run is priced at once but delivered step by step, in (scaled) time
            while core.chunk is ch:
                nxt_end = float(ch.ends[ch.done])
                await self.clock.sleep_until(nxt_end)
                self._deliver(core.commit(upto=nxt_end if core.chunk is ch else None))

    def _deliver(self, out: ChunkResult) -> None:
        for s in out.sampled:
            st: Stream = s.payload
            new = s.generated - st.emitted
            if new > 0:
                st.emitted = s.generated
                st.queue.put_nowait(new)
        for s in out.finished:
            self.finished.append({
                "id": s.rid, "arrival": s.arrival, "first_token_at": s.first_token_at,
                "finished_at": s.finished_at, "prompt_tokens": s.prompt,
                "output_tokens": s.generated, "finish_reason": s.finish_reason,
                "remote_prefill": s.remote_prefill, "preemptions": s.preemptions,
            })
            s.payload.done.set()
            s.payload.queue.put_nowait(0)


def build_collector(engine: SimEngine, served: str) -> Any:
    class EngineCollector:
        def collect(self) -> Any:
            snap = engine.core.snapshot()
            lv = [served, "0"]
            names = list(m.VLLM_LABELS)
            for name in GAUGES:
                g = GaugeMetricFamily(name, HELP[name], labels=names)
                g.add_metric(lv, snap.gauges[name])
                yield g
            for name, value in snap.counters.items():
                c = CounterMetricFamily(name.removesuffix("_total"), HELP[name], labels=names)
                c.add_metric(lv, value)
                yield c
            c = CounterMetricFamily(m.VLLM_REQUEST_SUCCESS.removesuffix("_total"),
                                    HELP[m.VLLM_REQUEST_SUCCESS],
                                    labels=[*names, "finished_reason"])
            for reason, value in snap.success.items():
                c.add_metric([*lv, reason], value)
            yield c
            for name, h in snap.histograms.items():
                hf = HistogramMetricFamily(name, HELP[name], labels=names)
                buckets = [("+Inf" if le == math.inf else repr(float(le)), cnt)
                           for le, cnt in h.cumulative()]
                hf.add_metric(lv, buckets, sum_value=h.sum)
                yield hf

    return EngineCollector()


@dataclass(frozen=True)
class SimServerConfig:
    """What `poolpilot engine-sim` serves: one field per option, the options' defaults."""

    model: str = "llama-3.1-8b"
    gpu: str = "h200"
    tensor_parallel: int = 1
    role: str = Role.ENGINE
    host: str = "127.0.0.1"
    port: int = 8000
    speed: float = 1.0
    served_name: str | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    enable_prefix_caching: bool = True
    kv_offloading_size: float = 0.0  # GiB of CPU offload tier (vLLM's flag); 0: none
    mean_output_tokens: float = 256.0
    seed: int = 0
    engine_id: str | None = None
    kv_lease_seconds: float = KV_LEASE_DEFAULT
    itl_budget: float | None = None
    metrics_port: int | None = None  # /metrics on a port of its own too (as poolpilot launch)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SimServerConfig:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


class SimServer:
    def __init__(self, cfg: SimServerConfig) -> None:
        self.cfg = cfg
        self.step_model = make_step_model(cfg.model, cfg.gpu, cfg.tensor_parallel)
        self.role = canonical_role(cfg.role)
        self.clock = EngineClock(cfg.speed)
        if cfg.itl_budget is not None and not cfg.itl_budget > 0:
            raise ValueError(f"--itl-budget must be > 0 seconds, got {cfg.itl_budget}")
        config = EngineConfig(
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_num_seqs=cfg.max_num_seqs,
            itl_budget=cfg.itl_budget,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_model_len=cfg.max_model_len,
            max_chunk_steps=256 if self.clock.instant else 64,
            track_token_steps=False,
            block_size=cfg.block_size,
            enable_prefix_caching=cfg.enable_prefix_caching,
            kv_offloading_gib=cfg.kv_offloading_size,
        )
        if not cfg.kv_lease_seconds > 0:
            raise ValueError(f"--kv-lease-seconds must be > 0, got {cfg.kv_lease_seconds}")
        self.engine = SimEngine(self.step_model, self.role, config, self.clock,
                                cfg.kv_lease_seconds)
        self.served = cfg.served_name or self.step_model.model.hf_id
        self.engine_id = cfg.engine_id or str(uuid.uuid4())
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(build_collector(self.engine, self.served))
        self.host = cfg.host
        self.port = cfg.port
        self._block_cursor = 0
        self._session: aiohttp.ClientSession | None = None

    # ---- app ----
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/sim/kv/pull", self.kv_pull)
        app.router.add_get("/sim/requests", self.sim_requests)
        app.router.add_get("/sim/fault", self.sim_fault)
        app.router.add_post("/sim/fault", self.sim_fault)
        app.on_startup.append(self._startup)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _startup(self, app: web.Application) -> None:
        self.engine.start()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def _cleanup(self, app: web.Application) -> None:
        await self.engine.stop()
        if self._session is not None:
            await self._session.close()

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.0.0-poolpilot-engine-sim"})

    async def models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        return web.json_response({"object": "list", "data": [{
            "id": self.served, "object": "model", "created": created, "owned_by": "vllm",
            "root": self.step_model.model.hf_id, "parent": None,
            "max_model_len": self.engine.core.max_model_len,
            "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                            "created": created, "allow_create_engine": False,
                            "allow_sampling": True, "allow_logprobs": True,
                            "allow_search_indices": False, "allow_view": True,
                            "allow_fine_tuning": False, "organization": "*", "group": None,
                            "is_blocking": False}],
        }]})

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; "
                                                                "charset=utf-8"})

    async def sim_requests(self, request: web.Request) -> web.Response:
        """The simulator's own record of the last 10,000 finished requests (simulated s)."""
        return web.json_response({"now": self.clock.now(), "requests": list(self.engine.finished)})

    async def sim_fault(self, request: web.Request) -> web.Response:
        """Read or set the step-time multiplier (see the module's docstring)."""
        if request.method == "POST":
            try:
                body = await request.json()
                factor = float(body["slowdown"])
            except (ValueError, KeyError, TypeError):
                return web.json_response({"error": 'expected {"slowdown": <number >= 1>}'},
                                         status=400)
            if not 1.0 <= factor < float("inf"):
                return web.json_response({"error": f"slowdown {factor}: must be >= 1"},
                                         status=400)
            self.engine.core.slowdown = factor
        return web.json_response({"slowdown": self.engine.core.slowdown})

    async def kv_pull(self, request: web.Request) -> web.Response:
        """Side channel: a decode engine reads a finished prefill's KV, which frees it here."""
        body = await request.json()
        if body.get("remote_engine_id") != self.engine_id:
            return web.json_response({"ok": False, "reason": "unknown engine"}, status=404)
        seq = self.engine.core.release_held(body.get("remote_request_id"))
        if seq is None:
            return web.json_response({"ok": False, "reason": "unknown or expired request"},
                                     status=404)
        self.engine.wake.set()
        bs = self.engine.core.config.block_size
        return web.json_response({"ok": True, "blocks": -(-seq.prompt // bs)})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    # ---- generation ----
    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response(p.error_body("request body is not valid JSON", 400),
                                     status=400)
        if not isinstance(body, dict):
            return web.json_response(p.error_body("request body must be a JSON object", 400),
                                     status=400)
        try:
            model = body.get("model")
            if model is not None and model != self.served:
                raise p.BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError",
                                   "model")
            if chat:
                prompt_n, key = p.chat_tokens(body.get("messages"))
            else:
                if "prompt" not in body:
                    raise p.BadRequest("prompt is required", param="prompt")
                prompt_n, key = p.prompt_tokens(body["prompt"])
            hashes = self._block_hashes(body, chat)
            core = self.engine.core
            if prompt_n >= core.max_model_len:
                raise p.BadRequest(core.validate(prompt_n, 1) or "prompt too long")
            sampling = p.plan_output(body, prompt_n, core.max_model_len, chat, key,
                                     self.cfg.mean_output_tokens, self.cfg.seed)
            err = core.validate(prompt_n, sampling.max_tokens)
            if err is not None:
                raise p.BadRequest(err)
            kv_in = body.get("kv_transfer_params") or {}
            if not isinstance(kv_in, dict):
                raise p.BadRequest("kv_transfer_params must be an object",
                                   param="kv_transfer_params")
            options = body.get("stream_options")
            if options is not None and not isinstance(options, dict):
                # vLLM's request model refuses it; _stream used to fail on it mid-response
                raise p.BadRequest('stream_options must be an object, e.g. '
                                   '{"include_usage": true}', param="stream_options")
        except p.BadRequest as exc:
            kv = body.get("kv_transfer_params")
            if isinstance(kv, dict) and kv.get("do_remote_prefill"):
                await self._pull_kv(kv, count_failure=False)  # free the prefill's hold
            return web.json_response(exc.body(), status=exc.status)

        rid = p.new_id(chat)
        remote_prefill = bool(kv_in.get("do_remote_prefill"))
        remote_decode = bool(kv_in.get("do_remote_decode"))
        if remote_prefill and kv_in.get("remote_block_ids") == []:
            remote_prefill = False  # a prompt shorter than a block: nothing to read (as vLLM)
        elif remote_prefill:
            remote_prefill = await self._pull_kv(kv_in)
        full_blocks = prompt_n // self.engine.core.config.block_size
        seq = Seq(rid, prompt_n, sampling.output_tokens, self.engine.arrival_time(),
                  remote_prefill=remote_prefill, hold_kv=remote_decode and full_blocks > 0,
                  finish_reason=sampling.finish_reason, payload=Stream(key),
                  block_hashes=hashes)
        self.engine.add(seq)
        kv_out = self._kv_params(rid, full_blocks) if remote_decode else None
        stream = bool(body.get("stream", False))
        try:
            if stream:
                return await self._stream(request, seq, chat, prompt_n, kv_out, body)
            await seq.payload.done.wait()
        except (asyncio.CancelledError, ConnectionResetError):
            self.engine.abort(seq)  # the client went away: free its slot and blocks
            raise
        text = p.token_text(key, 0, seq.generated)
        make = p.chat_response if chat else p.completion_response
        return web.json_response(make(rid, self.served, text, seq.finish_reason, prompt_n,
                                      seq.generated, kv_out))

    def _block_hashes(self, body: dict[str, Any], chat: bool) -> tuple[int, ...]:
        """The prompt's full blocks hashed as vLLM does, over the token ids the simulator's
        tokenizer gives (a chat: the template's sequence)."""
        if not self.engine.core.config.enable_prefix_caching:
            return ()
        ids = p.chat_token_ids(body["messages"]) if chat else p.prompt_token_ids(body["prompt"])
        return chain_hashes(ids, self.engine.core.config.block_size)

    async def _pull_kv(self, kv: dict[str, Any], count_failure: bool = True) -> bool:
        """Read the prompt's KV from the prefill engine; False means recompute locally."""
        host, port = kv.get("remote_host"), kv.get("remote_port")
        ok = False
        if host and port and self._session is not None:
            url = f"http://{host}:{port}/sim/kv/pull"
            payload = {"remote_request_id": kv.get("remote_request_id"),
                       "remote_engine_id": kv.get("remote_engine_id")}
            try:
                async with self._session.post(url, json=payload) as r:
                    ok = r.status == 200
            except (aiohttp.ClientError, TimeoutError, OSError):
                ok = False
        if not ok and count_failure:
            self.engine.core.stats.counters[m.VLLM_NIXL_FAILED] += 1
        return ok

    def _kv_params(self, rid: str, full_blocks: int) -> dict[str, Any]:
        n = self.engine.core.sched.num_blocks
        ids = [(self._block_cursor + i) % n for i in range(full_blocks)]
        self._block_cursor = (self._block_cursor + full_blocks) % n
        return {
            "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": ids,
            "remote_engine_id": self.engine_id, "remote_request_id": rid,
            "remote_host": self.host, "remote_port": self.port,
            "tp_size": self.step_model.tp,
        }

    async def _stream(self, request: web.Request, seq: Seq, chat: bool, prompt_n: int,
                      kv_out: dict[str, Any] | None, body: dict[str, Any]
                      ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created = int(time.time())
        st: Stream = seq.payload
        sent = 0
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage", False))
        continuous = bool(opts.get("continuous_usage_stats", False))

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

        if chat:
            first = p.chat_chunk(seq.rid, self.served, created,
                                 {"role": "assistant", "content": ""}, None)
            await send(first)
        while True:
            await st.queue.get()
            total = st.emitted
            finished = st.done.is_set()
            while not st.queue.empty():  # coalesce what is already there
                st.queue.get_nowait()
            n = total - sent
            if n > 0 or finished:
                text = p.token_text(st.key, sent, n)
                sent = total
                finish = seq.finish_reason if finished else None
                if chat:
                    chunk = p.chat_chunk(seq.rid, self.served, created, {"content": text}, finish)
                else:
                    chunk = p.completion_chunk(seq.rid, self.served, created, text, finish)
                if finished and kv_out is not None:
                    chunk["kv_transfer_params"] = kv_out
                if continuous:
                    chunk["usage"] = p.usage(prompt_n, sent)
                await send(chunk)
            if finished:
                break
        if include_usage:
            obj = "chat.completion.chunk" if chat else "text_completion"
            await send({"id": seq.rid, "object": obj, "created": created, "model": self.served,
                        "choices": [], "usage": p.usage(prompt_n, sent)})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def add_arguments(parser: argparse.ArgumentParser) -> None:
    D = SimServerConfig()  # the options' defaults are the config's
    parser.add_argument("--model", default=D.model,
                        help="model shape (llama-3.1-8b, llama-3.1-70b, qwen2.5-7b, ...)")
    cli.add_gpu(parser, GPUS)
    parser.add_argument("--tensor-parallel", type=int, default=D.tensor_parallel,
                        help="GPUs per engine")
    parser.add_argument("--role", default=D.role,
                        help="prefill, decode or engine (the aggregated engine, the default; "
                        "aggregated is an older name for it, still accepted)")
    parser.add_argument("--host", default=D.host, help="address to bind (loopback)")
    parser.add_argument("--port", type=int, default=D.port, help="port (0 = a free one)")
    cli.add_speed(parser, D.speed)
    parser.add_argument("--served-name", default=None,
                        help="model name clients send (default: the HF id)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="context limit (default: the model's, capped by the KV cache)")
    parser.add_argument("--max-num-batched-tokens", type=int,
                        default=D.max_num_batched_tokens,
                        help="tokens one scheduler step may process (vLLM's flag; default "
                        f"{D.max_num_batched_tokens})")
    parser.add_argument("--max-num-seqs", type=int, default=D.max_num_seqs,
                        help="sequences in the running batch at most (vLLM's flag; default "
                        f"{D.max_num_seqs})")
    parser.add_argument("--gpu-memory-utilization", type=float,
                        default=D.gpu_memory_utilization,
                        help="share of GPU memory for weights and KV cache (vLLM's flag; "
                        f"default {D.gpu_memory_utilization:g})")
    parser.add_argument("--block-size", type=int, default=D.block_size,
                        help="tokens per KV block, the prefix cache's unit (vLLM's flag; "
                             f"default {D.block_size}, vLLM's on GPU)")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                        default=D.enable_prefix_caching,
                        help="cache prompt prefixes as vLLM V1 does (vLLM's flag; default on)")
    parser.add_argument("--kv-offloading-size", type=float, default=D.kv_offloading_size,
                        metavar="GIB",
                        help="GiB of host memory for a CPU offload tier of the prefix cache "
                             "(vLLM's flag, its native backend; default 0: none)")
    parser.add_argument("--mean-output-tokens", type=float, default=D.mean_output_tokens,
                        help="mean 'natural' output length when ignore_eos is false")
    parser.add_argument("--seed", type=int, default=D.seed, help="seed for natural output lengths")
    parser.add_argument("--engine-id", default=None, help="NIXL engine id (default: a uuid)")
    parser.add_argument("--kv-lease-seconds", type=float, default=D.kv_lease_seconds,
                        help="prefill: how long a prompt's KV waits for a decode engine to read "
                             "it (simulated seconds; default 30, vLLM 0.32's kv_lease_duration)")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve /metrics on this port too, at the same address (as "
                        "`poolpilot launch --metrics-port` does for vLLM)")
    parser.add_argument("--itl-budget", type=float, default=None, metavar="SECONDS",
                        help="while it prefills a plain request itself (the router's local-"
                             "prefill fallback on a decode engine), size each step's prompt "
                             "chunk so the step stays within SECONDS (the ITL target) at the "
                             "running batch; default: --max-num-batched-tokens alone, as vLLM")


def run(args: argparse.Namespace) -> int:
    try:
        server = SimServer(SimServerConfig.from_args(args))
    except (UnknownHardware, ValueError) as exc:
        print(f"poolpilot engine-sim: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(server))


async def _serve(server: SimServer) -> int:
    # cancel a handler whose client went away, so its request is aborted (as vLLM does)
    runner = web.AppRunner(server.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, server.host, server.port)
    await site.start()
    if server.port == 0:
        server.port = runner.addresses[0][1]
    metrics_runner = None
    if server.cfg.metrics_port is not None:
        metrics_app = web.Application()
        metrics_app.router.add_get("/metrics", server.metrics)
        metrics_runner = web.AppRunner(metrics_app, access_log=None)
        await metrics_runner.setup()
        await web.TCPSite(metrics_runner, server.host, server.cfg.metrics_port).start()
    sm = server.step_model
    print(f"engine-sim {server.role} {sm.model.name} on {sm.tp} x {sm.gpu.name} "
          f"(KV {server.engine.core.memory.kv_tokens} tokens, max_model_len "
          f"{server.engine.core.max_model_len}, speed {server.clock.speed:g}) "
          f"listening on http://{server.host}:{server.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    if metrics_runner is not None:
        await metrics_runner.cleanup()
    return 0
