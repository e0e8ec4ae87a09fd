"""Replay a trace through the official `openai` async client against the pool's routers.

Each request is a prompt of exactly the trace's input tokens and a forced output of the
trace's output tokens (`max_tokens` with `ignore_eos`). A request without prefix information
(Azure, plain CSV) is sent as token ids, so the count does not depend on a tokenizer and no two
prompts share a prefix. A request with Mooncake `hash_ids` is sent as text
(`engine_sim.workloads.prompt_text`): requests with equal leading ids get identical leading
text, so the router's prefix keys and the engines' prefix caches see the reuse the trace
records.
Arrivals follow the trace, divided by --speed; latencies are measured on the client and
reported in simulated seconds (real seconds x speed).
Every request ends in exactly one result: a completion, or the error its client saw.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from poolpilot.engine_sim.traces import MOONCAKE_BLOCK_TOKENS, TraceRequest, prefix_hit_tokens
from poolpilot.engine_sim.workloads import prompt_text
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:  # imported where a client is made: a third of a second the report never needs
    import openai

# Token ids used for prompts: above the few special ids every tokenizer keeps at the bottom,
# below the tiny model's vocabulary size (512), so the same prompts work on every engine.
TOKEN_LOW, TOKEN_HIGH = 10, 500


@dataclass
class RequestResult:
    index: int
    arrival_s: float  # trace time (simulated seconds from the start of the replay)
    input_tokens: int
    max_tokens: int
    sent_at: float = 0.0  # time.monotonic()
    first_token_at: float | None = None
    finished_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    ok: bool = False
    error: str | None = None
    hash_ids: tuple[int, ...] = ()  # the trace's block ids: sent as text sharing their prefix
    block_tokens: int = MOONCAKE_BLOCK_TOKENS  # the tokens one of them stands for
    reusable_tokens: int = 0  # prompt tokens in blocks an earlier request of the trace had

    def reusable_share(self) -> float:
        """The share of the prompt an infinite cache reachable from anywhere would serve."""
        return self.reusable_tokens / self.input_tokens if self.input_tokens else 0.0

    def ttft(self, speed: float) -> float | None:
        if self.first_token_at is None:
            return None
        return (self.first_token_at - self.sent_at) * speed

    def itls(self, speed: float) -> list[float]:
        t = self.token_times
        return [(b - a) * speed for a, b in itertools.pairwise(t)]

    def mean_itl(self, speed: float) -> float | None:
        """Time per output token after the first: (last - first token) / (tokens - 1).
        Counted in tokens, not chunks, as a chunk may carry several tokens."""
        n = self.output_tokens or len(self.token_times)
        if n < 2 or len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) * speed


# One seeded generator for the whole list (a generator per element made every id the same,
# so every prompt was one token repeated: a prefix cache then served all of them).
_RNG = random.Random(0)
_BASE = [_RNG.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(8192)]


def prompt_tokens(n: int, seed: int) -> list[int]:
    """`n` token ids, a different sequence per seed (cheap: slices of one random list)."""
    start = (seed * 7919) % len(_BASE)
    ids = _BASE[start:] + _BASE[:start]
    while len(ids) < n:
        ids += ids
    return ids[:n]


def request_prompt(r: RequestResult) -> str | list[int]:
    """What is sent as the request's prompt: text whose shared blocks are shared text when the
    trace names its blocks, else token ids of its own."""
    if r.hash_ids:
        return prompt_text(r.hash_ids, r.input_tokens, salt=r.index,
                           block_tokens=r.block_tokens)
    return prompt_tokens(r.input_tokens, r.index)


def results_for(trace: Sequence[TraceRequest]) -> list[RequestResult]:
    """One empty result per trace request, in order, with what the trace says of its prefix."""
    reusable = prefix_hit_tokens(trace)
    return [RequestResult(i, r.arrival_s, r.input_tokens, r.output_tokens, hash_ids=r.hash_ids,
                          block_tokens=r.block_tokens,
                          reusable_tokens=reusable[i])
            for i, r in enumerate(trace)]


class Replayer:
    """Sends a trace to whichever router endpoints are ready when each request starts."""

    def __init__(self, endpoints: Callable[[], list[str]], served_name: str, speed: float,
                 timeout_s: float = 600.0) -> None:
        self.endpoints = endpoints
        self.served_name = served_name
        self.speed = speed
        self.timeout_s = timeout_s
        self._clients: dict[str, openai.AsyncOpenAI] = {}
        self._rr = 0
        self.results: list[RequestResult] = []
        self.in_flight = 0

    def _client(self) -> openai.AsyncOpenAI | None:
        urls = self.endpoints()
        if not urls:
            return None
        self._rr += 1
        url = urls[self._rr % len(urls)]
        if url not in self._clients:
            import openai

            # No retries: a failure is reported as the client saw it, never hidden.
            self._clients[url] = openai.AsyncOpenAI(
                base_url=url, api_key="sandbox", max_retries=0, timeout=self.timeout_s
            )
        return self._clients[url]

    async def close(self) -> None:
        for c in self._clients.values():
            await c.close()
        self._clients.clear()

    async def send(self, r: RequestResult) -> None:
        self.in_flight += 1
        r.sent_at = time.monotonic()
        try:
            client = self._client()
            if client is None:
                raise RuntimeError("no ready router endpoint")
            stream = await client.completions.create(
                model=self.served_name,
                # The prompt goes in extra_body: the SDK then sends token ids as they are
                # instead of walking the list in Python (~40 ms per 2,000-token prompt).
                prompt="",
                max_tokens=r.max_tokens,
                stream=True,
                stream_options={"include_usage": True},
                temperature=0.0,
                extra_body={"prompt": request_prompt(r), "ignore_eos": True},
            )
            usage_tokens = None
            async for chunk in stream:
                now = time.monotonic()
                if chunk.usage is not None:
                    usage_tokens = chunk.usage.completion_tokens
                if chunk.choices and chunk.choices[0].text is not None and (
                    chunk.choices[0].text or chunk.choices[0].finish_reason is None
                ):
                    if r.first_token_at is None:
                        r.first_token_at = now
                    r.token_times.append(now)
            r.finished_at = time.monotonic()
            r.output_tokens = usage_tokens if usage_tokens is not None else len(r.token_times)
            r.ok = r.first_token_at is not None
            if not r.ok:
                r.error = "the stream ended without a token"
        except Exception as exc:  # every request ends in a result its client saw
            r.finished_at = time.monotonic()
            r.error = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            self.in_flight -= 1

    async def replay(self, trace: Sequence[TraceRequest], progress: bool = True,
                     on_start: Callable[[float], None] | None = None,
                     drain_s: float | None = None) -> list[RequestResult]:
        """Send every request at its arrival time (divided by speed); wait for all to end, or
        `drain_s` real seconds after the last send: a request still open then is cancelled
        and recorded as having no outcome (finished_at None), a hang."""
        self.results = results_for(trace)
        tasks: list[asyncio.Task[None]] = []
        t0 = time.monotonic()
        if on_start:
            on_start(t0)
        bar = Progress(
            TextColumn("[bold]replay"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} sent"),
            TextColumn("{task.fields[ok]} ok, {task.fields[failed]} failed, "
                       "{task.fields[inflight]} in flight, trace t={task.fields[t]:.0f}s"),
            TimeElapsedColumn(),
            disable=not progress,
            transient=False,
        )
        with bar:
            task_id = bar.add_task("replay", total=len(self.results), ok=0, failed=0,
                                   inflight=0, t=0.0)

            def refresh() -> None:
                done = [r for r in self.results if r.finished_at is not None]
                bar.update(task_id, completed=len(tasks), ok=sum(r.ok for r in done),
                           failed=sum(not r.ok for r in done), inflight=self.in_flight,
                           t=(time.monotonic() - t0) * self.speed)

            for r in self.results:
                due = t0 + r.arrival_s / self.speed
                delay = due - time.monotonic()
                if delay > 0:
                    refresh()
                await asyncio.sleep(max(0.0, delay))  # also lets due requests start
                tasks.append(asyncio.create_task(self.send(r)))
            deadline = None if drain_s is None else time.monotonic() + drain_s
            while any(not t.done() for t in tasks):
                if deadline is not None and time.monotonic() >= deadline:
                    await self._give_up(tasks, drain_s or 0.0)
                    break
                refresh()
                await asyncio.wait(tasks, timeout=0.5)
            refresh()
        return self.results

    async def _give_up(self, tasks: Sequence[asyncio.Task[None]], drain_s: float) -> None:
        hung = [r for r, t in zip(self.results, tasks, strict=False) if not t.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for r in hung:
            r.finished_at = None
            r.error = f"no outcome {drain_s * self.speed:.0f}s (simulated) after the last send"
