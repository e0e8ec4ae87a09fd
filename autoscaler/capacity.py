"""The capacity model: what a role must serve, and how many replicas that takes one cold start
from now. Pure arithmetic on plain numbers (no I/O, no clock); the `decide` package feeds it.

Per role, in its own unit (prompt tokens for prefill, generated tokens for decode):

- **demand** `rate`: tokens/s arriving now. For prefill: the prompt tokens the prefill engines
  processed, plus those the router prefilled on decode engines because prefill was behind
  (local-prefill fallback), plus the growth of the queue (arrivals the engines did not get to);
- **backlog** `B`: tokens queued at the role's engines (waiting and running requests times the
  mean prompt length);
- **forecast** `rate_ahead`: the demand one cold start `H` from now, the current rate plus the
  rising part of its trend (least squares over the last `window` seconds); never below now;
- **capacity on its way**: replicas asked for but still starting serve from when they are
  ready (their order time plus the cold start), so the backlog left when a replica ordered now
  would land is `B_H = max(0, B + arrivals over H - what the ready and starting replicas
  serve within H)`;
- **replicas**, with `C` the tokens/s one replica serves and `h` the headroom kept free:

      needed_ahead = (rate_ahead + B_H / drain) / (C (1 - h))     # to order now (scale up)
      needed_now   = (rate + B / drain) / (C (1 - h))             # to keep now (scale down)

  A scale-up orders `ceil(needed_ahead)`: the backlog that the pool drains before a new
  replica could arrive is not ordered again. A scale-down keeps `ceil(needed_now)`: replicas
  go as soon as the demand and the backlog no longer need them.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from poolpilot.autoscaler.frozen import replace

# How much a new cold-start sample moves the learned value (EWMA weight).
COLD_START_ALPHA = 0.5
# Backlog growth is measured over this many seconds of samples (the queue gauge is instant).
GROWTH_WINDOW = 30.0
# A trend needs at least TREND_MIN_SAMPLES samples spanning TREND_MIN_SPAN seconds: three
# (two always fit a line, one noisy scrape setting its slope) over two scrape intervals. This
# binds only where the history is short, when a role's series begins or after a gap: a ramp
# from a pool's first minute is seen 45 s sooner than with four over 60 s (docs/autoscaler.md).
TREND_MIN_SAMPLES = 3
TREND_MIN_SPAN = 30.0


@dataclass(frozen=True)
class Sample:
    time: float
    rate: float  # demand arriving, tokens/s (prefill: prompt tokens, cached or not)
    backlog: float  # tokens queued
    computed: float | None = None  # of `rate`, the tokens/s to compute (prefill: cache misses)


@dataclass(frozen=True)
class Memory:
    """What the model remembers of one role between decisions (kept in `History.memory`).

    `seen`: (time, replicas asked, ready) at the previous decision. `orders`: times of
    scale-ups whose pods are not ready yet, oldest first. `cold_start`: learned seconds from a
    scale-up to a ready replica. `samples`: demand samples within the forecast window.
    `measured`: the cold start has been learned from measured starts (`learn_measured`), which
    the ready transitions then no longer move.
    `tokens_per_request`: the last known mean prompt length (prefill). `busy_since`: when the
    role's current saturated stretch began (None: not saturated). `first_seen`: the first
    decision with the role's rates (a rate window that reaches back before the series began
    underestimates, and would read as a rising trend). `headroom`: the learned share of
    capacity to keep free (None: the policy's). `shrunk`: when the ready count last fell.
    """

    seen: tuple[float, int, int] | None = None
    orders: tuple[float, ...] = ()
    cold_start: float | None = None
    samples: tuple[Sample, ...] = ()
    tokens_per_request: float | None = None
    busy_since: float | None = None
    first_seen: float | None = None
    headroom: float | None = None
    measured: bool = False
    shrunk: float | None = None


def _ordered_times(samples: Sequence[Sample]) -> list[float] | None:
    """The samples' times when they are in time order, else None.

    They are, unless the clock stepped back between two decisions. In order, the windows
    below are found by bisection instead of a scan of every sample: a role keeps a
    history_window of samples (120 at 15 s), and those scans were most of a decision's CPU
    once the history had filled. Out of order, each function scans as its
    definition says, so both paths give the same answer."""
    times = [s.time for s in samples]
    # (a NaN fails every comparison: the pairs catch one among two samples or more)
    ordered = all(a <= b for a, b in itertools.pairwise(times)) and not (
        len(times) == 1 and math.isnan(times[0]))
    return times if ordered else None


def after(samples: Sequence[Sample], t: float) -> tuple[Sample, ...]:
    """The samples later than `t`, in their order."""
    times = _ordered_times(samples)
    if times is not None:
        return tuple(samples[bisect.bisect_right(times, t):])
    return tuple(s for s in samples if s.time > t)


def track_starts(mem: Memory, replicas: int, ready: int, now: float) -> Memory:
    """Follow the role's pods: a rise in replicas asked is an order (placed at the previous
    decision, when this autoscaler scaled); a fall cancels the newest orders (starting pods go
    first); a rise in ready replicas completes the oldest orders and teaches the cold start
    (unless measured starts teach it: `learn_measured`); a fall is remembered (`shrunk`)."""
    orders = list(mem.orders)
    cold = mem.cold_start
    shrunk = mem.shrunk
    if mem.seen is not None:
        t0, asked0, ready0 = mem.seen
        if ready < ready0:
            shrunk = now
        if replicas > asked0:
            orders += [t0] * (replicas - asked0)
        elif replicas < asked0:
            del orders[max(0, len(orders) - (asked0 - replicas)):]
        if ready > ready0:
            done, orders = orders[: ready - ready0], orders[ready - ready0:]
            for t in done if not mem.measured else ():
                sample = now - t
                cold = sample if cold is None else cold + COLD_START_ALPHA * (sample - cold)
    return replace(mem, seen=(now, replicas, ready), orders=tuple(orders), cold_start=cold,
                   shrunk=shrunk)


def learn_measured(mem: Memory, samples: Sequence[float]) -> Memory:
    """Learn the cold start from measured starts of new pods (seconds from the pod's creation
    to its engine's first /health 200: the pod's own timestamps and the phases the engine
    launcher measured), in the order they became ready. The first replaces what the ready
    transitions taught (a transition is seen at the next decision, up to one interval late,
    and is matched to the oldest order, whichever pod it was); the next move it as they would
    (COLD_START_ALPHA). Samples that are no duration (NaN, <= 0) are left out."""
    cold, measured = mem.cold_start, mem.measured
    for sample in samples:
        if not (math.isfinite(sample) and sample > 0):
            continue
        cold = sample if not measured or cold is None else (
            cold + COLD_START_ALPHA * (sample - cold))
        measured = True
    return replace(mem, cold_start=cold, measured=measured)


def remember(mem: Memory, now: float, rate: float, backlog: float, window: float,
             computed: float | None = None) -> Memory:
    """Add a demand sample; those older than `window` go."""
    first = mem.first_seen if mem.first_seen is not None else now
    keep = after(mem.samples, now - window)
    return replace(mem, first_seen=first,
                   samples=(*keep, Sample(now, rate, backlog, computed)))


def computed_share(samples: Sequence[Sample], default: float) -> float:
    """The share of the demand that arrived over the samples which the role computed
    (prefill: what its prefix cache did not serve), weighted by the demand; `default` when
    no sample carries one, or none had demand."""
    known = [s for s in samples if s.computed is not None]
    arrived = sum(s.rate for s in known)
    if not arrived > 0:
        return default
    return sum(s.computed or 0.0 for s in known) / arrived


def upside(samples: Sequence[Sample], now: float, horizon: float, quantile: float) -> float:
    """How far the demand rose within one cold start in the recent past: for every sample at
    least `horizon` old, the highest demand in the `horizon` after it minus the demand then;
    the `quantile` of those rises (0 without a full horizon of history). A pool that keeps
    this much above its demand rides out the rises it has seen while a replica ordered at
    their start is on its way."""
    times = _ordered_times(samples)
    ordered = times is not None
    times = times if times is not None else [s.time for s in samples]
    rates = [s.rate for s in samples]
    last = now - horizon + 1e-9
    rises = []
    for i, t in enumerate(times):
        if t > last:
            break
        # j: the first sample after i beyond one horizon from it
        reach = t + horizon + 1e-9
        if ordered:
            j = bisect.bisect_right(times, reach, i + 1)
        else:
            j = i + 1
            while j < len(times) and not times[j] > reach:
                j += 1
        rises.append(max(rates[i:j]) - rates[i])  # the peak from i on, minus the demand then
    if not rises:
        return 0.0
    rises.sort()
    return rises[min(len(rises) - 1, int(quantile * len(rises)))]


# How far one observation moves the learned headroom: up at a breach, down when the pool
# served more than its target utilization within the SLO.
HEADROOM_UP = 0.05
HEADROOM_DOWN = 0.02
HEADROOM_RANGE = (0.05, 0.7)


def service_headroom(service_s: float, target_s: float) -> float:
    """The prefill headroom to start from before one is learned: the share of the TTFT target
    one prompt takes to compute on a replica (its computed tokens over the per-replica rate).
    What a prompt spends computing is not left for waiting behind others, so a pool of prompts
    that each take a quarter of the target keeps at least a quarter of each replica free (a
    prompt's wait grows with the work queued ahead of it, and the longer each prompt, the
    sooner a queue costs a whole target). Short prompts leave the policy's default in place,
    and so do prompts that take the whole target or more: those breach it on an idle replica,
    and capacity kept idle would buy nothing (the bench's `slo_ceiling` counts them)."""
    if target_s <= 0 or service_s <= 0 or service_s >= target_s:
        return 0.0
    return min(HEADROOM_RANGE[1], service_s / target_s)


def learn_headroom(headroom: float, utilization: float, latency: float, target: float,
                   band: float, queued: bool) -> float:
    """The capacity kept free, learned from the SLO itself: a latency above its target band
    while the replicas ran below their target utilization (1 - headroom), with requests
    queued (a prompt too long for the target breaches it on an idle pool too, with none
    queued), means the target utilization is too high: keep more free. A latency below the
    band while they ran above it means less will do. Between the two it stays."""
    lo, hi = HEADROOM_RANGE
    if latency > target * (1 + band) and utilization < 1 - headroom and queued:
        return min(hi, headroom + HEADROOM_UP)
    if latency < target * (1 - band) and utilization > 1 - headroom:
        return max(lo, headroom - HEADROOM_DOWN)
    return headroom


def trend_samples(mem: Memory, rate_window: float) -> tuple[Sample, ...]:
    """The samples a trend may be fitted on: not those whose rate window reached back before
    the role's series began (they underestimate, and would read as a rising trend)."""
    start = (mem.first_seen or 0.0) + rate_window - 1e-9
    times = _ordered_times(mem.samples)
    if times is not None:
        return tuple(mem.samples[bisect.bisect_left(times, start):])
    return tuple(s for s in mem.samples if s.time >= start)


def backlog_growth(samples: Sequence[Sample], now: float, backlog: float) -> float:
    """Tokens/s the backlog grew by over the last GROWTH_WINDOW (0 when it shrank): arrivals
    that the engines did not process, which their token counters cannot show."""
    # The first sample within the window (bounds computed once: a role keeps up to
    # history_window of samples, 120 at 15 s, and this ran for each of them per decision).
    lo = now - GROWTH_WINDOW - 1e-9
    times = _ordered_times(samples)
    if times is not None:
        i = bisect.bisect_left(times, lo)
        first = samples[i] if i < len(times) and times[i] < now else None
    else:
        first = next((s for s in samples if lo <= s.time < now), None)
    if first is None:
        return 0.0
    return max(0.0, (backlog - first.backlog) / max(now - first.time, 1e-9))


def trend(samples: Sequence[Sample], window: float) -> float:
    """Slope of the demand (tokens/s per second) by least squares over the samples; 0 with
    too few of them to say (fewer than TREND_MIN_SAMPLES, or spanning less than
    TREND_MIN_SPAN)."""
    span = samples[-1].time - samples[0].time if samples else 0.0
    if len(samples) < TREND_MIN_SAMPLES or span < min(TREND_MIN_SPAN, window):
        return 0.0
    n = len(samples)
    mt = sum(s.time for s in samples) / n
    mr = sum(s.rate for s in samples) / n
    var = sum((s.time - mt) ** 2 for s in samples)
    if var <= 0:
        return 0.0
    return sum((s.time - mt) * (s.rate - mr) for s in samples) / var


@dataclass(frozen=True)
class Need:
    """The model's answer for one role (for the decision and its message)."""

    per_replica: float  # C, tokens/s one replica serves
    rate: float  # demand now, tokens/s
    rise: float  # how much it may rise within a cold start (`upside`)
    backlog: float  # tokens queued now
    rate_ahead: float  # demand one cold start ahead
    backlog_ahead: float  # backlog left when a replica ordered now would be ready
    horizon: float  # H, seconds
    drain: float  # seconds to drain a backlog in
    headroom: float
    local: float = 0.0  # tokens/s prefilled on decode engines (included in rate)
    trend_ahead: float = 0.0  # demand one cold start ahead by the trend alone
    unit: str = "tokens"  # what the rates count, for messages

    def _replicas(self, rate: float, backlog: float) -> float:
        return (rate + backlog / self.drain) / (self.per_replica * (1 - self.headroom))

    @property
    def now(self) -> float:
        """Replicas to keep now (fractional): the demand, the rise it may take before a
        replica ordered now could arrive, and the backlog."""
        return self._replicas(self.rate + self.rise, self.backlog)

    @property
    def ahead(self) -> float:
        """Replicas to have when one ordered now would land (fractional)."""
        return self._replicas(self.rate_ahead, self.backlog_ahead)

    @property
    def ahead_of_current(self) -> float:
        """As `ahead`, for the demand of now (without the forecast's rise)."""
        return self._replicas(self.rate, self.backlog_ahead)

    def describe(self) -> str:
        unit = self.unit
        local = f" incl. {self.local:.4g} prefilled on decode" if self.local else ""
        return (f"{unit} {self.rate:.4g}/s{local} (may rise {self.rise:.4g}/s), backlog "
                f"{self.backlog:.4g}, in {self.horizon:.0f}s "
                f"{self.rate_ahead:.4g}/s and backlog {self.backlog_ahead:.4g}; "
                f"{self.per_replica:.4g}/s per replica, headroom {self.headroom:g}, "
                f"drain {self.drain:g}s -> {self.now:.2f} now, {self.ahead:.2f} ahead")


def served_within(per_replica: float, ready: int, starting: int, orders: Sequence[float],
                  now: float, horizon: float) -> float:
    """Tokens the ready and starting replicas can serve within the next `horizon` seconds.
    A starting pod serves from its order time plus the cold start; one whose order this
    model did not see (a restarted autoscaler) is assumed half-way."""
    known = list(orders)[-starting:] if starting > 0 else []
    time = ready * horizon
    for t in known:
        time += max(0.0, horizon - max(0.0, t + horizon - now))
    time += (starting - len(known)) * horizon / 2
    return per_replica * time


def need(per_replica: float, rate: float, backlog: float, slope: float, horizon: float,
         drain: float, headroom: float, ready: int, starting: int, orders: Sequence[float],
         now: float, local: float = 0.0, rise: float = 0.0, unit: str = "tokens") -> Need:
    """The model for one role. `rise`: the `upside` of its demand; the forecast one cold start
    ahead is the larger of it and the rising trend (`slope` x horizon)."""
    rate_ahead = rate + max(rise, max(0.0, slope) * horizon)
    arrivals = (rate + rate_ahead) / 2 * horizon
    left = backlog + arrivals - served_within(per_replica, ready, starting, orders, now, horizon)
    return Need(per_replica, rate, rise, backlog, rate_ahead, max(0.0, left), horizon, drain,
                headroom, local, rate + max(0.0, slope) * horizon, unit)


def ceil(x: float) -> int:
    return max(0, math.ceil(x - 1e-9))
