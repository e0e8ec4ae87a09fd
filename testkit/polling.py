"""`wait_for`: poll a condition until it holds, for the tests and tools of every room.

One helper with one argument order, so a reader of any suite knows what
`wait_for(check, 30, "the pool to be ready")` means. Standard library only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T | None], timeout: float = 60.0,
             what: str = "condition", *, interval: float = 0.25) -> T:
    """Call `condition` until it returns something truthy and return that; after `timeout`
    seconds fail with an AssertionError naming `what` and the last value seen."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")
