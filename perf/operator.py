"""Operator benchmark: what the operator itself costs per pool, with the API server measured
apart.

    poolpilot perf operator --pools 1 100 1000 --json operator.json

For each N a fresh emulator process (`poolpilot emulator`) and a fresh `poolpilot operator`
process (the real CLI, standalone) run; N pools are created through the API (16 at a time)
and a watch records when each pool's last child (its router PodDisruptionBudget) appears.
Then that operator is stopped and a second one started: it resumes every pool, a reconcile
that finds everything in place (what a restart, an upgrade or a failover costs).

Both processes' CPU time is read from /proc, so the operator's own cost per reconcile is
known whatever the API server or the machine's load add to the wall time: `reconciles per
CPU second` is what the operator sustains with one core to itself. Reconciles are counted
from Kopf's log ("Handler '...reconcile_pool' succeeded"). The baseline (same run, fresh
emulator): one client server-side applying the same rendered children directly, 16 pools at a
time. RSS is the operator's VmRSS idle (one pool) and with all N pools.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
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
from poolpilot.perf.procstat import cpu_seconds, load_average, rss_mib

from poolpilot import api, crd, names
from poolpilot.validate import parse_spec

NS = "bench"
CONCURRENCY = 16
# Kopf logs "Handler 'register.<locals>.reconcile_pool' succeeded." per reconcile.
SUCCEEDED = "reconcile_pool' succeeded"


def _pool(i: int) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": f"pool-{i:04d}", "namespace": NS},
            "spec": {"model": {"name": "org/model"}, "prefill": {"gpus": 0},
                     "decode": {"gpus": 0}}}


@contextmanager
def _emulator(workdir: Path) -> Iterator[tuple[str, Path, int]]:
    kubeconfig = workdir / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "poolpilot.cli", "emulator", "--write-kubeconfig", str(kubeconfig),
         "--request-log-limit", "1000"],
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


@dataclass
class OperatorProc:
    pid: int
    log: Path

    def succeeded(self) -> int:
        """Reconciles Kopf logged as succeeded so far."""
        return self.log.read_text(errors="replace").count(SUCCEEDED)


@contextmanager
def _operator(kubeconfig: Path, log: Path, profile: Path | None = None
              ) -> Iterator[OperatorProc]:
    cmd = [sys.executable, "-m", "poolpilot.cli", "operator", "--kubeconfig", str(kubeconfig),
           "--standalone", "--liveness", "", "--drift-interval", "600", "-n", NS]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        spy = None
        if profile is not None:
            spy = subprocess.Popen([_py_spy(), "record", "--pid", str(proc.pid), "--rate", "100",
                                    "--format", "raw", "--output", str(profile)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            yield OperatorProc(proc.pid, log)
        finally:
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
                spy.wait(timeout=60)
            proc.terminate()
            proc.wait(timeout=60)


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("--profile needs py-spy (pip install py-spy; it is in the dev extras)")
    return found


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
    latency_p50_seconds: float = 0.0
    latency_p99_seconds: float = 0.0
    all_children_seconds: float = 0.0
    pools_per_second: float = 0.0
    direct_apply_pools_per_second: float = 0.0
    # The operator's own CPU: creating the pools (their first reconcile) and resuming them
    # after a restart (a reconcile that finds every child in place).
    create_reconciles: int = 0
    create_operator_cpu_seconds: float = 0.0
    create_api_cpu_seconds: float = 0.0
    resume_reconciles: int = 0
    resume_seconds: float = 0.0
    resume_operator_cpu_seconds: float = 0.0
    resume_api_cpu_seconds: float = 0.0
    startup_cpu_seconds: float = 0.0  # an operator's CPU until it reconciled one pool
    rss_idle_mib: float = 0.0
    rss_loaded_mib: float = 0.0
    rss_resumed_mib: float = 0.0

    @property
    def create_cpu_ms_per_reconcile(self) -> float:
        return 1000 * self.create_operator_cpu_seconds / max(1, self.create_reconciles)

    @property
    def resume_cpu_ms_per_reconcile(self) -> float:
        return 1000 * self.resume_operator_cpu_seconds / max(1, self.resume_reconciles)

    def as_json(self) -> dict[str, Any]:
        """The JSON fields (the names of the first version of this harness where they mean
        the same: `operator_cpu_ms_per_pool`, `reconciles_per_operator_cpu_second`, ...)."""
        return {
            "pools": self.pools, "latency_p50_s": self.latency_p50_seconds,
            "latency_p99_s": self.latency_p99_seconds,
            "all_children_s": self.all_children_seconds, "pools_per_s": self.pools_per_second,
            "direct_apply_pools_per_s": self.direct_apply_pools_per_second,
            "operator_rss_idle_mib": self.rss_idle_mib,
            "operator_rss_loaded_mib": self.rss_loaded_mib,
            "operator_rss_resumed_mib": self.rss_resumed_mib,
            "operator_startup_cpu_seconds": self.startup_cpu_seconds,
            # Creating the pools: their first reconcile (and Kopf's retries, if any).
            "reconciles": self.create_reconciles,
            "operator_cpu_seconds": self.create_operator_cpu_seconds,
            "operator_cpu_ms_per_pool": 1000 * self.create_operator_cpu_seconds / self.pools,
            "operator_cpu_ms_per_reconcile": self.create_cpu_ms_per_reconcile,
            "reconciles_per_operator_cpu_second":
                1000 / max(1e-9, self.create_cpu_ms_per_reconcile),
            "emulator_cpu_seconds": self.create_api_cpu_seconds,
            # A restarted operator resuming every pool (nothing to change).
            "resume_s": self.resume_seconds, "resume_reconciles": self.resume_reconciles,
            "resume_operator_cpu_seconds": self.resume_operator_cpu_seconds,
            "resume_operator_cpu_ms_per_reconcile": self.resume_cpu_ms_per_reconcile,
            "resume_reconciles_per_operator_cpu_second":
                1000 / max(1e-9, self.resume_cpu_ms_per_reconcile),
            "resume_emulator_cpu_seconds": self.resume_api_cpu_seconds,
        }


def _latencies(result: Result, created: dict[str, float], seen: dict[str, float]) -> None:
    lat = sorted(seen[p] - created[p] for p in created)
    total = max(seen.values()) - min(created.values())
    result.latency_p50_seconds = statistics.median(lat)
    result.latency_p99_seconds = lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))]
    result.all_children_seconds = total
    result.pools_per_second = len(created) / total


async def _until(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {timeout:.0f}s")
        await asyncio.sleep(0.2)


async def _measure_operator(url: str, kubeconfig: Path, api_pid: int, n: int, workdir: Path,
                            profile: Path | None) -> Result:
    result = Result(n)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        await _install_crd(client)
        spy = profile.with_name(f"{profile.name}.{n}.create") if profile else None
        with _operator(kubeconfig, workdir / f"operator-{n}.log", spy) as op:
            # Idle: the operator has started and reconciled one pool.
            await client.post(f"/apis/{api.API_VERSION}/namespaces/{NS}/{api.PLURAL}",
                              json=_pool(99999))
            await _until(lambda: op.succeeded() >= 1, 120, "the first reconcile")
            result.rss_idle_mib = rss_mib(op.pid)
            result.startup_cpu_seconds = cpu_seconds(op.pid)
            seen: dict[str, float] = {}
            started = asyncio.Event()
            watcher = asyncio.create_task(_watch_last_children(client, n + 1, seen, started))
            await started.wait()
            cpu0, api0, done0 = cpu_seconds(op.pid), cpu_seconds(api_pid), op.succeeded()
            created = await _create_pools(client, n)
            await asyncio.wait_for(watcher, timeout=3600)
            # The last status writes follow the last child: every pool's reconcile finished.
            await _until(lambda: op.succeeded() - done0 >= n, 600, f"{n} reconciles")
            result.create_operator_cpu_seconds = cpu_seconds(op.pid) - cpu0
            result.create_api_cpu_seconds = cpu_seconds(api_pid) - api0
            result.create_reconciles = op.succeeded() - done0
            seen.pop("pool-99999", None)
            _latencies(result, created, seen)
            result.rss_loaded_mib = rss_mib(op.pid)
            await _check_all_children(client, n)
        # A restart: a new operator resumes every pool (n + the idle one), changing nothing.
        spy = profile.with_name(f"{profile.name}.{n}.resume") if profile else None
        api0, t0 = cpu_seconds(api_pid), time.monotonic()
        with _operator(kubeconfig, workdir / f"operator-{n}-resume.log", spy) as op:
            await _until(lambda: op.succeeded() >= n + 1, 3600, f"{n + 1} resumed pools")
            result.resume_seconds = time.monotonic() - t0
            # The process's CPU less what starting up (and one reconcile) cost the first one.
            result.resume_operator_cpu_seconds = max(
                0.0, cpu_seconds(op.pid) - result.startup_cpu_seconds)
            result.resume_api_cpu_seconds = cpu_seconds(api_pid) - api0
            result.resume_reconciles = op.succeeded()
            result.rss_resumed_mib = rss_mib(op.pid)
    return result


async def _check_all_children(client: httpx.AsyncClient, n: int) -> None:
    deps = (await client.get(f"/apis/apps/v1/namespaces/{NS}/deployments")).json()["items"]
    counts: dict[str, int] = {}
    for d in deps:
        pool = d["metadata"]["labels"][names.POOL_LABEL]
        counts[pool] = counts.get(pool, 0) + 1
    short = [p for p in (f"pool-{i:04d}" for i in range(n)) if counts.get(p) != 3]
    if short:
        raise RuntimeError(f"{len(short)} pools lack Deployments, e.g. {short[:3]}")


async def _measure_baseline(url: str, kubeconfig: Path, n: int) -> float:
    """Pools/s of one client (the operator's own, kubeclient) applying the rendered children
    directly, 16 pools at a time."""
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
        return n / (max(seen.values()) - min(created.values()))


def run_bench(counts: list[int], profile: Path | None) -> list[Result]:
    out = []
    with tempfile.TemporaryDirectory(prefix="operator-bench-") as tmp:
        workdir = Path(tmp)
        for n in counts:
            with _emulator(workdir) as (url, kubeconfig, _):
                base = asyncio.run(_measure_baseline(url, kubeconfig, n))
            with _emulator(workdir) as (url, kubeconfig, api_pid):
                op = asyncio.run(_measure_operator(url, kubeconfig, api_pid, n, workdir,
                                                   profile))
            op.direct_apply_pools_per_second = base
            out.append(op)
            print(_row(op), flush=True)
    return out


HEADER = ("| pools | latency p50 (s) | p99 (s) | all children (s) | pools/s | direct-apply "
          "pools/s | operator CPU ms per reconcile: create, resume | reconciles per operator "
          "CPU second | API CPU ms per pool: create, resume | resume all (s) | operator RSS "
          "idle → loaded → resumed (MiB) |\n"
          "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def _row(r: Result) -> str:
    return (f"| {r.pools} | {r.latency_p50_seconds:.3f} | {r.latency_p99_seconds:.3f} | "
            f"{r.all_children_seconds:.2f} | {r.pools_per_second:.1f} | "
            f"{r.direct_apply_pools_per_second:.1f} | {r.create_cpu_ms_per_reconcile:.1f}, "
            f"{r.resume_cpu_ms_per_reconcile:.1f} | "
            f"{1000 / max(1e-9, r.create_cpu_ms_per_reconcile):.1f} | "
            f"{1000 * r.create_api_cpu_seconds / r.pools:.1f}, "
            f"{1000 * r.resume_api_cpu_seconds / r.pools:.1f} | {r.resume_seconds:.1f} | "
            f"{r.rss_idle_mib:.0f} → {r.rss_loaded_mib:.0f} → {r.rss_resumed_mib:.0f} |")


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--pools", type=int, nargs="+", default=[1, 100, 1000],
                        help="pool counts to measure (default 1 100 1000)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results here")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="record the operator with py-spy (raw stacks) to "
                        "FILE.<pools>.create and FILE.<pools>.resume")
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.pools):
        parser.error("--pools: every count must be at least 1")
    if args.profile is not None:
        _py_spy()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # children stop with the run
    loads = {"start": load_average()}
    print(HEADER, flush=True)
    results = run_bench(args.pools, args.profile)
    loads["end"] = load_average()
    if args.json:
        args.json.write_text(json.dumps({
            "cpus": os.cpu_count(), "load_average": loads,
            "runs": [r.as_json() for r in results],
        }, indent=2) + "\n")
        print(f"wrote {args.json}")
    print(f"load average (1, 5, 15 min): {loads}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
