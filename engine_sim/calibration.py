"""The step-time model next to step times measured on one H200 (engine_sim/data/calibration).

Each measured row becomes a `Row`: what was measured, what `hardware.StepModel` gives for the
same work on one GPU (the all-reduce of a tensor-parallel group was not measured, so it is
left out), and the physical bound that applies:

* decode: the measurement is plain PyTorch (unfused ops) in a CUDA graph; vLLM's fused
  kernels are at least as fast, and nothing beats reading the weights and the KV once at the
  card's datasheet bandwidth. So `floor <= model <= measured`.
* prefill of >= 512 tokens: GEMM-bound, the same cuBLAS GEMMs as vLLM: within 15%.
  (Shorter ones were run eagerly and are dominated by kernel launches vLLM's graphs avoid.)
* mixed (a decode batch plus one prefill chunk, both in one CUDA graph): within 25%.

`poolpilot sim calibration` prints the table docs/engine-simulator.md shows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from .hardware import StepModel, make_step_model

DATA = "data/calibration"
PREFILL_MIN_TOKENS = 512
PREFILL_TOLERANCE = 0.15
MIXED_TOLERANCE = 0.25

# measured model name -> (hardware.py model, tensor parallel): the measurement is one GPU's
# share of a TP group (half the heads, MLP width and vocabulary for TP 2)
MEASURED_MODELS = {
    "llama-3.1-8b": ("llama-3.1-8b", 1),
    "llama-3.1-70b-tp2-per-gpu": ("llama-3.1-70b", 2),
}


@cache
def load(name: str) -> dict[str, Any]:
    """One JSON file of the measurement (h200-steptime.json, h200-mixedstep.json)."""
    text = resources.files("poolpilot.engine_sim").joinpath(DATA, name).read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def step_model(measured_model: str) -> StepModel:
    model, tp = MEASURED_MODELS[measured_model]
    return make_step_model(model, "h200", tp)


def per_gpu_shape(sm: StepModel) -> dict[str, int]:
    """The shapes one GPU of the model's TP group computes, named as the measurement names
    them (steptime.py's Model arguments)."""
    m, tp = sm.model, sm.tp
    return {"layers": m.layers, "hidden": m.hidden, "heads": m.heads // tp,
            "kv_heads": m.kv_heads // tp, "head_dim": m.head_dim,
            "inter": m.intermediate // tp, "vocab": m.vocab // tp}


@dataclass(frozen=True)
class Row:
    kind: str  # decode | prefill | mixed
    model: str  # the measurement's model name
    label: str  # the work, e.g. "batch 16, context 1024"
    measured: float  # seconds
    modelled: float  # seconds, one GPU, no all-reduce
    floor: float | None = None  # decode: (weights + KV) / datasheet bandwidth

    @property
    def ratio(self) -> float:
        return self.modelled / self.measured

    @property
    def bound(self) -> str:
        if self.kind == "decode":
            return "floor <= model <= measured"
        tol = PREFILL_TOLERANCE if self.kind == "prefill" else MIXED_TOLERANCE
        return f"within {tol:.0%}"

    @property
    def inside(self) -> bool:
        if self.kind == "decode":
            assert self.floor is not None
            return self.floor <= self.modelled <= self.measured
        tol = PREFILL_TOLERANCE if self.kind == "prefill" else MIXED_TOLERANCE
        return abs(self.ratio - 1.0) <= tol


def decode_floor(sm: StepModel, batch: int, context: int) -> float:
    """Weights plus every sequence's KV read once at the datasheet bandwidth, one GPU."""
    m = sm.model
    return (m.streamed_weight_bytes + batch * context * m.kv_bytes_per_token) / sm.tp \
        / sm.gpu.mem_bandwidth


def rows() -> list[Row]:
    steps = load("h200-steptime.json")["models"]
    mixed = load("h200-mixedstep.json")["models"]
    out: list[Row] = []
    for name in MEASURED_MODELS:
        sm = step_model(name)
        for r in steps[name]["decode"]:
            b, c = r["batch"], r["context"]
            t = sm.step_time([(1, c)] * b, all_reduce=False)
            out.append(Row("decode", name, f"batch {b}, context {c}", r["step_s_graph"], t,
                           decode_floor(sm, b, c)))
        for r in steps[name]["prefill"]:
            n, s = r["tokens"], r["seqs"]
            if n < PREFILL_MIN_TOKENS:
                continue
            t = sm.step_time([(n // s, 0)] * s, sampled=s, all_reduce=False)
            label = f"{n} tokens" + (f" ({s} x {n // s})" if s > 1 else "")
            out.append(Row("prefill", name, label, r["step_s"], t))
        for r in mixed[name]["rows"]:
            b, c, chunk = r["decode_batch"], r["context"], r["prefill_chunk"]
            work = [(1, c)] * b + ([(chunk, 0)] if chunk else [])
            t = sm.step_time(work, all_reduce=False)
            out.append(Row("mixed", name, f"batch {b} + chunk {chunk}", r["step_s_graph"], t))
    return out


def markdown(table: list[Row]) -> str:
    lines = ["| kind | model (one GPU) | step | measured | model | floor | model / measured "
             "| bound |", "|---|---|---|---:|---:|---:|---:|---|"]
    for r in table:
        floor = f"{r.floor * 1e3:.2f} ms" if r.floor is not None else ""
        mark = "" if r.inside else " **outside**"
        lines.append(f"| {r.kind} | {r.model} | {r.label} | {r.measured * 1e3:.2f} ms "
                     f"| {r.modelled * 1e3:.2f} ms | {floor} | {r.ratio:.2f} | {r.bound}{mark} |")
    return "\n".join(lines)
