"""Benchmark: autoscaler cycles for 1 to 10,000 pools, before and after the watch-fed view and
the recording rules, measured in one run.

    poolpilot perf autoscaler --pools 1 100 1000 10000 --json autoscaler.json

For each pool count a real Prometheus scrapes a synthetic exporter (its own process) that
serves, for every pool, the series its prefill and decode engines and its router would
(about 85 per pool, already labelled namespace/pool/role as after relabelling), and evaluates
the autoscaler's recording rules (group poolpilot.autoscaler, as the chart ships it). The
pools and their Deployments live in the Kubernetes API emulator (its own process). Each
variant ("mode") then runs a fresh autoscaler, in Apply mode, against the same cluster and
Prometheus:

  list+raw     no watch: LIST pools, Deployments and pods every cycle; raw queries
  watch+raw    the watch-fed view; a Prometheus without poolpilot's rules (the fallback)
  watch+rules  the watch-fed view; the recording rules (what the autoscaler does now)

"First cycle": from the autoscaler's start (its first LIST) to its first cycle done, deciding
every pool and writing statuses, scales and Events; pools start without autoscaler status and
with 2 replicas per role (reset between modes). "Steady cycles": later cycles with the clock
moved one interval on, each deciding every pool and writing what changed (usually nothing).
Times are wall clock on a machine that others may share: `--json` records the load average
and the autoscaler process's CPU seconds per cycle too.

`--total-shards N`: the autoscaler measured is shard 0 of N (`poolpilot autoscaler --shard 0
--total-shards N`): it decides, writes and queries Prometheus for its ~1/N of the pools, while
Prometheus and the cluster hold all of them; the other shards would run in pods of their own.
`--every-shard` measures each of the N in turn the same way (the cluster reset between them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from poolpilot.autoscaler import queries as q
from poolpilot.autoscaler import recording
from poolpilot.autoscaler.cache import WatchedKube
from poolpilot.autoscaler.kube import KubeError, KubeScaler
from poolpilot.autoscaler.loop import Autoscaler, CycleResult, Options
from poolpilot.autoscaler.observe import PrometheusSource
from poolpilot.autoscaler.shard import Shard
from poolpilot.perf.procstat import cpu_seconds, load_average
from poolpilot.testkit.prometheus import MetricsPage, PrometheusProcess, Target, duration

from poolpilot import api, gcpolicy, names
from poolpilot import metrics as m
from poolpilot.clock import Clock
from poolpilot.roles import DISAGGREGATED_ROLES, Role

ROOT = Path(__file__).resolve().parents[1]
POOLS = f"/apis/{api.GROUP}/{api.VERSION}"
SHARD = 1000  # pools per exporter page (Prometheus scrapes the pages in parallel)
MODES = ("list+raw", "watch+raw", "watch+rules")
INTERVAL = 15.0  # seconds the clock moves between cycles: the pools' default intervalSeconds
# Pools accept samples this old: a Prometheus that lags behind its rule interval on a loaded
# machine must not turn every decision into a hold, which skips most of a decision's work.
MAX_AGE_S = 900


@dataclass(frozen=True)
class Setup:
    scrape_s: float = 15.0
    window_s: float = 60.0
    rules_interval_s: float = 10.0
    repeat: int = 10
    history_cycles: int = 0  # untimed cycles first, to fill the decisions' history
    baseline_max: int = 1000  # the raw modes only up to this many pools
    shards: int = 1  # the autoscaler measured is shard 0 of this many (--total-shards)
    every_shard: bool = False  # each shard in turn, not shard 0 alone


def pool_name(i: int) -> tuple[str, str]:
    return f"bench-{i % 10}", f"p{i}"


# ---------------------------------------------------------------------------------------------
# The synthetic exporter (its own process)


class SyntheticExporter:
    """Text exposition for pools [first, first + count); counters grow at per-pool rates.

    The page is prepared once as static pieces plus a handful of time-dependent values, so a
    thousand pools render well within a scrape interval."""

    def __init__(self, first: int, count: int, started: float) -> None:
        self.started = started
        self._rates: dict[str, float] = {}  # dynamic key -> per-second growth
        self._pieces: list[bytes | str] = []  # bytes: static; str: a dynamic key
        for i in range(first, first + count):
            self._pool(i)

    def _counter(self, line_prefix: str, key: str, rate: float) -> None:
        self._rates[key] = rate
        self._pieces += [line_prefix.encode() + b" ", key, b"\n"]

    def _static(self, line: str) -> None:
        self._pieces.append(line.encode() + b"\n")

    def _histogram(self, name: str, lab: str, buckets: tuple[float, ...], upper: float) -> None:
        for b in buckets:
            if b < upper:
                self._static(f'{name}_bucket{{{lab},le="{b}"}} 0')
            else:
                self._counter(f'{name}_bucket{{{lab},le="{b}"}}', "hist", 10)
        self._counter(f'{name}_bucket{{{lab},le="+Inf"}}', "hist", 10)
        self._counter(f"{name}_count{{{lab}}}", "hist", 10)
        self._counter(f"{name}_sum{{{lab}}}", f"sum{upper}", 10 * upper)

    def _pool(self, i: int) -> None:
        ns, pool = pool_name(i)
        cls = i % 7
        load = cls / 3.0  # 0 .. 2: some pools idle, some over their queue targets
        for role in DISAGGREGATED_ROLES:
            lab = f'namespace="{ns}",pool="{pool}",role="{role}"'
            self._static(f"{m.VLLM_WAITING}{{{lab}}} {4 * load:.3f}")
            self._static(f"{m.VLLM_RUNNING}{{{lab}}} {60 * load:.3f}")
            self._static(f"{m.VLLM_KV_USAGE}{{{lab}}} {min(1.0, 0.45 * load):.3f}")
            self._counter(f"{m.VLLM_PROMPT_TOKENS}{{{lab}}}", f"prompt{cls}", 500 * load)
            self._counter(f"{m.VLLM_GENERATION_TOKENS}{{{lab}}}", f"gen{cls}", 80 * load)
            if role == Role.PREFILL:
                self._histogram(m.VLLM_TTFT, lab, m.TTFT_BUCKETS, 0.5)
            else:
                self._histogram(m.VLLM_ITL, lab, m.ITL_BUCKETS, 0.05)
        lab = f'namespace="{ns}",pool="{pool}",role="{Role.ROUTER}"'
        self._static(f"{m.ROUTER_INFLIGHT}{{{lab}}} {5 * load:.3f}")
        self._counter(f'{m.ROUTER_REQUESTS}{{{lab},code="200"}}', "requests", 2)
        self._histogram(m.ROUTER_TTFT, lab, m.TTFT_BUCKETS, 0.75)

    def render(self) -> bytes:
        t = time.time() - self.started
        values = {k: f"{1e6 + r * t:.3f}".encode() for k, r in self._rates.items()}
        return b"".join(p if isinstance(p, bytes) else values[p] for p in self._pieces)


def _serve_exporter(pools: int, ports: Any, stop: Any) -> None:
    """Child process: one MetricsPage per shard of pools, until `stop` is set."""
    started = time.time()
    pages = []
    for first in range(0, pools, SHARD):
        exp = SyntheticExporter(first, min(SHARD, pools - first), started)
        pages.append(MetricsPage(exp.render))
        ports.put(pages[-1].port)
    ports.put(None)
    stop.wait()
    for page in pages:
        page.close()


def _serve_emulator(kubeconfig: str, ready: Any, stop: Any) -> None:
    """Child process: the API emulator, CRD validation off (see `docs/benchmarks.md`)."""
    from poolpilot.emulator.server import KubeEmulator

    async def main() -> None:
        async with KubeEmulator(request_log_limit=1000, history_limit=200_000) as emu:
            emu.store.validate_crds = False
            emu.write_kubeconfig(kubeconfig)
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.2)

    asyncio.run(main())


@contextmanager
def child(target: Callable[..., None], *args: Any) -> Iterator[Any]:
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    proc = ctx.Process(target=target, args=(*args, stop), daemon=True)
    proc.start()
    try:
        yield proc
    finally:
        stop.set()
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()


# ---------------------------------------------------------------------------------------------
# Cluster set-up and reset


async def gather_limited(n: int, jobs: list[Callable[[], Any]]) -> list[Any]:
    sem = asyncio.Semaphore(n)

    async def one(job: Callable[[], Any]) -> Any:
        async with sem:
            return await job()

    return list(await asyncio.gather(*(one(j) for j in jobs)))


async def populate(kube: KubeScaler, n: int) -> None:
    crd = yaml.safe_load((ROOT / "crds" / "inferencepool.yaml").read_text())
    try:
        await kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                           body=crd)
    except KubeError as exc:
        if exc.status != 409:
            raise
    for _ in range(100):
        try:
            await kube.request("GET", f"{POOLS}/{api.PLURAL}")
            break
        except KubeError:
            await asyncio.sleep(0.1)

    async def one(i: int) -> None:
        ns, pool = pool_name(i)
        role = {"replicas": 2, "minReplicas": 1, "maxReplicas": 16}
        body = {"apiVersion": api.API_VERSION, "kind": api.KIND,
                "metadata": {"name": pool, "namespace": ns},
                "spec": {"model": {"name": "m"}, "prefill": role, "decode": role,
                         "autoscaling": {"metricsMaxAgeSeconds": MAX_AGE_S}}}
        await kube.request("POST", f"{POOLS}/namespaces/{ns}/{api.PLURAL}", body=body)
        for r in DISAGGREGATED_ROLES:
            lab = names.labels(pool, r)
            dep: dict[str, Any] = {
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": names.child_name(pool, r), "namespace": ns, "labels": lab},
                "spec": {"replicas": 2, "selector": {"matchLabels": lab},
                         "template": {"metadata": {"labels": lab},
                                      "spec": {"containers": [{"name": "e", "image": "x"}]}}}}
            path = f"/apis/apps/v1/namespaces/{ns}/deployments"
            await kube.request("POST", path, body=dep)
            await _ready(kube, ns, dep["metadata"]["name"], 2)

    await gather_limited(32, [partial(one, i) for i in range(n)])


async def _ready(kube: KubeScaler, ns: str, name: str, replicas: int) -> None:
    """What the Deployment controller and kubelet would report: every replica ready."""
    await kube.request("PATCH", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}/status",
                       body={"status": {"replicas": replicas, "readyReplicas": replicas,
                                        "updatedReplicas": replicas}},
                       content_type="application/merge-patch+json")


async def reset(kube: KubeScaler, n: int, scaled: set[tuple[str, str]]) -> None:
    """Pools back to no autoscaler status, scaled Deployments back to 2 ready replicas."""
    async def no_status(ns: str, pool: str) -> None:
        await kube.request("PATCH", f"{POOLS}/namespaces/{ns}/{api.PLURAL}/{pool}/status",
                           body={"status": None}, content_type="application/merge-patch+json")

    async def two_replicas(ns: str, name: str) -> None:
        await kube.scale(ns, name, 2)
        await _ready(kube, ns, name, 2)

    jobs: list[Callable[[], Any]] = [partial(no_status, *pool_name(i)) for i in range(n)]
    jobs += [partial(two_replicas, ns, name) for ns, name in scaled]
    await gather_limited(32, jobs)


# ---------------------------------------------------------------------------------------------
# Measuring


@dataclass
class Run:
    pools: int
    mode: str
    shard: int = 0  # which shard of Setup.shards was measured
    shard_pools: int = 0  # the pools that shard owns and decides (all when not sharded)
    queries_per_cycle: int = 0
    recorded_signals: int = 0
    first_cycle_seconds: float = 0.0  # a restarted autoscaler: pools already have status
    first_cycle_api_requests: int = 0
    first_cycle_writes: int = 0
    first_cycle_fresh_seconds: float = 0.0  # pools no autoscaler has seen: everything written
    first_cycle_fresh_writes: int = 0
    first_cycle_fresh_cpu_seconds: float = 0.0  # the autoscaler process
    first_cycle_fresh_api_cpu_seconds: float = 0.0  # the API server (emulator) process
    cycle_seconds_p50: float = 0.0
    cycle_seconds_p99: float = 0.0
    cycle_cpu_seconds_p50: float = 0.0
    cycle_api_requests_p50: float = 0.0
    steady_scales: int = 0
    prometheus_seconds_p50: float = 0.0  # the queries alone (wall), after the steady cycles
    rules_evaluation_seconds: float | None = None  # Prometheus's last run of the rule group
    sample_age_seconds_p50: float | None = None  # age of the newest sample the cycles read
    cycles: list[float] = field(default_factory=list)


def quantile(values: list[float], qv: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(qv * (len(s) - 1))))]


async def _settle(kube: KubeScaler) -> None:
    """Until the watches have taken in the first cycle's writes (no event for 0.5 s)."""
    if not isinstance(kube, WatchedKube):
        return
    last, quiet_since = -1, time.monotonic()
    while time.monotonic() - quiet_since < 0.5:
        seen = sum(i.events for i in kube.informers)
        if seen != last:
            last, quiet_since = seen, time.monotonic()
        await asyncio.sleep(0.1)


async def first_cycle(mode: str, kubeconfig: Path, prom: PrometheusProcess, setup: Setup,
                      now: list[float], shard: Shard) -> tuple[KubeScaler, Autoscaler,
                                                               CycleResult, float, int, int]:
    """A started autoscaler's first cycle: (adapter, loop, result, seconds, requests, writes)."""
    adapter = WatchedKube if mode != "list+raw" else KubeScaler
    kube = await adapter.connect(str(kubeconfig))
    source = PrometheusSource(prom.url, q.QuerySet(window_seconds=setup.window_s),
                              use_rules=mode == "watch+rules")
    options = Options(interval=INTERVAL, shard=shard)
    scaler = Autoscaler(kube, source, options, clock=Clock(monotonic=lambda: now[0]))
    t0, sent, wrote = time.perf_counter(), kube.requests, kube.kube.writes
    res = await scaler.cycle()
    return (kube, scaler, res, time.perf_counter() - t0, kube.requests - sent,
            kube.kube.writes - wrote)


async def measure_mode(n: int, mode: str, kubeconfig: Path, prom: PrometheusProcess,
                       api_pid: int, setup: Setup, profile: Path | None, index: int = 0
                       ) -> tuple[Run, set[tuple[str, str]]]:
    shard = Shard(index, setup.shards)
    run = Run(n, mode, shard=index,
              shard_pools=sum(shard.owns(*pool_name(i)) for i in range(n)))
    if profile is not None and shard.split:
        profile = profile.with_name(f"{profile.name}.shard{index}")
    scaled: set[tuple[str, str]] = set()
    now = [time.time()]
    api0, cpu0 = cpu_seconds(api_pid), time.process_time()
    prof = _profiler(profile)
    if prof is not None:
        prof.enable()
    kube, scaler, first, secs, _, writes = await first_cycle(mode, kubeconfig, prom, setup, now,
                                                             shard)
    if prof is not None and profile is not None:
        prof.disable()
        prof.dump_stats(str(profile.with_name(f"{profile.name}.{n}.{mode}.first")))
    run.first_cycle_fresh_cpu_seconds = time.process_time() - cpu0
    run.first_cycle_fresh_api_cpu_seconds = cpu_seconds(api_pid) - api0
    run.first_cycle_fresh_seconds, run.first_cycle_fresh_writes = secs, writes
    try:
        if first.decided != run.shard_pools or first.errors:
            raise RuntimeError(f"{mode}, {n} pools: first cycle decided {first.decided} of "
                               f"{run.shard_pools}, errors {first.errors[:3]}")
        _note_scaled(first, scaled)
        await _settle(kube)
        for _ in range(4):  # until the pools that needed more replicas have them
            now[0] += INTERVAL
            res = await scaler.cycle()
            _note_scaled(res, scaled)
            await _settle(kube)
            if res.scaled == 0:
                break
        # A long-running autoscaler remembers up to its history window of demand samples per
        # role (30 min: 120 cycles at 15 s); its per-pool work grows with them. These cycles,
        # untimed, fill that memory (scales they make are counted as steady ones).
        for _ in range(setup.history_cycles):
            now[0] += INTERVAL
            res = await scaler.cycle()
            run.steady_scales += res.scaled
            _note_scaled(res, scaled)
        if setup.history_cycles:
            await _settle(kube)
        cpu, reqs = [], []
        prof = _profiler(profile)
        for _ in range(setup.repeat):
            now[0] += INTERVAL
            sent = kube.requests
            c0, t0 = time.process_time(), time.perf_counter()
            if prof is not None:
                prof.enable()
            res = await scaler.cycle()
            if prof is not None:
                prof.disable()
            run.cycles.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            reqs.append(kube.requests - sent)
            run.steady_scales += res.scaled
            run.queries_per_cycle = res.queries
            _note_scaled(res, scaled)
        if prof is not None and profile is not None:
            prof.dump_stats(str(profile.with_name(f"{profile.name}.{n}.{mode}")))
        run.cycle_seconds_p50 = statistics.median(run.cycles)
        run.cycle_seconds_p99 = quantile(run.cycles, 0.99)
        run.cycle_cpu_seconds_p50 = statistics.median(cpu)
        run.cycle_api_requests_p50 = statistics.median(reqs)
        fetches = []
        mine = frozenset(pool_name(i)[1] for i in range(n)
                         if shard.owns(*pool_name(i))) if shard.split else None
        for _ in range(3):
            t0 = time.perf_counter()
            snap = await asyncio.to_thread(scaler.source.fetch, (0.9,), (0.9,), mine)
            fetches.append(time.perf_counter() - t0)
        run.prometheus_seconds_p50 = statistics.median(fetches)
        run.recorded_signals = snap.recorded
        ages = [snap.time - t for t in snap.values.get(q.SAMPLE_TIME, {}).values()]
        run.sample_age_seconds_p50 = statistics.median(ages) if ages else None
        run.rules_evaluation_seconds = await asyncio.to_thread(rules_evaluation, prom)
    finally:
        await kube.close()
    # A restart: a new autoscaler process against the same pools, their statuses written.
    now[0] += INTERVAL
    kube, _, again, secs, sent, writes = await first_cycle(mode, kubeconfig, prom, setup, now,
                                                           shard)
    try:
        if again.errors:
            raise RuntimeError(f"{mode}, {n} pools: restart errors {again.errors[:3]}")
        run.first_cycle_seconds, run.first_cycle_api_requests = secs, sent
        run.first_cycle_writes = writes
        _note_scaled(again, scaled)
    finally:
        await kube.close()
    return run, scaled


def _profiler(path: Path | None) -> Any:
    if path is None:
        return None
    import cProfile

    return cProfile.Profile()


def _note_scaled(res: CycleResult, scaled: set[tuple[str, str]]) -> None:
    for (ns, pool), d in res.decisions.items():
        for role, rd in d.roles.items():
            if rd.replicas != rd.current:
                scaled.add((ns, names.child_name(pool, role)))


def rules_evaluation(prom: PrometheusProcess) -> float | None:
    """Seconds Prometheus took for its last evaluation of the autoscaler's rule group."""
    import requests

    groups = requests.get(f"{prom.url}/api/v1/rules", params={"type": "record"},
                          timeout=30).json()["data"]["groups"]
    times = [g.get("evaluationTime") for g in groups if g["name"] == recording.GROUP]
    return float(times[0]) if times and times[0] is not None else None


async def wait_ready(prom: PrometheusProcess, n: int, setup: Setup, timeout: float) -> None:
    """Until every recording rule is usable and every pool has recorded rates over a full
    window (no raw queries meanwhile: at 10,000 pools they would only slow Prometheus)."""
    window = q.QuerySet(window_seconds=setup.window_s).window()
    expected = len(recording.recording_rules(window))
    source = PrometheusSource(prom.url, q.QuerySet(window_seconds=setup.window_s),
                              rules_refresh=0)
    deadline = time.monotonic() + timeout
    first: float | None = None
    while time.monotonic() < deadline:
        await asyncio.to_thread(source._check_rules)
        if len(source.rules.usable) < expected:
            await asyncio.sleep(2)
            continue
        snap = await asyncio.to_thread(source.fetch)
        if len(snap.values.get(q.PROMPT_RATE, {})) >= 2 * n:
            first = first or time.monotonic()
            if time.monotonic() - first >= setup.window_s + setup.scrape_s:
                return
        await asyncio.sleep(2)
    raise TimeoutError(f"Prometheus had no full window of series and rules for {n} pools "
                       f"after {timeout:.0f}s: {source.rules.summary(expected)}")


async def measure(n: int, setup: Setup, modes: list[str], profile: Path | None
                  ) -> list[Run]:
    with tempfile.TemporaryDirectory(prefix="perf-autoscaler-") as tmp:
        ctx = multiprocessing.get_context("spawn")
        kubeconfig = Path(tmp) / "kubeconfig"
        ready, ports = ctx.Event(), ctx.Queue()
        with child(_serve_emulator, str(kubeconfig), ready) as emulator, \
                child(_serve_exporter, n, ports):
            if not await asyncio.to_thread(ready.wait, 60):
                raise RuntimeError("the emulator did not start")
            exporter_ports = []
            while (port := await asyncio.to_thread(ports.get, True, 120)) is not None:
                exporter_ports.append(port)
            window = q.QuerySet(window_seconds=setup.window_s).window()
            rule_file = Path(tmp) / "rules.yaml"
            rule_file.write_text(yaml.safe_dump({"groups": [recording.rule_group(
                window, duration(setup.rules_interval_s))]}))
            with PrometheusProcess(scrape_interval=setup.scrape_s, rule_files=[rule_file],
                                   workdir=Path(tmp) / "prom") as prom:
                prom.start([Target(f"127.0.0.1:{p}") for p in exporter_ports])
                kube = await KubeScaler.connect(str(kubeconfig), timeout=60)
                try:
                    t0 = time.monotonic()
                    await populate(kube, n)
                    print(f"  {n} pools: cluster populated in {time.monotonic() - t0:.0f}s",
                          flush=True)
                    await wait_ready(prom, n, setup, timeout=900)
                    runs: list[Run] = []
                    scaled: set[tuple[str, str]] = set()
                    for mode in modes:
                        for index in range(setup.shards if setup.every_shard else 1):
                            if runs:  # the previous run's statuses and scales undone
                                await reset(kube, n, scaled)
                            run, scaled = await measure_mode(n, mode, kubeconfig, prom,
                                                             emulator.pid, setup, profile,
                                                             index)
                            runs.append(run)
                            print("  " + row(run), flush=True)
                    return runs
                finally:
                    await kube.close()


# ---------------------------------------------------------------------------------------------
# Output


HEADER = ("| pools | mode | queries/cycle | first cycle (writes) | steady cycle p50 | p99 | "
          "CPU s/cycle | API requests/cycle | Prometheus part | rule evaluation | sample age |\n"
          "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def row(r: Run) -> str:
    mode = (r.mode if r.shard_pools == r.pools
            else f"{r.mode}, shard {r.shard}: {r.shard_pools} pools")
    return (f"| {r.pools} | {mode} | {r.queries_per_cycle} | fresh "
            f"{r.first_cycle_fresh_seconds:.2f} s ({r.first_cycle_fresh_writes}), restart "
            f"{r.first_cycle_seconds:.2f} s ({r.first_cycle_writes}) | "
            f"{r.cycle_seconds_p50:.3f} s | "
            f"{r.cycle_seconds_p99:.3f} s | {r.cycle_cpu_seconds_p50:.3f} | "
            f"{r.cycle_api_requests_p50:g} | {r.prometheus_seconds_p50:.3f} s | "
            f"{_s(r.rules_evaluation_seconds)} | {_s(r.sample_age_seconds_p50)} |")


def _s(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f} s"


def report(runs: list[Run], setup: Setup, loads: dict[str, list[float]]) -> dict[str, Any]:
    """The JSON: the headline fields are the current autoscaler's (watch+rules) at the largest
    pool count; `runs` has every mode and count; `ratios` compare modes at the same count."""
    best = max((r for r in runs if r.mode == "watch+rules"), key=lambda r: r.pools,
               default=runs[-1])
    ratios = []
    for n in sorted({r.pools for r in runs}):
        by = {r.mode: r for r in runs if r.pools == n}
        if "list+raw" in by and "watch+rules" in by:
            a, b = by["list+raw"], by["watch+rules"]
            ratios.append({"pools": n,
                           "steady_before_over_after": round(a.cycle_seconds_p50
                                                             / b.cycle_seconds_p50, 2),
                           "first_before_over_after": round(a.first_cycle_seconds
                                                            / b.first_cycle_seconds, 2)})
    return {
        "pools": best.pools, "mode": best.mode,
        "cycle_seconds_p50": best.cycle_seconds_p50,
        "cycle_seconds_p99": best.cycle_seconds_p99,
        "first_cycle_seconds": best.first_cycle_seconds,
        "queries_per_cycle": best.queries_per_cycle,
        "setup": asdict(setup), "cpus": os.cpu_count(), "load_average": loads,
        "runs": [asdict(r) for r in runs], "ratios": ratios,
    }



def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--pools", type=int, nargs="+", default=[1, 100, 1000],
                   help="pool counts to measure (default 1 100 1000)")
    p.add_argument("--repeat", type=int, default=10, help="steady cycles timed per mode")
    p.add_argument("--history", type=int, default=0, metavar="CYCLES",
                   help="untimed cycles before the timed ones, each one interval (15 s) on, "
                   "so the decisions' history fills as in a long-running autoscaler (120: its "
                   "30 min window; default 0)")
    p.add_argument("--modes", default=",".join(MODES),
                   help=f"comma-separated subset of {', '.join(MODES)} (default: all)")
    p.add_argument("--baseline-max", type=int, default=1000,
                   help="run the raw-query modes only up to this many pools (default 1000)")
    p.add_argument("--total-shards", type=int, default=1, metavar="N",
                   help="measure shard 0 of N autoscalers splitting the pools (each decides "
                   "and queries ~1/N of them; the others would run in pods of their own) "
                   "(default 1)")
    p.add_argument("--every-shard", action="store_true",
                   help="with --total-shards: measure every shard in turn, each against the "
                   "full cluster and Prometheus, not shard 0 alone")
    p.add_argument("--scrape", type=float, default=15.0, help="scrape interval, s (default 15)")
    p.add_argument("--window", type=float, default=60.0,
                   help="the autoscaler's --rate-window, s (default 60)")
    p.add_argument("--rules-interval", type=float, default=10.0,
                   help="evaluation interval of the recording rules, s (default 10, the "
                   "chart's)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the results here")
    p.add_argument("--profile", type=Path, metavar="FILE",
                   help="cProfile the steady cycles; stats written to FILE.<pools>.<mode>")
    args = p.parse_args(argv)
    modes = [x for x in args.modes.split(",") if x]
    unknown = [x for x in modes if x not in MODES]
    if unknown or not modes:
        p.error(f"--modes: unknown {', '.join(unknown) or '(none given)'}; choose from "
                f"{', '.join(MODES)}")
    if any(n < 1 for n in args.pools):
        p.error("--pools: every count must be at least 1")
    if min(args.scrape, args.window, args.rules_interval) <= 0 or args.repeat < 1:
        p.error("--scrape, --window and --rules-interval must be > 0, --repeat at least 1")
    if args.history < 0:
        p.error("--history: a number of cycles, 0 or more")
    if args.total_shards < 1:
        p.error("--total-shards: at least 1")
    if args.every_shard and args.total_shards < 2:
        p.error("--every-shard: needs --total-shards 2 or more")
    gcpolicy.tune()  # as `poolpilot autoscaler` does
    # A SIGTERM runs the clean-up (Prometheus and the child processes stop with the run).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    setup = Setup(scrape_s=args.scrape, window_s=args.window,
                  rules_interval_s=args.rules_interval, repeat=args.repeat,
                  history_cycles=args.history, shards=args.total_shards,
                  every_shard=args.every_shard,
                  baseline_max=args.baseline_max)
    loads = {"start": load_average()}
    print(HEADER, flush=True)
    runs: list[Run] = []
    for n in args.pools:
        wanted = [x for x in modes if x == "watch+rules" or n <= setup.baseline_max]
        runs += asyncio.run(measure(n, setup, wanted, args.profile))
        loads[f"after {n} pools"] = load_average()
    result = report(runs, setup, loads)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    print(f"load average (1, 5, 15 min): {loads}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
