"""The prefill -> decode KV handoff's time limits, shared by the router and the engine launcher.

A prefill engine keeps a prompt's KV blocks after answering the router, for a decode engine to
read (vLLM 0.32's NixlConnector: a lease of `kv_lease_duration` seconds, 30 by default,
renewed by heartbeats from the decode engine once the request is queued there). The lease
is sized to cover the router's side of the handoff within its limits: reading the prefill's
answer and getting the decode request to a decode engine, trying up to `max_attempts` engines
each within the connect timeout. A longer lease pins KV blocks longer when a handoff is
abandoned (a router that dies mid-request); a shorter one expires blocks a slow handoff still
needs. So the launcher sets the lease from the router's limits instead of leaving vLLM's
default, and the router (`--kv-lease-seconds`, this same number) sends no prefill's
parameters once too little of its lease is left for a decode engine to pick them up
(router/kv_lease.py): a router or decode side held up past its limits costs a local prefill,
never a read of expired blocks.
"""

from __future__ import annotations

import math

ROUTER_CONNECT_TIMEOUT_S = 5.0  # `poolpilot router --connect-timeout` default
ROUTER_MAX_ATTEMPTS = 3  # `poolpilot router --max-attempts` default (per phase)
LEASE_MARGIN_S = 10.0  # reading the prefill answer, scheduling hiccups, clock steps


def kv_lease_seconds(connect_timeout_s: float = ROUTER_CONNECT_TIMEOUT_S,
                     max_attempts: int = ROUTER_MAX_ATTEMPTS) -> int:
    """Seconds a prefill engine holds a prompt's KV for its decode engine to pick up."""
    if not (connect_timeout_s > 0 and math.isfinite(connect_timeout_s)) or max_attempts < 1:
        raise ValueError("connect timeout must be a positive number and max_attempts >= 1")
    return math.ceil(connect_timeout_s * max_attempts + LEASE_MARGIN_S)
