"""The precise prefix source: what each vLLM engine says it holds, from its KV events.

vLLM publishes its prefix cache's changes when started with `--kv-events-config
'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
"replay_endpoint": "tcp://*:5558"}'` (the launcher's `--kv-events-port`). The wire format, as
vLLM 0.32 builds it (vllm/distributed/kv_events.py):
- a ZMQ PUB socket sends each batch as three frames: topic, sequence number (8 bytes, big
  endian, from 0 at engine start), payload;
- the payload is msgspec msgpack of `EventBatch(ts, events, data_parallel_rank)`, an array;
  each event a map tagged by `type`: `BlockStored(block_hashes, parent_block_hash, token_ids,
  block_size, lora_id, medium, lora_name, [extra_keys, group_idx, ...])`, `BlockRemoved(
  block_hashes, medium, [group_idx, ...])`, `AllBlocksCleared()`; block hashes are 64-bit
  ints (bytes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0; both are accepted);
- a ROUTER socket replays the last `buffer_steps` batches: a request of (empty frame, start
  sequence as 8 bytes big endian) is answered by (empty, topic, seq, payload) per buffered
  batch with seq >= start, then (empty, empty, -1 as 8 signed bytes, empty).

Keys. vLLM's block hashes cannot be recomputed by the router (they need vLLM's hash function
and seed), so each stored block is keyed by the router's own chain instead: key = blake2b-64
of the block's token ids keyed by its parent's key (the first block's parent is a fixed
seed). For a request, `prompt_keys` asks an engine's `POST /tokenize` for the prompt's token
ids (the same chat template and special tokens the engine will apply), cuts them into the
engines' block size and computes the same chain. Blocks whose vLLM hash takes more than the
tokens (a LoRA adapter, multimodal inputs, a cache salt: `lora_name`, `extra_keys`), of other
KV-cache groups (hybrid models), or at another granularity (vLLM's partial entries) are not
indexed: no plain prompt could match them.

Per engine, one subscriber (`Subscriber`) keeps its `EngineIndex`. On every (re)connection
it asks for a replay from the last batch it applied and checks that batch is still the one
it saw (same sequence number and timestamp): if not, the engine restarted (or the replay
buffer rolled past it) and the index is rebuilt from the engine's whole buffer. A live batch
whose sequence number goes backwards is a restart too (unless it is one already applied, as
a replay and live delivery can overlap); one that skips ahead triggers a replay of the gap.
`AllBlocksCleared` (vLLM's prefix-cache reset) empties the index; `forget(url)` (the engine
left the pool or was ejected) drops it and its subscriber.

`record` (the router sent a prompt somewhere) adds a short-lived pending entry: the engine
publishes the blocks only after its step computed them, and a request sharing the prefix in
the meantime should follow the first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import zmq
import zmq.asyncio
from poolpilot.router.discovery import parse_urls
from poolpilot.router.kv_index import (
    END_SEQ,
    RECENT_BATCHES,
    ROOT_KEY,
    AllBlocksCleared,
    Batch,
    BlockRemoved,
    BlockStored,
    EngineIndex,
    Event,
    Hash,
    Live,
    Stream,
    WireError,
    apply_batch,
    block_key,
    chain_keys,
    decode_live,
    decode_payload,
    decode_replay,
    key_int,
    replay_request,
)
from poolpilot.router.prefix_source import PromptKeys
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger("poolpilot.router.kv_events")

DEFAULT_EVENTS_PORT = 5557
DEFAULT_REPLAY_PORT = 5558
PENDING_TTL_S = 10.0  # a sent prompt counts as cached at its engine until events confirm it
PENDING_MAX_KEYS = 65536  # per engine
TOKENIZE_TIMEOUT_S = 0.5  # a slow /tokenize costs TTFT: past this, route on load
REPLAY_TIMEOUT_S = 5.0
# The router's view of each engine's KV events (a gauge, on the router's /metrics).
KV_EVENTS_BLOCKS = "poolpilot_router_kv_events_blocks"


# The pure half's names stay reachable here too (kv_events.X), where callers and tests
# have always found them.
__all__ = [
    "END_SEQ",
    "RECENT_BATCHES",
    "ROOT_KEY",
    "AllBlocksCleared",
    "Batch",
    "BlockRemoved",
    "BlockStored",
    "EngineIndex",
    "Event",
    "Hash",
    "Live",
    "Stream",
    "WireError",
    "apply_batch",
    "block_key",
    "chain_keys",
    "decode_live",
    "decode_payload",
    "decode_replay",
    "key_int",
    "replay_request",
]

# -------------------------------------------------------------------------------------------
# Requests -> token ids


# /tokenize fields that change a chat prompt's tokens (vLLM's TokenizeChatRequest).
CHAT_FIELDS = ("tools", "chat_template", "chat_template_kwargs", "add_generation_prompt",
               "continue_final_message", "add_special_tokens", "documents")


def tokenize_body(path: str, body: dict[str, Any]) -> dict[str, Any] | list[int] | None:
    """What to POST to /tokenize for a request (or its token ids when it carries them);
    None for what cannot be keyed (a batch of prompts, no prompt)."""
    model = body.get("model")
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        out: dict[str, Any] = {"model": model, "messages": messages}
        out.update({k: body[k] for k in CHAT_FIELDS if k in body})
        return out
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str):
        out = {"model": model, "prompt": prompt}
        if "add_special_tokens" in body:
            out["add_special_tokens"] = body["add_special_tokens"]
        return out
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    return None


# -------------------------------------------------------------------------------------------
# I/O: one subscriber per engine


@dataclass(frozen=True)
class EventPorts:
    """Where an engine publishes: its pod's address, these ports (or, for an engine in
    `per_engine`, its own: engines sharing one host cannot share a port)."""

    events: int = DEFAULT_EVENTS_PORT
    replay: int = DEFAULT_REPLAY_PORT
    per_engine: dict[str, tuple[int, int]] = field(default_factory=dict)  # url -> ports

    def endpoints(self, url: str) -> tuple[str, str]:
        host = urlsplit(url).hostname or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        events, replay = self.per_engine.get(url, (self.events, self.replay))
        return f"tcp://{host}:{events}", f"tcp://{host}:{replay}"


def parse_engine_ports(items: Iterable[str]) -> dict[str, tuple[int, int]]:
    """['URL=5557:5558', 'URL=6000'] -> {url: (events, replay)} (replay: events + 1)."""
    out: dict[str, tuple[int, int]] = {}
    for item in items:
        url, sep, ports = item.rpartition("=")
        events, _, replay = ports.partition(":")
        try:
            pair = (int(events), int(replay) if replay else int(events) + 1)
        except ValueError:
            pair = (0, 0)
        if not sep or not url or not all(0 < p < 65536 for p in pair):
            raise ValueError(f"--kv-events-ports {item!r}: expected URL=PORT[:REPLAY_PORT], "
                             "ports 1..65535")
        out[parse_urls(url)[0]] = pair
    return out


class Subscriber:
    """Keeps one engine's index from its KV events (see the module doc)."""

    def __init__(self, url: str, ports: EventPorts, block_size: int | None = None,
                 replay_timeout_s: float = REPLAY_TIMEOUT_S) -> None:
        self.url = url
        self.events_endpoint, self.replay_endpoint = ports.endpoints(url)
        self.index = EngineIndex(block_size=block_size)
        self.stream = Stream()
        self.replay_timeout_s = replay_timeout_s
        self.connected = asyncio.Event()
        self.restarts = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        """Subscribe until cancelled; a failure (a ZMQ error, a bug) drops the index and
        subscribes again a second later, so no engine is left with a stale index for good."""
        while True:
            try:
                await self._subscribe()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("kv events from %s: subscriber failed; its index is dropped and "
                            "rebuilt", self.url, exc_info=True)
                self.index.clear()
                self.stream.reset()
                await asyncio.sleep(1.0)

    async def _subscribe(self) -> None:
        ctx = zmq.asyncio.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sub.connect(self.events_endpoint)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    event = parse_monitor_message(await monitor.recv_multipart())["event"]
                    if event == zmq.EVENT_CONNECTED:
                        self.connected.set()
                        await self._resync()  # what was published while away
                    elif event == zmq.EVENT_DISCONNECTED:
                        self.connected.clear()
                if sub in ready:
                    await self._live(await sub.recv_multipart())
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _live(self, frames: list[bytes]) -> None:
        try:
            batch = decode_live(frames)
        except WireError as exc:
            log.warning("kv events from %s: %s", self.url, exc)
            return
        verdict = self.stream.classify(batch)
        if verdict == Live.DUPLICATE:
            return
        if verdict == Live.RESTART:
            self._restarted("its batch sequence went back to %d", batch.seq)
        if verdict != Live.APPLY:  # a gap, or the new engine's batches before this one
            await self._resync()
            if self.stream.last is not None and batch.seq <= self.stream.last:
                return  # the replay brought it
        self._apply(batch)

    def _apply(self, batch: Batch) -> None:
        apply_batch(self.index, self.stream, batch)

    def _restarted(self, why: str, *args: object) -> None:
        self.restarts += 1
        log.info("engine %s restarted (" + why + "): its prefix index is rebuilt", self.url,
                 *args)
        self.index.clear()
        self.stream.reset()

    async def _resync(self) -> None:
        replayed = await self._replay(self.stream.replay_start())
        if replayed is None:
            return  # no replay (yet): live batches keep the index from now on
        if not self.stream.continues(replayed):
            self._restarted("the replay does not hold batch %s as it was seen",
                            self.stream.last)
            replayed = await self._replay(0)
            if replayed is None:
                return
        for batch in replayed:
            if self.stream.last is None or batch.seq > self.stream.last:
                self._apply(batch)

    async def _replay(self, start: int) -> list[Batch] | None:
        """The engine's buffered batches from `start`; None when it does not answer."""
        sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.replay_endpoint)
        out: list[Batch] = []
        try:
            await sock.send_multipart(replay_request(start))
            while True:
                frames = await asyncio.wait_for(sock.recv_multipart(), self.replay_timeout_s)
                batch = decode_replay(frames)
                if batch is None:
                    return out
                out.append(batch)
        except TimeoutError:
            log.warning("kv events replay from %s: no answer within %.0f s",
                        self.replay_endpoint, self.replay_timeout_s)
            return None
        except WireError as exc:
            log.warning("kv events replay from %s: %s", self.replay_endpoint, exc)
            return None
        finally:
            sock.close(linger=0)


# -------------------------------------------------------------------------------------------
# The source


class KvEventsSource:
    """A `PrefixSource` from the engines' KV events. `attach` gives it the router's HTTP
    session and the engines it routes to (it subscribes to each; `forget` drops one)."""

    def __init__(self, ports: EventPorts | None = None, block_size: int | None = None,
                 tokenize_timeout_s: float = TOKENIZE_TIMEOUT_S,
                 replay_timeout_s: float = REPLAY_TIMEOUT_S,
                 pending_ttl_s: float = PENDING_TTL_S) -> None:
        self.ports = ports or EventPorts()
        self.block_size = block_size
        self.tokenize_timeout = aiohttp.ClientTimeout(total=tokenize_timeout_s)
        self.replay_timeout_s = replay_timeout_s
        self.pending_ttl_s = pending_ttl_s
        self.subscribers: dict[str, Subscriber] = {}
        self._pending: dict[str, OrderedDict[int, float]] = {}  # url -> key -> expiry
        self._session: Callable[[], aiohttp.ClientSession | None] = lambda: None
        self._own_session: aiohttp.ClientSession | None = None
        self._urls: Callable[[], Iterable[str]] = lambda: ()
        self._turn = itertools.count()
        self._sync_task: asyncio.Task[None] | None = None

    def attach(self, session: Callable[[], aiohttp.ClientSession | None],
               urls: Callable[[], Iterable[str]], sync_interval_s: float = 1.0,
               registry: CollectorRegistry | None = None, pool: str = "default") -> None:
        """Use the router's session (for /tokenize) and follow its engines; call it in the
        router's event loop (it subscribes every `sync_interval_s` to new engines). With a
        `registry`, export each engine's indexed blocks there."""
        self._session, self._urls = session, urls
        if registry is not None:
            registry.register(_BlocksCollector(self, pool))
        self.sync()
        if sync_interval_s > 0:
            self._sync_task = asyncio.get_running_loop().create_task(
                self._sync_loop(sync_interval_s))

    async def _sync_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.sync()

    def sync(self) -> None:
        """Subscribe to every engine the router routes to (an unsubscribed url is new, or
        was forgotten: its index starts empty and its replay fills it)."""
        for url in self._urls():
            if url not in self.subscribers:
                sub = Subscriber(url, self.ports, self.block_size, self.replay_timeout_s)
                self.subscribers[url] = sub
                sub.start()

    async def close(self) -> None:
        if self._sync_task is not None:
            self._sync_task.cancel()
        await asyncio.gather(*(s.stop() for s in self.subscribers.values()))
        self.subscribers.clear()
        if self._own_session is not None:
            await self._own_session.close()

    # -- PrefixSource ------------------------------------------------------------------------

    def engine_block_size(self) -> int | None:
        if self.block_size is not None:
            return self.block_size
        for sub in self.subscribers.values():
            if sub.index.block_size is not None:
                return sub.index.block_size
        return None

    async def prompt_keys(self, path: str, body: dict[str, Any]) -> PromptKeys | None:
        block = self.engine_block_size()
        if block is None:
            return None  # no engine has stored a block yet: nothing to match
        request = tokenize_body(path, body)
        if request is None:
            return None
        tokens = request if isinstance(request, list) else await self._tokenize(request)
        if tokens is None:
            return None
        keys = tuple(key_int(k) for k in chain_keys(tokens, block))
        return PromptKeys(keys, block)

    async def _tokenize(self, request: dict[str, Any]) -> list[int] | None:
        urls = list(self.subscribers) or list(self._urls())
        if not urls:
            return None
        url = urls[next(self._turn) % len(urls)]  # spread the tokenizing over the engines
        session = self._session() or await self._session_of_own()
        try:
            async with session.post(url + "/tokenize", json=request,
                                    timeout=self.tokenize_timeout) as resp:
                if resp.status != 200:
                    log.debug("tokenize at %s answered %d", url, resp.status)
                    return None
                data = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.debug("tokenize at %s failed: %r", url, exc)
            return None
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            return None
        return tokens

    async def _session_of_own(self) -> aiohttp.ClientSession:
        if self._own_session is None:
            self._own_session = aiohttp.ClientSession()
        return self._own_session

    def matched_blocks(self, prompt: PromptKeys, urls: Sequence[str], now: float) -> list[int]:
        out = []
        for url in urls:
            sub = self.subscribers.get(url)
            held = 0
            if sub is not None and sub.index.block_size == prompt.block_tokens:
                held = sub.index.matched(prompt.keys)
            out.append(max(held, self._pending_matched(url, prompt.keys, now)))
        return out

    def _pending_matched(self, url: str, keys: Sequence[int], now: float) -> int:
        pending = self._pending.get(url)
        if not pending:
            return 0
        n = 0
        for k in keys:
            expiry = pending.get(k)
            if expiry is None or expiry <= now:
                break
            n += 1
        return n

    def record(self, prompt: PromptKeys, url: str, now: float) -> None:
        pending = self._pending.setdefault(url, OrderedDict())
        expiry = now + self.pending_ttl_s
        for k in prompt.keys:
            pending[k] = expiry
            pending.move_to_end(k)
        while len(pending) > PENDING_MAX_KEYS:
            pending.popitem(last=False)

    def forget(self, url: str) -> None:
        self._pending.pop(url, None)
        sub = self.subscribers.pop(url, None)
        if sub is not None:
            sub.cancel()


class _BlocksCollector(Collector):
    def __init__(self, source: KvEventsSource, pool: str) -> None:
        self.source, self.pool = source, pool

    def collect(self) -> Iterable[Metric]:
        gauge = GaugeMetricFamily(
            KV_EVENTS_BLOCKS, "Prefix-cache blocks each engine's KV events say it holds "
            "(precise prefix routing; blocks the router cannot key are not counted).",
            labels=["pool", "endpoint"])
        for url, sub in sorted(self.source.subscribers.items()):
            gauge.add_metric([self.pool, url], len(sub.index.by_hash))
        yield gauge


def source_from_args(args: argparse.Namespace, config: object) -> KvEventsSource:
    """The precise source for `poolpilot router --prefix-routing precise` (its flags
    --kv-events-port, --kv-replay-port and --kv-events-ports are router/main.py's; the last
    is checked there with parse_engine_ports)."""
    return KvEventsSource(EventPorts(
        getattr(args, "kv_events_port", DEFAULT_EVENTS_PORT),
        getattr(args, "kv_replay_port", DEFAULT_REPLAY_PORT),
        parse_engine_ports(getattr(args, "kv_events_ports", None) or ())))
