"""poolpilot's own autoscaler: the real decision core, `poolpilot.autoscaler.decide.decide`.

Nothing here decides anything: it evaluates the autoscaler's own query set (`QuerySet`: the
same signals, PromQL shapes and 60 s window) on the scraped series, hands the results to the
autoscaler's own `observe.observation()` to build the `Observation`, and builds a
`Policy` from an InferencePool spec with the API's defaults (`Policy.from_spec`), then applies
whatever `decide()` returns. The `History` it gets back is passed to the next call, as the
autoscaler loop does. Cadence: the spec's `autoscaling.intervalSeconds`.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from poolpilot.autoscaler import queries as q
from poolpilot.autoscaler.decide import History, Observation, decide
from poolpilot.autoscaler.decide import Policy as ScalerPolicy
from poolpilot.autoscaler.decide.burst import Clumps
from poolpilot.autoscaler.kube import RoleState
from poolpilot.autoscaler.observe import Snapshot, observation
from poolpilot.bench.policies.base import Bounds, PoolView, ScalingDecision
from poolpilot.bench.policies.static_peak import MinuteLoad
from poolpilot.bench.profile import Capacity

from poolpilot import metrics as m
from poolpilot.roles import DISAGGREGATED_ROLES
from poolpilot.validate import parse_spec

RATE_WINDOW_S = 60.0  # rate() and histogram_quantile() window (autoscaler.queries.QuerySet)
NAMESPACE, POOL = "bench", "pool"


def pool_spec(
    bounds: Bounds, slo_ttft: float, slo_itl: float, quantile: float, overrides: dict[str, Any]
) -> dict[str, Any]:
    """An InferencePool spec as a user would write it for this benchmark."""
    role = {"replicas": max(1, bounds.min_replicas), "minReplicas": bounds.min_replicas,
            "maxReplicas": bounds.max_replicas}
    return {
        "model": {"name": "bench-model"},
        "runtime": {"image": "vllm/vllm-openai:latest"},
        "mode": "Disaggregated",
        "prefill": dict(role),
        "decode": dict(role),
        "slo": {
            "ttft": {"quantile": quantile, "seconds": slo_ttft},
            "itl": {"quantile": quantile, "seconds": slo_itl},
        },
        "autoscaling": {"enabled": True, **overrides},
    }


def profile_targets(load: MinuteLoad, cap: Capacity) -> dict[str, float]:
    """The spec targets a user would set from an offline profile of the engine, at the
    prompt and output lengths of the traffic the pool starts with: prompt tokens/s one prefill
    replica serves, generated tokens/s one decode replica serves within the ITL target."""
    if not load.requests:
        return {}
    return {
        "prefillTokensPerSecondPerReplica": round(cap.prefill_tokens_per_s(load.mean_isl), 1),
        "decodeTokensPerSecondPerReplica": round(
            cap.decode_tokens_per_s(load.mean_isl + load.mean_osl / 2), 1),
    }


def hit_rate(prom: Any, window: float, by: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    """`sum by (role) (rate(hits[w])) / sum by (role) (rate(queries[w]))`, NaN where nothing
    was looked up; no group where the engines export no such counters. As the autoscaler's
    query (queries.hit_rate), hits loaded from a CPU offload tier count too (vLLM's external
    hits; not at decode engines, where they are the prompts sent by the prefill engines)."""
    hits = prom.rate(m.VLLM_PREFIX_CACHE_HITS, window, by=by)
    ext = prom.rate(m.VLLM_EXTERNAL_PREFIX_CACHE_HITS, window, by=by)
    queries = prom.rate(m.VLLM_PREFIX_CACHE_QUERIES, window, by=by)
    return {g: ((hits[g] + (ext.get(g, 0.0) if "decode" not in g else 0.0)) / qv
                if qv > 0 else math.nan)
            for g, qv in queries.items() if g in hits}


class PoolpilotPolicy:
    name = "poolpilot"

    def __init__(
        self,
        bounds: Bounds,
        initial: dict[str, int],
        slo_ttft: float,
        slo_itl: float,
        quantile: float = 0.9,
        autoscaling: dict[str, Any] | None = None,
        rate_window: float = RATE_WINDOW_S,
        profile: dict[str, float] | None = None,
        forecast: bool = True,
        hits: bool = True,
        room: bool = True,
        record: bool = False,
    ) -> None:
        # A user who profiled the engine writes its per-replica throughputs into the spec's
        # targets (the same profile Dynamo's planner gets); explicit settings win.
        given = dict(autoscaling or {})
        targets = {**(profile or {}), **(given.get("targets") or {})}
        if targets:
            given["targets"] = targets
        spec = parse_spec(pool_spec(bounds, slo_ttft, slo_itl, quantile, given))
        self.policy = replace(ScalerPolicy.from_spec(spec), forecast=forecast, burst_room=room)
        self.quantile = quantile
        self.hits = hits  # False: the ablation that never sees the engines' hit rate
        self.interval = float(spec.autoscaling.interval_seconds)
        self.rate_window = rate_window
        # The autoscaler process starts with the pool: no scale-down before its window fills,
        # and it saw the pool's prefill queue empty at the start (a queue that forms before
        # its first decision is a clump, not one of unknown age found at a restart).
        fresh = History.fresh(0.0)
        self.history = replace(fresh, clumps={r: Clumps(seen=True) for r in DISAGGREGATED_ROLES})
        self._initial = dict(initial)
        # `record`: every decision's per-role answer and message, for `bench --decisions`
        self.record = record
        self.decisions: list[dict[str, Any]] = []

    def initial(self) -> dict[str, int]:
        return dict(self._initial)

    def observe(self, view: PoolView) -> Observation:
        """The autoscaler's query results (its own keys, `autoscaler.queries`), evaluated on
        the scraped series, turned into an Observation by the autoscaler's own
        `observe.observation()`."""
        prom, w, qt = view.prom, self.rate_window, self.quantile
        by = ("role",)

        def grouped(d: dict[tuple[str, ...], float]) -> dict[tuple[str, str, str], float]:
            return {(NAMESPACE, POOL, g[0]): v for g, v in d.items()}

        def per_pool(d: dict[tuple[str, ...], float]) -> dict[tuple[str, str, str], float]:
            return {(NAMESPACE, POOL, ""): sum(d.values())} if d else {}

        values = {
            q.WAITING: grouped(prom.gauge(m.VLLM_WAITING, by=by)),
            q.RUNNING: grouped(prom.gauge(m.VLLM_RUNNING, by=by)),
            q.KV_USAGE: grouped(prom.gauge(m.VLLM_KV_USAGE, by=by, agg="avg")),
            q.PROMPT_RATE: grouped(prom.rate(m.VLLM_PROMPT_TOKENS, w, by=by)),
            q.GENERATION_RATE: grouped(prom.rate(m.VLLM_GENERATION_TOKENS, w, by=by)),
            q.REQUEST_RATE: grouped(prom.rate(m.VLLM_REQUEST_SUCCESS, w, by=by)),
            # the engines' prefix-cache hit rate: hit tokens over queried tokens, per role
            q.PREFIX_HIT_RATE: grouped(hit_rate(prom, w, by)) if self.hits else {},
            q.ttft_key(qt): grouped(prom.histogram_quantile(qt, m.VLLM_TTFT, w, by=by)),
            q.itl_key(qt): grouped(prom.histogram_quantile(qt, m.VLLM_ITL, w, by=by)),
            # the router's (by pool): requests it prefilled on decode engines, failed handoffs
            q.LOCAL_PREFILL_RATE: per_pool(prom.rate(
                m.ROUTER_LOCAL_PREFILL, w, match={"reason": m.LOCAL_PREFILL_REASONS[0]})),
            q.KV_FAILURE_RATE: per_pool(prom.rate(m.ROUTER_KV_TRANSFER_FAILURES, w)),
            # prompts it holds for a prefill engine (late binding)
            q.ROUTER_HELD_PREFILL: per_pool(prom.gauge(m.ROUTER_HELD)),
            # max(timestamp(waiting)): every series of a scrape carries the scrape's time
            q.SAMPLE_TIME: {(NAMESPACE, POOL, g[0]): prom.now
                            for g in prom.gauge(m.VLLM_WAITING, by=by)},
        }
        snap = Snapshot(time=view.now, values=values)
        states: dict[str, RoleState] = {
            r: RoleState(replicas=view.roles[r].target, ready=view.roles[r].ready,
                         starting=view.roles[r].starting)
            for r in DISAGGREGATED_ROLES
        }
        return observation(NAMESPACE, POOL, states, snap, qt, qt)

    def decide(self, view: PoolView) -> ScalingDecision:
        d = decide(self.observe(view), self.policy, self.history, view.now)
        if self.record:
            self.decisions.extend(
                {"t": view.now, "role": r, "from": rd.current, "to": rd.replicas,
                 "reason": str(rd.reason), "message": rd.message}
                for r, rd in d.roles.items() if r in DISAGGREGATED_ROLES)
        # the replay applies every decision, so each scale starts its role's cooldown
        self.history = d.history.scaled(
            (r for r, rd in d.roles.items() if rd.replicas != rd.current), view.now)
        return ScalingDecision(
            {r: d.roles[r].replicas for r in DISAGGREGATED_ROLES},
            {r: d.roles[r].reason for r in DISAGGREGATED_ROLES},
        )
