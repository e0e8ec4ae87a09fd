"""The chaos run's part of the sandbox report: report.json's "chaos" section, chaos.png (the
pool's ready vs desired replicas with every fault's span, and each request's outcome over
time) and the summary tables."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from poolpilot.roles import Role

from . import chaos as C

COLORS = {"answered": "tab:green", "error": "tab:red", "truncated": "tab:orange",
          "hung": "black"}


def add_to_report(out: dict[str, Any], section: Mapping[str, Any], out_dir: Path) -> Path:
    """Put the chaos section into the report and write report.json again."""
    out["chaos"] = dict(section)
    path = out_dir / "report.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    return path


def write_plot(out_dir: Path, section: Mapping[str, Any], outcomes: Sequence[C.ChaosRequest],
               end_s: float) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    watch = section.get("watch") or []
    roles = sorted({r for s in watch for r in s["sizes"]}, key=lambda r: (r == Role.ROUTER, r))
    fig, axes = plt.subplots(len(roles) + 1, 1, figsize=(9, 1.9 * (len(roles) + 1) + 0.6),
                             sharex=True, squeeze=False)
    for ax, role in zip(axes[:-1, 0], roles, strict=False):
        pts = [(s["t"], *s["sizes"][role], (s["desired"] or {}).get(role))
               for s in watch if role in s["sizes"]]
        if pts:
            ts = [p[0] for p in pts] + [end_s]
            for i, label, style in ((1, "replicas", "-"), (2, "ready", "--")):
                ys = [p[i] for p in pts]
                ax.step(ts, [*ys, ys[-1]], style, where="post", label=label)
            if any(p[3] is not None for p in pts):
                ys = [p[3] if p[3] is not None else math.nan for p in pts]
                ax.step(ts, [*ys, ys[-1]], ":", where="post", label="autoscaler desired")
        ax.set_ylabel(role)
        ax.legend(loc="upper right", fontsize=7)
    for ax in axes[:, 0]:
        for f in section["faults"]:
            if f["injected_s"] is None:
                continue
            end = f["recovered_s"] if f["recovered_s"] is not None else \
                f["injected_s"] + f["bound_s"]
            ax.axvspan(f["injected_s"], end, color="tab:red", alpha=0.12)
    for f in section["faults"]:
        if f["injected_s"] is not None:
            axes[0, 0].annotate(f["kind"], (f["injected_s"], 1.0), fontsize=7, rotation=30,
                                xycoords=("data", "axes fraction"), va="bottom")
    ax = axes[-1, 0]
    bin_s = max(5.0, end_s / 60)
    n = max(1, math.ceil(end_s / bin_s))
    bottom = [0] * n
    for kind in ("answered", "error", "truncated", "hung"):
        counts = [0] * n
        for o in outcomes:
            if o.kind == kind:
                counts[min(n - 1, max(0, int(o.sent_s // bin_s)))] += 1
        if any(counts):
            ax.bar([i * bin_s for i in range(n)], counts, width=bin_s, bottom=bottom,
                   align="edge", color=COLORS[kind], label=kind)
            bottom = [a + b for a, b in zip(bottom, counts, strict=True)]
    ax.set(xlabel="trace time (s); shaded: from a fault's kill to its recovery",
           ylabel="requests sent")
    ax.legend(loc="upper right", fontsize=7)
    fig.suptitle(f"chaos run, seed {section['seed']}: replicas and request outcomes")
    fig.tight_layout()
    path = out_dir / "chaos.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def tables(section: Mapping[str, Any]) -> list[Any]:
    from rich.table import Table

    def s(v: Any) -> str:
        return "-" if v is None else f"{v:.0f}" if isinstance(v, float) else str(v)

    t = Table(title=f"chaos (seed {section['seed']}): faults", show_header=True)
    for col in ("t (s)", "fault", "pod", "down (s)", "back after (s)", "bound (s)",
                "errors", "scale events"):
        t.add_column(col)
    for f in section["faults"]:
        errors = ", ".join(f"{v} {k}" for k, v in f["errors"].items()) or "0"
        events = ", ".join(f"{e['role']} {e['from']}->{e['to']}"
                           for e in f["scale_events"]) or "-"
        back = s(f["recovery_s"]) if f["recovery_s"] is not None else (
            f"[red]not within {f['bound_s']:.0f}[/]" if f["injected_s"] is not None
            else f"[red]{f.get('problem', 'not injected')}[/]")
        target = f["target"].rsplit("-", 1)[-1] if f["kind"] not in C.INFRA else ""
        t.add_row(s(f["injected_s"]), f["kind"], target, s(f["down_s"] if f["down_s"] is not None
                                                           else f.get("hold_s")), back,
                  s(f["bound_s"]), errors, events)
    r = section["requests"]
    v = Table(title="chaos: properties", show_header=True)
    v.add_column("property")
    v.add_column("holds")
    v.add_column("detail")
    for name, verdict in section["verdicts"].items():
        v.add_row(name, "[green]yes[/]" if verdict["ok"] else "[red]NO[/]", verdict["detail"])
    v.add_row("requests", "", f"{r['sent']} sent: {r['answered']} answered, {r['error']} errors "
              f"({r['errors_outside_faults']} outside any fault), {r['truncated']} truncated, "
              f"{r['hung']} hung; {section['scale_events_during_faults']} scale events during "
              "faults")
    return [t, v]
