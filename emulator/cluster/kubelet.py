"""The cluster's kubelet: Pods -> local processes, readiness, restarts, graceful deletion.

- Each pod gets its own loopback address 127.B.N.M (AddressPool) and runs its command
  (pods.pod_command) there on its container port, in a folder of its own with its volumes as
  local folders, env from values, the downward API, Secrets and ConfigMaps.
- Readiness from the pod's readinessProbe (HTTP GET, polled; its period divided by --speed,
  at most 1 s), as the kubelet counts it: ready after successThreshold successes, not ready
  after failureThreshold failures in a row (each try given timeoutSeconds), not ready at once
  when the process is gone; gated for simulator engines by a cold start (weight loading)
  divided by --speed.
- A process that exits is restarted with back-off and reported as CrashLoopBackOff.
- Deleting a pod is graceful: its endpoint turns not-ready, the preStop sleep runs, then
  SIGTERM, then SIGKILL after terminationGracePeriodSeconds (all divided by --speed); a
  finalizer keeps the Pod object until its process is gone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import random
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from poolpilot import names
from poolpilot.apitypes import Obj
from poolpilot.roles import Role
from poolpilot.validate import InvalidPool, parse_spec

from . import pods as P
from .kubeapi import ApiError, ControllerApi
from .processes import Child, ProcessTable
from .status_cache import StatusCache

log = logging.getLogger("poolpilot.emulator.cluster.kubelet")



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
class KubeletConfig:
    workdir: Path  # pods run in workdir/pods/NAMESPACE/NAME
    kubeconfig: Path
    mapping: P.EngineMapping
    speed: float = 1.0
    cold_start_s: float = 30.0  # simulated seconds of weight loading for simulator engines
    extra_env: dict[str, str] = field(default_factory=dict)


class Kubelet:
    def __init__(self, kube: ControllerApi, procs: ProcessTable, cfg: KubeletConfig) -> None:
        self.kube = kube
        self.procs = procs
        self.cfg = cfg
        self.addresses = AddressPool()
        self.runtimes: dict[tuple[str, str], PodRuntime] = {}
        self._status = StatusCache(kube)
        self._http = httpx.AsyncClient(timeout=2.0)
        self._transitions = ConditionTimes()

    # -- what other jobs read -----------------------------------------------------------------

    def runtime(self, pod: Obj) -> PodRuntime | None:
        return self.runtimes.get((pod["metadata"]["namespace"], pod["metadata"]["name"]))

    def is_ready(self, pod: Obj) -> bool:
        rt = self.runtime(pod)
        return bool(rt and rt.ready and not rt.terminating)

    def is_running(self, pod: Obj) -> bool:
        """The pod's process is alive (also while it drains)."""
        rt = self.runtime(pod)
        return bool(rt and rt.child is not None and rt.child.alive())

    def view(self, pod: Obj) -> P.PodView:
        rt = self.runtime(pod)
        return P.PodView(
            pod=pod,
            ip=rt.ip if rt else None,
            ready=bool(rt and rt.ready),
            terminating=bool(rt and rt.terminating)
            or bool(pod["metadata"].get("deletionTimestamp")),
        )

    # -- one pass -----------------------------------------------------------------------------

    async def sync(self, pods: list[Obj]) -> None:
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

    async def shutdown(self) -> None:
        """Stop every pod process (fast: the sandbox is going away)."""
        for rt in list(self.runtimes.values()):
            for t in rt.tasks:
                t.cancel()
            if rt.child is not None:
                await self.procs.stop(rt.child, grace=3.0)
            rt.cleanup()
        self.runtimes.clear()
        await self._http.aclose()

    # -- start --------------------------------------------------------------------------------

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
            await self._write_status(pod, waiting_status(pod, "CreateContainerError", str(exc)))
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
            await self._write_status(pod, waiting_status(pod, "CreateContainerError", str(exc)))
            return
        rt.child = self.procs.start(f"pod-{rt.namespace}-{rt.name}", argv, env=env,
                                    cwd=rt.workdir)
        rt.started_at = time.monotonic()
        rt.probe_ok = rt.ready = False
        log.info("pod %s/%s on %s: %s", rt.namespace, rt.name, rt.ip, " ".join(argv))
        await self._write_status(pod, running_status(pod, rt))

    async def _command(self, rt: PodRuntime, pod: Obj) -> tuple[list[str], dict[str, str]]:
        mounts = await self._volumes(rt, pod)
        argv = (rt.container.get("command") or []) + (rt.container.get("args") or [])
        local = P.pod_command(argv, rt.ip, self.cfg.mapping, mounts,
                              itl_budget=await self._itl_target(pod))
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
            role = P._option(argv, "--role") or str(Role.ENGINE)
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

    async def _itl_target(self, pod: Obj) -> float | None:
        """The ITL target of the pod's pool (simulated decode engines keep a local prefill's
        steps within it); None when the pod belongs to no pool."""
        pool = (pod["metadata"].get("labels") or {}).get(names.POOL_LABEL)
        obj = await self.kube.get("InferencePool", pod["metadata"]["namespace"], pool) \
            if pool else None
        if obj is None:
            return None
        try:
            return float(parse_spec(obj.get("spec") or {}).slo.itl.seconds)
        except InvalidPool:
            return None  # the operator reports it; the pod keeps its last good command

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

    # -- readiness and restarts ---------------------------------------------------------------

    def _cold_start(self, rt: PodRuntime) -> float:
        # Simulated weight loading; real vLLM loads for real.
        if rt.is_engine and self.cfg.mapping.engine == "sim":
            return self.cfg.cold_start_s / self.cfg.speed
        return 0.0

    async def _probe_loop(self, rt: PodRuntime) -> None:
        url = P.probe_url(rt.container, rt.ip)
        probe = rt.container.get("readinessProbe") or {}
        rule = P.ProbeRule.of(rt.container)
        period = max(0.2, min(1.0, float(probe.get("periodSeconds", 5)) / self.cfg.speed))
        streak = 0
        while not rt.terminating:
            ok = False
            running = rt.child is not None and rt.child.alive()
            if running:
                if url is None:
                    ok = True
                else:
                    with contextlib.suppress(httpx.HTTPError):
                        r = await self._http.get(url, timeout=rule.timeout_s)
                        ok = r.status_code == 200
            # (a restart reset probe_ok: the new process must pass its probe again)
            rt.probe_ok, streak = rule.next(rt.probe_ok, streak, ok, running)
            rt.ready = rt.probe_ok and time.monotonic() - rt.started_at >= self._cold_start(rt)
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
            await self._write_status(pod, waiting_status(
                pod, "CrashLoopBackOff", f"exited with code {rt.last_exit}", rt))
            return
        if rt.restart_at is not None and now >= rt.restart_at:
            rt.restart_at = None
            await self._spawn(rt, pod)
            return
        if rt.restart_at is None and rt.child is not None:
            await self._write_status(pod, running_status(pod, rt))

    # -- deletion -----------------------------------------------------------------------------

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
            self._transitions.forget((rt.namespace, rt.name))
            if pod is not None:
                with contextlib.suppress(ApiError, httpx.HTTPError):
                    await self._remove_finalizer(pod)

    async def _remove_finalizer(self, pod: Obj) -> None:
        meta = pod["metadata"]
        fins = [f for f in meta.get("finalizers") or [] if f != P.FINALIZER]
        if fins != (meta.get("finalizers") or []):
            await self.kube.merge_patch("Pod", meta["namespace"], meta["name"],
                                        {"metadata": {"finalizers": fins or None}})

    async def _write_status(self, pod: Obj, status: Obj) -> None:
        meta = pod["metadata"]
        self._transitions.stamp((meta["namespace"], meta["name"]), status)
        # A pod without a phase yet is always written (it was just created).
        await self._status.write("Pod", pod, status,
                                 force=not pod.get("status", {}).get("phase"))


# -- pod status (what `kubectl get pods` shows) --------------------------------------------


def _now_iso() -> str:
    """RFC 3339 at seconds precision, as the kubelet writes condition times."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class ConditionTimes:
    """Each pod's condition transition times, kept as a kubelet keeps them: a condition's
    lastTransitionTime moves only when its status does (the autoscaler reads the Ready one to
    tell since when a role has been serving without a break)."""

    def __init__(self, now: Callable[[], str] = _now_iso) -> None:
        self._now = now
        self._seen: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}

    def stamp(self, pod: tuple[str, str], status: Obj) -> None:
        """Set lastTransitionTime on each of `status`'s conditions of the pod (namespace,
        name): the time it took this status, now if it just changed."""
        seen = self._seen.setdefault(pod, {})
        for cond in status.get("conditions") or []:
            known = seen.get(cond["type"])
            if known is None or known[0] != cond["status"]:
                known = seen[cond["type"]] = (cond["status"], self._now())
            cond["lastTransitionTime"] = known[1]

    def forget(self, pod: tuple[str, str]) -> None:
        self._seen.pop(pod, None)


def running_status(pod: Obj, rt: PodRuntime) -> Obj:
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


def waiting_status(pod: Obj, reason: str, message: str, rt: PodRuntime | None = None) -> Obj:
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
