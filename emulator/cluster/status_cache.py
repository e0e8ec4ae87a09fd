"""Status writes without no-op patches: the cluster's controllers run a pass every quarter
second, and re-patching an unchanged status would flood the API and its watchers."""

from __future__ import annotations

import json
from typing import Any

from .kubeapi import ControllerApi


class StatusCache:
    def __init__(self, kube: ControllerApi) -> None:
        self.kube = kube
        self._written: dict[tuple[str, str, str], str] = {}

    async def write(self, kind: str, obj: dict[str, Any], status: dict[str, Any],
                    force: bool = False) -> None:
        """Patch `obj`'s status subresource unless this exact status was the last one written
        (`force`: the object's stored status differs, e.g. someone else reset it)."""
        meta = obj["metadata"]
        key = (kind, meta["namespace"], meta["name"])
        text = json.dumps(status, sort_keys=True)
        if not force and self._written.get(key) == text:
            return
        await self.kube.merge_patch(kind, meta["namespace"], meta["name"], {"status": status},
                                    sub="status")
        self._written[key] = text
