"""Results out: a terminal table, the JSON document, a markdown table and the PNG plots."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from poolpilot.bench.replay import RunResult
from rich.console import Console
from rich.table import Table

COLUMNS = (
    ("policy", "policy"),
    ("SLO attain.", "slo_attainment"),
    ("TTFT p50", "ttft_p50"),
    ("TTFT p90", "ttft_p90"),
    ("TTFT p99", "ttft_p99"),
    ("ITL p90", "itl_p90"),
    ("GPU-hours", "gpu_hours"),
    ("goodput/GPU", "goodput_per_gpu"),
    ("scale events", "scale_events"),
    ("dir. changes", "direction_changes"),
    ("local prefill", "local_prefill_requests"),  # "-": the fallback was off
)


def fmt(key: str, v: Any) -> str:
    if isinstance(v, str):
        return v
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if key == "slo_attainment":
        return f"{100 * v:.1f}%"
    if key.startswith(("ttft", "itl")):
        return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"
    if key in ("gpu_hours", "goodput_per_gpu"):
        return f"{v:.2f}"
    return str(v)


def rows(results: Sequence[RunResult]) -> list[list[str]]:
    out = []
    for r in results:
        s = r.summary
        vals = {"policy": r.policy, **{k: getattr(s, k, None) for _, k in COLUMNS[1:]},
                "local_prefill_requests": r.local_prefill_requests}
        out.append([fmt(k, vals[k]) for _, k in COLUMNS])
    return out


def print_table(results: Sequence[RunResult], title: str, console: Console | None = None) -> None:
    t = Table(title=title)
    for head, _ in COLUMNS:
        t.add_column(head, justify="left" if head == "policy" else "right")
    for row in rows(results):
        t.add_row(*row)
    (console or Console()).print(t)


def markdown_table(results: Sequence[RunResult]) -> str:
    lines = ["| " + " | ".join(h for h, _ in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(results)]
    return "\n".join(lines)


def as_json(results: Sequence[RunResult], meta: Mapping[str, Any]) -> dict[str, Any]:
    return {**meta, "policies": {r.policy: r.as_json() for r in results}}


def plot(results: Sequence[RunResult], path: str | Path, title: str, slo_ttft: float) -> None:
    """Replicas per role over time per policy, and the TTFT p90 per minute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(3, 1, figsize=(9, 8.5), sharex=True)
    for r in results:
        tl = r.timeline
        mins = np.asarray(tl.t) / 60.0
        for ax, role in zip(axes[:2], ("prefill", "decode"), strict=True):
            ax.step(mins, tl.billed[role], where="post", label=r.policy, linewidth=1.2)
        arr = np.asarray([o.arrival for o in r.outcomes])
        ttft = np.asarray([o.ttft for o in r.outcomes])
        if arr.size:
            bins = (arr // 60).astype(int)
            xs, ys = [], []
            for b in range(int(bins.max()) + 1):
                sel = ttft[bins == b]
                if sel.size:
                    xs.append(b + 0.5)
                    ys.append(float(np.percentile(sel, 90, method="inverted_cdf")))
            ys_arr = np.minimum(np.asarray(ys), 1e4)
            axes[2].plot(xs, ys_arr, label=r.policy, linewidth=1.2)
    axes[0].set_ylabel("prefill pods\n(billed)")
    axes[1].set_ylabel("decode pods\n(billed)")
    axes[2].set_ylabel("TTFT p90 per\nminute (s)")
    axes[2].set_yscale("log")
    axes[2].axhline(slo_ttft, color="black", linestyle="--", linewidth=0.8, label="TTFT SLO")
    axes[2].set_xlabel("trace time (minutes)")
    axes[0].set_title(title, fontsize=10)
    axes[0].legend(fontsize=8, ncol=3, loc="upper left")
    axes[2].legend(fontsize=8, ncol=3, loc="upper left")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
