"""A tiny vLLM-shaped OpenAI server for the router's fault tests, run as its own process so a
test can SIGKILL it mid-stream like a crashing engine.

    python fake_engine.py --name A [--token-delay 0.01] [--port 0]

Prints `listening on PORT` once bound. Behaves like vLLM where the router cares:
- a request with kv_transfer_params.do_remote_decode answers one token and returns
  kv_transfer_params naming this engine (a prefill);
- otherwise generates max_tokens tokens `A0 A1 ...` (streamed as SSE chunks when asked);
- /health, /v1/models, /metrics (vllm:num_requests_waiting, settable via POST /debug/waiting);
- GET /debug/requests: bodies received; GET /debug/stats: counts, incl. cancelled requests
  (the client of this engine, i.e. the router, went away mid-request).
- `--kv-params JSON`: the kv_transfer_params a prefill answers with (default: naming itself);
- `--header-delay S`: wait S seconds before answering anything (an engine slow to take a
  request);
- `--fail-kv-loads`: a request carrying a prefill's KV (do_remote_prefill) fails the way vLLM
  reports a failed KV load: a 500, or a stream whose first event is an error.
- `--max-model-len N`: reported in /v1/models' `data[].max_model_len`, as vLLM does;
- `--stall-after K`: a stream sends its status line and K tokens, then goes silent (a hung
  engine: alive, not answering).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from aiohttp import web


class FakeEngine:
    def __init__(self, name: str, token_delay: float, fail_kv_loads: bool = False,
                 kv_params: dict | None = None, header_delay: float = 0.0,
                 max_model_len: int | None = None, stall_after: int | None = None) -> None:
        self.name = name
        self.max_model_len = max_model_len
        self.stall_after = stall_after
        self.header_delay = header_delay
        self.kv_params = kv_params or {"remote_engine_id": name, "remote_block_ids": [1],
                                       "do_remote_prefill": True, "do_remote_decode": False}
        self.token_delay = token_delay
        self.fail_kv_loads = fail_kv_loads
        self.requests: list[dict] = []
        self.stats = {"requests": 0, "completed": 0, "cancelled": 0}
        self.waiting = 0.0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/chat/completions", self.generate)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/debug/requests", self.debug_requests)
        app.router.add_get("/debug/stats", self.debug_stats)
        app.router.add_post("/debug/waiting", self.set_waiting)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(self, request: web.Request) -> web.Response:
        model = {"id": "fake", "object": "model", "owned_by": self.name}
        if self.max_model_len is not None:
            model["max_model_len"] = self.max_model_len
        return web.json_response({"object": "list", "data": [model]})

    async def metrics(self, request: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="fake"}} {self.waiting}\n'
        )
        return web.Response(text=text)

    async def debug_requests(self, request: web.Request) -> web.Response:
        return web.json_response(self.requests)

    async def debug_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats)

    async def set_waiting(self, request: web.Request) -> web.Response:
        self.waiting = float((await request.json())["waiting"])
        return web.json_response({"waiting": self.waiting})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.stats["requests"] += 1
        chat = request.path.endswith("/chat/completions")
        try:
            return await self._generate(request, body, chat)
        except asyncio.CancelledError:
            self.stats["cancelled"] += 1
            raise

    async def _generate(self, request: web.Request, body: dict, chat: bool) -> web.StreamResponse:
        await asyncio.sleep(self.header_delay)
        if body.get("model") == "bad":
            return web.json_response(
                {"error": {"message": "model bad does not exist", "code": 404}}, status=404
            )
        kv = body.get("kv_transfer_params") or {}
        if body.get("model") == "boom" and not kv.get("do_remote_decode"):
            return web.json_response({"error": {"message": "engine exploded"}}, status=500)
        if self.fail_kv_loads and kv.get("do_remote_prefill"):
            error = {"error": {"message": "Internal server error", "type": "InternalServerError",
                               "code": 500}}
            if not body.get("stream"):
                return web.json_response(error, status=500)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"data: " + json.dumps(error).encode() + b"\n\ndata: [DONE]\n\n")
            await resp.write_eof()
            return resp
        if kv.get("do_remote_decode"):
            await asyncio.sleep(self.token_delay)
            self.stats["completed"] += 1
            return web.json_response(
                self._final(["P"], chat)
                | {"kv_transfer_params": self.kv_params}
            )
        n = int(body.get("max_tokens") or 16)
        tokens = [f"{self.name}{i} " for i in range(n)]
        if not body.get("stream"):
            await asyncio.sleep(self.token_delay * n)
            self.stats["completed"] += 1
            return web.json_response(self._final(tokens, chat))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, tok in enumerate(tokens):
            if self.stall_after is not None and i >= self.stall_after:
                await asyncio.Event().wait()  # hung: the connection stays open, silent
            await asyncio.sleep(self.token_delay)
            choice = {"index": 0, "finish_reason": "length" if i == n - 1 else None}
            choice |= {"delta": {"content": tok}} if chat else {"text": tok}
            chunk = {"id": "x", "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": int(time.time()), "model": body.get("model"),
                     "choices": [choice]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        self.stats["completed"] += 1
        return resp

    def _final(self, tokens: list[str], chat: bool) -> dict:
        text = "".join(tokens)
        choice: dict = {"index": 0, "finish_reason": "length"}
        choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        return {
            "id": "x", "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": "fake", "choices": [choice],
            "usage": {"prompt_tokens": 1, "completion_tokens": len(tokens),
                      "total_tokens": 1 + len(tokens)},
        }


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--name", default="E")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token-delay", type=float, default=0.0)
    p.add_argument("--fail-kv-loads", action="store_true")
    p.add_argument("--kv-params", type=json.loads, default=None)
    p.add_argument("--header-delay", type=float, default=0.0)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--stall-after", type=int, default=None)
    args = p.parse_args()
    runner = web.AppRunner(
        FakeEngine(args.name, args.token_delay, args.fail_kv_loads, args.kv_params,
                   args.header_delay, args.max_model_len, args.stall_after).app(),
        handler_cancellation=True,
        access_log=None,
    )
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    print(f"listening on {runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
