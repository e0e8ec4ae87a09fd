"""Thin Kopf handlers: one reconcile for create/update/resume and a timer for drift.

Both parse the spec with pydantic, call the reconcile service, patch the operator's part of the
status and post Events for transitions. Kopf's memo holds two typed objects: the process's
(`Process`: the API client, discovery, the reconcile slots, the metrics), shared by every pool,
and each pool's own (`PoolMemory`: its lock, which keeps the timer and the change handler from
overlapping, its backoff and its last status write).

    registry = kopf.OperatorRegistry()
    register(registry, OperatorConfig(kubeconfig=..., drift_interval=30))
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import kopf
from poolpilot.kubeclient import credentials
from poolpilot.operator import builders, gateway_objects, model_cache, reconcile, retry, status
from poolpilot.operator import metrics as opmetrics
from poolpilot.operator.kubeapi import ApiError, Discovered, KubeApi
from poolpilot.operator.metrics import OperatorMetrics

from poolpilot import api, names
from poolpilot.roles import Role
from poolpilot.validate import InvalidPool, parse_spec


@dataclass(frozen=True)
class OperatorConfig:
    """How the operator runs; tests shorten the intervals."""

    kubeconfig: str | None = None
    drift_interval: float = 30.0  # seconds between drift checks per pool
    cutover_poll: float = 5.0  # how often a mode switch re-checks the new engines
    request_timeout: float = 10.0  # per API request
    watch_timeout: float = 300.0  # server-side watch timeout; Kopf reconnects after it
    peering_lifetime: int = 60  # seconds a silent peer is considered alive (HA failover time)
    peering_name: str = "poolpilot"  # KopfPeering/ClusterKopfPeering object shared by replicas
    peering_mandatory: bool = False  # False: peer when the kopf.dev CRDs exist, else standalone
    identity: str = ""  # appended to the User-Agent (tells HA replicas apart in API logs)
    # Pools reconciled at once. Unbounded, 1,000 new pools would put 20,000 requests in flight,
    # every one would time out in the API server's queue and every retry start over.
    max_concurrent_reconciles: int = 16
    # Extra labels on the per-pool ServiceMonitor/PodMonitor (--monitor-label).
    monitor_labels: tuple[tuple[str, str], ...] = ()
    # NetworkPolicies for pools whose spec.networkPolicy.enabled is unset (on unless
    # --no-network-policies).
    network_policies: bool = True
    # Routers of pools without spec.router.apiKeySecret read a key from a Secret the operator
    # creates (--router-auth; on in the chart).
    router_auth: bool = False
    # Backoff after a permanent API error (403, 422, quota): first wait, doubling up to the max.
    permanent_backoff: tuple[float, float] = (retry.PERMANENT_FIRST_S, retry.PERMANENT_MAX_S)


@dataclass
class Process:
    """What every pool's reconcile shares. Kopf gives each pool a shallow copy of the startup
    memo, so this one object is seen, and updated (`closing`), by all of them."""

    kube: KubeApi
    discovered: Discovered
    slots: asyncio.Semaphore  # --max-concurrent-reconciles
    metrics: OperatorMetrics
    closing: bool = False  # shutting down: the API client is closed


@dataclass
class PoolMemory:
    """One pool's state between its reconciles."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    generation: int | None = None
    failures: int = 0  # permanent API errors in a row (the backoff's exponent)
    retry_at: float = 0.0  # monotonic time before which a permanent error is not retried
    last_written: dict[str, Any] | None = None  # the pool as our last status write returned it
    result: str = opmetrics.NO_OP  # how the last reconcile ended (the metrics' label)


# Kopf's memo is an untyped dict: these are its only keys, read and written only through the
# typed helpers below.
_PROCESS, _POOL = "process", "pool"


def _start_process(memo: kopf.Memo, process: Process) -> None:
    memo[_PROCESS] = process


def _process(memo: kopf.Memo) -> Process:
    process: Process = memo[_PROCESS]
    return process


def _process_if_started(memo: kopf.Memo) -> Process | None:
    process: Process | None = memo.get(_PROCESS)
    return process


def _pool_memory(memo: kopf.Memo) -> PoolMemory:
    pool: PoolMemory = memo.setdefault(_POOL, PoolMemory())
    return pool


def configure(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    settings.networking.request_timeout = config.request_timeout
    settings.networking.connect_timeout = config.request_timeout
    settings.watching.server_timeout = config.watch_timeout
    settings.watching.client_timeout = config.watch_timeout + 10
    settings.watching.connect_timeout = config.request_timeout
    settings.peering.lifetime = config.peering_lifetime
    settings.peering.name = config.peering_name
    settings.peering.mandatory = config.peering_mandatory
    # Only explicit kopf.event() calls become Events (transitions and API refusals, see
    # _api_failed), never log lines: one per retry would flood `kubectl describe`.
    settings.posting.loggers = False
    # Retries of a failed Event post itself.
    settings.posting.default_backoffs = (1, 1, 2, 3, 5, 8, 13)
    # A pool deleted while its drift timer reconciles keeps Kopf's finalizer until the timer
    # has exited, and Kopf looks again only after this many seconds (60 by default: a
    # `kubectl delete` that waits a minute for a reconcile that ends in one second).
    settings.background.cancellation_polling = 1.0


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rv(body: Any) -> int:
    try:
        return int((body or {}).get("metadata", {}).get("resourceVersion", 0))
    except (TypeError, ValueError):
        return 0


def _previous_status(body: kopf.Body, memory: PoolMemory) -> dict[str, Any]:
    """The freshest status we know: the watched body, or our own last write if newer (the
    watch event of that write may not have arrived yet; re-writing it would not be a no-op)."""
    seen = memory.last_written
    if seen is not None and _rv(seen) > _rv(body):
        return dict(seen.get("status") or {})
    return dict(body.get("status") or {})


async def _write_status(kube: KubeApi, body: kopf.Body, memory: PoolMemory,
                        new: dict[str, Any], previous: dict[str, Any]) -> None:
    patch = status.merge_patch(previous, new)
    if patch is None:
        return
    written = await kube.patch_status(body["metadata"]["namespace"], body["metadata"]["name"],
                                      {"status": patch})
    memory.last_written = written


def _post(body: kopf.Body, events: list[status.EventSpec]) -> None:
    for ev in events:
        kopf.event(body, type=ev.type, reason=ev.reason, message=ev.message)


def _outcome_events(outcome: reconcile.ReconcileResult) -> list[status.EventSpec]:
    out = []
    if outcome.created:
        out.append(status.EventSpec("Normal", "Created", "created " + ", ".join(outcome.created)))
    if outcome.updated:
        out.append(status.EventSpec("Normal", "Updated", "applied the new spec to "
                                    + ", ".join(outcome.updated)))
    if outcome.repaired:
        out.append(status.EventSpec("Warning", "DriftRepaired", "restored "
                                    + ", ".join(outcome.repaired)
                                    + " to the pool's spec (it was changed or deleted)"))
    if outcome.deleted:
        out.append(status.EventSpec("Normal", "Removed", "removed " + ", ".join(outcome.deleted)))
    return out


async def handle(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger | Any, *,
                 from_timer: bool, config: OperatorConfig) -> None:
    """Reconcile one pool: children, then status. Shared by the change handler and the timer."""
    process, memory = _process(memo), _pool_memory(memo)
    if process.closing:
        return  # shutting down: the API client is closed
    metrics = process.metrics
    trigger = "timer" if from_timer else "change"
    async with memory.lock:
        metrics.queued.inc()
        try:
            await process.slots.acquire()
        finally:
            metrics.queued.dec()
        metrics.active.inc()
        start = time.monotonic()
        memory.result = opmetrics.API_ERROR  # what an unexpected exception out of it means
        try:
            await _handle_locked(body, process, memory, logger, from_timer=from_timer,
                                 config=config)
        finally:
            process.slots.release()
            metrics.active.dec()
            metrics.duration.labels(trigger).observe(time.monotonic() - start)
            metrics.reconciles.labels(trigger, memory.result).inc()


async def _handle_locked(body: kopf.Body, process: Process, memory: PoolMemory,
                         logger: logging.Logger | Any, *, from_timer: bool,
                         config: OperatorConfig) -> None:
    kube = process.kube
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    if meta.get("deletionTimestamp"):
        memory.result = opmetrics.POOL_GONE
        return  # being deleted: the collector removes the children, nothing to converge
    generation = int(meta.get("generation", 0))
    if memory.generation != generation:  # a new spec: no backoff carried over
        memory.generation, memory.failures, memory.retry_at = generation, 0, 0.0
    wait = memory.retry_at - time.monotonic()
    if wait > 0:  # backing off after a permanent API error
        memory.result = opmetrics.BACKING_OFF
        if from_timer:
            return
        raise kopf.TemporaryError("backing off after a permanent API error", delay=wait)
    previous = _previous_status(body, memory)
    endpoint = names.router_endpoint(name, namespace)
    caps = reconcile.capabilities(process.discovered, config.monitor_labels,
                                  config.network_policies, config.router_auth)
    try:
        spec = parse_spec(dict(body.get("spec") or {}))
    except InvalidPool as exc:
        result = status.compute_status(generation=generation, roles=[], pods=[],
                                       previous=previous, endpoint=endpoint, now=_now(),
                                       invalid=exc.errors)
        try:
            await _write_status(kube, body, memory, result.status, previous)
        except ApiError as err:
            await _api_failed(err, body, process, memory, logger, None, caps, config,
                              from_timer=from_timer, writing_status=True)
            return
        _succeeded(memory)
        memory.result = opmetrics.INVALID_SPEC
        _post(body, result.events)
        logger.warning("%s/%s: invalid spec, children left as they are: %s", namespace, name,
                       "; ".join(exc.errors))
        if not from_timer:
            raise kopf.PermanentError("; ".join(exc.errors)) from None
        return
    pool = builders.Pool(name=name, namespace=namespace, spec=spec, uid=meta.get("uid"))
    try:
        if reconcile.needs_leader_worker_set(spec) and not caps.leader_worker_set:
            # LWS may have been installed since we looked: look again (one GET /apis).
            process.discovered = await kube.discover()
            caps = dataclasses.replace(
                caps, leader_worker_set=process.discovered.leader_worker_set)
        if _gateway_apis_missing(spec, caps):
            # Their CRDs may have been installed since we looked: look again (one GET /apis).
            process.discovered = await kube.discover()
            caps = reconcile.capabilities(process.discovered, config.monitor_labels,
                                          config.network_policies, config.router_auth)
        outcome = await reconcile.reconcile(kube, pool, caps)
        roles = [*spec.engine_roles(), Role.ROUTER]
        observations = [status.RoleRollout.from_deployment(r, outcome.deployments.get(r))
                        for r in roles]
        # Pods only explain why a role is not settled; a settled pool skips the LIST.
        pods = ([] if all(o.settled for o in observations) else
                await kube.list("v1", "Pod", namespace, {names.POOL_LABEL: name}))
    except ApiError as exc:
        # Every write is an idempotent apply, so a retry finishes whatever a failed attempt
        # left half done.
        await _api_failed(exc, body, process, memory, logger, pool, caps, config,
                          from_timer=from_timer)
        return
    process.metrics.writes.inc(outcome.writes)
    if outcome.pool_gone:
        memory.result = opmetrics.POOL_GONE
        logger.info("%s/%s: the pool is being deleted; nothing to do", namespace, name)
        return
    _post(body, _outcome_events(outcome))
    if outcome.writes:
        logger.info("reconciled with %d writes: created=%s updated=%s repaired=%s deleted=%s",
                    outcome.writes, outcome.created, outcome.updated, outcome.repaired,
                    outcome.deleted)
    stale = tuple(r for r in names.ENGINE_ROLES if r not in roles)
    blocked = None
    if outcome.conflicts:
        blocked = status.Blocked(status.NAME_CONFLICT,
                                 reconcile.conflict_message(outcome.conflicts))
        logger.warning("%s/%s: %s", namespace, name, blocked.message)
    routed = (None if spec.gateway is None else
              gateway_objects.route_condition(pool, outcome.route, caps))
    result = status.compute_status(generation=generation, roles=observations, pods=pods,
                                   previous=previous, endpoint=endpoint, now=_now(),
                                   stale_roles=stale, blocked=blocked, routed=routed,
                                   unrouted=spec.gateway is None,
                                   model_cached=model_cache.cache_state(
                                       pool, outcome.model_cache, pods))
    try:
        await _write_status(kube, body, memory, result.status, previous)
    except ApiError as exc:
        exc.what = exc.what or "write the pool's status"
        await _api_failed(exc, body, process, memory, logger, pool, caps, config,
                          from_timer=from_timer, writing_status=True)
        return
    _succeeded(memory)
    memory.result = (opmetrics.NAME_CONFLICT if outcome.conflicts else
                     opmetrics.CONVERGED if outcome.writes else opmetrics.NO_OP)
    _post(body, result.events)
    if outcome.waiting and not from_timer:
        raise kopf.TemporaryError(f"mode switch: {outcome.waiting}", delay=config.cutover_poll)


def _gateway_apis_missing(spec: api.InferencePoolSpec, caps: builders.Capabilities) -> bool:
    gateway = spec.gateway
    return gateway is not None and not (
        caps.gateway_api and (caps.inference_pools or not gateway.inference_pool))


def _succeeded(memory: PoolMemory) -> None:
    memory.failures, memory.retry_at = 0, 0.0


async def _pool_gone(kube: KubeApi, body: kopf.Body) -> bool:
    meta = body["metadata"]
    try:
        live = await kube.get(api.API_VERSION, api.KIND, meta["namespace"], meta["name"])
    except ApiError:
        return False  # cannot tell: treat as present
    return (live is None or live["metadata"].get("uid") != meta.get("uid")
            or bool(live["metadata"].get("deletionTimestamp")))


async def _api_failed(exc: ApiError, body: kopf.Body, process: Process, memory: PoolMemory,
                      logger: logging.Logger | Any, pool: builders.Pool | None,
                      caps: builders.Capabilities, config: OperatorConfig, *, from_timer: bool,
                      writing_status: bool = False) -> None:
    """An API error while reconciling. Transient: retried in 2 s. Permanent (403, 422,
    quota): Degraded=True with the API's message, an Event, retries backing off from 5 s to
    5 min. A pool deleted meanwhile: nothing retried or reported, and children written for
    it after it was gone (its finalizer removed by hand) are deleted."""
    kube = process.kube
    meta = body["metadata"]
    where = f"{meta['namespace']}/{meta['name']}"
    if await _pool_gone(kube, body):
        memory.result = opmetrics.POOL_GONE
        removed = await reconcile.remove_orphans(kube, pool, caps) if pool is not None else []
        logger.info("%s: deleted while being reconciled (%s); removed %s", where, exc,
                    ", ".join(removed) or "nothing")
        return
    memory.result = opmetrics.API_ERROR
    process.metrics.api_errors.labels("transient" if exc.transient else "permanent").inc()
    memory.failures += 1
    first, ceiling = config.permanent_backoff
    wait = retry.delay(transient=exc.transient, failures=memory.failures, first=first,
                       ceiling=ceiling)
    if exc.transient:
        logger.warning("%s: API error, retrying in %.0fs: %s", where, wait, exc)
        raise kopf.TemporaryError(f"API error: {exc}", delay=wait)
    memory.retry_at = time.monotonic() + wait
    blocked = status.api_failure(exc.status, exc.message, exc.what)
    logger.error("%s: the API server refused to %s (HTTP %d %s): %s; retrying in %.0fs",
                 where, exc.what or "answer", exc.status, exc.reason, exc.message, wait)
    reported = False
    if not writing_status:
        previous = _previous_status(body, memory)
        result = status.compute_status(
            generation=int(meta.get("generation", 0)), roles=[], pods=[], previous=previous,
            endpoint=names.router_endpoint(meta["name"], meta["namespace"]), now=_now(),
            blocked=blocked)
        try:
            await _write_status(kube, body, memory, result.status, previous)
            _post(body, result.events)
            reported = True
        except ApiError as err:
            logger.error("%s: could not report it in the status either: %s", where, err)
    if not reported and memory.failures == 1:
        # The status cannot carry it: an Event is what `kubectl describe` still shows.
        _post(body, [status.EventSpec("Warning", blocked.reason, blocked.message)])
    if not from_timer:
        raise kopf.TemporaryError(f"{blocked.reason}: {blocked.message}", delay=wait)


def register(registry: kopf.OperatorRegistry, config: OperatorConfig,
             metrics: OperatorMetrics | None = None) -> None:
    """Register the operator's handlers into `registry` (no module-level state)."""
    metrics = metrics or OperatorMetrics()
    group, version, plural = api.GROUP, api.VERSION, api.PLURAL

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # Kopf's own client follows the same credential order as ours (kubeclient).
        source = credentials.resolve(config.kubeconfig)
        if source.in_cluster:
            return kopf.login_with_service_account(**kwargs)
        assert source.kubeconfig is not None
        os.environ["KUBECONFIG"] = source.kubeconfig  # what Kopf's kubeconfig login reads
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        configure(settings, config)
        kube = await KubeApi.connect(
            config.kubeconfig, timeout=config.request_timeout,
            user_agent=f"{names.FIELD_MANAGER}/{config.identity or 'main'}")
        process = Process(kube, await kube.discover(),
                          asyncio.Semaphore(config.max_concurrent_reconciles), metrics)
        _start_process(memo, process)
        if process.discovered.inference_pools:
            logging.getLogger("poolpilot.operator").warning(gateway_objects.KIND_CLASH_WARNING)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        process = _process_if_started(memo)
        if process is not None:
            process.closing = True
            await process.kube.close()

    @kopf.on.probe(id="api", registry=registry)
    async def probe(memo: kopf.Memo, **_: Any) -> int:
        """Liveness: the API is reachable (a wedged operator fails this and is restarted)."""
        kube = _process(memo).kube
        await kube.discover()
        return kube.writes

    @kopf.on.resume(group, version, plural, registry=registry)
    @kopf.on.create(group, version, plural, registry=registry)
    @kopf.on.update(group, version, plural, field="spec", registry=registry)
    async def reconcile_pool(body: kopf.Body, memo: kopf.Memo, logger: Any, **_: Any) -> None:
        await handle(body, memo, logger, from_timer=False, config=config)

    @kopf.timer(group, version, plural, interval=config.drift_interval,
                initial_delay=config.drift_interval, registry=registry)
    async def repair_drift(body: kopf.Body, memo: kopf.Memo, logger: Any, **_: Any) -> None:
        await handle(body, memo, logger, from_timer=True, config=config)
