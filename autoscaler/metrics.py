"""The autoscaler's own Prometheus metrics (names in poolpilot.metrics)."""

from __future__ import annotations

from typing import Any

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
        # Label children by (metric, labels), per pool (forgetting one is cheap), with the
        # gauge's last value: prometheus_client's labels() and set() lock and check their
        # arguments on every call, a quarter of a cycle's CPU at 1,000 pools.
        self._children: dict[tuple[str, ...], dict[tuple[int, tuple[str, ...]], Any]] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        mine = self._children.setdefault(labels[:2], {})
        child = mine.get((id(metric), labels))
        if child is None:
            child = mine[(id(metric), labels)] = metric.labels(*labels)
        return child

    def _set(self, metric: Any, value: float, *labels: str) -> None:
        """Gauge.set through the cached child, skipped when the value is the one it has."""
        mine = self._children.setdefault(labels[:2], {})
        key = (id(metric), labels)
        known = mine.get(key)
        if known is None:
            known = mine[key] = [metric.labels(*labels), None]
        if known[1] != value:
            known[0].set(value)
            known[1] = value

    def _remove(self, metric: Any, *labels: str) -> None:
        self._children.get(labels[:2], {}).pop((id(metric), labels), None)
        metric.remove(*labels)

    def record(self, ns: str, pool: str, d: RoleDecision, metrics_ok: bool) -> None:
        key = (ns, pool, d.role)
        self._set(self.desired, d.replicas, *key)
        self._child(self.decisions, *key, d.direction, d.reason).inc()
        self._set(self.metrics_available, 1 if d.metrics_ok and metrics_ok else 0, *key)
        names: set[str] = {s.name for s in d.signals}
        for gone in self._signals.get(key, set()) - names:
            self._remove(self.signal, *key, gone)
            self._remove(self.signal_target, *key, gone)
        for s in d.signals:
            self._set(self.signal, s.value, *key, s.name)
            self._set(self.signal_target, s.target, *key, s.name)
        self._signals[key] = names
        old = self._limited.pop(key, None)
        if old is not None and old != d.limited:
            self._remove(self.limited, *key, old)
        if d.limited:
            self._set(self.limited, 1, *key, d.limited)
            self._limited[key] = d.limited

    def forget_all(self) -> None:
        """Drop every pool's series (leadership lost: the new leader reports them now)."""
        for ns, pool in {k[:2] for k in self._signals}:
            self.forget(ns, pool)

    def forget(self, ns: str, pool: str) -> None:
        """Drop a deleted pool's series (the decision counters stay, as counters do)."""
        for key in [k for k in self._signals if k[:2] == (ns, pool)]:
            for name in self._signals.pop(key):
                self._remove(self.signal, *key, name)
                self._remove(self.signal_target, *key, name)
            self._remove(self.desired, *key)
            self._remove(self.metrics_available, *key)
            if key in self._limited:
                self._remove(self.limited, *key, self._limited.pop(key))
        # The decision counters stay (as counters do); only the cached handles go.
        self._children.pop((ns, pool), None)
