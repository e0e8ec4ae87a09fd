"""Local prefill: when to serve a disaggregated request on a decode engine alone.

Decode engines have spare compute while prefill queues: a decode engine can prefill a prompt
itself (chunked prefill, no KV transfer) in the same steps that decode its running batch.
Each such step costs the running sequences inter-token latency, so a decode engine takes at
most the prefill chunk that keeps its step within the decode role's ITL budget; that chunk
comes from measured mixed-step costs (`MixedStepTable`, presets from
shared/calibration/h200-mixedstep.json: an 8B decode engine on an H200 keeps 50 ms with a
~1,300-token chunk at batch 128, a 70B TP2 one only with ~230 tokens at batch 64).

Pure: no I/O, no clock. The router calls `decide` for every disaggregated request; the engine
simulator imports the same function, so the bench models exactly what the router does.

    decide(prompt_tokens, prefill, decode, policy, active) -> Decision

Inputs (what a router knows of its engines; a simulator passes the same quantities):
- `prompt_tokens`: the request's prompt length (the router estimates it, ~4 characters a token).
- `prefill`: one `PrefillLoad(queued_tokens, tokens_per_s, cached_tokens=0)` per prefill
  engine that can take work: prompt tokens queued or being prefilled there, what it prefills
  per second when busy, and how many of this prompt's tokens it is expected to hold in its
  prefix cache (prefix-aware routing; those are not computed). Empty (no prefill engine) means
  an infinite wait.
- `decode`: one `DecodeLoad(running, local_tokens, cached_tokens=0)` per decode engine that
  can take work: sequences it is decoding, prompt tokens it was given to prefill locally that
  are not prefilled yet, and this prompt's tokens it is expected to hold.
- `policy`: `LocalPrefillPolicy(ttft_s, itl_s, cost, enter=1.0, exit=0.5, enabled=True,
  max_chunk_tokens=8192)`; `cost` is anything with `step_s(decode_batch, prefill_chunk)`
  (seconds of one engine step), e.g. a `MixedStepTable` or a simulator's step model.
- `active`: the hysteresis state the previous call returned (`Decision.active`; False at
  start). One state per router (per pool in a simulator).

Rule:
1. The P/D path's expected prefill wait is `min over prefill engines of (queued_tokens +
   prompt_tokens - cached_tokens) / tokens_per_s` (the router sends to the least loaded one).
2. Hysteresis: fallback turns on when that wait exceeds `enter x ttft_s` and stays on until
   it drops below `exit x ttft_s` (prefill has caught up), so the path does not flap.
3. While on, each request goes to the decode engine with the earliest local first token,
   `(local_tokens + prompt_tokens - cached_tokens) / rate` (so among the engines with
   headroom the one holding the prompt's prefix is preferred), where
   `rate = chunk / step_s(running, chunk)` and `chunk` is the largest prefill chunk whose
   step stays within `itl_s` at that engine's batch (0: no headroom, the batch alone uses the
   budget). It goes local only if that beats the
   prefill wait, so local work cannot pile up past what the prefill role would do.
4. The step costs are scaled to the pool's hardware (`calibrated`): by how much slower the
   prefill engines measure than the preset's GPU, once the router has measured them
   (`RateEstimate.measured`). The router decides with the policy it returns.

Output: `Decision(local, engine, active, reason, prefill_wait_s, local_ttft_s)`; `engine`
indexes `decode` when `local`. Reasons: "prefill_behind" (local), "prefill_ok",
"no_decode_headroom" (fallback on but no decode engine would be faster), "disabled".
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import Protocol

# Reasons (the first is also a label value of poolpilot_router_local_prefill_total).
PREFILL_BEHIND = "prefill_behind"
KV_TRANSFER_FAILED = "kv_transfer_failed"  # the router's retry paths; not decided here
PREFILL_FAILED = "prefill_failed"  # ... the prefill failed on every prefill engine (or none)
PREFILL_OK = "prefill_ok"
NO_DECODE_HEADROOM = "no_decode_headroom"
DISABLED = "disabled"


class StepCost(Protocol):
    def step_s(self, decode_batch: int, prefill_chunk: int) -> float:
        """Seconds one engine step takes with `decode_batch` decoding sequences and a prefill
        chunk of `prefill_chunk` tokens (non-decreasing in both)."""
        ...


@dataclass(frozen=True)
class PrefillLoad:
    queued_tokens: float
    tokens_per_s: float
    cached_tokens: float = 0.0  # of this prompt, expected in its prefix cache (not computed)


@dataclass(frozen=True)
class DecodeLoad:
    running: int
    local_tokens: float = 0.0
    cached_tokens: float = 0.0  # as PrefillLoad's


@dataclass(frozen=True)
class LocalPrefillPolicy:
    ttft_s: float  # the pool's TTFT target
    itl_s: float  # the decode role's ITL budget: a mixed step may take this long
    cost: StepCost
    enter: float = 1.0  # fallback on when prefill wait > enter x ttft_s
    exit: float = 0.5  # ... and off again when it drops below exit x ttft_s
    enabled: bool = True
    max_chunk_tokens: int = 8192  # the engine's max-num-batched-tokens


@dataclass(frozen=True)
class Decision:
    local: bool
    engine: int | None  # index into `decode` when local
    active: bool  # hysteresis state for the next call
    reason: str
    prefill_wait_s: float
    local_ttft_s: float  # best decode engine's expected first token (inf: none has headroom)


def max_chunk(cost: StepCost, decode_batch: int, itl_s: float, limit: int = 8192) -> int:
    """Largest prefill chunk (tokens) whose mixed step keeps within `itl_s`; 0 if none."""
    if cost.step_s(decode_batch, 0) > itl_s:
        return 0
    lo, hi = 0, max(0, limit)
    while lo < hi:  # step_s is monotone in the chunk: binary search
        mid = (lo + hi + 1) // 2
        if cost.step_s(decode_batch, mid) <= itl_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def local_rate(cost: StepCost, decode_batch: int, itl_s: float, limit: int = 8192) -> float:
    """Prompt tokens/s a decode engine prefills on top of its batch within the ITL budget."""
    try:  # the router asks per request and decode engine: remember (hashable costs only)
        return _cached_local_rate(cost, decode_batch, itl_s, limit)  # type: ignore[arg-type]
    except TypeError:
        return _local_rate(cost, decode_batch, itl_s, limit)


def _local_rate(cost: StepCost, decode_batch: int, itl_s: float, limit: int) -> float:
    chunk = max_chunk(cost, decode_batch, itl_s, limit)
    return chunk / cost.step_s(decode_batch, chunk) if chunk > 0 else 0.0


_cached_local_rate = lru_cache(maxsize=4096)(_local_rate)


@dataclass(frozen=True)
class ScaledStepCost:
    """Step costs measured on other hardware, stretched by `factor` (> 1: this pool is slower)."""

    base: StepCost
    factor: float

    def step_s(self, decode_batch: int, prefill_chunk: int) -> float:
        return self.base.step_s(decode_batch, prefill_chunk) * self.factor


def calibrated(policy: LocalPrefillPolicy, prefill_tokens_per_s: float) -> LocalPrefillPolicy:
    """`policy` with its step costs scaled to this pool's hardware.

    The presets were measured on one GPU (an H200); a pool on another (an A100 is ~3x slower)
    would be told its decode engines prefill locally ~3x faster than they do, and the fallback
    would pile work on them that P/D requests then queue behind. The prefill engines' measured
    throughput (`RateEstimate`, learned from every P/D prefill) against the preset's says how
    much slower this hardware is; mixed steps are taken to be slower by the same factor. Costs
    without a reference throughput are used as they are."""
    reference = getattr(policy.cost, "prefill_tokens_per_s", None)
    if not reference or not prefill_tokens_per_s > 0 or not math.isfinite(prefill_tokens_per_s):
        return policy
    factor = round(min(max(reference / prefill_tokens_per_s, 0.1), 10.0), 2)
    return policy if factor == 1.0 else _scaled_policy(policy, factor)


@lru_cache(maxsize=256)  # one policy per rounded factor: local_rate's cache keys on the cost
def _scaled_policy(policy: LocalPrefillPolicy, factor: float) -> LocalPrefillPolicy:
    return replace(policy, cost=ScaledStepCost(policy.cost, factor))


def prefill_wait(prompt_tokens: float, prefill: Sequence[PrefillLoad]) -> float:
    waits = [(p.queued_tokens + max(0.0, prompt_tokens - p.cached_tokens)) / p.tokens_per_s
             for p in prefill if p.tokens_per_s > 0]
    return min(waits, default=math.inf)


def decide(
    prompt_tokens: float,
    prefill: Sequence[PrefillLoad],
    decode: Sequence[DecodeLoad],
    policy: LocalPrefillPolicy,
    active: bool,
) -> Decision:
    wait = prefill_wait(prompt_tokens, prefill)
    if not policy.enabled:
        return Decision(False, None, False, DISABLED, wait, math.inf)
    limit = policy.exit if active else policy.enter
    on = wait > limit * policy.ttft_s
    if not on:
        return Decision(False, None, False, PREFILL_OK, wait, math.inf)
    best, best_ttft = None, math.inf
    for i, d in enumerate(decode):
        rate = local_rate(policy.cost, d.running, policy.itl_s, policy.max_chunk_tokens)
        if rate <= 0:
            continue
        ttft = (d.local_tokens + max(0.0, prompt_tokens - d.cached_tokens)) / rate
        if ttft < best_ttft:
            best, best_ttft = i, ttft
    if best is None or best_ttft >= wait:
        return Decision(False, None, True, NO_DECODE_HEADROOM, wait, best_ttft)
    return Decision(True, best, True, PREFILL_BEHIND, wait, best_ttft)


@dataclass(frozen=True, eq=False)  # identity hash: cheap to memoize on
class MixedStepTable:
    """Measured step times of a decode batch plus a prefill chunk, interpolated.

    `rows` are (decode_batch, prefill_chunk, step_s). Within a batch row the step time is
    piecewise linear in the chunk (linear past the largest chunk measured); between batch
    rows it is linear in the batch (linear past the largest batch, the smallest batch's time
    below it: never optimistic)."""

    rows: tuple[tuple[int, int, float], ...]
    prefill_tokens_per_s: float  # a prefill-only engine of the same model and GPU

    @cached_property
    def _by_batch(self) -> dict[int, tuple[list[int], list[float]]]:
        out: dict[int, tuple[list[int], list[float]]] = {}
        for b, c, s in sorted(self.rows):
            chunks, steps = out.setdefault(b, ([], []))
            chunks.append(c)
            steps.append(s)
        return out

    @staticmethod
    def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
        if len(xs) == 1 or x <= xs[0]:
            return ys[0]
        i = min(max(bisect.bisect_right(xs, x), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    def step_s(self, decode_batch: int, prefill_chunk: int) -> float:
        table = self._by_batch
        batches = sorted(table)
        at_batch = [self._interp(*table[b], prefill_chunk) for b in batches]
        return self._interp(batches, at_batch, decode_batch)


def _table(steps: dict[int, dict[int, float]], prefill_tokens_per_s: float) -> MixedStepTable:
    return MixedStepTable(
        tuple((b, c, s / 1000) for b, row in steps.items() for c, s in row.items()),
        prefill_tokens_per_s,
    )


# Graph-mode step times (ms) from shared/calibration/h200-mixedstep.json (one H200, bf16,
# every decode sequence at 2,048 tokens of context); prefill-only throughput from
# h200-steptime.json (2,048-token prefill: 8B 56.9 ms, 70B one GPU of TP2 270 ms).
PRESETS: dict[str, MixedStepTable] = {
    "llama-3.1-8b/h200": _table({
        16: {0: 7.34, 128: 8.75, 256: 11.52, 512: 17.70, 1024: 30.71, 2048: 60.50, 4096: 121.0},
        64: {0: 10.42, 128: 12.78, 256: 15.51, 512: 22.34, 1024: 36.05, 2048: 65.93,
             4096: 127.2},
        128: {0: 16.03, 128: 17.84, 256: 22.08, 512: 28.15, 1024: 41.58, 2048: 73.67,
              4096: 131.3},
    }, 2048 / 0.0569),
    "llama-3.1-70b-tp2/h200": _table({
        16: {0: 24.36, 256: 43.78, 512: 73.17, 1024: 138.7, 2048: 275.1},
        64: {0: 28.50, 256: 52.58, 512: 83.36, 1024: 151.4, 2048: 288.9},
    }, 2048 / 0.270),
}
# Model names (Hugging Face ids or short names, lower case) -> preset.
MODEL_PRESETS = {
    "meta-llama/llama-3.1-8b-instruct": "llama-3.1-8b/h200",
    "meta-llama/llama-3.1-8b": "llama-3.1-8b/h200",
    "llama-3.1-8b": "llama-3.1-8b/h200",
    "meta-llama/llama-3.1-70b-instruct": "llama-3.1-70b-tp2/h200",
    "meta-llama/llama-3.1-70b": "llama-3.1-70b-tp2/h200",
    "llama-3.1-70b": "llama-3.1-70b-tp2/h200",
}


def preset_for_model(model: str | None) -> str | None:
    """The preset measured for a model, if any."""
    return MODEL_PRESETS.get((model or "").lower())


@dataclass
class RateEstimate:
    """Prefill throughput learned from completed prefills: an exponentially weighted mean of
    tokens / seconds samples, starting from a seed (the preset's prefill-only throughput).

    A sample is (prompt tokens the engine had queued when this request was sent, including
    its own) / (this request's prefill latency): with FIFO service that is the engine's rate
    while busy. Samples of fewer than `min_tokens` are dropped: an idle engine's short prompt
    measures its fixed per-request overhead, not its throughput. What overhead is left makes
    the estimate low, so the fallback turns on slightly early rather than late."""

    tokens_per_s: float
    alpha: float = 0.2
    min_tokens: float = 512.0
    samples: int = 0  # accepted so far

    @property
    def measured(self) -> bool:
        """Enough samples that the estimate says what the engines do, not what it was seeded
        with (e.g. a profile's number, or one set on purpose)."""
        return self.samples >= MEASURED_SAMPLES

    def observe(self, tokens: float, seconds: float) -> None:
        if tokens < self.min_tokens or seconds <= 0 or not math.isfinite(seconds):
            return
        self.samples += 1
        self.tokens_per_s += self.alpha * (tokens / seconds - self.tokens_per_s)


MEASURED_SAMPLES = 3
