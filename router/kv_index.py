"""The pure half of the precise prefix source: vLLM's KV-events wire format, the router's
block keys, one engine's index and the sequence bookkeeping that says what to do with a batch.

No I/O: `poolpilot.router.kv_events` (the subscribers and the source) feeds it what the
engines publish; its docstring describes the protocol.
"""


from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from hashlib import blake2b
from typing import Any

import msgspec

RECENT_BATCHES = 4096  # (seq -> ts) remembered to tell a duplicate from a restart
END_SEQ = -1  # the replay's end marker (8 signed bytes)

# -------------------------------------------------------------------------------------------
# Wire format (pure)

Hash = int | bytes


class BlockStored(msgspec.Struct, tag=True, gc=False):
    block_hashes: list[Hash]
    parent_block_hash: Hash | None = None
    token_ids: list[int] = []
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class BlockRemoved(msgspec.Struct, tag=True, gc=False):
    block_hashes: list[Hash]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, gc=False):
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


class _Batch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]  # decoded one by one: an event type this router does not know
    data_parallel_rank: int | None = None  # is skipped, not the whole batch


_batch_decoder = msgspec.msgpack.Decoder(_Batch)
_event_decoder: msgspec.msgpack.Decoder[Event] = msgspec.msgpack.Decoder(Event)


@dataclass(frozen=True, slots=True)
class Batch:
    seq: int
    ts: float
    events: tuple[Event, ...]
    unknown: int = 0  # events of types (or shapes) this router does not decode


class WireError(ValueError):
    """A message that is not vLLM's KV events framing or payload."""


def decode_payload(seq: int, payload: bytes) -> Batch:
    try:
        raw = _batch_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireError(f"batch {seq}: not an EventBatch ({exc})") from exc
    events: list[Event] = []
    unknown = 0
    for item in raw.events:
        try:
            events.append(_event_decoder.decode(item))
        except (msgspec.DecodeError, msgspec.ValidationError):
            unknown += 1
    return Batch(seq, raw.ts, tuple(events), unknown)


def _seq(frame: bytes) -> int:
    if len(frame) != 8:
        raise WireError(f"sequence frame of {len(frame)} bytes, not 8")
    return int.from_bytes(frame, "big", signed=True)


def decode_live(frames: Sequence[bytes]) -> Batch:
    """A PUB message: (topic, seq, payload)."""
    if len(frames) != 3:
        raise WireError(f"live message of {len(frames)} frames, not 3 (topic, seq, payload)")
    seq = _seq(frames[1])
    return decode_payload(seq, frames[2])


def decode_replay(frames: Sequence[bytes]) -> Batch | None:
    """A replay answer on a DEALER socket: (empty, topic, seq, payload); None at the end."""
    if len(frames) != 4 or frames[0] != b"":
        raise WireError(f"replay answer of {len(frames)} frames, not 4 (empty, topic, seq, "
                        "payload)")
    seq = _seq(frames[2])
    if seq == END_SEQ:
        return None
    return decode_payload(seq, frames[3])


def replay_request(start: int) -> list[bytes]:
    """What a DEALER sends the ROUTER for the batches from `start` on."""
    return [b"", max(0, start).to_bytes(8, "big")]


# -------------------------------------------------------------------------------------------
# Keys (pure)

ROOT_KEY = blake2b(b"poolpilot kv events", digest_size=8).digest()


def block_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    """A block's key: its token ids, hashed keyed by the key of the block before it."""
    return blake2b(array("q", tokens).tobytes(), digest_size=8, key=parent).digest()


def chain_keys(tokens: Sequence[int], block_size: int, parent: bytes = ROOT_KEY) -> list[bytes]:
    """Keys of the full blocks of `tokens` (a partial last block is not cached by vLLM)."""
    keys = []
    for end in range(block_size, len(tokens) + 1, block_size):
        parent = block_key(parent, tokens[end - block_size: end])
        keys.append(parent)
    return keys


def key_int(key: bytes) -> int:
    return int.from_bytes(key, "little")


# -------------------------------------------------------------------------------------------
# One engine's index (pure)


@dataclass
class EngineIndex:
    """What one engine holds: vLLM block hash -> (the router's key, media holding it)."""

    block_size: int | None = None  # learnt from the first stored block (or given)
    by_hash: dict[Hash, tuple[int, set[str | None]]] = field(default_factory=dict)
    keys: dict[int, int] = field(default_factory=dict)  # key -> vLLM hashes mapping to it
    skipped: int = 0  # stored blocks not indexed (see the module doc)

    def clear(self) -> None:
        self.by_hash.clear()
        self.keys.clear()

    def apply(self, event: Event) -> None:
        if isinstance(event, BlockStored):
            self._stored(event)
        elif isinstance(event, BlockRemoved):
            self._removed(event)
        else:
            self.clear()

    def _parent_key(self, parent: Hash | None) -> bytes | None:
        if parent is None:
            return ROOT_KEY
        entry = self.by_hash.get(parent)
        return None if entry is None else entry[0].to_bytes(8, "little")

    def _stored(self, e: BlockStored) -> None:
        n = len(e.block_hashes)
        size = e.block_size
        if self.block_size is None and size > 0:
            self.block_size = size
        parent = self._parent_key(e.parent_block_hash)
        if (e.group_idx not in (None, 0) or e.lora_name is not None or e.lora_id is not None
                or size != self.block_size or len(e.token_ids) != n * size or parent is None):
            self.skipped += n
            return
        extra = e.extra_keys or []
        for i, h in enumerate(e.block_hashes):
            if i < len(extra) and extra[i]:  # this block's hash takes more than its tokens
                self.skipped += n - i
                return
            parent = block_key(parent, e.token_ids[i * size: (i + 1) * size])
            key = key_int(parent)
            entry = self.by_hash.get(h)
            if entry is None:
                self.by_hash[h] = (key, {e.medium})
                self.keys[key] = self.keys.get(key, 0) + 1
            else:
                entry[1].add(e.medium)

    def _removed(self, e: BlockRemoved) -> None:
        if e.group_idx not in (None, 0):
            return
        for h in e.block_hashes:
            entry = self.by_hash.get(h)
            if entry is None:
                continue
            key, media = entry
            if e.medium is None:
                media.clear()
            else:
                media.discard(e.medium)
            if media:
                continue
            del self.by_hash[h]
            left = self.keys[key] - 1
            if left:
                self.keys[key] = left
            else:
                del self.keys[key]

    def matched(self, keys: Sequence[int]) -> int:
        """How many of a prompt's leading keys this engine holds."""
        n = 0
        for k in keys:
            if k not in self.keys:
                break
            n += 1
        return n


# -------------------------------------------------------------------------------------------
# Sequence bookkeeping (pure): what to do with a batch, given what was applied before


class Live(StrEnum):
    APPLY = "apply"  # the next batch (or the first one seen)
    DUPLICATE = "duplicate"  # already applied (replay and live delivery overlap)
    RESTART = "restart"  # the sequence went backwards: a new engine process
    GAP = "gap"  # batches were missed (dropped at the high-water mark, or while away)


@dataclass
class Stream:
    """The sequence of batches applied to one index."""

    last: int | None = None
    recent: OrderedDict[int, float] = field(default_factory=OrderedDict)  # seq -> ts

    def classify(self, batch: Batch) -> Live:
        if self.last is None or batch.seq == self.last + 1:
            return Live.APPLY
        if batch.seq > self.last:
            return Live.GAP
        return Live.DUPLICATE if self.recent.get(batch.seq) == batch.ts else Live.RESTART

    def applied(self, batch: Batch) -> None:
        self.last = batch.seq
        self.recent[batch.seq] = batch.ts
        if len(self.recent) > RECENT_BATCHES:
            self.recent.popitem(last=False)

    def reset(self) -> None:
        self.last = None
        self.recent.clear()

    def replay_start(self) -> int:
        """Ask for the last applied batch again, to check it is still the same one."""
        return 0 if self.last is None else self.last

    def continues(self, replayed: Sequence[Batch]) -> bool:
        """Whether a replay from `replay_start()` continues what was applied: its first batch
        is the last applied one (same seq and ts). Otherwise the engine restarted (its
        sequence restarted below it) or its buffer rolled past it (batches lost)."""
        if self.last is None:
            return True
        return bool(replayed) and replayed[0].seq == self.last \
            and replayed[0].ts == self.recent.get(self.last)


def apply_batch(index: EngineIndex, stream: Stream, batch: Batch) -> None:
    for event in batch.events:
        index.apply(event)
    stream.applied(batch)
