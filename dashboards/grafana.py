"""Grafana dashboards (Pool, Autoscaler, Fleet), built with Grafana's typed builders.

The builders come from grafana-foundation-sdk (its Grafana 11.6 schema): a misspelt option or a
wrong type fails here or in mypy, and the SDK follows Grafana's schema as it moves. The helpers
below only fix this project's conventions (datasource, legend, refIds, dashed targets, ids).

Panels query Prometheus through the `datasource` template variable and filter with the
`namespace` and `pool` variables (multi-value regexes). Scale events come from the
autoscaler's metrics as annotations naming the role, the new size and the decision's reason.
Each panel shows one unit (its y axis has one meaning); every unit is a Grafana unit id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeVar

from grafana_foundation_sdk.builders import bargauge, prometheus, stat, timeseries
from grafana_foundation_sdk.builders import common as viz
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders.dashboard import Row
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
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

DS = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
W = "$__rate_interval"
NS = 'namespace=~"$namespace"'
POOL = 'pool=~"$pool"'
PREFILL = 'role="prefill"'
DECODE = 'role="decode"'
SCALED = 'direction!="none"'
Json = dict[str, Any]
Item = timeseries.Panel | stat.Panel | bargauge.Panel | Row
P = TypeVar("P", timeseries.Panel, stat.Panel, bargauge.Panel)


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


def _target(q: Query, ref: str) -> prometheus.Dataquery:
    return (prometheus.Dataquery().datasource(DS).expr(q.expr).legend_format(q.legend)
            .ref_id(ref).range())


def _panel(p: P, title: str, queries: list[Query], unit: str, description: str, width: int,
           height: int) -> P:
    """What every panel has: the datasource variable, one unit, refIds A, B, ... in order."""
    targets: list[cogbuilder.Builder[cogvariants.Dataquery]] = [
        _target(q, chr(ord("A") + i)) for i, q in enumerate(queries)]
    return (p.title(title).description(description).datasource(DS).unit(unit)
            .span(width).height(height).targets(targets))


def _timeseries(title: str, queries: list[Query], *, unit: str = "short", description: str = "",
                width: int = 12, height: int = 8, dashed: str = "",
                axis_label: str = "") -> timeseries.Panel:
    """A graph over time. `dashed`: a legend regex of the series drawn as dashed red lines (SLO
    targets); `axis_label`: what the unit counts, when the unit id alone does not say."""
    p = (_panel(timeseries.Panel(), title, queries, unit, description, width, height)
         .legend(viz.VizLegendOptions().display_mode(common.LegendDisplayMode.LIST)
                 .placement(common.LegendPlacement.BOTTOM).show_legend(True))
         .tooltip(viz.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                  .sort(common.SortOrder.DESCENDING)))
    if axis_label:
        p.axis_label(axis_label)
    if dashed:
        p.override_by_regexp(dashed, [
            model.DynamicConfigValue(id_val="custom.lineStyle",
                                     value=common.LineStyle(fill="dash", dash=[10, 10])),
            model.DynamicConfigValue(id_val="color", value=model.FieldColor(
                mode=model.FieldColorModeId.FIXED, fixed_color="red")),
        ])
    return p


def _last_value() -> viz.ReduceDataOptions:
    return viz.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def _stat(title: str, query: Query, *, unit: str = "short") -> stat.Panel:
    """One big number: the last value, with its sparkline (the Fleet dashboard's top row)."""
    return (_panel(stat.Panel(), title, [query], unit, "", 6, 5)
            .reduce_options(_last_value()).color_mode(common.BigValueColorMode.VALUE)
            .graph_mode(common.BigValueGraphMode.AREA).text_mode(common.BigValueTextMode.AUTO))


def _bargauge(title: str, queries: list[Query], *, unit: str, description: str, width: int,
              height: int) -> bargauge.Panel:
    """One horizontal bar per series, its last value."""
    return (_panel(bargauge.Panel(), title, queries, unit, description, width, height)
            .reduce_options(_last_value()).display_mode(common.BarGaugeDisplayMode.BASIC)
            .orientation(common.VizOrientation.HORIZONTAL).show_unfilled(True))


def _variables(with_pool: bool) -> list[cogbuilder.Builder[model.VariableModel]]:
    ds = (dash.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
          .hide(model.VariableHide.DONT_HIDE).regex(""))
    variables: list[cogbuilder.Builder[model.VariableModel]] = [ds, _query_var(
        "namespace", f"label_values({series('up', POOL_TARGETS)}, namespace)")]
    if with_pool:
        variables.append(
            _query_var("pool", f"label_values({series('up', POOL_TARGETS, NS)}, pool)")
        )
    return variables


def _query_var(name: str, query: str) -> dash.QueryVariable:
    """A multi-value picker of a label's values; All matches any value (`.+`)."""
    return (dash.QueryVariable(name).label(name.capitalize()).datasource(DS)
            .query({"query": query, "refId": f"{name}-values"})
            .hide(model.VariableHide.DONT_HIDE).include_all(True).multi(True).all_value(".+")
            .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(model.VariableSort.ALPHABETICAL_ASC).regex(""))


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


# What the builders cannot say (grafana-foundation-sdk 11.6 declares neither): the Prometheus data
# source's annotation fields (the SDK's AnnotationQuery is the generic one: `expr` and no more),
# and a query variable's `definition` (the editor's text of its query). They are added to the
# built JSON by `_add_undeclared`, and nothing else is.
SCALE_EVENTS_NAME = "Scale events"
SCALE_EVENTS_FIELDS: Json = {
    "step": "30s",
    "titleFormat": "{{role}} scaled {{direction}} to {{replicas}}",
    "textFormat": "{{namespace}}/{{pool}}: {{role}} scaled {{direction}} to {{replicas}} "
                  "replicas ({{reason}})",
    "tagKeys": "namespace,pool,role,reason",
    "useValueForTime": False,
}


def _add_undeclared(d: Json) -> Json:
    for variable in d["templating"]["list"]:
        if variable["type"] == "query":
            variable["definition"] = variable["query"]["query"]
    for annotation in d["annotations"]["list"]:
        if annotation["name"] == SCALE_EVENTS_NAME:
            annotation.update(SCALE_EVENTS_FIELDS)
    return d


def _annotations(scale_events: bool) -> list[cogbuilder.Builder[model.AnnotationQuery]]:
    builtin = (dash.AnnotationQuery().name("Annotations & Alerts").built_in(1).type("dashboard")
               .datasource(model.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
               .enable(True).hide(True).icon_color("rgba(0, 211, 255, 1)"))
    items: list[cogbuilder.Builder[model.AnnotationQuery]] = [builtin]
    if scale_events:
        items.append(dash.AnnotationQuery().name(SCALE_EVENTS_NAME).datasource(DS).enable(True)
                     .hide(False).icon_color("orange").expr(SCALE_EVENTS))
    return items


# The autoscaler's signals (the `signal` label), one panel per unit of the autoscaler's own
# vocabulary (poolpilot.reasons.SIGNAL_UNIT): unit -> (panel title, Grafana unit id, axis label).
SIGNAL_PANELS = {
    "seconds": ("Latency signals", "s", ""),
    "requests": ("Queue and sequences", "short", "requests"),
    "tokens/s": ("Token throughput and demand", "cps", "tokens/s"),
    "fraction": ("KV-cache usage", "percentunit", ""),
}
SIGNAL_UNITS = {s: SIGNAL_PANELS[SIGNAL_UNIT[s]][1] for s in SignalName}


def dashboard(uid: str, title: str, description: str, items: list[Item], *,
              with_pool: bool = True, scale_events: bool = True) -> Json:
    d = (dash.Dashboard(title).uid(uid).description(description)
         .tags(["poolpilot", "llm-inference"]).version(1).editable()
         .tooltip(model.DashboardCursorSync.CROSSHAIR).timezone("browser").refresh("30s")
         .time("now-3h", "now")
         .variables(_variables(with_pool)).annotations(_annotations(scale_events))
         .link(dash.DashboardLink("poolpilot dashboards").type(model.DashboardLinkType.DASHBOARDS)
               .tags(["poolpilot"]).as_dropdown(True).include_vars(True).keep_time(True)))
    # The builder lays the panels out left to right, top to bottom on Grafana's 24-column grid,
    # each row on a line of its own (a panel wider than what is left of its line is not moved
    # down: the chart's tests check that none overlaps); ids are stable: the place in `items`.
    for pid, item in enumerate(items, start=1):
        if isinstance(item, Row):
            d.with_row(item.id(pid))
        else:
            d.with_panel(item.id(pid))
    return _add_undeclared(json.loads(json.dumps(d.build(), cls=JSONEncoder)))


def _latency_panel(title: str, hist: str, by: str, legend: str, target_signal: SignalName,
                   description: str, *matchers: str) -> timeseries.Panel:
    queries = [
        Query(quantile(q, hist, W, by, NS, POOL, *matchers), f"{legend} p{round(q * 100)}")
        for q in (0.5, 0.9, 0.99)
    ]
    signal = f'signal="{target_signal}"'
    queries.append(Query(
        f"max by ({BY_POOL}) ({series(m.AUTOSCALER_SIGNAL_TARGET, NS, POOL, signal)})",
        "{{pool}} target",
    ))
    return _timeseries(title, queries, unit="s", description=description, dashed=".*target")


def _by(agg: str, by: str, metric: str, *matchers: str) -> str:
    return f"{agg} by ({by}) ({series(metric, *matchers)})"


def _rate_by(by: str, metric: str, *matchers: str) -> str:
    return f"sum by ({by}) ({rate(metric, W, *matchers)})"


# The router labels its prefix counters by the engine's URL (`endpoint`, http://IP:PORT);
# Prometheus labels the engine's own series by its target (`instance`, IP:PORT).
BY_ENDPOINT = f"{BY_POOL}, instance"


def _as_instance(expr: str) -> str:
    return f'label_replace({expr}, "instance", "$1", "endpoint", "https?://(.+)")'


def _prefix_hit_panel(f: tuple[str, ...]) -> timeseries.Panel:
    """What the router expected each engine to serve from its prefix cache, beside what the
    engine reports it served."""
    expected = _as_instance(rate(m.ROUTER_PREFIX_EXPECTED_HITS, W, *f))
    routed = _as_instance(rate(m.ROUTER_PREFIX_ROUTED, W, *f))
    hits = rate(m.VLLM_PREFIX_CACHE_HITS, W, *f, ENGINE_ROLES)
    queries = rate(m.VLLM_PREFIX_CACHE_QUERIES, W, *f, ENGINE_ROLES)
    # (a decode engine's external hits are the prompts sent to it, not an offload tier's)
    host = rate(m.VLLM_EXTERNAL_PREFIX_CACHE_HITS, W, *f, 'role=~"prefill|engine"')
    title = "Prefix-cache hit rate per engine: expected by the router vs the engine's"
    return _timeseries(title, [
        Query(f"sum by ({BY_ENDPOINT}) ({expected}) / sum by ({BY_ENDPOINT}) ({routed})",
              "{{pool}} {{instance}} expected by the router"),
        Query(f"sum by ({BY_ENDPOINT}) ({hits}) / sum by ({BY_ENDPOINT}) ({queries})",
              "{{pool}} {{instance}} engine"),
        Query(f"sum by ({BY_ENDPOINT}) ({host}) / sum by ({BY_ENDPOINT}) ({queries})",
              "{{pool}} {{instance}} engine, from its CPU offload tier"),
    ], unit="percentunit", width=24, dashed=".*expected by the router",
        description="Share of the prompt tokens sent to each engine that its prefix cache "
        "served. Dashed: what the router expected when it chose the engine (prefix-aware "
        "routing: spec.router.prefixRouting; summed over the router replicas). Solid: the "
        "engine's own vllm:prefix_cache_hits_total over vllm:prefix_cache_queries_total; "
        "with a CPU offload tier (spec.prefill.kvOffload), also the share it loaded from "
        "host memory (vllm:external_prefix_cache_hits_total), on top of the GPU's. "
        "Expected well above the engine's: the router's record (Approximate) outlives what "
        "the engine keeps (it evicted blocks), or the router's token estimate is off.")


def _cold_start_panel(f: tuple[str, ...]) -> bargauge.Panel:
    """The phases of the engines' cold starts per role (the launcher's series), the mean over
    the role's current pods, in the order they happen."""
    phases = 'phase!="total"'
    return _bargauge("Cold-start phases per role (mean of the current pods)", [
        Query(_by("avg", f"{BY_ROLE}, phase", m.ENGINE_COLD_START, *f, ENGINE_ROLES, phases),
              "{{pool}} {{role}} {{phase}}"),
        Query(_by("avg", BY_ROLE, m.ENGINE_COLD_START, *f, ENGINE_ROLES, 'phase="total"'),
              "{{pool}} {{role}} total"),
    ], unit="s", width=24, height=10,
        description="Seconds each phase of an engine's start took, from the launcher's "
        f"{m.ENGINE_COLD_START}: import (python, torch, vLLM), engine (config, engine core "
        "process), weights, compile (torch.compile; none with enforceEager), graphs (CUDA "
        "graphs; none on CPU), warmup (KV cache, profiling), server (the API server), ready "
        "(to the first /health 200). Total: the container's start to ready. What came before "
        "(scheduling, image pull) is in each pod's poolpilot.dev/cold-start annotation.")


def pool_dashboard() -> Json:
    f = (NS, POOL)
    items: list[Item] = [
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
        _timeseries("Queue depth per role", [
            Query(_by("sum", BY_ROLE, m.VLLM_WAITING, *f), "{{pool}} {{role}} waiting"),
            Query(_by("sum", BY_POOL, m.ROUTER_HELD, *f), "{{pool}} prefill held at the router"),
        ], description="Requests waiting for a slot: which role is the bottleneck. Held at the "
                       "router: prompts waiting while every prefill engine is saturated (late "
                       "binding); the autoscaler counts them as prefill waiting."),
        _timeseries("Running requests per role", [
            Query(_by("sum", BY_ROLE, m.VLLM_RUNNING, *f), "{{pool}} {{role}} running"),
        ], description="Sequences in the running batch (continuous batching)."),
        _timeseries("KV-cache usage", [
            Query(_by("max", BY_ROLE, m.VLLM_KV_USAGE, *f), "{{pool}} {{role}} max"),
            Query(_by("avg", BY_ROLE, m.VLLM_KV_USAGE, *f), "{{pool}} {{role}} avg"),
        ], unit="percentunit", description="Share of KV-cache blocks in use per engine."),
        _timeseries("Tokens per second", [
            Query(_rate_by(BY_ROLE, m.VLLM_PROMPT_TOKENS, *f), "{{pool}} {{role}} prompt"),
            Query(_rate_by(BY_ROLE, m.VLLM_GENERATION_TOKENS, *f),
                  "{{pool}} {{role}} generation"),
        ], unit="cps", axis_label="tokens/s",
            description="Prompt tokens prefilled and tokens generated, per role."),
        _timeseries("Requests at the router", [
            Query(_rate_by(f"{BY_POOL}, code", m.ROUTER_REQUESTS, *f), "{{pool}} {{code}}"),
        ], unit="reqps", description="Requests per second by HTTP status."),
        _timeseries("KV-cache transfer failures", [
            Query(_rate_by(BY_POOL, m.ROUTER_KV_TRANSFER_FAILURES, *f),
                  "{{pool}} failed handoffs"),
        ], unit="reqps", description="Prefill -> decode handoffs that failed (per second)."),
        _timeseries("Local prefill on decode engines", [
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
        _timeseries("Desired vs ready replicas per role", [
            Query(_by("sum", BY_ROLE, m.AUTOSCALER_DESIRED, *f), "{{pool}} {{role}} desired"),
            Query(_by("sum", BY_ROLE, "up", *f), "{{pool}} {{role}} ready (scraped)"),
        ], description="Desired: the autoscaler's decision. Ready: replicas Prometheus scrapes "
                       "successfully. Orange marks: scale events.", dashed=".*desired"),
        _timeseries("Prefill:decode ratio", [
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


def _signals_panel(unit: str) -> timeseries.Panel:
    """Every signal the autoscaler measures in `unit`, each next to its target (dashed)."""
    title, grafana_unit, axis_label = SIGNAL_PANELS[unit]
    signals = [s for s in SignalName if SIGNAL_UNIT[s] == unit]
    f = (NS, POOL, f'signal=~"{"|".join(signals)}"')
    description = "Each signal the decision used, with its target dashed:\n" + "\n".join(
        f"- `{s}`: {SIGNAL_DESCRIPTION[s]}" for s in signals)
    return _timeseries(title, [
        Query(f"max by ({BY_ROLE}, signal) ({series(m.AUTOSCALER_SIGNAL, *f)})",
              "{{pool}} {{role}} {{signal}}"),
        Query(f"max by ({BY_ROLE}, signal) ({series(m.AUTOSCALER_SIGNAL_TARGET, *f)})",
              "{{pool}} {{role}} {{signal}} target"),
    ], unit=grafana_unit, axis_label=axis_label, description=description, dashed=".*target")


def autoscaler_dashboard() -> Json:
    f = (NS, POOL)
    items: list[Item] = [
        Row("Decisions"),
        _timeseries("Decisions by reason", [
            Query(f"sum by ({BY_ROLE}, reason) (increase("
                  f"{series(m.AUTOSCALER_DECISIONS, *f)}[{W}]))",
                  "{{pool}} {{role}} {{reason}}"),
        ], description="Why each cycle kept or changed the size. The reasons, by the step of "
                       "the decision that gives them:\n" + reasons_text()),
        _timeseries("Scale decisions by direction", [
            Query(f"sum by ({BY_ROLE}, direction) (increase("
                  f"{series(m.AUTOSCALER_DECISIONS, *f, SCALED)}[{W}]))",
                  "{{pool}} {{role}} {{direction}}"),
        ], description="Decisions that changed the size, up or down."),
        _timeseries("Desired replicas", [
            Query(_by("sum", BY_ROLE, m.AUTOSCALER_DESIRED, *f), "{{pool}} {{role}}"),
        ]),
        _timeseries("MetricsAvailable", [
            Query(_by("min", BY_ROLE, m.AUTOSCALER_METRICS_AVAILABLE, *f), "{{pool}} {{role}}"),
        ], description="1: every signal had a fresh value; 0: the size is held (no data is "
                       "not zero)."),
        Row("Signals next to their targets"),
        *(_signals_panel(unit) for unit in SIGNAL_PANELS),
        _timeseries("ScalingLimited", [
            Query(f"max by ({BY_ROLE}, reason) ({series(m.AUTOSCALER_LIMITED, *f)})",
                  "{{pool}} {{role}} {{reason}}"),
        ], description="1 while the autoscaler cannot get the replicas it wants."),
        _timeseries("Cycle time", [
            Query(quantile(0.5, m.AUTOSCALER_CYCLE, W, "job"), "p50"),
            Query(quantile(0.99, m.AUTOSCALER_CYCLE, W, "job"), "p99"),
        ], unit="s", description="One cycle: every query for all pools, decisions, writes."),
    ]
    return dashboard("poolpilot-autoscaler", "poolpilot / Autoscaler",
                     "What the autoscaler decided, why, and on which signals.", items)



def _operator_row() -> list[Item]:
    """The operator's own series (poolpilot.operator.metrics). They describe the operator
    process, not a pool: no namespace or pool filter (the operator runs in its own namespace),
    summed over its replicas (only the active one reconciles)."""
    return [
        Row("Operator"),
        _timeseries("Reconciles per second by result", [
            Query(f"sum by (result) ({rate(m.OPERATOR_RECONCILES, W)})", "{{result}}"),
        ], unit="ops", description="How each reconcile of a pool ended: converged (children "
                       "written), no_op (nothing to write), invalid_spec, name_conflict, "
                       "api_error, pool_gone, backing_off. An idle healthy operator shows only "
                       "no_op (the drift timer)."),
        _timeseries("Reconcile duration", [
            Query(quantile(q, m.OPERATOR_RECONCILE_DURATION, W, "trigger"),
                  f"{{{{trigger}}}} p{round(q * 100)}") for q in (0.5, 0.99)
        ], unit="s", description="Seconds one reconcile took (reading, writing, status), "
                                 "by what started it: a change to the pool or the drift "
                                 "timer."),
        _timeseries("Writes and API errors per second", [
            Query(f"sum({rate(m.OPERATOR_WRITES, W)})", "writes"),
            Query(f"sum by (kind) ({rate(m.OPERATOR_API_ERRORS, W)})", "{{kind}} API errors"),
        ], unit="ops", description="Writes: applies, deletes and size hand-overs. API errors "
                       "by kind: transient ones are retried in 2 s; permanent ones (403, 422, "
                       "quota) set the pool Degraded and back off up to 5 min."),
        _timeseries("Reconciles running and queued", [
            Query(f"sum({series(m.OPERATOR_ACTIVE)})", "running"),
            Query(f"sum({series(m.OPERATOR_QUEUED)})", "queued"),
        ], description="Queued: reconciles waiting for one of the --max-concurrent-reconciles "
                       "slots. Above 0 for long: the API server is the bottleneck."),
    ]


def fleet_dashboard() -> Json:
    items: list[Item] = [
        _stat("Pools", Query(f"count(count by ({BY_POOL}) ({series('up', NS, POOL_TARGETS)}))",
                             "pools")),
        _stat("Engine replicas up", Query(f"sum({series('up', NS, ENGINE_ROLES)})", "replicas")),
        _stat("Requests per second", Query(f"sum({rate(m.ROUTER_REQUESTS, W, NS)})", "req/s"),
              unit="reqps"),
        _stat("Requests waiting", Query(f"sum({series(m.VLLM_WAITING, NS)})", "waiting")),
        _timeseries("TTFT p90 at the router per pool", [
            Query(quantile(0.9, m.ROUTER_TTFT, W, BY_POOL, NS), "{{namespace}}/{{pool}}"),
        ], unit="s"),
        _timeseries("ITL p90 at the router per pool", [
            Query(quantile(0.9, m.ROUTER_ITL, W, BY_POOL, NS), "{{namespace}}/{{pool}}"),
        ], unit="s"),
        _timeseries("Requests per second per pool", [
            Query(_rate_by(BY_POOL, m.ROUTER_REQUESTS, NS), "{{namespace}}/{{pool}}"),
        ], unit="reqps"),
        _timeseries("Queue depth per pool and role", [
            Query(_by("sum", BY_ROLE, m.VLLM_WAITING, NS), "{{namespace}}/{{pool}} {{role}}"),
        ]),
        _timeseries("Replicas up per pool and role", [
            Query(_by("sum", BY_ROLE, "up", NS, POOL_TARGETS),
                  "{{namespace}}/{{pool}} {{role}}"),
        ]),
        _timeseries("KV-cache usage (max) per pool", [
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
