"""Prometheus adapter: run the fixed query set once per cycle and turn it into Observations.

`PrometheusSource.fetch()` does the I/O (through prometheus-api-client): it reads the
autoscaler's recording rules with one query where Prometheus has them loaded (see
`recording`), and queries the rest raw. `observation()` is a pure function that assembles one
pool's `decide.Observation` from a `Snapshot` and the Kubernetes view of its roles.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import orjson
from poolpilot.autoscaler import queries as q
from poolpilot.autoscaler import recording
from poolpilot.autoscaler.decide import Observation, RoleObservation
from poolpilot.autoscaler.promaccess import PrometheusAccess

log = logging.getLogger("poolpilot.autoscaler")
GroupKey = tuple[str, str, str]  # (namespace, pool, role); role "" for per-pool series


class PrometheusQueryError(RuntimeError):
    """Prometheus answered a query with an error status."""


@dataclass
class Snapshot:
    """Every query's result at one evaluation time: key -> {(namespace, pool, role): value}.

    A group missing from a key's dict had no series (no data); NaN values stay NaN.
    `error` is set when Prometheus could not answer (then `values` may be partial).
    """

    time: float
    values: dict[str, dict[GroupKey, float]] = field(default_factory=dict)
    error: str | None = None
    queries: int = 0
    recorded: int = 0  # signals read from recording rules (the rest were queried raw)

    def get(self, key: str, group: GroupKey) -> float | None:
        return self.values.get(key, {}).get(group)


class MetricsSource(Protocol):
    def fetch(self, ttft_quantiles: Iterable[float], itl_quantiles: Iterable[float],
              pools: Collection[str] | None = None) -> Snapshot:
        """Every signal at one instant; `pools`: only pools of these names (a shard's)."""
        ...


@dataclass(frozen=True)
class RoleState:
    """The Kubernetes view of one role (see decide.RoleObservation for the meaning)."""

    replicas: int
    ready: int
    starting: int = 0
    unschedulable: int = 0
    unschedulable_message: str = ""


class PrometheusSource:
    """Runs the QuerySet against a Prometheus server, a few queries in parallel.

    `use_rules`: read the autoscaler's recording rules where Prometheus has them (checked on
    /api/v1/rules every `rules_refresh` seconds); False: always the raw queries."""

    def __init__(self, url: str, query_set: q.QuerySet | None = None, timeout: float = 10.0,
                 parallel: int = 4, use_rules: bool = True, rules_refresh: float = 60.0,
                 access: PrometheusAccess | None = None) -> None:
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        self.url = url
        self.query_set = query_set or q.QuerySet()
        self.timeout = timeout
        self.parallel = parallel
        self.use_rules = use_rules
        self.rules_refresh = rules_refresh
        self.rules = recording.Loaded()
        self._rules_checked = -math.inf
        self._rules_said: str | None = None
        access = access or PrometheusAccess()
        # One quick retry: a cycle that cannot reach Prometheus holds and tries next cycle.
        # POST, because the namespace matcher can make a query long. TLS is verified (against
        # access.ca_file when given) unless switched off explicitly.
        self._prom = PrometheusConnect(
            url=url,
            headers=dict(access.headers) or None,
            auth=access.auth(),
            session=access.session(),
            timeout=timeout,
            retry=Retry(total=1, backoff_factor=0.1, status_forcelist=(502, 503, 504),
                        allowed_methods=None),
            method="POST",
        )

    def _check_rules(self) -> None:
        """Which recording rules Prometheus evaluates now; any failure means none (raw)."""
        now = time.monotonic()
        if not self.use_rules or now - self._rules_checked < self.rules_refresh:
            return
        self._rules_checked = now
        expected = recording.recording_rules(self.query_set.window())
        try:
            resp = self._prom._session.get(
                f"{self.url}/api/v1/rules", params={"type": "record"},
                headers=self._prom.headers, auth=self._prom.auth, timeout=self.timeout)
            resp.raise_for_status()
            self.rules = recording.loaded(resp.json(), expected)
            said = self.rules.summary(len(expected))
        except Exception as exc:  # an older or proxied Prometheus without the rules API
            self.rules = recording.Loaded()
            said = f"cannot read recording rules ({type(exc).__name__}: {exc}"[:300] + ")"
        if said != self._rules_said:  # one line when it changes, not one per cycle
            self._rules_said = said
            log.info("prometheus %s: %s; %s", self.url, said,
                     "querying the rest raw" if self.rules.missing else "one query per cycle")

    def _query(self, promql: str, at: float) -> list[Any]:
        """One instant query through the client's session (its TLS, auth, headers and retry),
        as a form POST (a long namespace matcher stays out of the URL); the answer decoded
        with orjson: at 1,000 pools the recorded signals are megabytes of JSON, and decoding
        them with the standard library was the largest part of a cycle's CPU."""
        session = self._prom._session
        resp = session.post(
            f"{self.url}/api/v1/query",
            data={"query": promql, "time": at, "timeout": f"{round(self.timeout * 1000)}ms"},
            headers=self._prom.headers, auth=self._prom.auth, verify=session.verify,
            cert=session.cert, timeout=self.timeout)
        if resp.status_code != 200:
            raise PrometheusQueryError(
                f"HTTP Status Code {resp.status_code} ({resp.content[:300]!r})")
        result: list[Any] = orjson.loads(resp.content)["data"]["result"]
        return result

    def fetch(self, ttft_quantiles: Iterable[float] = (0.9,),
              itl_quantiles: Iterable[float] = (0.9,),
              pools: Collection[str] | None = None) -> Snapshot:
        self._check_rules()
        qs = self.query_set if pools is None else replace(self.query_set,
                                                          pools=tuple(sorted(pools)))
        plan = recording.plan(qs, ttft_quantiles, itl_quantiles, self.rules.usable)
        # One evaluation time for every query, so all signals describe the same instant.
        snap = Snapshot(time=time.time(), queries=plan.count)
        jobs = list(plan.raw.items())
        if plan.combined is not None:
            jobs.insert(0, ("", plan.combined))  # the big one first

        def run(item: tuple[str, str]) -> tuple[str, list[Any] | str]:
            key, promql = item
            try:
                result = self._query(promql, snap.time)
            except Exception as exc:  # connection refused, 4xx/5xx, timeouts: all "no data"
                return key, f"{type(exc).__name__}: {exc}"
            return key, result

        with ThreadPoolExecutor(max_workers=self.parallel) as pool:
            for key, out in pool.map(run, jobs):
                if isinstance(out, str):
                    snap.error = snap.error or f"{key or 'recorded signals'}: {out}"[:500]
                    if not key:  # the rules may be gone: look again next cycle
                        self._rules_checked = -math.inf
                elif key:
                    snap.values[key] = parse_vector(out)
                else:
                    for k, values in parse_combined(out, plan).items():
                        snap.values.setdefault(k, {}).update(values)
                    snap.recorded = plan.recorded
        return snap


    def pod_loads(self, namespace: str, pool: str, role: str) -> PodSeries:
        """The per-pod series of one role (`QuerySet.pod_queries`); a failed query is no
        data (the choice then falls back on readiness and names)."""
        out = PodSeries()
        now = time.time()
        for key, promql in self.query_set.pod_queries(namespace, pool, role).items():
            try:
                result = self._query(promql, now)
            except Exception as exc:
                log.info("pool %s/%s: per-pod %s unavailable: %s", namespace, pool, key, exc)
                continue
            label = "endpoint" if key == q.ENDPOINT_EXPECTED_HITS else "pod"
            values = {str((s.get("metric") or {}).get(label, "")): float(s["value"][1])
                      for s in result or []}
            setattr(out, key, values)
        return out


@dataclass
class PodSeries:
    """Per-pod values of one role: pod name (router: endpoint URL) -> value."""

    pod_in_flight: dict[str, float] = field(default_factory=dict)
    pod_prefix_hits: dict[str, float] = field(default_factory=dict)
    endpoint_expected_hits: dict[str, float] = field(default_factory=dict)


def parse_combined(result: Any, plan: recording.Plan) -> dict[str, dict[GroupKey, float]]:
    """The combined query's series, split by query key."""
    out: dict[str, dict[GroupKey, float]] = {}
    # The key depends only on the series' name and quantile label: a few distinct pairs among
    # tens of thousands of series at 1,000 pools, so each is worked out once.
    keys: dict[tuple[str, str | None], str | None] = {}
    for series in result or []:
        labels = series.get("metric", {})
        ident = (labels.get("__name__", ""), labels.get(recording.QUANTILE_LABEL))
        if ident in keys:
            key = keys[ident]
        else:
            key = keys[ident] = plan.key_of(labels)
        if key is None:
            continue
        group = (labels.get("namespace", ""), labels.get("pool", ""), labels.get("role", ""))
        values = out.get(key)
        if values is None:
            values = out[key] = {}
        values[group] = float(series["value"][1])
    return out


def parse_vector(result: Any) -> dict[GroupKey, float]:
    """An instant-vector result -> {(namespace, pool, role): value}; NaN stays NaN."""
    out: dict[GroupKey, float] = {}
    for series in result or []:
        labels = series.get("metric", {})
        key = (labels.get("namespace", ""), labels.get("pool", ""), labels.get("role", ""))
        out[key] = float(series["value"][1])  # float("NaN") and "+Inf" parse
    return out


def observation(
    namespace: str,
    pool: str,
    roles: Mapping[str, RoleState],
    snap: Snapshot,
    ttft_quantile: float,
    itl_quantile: float,
    router: RoleState | None = None,
) -> Observation:
    """One pool's Observation: Kubernetes counts plus this pool's groups of the snapshot;
    `router`: the router Deployment's counts, when there is one."""
    per_role = {}
    for role, st in roles.items():
        g = (namespace, pool, role)
        sample_time = snap.get(q.SAMPLE_TIME, g)
        age = None if sample_time is None or math.isnan(sample_time) else snap.time - sample_time
        per_role[role] = RoleObservation(
            replicas=st.replicas,
            ready=st.ready,
            starting=st.starting,
            unschedulable=st.unschedulable,
            unschedulable_message=st.unschedulable_message,
            waiting=snap.get(q.WAITING, g),
            running=snap.get(q.RUNNING, g),
            kv_usage=snap.get(q.KV_USAGE, g),
            ttft=snap.get(q.ttft_key(ttft_quantile), g),
            itl=snap.get(q.itl_key(itl_quantile), g),
            prompt_tokens_rate=snap.get(q.PROMPT_RATE, g),
            generation_tokens_rate=snap.get(q.GENERATION_RATE, g),
            sample_age=max(0.0, age) if age is not None else None,
            request_rate=snap.get(q.REQUEST_RATE, g),
            prefix_hit_rate=snap.get(q.PREFIX_HIT_RATE, g),
        )
    p = (namespace, pool, "")
    return Observation(
        roles=per_role,
        router_ttft=snap.get(q.router_ttft_key(ttft_quantile), p),
        router_inflight=snap.get(q.ROUTER_INFLIGHT, p),
        router_request_rate=snap.get(q.ROUTER_REQUEST_RATE, p),
        prometheus_error=snap.error,
        router_ready=router.ready if router is not None and router.replicas > 0 else None,
        local_prefill_rate=snap.get(q.LOCAL_PREFILL_RATE, p),
        kv_transfer_failure_rate=snap.get(q.KV_FAILURE_RATE, p),
    )
