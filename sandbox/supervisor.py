"""The sandbox supervisor: starts and wires every component on loopback, and stops them all.

Order: pre-flight checks (Prometheus and kubectl installed, ports free) -> the Kubernetes API
emulator (its own process) -> the CRD (`kubectl apply`) -> Prometheus -> the controller (in
this process; it runs pods as processes) -> the operator and the autoscaler (their own
processes, their real CLIs) -> the pool (`kubectl apply -f`). `stop()` ends everything it
started, in reverse order, also after an error or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from poolpilot.autoscaler import recording
from poolpilot.autoscaler.queries import QuerySet
from poolpilot.emulator.cluster import pods as P
from poolpilot.emulator.cluster.controller import Controller, ControllerConfig
from poolpilot.emulator.cluster.kubeapi import ControllerApi
from poolpilot.emulator.cluster.processes import Child, ProcessTable
from poolpilot.operator.multinode import multi_node, set_name
from poolpilot.testkit.prometheus import (
    PrometheusNotInstalled,
    PrometheusProcess,
    Target,
    duration,
    free_port,
)

from poolpilot import leaderworkerset as lws
from poolpilot import names, workloads
from poolpilot.api import InferencePoolSpec
from poolpilot.roles import Role
from poolpilot.validate import InvalidPool, parse_spec

log = logging.getLogger("poolpilot.sandbox")
POOLPILOT = [sys.executable, "-m", "poolpilot.cli"]
REPO = Path(__file__).resolve().parent.parent


class SandboxError(RuntimeError):
    """A problem the user can fix; the message says how."""


@dataclass
class SandboxConfig:
    out_dir: Path  # made absolute: pods run in their own folders and get paths under it
    engine: str = "sim"  # sim | vllm-cpu
    speed: float = 1.0
    api_port: int = 0  # 0: a free port
    prometheus_port: int = 0
    scrape_interval_s: float = 5.0  # simulated seconds
    cold_start_s: float = 30.0  # simulated seconds of weight loading (simulator engines)
    sim_gpu: str = "h200"
    sim_model: str | None = None  # None: the pool's model when the simulator knows it
    autoscaler: bool = True
    autoscaler_tick_s: float = 2.0  # how often the loop wakes (each pool keeps its interval)
    rate_window_s: float = 30.0  # rate() and latency-quantile window of its queries
    extra_autoscaler_args: list[str] = field(default_factory=list)
    log_level: str = "INFO"


@dataclass
class AppliedPool:
    namespace: str
    name: str
    spec: InferencePoolSpec
    manifest: dict[str, Any]


def kubectl_path() -> str:
    for root in (REPO, Path.cwd()):
        candidate = root / ".cache" / "bin" / "kubectl"
        if candidate.exists():
            return str(candidate)
    found = shutil.which("kubectl")
    if found:
        return found
    raise SandboxError("kubectl is not installed; run ./dev setup (it installs kubectl into "
                       ".cache/bin) or put kubectl 1.33 on PATH")


def check_port(host: str, port: int, option: str) -> None:
    if port == 0:
        return
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            raise SandboxError(
                f"port {port} on {host} is taken by another program; stop it or pass "
                f"{option} 0 to pick a free port"
            ) from None


def load_pool(path: Path) -> tuple[dict[str, Any], InferencePoolSpec]:
    try:
        manifest = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SandboxError(f"{path}: no such pool file") from None
    except yaml.YAMLError as exc:
        raise SandboxError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != "InferencePool":
        raise SandboxError(f"{path}: expected one InferencePool manifest")
    try:
        spec = parse_spec(manifest.get("spec") or {})
    except InvalidPool as exc:
        raise SandboxError(f"{path}: invalid pool:\n" + "\n".join(exc.errors)) from None
    return manifest, spec


class Sandbox:
    def __init__(self, cfg: SandboxConfig) -> None:
        cfg.out_dir = cfg.out_dir.resolve()
        self.cfg = cfg
        self.out = cfg.out_dir
        self.logs = self.out / "logs"
        self.procs = ProcessTable(self.logs)
        self.prometheus: PrometheusProcess | None = None
        self.emulator: Child | None = None
        self.operator: Child | None = None
        self.autoscaler: Child | None = None
        self.kube: ControllerApi | None = None
        self.controller: Controller | None = None
        self._controller_task: asyncio.Task[None] | None = None
        self.api_url = ""
        self.kubeconfig = self.out / "kubeconfig"
        self.kubectl_bin = ""
        self._infra_targets: list[Target] = []
        self._pod_targets: list[Target] = []
        self.autoscaler_metrics_port = 0
        self.operator_health_port = 0

    # -- start --------------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.cfg
        self.kubectl_bin = kubectl_path()
        if shutil.which("prometheus") is None:
            raise SandboxError(
                "Prometheus is not installed; run ./dev setup, or `apt-get install -y "
                "--no-install-recommends prometheus`"
            )
        check_port("127.0.0.1", cfg.api_port, "--api-port")
        check_port("127.0.0.1", cfg.prometheus_port, "--prometheus-port")
        self.out.mkdir(parents=True, exist_ok=True)
        for stale in ("kubeconfig",):
            with contextlib.suppress(FileNotFoundError):
                (self.out / stale).unlink()
        shutil.rmtree(self.out / "pods", ignore_errors=True)
        shutil.rmtree(self.out / "prometheus", ignore_errors=True)
        shutil.rmtree(self.logs, ignore_errors=True)
        await self._start_emulator()
        await self.apply_crd()
        self._start_prometheus()
        self._start_controller()
        self._start_operator()
        if cfg.autoscaler:
            self._start_autoscaler()
        await self._wait_infra()

    async def _start_emulator(self) -> None:
        port = self.cfg.api_port or free_port()
        self.emulator = self.procs.start(
            "emulator",
            [*POOLPILOT, "emulator", "--host", "127.0.0.1", "--port", str(port),
             "--write-kubeconfig", str(self.kubeconfig)],
        )
        self.api_url = f"http://127.0.0.1:{port}"
        await self._wait_http(f"{self.api_url}/version", self.emulator, "the Kubernetes API "
                              "emulator", timeout=60)
        deadline = time.monotonic() + 10
        while not self.kubeconfig.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if not self.kubeconfig.exists():
            raise SandboxError(f"the emulator wrote no kubeconfig; see {self.emulator.log_path}")
        self.kube = ControllerApi(self.kubeconfig)

    async def _wait_http(self, url: str, child: Child | None, what: str,
                         timeout: float) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=2.0) as http:
            while time.monotonic() < deadline:
                if child is not None and not child.alive():
                    raise SandboxError(f"{what} exited with code {child.returncode}:\n"
                                       f"{child.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    r = await http.get(url)
                    if r.status_code < 500:
                        return
                await asyncio.sleep(0.1)
        raise SandboxError(f"{what} did not answer {url} within {timeout:.0f}s; see "
                           f"{child.log_path if child else 'its log'}")

    def kubectl_run(self, *args: str, input_text: str | None = None,
                    check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.kubectl_bin, "--kubeconfig", str(self.kubeconfig), *args],
            input=input_text, capture_output=True, text=True, timeout=timeout,
        )
        if check and result.returncode != 0:
            raise SandboxError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    async def kubectl(self, *args: str, input_text: str | None = None,
                      check: bool = True) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(self.kubectl_run, *args, input_text=input_text,
                                       check=check)

    async def apply_crd(self) -> None:
        from poolpilot.crd import build_crd

        crd_file = self.out / "crd.yaml"
        crd_file.write_text(yaml.safe_dump(build_crd(), sort_keys=False))
        await self.kubectl("apply", "-f", str(crd_file))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = await self.kubectl("get", "inferencepools.poolpilot.dev", "-A", check=False)
            if r.returncode == 0:
                return
            await asyncio.sleep(0.2)
        raise SandboxError("the InferencePool CRD was not served within 30s")

    def _start_prometheus(self) -> None:
        interval = self.cfg.scrape_interval_s / self.cfg.speed
        workdir = self.out / "prometheus"
        workdir.mkdir(parents=True, exist_ok=True)
        # The autoscaler's recording rules (as the chart's PrometheusRule ships them), for its
        # --rate-window on the sandbox's clock, evaluated at every scrape.
        window = QuerySet(window_seconds=self.cfg.rate_window_s / self.cfg.speed).window()
        rules = workdir / "autoscaler-rules.yaml"
        rules.write_text(yaml.safe_dump(
            {"groups": [recording.rule_group(window, duration(interval))]},
            sort_keys=False))
        self.prometheus = PrometheusProcess(
            scrape_interval=interval, port=self.cfg.prometheus_port, workdir=workdir,
            rule_files=[rules],
        )
        try:
            self.prometheus.start()
        except PrometheusNotInstalled as exc:
            raise SandboxError(str(exc)) from None

    def _set_targets(self, pod_targets: list[P.ScrapeTarget] | None = None) -> None:
        if pod_targets is not None:
            self._pod_targets = [Target(t.address, t.labels, t.path) for t in pod_targets]
        if self.prometheus is not None:
            self.prometheus.set_targets([*self._infra_targets, *self._pod_targets])

    def _start_controller(self) -> None:
        assert self.kube is not None
        mapping = P.EngineMapping(engine=self.cfg.engine, speed=self.cfg.speed,
                                  sim_model=self.cfg.sim_model, sim_gpu=self.cfg.sim_gpu)
        if self.cfg.engine == "vllm-cpu":
            mapping = self._vllm_mapping(mapping)
        self.controller = Controller(
            self.kube, self.procs,
            ControllerConfig(workdir=self.out, kubeconfig=self.kubeconfig, mapping=mapping,
                             speed=self.cfg.speed, cold_start_s=self.cfg.cold_start_s),
            on_targets=self._set_targets,
        )
        self._controller_task = asyncio.create_task(self.controller.run())

    def _vllm_mapping(self, mapping: P.EngineMapping) -> P.EngineMapping:
        from dataclasses import replace

        from poolpilot.sandbox import tinymodel

        # absolute(), not resolve(): the venv's python is a symlink out of the venv.
        python = tinymodel.vllm_python().absolute()
        if not python.exists():
            raise SandboxError(f"--engine vllm-cpu needs real vLLM in {python.parent.parent}; "
                               "run ./dev setup-vllm")
        model = tinymodel.ensure_tiny_model(REPO / ".cache" / "tiny-llama")
        # one core each for prefill and decode; an aggregated engine gets all (the kubelet's
        # default, whichever name its --role gives it)
        return replace(mapping, tiny_model=str(model), vllm_python=str(python),
                       cpu_threads={Role.PREFILL: "0", Role.DECODE: "1"})

    def _env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"}

    def _start_operator(self) -> None:
        # One replica, no peering; drift checks on the sandbox's clock. A restart keeps the port.
        self.operator_health_port = self.operator_health_port or free_port()
        self.operator = self.procs.start(
            "operator",
            [*POOLPILOT, "operator", "--all-namespaces", "--standalone",
             "--liveness", f"http://127.0.0.1:{self.operator_health_port}/healthz",
             "--drift-interval", f"{max(1.0, 30.0 / self.cfg.speed):g}"],
            env=self._env(),
        )

    def _start_autoscaler(self) -> None:
        assert self.prometheus is not None
        # Intervals and windows are simulated seconds; --speed divides them all (one clock).
        # A restart keeps the port, so Prometheus's target stays the same.
        restart = bool(self.autoscaler_metrics_port)
        self.autoscaler_metrics_port = self.autoscaler_metrics_port or free_port()
        self.autoscaler = self.procs.start(
            "autoscaler",
            [*POOLPILOT, "autoscaler", "--prometheus", self.prometheus.url, "--all-namespaces",
             "--speed", f"{self.cfg.speed:g}", "--interval", f"{self.cfg.autoscaler_tick_s:g}",
             "--rate-window", f"{self.cfg.rate_window_s:g}",
             "--metrics-port", str(self.autoscaler_metrics_port), "--metrics-host", "127.0.0.1",
             *self.cfg.extra_autoscaler_args],
            env=self._env(),
        )
        if not restart:
            self._infra_targets.append(
                Target(f"127.0.0.1:{self.autoscaler_metrics_port}", {"component": "autoscaler"}))
            self._set_targets()

    def restart(self, component: str) -> Child:
        """Start the operator or the autoscaler again after it exited (a chaos fault), with the
        same command line and ports, as its Deployment would restart its pod."""
        if component == "operator":
            self._start_operator()
            assert self.operator is not None
            return self.operator
        if component == "autoscaler":
            self._start_autoscaler()
            assert self.autoscaler is not None
            return self.autoscaler
        raise ValueError(f"cannot restart {component!r}: operator or autoscaler")

    async def _wait_infra(self) -> None:
        await asyncio.sleep(0)
        for child, what in ((self.operator, "the operator"), (self.autoscaler, "the autoscaler")):
            if child is not None and not child.alive():
                raise SandboxError(f"{what} exited with code {child.returncode}:\n"
                                   f"{child.log_tail()}")

    # -- pools --------------------------------------------------------------------------------

    async def apply(self, pool_file: Path, namespace: str | None = None) -> AppliedPool:
        manifest, spec = load_pool(pool_file)
        ns = namespace or manifest["metadata"].get("namespace") or "default"
        manifest["metadata"]["namespace"] = ns
        await self.kubectl("create", "namespace", ns, check=False)
        path = self.out / f"pool-{manifest['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(manifest, sort_keys=False))
        await self.kubectl("apply", "-f", str(path))
        return AppliedPool(ns, manifest["metadata"]["name"], spec, manifest)

    async def wait_ready(self, pool: AppliedPool, timeout: float = 180.0) -> None:
        """Until every role has its minimum of ready pods and a router answers."""
        assert self.kube is not None and self.controller is not None
        deadline = time.monotonic() + timeout
        roles = [*pool.spec.engine_roles(), Role.ROUTER]
        state: dict[str, str] = {}
        while time.monotonic() < deadline:
            self.check_alive()
            crashing = [rt for rt in self.controller.kubelet.runtimes.values()
                        if rt.namespace == pool.namespace and rt.restarts >= 3]
            if crashing:
                raise SandboxError(
                    f"pool {pool.namespace}/{pool.name}: pods keep crashing:\n"
                    f"{self._pod_failures()}see the logs in {self.logs}")
            done = True
            for role in roles:
                d = await self._role_workload(pool, role)
                c = workloads.counts(d or {})
                ready, want = c.ready, c.desired if d else -1
                state[role] = "missing" if d is None else f"{ready}/{want} ready"
                if d is None or ready < max(1, want):
                    done = False
            if done and self.router_urls(pool):
                return
            await asyncio.sleep(0.25)
        raise SandboxError(
            f"pool {pool.namespace}/{pool.name} not ready after {timeout:.0f}s: "
            + ", ".join(f"{r} {s}" for r, s in state.items())
            + f"\n{self._pod_failures()}see the logs in {self.logs}"
        )

    async def _role_workload(self, pool: AppliedPool, role: str) -> dict[str, Any] | None:
        """The role's Deployment, or its LeaderWorkerSet for multi-node replicas (replicas and
        ready replicas count groups)."""
        assert self.kube is not None
        if role != Role.ROUTER and multi_node(pool.spec, role):
            return await self.kube.get(lws.KIND, pool.namespace, set_name(pool.name, role))
        return await self.kube.get("Deployment", pool.namespace,
                                   names.child_name(pool.name, role))

    def warmup_seconds(self, pool: AppliedPool) -> float:
        """Simulated seconds to let a freshly started pool run before load: the autoscaler
        treats replicas that just became ready as settling for 1.5 metric ages (its rates
        still cover the time before), and two scrapes make the first samples. A trace then
        meets a pool that has been running, as in production."""
        if not self.cfg.autoscaler or not pool.spec.autoscaling.enabled:
            return 0.0
        return 1.5 * pool.spec.autoscaling.metrics_max_age_seconds + 2 * self.cfg.scrape_interval_s

    async def warm_up(self, pool: AppliedPool) -> None:
        # Simulated time passing on an idle pool (the scenario's history), not a readiness wait.
        await asyncio.sleep(self.warmup_seconds(pool) / self.cfg.speed)

    def _pod_failures(self) -> str:
        assert self.controller is not None
        lines = []
        for rt in self.controller.kubelet.runtimes.values():
            if rt.restarts or (rt.child is not None and not rt.child.alive()):
                tail = rt.child.log_tail(8) if rt.child else ""
                lines.append(f"pod {rt.name} restarted {rt.restarts}x; last log lines:\n{tail}\n")
        return "".join(lines)

    def check_alive(self) -> None:
        """Raise SandboxError when a component the sandbox started has exited."""
        for child, what in ((self.emulator, "the Kubernetes API emulator"),
                            (self.operator, "the operator"), (self.autoscaler, "the autoscaler")):
            if child is not None and not child.alive():
                raise SandboxError(f"{what} exited with code {child.returncode}:\n"
                                   f"{child.log_tail()}")

    def router_urls(self, pool: AppliedPool) -> list[str]:
        """OpenAI base URLs of the pool's ready router pods (the Service's endpoints)."""
        assert self.controller is not None
        prefix = names.child_name(pool.name, Role.ROUTER) + "-"
        return sorted(
            f"http://{rt.ip}:{names.ROUTER_PORT}/v1"
            for rt in self.controller.kubelet.runtimes.values()
            if rt.namespace == pool.namespace and rt.name.startswith(prefix) and rt.ready
            and not rt.terminating
        )

    async def scale_event_messages(self, pool: AppliedPool) -> list[str]:
        """Messages of the autoscaler's ScaledUp/ScaledDown Events for the pool, oldest first
        (each reads "prefill 1 -> 3: QueueAboveTarget (...)")."""
        assert self.kube is not None
        events = await self.kube.list("Event", pool.namespace)
        mine = [e for e in events
                if (e.get("involvedObject") or {}).get("name") == pool.name
                and e.get("reason") in ("ScaledUp", "ScaledDown")]
        mine.sort(key=lambda e: (e.get("firstTimestamp") or e.get("eventTime") or "",
                                 int(e["metadata"].get("resourceVersion") or 0)))
        return [e.get("message", "") for e in mine]

    # -- Prometheus ---------------------------------------------------------------------------

    async def query_range(self, promql: str, start: float, end: float,
                          step: float) -> list[dict[str, Any]]:
        """A range query; start/end are time.time() values."""
        assert self.prometheus is not None
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.get(f"{self.prometheus.url}/api/v1/query_range",
                               params={"query": promql, "start": start, "end": end,
                                       "step": max(step, 0.05)})
            r.raise_for_status()
            result: list[dict[str, Any]] = r.json()["data"]["result"]
            return result

    def stop_prometheus(self, kill: bool = False) -> None:
        """Stop Prometheus but keep its data and port (for outage tests); `kill`: SIGKILL, a
        crash (it replays its write-ahead log when started again)."""
        assert self.prometheus is not None
        proc = self.prometheus._proc
        if proc is not None and proc.poll() is None:
            proc.kill() if kill else proc.terminate()
            proc.wait(timeout=15)
        self.prometheus._proc = None

    def restart_prometheus(self) -> None:
        assert self.prometheus is not None
        self.prometheus.start([*self._infra_targets, *self._pod_targets])

    # -- stop ---------------------------------------------------------------------------------

    async def stop(self) -> None:
        if self._controller_task is not None:
            self._controller_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._controller_task
        for child in (self.autoscaler, self.operator):
            if child is not None:
                await self.procs.stop(child, grace=5.0)
        if self.controller is not None:
            await self.controller.shutdown()
        if self.prometheus is not None:
            self.prometheus.stop()
        if self.kube is not None:
            await self.kube.close()
        self.procs.stop_all(grace=5.0)

    def stop_sync(self) -> None:
        """Last resort (signal handlers, atexit): kill whatever is left, blocking."""
        if self.prometheus is not None:
            with contextlib.suppress(Exception):
                self.prometheus.stop()
        self.procs.stop_all(grace=3.0)


@contextlib.contextmanager
def sigterm_as_keyboard_interrupt() -> Iterator[None]:
    """SIGTERM ends the sandbox like Ctrl-C does, so the same cleanup runs."""
    import signal

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
