"""Which replicas a scale-down removes: those whose loss costs least. Pure (no I/O).

A replica's loss costs the requests it has in flight (they finish there while the pod drains,
or fail if it goes first) and the prefix cache it holds (the prompts it served from its cache
are computed again elsewhere, on a cold cache). So the order is: pods that are not ready
first (they serve nothing); then the lowest `share of the role's requests in flight + share
of the role's prefix-cache hits`; ties by name, so repeated decisions agree.

The loop writes the answer as annotations before it scales: every victim gets a negative
`controller.kubernetes.io/pod-deletion-cost` (the ReplicaSet controller deletes the lowest
first; unannotated pods count 0) and `poolpilot.dev/draining: "true"` (the router's discovery
stops sending new requests to it). Marks left on pods that are no longer victims (a scale
that failed, a decision that changed) are removed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from poolpilot import names

Obj = dict[str, object]


@dataclass(frozen=True)
class PodLoad:
    """One engine pod as the removal choice sees it. None: no sample (counts as 0)."""

    name: str
    ready: bool = True
    in_flight: float | None = None  # requests running + waiting at the engine
    prefix_hits: float | None = None  # prompt tokens/s its prefix cache served (or the
    # router expected it to, where the engines keep no such counter)


def _num(v: float | None) -> float:
    return v if v is not None and 0 <= v < math.inf else 0.0


def removal_order(pods: Sequence[PodLoad]) -> list[PodLoad]:
    """Cheapest loss first (see the module doc)."""
    flight = sum(_num(p.in_flight) for p in pods)
    hits = sum(_num(p.prefix_hits) for p in pods)

    def cost(p: PodLoad) -> tuple[bool, float, str]:
        share = (_num(p.in_flight) / flight if flight > 0 else 0.0) + (
            _num(p.prefix_hits) / hits if hits > 0 else 0.0)
        return p.ready, share, p.name

    return sorted(pods, key=cost)


def victims(pods: Sequence[PodLoad], remove: int) -> list[str]:
    """The names of the `remove` pods a scale-down should take, cheapest first."""
    return [p.name for p in removal_order(pods)[:max(0, remove)]]


def annotation_patches(pods: Sequence[PodLoad], remove: int,
                       marked: Mapping[str, bool]) -> dict[str, dict[str, str | None]]:
    """Pod name -> the annotations to merge-patch (None deletes one). `marked`: pods that
    carry the draining mark now. Victims get a deletion cost below every other pod's (the
    cheapest the lowest) and the mark; marked pods that are no victims lose both."""
    chosen = victims(pods, remove)
    out: dict[str, dict[str, str | None]] = {
        name: {names.DELETION_COST: str(i - len(chosen)), names.DRAINING: "true"}
        for i, name in enumerate(chosen)
    }
    for name, is_marked in marked.items():
        if is_marked and name not in out:
            out[name] = {names.DELETION_COST: None, names.DRAINING: None}
    return out
