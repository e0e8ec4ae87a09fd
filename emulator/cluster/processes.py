"""Child processes of the sandbox: each in its own process group, logged to a file, and
stopped (SIGTERM, then SIGKILL after a grace period) by PID, never by name.

A `ProcessTable` remembers every process it started so the supervisor can stop all of them on
exit, on error and on Ctrl-C, including ones a failing step left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes]
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def signal_group(self, sig: int) -> None:
        # The child leads its own session/group (start_new_session), so this reaches its
        # descendants too (e.g. vLLM's engine core process).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def stop_now(self, grace: float = 5.0) -> None:
        """Blocking stop: SIGTERM the group, SIGKILL after `grace` seconds."""
        if self.alive():
            self.signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace)
        # Kill leftovers of the group even if the leader is gone.
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)

    async def stop(self, grace: float = 5.0) -> None:
        """Async stop: SIGTERM, wait up to `grace` seconds without blocking the loop, SIGKILL."""
        if self.alive():
            self.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        self.signal_group(signal.SIGKILL)
        while self.alive():
            await asyncio.sleep(0.02)


class ProcessTable:
    """Starts children and remembers them until they are stopped."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: dict[int, Child] = {}

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              cwd: Path | None = None) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
            )
        child = Child(name=name, argv=list(argv), log_path=log_path, popen=popen)
        self.children[popen.pid] = child
        return child

    def forget(self, child: Child) -> None:
        self.children.pop(child.pid, None)

    async def stop(self, child: Child, grace: float) -> None:
        await child.stop(grace)
        self.forget(child)

    def stop_all(self, grace: float = 5.0) -> None:
        """Stop everything still running: SIGTERM all groups at once, then wait, then SIGKILL."""
        children = list(self.children.values())
        for c in children:
            if c.alive():
                c.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for c in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        for c in children:
            c.stop_now(grace=0)
        self.children.clear()
