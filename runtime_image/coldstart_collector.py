"""The cold-start phases on vLLM's own /metrics: `poolpilot launch` loads this module into
vLLM's API server as an ASGI middleware (vLLM's `--middleware`, a pass-through), which
registers a collector with prometheus_client's default registry, the one vLLM serves. At
each scrape the collector reads the file the launcher's log watcher writes once the engine is
ready (POOLPILOT_COLD_START_FILE: {"phases": {phase: seconds}, "compile_cache_hit": 1|0|null})
and yields its gauges; before that, nothing.

Runs inside vLLM's Python, which may not have poolpilot installed (a separate venv): the
launcher puts this file's folder on PYTHONPATH, and this module imports nothing of poolpilot
(the names below are poolpilot.metrics', which a test keeps equal). With several API servers
(vLLM's multiprocess metrics) vLLM serves another registry, and the phases are not shown.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Any

FILE_ENV = "POOLPILOT_COLD_START_FILE"
ENGINE_COLD_START = "poolpilot_engine_cold_start_seconds"
ENGINE_COMPILE_CACHE_HIT = "poolpilot_engine_compile_cache_hit"

_lock = threading.Lock()
_registered = False


def read(path: str | None) -> tuple[dict[str, float], float | None]:
    """The phases and the cache gauge from the watcher's file ({} and None until it exists;
    a file that is not what the watcher writes counts as none)."""
    if not path:
        return {}, None
    try:
        with open(path) as f:
            doc = json.load(f)
        phases = {str(k): float(v) for k, v in (doc.get("phases") or {}).items()}
        hit = doc.get("compile_cache_hit")
        return phases, None if hit is None else float(hit)
    except (OSError, ValueError, TypeError, AttributeError):
        return {}, None


class PhasesCollector:
    def __init__(self, path: str | None) -> None:
        self.path = path

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        phases, hit = read(self.path)
        if phases:
            g = GaugeMetricFamily(ENGINE_COLD_START, "Seconds each phase of this engine's cold "
                                  "start took (phase total: the container's start to the first "
                                  "/health 200)", labels=["phase"])
            for phase, seconds in phases.items():
                g.add_metric([phase], seconds)
            yield g
        if hit is not None:
            yield GaugeMetricFamily(ENGINE_COMPILE_CACHE_HIT, "1 when torch.compile loaded every "
                                    "graph from vLLM's compile cache, 0 when it compiled",
                                    value=hit)

    def describe(self) -> list[Any]:
        return []  # names known only once the file exists: not checked at registration


def register(registry: Any = None) -> None:
    """Register the collector once (vLLM may build its app more than once)."""
    global _registered
    with _lock:
        if _registered:
            return
        if registry is None:
            from prometheus_client import REGISTRY

            registry = REGISTRY
        registry.register(PhasesCollector(os.environ.get(FILE_ENV)))
        _registered = True


class ColdStartMetrics:
    """The ASGI middleware vLLM loads: passes every request through unchanged."""

    def __init__(self, app: Any) -> None:
        self.app = app
        register()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
