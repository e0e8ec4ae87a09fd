"""The sandbox's control plane for workloads: what kube-controller-manager and the kubelet do in a
real cluster, for the objects poolpilot makes.

- Deployments -> Pods (the ReplicaSet logic in pods.plan_replicas), Deployment status.
- Pods -> local processes, each on its own loopback address 127.0.0.N and the container port,
  running the pod's command (pods.local_command); readiness from the pod's readinessProbe,
  gated by a cold start (weight loading) that is divided by --speed; crashed processes are
  restarted with back-off and reported as CrashLoopBackOff.
- Deleting a pod is graceful: its endpoint turns not-ready, the preStop sleep runs, then
  SIGTERM, then SIGKILL after terminationGracePeriodSeconds (all divided by --speed); a
  finalizer keeps the Pod object until its process is gone.
- EndpointSlices for every Service with a selector; Prometheus file_sd targets from the pods'
  prometheus.io annotations; a timeline of desired and ready replicas per role for the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from poolpilot import names

from . import pods as P
from .kubeapi import ApiError, KubeClient
from .processes import Child, ProcessTable

log = logging.getLogger("poolpilot.sandbox.controller")

Obj = dict[str, Any]


def _bindable(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError:
            return False
    return True


class AddressPool:
    """Loopback addresses for pods: 127.B.0.2, 127.B.0.3, ... (the whole 127/8 is local).

    Each sandbox draws its own second octet B at random, so two sandboxes on one machine (two
    test runs, say) do not hand out the same address: a pod's port is only bound once its
    process starts, so a bind check alone cannot see the other sandbox's pods coming.
    Addresses are not reused until the range wraps, so a client never reaches a new pod at an
    old pod's address; one whose port is taken (another program) is skipped.
    """

    def __init__(self, second_octet: int | None = None) -> None:
        self.octet = second_octet if second_octet is not None else random.randint(1, 254)
        self._next = 2
        self.in_use: set[str] = set()

    def allocate(self, ports: list[int]) -> str:
        for _ in range(256 * 256):
            n = self._next
            self._next = n + 1 if n + 1 < 256 * 256 else 2
            if n % 256 in (0, 1, 255):
                continue
            ip = f"127.{self.octet}.{n // 256}.{n % 256}"
            if ip in self.in_use:
                continue
            if all(_bindable(ip, p) for p in ports):
                self.in_use.add(ip)
                return ip
        raise RuntimeError("no free loopback address for a pod")

    def release(self, ip: str) -> None:
        self.in_use.discard(ip)


@dataclass
class PodRuntime:
    namespace: str
    name: str
    ip: str
    container: Obj
    workdir: Path
    is_engine: bool
    child: Child | None = None
    started_at: float = 0.0
    probe_ok: bool = False
    ready: bool = False
    restarts: int = 0
    restart_at: float | None = None
    last_exit: int | None = None
    terminating: bool = False
    gone: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    scratch: Path | None = None  # short-path scratch folder (vLLM's IPC sockets)

    def cleanup(self) -> None:
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


@dataclass
class RoleSample:
    t: float  # time.monotonic()
    namespace: str
    pool: str
    role: str
    desired: int
    ready: int
    pods: int  # pods that exist, starting and draining ones included (they hold a GPU)


@dataclass
class ScaleChange:
    t: float
    namespace: str
    pool: str
    role: str
    from_replicas: int
    to_replicas: int
    reason: str | None = None
    message: str | None = None


@dataclass
class ControllerConfig:
    workdir: Path
    kubeconfig: Path
    mapping: P.EngineMapping
    speed: float = 1.0
    cold_start_s: float = 30.0  # simulated seconds of weight loading for simulator engines
    period_s: float = 0.25  # real seconds between reconciles
    extra_env: dict[str, str] = field(default_factory=dict)


class Controller:
    def __init__(self, kube: KubeClient, procs: ProcessTable, cfg: ControllerConfig,
                 on_targets: Callable[[list[P.ScrapeTarget]], None] | None = None) -> None:
        self.kube = kube
        self.procs = procs
        self.cfg = cfg
        self.on_targets = on_targets
        self.addresses = AddressPool()
        self.runtimes: dict[tuple[str, str], PodRuntime] = {}
        self.samples: list[RoleSample] = []
        self.scale_changes: list[ScaleChange] = []
        self.errors: list[str] = []
        self._replicas_seen: dict[tuple[str, str], int] = {}
        self._last_sample: dict[tuple[str, str, str], tuple[int, int, int]] = {}
        self._written: dict[str, str] = {}
        self._targets_written = ""
        self._http = httpx.AsyncClient(timeout=2.0)
        self._stopping = False

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        while not self._stopping:
            try:
                await self.reconcile_once()
            except (ApiError, httpx.HTTPError) as exc:
                # The API may be briefly unavailable (e.g. a test injects faults): retry.
                log.warning("reconcile failed: %s", exc)
                self.errors.append(str(exc))
            await asyncio.sleep(self.cfg.period_s)

    async def shutdown(self) -> None:
        """Stop every pod process (fast: the sandbox is going away)."""
        self._stopping = True
        for rt in list(self.runtimes.values()):
            for t in rt.tasks:
                t.cancel()
            if rt.child is not None:
                await self.procs.stop(rt.child, grace=3.0)
            rt.cleanup()
        self.runtimes.clear()
        await self._http.aclose()

    # -- one pass -----------------------------------------------------------------------------

    async def reconcile_once(self) -> None:
        deployments = await self.kube.list("Deployment")
        pods = await self.kube.list("Pod")
        now = time.monotonic()
        ready = {p["metadata"]["name"]: self._is_ready(p) for p in pods}
        await self._replicasets(deployments, pods, ready)
        await self._kubelet(pods)
        pods = await self.kube.list("Pod")
        ready = {p["metadata"]["name"]: self._is_ready(p) for p in pods}
        await self._deployment_status(deployments, pods, ready)
        await self._endpoints(pods)
        self._scrape_targets(pods)
        await self._record(deployments, pods, ready, now)

    def _is_ready(self, pod: Obj) -> bool:
        rt = self.runtimes.get((pod["metadata"]["namespace"], pod["metadata"]["name"]))
        return bool(rt and rt.ready and not rt.terminating)

    async def _replicasets(self, deployments: list[Obj], pods: list[Obj],
                           ready: Mapping[str, bool]) -> None:
        for d in deployments:
            if d["metadata"].get("deletionTimestamp"):
                continue
            mine = [p for p in pods if P.owned_by(p, d)]
            plan = P.plan_replicas(d, mine, ready)
            for _ in range(plan.create):
                await self.kube.create(P.build_pod(d))
            for name in plan.delete:
                await self.kube.delete("Pod", d["metadata"]["namespace"], name)

    # -- kubelet ------------------------------------------------------------------------------

    async def _kubelet(self, pods: list[Obj]) -> None:
        seen = set()
        for pod in pods:
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            seen.add(key)
            rt = self.runtimes.get(key)
            if pod["metadata"].get("deletionTimestamp"):
                if rt is None:
                    await self._remove_finalizer(pod)
                elif not rt.terminating:
                    self._terminate(rt, pod)
                continue
            if rt is None:
                await self._start_pod(pod)
            else:
                await self._supervise(rt, pod)
        # Pods deleted outright (no finalizer honoured): stop their processes.
        for key, rt in list(self.runtimes.items()):
            if key not in seen and not rt.terminating:
                rt.gone = True
                self._terminate(rt, None)

    async def _start_pod(self, pod: Obj) -> None:
        meta = pod["metadata"]
        container = pod["spec"]["containers"][0]
        ports = [int(p["containerPort"]) for p in container.get("ports") or []] or [8000]
        workdir = self.cfg.workdir / "pods" / meta["namespace"] / meta["name"]
        try:
            argv = (container.get("command") or []) + (container.get("args") or [])
            is_engine = P._subcommand(argv)[0] == "launch"
            ip = self.addresses.allocate(ports)
        except (P.PodSpecError, RuntimeError) as exc:
            await self._write_status(pod, self._waiting_status(pod, "CreateContainerError",
                                                               str(exc)))
            return
        rt = PodRuntime(meta["namespace"], meta["name"], ip, container, workdir, is_engine)
        self.runtimes[(rt.namespace, rt.name)] = rt
        await self._spawn(rt, pod)
        rt.tasks.append(asyncio.create_task(self._probe_loop(rt)))

    async def _spawn(self, rt: PodRuntime, pod: Obj) -> None:
        try:
            argv, env = await self._command(rt, pod)
        except (P.PodSpecError, ApiError) as exc:
            rt.last_exit = -1
            await self._write_status(pod, self._waiting_status(pod, "CreateContainerError",
                                                               str(exc)))
            return
        rt.child = self.procs.start(f"pod-{rt.namespace}-{rt.name}", argv, env=env,
                                    cwd=rt.workdir)
        rt.started_at = time.monotonic()
        rt.probe_ok = rt.ready = False
        log.info("pod %s/%s on %s: %s", rt.namespace, rt.name, rt.ip, " ".join(argv))
        await self._write_status(pod, self._running_status(pod, rt))

    async def _command(self, rt: PodRuntime, pod: Obj) -> tuple[list[str], dict[str, str]]:
        mounts = await self._volumes(rt, pod)
        argv = (rt.container.get("command") or []) + (rt.container.get("args") or [])
        local = P.pod_command(argv, rt.ip, self.cfg.mapping, mounts)
        secrets = await self._secret_values(pod)
        cenv = P.resolve_env(pod, rt.container, rt.ip, secrets)
        cenv = dict(zip(cenv, P.remap_paths(cenv.values(), mounts), strict=True))
        tmp = rt.workdir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            **self.cfg.extra_env,
            **cenv,
            "KUBECONFIG": str(self.cfg.kubeconfig),
            "POD_IP": rt.ip,
            "POD_NAME": rt.name,
            "POD_NAMESPACE": rt.namespace,
            "TMPDIR": str(tmp),
            "PYTHONUNBUFFERED": "1",
        }
        if self.cfg.mapping.engine == "vllm-cpu" and rt.is_engine:
            role = P._option(argv, "--role") or "aggregated"
            # vLLM's ZeroMQ IPC sockets need a short path (sun_path holds 107 bytes).
            if rt.scratch is None:
                rt.scratch = Path(tempfile.mkdtemp(prefix="pp-"))
            env.update({
                "HF_HUB_OFFLINE": "1",
                "VLLM_CPU_KVCACHE_SPACE": "1",
                "TMPDIR": str(rt.scratch),
                "VLLM_RPC_BASE_PATH": str(rt.scratch),
                "VLLM_CACHE_ROOT": str(rt.workdir / "vllm-cache"),
                "VLLM_CPU_OMP_THREADS_BIND": self.cfg.mapping.cpu_threads.get(role, "all"),
            })
        return local, env

    async def _volumes(self, rt: PodRuntime, pod: Obj) -> dict[str, str]:
        """Make the pod's volumes as local folders; return mountPath -> folder."""
        folders: dict[str, Path] = {}
        for vol in pod["spec"].get("volumes") or []:
            path = rt.workdir / "volumes" / vol["name"]
            path.mkdir(parents=True, exist_ok=True)
            folders[vol["name"]] = path
            source = vol.get("configMap") or vol.get("secret")
            if source is not None:
                kind = "ConfigMap" if "configMap" in vol else "Secret"
                name = source.get("name") or source.get("secretName")
                obj = await self.kube.get(kind, rt.namespace, name) if name else None
                for key, value in ((obj or {}).get("data") or {}).items():
                    (path / key).write_text(value)
        return {
            m["mountPath"]: str(folders[m["name"]])
            for m in rt.container.get("volumeMounts") or []
            if m["name"] in folders
        }

    async def _secret_values(self, pod: Obj) -> dict[tuple[str, str], str]:
        import base64

        out: dict[tuple[str, str], str] = {}
        for var in pod["spec"]["containers"][0].get("env") or []:
            src = var.get("valueFrom") or {}
            for kind, ref_key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
                ref = src.get(ref_key)
                if not ref:
                    continue
                obj = await self.kube.get(kind, pod["metadata"]["namespace"], ref["name"])
                raw = ((obj or {}).get("data") or {}).get(ref["key"])
                if raw is not None:
                    out[(ref["name"], ref["key"])] = (
                        base64.b64decode(raw).decode() if kind == "Secret" else raw
                    )
        return out

    def _cold_start(self, rt: PodRuntime) -> float:
        # Simulated weight loading; real vLLM loads for real.
        if rt.is_engine and self.cfg.mapping.engine == "sim":
            return self.cfg.cold_start_s / self.cfg.speed
        return 0.0

    async def _probe_loop(self, rt: PodRuntime) -> None:
        url = P.probe_url(rt.container, rt.ip)
        probe = rt.container.get("readinessProbe") or {}
        period = max(0.2, min(1.0, float(probe.get("periodSeconds", 5)) / self.cfg.speed))
        while not rt.terminating:
            ok = False
            if rt.child is not None and rt.child.alive():
                if url is None:
                    ok = True
                else:
                    with contextlib.suppress(httpx.HTTPError):
                        r = await self._http.get(url)
                        ok = r.status_code == 200
            rt.probe_ok = ok
            rt.ready = ok and time.monotonic() - rt.started_at >= self._cold_start(rt)
            await asyncio.sleep(period)

    async def _supervise(self, rt: PodRuntime, pod: Obj) -> None:
        now = time.monotonic()
        if rt.child is not None and not rt.child.alive() and rt.restart_at is None:
            rt.last_exit = rt.child.returncode
            rt.restarts += 1
            rt.ready = rt.probe_ok = False
            self.procs.forget(rt.child)
            backoff = min(2.0 ** rt.restarts, 30.0) / self.cfg.speed
            rt.restart_at = now + backoff
            log.warning("pod %s/%s exited with %s; restart %d in %.1fs; log tail:\n%s",
                        rt.namespace, rt.name, rt.last_exit, rt.restarts, backoff,
                        rt.child.log_tail())
            await self._write_status(pod, self._waiting_status(
                pod, "CrashLoopBackOff", f"exited with code {rt.last_exit}", rt))
            return
        if rt.restart_at is not None and now >= rt.restart_at:
            rt.restart_at = None
            await self._spawn(rt, pod)
            return
        if rt.restart_at is None and rt.child is not None:
            await self._write_status(pod, self._running_status(pod, rt))

    def _terminate(self, rt: PodRuntime, pod: Obj | None) -> None:
        rt.terminating = True
        rt.ready = False
        rt.tasks.append(asyncio.create_task(self._graceful_stop(rt, pod)))

    async def _graceful_stop(self, rt: PodRuntime, pod: Obj | None) -> None:
        speed = self.cfg.speed
        try:
            if rt.child is not None and rt.child.alive() and pod is not None:
                # Let endpoint removal reach the routers first (the pod's preStop sleep).
                await asyncio.sleep(P.prestop_seconds(rt.container) / speed)
            grace = float(
                (pod or {}).get("metadata", {}).get("deletionGracePeriodSeconds")
                or (pod or {}).get("spec", {}).get("terminationGracePeriodSeconds", 30)
            )
            if rt.child is not None:
                await self.procs.stop(rt.child, grace=max(1.0, grace / speed))
        finally:
            rt.cleanup()
            self.addresses.release(rt.ip)
            self.runtimes.pop((rt.namespace, rt.name), None)
            if pod is not None:
                with contextlib.suppress(ApiError, httpx.HTTPError):
                    await self._remove_finalizer(pod)

    async def _remove_finalizer(self, pod: Obj) -> None:
        meta = pod["metadata"]
        fins = [f for f in meta.get("finalizers") or [] if f != P.FINALIZER]
        if fins != (meta.get("finalizers") or []):
            await self.kube.merge_patch("Pod", meta["namespace"], meta["name"],
                                        {"metadata": {"finalizers": fins or None}})

    # -- status -------------------------------------------------------------------------------

    def _running_status(self, pod: Obj, rt: PodRuntime) -> Obj:
        ready = "True" if rt.ready else "False"
        return {
            "phase": "Running",
            "podIP": rt.ip,
            "podIPs": [{"ip": rt.ip}],
            "hostIP": "127.0.0.1",
            "startTime": pod["metadata"].get("creationTimestamp"),
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": ready},
                {"type": "Ready", "status": ready},
            ],
            "containerStatuses": [
                {
                    "name": rt.container.get("name", "main"),
                    "ready": rt.ready,
                    "started": rt.probe_ok,
                    "restartCount": rt.restarts,
                    "image": rt.container.get("image", ""),
                    "state": {"running": {}},
                }
            ],
        }

    def _waiting_status(self, pod: Obj, reason: str, message: str,
                        rt: PodRuntime | None = None) -> Obj:
        container = pod["spec"]["containers"][0]
        return {
            "phase": "Running" if rt else "Pending",
            **({"podIP": rt.ip, "podIPs": [{"ip": rt.ip}]} if rt else {}),
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "ContainersReady", "status": "False"},
                {"type": "Ready", "status": "False"},
            ],
            "containerStatuses": [
                {
                    "name": container.get("name", "main"),
                    "ready": False,
                    "started": False,
                    "restartCount": rt.restarts if rt else 0,
                    "image": container.get("image", ""),
                    "state": {"waiting": {"reason": reason, "message": message[:500]}},
                    **({"lastState": {"terminated": {"exitCode": rt.last_exit or 0}}}
                       if rt else {}),
                }
            ],
        }

    async def _write_status(self, pod: Obj, status: Obj) -> None:
        meta = pod["metadata"]
        key = f"pod/{meta['namespace']}/{meta['name']}"
        text = json.dumps(status, sort_keys=True)
        if self._written.get(key) == text and pod.get("status", {}).get("phase"):
            return
        await self.kube.merge_patch("Pod", meta["namespace"], meta["name"], {"status": status},
                                    sub="status")
        self._written[key] = text

    async def _deployment_status(self, deployments: list[Obj], pods: list[Obj],
                                 ready: Mapping[str, bool]) -> None:
        for d in deployments:
            meta = d["metadata"]
            mine = [p for p in pods if P.owned_by(p, d)]
            status = P.deployment_status(d, mine, ready)
            key = f"deploy/{meta['namespace']}/{meta['name']}"
            text = json.dumps(status, sort_keys=True)
            current = {k: d.get("status", {}).get(k) for k in status if k != "conditions"}
            if self._written.get(key) == text and current == {
                k: v for k, v in status.items() if k != "conditions"
            }:
                continue
            await self.kube.merge_patch("Deployment", meta["namespace"], meta["name"],
                                        {"status": status}, sub="status")
            self._written[key] = text

    async def _endpoints(self, pods: list[Obj]) -> None:
        services = await self.kube.list("Service")
        views = [self._view(p) for p in pods]
        for svc in services:
            if not svc["spec"].get("selector"):
                continue
            want = P.endpoint_slice(svc, views)
            meta = want["metadata"]
            key = f"slice/{meta['namespace']}/{meta['name']}"
            text = json.dumps([want["endpoints"], want["ports"]], sort_keys=True)
            if self._written.get(key) == text:
                continue
            have = await self.kube.get("EndpointSlice", meta["namespace"], meta["name"])
            if have is None:
                await self.kube.create(want)
            else:
                want["metadata"]["resourceVersion"] = have["metadata"].get("resourceVersion")
                await self.kube.replace(want)
            self._written[key] = text

    def _view(self, pod: Obj) -> P.PodView:
        rt = self.runtimes.get((pod["metadata"]["namespace"], pod["metadata"]["name"]))
        return P.PodView(
            pod=pod,
            ip=rt.ip if rt else None,
            ready=bool(rt and rt.ready),
            terminating=bool(rt and rt.terminating)
            or bool(pod["metadata"].get("deletionTimestamp")),
        )

    def _scrape_targets(self, pods: list[Obj]) -> None:
        if self.on_targets is None:
            return
        targets = []
        for p in pods:
            view = self._view(p)
            rt = self.runtimes.get((p["metadata"]["namespace"], p["metadata"]["name"]))
            # Scrape while the process runs (also while draining), as Prometheus would.
            if rt is None or rt.child is None or not rt.child.alive():
                continue
            t = P.scrape_target(view)
            if t is not None:
                targets.append(t)
        text = json.dumps([(t.address, t.labels) for t in targets], sort_keys=True)
        if text != self._targets_written:
            self.on_targets(targets)
            self._targets_written = text

    # -- timeline -----------------------------------------------------------------------------

    async def _record(self, deployments: list[Obj], pods: list[Obj], ready: Mapping[str, bool],
                      now: float) -> None:
        for d in deployments:
            meta = d["metadata"]
            labels = meta.get("labels") or {}
            pool, role = labels.get(names.POOL_LABEL), labels.get(names.ROLE_LABEL)
            if not pool or not role:
                continue
            desired = int(d["spec"].get("replicas", 1))
            mine = [p for p in pods if P.owned_by(p, d)]
            n_ready = sum(1 for p in mine if ready.get(p["metadata"]["name"]))
            skey = (meta["namespace"], pool, role)
            if self._last_sample.get(skey) != (desired, n_ready, len(mine)):
                self.samples.append(RoleSample(now, meta["namespace"], pool, role, desired,
                                               n_ready, len(mine)))
                self._last_sample[skey] = (desired, n_ready, len(mine))
            dkey = (meta["namespace"], meta["name"])
            before = self._replicas_seen.get(dkey)
            self._replicas_seen[dkey] = desired
            if before is not None and before != desired and role in names.ENGINE_ROLES:
                self.scale_changes.append(
                    ScaleChange(now, meta["namespace"], pool, role, before, desired)
                )
        # Reasons come from the autoscaler's Events (report.attach_reasons).
