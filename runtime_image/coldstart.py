"""The phases of an engine's cold start, read from vLLM's own log lines. Pure: lines and the
times they arrived in, phases out (the launcher's log watcher does the I/O).

Each phase ends at a milestone vLLM logs (vLLM 0.32; the patterns are the messages' fixed
parts, so a changed number or path still matches):

| phase     | ends when vLLM logs                                                          |
|-----------|------------------------------------------------------------------------------|
| `import`  | its first log line (python, torch and vLLM imported)                         |
| `engine`  | `Initializing a V1 LLM engine` (config resolved, engine core process up)     |
| `weights` | `Loading weights took` / `Model loading took` (the last of them)             |
| `compile` | the last torch.compile line: `saved AOT compiled function`, `Directly load`, |
|           | `Compiling a graph for`, `torch.compile took`, `Warming up done.` (CPU)      |
| `graphs`  | `Graph capturing finished in` (CUDA graphs; not on CPU)                      |
| `warmup`  | `init engine (profile, create kv cache, warmup model) took`                  |
| `server`  | `Starting vLLM server on` / `Application startup complete`                   |
| `ready`   | the first `/health` answered 200 (the launcher asks; or the access-log line) |

A phase lasts from the previous milestone that happened (the launcher's start for `import`)
to its own, so the phases add up to `total`. One that did not happen has no value: `compile`
with `--enforce-eager`, `graphs` on CPU. Times are the lines' arrival (vLLM's own log stamps
have whole seconds only).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from poolpilot.metrics import COLD_START_PHASES, COLD_START_TOTAL

# vLLM's log format: an optional "(EngineCore pid=12) " prefix, then level and date.
_VLLM_LINE = re.compile(r"^(?:\([\w.-]+ pid=\d+\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                        r"\d\d-\d\d \d\d:\d\d:\d\d ")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# phase -> the message parts that end it
MILESTONES: dict[str, tuple[str, ...]] = {
    "engine": ("Initializing a V1 LLM engine",),
    "weights": ("Loading weights took", "Model loading took"),
    "compile": ("saved AOT compiled function", "Directly load AOT compilation",
                "Directly load the compiled graph", "Compiling a graph for compile range",
                "Cache the graph of compile range", "torch.compile took",
                "torch.compile and initial profiling/warmup run together took",
                "Initial profiling/warmup run took", "Warming up done.",
                "Compiling model again due to a load failure"),
    "graphs": ("Graph capturing finished in",),
    "warmup": ("init engine (profile, create kv cache, warmup model) took",),
    "server": ("Starting vLLM server on", "Application startup complete"),
    "ready": ('"GET /health HTTP/1.1" 200',),
}
# vLLM found its compiled artifacts in VLLM_CACHE_ROOT / compiled them (and saved them there).
CACHE_HIT = ("Directly load AOT compilation", "Directly load the compiled graph")
# (a load failure: the artifacts were there but could not be used, and vLLM compiled again)
CACHE_MISS = ("saved AOT compiled function", "Compiling a graph for compile range",
              "Cache the graph of compile range", "Compiling model again due to a load failure")


def vllm_line(line: str) -> bool:
    """A line in vLLM's log format."""
    return _VLLM_LINE.match(_ANSI.sub("", line)) is not None


def milestone(line: str) -> str | None:
    """The phase this log line ends, or None."""
    text = _ANSI.sub("", line)
    for phase, parts in MILESTONES.items():
        if any(p in text for p in parts):
            return phase
    return "import" if _VLLM_LINE.match(text) else None


@dataclass(frozen=True)
class Timeline:
    """What one start has shown so far: the launcher's start (`origin`, seconds on any clock),
    when each milestone was reached, whether torch.compile hit its cache. `ready` comes from
    `seen` (the access log) or `reached_ready` (the launcher's own health check)."""

    origin: float
    marks: Mapping[str, float] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0

    def seen(self, line: str, at: float) -> Timeline:
        """This timeline with one more log line that arrived at `at`."""
        phase = milestone(line)
        if phase is None or "ready" in self.marks:
            return self
        marks = dict(self.marks)
        if phase == "import":
            marks.setdefault("import", at)  # the first vLLM line
        elif phase == "ready":
            marks["ready"] = at
        else:
            marks.setdefault("import", at)
            marks[phase] = at  # the last line of a phase ends it
        hits = self.hits + any(p in line for p in CACHE_HIT)
        misses = self.misses + any(p in line for p in CACHE_MISS)
        return replace(self, marks=marks, hits=hits, misses=misses)

    def reached_ready(self, at: float) -> Timeline:
        if "ready" in self.marks:
            return self
        return replace(self, marks={**self.marks, "ready": at})

    @property
    def ready(self) -> bool:
        return "ready" in self.marks

    @property
    def compile_cache_hit(self) -> bool | None:
        """True: every compiled graph came from the cache; False: vLLM compiled some; None:
        nothing compiled (torch.compile off)."""
        if self.misses:
            return False
        return True if self.hits else None

    def phases(self) -> dict[str, float]:
        """Seconds per phase that happened, in their order, and `total` (once ready)."""
        return phases(self.origin, self.marks)


def phases(origin: float, marks: Mapping[str, float]) -> dict[str, float]:
    """Phase durations from milestone times: each from the previous milestone reached (a
    milestone logged out of order counts from the latest before it), `total` once ready."""
    out: dict[str, float] = {}
    last = origin
    for phase in COLD_START_PHASES:
        at = marks.get(phase)
        if at is None:
            continue
        out[phase] = max(0.0, at - last)
        last = max(last, at)
    if "ready" in marks:
        out[COLD_START_TOTAL] = max(0.0, marks["ready"] - origin)
    return out


def timeline(lines: Iterable[tuple[float, str]], origin: float) -> Timeline:
    """The timeline of (arrival time, line) pairs."""
    t = Timeline(origin)
    for at, line in lines:
        t = t.seen(line, at)
    return t


def describe(t: Timeline) -> str:
    """One log line: "cold start 75.3 s: import 8.1 s, engine 19.0 s, ..., compile cache miss"."""
    ph = t.phases()
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in ph.items() if k != COLD_START_TOTAL)
    cache = {True: "hit", False: "miss", None: "not used"}[t.compile_cache_hit]
    total = ph.get(COLD_START_TOTAL)
    head = f"cold start {total:.1f} s" if total is not None else "cold start (not ready)"
    return f"{head}: {parts}; compile cache {cache}"
