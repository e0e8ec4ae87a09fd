"""Shaping a trace into the benchmark's workload: a time window and a rate scale.

`--rate-scale X` multiplies the request rate but keeps the trace's clock: an hour stays an
hour, so bursts, idle minutes and their timing against the pods' cold start are the trace's
own. Each request is replayed floor(X) times, plus once more with probability frac(X); every
copy after the first is shifted by a uniform offset in [-0.5, 0.5) s (seeded), so copies do
not arrive in lock-step. (Compressing time instead, as `traces.scale_rate` does for
the sandbox, would turn a 5-minute burst into a 1-minute one and change what autoscaling is
up against.) X < 1 thins the trace the same way. Hash ids (prefix blocks) are kept; each copy
after the first shares prefixes only with its own kind (see scale_load).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from poolpilot.engine_sim.traces import MOONCAKE_BLOCK_TOKENS, TraceRequest


def scale_load(trace: Sequence[TraceRequest], x: float, seed: int = 0) -> list[TraceRequest]:
    if x <= 0:
        raise ValueError(f"--rate-scale must be > 0, got {x}")
    rng = np.random.default_rng(seed)
    whole, frac = int(x), x - int(x)
    # Copy k's prompts share prefixes among themselves (its hash ids offset by k x the
    # trace's id span), never with another copy's: another user's conversation.
    span = 1 + max((h for r in trace for h in r.hash_ids), default=-1)
    out: list[TraceRequest] = []
    for r in trace:
        copies = whole + (1 if frac and rng.random() < frac else 0)
        for k in range(copies):
            t = r.arrival_s if k == 0 else max(0.0, r.arrival_s + float(rng.random()) - 0.5)
            out.append(replace(r, arrival_s=round(t, 6),
                               hash_ids=tuple(h + k * span for h in r.hash_ids)))
    out.sort()
    return out


def block_tokens(trace: Sequence[TraceRequest]) -> int:
    """The tokens one of the trace's hash ids stands for (a trace without ids: Mooncake's)."""
    sizes = {r.block_tokens for r in trace if r.hash_ids}
    if len(sizes) > 1:
        raise ValueError(f"the trace mixes hash blocks of {sorted(sizes)} tokens")
    return sizes.pop() if sizes else MOONCAKE_BLOCK_TOKENS


def first_seconds(trace: Sequence[TraceRequest], duration: float | None) -> list[TraceRequest]:
    if duration is None:
        return list(trace)
    if duration <= 0:
        raise ValueError(f"--duration must be > 0 seconds, got {duration}")
    return [r for r in trace if r.arrival_s < duration]
