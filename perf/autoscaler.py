"""Benchmark: one autoscaler cycle for 1, 100 and 1,000 pools.

    poolpilot perf autoscaler --pools 1 100 1000

A real Prometheus scrapes one synthetic exporter that serves, for every pool, the series a
disaggregated pool's engines and router would (already carrying namespace/pool/role, as after
relabelling); the Kubernetes API emulator holds the pools and their Deployments. For each
size it reports the queries per cycle, the wall time of a full cycle (first: every pool
decided, with status writes, scales and Events; then cycles with nothing to write, run as
--dry-run: list, query, decide, report), its Prometheus and decision parts, and the same
signals fetched with one query set per pool (what the autoscaler avoids).
Times are medians; ratios are against the 1-pool run of the same invocation.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from poolpilot.autoscaler import decide as core
from poolpilot.autoscaler import queries as q
from poolpilot.autoscaler.kube import KubeClient, KubeError
from poolpilot.autoscaler.loop import Autoscaler, Options
from poolpilot.autoscaler.observe import PrometheusSource, observation
from poolpilot.emulator.server import KubeEmulator
from poolpilot.sandbox.localprom import MetricsPage, PrometheusProcess, Target, free_port

from poolpilot import api, names
from poolpilot import metrics as m

ROOT = Path(__file__).resolve().parents[1]
SCRAPE = 3.0
WINDOW = 15.0
POOLS = f"/apis/{api.GROUP}/{api.VERSION}"


def pool_name(i: int) -> tuple[str, str]:
    return f"bench-{i % 10}", f"p{i}"


class SyntheticExporter:
    """Text exposition for N pools; counters grow with time at per-pool rates.

    The page (about 85 series per pool) is prepared once as static pieces plus a handful of
    time-dependent values, so even 1,000 pools render well within a scrape interval.
    """

    def __init__(self, pools: int) -> None:
        self.pools = pools
        self.started = time.time()
        self.port = free_port()
        self._server: MetricsPage | None = None
        self._rates: dict[str, float] = {}  # dynamic key -> per-second growth
        self._pieces: list[bytes | str] = []  # bytes: static; str: a dynamic key
        self._build()

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

    def _build(self) -> None:
        for i in range(self.pools):
            ns, pool = pool_name(i)
            cls = i % 7
            load = cls / 3.0  # 0 .. 2: some pools idle, some over target
            for role in ("prefill", "decode"):
                lab = f'namespace="{ns}",pool="{pool}",role="{role}"'
                self._static(f"{m.VLLM_WAITING}{{{lab}}} {4 * load:.3f}")
                self._static(f"{m.VLLM_RUNNING}{{{lab}}} {60 * load:.3f}")
                self._static(f"{m.VLLM_KV_USAGE}{{{lab}}} {min(1.0, 0.45 * load):.3f}")
                self._counter(f"{m.VLLM_PROMPT_TOKENS}{{{lab}}}", f"prompt{cls}", 500 * load)
                self._counter(f"{m.VLLM_GENERATION_TOKENS}{{{lab}}}", f"gen{cls}", 80 * load)
                if role == "prefill":
                    self._histogram(m.VLLM_TTFT, lab, m.TTFT_BUCKETS, 0.5)
                else:
                    self._histogram(m.VLLM_ITL, lab, m.ITL_BUCKETS, 0.05)
            lab = f'namespace="{ns}",pool="{pool}",role="router"'
            self._static(f"{m.ROUTER_INFLIGHT}{{{lab}}} {5 * load:.3f}")
            self._counter(f'{m.ROUTER_REQUESTS}{{{lab},code="200"}}', "requests", 2)
            self._histogram(m.ROUTER_TTFT, lab, m.TTFT_BUCKETS, 0.75)

    def render(self) -> bytes:
        t = time.time() - self.started
        values = {k: f"{1e6 + r * t:.3f}".encode() for k, r in self._rates.items()}
        return b"".join(p if isinstance(p, bytes) else values[p] for p in self._pieces)

    def start(self) -> SyntheticExporter:
        self._server = MetricsPage(self.render, self.port)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()


async def populate(kube: KubeClient, n: int) -> None:
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
    limit = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        ns, pool = pool_name(i)
        role = {"replicas": 2, "minReplicas": 1, "maxReplicas": 16}
        body = {"apiVersion": api.API_VERSION, "kind": api.KIND,
                "metadata": {"name": pool, "namespace": ns},
                "spec": {"model": {"name": "m"}, "prefill": role, "decode": role}}
        async with limit:
            await kube.request("POST", f"{POOLS}/namespaces/{ns}/{api.PLURAL}", body=body)
            for r in ("prefill", "decode"):
                lab = names.labels(pool, r)
                dep: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "Deployment",
                       "metadata": {"name": names.child_name(pool, r), "namespace": ns,
                                    "labels": lab},
                       "spec": {"replicas": 2, "selector": {"matchLabels": lab},
                                "template": {"metadata": {"labels": lab}, "spec": {
                                    "containers": [{"name": "e", "image": "x"}]}}}}
                path = f"/apis/apps/v1/namespaces/{ns}/deployments"
                await kube.request("POST", path, body=dep)
                await kube.request("PATCH", f"{path}/{dep['metadata']['name']}/status",
                                   body={"status": {"readyReplicas": 2, "replicas": 2}},
                                   content_type="application/merge-patch+json")

    await asyncio.gather(*(one(i) for i in range(n)))


def wait_for_series(prom: PrometheusProcess, n: int, timeout: float = 180) -> None:
    source = PrometheusSource(prom.url, q.QuerySet(window_seconds=WINDOW))
    deadline = time.monotonic() + timeout
    first = None
    while time.monotonic() < deadline:
        snap = source.fetch()
        if len(snap.values.get(q.PROMPT_RATE, {})) >= 2 * n:
            first = first or time.monotonic()
            if time.monotonic() - first >= WINDOW + SCRAPE:
                return
        time.sleep(0.5)
    raise TimeoutError(f"Prometheus did not get series for {n} pools in {timeout}s")


def median_time(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclass
class Row:
    pools: int
    queries: int
    first_cycle: float
    steady_cycle: float
    prometheus: float
    decide: float
    api_requests_steady: int
    naive_queries: int | None = None
    naive_prometheus: float | None = None


async def measure(n: int, repeat: int, naive_max: int, per_query: bool = False) -> Row:
    exporter = SyntheticExporter(n).start()
    emu = KubeEmulator()
    try:
        with emu.running(), tempfile.TemporaryDirectory() as tmp, \
                PrometheusProcess(scrape_interval=SCRAPE) as prom:
            kubeconfig = emu.write_kubeconfig(Path(tmp) / "kubeconfig")
            prom.start([Target(f"127.0.0.1:{exporter.port}")])
            kube = await KubeClient.connect(str(kubeconfig))
            try:
                await populate(kube, n)
                await asyncio.to_thread(wait_for_series, prom, n)
                source = PrometheusSource(prom.url, q.QuerySet(window_seconds=WINDOW))
                now = [time.time()]
                scaler = Autoscaler(kube, source, Options(), clock=lambda: now[0])
                t0 = time.perf_counter()
                first = await scaler.cycle()
                first_s = time.perf_counter() - t0
                assert first.decided == n, first
                # Later cycles with nothing to write (dry run: read, query, decide, report).
                reader = Autoscaler(kube, source, Options(dry_run=True), clock=lambda: now[0])
                steady = []
                requests = 0
                for _ in range(repeat):
                    now[0] += 20
                    before = kube.requests
                    t0 = time.perf_counter()
                    await reader.cycle()
                    steady.append(time.perf_counter() - t0)
                    requests = kube.requests - before
                prom_s = await asyncio.to_thread(median_time, source.fetch, repeat)
                snap = source.fetch()
                wl = await kube.workloads()
                pools = [pool_name(i) for i in range(n)]
                policy = core.Policy(bounds={"prefill": (1, 16), "decode": (1, 16)})

                def decide_all() -> None:
                    for ns, pool in pools:
                        states = {r: s for r in ("prefill", "decode")
                                  if (s := wl.role_state(ns, pool, r)) is not None}
                        obs = observation(ns, pool, states, snap, 0.9, 0.9)
                        core.decide(obs, policy, core.History.warm(), snap.time)

                decide_s = median_time(decide_all, repeat)
                if per_query:
                    qs = source.query_set.build()
                    for key, promql in qs.items():
                        t = await asyncio.to_thread(
                            median_time, partial(source._prom.custom_query, promql), repeat)
                        print(f"  {n} pools, {key}: {t * 1000:.0f} ms", flush=True)
                row = Row(n, first.queries, first_s, statistics.median(steady), prom_s,
                          decide_s, requests)
                if n <= naive_max:
                    row.naive_queries, row.naive_prometheus = naive(prom, pools, repeat)
                return row
            finally:
                await kube.close()
    finally:
        exporter.stop()


def naive(prom: PrometheusProcess, pools: list[tuple[str, str]], repeat: int
          ) -> tuple[int, float]:
    """The same signals with one query set per pool (what most autoscalers do)."""
    per_pool = [PrometheusSource(prom.url, replace(q.QuerySet(window_seconds=WINDOW),
                                                   namespaces=(ns,)), parallel=4)
                for ns, _ in pools]
    # Narrow each set to its pool by name, as a per-pool autoscaler would.
    for src, (_, pool) in zip(per_pool, pools, strict=True):
        src.query_set = _PoolQuerySet(src.query_set.window_seconds, src.query_set.namespaces,
                                      pool)
    count = sum(len(s.query_set.build()) for s in per_pool)

    def run_all() -> None:
        for s in per_pool:
            s.fetch()

    return count, median_time(run_all, max(1, repeat // 2))


@dataclass(frozen=True)
class _PoolQuerySet(q.QuerySet):
    pool: str = ""

    def selector(self) -> str:
        return super().selector().replace('pool!=""', f'pool="{self.pool}"')


def table(rows: list[Row]) -> str:
    base = rows[0]
    lines = [
        "| pools | queries/cycle | first cycle (all write) | cycle, no writes | ratio vs "
        f"{base.pools} pool | Prometheus part | decide() for all pools | API requests "
        "| per-pool queries: count, time |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        naive_txt = (f"{r.naive_queries}, {r.naive_prometheus:.2f} s"
                     if r.naive_queries is not None and r.naive_prometheus is not None else "—")
        lines.append(
            f"| {r.pools} | {r.queries} | {r.first_cycle:.2f} s | {r.steady_cycle:.3f} s | "
            f"{r.steady_cycle / base.steady_cycle:.1f}x | {r.prometheus:.3f} s | "
            f"{r.decide * 1000:.1f} ms | {r.api_requests_steady} | {naive_txt} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--pools", type=int, nargs="+", default=[1, 100, 1000],
                   help="pool counts to measure (default 1 100 1000)")
    p.add_argument("--repeat", type=int, default=5, help="steady cycles timed per count")
    p.add_argument("--per-query", action="store_true", help="also time each query alone")
    p.add_argument("--naive-max", type=int, default=100,
                   help="also time per-pool queries up to this many pools")
    args = p.parse_args(argv)
    rows = []
    for n in args.pools:
        rows.append(asyncio.run(measure(n, args.repeat, args.naive_max, args.per_query)))
        print(f"measured {n} pools", flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
