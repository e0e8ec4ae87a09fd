"""Run `poolpilot engine-sim` as a child process (for tests, benchmarks and the sandbox).

    with EngineSimProcess(role="decode", speed=50, served_name="m") as sim:
        httpx.get(sim.url + "/health")
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType

from poolpilot.roles import Role


@dataclass
class EngineSimProcess:
    role: str = Role.ENGINE
    model: str = "llama-3.1-8b"
    gpu: str = "h200"
    host: str = "127.0.0.1"
    port: int = 0
    speed: float = 1.0
    served_name: str | None = None
    extra_args: list[str] = field(default_factory=list)
    url: str = ""
    _proc: subprocess.Popen[str] | None = None
    _lines: list[str] = field(default_factory=list)

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "poolpilot.cli", "engine-sim", "--role", self.role,
               "--model", self.model, "--gpu", self.gpu, "--host", self.host,
               "--port", str(self.port), "--speed", repr(float(self.speed))]
        if self.served_name:
            cmd += ["--served-name", self.served_name]
        return cmd + list(self.extra_args)

    def start(self, timeout: float = 30.0) -> EngineSimProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self._proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=env)
        ready = threading.Event()

        def reader() -> None:
            assert self._proc is not None and self._proc.stdout is not None
            for line in self._proc.stdout:
                self._lines.append(line)
                if "listening on " in line and not ready.is_set():
                    self.url = line.rsplit("listening on ", 1)[1].strip()
                    ready.set()

        threading.Thread(target=reader, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not ready.wait(0.05):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                out = "".join(self._lines)
                self.stop()
                raise RuntimeError(f"engine-sim did not start: {out}")
        return self

    @property
    def output(self) -> str:
        return "".join(self._lines)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        self._proc = None

    def __enter__(self) -> EngineSimProcess:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
