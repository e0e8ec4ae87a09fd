"""Discrete-event simulation of a whole pool: engines, the router's selection, KV handoffs.

No sleeping, no HTTP: the same scheduler and step-time model as the HTTP engine simulator,
driven by an event queue in simulated seconds.

    sim = PoolSim(model="llama-3.1-8b", gpu="h200", mode="disaggregated",
                  prefill_replicas=1, decode_replicas=2)
    sim.submit(SimRequest(id=0, arrival=0.0, prompt_tokens=1000, output_tokens=100))
    sim.run_until(60.0)
    sim.records()                        # one RequestRecord per finished or failed request
    sim.metrics()["decode"].histograms   # vLLM-named, cumulative, per role

Flow (disaggregated): arrival -> router -> least-loaded ready prefill replica (prompt, one
token) -> least-loaded ready decode replica: its blocks are allocated, the prompt's KV moves
over the link (bytes / link bandwidth + latency), then decode runs; the user sees the first
token when the decode engine samples it. Aggregated: one engine does both.

Prefix caching: a request's `hash_ids` (a trace's 512-token blocks) are what each engine's
prefix cache looks up and keeps (scheduler.py, prefix_cache.py): the prefill engine's cache
serves a P/D prompt; the decode engine transfers only what its own cache lacks and caches the
rest on arrival; a local prefill uses its decode engine's cache. `RequestRecord.
prefix_hit_tokens` is what the prefilling engine found cached, in its CPU offload tier too
(`EngineConfig.kv_offloading_gib`); `metrics()` carries vLLM's prefix_cache_queries/hits
counters per role (and per engine with per_replica=True).

Local prefill (`local_prefill=LocalPrefill(ttft_s, itl_s)`, disaggregated only): at each
arrival the router's own rule, `poolpilot.router.local_prefill.decide`, chooses between the
P/D path and prefilling on a decode engine (aggregated there: no KV transfer). It is fed what
the router (router/app.py) feeds it: per ready prefill engine the prompt tokens in flight
there and the prefill throughput learned from completed prefills (`RateEstimate`, seeded from
the step model); per ready decode engine its requests in flight and the prompt tokens it was
given to prefill locally, until their first token; the mixed-step cost is the simulator's own
step model (the router uses the measured H200 table). Decode engines then size each
step's prompt chunk from the ITL budget (`EngineConfig.itl_budget`): the step of a decode batch
plus a prefill chunk is priced as one mixed step.

Routing (`routing="least-loaded"` (default) or `"prefix-aware"`): how the router picks the
prefill engine (P/D), the aggregated engine and, for local prefill, the decode engine. Both
use the router's load measure at prefill and aggregated engines (requests held + the prompt
tokens the router charged them / 512, `Replica.router_load`: the prefix it expected held is
not charged, and the charge goes with the engine's answer). With prefix-aware it is the
router's own rule, `poolpilot.router.prefix_index.choose` (bounded requests, least expected
work), fed each ready engine's load, its requests held and the prompt tokens the router
expects it to hold: its record of where it sent which `hash_ids` (an
`ApproximateIndex` of 512-token blocks, bounded like the router's), recorded when it sends a
request (the real router records on the engine's 2xx, for a prefill at its answer). The
local-prefill rule gets the same expected hits (`cached_tokens`). P/D decode steps go to the
least-loaded decode engine either way; `prefix_choices` counts the choices by reason, as the
router's `poolpilot_router_prefix_choices_total` does.

Replicas: `add_replica(role, ready_at)` serves from `ready_at` (a cold start);
`remove_replica(role)` removes a starting replica at once if there is one, else drains the
least-loaded ready one: it admits nothing new and leaves when its last request finishes.
With no ready replica of a role, requests wait at the router.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from poolpilot.router import local_prefill as lp
from poolpilot.router import prefix_index as pi
from poolpilot.router.prefill_hold import DEFAULT_PREFILL_HOLD_S
from poolpilot.router.prefix_source import PromptKeys

from poolpilot.roles import DISAGGREGATED_ROLES, Mode, Role

from .engine import EngineConfig, EngineCore, canonical_role, itl_p90
from .hardware import StepModel, make_step_model
from .scheduler import Seq
from .stats import MetricsSnapshot, sum_snapshots

# Prompt tokens one of SimRequest.hash_ids stands for unless it says otherwise: a Mooncake
# trace's hash block (poolpilot.engine_sim.traces.MOONCAKE_BLOCK_TOKENS), 32 of the engines'
# 16-token KV blocks (a Qwen-Bailian trace's blocks are 16 tokens, one KV block).
HASH_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class SimRequest:
    id: Any
    arrival: float  # seconds
    prompt_tokens: int
    output_tokens: int
    # The prompt's blocks of `hash_block_tokens` tokens (the last possibly partial), each id
    # standing for its block and the prefix before it: what every engine's prefix cache looks
    # up and keeps. (): nothing shared with any other request.
    hash_ids: tuple[int, ...] = ()
    hash_block_tokens: int = HASH_BLOCK_TOKENS


@dataclass
class RequestRecord:
    """What the user saw for one request (simulated seconds)."""

    id: Any
    arrival: float
    prompt_tokens: int
    output_tokens: int  # generated
    first_token_at: float | None
    finished_at: float | None
    itl_p90: float | None
    ok: bool
    error: str | None = None
    prefill_replica: int | None = None
    decode_replica: int | None = None
    kv_transfer_time: float | None = None
    preemptions: int = 0
    local_prefill: bool = False  # prefilled on its decode engine (the router's fallback)
    # prompt tokens the engine that prefilled it found in its prefix cache (not computed)
    prefix_hit_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.arrival


@dataclass(frozen=True)
class LocalPrefill:
    """The router's local-prefill fallback (router/local_prefill.py's LocalPrefillPolicy,
    whose step cost the simulator supplies)."""

    ttft_s: float  # the pool's TTFT target
    itl_s: float  # the decode role's ITL target: what a mixed step may take
    enter: float = 1.0  # fallback on when the P/D path's prefill wait > enter x ttft_s
    exit: float = 0.5  # off again below exit x ttft_s

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.itl_s > 0):
            raise ValueError(f"local prefill needs ttft_s and itl_s > 0, got {self.ttft_s}, "
                             f"{self.itl_s}")


class _MixedStepCost:
    """lp.StepCost from the step model: `decode_batch` sequences at `context` tokens each."""

    def __init__(self, model: StepModel, context: int) -> None:
        self.model = model
        self.context = context
        self._memo: dict[tuple[int, int], float] = {}

    def step_s(self, decode_batch: int, prefill_chunk: int) -> float:
        key = (decode_batch, prefill_chunk)
        t = self._memo.get(key)
        if t is None:
            t = self._memo[key] = self.model.mixed_step_time(
                decode_batch, decode_batch * self.context, prefill_chunk)
        return t


class ReplicaCounts(NamedTuple):
    ready: int
    starting: int
    draining: int


@dataclass
class Replica:
    id: int
    role: Role
    engine: EngineCore
    ready_at: float
    draining: bool = False
    removed_at: float | None = None
    version: int = 0  # invalidates stale step-done events
    # what a router knows of it: prompt tokens sent to prefill (P/D or local) not yet done
    queued_tokens: int = 0
    # the router's balancer charge: prompt tokens it expected this engine to compute (the
    # prefix it expected held is not work) for prefill and aggregated requests in flight
    charged_tokens: int = 0
    # requests in flight integrated over time (for the bench's load imbalance), kept exactly:
    # the count changes only when a request is added or a step finishes one
    _load_area: float = 0.0
    _load_since: float = 0.0
    _load_now: int = 0

    def is_ready(self, now: float) -> bool:
        return self.ready_at <= now and not self.draining and self.removed_at is None

    def router_load(self) -> float:
        """The router's load measure (router/balancer.py): requests in flight plus the prompt
        tokens charged to it, in 512-token requests."""
        return self.engine.load() + self.charged_tokens / pi.TOKENS_PER_LOAD

    def note_load(self, now: float) -> None:
        """The engine's requests in flight may have changed at `now`."""
        self._load_area += self._load_now * (now - self._load_since)
        self._load_since, self._load_now = now, self.engine.load()

    def load_area(self, now: float) -> float:
        """Requests in flight integrated over simulated time, up to `now`."""
        return self._load_area + self._load_now * (now - self._load_since)


@dataclass
class _Job:
    """A request's journey through the pool."""

    req: SimRequest
    prefill_replica: int | None = None
    decode_replica: int | None = None
    xfer: float | None = None
    preemptions: int = 0
    local: bool = False
    sent_at: float = 0.0  # to the prefill engine ...
    queued_at_send: int = 0  # ... which then had this many prompt tokens to do, its own too
    prefix_hit: int = 0  # prompt tokens the prefill engine's cache served
    charged: int = 0  # prompt tokens the router charged to the prefill/aggregated engine


_ARRIVAL, _READY, _STEP, _LOAD, _HANDOFF = range(5)
ROUTING = ("least-loaded", "prefix-aware")
_MODES = {m.lower(): m for m in Mode}  # `mode` is case-insensitive


class PoolSim:
    """A pool of simulated vLLM engines behind a least-loaded router."""

    def __init__(
        self,
        model: str = "llama-3.1-8b",
        gpu: str = "h200",
        tensor_parallel: int = 1,
        mode: Mode | str = Mode.DISAGGREGATED,
        prefill_replicas: int = 1,
        decode_replicas: int = 1,
        engine_replicas: int = 1,
        *,
        config: EngineConfig | None = None,
        prefill_config: EngineConfig | None = None,
        decode_config: EngineConfig | None = None,
        router_overhead: float = 0.0,
        local_prefill: LocalPrefill | None = None,
        routing: str = "least-loaded",
        prefix_balance: float = pi.DEFAULT_BALANCE,
        prefix_max_entries: int = pi.DEFAULT_MAX_ENTRIES,
        hash_block_tokens: int = HASH_BLOCK_TOKENS,
        prefill_hold_s: float | None = DEFAULT_PREFILL_HOLD_S,
    ) -> None:
        pool_mode = _MODES.get(str(mode).lower())
        if pool_mode is None:
            raise ValueError(f"mode must be 'disaggregated' or 'aggregated', got {mode!r}")
        if routing not in ROUTING:
            raise ValueError(f"routing must be one of {', '.join(ROUTING)}, got {routing!r}")
        # The simulated router's choice of prefill, aggregated and local-prefill engines:
        # least-loaded, or the router's prefix-aware rule over its own record of what it sent
        # where (router/prefix_index.py), keyed by the requests' hash_ids. Its LRU holds as
        # many prompt tokens as the router's with `prefix_max_entries` (its
        # --prefix-max-entries) and forgets after its default TTL (`hash_block_tokens`: the
        # tokens one of the requests' hash ids stands for).
        self.routing = routing
        self.prefix_balance = prefix_balance
        self._prefix = pi.ApproximateIndex(
            max(1, prefix_max_entries * pi.BLOCK_TOKENS // hash_block_tokens),
            pi.DEFAULT_TTL_S)
        self.prefix_choices: dict[str, int] = {}  # the router's counter, by reason
        # The router's late binding (router/prefill_hold.py): a prompt waits in `_pending`
        # while every ready prefill engine has more than this much queued work at the
        # learned rate. None: off.
        self.prefill_hold_s = prefill_hold_s or None
        self.mode = pool_mode
        self.step_model: StepModel = make_step_model(model, gpu, tensor_parallel)
        base = config or EngineConfig()
        self.configs = {
            Role.PREFILL: prefill_config or base,
            Role.DECODE: decode_config or base,
            Role.ENGINE: base,
        }
        self.local_prefill = local_prefill if pool_mode == Mode.DISAGGREGATED else None
        self.local_prefill_total: dict[str, int] = {}  # the router's counter, by reason
        self._lp_active = False  # the rule's hysteresis state (one router)
        self._lp_costs: dict[int, _MixedStepCost] = {}
        self._prefill_rate = lp.RateEstimate(
            2048 / self.step_model.step_time([(2048, 0)]))  # as the router's presets
        if self.local_prefill is not None and self.configs[Role.DECODE].itl_budget is None:
            self.configs[Role.DECODE] = replace(self.configs[Role.DECODE],
                                             itl_budget=self.local_prefill.itl_s)
        self.roles: tuple[Role, ...] = (DISAGGREGATED_ROLES if pool_mode == Mode.DISAGGREGATED
                                        else (Role.ENGINE,))
        self.router_overhead = router_overhead
        self.now = 0.0
        self._events: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._ids = itertools.count()
        self.replicas: dict[int, Replica] = {}  # every replica ever (removed ones too)
        self._live: dict[int, Replica] = {}  # not removed
        self._pending: dict[str, deque[tuple[_Job, Seq | None]]] = {r: deque() for r in self.roles}
        self._records: list[RequestRecord] = []
        self._retired_stats: dict[str, list[MetricsSnapshot]] = {r: [] for r in self.roles}
        self.max_model_len: int | None = None
        self.events_processed = 0
        if pool_mode == Mode.DISAGGREGATED:
            for _ in range(prefill_replicas):
                self.add_replica(Role.PREFILL, ready_at=0.0)
            for _ in range(decode_replicas):
                self.add_replica(Role.DECODE, ready_at=0.0)
        else:
            for _ in range(engine_replicas):
                self.add_replica(Role.ENGINE, ready_at=0.0)

    # ---- public API ----
    def submit(self, req: SimRequest) -> None:
        if req.arrival < self.now:
            raise ValueError(f"request {req.id}: arrival {req.arrival} is before now {self.now}")
        self._push(req.arrival, _ARRIVAL, _Job(req))

    def submit_many(self, reqs: list[SimRequest]) -> None:
        for r in reqs:
            self.submit(r)

    def add_replica(self, role: str, ready_at: float | None = None) -> int:
        role = self._role(role)
        ready = self.now if ready_at is None else max(ready_at, self.now)
        engine = EngineCore(self.step_model, role, self.configs[role])
        if self.max_model_len is None:
            self.max_model_len = engine.max_model_len
        rid = next(self._ids)
        self.replicas[rid] = self._live[rid] = Replica(rid, role, engine, ready)
        self._push(ready, _READY, rid)
        return rid

    def remove_replica(self, role: str, replica_id: int | None = None) -> int | None:
        """Remove one replica of `role` (a starting one first; else drain the least loaded).

        Returns the replica id, or None if the role has none left to remove."""
        role = self._role(role)
        live = [r for r in self._live.values() if r.role == role and not r.draining]
        if replica_id is not None:
            live = [r for r in live if r.id == replica_id]
        if not live:
            return None
        starting = [r for r in live if r.ready_at > self.now]
        if starting:
            victim = max(starting, key=lambda r: (r.ready_at, r.id))
            victim.removed_at = self.now
            del self._live[victim.id]
            return victim.id
        victim = min(live, key=lambda r: (r.engine.load(), -r.id))
        victim.draining = True
        self._maybe_leave(victim)
        return victim.id

    def replica_counts(self, role: str) -> ReplicaCounts:
        role = self._role(role)
        ready = starting = draining = 0
        for r in self._live.values():
            if r.role != role:
                continue
            if r.draining:
                draining += 1
            elif r.ready_at > self.now:
                starting += 1
            else:
                ready += 1
        return ReplicaCounts(ready, starting, draining)

    def run_until(self, t: float) -> None:
        """Process every event up to simulated time t; engine state is brought up to t."""
        ev = self._events
        while ev and ev[0][0] <= t:
            time, _, kind, data = heapq.heappop(ev)
            self.now = max(self.now, time)
            self.events_processed += 1
            if kind == _ARRIVAL:
                self._route(data, Role.PREFILL if self.mode == Mode.DISAGGREGATED else Role.ENGINE,
                            None)
            elif kind == _HANDOFF:
                job, seq = data
                self._route(job, Role.DECODE, seq)
            elif kind == _READY:
                rep = self.replicas[data]
                if rep.removed_at is None:
                    self._dispatch_pending(rep.role)
            elif kind == _STEP:
                rid, version = data
                rep = self.replicas[rid]
                if version == rep.version:
                    self._step_done(rep)
            elif kind == _LOAD:
                rep = self.replicas[data]
                if rep.engine.chunk is None:
                    self._kick(rep)
                else:
                    self._truncate(rep, self.now)
        self.now = max(self.now, t)
        for rep in self._live.values():  # partial decode runs up to t (for metrics)
            if rep.engine.chunk is not None and rep.engine.chunk.decode_run:
                self._absorb(rep, rep.engine.commit(upto=t))

    def run(self) -> None:
        """Run until every submitted request has finished."""
        while self._events:
            self.run_until(self._events[0][0])

    def records(self) -> list[RequestRecord]:
        return list(self._records)

    def metrics(self, per_replica: bool = False) -> dict[str, Any]:
        """Per role: the sum over the role's engines (counters and histograms cumulative since
        the start, including removed replicas; running/waiting summed over live replicas;
        KV usage averaged over them). per_replica=True: {str(replica_id): MetricsSnapshot} of the
        live replicas instead."""
        if per_replica:
            return {str(r.id): r.engine.snapshot() for r in self._live.values()}
        out: dict[str, Any] = {}
        for role in self.roles:
            live = [r.engine.snapshot() for r in self._live.values()
                    if r.role == role and r.ready_at <= self.now]
            total = sum_snapshots([*live, *self._retired_stats[role]])
            if self._retired_stats[role]:
                # retired engines add counts, not gauges: recompute gauges from live ones only
                total.gauges = sum_snapshots(live).gauges
            out[role] = total
        return out

    def pending(self, role: str) -> int:
        """Requests waiting at the router for a ready replica of `role`."""
        return len(self._pending[self._role(role)])

    def in_flight(self) -> int:
        return sum(r.engine.load() for r in self._live.values()) + sum(
            len(q) for q in self._pending.values())

    # ---- internals ----
    def _role(self, role: str) -> Role:
        r = canonical_role(role)
        if r not in self.roles:
            raise ValueError(f"role '{role}' is not in this {self.mode.lower()} pool; roles: "
                             f"{', '.join(self.roles)}")
        return r

    def _push(self, t: float, kind: int, data: Any) -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, data))

    def _pick(self, role: str) -> Replica | None:
        """Least loaded: requests in flight at decode engines; the router's whole measure
        (requests and charged prompt tokens) at prefill and aggregated engines."""
        best: Replica | None = None
        best_load = 0.0
        for r in self._live.values():
            if r.role == role and r.is_ready(self.now):
                load = r.engine.load() if role == Role.DECODE else r.router_load()
                if best is None or load < best_load:
                    best, best_load = r, load
        return best

    def _choose(self, role: str, req: SimRequest) -> tuple[Replica, int] | None:
        """The router's pick for `req` and the prompt tokens it expects the engine to hold:
        by prefix for prefill and aggregated engines when routing is prefix-aware (recording
        where it went), else least loaded (nothing expected held)."""
        if self.routing != "prefix-aware" or role == Role.DECODE:
            picked = self._pick(role)
            return None if picked is None else (picked, 0)
        ready = [r for r in self._live.values() if r.role == role and r.is_ready(self.now)]
        if not ready:
            return None
        keys = PromptKeys(req.hash_ids, req.hash_block_tokens)
        matched = self._matched(keys, req.prompt_tokens, ready)
        # turn 0: ties go to the first, as _pick's do (no match: exactly _pick's choice)
        c = pi.choose([r.router_load() for r in ready], matched, req.prompt_tokens,
                      requests=[r.engine.load() for r in ready],
                      balance=self.prefix_balance)
        self.prefix_choices[c.reason] = self.prefix_choices.get(c.reason, 0) + 1
        rep = ready[c.index]
        self._prefix.record(keys, str(rep.id), self.now)
        return rep, matched[c.index]

    def _matched(self, keys: PromptKeys, prompt_tokens: int, reps: list[Replica]) -> list[int]:
        """Per replica, the prompt tokens the router expects it to hold."""
        if not keys.keys:
            return [0] * len(reps)
        blocks = self._prefix.matched_blocks(keys, [str(r.id) for r in reps], self.now)
        return [min(prompt_tokens, keys.tokens(b)) for b in blocks]

    def _saturated(self, role: str) -> bool:
        """The router's late binding: every ready prefill engine has more than the hold's
        worth of queued prompt tokens at the learned prefill rate (False with none ready)."""
        if self.prefill_hold_s is None or role != Role.PREFILL:
            return False
        limit = self.prefill_hold_s * self._prefill_rate.tokens_per_s
        ready = [r for r in self._live.values() if r.role == role and r.is_ready(self.now)]
        return bool(ready) and all(r.queued_tokens > limit for r in ready)

    def _route(self, job: _Job, role: str, seq: Seq | None) -> None:
        if role == Role.PREFILL and self.local_prefill is not None:
            local = self._local_target(job.req)
            if local is not None:
                job.local = True
                self._assign(local, job, None)
                return
        if self.prefill_hold_s is not None and role == Role.PREFILL and (
                self._pending[role] or self._saturated(role)):
            self._pending[role].append((job, seq))  # held, behind those held before it
            return
        chosen = self._choose(role, job.req)
        if chosen is None:
            self._pending[role].append((job, seq))
            return
        self._assign(chosen[0], job, seq, held=chosen[1])

    def _local_target(self, req: SimRequest) -> Replica | None:
        """The router's rule: a decode replica to prefill `req` itself, or None (P/D path)."""
        lpc = self.local_prefill
        assert lpc is not None
        now = self.now
        prefill: list[Replica] = []
        decode: list[Replica] = []
        for r in self._live.values():
            if r.is_ready(now):
                (prefill if r.role == Role.PREFILL else decode).append(r)
        if not decode:
            return None
        rate = self._prefill_rate.tokens_per_s
        seqs = kv = 0
        for r in decode:  # the decode batch's mean context, from the blocks it holds
            seqs += r.engine.sched.num_running
            kv += r.engine.sched.used_blocks * r.engine.sched.block_size
        context = -(-kv // max(seqs, 1) // 256) * 256 or 256
        cost = self._lp_costs.get(context)
        if cost is None:
            cost = self._lp_costs[context] = _MixedStepCost(self.step_model, context)
        policy = lp.LocalPrefillPolicy(
            lpc.ttft_s, lpc.itl_s, cost, lpc.enter, lpc.exit,
            max_chunk_tokens=self.configs[Role.DECODE].max_num_batched_tokens)
        keys = PromptKeys(req.hash_ids, req.hash_block_tokens)
        aware = self.routing == "prefix-aware"
        held_p = self._matched(keys, req.prompt_tokens, prefill) if aware else [0] * len(prefill)
        held_d = self._matched(keys, req.prompt_tokens, decode) if aware else [0] * len(decode)
        d = lp.decide(req.prompt_tokens,
                      [lp.PrefillLoad(r.queued_tokens, rate, h)
                       for r, h in zip(prefill, held_p, strict=True)],
                      [lp.DecodeLoad(r.engine.load(), r.queued_tokens, h)
                       for r, h in zip(decode, held_d, strict=True)],
                      policy, self._lp_active)
        self._lp_active = d.active
        if not d.local or d.engine is None:
            return None
        self.local_prefill_total[d.reason] = self.local_prefill_total.get(d.reason, 0) + 1
        target = decode[d.engine]
        if aware:
            self._prefix.record(keys, str(target.id), self.now)
        return target

    def _dispatch_pending(self, role: str) -> None:
        q = self._pending[role]
        while q and not self._saturated(role):
            job, seq = q[0]
            chosen = self._choose(role, job.req)
            if chosen is None:
                return
            q.popleft()
            self._assign(chosen[0], job, seq, held=chosen[1])

    def _assign(self, rep: Replica, job: _Job, _prev: Seq | None, held: int = 0) -> None:
        """Start `job` on `rep`; `held`: prompt tokens the router expected it to hold."""
        eng = rep.engine
        req = job.req
        err = eng.validate(req.prompt_tokens, req.output_tokens)
        if err is not None:
            self._records.append(RequestRecord(req.id, req.arrival, req.prompt_tokens, 0, None,
                                               None, None, False, err))
            return
        if rep.role != Role.DECODE:
            job.charged = max(0, req.prompt_tokens - held)
            rep.charged_tokens += job.charged
        if rep.role == Role.PREFILL:
            job.prefill_replica = rep.id
            seq = Seq(req.id, req.prompt_tokens, 1, self.now, payload=job,
                      block_hashes=req.hash_ids, hash_block_tokens=req.hash_block_tokens)
            rep.queued_tokens += req.prompt_tokens
            job.sent_at, job.queued_at_send = self.now, rep.queued_tokens
        elif job.local:  # the router's fallback: a plain request, prefilled here
            job.decode_replica = rep.id
            seq = Seq(req.id, req.prompt_tokens, req.output_tokens, self.now, payload=job,
                      block_hashes=req.hash_ids, hash_block_tokens=req.hash_block_tokens)
            rep.queued_tokens += req.prompt_tokens
        elif rep.role == Role.DECODE:
            job.decode_replica = rep.id
            # its own cache serves what it holds; the blocks it receives are cached
            seq = Seq(req.id, req.prompt_tokens, req.output_tokens, self.now,
                      remote_prefill=True, payload=job, block_hashes=req.hash_ids,
                      hash_block_tokens=req.hash_block_tokens)
        else:
            job.decode_replica = rep.id
            seq = Seq(req.id, req.prompt_tokens, req.output_tokens, self.now, payload=job,
                      block_hashes=req.hash_ids, hash_block_tokens=req.hash_block_tokens)
        eng.add(seq)
        rep.note_load(self.now)
        if eng.chunk is None:
            self._kick(rep)
        else:
            self._truncate(rep, self.now)

    def _truncate(self, rep: Replica, t: float) -> None:
        new_end = rep.engine.truncate(t)
        if new_end is not None:
            rep.version += 1
            self._push(new_end, _STEP, (rep.id, rep.version))

    def _kick(self, rep: Replica) -> None:
        """Plan the idle engine's next chunk and schedule its end."""
        eng = rep.engine
        ch = eng.plan(self.now)
        for s in eng.started_loads:
            self._push(s.ready_at, _LOAD, rep.id)
            if s.remote_prefill:  # (not a load from the CPU offload tier)
                s.payload.xfer = s.xfer_time
        eng.started_loads.clear()
        if ch is not None:
            rep.version += 1
            self._push(ch.end, _STEP, (rep.id, rep.version))
        else:
            self._maybe_leave(rep)

    def _step_done(self, rep: Replica) -> None:
        out = rep.engine.commit()
        self._absorb(rep, out)
        self._kick(rep)

    def _absorb(self, rep: Replica, out: Any) -> None:
        eng = rep.engine
        for s in out.first_tokens:
            if s.payload.local:  # a local prefill is done: the router sees its first token
                rep.queued_tokens -= s.prompt
        for s in out.finished:
            job: _Job = s.payload
            job.preemptions += s.preemptions
            if rep.role != Role.DECODE:  # the router's answer from it: the charge is released
                rep.charged_tokens -= job.charged
            if rep.role == Role.PREFILL:
                job.prefix_hit = s.prefix_hit + s.host_hit
                rep.queued_tokens -= s.prompt
                self._prefill_rate.observe(job.queued_at_send, out.end - job.sent_at)
                self._push(out.end + self.router_overhead, _HANDOFF, (job, s))
                if self._pending[Role.PREFILL]:  # its queue shrank: a held prompt may go
                    self._push(out.end, _READY, rep.id)
                continue
            times = eng.token_times(s)
            req = job.req
            self._records.append(RequestRecord(
                req.id, req.arrival, req.prompt_tokens, s.generated, s.first_token_at,
                s.finished_at, itl_p90(times), True, None, job.prefill_replica,
                job.decode_replica, job.xfer, job.preemptions, job.local,
                job.prefix_hit if job.prefill_replica is not None
                else s.prefix_hit + s.host_hit))
            s.token_steps = []
        rep.note_load(self.now)

    def _maybe_leave(self, rep: Replica) -> None:
        if rep.draining and rep.removed_at is None and rep.engine.load() == 0 \
                and rep.engine.chunk is None and not rep.engine.sched.held:
            rep.removed_at = self.now
            del self._live[rep.id]
            self._retired_stats[rep.role].append(rep.engine.snapshot())
