"""The sandbox's report: report.json, PNG plots and a summary table.

All times in the report are simulated seconds from the start of the replay (real seconds x
speed), so a run at --speed 4 reads like the same run at speed 1.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .loadgen import RequestResult
from .timeline import RoleSample, ScaleChange

QUANTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0}


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    ttft_quantile: float
    itl_s: float
    itl_quantile: float


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return dict.fromkeys(QUANTILES)
    arr = np.asarray(values, dtype=float)
    return {k: round(float(np.percentile(arr, q)), 6) for k, q in QUANTILES.items()}


def meets_slo(r: RequestResult, slo: Slo, speed: float) -> bool:
    """A request meets the SLO when it succeeded, its TTFT is within the TTFT target and its
    mean inter-token latency (time per output token) is within the ITL target."""
    if not r.ok:
        return False
    ttft = r.ttft(speed)
    if ttft is None or ttft > slo.ttft_s:
        return False
    itl = r.mean_itl(speed)
    return itl is None or itl <= slo.itl_s


def slo_attainment(results: Sequence[RequestResult], slo: Slo, speed: float) -> float | None:
    if not results:
        return None
    return round(sum(meets_slo(r, slo, speed) for r in results) / len(results), 4)


def step_integral(points: Sequence[tuple[float, float]], t_end: float) -> float:
    """Integral of a step function given as (t, value) change points, up to t_end."""
    total = 0.0
    for (t, v), nxt in zip(points, [*points[1:], None], strict=True):
        stop = min(nxt[0] if nxt else t_end, t_end)
        if stop > t:
            total += v * (stop - t)
    return total


def role_series(samples: Iterable[RoleSample], t0: float, speed: float,
                field: str) -> dict[str, list[tuple[float, float]]]:
    """Per role, (simulated t, value) change points of `field` (desired, ready or pods).
    Samples from before the replay (the pool coming up) collapse into the last of them: the
    state at t=0, not a jump from 0 at t=0."""
    out: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        points = out.setdefault(s.role, [])
        point = (max(0.0, (s.t - t0) * speed), float(getattr(s, field)))
        if points and point[0] == 0.0 and points[-1][0] == 0.0:
            points[-1] = point
        else:
            points.append(point)
    return out


def replica_seconds(samples: Sequence[RoleSample], t0: float, t_end: float,
                    speed: float) -> dict[str, float]:
    """Pod-seconds per role (simulated), counting starting and draining pods: what GPUs cost."""
    series = role_series(samples, t0, speed, "pods")
    end = (t_end - t0) * speed
    return {role: round(step_integral(points, end), 1) for role, points in sorted(series.items())}


_EVENT = re.compile(r"^(?P<role>\w+) (?P<frm>\d+) -> (?P<to>\d+): (?P<reason>\w+)")


def attach_reasons(changes: Sequence[ScaleChange], messages: Iterable[str]) -> None:
    """Give each observed replica change the reason of the autoscaler's Event for it (the
    Event message starts "prefill 1 -> 3: QueueAboveTarget"); changes nobody announced (e.g.
    a manual `kubectl scale`) keep what they had."""
    parsed = [(m.group("role"), int(m.group("frm")), int(m.group("to")), m.group("reason"), msg)
              for msg in messages if (m := _EVENT.match(msg))]
    used: set[int] = set()
    for c in changes:
        for i, (role, frm, to, reason, msg) in enumerate(parsed):
            if i not in used and (role, frm, to) == (c.role, c.from_replicas, c.to_replicas):
                used.add(i)
                c.reason, c.message = reason, msg
                break


def scale_events(changes: Iterable[ScaleChange], t0: float, speed: float) -> list[dict[str, Any]]:
    return [
        {
            "t": round((c.t - t0) * speed, 1),
            "role": c.role,
            "from": c.from_replicas,
            "to": c.to_replicas,
            "reason": c.reason or "Unknown",
            **({"message": c.message} if c.message else {}),
        }
        for c in changes
    ]


def direction_changes(events: Sequence[Mapping[str, Any]], role: str) -> int:
    """How often a role's scaling direction flipped (up then down, or down then up)."""
    dirs = [1 if e["to"] > e["from"] else -1 for e in events if e["role"] == role
            and e["to"] != e["from"]]
    return sum(1 for a, b in itertools.pairwise(dirs) if a != b)


def binned(results: Sequence[RequestResult], speed: float, bin_s: float,
           t_end: float) -> tuple[list[float], list[float], list[float | None]]:
    """Per bin of simulated time: bin starts, request rate (req/s) and TTFT p90 of the
    requests sent in that bin."""
    n = max(1, math.ceil(t_end / bin_s))
    counts = [0] * n
    ttfts: list[list[float]] = [[] for _ in range(n)]
    for r in results:
        i = min(n - 1, int(r.arrival_s // bin_s))
        counts[i] += 1
        ttft = r.ttft(speed)
        if ttft is not None:
            ttfts[i].append(ttft)
    starts = [i * bin_s for i in range(n)]
    rate = [c / bin_s for c in counts]
    p90 = [float(np.percentile(v, 90)) if v else None for v in ttfts]
    return starts, rate, p90


def build_report(*, results: Sequence[RequestResult], slo: Slo, speed: float,
                 samples: Sequence[RoleSample], changes: Sequence[ScaleChange], t0: float,
                 t_end: float, meta: Mapping[str, Any],
                 local_prefill: Mapping[str, Sequence[tuple[float, float]]] | None = None,
                 ) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ttfts = [t for r in ok if (t := r.ttft(speed)) is not None]
    # Per request, as its client sees it: (last token - first token) / (tokens - 1). Single
    # gaps are not used: streamed chunks can bunch up on the way, the mean does not.
    itls = [m for r in ok if (m := r.mean_itl(speed)) is not None]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            key = (r.error or "unknown")[:120]
            errors[key] = errors.get(key, 0) + 1
    events = scale_events(changes, t0, speed)
    return {
        **meta,
        "duration_s": round((t_end - t0) * speed, 1),
        "requests": {
            "sent": len(results),
            "ok": len(ok),
            "failed": len(results) - len(ok),
            "errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])[:10]),
            "output_tokens": sum(r.output_tokens for r in ok),
        },
        "ttft_seconds": {**percentiles(ttfts), "target": slo.ttft_s,
                         "target_quantile": slo.ttft_quantile},
        "itl_seconds": {**percentiles(itls), "target": slo.itl_s,
                        "target_quantile": slo.itl_quantile},
        "slo_attainment": slo_attainment(results, slo, speed),
        "replica_seconds": replica_seconds(samples, t0, t_end, speed),
        "scale_events": events,
        "local_prefill": local_prefill_counts(local_prefill or {}),
        "direction_changes": {
            role: direction_changes(events, role) for role in sorted({e["role"] for e in events})
        },
        "replicas": [
            {"t": round(max(0.0, (s.t - t0) * speed), 1), "role": s.role, "desired": s.desired,
             "ready": s.ready, "pods": s.pods}
            for s in samples
        ],
    }


def local_prefill_counts(
    series: Mapping[str, Sequence[tuple[float, float]]],
) -> dict[str, Any] | None:
    """Requests served by the router's local-prefill fallback, per reason and in all: each
    cumulative counter's last value (None when Prometheus had no series, e.g. an aggregated
    pool)."""
    if not series:
        return None
    by_reason = {reason: round(points[-1][1]) if points else 0
                 for reason, points in sorted(series.items())}
    return {"total": sum(by_reason.values()), "by_reason": by_reason}


def write_report(report: Mapping[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


REQUEST_COLUMNS = ("index", "arrival_s", "input_tokens", "output_tokens", "ttft_s",
                   "mean_itl_s", "met_slo", "error")


def write_requests(results: Sequence[RequestResult], slo: Slo, speed: float,
                   out_dir: Path) -> Path:
    """requests.csv: one row per request as its client saw it (simulated seconds), so a user
    can see which requests missed the SLO and when, not only how many."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "requests.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(REQUEST_COLUMNS)
        for r in sorted(results, key=lambda r: r.index):
            ttft, itl = r.ttft(speed), r.mean_itl(speed)
            w.writerow([r.index, f"{r.arrival_s:.3f}", r.input_tokens, r.output_tokens,
                        "" if ttft is None else f"{ttft:.4f}",
                        "" if itl is None else f"{itl:.5f}",
                        int(meets_slo(r, slo, speed)), r.error or ""])
    return path


# ---------------------------------------------------------------------------------------------
# Plots


def write_plots(*, out_dir: Path, results: Sequence[RequestResult], slo: Slo, speed: float,
                samples: Sequence[RoleSample], t0: float, t_end: float,
                queue: Mapping[str, Sequence[tuple[float, float]]],
                scale_events_: Sequence[Mapping[str, Any]],
                local_prefill: Mapping[str, Sequence[tuple[float, float]]] | None = None,
                ) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    end = (t_end - t0) * speed
    bin_s = max(5.0, end / 60)
    starts, rate, p90 = binned(results, speed, bin_s, end)
    paths = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(8, 3.5))
    xs = [s for s, v in zip(starts, p90, strict=True) if v is not None]
    ys = [v for v in p90 if v is not None]
    ax.plot(xs, ys, marker=".", label=f"TTFT p90 (client, per {bin_s:.0f}s of sends)")
    ax.axhline(slo.ttft_s, color="red", linestyle="--",
               label=f"target p{slo.ttft_quantile * 100:g} {slo.ttft_s:g}s")
    for e in scale_events_:
        ax.axvline(e["t"], color="grey", alpha=0.3, linewidth=0.8)
    ax.set_yscale("log")
    ax.set(xlabel="trace time (s)", ylabel="seconds", title="Time to first token vs target")
    ax.legend(loc="upper right", fontsize=8)
    save(fig, "ttft.png")

    fig, ax = plt.subplots(figsize=(8, 3.5))
    for role, points in sorted(queue.items()):
        ax.plot([p[0] for p in points], [p[1] for p in points], label=role)
    ax.set(xlabel="trace time (s)", ylabel="waiting requests",
           title="Queue depth per role (vllm:num_requests_waiting, from Prometheus)")
    if queue:
        ax.legend(fontsize=8)
    save(fig, "queue.png")

    fig, ax = plt.subplots(figsize=(8, 3.0))
    for reason, points in sorted((local_prefill or {}).items()):
        ax.plot([p[0] for p in points], [p[1] for p in points], label=reason)
    for e in scale_events_:
        ax.axvline(e["t"], color="grey", alpha=0.3, linewidth=0.8)
    ax.set(xlabel="trace time (s)", ylabel="requests (cumulative)",
           title="Local prefill on decode engines (the router's fallback), by reason")
    if local_prefill:
        ax.legend(fontsize=8)
    save(fig, "local_prefill.png")

    desired = role_series(samples, t0, speed, "desired")
    ready = role_series(samples, t0, speed, "ready")
    engine_roles = [r for r in sorted(desired) if r != "router"] or sorted(desired)
    rows = max(1, len(engine_roles))
    fig, axes = plt.subplots(rows, 1, figsize=(8, 2.6 * rows), squeeze=False)
    for ax, role in zip(axes[:, 0], engine_roles, strict=False):
        for series, style, label in ((desired, "-", "desired"), (ready, "--", "ready")):
            pts = [*series.get(role, []), (end, series.get(role, [(0, 0)])[-1][1])]
            ax.step([p[0] for p in pts], [p[1] for p in pts], style, where="post", label=label)
        ax.set(ylabel="replicas", title=f"{role}: desired vs ready replicas")
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("trace time (s)")
    save(fig, "replicas.png")

    fig, ax = plt.subplots(figsize=(8, 3.0))
    ax.bar(starts, rate, width=bin_s, align="edge", alpha=0.7)
    ax.set(xlabel="trace time (s)", ylabel="requests / s", title="Request rate (trace)")
    save(fig, "request_rate.png")
    return paths


# ---------------------------------------------------------------------------------------------
# Summary table


def summary_tables(report: Mapping[str, Any]) -> list[Any]:
    from rich.table import Table

    def fmt(v: Any, unit: str = "s") -> str:
        if v is None:
            return "-"
        if unit == "s":
            return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"
        return str(v)

    req = report["requests"]
    t = Table(title="poolpilot sandbox", show_header=True)
    t.add_column("metric")
    t.add_column("p50", justify="right")
    t.add_column("p90", justify="right")
    t.add_column("p99", justify="right")
    t.add_column("target", justify="right")
    for key, label in (("ttft_seconds", "TTFT"), ("itl_seconds", "ITL")):
        d = report[key]
        t.add_row(label, fmt(d["p50"]), fmt(d["p90"]), fmt(d["p99"]),
                  f"p{d['target_quantile'] * 100:g} <= {fmt(d['target'])}")
    att = report["slo_attainment"]
    t.add_row("requests", f"{req['sent']} sent", f"{req['ok']} ok", f"{req['failed']} failed",
              f"SLO met: {att * 100:.1f}%" if att is not None else "-")
    local = report.get("local_prefill")
    if local is not None:
        reasons = ", ".join(f"{k} {v}" for k, v in local["by_reason"].items() if v)
        t.add_row("local prefills (fallback)", str(local["total"]), reasons or "", "", "")
    for role, secs in report["replica_seconds"].items():
        t.add_row(f"{role} replica-seconds", f"{secs:.0f}", "", "", "")
    ev = Table(title="scale events (from the autoscaler)", show_header=True)
    for col in ("t (s)", "role", "from", "to", "reason"):
        ev.add_column(col)
    for e in report["scale_events"]:
        ev.add_row(f"{e['t']:.0f}", e["role"], str(e["from"]), str(e["to"]), e["reason"])
    if not report["scale_events"]:
        ev.add_row("-", "none", "", "", "no replica changed during the run")
    return [t, ev]
