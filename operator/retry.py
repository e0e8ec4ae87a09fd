"""How long the operator waits before trying a pool again after an API error (pure).

Transient errors (no answer, 409, 429, 5xx) are retried soon: the next try usually works.
Permanent ones (403, 422, quota) wait longer each time — 5 s, 10 s, 20 s ... up to 5 minutes —
so a pool nobody fixes does not hammer the API server, yet a fixed RBAC rule or a raised quota
is picked up within minutes without touching the pool.
"""

from __future__ import annotations

TRANSIENT_DELAY_S = 2.0
PERMANENT_FIRST_S = 5.0
PERMANENT_MAX_S = 300.0


def delay(*, transient: bool, failures: int, first: float = PERMANENT_FIRST_S,
          ceiling: float = PERMANENT_MAX_S) -> float:
    """Seconds before the next try; `failures` counts this failure too (>= 1)."""
    if transient:
        return TRANSIENT_DELAY_S
    return min(ceiling, first * 2 ** min(max(0, failures - 1), 32))  # no float overflow
