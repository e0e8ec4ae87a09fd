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
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from poolpilot.autoscaler import queries as q
from poolpilot.autoscaler import recording
from poolpilot.autoscaler.decide import Observation, RoleObservation
from poolpilot.autoscaler.promaccess import PrometheusAccess

from poolpilot.clock import REAL_TIME, Clock
from poolpilot.metrics import COLD_START_PHASES, COLD_START_TOTAL
from poolpilot.roles import Role

if TYPE_CHECKING:  # (kube loads the Kubernetes client: this adapter needs only the type)
    from poolpilot.autoscaler.kube import RoleState

log = logging.getLogger("poolpilot.autoscaler")
GroupKey = tuple[str, str, str]  # (namespace, pool, role); role "" for per-pool series


class PrometheusQueryError(RuntimeError):
    """Prometheus answered a query with an error status."""


class MalformedAnswer(ValueError):
    """An answer that is not an instant vector (a matrix, a scalar, not JSON, no `result`)."""


PoolKey = tuple[str, str]  # (namespace, pool)


@dataclass
class Snapshot:
    """Every query's result: key -> {(namespace, pool, role): value}.

    A group missing from a key's dict had no series (no data); NaN values stay NaN.
    `error` is set when a query failed or its answer was not an instant vector (every pool
    then has no data; `values` holds the queries that did answer); `pool_errors`: pools with
    a malformed series in some answer (a value that is no number, no `value`), no data for
    those pools alone. `time` is Prometheus's evaluation time (its clock, from the answers;
    the local clock only when none answered) and `evaluated` each key's own: sample ages
    are taken on Prometheus's clock, so a skewed local clock cannot make old data look new.
    """

    time: float
    values: dict[str, dict[GroupKey, float]] = field(default_factory=dict)
    error: str | None = None
    queries: int = 0
    recorded: int = 0  # signals read from recording rules (the rest were queried raw)
    pool_errors: dict[PoolKey, str] = field(default_factory=dict)
    evaluated: dict[str, float] = field(default_factory=dict)

    def get(self, key: str, group: GroupKey) -> float | None:
        return self.values.get(key, {}).get(group)


class MetricsSource(Protocol):
    def fetch(self, ttft_quantiles: Iterable[float], itl_quantiles: Iterable[float],
              pools: Collection[str] | None = None) -> Snapshot:
        """Every signal at one instant; `pools`: only pools of these names (a shard's)."""
        ...


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
        # The session is ours: the client mounts its retry on it, and _query posts through it
        # itself (the client's custom_query decodes with the standard json module and sends
        # GET; at 1,000 pools orjson and a form POST matter, see _query).
        self._session = access.session()
        self._prom = PrometheusConnect(
            url=url,
            headers=dict(access.headers) or None,
            auth=access.auth(),
            session=self._session,
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
            resp = self._session.get(
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

    def _query(self, promql: str) -> Any:
        """One instant query through the client's session (its TLS, auth, headers and retry),
        as a form POST (a long namespace matcher stays out of the URL); the answer decoded
        with orjson: at 1,000 pools the recorded signals are megabytes of JSON, and decoding
        them with the standard library was the largest part of a cycle's CPU. No `time`:
        Prometheus evaluates at its own now (a local clock ahead or behind would evaluate in
        its past or future, and data 21 s old would look 1 s old); each answer carries that
        time in its samples. Returns the `data` object, checked to be an instant vector."""
        session = self._session
        resp = session.post(
            f"{self.url}/api/v1/query",
            data={"query": promql, "timeout": f"{round(self.timeout * 1000)}ms"},
            headers=self._prom.headers, auth=self._prom.auth, verify=session.verify,
            cert=session.cert, timeout=self.timeout)
        if resp.status_code != 200:
            raise PrometheusQueryError(
                f"HTTP Status Code {resp.status_code} ({resp.content[:300]!r})")
        return vector_data(resp.content)

    def fetch(self, ttft_quantiles: Iterable[float] = (0.9,),
              itl_quantiles: Iterable[float] = (0.9,),
              pools: Collection[str] | None = None) -> Snapshot:
        self._check_rules()
        qs = self.query_set if pools is None else replace(self.query_set,
                                                          pools=tuple(sorted(pools)))
        plan = recording.plan(qs, ttft_quantiles, itl_quantiles, self.rules.usable)
        snap = Snapshot(time=time.time(), queries=plan.count)
        jobs = list(plan.raw.items())
        if plan.combined is not None:
            jobs.insert(0, ("", plan.combined))  # the big one first

        def run(item: tuple[str, str]) -> tuple[str, Any]:
            key, promql = item
            try:
                return key, self._query(promql)
            except Exception as exc:  # connection refused, 4xx/5xx, timeouts, not a vector
                return key, f"{type(exc).__name__}: {exc}"

        failed: list[str] = []
        with ThreadPoolExecutor(max_workers=self.parallel) as pool:
            for key, out in pool.map(run, jobs):
                if isinstance(out, str):
                    failed.append(f"query {key or 'recorded signals'}: {out}"[:300])
                    if not key:  # the rules may be gone: look again next cycle
                        self._rules_checked = -math.inf
                    continue
                ans = parse_answer(out["result"], key, plan)
                for k, values in ans.values.items():
                    snap.values.setdefault(k, {}).update(values)
                    if ans.evaluated is not None:
                        snap.evaluated[k] = ans.evaluated
                for pk, why in ans.bad.items():
                    snap.pool_errors.setdefault(pk, why)
                if not key:
                    snap.recorded = plan.recorded
        if failed:
            snap.error = "; ".join(failed)[:500]
        # Prometheus's clock: the sample times' evaluation, else any answer's.
        at = snap.evaluated.get(q.SAMPLE_TIME)
        if at is None and snap.evaluated:
            at = max(snap.evaluated.values())
        if at is not None:
            snap.time = at
        return snap

    def pod_loads(self, namespace: str, pool: str, role: str) -> PodSeries:
        """The per-pod series of one role (`QuerySet.pod_queries`); a failed query is no
        data (the choice then falls back on readiness and names)."""
        out = PodSeries()
        for key, promql in self.query_set.pod_queries(namespace, pool, role).items():
            try:
                result = self._query(promql)["result"]
            except Exception as exc:
                log.info("pool %s/%s: per-pod %s unavailable: %s", namespace, pool, key, exc)
                continue
            label = "endpoint" if key == q.ENDPOINT_EXPECTED_HITS else "pod"
            values = {}
            for series in result:  # a malformed series is left out (no data for that pod)
                point = sample_value(series)
                if isinstance(point, tuple):
                    values[str(series["metric"].get(label, ""))] = point[1]
            setattr(out, key, values)
        return out


    def cold_starts(self, namespace: str, pool: str, role: str) -> dict[str, dict[str, float]]:
        """The measured cold starts of one role's pods: pod -> {phase: seconds, and
        queries.COMPILE_CACHE_PHASE: 1 hit / 0 miss}; pods without the launcher's series
        are absent. A failed query is no data (nothing learned, nothing written)."""
        promql = self.query_set.cold_start_query(namespace, pool, role)
        try:
            result = self._query(promql)["result"]
        except Exception as exc:
            log.info("pool %s/%s: %s cold starts unavailable: %s", namespace, pool, role, exc)
            return {}
        return pod_phases(result)


def pod_phases(result: Iterable[Any]) -> dict[str, dict[str, float]]:
    """An instant vector by (pod, phase) as pod -> {phase: value}; malformed series and
    values that are no duration (NaN, negative) are left out."""
    out: dict[str, dict[str, float]] = {}
    for series in result:
        point = sample_value(series)
        if isinstance(point, str) or not math.isfinite(point[1]) or point[1] < 0:
            continue
        labels = series["metric"]
        pod, phase = str(labels.get("pod", "")), str(labels.get("phase", ""))
        if pod and phase:
            out.setdefault(pod, {})[phase] = point[1]
    return out


def pod_start_times(pod: Mapping[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(created, scheduled, container started) of a pod, Unix seconds, None where unknown:
    metadata.creationTimestamp, the PodScheduled condition's transition to True, and the
    (first) running container's startedAt."""
    from poolpilot.autoscaler.kube import parse_time  # (see the TYPE_CHECKING import above)

    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    scheduled = next((parse_time(c.get("lastTransitionTime"))
                      for c in status.get("conditions") or []
                      if c.get("type") == "PodScheduled" and c.get("status") == "True"), None)
    started = next((parse_time(((c.get("state") or {}).get("running") or {}).get("startedAt"))
                    for c in status.get("containerStatuses") or []
                    if ((c.get("state") or {}).get("running") or {}).get("startedAt")), None)
    return parse_time(meta.get("creationTimestamp")), scheduled, started


def cold_start_annotation(phases: Mapping[str, float], cache_hit: float | None,
                          created: float | None, scheduled: float | None,
                          started: float | None) -> dict[str, Any]:
    """What the pod's poolpilot.dev/cold-start annotation says, seconds to 0.01: `scheduled`
    (creation to PodScheduled), `container` (scheduled to the container's start: image pull,
    volumes), `engine` (the launcher's phases, in their order), `total` (creation to ready
    where the pod's timestamps are known, else the engine's part) and `compileCache`."""
    note: dict[str, Any] = {}
    if created is not None and scheduled is not None:
        note["scheduled"] = round(max(0.0, scheduled - created), 2)
    if scheduled is not None and started is not None:
        note["container"] = round(max(0.0, started - scheduled), 2)
    note["engine"] = {p: round(phases[p], 2) for p in COLD_START_PHASES if p in phases}
    engine = phases.get(COLD_START_TOTAL, 0.0)
    before = max(0.0, started - created) if created is not None and started is not None else 0.0
    note["total"] = round(before + engine, 2)
    if cache_hit is not None:
        note["compileCache"] = "hit" if cache_hit >= 1 else "miss"
    return note


@dataclass
class PodSeries:
    """Per-pod values of one role: pod name (router: endpoint URL) -> value."""

    pod_in_flight: dict[str, float] = field(default_factory=dict)
    pod_prefix_hits: dict[str, float] = field(default_factory=dict)
    endpoint_expected_hits: dict[str, float] = field(default_factory=dict)


def vector_data(body: bytes) -> Any:
    """The `data` of a successful instant query, or MalformedAnswer saying what it is instead."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedAnswer(f"not JSON ({exc})") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, dict):
        raise MalformedAnswer("no data object in the answer")
    kind = data.get("resultType")
    if kind != "vector" or not isinstance(data.get("result"), list):
        raise MalformedAnswer(f"a {kind} where an instant vector is expected")
    return data


def sample_value(series: Any) -> tuple[float, float] | str:
    """(evaluation time, value) of one instant-vector series, or what is wrong with it.
    NaN and +-Inf parse (Prometheus writes them as strings): they mean something."""
    if not isinstance(series, dict) or not isinstance(series.get("metric"), dict):
        return "a series without labels"
    point = series.get("value")
    if not isinstance(point, list) or len(point) != 2:
        return f"value {point!r} is not [time, value]"
    at, value = point
    try:
        if isinstance(at, bool) or isinstance(value, bool):
            raise ValueError
        return float(at), float(value)
    except (TypeError, ValueError):
        return f"value {value!r} at {at!r} is not a number"


@dataclass
class Answer:
    """One query's answer parsed: key -> {group: value}; Prometheus's evaluation time; the
    pools with a malformed series (pool -> why), which get no data from this cycle."""

    values: dict[str, dict[GroupKey, float]] = field(default_factory=dict)
    evaluated: float | None = None
    bad: dict[PoolKey, str] = field(default_factory=dict)


def parse_answer(result: list[Any], key: str, plan: recording.Plan | None = None) -> Answer:
    """An instant vector's series by (namespace, pool, role). `key` "": the combined query of
    the recorded signals, whose series `plan` splits by query key."""
    out = Answer()
    # The key depends only on the series' name and quantile label: a few distinct pairs among
    # tens of thousands of series at 1,000 pools, so each is worked out once.
    keys: dict[tuple[str, str | None], str | None] = {}
    for series in result:
        point = sample_value(series)
        labels = series.get("metric") if isinstance(series, dict) else None
        labels = labels if isinstance(labels, dict) else {}
        if isinstance(point, str):
            pk = (str(labels.get("namespace", "")), str(labels.get("pool", "")))
            out.bad.setdefault(pk, f"query {key or 'recorded signals'}: {point}"[:300])
            continue
        k = key
        if not key:
            assert plan is not None
            ident = (labels.get("__name__", ""), labels.get(recording.QUANTILE_LABEL))
            found = keys[ident] if ident in keys else keys.setdefault(ident, plan.key_of(labels))
            if found is None:
                continue
            k = found
        group = (labels.get("namespace", ""), labels.get("pool", ""), labels.get("role", ""))
        values = out.values.get(k)
        if values is None:
            values = out.values[k] = {}
        values[group] = point[1]
        out.evaluated = point[0]
    return out


# Physical ceilings: a value above one is a broken exporter or a corrupted answer, not a load,
# and is counted as missing (a required signal missing holds the pool, MetricsAvailable=False).
# Per replica (the larger of spec.replicas and the pods that exist, at least 1): vLLM runs at
# most a few thousand sequences per engine and an H200 prefills ~1e5 tokens/s, so these are
# 10-100x beyond any real engine; fractions above 1; latencies above a day.
MAX_REQUESTS_PER_REPLICA = 1e5  # waiting or running requests
MAX_TOKENS_PER_REPLICA = 1e7  # tokens/s, prompt or generated
MAX_REQUEST_RATE_PER_REPLICA = 1e5  # requests/s finished
MAX_LATENCY = 86400.0  # seconds, TTFT or ITL quantile
MAX_ROUTER_VALUE = 1e7  # router requests in flight, requests/s, failures/s (per pool)
_FRACTION = 1.0 + 1e-9  # KV-cache usage, prefix-cache hit rate

_PER_REPLICA = {"waiting": MAX_REQUESTS_PER_REPLICA, "running": MAX_REQUESTS_PER_REPLICA,
                "prompt_tokens_rate": MAX_TOKENS_PER_REPLICA,
                "generation_tokens_rate": MAX_TOKENS_PER_REPLICA,
                "request_rate": MAX_REQUEST_RATE_PER_REPLICA}
_RATES = ("prompt_tokens_rate", "generation_tokens_rate", "request_rate")  # per second
_ABSOLUTE = {"kv_usage": _FRACTION, "prefix_hit_rate": _FRACTION, "ttft": MAX_LATENCY,
             "itl": MAX_LATENCY}


def _per(convert: Callable[[float], float] | None, value: float | None) -> float | None:
    """`value` converted (None: no conversion, or no value)."""
    return value if value is None or convert is None else convert(value)


def plausible(value: float | None, ceiling: float, what: str, where: str) -> float | None:
    """`value`, or None when above `ceiling` (NaN, which means "nothing happened", stays)."""
    if value is not None and value > ceiling:
        log.info("%s: %s=%g is above what it could be (%g): counted as missing",
                 where, what, value, ceiling)
        return None
    return value


def path_whole_since(parts: Iterable[RoleState], clock: Clock) -> float | None:
    """Since when (the clock's seconds) every part of the request path asked for has had a
    ready pod without a break: the latest of their `ready_since`. A part with no ready pod
    is the broken path `check_data` holds for; one without a time tells nothing."""
    since = [s.ready_since for s in parts if s.replicas > 0 and s.ready_since is not None]
    return clock.simulated(max(since)) if since else None


def with_held(waiting: float | None, held: float | None) -> float | None:
    """The prefill role's waiting requests: its engines' and those the router holds for them
    (late binding, router/prefill_hold.py). The router's alone is no reading of the engines:
    with theirs missing, the role's stays missing."""
    if waiting is None or held is None or not math.isfinite(held) or held <= 0:
        return waiting
    return waiting + held


def observation(
    namespace: str,
    pool: str,
    roles: Mapping[str, RoleState],
    snap: Snapshot,
    ttft_quantile: float,
    itl_quantile: float,
    router: RoleState | None = None,
    clock: Clock = REAL_TIME,
) -> Observation:
    """One pool's Observation: Kubernetes counts plus this pool's groups of the snapshot;
    `router`: the router Deployment's counts, when there is one. `clock`: the one the core
    decides on; the Observation is in its simulated seconds."""
    # Converted here, where Prometheus's numbers become the core's: its rates are per real
    # second and its sample ages real seconds (latencies are the engines' simulated ones).
    per_second = clock.per_simulated_second if clock.rate != 1 else None
    per_role = {}
    at = snap.evaluated.get(q.SAMPLE_TIME, snap.time)  # Prometheus's clock
    for role, st in roles.items():
        g = (namespace, pool, role)
        sample_time = snap.get(q.SAMPLE_TIME, g)
        age = None if sample_time is None or math.isnan(sample_time) else at - sample_time
        obs = RoleObservation(
            replicas=st.replicas,
            ready=st.ready,
            starting=st.starting,
            unschedulable=st.unschedulable,
            unschedulable_message=st.unschedulable_message,
            waiting=with_held(snap.get(q.WAITING, g),
                              snap.get(q.ROUTER_HELD_PREFILL, (namespace, pool, ""))
                              if role == Role.PREFILL else None),
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
        where = f"pool {namespace}/{pool} {role}"
        n = max(st.replicas, st.ready + st.starting, 1)
        fix: dict[str, Any] = {name: plausible(getattr(obs, name), ceiling * n, name, where)
               for name, ceiling in _PER_REPLICA.items()}
        fix |= {name: plausible(getattr(obs, name), ceiling, name, where)
                for name, ceiling in _ABSOLUTE.items()}
        if per_second is not None:
            fix |= {name: _per(per_second, fix[name]) for name in _RATES}
            fix["sample_age"] = _per(clock.simulated, obs.sample_age)
        per_role[role] = replace(obs, **fix)
    p = (namespace, pool, "")
    where = f"pool {namespace}/{pool}"

    def router_value(key: str) -> float | None:
        return plausible(snap.get(key, p), MAX_ROUTER_VALUE, key, where)

    def router_rate(key: str) -> float | None:
        return _per(per_second, router_value(key))

    return Observation(
        roles=per_role,
        router_ttft=plausible(snap.get(q.router_ttft_key(ttft_quantile), p), MAX_LATENCY,
                              "router_ttft", where),
        router_inflight=router_value(q.ROUTER_INFLIGHT),
        router_request_rate=router_rate(q.ROUTER_REQUEST_RATE),
        prometheus_error=snap.error or snap.pool_errors.get((namespace, pool)),
        router_ready=router.ready if router is not None and router.replicas > 0 else None,
        path_whole_since=path_whole_since([*roles.values(), *([router] if router else [])],
                                          clock),
        local_prefill_rate=router_rate(q.LOCAL_PREFILL_RATE),
        kv_transfer_failure_rate=router_rate(q.KV_FAILURE_RATE),
    )
