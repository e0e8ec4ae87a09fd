"""Continuous-batching scheduler, after vLLM v1's (FCFS policy, chunked prefill always on).

Each step:
1. Running sequences first, in admission order: each asks for its remaining tokens (the rest
   of its prompt, chunked to the token budget, or 1 for decode). If the KV blocks for them are
   not free, the newest running sequence is preempted (recompute: its blocks are freed and it
   goes back to the head of the waiting queue, keeping the tokens it generated) until they
   are, or until the sequence itself is the one preempted.
2. If nobody was preempted, waiting sequences are admitted in FIFO order while the token
   budget (max_num_batched_tokens), the sequence cap (max_num_seqs) and free KV blocks allow;
   the head of the queue blocks the rest (no overtaking). A sequence whose KV comes from a
   remote prefill engine (do_remote_prefill) only needs blocks: it moves to LOADING and
   becomes runnable once its transfer is done, with all prompt tokens but the last computed.

A sequence samples a token in every step that computes its last known token; it finishes
when it has generated `max_output` tokens, and its blocks are freed at once (or held for a
remote decode engine to pull, on a prefill engine).

Prefix caching (vLLM V1's, on by default; prefix_cache.py): a sequence carries its prompt's
cache units (`block_hashes`, each for `hash_block_tokens` prompt tokens). When it is admitted
its longest cached prefix is marked computed (never the prompt's last token: vLLM computes it
to sample from it, and hits whole KV blocks only), so the step charges only the new tokens,
which still attend to the whole context (the step model prices a chunk by its tokens and the
context before it). Every unit it computes becomes cached. `free_blocks` counts cached units
nobody references as free: an allocation that finds no empty block evicts the least recently
used of them. A preempted or finished sequence drops its references; the units stay cached.
A sequence whose KV comes from a remote prefill engine looks up its local cache too (only
the rest is transferred, as vLLM's NixlConnector does) and caches the blocks it receives.

CPU offload tier (`host_blocks` > 0; prefix_cache.HostTier): each unit computed is also stored
in host memory. A sequence whose cached prefix runs on past the GPU cache into the host tier
allocates blocks for those units and waits in LOADING while they are copied back (the engine
prices the copy); vLLM counts those tokens as external prefix-cache hits. Then it computes
the rest of its prompt like any other. Sequences with remote KV do not look up the host tier.

The scheduler is pure: no clock, no I/O. The engine core (engine.py) prices steps and keeps
time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .prefix_cache import HostTier, PrefixCache


class SeqState(Enum):
    WAITING = "waiting"
    LOADING = "loading"  # blocks allocated, KV arriving from a remote prefill engine
    READY = "ready"  # KV arrived; runs at the next step
    RUNNING = "running"
    FINISHED = "finished"


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@dataclass(eq=False)
class Seq:
    """One request inside an engine."""

    rid: Any
    prompt: int
    max_output: int
    arrival: float
    remote_prefill: bool = False  # decode side of P/D: KV for the prompt comes from elsewhere
    hold_kv: bool = False  # prefill side of P/D: keep blocks until the decode side pulls them
    finish_reason: str = "length"  # "length" when max_output is max_tokens, else "stop"
    xfer_time: float | None = None  # remote KV transfer time (set by the engine if None)
    payload: Any = None  # the caller's own data (HTTP stream, DES bookkeeping)
    # Prompt cache units (chained hashes; unit i covers prompt tokens [i*T, (i+1)*T) with
    # T = hash_block_tokens, 0: the scheduler's block_size); () = nothing to look up or cache.
    block_hashes: tuple[int, ...] = ()
    hash_block_tokens: int = 0

    state: SeqState = SeqState.WAITING
    computed: int = 0  # tokens whose KV is in the cache
    generated: int = 0
    blocks: int = 0  # KV blocks it spans, the shared cached ones included
    shared_blocks: int = 0  # of those, blocks of cache units it references
    cached: list[int] = field(default_factory=list)  # the cache units it references
    cache_next: int = 0  # index of the next unit to cache once computed
    prefix_hit: int = 0  # prompt tokens its last admission found cached
    host_hit: int = 0  # prompt tokens past prefix_hit it loads from the CPU offload tier
    preemptions: int = 0
    ready_at: float = 0.0
    first_scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    # Global step indices (into the engine's step log) of the steps that sampled a token.
    token_steps: list[list[int]] = field(default_factory=list)

    @property
    def context(self) -> int:
        """Tokens known: prompt plus generated (the last one's KV is not computed yet)."""
        return self.prompt + self.generated


@dataclass
class StepPlan:
    items: list[tuple[Seq, int]]  # (sequence, tokens to compute this step)
    preempted: list[Seq] = field(default_factory=list)
    admitted: list[Seq] = field(default_factory=list)  # from the waiting queue
    resumed: list[Seq] = field(default_factory=list)  # remote KV arrived, runs from now
    loading: list[Seq] = field(default_factory=list)  # started a remote KV load this step
    all_decode: bool = True  # every item computes exactly its last token


class Scheduler:
    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 256,
        enable_prefix_caching: bool = True,
        host_blocks: int = 0,
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        if max_num_batched_tokens <= 0 or max_num_seqs <= 0:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.free_blocks = num_blocks
        self.waiting: deque[Seq] = deque()
        self.ready: deque[Seq] = deque()
        self.loading: list[Seq] = []
        self.running: list[Seq] = []
        self.held: dict[Any, Seq] = {}  # finished prefill-side sequences holding their KV
        self.num_preemptions = 0
        self.cache = PrefixCache()
        self.enable_prefix_caching = enable_prefix_caching
        # vLLM's prefix-cache stats: prompt tokens of new (not preempted) requests looked up,
        # and those found cached
        self.prefix_queries = 0
        self.prefix_hits = 0
        # the CPU offload tier, and vLLM's external prefix-cache stats for it
        self.host = HostTier(host_blocks) if host_blocks > 0 and enable_prefix_caching else None
        self.external_queries = 0
        self.external_hits = 0

    # ---- queue ----
    def add(self, seq: Seq) -> None:
        seq.state = SeqState.WAITING
        self.waiting.append(seq)

    def fits_ever(self, seq: Seq) -> bool:
        return blocks_for(seq.prompt + seq.max_output, self.block_size) <= self.num_blocks

    @property
    def num_waiting(self) -> int:
        """vLLM counts requests waiting for remote KV as waiting."""
        return len(self.waiting) + len(self.loading) + len(self.ready)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks

    def has_work(self) -> bool:
        return bool(self.running or self.ready or self.waiting)

    def num_unfinished(self) -> int:
        return len(self.running) + self.num_waiting

    # ---- blocks ----
    def _grow(self, seq: Seq, tokens: int) -> bool:
        if tokens <= seq.blocks * self.block_size:
            return True
        need = blocks_for(tokens, self.block_size) - seq.blocks
        if need <= 0:
            return True
        if need > self.free_blocks:
            return False
        self.take(need)
        seq.blocks += need
        return True

    def take(self, blocks: int) -> None:
        """Allocate `blocks` free blocks (the caller checked they are): empty ones first, then
        the least recently used cached units nobody references, evicted."""
        self.free_blocks -= blocks
        over = self.cache.evictable_blocks - self.free_blocks
        if over > 0:
            self.cache.evict(over)

    def free(self, seq: Seq) -> None:
        self.free_blocks += seq.blocks - seq.shared_blocks
        if seq.cached:
            self.free_blocks += self.cache.release(reversed(seq.cached))
            seq.cached = []
        seq.blocks = seq.shared_blocks = seq.cache_next = 0

    # ---- prefix cache ----
    def _unit(self, seq: Seq) -> int:
        return seq.hash_block_tokens or self.block_size

    def _lookup(self, seq: Seq) -> None:
        """Start `seq` from its longest cached prefix (before it allocates anything): its
        first units are referenced and their tokens computed (_unlookup undoes it)."""
        hashes = seq.block_hashes
        if not self.enable_prefix_caching or not hashes or seq.cached:
            return
        seq.prefix_hit = seq.host_hit = 0  # a preempted sequence looks up again
        k = self.cache.match(hashes)
        unit, bs = self._unit(seq), self.block_size
        last = (seq.prompt - 1) // bs * bs  # whole KV blocks, never the last prompt token
        if self.host is not None and not seq.remote_prefill:
            j = self.host.match(hashes[k:])
            if j:
                seq.host_hit = max(0, min((k + j) * unit, seq.prompt, last) - k * unit)
        if k == 0:
            return
        hit = min(k * unit, seq.prompt, last)
        k = min(k, -(-hit // unit))
        if hit <= 0 or k <= 0:
            seq.host_hit = 0  # the host units would not start on a unit boundary
            return
        use = hashes[:k]
        taken = self.cache.acquire(use)
        self.free_blocks -= taken
        seq.cached = list(use)
        seq.shared_blocks = seq.blocks = self.cache.blocks(use)
        seq.cache_next = k
        seq.computed = hit
        seq.prefix_hit = hit

    def _unlookup(self, seq: Seq) -> None:
        """Undo _lookup for a sequence that could not be admitted after all."""
        if seq.cached:
            self.free_blocks += self.cache.release(reversed(seq.cached))
            seq.cached = []
        seq.blocks = seq.shared_blocks = seq.cache_next = seq.computed = seq.prefix_hit = 0
        seq.host_hit = 0

    def _count_query(self, seq: Seq) -> None:
        if self.enable_prefix_caching and seq.preemptions == 0:
            self.prefix_queries += seq.prompt
            self.prefix_hits += seq.prefix_hit
            if self.host is not None and not seq.remote_prefill:
                self.external_queries += seq.prompt - seq.prefix_hit
                self.external_hits += seq.host_hit

    def cache_computed(self, seq: Seq) -> None:
        """Cache the units of `seq`'s prompt that it has computed since the last call."""
        hashes = seq.block_hashes
        if seq.cache_next >= len(hashes) or not self.enable_prefix_caching:
            return
        unit, bs = self._unit(seq), self.block_size
        while seq.cache_next < len(hashes):
            i = seq.cache_next
            start = i * unit
            end = min(start + unit, seq.prompt)
            if end <= start or seq.computed < end:
                return
            blocks = blocks_for(end, bs) - blocks_for(start, bs)
            if self.cache.insert(hashes[i], blocks):
                seq.cached.append(hashes[i])
                seq.shared_blocks += blocks
            if self.host is not None:
                self.host.store(hashes[i], blocks)
            seq.cache_next = i + 1

    def release_held(self, rid: Any) -> Seq | None:
        seq = self.held.pop(rid, None)
        if seq is not None:
            self.free(seq)
        return seq

    def _preempt(self, seq: Seq) -> None:
        self.free(seq)
        seq.computed = 0
        seq.state = SeqState.WAITING
        seq.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    # ---- one step ----
    def schedule(self, now: float = 0.0,
                 chunk_limit: Callable[[Seq], int] | None = None) -> StepPlan:
        """Choose this step's work. Moves sequences between queues and allocates blocks.

        chunk_limit: prompt tokens this step may prefill in all (within the token budget),
        asked once, with the first sequence that has more than one token to compute: a
        decode engine sizes it from its ITL headroom so that the running batch keeps its
        inter-token latency. None: the token budget alone (vLLM's behaviour)."""
        budget = self.max_num_batched_tokens
        prefill_left = -1  # chunk_limit's answer once asked (-1: not yet)
        plan = StepPlan(items=[])
        # Sequences whose remote KV arrived are already allocated: they join the running set.
        while self.ready and len(self.running) < self.max_num_seqs:
            seq = self.ready.popleft()
            seq.state = SeqState.RUNNING
            self.running.append(seq)
            plan.resumed.append(seq)
        i = 0
        running = self.running
        items = plan.items
        bs = self.block_size
        all_decode = True
        while i < len(running) and budget > 0:
            seq = running[i]
            n = seq.prompt + seq.generated - seq.computed
            if n > budget:
                n = budget
                all_decode = False
            elif n != 1:
                all_decode = False
            if n > 1 and chunk_limit is not None:
                if prefill_left < 0:
                    prefill_left = max(0, chunk_limit(seq))
                n = min(n, prefill_left)
                if n == 0:  # no prefill room left this step; decode sequences still run
                    i += 1
                    continue
                prefill_left -= n
            if seq.computed + n <= seq.blocks * bs:  # fast path: room in its last block
                items.append((seq, n))
                budget -= n
                i += 1
                continue
            while not self._grow(seq, seq.computed + n):
                victim = self.running.pop()
                self._preempt(victim)
                plan.preempted.append(victim)
                if victim is seq:
                    break
            else:
                items.append((seq, n))
                budget -= n
                i += 1
        plan.all_decode = all_decode
        if plan.preempted:
            return plan
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            self._lookup(seq)
            # KV to load before it runs: the host tier's units (then it computes the rest),
            # or a remote prefill engine's whole prompt
            load_to = seq.computed + seq.host_hit if seq.host_hit else (
                seq.prompt if seq.remote_prefill and seq.generated == 0
                and seq.preemptions == 0 else 0)
            if load_to:
                if not self._grow(seq, load_to):
                    self._unlookup(seq)
                    break
                self._count_query(seq)
                self.waiting.popleft()
                seq.state = SeqState.LOADING
                if seq.first_scheduled_at is None:
                    seq.first_scheduled_at = now
                self.loading.append(seq)
                plan.loading.append(seq)
                continue
            n = min(seq.context - seq.computed, budget)
            take = 0
            if n > 1 and chunk_limit is not None:
                if prefill_left < 0:
                    prefill_left = max(0, chunk_limit(seq))
                n = take = min(n, prefill_left)
                if n == 0:
                    self._unlookup(seq)
                    break
            if not self._grow(seq, seq.computed + n):
                self._unlookup(seq)
                break
            prefill_left -= take
            self._count_query(seq)
            self.waiting.popleft()
            seq.state = SeqState.RUNNING
            if seq.first_scheduled_at is None:
                seq.first_scheduled_at = now
            self.running.append(seq)
            plan.admitted.append(seq)
            plan.items.append((seq, n))
            budget -= n
        return plan

    def load_done(self, seq: Seq) -> None:
        """The KV of a LOADING sequence arrived and is cached here, as vLLM caches the blocks
        it receives: from a remote prefill engine, all prompt tokens but the last; from the
        host tier, its units (the rest of the prompt is computed when it runs)."""
        self.loading.remove(seq)
        if seq.host_hit:
            seq.computed += seq.host_hit
            self.cache_computed(seq)
            if self.host is not None:
                self.host.touch(seq.block_hashes[:seq.cache_next])
        else:
            seq.computed = seq.prompt - 1
            self.cache_computed(seq)
        seq.state = SeqState.READY
        self.ready.append(seq)

    def extra_blocks_for_steps(self, seqs: list[Seq], steps: int) -> int:
        """Blocks the decode sequences need to run `steps` more steps (beyond what they hold)."""
        bs = self.block_size
        return sum(max(0, blocks_for(s.computed + steps, bs) - s.blocks) for s in seqs)

    def reserve_steps(self, seqs: list[Seq], steps: int) -> None:
        for s in seqs:
            ok = self._grow(s, s.computed + steps)
            assert ok, "reserve_steps called beyond free blocks"

    def abort(self, seq: Seq) -> None:
        """Drop a request wherever it is (the client went away) and free its blocks."""
        for q in (self.waiting, self.ready):
            if seq in q:
                q.remove(seq)
        for lst in (self.running, self.loading):
            if seq in lst:
                lst.remove(seq)
        self.held.pop(seq.rid, None)
        self.free(seq)
        seq.state = SeqState.FINISHED
        seq.finish_reason = "abort"

    def finish(self, seq: Seq) -> None:
        self.running.remove(seq)
        seq.state = SeqState.FINISHED
        if seq.hold_kv:
            self.held[seq.rid] = seq
        else:
            self.free(seq)
