"""What every policy sees and returns.

A policy is called every `interval` seconds of simulated time with a `PoolView`: the scraped
metrics (`PromView`, i.e. Prometheus's picture, never the simulator's exact state) and the pod
counts per role that the Kubernetes API would show (ready, starting, draining, and the target
last set). It returns the desired replicas per role; the replay applies them, pods taking the
cold start to become ready.

Ahead of time a policy may know only its configuration: the SLO, the model and GPU, the
replica bounds, and an offline capacity profile measured on the simulator the way Dynamo's
profiler measures an engine before deployment. Only static-peak provisioning is handed the
trace (that is its definition: sized in hindsight from the busiest minute).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from poolpilot.bench.scrape import PromView


@dataclass(frozen=True)
class RolePods:
    ready: int
    starting: int
    draining: int
    target: int  # the Deployment's spec.replicas: ready + starting
    ready_pods: frozenset[str] = frozenset()  # names (the `pod` label) of the ready pods

    @property
    def exists(self) -> int:
        """Pods that exist and are not being deleted (the scale's status.replicas)."""
        return self.ready + self.starting


@dataclass(frozen=True)
class PoolView:
    now: float
    prom: PromView
    roles: Mapping[str, RolePods]


@dataclass(frozen=True)
class ScalingDecision:
    replicas: dict[str, int]
    reasons: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Bounds:
    min_replicas: int = 1
    max_replicas: int = 64


class ScalingPolicy(Protocol):
    name: str
    interval: float  # seconds between decisions

    def initial(self) -> dict[str, int]:
        """Replicas per role at t=0 (before any metric exists)."""
        ...

    def decide(self, view: PoolView) -> ScalingDecision: ...


def clamp(n: int, bounds: Bounds) -> int:
    return max(bounds.min_replicas, min(bounds.max_replicas, n))
