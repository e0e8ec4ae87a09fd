"""Grafana dashboards (Pool, Autoscaler, Fleet) as plain JSON models.

Panels query Prometheus through the `datasource` template variable and filter with the
`namespace` and `pool` variables (multi-value regexes). Scale events come from the
autoscaler's desired-replicas gauge as annotations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from poolpilot import metrics as m
from poolpilot.dashboards.promql import BY_POOL, BY_ROLE, ENGINE_ROLES, POOL_TARGETS, quantile, sel

SCHEMA_VERSION = 39
DS = {"type": "prometheus", "uid": "${datasource}"}
W = "$__rate_interval"
NS = 'namespace=~"$namespace"'
POOL = 'pool=~"$pool"'
PREFILL = 'role="prefill"'
DECODE = 'role="decode"'
SCALED = 'direction!="none"'
Json = dict[str, Any]


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass
class Panel:
    title: str
    queries: list[Query]
    unit: str = "short"
    kind: str = "timeseries"
    description: str = ""
    width: int = 12
    height: int = 8
    # Series drawn as dashed threshold lines (SLO targets), matched by legend regex.
    dashed: str = ""
    extra_options: Json = field(default_factory=dict)


@dataclass
class Row:
    title: str


def _target(q: Query, ref: str) -> Json:
    return {"datasource": DS, "expr": q.expr, "legendFormat": q.legend, "refId": ref,
            "range": True}


def _panel_json(p: Panel, pid: int, x: int, y: int) -> Json:
    field_config: Json = {"defaults": {"unit": p.unit}, "overrides": []}
    if p.dashed:
        field_config["overrides"].append({
            "matcher": {"id": "byRegexp", "options": p.dashed},
            "properties": [
                {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                {"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
            ],
        })
    options: Json = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                     "tooltip": {"mode": "multi", "sort": "desc"}}
    if p.kind == "stat":
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "colorMode": "value", "graphMode": "area", "textMode": "auto"}
    options.update(p.extra_options)
    return {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DS,
        "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
        "targets": [_target(q, chr(ord("A") + i)) for i, q in enumerate(p.queries)],
        "fieldConfig": field_config,
        "options": options,
    }


def _layout(items: list[Panel | Row]) -> list[Json]:
    """Left-to-right, top-to-bottom on Grafana's 24-column grid; ids are unique and stable."""
    out: list[Json] = []
    x = y = 0
    row_h = 0
    for pid, item in enumerate(items, start=1):
        if isinstance(item, Row):
            y += row_h
            x, row_h = 0, 0
            out.append({"id": pid, "type": "row", "title": item.title, "collapsed": False,
                        "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
            y += 1
            continue
        if x + item.width > 24:
            y += row_h
            x, row_h = 0, 0
        out.append(_panel_json(item, pid, x, y))
        x += item.width
        row_h = max(row_h, item.height)
    return out


def _variables(with_pool: bool) -> Json:
    ds = {"name": "datasource", "label": "Prometheus", "type": "datasource",
          "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "options": [],
          "regex": "", "skipUrlSync": False}
    variables = [ds, _query_var("namespace", f"label_values(up{sel(POOL_TARGETS)}, namespace)")]
    if with_pool:
        variables.append(
            _query_var("pool", f"label_values(up{sel(POOL_TARGETS, NS)}, pool)")
        )
    return {"list": variables}


def _query_var(name: str, query: str) -> Json:
    return {
        "name": name, "label": name.capitalize(), "type": "query", "datasource": DS,
        "query": {"query": query, "refId": f"{name}-values"}, "definition": query,
        "current": {}, "hide": 0, "includeAll": True, "multi": True, "allValue": ".+",
        "refresh": 2, "sort": 1, "options": [], "regex": "", "skipUrlSync": False,
    }


def _annotations(scale_events: bool) -> Json:
    builtin = {
        "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
        "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    items = [builtin]
    if scale_events:
        items.append({
            "name": "Scale events", "datasource": DS, "enable": True, "hide": False,
            "iconColor": "orange", "expr": SCALE_EVENTS, "step": "30s",
            "titleFormat": "{{role}} scaled", "textFormat": "{{pool}}: {{role}} now {{__value}}",
            "tagKeys": "namespace,pool,role", "useValueForTime": False,
        })
    return {"list": items}


# A change of the desired replica count is a scale decision (up or down).
SCALE_EVENTS_SERIES = f"{m.AUTOSCALER_DESIRED}{sel(NS, POOL)}"
SCALE_EVENTS = f"changes({SCALE_EVENTS_SERIES}[1m]) > 0"


def dashboard(uid: str, title: str, description: str, items: list[Panel | Row], *,
              with_pool: bool = True, scale_events: bool = True) -> Json:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["poolpilot", "llm-inference"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": _variables(with_pool),
        "annotations": _annotations(scale_events),
        "links": [{"title": "poolpilot dashboards", "type": "dashboards", "tags": ["poolpilot"],
                   "asDropdown": True, "includeVars": True, "keepTime": True}],
        "panels": _layout(items),
    }


def _latency_panel(title: str, hist: str, selector: str, by: str, legend: str,
                   target_signal: str, description: str) -> Panel:
    signal = f'signal="{target_signal}"'
    queries = [
        Query(quantile(q, hist, selector, W, by), f"{legend} p{round(q * 100)}")
        for q in (0.5, 0.9, 0.99)
    ]
    queries.append(Query(
        f"max by ({BY_POOL}) ({m.AUTOSCALER_SIGNAL_TARGET}{sel(NS, POOL, signal)})",
        "{{pool}} target",
    ))
    return Panel(title, queries, unit="s", description=description, dashed=".*target")


def pool_dashboard() -> Json:
    s = sel(NS, POOL)
    s_engines = sel(NS, POOL, ENGINE_ROLES)
    items: list[Panel | Row] = [
        Row("Latency against the SLO"),
        _latency_panel(
            "TTFT at the router (user-visible)", m.ROUTER_TTFT, s, BY_POOL, "{{pool}}", "TTFT",
            "Time to first token as clients see it: prefill + KV transfer + first decode step. "
            "Dashed: the pool's SLO target.",
        ),
        _latency_panel(
            "TTFT per engine role", m.VLLM_TTFT, s_engines, BY_ROLE, "{{pool}} {{role}}", "TTFT",
            "vLLM's own time to first token per role: tells which role adds the latency.",
        ),
        _latency_panel(
            "Inter-token latency at the router", m.ROUTER_ITL, s, BY_POOL, "{{pool}}", "ITL",
            "Time between streamed tokens as clients see it. Dashed: the pool's SLO target.",
        ),
        _latency_panel(
            "Inter-token latency per engine role", m.VLLM_ITL, s_engines, BY_ROLE,
            "{{pool}} {{role}}", "ITL", "vLLM's inter-token latency (decode steps) per role.",
        ),
        Row("Load"),
        Panel("Queue depth per role", [
            Query(f"sum by ({BY_ROLE}) ({m.VLLM_WAITING}{s})", "{{pool}} {{role}} waiting"),
        ], description="Requests waiting for a slot: which role is the bottleneck."),
        Panel("Running requests per role", [
            Query(f"sum by ({BY_ROLE}) ({m.VLLM_RUNNING}{s})", "{{pool}} {{role}} running"),
        ], description="Sequences in the running batch (continuous batching)."),
        Panel("KV-cache usage", [
            Query(f"max by ({BY_ROLE}) ({m.VLLM_KV_USAGE}{s})", "{{pool}} {{role}} max"),
            Query(f"avg by ({BY_ROLE}) ({m.VLLM_KV_USAGE}{s})", "{{pool}} {{role}} avg"),
        ], unit="percentunit", description="Share of KV-cache blocks in use per engine."),
        Panel("Tokens per second", [
            Query(f"sum by ({BY_ROLE}) (rate({m.VLLM_PROMPT_TOKENS}{s}[{W}]))",
                  "{{pool}} {{role}} prompt"),
            Query(f"sum by ({BY_ROLE}) (rate({m.VLLM_GENERATION_TOKENS}{s}[{W}]))",
                  "{{pool}} {{role}} generation"),
        ], unit="tps", description="Prompt tokens prefilled and tokens generated, per role."),
        Panel("Requests at the router", [
            Query(f"sum by ({BY_POOL}, code) (rate({m.ROUTER_REQUESTS}{s}[{W}]))",
                  "{{pool}} {{code}}"),
        ], unit="reqps", description="Requests per second by HTTP status."),
        Panel("KV-cache transfer failures", [
            Query(f"sum by ({BY_POOL}) (rate({m.ROUTER_KV_TRANSFER_FAILURES}{s}[{W}]))",
                  "{{pool}} failed handoffs"),
        ], unit="reqps", description="Prefill -> decode handoffs that failed (per second)."),
        Row("Replicas"),
        Panel("Desired vs ready replicas per role", [
            Query(f"sum by ({BY_ROLE}) ({m.AUTOSCALER_DESIRED}{s})", "{{pool}} {{role}} desired"),
            Query(f"sum by ({BY_ROLE}) (up{s})", "{{pool}} {{role}} ready (scraped)"),
        ], description="Desired: the autoscaler's decision. Ready: replicas Prometheus scrapes "
                       "successfully. Orange marks: scale events.", dashed=".*desired"),
        Panel("Prefill:decode ratio", [
            Query(f'sum by ({BY_POOL}) (up{sel(NS, POOL, PREFILL)}) / '
                  f'sum by ({BY_POOL}) (up{sel(NS, POOL, DECODE)})',
                  "{{pool}} ready prefill:decode"),
            Query(f'sum by ({BY_POOL}) ({m.AUTOSCALER_DESIRED}{sel(NS, POOL, PREFILL)})'
                  f' / sum by ({BY_POOL}) '
                  f'({m.AUTOSCALER_DESIRED}{sel(NS, POOL, DECODE)})',
                  "{{pool}} desired prefill:decode"),
        ], description="Prefill replicas per decode replica (Disaggregated pools)."),
    ]
    return dashboard("poolpilot-pool", "poolpilot / Pool",
                     "One InferencePool: latency against its SLO, load and replicas per role.",
                     items)


def autoscaler_dashboard() -> Json:
    s = sel(NS, POOL)
    items: list[Panel | Row] = [
        Row("Decisions"),
        Panel("Decisions by reason", [
            Query(f"sum by ({BY_ROLE}, reason) (increase({m.AUTOSCALER_DECISIONS}{s}[{W}]))",
                  "{{pool}} {{role}} {{reason}}"),
        ], description="Why each cycle kept or changed the size (CamelCase reasons).",
            extra_options={"tooltip": {"mode": "multi", "sort": "desc"}}),
        Panel("Scale decisions by direction", [
            Query(f'sum by ({BY_ROLE}, direction) (increase({m.AUTOSCALER_DECISIONS}'
                  f"{sel(NS, POOL, SCALED)}[{W}]))",
                  "{{pool}} {{role}} {{direction}}"),
        ]),
        Panel("Desired replicas", [
            Query(f"sum by ({BY_ROLE}) ({m.AUTOSCALER_DESIRED}{s})", "{{pool}} {{role}}"),
        ]),
        Panel("MetricsAvailable", [
            Query(f"min by ({BY_ROLE}) ({m.AUTOSCALER_METRICS_AVAILABLE}{s})",
                  "{{pool}} {{role}}"),
        ], description="1: every signal had a fresh value; 0: the size is held (no data is "
                       "not zero).", extra_options={"legend": {"showLegend": True,
                                                               "displayMode": "list",
                                                               "placement": "bottom"}}),
        Row("Signals next to their targets"),
        Panel("Signals and targets", [
            Query(f"max by ({BY_ROLE}, signal) ({m.AUTOSCALER_SIGNAL}{s})",
                  "{{pool}} {{role}} {{signal}}"),
            Query(f"max by ({BY_ROLE}, signal) ({m.AUTOSCALER_SIGNAL_TARGET}{s})",
                  "{{pool}} {{role}} {{signal}} target"),
        ], description="Each signal the decision used, with its target dashed.",
            dashed=".*target", width=24),
        Panel("ScalingLimited", [
            Query(f"max by ({BY_ROLE}, reason) ({m.AUTOSCALER_LIMITED}{s})",
                  "{{pool}} {{role}} {{reason}}"),
        ], description="1 while the autoscaler cannot get the replicas it wants."),
        Panel("Cycle time", [
            Query(f"histogram_quantile(0.5, sum by (le) (rate({m.AUTOSCALER_CYCLE}_bucket[{W}])))",
                  "p50"),
            Query(f"histogram_quantile(0.99, sum by (le) (rate({m.AUTOSCALER_CYCLE}_bucket[{W}])))",
                  "p99"),
        ], unit="s", description="One cycle: every query for all pools, decisions, writes."),
    ]
    return dashboard("poolpilot-autoscaler", "poolpilot / Autoscaler",
                     "What the autoscaler decided, why, and on which signals.", items)


def fleet_dashboard() -> Json:
    s = sel(NS)
    items: list[Panel | Row] = [
        Panel("Pools", [Query(f"count(count by ({BY_POOL}) (up{sel(NS, POOL_TARGETS)}))",
                              "pools")], kind="stat", width=6, height=5),
        Panel("Engine replicas up", [Query(f"sum(up{sel(NS, ENGINE_ROLES)})", "replicas")],
              kind="stat", width=6, height=5),
        Panel("Requests per second", [Query(f"sum(rate({m.ROUTER_REQUESTS}{s}[{W}]))", "req/s")],
              kind="stat", unit="reqps", width=6, height=5),
        Panel("Requests waiting", [Query(f"sum({m.VLLM_WAITING}{s})", "waiting")],
              kind="stat", width=6, height=5),
        Panel("TTFT p90 at the router per pool", [
            Query(quantile(0.9, m.ROUTER_TTFT, s, W, BY_POOL), "{{namespace}}/{{pool}}"),
        ], unit="s"),
        Panel("ITL p90 at the router per pool", [
            Query(quantile(0.9, m.ROUTER_ITL, s, W, BY_POOL), "{{namespace}}/{{pool}}"),
        ], unit="s"),
        Panel("Requests per second per pool", [
            Query(f"sum by ({BY_POOL}) (rate({m.ROUTER_REQUESTS}{s}[{W}]))",
                  "{{namespace}}/{{pool}}"),
        ], unit="reqps"),
        Panel("Queue depth per pool and role", [
            Query(f"sum by ({BY_ROLE}) ({m.VLLM_WAITING}{s})", "{{namespace}}/{{pool}} {{role}}"),
        ]),
        Panel("Replicas up per pool and role", [
            Query(f"sum by ({BY_ROLE}) (up{sel(NS, POOL_TARGETS)})",
                  "{{namespace}}/{{pool}} {{role}}"),
        ]),
        Panel("KV-cache usage (max) per pool", [
            Query(f"max by ({BY_POOL}) ({m.VLLM_KV_USAGE}{s})", "{{namespace}}/{{pool}}"),
        ], unit="percentunit"),
    ]
    return dashboard("poolpilot-fleet", "poolpilot / Fleet",
                     "Every InferencePool at a glance.", items, with_pool=False,
                     scale_events=False)


DASHBOARDS = {
    "pool": pool_dashboard,
    "autoscaler": autoscaler_dashboard,
    "fleet": fleet_dashboard,
}
