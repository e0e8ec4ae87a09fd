"""How fast the emulator answers the calls an operator makes, against bare HTTP on the same
server: `poolpilot perf emulator [--objects 1000] [--watchers 4]`.

Phases (sequential requests from one aiohttp client, keep-alive): GET /version (the baseline:
HTTP and routing only), server-side apply creating N Deployments, re-applying them unchanged
(the no-op reconcile), applying a changed image, listing by label selector, merge-patching
status; while `--watchers` watches stream every change. Prints per-request latency and the
ratio to the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

import aiohttp
from poolpilot.emulator.server import KubeEmulator

from poolpilot.roles import Role


def _deployment(i: int, image: str) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "poolpilot", "poolpilot.dev/pool": f"p{i}",
              "poolpilot.dev/role": Role.DECODE}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": f"p{i}-decode", "namespace": "bench", "labels": labels},
        "spec": {
            "replicas": 2, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{
                "name": "engine", "image": image, "args": ["--model", "m", "--port", "8000"],
                "env": [{"name": f"E{j}", "value": "v"} for j in range(8)],
                "ports": [{"containerPort": 8000, "name": "http"}],
                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}},
            }]}},
        },
    }


async def _timed(session: aiohttp.ClientSession, n: int, make: Any) -> list[float]:
    out = []
    for i in range(n):
        method, url, body, ctype = make(i)
        start = time.perf_counter()
        async with session.request(method, url, data=body,
                                   headers={"Content-Type": ctype}) as resp:
            await resp.read()
            if resp.status >= 300:
                raise RuntimeError(f"{method} {url}: {resp.status}")
        out.append(time.perf_counter() - start)
    return out


async def _watch(session: aiohttp.ClientSession, url: str, seen: list[int]) -> None:
    async with session.get(f"{url}/apis/apps/v1/namespaces/bench/deployments?watch=1") as resp:
        async for _ in resp.content:
            seen[0] += 1


async def run_bench(objects: int, watchers: int) -> list[tuple[str, float, float]]:
    async with KubeEmulator() as emu, aiohttp.ClientSession() as session:
        url = emu.url
        seen = [0]
        tasks = [asyncio.create_task(_watch(session, url, seen)) for _ in range(watchers)]
        apply_ct = "application/apply-patch+yaml"

        def apply(image: str) -> Any:
            return lambda i: ("PATCH", f"{url}/apis/apps/v1/namespaces/bench/deployments/"
                              f"p{i}-decode?fieldManager=bench&force=true",
                              json.dumps(_deployment(i, image)), apply_ct)

        phases = [
            ("GET /version (baseline)", lambda i: ("GET", f"{url}/version", None,
                                                   "application/json")),
            ("apply: create", apply("vllm:1")),
            ("apply: unchanged (no-op)", apply("vllm:1")),
            ("apply: new image", apply("vllm:2")),
            ("list by label selector", lambda i: (
                "GET", f"{url}/apis/apps/v1/namespaces/bench/deployments?labelSelector="
                f"poolpilot.dev/pool%3Dp{i}", None, "application/json")),
            ("merge-patch /status", lambda i: (
                "PATCH", f"{url}/apis/apps/v1/namespaces/bench/deployments/p{i}-decode/status",
                json.dumps({"status": {"readyReplicas": 2, "replicas": 2}}),
                "application/merge-patch+json")),
        ]
        results = []
        for name, make in phases:
            lat = await _timed(session, objects, make)
            results.append((name, statistics.median(lat) * 1e3, objects / sum(lat)))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return results


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=1000,
                        help="Deployments applied, re-applied, changed, listed and patched "
                        "(default 1000)")
    parser.add_argument("--watchers", type=int, default=4,
                        help="watch streams open meanwhile, each receiving every change "
                        "(default 4)")
    args = parser.parse_args(argv)
    results = asyncio.run(run_bench(args.objects, args.watchers))
    base = results[0][1]
    print(f"{args.objects} objects, {args.watchers} watchers streaming every change")
    print("| request | p50 ms | req/s | p50 / baseline |")
    print("|---|---|---|---|")
    for name, p50, rate in results:
        print(f"| {name} | {p50:.2f} | {rate:.0f} | {p50 / base:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
