"""A pool's mode and its pods' roles: one word each, everywhere (API, operator, router,
launcher, engine simulator, autoscaler, bench, sandbox). Free of pydantic, so the router and
the launcher can name them without loading the API models (`poolpilot.api` re-exports Mode)."""

from __future__ import annotations

from enum import StrEnum


# `spec.mode`: separate prefill and decode engines with a KV handoff, or one engine role. (No
# docstring: pydantic would put it into the CRD's schema, whose field has its own description.)
class Mode(StrEnum):
    DISAGGREGATED = "Disaggregated"
    AGGREGATED = "Aggregated"


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
