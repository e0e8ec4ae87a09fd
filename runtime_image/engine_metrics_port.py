"""vLLM's /metrics on a port of its own: `poolpilot launch --metrics-port P` loads this module
into vLLM's API server as an ASGI middleware (vLLM's `--middleware`), which starts a
prometheus_client HTTP server on P serving the same registry as vLLM's own /metrics.

Why: Prometheus, in another namespace, must reach an engine's metrics, but not its serving
port (no authentication: whoever reaches it can send prompts and read KV handoffs). With
metrics on their own port, a NetworkPolicy lets the monitoring namespace reach that port only.
vLLM keeps /metrics on its serving port too (the router reads queue lengths there, from
inside the pool).

Runs inside vLLM's Python, which may not have poolpilot installed (a separate venv): the
launcher puts this file's folder on PYTHONPATH and this module imports nothing of poolpilot.
The port and address come from the environment the launcher sets.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

PORT_ENV = "POOLPILOT_ENGINE_METRICS_PORT"
HOST_ENV = "POOLPILOT_ENGINE_METRICS_HOST"

log = logging.getLogger("poolpilot.engine_metrics_port")
_started = threading.Lock()
_server: Any = None


def _registry() -> Any:
    """vLLM's registry: the multiprocess one when its API servers share metrics
    (PROMETHEUS_MULTIPROC_DIR), else the default (what vLLM's own /metrics serves)."""
    try:
        from vllm.v1.metrics.prometheus import get_prometheus_registry

        return get_prometheus_registry()
    except ImportError:
        from prometheus_client import REGISTRY

        return REGISTRY


def start(port: int, host: str) -> bool:
    """Serve /metrics on host:port once per process; False when another API server process
    of this engine serves it already (the port is taken)."""
    global _server
    with _started:
        if _server is not None:
            return True
        from prometheus_client import start_http_server

        try:
            _server, _ = start_http_server(port, addr=host, registry=_registry())
        except OSError as exc:
            log.info("metrics port %s:%d not bound here (%s)", host, port, exc)
            return False
        log.info("vLLM metrics on http://%s:%d/metrics", host, port)
        return True


class MetricsPort:
    """The middleware vLLM instantiates when it builds its app (at start-up): it starts the
    metrics server and passes every request through untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app
        port = os.environ.get(PORT_ENV)
        if port:
            start(int(port), os.environ.get(HOST_ENV, "0.0.0.0"))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
