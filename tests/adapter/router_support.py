"""Processes for the router's adapter tests: fake engines, real vLLM engines, the router.

Every process starts in its own session (so its children die with it), binds 127.0.0.1 on a
port it picks itself, and is stopped by PID in a `finally`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
# The console script, not `python -m`: that would put the working directory (the repository,
# whose operator/ folder shadows the stdlib module) first on sys.path.
POOLPILOT = str(Path(sys.executable).parent / "poolpilot")
FAKE_ENGINE = Path(__file__).parent / "router_fakes" / "fake_engine.py"
# Router flags for tests: health checks and queue scrapes every 0.2 s, no ramp-in.
FAST = ("--health-interval", "0.2", "--ramp-seconds", "0")


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    port: int
    name: str = ""
    output: Output | None = None  # its stdout and stderr, read in the background

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill(self) -> None:
        """SIGKILL the whole process group: a crash, no clean-up."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
            except ProcessLookupError:
                pass
        return self.popen.returncode


class Output:
    """Reads a child's stdout in a thread (so its pipe never fills up and blocks it)."""

    def __init__(self, popen: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert popen.stdout is not None
        self._thread = threading.Thread(target=self._pump, args=(popen.stdout,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def shows(self, text: str, timeout: float = 10.0) -> bool:
        """Whether `text` is in the output within `timeout` seconds: what the child wrote
        before it answered the test reaches this reader later, on a loaded machine."""
        deadline = time.monotonic() + timeout
        while text not in self.text():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True


def wait_for_line(
    popen: subprocess.Popen[str], pattern: str, timeout: float
) -> tuple[re.Match[str], Output]:
    """Wait until a line of the process's stdout matches, with a deadline; kills the process
    when it never does (the caller gets no Proc to stop)."""
    try:
        return _wait_for_line(popen, pattern, timeout)
    except BaseException:
        Proc(popen, 0).kill()
        raise


def _wait_for_line(
    popen: subprocess.Popen[str], pattern: str, timeout: float
) -> tuple[re.Match[str], Output]:
    output = Output(popen)
    deadline = time.monotonic() + timeout
    checked = 0
    while time.monotonic() < deadline:
        for line in output.lines[checked:]:
            checked += 1
            m = re.search(pattern, line)
            if m:
                return m, output
        if popen.poll() is not None:
            time.sleep(0.2)
            raise RuntimeError(f"process exited ({popen.returncode}):\n{output.text()}")
        time.sleep(0.05)
    raise TimeoutError(f"no line matching {pattern!r} within {timeout}s:\n{output.text()}")


def spawn(cmd: list[str], env: Mapping[str, str] | None = None, cwd: Path | None = None,
          stdout: int | None = subprocess.PIPE, log: Path | None = None) -> subprocess.Popen[str]:
    out = open(log, "w") if log is not None else None  # noqa: SIM115 - handed to the child
    return subprocess.Popen(
        cmd, stdout=out or stdout, stderr=subprocess.STDOUT if out is None else out, text=True,
        env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
    )


def start_fake_engine(name: str, token_delay: float = 0.0, port: int = 0,
                      *args: str) -> Proc:
    popen = spawn([PYTHON, str(FAKE_ENGINE), "--name", name, "--port", str(port),
                   "--token-delay", str(token_delay), *args])
    m, output = wait_for_line(popen, r"listening on (\d+)", 60)
    return Proc(popen, int(m.group(1)), name, output)


def start_engine_sim(role: str, *args: str) -> Proc:
    """`poolpilot engine-sim` for a role (8B on an H200 unless args say otherwise)."""
    popen = spawn([POOLPILOT, "engine-sim", "--host", "127.0.0.1", "--port", "0",
                   "--role", role, "--served-name", "sim", *args])
    m, output = wait_for_line(popen, r"listening on http://[\d.]+:(\d+)", 60)
    return Proc(popen, int(m.group(1)), f"engine-sim {role}", output)


def start_router(*args: str) -> Proc:
    popen = spawn([POOLPILOT, "router", "--host", "127.0.0.1", "--port", "0", *args])
    m, output = wait_for_line(popen, r"listening on http://[\d.]+:(\d+)", 60)
    return Proc(popen, int(m.group(1)), "router", output)


@contextmanager
def running(*procs: Proc) -> Iterator[tuple[Proc, ...]]:
    try:
        yield procs
    finally:
        for p in procs:
            p.stop()


def wait_until(check: Callable[[], bool], timeout: float, what: str,
               interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def metric_value(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """Sum of a metric's samples in a /metrics page whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name): len(name) + 1] not in ("{", " "):
            continue
        head, value = line.rsplit(" ", 1)
        found = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if all(found.get(k) == v for k, v in (labels or {}).items()):
            total += float(value)
    return total


def sse_events(text: str) -> list[dict | str]:
    """Parse an SSE body into JSON payloads ("[DONE]" kept as a string)."""
    events: list[dict | str] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


# -- real vLLM on CPU ---------------------------------------------------------------------------

VLLM_VENV = Path(os.environ.get("POOLPILOT_VLLM_VENV", REPO / ".cache" / "vllm-venv"))
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
ENGINE_ARGS = ("dtype=float32", "enforceEager=true", "maxModelLen=512")


def vllm_available() -> bool:
    return VLLM_PYTHON.exists() and (VLLM_VENV / ".installed").exists()


def start_vllm(role: str, model: Path, scratch: Path, cpu: int, served_name: str,
               connector: str | None = None, kv_config: Mapping[str, object] | None = None,
               extra: Sequence[str] = ()) -> Proc:
    """Start vLLM for a role through `poolpilot launch` (the runtime image's entrypoint).
    Returns once it is listening; call wait_vllm_ready() before use (start two, then wait)."""
    from poolpilot.runtime.launcher import vllm_cpu_env
    from poolpilot.testkit.prometheus import free_port

    scratch.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [POOLPILOT, "launch", "--python", str(VLLM_PYTHON), "--role", role,
           "--model", str(model), "--served-name", served_name, "--host", "127.0.0.1",
           "--port", str(port)]
    if connector:
        cmd += ["--kv-connector", connector, "--kv-config", json.dumps(kv_config or {})]
    for arg in ENGINE_ARGS:
        cmd += ["--engine-arg", arg]
    cmd += list(extra)  # more launcher flags
    # Shared and kept cache root: vLLM caches the model's inspection there, which saves
    # every later engine a subprocess that imports torch and vLLM (written atomically).
    env = vllm_cpu_env(str(scratch), cpu, free_port(),
                       cache_root=str(REPO / ".cache" / "vllm-test-cache"))
    popen = spawn(cmd, env=env, cwd=scratch, log=scratch / "vllm.log")
    return Proc(popen, port, f"{role}:{scratch / 'vllm.log'}")


def wait_vllm_ready(proc: Proc, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            log = Path(proc.name.split(":", 1)[1])
            raise RuntimeError(f"vLLM exited ({proc.popen.returncode}):\n"
                               + log.read_text()[-4000:])
        try:
            if httpx.get(proc.url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"vLLM {proc.name} not ready within {timeout}s")


@dataclass
class SharedEngine(Proc):
    """An aggregated engine of `SharedEngines`, with the ports of its optional flags."""

    metrics_port: int = 0
    events_port: int = 0
    replay_port: int = 0

    def metric(self, name: str) -> float:
        return metric_value(httpx.get(self.url + "/metrics", timeout=10).text, name)


class SharedEngines:
    """Aggregated vLLM-CPU engines that several test modules share (one start each instead of
    one per module: a start takes 35-150 s on two cores). At most one per core, started on
    first use (`get`), stopped by `close`. Each runs with every launcher flag a sharing module
    tests (--metrics-port, --kv-events-port/--kv-replay-port, --grace-seconds 40): they add
    ports and a drain on SIGTERM, and change no output. A test that ends an engine (SIGTERM)
    `take`s it: the engine is then the test's to stop, and a later `get` starts a fresh one."""

    GRACE_FLAGS = ("--grace-seconds", "40")  # 35 s to drain (no preStop)

    def __init__(self, scratch: Path, served_name: str) -> None:
        self.scratch = scratch
        self.served_name = served_name
        self.engines: dict[int, SharedEngine] = {}
        self.starts = 0  # engines started, for the log

    def get(self, *cpus: int) -> tuple[SharedEngine, ...]:
        """The engines pinned to these cores, ready; those not running start together."""
        from poolpilot.sandbox.tinymodel import ensure_tiny_model
        from poolpilot.testkit.prometheus import free_port

        for cpu in cpus:
            old = self.engines.get(cpu)
            if old is not None and old.popen.poll() is None:
                continue
            model = ensure_tiny_model(REPO / ".cache" / "tiny-llama")
            metrics, events, replay = free_port(), free_port(), free_port()
            self.starts += 1
            proc = start_vllm(
                "aggregated", model, self.scratch / f"cpu{cpu}-{self.starts}", cpu,
                self.served_name, extra=["--metrics-port", str(metrics), "--kv-events-port",
                                         str(events), "--kv-replay-port", str(replay),
                                         *self.GRACE_FLAGS])
            self.engines[cpu] = SharedEngine(proc.popen, proc.port, proc.name, proc.output,
                                             metrics, events, replay)
        for cpu in cpus:
            wait_vllm_ready(self.engines[cpu])
        return tuple(self.engines[cpu] for cpu in cpus)

    def take(self, cpu: int) -> SharedEngine:
        """The engine on this core, no longer shared: the caller stops it."""
        (engine,) = self.get(cpu)
        del self.engines[cpu]
        return engine

    def close(self) -> None:
        while self.engines:
            self.engines.popitem()[1].stop()
