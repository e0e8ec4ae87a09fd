"""Run a real Prometheus server on loopback (for the sandbox and the adapter tests), and serve
synthetic /metrics pages for it to scrape (`MetricsPage`).

Targets are given through file_sd, so callers can add and remove scrape targets while it
runs (Prometheus re-reads the file within `refresh` seconds). Each target carries labels,
e.g. {"namespace": "sandbox", "pool": "demo", "role": "prefill"}, as the relabelling of a
real cluster's pod labels would give them.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml


class PrometheusNotInstalled(RuntimeError):
    pass


# Ports handed out below the kernel's ephemeral range (where the kernel picks the local port
# of every outgoing connection, and of a bind to port 0), and at least this one.
LOWEST_FREE_PORT = 10_000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ephemeral ports (Linux's default where it cannot be read)."""
    try:
        lo, hi = (int(x) for x in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return lo, hi


def free_port(host: str = "127.0.0.1") -> int:
    """A port no socket holds now, for a server started next. Not from the ephemeral range:
    between this check and the server's bind, any outgoing connection on the machine (the
    engines', the clients', Prometheus's scrapes) may get a port of that range as its own, and
    the server then fails with 'address already in use' (a fresh-clone CI run lost the
    sandbox's operator so). Below it only servers take ports, each through this function or a
    fixed one, and a port taken since is caught here: random picks, each checked by a bind."""
    lo, _ = ephemeral_ports()
    rng = random.SystemRandom()
    for _ in range(200 if lo - LOWEST_FREE_PORT >= 1000 else 0):
        port = rng.randrange(LOWEST_FREE_PORT, lo)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a kernel whose ephemeral range leaves no room below it
        s.bind((host, 0))
        chosen: int = s.getsockname()[1]
        return chosen


TEXT_FORMAT = "text/plain; version=0.0.4"


class MetricsPage:
    """A /metrics page on loopback, served from a thread until `close()` (or `with`): each scrape
    gets `render()`'s bytes as they are, in `content_type` (Prometheus's text format by default,
    never OpenMetrics). For the exporters that tests and benchmarks synthesise; real components
    serve theirs with prometheus_client."""

    def __init__(self, render: Callable[[], bytes], port: int = 0, host: str = "127.0.0.1",
                 content_type: str = TEXT_FORMAT) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = render()
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self.host, self.port = host, int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> MetricsPage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Target:
    address: str  # host:port
    labels: dict[str, str] = field(default_factory=dict)
    metrics_path: str = "/metrics"


@dataclass
class PrometheusProcess:
    """A Prometheus child process with a scratch TSDB, stopped by `stop()` or `with`."""

    scrape_interval: float = 1.0
    evaluation_interval: float | None = None
    rule_files: list[Path] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 0
    binary: str = "prometheus"
    workdir: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    # --web.config.file: `tls_server_config` (then the URL is https) and `basic_auth_users`;
    # probe_auth is the (user, password) the readiness probe sends.
    web_config: dict[str, Any] | None = None
    probe_auth: tuple[str, str] | None = None
    _proc: subprocess.Popen[bytes] | None = None
    _own_workdir: bool = False

    @property
    def url(self) -> str:
        tls = bool(self.web_config and self.web_config.get("tls_server_config"))
        return f"{'https' if tls else 'http'}://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        """The running server's process id (benchmarks read its CPU time)."""
        assert self._proc is not None, "not started"
        return self._proc.pid

    def _paths(self) -> tuple[Path, Path, Path]:
        assert self.workdir is not None
        return self.workdir / "prometheus.yml", self.workdir / "targets", self.workdir / "tsdb"

    def start(self, targets: Iterable[Target] = (), timeout: float = 60.0) -> PrometheusProcess:
        if shutil.which(self.binary) is None:
            raise PrometheusNotInstalled(
                "prometheus is not installed; install it with "
                "`apt-get install -y --no-install-recommends prometheus` (or run ./dev setup)"
            )
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="poolpilot-prom-"))
            self._own_workdir = True
        config, targets_dir, tsdb = self._paths()
        targets_dir.mkdir(parents=True, exist_ok=True)
        self.set_targets(targets)
        interval = duration(self.scrape_interval)
        cfg: dict[str, Any] = {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": duration(self.evaluation_interval or self.scrape_interval),
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": "poolpilot",
                    "file_sd_configs": [
                        {"files": [str(targets_dir / "*.json")], "refresh_interval": "1s"}
                    ],
                    "relabel_configs": [
                        {"source_labels": ["__meta_metrics_path"], "regex": "(.+)",
                         "target_label": "__metrics_path__"},
                    ],
                }
            ],
        }
        config.write_text(yaml.safe_dump(cfg))
        if not self.port:
            self.port = free_port(self.host)
        web: list[str] = []
        if self.web_config is not None:
            (self.workdir / "web.yml").write_text(yaml.safe_dump(self.web_config))
            web = [f"--web.config.file={self.workdir / 'web.yml'}"]
        log = open(self.workdir / "prometheus.log", "wb")  # noqa: SIM115 - lives with the process
        self._proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tsdb}",
                f"--web.listen-address={self.host}:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
                *web,
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_ready(timeout)
        return self

    def set_targets(self, targets: Iterable[Target]) -> None:
        """Replace the scrape targets (atomically, so Prometheus never reads half a file)."""
        _, targets_dir, _ = self._paths()
        groups = [
            {
                "targets": [t.address],
                "labels": {**t.labels, "__meta_metrics_path": t.metrics_path},
            }
            for t in targets
        ]
        tmp = targets_dir / ".targets.json.tmp"
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, targets_dir / "targets.json")

    def _wait_ready(self, timeout: float) -> None:
        import base64
        import ssl
        import urllib.request

        request = urllib.request.Request(f"{self.url}/-/ready")
        if self.probe_auth:
            token = base64.b64encode(":".join(self.probe_auth).encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        context = ssl.create_default_context()  # the probe checks readiness, not identity
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited early: {self.log_tail()}")
            try:
                with urllib.request.urlopen(request, timeout=1, context=context) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"prometheus not ready after {timeout}s: {self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        assert self.workdir is not None
        path = self.workdir / "prometheus.log"
        return "\n".join(path.read_text().splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PrometheusProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def duration(seconds: float) -> str:
    """Prometheus duration string; sub-second intervals as milliseconds."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"
