"""Results out: a terminal table, the JSON document, a markdown table and the PNG plots.

Every policy's GPU-hours are also given as a ratio to the two references planned in
hindsight, when they were run: the oracle's (`gpu_hours_vs_oracle`) and static-min's
(`gpu_hours_vs_static_min`, absent when no static pool within the bounds meets the goal).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from poolpilot.bench.replay import RunResult
from poolpilot.bench.static_min import PASS_GOAL
from poolpilot.bench.sweeps import best_points, family
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
    ("vs oracle", "gpu_hours_vs_oracle"),
    ("vs static-min", "gpu_hours_vs_static_min"),
    ("met/GPU-h", "met_per_gpu_hour"),
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
    if key == "gpu_hours":
        return f"{v:.2f}"
    if key.startswith("gpu_hours_vs"):
        return f"{v:.2f}x"
    if key == "met_per_gpu_hour":
        return f"{v:,.0f}"
    return str(v)


def reference_hours(results: Sequence[RunResult]) -> dict[str, float | None]:
    """GPU-hours of the oracle and of static-min (None: not run, or no static pool met the
    goal within the bounds)."""
    out: dict[str, float | None] = {"oracle": None, "static-min": None}
    for r in results:
        if r.policy == "oracle":
            out["oracle"] = r.summary.gpu_hours
        elif r.policy == "static-min" and r.info.get("found", True):
            out["static-min"] = r.summary.gpu_hours
    return out


def ratios(r: RunResult, refs: Mapping[str, float | None]) -> dict[str, float | None]:
    def ratio(ref: float | None) -> float | None:
        return r.summary.gpu_hours / ref if ref else None

    return {"gpu_hours_vs_oracle": ratio(refs["oracle"]),
            "gpu_hours_vs_static_min": ratio(refs["static-min"])}


def label(r: RunResult, best: Mapping[str, str] | None = None) -> str:
    if best and best.get(family(r.policy)) == r.policy:
        return f"{r.policy} (best)"
    if r.policy == "static-min":
        i = r.info
        if i.get("found", True) and "prefill" in i:
            return f"static-min ({i['prefill']}+{i['decode']})"
        if not i.get("found", True):
            pool = i.get("largest_pool", {})
            return f"static-min: none ({pool.get('prefill')}+{pool.get('decode')} misses)"
    if r.policy == "static-peak" and "prefill" in r.info:
        return f"static-peak ({r.info['prefill']}+{r.info['decode']})"
    return r.policy


def rows(results: Sequence[RunResult], shown: Sequence[RunResult] | None = None,
         goal: float = PASS_GOAL) -> list[list[str]]:
    """Table rows for `shown` (default: all results); ratios and best points come from all."""
    refs = reference_hours(results)
    best = best_points(results, goal)
    out = []
    for r in results if shown is None else shown:
        s = r.summary
        vals = {k: getattr(s, k, None) for _, k in COLUMNS[1:]}
        vals.update(ratios(r, refs))
        vals["policy"] = label(r, best)
        vals["local_prefill_requests"] = r.local_prefill_requests
        out.append([fmt(k, vals[k]) for _, k in COLUMNS])
    return out


def reference_notes(results: Sequence[RunResult]) -> list[str]:
    """One line per reference that says what it is, or that it does not exist."""
    notes = []
    for r in results:
        i = r.info
        if r.policy == "oracle":
            notes.append(
                f"oracle: {i.get('windows')} windows of {i.get('window_s'):g} s sized by "
                f"{i.get('trials')} simulations; peak need {i.get('peak_need')}; "
                f"{i.get('unattainable_windows')} windows could not reach the target "
                f"within the bounds")
        elif r.policy == "static-min":
            if i.get("found", True):
                notes.append(f"static-min: {i.get('prefill')} prefill + {i.get('decode')} "
                             f"decode is the smallest fixed pool that reaches "
                             f"{100 * i.get('goal', 0):.0f}% ({i.get('replays')} replays)")
            else:
                notes.append(f"static-min: no fixed pool up to --max-replicas reaches "
                             f"{100 * i.get('goal', 0):.0f}%; the row is the largest one")
    return notes


def print_table(results: Sequence[RunResult], title: str, console: Console | None = None,
                goal: float = PASS_GOAL) -> None:
    t = Table(title=title)
    for head, _ in COLUMNS:
        t.add_column(head, justify="left" if head == "policy" else "right",
                     no_wrap=head == "policy")
    for row in rows(results, goal=goal):
        t.add_row(*row)
    (console or Console()).print(t)


def _markdown(results: Sequence[RunResult], shown: Sequence[RunResult], goal: float) -> str:
    lines = ["| " + " | ".join(h for h, _ in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(results, shown, goal)]
    return "\n".join(lines)


def markdown_table(results: Sequence[RunResult], goal: float = PASS_GOAL) -> str:
    """One table of every policy at its defaults plus each swept baseline's best point; when
    baselines were swept, a second table with every setting tried."""
    best = best_points(results, goal)
    main = [r for r in results if "(" not in r.policy or r.policy in best.values()]
    text = _markdown(results, main, goal)
    swept = [r for r in results if family(r.policy) in best]
    if swept:
        text += (f"\n\nBaseline settings tried (best: the cheapest that reaches "
                 f"{100 * goal:g}% attainment, else the highest attainment):\n\n"
                 + _markdown(results, swept, goal))
    return text


def as_json(results: Sequence[RunResult], meta: Mapping[str, Any],
            goal: float = PASS_GOAL) -> dict[str, Any]:
    refs = reference_hours(results)

    def one(r: RunResult) -> dict[str, Any]:
        d = r.as_json()
        d.update({k: None if v is None else round(v, 6) for k, v in ratios(r, refs).items()})
        return d

    doc = {**meta, "policies": {r.policy: one(r) for r in results}}
    best = best_points(results, goal)
    if best:
        doc["best_points"] = best
        doc["best_rule"] = (f"cheapest GPU-hours with SLO attainment >= {goal:g}, "
                            f"else the highest attainment")
    return doc


def plot(results: Sequence[RunResult], path: str | Path, title: str, slo_ttft: float,
         goal: float = 0.95) -> None:
    """Replicas per role over time per policy, the TTFT p90 per minute, and each policy's
    SLO attainment against its GPU-hours (relative to the oracle's when it ran)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig = plt.figure(figsize=(9, 11))
    grid = fig.add_gridspec(4, 1, height_ratios=(1, 1, 1, 1.2))
    axes = [fig.add_subplot(grid[0])]
    axes += [fig.add_subplot(grid[i], sharex=axes[0]) for i in (1, 2)]
    colors: dict[str, Any] = {}
    for r in results:
        tl = r.timeline
        mins = np.asarray(tl.t) / 60.0
        for ax, role in zip(axes[:2], ("prefill", "decode"), strict=True):
            (line,) = ax.step(mins, tl.billed[role], where="post", label=label(r),
                              linewidth=1.2, color=colors.get(r.policy))
            colors[r.policy] = line.get_color()
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
            axes[2].plot(xs, ys_arr, label=label(r), linewidth=1.2, color=colors[r.policy])
    axes[0].set_ylabel("prefill pods\n(billed)")
    axes[1].set_ylabel("decode pods\n(billed)")
    axes[2].set_ylabel("TTFT p90 per\nminute (s)")
    axes[2].set_yscale("log")
    axes[2].axhline(slo_ttft, color="black", linestyle="--", linewidth=0.8, label="TTFT SLO")
    axes[2].set_xlabel("trace time (minutes)")
    axes[0].set_title(title, fontsize=10)
    axes[0].legend(fontsize=7, ncol=3, loc="upper left")
    axes[2].legend(fontsize=7, ncol=3, loc="upper left")
    for ax in axes:
        ax.grid(alpha=0.3)

    # Cost against SLO: the references anchor the x axis.
    ax = fig.add_subplot(grid[3])
    refs = reference_hours(results)
    base = refs["oracle"]
    for r in results:
        x = r.summary.gpu_hours / base if base else r.summary.gpu_hours
        y = 100 * r.summary.slo_attainment
        ax.scatter([x], [y], color=colors.get(r.policy), s=30, zorder=3)
        ax.annotate(label(r), (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.axhline(100 * goal, color="black", linestyle="--", linewidth=0.8)
    if base:
        ax.axvline(1.0, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("GPU-hours vs the oracle's" if base else "GPU-hours")
    ax.set_ylabel("SLO attainment (%)")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
