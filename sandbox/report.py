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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from poolpilot.emulator.cluster.timeline import RoleSample, ScaleChange

from poolpilot.roles import Role

from .loadgen import RequestResult

QUANTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0}
# Requests grouped by the share of their prompt an earlier request had sent (upper bounds).
REUSE_BUCKETS = ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0))
ALL_ROLES = "all"  # the key of the pool-wide hit rate beside the per-role ones


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
    for r in results:
        counts[min(n - 1, int(r.arrival_s // bin_s))] += 1
    starts = [i * bin_s for i in range(n)]
    rate = [c / bin_s for c in counts]
    return starts, rate, binned_ttft(results, speed, bin_s, t_end, 90.0)


@dataclass(frozen=True)
class PrefixSeries:
    """What Prometheus recorded of the prefix caches during the run, in trace seconds, per
    engine role (and ALL_ROLES for the pool).

    `hit_rate`: hit tokens over query tokens in each rate window, from the engines' counters
    (`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`); `hit_tokens`,
    `query_tokens`: the counters' increase over the whole run. `router_expected`,
    `router_expected_tokens`, `router_routed_tokens`: the same for the router's own record
    (prompt tokens it routed, and those it expected the chosen engine to hold); empty when
    the router exports none.
    """

    hit_rate: Mapping[str, Sequence[tuple[float, float]]]
    hit_tokens: Mapping[str, float]
    query_tokens: Mapping[str, float]
    router_expected: Mapping[str, Sequence[tuple[float, float]]] = field(default_factory=dict)
    router_expected_tokens: Mapping[str, float] = field(default_factory=dict)
    router_routed_tokens: Mapping[str, float] = field(default_factory=dict)


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den rounded for the report; None when there is nothing to divide by."""
    if num is None or not den:
        return None
    return round(num / den, 4)


def reuse_bucket(share: float) -> int:
    """The REUSE_BUCKETS index of a reusable share (0..1, the last bucket includes 1)."""
    for i, (_, hi) in enumerate(REUSE_BUCKETS):
        if share < hi:
            return i
    return len(REUSE_BUCKETS) - 1


def ttft_by_reuse(results: Sequence[RequestResult], speed: float) -> list[dict[str, Any]]:
    """TTFT percentiles of the answered requests, grouped by how much of their prompt an
    earlier request had sent (what a cache could have served): the benefit per request."""
    groups: list[list[RequestResult]] = [[] for _ in REUSE_BUCKETS]
    for r in results:
        if r.ok and r.ttft(speed) is not None:
            groups[reuse_bucket(r.reusable_share())].append(r)
    out = []
    for (lo, hi), group in zip(REUSE_BUCKETS, groups, strict=True):
        ttfts = [t for r in group if (t := r.ttft(speed)) is not None]
        out.append({
            "reusable_share": f"{lo * 100:.0f}-{hi * 100:.0f}%",
            "requests": len(group),
            "prompt_tokens_mean": round(sum(r.input_tokens for r in group) / len(group))
            if group else None,
            "ttft_seconds": percentiles(ttfts),
        })
    return out


def prefix_cache_section(results: Sequence[RequestResult], speed: float,
                         prefix: PrefixSeries | None, t_end: float) -> dict[str, Any]:
    """The report's `prefix_cache`: the hit rate the engines measured (per role and in all),
    what the trace allowed (`ideal_hit_rate`: every block an earlier request had, served from
    an infinite cache reachable from anywhere), what the router expected, and TTFT beside it
    (by reusable share, and over time with the hit rate)."""
    prefix = prefix or PrefixSeries({}, {}, {})
    prompt = sum(r.input_tokens for r in results)
    reusable = sum(r.reusable_tokens for r in results)
    hits, queries = prefix.hit_tokens, prefix.query_tokens
    expected, routed = prefix.router_expected_tokens, prefix.router_routed_tokens
    bin_s = plot_bin_s(t_end)
    starts, _, p90 = binned(results, speed, bin_s, t_end)
    p50 = binned_ttft(results, speed, bin_s, t_end, 50.0)

    def points(series: Mapping[str, Sequence[tuple[float, float]]]) -> dict[str, list[list[float]]]:
        return {role: [[round(t, 1), round(v, 4)] for t, v in pts]
                for role, pts in sorted(series.items())}

    return {
        "ideal_hit_rate": ratio(reusable, prompt),
        "hit_rate": ratio(sum(hits.values()), sum(queries.values())) if queries else None,
        "router_expected_hit_rate":
            ratio(sum(expected.values()), sum(routed.values())) if routed else None,
        "by_role": {role: {"hit_rate": ratio(hits.get(role, 0.0), queries.get(role)),
                           "query_tokens": round(queries.get(role, 0.0)),
                           "hit_tokens": round(hits.get(role, 0.0)),
                           "router_expected_hit_rate":
                               ratio(expected.get(role, 0.0), routed.get(role))}
                    for role in sorted(set(hits) | set(queries) | set(routed))},
        "ttft_by_reusable_share": ttft_by_reuse(results, speed),
        "over_time": {
            "hit_rate": points(prefix.hit_rate),
            "router_expected": points(prefix.router_expected),
            "ttft": {"bin_s": bin_s, "t": starts,
                     "p50": [None if v is None else round(v, 4) for v in p50],
                     "p90": [None if v is None else round(v, 4) for v in p90]},
        },
    }


def plot_bin_s(t_end: float) -> float:
    """The plots' bin of simulated seconds: about 60 bins over the run, at least 5 s."""
    return max(5.0, t_end / 60)


def binned_ttft(results: Sequence[RequestResult], speed: float, bin_s: float, t_end: float,
                q: float) -> list[float | None]:
    """Per bin of sends, the q-th percentile of TTFT (None for a bin without answers)."""
    n = max(1, math.ceil(t_end / bin_s))
    ttfts: list[list[float]] = [[] for _ in range(n)]
    for r in results:
        if (t := r.ttft(speed)) is not None:
            ttfts[min(n - 1, int(r.arrival_s // bin_s))].append(t)
    return [float(np.percentile(v, q)) if v else None for v in ttfts]


def build_report(*, results: Sequence[RequestResult], slo: Slo, speed: float,
                 samples: Sequence[RoleSample], changes: Sequence[ScaleChange], t0: float,
                 t_end: float, meta: Mapping[str, Any],
                 local_prefill: Mapping[str, Sequence[tuple[float, float]]] | None = None,
                 prefix: PrefixSeries | None = None,
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
        "prefix_cache": prefix_cache_section(results, speed, prefix, (t_end - t0) * speed),
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
                   "mean_itl_s", "met_slo", "error", "reusable_tokens")


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
                        int(meets_slo(r, slo, speed)), r.error or "", r.reusable_tokens])
    return path


# ---------------------------------------------------------------------------------------------
# Plots


def write_plots(*, out_dir: Path, results: Sequence[RequestResult], slo: Slo, speed: float,
                samples: Sequence[RoleSample], t0: float, t_end: float,
                queue: Mapping[str, Sequence[tuple[float, float]]],
                scale_events_: Sequence[Mapping[str, Any]],
                local_prefill: Mapping[str, Sequence[tuple[float, float]]] | None = None,
                prefix_cache: Mapping[str, Any] | None = None,
                ) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    end = (t_end - t0) * speed
    bin_s = plot_bin_s(end)
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
    engine_roles = [r for r in sorted(desired) if r != Role.ROUTER] or sorted(desired)
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

    save(prefix_cache_figure(plt, prefix_cache or {}, slo, end), "prefix_cache.png")
    return paths


def prefix_cache_figure(plt: Any, section: Mapping[str, Any], slo: Slo, end: float) -> Any:
    """The prefix caches' hit rate over time (per role, the router's expectation, the trace's
    ideal) above TTFT p50/p90 over the same time, and TTFT by reusable share."""
    fig, (top, mid, low) = plt.subplots(3, 1, figsize=(8, 8.5))
    over = section.get("over_time", {})
    for role, points in sorted(over.get("hit_rate", {}).items()):
        top.plot([p[0] for p in points], [p[1] for p in points], label=f"{role} (engines)",
                 linewidth=2.0 if role == ALL_ROLES else 1.0)
    for role, points in sorted(over.get("router_expected", {}).items()):
        top.plot([p[0] for p in points], [p[1] for p in points], "--",
                 label=f"{role} (router's expectation)")
    if section.get("ideal_hit_rate") is not None:
        top.axhline(section["ideal_hit_rate"], color="grey", linestyle=":",
                    label=f"ideal (trace) {section['ideal_hit_rate'] * 100:.0f}%")
    top.set(xlim=(0, max(end, 1.0)), ylim=(0, 1.05), ylabel="hit tokens / prompt tokens",
            title="Prefix-cache hit rate (vllm:prefix_cache_hits / queries, from Prometheus)")
    if top.get_legend_handles_labels()[0]:
        top.legend(fontsize=8, loc="lower right")
    ttft = over.get("ttft", {})
    for key in ("p50", "p90"):
        pts = [(t, v) for t, v in zip(ttft.get("t", []), ttft.get(key, []), strict=True)
               if v is not None]
        mid.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=f"TTFT {key}")
    mid.axhline(slo.ttft_s, color="red", linestyle="--", label=f"target {slo.ttft_s:g}s")
    mid.set(xlim=(0, max(end, 1.0)), xlabel="trace time (s)", ylabel="seconds",
            title=f"TTFT at the client per {ttft.get('bin_s', 0):.0f}s of sends")
    mid.set_yscale("log")
    mid.legend(fontsize=8, loc="upper right")
    groups = section.get("ttft_by_reusable_share", [])
    labels = [f"{g['reusable_share']}\n({g['requests']} req)" for g in groups]
    xs = np.arange(len(groups))
    for offset, key in ((-0.2, "p50"), (0.2, "p90")):
        low.bar(xs + offset, [g["ttft_seconds"][key] or 0.0 for g in groups], width=0.4,
                label=f"TTFT {key}")
    low.set_xticks(xs, labels, fontsize=8)
    low.set(ylabel="seconds", title="TTFT by the share of the prompt an earlier request had sent")
    low.legend(fontsize=8)
    return fig


# ---------------------------------------------------------------------------------------------
# Summary table


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


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
    prefix = report.get("prefix_cache")
    if prefix and prefix.get("hit_rate") is not None:
        by_role = ", ".join(f"{role} {pct(d['hit_rate'])}" for role, d in prefix["by_role"].items())
        expected = prefix.get("router_expected_hit_rate")
        t.add_row("prefix-cache hit rate", pct(prefix["hit_rate"]), by_role,
                  f"router expected {pct(expected)}" if expected is not None else "",
                  f"ideal {pct(prefix['ideal_hit_rate'])}")
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
