"""Grafana dashboards (Pool, Autoscaler, Fleet) as plain JSON models.

Panels query Prometheus through the `datasource` template variable and filter with the
`namespace` and `pool` variables (multi-value regexes). Scale events come from the
autoscaler's metrics as annotations naming the role, the new size and the decision's reason.
Each panel shows one unit (its y axis has one meaning); every unit is a Grafana unit id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from poolpilot.dashboards.promql import (
    BY_POOL,
    BY_ROLE,
    ENGINE_ROLES,
    POOL_TARGETS,
    quantile,
    rate,
    series,
)

from poolpilot import metrics as m
from poolpilot.reasons import SIGNAL_DESCRIPTION, SIGNAL_UNIT, SignalName, reasons_text

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
    axis_label: str = ""  # what the unit counts, when the unit id alone does not say


@dataclass
class Row:
    title: str


def _target(q: Query, ref: str) -> Json:
    return {"datasource": DS, "expr": q.expr, "legendFormat": q.legend, "refId": ref,
            "range": True}


def _panel_json(p: Panel, pid: int, x: int, y: int) -> Json:
    defaults: Json = {"unit": p.unit}
    if p.axis_label:
        defaults["custom"] = {"axisLabel": p.axis_label}
    field_config: Json = {"defaults": defaults, "overrides": []}
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
    if p.kind == "bargauge":  # one bar per series, its last value
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "displayMode": "basic", "orientation": "horizontal", "showUnfilled": True}
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
    variables = [ds, _query_var("namespace",
                                f"label_values({series('up', POOL_TARGETS)}, namespace)")]
    if with_pool:
        variables.append(
            _query_var("pool", f"label_values({series('up', POOL_TARGETS, NS)}, pool)")
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
            "titleFormat": "{{role}} scaled {{direction}} to {{replicas}}",
            "textFormat": "{{namespace}}/{{pool}}: {{role}} scaled {{direction}} to "
                          "{{replicas}} replicas ({{reason}})",
            "tagKeys": "namespace,pool,role,reason", "useValueForTime": False,
        })
    return {"list": items}


# A scale decision (direction up or down) in the last minute, labelled with its reason, joined
# with the size it decided on: count_values turns the desired-replicas value into the label
# `replicas` (an annotation can show labels, not values). A decision series seen for the first
# time starts at 1, where increase() sees no change: new series count too. Grafana runs the
# annotation as a range query, where Prometheus 2.42's `count_values by (a, b, c)` drops a
# grouping label (role: the join below then fails as many-to-many); `without ()` keeps the
# labels `max by` left, on every version.
_DECIDED = series(m.AUTOSCALER_DECISIONS, NS, POOL, SCALED)
SCALE_DECISIONS = (
    f"max by ({BY_ROLE}, direction, reason) "
    f"((increase({_DECIDED}[1m]) > 0) or ({_DECIDED} unless {_DECIDED} offset 1m))"
)
SCALE_SIZES = (
    f'count_values without () ("replicas", '
    f"max by ({BY_ROLE}) ({series(m.AUTOSCALER_DESIRED, NS, POOL)}))"
)
SCALE_EVENTS = (
    f"{SCALE_SIZES}\n* on ({BY_ROLE}) group_right (replicas)\n"
    f"({SCALE_DECISIONS} > bool 0)"
)
SCALE_EVENTS_INPUTS = (SCALE_SIZES, SCALE_DECISIONS)

# The autoscaler's signals (the `signal` label), one panel per unit of the autoscaler's own
# vocabulary (poolpilot.reasons.SIGNAL_UNIT): unit -> (panel title, Grafana unit id, axis label).
SIGNAL_PANELS = {
    "seconds": ("Latency signals", "s", ""),
    "requests": ("Queue and sequences", "short", "requests"),
    "tokens/s": ("Token throughput and demand", "cps", "tokens/s"),
    "fraction": ("KV-cache usage", "percentunit", ""),
}
SIGNAL_UNITS = {s: SIGNAL_PANELS[SIGNAL_UNIT[s]][1] for s in SignalName}


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


def _latency_panel(title: str, hist: str, by: str, legend: str, target_signal: SignalName,
                   description: str, *matchers: str) -> Panel:
    queries = [
        Query(quantile(q, hist, W, by, NS, POOL, *matchers), f"{legend} p{round(q * 100)}")
        for q in (0.5, 0.9, 0.99)
    ]
    signal = f'signal="{target_signal}"'
    queries.append(Query(
        f"max by ({BY_POOL}) ({series(m.AUTOSCALER_SIGNAL_TARGET, NS, POOL, signal)})",
        "{{pool}} target",
    ))
    return Panel(title, queries, unit="s", description=description, dashed=".*target")


def _by(agg: str, by: str, metric: str, *matchers: str) -> str:
    return f"{agg} by ({by}) ({series(metric, *matchers)})"


def _rate_by(by: str, metric: str, *matchers: str) -> str:
    return f"sum by ({by}) ({rate(metric, W, *matchers)})"


# The router labels its prefix counters by the engine's URL (`endpoint`, http://IP:PORT);
# Prometheus labels the engine's own series by its target (`instance`, IP:PORT).
BY_ENDPOINT = f"{BY_POOL}, instance"


def _as_instance(expr: str) -> str:
    return f'label_replace({expr}, "instance", "$1", "endpoint", "https?://(.+)")'


def _prefix_hit_panel(f: tuple[str, ...]) -> Panel:
    """What the router expected each engine to serve from its prefix cache, beside what the
    engine reports it served."""
    expected = _as_instance(rate(m.ROUTER_PREFIX_EXPECTED_HITS, W, *f))
    routed = _as_instance(rate(m.ROUTER_PREFIX_ROUTED, W, *f))
    hits = rate(m.VLLM_PREFIX_CACHE_HITS, W, *f, ENGINE_ROLES)
    queries = rate(m.VLLM_PREFIX_CACHE_QUERIES, W, *f, ENGINE_ROLES)
    return Panel("Prefix-cache hit rate per engine: expected by the router vs the engine's", [
        Query(f"sum by ({BY_ENDPOINT}) ({expected}) / sum by ({BY_ENDPOINT}) ({routed})",
              "{{pool}} {{instance}} expected by the router"),
        Query(f"sum by ({BY_ENDPOINT}) ({hits}) / sum by ({BY_ENDPOINT}) ({queries})",
              "{{pool}} {{instance}} engine"),
    ], unit="percentunit", width=24, dashed=".*expected by the router",
        description="Share of the prompt tokens sent to each engine that its prefix cache "
        "served. Dashed: what the router expected when it chose the engine (prefix-aware "
        "routing: spec.router.prefixRouting; summed over the router replicas). Solid: the "
        "engine's own vllm:prefix_cache_hits_total over vllm:prefix_cache_queries_total. "
        "Expected well above the engine's: the router's record (Approximate) outlives what "
        "the engine keeps (it evicted blocks), or the router's token estimate is off.")


def _cold_start_panel(f: tuple[str, ...]) -> Panel:
    """The phases of the engines' cold starts per role (the launcher's series), the mean over
    the role's current pods, in the order they happen."""
    phases = 'phase!="total"'
    return Panel("Cold-start phases per role (mean of the current pods)", [
        Query(_by("avg", f"{BY_ROLE}, phase", m.ENGINE_COLD_START, *f, ENGINE_ROLES, phases),
              "{{pool}} {{role}} {{phase}}"),
        Query(_by("avg", BY_ROLE, m.ENGINE_COLD_START, *f, ENGINE_ROLES, 'phase="total"'),
              "{{pool}} {{role}} total"),
    ], unit="s", kind="bargauge", width=24, height=10,
        description="Seconds each phase of an engine's start took, from the launcher's "
        f"{m.ENGINE_COLD_START}: import (python, torch, vLLM), engine (config, engine core "
        "process), weights, compile (torch.compile; none with enforceEager), graphs (CUDA "
        "graphs; none on CPU), warmup (KV cache, profiling), server (the API server), ready "
        "(to the first /health 200). Total: the container's start to ready. What came before "
        "(scheduling, image pull) is in each pod's poolpilot.dev/cold-start annotation.")


def pool_dashboard() -> Json:
    f = (NS, POOL)
    items: list[Panel | Row] = [
        Row("Latency against the SLO"),
        _latency_panel(
            "TTFT at the router (user-visible)", m.ROUTER_TTFT, BY_POOL, "{{pool}}",
            SignalName.TTFT,
            "Time to first token as clients see it: prefill + KV transfer + first decode step. "
            "Dashed: the pool's SLO target.",
        ),
        _latency_panel(
            "TTFT per engine role", m.VLLM_TTFT, BY_ROLE, "{{pool}} {{role}}", SignalName.TTFT,
            "vLLM's own time to first token per role: tells which role adds the latency.",
            ENGINE_ROLES,
        ),
        _latency_panel(
            "Inter-token latency at the router", m.ROUTER_ITL, BY_POOL, "{{pool}}", SignalName.ITL,
            "Time between streamed tokens as clients see it. Dashed: the pool's SLO target.",
        ),
        _latency_panel(
            "Inter-token latency per engine role", m.VLLM_ITL, BY_ROLE, "{{pool}} {{role}}",
            SignalName.ITL, "vLLM's inter-token latency (decode steps) per role.", ENGINE_ROLES,
        ),
        Row("Load"),
        Panel("Queue depth per role", [
            Query(_by("sum", BY_ROLE, m.VLLM_WAITING, *f), "{{pool}} {{role}} waiting"),
        ], description="Requests waiting for a slot: which role is the bottleneck."),
        Panel("Running requests per role", [
            Query(_by("sum", BY_ROLE, m.VLLM_RUNNING, *f), "{{pool}} {{role}} running"),
        ], description="Sequences in the running batch (continuous batching)."),
        Panel("KV-cache usage", [
            Query(_by("max", BY_ROLE, m.VLLM_KV_USAGE, *f), "{{pool}} {{role}} max"),
            Query(_by("avg", BY_ROLE, m.VLLM_KV_USAGE, *f), "{{pool}} {{role}} avg"),
        ], unit="percentunit", description="Share of KV-cache blocks in use per engine."),
        Panel("Tokens per second", [
            Query(_rate_by(BY_ROLE, m.VLLM_PROMPT_TOKENS, *f), "{{pool}} {{role}} prompt"),
            Query(_rate_by(BY_ROLE, m.VLLM_GENERATION_TOKENS, *f),
                  "{{pool}} {{role}} generation"),
        ], unit="cps", axis_label="tokens/s",
            description="Prompt tokens prefilled and tokens generated, per role."),
        Panel("Requests at the router", [
            Query(_rate_by(f"{BY_POOL}, code", m.ROUTER_REQUESTS, *f), "{{pool}} {{code}}"),
        ], unit="reqps", description="Requests per second by HTTP status."),
        Panel("KV-cache transfer failures", [
            Query(_rate_by(BY_POOL, m.ROUTER_KV_TRANSFER_FAILURES, *f),
                  "{{pool}} failed handoffs"),
        ], unit="reqps", description="Prefill -> decode handoffs that failed (per second)."),
        Panel("Local prefill on decode engines", [
            Query(_rate_by(f"{BY_POOL}, reason", m.ROUTER_LOCAL_PREFILL, *f),
                  "{{pool}} {{reason}}"),
        ], unit="reqps", description="Requests a decode engine prefilled itself (no KV "
                       "transfer): prefill_behind, the prefill role would have broken the TTFT "
                       "target; kv_transfer_failed, a failed handoff retried locally; "
                       "prefill_failed, a prefill that failed on every prefill engine (or "
                       "found none) retried locally. A pool living on prefill_behind needs "
                       "prefill replicas."),
        Row("Prefix cache"),
        _prefix_hit_panel(f),
        Row("Replicas"),
        Panel("Desired vs ready replicas per role", [
            Query(_by("sum", BY_ROLE, m.AUTOSCALER_DESIRED, *f), "{{pool}} {{role}} desired"),
            Query(_by("sum", BY_ROLE, "up", *f), "{{pool}} {{role}} ready (scraped)"),
        ], description="Desired: the autoscaler's decision. Ready: replicas Prometheus scrapes "
                       "successfully. Orange marks: scale events.", dashed=".*desired"),
        Panel("Prefill:decode ratio", [
            Query(f"{_by('sum', BY_POOL, 'up', *f, PREFILL)} / "
                  f"{_by('sum', BY_POOL, 'up', *f, DECODE)}",
                  "{{pool}} ready prefill:decode"),
            Query(f"{_by('sum', BY_POOL, m.AUTOSCALER_DESIRED, *f, PREFILL)} / "
                  f"{_by('sum', BY_POOL, m.AUTOSCALER_DESIRED, *f, DECODE)}",
                  "{{pool}} desired prefill:decode"),
        ], description="Prefill replicas per decode replica (Disaggregated pools)."),
        _cold_start_panel(f),
    ]
    return dashboard("poolpilot-pool", "poolpilot / Pool",
                     "One InferencePool: latency against its SLO, load and replicas per role.",
                     items)


def _signals_panel(unit: str) -> Panel:
    """Every signal the autoscaler measures in `unit`, each next to its target (dashed)."""
    title, grafana_unit, axis_label = SIGNAL_PANELS[unit]
    signals = [s for s in SignalName if SIGNAL_UNIT[s] == unit]
    f = (NS, POOL, f'signal=~"{"|".join(signals)}"')
    description = "Each signal the decision used, with its target dashed:\n" + "\n".join(
        f"- `{s}`: {SIGNAL_DESCRIPTION[s]}" for s in signals)
    return Panel(title, [
        Query(f"max by ({BY_ROLE}, signal) ({series(m.AUTOSCALER_SIGNAL, *f)})",
              "{{pool}} {{role}} {{signal}}"),
        Query(f"max by ({BY_ROLE}, signal) ({series(m.AUTOSCALER_SIGNAL_TARGET, *f)})",
              "{{pool}} {{role}} {{signal}} target"),
    ], unit=grafana_unit, axis_label=axis_label, description=description, dashed=".*target")


def autoscaler_dashboard() -> Json:
    f = (NS, POOL)
    items: list[Panel | Row] = [
        Row("Decisions"),
        Panel("Decisions by reason", [
            Query(f"sum by ({BY_ROLE}, reason) (increase("
                  f"{series(m.AUTOSCALER_DECISIONS, *f)}[{W}]))",
                  "{{pool}} {{role}} {{reason}}"),
        ], description="Why each cycle kept or changed the size. The reasons, by the step of "
                       "the decision that gives them:\n" + reasons_text()),
        Panel("Scale decisions by direction", [
            Query(f"sum by ({BY_ROLE}, direction) (increase("
                  f"{series(m.AUTOSCALER_DECISIONS, *f, SCALED)}[{W}]))",
                  "{{pool}} {{role}} {{direction}}"),
        ], description="Decisions that changed the size, up or down."),
        Panel("Desired replicas", [
            Query(_by("sum", BY_ROLE, m.AUTOSCALER_DESIRED, *f), "{{pool}} {{role}}"),
        ]),
        Panel("MetricsAvailable", [
            Query(_by("min", BY_ROLE, m.AUTOSCALER_METRICS_AVAILABLE, *f), "{{pool}} {{role}}"),
        ], description="1: every signal had a fresh value; 0: the size is held (no data is "
                       "not zero)."),
        Row("Signals next to their targets"),
        *(_signals_panel(unit) for unit in SIGNAL_PANELS),
        Panel("ScalingLimited", [
            Query(f"max by ({BY_ROLE}, reason) ({series(m.AUTOSCALER_LIMITED, *f)})",
                  "{{pool}} {{role}} {{reason}}"),
        ], description="1 while the autoscaler cannot get the replicas it wants."),
        Panel("Cycle time", [
            Query(quantile(0.5, m.AUTOSCALER_CYCLE, W, "job"), "p50"),
            Query(quantile(0.99, m.AUTOSCALER_CYCLE, W, "job"), "p99"),
        ], unit="s", description="One cycle: every query for all pools, decisions, writes."),
    ]
    return dashboard("poolpilot-autoscaler", "poolpilot / Autoscaler",
                     "What the autoscaler decided, why, and on which signals.", items)



def _operator_row() -> list[Panel | Row]:
    """The operator's own series (poolpilot.operator.metrics). They describe the operator
    process, not a pool: no namespace or pool filter (the operator runs in its own namespace),
    summed over its replicas (only the active one reconciles)."""
    return [
        Row("Operator"),
        Panel("Reconciles per second by result", [
            Query(f"sum by (result) ({rate(m.OPERATOR_RECONCILES, W)})", "{{result}}"),
        ], unit="ops", description="How each reconcile of a pool ended: converged (children "
                       "written), no_op (nothing to write), invalid_spec, name_conflict, "
                       "api_error, pool_gone, backing_off. An idle healthy operator shows only "
                       "no_op (the drift timer)."),
        Panel("Reconcile duration", [
            Query(quantile(q, m.OPERATOR_RECONCILE_DURATION, W, "trigger"),
                  f"{{{{trigger}}}} p{round(q * 100)}") for q in (0.5, 0.99)
        ], unit="s", description="Seconds one reconcile took (reading, writing, status), "
                                 "by what started it: a change to the pool or the drift "
                                 "timer."),
        Panel("Writes and API errors per second", [
            Query(f"sum({rate(m.OPERATOR_WRITES, W)})", "writes"),
            Query(f"sum by (kind) ({rate(m.OPERATOR_API_ERRORS, W)})", "{{kind}} API errors"),
        ], unit="ops", description="Writes: applies, deletes and size hand-overs. API errors "
                       "by kind: transient ones are retried in 2 s; permanent ones (403, 422, "
                       "quota) set the pool Degraded and back off up to 5 min."),
        Panel("Reconciles running and queued", [
            Query(f"sum({series(m.OPERATOR_ACTIVE)})", "running"),
            Query(f"sum({series(m.OPERATOR_QUEUED)})", "queued"),
        ], description="Queued: reconciles waiting for one of the --max-concurrent-reconciles "
                       "slots. Above 0 for long: the API server is the bottleneck."),
    ]


def fleet_dashboard() -> Json:
    items: list[Panel | Row] = [
        Panel("Pools", [Query(f"count(count by ({BY_POOL}) ({series('up', NS, POOL_TARGETS)}))",
                              "pools")], kind="stat", width=6, height=5),
        Panel("Engine replicas up", [Query(f"sum({series('up', NS, ENGINE_ROLES)})",
                                           "replicas")], kind="stat", width=6, height=5),
        Panel("Requests per second", [Query(f"sum({rate(m.ROUTER_REQUESTS, W, NS)})",
                                            "req/s")], kind="stat", unit="reqps", width=6,
              height=5),
        Panel("Requests waiting", [Query(f"sum({series(m.VLLM_WAITING, NS)})", "waiting")],
              kind="stat", width=6, height=5),
        Panel("TTFT p90 at the router per pool", [
            Query(quantile(0.9, m.ROUTER_TTFT, W, BY_POOL, NS), "{{namespace}}/{{pool}}"),
        ], unit="s"),
        Panel("ITL p90 at the router per pool", [
            Query(quantile(0.9, m.ROUTER_ITL, W, BY_POOL, NS), "{{namespace}}/{{pool}}"),
        ], unit="s"),
        Panel("Requests per second per pool", [
            Query(_rate_by(BY_POOL, m.ROUTER_REQUESTS, NS), "{{namespace}}/{{pool}}"),
        ], unit="reqps"),
        Panel("Queue depth per pool and role", [
            Query(_by("sum", BY_ROLE, m.VLLM_WAITING, NS), "{{namespace}}/{{pool}} {{role}}"),
        ]),
        Panel("Replicas up per pool and role", [
            Query(_by("sum", BY_ROLE, "up", NS, POOL_TARGETS),
                  "{{namespace}}/{{pool}} {{role}}"),
        ]),
        Panel("KV-cache usage (max) per pool", [
            Query(_by("max", BY_POOL, m.VLLM_KV_USAGE, NS), "{{namespace}}/{{pool}}"),
        ], unit="percentunit"),
        *_operator_row(),
    ]
    return dashboard("poolpilot-fleet", "poolpilot / Fleet",
                     "Every InferencePool at a glance.", items, with_pool=False,
                     scale_events=False)


DASHBOARDS = {
    "pool": pool_dashboard,
    "autoscaler": autoscaler_dashboard,
    "fleet": fleet_dashboard,
}
