"""Results out: the JSON document, and the terminal table, markdown tables and PNG drawn from it.

Everything shown is rendered from the JSON document (`as_json`), so a saved run can be drawn
again without replaying it (`poolpilot bench --replot results.json --plot ... --markdown ...`).

Every policy's GPU-hours are also given as a ratio to the two references planned in
hindsight, when they were run: the oracle's (`gpu_hours_vs_oracle`) and static-min's
(`gpu_hours_vs_static_min`, null when no static pool within the bounds meets the goal).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from poolpilot.bench.replay import RunResult
from poolpilot.bench.static_min import PASS_GOAL
from poolpilot.bench.sweeps import SWEEPS, best_points, family
from rich.console import Console
from rich.table import Table

from poolpilot.roles import DISAGGREGATED_ROLES, Role

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

Doc = Mapping[str, Any]


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


# ---- the document ----
def reference_hours(policies: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    """GPU-hours of the oracle and of static-min (None: not run, or no static pool met the
    goal within the bounds)."""
    oracle = policies.get("oracle")
    smin = policies.get("static-min")
    return {
        "oracle": oracle["gpu_hours"] if oracle else None,
        "static-min": smin["gpu_hours"] if smin and smin.get("info", {}).get("found", True)
        else None,
    }


def _series(r: RunResult) -> dict[str, list[float]]:
    """What the plot draws: pods billed per role over time, and each minute's TTFT p90."""
    tl = r.timeline
    arr = np.asarray([o.arrival for o in r.outcomes])
    ttft = np.asarray([o.ttft for o in r.outcomes])
    minutes, p90 = [], []
    if arr.size:
        bins = (arr // 60).astype(int)
        for b in range(int(bins.max()) + 1):
            sel = ttft[bins == b]
            if sel.size:
                minutes.append(b + 0.5)
                p90.append(round(min(float(np.percentile(sel, 90, method="inverted_cdf")),
                                     1e4), 4))
    return {"t": [round(t, 3) for t in tl.t], Role.PREFILL: list(tl.billed[Role.PREFILL]),
            Role.DECODE: list(tl.billed[Role.DECODE]), "minute": minutes, "ttft_p90": p90}


def as_json(results: Sequence[RunResult], meta: Mapping[str, Any],
            goal: float = PASS_GOAL) -> dict[str, Any]:
    policies: dict[str, dict[str, Any]] = {}
    for r in results:
        d = r.as_json()
        d["series"] = _series(r)
        policies[r.policy] = d
    refs = reference_hours(policies)
    for d in policies.values():
        for key, ref in (("gpu_hours_vs_oracle", refs["oracle"]),
                         ("gpu_hours_vs_static_min", refs["static-min"])):
            d[key] = round(d["gpu_hours"] / ref, 6) if ref and d["gpu_hours"] is not None \
                else None
    doc: dict[str, Any] = {**meta, "goal": goal, "policies": policies}
    best = _best(doc)
    if best:
        doc["best_points"] = best
        doc["best_rule"] = (f"cheapest GPU-hours with SLO attainment >= {goal:g}, "
                            f"else the highest attainment")
    return doc


def _best(doc: Doc) -> dict[str, str]:
    return best_points([(n, p["slo_attainment"] or 0.0, p["gpu_hours"] or 0.0)
                        for n, p in doc["policies"].items()], doc.get("goal", PASS_GOAL))


def label(name: str, p: Mapping[str, Any], best: Mapping[str, str] | None = None) -> str:
    if best and best.get(family(name)) == name:
        return f"{name} (best)"
    info = p.get("info") or {}
    if name == "static-min":
        if info.get("found", True) and Role.PREFILL in info:
            return f"static-min ({info[Role.PREFILL]}+{info[Role.DECODE]})"
        if not info.get("found", True):
            pool = info.get("largest_pool", {})
            return f"static-min: none ({pool.get(Role.PREFILL)}+{pool.get(Role.DECODE)} misses)"
    if name == "static-peak" and Role.PREFILL in info:
        return f"static-peak ({info[Role.PREFILL]}+{info[Role.DECODE]})"
    return name


def main_rows(doc: Doc) -> list[str]:
    """Every policy at its defaults, each swept baseline's best point, and the variants asked
    for that are no baseline's sweep (ablations such as `poolpilot(forecast=0)`)."""
    best = _best(doc)
    return [n for n in doc["policies"]
            if "(" not in n or n in best.values() or family(n) not in SWEEPS]


def swept_rows(doc: Doc) -> list[str]:
    best = _best(doc)
    return [n for n in doc["policies"] if family(n) in best]


def rows(doc: Doc, names: Sequence[str] | None = None) -> list[list[str]]:
    best = _best(doc)
    out = []
    for n in doc["policies"] if names is None else names:
        p = doc["policies"][n]
        vals = {k: p.get(k) for _, k in COLUMNS[1:]}
        vals["policy"] = label(n, p, best)
        out.append([fmt(k, vals[k]) for _, k in COLUMNS])
    return out


def reference_notes(doc: Doc) -> list[str]:
    """One line per reference that says what it is, or that it does not exist."""
    notes = []
    goal = 100 * doc.get("goal", PASS_GOAL)
    for name, p in doc["policies"].items():
        i = p.get("info") or {}
        if name == "oracle":
            notes.append(
                f"oracle: {i.get('windows')} windows of {i.get('window_s'):g} s sized by "
                f"{i.get('trials')} simulations; peak need {i.get('peak_need')}; "
                f"{i.get('unattainable_windows')} windows could not reach the target "
                f"within the bounds")
        elif name == "static-min":
            if i.get("found", True):
                notes.append(f"static-min: {i.get(Role.PREFILL)} prefill + {i.get(Role.DECODE)} "
                             f"decode is the smallest fixed pool that reaches {goal:.0f}% "
                             f"({i.get('replays')} replays)")
            else:
                notes.append(f"static-min: no fixed pool up to --max-replicas reaches "
                             f"{goal:.0f}%; the row is the largest one")
    return notes


def print_table(doc: Doc, title: str, console: Console | None = None) -> None:
    t = Table(title=title)
    for head, _ in COLUMNS:
        t.add_column(head, justify="left" if head == "policy" else "right",
                     no_wrap=head == "policy")
    for row in rows(doc):
        t.add_row(*row)
    (console or Console()).print(t)


def _markdown(doc: Doc, names: Sequence[str]) -> str:
    lines = ["| " + " | ".join(h for h, _ in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(doc, names)]
    return "\n".join(lines)


def markdown_table(doc: Doc) -> str:
    """One table of every policy at its defaults plus each swept baseline's best point; when
    baselines were swept, a second table with every setting tried."""
    text = _markdown(doc, main_rows(doc))
    swept = swept_rows(doc)
    if swept:
        text += (f"\n\nBaseline settings tried (best: the cheapest that reaches "
                 f"{100 * doc.get('goal', PASS_GOAL):g}% attainment, else the highest "
                 f"attainment):\n\n" + _markdown(doc, swept))
    return text


# ---- the plot ----
REFERENCE_STYLE = {"oracle": {"color": "black", "linewidth": 2.0},
                   "static-min": {"color": "0.45", "linewidth": 1.6, "linestyle": "--"}}


def plot(doc: Doc, path: str | Path, title: str) -> None:
    """Pods billed per role over time and the TTFT p90 per minute, for every policy at its
    defaults and each baseline's best point; then every run's SLO attainment against its
    GPU-hours relative to the oracle's (every swept setting as a small point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    pols = doc["policies"]
    best = _best(doc)
    shown = main_rows(doc)
    cmap = plt.get_cmap("tab10")
    cycle = iter([cmap(i % 10) for i in range(64)])
    style: dict[str, dict[str, Any]] = {}
    for n in shown:
        style[n] = dict(REFERENCE_STYLE.get(n) or {"color": next(cycle), "linewidth": 1.2})
    fig = plt.figure(figsize=(9, 11.5))
    grid = fig.add_gridspec(4, 1, height_ratios=(1, 1, 1, 1.3))
    axes = [fig.add_subplot(grid[0])]
    axes += [fig.add_subplot(grid[i], sharex=axes[0]) for i in (1, 2)]
    for n in shown:
        s = pols[n].get("series") or {}
        mins = np.asarray(s.get("t", [])) / 60.0
        for ax, role in zip(axes[:2], DISAGGREGATED_ROLES, strict=True):
            ax.step(mins, s.get(role, []), where="post", label=label(n, pols[n], best),
                    **style[n])
        axes[2].plot(s.get("minute", []), s.get("ttft_p90", []), **style[n])
    axes[0].set_ylabel("prefill pods\n(billed)")
    axes[1].set_ylabel("decode pods\n(billed)")
    axes[2].set_ylabel("TTFT p90 per\nminute (s)")
    axes[2].set_yscale("log")
    slo = doc.get("config", {}).get("slo_ttft")
    if slo:
        axes[2].axhline(slo, color="black", linestyle=":", linewidth=0.8)
    axes[2].set_xlabel("trace time (minutes)")
    axes[0].set_title(title, fontsize=10)
    axes[0].legend(fontsize=7, ncol=2, loc="upper left")
    for ax in axes:
        ax.grid(alpha=0.3)

    ax = fig.add_subplot(grid[3])
    base = reference_hours(pols)["oracle"]
    for n, p in pols.items():
        x = p["gpu_hours"] / base if base else p["gpu_hours"]
        y = 100 * (p["slo_attainment"] or 0.0)
        if n in style:
            ax.scatter([x], [y], s=36, zorder=3, color=style[n]["color"])
            ax.annotate(label(n, p, best), (x, y), fontsize=7, xytext=(4, 3),
                        textcoords="offset points")
        else:  # a swept setting that is not its baseline's best: the family's colour
            fam = next((m for m in shown if family(m) == family(n)), None)
            ax.scatter([x], [y], s=14, zorder=2, facecolors="none",
                       edgecolors=style[fam]["color"] if fam else "0.6")
    ax.axhline(100 * doc.get("goal", PASS_GOAL), color="black", linestyle=":", linewidth=0.8)
    if base:
        ax.axvline(1.0, color="black", linewidth=0.6)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xlabel("GPU-hours vs the oracle's (log)" if base else "GPU-hours (log)")
    ax.set_ylabel("SLO attainment (%)\n(open: other settings)")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
