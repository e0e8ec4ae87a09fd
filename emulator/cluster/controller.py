"""The emulator's control plane for workloads: what kube-controller-manager and the kubelet do
in a real cluster, for the objects poolpilot makes (the sandbox runs it beside the emulator).
One pass every `period_s` runs five jobs, each in a module of its own:

- deployments.py: Deployments -> Pods (ReplicaSet logic) and Deployment status;
- leaderworkersets.py: LeaderWorkerSets -> groups of Pods and their status (multi-node roles);
- kubelet.py: Pods -> local processes on their own loopback addresses, readiness, restarts,
  graceful deletion;
- endpoints.py: EndpointSlices for every Service with a selector;
- scrape.py: Prometheus scrape targets from the pods' prometheus.io annotations;
- timeline.py: desired and ready replicas per role over time, for the report.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from . import pods as P
from .deployments import DeploymentController
from .endpoints import EndpointSlices
from .kubeapi import ApiError, ControllerApi
from .kubelet import Kubelet, KubeletConfig
from .leaderworkersets import LeaderWorkerSetController
from .processes import ProcessTable
from .scrape import ScrapeTargets
from .timeline import Timeline

log = logging.getLogger("poolpilot.emulator.cluster.controller")


@dataclass
class ControllerConfig:
    workdir: Path
    kubeconfig: Path
    mapping: P.EngineMapping
    speed: float = 1.0
    cold_start_s: float = 30.0  # simulated seconds of weight loading for simulator engines
    period_s: float = 0.25  # real seconds between passes
    extra_env: dict[str, str] = field(default_factory=dict)


class Controller:
    def __init__(self, kube: ControllerApi, procs: ProcessTable, cfg: ControllerConfig,
                 on_targets: Callable[[list[P.ScrapeTarget]], None] | None = None) -> None:
        self.kube = kube
        self.cfg = cfg
        self.deployments = DeploymentController(kube)
        self.leader_worker_sets = LeaderWorkerSetController(kube)
        self.kubelet = Kubelet(kube, procs, KubeletConfig(
            workdir=cfg.workdir, kubeconfig=cfg.kubeconfig, mapping=cfg.mapping,
            speed=cfg.speed, cold_start_s=cfg.cold_start_s, extra_env=cfg.extra_env))
        self.endpoints = EndpointSlices(kube)
        self.scrape = ScrapeTargets(on_targets) if on_targets is not None else None
        self.timeline = Timeline()
        self.errors: list[str] = []
        self._stopping = False

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
        await self.kubelet.shutdown()

    async def reconcile_once(self) -> None:
        deployments = await self.kube.list("Deployment")
        sets = await self.leader_worker_sets.list_sets()
        pods = await self.kube.list("Pod")
        now = time.monotonic()
        await self.deployments.scale(deployments, pods, self._ready(pods))
        await self.leader_worker_sets.scale(sets, pods, self._ready(pods))
        await self.kubelet.sync(pods)
        pods = await self.kube.list("Pod")  # the pods just created or deleted
        ready = self._ready(pods)
        await self.deployments.write_status(deployments, pods, ready)
        await self.leader_worker_sets.write_status(sets, pods, ready)
        await self.endpoints.sync([self.kubelet.view(p) for p in pods])
        if self.scrape is not None:
            self.scrape.sync([self.kubelet.view(p) for p in pods if self.kubelet.is_running(p)])
        self.timeline.record([*deployments, *sets], pods, ready, now)

    def _ready(self, pods: list[P.Obj]) -> dict[str, bool]:
        return {p["metadata"]["name"]: self.kubelet.is_ready(p) for p in pods}
