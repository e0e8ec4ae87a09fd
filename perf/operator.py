"""Operator benchmark: reconcile latency and throughput for N pools against the emulator.

    poolpilot perf operator --pools 1 100 1000

For each N, a fresh emulator process and a fresh `poolpilot operator` process (the real CLI)
run; N pools are created through the API (16 at a time) and a watch records when each pool's
last child (its router PodDisruptionBudget, applied last) appears. Latency = that moment minus
the pool's creation; throughput = N / (last child seen - first pool created). The baseline is
one client server-side applying the same rendered children directly (no operator) to a fresh
emulator, so the ratio shows what the operator adds over the API's own cost. The operator's
resident memory (VmRSS) is read from /proc after its pools settled.

The operator's own cost, with the emulator out of the way: the CPU time the operator process
used (/proc/PID/stat) between creating the pools and every pool's status being written, per
pool, and the reconciles it made per CPU-second (what it sustains when the API answers at
once; the emulator's CPU over the same window shows which side bounds the wall-clock rate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from poolpilot.kubeclient import KubeClient
from poolpilot.operator import builders

from poolpilot import api, crd, names
from poolpilot.validate import parse_spec

NS = "bench"
CONCURRENCY = 16


def _pool(i: int) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": f"pool-{i:04d}", "namespace": NS},
            "spec": {"model": {"name": "org/model"}, "prefill": {"gpus": 0},
                     "decode": {"gpus": 0}}}


@contextmanager
def _emulator(workdir: Path) -> Iterator[tuple[str, Path, int]]:
    kubeconfig = workdir / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "poolpilot.cli", "emulator", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError("the emulator did not start")
        yield url, kubeconfig, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def _operator(kubeconfig: Path, log: Path) -> Iterator[int]:
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "poolpilot.cli", "operator", "--kubeconfig", str(kubeconfig),
             "--standalone", "--liveness", "", "--drift-interval", "600", "-n", NS],
            stdout=out, stderr=subprocess.STDOUT,
        )
        try:
            yield proc.pid
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used (/proc/PID/stat, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _install_crd(client: httpx.AsyncClient) -> None:
    r = await client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                          json=crd.build_crd())
    r.raise_for_status()
    path = f"/apis/{api.API_VERSION}/namespaces/{NS}/{api.PLURAL}"
    for _ in range(200):
        if (await client.get(path)).status_code == 200:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("CRD not served")


async def _create_pools(client: httpx.AsyncClient, n: int) -> dict[str, float]:
    created: dict[str, float] = {}
    sem = asyncio.Semaphore(CONCURRENCY)
    path = f"/apis/{api.API_VERSION}/namespaces/{NS}/{api.PLURAL}"

    async def one(i: int) -> None:
        async with sem:
            r = await client.post(path, json=_pool(i))
            r.raise_for_status()
            created[f"pool-{i:04d}"] = time.monotonic()

    await asyncio.gather(*(one(i) for i in range(n)))
    return created


async def _watch_last_children(client: httpx.AsyncClient, n: int, seen: dict[str, float],
                               started: asyncio.Event) -> None:
    path = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets"
    params = {"watch": "1", "timeoutSeconds": "3600"}
    async with client.stream("GET", path, params=params, timeout=None) as resp:
        started.set()
        async for line in resp.aiter_lines():
            if not line:
                continue
            event = json.loads(line)
            obj = event.get("object", {})
            name = obj.get("metadata", {}).get("name", "")
            if event.get("type") == "ADDED" and name.endswith("-router"):
                seen.setdefault(name.removesuffix("-router"), time.monotonic())
                if len(seen) >= n:
                    return


@dataclass
class Result:
    pools: int
    p50: float
    p99: float
    total: float
    throughput: float
    rss_idle: float = float("nan")
    rss_loaded: float = float("nan")
    # The operator's own cost, the API's out of the way: CPU it spent while the pools were
    # created and reconciled, and the reconciles it made (one per pool and spec change, its
    # log's "reconciled with" lines).
    operator_cpu: float = float("nan")
    reconciles: int = 0
    emulator_cpu: float = float("nan")

    @property
    def cpu_ms_per_pool(self) -> float:
        return 1000 * self.operator_cpu / self.pools

    @property
    def reconciles_per_cpu_second(self) -> float:
        return self.reconciles / self.operator_cpu if self.operator_cpu else float("nan")


def _summary(n: int, created: dict[str, float], seen: dict[str, float]) -> Result:
    lat = sorted(seen[p] - created[p] for p in created)
    total = max(seen.values()) - min(created.values())
    p99 = lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))]
    return Result(n, statistics.median(lat), p99, total, n / total)


async def _measure_operator(url: str, kubeconfig: Path, n: int, workdir: Path,
                            emulator_pid: int) -> Result:
    log = workdir / f"operator-{n}.log"
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        await _install_crd(client)
        with _operator(kubeconfig, log) as pid:
            # Idle: the operator has started and listed the (empty) namespace.
            await client.post(f"/apis/{api.API_VERSION}/namespaces/{NS}/{api.PLURAL}",
                              json=_pool(99999))
            for _ in range(600):
                r = await client.get(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets")
                if r.json().get("items"):
                    break
                await asyncio.sleep(0.05)
            rss_idle = rss_mib(pid)
            await _settled(client, 1)
            reconciles_before = _reconciles(log)
            cpu_before, emu_before = cpu_seconds(pid), cpu_seconds(emulator_pid)
            seen: dict[str, float] = {}
            started = asyncio.Event()
            watcher = asyncio.create_task(_watch_last_children(client, n + 1, seen, started))
            await started.wait()
            created = await _create_pools(client, n)
            await asyncio.wait_for(watcher, timeout=1800)
            await _settled(client, n + 1)  # every status written: the reconciles are done
            seen.pop("pool-99999", None)
            result = _summary(n, created, seen)
            result.rss_idle, result.rss_loaded = rss_idle, rss_mib(pid)
            result.operator_cpu = cpu_seconds(pid) - cpu_before
            result.emulator_cpu = cpu_seconds(emulator_pid) - emu_before
            result.reconciles = _reconciles(log) - reconciles_before
            await _check_all_children(client, n)
            return result


def _reconciles(log: Path) -> int:
    return log.read_text(errors="replace").count("reconciled with ")


async def _settled(client: httpx.AsyncClient, n: int, timeout: float = 1800) -> None:
    """Until `n` pools have the status of their generation."""
    path = f"/apis/{api.API_VERSION}/namespaces/{NS}/{api.PLURAL}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items = (await client.get(path)).json()["items"]
        done = sum(1 for p in items if (p.get("status") or {}).get("observedGeneration")
                   == p["metadata"].get("generation"))
        if done >= n:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{n} pools did not settle in {timeout:.0f}s")


async def _check_all_children(client: httpx.AsyncClient, n: int) -> None:
    deps = (await client.get(f"/apis/apps/v1/namespaces/{NS}/deployments")).json()["items"]
    counts: dict[str, int] = {}
    for d in deps:
        pool = d["metadata"]["labels"][names.POOL_LABEL]
        counts[pool] = counts.get(pool, 0) + 1
    short = [p for p in (f"pool-{i:04d}" for i in range(n)) if counts.get(p) != 3]
    if short:
        raise RuntimeError(f"{len(short)} pools lack Deployments, e.g. {short[:3]}")


async def _measure_baseline(url: str, kubeconfig: Path, n: int) -> Result:
    """One client (the operator's own, kubeclient) applying the rendered children directly,
    16 pools at a time."""
    kube = await KubeClient.connect(kubeconfig, timeout=60)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        await _install_crd(client)
        sem = asyncio.Semaphore(CONCURRENCY)
        created: dict[str, float] = {}
        seen: dict[str, float] = {}
        path = f"/apis/{api.API_VERSION}/namespaces/{NS}/{api.PLURAL}"

        async def one(i: int) -> None:
            async with sem:
                body = _pool(i)
                r = await client.post(path, json=body)
                r.raise_for_status()
                name = body["metadata"]["name"]
                created[name] = time.monotonic()
                uid = r.json()["metadata"]["uid"]
                pool = builders.Pool(name, NS, parse_spec(body["spec"]), uid)
                for obj in builders.build_children(pool, builders.Capabilities(rbac=False)):
                    await kube.apply(obj, manager=names.FIELD_MANAGER)
                seen[name] = time.monotonic()

        try:
            await asyncio.gather(*(one(i) for i in range(n)))
        finally:
            await kube.close()
        return _summary(n, created, seen)


def run_bench(counts: list[int]) -> list[tuple[Result, Result]]:
    out = []
    with tempfile.TemporaryDirectory(prefix="operator-bench-") as tmp:
        workdir = Path(tmp)
        for n in counts:
            with _emulator(workdir) as (url, kubeconfig, _):
                base = asyncio.run(_measure_baseline(url, kubeconfig, n))
            with _emulator(workdir) as (url, kubeconfig, emulator_pid):
                op = asyncio.run(_measure_operator(url, kubeconfig, n, workdir, emulator_pid))
            out.append((op, base))
            print(_row(op, base), flush=True)
    return out


HEADER = ("| pools | latency p50 (s) | latency p99 (s) | all children (s) | pools/s | "
          "direct-apply pools/s | operator / direct | operator RSS idle → loaded (MiB) | "
          "operator CPU per pool (ms) | reconciles per operator CPU-second | "
          "emulator / operator CPU |\n"
          "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def _row(op: Result, base: Result) -> str:
    return (f"| {op.pools} | {op.p50:.3f} | {op.p99:.3f} | {op.total:.2f} | "
            f"{op.throughput:.1f} | {base.throughput:.1f} | "
            f"{op.throughput / base.throughput:.2f} | {op.rss_idle:.0f} → {op.rss_loaded:.0f} | "
            f"{op.cpu_ms_per_pool:.0f} | {op.reconciles_per_cpu_second:.1f} | "
            f"{op.emulator_cpu / op.operator_cpu:.1f} |")


def as_json(op: Result, base: Result) -> dict[str, float]:
    return {
        "pools": op.pools, "latency_p50_s": op.p50, "latency_p99_s": op.p99,
        "all_children_s": op.total, "pools_per_s": op.throughput,
        "direct_apply_pools_per_s": base.throughput,
        "operator_rss_idle_mib": op.rss_idle, "operator_rss_loaded_mib": op.rss_loaded,
        "operator_cpu_seconds": op.operator_cpu, "operator_cpu_ms_per_pool": op.cpu_ms_per_pool,
        "reconciles": op.reconciles,
        "reconciles_per_operator_cpu_second": op.reconciles_per_cpu_second,
        "emulator_cpu_seconds": op.emulator_cpu,
    }


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--pools", type=int, nargs="+", default=[1, 100, 1000],
                        help="pool counts to measure (default 1 100 1000)")
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write the results as JSON (one object per pool count)")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    print(HEADER, flush=True)
    results = run_bench(args.pools)
    if args.json:
        args.json.write_text(json.dumps([as_json(op, base) for op, base in results], indent=2)
                             + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
