"""The operator's own Prometheus metrics (names in poolpilot.metrics): how many reconciles ran,
with what result, how long they took, how many writes they made, and how many wait for one of
the `--max-concurrent-reconciles` slots (the operator's queue)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from poolpilot import metrics as m

RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Results, one word each (the `result` label).
CONVERGED = "converged"  # children written: created, updated, repaired or deleted
NO_OP = "no_op"  # nothing to write
INVALID_SPEC = "invalid_spec"
NAME_CONFLICT = "name_conflict"
API_ERROR = "api_error"
POOL_GONE = "pool_gone"
BACKING_OFF = "backing_off"
RESULTS = (CONVERGED, NO_OP, INVALID_SPEC, NAME_CONFLICT, API_ERROR, POOL_GONE, BACKING_OFF)
TRIGGERS = ("change", "timer")


def _base(counter_name: str) -> str:
    return counter_name.removesuffix("_total")


class OperatorMetrics:
    """One registry per operator process (tests make several side by side)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.reconciles = Counter(_base(m.OPERATOR_RECONCILES),
                                  "Reconciles of a pool, by trigger and result.",
                                  ["trigger", "result"], registry=r)
        self.duration = Histogram(m.OPERATOR_RECONCILE_DURATION,
                                  "Seconds one reconcile took (reading, writing, status).",
                                  ["trigger"], buckets=RECONCILE_BUCKETS, registry=r)
        self.writes = Counter(_base(m.OPERATOR_WRITES),
                              "Writes (applies, deletes, size hand-overs) reconciles made.",
                              registry=r)
        self.api_errors = Counter(_base(m.OPERATOR_API_ERRORS),
                                  "Kubernetes API errors while reconciling, by kind.",
                                  ["kind"], registry=r)
        self.active = Gauge(m.OPERATOR_ACTIVE, "Reconciles running now.", registry=r)
        self.queued = Gauge(m.OPERATOR_QUEUED,
                            "Reconciles waiting for a free slot (--max-concurrent-reconciles).",
                            registry=r)
        for trigger in TRIGGERS:  # every series exists from the start, at 0
            for result in RESULTS:
                self.reconciles.labels(trigger, result)
            self.duration.labels(trigger)
        for kind in ("transient", "permanent"):
            self.api_errors.labels(kind)
