"""Scale-downs lose nothing: decode 4 -> 1 and prefill 3 -> 1 while a steady stream of
requests plays through the pool's router, in the sandbox (the Kubernetes API emulator, its
kubelet running simulated engines and the router as pods, the operator).

What happens to each victim pod is what a cluster does: its EndpointSlice entry turns
`ready: false, terminating: true` at once, the preStop sleep runs, then SIGTERM, and the
engine finishes what it holds within the grace period. The router must stop sending new
requests to it as soon as the slice says so, and let the ones in flight finish. Budget: about
a minute (speed 4).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from poolpilot.engine_sim.traces import TraceRequest
from poolpilot.sandbox.loadgen import Replayer, RequestResult
from poolpilot.sandbox.supervisor import AppliedPool, SandboxConfig
from poolpilot.testkit.polling import wait_for
from poolpilot.testkit.sandbox import SandboxThread

from poolpilot import workloads

pytestmark = [pytest.mark.adapter, pytest.mark.cluster]

SPEED = 4.0
REPO = Path(__file__).resolve().parents[2]
BURST_POOL = REPO / "e2e" / "burst-pool.yaml"  # the scenarios' pool, here without autoscaling
START = {"prefill": 3, "decode": 4}
# A steady load: a request every 0.25 simulated seconds for 40 s, each streaming 400 tokens
# (a few seconds of decode), so every decode pod holds streams when the scale-down comes.
RATE_S, DURATION_S, OUTPUT_TOKENS, INPUT_TOKENS = 0.25, 40.0, 400, 600
SCALE_AT_S = 15.0  # trace time of the scale-down


def pool_manifest() -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(BURST_POOL.read_text())
    manifest["metadata"] = {"name": "drain", "namespace": "drain"}
    spec = manifest["spec"]
    spec["autoscaling"]["enabled"] = False  # the test scales; nothing scales back
    for role, n in START.items():
        spec[role].update(replicas=n, minReplicas=1, maxReplicas=4)
    return manifest


def steady_trace() -> list[TraceRequest]:
    n = int(DURATION_S / RATE_S)
    return [TraceRequest(i * RATE_S, INPUT_TOKENS, OUTPUT_TOKENS) for i in range(n)]


@dataclass
class Drained:
    pool: AppliedPool
    results: list[RequestResult]
    scaled_at: float  # time.monotonic() of the scale-down
    sizes: dict[str, tuple[int, int]]  # role -> (desired, ready) at the end


def deployment_counts(sb: SandboxThread, pool: AppliedPool, role: str) -> tuple[int, int]:
    r = sb.sandbox.kubectl_run("get", "deployment", f"{pool.name}-{role}", "-n",
                               pool.namespace, "-o", "json", check=False)
    if r.returncode != 0:
        return (-1, 0)
    c = workloads.counts(json.loads(r.stdout))
    return (c.desired, c.ready)


def engine_pods(sb: SandboxThread, pool: AppliedPool, role: str) -> int:
    assert sb.sandbox.controller is not None
    prefix = f"{pool.name}-{role}-"
    return sum(1 for rt in sb.sandbox.controller.kubelet.runtimes.values()
               if rt.namespace == pool.namespace and rt.name.startswith(prefix))


@pytest.fixture(scope="module")
def drained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Drained]:
    out = tmp_path_factory.mktemp("drain")
    cfg = SandboxConfig(out_dir=out, speed=SPEED, scrape_interval_s=5.0, cold_start_s=10.0,
                        sim_gpu="a100", autoscaler=False)
    path = out / "drain.yaml"
    path.write_text(yaml.safe_dump(pool_manifest(), sort_keys=False))
    with SandboxThread(cfg) as sb:
        s = sb.sandbox
        pool = sb.call(s.apply(path))
        sb.call(s.wait_ready(pool, timeout=150), timeout=180)
        wait_for(lambda: all(deployment_counts(sb, pool, r) == (n, n) for r, n in START.items()),
                 timeout=120, what="prefill 3/3 and decode 4/4 ready")
        replayer = Replayer(lambda: s.router_urls(pool), pool.spec.served_name(), SPEED)
        scaled: list[float] = []

        def patch() -> None:
            body = {"spec": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}}
            r = s.kubectl_run("patch", "inferencepool.poolpilot.dev", pool.name, "-n",
                              pool.namespace, "--type", "merge", "-p", json.dumps(body))
            assert r.returncode == 0, r.stderr
            scaled.append(time.monotonic())

        def scale_down(t0: float) -> None:
            # Timed from the replay's start, from the replay's own loop (kubectl in a thread,
            # so the streams keep flowing): the patch goes out while the trace plays.
            loop = asyncio.get_running_loop()
            loop.call_later(SCALE_AT_S / SPEED, lambda: loop.run_in_executor(None, patch))

        try:
            results = sb.call(replayer.replay(steady_trace(), progress=False,
                                              on_start=scale_down), timeout=300)
        finally:
            sb.call(replayer.close())
        assert scaled, "the scale-down was never sent"
        wait_for(lambda: all(deployment_counts(sb, pool, r) == (1, 1) for r in START),
                 timeout=60, what="prefill and decode at 1/1")
        wait_for(lambda: all(engine_pods(sb, pool, r) == 1 for r in START), timeout=120,
                 what="the victim pods gone")
        yield Drained(pool, results, scaled[0],
                      {r: deployment_counts(sb, pool, r) for r in START})


def test_the_scale_down_happened_under_load(drained: Drained) -> None:
    assert drained.sizes == {"prefill": (1, 1), "decode": (1, 1)}
    # Streams were open when the victims were chosen, and requests kept coming after.
    open_then = [r for r in drained.results if r.sent_at < drained.scaled_at
                 and (r.finished_at is None or r.finished_at > drained.scaled_at)]
    after = [r for r in drained.results if r.sent_at > drained.scaled_at]
    assert len(open_then) >= 8, len(open_then)
    assert len(after) >= 40, len(after)


def test_no_request_failed_or_was_cut_short(drained: Drained) -> None:
    failed = [(r.index, r.error) for r in drained.results if not r.ok]
    assert not failed, failed
    short = [(r.index, r.output_tokens) for r in drained.results
             if r.output_tokens != r.max_tokens]
    assert not short, short
