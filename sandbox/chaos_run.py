"""Chaos in the sandbox, the I/O part: kill and restart components while a trace replays, and
watch the cluster to see each fault end (`poolpilot sandbox --chaos SEED`).

Faults run one at a time, at the times `chaos.plan` drew from the seed; a fault whose time
comes while the previous one has not recovered waits for it (and MIN_GAP_S more), so each
recovery is measured on its own. Killing is SIGKILL to the process group, as a crash or an
OOM kill: nothing gets to clean up.

- operator, autoscaler: killed, started again after the fault's downtime with the same
  command line and ports (its Deployment would restart it);
- Prometheus: killed, started again after the downtime on the same port and TSDB (a
  persistent volume), its targets rewritten;
- one pod of an engine role, or the router pod: its process killed; the sandbox's kubelet
  restarts it after its back-off, in the same pod (restartCount + 1), as for any crash;
- hung-ROLE: one pod of the role stopped (SIGSTOP to its process group, the PID the sandbox's
  kubelet started), continued (SIGCONT) after the hold; the kubelet's probes see it as a
  real kubelet would (it may restart it);
- slow-ROLE: one pod of the role told to take SLOWDOWN x its step time (POST /sim/fault on
  the engine simulator's port), back to 1x after the hold.

While it runs, a watcher reads the pool's Deployments (spec.replicas, status.readyReplicas)
and the pool's status (desiredReplicas per role, MetricsAvailable) from the Kubernetes API a
few times a second: that is what "back at the desired size" and "MetricsAvailable=False
during the outage" are judged on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from poolpilot.emulator.cluster import pods as P
from poolpilot.router.main import MIN_DEADLINE_S

from poolpilot import names, workloads
from poolpilot.api import AutoscalingMode
from poolpilot.roles import Role

from . import chaos as C
from .supervisor import AppliedPool, Sandbox

log = logging.getLogger("poolpilot.sandbox.chaos")

WATCH_PERIOD_S = 0.2  # real seconds between two reads of the cluster's state
# A scale decided just before a kill reaches the Deployment, and the timeline, up to a moment
# after it (the autoscaler's queries and writes, a controller pass): real seconds.
DECISION_LAG_REAL_S = 1.0
# Simulated seconds after the last send by which every request must have an outcome; one
# still open then is cancelled and counted as hung (a failure of the run).
DRAIN_S = 300.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chaos", type=int, default=None, metavar="SEED",
                   help="while the trace replays, kill and restart the operator, the "
                   "autoscaler, Prometheus, one pod of each engine role and the router, at "
                   "times drawn from SEED; report.json gets a 'chaos' section and chaos.png, "
                   "and the exit status is 4 when a chaos property fails")
    p.add_argument("--chaos-faults", default=None, metavar="LIST",
                   help="comma-separated faults to inject (default: operator,autoscaler,"
                   "prometheus, the pool's engine roles, router)")


@dataclass
class Sample:
    t: float  # time.monotonic()
    sizes: dict[str, tuple[int, int]]  # role -> (spec.replicas, readyReplicas)
    desired: dict[str, int | None]  # engine role -> the autoscaler's status.desiredReplicas
    metrics_available: str | None  # the pool's MetricsAvailable condition status

    def asked_as_desired(self, autoscaled: bool) -> bool:
        """Each engine role's Deployment asks for the replicas the autoscaler wants (when it
        applies its decisions)."""
        if not self.sizes:
            return False
        return not autoscaled or all(
            self.desired.get(role) in (None, spec) for role, (spec, _) in self.sizes.items()
            if role != Role.ROUTER)


class ChaosRun:
    """Injects the planned faults into a running sandbox and records what happened."""

    def __init__(self, sandbox: Sandbox, pool: AppliedPool, seed: int,
                 faults: Sequence[C.Fault]) -> None:
        self.sandbox = sandbox
        self.pool = pool
        self.seed = seed
        self.faults = list(faults)
        cfg = sandbox.cfg
        self.speed = cfg.speed
        self.bounds = C.BoundInputs(speed=cfg.speed, cold_start_s=cfg.cold_start_s,
                                    interval_s=float(pool.spec.autoscaling.interval_seconds),
                                    scrape_s=cfg.scrape_interval_s)
        a = pool.spec.autoscaling
        self.autoscaled = bool(a.enabled and a.mode == AutoscalingMode.APPLY and cfg.autoscaler)
        self.down_window_s = float(a.scale_down.stabilization_window_seconds)
        self.records: list[C.FaultRecord] = []
        self.samples: list[Sample] = []
        self.t0 = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._http = httpx.AsyncClient(timeout=2.0)
        self.drain_s = DRAIN_S / self.speed  # real seconds, for Replayer.replay(drain_s=)

    # -- clock ----------------------------------------------------------------------------------

    def sim(self, t: float) -> float:
        """time.monotonic() -> simulated seconds from the replay's start."""
        return round((t - self.t0) * self.speed, 1)

    # -- lifecycle ------------------------------------------------------------------------------

    async def replay(self, replayer: Any, trace: Sequence[Any], t0: float,
                     progress: bool = True) -> list[Any]:
        """`replayer.replay(trace)` with the faults injected meanwhile (times from `t0`, the
        replay's start); returns once every request has an outcome (or hangs past DRAIN_S)
        and every fault has recovered or passed its bound."""
        self.start(t0)
        try:
            results: list[Any] = await replayer.replay(trace, progress=progress,
                                                       drain_s=self.drain_s)
            await self.finish()
        finally:
            await self.cancel()
        return results

    def start(self, t0: float) -> None:
        self.t0 = t0
        # [watcher, injector]
        self._tasks = [asyncio.create_task(self._watch()), asyncio.create_task(self._inject_all())]

    async def finish(self) -> None:
        """Wait for the remaining faults (each ends within its bound), then stop watching."""
        try:
            await self._tasks[1]
        finally:
            await self.cancel()

    async def cancel(self) -> None:
        """Stop injecting and watching. The watcher also ends on its own flag: it talks to
        the API server, and a cancellation must not be the only way out of that loop."""
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, timeout=10)
        await self._http.aclose()

    # -- watching the cluster -------------------------------------------------------------------

    async def observe(self) -> Sample | None:
        kube = self.sandbox.kube
        assert kube is not None
        pool = self.pool
        try:
            deps = await kube.list("Deployment", pool.namespace,
                                   label_selector=f"{names.POOL_LABEL}={pool.name}")
            obj = await kube.get("InferencePool", pool.namespace, pool.name) or {}
        except Exception as exc:  # the API answers again next time; the run goes on
            log.warning("chaos watcher: reading the cluster failed: %s", exc)
            return None
        sizes = {}
        for d in deps:
            role = (d["metadata"].get("labels") or {}).get(names.ROLE_LABEL)
            if role in names.ROLES:
                c = workloads.counts(d)
                sizes[role] = (c.desired, c.ready)
        status = obj.get("status") or {}
        desired: dict[str, int | None] = {r: (status.get(r) or {}).get("desiredReplicas")
                                          for r in pool.spec.engine_roles()}
        cond = next((c for c in status.get("conditions") or []
                     if c.get("type") == "MetricsAvailable"), None)
        s = Sample(time.monotonic(), sizes, desired, cond.get("status") if cond else None)
        self.samples.append(s)
        return s

    async def _watch(self) -> None:
        while not self._stop.is_set():
            await self.observe()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), WATCH_PERIOD_S)

    # -- faults ---------------------------------------------------------------------------------

    async def _inject_all(self) -> None:
        ready_at = self.t0
        for fault in self.faults:
            due = max(self.t0 + fault.at_s / self.speed, ready_at)
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            rec = C.FaultRecord(fault)
            self.records.append(rec)
            try:
                await self._one(rec)
            except Exception as exc:  # one fault's trouble must not stop the run
                log.exception("chaos fault %s failed", fault.kind)
                rec.problem = rec.problem or f"{type(exc).__name__}: {exc}"
            ready_at = time.monotonic() + C.MIN_GAP_S / self.speed

    async def _one(self, rec: C.FaultRecord) -> None:
        kind = rec.fault.kind
        if kind in C.INFRA:
            await self._infra(rec)
        elif C.alive_fault(kind):
            await self._alive(rec)
        else:
            await self._pod(rec)

    async def _infra(self, rec: C.FaultRecord) -> None:
        sb, kind = self.sandbox, rec.fault.kind
        rec.bound_s = C.recovery_bound_s(rec.fault, self.bounds)
        rec.target = kind
        before = set(await self.pods() or {})
        killed = time.monotonic()
        if kind == "prometheus":
            await asyncio.to_thread(sb.stop_prometheus, True)
        else:
            child = sb.operator if kind == "operator" else sb.autoscaler
            if child is None:
                rec.problem = f"no {kind} running"
                return
            child.signal_group(signal.SIGKILL)
            while child.alive():
                await asyncio.sleep(0.02)
            sb.procs.forget(child)
        rec.injected_s = self.sim(killed)
        log.info("chaos: killed %s at t=%.1fs; down for %.0fs", kind, rec.injected_s,
                 rec.fault.down_s)
        await asyncio.sleep(rec.fault.down_s / self.speed)
        if kind == "prometheus":
            await asyncio.to_thread(sb.restart_prometheus)
        else:
            sb.restart(kind)
        restored = time.monotonic()
        rec.restored_s = self.sim(restored)
        await self._until_recovered(rec, killed, lambda: self._serving(kind, restored, rec),
                                    before)
        if kind == "prometheus":
            during = [s for s in self.samples if killed <= s.t <= restored]
            rec.metrics_unavailable_seen = any(s.metrics_available == "False" for s in during)

    async def _serving(self, kind: str, restored: float, rec: C.FaultRecord) -> bool:
        sb = self.sandbox
        if kind == "operator":
            url = f"http://127.0.0.1:{sb.operator_health_port}/healthz"
        elif kind == "autoscaler":
            url = f"http://127.0.0.1:{sb.autoscaler_metrics_port}/metrics"
        else:
            assert sb.prometheus is not None
            url = f"{sb.prometheus.url}/-/ready"
        try:
            if (await self._http.get(url)).status_code != 200:
                return False
        except httpx.HTTPError:
            return False
        if kind == "prometheus":
            # The autoscaler has seen metrics again since the restart.
            back = next((s for s in self.samples if s.t >= restored
                         and s.metrics_available == "True"), None)
            if back is None:
                return False
            rec.serving_s = self.sim(back.t)
        elif rec.serving_s is None:
            rec.serving_s = self.sim(time.monotonic())
        return True

    async def _running(self, kind: str) -> tuple[str, dict[str, Any]]:
        """The pod-name prefix of the fault's role, and its serving pods: ready, the process
        alive, not on its way out (a scale-down's victim)."""
        ctl = self.sandbox.controller
        assert ctl is not None
        prefix = names.child_name(self.pool.name, C.pod_role(kind)) + "-"
        kube = self.sandbox.kube
        assert kube is not None
        leaving = {p["metadata"]["name"] for p in await kube.list("Pod", self.pool.namespace)
                   if p["metadata"].get("deletionTimestamp")}
        return prefix, {rt.name: rt for rt in ctl.kubelet.runtimes.values()
                        if rt.namespace == self.pool.namespace and rt.name.startswith(prefix)
                        and rt.ready and not rt.terminating and rt.name not in leaving
                        and rt.child is not None and rt.child.alive()}

    async def _alive(self, rec: C.FaultRecord) -> None:
        """A hung or slow engine: stop it (slow it) for the fault's hold, then let it go, and
        wait for the pool to be whole again."""
        ctl = self.sandbox.controller
        assert ctl is not None
        what, _ = C.alive_fault(rec.fault.kind) or ("", "")
        _, running = await self._running(rec.fault.kind)
        name = rec.fault.choose(list(running))
        if name is None:
            rec.problem = f"no ready {C.pod_role(rec.fault.kind)} pod"
            return
        rt = running[name]
        child = rt.child
        assert child is not None
        rec.target = name
        # A hung sole engine hides the demand as a dead one does (its role serves nothing, its
        # metrics cannot be scraped); a slow one is measured, and scaling up for it is right.
        rec.sole = what == "hung" and len(running) == 1
        rec.bound_s = C.recovery_bound_s(rec.fault, self.bounds, rt.restarts)
        before = set(await self.pods() or {})
        url = self._engine_url(rt)
        if what == "slow" and url is None:
            rec.problem = f"{name}: no port to reach the engine on"
            return
        start = time.monotonic()
        try:
            if what == "hung":
                child.signal_group(signal.SIGSTOP)
            else:
                r = await self._http.post(f"{url}/sim/fault", json={"slowdown": C.SLOWDOWN})
                if r.status_code != 200:  # not the engine simulator (a real vLLM: 404)
                    rec.problem = f"{name}: POST /sim/fault answered {r.status_code}"
                    return
            rec.injected_s = self.sim(start)
            log.info("chaos: %s pod %s at t=%.1fs for %.0fs", "stopped" if what == "hung"
                     else f"slowed {C.SLOWDOWN:g}x", name, rec.injected_s, rec.fault.down_s)
            await asyncio.sleep(rec.fault.down_s / self.speed)
        finally:
            # let it go on every path (a cancelled run too); a restarted process never saw it
            if what == "hung":
                if child.alive():
                    with contextlib.suppress(ProcessLookupError):
                        child.signal_group(signal.SIGCONT)
            elif rec.injected_s is not None:
                with contextlib.suppress(httpx.HTTPError):
                    await self._http.post(f"{url}/sim/fault", json={"slowdown": 1.0})
        rec.restored_s = self.sim(time.monotonic())

        async def back() -> bool:
            now_rt = ctl.kubelet.runtimes.get((self.pool.namespace, name))
            if now_rt is None:  # deleted meanwhile (scaled down)
                rec.serving_s = rec.serving_s or rec.restored_s
                return True
            serving = (now_rt.child is not None and now_rt.child.alive() and now_rt.ready
                       and not now_rt.terminating)
            if serving and rec.serving_s is None:
                rec.serving_s = self.sim(time.monotonic())
            return serving

        await self._until_recovered(rec, start, back, before)

    @staticmethod
    def _engine_url(rt: Any) -> str | None:
        """http://IP:PORT of a pod's engine, from its probe (the port vLLM serves on)."""
        probe = P.probe_url(rt.container, rt.ip)
        if probe is None:
            return None
        u = urlsplit(probe)
        return f"{u.scheme}://{u.netloc}"

    async def _pod(self, rec: C.FaultRecord) -> None:
        ctl = self.sandbox.controller
        assert ctl is not None
        prefix, running = await self._running(rec.fault.kind)
        name = rec.fault.choose(list(running))
        if name is None:
            rec.problem = f"no ready {rec.fault.kind} pod"
            return
        rt = running[name]
        assert rt.child is not None
        before_restarts, before_start = rt.restarts, rt.started_at
        rec.target = name
        rec.sole = len(running) == 1  # no other ready pod of the role serves meanwhile
        rec.bound_s = C.recovery_bound_s(rec.fault, self.bounds, before_restarts)
        before = set(await self.pods() or {})
        killed = time.monotonic()
        rt.child.signal_group(signal.SIGKILL)
        rec.injected_s = self.sim(killed)
        log.info("chaos: killed pod %s at t=%.1fs", name, rec.injected_s)

        async def back() -> bool:
            now_rt = ctl.kubelet.runtimes.get((self.pool.namespace, name))
            if now_rt is None:  # deleted meanwhile (scaled down): nothing to restart
                rec.restored_s = rec.restored_s or self.sim(time.monotonic())
                rec.serving_s = rec.serving_s or rec.restored_s
                return True
            if now_rt.started_at > before_start and rec.restored_s is None:
                rec.restored_s = self.sim(now_rt.started_at)
            # Serving again: a new process (started after the kill), alive and ready.
            serving = (now_rt.restarts > before_restarts and now_rt.started_at > before_start
                       and now_rt.child is not None and now_rt.child.alive() and now_rt.ready)
            # The role is whole again once any of its pods is ready (the killed one, or one
            # that was starting when it died).
            role_ready = any(r.ready and not r.terminating for r in ctl.kubelet.runtimes.values()
                             if r.namespace == self.pool.namespace and r.name.startswith(prefix)
                             and (r.name != name or serving))
            if rec.serving_s is None and (serving or (rec.sole and role_ready)):
                rec.serving_s = self.sim(time.monotonic())
            return serving

        await self._until_recovered(rec, killed, back, before)

    async def pods(self) -> dict[str, bool] | None:
        """The pool's pods that are not being deleted -> Ready, as the API shows them."""
        kube = self.sandbox.kube
        assert kube is not None
        try:
            items = await kube.list("Pod", self.pool.namespace,
                                    label_selector=f"{names.POOL_LABEL}={self.pool.name}")
        except Exception as exc:
            log.warning("chaos watcher: listing pods failed: %s", exc)
            return None
        return {p["metadata"]["name"]: any(
                    c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (p.get("status") or {}).get("conditions") or [])
                for p in items if not p["metadata"].get("deletionTimestamp")}

    async def routers_ready(self) -> bool:
        """The pool as its clients reach it is whole: every ready router answers /ready (it
        has an admitted engine of every role). Kubernetes shows a restarted pod ready before
        its EndpointSlice, and the routers' watch of it, have caught up."""
        urls = self.sandbox.router_urls(self.pool)
        if not urls:
            return False
        for url in urls:
            try:
                if (await self._http.get(url.removesuffix("/v1") + "/ready")).status_code != 200:
                    return False
            except httpx.HTTPError:
                return False
        return True

    async def _until_recovered(self, rec: C.FaultRecord, killed: float,
                               serving: Callable[[], Any], before: set[str]) -> None:
        """Poll until the component serves, and then the cluster shows the pool healed: the
        autoscaler's desired replicas asked for, and every pod that existed at the kill ready
        again (or removed by a scale-down). Pods created after the kill, the autoscaler's new
        orders, may still be loading. Give up at the fault's bound."""
        deadline = killed + rec.bound_s / self.speed
        while time.monotonic() < deadline:
            if await serving():
                s = await self.observe()
                pods = await self.pods()
                if (s is not None and pods is not None and s.asked_as_desired(self.autoscaled)
                        and all(pods.get(name, True) for name in before)
                        and await self.routers_ready()):
                    rec.recovered_s = self.sim(time.monotonic())
                    log.info("chaos: %s back at t=%.1fs (%.1fs after the kill, bound %.0fs)",
                             rec.fault.kind, rec.recovered_s, rec.recovery_s, rec.bound_s)
                    return
            await asyncio.sleep(WATCH_PERIOD_S)
        log.warning("chaos: %s (%s) not back within %.0fs", rec.fault.kind, rec.target,
                    rec.bound_s)

    # -- report ---------------------------------------------------------------------------------

    def outcomes(self, results: Sequence[Any]) -> list[C.ChaosRequest]:
        return [C.ChaosRequest(sent_s=self.sim(r.sent_at) if r.sent_at else r.arrival_s,
                          finished_s=self.sim(r.finished_at) if r.finished_at else None,
                          ok=r.ok, output_tokens=r.output_tokens, max_tokens=r.max_tokens,
                          error=r.error,
                          token_s=tuple(self.sim(t) for t in r.token_times))
                for r in results]

    def section(self, results: Sequence[Any], trace_len: int,
                events: Sequence[dict[str, Any]]) -> dict[str, Any]:
        slo = self.pool.spec.slo
        targets = C.Targets(ttft_s=slo.ttft.seconds, itl_s=slo.itl.seconds,
                            allowance_s=C.WAIT_ALLOWANCE_REAL_S * self.speed,
                            min_deadline_s=MIN_DEADLINE_S * self.speed)
        out = C.section(self.seed, self.records, self.outcomes(results), trace_len, events,
                        self.down_window_s, self.bounds.interval_s,
                        DECISION_LAG_REAL_S * self.speed, targets,
                        # a scrape that times out (its timeout is the interval), then the
                        # recording rules' evaluation: a hung engine's series gone
                        seen_hung_s=3 * self.bounds.scrape_s)
        out["bound"] = ("kill -> component serving, the autoscaler's desired replicas asked "
                        "for, every pod that existed at the kill ready again, within: downtime "
                        "(infra) or kubelet back-off (pods) + one cold start + 2 autoscaler "
                        "intervals + 2 scrapes (+ 2 after Prometheus) + "
                        f"{C.STARTUP_ALLOWANCE_REAL_S:g} real seconds x speed; a hung or slow "
                        "engine: its hold + a kubelet back-off in place of the downtime")
        out["hung_wait_bound"] = (
            "a hung engine: every request waiting during the stop hears from the pool (a "
            "token, its answer or an error) within the TTFT target + one router deadline: "
            f"{C.PREFILL_DEADLINE_TTFTS:g} x TTFT target (prefill), {C.DECODE_STALL_ITLS:g} x "
            f"ITL target (decode, aggregated), + {C.WAIT_ALLOWANCE_REAL_S:g} real seconds x "
            f"speed; here prefill {targets.wait_bound_s(Role.PREFILL):g}s, "
            f"decode {targets.wait_bound_s(Role.DECODE):g}s")
        out["watch"] = [
            {"t": self.sim(s.t), "sizes": {r: list(v) for r, v in s.sizes.items()},
             "desired": s.desired, "metrics_available": s.metrics_available}
            for i, s in enumerate(self.samples)
            if i == 0 or (s.sizes, s.desired, s.metrics_available)
            != (self.samples[i - 1].sizes, self.samples[i - 1].desired,
                self.samples[i - 1].metrics_available)
        ]
        return out


def check_args(args: argparse.Namespace, engine_roles: Sequence[str]) -> None:
    """A bad --chaos-faults is a usage error (exit 2) before anything starts."""
    if getattr(args, "chaos", None) is not None and args.chaos_faults:
        C.parse_kinds(args.chaos_faults, engine_roles)


def tables(section: dict[str, Any]) -> list[Any]:
    from . import chaos_report

    return chaos_report.tables(section)


def prepare(sandbox: Sandbox, pool: AppliedPool, args: argparse.Namespace,
            trace_span_s: float) -> ChaosRun | None:
    """The chaos run `--chaos SEED` asks for (None without it): faults spread over the
    trace's span. Raises ValueError for a bad --chaos-faults."""
    if getattr(args, "chaos", None) is None:
        return None
    roles = pool.spec.engine_roles()
    kinds = (C.parse_kinds(args.chaos_faults, roles) if args.chaos_faults
             else C.default_kinds(roles))
    span = max(trace_span_s, 60.0)  # a very short trace: the faults run on past it
    faults = C.plan(args.chaos, kinds, 0.05 * span, 0.9 * span)
    return ChaosRun(sandbox, pool, args.chaos, faults)


def conclude(run: ChaosRun, out: dict[str, Any], results: Sequence[Any], trace_len: int
             ) -> dict[str, Any]:
    """The chaos section of a finished run, into report.json and chaos.png; returned too."""
    from . import chaos_report

    section = run.section(results, trace_len, out.get("scale_events") or [])
    out_dir = run.sandbox.cfg.out_dir
    chaos_report.add_to_report(out, section, out_dir)
    chaos_report.write_plot(out_dir, section, run.outcomes(results),
                            float(out.get("duration_s") or 0.0))
    return section
