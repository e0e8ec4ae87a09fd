"""The chaos run (`poolpilot sandbox --chaos SEED`) end to end: while the default burst replays
(at a third of its rate, so it lasts ~280 simulated seconds), the operator, the autoscaler,
Prometheus, one prefill pod, one decode pod and the router pod are killed and restarted at
times drawn from the seed. The three properties are asserted on report.json, as the CLI
writes it, and checked again on the cluster's state through kubectl: Deployments and the
pool's status, the killed pods' restart counts, the autoscaler's Events. Budget: about two
minutes on a quiet machine (speed 8).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from e2e_support import pool_manifest, write_pool
from poolpilot.sandbox import chaos as C
from poolpilot.sandbox import chaos_run
from poolpilot.sandbox.data import BURST_TRACE
from poolpilot.sandbox.loadgen import Replayer, RequestResult
from poolpilot.sandbox.main import prepare_trace, write_outputs
from poolpilot.sandbox.supervisor import AppliedPool, SandboxConfig
from poolpilot.testkit.polling import wait_for
from poolpilot.testkit.sandbox import SandboxThread

from poolpilot import workloads

SEED = 4  # engines killed while the burst plays, Prometheus once it is over
SPEED = 8.0
RATE_SCALE = 0.3


@dataclass
class Run:
    sb: SandboxThread
    pool: AppliedPool
    trace_len: int
    results: list[RequestResult]
    report: dict[str, Any]
    wall0: float  # time.time() at the replay's start
    first_pids: dict[str, int]  # operator, autoscaler before the faults

    @property
    def chaos(self) -> dict[str, Any]:
        chaos: dict[str, Any] = self.report["chaos"]
        return chaos

    def fault(self, kind: str) -> dict[str, Any]:
        return next(f for f in self.chaos["faults"] if f["kind"] == kind)

    def wall(self, t_sim: float) -> float:
        return self.wall0 + t_sim / SPEED

    def kubectl_json(self, *args: str) -> Any:
        r = self.sb.sandbox.kubectl_run("get", *args, "-o", "json", "-n", self.pool.namespace)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    yield from chaos_run_of(tmp_path_factory, None)


# The engines stay alive but stop answering (SIGSTOP) or slow down 10x, one at a time.
ALIVE_FAULTS = "hung-prefill,hung-decode,slow-decode"


@pytest.fixture(scope="module")
def alive_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    yield from chaos_run_of(tmp_path_factory, ALIVE_FAULTS)


def chaos_run_of(tmp_path_factory: pytest.TempPathFactory, faults: str | None) -> Iterator[Run]:
    out = tmp_path_factory.mktemp("chaos")
    cfg = SandboxConfig(out_dir=out, speed=SPEED, scrape_interval_s=5.0, cold_start_s=20.0,
                        sim_gpu="a100")
    # The options `poolpilot sandbox --chaos 4 --rate-scale 0.3 --speed 8 [--chaos-faults
    # FAULTS]` parse into.
    args = argparse.Namespace(trace=BURST_TRACE, trace_format=None, rate_scale=RATE_SCALE,
                              start=0.0, duration=None, engine="sim", chaos=SEED,
                              chaos_faults=faults)
    with SandboxThread(cfg) as sb:
        s = sb.sandbox
        pool = sb.call(s.apply(write_pool(out, pool_manifest("chaos"))))
        sb.call(s.wait_ready(pool, timeout=120), timeout=150)
        sb.call(s.warm_up(pool))
        trace = prepare_trace(args, 8192)
        assert s.operator is not None and s.autoscaler is not None
        pids = {"operator": s.operator.pid, "autoscaler": s.autoscaler.pid}
        chaos = chaos_run.prepare(s, pool, args, trace[-1].arrival_s)
        assert chaos is not None
        replayer = Replayer(lambda: s.router_urls(pool), pool.spec.served_name(), SPEED)
        t0, wall0 = time.monotonic(), time.time()
        try:
            results = sb.call(chaos.replay(replayer, trace, t0, progress=False), timeout=900)
        finally:
            sb.call(replayer.close())
        out_json = sb.call(write_outputs(s, pool, results, t0, time.monotonic(), wall0,
                                         time.time(), args))
        chaos_run.conclude(chaos, out_json, results, len(trace))
        report = json.loads((out / "report.json").read_text())  # as the CLI leaves it
        yield Run(sb, pool, len(trace), results, report, wall0, pids)


def test_every_fault_is_injected_and_the_pool_returns_to_its_desired_size(run: Run) -> None:
    chaos = run.chaos
    kinds = sorted(f["kind"] for f in chaos["faults"] if f["injected_s"] is not None)
    assert kinds == sorted(C.default_kinds(["prefill", "decode"])), chaos["faults"]
    for f in chaos["faults"]:
        assert f["recovery_s"] is not None and f["recovery_s"] <= f["bound_s"], f
    assert chaos["verdicts"]["back_to_desired_size"]["ok"], chaos["verdicts"]
    assert (Path(run.sb.sandbox.cfg.out_dir) / "chaos.png").stat().st_size > 0

    # The cluster agrees once the autoscaler's last orders are in: every Deployment has its
    # replicas ready, and each engine role's replicas are what the autoscaler wants.
    def settled() -> dict[str, Any] | None:
        deployments = {d["metadata"]["labels"]["poolpilot.dev/role"]: workloads.counts(d)
                       for d in run.kubectl_json("deployments", "-l",
                                                 f"poolpilot.dev/pool={run.pool.name}")["items"]}
        status = run.kubectl_json("inferencepool.poolpilot.dev", run.pool.name)["status"]
        assert set(deployments) == {"prefill", "decode", "router"}
        ok = all(c.ready == c.desired and (role == "router"
                                           or status[role]["desiredReplicas"] == c.desired)
                 for role, c in deployments.items())
        return None if not ok else {"deployments": deployments, "status": status}

    bound = max(f["bound_s"] for f in chaos["faults"]) / SPEED
    wait_for(settled, timeout=bound, what="every Deployment ready at the autoscaler's size")
    # A killed pod that is still there shows its restart, as `kubectl get pods` does.
    pods = {p["metadata"]["name"]: p for p in run.kubectl_json("pods")["items"]}
    for kind in ("prefill", "decode", "router"):
        name = run.fault(kind)["target"]
        if name in pods:
            restarts = pods[name]["status"]["containerStatuses"][0]["restartCount"]
            assert restarts >= 1, (name, pods[name]["status"])
    # The operator and the autoscaler serving now are the restarted processes.
    s = run.sb.sandbox
    assert s.operator is not None and s.operator.alive()
    assert s.autoscaler is not None and s.autoscaler.alive()
    assert s.operator.pid != run.first_pids["operator"]
    assert s.autoscaler.pid != run.first_pids["autoscaler"]


def test_no_request_is_lost_silently(run: Run) -> None:
    """Every request of the trace has an outcome at its client: the full answer, or an error
    it saw. None hangs, none is a success with fewer tokens than forced."""
    req = run.chaos["requests"]
    assert req["trace"] == run.trace_len == len(run.results) == req["sent"]
    assert req["answered"] + req["error"] == req["sent"], req
    assert req["hung"] == 0 and req["truncated"] == 0, req
    for r in run.results:
        assert r.finished_at is not None, r
        if r.ok:
            assert r.output_tokens == r.max_tokens, r
        else:
            assert r.error, r
    # Errors come from the faults, not from anything else going wrong.
    spans = [(f["kind"], f["injected_s"], f["recovered_s"], f["bound_s"])
             for f in run.chaos["faults"]]
    assert req["errors_outside_faults"] == 0, (run.chaos["outside_faults"], spans)
    assert run.report["requests"]["failed"] == req["error"]
    assert run.chaos["verdicts"]["no_request_lost_silently"]["ok"]


def _time(e: dict[str, Any]) -> float:
    stamp = e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp")
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()


def test_no_scale_down_while_metrics_are_missing_or_the_demand_is_hidden(run: Run) -> None:
    """While Prometheus is down the autoscaler holds with MetricsAvailable=False; while the
    only router pod (or an engine role's only pod) is down, requests fail before they reach
    the engines, and their idleness is no demand. Neither is followed by a scale-down before a
    whole scale-down window of the pool in service."""
    f = run.fault("prometheus")
    assert f["metrics_unavailable_seen"], f
    assert f["serving_s"] is not None, f  # MetricsAvailable=True again
    assert run.fault("router")["hides_demand"], "the pool's only router pod was killed"
    assert run.chaos["verdicts"]["no_scale_down_from_missing_metrics"]["ok"], \
        run.chaos["verdicts"]
    # The autoscaler's own Events say the same (seconds precision: one second of slack).
    window = run.pool.spec.autoscaling.scale_down.stabilization_window_seconds
    interval = run.pool.spec.autoscaling.interval_seconds
    events = [e for e in run.kubectl_json("events")["items"]
              if e["involvedObject"].get("name") == run.pool.name]
    assert any(e.get("reason") == "ScaledUp" for e in events), "the burst scaled nothing up"
    for f in run.chaos["faults"]:
        if not f["hides_demand"]:
            continue
        start = run.wall(f["injected_s"] + chaos_run.DECISION_LAG_REAL_S * SPEED) + 1
        end = run.wall(f["serving_s"] + window - interval) - 1
        downs = [e["message"] for e in events
                 if e.get("reason") == "ScaledDown" and start <= _time(e) <= end]
        assert not downs, (f["kind"], downs)


def test_hung_and_slow_engines_cost_a_deadline_and_lose_nothing(alive_run: Run) -> None:
    """A stopped (SIGSTOP) prefill engine, then a stopped decode engine, then a decode engine
    at 10x its step time: every request waiting on a hung engine hears from the pool within
    the TTFT target + one router deadline (not the 120 s idle timeout), none is lost
    silently, and the pool is back at its size after each."""
    chaos = alive_run.chaos
    kinds = sorted(f["kind"] for f in chaos["faults"] if f["injected_s"] is not None)
    assert kinds == sorted(ALIVE_FAULTS.split(",")), chaos["faults"]
    verdicts = chaos["verdicts"]
    assert verdicts["hung_engine_costs_a_deadline"]["ok"], \
        (verdicts["hung_engine_costs_a_deadline"]["detail"], json.dumps(chaos["hung_waits"]))
    assert verdicts["no_request_lost_silently"]["ok"], chaos["requests"]
    assert verdicts["back_to_desired_size"]["ok"], verdicts
    # a slow engine is measured, not missing: scaling up for it is no fault of the autoscaler
    assert verdicts["no_scale_down_from_missing_metrics"]["ok"], verdicts
    for w in chaos["hung_waits"]:
        assert w["requests_waiting"] > 0, w  # the stop caught requests to judge
        assert w["longest_wait_s"] is not None and w["longest_wait_s"] <= w["bound_s"], w
    # Each stopped engine was continued: its process is alive and ready again.
    ctl = alive_run.sb.sandbox.controller
    assert ctl is not None
    runtimes = ctl.kubelet.runtimes
    for f in chaos["faults"]:
        rt = runtimes.get((alive_run.pool.namespace, f["target"]))
        if rt is not None:
            assert rt.child is not None and rt.child.alive(), f
