"""One request's deadline budget: how long it may still wait on engines for its first token.

Every attempt (a prefill, a decode after the handoff, the local prefill that retries a failed
handoff, another engine of the role) has its own deadline: the prefill deadline, the decode
stall deadline, or both for an engine that prefills the prompt itself. Without a budget each
retry started its deadline afresh, so a request whose handoff met a hung decode engine waited
one decode deadline there and then another one on the local retry. With it, the first missed
deadline (the engine is hung) starts the request's grace, the TTFT target: every later attempt
of that request waits at most what is left of it, and none starts once it is spent. A request
therefore waits on a hung engine at most one deadline plus the TTFT target.

Pure: the caller passes the clock's readings (seconds of the router's clock).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DeadlineBudget:
    """`grace_s`: what every attempt after the first missed deadline shares (the TTFT target
    on the router's clock); None: no budget, each attempt keeps its own deadline."""

    grace_s: float | None
    cutoff: float | None = None  # the clock reading after which no attempt may wait
    missed_deadlines: int = 0

    def timeout(self, deadline_s: float | None, now: float) -> float | None:
        """Seconds an attempt starting `now` may wait for its first byte or token: its own
        deadline (None: none), capped by what the request has left once a deadline was
        missed (0 or less: spent)."""
        if self.cutoff is None:
            return deadline_s
        left = self.cutoff - now
        return left if deadline_s is None else min(deadline_s, left)

    def missed(self, now: float) -> None:
        """An attempt missed its deadline (its engine counts as hung): the grace starts now,
        once per request."""
        self.missed_deadlines += 1
        if self.cutoff is None and self.grace_s is not None:
            self.cutoff = now + self.grace_s

    def spent(self, now: float) -> bool:
        """No time is left for another attempt."""
        return self.cutoff is not None and now >= self.cutoff
