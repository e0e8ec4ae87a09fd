"""An engine's prefix cache, as vLLM V1 keeps it (automatic prefix caching); pure, no clock.

vLLM cuts a prompt into blocks and names each full block by a hash chained on its parent's
(`chain_hashes`), so a hash stands for its block and the whole prefix before it. A running
sequence references the cached blocks it uses (a reference count per block); when the count
drops to 0 the block stays cached but becomes free: the next allocation that finds no empty
block evicts the least recently used of them. Cached blocks are therefore not extra memory:
they are free blocks whose content has not been overwritten yet, bounded by the same KV cache
the running sequences allocate from (the scheduler counts them as free; scheduler.py).

One entry is one cache unit: a vLLM block over HTTP (`block_size` tokens, one KV block), or a
trace's hash block in the discrete-event pool (Mooncake's 512 tokens, 32 KV blocks of 16).

`HostTier` is the second tier vLLM's native CPU offloading keeps (`--kv-offloading-size`):
every block the engine computes is also stored in host memory, an LRU bounded by its own size;
a prompt whose prefix runs on past the GPU cache into the host tier loads those blocks back
over PCIe instead of computing them.

What is not modelled: LoRA, multimodal and cache-salt extras in the hash (the simulator serves
one base model, text only); hybrid or sliding-window attention groups.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass

# The parent of a prompt's first block (vLLM seeds it with a random or fixed NONE_HASH).
ROOT_HASH = 0


def block_hash(parent: int, token_ids: Sequence[int]) -> int:
    """A full block's hash: its parent's hash and its token ids (63 bits)."""
    data = parent.to_bytes(8, "big") + array("q", token_ids).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") >> 1


def chain_hashes(token_ids: Sequence[int], block_size: int, parent: int = ROOT_HASH
                 ) -> tuple[int, ...]:
    """The hashes of the prompt's full blocks, each chained on the one before (a partial last
    block has none: vLLM caches full blocks only)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    out = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start:start + block_size])
        out.append(parent)
    return tuple(out)


def leading_run(hashes: Sequence[int], held: Container[int]) -> int:
    """How many of the leading `hashes` are in `held` (a chain's cached prefix)."""
    n = 0
    for h in hashes:
        if h not in held:
            break
        n += 1
    return n


@dataclass(slots=True)
class _Entry:
    blocks: int  # KV blocks it occupies
    refs: int = 0  # running sequences that use it


class PrefixCache:
    """Cached units by hash, reference counted, the unreferenced ones in LRU order.

    `pinned_blocks`: blocks of units some sequence references (not free);
    `evictable_blocks`: blocks of cached units nobody references (free, still hit-able)."""

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # refs == 0, least recent first
        self.pinned_blocks = 0
        self.evictable_blocks = 0
        self.evicted = 0  # units evicted since start

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, h: int) -> bool:
        return h in self._entries

    @property
    def total_blocks(self) -> int:
        return self.pinned_blocks + self.evictable_blocks

    def refs(self, h: int) -> int:
        """References to unit `h` (0 for a cached free unit); KeyError if not cached."""
        return self._entries[h].refs

    def blocks(self, hashes: Iterable[int]) -> int:
        """KV blocks these cached units occupy."""
        return sum(self._entries[h].blocks for h in hashes)

    def lru_order(self) -> list[int]:
        """The unreferenced units, the next to be evicted first."""
        return list(self._lru)

    def match(self, hashes: Sequence[int]) -> int:
        """How many of the leading `hashes` are cached (the longest cached prefix)."""
        return leading_run(hashes, self._entries)

    def acquire(self, hashes: Iterable[int]) -> int:
        """A sequence starts using these cached units; returns the blocks that stopped being
        free (units that nobody referenced)."""
        taken = 0
        for h in hashes:
            e = self._entries[h]
            if e.refs == 0:
                del self._lru[h]
                self.evictable_blocks -= e.blocks
                self.pinned_blocks += e.blocks
                taken += e.blocks
            e.refs += 1
        return taken

    def release(self, hashes: Iterable[int]) -> int:
        """A sequence stops using these units (pass them last first, as vLLM frees a request's
        blocks: its tail is then evicted before its head); returns the blocks that became free
        (and stay cached)."""
        freed = 0
        for h in hashes:
            e = self._entries[h]
            e.refs -= 1
            if e.refs == 0:
                self._lru[h] = None
                self.pinned_blocks -= e.blocks
                self.evictable_blocks += e.blocks
                freed += e.blocks
        return freed

    def insert(self, h: int, blocks: int) -> bool:
        """A sequence computed unit `h` in `blocks` blocks of its own: they become the cached
        unit, referenced by that sequence. False (nothing changes) if `h` is cached already:
        vLLM keeps such a duplicate block private to its sequence."""
        if h in self._entries:
            return False
        self._entries[h] = _Entry(blocks, 1)
        self.pinned_blocks += blocks
        return True

    def evict(self, blocks: int) -> int:
        """Evict least-recently-used free units until `blocks` blocks are empty again; returns
        the blocks evicted (whole units: possibly more than asked)."""
        freed = 0
        while freed < blocks and self._lru:
            h, _ = self._lru.popitem(last=False)
            e = self._entries.pop(h)
            self.evictable_blocks -= e.blocks
            freed += e.blocks
            self.evicted += 1
        return freed

    def clear(self) -> None:
        """Drop every free unit (vLLM's reset_prefix_cache); referenced units stay."""
        self.evict(self.evictable_blocks)


class HostTier:
    """The CPU offload tier: cached units by hash in host memory, bounded by `capacity_blocks`
    KV blocks, least recently stored or loaded evicted first. Write-through: the engine stores
    each unit it computes (vLLM's OffloadingConnector stores every full block a request
    computes), so the tier holds what the GPU cache evicted as long as host memory lasts."""

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be positive, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[int, int] = OrderedDict()  # hash -> blocks, least recent first
        self.used_blocks = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, h: int) -> bool:
        return h in self._lru

    def match(self, hashes: Sequence[int]) -> int:
        """How many of the leading `hashes` the tier holds."""
        return leading_run(hashes, self._lru)

    def touch(self, hashes: Iterable[int]) -> None:
        """These units were loaded back: they become the most recent."""
        for h in hashes:
            if h in self._lru:
                self._lru.move_to_end(h)

    def store(self, h: int, blocks: int) -> None:
        """Keep unit `h` (a unit larger than the whole tier is not kept)."""
        if h in self._lru:
            self._lru.move_to_end(h)
            return
        if blocks > self.capacity_blocks:
            return
        self._lru[h] = blocks
        self.used_blocks += blocks
        while self.used_blocks > self.capacity_blocks:
            _, b = self._lru.popitem(last=False)
            self.used_blocks -= b
            self.evicted += 1
