"""The precise prefix source (router/kv_events.py): vLLM's KV events decoded, each engine's
index kept from them, restarts and gaps noticed, prompts keyed from their token ids.

Payloads are built with msgspec from structs declared as vLLM 0.32 declares them
(vllm/distributed/kv_events.py: EventBatch an array, events maps tagged by class name,
defaults omitted); tests/adapter/test_vllm_kv_events.py decodes what the real vLLM encodes.
The subscriber tests run real ZMQ sockets in-process against a publisher with vLLM's framing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.router import kv_events as kv
from poolpilot.router.prefix_source import PromptKeys
from poolpilot.testkit.prometheus import free_port

# -- vLLM's declarations (the wire contract) ---------------------------------------------------


class VEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class VKVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(VKVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(VKVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(VKVCacheEvent):
    pass


class FutureEvent(VKVCacheEvent):  # an event type a later vLLM might add
    what: str = "new"


BS = 4  # block size in these tests


def stored(hashes: list[int | bytes], tokens: list[int], parent: int | bytes | None = None,
           **kw: Any) -> BlockStored:
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                       block_size=kw.pop("block_size", BS), lora_id=kw.pop("lora_id", None),
                       medium=kw.pop("medium", "GPU"), lora_name=kw.pop("lora_name", None), **kw)


def removed(hashes: list[int | bytes], medium: str | None = "GPU", **kw: Any) -> BlockRemoved:
    return BlockRemoved(block_hashes=hashes, medium=medium, **kw)


def payload(*events: VKVCacheEvent, ts: float = 1.0) -> bytes:
    return msgspec.msgpack.encode(VEventBatch(ts=ts, events=list(events), data_parallel_rank=0))


def toks(start: int, blocks: int = 1) -> list[int]:
    return list(range(start, start + blocks * BS))


def keys_of(tokens: list[int]) -> tuple[int, ...]:
    return tuple(kv.key_int(k) for k in kv.chain_keys(tokens, BS))


# -- decoding ---------------------------------------------------------------------------------


def test_decodes_every_event_type_as_vllm_encodes_it() -> None:
    blob = payload(stored([11, 12], toks(0, 2), medium="CPU", group_idx=0, session_id="s"),
                   removed([b"\x01" * 32]), AllBlocksCleared(), ts=12.5)
    batch = kv.decode_live([b"kv", (7).to_bytes(8, "big"), blob])
    assert (batch.seq, batch.ts, batch.unknown) == (7, 12.5, 0)
    s, r, c = batch.events
    assert isinstance(s, kv.BlockStored) and s.block_hashes == [11, 12]
    assert (s.token_ids, s.block_size, s.medium, s.parent_block_hash) == (toks(0, 2), BS,
                                                                          "CPU", None)
    assert isinstance(r, kv.BlockRemoved) and r.block_hashes == [b"\x01" * 32]
    assert isinstance(c, kv.AllBlocksCleared)


def test_an_unknown_event_type_is_skipped_not_the_batch() -> None:
    batch = kv.decode_payload(0, payload(FutureEvent(), stored([1], toks(0))))
    assert batch.unknown == 1
    assert [type(e) for e in batch.events] == [kv.BlockStored]


@dataclass(frozen=True)
class FrameCase:
    id: str
    frames: list[bytes]


BAD_FRAMES = [
    FrameCase("two frames", [b"", (0).to_bytes(8, "big")]),
    FrameCase("short sequence", [b"", b"\x00\x01", payload()]),
    FrameCase("not msgpack", [b"", (0).to_bytes(8, "big"), b"\xc1"]),
    FrameCase("not a batch", [b"", (0).to_bytes(8, "big"), msgspec.msgpack.encode({"a": 1})]),
]


@pytest.mark.parametrize("case", BAD_FRAMES, ids=[c.id for c in BAD_FRAMES])
def test_bad_live_messages_are_wire_errors(case: FrameCase) -> None:
    with pytest.raises(kv.WireError):
        kv.decode_live(case.frames)


def test_replay_framing_and_its_end_marker() -> None:
    # vLLM's ROUTER sends (identity, b"", topic, seq, payload); a DEALER sees the rest.
    got = kv.decode_replay([b"", b"kv", (3).to_bytes(8, "big"), payload(ts=2.0)])
    assert got is not None and (got.seq, got.ts) == (3, 2.0)
    assert kv.decode_replay([b"", b"", (-1).to_bytes(8, "big", signed=True), b""]) is None
    assert kv.replay_request(5) == [b"", (5).to_bytes(8, "big")]


# -- one engine's index -----------------------------------------------------------------------

PROMPT = toks(100, 3)  # three blocks


@dataclass(frozen=True)
class IndexCase:
    id: str
    events: list[VKVCacheEvent]
    matched: int  # of PROMPT's three blocks


INDEX_CASES = [
    IndexCase("nothing stored", [], 0),
    IndexCase("the whole prompt in one event", [stored([1, 2, 3], PROMPT)], 3),
    IndexCase("chained over two events", [stored([1], PROMPT[:4]),
                                          stored([2, 3], PROMPT[4:], parent=1)], 3),
    IndexCase("a leading run only", [stored([1, 2], PROMPT[:8])], 2),
    IndexCase("another first block shares nothing", [stored([9, 2, 3], [0] * 4 + PROMPT[4:])],
              0),
    IndexCase("unknown parent: not indexed", [stored([2, 3], PROMPT[4:], parent=77)], 0),
    IndexCase("removing the middle block ends the run",
              [stored([1, 2, 3], PROMPT), removed([2])], 1),
    IndexCase("removed from one medium, still in another",
              [stored([1, 2, 3], PROMPT), stored([1, 2, 3], PROMPT, medium="CPU"),
               removed([1, 2, 3], medium="GPU")], 3),
    IndexCase("stored again (a reuse report) then removed once",
              [stored([1, 2, 3], PROMPT), stored([1, 2, 3], PROMPT), removed([3])], 2),
    IndexCase("all blocks cleared", [stored([1, 2, 3], PROMPT), AllBlocksCleared()], 0),
    IndexCase("a LoRA adapter's blocks are not the plain prompt's",
              [stored([1, 2, 3], PROMPT, lora_name="a", lora_id=1)], 0),
    IndexCase("extra keys (multimodal, cache salt) stop the chain",
              [stored([1, 2, 3], PROMPT, extra_keys=[None, ("salt",), None])], 1),
    IndexCase("another KV-cache group is not indexed",
              [stored([1, 2, 3], PROMPT, group_idx=1)], 0),
    IndexCase("another block size (a partial entry) is not indexed",
              [stored([1, 2, 3], PROMPT), stored([4], PROMPT[:2], block_size=2),
               removed([2]), stored([5], PROMPT[4:8], parent=1)], 3),
    IndexCase("token ids that do not fill the blocks: malformed, skipped",
              [stored([1, 2, 3], PROMPT[:10])], 0),
    IndexCase("removing a block never stored is harmless", [removed([42])], 0),
]


def _decoded(e: VKVCacheEvent) -> kv.Event:
    return kv.decode_payload(0, payload(e)).events[0]


@pytest.mark.parametrize("case", INDEX_CASES, ids=[c.id for c in INDEX_CASES])
def test_engine_index(case: IndexCase) -> None:
    index = kv.EngineIndex()
    for e in case.events:
        index.apply(_decoded(e))
    assert index.matched(keys_of(PROMPT)) == case.matched


def test_block_hashes_as_bytes_work_like_ints() -> None:
    index = kv.EngineIndex()
    h: list[int | bytes] = [bytes([i]) * 32 for i in range(3)]
    index.apply(_decoded(stored(h[:1], PROMPT[:4])))
    index.apply(_decoded(stored(h[1:], PROMPT[4:], parent=h[0])))
    assert index.matched(keys_of(PROMPT)) == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(1, 4)), max_size=40))
def test_index_holds_exactly_the_stored_and_not_removed_chains(
        ops: list[tuple[bool, int, int]]) -> None:
    """Prompts p0..p5, each of 4 blocks sharing its first block with the others; store a
    prompt's first n blocks or remove its n-th block: the index matches each prompt exactly
    as far as a model of the engine's cache holds its leading blocks."""
    prompts = [[0] * BS + [p] * (3 * BS) for p in range(6)]

    def vhash(p: int, i: int) -> int:  # vLLM's hash: the chain's identity
        return 0 if i == 0 else 1000 * (p + 1) + i

    index = kv.EngineIndex()
    held: set[int] = set()
    for store, p, n in ops:
        if store:
            index.apply(_decoded(stored([vhash(p, i) for i in range(n)], prompts[p][:n * BS])))
            held |= {vhash(p, i) for i in range(n)}
        else:
            index.apply(_decoded(removed([vhash(p, n - 1)])))
            held.discard(vhash(p, n - 1))
    for p, tokens in enumerate(prompts):
        expected = next((i for i in range(4) if vhash(p, i) not in held), 4)
        assert index.matched(keys_of(tokens)) == expected


# -- the batch sequence ------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveCase:
    id: str
    applied: list[tuple[int, float]]
    batch: tuple[int, float]
    verdict: kv.Live


LIVE_CASES = [
    LiveCase("first batch seen", [], (5, 1.0), kv.Live.APPLY),
    LiveCase("the next one", [(0, 1.0), (1, 2.0)], (2, 3.0), kv.Live.APPLY),
    LiveCase("one skipped", [(0, 1.0)], (2, 3.0), kv.Live.GAP),
    LiveCase("already applied (replay overlap)", [(0, 1.0), (1, 2.0)], (1, 2.0),
             kv.Live.DUPLICATE),
    LiveCase("back to 0 with another timestamp: restarted", [(0, 1.0), (1, 2.0)], (0, 9.0),
             kv.Live.RESTART),
]


@pytest.mark.parametrize("case", LIVE_CASES, ids=[c.id for c in LIVE_CASES])
def test_classify_live_batches(case: LiveCase) -> None:
    stream = kv.Stream()
    for seq, ts in case.applied:
        stream.applied(kv.Batch(seq, ts, ()))
    assert stream.classify(kv.Batch(*case.batch, ())) == case.verdict


@dataclass(frozen=True)
class ReplayCase:
    id: str
    applied: list[tuple[int, float]]
    replayed: list[tuple[int, float]]
    continues: bool


REPLAY_CASES = [
    ReplayCase("nothing applied yet", [], [(0, 1.0)], True),
    ReplayCase("starts at the last applied batch", [(3, 1.0)], [(3, 1.0), (4, 2.0)], True),
    ReplayCase("the last batch is another one: restarted", [(3, 1.0)], [(3, 7.0)], False),
    ReplayCase("empty: the new engine has not got that far", [(3, 1.0)], [], False),
    ReplayCase("starts later: the buffer rolled past it", [(3, 1.0)], [(9, 5.0)], False),
]


@pytest.mark.parametrize("case", REPLAY_CASES, ids=[c.id for c in REPLAY_CASES])
def test_a_replay_continues_what_was_applied(case: ReplayCase) -> None:
    stream = kv.Stream()
    for seq, ts in case.applied:
        stream.applied(kv.Batch(seq, ts, ()))
    assert stream.replay_start() == (case.applied[-1][0] if case.applied else 0)
    assert stream.continues([kv.Batch(s, t, ()) for s, t in case.replayed]) == case.continues


# -- requests -> /tokenize --------------------------------------------------------------------


@dataclass(frozen=True)
class TokenizeCase:
    id: str
    path: str
    body: dict[str, Any]
    expected: dict[str, Any] | list[int] | None


MSGS = [{"role": "user", "content": "hi"}]
TOKENIZE_CASES = [
    TokenizeCase("completion", "/v1/completions", {"model": "m", "prompt": "abc", "n": 2},
                 {"model": "m", "prompt": "abc"}),
    TokenizeCase("a one-prompt list", "/v1/completions", {"model": "m", "prompt": ["abc"]},
                 {"model": "m", "prompt": "abc"}),
    TokenizeCase("special tokens passed on", "/v1/completions",
                 {"model": "m", "prompt": "abc", "add_special_tokens": False},
                 {"model": "m", "prompt": "abc", "add_special_tokens": False}),
    TokenizeCase("token ids need no engine", "/v1/completions",
                 {"model": "m", "prompt": [5, 6, 7]}, [5, 6, 7]),
    TokenizeCase("a batch of prompts: not keyed", "/v1/completions",
                 {"model": "m", "prompt": ["a", "b"]}, None),
    TokenizeCase("no prompt", "/v1/completions", {"model": "m"}, None),
    TokenizeCase("chat, with what changes its template", "/v1/chat/completions",
                 {"model": "m", "messages": MSGS, "tools": [{"type": "function"}],
                  "chat_template_kwargs": {"x": 1}, "temperature": 0},
                 {"model": "m", "messages": MSGS, "tools": [{"type": "function"}],
                  "chat_template_kwargs": {"x": 1}}),
    TokenizeCase("chat without messages", "/v1/chat/completions", {"model": "m"}, None),
]


@pytest.mark.parametrize("case", TOKENIZE_CASES, ids=[c.id for c in TOKENIZE_CASES])
def test_tokenize_body(case: TokenizeCase) -> None:
    assert kv.tokenize_body(case.path, case.body) == case.expected


def test_events_endpoints_from_the_engine_url() -> None:
    ports = kv.EventPorts(6001, 6002, kv.parse_engine_ports(["127.0.0.1:9000=7000",
                                                             "http://h:1=7100:7200"]))
    assert ports.endpoints("http://10.1.2.3:8000") == ("tcp://10.1.2.3:6001",
                                                        "tcp://10.1.2.3:6002")
    assert ports.endpoints("http://[fd00::5]:8000")[0] == "tcp://[fd00::5]:6001"
    assert ports.endpoints("http://127.0.0.1:9000") == ("tcp://127.0.0.1:7000",
                                                         "tcp://127.0.0.1:7001")
    assert ports.endpoints("http://h:1") == ("tcp://h:7100", "tcp://h:7200")


@pytest.mark.parametrize("item", ["http://h:1", "=5557", "http://h:1=x", "http://h:1=0",
                                  "http://h:1=5557:70000"])
def test_bad_per_engine_ports(item: str) -> None:
    with pytest.raises(ValueError, match="expected URL=PORT"):
        kv.parse_engine_ports([item])


# -- real sockets: a publisher with vLLM's framing ---------------------------------------------


@dataclass
class Publisher:
    """vLLM's ZmqEventPublisher on the wire: PUB (topic, seq, payload) and a ROUTER that
    replays the buffered batches from a requested seq, then the end marker."""

    host: str = "127.0.0.1"
    events_port: int = field(default_factory=free_port)
    replay_port: int = field(default_factory=free_port)
    buffer: list[tuple[int, bytes]] = field(default_factory=list)
    seq: int = 0
    ts: float = field(default_factory=time.time)

    def start(self) -> None:
        ctx = zmq.asyncio.Context.instance()
        self.pub = ctx.socket(zmq.PUB)
        self.pub.bind(f"tcp://{self.host}:{self.events_port}")
        self.router = ctx.socket(zmq.ROUTER)
        self.router.bind(f"tcp://{self.host}:{self.replay_port}")
        self.task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def _serve_replay(self) -> None:
        while True:
            ident, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq, buf in self.buffer:
                if seq >= first:
                    await self.router.send_multipart(
                        [ident, b"", b"kv", seq.to_bytes(8, "big"), buf])
            await self.router.send_multipart(
                [ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

    async def publish(self, *events: VKVCacheEvent, send: bool = True) -> None:
        self.ts += 1.0
        buf = payload(*events, ts=self.ts)
        self.buffer.append((self.seq, buf))
        if send:  # send=False: lost on the way (the subscriber must notice the gap)
            await self.pub.send_multipart([b"kv", self.seq.to_bytes(8, "big"), buf])
        self.seq += 1

    def restart(self) -> None:
        """A new engine process on the same address: sequence from 0, an empty buffer."""
        self.buffer.clear()
        self.seq = 0

    async def stop(self) -> None:
        self.task.cancel()
        self.pub.close(linger=0)
        self.router.close(linger=0)

    @property
    def url(self) -> str:
        return f"http://{self.host}:8000"

    def ports(self) -> kv.EventPorts:
        return kv.EventPorts(self.events_port, self.replay_port)


async def eventually(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def publish_until(pub: Publisher, check: Callable[[], bool], what: str,
                        make: Callable[[], Awaitable[None]]) -> None:
    """A PUB drops what it sends before the subscription arrives (ZMQ's slow joiner): keep
    publishing harmless batches until the subscriber has seen one."""
    deadline = time.monotonic() + 10.0
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await make()
        await asyncio.sleep(0.02)


P1, P2 = toks(100, 3), toks(500, 3)


@pytest.fixture
async def pub() -> Any:
    p = Publisher()
    p.start()
    yield p
    await p.stop()


async def test_replays_what_was_published_before_it_connected(pub: Publisher) -> None:
    await pub.publish(stored([1, 2, 3], P1))
    sub = kv.Subscriber(pub.url, pub.ports())
    sub.start()
    try:
        await eventually(lambda: sub.index.matched(keys_of(P1)) == 3, "the replay")
        # Live batches follow.
        await publish_until(pub, lambda: sub.index.matched(keys_of(P2)) == 3, "live batches",
                            lambda: pub.publish(stored([7, 8, 9], P2)))
        await pub.publish(removed([2]))
        await eventually(lambda: sub.index.matched(keys_of(P1)) == 1, "the removal")
    finally:
        await sub.stop()


async def test_a_gap_is_replayed(pub: Publisher) -> None:
    sub = kv.Subscriber(pub.url, pub.ports())
    sub.start()
    try:
        await publish_until(pub, lambda: sub.stream.last is not None, "a first batch",
                            lambda: pub.publish(AllBlocksCleared()))
        await pub.publish(stored([1, 2, 3], P1), send=False)  # lost on the way
        await pub.publish(stored([7], P2[:4]))
        await eventually(lambda: sub.index.matched(keys_of(P2)) == 1, "the next batch")
        assert sub.index.matched(keys_of(P1)) == 3  # the lost one came from the replay
        assert sub.restarts == 0
    finally:
        await sub.stop()


async def test_a_restarted_engine_starts_an_empty_index(pub: Publisher) -> None:
    sub = kv.Subscriber(pub.url, pub.ports())
    sub.start()
    try:
        await publish_until(pub, lambda: sub.index.matched(keys_of(P1)) == 3, "P1 stored",
                            lambda: pub.publish(stored([1, 2, 3], P1)))
        await pub.publish(stored([7, 8, 9], P2))
        await eventually(lambda: sub.index.matched(keys_of(P2)) == 3, "P2 stored")
        pub.restart()
        await pub.publish(stored([4], P2[:4]))  # seq 0 again, another batch
        await eventually(lambda: sub.restarts == 1, "the restart noticed")
        await eventually(lambda: sub.index.matched(keys_of(P2)) == 1, "the new engine's block")
        assert sub.index.matched(keys_of(P1)) == 0
    finally:
        await sub.stop()


# -- the source --------------------------------------------------------------------------------


@pytest.fixture
async def tokenizer() -> Any:
    """An engine's /tokenize: a character per token; 'slow' never answers in time."""
    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        text = body.get("prompt") or "".join(m["content"] for m in body["messages"])
        if text == "slow":
            await asyncio.sleep(30)
        if text == "broken":
            return web.json_response({"error": "no"}, status=500)
        return web.json_response({"tokens": [ord(c) for c in text], "count": len(text)})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    # 'slow' ends with its client.
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def test_source_keys_prompts_from_the_engines_tokens_and_matches_events(
        pub: Publisher, tokenizer: str) -> None:
    text = "abcdefghijkl"  # three blocks of 4 tokens
    tokens = [ord(c) for c in text]
    source = kv.KvEventsSource(pub.ports(), tokenize_timeout_s=1.0)
    # One engine: its HTTP server (/tokenize) and its events publisher share its address.
    url = tokenizer
    source.attach(lambda: None, lambda: [url], sync_interval_s=0)
    try:
        await publish_until(pub, lambda: source.engine_block_size() == BS, "the block size",
                            lambda: pub.publish(stored([1, 2], tokens[:8])))
        prompt = await source.prompt_keys("/v1/completions", {"model": "m", "prompt": text})
        assert prompt is not None and prompt.block_tokens == BS and len(prompt.keys) == 3
        assert source.matched_blocks(prompt, [url, "http://other:8000"], 0.0) == [2, 0]
        # Sent to the other engine: it counts as holding it until the pending entry expires.
        source.record(prompt, "http://other:8000", now=0.0)
        assert source.matched_blocks(prompt, [url, "http://other:8000"], 1.0) == [2, 3]
        assert source.matched_blocks(prompt, ["http://other:8000"],
                                     kv.PENDING_TTL_S + 1) == [0]
        chat = await source.prompt_keys("/v1/chat/completions",
                                        {"model": "m", "messages": [{"role": "user",
                                                                     "content": text}]})
        assert chat == prompt
        for failing in ("broken", "slow"):  # route on load
            assert await source.prompt_keys("/v1/completions",
                                            {"model": "m", "prompt": failing}) is None
        source.forget(url)
        assert source.matched_blocks(prompt, [url], 0.0) == [0]
    finally:
        await source.close()


async def test_no_keys_before_any_engine_stored_a_block() -> None:
    source = kv.KvEventsSource()
    assert await source.prompt_keys("/v1/completions", {"model": "m", "prompt": [1] * 99}) \
        is None
    assert source.matched_blocks(PromptKeys((1, 2), BS), ["http://e:8000"], 0.0) == [0]


def test_the_blocks_each_engine_holds_are_exported() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    source = kv.KvEventsSource()
    source.attach(lambda: None, lambda: (), sync_interval_s=0, registry=registry, pool="p")
    sub = kv.Subscriber("http://e:8000", source.ports)
    sub.index.apply(_decoded(stored([1, 2, 3], PROMPT)))
    source.subscribers[sub.url] = sub
    page = generate_latest(registry).decode()
    assert f'{kv.KV_EVENTS_BLOCKS}{{endpoint="http://e:8000",pool="p"}} 3.0' in page


async def test_a_failing_subscriber_starts_over_with_an_empty_index(pub: Publisher) -> None:
    sub = kv.Subscriber(pub.url, pub.ports())
    sub.index.apply(_decoded(stored([1, 2, 3], P1)))  # from before the failure
    failures = 0
    subscribe = sub._subscribe  # the failure is injected there

    async def failing_once() -> None:
        nonlocal failures
        if failures == 0:
            failures += 1
            raise zmq.ZMQError(zmq.EAGAIN, "injected")
        await subscribe()

    sub._subscribe = failing_once
    sub.start()
    try:
        await eventually(lambda: failures == 1 and sub.index.matched(keys_of(P1)) == 0,
                         "the index dropped")
        await publish_until(pub, lambda: sub.index.matched(keys_of(P2)) == 3,
                            "subscribed again", lambda: pub.publish(stored([7, 8, 9], P2)))
    finally:
        await sub.stop()
