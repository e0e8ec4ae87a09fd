"""Replay one trace through a simulated disaggregated pool under one scaling policy.

Every policy gets the same arrivals (the trace, after `--rate-scale`), the same simulator
(`poolpilot.engine_sim.des.PoolSim`: router, prefill and decode engines, KV handoff), the same
cold start and the same Prometheus emulation. The loop advances simulated time in ticks of
`tick` seconds (5 s):

- every tick: the simulator runs up to t; every ready GPU is sampled busy or idle (the DCGM
  exporter's utilization is a sampled duty cycle too); replicas that finished draining close
  their billing span at the exact time the simulator removed them;
- every `scrape_interval` (15 s): one scrape of every pod that serves (ready or draining):
  its vLLM counters, histograms and gauges, labelled `role` and `pod`, plus its DCGM GPU
  utilization over the scrape interval. Starting pods export nothing, as a pod loading weights
  does not serve /metrics yet;
- at every scrape, the load imbalance is sampled per role: the busiest ready engine's work in
  flight (requests running and waiting at it), averaged over the scrape interval, over the
  role's mean, each counted as at least one request (`load_imbalance`);
- every `policy.interval`: the policy decides from the scraped picture and the pod counts;
  scale-ups add pods that become ready `cold_start` seconds later (billed from now), scale-downs
  remove a starting pod first, else drain the least-loaded ready one (billed until it leaves).

GPU-hours are billed over the trace's span [0, last arrival]; requests still in flight then run
to completion on the pool as it is (their latencies count, their extra GPU time does not),
so a policy cannot lower its bill by leaving work unfinished.

Prefix caching: the simulated engines keep vLLM's prefix cache, and the simulated router picks
prefill engines (and local-prefill decode engines) by `BenchConfig.routing`: "prefix-aware"
(the router's default: its approximate index, bounded load) or "least-loaded". A trace without
hash ids (Azure) shares nothing, and both pick the least-loaded engine exactly as before.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from poolpilot.bench.accounting import Ledger, ReplayedRequest, ScaleEvent, Span, Summary, summarize
from poolpilot.bench.policies.base import PoolView, RolePods, ScalingPolicy
from poolpilot.bench.scrape import Labels, PromView, labels_of
from poolpilot.engine_sim.des import HASH_BLOCK_TOKENS, ROUTING, LocalPrefill, PoolSim, SimRequest
from poolpilot.engine_sim.engine import EngineConfig
from poolpilot.engine_sim.traces import TraceRequest
from poolpilot.router import prefix_index as pi
from poolpilot.router.prefill_hold import DEFAULT_PREFILL_HOLD_S

from poolpilot import metrics as m
from poolpilot.roles import DISAGGREGATED_ROLES, Role

DEFAULT_ROUTING = "prefix-aware"  # the router's default (approximate prefix index)
# The load imbalance reported: this percentile over the run of busiest / mean per role, the
# samples weighted by the role's work in flight.
IMBALANCE_PERCENTILE = 99

# Series the policies query (the rest of vLLM's histograms are not scraped, to save time).
SCRAPED_HISTOGRAMS = (m.VLLM_TTFT, m.VLLM_ITL, m.VLLM_E2E)
# The front door's count of requests it started (arrivals so far): what Dynamo's planner reads
# as offered load (its frontend exports `dynamo_frontend_requests_started_total`; poolpilot's
# router counts answered requests only, in poolpilot_router_requests_total).
FRONTEND_STARTED = "frontend_requests_started_total"


@dataclass(frozen=True)
class BenchConfig:
    model: str = "llama-3.1-8b"
    gpu: str = "h200"
    tensor_parallel: int = 1
    slo_ttft: float = 1.0
    slo_itl: float = 0.05
    quantile: float = 0.9
    cold_start: float = 120.0
    scrape_interval: float = 15.0
    tick: float = 5.0
    min_replicas: int = 1
    max_replicas: int = 32
    engine: EngineConfig = field(default_factory=EngineConfig)
    local_prefill: bool = False  # the router's local-prefill fallback (PoolSim.local_prefill)
    # GPU nodes kept warm by a placeholder pod (no GPU request): a pod ordered while one of
    # them is free lands there and starts in `warm_cold_start` instead of `cold_start`
    warm_placeholders: int = 0
    warm_cold_start: float = 0.0
    routing: str = DEFAULT_ROUTING  # the router's pick of prefill engines (ROUTING)
    # GiB of host memory per prefill (or aggregated) engine for the CPU offload tier of its
    # prefix cache (vLLM's --kv-offloading-size; the pool's prefill.kvOffload); 0: none
    kv_offloading_gib: float = 0.0
    # the router's --prefix-max-entries: keys its approximate prefix index remembers (None:
    # as the operator sizes it, grown by max_replicas prefill engines' offload tiers)
    prefix_max_entries: int | None = None
    # the tokens one of the trace's hash ids stands for (Mooncake's 512, Bailian's 16): the
    # simulated router's record holds as many tokens whatever the trace's block size
    hash_block_tokens: int = HASH_BLOCK_TOKENS
    # the router's --prefill-hold (late binding, router/prefill_hold.py); None: off
    prefill_hold_s: float | None = DEFAULT_PREFILL_HOLD_S

    def __post_init__(self) -> None:
        if self.routing not in ROUTING:
            raise ValueError(f"routing must be one of {', '.join(ROUTING)}, "
                             f"got {self.routing!r}")
        if self.prefix_max_entries is not None and self.prefix_max_entries < 1:
            raise ValueError(f"--prefix-max-entries must be >= 1, got {self.prefix_max_entries}")
        if self.prefill_hold_s is not None and not 0 <= self.prefill_hold_s < math.inf:
            raise ValueError(f"--prefill-hold must be >= 0 seconds, got {self.prefill_hold_s}")
        if not 0 <= self.kv_offloading_gib < math.inf:
            raise ValueError(f"--kv-offload-gib must be a number >= 0, got "
                             f"{self.kv_offloading_gib}")

    def record_entries(self) -> int:
        """The simulated router's record: as given, else as the operator sizes it."""
        if self.prefix_max_entries is not None:
            return self.prefix_max_entries
        if not self.kv_offloading_gib:
            return pi.DEFAULT_MAX_ENTRIES
        return pi.entries_for_offload(self.max_replicas * self.kv_offloading_gib * 2**30)


def _per_role() -> dict[str, list[int]]:
    return {r: [] for r in DISAGGREGATED_ROLES}


@dataclass
class Timeline:
    """Per role, sampled every `every` seconds: pods billed, ready pods, the target."""

    t: list[float] = field(default_factory=list)
    billed: dict[str, list[int]] = field(default_factory=_per_role)
    ready: dict[str, list[int]] = field(default_factory=_per_role)
    target: dict[str, list[int]] = field(default_factory=_per_role)


@dataclass
class RunResult:
    policy: str
    summary: Summary
    outcomes: list[ReplayedRequest]
    ledger: Ledger
    timeline: Timeline
    reasons: dict[str, dict[str, int]]
    sim_events: int
    local_prefill_requests: int | None = None  # served by the fallback (None: it was off)
    info: dict[str, Any] = field(default_factory=dict)  # what a policy reports about itself
    aborted_at: float | None = None  # stopped early: the miss budget was spent by then
    cache: dict[str, Any] = field(default_factory=dict)  # prefix_hit_rate, ... (see _cache)
    decisions: list[dict[str, Any]] = field(default_factory=list)  # `bench --decisions`

    def as_json(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.summary.as_json())
        d["scale_reasons"] = self.reasons
        d["local_prefill_requests"] = self.local_prefill_requests
        d.update(self.cache)
        if self.info:
            d["info"] = self.info
        return d


def new_pool_sim(cfg: BenchConfig, sim_class: type[PoolSim] = PoolSim) -> PoolSim:
    """An empty simulated pool as every replay (and the oracle's search) builds it."""
    local = LocalPrefill(cfg.slo_ttft, cfg.slo_itl) if cfg.local_prefill else None
    prefill = (replace(cfg.engine, kv_offloading_gib=cfg.kv_offloading_gib)
               if cfg.kv_offloading_gib else None)
    return sim_class(cfg.model, cfg.gpu, cfg.tensor_parallel, mode="disaggregated",
                     prefill_replicas=0, decode_replicas=0, config=cfg.engine,
                     prefill_config=prefill, local_prefill=local, routing=cfg.routing,
                     prefix_max_entries=cfg.record_entries(),
                     hash_block_tokens=cfg.hash_block_tokens,
                     prefill_hold_s=cfg.prefill_hold_s)


def meets_slo(rec: Any, slo_ttft: float, slo_itl: float) -> bool:
    """A simulator RequestRecord against the SLO (the same rule as `ReplayedRequest.meets`)."""
    if not rec.ok or rec.first_token_at is None or rec.finished_at is None:
        return False
    if rec.first_token_at - rec.arrival > slo_ttft:
        return False
    return rec.itl_p90 is None or rec.itl_p90 <= slo_itl


def to_sim_requests(trace: Sequence[TraceRequest]) -> list[SimRequest]:
    return [SimRequest(i, r.arrival_s, r.input_tokens, r.output_tokens, r.hash_ids,
                       r.block_tokens)
            for i, r in enumerate(trace)]


def snapshot_samples(snap: Any, labels: dict[str, str]) -> list[tuple[str, Labels, float]]:
    """One engine's MetricsSnapshot as the samples a scrape of its /metrics would give."""
    out: list[tuple[str, Labels, float]] = []
    base = labels_of(labels)
    for name, value in snap.counters.items():
        out.append((name, base, float(value)))
    for reason, value in snap.success.items():
        out.append((m.VLLM_REQUEST_SUCCESS, labels_of({**labels, "finished_reason": reason}),
                    float(value)))
    for name, value in snap.gauges.items():
        out.append((name, base, float(value)))
    for name in SCRAPED_HISTOGRAMS:
        h = snap.histograms.get(name)
        if h is None:
            continue
        for le, c in h.cumulative():
            le_s = "+Inf" if math.isinf(le) else repr(float(le))
            out.append((f"{name}_bucket", labels_of({**labels, "le": le_s}), float(c)))
        out.append((f"{name}_count", base, float(h.count)))
        out.append((f"{name}_sum", base, float(h.sum)))
    return out


class Replay:
    def __init__(self, trace: Sequence[TraceRequest], policy: ScalingPolicy,
                 cfg: BenchConfig) -> None:
        self.trace = trace
        self.policy = policy
        self.cfg = cfg
        self.sim = new_pool_sim(cfg)
        self.prom = PromView(cfg.scrape_interval)
        self.ledger = Ledger()
        self.spans: dict[int, Span] = {}
        self.busy: dict[int, int] = {}  # busy samples since the last scrape, per replica
        self.samples: dict[int, int] = {}
        self.timeline = Timeline()
        self.reasons: dict[str, dict[str, int]] = {r: {} for r in DISAGGREGATED_ROLES}
        self.end = trace[-1].arrival_s if trace else 0.0
        self._checked = self._misses = 0  # records already counted, and their misses
        self._arrivals = sorted(r.arrival_s for r in trace)
        self.imbalance: dict[str, list[tuple[float, float]]] = {
            r: [] for r in DISAGGREGATED_ROLES}
        self._load_areas: dict[int, float] = {}  # per replica, at the last scrape
        self._warm_taken: set[int] = set()  # replicas on a warm node (--warm-placeholders)
        self.warm_landings = 0

    # ---- pods ----
    def _add(self, role: str, t: float, ready_at: float) -> int:
        rid = self.sim.add_replica(role, ready_at=ready_at)
        self.spans[rid] = self.ledger.request(role, t, ready_at, self.cfg.tensor_parallel)
        return rid

    def _order(self, role: str, t: float) -> None:
        """A scale-up's pod: on a free warm node (a placeholder's) if there is one, else a
        full cold start. The node is the pod's until it leaves; then it is warm again."""
        cfg = self.cfg
        self._warm_taken = {rid for rid in self._warm_taken
                            if self.sim.replicas[rid].removed_at is None}
        if len(self._warm_taken) < cfg.warm_placeholders:
            start = min(cfg.cold_start, cfg.warm_cold_start)
            self._warm_taken.add(self._add(role, t, t + start))
            self.warm_landings += 1
        else:
            self._add(role, t, t + cfg.cold_start)

    def _remove(self, role: str, t: float) -> None:
        rid = self.sim.remove_replica(role)
        if rid is None:
            return
        span = self.spans[rid]
        self.ledger.mark_removal(span, t)
        self._close_gone(t)

    def _close_gone(self, now: float) -> None:
        for rid, span in self.spans.items():
            if span.gone_at is None:
                removed = self.sim.replicas[rid].removed_at
                if removed is not None:
                    self.ledger.close(span, removed)

    def role_pods(self, role: str) -> RolePods:
        c = self.sim.replica_counts(role)
        now = self.sim.now
        ready = frozenset(str(rid) for rid, rep in self.sim.replicas.items()
                          if rep.role == role and rep.is_ready(now))
        return RolePods(c.ready, c.starting, c.draining, c.ready + c.starting, ready)

    # ---- scrape ----
    def _sample_busy(self) -> None:
        now = self.sim.now
        for rid, rep in self.sim.replicas.items():
            if rep.removed_at is None and rep.ready_at <= now:
                self.samples[rid] = self.samples.get(rid, 0) + 1
                if rep.engine.has_work():
                    self.busy[rid] = self.busy.get(rid, 0) + 1

    def _scrape(self, t: float) -> None:
        samples: list[tuple[str, Labels, float]] = []
        for rid, rep in self.sim.replicas.items():
            if rep.removed_at is not None or rep.ready_at > t:
                continue
            labels = {"role": rep.role, "pod": str(rid)}
            samples += snapshot_samples(rep.engine.snapshot(), labels)
            n = self.samples.get(rid, 0)
            util = 100.0 * self.busy.get(rid, 0) / n if n else 0.0
            samples.append((m.DCGM_GPU_UTIL, labels_of(labels), util))
        # the router's gauge: prompts it holds for a prefill engine (late binding, and none
        # ready yet)
        samples.append((m.ROUTER_HELD, labels_of({"role": Role.PREFILL}),
                        float(self.sim.pending(Role.PREFILL))))
        for reason, n in self.sim.local_prefill_total.items():  # the router's counter
            samples.append((m.ROUTER_LOCAL_PREFILL, labels_of({"reason": reason}), float(n)))
        started = bisect.bisect_right(self._arrivals, t)
        samples.append((FRONTEND_STARTED, labels_of({}), float(started)))
        self.busy.clear()
        self.samples.clear()
        self.prom.scrape(t, samples)
        self._sample_imbalance()

    def _sample_imbalance(self) -> None:
        """Per role, over the scrape interval just ended: each engine's mean requests in
        flight (time-averaged: a request finishing or arriving between two instants does not
        make a hot spot), the busiest over the role's mean, weighted by the role's work in the
        interval. Only engines ready and not draining for the whole interval count (a replica
        that joined mid-interval is filling up, one that drains is emptying); no sample while
        the role has nothing in flight."""
        now, start = self.sim.now, self.sim.now - self.cfg.scrape_interval
        means: dict[str, list[float]] = {r: [] for r in DISAGGREGATED_ROLES}
        areas: dict[int, float] = {}
        for rid, rep in self.sim.replicas.items():
            if rep.removed_at is not None:
                continue
            area = areas[rid] = rep.load_area(now)
            before = self._load_areas.get(rid)
            if before is not None and rep.ready_at <= start and not rep.draining \
                    and rep.role in means:
                means[rep.role].append((area - before) / self.cfg.scrape_interval)
        self._load_areas = areas
        for role, xs in means.items():
            x = load_imbalance(xs)
            if x is not None:
                self.imbalance[role].append(x)

    # ---- policy ----
    def _decide(self, t: float) -> None:
        roles: dict[str, RolePods] = {r: self.role_pods(r) for r in DISAGGREGATED_ROLES}
        d = self.policy.decide(PoolView(t, self.prom, roles))
        for role in DISAGGREGATED_ROLES:
            want = d.replicas.get(role, roles[role].target)
            cur = roles[role].target
            reason = d.reasons.get(role, "")
            if want != cur:
                self.reasons[role][reason] = self.reasons[role].get(reason, 0) + 1
                self.ledger.events.append(ScaleEvent(t, role, cur, want, reason))
            for _ in range(want - cur):
                self._order(role, t)
            for _ in range(cur - want):
                self._remove(role, t)

    def _record(self, t: float) -> None:
        tl = self.timeline
        tl.t.append(t)
        for role in DISAGGREGATED_ROLES:
            st = self.role_pods(role)
            tl.ready[role].append(st.ready)
            tl.target[role].append(st.target)
            tl.billed[role].append(st.ready + st.starting + st.draining)

    # ---- run ----
    def _misses_so_far(self) -> int:
        cfg = self.cfg
        recs = self.sim.records()
        self._misses += sum(1 for r in recs[self._checked:]
                            if not meets_slo(r, cfg.slo_ttft, cfg.slo_itl))
        self._checked = len(recs)
        return self._misses

    def run(self, progress: Callable[[float], None] | None = None,
            miss_budget: int | None = None) -> RunResult:
        """Replay the trace. With `miss_budget`, stop as soon as more requests than that have
        finished outside the SLO (a search that only asks "does it meet the goal?" needs no
        more); the result then has `aborted_at` set and its numbers are partial."""
        cfg = self.cfg
        for role, n in self.policy.initial().items():
            for _ in range(n):
                self._add(role, 0.0, 0.0)
        self.sim.submit_many(to_sim_requests(self.trace))
        tick = cfg.tick
        next_scrape = cfg.scrape_interval
        next_decide = self.policy.interval
        t = 0.0
        self._record(0.0)
        steps = 0
        while t < self.end:
            t = min(self.end, t + tick)
            self.sim.run_until(t)
            self._sample_busy()
            self._close_gone(t)
            if t >= next_scrape - 1e-9:
                self._scrape(t)
                next_scrape += cfg.scrape_interval
            if t >= next_decide - 1e-9:
                self._decide(t)
                next_decide += self.policy.interval
            steps += 1
            if steps % 10 == 0:
                self._record(t)
                if progress is not None:
                    progress(t)
            if miss_budget is not None and steps % 12 == 0 \
                    and self._misses_so_far() > miss_budget:
                self._record(t)
                return self._result(aborted_at=t)
        self._record(t)
        # Let what is in flight finish on the pool as it stands (not billed: see module doc).
        self.sim.run()
        self._close_gone(self.sim.now)
        if progress is not None:
            progress(self.end)
        return self._result()

    def _result(self, aborted_at: float | None = None) -> RunResult:
        cfg = self.cfg
        recs = {r.id: r for r in self.sim.records()}
        outcomes = []
        for i, req in enumerate(self.trace):
            r = recs.get(i)
            if r is None:  # never finished: counted, as a miss
                outcomes.append(ReplayedRequest(i, req.arrival_s, None, None, 0, None))
            else:
                outcomes.append(ReplayedRequest(i, r.arrival, r.first_token_at,
                                        r.finished_at if r.ok else None, r.output_tokens,
                                        r.itl_p90))
        duration = max(self.end, cfg.tick)
        summary = summarize(outcomes, self.ledger, duration, cfg.slo_ttft, cfg.slo_itl)
        local = sum(self.sim.local_prefill_total.values()) if cfg.local_prefill else None
        info = dict(getattr(self.policy, "info", None) or {})
        if cfg.warm_placeholders:
            info["warm_landings"] = self.warm_landings  # scale-ups that found a warm node
        return RunResult(self.policy.name, summary, outcomes, self.ledger, self.timeline,
                         self.reasons, self.sim.events_processed, local, info, aborted_at,
                         self._cache(duration))

    def _cache(self, duration: float) -> dict[str, Any]:
        """The prefix cache's effect and the load's spread, for the JSON:

        - `prefix_hit_rate`: prompt tokens served from a prefix cache over all prompt tokens
          prefilled, over the run (each request's hit tokens at the engine that prefilled it:
          what the prefill engines' `vllm:prefix_cache_hits_total` and the decode engines'
          local prefills add up to, without the decode engines' lookups of KV they received;
          the CPU offload tier's hits included);
        - `prefix_hit_rate_by_role`: each role's engines' own counters, hits (the offload
          tier's external hits too) / queries; `host_hit_rate`: the offload tier's share of
          all prompt tokens (with --kv-offload-gib);
        - `gpu_hours_by_role`; `load_imbalance`: per role, the IMBALANCE_PERCENTILE of the
          scrape-time samples of busiest / mean requests in flight (None: never loaded)."""
        recs = self.sim.records()
        prompt = sum(r.prompt_tokens for r in recs)
        hits = sum(r.prefix_hit_tokens for r in recs)
        by_role: dict[str, float | None] = {}
        host = 0.0
        for role in DISAGGREGATED_ROLES:
            q = h = 0.0
            for rep in self.sim.replicas.values():
                if rep.role == role:
                    c = rep.engine.snapshot().counters
                    q += c.get(m.VLLM_PREFIX_CACHE_QUERIES, 0.0)
                    h += c.get(m.VLLM_PREFIX_CACHE_HITS, 0.0)
                    ext = c.get(m.VLLM_EXTERNAL_PREFIX_CACHE_HITS, 0.0)
                    h += ext
                    host += ext
            by_role[role] = round(h / q, 6) if q > 0 else None
        out: dict[str, Any] = {
            "prefix_hit_rate": round(hits / prompt, 6) if prompt else None,
            "prefix_hit_rate_by_role": by_role,
            "gpu_hours_by_role": {r: self.ledger.gpu_hours(duration, r)
                                  for r in DISAGGREGATED_ROLES},
            "load_imbalance": {
                r: weighted_percentile(xs, IMBALANCE_PERCENTILE)
                for r, xs in self.imbalance.items()},
            "routing": self.cfg.routing,
            "prefill_hold_s": self.cfg.prefill_hold_s,
        }
        if self.cfg.kv_offloading_gib:
            out["host_hit_rate"] = round(host / prompt, 6) if prompt else None
        return out


def load_imbalance(loads: Sequence[float]) -> tuple[float, float] | None:
    """The busiest engine's requests in flight over the role's mean, each counted as at least
    one request (an engine that holds one request at a time has nothing queued behind it: at
    a light load, all going to one engine is no hot spot), so 1.0 is no hot spot; with the
    role's total as the sample's weight; None while nothing is in flight."""
    total = math.fsum(loads)
    if total <= 0:
        return None
    return max(max(loads), 1.0) / max(total / len(loads), 1.0), total


def weighted_percentile(samples: Sequence[tuple[float, float]], q: float) -> float | None:
    """The q-th percentile of (value, weight) samples: the least value that at least q % of
    the weight is at or below (None: no samples)."""
    if not samples:
        return None
    values, weights = zip(*samples, strict=True)
    x = np.percentile(values, q, weights=weights, method="inverted_cdf")
    return round(float(x), 4)


def replay(trace: Sequence[TraceRequest], policy: ScalingPolicy, cfg: BenchConfig,
           progress: Callable[[float], None] | None = None,
           miss_budget: int | None = None) -> RunResult:
    return Replay(trace, policy, cfg).run(progress, miss_budget)
