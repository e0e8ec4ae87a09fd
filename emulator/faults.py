"""Fault injection: make chosen requests fail the way a real API server or network does."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field


@dataclass
class Fault:
    """One rule. `status` is an HTTP code (409, 429, 500, 503, ...), "timeout" (hold the request
    `delay_s` seconds, then answer 504: the client's own timeout fires first), "disconnect"
    (drop the connection without an answer) or "delay" (hold the request until `release()` or
    `delay_s`, then serve it as usual: a test acts while a client's request is in flight).
    `when="after"` serves the request first and then answers with the error (the write
    happened, the client does not know it)."""

    method: str | None = None  # None: any
    path: str = ""  # regex searched in the URL path; "" matches all
    status: int | str = 500
    times: int | None = 1  # None: every matching request until cleared
    watch: bool | None = None  # True: only watch requests, False: never watches
    delay_s: float = 30.0
    when: str = "before"
    message: str = ""
    hits: int = 0
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        """Let a held ("delay") request through."""
        self.released.set()

    def matches(self, method: str, path: str, is_watch: bool) -> bool:
        if self.method is not None and self.method.upper() != method.upper():
            return False
        if self.watch is not None and self.watch != is_watch:
            return False
        return not self.path or re.search(self.path, path) is not None


class Faults:
    """Thread-safe rule list: tests add rules from their thread, the server consumes them."""

    def __init__(self) -> None:
        self._rules: list[Fault] = []
        self._lock = threading.Lock()

    def add(self, method: str | None = None, path: str = "", status: int | str = 500,
            times: int | None = 1, *, watch: bool | None = None, delay_s: float = 30.0,
            when: str = "before", message: str = "") -> Fault:
        if status not in ("timeout", "disconnect", "delay") and not isinstance(status, int):
            raise ValueError(f"status must be an HTTP code, 'timeout', 'disconnect' or "
                             f"'delay', not {status!r}")
        if when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', not {when!r}")
        rule = Fault(method, path, status, times, watch, delay_s, when, message)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            for rule in self._rules:
                rule.release()  # held requests go through
            self._rules.clear()

    @property
    def rules(self) -> list[Fault]:
        with self._lock:
            return list(self._rules)

    def take(self, method: str, path: str, is_watch: bool) -> Fault | None:
        """The first matching rule (its count used up by one), or None."""
        with self._lock:
            for rule in self._rules:
                if rule.matches(method, path, is_watch):
                    rule.hits += 1
                    if rule.times is not None:
                        rule.times -= 1
                        if rule.times <= 0:
                            self._rules.remove(rule)
                    return rule
        return None
