"""Two `poolpilot autoscaler --leader-elect` processes against a cluster (the emulator, or a
real one with --kubeconfig) and a real Prometheus: one acts, the other waits; killing the
leader hands over within the lease, and the scale the old leader made is not made again.

The pool `busy` has a prefill queue of 10 on one replica: the first leader scales prefill
1 -> 5. The new pods never become ready here (nothing runs them), so the new leader must see
them as starting and hold, whatever its fresh history.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from autoscaler_exporters import FakeExporter, engine
from poolpilot.autoscaler import queries as q
from poolpilot.autoscaler.observe import PrometheusSource
from poolpilot.autoscaler.shard import Shard
from poolpilot.emulator.server import KubeEmulator
from poolpilot.kubeclient import KubeClient
from poolpilot.testkit.cluster import cluster_from_env
from poolpilot.testkit.polling import wait_for
from poolpilot.testkit.prometheus import PrometheusProcess
from rbac_calls import called, chart_rules, compare

from poolpilot import api, names
from poolpilot import metrics as m

pytestmark = [pytest.mark.adapter, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
NS, POOL = "as-ha", "busy"
LEASE, RENEW, RETRY = 4, 3.0, 1.0
WINDOW = 4.0
LEASE_NAME = "poolpilot-autoscaler"
MULTI_NODE = {("leaderworkerset.x-k8s.io", "leaderworkersets", "list"),
              ("leaderworkerset.x-k8s.io", "leaderworkersets", "watch"),
              ("leaderworkerset.x-k8s.io", "leaderworkersets/scale", "patch")}


@dataclass
class Env:
    kubeconfig: Path
    emu: KubeEmulator | None
    prom: PrometheusProcess


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _with_kube(kubeconfig: Path, fn: Any) -> Any:
    kube = await KubeClient.connect(kubeconfig)
    try:
        return await fn(kube)
    finally:
        await kube.close()


def kube(env: Env, fn: Any) -> Any:
    return run(_with_kube(env.kubeconfig, fn))


async def _setup(kube: KubeClient, emulated: bool) -> None:
    crd = yaml.safe_load((ROOT / "crds" / "inferencepool.yaml").read_text())
    await kube.apply(crd, manager="test")
    for _ in range(300):  # served once established
        if await kube.serves(api.API_VERSION, api.KIND):
            break
        await asyncio.sleep(0.1)
    await kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
                     manager="test")
    role = {"replicas": 1, "minReplicas": 1, "maxReplicas": 8}
    await kube.apply({
        "apiVersion": api.API_VERSION, "kind": api.KIND,
        "metadata": {"name": POOL, "namespace": NS},
        "spec": {"model": {"name": "tiny"}, "prefill": role, "decode": role,
                 "autoscaling": {"mode": "Apply", "intervalSeconds": 1,
                                 "scaleUp": {"stabilizationWindowSeconds": 0, "maxStep": 4,
                                             "cooldownSeconds": 0}}},
    }, manager="test")
    for r in ("prefill", "decode"):
        labels = names.labels(POOL, r)
        name = names.child_name(POOL, r)
        await kube.apply({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": names.selector(POOL, r)},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                         {"name": "engine", "image": "registry.k8s.io/pause:3.9"}]}}},
        }, manager="test")
        if emulated:  # no kubelet: one pod ready, as the Deployment controller would say
            await kube.merge_patch("apps/v1", "Deployment", NS, name,
                                   {"status": {"replicas": 1, "readyReplicas": 1}},
                                   subresource="status")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    busy = engine(waiting=10, running=1, prompt_rate=100, text_only=True)
    steady = engine(running=64, kv=0.8, generation_rate=50, text_only=True)
    exporters: list[FakeExporter] = [busy, steady]
    try:
        for e in exporters:
            e.start()
        with cluster_from_env(tmp_path_factory.mktemp("kube")) as (kubeconfig, emu), \
                PrometheusProcess(scrape_interval=0.5) as prom:
            prom.start([busy.target(NS, POOL, "prefill"), steady.target(NS, POOL, "decode")])
            e = Env(kubeconfig, emu, prom)
            kube(e, lambda k: _setup(k, emu is not None))
            source = PrometheusSource(prom.url, q.QuerySet(window_seconds=WINDOW))
            first = wait_for(lambda: (NS, POOL, "prefill") in source.fetch().values.get(
                q.PROMPT_RATE, {}) and time.monotonic(), timeout=60, what="Prometheus data")
            wait_for(lambda: time.monotonic() - first > WINDOW, what="a full rate window")
            yield e
    finally:
        for exp in exporters:
            exp.stop()


class Replica:
    """One `poolpilot autoscaler --leader-elect` process."""

    def __init__(self, env: Env, identity: str, log: Path, *extra: str) -> None:
        self.identity = identity
        self.log_path = log
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "poolpilot.cli", "autoscaler", "--prometheus", env.prom.url,
             "--kubeconfig", str(env.kubeconfig), "--namespace", NS, "--interval", "1",
             "--rate-window", f"{WINDOW:g}", "--metrics-port", "0",
             "--metrics-host", "127.0.0.1", "--leader-elect", "--leader-election-namespace",
             NS, "--leader-election-identity", identity, "--lease-duration", f"{LEASE:g}",
             "--renew-deadline", f"{RENEW:g}", "--retry-period", f"{RETRY:g}", *extra],
            stdout=subprocess.PIPE, stderr=self._log, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = re.search(r"(http://\S+/metrics)", line)
        assert found, f"{identity}: no metrics URL in {line!r}; log: {log.read_text()[-2000:]}"
        self.metrics_url = found.group(1)

    def sample(self, name: str) -> float:
        text = httpx.get(self.metrics_url, timeout=5).text
        for row in text.splitlines():
            if row.startswith((name + " ", name + "{")):
                return float(row.split()[1])
        return 0.0

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def lease(env: Env, name: str = LEASE_NAME) -> dict[str, Any]:
    obj = kube(env, lambda k: k.get("coordination.k8s.io/v1", "Lease", NS, name))
    return dict((obj or {}).get("spec") or {})


def prefill_replicas(env: Env) -> int:
    dep = kube(env, lambda k: k.get("apps/v1", "Deployment", NS, f"{POOL}-prefill"))
    return int(dep["spec"]["replicas"])


def scale_writes(emu: KubeEmulator) -> list[str]:
    """User agents of every write to the prefill Deployment's size."""
    path = f"/apis/apps/v1/namespaces/{NS}/deployments/{POOL}-prefill/scale"
    return [r.user_agent for r in list(emu.requests) if r.is_write and r.path == path]


def writes_by(emu: KubeEmulator, identity: str) -> int:
    agent = f"poolpilot-autoscaler/{identity}"
    return sum(1 for r in list(emu.requests) if r.is_write and r.user_agent == agent
               and "/leases/" not in r.path)


def _time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def test_killed_leader_hands_over_within_the_lease_without_scaling_twice(
        env: Env, tmp_path: Path) -> None:
    if env.emu is not None:  # a status write that conflicts: read again (the `get` path)
        env.emu.faults.add("PATCH", rf"/inferencepools/{POOL}/status$", 409, times=1)
    replicas = {i: Replica(env, i, tmp_path / f"{i}.log") for i in ("as-a", "as-b")}
    try:
        holder = wait_for(lambda: lease(env).get("holderIdentity"), what="a leader")
        leader = replicas[holder]
        follower = next(r for r in replicas.values() if r is not leader)
        wait_for(lambda: prefill_replicas(env) == 5, what="the leader's scale-up 1 -> 5")
        wait_for(lambda: leader.sample(m.AUTOSCALER_LEADER) == 1, what="leader gauge")
        assert follower.sample(m.AUTOSCALER_LEADER) == 0
        assert follower.sample(f"{m.AUTOSCALER_CYCLE}_count") == 0  # it never acted
        if env.emu is not None:
            assert writes_by(env.emu, follower.identity) == 0
            assert scale_writes(env.emu) == [f"poolpilot-autoscaler/{leader.identity}"]

        last_renew = _time(lease(env)["renewTime"])
        leader.stop(signal.SIGKILL)  # no release: the follower must wait out the lease
        new = wait_for(lambda: (s := lease(env)).get("holderIdentity") == follower.identity
                       and s, timeout=LEASE * 4, what="the follower to take the lease")
        # Never before the old lease ran out; within it plus the follower's polling.
        waited = _time(new["acquireTime"]) - last_renew
        assert LEASE - RETRY <= waited <= LEASE + 3 * RETRY + 3, waited

        cycles = follower.sample(f"{m.AUTOSCALER_CYCLE}_count")
        wait_for(lambda: follower.sample(f"{m.AUTOSCALER_CYCLE}_count") >= cycles + 3,
                 what="three cycles of the new leader")
        assert follower.sample(m.AUTOSCALER_LEADER) == 1
        assert prefill_replicas(env) == 5  # the 4 starting pods are counted: no second scale
        if env.emu is not None:
            assert scale_writes(env.emu) == [f"poolpilot-autoscaler/{leader.identity}"]
            assert writes_by(env.emu, follower.identity) > 0  # it writes status now

        follower.stop()  # a clean stop releases the lease for an immediate hand-over
        assert follower.proc.returncode == 0, follower.log_path.read_text()[-2000:]
        assert lease(env).get("holderIdentity") in (None, "")
        if env.emu is not None:  # least privilege: the chart grants exactly what they called
            calls = called(list(env.emu.requests), ("poolpilot-autoscaler/",))
            # (no scale-down here: the pods patch before one is checked in
            # test_autoscaler_victims_cluster.py)
            # (nor a multi-node role: its LeaderWorkerSet is listed, watched and scaled in
            # e2e/test_e2e_multinode.py; here the kind is not served)
            refused, unused = compare(calls, chart_rules("-autoscaler", "-autoscaler-leader"),
                                      {("", "pods", "patch")} | MULTI_NODE)
            assert refused == set(), f"calls the chart's autoscaler rules refuse: {refused}"
            assert unused == set(), f"autoscaler rules no call needs: {unused}"
    finally:
        for r in replicas.values():
            r.stop()


def test_leader_election_flags_are_checked() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "poolpilot.cli", "autoscaler", "--prometheus", "http://x",
         "--leader-elect", "--lease-duration", "5", "--renew-deadline", "6"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--lease-duration > --renew-deadline" in out.stderr


def test_a_missing_kubeconfig_is_named(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "poolpilot.cli", "autoscaler", "--prometheus", "http://x",
         "--kubeconfig", str(tmp_path / "none"), "--once"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert f"--kubeconfig {tmp_path / 'none'}: no such file" in out.stderr



def test_each_shard_elects_its_own_leader_and_only_the_owner_acts(
        env: Env, tmp_path: Path) -> None:
    """Two shards of one: each takes a Lease of its own (NAME-I-of-2) at once, labels its
    leader gauge with its shard, and only the shard that owns the pool writes to it."""
    owner = next(i for i in range(2) if Shard(i, 2).owns(NS, POOL))
    shards = {i: Replica(env, f"as-shard-{i}", tmp_path / f"shard-{i}.log",
                         "--shard", str(i), "--total-shards", "2") for i in range(2)}
    try:
        for i, r in shards.items():
            wait_for(lambda r=r, i=i: lease(env, f"{LEASE_NAME}-{i}-of-2").get(
                "holderIdentity") == r.identity, what=f"shard {i}'s leader")
            wait_for(lambda r=r: r.sample(f"{m.AUTOSCALER_CYCLE}_count") >= 3,
                     what=f"three cycles of shard {i}")
            page = httpx.get(r.metrics_url, timeout=5).text
            assert f'{m.AUTOSCALER_LEADER}{{shard="{i}"}} 1.0' in page
        assert lease(env).get("holderIdentity") in (None, "")  # the unsharded Lease: unused
        # The owner decides the pool (its desired replicas exported), the other shard never.
        pages = {i: httpx.get(r.metrics_url, timeout=5).text for i, r in shards.items()}
        desired = f'{m.AUTOSCALER_DESIRED}{{namespace="{NS}",pool="{POOL}",role="prefill"}}'
        assert desired in pages[owner] and desired not in pages[1 - owner]
        if env.emu is not None:  # nothing but its Lease
            agent = f"poolpilot-autoscaler/as-shard-{1 - owner}"
            assert [r.path for r in list(env.emu.requests) if r.is_write
                    and r.user_agent == agent and "/leases" not in r.path] == []
    finally:
        for r in shards.values():
            r.stop()
