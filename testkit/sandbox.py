"""Run a sandbox from synchronous code (pytest fixtures): its event loop lives in a thread.

    with SandboxThread(SandboxConfig(out_dir=tmp, speed=8)) as sb:
        pool = sb.call(sb.sandbox.apply(path))
        future = sb.submit(replayer.replay(trace, progress=False))   # runs in the background
        ...
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from poolpilot.sandbox.supervisor import Sandbox, SandboxConfig

T = TypeVar("T")


class SandboxThread:
    def __init__(self, cfg: SandboxConfig) -> None:
        self.sandbox = Sandbox(cfg)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sandbox",
                                        daemon=True)

    def __enter__(self) -> SandboxThread:
        self._thread.start()
        try:
            self.call(self.sandbox.start(), timeout=120)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            if self._thread.is_alive():
                self.call(self.sandbox.stop(), timeout=60)
        finally:
            self.sandbox.stop_sync()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return self.submit(coro).result(timeout=timeout)

