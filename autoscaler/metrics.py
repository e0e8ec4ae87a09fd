"""The autoscaler's own Prometheus metrics (names in poolpilot.metrics)."""

from __future__ import annotations

from poolpilot.autoscaler.decide import RoleDecision
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from poolpilot import metrics as m

ROLE = ["namespace", "pool", "role"]
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _base(counter_name: str) -> str:
    return counter_name.removesuffix("_total")


class AutoscalerMetrics:
    """One registry per autoscaler (tests make several side by side)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.desired = Gauge(m.AUTOSCALER_DESIRED, "Replicas the autoscaler decided on.",
                             ROLE, registry=r)
        self.decisions = Counter(
            _base(m.AUTOSCALER_DECISIONS),
            "Decisions, by direction (up, down, none) and CamelCase reason.",
            [*ROLE, "direction", "reason"], registry=r)
        self.signal = Gauge(m.AUTOSCALER_SIGNAL, "A signal's value as the decision saw it.",
                            [*ROLE, "signal"], registry=r)
        self.signal_target = Gauge(m.AUTOSCALER_SIGNAL_TARGET,
                                   "The target the signal was compared with.",
                                   [*ROLE, "signal"], registry=r)
        self.limited = Gauge(m.AUTOSCALER_LIMITED,
                             "1 while the role cannot scale as it wants (reason label).",
                             [*ROLE, "reason"], registry=r)
        self.metrics_available = Gauge(
            m.AUTOSCALER_METRICS_AVAILABLE,
            "1: every signal had a fresh value; 0: the size is held for lack of data.",
            ROLE, registry=r)
        self.cycle = Histogram(m.AUTOSCALER_CYCLE, "Seconds per autoscaler cycle.",
                               buckets=CYCLE_BUCKETS, registry=r)
        self.leader = Gauge(m.AUTOSCALER_LEADER,
                            "1 on the replica that holds the leader lease (the one acting).",
                            registry=r)
        self._signals: dict[tuple[str, str, str], set[str]] = {}
        self._limited: dict[tuple[str, str, str], str] = {}

    def record(self, ns: str, pool: str, d: RoleDecision, metrics_ok: bool) -> None:
        key = (ns, pool, d.role)
        self.desired.labels(*key).set(d.replicas)
        self.decisions.labels(*key, d.direction, d.reason).inc()
        self.metrics_available.labels(*key).set(1 if d.metrics_ok and metrics_ok else 0)
        names: set[str] = {s.name for s in d.signals}
        for gone in self._signals.get(key, set()) - names:
            self.signal.remove(*key, gone)
            self.signal_target.remove(*key, gone)
        for s in d.signals:
            self.signal.labels(*key, s.name).set(s.value)
            self.signal_target.labels(*key, s.name).set(s.target)
        self._signals[key] = names
        old = self._limited.pop(key, None)
        if old is not None and old != d.limited:
            self.limited.remove(*key, old)
        if d.limited:
            self.limited.labels(*key, d.limited).set(1)
            self._limited[key] = d.limited

    def forget_all(self) -> None:
        """Drop every pool's series (leadership lost: the new leader reports them now)."""
        for ns, pool in {k[:2] for k in self._signals}:
            self.forget(ns, pool)

    def forget(self, ns: str, pool: str) -> None:
        """Drop a deleted pool's series (the decision counters stay, as counters do)."""
        for key in [k for k in self._signals if k[:2] == (ns, pool)]:
            for name in self._signals.pop(key):
                self.signal.remove(*key, name)
                self.signal_target.remove(*key, name)
            self.desired.remove(*key)
            self.metrics_available.remove(*key)
            if key in self._limited:
                self.limited.remove(*key, self._limited.pop(key))
