"""Burst room: the prefill capacity kept for clumps of demand that no scale-up can follow.

A clump of a few seconds is over long before a replica ordered at its start could serve (one
cold start plus a decision interval later), and a rate over a 60 s window shows only a
fraction of it. What the pool must hold for it does not depend on how long a replica takes
to start, so it is not taken from the look-ahead horizon; it is taken from what the pool has
seen at the finest scale Prometheus resolves: the prefill queue at each scrape instant.

At every decision the role's *seconds-scale demand* is

    X = max(D, W / T)

with `D` the demand of the capacity model (tokens/s over the rate window, the prompts the
router prefilled on decode engines included), `W` the computed prompt tokens that queued at
prefill since the previous decision (what the ready replicas and the decode engines' local
prefill did not take at once), and `T` the TTFT target: the last prompt of a queue waits for
all of it, so serving the queue within the target takes `W / T`. Each minute keeps its
largest `X` for `WINDOW` seconds, and the room is the SLO's quantile of those minutes' peaks,
in replicas (`X / C`). The capacity model keeps at least that many (a floor under both the
size it keeps and the size it orders), so a role that has seen clumps queue keeps what
serves them within the target whatever the cold start.

While no queue forms, `X = D` and the room is at most what the demand itself needs: it adds
nothing. The room comes from what the queue did under the pool as it was sized, so it
settles where the clumps stop queueing at more than the SLO's share of the minutes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# How long a minute's peak is remembered: the clumps of the last hours size the room.
WINDOW = 3 * 3600.0
# The room's sample period: each minute keeps its largest seconds-scale demand.
MINUTE = 60.0


@dataclass(frozen=True)
class Peak:
    """The largest seconds-scale demand (tokens/s) sampled within the minute from `start`."""

    start: float
    demand: float


@dataclass(frozen=True)
class Clumps:
    """What the burst room remembers of one role: the minutes' peaks, oldest first, and the
    tokens waiting at the previous decision (a queue that was already there is no new clump:
    the capacity model's backlog term drains it)."""

    peaks: tuple[Peak, ...] = ()
    waiting: float = 0.0
    seen: bool = False  # a decision has looked at the queue (a new autoscaler has not)
    settled: bool = True  # no replica was starting at that decision


def seconds_demand(demand: float, new_waiting: float, ttft_target: float) -> float:
    """The tokens/s the role had to absorb at this instant (module doc): the demand itself,
    or, where a new queue formed, the capacity that serves what waits within the TTFT target
    (the last prompt in the queue waits for all of it), whichever is more."""
    demand = max(0.0, demand)
    if not new_waiting > 0 or not ttft_target > 0:
        return demand
    return max(demand, new_waiting / ttft_target)


def remember(peaks: Sequence[Peak], now: float, demand: float,
             window: float = WINDOW) -> tuple[Peak, ...]:
    """Add one sample: it raises its minute's peak; minutes older than `window` go."""
    if not math.isfinite(demand) or demand < 0 or not math.isfinite(now):
        return tuple(peaks)
    start = math.floor(now / MINUTE) * MINUTE
    oldest = now - window
    kept = [p for p in peaks if p.start + MINUTE > oldest]
    if kept and kept[-1].start == start:
        last = kept[-1]
        kept[-1] = Peak(start, max(last.demand, demand))
    else:
        kept.append(Peak(start, demand))
    return tuple(kept)


def observe(mem: Clumps, now: float, demand: float, waiting: float, ttft_target: float,
            settled: bool) -> Clumps:
    """One decision's sample. While replicas are starting (`settled` False, now or at the
    previous decision) a queue is the shortage they were ordered for, not a clump: the sample
    is the demand alone. The growth is measured from the previous decision, so both ends
    count: a replica that arrived in between drained part of the queue, and how much depends
    on when it arrived, not on the clump. So is the queue a new (or restarted) autoscaler
    finds at its first look: of unknown age, it is the capacity model's backlog to drain, not
    a clump to keep room for (one queue seen at a restart would otherwise set the room from a
    single sample)."""
    waiting = waiting if math.isfinite(waiting) and waiting > 0 else 0.0
    grown = waiting - mem.waiting if settled and mem.settled and mem.seen else 0.0
    x = seconds_demand(demand, grown, ttft_target)
    return Clumps(remember(mem.peaks, now, x), waiting, seen=True, settled=settled)


def room(peaks: Sequence[Peak], quantile: float, per_replica: float) -> float:
    """Replicas (fractional) the clumps of the remembered minutes need: the `quantile` of the
    minutes' peaks over one replica's throughput; 0 without peaks or a capacity."""
    if not peaks or not per_replica > 0:
        return 0.0
    values = sorted(p.demand for p in peaks)
    q = min(1.0, max(0.0, quantile))
    # the smallest peak that at least `q` of the minutes stay within
    i = min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))
    return values[i] / per_replica
