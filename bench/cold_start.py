"""A replica's cold start as phases, and the named profiles of where its image and weights are.

`--cold-start S` gives the total; `--cold-start-phases pull=2,load=12,compile=5,graphs=6`
gives it as phases (the total is their sum), and `--cold-start-profile NAME` takes the
phases from a profile, scaled to the model and tensor parallelism of the run:

| profile | image | weights | compile |
|---|---|---|---|
| `warm-node` | on the node | in the node's page cache | vLLM's compile cache hit |
| `node-cache` | on the node | on the node's disk, page cache cold | compile cache hit |
| `hub` | on the node | downloaded from the Hugging Face Hub at each start | compiled at start |

Measured on an H200 (../shared/calibration/README.md, `h200-coldstart.json`): importing torch
5.5 s and CUDA init 0.4 s (the `load` phase's fixed part), weights from local disk at
1.4 GB/s with the page cache dropped and 5.3 GB/s from the page cache, 35 decode CUDA
graphs in 5.7 s. Assumed (not measured here; say so where a number is quoted): scheduling
and container start 1 s, a Hub download at 0.5 GB/s, compilation 5 s with a cache hit and
30 s without. A replica with tensor parallelism `tp` reads `weights / tp` bytes per GPU, its
GPUs in parallel; a download fetches the whole model to the node.
"""

from __future__ import annotations

from dataclasses import dataclass

from poolpilot.engine_sim.hardware import get_model

PHASES = ("pull", "download", "load", "compile", "graphs")

# Measured (calibration, H200): fixed start-up cost of an engine process, bandwidths, graphs.
IMPORT_AND_CUDA_S = 5.5 + 0.4
DISK_GBPS = 1.4  # local disk, page cache dropped
PAGE_CACHE_GBPS = 5.3
GRAPHS_S = 5.7
# Assumed (not measured here).
SCHEDULE_S = 1.0
HUB_GBPS = 0.5
COMPILE_CACHED_S = 5.0
COMPILE_COLD_S = 30.0

PROFILES = ("warm-node", "node-cache", "hub")


@dataclass(frozen=True)
class ColdStart:
    """Seconds per phase, in start-up order; `total` is what a scale-up waits."""

    phases: tuple[tuple[str, float], ...]

    @property
    def total(self) -> float:
        return sum(s for _, s in self.phases)

    def describe(self) -> str:
        return ", ".join(f"{n} {s:.1f}s" for n, s in self.phases) + f" = {self.total:.1f}s"

    def as_json(self) -> dict[str, float]:
        return {n: round(s, 3) for n, s in self.phases}


def parse_phases(text: str) -> ColdStart:
    """`pull=2,load=12,compile=5,graphs=6` -> ColdStart; errors name the phase and the fix."""
    out: list[tuple[str, float]] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, raw = part.partition("=")
        name = name.strip()
        if not sep or name not in PHASES:
            raise ValueError(f"--cold-start-phases: {part!r}: write PHASE=SECONDS with PHASE "
                             f"one of {', '.join(PHASES)}")
        if name in dict(out):
            raise ValueError(f"--cold-start-phases: {name} given twice")
        try:
            seconds = float(raw)
        except ValueError:
            raise ValueError(f"--cold-start-phases: {name}={raw.strip()!r} is not a number of "
                             "seconds") from None
        if not 0 <= seconds < float("inf"):
            raise ValueError(f"--cold-start-phases: {name} must be >= 0 seconds, got {seconds}")
        out.append((name, seconds))
    if not out:
        raise ValueError("--cold-start-phases: no phase given (e.g. pull=2,load=12,graphs=6)")
    return ColdStart(tuple(sorted(out, key=lambda p: PHASES.index(p[0]))))


def profile(name: str, model: str, tensor_parallel: int = 1) -> ColdStart:
    """The phases of profile `name` (module doc) for `model` at `tensor_parallel` GPUs."""
    if name not in PROFILES:
        raise ValueError(f"--cold-start-profile: unknown {name!r}; choose from "
                         f"{', '.join(PROFILES)}")
    gb = get_model(model).weight_bytes / 1e9
    per_gpu = gb / max(1, tensor_parallel)
    phases: tuple[tuple[str, float], ...]
    if name == "warm-node":
        phases = (("pull", SCHEDULE_S), ("load", IMPORT_AND_CUDA_S + per_gpu / PAGE_CACHE_GBPS),
                  ("compile", COMPILE_CACHED_S), ("graphs", GRAPHS_S))
    elif name == "node-cache":
        phases = (("pull", SCHEDULE_S), ("load", IMPORT_AND_CUDA_S + per_gpu / DISK_GBPS),
                  ("compile", COMPILE_CACHED_S), ("graphs", GRAPHS_S))
    else:  # hub
        phases = (("pull", SCHEDULE_S), ("download", gb / HUB_GBPS),
                  ("load", IMPORT_AND_CUDA_S + per_gpu / DISK_GBPS),
                  ("compile", COMPILE_COLD_S), ("graphs", GRAPHS_S))
    return ColdStart(phases)
