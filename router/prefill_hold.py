"""Late binding of prompts to prefill engines: while every prefill engine is saturated, a new
prompt waits at the router, in arrival order, instead of joining one engine's queue.

Why: a request queued at an engine stays there. After a burst from idle, every prompt of the
burst queued at the one engine that was ready, and the replicas the autoscaler added minutes
later found nothing to take while that engine worked through its queue (the prefill load
imbalance read 13 where 1.5 is the goal). Held at the router, the queue goes to whichever
engine can start on it first, the new replicas included (llm-d's flow control and Dynamo's
router queue hold requests for the same reason). The held requests are prefill demand the
engines' waiting gauges no longer show: the router exports their count
(`poolpilot_router_held_requests{role="prefill"}`) and the autoscaler adds it to the prefill
role's waiting requests.

An engine is saturated when the work the router has queued there would take it longer than
`hold_s` at the learned prefill rate (router/engine_choice.py): an engine below that keeps
enough queued to stay busy, so holding costs no throughput. A held prompt is let through when
an engine falls below it (a prefill finished, an engine joined or was ejected, a health check
ran), one at a time: the one let through takes its engine before the next is considered.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from poolpilot.routing_defaults import DEFAULT_PREFILL_HOLD_S

__all__ = ["DEFAULT_PREFILL_HOLD_S", "PrefillHold"]


class PrefillHold:
    """The queue of prompts waiting for a prefill engine that is not saturated.

    `saturated()`: whether every prefill engine is (False when there is none to wait for: the
    caller's own path for no engine then applies); `on_change`: told the number held whenever
    it changes (the router's gauge). Pure of I/O: the Router calls `release()` whenever an
    engine's queue may have shrunk, and `passed()` once a prompt let through took its
    engine."""

    def __init__(self, saturated: Callable[[], bool],
                 on_change: Callable[[int], None] = lambda held: None) -> None:
        self.saturated = saturated
        self.on_change = on_change
        self._waiters: deque[asyncio.Future[None]] = deque()
        # A prompt let through has not taken its engine yet: the next waits for it, or
        # every held prompt would go at once to the engine that just freed up.
        self._passing = False

    def __len__(self) -> int:
        return len(self._waiters)

    async def enter(self) -> bool:
        """Wait until this prompt may go to an engine (at once when none is held and an
        engine is not saturated); True if it was held: call `passed()` once it took its
        engine, or gave up."""
        if not self._waiters and not self._passing and not self.saturated():
            return False
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self.on_change(len(self._waiters))
        try:
            await waiter
        except asyncio.CancelledError:  # the client left
            if waiter.done() and not waiter.cancelled():
                self.passed()  # it was let through: hand its turn on
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
                self.on_change(len(self._waiters))
            raise
        return True

    def passed(self) -> None:
        """The prompt let through has taken its engine: consider the next one."""
        self._passing = False
        self.release()

    def release(self) -> None:
        """Let the first held prompt through if an engine can start on it now."""
        while self._waiters and not self._passing and not self.saturated():
            waiter = self._waiters.popleft()
            if not waiter.done():  # (else cancelled, its task not resumed yet)
                waiter.set_result(None)
                self._passing = True
            self.on_change(len(self._waiters))
