"""The hindsight oracle's plan: per role and per window, the fewest ready replicas that meet the
SLO, found by search through the same simulated pool every policy is replayed on.

How a plan is made (`plan_oracle`):

1. **Needs, window by window, through the simulator.** The trace is cut into windows of
   `window` seconds (30 s). A search pool (`PoolSim`, built like the replay's) is carried
   forward in time; at the start of each window it is copied, the copy is given `p` prefill
   and `d` decode replicas ready at that instant (extra ones drain, as in the replay), fed
   the window's arrivals plus the next `tail` seconds of them (so the window's requests
   compete with what follows), and run until all of them finish. The window's requests
   that miss the SLO (TTFT and their own p90 ITL, as the report counts them) are counted.
   `(p, d)` is acceptable when at most `floor((1 - target) x requests)` of the requests
   that can meet the SLO at all missed (the target: by default the bench's goal, 0.95, so
   that the oracle meets exactly what every other policy is asked to), besides the ones that
   cannot
   (`poolpilot.bench.ceiling`: prompts too long to prefill within the TTFT target even on an
   idle pool). The search starts from the capacity profile's estimate for the window, corrected
   by how the previous window's need compared with its own estimate; it grows the role
   whose requests missed (TTFT misses: prefill, unless the last prefill step did not help,
   which is decode holding the handoff for want of KV cache; ITL misses: decode) with
   doubling steps until acceptable, then shrinks each role in turn (one step, then doubling, then
   bisection) to the smallest acceptable count with the other held. The search pool then
   advances through the window with the chosen pool, and the next window starts from the
   state this one left (its backlog included). A window that no pool within the bounds
   makes acceptable gets the smallest pool that misses no more than the largest one does
   (plus the allowance), and is counted as unattainable.
2. **Orders, from the needs (`OraclePlan.pods_at`).** A pod serves a window only if it was
   ordered one cold start before the window starts; a pod that is released and needed
   again later costs a new cold start. So the pods billed at time t must be at least the
   largest need over the windows that overlap [t, t + cold start]: any pod needed then
   must already exist at t. The oracle bills exactly that many (rounded to its decision
   interval), which is the least any schedule can bill for these needs: it orders each pod
   exactly one cold start ahead, keeps a pod through a gap shorter than a cold start (which
   is cheaper than re-ordering it) and releases it as soon as no window within the next cold
   start needs it.

Why it is close to the cheapest schedule that meets the SLO: step 2 is exact for the needs;
step 1 gives each window the smallest pool that serves it within the target given what the
earlier windows left, so a cheaper schedule must miss more requests in some window (or
carry more backlog into the next). It is greedy, not a global optimum: it never buys a
replica early to drain a backlog that a later window would otherwise pay for.
"""

from __future__ import annotations

import bisect
import itertools
import math
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from poolpilot.bench.ceiling import slo_ceiling
from poolpilot.bench.policies.base import Bounds
from poolpilot.bench.policies.static_peak import MinuteLoad, size_for
from poolpilot.bench.profile import Capacity
from poolpilot.bench.replay import BenchConfig, meets_slo, new_pool_sim, to_sim_requests
from poolpilot.engine_sim.des import PoolSim, RequestRecord
from poolpilot.engine_sim.traces import TraceRequest

from poolpilot.roles import DISAGGREGATED_ROLES, Role

DEFAULT_WINDOW_S = 30.0
DEFAULT_TARGET = 0.95  # the bench's goal: the oracle meets what the others are asked to


class _SearchSim(PoolSim):
    """The search pool: hands over finished records so that its copies stay small."""

    def take_records(self) -> list[RequestRecord]:
        out = self.records()
        self._records.clear()
        return out


@dataclass(frozen=True)
class WindowNeed:
    start: float
    prefill: int
    decode: int
    requests: int
    misses: int  # of this window's requests, in the search with the chosen pool
    trials: int  # simulations run to find it
    attainable: bool = True


@dataclass
class OraclePlan:
    window: float
    needs: list[WindowNeed] = field(default_factory=list)

    def pods_at(self, t: float, ahead: float, floor: int) -> dict[str, int]:
        """Pods to hold at time t: the largest need of any window that overlaps (t, t+ahead)
        (`ahead` = cold start + the decision interval: what must be ordered now to be ready
        in time), at least `floor`."""
        out: dict[str, int] = {r: floor for r in DISAGGREGATED_ROLES}
        for w in self.needs:
            if w.start < t + ahead and w.start + self.window > t:
                out[Role.PREFILL] = max(out[Role.PREFILL], w.prefill)
                out[Role.DECODE] = max(out[Role.DECODE], w.decode)
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "window_s": self.window,
            "windows": len(self.needs),
            "unattainable_windows": sum(1 for w in self.needs if not w.attainable),
            "trials": sum(w.trials for w in self.needs),
            "peak_need": {Role.PREFILL: max((w.prefill for w in self.needs), default=0),
                          Role.DECODE: max((w.decode for w in self.needs), default=0)},
        }


@dataclass
class _Trial:
    misses: int = 0
    ttft_misses: int = 0  # missed on TTFT (or failed)
    itl_misses: int = 0  # TTFT met, ITL missed
    complete: bool = True  # False: stopped early once over the allowance
    prefill_queued: bool = False  # prompts waited at a prefill engine
    decode_blocked: bool = False  # handoffs waited at a decode engine (KV cache or seqs full)


def _queued(sim: PoolSim, role: str) -> int:
    """Requests waiting to be scheduled on the role's engines (KV loads in flight excluded),
    and those the router holds for them (late binding, or none ready)."""
    return sim.pending(role) + sum(len(r.engine.sched.waiting) for r in sim.replicas.values()
                                   if r.role == role and r.removed_at is None)


def _resize(sim: PoolSim, role: str, n: int) -> None:
    c = sim.replica_counts(role)
    cur = c.ready + c.starting
    for _ in range(n - cur):
        sim.add_replica(role)
    for _ in range(cur - n):
        sim.remove_replica(role)


class _Planner:
    def __init__(self, trace: Sequence[TraceRequest], cfg: BenchConfig, bounds: Bounds,
                 capacity: Capacity, window: float, target: float, tail: float,
                 unreachable: Sequence[bool]) -> None:
        self.cfg = cfg
        self.unreachable = list(itertools.accumulate((int(u) for u in unreachable), initial=0))
        self.bounds = bounds
        self.capacity = capacity
        self.window = window
        self.target = target
        self.tail = tail
        self.reqs = to_sim_requests(trace)
        self.arrivals = [r.arrival for r in self.reqs]
        self.sim = new_pool_sim(cfg, _SearchSim)
        assert isinstance(self.sim, _SearchSim)
        self.ratio = {r: 1.0 for r in DISAGGREGATED_ROLES}  # need / profile estimate, last window

    def _idx(self, t: float) -> int:
        return bisect.bisect_left(self.arrivals, t)

    def trial(self, blob: bytes, p: int, d: int, i0: int, i1: int, it: int,
              stop_after: float) -> _Trial:
        sim = pickle.loads(blob)
        _resize(sim, Role.PREFILL, p)
        _resize(sim, Role.DECODE, d)
        sim.submit_many(self.reqs[i0:it])
        last = self.arrivals[it - 1] if it > i0 else sim.now
        out = _Trial()
        cfg = self.cfg
        while True:
            sim.run_until(sim.now + 2.0)
            out.prefill_queued = out.prefill_queued or _queued(sim, Role.PREFILL) > 0
            out.decode_blocked = out.decode_blocked or _queued(sim, Role.DECODE) > 0
            for r in sim.take_records():
                if not i0 <= r.id < i1 or meets_slo(r, cfg.slo_ttft, cfg.slo_itl):
                    continue
                out.misses += 1
                ttft = None if r.first_token_at is None else r.first_token_at - r.arrival
                if not r.ok or ttft is None or ttft > cfg.slo_ttft:
                    out.ttft_misses += 1
                else:
                    out.itl_misses += 1
            if out.misses > stop_after:
                out.complete = False
                return out
            if sim.now >= last and sim.in_flight() == 0:
                return out

    def window_need(self, s: float, guess: dict[str, int]) -> WindowNeed:
        e = s + self.window
        i0, i1, it = self._idx(s), self._idx(e), self._idx(e + self.tail)
        count = i1 - i0
        lo, hi = self.bounds.min_replicas, self.bounds.max_replicas
        if count == 0:
            return WindowNeed(s, lo, lo, 0, 0, 0)
        blob = pickle.dumps(self.sim, protocol=pickle.HIGHEST_PROTOCOL)
        lost = self.unreachable[i1] - self.unreachable[i0]  # cannot meet the SLO at all
        allowed = math.floor((1.0 - self.target) * (count - lost)) + lost
        cache: dict[tuple[int, int], _Trial] = {}

        def run(p: int, d: int, exact: bool = False) -> _Trial:
            got = cache.get((p, d))
            if got is None or (exact and not got.complete):
                got = self.trial(blob, p, d, i0, i1, it, math.inf if exact else allowed)
                cache[(p, d)] = got
            return got

        def ok(p: int, d: int) -> bool:
            return run(p, d).misses <= allowed

        p = min(hi, max(lo, guess[Role.PREFILL]))
        d = min(hi, max(lo, guess[Role.DECODE]))
        step = {Role.PREFILL: 1, Role.DECODE: 1}
        attainable = True
        while not ok(p, d):
            if p == hi and d == hi:
                # No pool within the bounds meets the target: settle for the smallest pool
                # that does as well as the largest one.
                attainable = False
                allowed = run(hi, hi, exact=True).misses + allowed - lost
                break
            tr = cache[(p, d)]
            # Grow the role that held requests up: prefill when prompts queued there and
            # first tokens came late; decode when tokens came too slowly or handoffs waited
            # at a decode engine for room in its KV cache.
            grow_p = tr.ttft_misses > 0 and tr.prefill_queued and p < hi
            grow_d = (tr.itl_misses > 0 or tr.decode_blocked) and d < hi
            if not grow_p and not grow_d:  # misses with no queue seen: try either
                grow_p, grow_d = p < hi, p == hi
            if grow_p:
                p = min(hi, p + step[Role.PREFILL])
                step[Role.PREFILL] *= 2
            if grow_d:
                d = min(hi, d + step[Role.DECODE])
                step[Role.DECODE] *= 2
        p = _shrink(lambda x: ok(x, d), lo, p)
        d = _shrink(lambda x: ok(p, x), lo, d)
        misses = run(p, d, exact=True).misses
        return WindowNeed(s, p, d, count, misses, len(cache), attainable)

    def advance(self, s: float, need: WindowNeed) -> None:
        e = s + self.window
        _resize(self.sim, Role.PREFILL, need.prefill)
        _resize(self.sim, Role.DECODE, need.decode)
        self.sim.submit_many(self.reqs[self._idx(s):self._idx(e)])
        self.sim.run_until(e)
        assert isinstance(self.sim, _SearchSim)
        self.sim.take_records()

    def estimate(self, s: float) -> dict[str, int]:
        """The capacity profile's replicas for this window's load (no backlog, no burst)."""
        reqs = self.reqs[self._idx(s):self._idx(s + self.window)]
        n, w = len(reqs), self.window
        pt = sum(r.prompt_tokens for r in reqs)
        ot = sum(r.output_tokens for r in reqs)
        load = MinuteLoad(s, n, pt / w, ot / w, pt / n if n else 0.0, ot / n if n else 0.0)
        return size_for(load, self.capacity, Bounds(1, 10**6))

    def plan(self, progress: Callable[[float], None] | None = None) -> OraclePlan:
        plan = OraclePlan(self.window)
        end = self.arrivals[-1] if self.arrivals else 0.0
        s = 0.0
        while s <= end:
            est = self.estimate(s)
            guess: dict[str, int] = {r: math.ceil(est[r] * self.ratio[r] - 1e-9)
                                     for r in DISAGGREGATED_ROLES}
            need = self.window_need(s, guess)
            if need.requests:
                self.ratio = {Role.PREFILL: need.prefill / est[Role.PREFILL],
                              Role.DECODE: need.decode / est[Role.DECODE]}
            plan.needs.append(need)
            self.advance(s, need)
            if progress is not None:
                progress(min(end, s + self.window))
            s += self.window
        return plan


def _shrink(ok: Callable[[int], bool], lo: int, cur: int) -> int:
    """The smallest x in [lo, cur] with ok(x), given ok(cur) and ok monotone: one step down,
    then doubling steps, then bisection between the last failure and the last success."""
    good, bad, step = cur, lo - 1, 1
    while good > lo:
        x = max(lo, good - step)
        if ok(x):
            good, step = x, step * 2
        else:
            bad = x
            break
    while good - bad > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def plan_oracle(trace: Sequence[TraceRequest], cfg: BenchConfig, bounds: Bounds,
                capacity: Capacity, window: float = DEFAULT_WINDOW_S,
                target: float = DEFAULT_TARGET, tail: float | None = None,
                progress: Callable[[float], None] | None = None,
                unreachable: Sequence[bool] | None = None) -> OraclePlan:
    if not window > 0:
        raise ValueError(f"--oracle-window must be > 0 seconds, got {window}")
    if not 0 < target <= 1:
        raise ValueError(f"--oracle-target must be in (0, 1], got {target}")
    if unreachable is None:
        unreachable = slo_ceiling(trace, cfg).unreachable
    planner = _Planner(trace, cfg, bounds, capacity, window, target,
                       window if tail is None else tail, unreachable)
    return planner.plan(progress)


# The trace's opening that the starting pool is sized for, whatever the cold start: the replay
# starts with no request in flight, so decode's KV fills over the first minutes, and a pool sized
# for a shorter opening (one 20 s cold start) started short of what the trace soon needed.
OPENING_S = 120.0


def warm_start(trace: Sequence[TraceRequest], cfg: BenchConfig, bounds: Bounds,
               capacity: Capacity, window: float = DEFAULT_WINDOW_S,
               target: float = DEFAULT_TARGET) -> dict[str, int]:
    """The pool every autoscaled policy starts with: the fewest replicas that serve the
    trace's opening within the SLO, its first cold start and at least OPENING_S (the
    oracle's own search, window by window; the oracle starts with the same). A trace is a cut
    from traffic that was already flowing, and no policy can change its pool before one cold
    start has passed, so every policy starts level and is judged on how it follows the trace
    from there. (Sizing for a mean load at
    full utilization, as before, started every autoscaled pool behind the oracle, and the
    first window alone can be a partial one.)"""
    span = max(cfg.cold_start, OPENING_S, window)
    head = [r for r in trace if r.arrival_s < span + window]
    if not head:
        return {r: bounds.min_replicas for r in DISAGGREGATED_ROLES}
    plan = plan_oracle(head, cfg, bounds, capacity, window, target, tail=window)
    firsts = [w for w in plan.needs if w.start < span] or plan.needs[:1]
    return {Role.PREFILL: max(bounds.min_replicas, *(w.prefill for w in firsts)),
            Role.DECODE: max(bounds.min_replicas, *(w.decode for w in firsts))}
