"""The autoscaler loop against a cluster (the Kubernetes API emulator, or a real cluster with
--kubeconfig) and a real Prometheus scraping fixture exporters.

Pools (Deployments made here, as the operator would): `busy` (Apply) has a prefill queue of
10 on one replica -> prefill 1 -> 5; `advice` is the same load in Advisory mode; `quiet` has
no traffic and 3 replicas per role; `dark` has no metrics at all.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from autoscaler_exporters import FakeExporter, engine
from poolpilot.autoscaler import queries as q
from poolpilot.autoscaler.cache import WatchedKube
from poolpilot.autoscaler.kube import KubeError, KubeScaler
from poolpilot.autoscaler.loop import Autoscaler, CycleResult, Options
from poolpilot.autoscaler.metrics import AutoscalerMetrics
from poolpilot.autoscaler.observe import PrometheusSource
from poolpilot.autoscaler.shard import Shard
from poolpilot.emulator.server import KubeEmulator
from poolpilot.testkit.cluster import cluster_from_env
from poolpilot.testkit.prometheus import PrometheusProcess, Target

from poolpilot import api, names
from poolpilot import metrics as m
from poolpilot.clock import Clock

pytestmark = [pytest.mark.adapter, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
WINDOW = 4.0
POOLS = f"/apis/{api.GROUP}/{api.VERSION}"


@dataclass
class Pool:
    ns: str
    name: str
    mode: str = "Apply"
    replicas: int = 1
    load: str = "busy"  # busy | idle | none
    up_cooldown: int = 0
    down_window: int | None = None  # the scale-down window; None: the API's default


PLAN = [
    Pool("as-apply", "busy"),
    Pool("as-apply", "quiet", replicas=3, load="idle"),
    Pool("as-apply", "dark", load="none"),
    Pool("as-advice", "advice", mode="Advisory"),
    Pool("as-conflict", "conflict", mode="Advisory"),
    Pool("as-dry", "dry"),
    Pool("as-fail", "flaky", up_cooldown=30),
    Pool("as-watch", "watched", mode="Advisory"),
    Pool("as-external", "keda", mode="External"),
    Pool("as-restart", "whole", replicas=3, load="idle", down_window=60),
]


@dataclass
class Env:
    kubeconfig: Path
    emu: KubeEmulator | None
    prom: PrometheusProcess


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def call(kubeconfig: Path, method: str, path: str, body: Any = None,
               content_type: str = "application/json") -> dict[str, Any]:
    kube = await KubeScaler.connect(str(kubeconfig))
    try:
        return await kube.request(method, path, body=body, content_type=content_type)
    finally:
        await kube.close()


async def create(kubeconfig: Path, path: str, body: dict[str, Any]) -> None:
    try:
        await call(kubeconfig, "POST", path, body)
    except KubeError as exc:
        if exc.status != 409:
            raise


def pool_manifest(p: Pool) -> dict[str, Any]:
    role = {"replicas": p.replicas, "minReplicas": 1, "maxReplicas": 8}
    return {
        "apiVersion": api.API_VERSION, "kind": api.KIND,
        "metadata": {"name": p.name, "namespace": p.ns},
        "spec": {
            "model": {"name": "tiny"}, "prefill": role, "decode": role,
            "autoscaling": {"mode": p.mode, "intervalSeconds": 1,
                            "scaleUp": {"stabilizationWindowSeconds": 0, "maxStep": 4,
                                        "cooldownSeconds": p.up_cooldown},
                            **({"scaleDown": {"stabilizationWindowSeconds": p.down_window,
                                              "maxStep": 1, "cooldownSeconds": 0}}
                               if p.down_window is not None else {})},
        },
    }


def deployment(p: Pool, role: str) -> dict[str, Any]:
    labels = names.labels(p.name, role)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": names.child_name(p.name, role), "namespace": p.ns,
                     "labels": labels},
        "spec": {
            "replicas": p.replicas,
            "selector": {"matchLabels": names.selector(p.name, role)},
            "template": {"metadata": {"labels": labels},
                         "spec": {"containers": [{"name": "engine",
                                                  "image": "registry.k8s.io/pause:3.9"}]}},
        },
    }


async def setup_cluster(kubeconfig: Path, emulated: bool) -> None:
    crd = yaml.safe_load((ROOT / "crds" / "inferencepool.yaml").read_text())
    await create(kubeconfig, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    deadline = time.monotonic() + 30
    while True:  # the CRD's resources are served once it is established
        try:
            await call(kubeconfig, "GET", f"{POOLS}/{api.PLURAL}")
            break
        except KubeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    for ns in sorted({p.ns for p in PLAN}):
        await create(kubeconfig, "/api/v1/namespaces",
                     {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for p in PLAN:
        await create(kubeconfig, f"{POOLS}/namespaces/{p.ns}/{api.PLURAL}", pool_manifest(p))
        # The operator's part of the status, which the autoscaler must keep.
        await call(kubeconfig, "PATCH", f"{POOLS}/namespaces/{p.ns}/{api.PLURAL}/{p.name}/status",
                   {"status": {"conditions": [{"type": "Ready", "status": "True",
                                               "reason": "AllReplicasReady", "message": "ok",
                                               "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                               "prefill": {"replicas": p.replicas, "readyReplicas": p.replicas}}},
                   "application/merge-patch+json")
        for role in ("prefill", "decode"):
            dep_path = f"/apis/apps/v1/namespaces/{p.ns}/deployments"
            await create(kubeconfig, dep_path, deployment(p, role))
            if emulated:  # no kubelet: report the pods ready, as the Deployment controller would
                await call(kubeconfig, "PATCH",
                           f"{dep_path}/{names.child_name(p.name, role)}/status",
                           {"status": {"replicas": p.replicas, "readyReplicas": p.replicas}},
                           "application/merge-patch+json")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    busy_prefill = engine(waiting=10, running=1, prompt_rate=100, text_only=True)
    steady_decode = engine(running=64, kv=0.8, generation_rate=50, text_only=True)
    idle = engine(text_only=True)
    exporters: list[FakeExporter] = [busy_prefill, steady_decode, idle]
    try:
        for e in exporters:
            e.start()
        targets = []
        for p in PLAN:
            if p.load == "none":
                continue
            pre, dec = (busy_prefill, steady_decode) if p.load == "busy" else (idle, idle)
            for role, exp in (("prefill", pre), ("decode", dec)):
                targets.append(Target(f"127.0.0.1:{exp.port}",
                                      {"namespace": p.ns, "pool": p.name, "role": role}))
        with cluster_from_env(tmp_path_factory.mktemp("kube")) as (kubeconfig, emu), \
                PrometheusProcess(scrape_interval=0.5) as prom:
            prom.start(targets)
            run(setup_cluster(kubeconfig, emu is not None))
            wait_for_metrics(prom)
            yield Env(kubeconfig, emu, prom)
    finally:
        for e in exporters:
            e.stop()


def wait_for_metrics(prom: PrometheusProcess, timeout: float = 60) -> None:
    """Until every pool with exporters has values and a full rate window behind them."""
    source = PrometheusSource(prom.url, q.QuerySet(window_seconds=WINDOW))
    deadline = time.monotonic() + timeout
    first: float | None = None
    while time.monotonic() < deadline:
        snap = source.fetch()
        have = {g[:2] for g in snap.values.get(q.PROMPT_RATE, {})}
        if all((p.ns, p.name) in have for p in PLAN if p.load != "none"):
            first = first or time.monotonic()
            if time.monotonic() - first > WINDOW:
                return
        time.sleep(0.25)
    raise AssertionError(f"Prometheus has no data for every pool after {timeout}s")


def get(env: Env, path: str) -> dict[str, Any]:
    return dict(run(call(env.kubeconfig, "GET", path)))


def pool_obj(env: Env, ns: str, name: str) -> dict[str, Any]:
    return get(env, f"{POOLS}/namespaces/{ns}/{api.PLURAL}/{name}")


def replicas(env: Env, ns: str, name: str) -> int:
    dep = get(env, f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")
    return int(dep["spec"]["replicas"])


def events(env: Env, ns: str, name: str) -> list[dict[str, Any]]:
    items = get(env, f"/api/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e["involvedObject"].get("name") == name
            and e["involvedObject"].get("kind") == api.KIND]


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def cli(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "poolpilot.cli", "autoscaler", "--prometheus", env.prom.url,
         "--kubeconfig", str(env.kubeconfig), "--rate-window", f"{WINDOW:g}", "--once", *args],
        capture_output=True, text=True, timeout=120,
    )


def test_apply_scales_the_deployment_and_writes_status_and_events(env: Env) -> None:
    out = cli(env, "--namespace", "as-apply")
    assert out.returncode == 0, out.stderr
    assert "pools=3 decided=3 scaled=1" in out.stdout
    # busy: prefill 1 -> 5 through the scale subresource; decode at its targets stays.
    assert replicas(env, "as-apply", "busy-prefill") == 5
    assert replicas(env, "as-apply", "busy-decode") == 1
    busy = pool_obj(env, "as-apply", "busy")
    st = busy["status"]
    assert (st["prefill"]["desiredReplicas"], st["prefill"]["reason"]) == (5, "QueueAboveTarget")
    assert st["prefill"]["lastScaleTime"] and "prefill 1 -> 5" in st["prefill"]["message"]
    assert (st["decode"]["desiredReplicas"], st["decode"]["reason"]) == (1, "WithinDeadBand")
    assert st["prefill"]["readyReplicas"] == 1  # the operator's fields are kept
    conds = conditions(busy)
    assert conds["Ready"]["reason"] == "AllReplicasReady"  # the operator's condition is kept
    assert conds["MetricsAvailable"]["status"] == "True"
    assert conds["ScalingLimited"]["status"] == "False"
    scaled = events(env, "as-apply", "busy")
    assert [(e["reason"], e["type"]) for e in scaled] == [("ScaledUp", "Normal")]
    assert "QueueAboveTarget" in scaled[0]["message"]
    # One structured log line per decision, with its inputs.
    assert '"pool": "busy", "role": "prefill"' in out.stderr and '"waiting": 10.0' in out.stderr


def test_restart_never_bursts_scale_downs(env: Env) -> None:
    # `quiet` has had no traffic, but this autoscaler process just started: it must not shrink
    # it before its scale-down window has filled.
    assert replicas(env, "as-apply", "quiet-prefill") == 3
    st = pool_obj(env, "as-apply", "quiet")["status"]
    assert (st["prefill"]["desiredReplicas"], st["prefill"]["reason"]) == (
        3, "StabilizationWindowFilling")
    assert events(env, "as-apply", "quiet") == []


def test_no_metrics_holds_and_says_so(env: Env) -> None:
    dark = pool_obj(env, "as-apply", "dark")
    cond = conditions(dark)["MetricsAvailable"]
    assert (cond["status"], cond["reason"]) == ("False", "MetricsUnavailable")
    assert dark["status"]["decode"]["reason"] == "MetricsUnavailable"
    assert replicas(env, "as-apply", "dark-prefill") == 1


async def two_cycles(env: Env, namespace: str, metrics: AutoscalerMetrics | None = None
                     ) -> list[CycleResult]:
    kube = await KubeScaler.connect(str(env.kubeconfig), [namespace])
    now = [time.time()]
    try:
        scaler = Autoscaler(kube, PrometheusSource(env.prom.url, q.QuerySet(WINDOW)),
                            Options(), metrics, clock=Clock(monotonic=lambda: now[0]))
        first = await scaler.cycle()
        now[0] += 5  # the next interval: same load, same decision
        return [first, await scaler.cycle()]
    finally:
        await kube.close()


def test_advisory_writes_status_only_and_a_quiet_cycle_writes_nothing(env: Env) -> None:
    met = AutoscalerMetrics()
    first, second = run(two_cycles(env, "as-advice", met))
    labels = {"namespace": "as-advice", "pool": "advice", "role": "prefill"}
    assert met.registry.get_sample_value(m.AUTOSCALER_DESIRED, labels) == 5
    assert met.registry.get_sample_value(
        m.AUTOSCALER_DECISIONS, {**labels, "direction": "up", "reason": "QueueAboveTarget"}) == 2
    assert met.registry.get_sample_value(m.AUTOSCALER_SIGNAL, {**labels, "signal": "Queue"}) == 10
    assert met.registry.get_sample_value(f"{m.AUTOSCALER_CYCLE}_count") == 2
    assert (first.decided, first.scaled, first.status_writes) == (1, 0, 1)
    assert (second.decided, second.scaled, second.status_writes) == (1, 0, 0)
    st = pool_obj(env, "as-advice", "advice")["status"]
    assert (st["prefill"]["desiredReplicas"], st["prefill"]["reason"]) == (5, "QueueAboveTarget")
    assert "lastScaleTime" not in st["prefill"]
    assert replicas(env, "as-advice", "advice-prefill") == 1
    assert events(env, "as-advice", "advice") == []
    if env.emu is not None:
        assert env.emu.count_writes("/apis/apps/v1/namespaces/as-advice/deployments/"
                                    "advice-prefill/scale") == 0


def test_an_external_pool_is_left_to_its_own_autoscaler(env: Env) -> None:
    """mode External: KEDA or an HPA sizes the roles; the same busy load makes poolpilot's
    autoscaler decide, write and export nothing for the pool."""
    met = AutoscalerMetrics()
    first, second = run(two_cycles(env, "as-external", met))
    assert (first.pools, first.decided, first.scaled, first.status_writes) == (0, 0, 0, 0)
    assert (second.decided, second.scaled, second.status_writes) == (0, 0, 0)
    labels = {"namespace": "as-external", "pool": "keda", "role": "prefill"}
    assert met.registry.get_sample_value(m.AUTOSCALER_DESIRED, labels) is None
    assert replicas(env, "as-external", "keda-prefill") == 1
    prefill = (pool_obj(env, "as-external", "keda").get("status") or {}).get("prefill") or {}
    assert "desiredReplicas" not in prefill and "reason" not in prefill


def test_status_conflict_is_read_again_and_retried(env: Env) -> None:
    if env.emu is None:
        pytest.skip("fault injection needs the emulator")
    env.emu.faults.add(method="PATCH", path=r".*/as-conflict/.*/conflict/status", status=409,
                       times=1)
    try:
        res, _ = run(two_cycles(env, "as-conflict"))
    finally:
        env.emu.faults.clear()
    assert res.errors == [] and res.status_writes == 1
    obj = pool_obj(env, "as-conflict", "conflict")
    assert obj["status"]["prefill"]["desiredReplicas"] == 5
    assert conditions(obj)["Ready"]["status"] == "True"
    statuses = [r.status for r in env.emu.requests
                if r.method == "PATCH" and r.path.endswith("/conflict/status")]
    assert statuses == [200, 409, 200]  # the set-up's write, then the conflict and the retry


def test_a_failed_scale_starts_no_cooldown_and_is_retried(env: Env) -> None:
    # The API refuses the first scale write; the next interval (5 s later, well inside the
    # 30 s scale-up cooldown) must try again, because no scale happened.
    if env.emu is None:
        pytest.skip("fault injection needs the emulator")
    env.emu.faults.add(method="PATCH", path=r".*/as-fail/deployments/flaky-prefill/scale",
                       status=503, times=1)
    try:
        first, second = run(two_cycles(env, "as-fail"))
    finally:
        env.emu.faults.clear()
    assert first.scaled == 0 and any("scale prefill" in e for e in first.errors), first.errors
    assert second.scaled == 1 and second.errors == [], second.errors
    assert replicas(env, "as-fail", "flaky-prefill") == 5
    st = pool_obj(env, "as-fail", "flaky")["status"]
    assert st["prefill"]["lastScaleTime"] and st["prefill"]["reason"] == "QueueAboveTarget"
    got = [(e["reason"], e["type"]) for e in events(env, "as-fail", "flaky")]
    assert sorted(got) == [("ScaleFailed", "Warning"), ("ScaledUp", "Normal")]


async def watched_cycles(env: Env) -> tuple[list[CycleResult], list[Any]]:
    """Three cycles on the watch-fed view; between the 2nd and 3rd someone scales prefill."""
    kube = await WatchedKube.connect(str(env.kubeconfig), ["as-watch"])
    now = [time.time()]
    reads: list[Any] = []
    try:
        scaler = Autoscaler(kube, PrometheusSource(env.prom.url, q.QuerySet(WINDOW)),
                            Options(), clock=Clock(monotonic=lambda: now[0]))
        results = [await scaler.cycle()]
        now[0] += 5
        seen = len(env.emu.requests) if env.emu is not None else 0
        results.append(await scaler.cycle())
        if env.emu is not None:
            reads = [r for r in env.emu.requests[seen:] if r.query.get("watch") != "true"]
        await kube.kube.merge_patch("apps/v1", "Deployment", "as-watch", "watched-prefill",
                                    {"spec": {"replicas": 3}})
        deadline = time.monotonic() + 10
        while getattr((await kube.workloads()).role_state("as-watch", "watched", "prefill"),
                      "replicas", None) != 3:
            assert time.monotonic() < deadline, "the scale never reached the view"
            await asyncio.sleep(0.05)
        now[0] += 5
        results.append(await scaler.cycle())
        return results, reads
    finally:
        await kube.close()


def test_watched_view_decides_without_reading_the_api_each_cycle(env: Env) -> None:
    (first, quiet, after), reads = run(watched_cycles(env))
    assert (first.decided, first.status_writes) == (1, 1)
    assert (quiet.decided, quiet.status_writes) == (1, 0)
    if env.emu is not None:
        assert reads == []  # no LIST, no GET: pools and Deployments came from the watches
    # kubectl scale by someone else: the next cycle sees it through the watch.
    assert after.decisions[("as-watch", "watched")].roles["prefill"].current == 3


def rfc3339(unix: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


async def ready_pod(kube: WatchedKube, ns: str, pool: str, role: str, name: str,
                    since: float) -> None:
    """A pod of the role, Ready since `since` (Unix seconds), as a kubelet would report it."""
    await kube.kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": names.labels(pool, role)},
        "spec": {"containers": [{"name": "engine", "image": "registry.k8s.io/pause:3.9"}]}})
    at = rfc3339(since)
    await kube.kube.merge_patch("v1", "Pod", ns, name, {"status": {
        "phase": "Running",
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": at},
                       {"type": "Ready", "status": "True", "lastTransitionTime": at}]}},
        subresource="status")


async def restarted_path_cycles(env: Env) -> list[CycleResult]:
    """`whole` (idle, 3 replicas a role, pods ready for an hour) on the watch-fed view: a first
    cycle, then the sole prefill pod replaced by one ready 5 s before the second cycle, which
    comes after the autoscaler's own restart window; a third a window later."""
    ns, pool = "as-restart", "whole"
    kube = await WatchedKube.connect(str(env.kubeconfig), [ns])
    start = float(int(time.time()))  # whole seconds, as the conditions' times are
    now = [start]
    try:
        await ready_pod(kube, ns, pool, "prefill", "whole-prefill-a", start - 3600)
        for i in range(3):
            await ready_pod(kube, ns, pool, "decode", f"whole-decode-{i}", start - 3600)
        scaler = Autoscaler(kube, PrometheusSource(env.prom.url, q.QuerySet(WINDOW)),
                            Options(), clock=Clock(monotonic=lambda: now[0]))
        results = [await scaler.cycle()]
        now[0] += 65
        # The prefill engine restarted between two decisions: no cycle saw it unready.
        await kube.kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/whole-prefill-a")
        await ready_pod(kube, ns, pool, "prefill", "whole-prefill-b", now[0] - 5)
        deadline = time.monotonic() + 10
        while getattr((await kube.workloads()).role_state(ns, pool, "prefill"),
                      "ready_since", None) != now[0] - 5 + 1:
            assert time.monotonic() < deadline, "the new pod never reached the watched view"
            await asyncio.sleep(0.05)
        results.append(await scaler.cycle())
        now[0] += 60
        results.append(await scaler.cycle())
        return results
    finally:
        await kube.close()


def test_no_scale_down_until_a_window_after_a_restarted_pod_is_back(env: Env) -> None:
    """The hold for a restart that hid the demand, in the running (watch-fed) autoscaler: it
    reads since when each role has had a ready pod from the pods' Ready conditions."""
    if env.emu is None:
        pytest.skip("forges pods' Ready conditions, which a real cluster's kubelet owns")
    first, back, later = run(restarted_path_cycles(env))
    key = ("as-restart", "whole")
    assert first.decisions[key].roles["decode"].reason == "StabilizationWindowFilling"
    held = back.decisions[key].roles["decode"]
    assert (held.current, held.replicas, held.reason) == (3, 3, "StabilizationWindowFilling")
    assert "whole again for only 4s" in held.message, held.message
    down = later.decisions[key].roles["decode"]
    assert (down.current, down.replicas) == (3, 2), down.message


def test_dry_run_writes_nothing(env: Env) -> None:
    before = env.emu.count_writes() if env.emu is not None else 0
    out = cli(env, "--namespace", "as-dry", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "decided=1" in out.stdout and '"desired": 5' in out.stderr
    assert replicas(env, "as-dry", "dry-prefill") == 1
    st = pool_obj(env, "as-dry", "dry")["status"]
    assert "desiredReplicas" not in st["prefill"]
    if env.emu is not None:
        assert env.emu.count_writes() == before


def test_shards_split_the_pools_and_each_decides_its_own(env: Env) -> None:
    """Three autoscalers with --total-shards 3 over the same namespace: each pool is decided
    by exactly the shard its namespace/name hashes to, and by no other."""
    pools = {p.name for p in PLAN if p.ns == "as-apply"}
    decided: dict[int, set[str]] = {}
    for i in range(3):
        out = cli(env, "--namespace", "as-apply", "--dry-run", "--shard", str(i),
                  "--total-shards", "3")
        assert out.returncode == 0, out.stderr
        lines = [json.loads(line.split(" poolpilot.autoscaler ", 1)[1])
                 for line in out.stderr.splitlines() if '"event": "decision"' in line]
        decided[i] = {d["pool"] for d in lines}
        assert decided[i] == {p for p in pools if Shard(i, 3).owns("as-apply", p)}
        count = re.search(r"pools=(\d+) decided=(\d+)", out.stdout)
        assert count is not None and int(count[1]) == len(decided[i]), out.stdout
    assert set().union(*decided.values()) == pools
    assert sum(len(d) for d in decided.values()) == len(pools)


def test_an_impossible_shard_is_refused_with_the_flags_named(env: Env) -> None:
    out = cli(env, "--shard", "3", "--total-shards", "3")
    assert out.returncode == 2
    assert "--shard 3 --total-shards 3" in out.stderr and "between 0 and" in out.stderr
