"""The autoscaler loop: one cycle = list pools -> one query set -> decide per pool -> act.

I/O happens here and in the adapters; the decision itself is `decide.decide`. A cycle never
fails as a whole for one bad pool: errors are logged per pool and the next cycle retries.

Time is the injected `Clock`'s simulated seconds (the local sandbox's `--speed`; real seconds in
a cluster): the loop, the policy and the decision core never see another unit. Only the edges
convert: sleeping between cycles, the status's timestamps, the cold starts pods measure, and
(in `observe`) what Prometheus measures per real second.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from poolpilot.autoscaler import decide as core
from poolpilot.autoscaler import victims
from poolpilot.autoscaler.capacity import Memory, learn_measured
from poolpilot.autoscaler.kube import Kube, Obj, parse_time, pod_ready, rfc3339
from poolpilot.autoscaler.metrics import AutoscalerMetrics
from poolpilot.autoscaler.observe import (
    MetricsSource,
    Snapshot,
    cold_start_annotation,
    observation,
    pod_start_times,
)
from poolpilot.autoscaler.queries import COMPILE_CACHE_PHASE
from poolpilot.autoscaler.shard import Shard
from pydantic import ValidationError

from poolpilot import api, names
from poolpilot.clock import Clock
from poolpilot.reasons import Reason
from poolpilot.roles import Role
from poolpilot.validate import InvalidPool, parse_spec

log = logging.getLogger("poolpilot.autoscaler")


@dataclass(frozen=True)
class Options:
    interval: float = 10.0  # seconds between cycles (each pool is decided at its own interval)
    dry_run: bool = False  # decide and report in logs and metrics only: no write at all
    status_refresh: float = 60.0  # rewrite an unchanged status (fresh message) this often
    concurrency: int = 16  # pools acted on at the same time (API writes in flight)
    shard: Shard = field(default_factory=Shard)  # the pools this process decides (all: 0 of 1)


@dataclass
class ColdStarts:
    """One role's measured cold starts: the pods already learned from (and annotated), the
    ready count last seen, and until when to look for the starts of pods that became ready
    (Prometheus scrapes a new pod's phases some seconds after it is ready)."""

    learned: frozenset[str] = frozenset()
    ready: int = -1
    look_until: float = -math.inf
    asked: float = -math.inf


# How long after a rise in ready pods to look for their measured starts, and how often; at
# most this many such questions per cycle (a restarted autoscaler with 1,000 pools asks for
# each role's once, over a few minutes, not 2,000 queries in its first cycle).
COLD_START_LOOK_SECONDS = 120.0
COLD_START_ASK_EVERY = 15.0
COLD_START_QUERIES_PER_CYCLE = 16


@dataclass
class PoolState:
    history: core.History
    last_decided: float = -math.inf
    last_status_write: float = -math.inf
    last_limited: bool = False
    cold_starts: dict[str, ColdStarts] = field(default_factory=dict)


@dataclass(frozen=True)
class Parsed:
    """A pool's spec as parsed for one generation, with the policy made from it."""

    version: tuple[Any, Any]  # (uid, generation)
    spec: api.InferencePoolSpec
    policy: core.Policy


@dataclass
class CycleResult:
    pools: int = 0
    decided: int = 0
    scaled: int = 0
    status_writes: int = 0
    queries: int = 0
    errors: list[str] = field(default_factory=list)
    decisions: dict[tuple[str, str], core.Decision] = field(default_factory=dict)


# The loop's clock on the Unix epoch: its seconds go into status (lastScaleTime, conditions) and
# come back from it after a restart.
UNIX_TIME = Clock(monotonic=time.time)


class Autoscaler:
    def __init__(self, kube: Kube, source: MetricsSource, options: Options | None = None,
                 metrics: AutoscalerMetrics | None = None,
                 clock: Clock = UNIX_TIME) -> None:
        self.kube = kube
        self.source = source
        self.opt = options or Options()
        self.metrics = metrics or AutoscalerMetrics()
        self.clock = clock
        self.pools: dict[tuple[str, str], PoolState] = {}
        self._specs: dict[tuple[Any, Any], Parsed] = {}
        self._cold_start_budget = COLD_START_QUERIES_PER_CYCLE

    async def run(self, stop: asyncio.Event, once: bool = False) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self.cycle()
            except Exception:  # the API server or Prometheus is down: retry next cycle
                log.exception("autoscaler cycle failed")
            if once:
                return
            wait = max(0.0, self.clock.real(self.opt.interval) - (time.monotonic() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)

    async def cycle(self) -> CycleResult:
        t0 = time.perf_counter()
        res = CycleResult()
        pools = await self.kube.list_pools()
        shard = self.opt.shard
        if shard.split:  # the other shards' pools are theirs alone, invalid ones included
            pools = [o for o in pools if shard.owns(*_name(o))]
        specs: list[tuple[Obj, Parsed]] = []
        for obj in pools:
            meta = obj.get("metadata") or {}
            try:
                parsed = self._spec(obj)
            except (InvalidPool, ValidationError) as exc:
                log.warning("skipping %s/%s: invalid spec: %s", meta.get("namespace"),
                            meta.get("name"), exc)
                continue
            auto = parsed.spec.autoscaling
            if auto.enabled and auto.mode != api.AutoscalingMode.EXTERNAL:  # else not ours
                specs.append((obj, parsed))
        res.pools = len(specs)
        seen = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o, _ in specs}
        for key in [k for k in self.pools if k not in seen]:  # deleted or autoscaling off
            del self.pools[key]
            self.metrics.forget(*key)
        listed = {_name(o) for o in pools}
        for key in [k for k in self._specs if k not in listed]:
            del self._specs[key]
        if not specs:
            self.metrics.cycle.observe(time.perf_counter() - t0)
            return res

        workloads = await self.kube.workloads()
        ttft_qs = {p.spec.slo.ttft.quantile for _, p in specs}
        itl_qs = {p.spec.slo.itl.quantile for _, p in specs}
        # A shard asks Prometheus for its own pools' series only.
        mine = frozenset(name for _, name in seen) if shard.split else None
        snap = await asyncio.to_thread(self.source.fetch, ttft_qs, itl_qs, mine)
        res.queries = snap.queries
        self._cold_start_budget = COLD_START_QUERIES_PER_CYCLE
        now = self.clock.now()
        # Pools are independent: their writes overlap, a few at a time.
        limit = asyncio.Semaphore(self.opt.concurrency)

        async def one(obj: Obj, parsed: Parsed) -> None:
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            async with limit:
                try:
                    await self._pool(obj, parsed, workloads, snap, now, res)
                except Exception as exc:  # one pool's API error must not stop the others
                    log.exception("pool %s/%s: %s", *key, exc)
                    res.errors.append(f"{key[0]}/{key[1]}: {exc}")

        await asyncio.gather(*(one(obj, parsed) for obj, parsed in specs))
        self.metrics.cycle.observe(time.perf_counter() - t0)
        return res

    def _spec(self, obj: Obj) -> Parsed:
        """The pool's parsed spec and policy, made once per generation (validating every
        pool's spec every cycle was a third of a cycle's CPU at 1,000 pools; the policy was
        another 5%)."""
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace"), meta.get("name"))
        version = (meta.get("uid"), meta.get("generation"))
        known = self._specs.get(key)
        if known is not None and known.version == version and version[1]:
            return known
        spec = parse_spec(obj.get("spec") or {})
        policy = core.Policy.from_spec(spec)
        # the window the signals' rates are taken over (a PromQL range, real seconds): how
        # late a rise shows, which the forecast's margin covers
        window = getattr(getattr(self.source, "query_set", None), "window_seconds", None)
        if isinstance(window, int | float) and window > 0:
            policy = replace(policy, rate_window=self.clock.simulated(float(window)))
        parsed = self._specs[key] = Parsed(version, spec, policy)
        return parsed

    def _state(self, obj: Obj, roles: Sequence[str], now: float) -> PoolState:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        st = self.pools.get(key)
        if st is None:
            # Restart safety: the cooldown clock comes back from status.<role>.lastScaleTime;
            # the stabilization window cannot, so no scale-down until it has filled again.
            status = obj.get("status") or {}
            last = {r: self.clock.simulated(t) for r in roles
                    if (t := parse_time((status.get(r) or {}).get("lastScaleTime"))) is not None}
            st = self.pools[key] = PoolState(core.History.fresh(now, last))
        return st

    async def _pool(self, obj: Obj, parsed: Parsed, wl: Any, snap: Snapshot,
                    now: float, res: CycleResult) -> None:
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        spec = parsed.spec
        roles: Sequence[str] = spec.engine_roles()
        st = self._state(obj, roles, now)
        if now - st.last_decided < spec.autoscaling.interval_seconds - 1e-6:
            return
        uid = str(obj["metadata"].get("uid") or "")
        states = {r: s for r in roles if (s := wl.role_state(ns, name, r, uid)) is not None}
        if not states:
            return  # the operator has not made the Deployments yet
        policy = parsed.policy
        if any(r not in states for r in policy.bounds):  # decide only the roles that exist
            policy = replace(policy, bounds={r: b for r, b in policy.bounds.items()
                                             if r in states})
        obs = observation(ns, name, states, snap, spec.slo.ttft.quantile, spec.slo.itl.quantile,
                          router=wl.role_state(ns, name, Role.ROUTER, uid), clock=self.clock)
        for role, state in states.items():
            await self._measured_cold_starts(ns, name, role, state.ready, uid, st, now)
        d = core.decide(obs, policy, st.history, now)
        # The recommendations are remembered now; a role's scale time (its cooldown clock)
        # only once the write has succeeded, below: a failed write must not start a cooldown
        # for a scale that never happened, and an Advisory decision starts none at all.
        st.history = d.history
        st.last_decided = now
        res.decided += 1
        res.decisions[(ns, name)] = d

        apply = spec.autoscaling.mode == api.AutoscalingMode.APPLY and not self.opt.dry_run
        scaled: list[core.RoleDecision] = []
        failed: dict[str, str] = {}
        for role, rd in d.roles.items():
            if apply and rd.replicas != rd.current:
                marked = (await self._mark_victims(ns, name, role, rd.replicas, uid)
                          if rd.replicas < rd.current else [])
                try:
                    await self.kube.scale(ns, names.child_name(name, role), rd.replicas)
                except Exception as exc:  # API error: no cooldown, retried next interval
                    await self._unmark(ns, name, marked)
                    log.warning("pool %s/%s: scaling %s to %d failed: %s", ns, name, role,
                                rd.replicas, exc)
                    failed[role] = f"{type(exc).__name__}: {exc}"
                    res.errors.append(f"{ns}/{name}: scale {role}: {exc}")
                else:
                    st.history = st.history.scaled([role], now)
                    scaled.append(rd)
            self.metrics.record(ns, name, rd, d.metrics_available.status)
            if log.isEnabledFor(logging.INFO):
                log.info("%s", json.dumps(_log_line(ns, name, spec, obs, rd, apply),
                                          default=str))
        res.scaled += len(scaled)
        if self.opt.dry_run:
            return
        if await self._write_status(obj, d, obs, scaled, failed, now, st, spec):
            res.status_writes += 1
        for rd in scaled:
            verb = Reason.SCALED_UP if rd.direction == core.UP else Reason.SCALED_DOWN
            await self.kube.event(obj, verb, f"{rd.message}")
        for role, err in failed.items():
            rd = d.roles[role]
            await self.kube.event(obj, Reason.SCALE_FAILED,
                                  f"{role} {rd.current} -> {rd.replicas} not applied: {err}",
                                  "Warning")
        if d.scaling_limited.status and not st.last_limited:
            await self.kube.event(obj, d.scaling_limited.reason, d.scaling_limited.message,
                                  "Warning")
        st.last_limited = d.scaling_limited.status

    async def _measured_cold_starts(self, ns: str, pool: str, role: str, ready: int,
                                    uid: str, st: PoolState, now: float) -> None:
        """Learn the role's cold start from its new pods' measured starts and write each on
        its pod (poolpilot.dev/cold-start). Asked from Prometheus only for a while after the
        ready count rose (or the pool is new to this process: its pods teach it at once),
        so a pool whose engines export no phases costs nothing in steady state."""
        cs = st.cold_starts.setdefault(role, ColdStarts())
        if ready > cs.ready:
            cs.look_until = now + COLD_START_LOOK_SECONDS
        cs.ready = ready
        fetch = getattr(self.source, "cold_starts", None)
        # (a role never asked keeps its turn past the window: its pods were scraped long ago)
        if (fetch is None or len(cs.learned) >= ready or self._cold_start_budget <= 0
                or (now > cs.look_until and cs.asked > -math.inf)
                or now - cs.asked < COLD_START_ASK_EVERY):
            return
        self._cold_start_budget -= 1
        cs.asked = now
        try:
            measured = await asyncio.to_thread(fetch, ns, pool, role)
            new = sorted(set(measured) - cs.learned)
            if not new:
                return
            pods = {str((p.get("metadata") or {}).get("name", "")): p
                    for p in await self.kube.role_pods(ns, pool, role, uid)}
            notes = []
            for pod_name in new:
                if pod_name not in pods:
                    continue  # gone already (its series lingers until it is stale)
                phases = dict(measured[pod_name])
                hit = phases.pop(COMPILE_CACHE_PHASE, None)
                note = cold_start_annotation(phases, hit, *pod_start_times(pods[pod_name]))
                notes.append((pod_name, note))
            # Oldest first, so the learned value ends on the newest start.
            notes.sort(key=lambda n: pod_start_times(pods[n[0]])[0] or 0.0)
            mem = st.history.memory.get(role, Memory())
            st.history = replace(st.history, memory={
                **st.history.memory,
                # (the pods' timestamps and the launcher's phases are real seconds)
                role: learn_measured(mem, [self.clock.simulated(note["total"])
                                           for _, note in notes])})
            cs.learned = frozenset(p for p in cs.learned | {n for n, _ in notes}
                                   if p in measured)
            for pod_name, note in notes:
                value = json.dumps(note, separators=(",", ":"))
                current = ((pods[pod_name].get("metadata") or {}).get("annotations")
                           or {}).get(names.COLD_START_ANNOTATION)
                if not self.opt.dry_run and current != value:
                    await self.kube.annotate_pod(ns, pod_name,
                                                 {names.COLD_START_ANNOTATION: value})
            if notes:
                log.info("pool %s/%s %s: measured cold starts %s", ns, pool, role,
                         json.dumps(dict(notes), separators=(",", ":")))
        except Exception as exc:  # best effort: the ready transitions still teach it
            log.warning("pool %s/%s: reading the %s cold starts failed: %s", ns, pool, role,
                        exc)

    async def _mark_victims(self, ns: str, pool: str, role: str, replicas: int,
                            pool_uid: str = "") -> list[str]:
        """Before a scale-down to `replicas`: annotate the pods whose loss costs least
        (`victims.py`) so that the ReplicaSet controller deletes them and the router stops
        sending to them first; marks left from before are cleared. Best effort: a failure
        here costs the choice of victim, never the scale-down. Returns the pods marked."""
        try:
            pods = [p for p in await self.kube.role_pods(ns, pool, role, pool_uid)
                    if not (p.get("metadata") or {}).get("deletionTimestamp")]
            fetch = getattr(self.source, "pod_loads", None)
            series = await asyncio.to_thread(fetch, ns, pool, role) if fetch else None
            loads, marked = [], {}
            for pod in pods:
                meta = pod.get("metadata") or {}
                pod_name = str(meta.get("name", ""))
                ip = str((pod.get("status") or {}).get("podIP") or "")
                hits = expected = flight = None
                if series is not None:
                    flight = series.pod_in_flight.get(pod_name)
                    hits = series.pod_prefix_hits.get(pod_name)
                    expected = next((v for url, v in series.endpoint_expected_hits.items()
                                     if ip and _host(url) == ip), None)
                loads.append(victims.PodLoad(pod_name, pod_ready(pod), flight,
                                             hits if hits is not None else expected))
                marked[pod_name] = ((meta.get("annotations") or {}).get(names.DRAINING)
                                    == "true")
            patches = victims.annotation_patches(loads, len(pods) - replicas, marked)
            for pod_name, annotations in patches.items():
                await self.kube.annotate_pod(ns, pod_name, annotations)
            return [n for n, a in patches.items() if a.get(names.DRAINING) is not None]
        except Exception as exc:
            log.warning("pool %s/%s: choosing the %s pods to remove failed: %s", ns, pool,
                        role, exc)
            return []

    async def _unmark(self, ns: str, pool: str, marked: list[str]) -> None:
        """The scale-down did not happen: the marked pods serve on."""
        for pod_name in marked:
            try:
                await self.kube.annotate_pod(ns, pod_name, {names.DELETION_COST: None,
                                                            names.DRAINING: None})
            except Exception as exc:
                log.warning("pool %s/%s: clearing the draining mark of %s failed: %s", ns,
                            pool, pod_name, exc)

    async def _write_status(self, obj: Obj, d: core.Decision, obs: core.Observation,
                            scaled: list[core.RoleDecision], failed: Mapping[str, str],
                            now: float, st: PoolState, spec: api.InferencePoolSpec) -> bool:
        status = obj.get("status") or {}
        refresh = now - st.last_status_write >= self.opt.status_refresh
        role_fields: dict[str, Obj] = {}
        for role, rd in d.roles.items():
            live = status.get(role) or {}
            fields: Obj = {"desiredReplicas": rd.replicas, "reason": rd.reason}
            if (refresh or any(live.get(k) != v for k, v in fields.items())
                    or rd in scaled or role in failed):
                note = f"; not applied: {failed[role]}" if role in failed else ""
                fields["message"] = (rd.message + note)[:1024]
                if rd in scaled:
                    fields["lastScaleTime"] = rfc3339(self.clock.real(now))
                role_fields[role] = fields
        metrics = None
        if refresh or role_fields:
            metrics = {"ttftSeconds": _round(obs.router_ttft if _ok(obs.router_ttft) else
                                             _first_ttft(obs)),
                       "itlSeconds": _round(_itl(obs))}
        when = _rfc3339(self.clock.real(now))
        gen = (obj.get("metadata") or {}).get("generation")
        conds = [
            _cond(api.ConditionType.METRICS_AVAILABLE, d.metrics_available, when, gen),
            _cond(api.ConditionType.SCALING_LIMITED, d.scaling_limited, when, gen),
        ]
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        wrote = await self.kube.patch_status(ns, name, role_fields, metrics, conds)
        if wrote:
            st.last_status_write = now
        return wrote


@functools.lru_cache(maxsize=4)
def _rfc3339(t: float) -> str:
    """rfc3339, once per cycle rather than once per pool (every pool's `now` is the cycle's)."""
    return rfc3339(t)


def _host(url: str) -> str:
    """'http://10.0.0.5:8000' -> '10.0.0.5' ('http://[fd00::1]:8000' -> 'fd00::1')."""
    rest = url.split("://", 1)[-1].split("/", 1)[0]
    if rest.startswith("["):
        return rest[1:].split("]", 1)[0]
    return rest.rsplit(":", 1)[0] if ":" in rest else rest


def _name(obj: Obj) -> tuple[Any, Any]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace"), meta.get("name")


def _cond(type_: str, c: core.ConditionDecision, when: str, gen: int | None) -> Obj:
    out: Obj = {"type": str(type_), "status": "True" if c.status else "False",
                "reason": c.reason, "message": c.message[:1024], "lastTransitionTime": when}
    if gen is not None:
        out["observedGeneration"] = gen
    return out


def _ok(v: float | None) -> bool:
    return v is not None and not math.isnan(v) and not math.isinf(v)


def _round(v: float | None) -> float | None:
    return float(f"{v:.4g}") if v is not None and _ok(v) else None


def _first_ttft(obs: core.Observation) -> float | None:
    for role in (Role.PREFILL, Role.ENGINE):
        o = obs.roles.get(role)
        if o is not None and _ok(o.ttft):
            return o.ttft
    return None


def _itl(obs: core.Observation) -> float | None:
    for role in (Role.DECODE, Role.ENGINE):
        o = obs.roles.get(role)
        if o is not None and _ok(o.itl):
            return o.itl
    return None


def _log_line(ns: str, name: str, spec: api.InferencePoolSpec, obs: core.Observation,
              rd: core.RoleDecision, apply: bool) -> dict[str, Any]:
    o = obs.roles[rd.role]
    inputs: Mapping[str, Any] = {
        "replicas": o.replicas, "ready": o.ready_replicas, "starting": o.starting,
        "unschedulable": o.unschedulable, "waiting": o.waiting, "running": o.running,
        "kvUsage": o.kv_usage, "ttft": o.ttft, "itl": o.itl,
        "promptTokensRate": o.prompt_tokens_rate,
        "generationTokensRate": o.generation_tokens_rate, "sampleAge": o.sample_age,
        "routerTtft": obs.router_ttft, "routerInflight": obs.router_inflight,
        "routerRequestRate": obs.router_request_rate, "prometheusError": obs.prometheus_error,
    }
    return {
        "event": "decision", "namespace": ns, "pool": name, "role": rd.role,
        "mode": "Apply" if apply else "Advisory", "current": rd.current,
        "desired": rd.replicas, "direction": rd.direction, "reason": rd.reason,
        "inputs": inputs,
        "signals": {s.name: {"value": s.value, "target": s.target, "proposal": s.proposal}
                    for s in rd.signals},
        "steps": [[s.name, s.replicas, s.reason] for s in rd.steps],
        "message": rd.message,
    }
