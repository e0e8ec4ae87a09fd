"""The autoscaler's queries against a real Prometheus scraping exporters with known values.

Every test runs twice against one Prometheus that has the autoscaler's recording rules
loaded: once with the raw queries (what an autoscaler does with a Prometheus without
poolpilot's rules) and once reading the recorded series (one query reads them all); both must
give the same observations.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from autoscaler_exporters import FakeExporter, Hist, engine, router, router_fallback
from poolpilot.autoscaler import queries as q
from poolpilot.autoscaler import recording
from poolpilot.autoscaler.decide import History, Policy, decide
from poolpilot.autoscaler.kube import RoleState
from poolpilot.autoscaler.observe import PrometheusSource, Snapshot, observation
from poolpilot.testkit.prometheus import PrometheusProcess, Target, free_port

from poolpilot import metrics as m

pytestmark = pytest.mark.adapter

WINDOW = 6.0
TTFT_PRE = Hist(upper=0.75)  # quantile 0.9 -> 0.5 + 0.25 * 0.9 = 0.725
TTFT_ROUTER = Hist(upper=2.5)  # quantile 0.9 -> 1.0 + 1.5 * 0.9 = 2.35
ITL_NEW = Hist(upper=0.075, buckets=m.ITL_BUCKETS)  # 0.05 + 0.025 * 0.9 = 0.0725
ITL_OLD = Hist(upper=0.2, buckets=m.ITL_BUCKETS)  # 0.15 + 0.05 * 0.9 = 0.195

# Pool alpha (team-a): 2 prefill + 2 decode engines on current vLLM names, and a router;
# served as text 0.0.4 (names keep their colons).
# Pool beta (team-b): one decode engine on the names older vLLM releases used, served the way
# prometheus_client negotiates with Prometheus 2.x (colons escaped to underscores).
# Pool gamma (team-b): a decode engine whose KV gauge is NaN.
# Pool delta (team-b): a decode engine that disappears (stale) in the last test.
EXPORTERS: dict[tuple[str, str, str, int], FakeExporter] = {
    ("team-a", "alpha", "prefill", 0): engine(waiting=3, running=1, prompt_rate=200, ttft=TTFT_PRE,
                                              text_only=True, request_rate=1),
    ("team-a", "alpha", "prefill", 1): engine(waiting=4, running=2, prompt_rate=200, ttft=TTFT_PRE,
                                              text_only=True, request_rate=1),
    ("team-a", "alpha", "decode", 0): engine(running=50, kv=0.2, generation_rate=50, itl=ITL_NEW,
                                              text_only=True),
    ("team-a", "alpha", "decode", 1): engine(running=70, kv=0.4, generation_rate=50, itl=ITL_NEW,
                                              text_only=True),
    ("team-a", "alpha", "router", 0): router("alpha", inflight=5, request_rate=2,
                                            ttft=TTFT_ROUTER),
    # the router's fallback: 0.5 requests/s prefilled on decode because prefill was behind
    # (prompt demand), 0.25/s retried there after a failed handoff (not demand)
    ("team-a", "alpha", "router", 1): router_fallback("alpha", "prefill_behind", 0.5),
    ("team-a", "alpha", "router", 2): router_fallback("alpha", "kv_transfer_failed", 0.25,
                                                      kv_failure_rate=0.25),
    ("team-b", "beta", "decode", 0): engine(running=10, kv=0.6, generation_rate=7, itl=ITL_OLD,
                                           old_names=True, prefix=(100, 50, None)),
    ("team-b", "gamma", "decode", 0): engine(running=1, kv=math.nan),
    # Pool epsilon (team-b): prefix caches. Prefill engines hit 30 of 100 tokens/s on GPU and
    # 10 more from a CPU offload tier (external hits); the decode engine's external hits are
    # the prompts NIXL brought it.
    ("team-b", "epsilon", "prefill", 0): engine(prefix=(100, 30, 10), text_only=True),
    ("team-b", "epsilon", "prefill", 1): engine(prefix=(100, 30, 10), text_only=True),
    ("team-b", "epsilon", "decode", 0): engine(prefix=(100, 10, 80), text_only=True),
    # its router holds 3 prompts while both prefill engines are saturated (late binding)
    ("team-b", "epsilon", "router", 0): router("epsilon", held=3),
    ("team-b", "delta", "decode", 0): engine(running=1, kv=0.1),
    # Pool zeta (team-b): a prefix cache on current names, without an offload tier's series.
    ("team-b", "zeta", "prefill", 0): engine(prefix=(100, 40, None)),
}


@dataclass
class Env:
    prom: PrometheusProcess
    targets: list[Target]


def poll(fetch: Callable[[], Snapshot], ok: Callable[[Snapshot], bool], timeout: float = 30
         ) -> Snapshot:
    """Fetch until `ok` (Prometheus needs a few scrapes before rates exist)."""
    deadline = time.monotonic() + timeout
    snap = fetch()
    while not ok(snap):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout}s: {snap.values}")
        time.sleep(0.25)
        snap = fetch()
    return snap


def rule_file(tmp: Path, window: float = WINDOW) -> Path:
    """The autoscaler's recording rules for a rate window, evaluated every 0.5 s."""
    path = tmp / f"rules-{window:g}.yml"
    group = recording.rule_group(q.QuerySet(window_seconds=window).window(), "500ms")
    path.write_text(yaml.safe_dump({"groups": [group]}))
    return path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    started = []
    try:
        for exp in EXPORTERS.values():
            started.append(exp.start())
        targets = [exp.target(ns, pool, role) for (ns, pool, role, _), exp in EXPORTERS.items()]
        files = [rule_file(tmp_path_factory.mktemp("rules"))]
        with PrometheusProcess(scrape_interval=0.5, rule_files=files) as prom:
            prom.start(targets)
            yield Env(prom, targets)
    finally:
        for exp in started:
            exp.stop()


@dataclass
class Source:
    prom: PrometheusSource
    rules: bool

    def fetch(self, *quantiles: tuple[float, ...]) -> Snapshot:
        return self.prom.fetch(*quantiles)


@pytest.fixture(scope="module", params=["raw", "rules"])
def source(request: pytest.FixtureRequest, env: Env) -> Source:
    rules = request.param == "rules"
    # With rules, they are looked up every 0.2 s: usable from their first evaluation on.
    return Source(PrometheusSource(env.prom.url, q.QuerySet(window_seconds=WINDOW),
                                   use_rules=rules, rules_refresh=0.2), rules)


def ready(snap: Snapshot) -> bool:
    return all(
        (k in snap.values and ("team-a", "alpha", role) in snap.values[k])
        for k, role in [(q.PROMPT_RATE, "prefill"), (q.ttft_key(0.9), "prefill"),
                        (q.itl_key(0.9), "decode")]
    ) and ("team-a", "alpha", "") in snap.values.get(q.router_ttft_key(0.9), {}) and (
        ("team-b", "beta", "decode") in snap.values.get(q.itl_key(0.9), {}))


A_PRE, A_DEC, B_DEC, G_PRE = (("team-a", "alpha", "prefill"), ("team-a", "alpha", "decode"),
                              ("team-b", "beta", "decode"), ("team-b", "gamma", "decode"))
A_POOL = ("team-a", "alpha", "")


@dataclass
class Expect:
    id: str
    key: str
    group: tuple[str, str, str]
    value: float | None  # None: no series; NaN: NaN
    rel: float = 1e-9


EXPECTED = [
    Expect("waiting-summed-over-replicas", q.WAITING, A_PRE, 7),
    Expect("running-summed-over-replicas", q.RUNNING, A_DEC, 120),
    Expect("kv-usage-averaged", q.KV_USAGE, A_DEC, 0.3),
    Expect("kv-usage-old-vllm-name", q.KV_USAGE, B_DEC, 0.6),
    Expect("kv-usage-nan-stays-nan", q.KV_USAGE, G_PRE, math.nan),
    # Rates: equal per replica, so a wrong aggregation (avg, max) is off by half; the
    # tolerance absorbs scrape jitter on a busy machine.
    Expect("prompt-token-rate-summed", q.PROMPT_RATE, A_PRE, 400, rel=0.2),
    Expect("generation-token-rate-summed", q.GENERATION_RATE, A_DEC, 100, rel=0.2),
    Expect("ttft-quantile-at-prefill", q.ttft_key(0.9), A_PRE, TTFT_PRE.quantile(0.9)),
    Expect("ttft-quantile-at-router", q.router_ttft_key(0.9), A_POOL, TTFT_ROUTER.quantile(0.9)),
    Expect("itl-quantile-at-decode", q.itl_key(0.9), A_DEC, ITL_NEW.quantile(0.9)),
    Expect("itl-quantile-old-vllm-name", q.itl_key(0.9), B_DEC, ITL_OLD.quantile(0.9)),
    Expect("router-inflight-despite-label-clash", q.ROUTER_INFLIGHT, A_POOL, 5),
    Expect("router-request-rate", q.ROUTER_REQUEST_RATE, A_POOL, 2, rel=0.2),
    Expect("requests-finished-per-role", q.REQUEST_RATE, A_PRE, 2, rel=0.2),
    Expect("local-prefill-when-prefill-is-behind-only", q.LOCAL_PREFILL_RATE, A_POOL, 0.5,
           rel=0.2),
    Expect("kv-handoff-failures", q.KV_FAILURE_RATE, A_POOL, 0.25, rel=0.2),
    Expect("prompts-the-router-holds-for-prefill", q.ROUTER_HELD_PREFILL,
           ("team-b", "epsilon", ""), 3),
    Expect("no-series-for-a-role-without-engines", q.WAITING, ("team-a", "alpha", "engine"),
           None),
    Expect("no-ttft-where-no-histogram", q.ttft_key(0.9), G_PRE, None),
    # hit rate: GPU hits plus the offload tier's (external) hits, over queries ...
    Expect("prefix-hit-rate-counts-the-offload-tier", q.PREFIX_HIT_RATE,
           ("team-b", "epsilon", "prefill"), 0.4, rel=0.1),
    # ... but not at decode, whose external hits are KV it received, not a cache's
    Expect("prefix-hit-rate-at-decode-without-nixl", q.PREFIX_HIT_RATE,
           ("team-b", "epsilon", "decode"), 0.1, rel=0.1),
    # an engine without a connector has no external series (and escaped names here) ...
    Expect("prefix-hit-rate-without-external-series", q.PREFIX_HIT_RATE,
           ("team-b", "zeta", "prefill"), 0.4, rel=0.1),
    # ... nor has an older vLLM, whose counters carried a `gpu_` infix
    Expect("prefix-hit-rate-old-vllm-names", q.PREFIX_HIT_RATE, B_DEC, 0.5, rel=0.1),
]


def window_filled(env: Env) -> bool:
    """Every target has been scraped for the whole rate window (else rate() under-reads)."""
    from prometheus_api_client import PrometheusConnect

    full = WINDOW / env.prom.scrape_interval - 1
    got = PrometheusConnect(env.prom.url).custom_query(
        f'min(count_over_time(up{{pool!="", pool!="delta"}}[{WINDOW:g}s]))')
    return bool(got) and float(got[0]["value"][1]) >= full


def all_recorded(source: Source, snap: Snapshot) -> bool:
    return not source.rules or snap.queries == 1


@pytest.fixture(scope="module")
def snapshot(env: Env, source: Source) -> Snapshot:
    return poll(source.fetch,
                lambda s: ready(s) and window_filled(env) and all_recorded(source, s))


@pytest.mark.parametrize("e", EXPECTED, ids=[e.id for e in EXPECTED])
def test_query_returns_what_the_exporters_imply(snapshot: Snapshot, e: Expect) -> None:
    assert snapshot.error is None
    got = snapshot.get(e.key, e.group)
    if e.value is None:
        assert got is None
    elif math.isnan(e.value):
        assert got is not None and math.isnan(got)
    else:
        assert got == pytest.approx(e.value, rel=e.rel), (e.key, snapshot.values.get(e.key))


def test_one_fixed_query_set_for_all_pools(snapshot: Snapshot, source: Source) -> None:
    # Raw: 8 plain signals + TTFT at engines and router + ITL, whatever the number of pools.
    # With the recording rules: every signal in one query.
    raw = len(q.QuerySet().build())
    assert (snapshot.queries, snapshot.recorded) == ((1, raw) if source.rules else (raw, 0))
    assert {g[:2] for g in snapshot.values[q.WAITING]} >= {("team-a", "alpha"),
                                                           ("team-b", "beta"), G_PRE[:2]}
    scoped = q.QuerySet(namespaces=("team-b",)).build()
    assert all('namespace=~"team-b"' in promql for promql in scoped.values())


def test_samples_are_fresh(snapshot: Snapshot) -> None:
    # Recorded, the newest sample's time is as old as the last scrape before the last rule
    # evaluation: still well within a pool's max metric age.
    age = snapshot.time - (snapshot.get(q.SAMPLE_TIME, A_PRE) or 0)
    assert 0 <= age < 5


QUANTILE_CASES = [
    # 0.9 is recorded; 0.85 is not: computed from the recorded bucket rates in one more query
    # per histogram, with the same result as the raw query.
    ("recorded-quantile", 0.9, 0),
    ("quantile-from-recorded-buckets", 0.85, 3),
]


@pytest.mark.parametrize(("quantile", "extra"), [c[1:] for c in QUANTILE_CASES],
                         ids=[c[0] for c in QUANTILE_CASES])
def test_any_slo_quantile(snapshot: Snapshot, source: Source, quantile: float, extra: int
                          ) -> None:
    snap = source.fetch((quantile,), (quantile,))
    assert snap.queries == (1 + extra if source.rules else len(q.QuerySet().build()))
    assert snap.get(q.ttft_key(quantile), A_PRE) == pytest.approx(TTFT_PRE.quantile(quantile))
    assert snap.get(q.itl_key(quantile), A_DEC) == pytest.approx(ITL_NEW.quantile(quantile))
    assert snap.get(q.router_ttft_key(quantile), A_POOL) == pytest.approx(
        TTFT_ROUTER.quantile(quantile))


def test_rules_for_another_window_are_not_used(snapshot: Snapshot, env: Env) -> None:
    """An autoscaler whose --rate-window the loaded rules were not made for queries raw."""
    other = PrometheusSource(env.prom.url, q.QuerySet(window_seconds=WINDOW + 1))
    snap = other.fetch()
    assert (snap.queries, snap.recorded) == (len(q.QuerySet().build()), 0)
    assert snap.get(q.WAITING, A_PRE) == 7
    assert "not for --rate-window 7s" in " ".join(other.rules.problems)


def test_observation_feeds_the_decision(snapshot: Snapshot) -> None:
    obs = observation("team-a", "alpha", {"prefill": RoleState(2, 2), "decode": RoleState(2, 2)},
                      snapshot, 0.9, 0.9)
    pol = Policy(bounds={"prefill": (1, 8), "decode": (1, 8)})
    d = decide(obs, pol, History.warm(), snapshot.time)
    # No throughput known yet: the queue and latency signals size the roles. The router's
    # TTFT (2.35 s vs 1 s) would ask for 5 prefill replicas, but 12 % of the KV handoffs fail
    # (the late first tokens are their retries'): the queue sizes prefill, 7 waiting for 2
    # per replica -> 4. ITL 0.0725 vs 0.05: decode 2 -> ceil(2 * 1.45) = 3.
    assert (d.replicas["prefill"], d.roles["prefill"].reason) == (4, "QueueAboveTarget")
    assert (d.replicas["decode"], d.roles["decode"].reason) == (3, "ITLAboveTarget")
    assert d.metrics_available.status


def test_prompts_the_router_holds_are_prefill_requests_waiting(snapshot: Snapshot) -> None:
    """Late binding moves a saturated prefill role's queue from its engines to the router:
    the autoscaler reads both (pool epsilon's engines have none waiting, its router holds
    3); a pool whose router holds none reads its engines' alone."""
    roles = {"prefill": RoleState(2, 2), "decode": RoleState(1, 1)}
    eps = observation("team-b", "epsilon", roles, snapshot, 0.9, 0.9)
    assert (eps.roles["prefill"].waiting, eps.roles["decode"].waiting) == (3, 0)
    alpha = observation("team-a", "alpha", roles, snapshot, 0.9, 0.9)
    assert alpha.roles["prefill"].waiting == 7


def test_observation_feeds_the_capacity_model(snapshot: Snapshot) -> None:
    obs = observation("team-a", "alpha", {"prefill": RoleState(2, 2), "decode": RoleState(2, 2)},
                      snapshot, 0.9, 0.9)
    # Profiled: 250 prompt tokens/s per prefill replica, 50 generated tokens/s per decode one.
    # A 4 s TTFT target: each 200-token prompt takes 0.8 s of it, a fifth, so the model keeps
    # the default headroom (0.2; against a 1 s target such prompts start it at 0.7).
    pol = Policy(bounds={"prefill": (1, 8), "decode": (1, 8)}, ttft_target=4.0,
                 prefill_tokens_per_replica=250, decode_tokens_per_replica=50)
    d = decide(obs, pol, History.warm(), snapshot.time)
    pre = d.roles["prefill"]
    # 400 prompt tokens/s for 2 requests/s: 200-token prompts; the router prefilled 0.5 more
    # requests/s on decode (100 tokens/s): 500 tokens/s of demand and 10 queued (2,000
    # tokens) for 2 x 250 x 0.8 -> 2.7 -> 3 (the failed-handoff retries are no demand)
    assert (pre.replicas, pre.reason) == (3, "DemandAboveCapacity"), pre.message
    assert "prefilled on decode" in pre.message
    # 100 generated tokens/s / (50 x 0.95) = 2.1 -> 3, as the ITL breach says
    assert d.replicas["decode"] == 3, d.roles["decode"].message
    # 0.25 failed handoffs/s of 2 requests/s is 12 %: more replicas would not help
    assert (d.scaling_limited.status, d.scaling_limited.reason) == (True, "KVTransferFailing")


def test_nan_gauge_holds_the_size(snapshot: Snapshot) -> None:
    obs = observation("team-b", "gamma", {"decode": RoleState(3, 3)}, snapshot, 0.9, 0.9)
    # gamma's decode runs 1 sequence on 3 replicas (would scale down), but its KV usage is NaN.
    d = decide(obs, Policy(bounds={"decode": (1, 8)}), History.warm(), snapshot.time)
    assert (d.replicas["decode"], d.roles["decode"].reason) == (3, "MetricsUnavailable")
    assert not d.metrics_available.status


def test_empty_pool_holds_the_size(snapshot: Snapshot) -> None:
    obs = observation("team-c", "nobody", {"decode": RoleState(4, 4)}, snapshot, 0.9, 0.9)
    d = decide(obs, Policy(bounds={"decode": (1, 8)}), History.warm(), snapshot.time)
    assert (d.replicas["decode"], d.roles["decode"].reason) == (4, "MetricsUnavailable")


def test_prometheus_down_is_no_data_not_zero() -> None:
    source = PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout=2)
    snap = source.fetch()
    assert snap.error and not snap.values
    obs = observation("team-a", "alpha", {"prefill": RoleState(2, 2), "decode": RoleState(2, 2)},
                      snap, 0.9, 0.9)
    pol = Policy(bounds={"prefill": (0, 8), "decode": (0, 8)}, scale_to_zero=True)
    d = decide(obs, pol, History.warm(), snap.time)
    assert d.replicas == {"prefill": 2, "decode": 2}
    assert d.metrics_available.reason == "MetricsUnavailable"


def test_vanished_target_goes_stale_and_holds(env: Env, source: Source, snapshot: Snapshot
                                             ) -> None:
    # delta's exporter is removed from the scrape targets (no other test reads delta).
    env.prom.set_targets([t for t in env.targets if t.labels["pool"] != "delta"])
    gone = ("team-b", "delta", "decode")
    snap = poll(source.fetch, lambda s: gone not in s.values.get(q.WAITING, {}))
    assert A_PRE in snap.values[q.WAITING]  # the others are still there
    obs = observation("team-b", "delta", {"decode": RoleState(3, 3)}, snap, 0.9, 0.9)
    d = decide(obs, Policy(bounds={"decode": (1, 8)}), History.warm(), snap.time)
    assert (d.replicas["decode"], d.roles["decode"].reason) == (3, "MetricsUnavailable")
