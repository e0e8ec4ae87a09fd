"""The cluster's EndpointSlice controller: one slice per Service with a selector, listing its
pods' addresses with ready/serving/terminating conditions (pods.endpoint_slice), written only
when it changed. The routers discover their engines through these slices."""

from __future__ import annotations

import json
from collections.abc import Sequence

from . import pods as P
from .kubeapi import ControllerApi


class EndpointSlices:
    def __init__(self, kube: ControllerApi) -> None:
        self.kube = kube
        self._written: dict[tuple[str, str], str] = {}

    async def sync(self, views: Sequence[P.PodView]) -> None:
        for svc in await self.kube.list("Service"):
            if not svc["spec"].get("selector"):
                continue
            want = P.endpoint_slice(svc, views)
            meta = want["metadata"]
            key = (meta["namespace"], meta["name"])
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
