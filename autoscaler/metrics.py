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

    def __init__(self, registry: CollectorRegistry | None = None, shard: int = 0) -> None:
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
        # Labelled with the shard (--shard; "0" when one autoscaler decides every pool), so an
        # alert can tell a shard without a leader from the others.
        self.leader = Gauge(m.AUTOSCALER_LEADER,
                            "1 on the replica that holds its shard's leader lease (the one "
                            "acting).", ["shard"], registry=r).labels(shard=str(shard))
        # Per role: its label children with the values they hold. prometheus_client's
        # labels() and set() lock and check their arguments on every call (a quarter of a
        # cycle's CPU at 1,000 pools), so each child is looked up once and set on a change.
        self._roles: dict[tuple[str, str, str], _RoleSeries] = {}

    def record(self, ns: str, pool: str, d: RoleDecision, metrics_ok: bool) -> None:
        key = (ns, pool, d.role)
        series = self._roles.get(key)
        if series is None:
            series = self._roles[key] = _RoleSeries(self, key)
        series.record(d, metrics_ok)

    def forget_all(self) -> None:
        """Drop every pool's series (leadership lost: the new leader reports them now)."""
        for ns, pool in {k[:2] for k in self._roles}:
            self.forget(ns, pool)

    def forget(self, ns: str, pool: str) -> None:
        """Drop a deleted pool's series (the decision counters stay, as counters do)."""
        for key in [k for k in self._roles if k[:2] == (ns, pool)]:
            self._roles.pop(key).remove()


class _Set:
    """A gauge child and the value it holds: set() only when the value changes."""

    __slots__ = ("child", "value")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.value: float | None = None

    def set(self, value: float) -> None:
        if value != self.value:
            self.child.set(value)
            self.value = value


class _RoleSeries:
    """One role's series: desired replicas, metrics available, a value and target per signal
    the last decision had, the ScalingLimited reason if any, and the decision counters."""

    def __init__(self, m: AutoscalerMetrics, key: tuple[str, str, str]) -> None:
        self.m, self.key = m, key
        self.desired = _Set(m.desired.labels(*key))
        self.available = _Set(m.metrics_available.labels(*key))
        self.decisions: dict[tuple[str, str], Any] = {}  # (direction, reason) -> counter
        self.signals: dict[str, tuple[_Set, _Set]] = {}  # signal -> (value, target)
        self.limited: str | None = None

    def record(self, d: RoleDecision, metrics_ok: bool) -> None:
        m, key = self.m, self.key
        self.desired.set(d.replicas)
        direction = d.direction
        counter = self.decisions.get((direction, d.reason))
        if counter is None:
            counter = self.decisions[(direction, d.reason)] = m.decisions.labels(
                *key, direction, d.reason)
        counter.inc()
        self.available.set(1 if d.metrics_ok and metrics_ok else 0)
        names = {s.name for s in d.signals}
        for gone in [n for n in self.signals if n not in names]:  # no longer reported
            del self.signals[gone]
            m.signal.remove(*key, gone)
            m.signal_target.remove(*key, gone)
        for s in d.signals:
            pair = self.signals.get(s.name)
            if pair is None:
                pair = self.signals[s.name] = (_Set(m.signal.labels(*key, s.name)),
                                               _Set(m.signal_target.labels(*key, s.name)))
            pair[0].set(s.value)
            pair[1].set(s.target)
        if self.limited is not None and self.limited != d.limited:
            m.limited.remove(*key, self.limited)
            self.limited = None
        if d.limited and self.limited is None:
            m.limited.labels(*key, d.limited).set(1)
            self.limited = d.limited

    def remove(self) -> None:
        """Drop the role's gauges (the decision counters stay, as counters do)."""
        m, key = self.m, self.key
        for name in self.signals:
            m.signal.remove(*key, name)
            m.signal_target.remove(*key, name)
        m.desired.remove(*key)
        m.metrics_available.remove(*key)
        if self.limited is not None:
            m.limited.remove(*key, self.limited)
