"""A pool whose decode role runs 2-node replicas (a LeaderWorkerSet) in the sandbox, on the
engine simulator: the trace is served through the groups' leaders, the autoscaler resizes the
set through its /scale subresource (whole groups), ready groups are counted by leader and
worker, and killing a worker recreates its whole group (RecreateGroupOnPodRestart).
Budget: about a minute and a half on 2 cores."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support import pool_manifest, write_pool
from poolpilot.engine_sim.traces import load_trace
from poolpilot.sandbox.data import BURST_TRACE
from poolpilot.sandbox.loadgen import Replayer, RequestResult
from poolpilot.sandbox.supervisor import AppliedPool, SandboxConfig
from poolpilot.testkit.polling import wait_for
from poolpilot.testkit.sandbox import SandboxThread

from poolpilot import leaderworkerset as lws
from poolpilot import workloads

SPEED = 4.0
SET = "mn-decode-lws"


def _two_nodes(spec: dict[str, Any]) -> None:
    spec["decode"].update({"nodesPerReplica": 2, "maxReplicas": 3})


@pytest.fixture(scope="module")
def sb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxThread]:
    cfg = SandboxConfig(out_dir=tmp_path_factory.mktemp("sandbox-mn"), speed=SPEED,
                        scrape_interval_s=5.0, cold_start_s=10.0, sim_gpu="a100")
    with SandboxThread(cfg) as sandbox:
        yield sandbox


def get(sb: SandboxThread, *args: str) -> Any:
    r = sb.sandbox.kubectl_run("get", *args, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def the_set(sb: SandboxThread, pool: AppliedPool) -> dict[str, Any] | None:
    obj: dict[str, Any] | None = get(sb, "leaderworkersets.leaderworkerset.x-k8s.io", SET,
                                     "-n", pool.namespace)
    return obj


def group_pods(sb: SandboxThread, pool: AppliedPool) -> dict[str, dict[str, Any]]:
    items = (get(sb, "pods", "-n", pool.namespace, "-l", f"{lws.NAME_LABEL}={SET}")
             or {}).get("items", [])
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


def groups_ready(sb: SandboxThread, pool: AppliedPool, n: int) -> bool:
    obj = the_set(sb, pool)
    if obj is None:
        return False
    c = workloads.counts(obj)
    return c.desired == n and c.ready == n and len(decode_endpoints(sb, pool)) == n


def decode_endpoints(sb: SandboxThread, pool: AppliedPool) -> list[str]:
    """Pods behind the decode Service that are ready (what the router discovers)."""
    items = (get(sb, "endpointslices", "-n", pool.namespace, "-l",
                 "kubernetes.io/service-name=mn-decode") or {}).get("items", [])
    return sorted(ep["targetRef"]["name"] for s in items for ep in s.get("endpoints") or []
                  if (ep.get("conditions") or {}).get("ready"))


def replay(sb: SandboxThread, pool: AppliedPool, n: int) -> list[RequestResult]:
    trace = load_trace(BURST_TRACE)[:n]
    replayer = Replayer(lambda: sb.sandbox.router_urls(pool), pool.spec.served_name(), SPEED)
    try:
        return sb.call(replayer.replay(trace, progress=False), timeout=300)
    finally:
        sb.call(replayer.close())


@pytest.fixture(scope="module")
def pool(sb: SandboxThread, tmp_path_factory: pytest.TempPathFactory) -> AppliedPool:
    tmp: Path = tmp_path_factory.mktemp("pools-mn")
    applied = sb.call(sb.sandbox.apply(write_pool(tmp, pool_manifest("mn", _two_nodes))))
    # The sandbox's own wait (what `poolpilot sandbox --pool` does): it reads the decode role's
    # LeaderWorkerSet, whose ready replicas are groups.
    sb.call(sb.sandbox.wait_ready(applied, timeout=150), timeout=180)
    assert groups_ready(sb, applied, 1)
    return applied


def test_the_trace_is_served_through_the_leaders(sb: SandboxThread, pool: AppliedPool) -> None:
    pods = group_pods(sb, pool)
    assert sorted(pods) == [f"{SET}-0", f"{SET}-0-1"]
    assert decode_endpoints(sb, pool) == [f"{SET}-0"], "only the leader serves"
    env = {e["name"]: e.get("value") for e in pods[f"{SET}-0-1"]["spec"]["containers"][0]["env"]}
    assert env["LWS_LEADER_ADDRESS"] == f"{SET}-0.{SET}.{pool.namespace}"
    assert env["LWS_WORKER_INDEX"] == "1" and env["LWS_GROUP_SIZE"] == "2"
    results = replay(sb, pool, 40)
    failed = [r.error for r in results if not r.ok]
    assert not failed, failed[:5]
    assert all(r.output_tokens == r.max_tokens for r in results)


def test_the_autoscaler_scales_whole_groups(sb: SandboxThread, pool: AppliedPool) -> None:
    # A new lower bound: the autoscaler's next decisions bring decode to it (from wherever the
    # trace's load took it), through the set's /scale subresource (the operator leaves the
    # size alone with autoscaling on).
    sb.sandbox.kubectl_run("patch", "inferencepool.poolpilot.dev", pool.name, "-n",
                           pool.namespace, "--type", "merge", "-p",
                           json.dumps({"spec": {"decode": {"minReplicas": 2, "replicas": 2}}}))
    wait_for(lambda: groups_ready(sb, pool, 2), timeout=120,
             what="two ready decode groups behind the decode Service")
    assert sorted(group_pods(sb, pool)) == [f"{SET}-0", f"{SET}-0-1", f"{SET}-1", f"{SET}-1-1"]
    assert decode_endpoints(sb, pool) == [f"{SET}-0", f"{SET}-1"]
    # The autoscaler made the changes (its Events: up under the trace's load, if it was
    # enough, and to the new minimum), not the operator.
    moves = [m for m in sb.call(sb.sandbox.scale_event_messages(pool))
             if m.startswith("decode ")]
    assert moves and re.match(r"decode \d+ -> 2: ", moves[-1]), moves
    # The sandbox's timeline (the report's replica plot and scale events) counts groups by
    # their leaders and saw the set's size change.
    # It counts pods until they are gone, draining ones included (they hold a GPU): the
    # group scaled away may still be draining when the set reads two ready groups.
    timeline = sb.sandbox.controller.timeline  # type: ignore[union-attr]

    def last_decode() -> tuple[int, int, int]:
        x = [x for x in timeline.samples if x.pool == pool.name and x.role == "decode"][-1]
        return x.desired, x.ready, x.pods

    wait_for(lambda: last_decode() == (2, 2, 2), timeout=60,
             what="the timeline's decode (desired, ready, pods) at (2, 2, 2)")
    assert any(c.role == "decode" and c.to_replicas == 2 for c in timeline.scale_changes
               if c.pool == pool.name), timeline.scale_changes
    # The pool's status counts groups too (the operator's next reconcile or drift check).
    wait_for(lambda: (get(sb, "inferencepool.poolpilot.dev", pool.name, "-n", pool.namespace)
                      or {}).get("status", {}).get("decode", {}).get("readyReplicas") == 2,
             timeout=60, what="status.decode.readyReplicas 2")


def test_killing_a_worker_recreates_its_group(sb: SandboxThread, pool: AppliedPool) -> None:
    before = {name: p["metadata"]["uid"] for name, p in group_pods(sb, pool).items()}
    assert sb.sandbox.controller is not None
    rt = sb.sandbox.controller.kubelet.runtimes[(pool.namespace, f"{SET}-1-1")]
    assert rt.child is not None
    rt.child.signal_group(signal.SIGKILL)

    def recreated() -> bool:
        now = {name: p["metadata"]["uid"] for name, p in group_pods(sb, pool).items()}
        return (set(now) == set(before) and now[f"{SET}-1"] != before[f"{SET}-1"]
                and now[f"{SET}-1-1"] != before[f"{SET}-1-1"])

    wait_for(recreated, timeout=90, what="group 1 recreated, leader and worker")
    after = {name: p["metadata"]["uid"] for name, p in group_pods(sb, pool).items()}
    assert after[f"{SET}-0"] == before[f"{SET}-0"] and after[f"{SET}-0-1"] == before[f"{SET}-0-1"]
    assert (pool.namespace, SET, 1) in sb.sandbox.controller.leader_worker_sets.recreated
    wait_for(lambda: groups_ready(sb, pool, 2), timeout=90, what="both groups ready again")
    results = replay(sb, pool, 20)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:5]
