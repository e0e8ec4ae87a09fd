"""Engine core: the scheduler plus the step-time model plus vLLM's metrics; pure, no clock.

The caller owns time. `plan(now)` picks the next piece of work starting at `now` (or when the
previous step ends) and prices it; `commit(chunk)` applies it. A chunk is one step, or - when
the batch is pure decode and nothing can join it - up to `max_chunk_steps` identical decode
steps priced at once (their durations grow with the KV they read). Nothing can join such a
run until a sequence finishes (the chunk ends there) or something arrives from outside
(arrival, a remote KV load completing): then the caller `truncate`s the chunk at the step in
flight. This is what makes hour-long traces cheap: work is per event, not per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from poolpilot import metrics as m
from poolpilot.roles import ENGINE_ROLES, Role

from .hardware import StepModel
from .scheduler import Scheduler, Seq, SeqState
from .stats import GAUGES, EngineStats, MetricsSnapshot

# Older names of the aggregated engine, still accepted (`--role aggregated` is what earlier
# launchers and pod specs pass).
ROLE_ALIASES = {"aggregated": Role.ENGINE, "both": Role.ENGINE}


def canonical_role(role: str) -> Role:
    r = ROLE_ALIASES.get(role, role)
    if r not in ENGINE_ROLES:
        raise ValueError(f"unknown role {role!r}; use one of prefill, decode, engine")
    return Role(r)


@dataclass
class EngineConfig:
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None  # default: the model's, capped by the KV cache
    max_chunk_steps: int = 4096
    track_token_steps: bool = True  # keep token step indices (for per-request ITL)
    # Seconds a step may take while the engine prefills besides decoding (a decode engine
    # serving local prefills: the decode role's ITL target). Each step's prompt chunk is the
    # largest that keeps the step within it at the running batch (at least
    # MIN_PREFILL_CHUNK); None: max_num_batched_tokens alone, as vLLM.
    itl_budget: float | None = None
    enable_prefix_caching: bool = True  # vLLM V1's default (scheduler.py, prefix_cache.py)
    # GiB of host memory for the CPU offload tier of the prefix cache (vLLM's
    # --kv-offloading-size, summed over the TP ranks); 0: none, vLLM's default
    kv_offloading_gib: float = 0.0


# A prompt still progresses when the decode batch alone uses the ITL budget.
MIN_PREFILL_CHUNK = 64


@dataclass
class Chunk:
    """Planned work: `ends[i]` is the end time of step i; steps [done:len(ends)) are pending."""

    start: float
    ends: np.ndarray
    items: list[tuple[Seq, int]]
    decode_run: bool  # True: every item is a decode sequence, repeated for len(ends) steps
    preempted: list[Seq] = field(default_factory=list)
    done: int = 0

    @property
    def end(self) -> float:
        return float(self.ends[-1])

    @property
    def steps(self) -> int:
        return len(self.ends)


@dataclass
class ChunkResult:
    """What committing (part of) a chunk produced."""

    end: float
    sampled: list[Seq]  # sequences that sampled at least one token
    first_tokens: list[Seq]
    finished: list[Seq]
    preempted: list[Seq]


class EngineCore:
    def __init__(self, step_model: StepModel, role: str = Role.ENGINE,
                 config: EngineConfig | None = None) -> None:
        self.model = step_model
        self.role = canonical_role(role)
        self.config = config or EngineConfig()
        c = self.config
        plan = step_model.memory_plan(c.gpu_memory_utilization, c.block_size)
        self.memory = plan
        if c.kv_offloading_gib < 0:
            raise ValueError(f"kv_offloading_gib must be >= 0, got {c.kv_offloading_gib}")
        self.sched = Scheduler(plan.num_blocks, c.block_size, c.max_num_batched_tokens,
                               c.max_num_seqs, c.enable_prefix_caching,
                               step_model.host_tier_blocks(c.kv_offloading_gib * 2**30,
                                                           c.block_size))
        limit = min(step_model.model.max_position, plan.kv_tokens)
        if c.max_model_len is not None and c.max_model_len > limit:
            raise ValueError(
                f"max_model_len {c.max_model_len} exceeds what {step_model.model.name} on "
                f"{step_model.tp} x {step_model.gpu.name} can hold ({limit} tokens: the model's "
                f"context or the KV cache); lower --max-model-len"
            )
        self.max_model_len = c.max_model_len or limit
        self.stats = EngineStats()
        self.busy_until = 0.0
        self._ends = np.zeros(1024)  # step end times (a growing log; see token_times)
        self._n_ends = 0
        self.chunk: Chunk | None = None
        self.steps_run = 0
        self.started_loads: list[Seq] = []  # remote KV loads begun; the caller drains it
        self._aborts: list[Seq] = []
        # Every step takes this many times its priced time: a fault injected from outside
        # (POST /sim/fault, the sandbox's "slow engine" chaos), 1 otherwise. It applies from
        # the next chunk planned; the one in flight keeps its times.
        self.slowdown = 1.0

    # ---- requests ----
    def validate(self, prompt: int, max_output: int) -> str | None:
        """None if acceptable; else vLLM's 400 message."""
        n = self.max_model_len
        if max_output < 1:
            return f"max_tokens must be at least 1, got {max_output}"
        if prompt >= n or prompt <= 0:
            return (f"This model's maximum context length is {n} tokens. However, your request "
                    f"has {prompt} input tokens. Please reduce the length of the input messages.")
        if prompt + max_output > n:
            return (f"'max_tokens' or 'max_completion_tokens' is too large: {max_output}. This "
                    f"model's maximum context length is {n} tokens and your request has "
                    f"{prompt} input tokens ({max_output} > {n} - {prompt}).")
        return None

    def add(self, seq: Seq) -> None:
        self.sched.add(seq)

    def abort(self, seq: Seq) -> None:
        """Abort between steps (as vLLM does): at once if idle, else before the next plan."""
        if seq.state is SeqState.FINISHED and seq.rid not in self.sched.held:
            return
        if self.chunk is None:
            self._abort_now(seq)
        else:
            self._aborts.append(seq)

    def _abort_now(self, seq: Seq) -> None:
        if seq.state is not SeqState.FINISHED:
            self.stats.success["abort"] += 1  # vLLM counts them, finished_reason="abort"
        self.sched.abort(seq)

    def has_work(self) -> bool:
        return self.sched.has_work()

    def next_load_at(self) -> float | None:
        return min((s.ready_at for s in self.sched.loading), default=None)

    def complete_loads(self, now: float) -> list[Seq]:
        done = [s for s in self.sched.loading if s.ready_at <= now]
        for s in done:
            self.sched.load_done(s)
            if s.remote_prefill:
                self.stats.histograms[m.VLLM_NIXL_XFER_TIME].observe(s.xfer_time or 0.0)
        return done

    def release_held(self, rid: Any) -> Seq | None:
        return self.sched.release_held(rid)

    def next_expiry(self, timeout: float) -> float | None:
        return min((s.finished_at + timeout for s in self.sched.held.values()
                    if s.finished_at is not None), default=None)

    def expire_held(self, now: float, timeout: float) -> int:
        old = [rid for rid, s in self.sched.held.items()
               if s.finished_at is not None and now - s.finished_at >= timeout]
        for rid in old:
            self.sched.release_held(rid)
        self.stats.counters[m.VLLM_NIXL_EXPIRED] += len(old)
        return len(old)

    # ---- planning ----
    def plan(self, now: float) -> Chunk | None:
        """Plan the next chunk starting at max(now, end of the previous step)."""
        assert self.chunk is None, "commit the current chunk first"
        start = max(now, self.busy_until)
        for s in self._aborts:
            if s.state is not SeqState.FINISHED or s.rid in self.sched.held:
                self._abort_now(s)
        self._aborts.clear()
        self.complete_loads(start)
        if not self.sched.has_work():
            return None
        limit = self._chunk_limit if self.config.itl_budget is not None else None
        sp = self.sched.schedule(start, limit)
        preempted = list(sp.preempted)
        while not sp.items and (sp.preempted or sp.resumed) and self.sched.has_work():
            # the queues changed without producing work (e.g. a sequence preempted itself to
            # make room): schedule again from the new state
            loading = sp.loading
            sp = self.sched.schedule(start, limit)
            sp.loading = loading + sp.loading
            preempted += sp.preempted
        sp.preempted = preempted
        for s in sp.loading:
            if s.host_hit:
                s.xfer_time = self.model.host_load_time(s.host_hit)
            elif s.xfer_time is None:  # what this engine's own cache holds is not transferred
                s.xfer_time = self.model.kv_transfer_time(s.prompt - s.prefix_hit)
            s.ready_at = start + s.xfer_time
        self.started_loads.extend(sp.loading)
        if sp.preempted:
            self.stats.counters[m.VLLM_PREEMPTIONS] += len(sp.preempted)
        if not sp.items:
            return None  # only remote loads started, or nothing fits until a load completes
        # resumed (remote KV arrived) sequences compute one token like decode: they may join
        # and loads that start do not change the batch (their completion cuts the run)
        decode_run = (self.config.max_chunk_steps > 1 and sp.all_decode and not sp.admitted
                      and not sp.preempted)
        if decode_run:
            seqs = [s for s, _ in sp.items]
            ctx = 0
            k = self.config.max_chunk_steps
            for s in seqs:
                ctx += s.computed
                r = s.max_output - s.generated
                if r < k:
                    k = r
            k = self._run_length(seqs, k)
            durs = self.model.decode_run_times(len(seqs), ctx, k)
        else:
            new = sampled = dec = dec_kv = pre_kv = 0
            pairs = 0.0
            for s, n in sp.items:
                c = s.computed
                new += n
                if n == 1:  # one query token: memory-bound attention over its context
                    dec += 1
                    dec_kv += c
                else:
                    pre_kv += c
                    pairs += n * c + n * (n + 1) / 2
                if c + n == s.prompt + s.generated:
                    sampled += 1
            ch = Chunk(start, np.array([start + self.slowdown * self.model.step_time_from(
                new, sampled, dec, dec_kv, pairs, pre_kv)]), sp.items, False, sp.preempted)
            self.chunk = ch
            return ch
        ends = start + np.cumsum(durs if self.slowdown == 1.0 else durs * self.slowdown)
        ch = Chunk(start, ends, sp.items, decode_run, sp.preempted)
        self.chunk = ch
        return ch

    def _chunk_limit(self, seq: Seq) -> int:
        """Prompt tokens this step may take: the most that keep the step within the ITL
        budget next to the decode batch that runs in it (priced by the step model)."""
        budget = self.config.itl_budget
        assert budget is not None
        batch = context = 0
        for s in self.sched.running:
            if s.computed + 1 == s.context:
                batch += 1
                context += s.computed
        most = min(seq.context - seq.computed, self.config.max_num_batched_tokens)
        chunk = self.model.max_chunk_within(budget, batch, context, seq.computed, most)
        return max(chunk, min(most, MIN_PREFILL_CHUNK))

    def _run_length(self, seqs: list[Seq], k: int) -> int:
        """Most identical decode steps (at most k: the next finish) within free KV blocks."""
        if k <= 1:
            return 1
        # blocks for step 1 are allocated; extend while the extra fits
        free = self.sched.free_blocks
        bs = self.sched.block_size
        need = []
        total = 0
        for s in seqs:
            n = -(-(s.computed + k) // bs) - s.blocks
            if n > 0:
                need.append((s, n))
                total += n
        if total <= free:
            for s, n in need:
                s.blocks += n
            self.sched.take(total)
            return k
        lo, hi = 1, k  # lo fits, hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.sched.extra_blocks_for_steps(seqs, mid) <= free:
                lo = mid
            else:
                hi = mid
        self.sched.reserve_steps(seqs, lo)
        return lo

    def truncate(self, t: float) -> float | None:
        """Something arrives at time t: the chunk stops after the step in flight at t.

        Returns the chunk's new end if it changed, else None."""
        ch = self.chunk
        if ch is None or ch.steps <= 1 or t >= ch.end:
            return None
        j = int(np.searchsorted(ch.ends, t, side="left"))  # first step ending at or after t
        j = max(j, ch.done)
        if j + 1 >= ch.steps:
            return None
        ch.ends = ch.ends[: j + 1]
        return ch.end

    # ---- committing ----
    def commit(self, upto: float | None = None) -> ChunkResult:
        """Apply the chunk's steps that end by `upto` (all of them if None)."""
        ch = self.chunk
        assert ch is not None
        n_end = ch.steps if upto is None else int(np.searchsorted(ch.ends, upto, side="right"))
        n_end = max(n_end, ch.done)
        j = n_end - ch.done
        out = ChunkResult(end=float(ch.ends[n_end - 1]) if n_end else ch.start, sampled=[],
                      first_tokens=[], finished=[],
                      preempted=ch.preempted if ch.done == 0 else [])
        if j > 0:
            if ch.decode_run:
                self._commit_decode_run(ch, ch.done, n_end, out)
            else:
                self._commit_step(ch, out)
            ch.done = n_end
            self.busy_until = out.end
        elif ch.decode_run:
            self._hold_exact([s for s, _ in ch.items], 1)  # observed before its first step ends
        if ch.done >= ch.steps:
            self.chunk = None
        return out

    def _log_steps(self, ends: np.ndarray) -> int:
        first = self._n_ends
        n = len(ends)
        self.steps_run += n
        if not self.config.track_token_steps:  # a long-running server keeps no step log
            return first
        if first + n > len(self._ends):
            grown = np.zeros(max(2 * len(self._ends), first + n))
            grown[:first] = self._ends[:first]
            self._ends = grown
        self._ends[first : first + n] = ends
        self._n_ends = first + n
        return first

    def _commit_decode_run(self, ch: Chunk, a: int, b: int, out: ChunkResult) -> None:
        ends = ch.ends[a:b]
        prev = ch.start if a == 0 else float(ch.ends[a - 1])
        j = b - a
        first_idx = self._log_steps(ends)
        seqs = [s for s, _ in ch.items]
        n = len(seqs)
        itl = self.stats.histograms[m.VLLM_ITL]
        if j > 1:
            itl.observe_many(ends[1:] - ends[:-1], times=n)
        self.stats.counters[m.VLLM_GENERATION_TOKENS] += n * j
        end = float(ends[-1])
        end0 = float(ends[0])
        last_idx = first_idx + j - 1
        track = self.config.track_token_steps
        back_to_back = 0  # sequences whose previous token ended right where this run starts
        live: list[Seq] = []
        in_flight = 1 if b < ch.steps else 0  # the next step of the run is under way
        for s in seqs:
            lt = s.last_token_at
            if lt == prev:
                back_to_back += 1
            elif lt is not None:
                itl.observe(end0 - lt)
            elif s.first_token_at is None:  # a resumed remote-prefill sequence
                s.first_token_at = end0
                out.first_tokens.append(s)
                self.stats.histograms[m.VLLM_TTFT].observe(end0 - s.arrival)
                self.stats.counters[m.VLLM_PROMPT_TOKENS] += s.prompt
            s.computed += j
            s.generated += j
            if s.cache_next < len(s.block_hashes):  # a prompt's last unit, computed in decode
                self.sched.cache_computed(s)
            s.last_token_at = end
            if track:
                ts = s.token_steps
                if ts and ts[-1][1] == first_idx - 1:
                    ts[-1][1] = last_idx
                else:
                    ts.append([first_idx, last_idx])
            if s.generated >= s.max_output:
                self._finish(s, end, out)
            else:
                live.append(s)
        self._hold_exact(live, in_flight)
        if back_to_back:
            itl.observe(end0 - prev, back_to_back)
        out.sampled.extend(seqs)

    def _hold_exact(self, seqs: list[Seq], in_flight: int) -> None:
        """Hold exactly the blocks step-by-step scheduling would hold now (a decode run
        reserves its future blocks up front): KV usage and the next admissions see the same
        cache as without batching. Nothing else allocates in this engine while a chunk is
        planned, so blocks given back here are still free when the run takes them again."""
        bs = self.sched.block_size
        surplus = 0
        for s in seqs:
            exact = -(-(s.computed + in_flight) // bs)
            surplus += s.blocks - exact
            s.blocks = exact
        self.sched.free_blocks += surplus

    def _commit_step(self, ch: Chunk, out: ChunkResult) -> None:
        end = float(ch.ends[0])
        idx = self._log_steps(ch.ends[:1])
        itl = self.stats.histograms[m.VLLM_ITL]
        start = ch.start
        back_to_back = 0
        track = self.config.track_token_steps
        for s, n in ch.items:
            if s.state is not SeqState.RUNNING:
                continue
            s.computed += n
            if s.cache_next < len(s.block_hashes):
                self.sched.cache_computed(s)
            if s.computed < s.context:
                continue  # a prefill chunk that does not reach the end of the prompt
            s.generated += 1
            self.stats.counters[m.VLLM_GENERATION_TOKENS] += 1
            if track:
                ts = s.token_steps
                if ts and ts[-1][1] == idx - 1:
                    ts[-1][1] = idx
                else:
                    ts.append([idx, idx])
            out.sampled.append(s)
            if s.first_token_at is None:
                s.first_token_at = end
                out.first_tokens.append(s)
                self.stats.histograms[m.VLLM_TTFT].observe(end - s.arrival)
                self.stats.counters[m.VLLM_PROMPT_TOKENS] += s.prompt
            elif s.last_token_at == start:
                back_to_back += 1
            elif s.last_token_at is not None:
                itl.observe(end - s.last_token_at)
            s.last_token_at = end
            if s.generated >= s.max_output:
                self._finish(s, end, out)
        if back_to_back:
            itl.observe(end - start, back_to_back)

    def _finish(self, s: Seq, end: float, out: ChunkResult) -> None:
        s.finished_at = end
        self.sched.finish(s)
        out.finished.append(s)
        h = self.stats.histograms
        sched = s.first_scheduled_at if s.first_scheduled_at is not None else s.arrival
        first = s.first_token_at if s.first_token_at is not None else end
        h[m.VLLM_E2E].observe(end - s.arrival)
        h[m.VLLM_QUEUE_TIME].observe(sched - s.arrival)
        h[m.VLLM_PREFILL_TIME].observe(first - sched)
        h[m.VLLM_DECODE_TIME].observe(end - first)
        h[m.VLLM_INFERENCE_TIME].observe(end - sched)
        self.stats.success[s.finish_reason] = self.stats.success.get(s.finish_reason, 0.0) + 1

    # ---- observation ----
    def token_times(self, seq: Seq) -> np.ndarray:
        """End times of the steps in which `seq` sampled its tokens."""
        ts = seq.token_steps
        if not ts:
            return np.zeros(0)
        if len(ts) == 1:
            return self._ends[ts[0][0] : ts[0][1] + 1]
        return np.concatenate([self._ends[a : b + 1] for a, b in ts])

    def load(self) -> int:
        """Requests this engine holds (the router's least-loaded measure)."""
        return self.sched.num_unfinished()

    def kv_usage(self) -> float:
        return self.sched.used_blocks / self.sched.num_blocks

    def gauges(self) -> dict[str, float]:
        g = dict.fromkeys(GAUGES, 0.0)
        g[m.VLLM_RUNNING] = float(self.sched.num_running)
        g[m.VLLM_WAITING] = float(self.sched.num_waiting)
        g[m.VLLM_KV_USAGE] = self.kv_usage()
        return g

    def snapshot(self) -> MetricsSnapshot:
        counters = dict(self.stats.counters)
        counters[m.VLLM_PREFIX_CACHE_QUERIES] = float(self.sched.prefix_queries)
        counters[m.VLLM_PREFIX_CACHE_HITS] = float(self.sched.prefix_hits)
        if self.sched.host is not None:  # (the decode side's NIXL tokens are not counted)
            counters[m.VLLM_EXTERNAL_PREFIX_CACHE_QUERIES] = float(self.sched.external_queries)
            counters[m.VLLM_EXTERNAL_PREFIX_CACHE_HITS] = float(self.sched.external_hits)
        return MetricsSnapshot(counters, dict(self.stats.success), self.gauges(),
                               self.stats.histograms)


def itl_p90(times: np.ndarray) -> float | None:
    """90th percentile of the gaps between token times (numpy's linear interpolation)."""
    n = len(times) - 1
    if n < 1:
        return None
    d = times[1:] - times[:-1]
    pos = 0.9 * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    part = np.partition(d, (lo, hi)) if n > 1 else d
    return float(part[lo] + (part[hi] - part[lo]) * (pos - lo))
