"""The roles of a pool's pods: one word per role, everywhere (API, operator, router, launcher,
engine simulator, autoscaler, bench, sandbox). The pool's mode is `poolpilot.api.Mode`."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """A pool's pods by job. Disaggregated pools run PREFILL and DECODE engines, aggregated
    pools ENGINE (one engine does both); every pool runs a ROUTER. The value is the
    `poolpilot.dev/role` label, the Deployment's suffix and Prometheus's `role`."""

    PREFILL = "prefill"
    DECODE = "decode"
    ENGINE = "engine"
    ROUTER = "router"


ENGINE_ROLES = (Role.PREFILL, Role.DECODE, Role.ENGINE)
DISAGGREGATED_ROLES = (Role.PREFILL, Role.DECODE)
