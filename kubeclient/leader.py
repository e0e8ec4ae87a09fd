"""Leader election on a coordination.k8s.io Lease (kubernetes_asyncio's LeaderElection).

Several replicas campaign; the one holding the Lease runs `work`, renewing every
`retry_s`. A leader that cannot renew for `renew_s` stops its work; a follower takes over once
it has seen the same Lease record for `lease_s` (a killed leader: within `lease_s` plus one
retry). `renew_s < lease_s` is what keeps two from acting at once: the old leader has stopped
before anyone may take over. On a clean stop the leader releases the Lease (empty holder), so
a rolling update hands over at once instead of after a lease.

API calls: get, create and update (replace) of one Lease, each with the shared client's
timeout (an API server that hangs must not keep a leader believing it still leads).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.leaderelection.electionconfig import Config
from kubernetes_asyncio.leaderelection.leaderelection import LeaderElection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock
from poolpilot.kubeclient.client import KubeClient

log = logging.getLogger("poolpilot.kubeclient.leader")


class _Lock(LeaseLock):
    """The library's Lease lock, with no-answer failures reported as a failed attempt (the
    library expects ApiException only; a timeout would end the election)."""

    async def get(self, name: str, namespace: str) -> Any:
        try:
            return await super().get(name, namespace)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            err = ApiException(status=0, reason=f"{type(exc).__name__}: {exc}")
            err.body = json.dumps({"code": 0, "message": str(exc)}).encode()
            return False, err

    async def create(self, name: str, namespace: str, election_record: Any) -> bool:
        try:
            return bool(await super().create(name, namespace, election_record))
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        try:
            return bool(await super().update(name, namespace, updated_record))
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False


async def lead(
    kube: KubeClient,
    *,
    name: str,
    namespace: str,
    identity: str,
    work: Callable[[], Awaitable[None]],
    stop: asyncio.Event,
    lease_s: int = 15,
    renew_s: float = 10.0,
    retry_s: float = 2.0,
    on_change: Callable[[bool], None] | None = None,
) -> None:
    """Campaign for the Lease `namespace/name` until `stop`; run `work` while leading."""
    leading = False
    working: asyncio.Task[Any] | None = None

    def changed(now: bool) -> None:
        nonlocal leading
        if now != leading:
            leading = now
            log.info("%s %s the lease %s/%s", identity, "holds" if now else "lost", namespace,
                     name)
            if on_change is not None:
                on_change(now)

    async def started() -> None:
        nonlocal working
        working = asyncio.current_task()
        changed(True)
        await work()

    async def stopped() -> None:
        changed(False)

    lock = _Lock(name, namespace, identity, kube.api_client)
    # The library writes leaseDurationSeconds as it was given: it must be whole seconds.
    config = Config(lock, lease_s, renew_s, retry_s, started, stopped)
    log.info("%s campaigns for the lease %s/%s", identity, namespace, name)
    while not stop.is_set():
        election = asyncio.create_task(LeaderElection(config).run())
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({election, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if election in done:  # leadership lost (or never held and failed): campaign again
            waiter.cancel()
            if (exc := election.exception()) is not None:
                log.warning("leader election failed: %r; campaigning again", exc)
            await asyncio.sleep(retry_s)
            continue
        election.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await election
    if working is not None and not working.done():  # `work` ends on `stop` by itself
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(working, timeout=renew_s)
    if leading:
        await release(kube, name, namespace, identity)
        changed(False)


async def release(kube: KubeClient, name: str, namespace: str, identity: str) -> None:
    """Give the Lease up (holder emptied) if `identity` still holds it."""
    from poolpilot.kubeclient.errors import ApiError

    try:
        lease = await kube.get("coordination.k8s.io/v1", "Lease", namespace, name)
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != identity:
            return
        lease["spec"]["holderIdentity"] = ""
        lease["spec"]["leaseDurationSeconds"] = 1
        await kube.replace(lease)
        log.info("%s released the lease %s/%s", identity, namespace, name)
    except ApiError as exc:  # the others take over after the lease instead
        log.warning("could not release the lease %s/%s: %s", namespace, name, exc)
